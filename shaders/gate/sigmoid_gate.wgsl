// The output gate of gated attention (Qwen3.5): x ← x · sigmoid(g), elementwise over the first
// `width` channels of every token row; with g_step 0 one gate a row for all its channels
// (Qwen3.5-MoE's shared-expert gate). One invocation per (channel, token).

struct GateParams {
    width: u32,
    x_stride: u32,  // floats per row of x
    g_stride: u32,  // floats per row of g
    g_offset: u32,  // column of channel 0's gate in a row of g
    g_step: u32,    // columns of g between channels' gates: 1, or 0 for one gate a row
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: GateParams;
@group(0) @binding(2) var<storage, read> g: array<f32>;        // [tokens, g_stride]
@group(0) @binding(3) var<storage, read_write> x: array<f32>;  // [tokens, x_stride]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= p.width || t >= step.num_tokens) {
        return;
    }
    let gate = g[t * p.g_stride + p.g_offset + i * p.g_step];
    x[t * p.x_stride + i] = x[t * p.x_stride + i] / (1.0 + exp(-gate));
}
