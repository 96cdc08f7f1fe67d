// Weight format BF16 in the interleaved layout (see kernels::weights):
//   wq: [cols / 2, rows] u32   — word (w, n) holds elements 2w (low half) and 2w+1 of row n
//   ws: unused
// A bf16 is the high half of an f32.
const W_WORDS_PER_GROUP: u32 = 4u;

fn bf16x2(w: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xFFFF0000u));
}

fn w_load8(n: u32, g: u32, rows: u32) -> W8 {
    let base = 4u * g;
    let a = bf16x2(wq[base * rows + n]);
    let b = bf16x2(wq[(base + 1u) * rows + n]);
    let c = bf16x2(wq[(base + 2u) * rows + n]);
    let d = bf16x2(wq[(base + 3u) * rows + n]);
    return W8(vec4<f32>(a, b), vec4<f32>(c, d));
}
