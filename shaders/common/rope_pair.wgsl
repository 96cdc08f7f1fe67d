// The rotation of one RoPE pair (a, b) by the table's (cos, sin): the one formula of
// rope/rope.wgsl and rope/rope_kv_write.wgsl.
fn rope_rotate(a: f32, b: f32, cs: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(a * cs.x - b * cs.y, a * cs.y + b * cs.x);
}
