// Weight format Q6_K: per 32-element block 4 u32 of low nibbles (1 vec4) and the high-pair
// words of elements 0..16 and 16..32; per super-block its 16 int8 scales and f16 d (210 bytes a
// super-block, the file's). WRaw.s is d (low half) with the int8 scales sc₀ (byte 2) of
// elements 0..16 and sc₁ (byte 3) of 16..32. value = (q − 32) · (d · sc), every
// product exact (d · sc ≤ 18 significant bits, times |q − 32| ≤ 32: ≤ 23), so w_decode forms the
// values themselves (scale 1) and the block dot is Σ value·x.
const W_VEC4_PER_BLOCK: u32 = 1u;

struct WRaw {
    q: vec4<u32>,
    ha: u32,
    hb: u32,
    s: u32,
}

fn w_load(n: u32, b: u32, rows: u32, blocks: u32) -> WRaw {
    let i = w_unit(n, b, rows, blocks);
    // side words: two high-pair words per unit; the super-block's 16 int8 scales (4 words) per
    // super-block unit; its f16 d, one a super-block unit. Sub-block b % 8's two scales are
    // half (b % 8) % 2 of scale word (b % 8) / 2.
    let units = rows * blocks;
    let scales = w_round8(2u * units);
    let su = w_super(n, b, rows, blocks);
    let sc = (w_s(scales + 4u * su + (b % 8u) / 2u) >> (16u * (b & 1u))) & 0xFFFFu;
    let d = w_half(scales + w_round8(units / 2u), su);
    let h = w_s2(2u * i);
    return WRaw(w_q(i), h.x, h.y, d | (sc << 16u));
}

fn w_decode(r: WRaw) -> WFloat {
    let d = unpack2x16float(r.s).x;
    let sc = vec2<f32>(unpack4xI8(r.s).zw);
    let d0 = vec4<f32>(d * sc.x);
    let d1 = vec4<f32>(d * sc.y);
    let q = q6_floats(r.q, r.ha, r.hb);
    let c = vec4<f32>(32.0);
    let v = V8((q.v0 - c) * d0, (q.v1 - c) * d0, (q.v2 - c) * d0, (q.v3 - c) * d0,
               (q.v4 - c) * d1, (q.v5 - c) * d1, (q.v6 - c) * d1, (q.v7 - c) * d1);
    return WFloat(v, 1.0, 0.0);
}

fn w_combine(qdot: f32, sx: f32, w: WFloat) -> f32 {
    return qdot;
}

fn w_values(w: WFloat) -> V8 {
    return w.q;
}
