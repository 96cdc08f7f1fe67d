// Weight format Q4_0: per block 4 u32 of nibbles (1 vec4) and an f16 scale d (18 bytes, the
// file's; WRaw.s holds d in its low half). value = (q − 8) · d, so the block dot is d · (Σ q·x − 8 Σ x).
const W_VEC4_PER_BLOCK: u32 = 1u;

struct WRaw {
    q: vec4<u32>,
    s: u32,
}

fn w_load(n: u32, b: u32, rows: u32, blocks: u32) -> WRaw {
    let i = w_unit(n, b, rows, blocks);
    return WRaw(w_q(i), w_half(0u, i));
}

fn w_decode(r: WRaw) -> WFloat {
    return WFloat(q4_floats(r.q), unpack2x16float(r.s).x, 0.0);
}

fn w_combine(qdot: f32, sx: f32, w: WFloat) -> f32 {
    return w.d * fma(-8.0, sx, qdot);
}

fn w_values(w: WFloat) -> V8 {
    let q = w.q;
    return v8_scale(V8(q.v0 - 8.0, q.v1 - 8.0, q.v2 - 8.0, q.v3 - 8.0,
                       q.v4 - 8.0, q.v5 - 8.0, q.v6 - 8.0, q.v7 - 8.0), w.d);
}
