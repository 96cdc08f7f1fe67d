// Advances each sequence's conv state past the step's query tokens (after conv.wgsl read it):
// the new state is the last CONV_K − 1 inputs, taken from this step's rows of x where the
// sequence has that many, else shifted from the old state. One invocation per (channel,
// sequence); in place, oldest first: entry m reads the old entry m + q_len (not yet written),
// or 0 when the step starts the sequence (conv.wgsl's `fresh`). Where seq.snapshot_len > 0 the
// state after that many of the step's tokens goes to slot seq.snapshot_slot first (a prefix-cache
// snapshot), read the same way before the in-place update.


@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: ConvParams;
@group(0) @binding(2) var<storage, read> seqs: array<SeqInfo>;
@group(0) @binding(3) var<storage, read> x: array<f32>;            // [tokens, x_stride]
@group(0) @binding(4) var<storage, read_write> state: array<f32>;  // [slots, CONV_K − 1, channels]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.channels || wid.y >= step.num_seqs) {
        return;
    }
    let seq = seqs[wid.y];
    let n = CONV_K - 1u;
    let s_base = seq.state_slot * n * p.channels + c;
    if (seq.snapshot_len > 0u) {
        let snap = seq.snapshot_slot * n * p.channels + c;
        for (var m = 0u; m < n; m++) {
            let r = i32(seq.snapshot_len) - i32(n) + i32(m);
            var v = 0.0;
            if (r >= 0) {
                v = x[(seq.q_start + u32(r)) * p.x_stride + p.x_offset + c];
            } else if (seq.ctx_len != seq.q_len) {
                v = state[s_base + (m + seq.snapshot_len) * p.channels];
            }
            state[snap + m * p.channels] = v;
        }
    }
    for (var m = 0u; m < n; m++) {
        let r = i32(seq.q_len) - i32(n) + i32(m);
        var v = 0.0;
        if (r >= 0) {
            v = x[(seq.q_start + u32(r)) * p.x_stride + p.x_offset + c];
        } else if (seq.ctx_len != seq.q_len) {
            v = state[s_base + (m + seq.q_len) * p.channels];
        }
        state[s_base + m * p.channels] = v;
    }
}
