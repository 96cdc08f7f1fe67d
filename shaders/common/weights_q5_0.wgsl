// Weight format Q5_0: per block 4 u32 of low nibbles (1 vec4), the high-bit word and an f16
// scale d (22 bytes, the file's; WRaw.s holds d in its low half). value = (q − 16) · d, so the block dot is
// d · (Σ q·x − 16 Σ x).
const W_VEC4_PER_BLOCK: u32 = 1u;

struct WRaw {
    q: vec4<u32>,
    s: u32,
    h: u32,
}

fn w_load(n: u32, b: u32, rows: u32, blocks: u32) -> WRaw {
    let i = w_unit(n, b, rows, blocks);
    // side words: the high-bit word per unit, then f16 d, one a unit
    return WRaw(w_q(i), w_half(w_round8(rows * blocks), i), w_s(i));
}

fn w_decode(r: WRaw) -> WFloat {
    return WFloat(q5_floats(r.q, r.h), unpack2x16float(r.s).x, 0.0);
}

fn w_combine(qdot: f32, sx: f32, w: WFloat) -> f32 {
    return w.d * fma(-16.0, sx, qdot);
}

// Exact: (q − 16) · d has at most 16 significant bits.
fn w_values(w: WFloat) -> V8 {
    let q = w.q;
    return v8_scale(V8(q.v0 - 16.0, q.v1 - 16.0, q.v2 - 16.0, q.v3 - 16.0,
                       q.v4 - 16.0, q.v5 - 16.0, q.v6 - 16.0, q.v7 - 16.0), w.d);
}
