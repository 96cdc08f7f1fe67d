// Weight format Q5_K: per 32-element block 4 u32 of low nibbles (1 vec4) and the high-bit
// word; per super-block its 16 bytes of d, dmin and scales (176 bytes a super-block, the
// file's). w_load forms the block's scale d · sc and minimum dmin · m (exact f32,
// k_scale_min). value = q · d − m, so the block dot is d · Σ q·x − m · Σ x.
const W_VEC4_PER_BLOCK: u32 = 1u;

struct WRaw {
    q: vec4<u32>,
    d: u32,
    m: u32,
    h: u32,
}

fn w_load(n: u32, b: u32, rows: u32, blocks: u32) -> WRaw {
    let i = w_unit(n, b, rows, blocks);
    // side words: the high-bit word per unit, then the super-block's 16 bytes of d, dmin and
    // scales per super-block unit
    let s = w_s4(w_round8(rows * blocks) + 4u * w_super(n, b, rows, blocks));
    let dm = k_scale_min(s, b % 8u);
    return WRaw(w_q(i), bitcast<u32>(dm.x), bitcast<u32>(dm.y), w_s(i));
}

fn w_decode(r: WRaw) -> WFloat {
    return WFloat(q5_floats(r.q, r.h), bitcast<f32>(r.d), bitcast<f32>(r.m));
}

fn w_combine(qdot: f32, sx: f32, w: WFloat) -> f32 {
    return fma(w.d, qdot, -(w.m * sx));
}

// q · d is exact (at most 22 significant bits), so fused or not this rounds once, as ggml.
fn w_values(w: WFloat) -> V8 {
    let q = w.q;
    return V8(q.v0 * w.d - w.m, q.v1 * w.d - w.m, q.v2 * w.d - w.m, q.v3 * w.d - w.m,
              q.v4 * w.d - w.m, q.v5 * w.d - w.m, q.v6 * w.d - w.m, q.v7 * w.d - w.m);
}
