// Weight format Q4_1, repacked at load into the interleaved layout (see kernels::weights):
//   wq: [cols / 8, rows] u32   — word (g, n) holds elements 8g..8g+7 of row n; byte i holds
//                                element i (low nibble) and element i+4 (high nibble)
//   ws: [cols / 32, rows] u32  — f16 scale d (low half) and f16 minimum m (high half)
// value = q * d + m
const W_WORDS_PER_GROUP: u32 = 1u;

fn w_load8(n: u32, g: u32, rows: u32) -> W8 {
    let q = wq[g * rows + n];
    let dm = unpack2x16float(ws[(g / 4u) * rows + n]);
    let lo = vec4<f32>(unpack4xU8(q & 0x0F0F0F0Fu));
    let hi = vec4<f32>(unpack4xU8((q >> 4u) & 0x0F0F0F0Fu));
    return W8(fma(lo, vec4<f32>(dm.x), vec4<f32>(dm.y)), fma(hi, vec4<f32>(dm.x), vec4<f32>(dm.y)));
}
