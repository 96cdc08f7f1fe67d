// Gated MLP activation: out[t, i] = act(gate_up[t, i]) · gate_up[t, ffn + i], act per the
// pipeline constant GLU (common/glu.wgsl). Gate and up are one fused linear layer whose types
// differ (same types take the linear kernel's GLU epilogue instead: no dispatch of this).

struct GluParams {
    ffn: u32,        // intermediate size
    in_stride: u32,  // floats between token rows of gate_up (2 * ffn)
    _pad0: u32,
    _pad1: u32,
}

override GLU: u32 = GLU_SILU;

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: GluParams;
@group(0) @binding(2) var<storage, read> gate_up: array<f32>;   // [tokens, 2 * ffn]
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [tokens, ffn]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let i = gid.x;
    if (t >= step.num_tokens || i >= p.ffn) {
        return;
    }
    let g = gate_up[t * p.in_stride + i];
    let u = gate_up[t * p.in_stride + p.ffn + i];
    out[t * p.ffn + i] = glu(GLU, g, u);
}
