// The KV rotation (--kv-rotate): each head of a row multiplied by the orthonormal Hadamard
// matrix H = H_d / sqrt(d) in place, as quant::fwht_inplace does it, operation for operation
// (butterflies for h = 1, 2, … d/2, then × scale), so the bits match the CPU. H is its own
// inverse: applied to Q, K and V after RoPE (scores q·k unchanged, K and V quantized rotated),
// and again to the attention output (undoing V's). One invocation per (head, token row).

struct RotateParams {
    heads: u32,       // heads per row, contiguous from `offset`
    row_stride: u32,  // floats between token rows
    offset: u32,      // float offset of head 0 in a row
    scale: f32,       // 1 / sqrt(HEAD_DIM), computed by the host as the CPU does
}

override HEAD_DIM: u32 = 64u;  // a power of two, at most 256

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: RotateParams;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;  // [tokens, row_stride]

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
