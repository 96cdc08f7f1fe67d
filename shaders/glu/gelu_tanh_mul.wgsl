// GeGLU activation (Gemma): out[t, i] = gelu_tanh(gate_up[t, i]) * gate_up[t, ffn + i] with
// HF's gelu_pytorch_tanh / ggml's gelu: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
// (the gate and up projections are one fused linear layer: gate rows first, then up rows).

struct GluParams {
    ffn: u32,        // intermediate size
    in_stride: u32,  // floats between token rows of gate_up (2 * ffn)
    _pad0: u32,
    _pad1: u32,
}

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
    // 0.5 (1 + tanh(y)) = 1 / (1 + exp(-2y)): the same function without the cancellation of
    // 1 + tanh(y) for negative y, and without tanh, which some drivers build from exp and
    // return inf / inf = NaN for large arguments (exp(-2y) = inf gives 0 here, as it should)
    let y = 0.7978845608028654 * (g + 0.044715 * g * g * g);
    out[t * p.ffn + i] = g / (1.0 + exp(-2.0 * y)) * u;
}
