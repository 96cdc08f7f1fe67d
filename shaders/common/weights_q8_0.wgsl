// Weight format Q8_0: per block 8 u32 of signed bytes (2 vec4; byte i of word w = element
// 4w + i) and an f16 scale d (side halves from word 0, one a unit). value = q · d.
const W_VEC4_PER_BLOCK: u32 = 2u;

struct WRaw {
    a: vec4<u32>,
    b: vec4<u32>,
    s: u32,
}

fn w_load(n: u32, b: u32, rows: u32, blocks: u32) -> WRaw {
    let u = w_unit(n, b, rows, blocks);
    return WRaw(w_q(2u * u), w_q(2u * u + 1u), w_half(0u, u));
}

// Shifts, not unpack4xI8: llvmpipe runs this ~1.4x faster in the linear kernel (same values).
fn i8x4(w: u32) -> vec4<f32> {
    let v = bitcast<vec4<i32>>(vec4<u32>(w << 24u, w << 16u, w << 8u, w));
    return vec4<f32>(v >> vec4<u32>(24u));
}

fn w_decode(r: WRaw) -> WFloat {
    let q = V8(i8x4(r.a.x), i8x4(r.a.y), i8x4(r.a.z), i8x4(r.a.w),
               i8x4(r.b.x), i8x4(r.b.y), i8x4(r.b.z), i8x4(r.b.w));
    return WFloat(q, unpack2x16float(r.s).x, 0.0);
}

fn w_combine(qdot: f32, sx: f32, w: WFloat) -> f32 {
    return w.d * qdot;
}

fn w_values(w: WFloat) -> V8 {
    return v8_scale(w.q, w.d);
}
