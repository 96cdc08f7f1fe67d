// Weight format F16 in the interleaved layout (see kernels::weights):
//   wq: [cols / 2, rows] u32   — word (w, n) holds elements 2w (low half) and 2w+1 of row n
//   ws: unused
const W_WORDS_PER_GROUP: u32 = 4u;

fn w_load8(n: u32, g: u32, rows: u32) -> W8 {
    let base = 4u * g;
    let a = unpack2x16float(wq[base * rows + n]);
    let b = unpack2x16float(wq[(base + 1u) * rows + n]);
    let c = unpack2x16float(wq[(base + 2u) * rows + n]);
    let d = unpack2x16float(wq[(base + 3u) * rows + n]);
    return W8(vec4<f32>(a, b), vec4<f32>(c, d));
}
