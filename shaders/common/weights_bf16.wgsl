// Weight format BF16: per block 16 u32 (4 vec4), each word two bf16 (low half = even element);
// a bf16 is the high half of an f32.
// No scales: the values are q.
const W_VEC4_PER_BLOCK: u32 = 4u;

struct WRaw {
    a: vec4<u32>,
    b: vec4<u32>,
    c: vec4<u32>,
    d: vec4<u32>,
}

fn w_load(n: u32, b: u32, rows: u32, blocks: u32) -> WRaw {
    let i = 4u * w_unit(n, b, rows, blocks);
    return WRaw(w_q(i), w_q(i + 1u), w_q(i + 2u), w_q(i + 3u));
}

fn h4(a: u32, b: u32) -> vec4<f32> {
    return vec4<f32>(bf16x2(a), bf16x2(b));
}

fn w_decode(r: WRaw) -> WFloat {
    let q = V8(h4(r.a.x, r.a.y), h4(r.a.z, r.a.w), h4(r.b.x, r.b.y), h4(r.b.z, r.b.w),
               h4(r.c.x, r.c.y), h4(r.c.z, r.c.w), h4(r.d.x, r.d.y), h4(r.d.z, r.d.w));
    return WFloat(q, 1.0, 0.0);
}

fn w_combine(qdot: f32, sx: f32, w: WFloat) -> f32 {
    return qdot;
}

fn w_values(w: WFloat) -> V8 {
    return w.q;
}

fn bf16x2(w: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xFFFF0000u));
}
