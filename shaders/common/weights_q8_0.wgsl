// Weight format Q8_0, repacked at load into the interleaved layout (see kernels::weights):
//   wq: [cols / 4, rows] u32   — word (w, n) holds elements 4w..4w+3 of row n as i8
//   ws: [cols / 32, rows] u32  — f16 scale d in the low half
// value = q * d
const W_WORDS_PER_GROUP: u32 = 2u;

fn w_load8(n: u32, g: u32, rows: u32) -> W8 {
    let d = unpack2x16float(ws[(g / 4u) * rows + n]).x;
    let lo = vec4<f32>(unpack4xI8(wq[(2u * g) * rows + n]));
    let hi = vec4<f32>(unpack4xI8(wq[(2u * g + 1u) * rows + n]));
    return W8(lo * d, hi * d);
}
