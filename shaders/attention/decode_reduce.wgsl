// Paged decode attention, reduce part: merges the partitions written by decode_partials left to
// right (merge_factors), from the one holding the first key of the window, folds in the head's
// attention sink (sink_fold) and normalises.
// One workgroup per (query head, decode sequence).

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> partials: array<f32>;   // [decode_seqs, num_heads, max_partitions, HEAD_DIM + 2]
@group(0) @binding(3) var<storage, read> seqs: array<SeqInfo>;   // [num_seqs]
@group(0) @binding(4) var<storage, read_write> out: array<f32>;  // [tokens, out_stride]

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wid.x;
    let si = wid.y;
    if (si >= step.num_decode_seqs) {
        return;
    }
    let seq = seqs[si];
    let n_parts = (seq.ctx_len + PART - 1u) / PART;
    let first = window_lo(seq.ctx_len - 1u) / PART;  // partitions before it: nothing written
    let stride = HEAD_DIM + 2u;
    let head_base = (si * p.num_heads + h) * p.max_partitions;
    for (var w = lid.x; w < HEAD_DIM / 2u; w += WG) {
        var m_run = NEG_BIG;
        var l_run = 0.0;
        var o_run = vec2<f32>(0.0);
        for (var part = first; part < n_parts; part++) {
            let pb = (head_base + part) * stride;
            let f = merge_factors(m_run, partials[pb]);
            l_run = fma(l_run, f.x, partials[pb + 1u] * f.y);
            let o_p = vec2<f32>(partials[pb + 2u + 2u * w], partials[pb + 3u + 2u * w]);
            o_run = fma(o_run, vec2<f32>(f.x), o_p * f.y);
            m_run = f.z;
        }
        let ob = seq.q_start * p.out_stride + h * HEAD_DIM + 2u * w;
        let sf = sink_fold(h, m_run, l_run);
        out[ob] = o_run.x * sf.x / sf.y;
        out[ob + 1u] = o_run.y * sf.x / sf.y;
    }
}
