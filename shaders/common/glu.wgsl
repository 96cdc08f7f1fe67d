// The gated-MLP activations, act(gate) · up: the one definition shared by the GLU kernel
// (glu/glu.wgsl) and the linear kernels' GLU epilogue (gate and up rows interleaved).
const GLU_SILU: u32 = 1u;       // SwiGLU (Llama, Qwen2): silu(g) = g / (1 + exp(-g))
const GLU_GELU_TANH: u32 = 2u;  // GeGLU (Gemma): HF's gelu_pytorch_tanh / ggml's gelu
const GLU_SWIGLU_OAI: u32 = 3u; // gpt-oss: g·σ(1.702 g)·(u + 1), g = min(g, 7), u = clamp(u, ±7)
const SWIGLU_OAI_ALPHA: f32 = 1.702;
const SWIGLU_OAI_LIMIT: f32 = 7.0;

fn glu(kind: u32, g: f32, u: f32) -> f32 {
    if (kind == GLU_SWIGLU_OAI) {
        let gc = min(g, SWIGLU_OAI_LIMIT);
        let uc = clamp(u, -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT);
        return gc / (1.0 + exp(-SWIGLU_OAI_ALPHA * gc)) * (uc + 1.0);
    }
    if (kind == GLU_GELU_TANH) {
        // 0.5 g (1 + tanh(y)), y = sqrt(2/pi) (g + 0.044715 g^3), written as g / (1 + exp(-2y)):
        // the same function without the cancellation of 1 + tanh(y) for negative y, and
        // without tanh, which some drivers build from exp and return inf / inf = NaN for large
        // arguments (exp(-2y) = inf gives 0 here, as it should)
        let y = 0.7978845608028654 * (g + 0.044715 * g * g * g);
        return g / (1.0 + exp(-2.0 * y)) * u;
    }
    return g / (1.0 + exp(-g)) * u;
}
