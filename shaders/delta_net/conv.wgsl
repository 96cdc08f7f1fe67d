// A recurrent layer's causal depthwise conv1d and SiLU (Gated DeltaNet: transformers'
// causal_conv1d_fn / causal_conv1d_update with activation "silu"), over each sequence's query
// tokens of the step, continuing from the sequence's conv state (its last CONV_K − 1 inputs):
//
//   out[t, c] = silu(Σ_{j < CONV_K} w[c, j] · in[t − (CONV_K − 1) + j, c])
//
// where in[·] before the step's first token reads the state — or 0 when the step starts the
// sequence (position 0: ctx_len = q_len), whatever its slot holds. Invocation: one channel (x) of one
// sequence (y) over one chunk of CT tokens (z); chunks are independent (each rebuilds its window
// from the inputs before it), so a long prompt spreads over the grid and no invocation walks
// more than CT tokens (llvmpipe's 65,535 loop iterations, DESIGN "Traps"). The state is only
// read here; conv_state.wgsl advances it in the next dispatch.

const CT: u32 = 256u;      // tokens per invocation (kernels::delta_net::CONV_TOKENS)
const MAX_TAPS: u32 = 8u;  // kernels::delta_net::MAX_TAPS

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: ConvParams;
@group(0) @binding(2) var<storage, read> seqs: array<SeqInfo>;
@group(0) @binding(3) var<storage, read> x: array<f32>;      // [tokens, x_stride]
@group(0) @binding(4) var<storage, read> w: array<f32>;      // [channels, CONV_K]
@group(0) @binding(5) var<storage, read> state: array<f32>;  // [slots, CONV_K − 1, channels], oldest first
@group(0) @binding(6) var<storage, read_write> out: array<f32>; // [tokens, out_stride]

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.channels || wid.y >= step.num_seqs) {
        return;
    }
    let seq = seqs[wid.y];
    let t0 = wid.z * CT;
    if (t0 >= seq.q_len) {
        return;
    }
    let t1 = min(t0 + CT, seq.q_len);
    let n = CONV_K - 1u;
    let s_base = seq.state_slot * n * p.channels + c;
    let fresh = seq.ctx_len == seq.q_len;
    var wv: array<f32, MAX_TAPS>;
    var win: array<f32, MAX_TAPS>;  // the n inputs before token t, oldest first
    for (var j = 0u; j < CONV_K; j++) {
        wv[j] = w[c * CONV_K + j];
    }
    for (var j = 0u; j < n; j++) {
        let r = i32(t0) - i32(n) + i32(j);
        if (r >= 0) {
            win[j] = x[(seq.q_start + u32(r)) * p.x_stride + p.x_offset + c];
        } else if (!fresh) {
            win[j] = state[s_base + u32(i32(n) + r) * p.channels];
        } else {
            win[j] = 0.0;
        }
    }
    for (var t = t0; t < t1; t++) {
        let row = seq.q_start + t;
        let cur = x[row * p.x_stride + p.x_offset + c];
        var acc = 0.0;
        for (var j = 0u; j < n; j++) {
            acc += wv[j] * win[j];
        }
        acc += wv[n] * cur;
        out[row * p.out_stride + c] = silu(acc);
        for (var j = 0u; j + 1u < n; j++) {
            win[j] = win[j + 1u];
        }
        win[n - 1u] = cur;
    }
}
