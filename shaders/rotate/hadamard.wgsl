// The KV rotation (--kv-rotate): each head of a row multiplied by the orthonormal Hadamard
// matrix H = H_d / sqrt(d) in place, as quant::fwht_inplace does it, operation for operation
// (butterflies for h = 1, 2, … d/2, then × scale), so the bits match the CPU. H is its own
// inverse: applied to Q, K and V after RoPE (scores q·k unchanged, K and V quantized rotated),
// and again to the attention output (undoing V's). One invocation per (head, token row).
// Parameters and bindings: rotate_io.wgsl.

override HEAD_DIM: u32 = 64u;  // a power of two, at most 256

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.y >= step.num_tokens || gid.x >= p.heads) {
        return;
    }
    let base = gid.y * p.row_stride + p.offset + gid.x * HEAD_DIM;
    var v: array<f32, 256>;
    for (var i = 0u; i < HEAD_DIM; i++) {
        v[i] = x[base + i];
    }
    for (var h = 1u; h < HEAD_DIM; h *= 2u) {
        for (var j = 0u; j < HEAD_DIM; j++) {
            if ((j & h) == 0u) {
                let a = v[j];
                let b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
        }
    }
    for (var i = 0u; i < HEAD_DIM; i++) {
        x[base + i] = v[i] * p.scale;
    }
}
