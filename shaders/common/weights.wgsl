// Shared by every kernel that reads weights: eight consecutive weights of one row, and the one
// dot product all linear kernels use, so that a token's result never depends on which kernel
// variant or batch computed it (fixed reduction order).
struct W8 {
    lo: vec4<f32>,  // elements 8g..8g+3
    hi: vec4<f32>,  // elements 8g+4..8g+7
}

fn group_dot(w: W8, x_lo: vec4<f32>, x_hi: vec4<f32>) -> f32 {
    let p = fma(w.lo, x_lo, w.hi * x_hi);
    return (p.x + p.y) + (p.z + p.w);
}
