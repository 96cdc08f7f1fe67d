// The final logit soft-cap (Gemma 4's final_logit_softcapping): every logit of the step's
// logit rows becomes cap · tanh(logit / cap), in place, as transformers computes it (divide,
// tanh, multiply). One invocation per (logit, row): x = logit index, y = row (a 2-D grid of
// rows past the per-dimension limit is never needed: rows ≤ the step's logit rows).

struct SoftcapParams {
    vocab: u32,
    cap: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: SoftcapParams;
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;  // [num_logits, vocab]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= p.vocab || r >= step.num_logits) {
        return;
    }
    let at = r * p.vocab + i;
    // clamped: tanh of |x| ≥ 10 is ±1 in f32 anyway, and a tanh built from exp (e^2x − 1) /
    // (e^2x + 1) would give inf / inf = NaN for an infinite logit
    logits[at] = tanh(clamp(logits[at] / p.cap, -10.0, 10.0)) * p.cap;
}
