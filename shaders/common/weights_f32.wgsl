// Weight format F32 in the interleaved layout (see kernels::weights):
//   wq: [cols, rows] u32       — word (k, n) holds element k of row n (f32 bits)
//   ws: unused
const W_WORDS_PER_GROUP: u32 = 8u;

fn w_load8(n: u32, g: u32, rows: u32) -> W8 {
    let base = 8u * g;
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = bitcast<f32>(wq[(base + i) * rows + n]);
    }
    return W8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}
