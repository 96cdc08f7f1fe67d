// Weight format F32: per block 32 u32 (8 vec4) of f32 bits. No scales: the values are q.
const W_VEC4_PER_BLOCK: u32 = 8u;

struct WRaw {
    q: V8,
}

fn w_load(n: u32, b: u32, rows: u32, blocks: u32) -> WRaw {
    let i = 8u * w_unit(n, b, rows, blocks);
    return WRaw(V8(bitcast<vec4<f32>>(w_q(i)), bitcast<vec4<f32>>(w_q(i + 1u)),
                   bitcast<vec4<f32>>(w_q(i + 2u)), bitcast<vec4<f32>>(w_q(i + 3u)),
                   bitcast<vec4<f32>>(w_q(i + 4u)), bitcast<vec4<f32>>(w_q(i + 5u)),
                   bitcast<vec4<f32>>(w_q(i + 6u)), bitcast<vec4<f32>>(w_q(i + 7u))));
}

fn w_decode(r: WRaw) -> WFloat {
    return WFloat(r.q, 1.0, 0.0);
}

fn w_combine(qdot: f32, sx: f32, w: WFloat) -> f32 {
    return qdot;
}

fn w_values(w: WFloat) -> V8 {
    return w.q;
}
