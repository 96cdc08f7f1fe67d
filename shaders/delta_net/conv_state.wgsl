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
            state[snap + m * p.channels] = entry_after(seq, c, s_base, seq.snapshot_len, m);
        }
    }
    for (var m = 0u; m < n; m++) {
        state[s_base + m * p.channels] = entry_after(seq, c, s_base, seq.q_len, m);
    }
}

// Entry m (oldest first) of channel c's conv state after `len` of the step's tokens: input row
// len − (CONV_K − 1) + m of the step, or an older entry of the old state (at s_base), or 0
// when the step starts the sequence. Reads only old entries ≥ m, so the update in place
// (m ascending) reads each before it is written.
fn entry_after(seq: SeqInfo, c: u32, s_base: u32, len: u32, m: u32) -> f32 {
    let r = i32(len) - i32(CONV_K - 1u) + i32(m);
    if (r >= 0) {
        return x[(seq.q_start + u32(r)) * p.x_stride + p.x_offset + c];
    }
    if (seq.ctx_len != seq.q_len) {
        return state[s_base + (m + len) * p.channels];
    }
    return 0.0;
}
