// Weight format Q4_1: per block 4 u32 of nibbles (1 vec4) and f16 scale d (low half) and
// minimum m (high half) in the scale word. value = q · d + m, so the block dot is
// d · Σ q·x + m · Σ x.
const W_VEC4_PER_BLOCK: u32 = 1u;

struct WRaw {
    q: vec4<u32>,
    s: u32,
}

fn w_load(n: u32, b: u32, rows: u32, blocks: u32) -> WRaw {
    let i = w_unit(n, b, rows, blocks);
    return WRaw(w_q(i), w_s(i));
}

fn w_decode(r: WRaw) -> WFloat {
    let dm = unpack2x16float(r.s);
    return WFloat(q4_floats(r.q), dm.x, dm.y);
}

fn w_combine(qdot: f32, sx: f32, w: WFloat) -> f32 {
    return fma(w.d, qdot, w.m * sx);
}

fn q4_1_value(q: vec4<f32>, d: f32, m: f32) -> vec4<f32> {
    return fma(q, vec4<f32>(d), vec4<f32>(m));
}

fn w_values(w: WFloat) -> V8 {
    let q = w.q;
    return V8(q4_1_value(q.v0, w.d, w.m), q4_1_value(q.v1, w.d, w.m), q4_1_value(q.v2, w.d, w.m),
              q4_1_value(q.v3, w.d, w.m), q4_1_value(q.v4, w.d, w.m), q4_1_value(q.v5, w.d, w.m),
              q4_1_value(q.v6, w.d, w.m), q4_1_value(q.v7, w.d, w.m));
}
