// The gated RMSNorm after a Gated DeltaNet layer's scan (transformers' Qwen3_5RMSNormGated),
// per token and value head, in place:
//
//   o ← o · rsqrt(mean(o²) + eps) · w · silu(z)
//
// w [dv] is shared by the heads. One 64-invocation workgroup per (head, token) row; the sum of
// squares in common/rms.wgsl's order.

struct GatedNormParams {
    v_heads: u32,
    dv: u32,
    o_stride: u32,  // floats per row of o (head h at h · dv)
    z_stride: u32,  // floats per row of z
    z_offset: u32,  // column of head 0's gate in a row of z
    eps: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: GatedNormParams;
@group(0) @binding(2) var<storage, read> z: array<f32>;        // [tokens, z_stride]
@group(0) @binding(3) var<storage, read> w: array<f32>;        // [dv]
@group(0) @binding(4) var<storage, read_write> o: array<f32>;  // [tokens, o_stride]

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let t = wid.y;
    if (t >= step.num_tokens) {
        return;
    }
    let base = t * p.o_stride + h * p.dv;
    var sum = 0.0;
    for (var i = lid; i < p.dv; i += 64u) {
        let v = o[base + i];
        sum = fma(v, v, sum);
    }
    let inv = rms_inv(rms_tree(lid, sum), p.dv, p.eps);
    let z_base = t * p.z_stride + p.z_offset + h * p.dv;
    for (var i = lid; i < p.dv; i += 64u) {
        let g = z[z_base + i];
        o[base + i] = o[base + i] * inv * w[i] * (g / (1.0 + exp(-g)));
    }
}
