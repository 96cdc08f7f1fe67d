// Paged decode attention, split-K part (FlashDecoding): one workgroup per
// (partition of PART key positions, slice of the query heads of one KV head, decode sequence).
// GQA/MQA by index broadcast: query head h reads KV head h / (num_heads / num_kv_heads); the
// keys of a partition are read once for all query heads of the slice. One body for every pool:
// the KV reader prepended before it (common/kv_read_f16.wgsl, or kv_read_quant.wgsl with the
// dequantization fused into the loads and the query's own block read fresh in f16) gives the
// keys and values, common/attention_workgroup.wgsl the partition's softmax, the same arithmetic
// as prefill.wgsl's, so a token's output is the same bits in both.
// Writes (m_p, l_p, o_p[HEAD_DIM]) per (sequence, query head, partition); decode_reduce merges.
// ONE_PASS (the host's choice when every window of the step lies in one partition): binding 8
// is the attention output instead, normalised here as decode_reduce would (the same bits: its
// merge of one partition is exact), and no reduce runs.

override ONE_PASS: bool = false;

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;             // [tokens, qkv_stride]
// bindings 3, 4, 5: k_pool, v_pool, stage (the KV reader's)
@group(0) @binding(6) var<storage, read> seqs: array<SeqInfo>;        // [num_seqs]; decode ones first
@group(0) @binding(7) var<storage, read> block_tables: array<u32>;    // concatenated tables
@group(0) @binding(8) var<storage, read_write> partials: array<f32>;  // [decode_seqs, num_heads, max_partitions, HEAD_DIM + 2]; ONE_PASS: out [tokens, out_stride]

var<workgroup> q_sh: array<f32, 2048>;            // [heads_per_wg, HEAD_DIM]
var<workgroup> s_sh: array<f32, 1024>;            // [heads_per_wg, PART] scores, then exp
var<workgroup> row_sh: array<u32, PART_WORKGROUP>; // kv_row of each key
var<workgroup> ulo_sh: array<u32, MAX_ROWS>;      // valid keys per head: [0, n_valid)
var<workgroup> uhi_sh: array<u32, MAX_ROWS>;
var<workgroup> mp_sh: array<f32, MAX_ROWS>;       // partition max per head
var<workgroup> lp_sh: array<f32, MAX_ROWS>;       // ONE_PASS: partition sum per head

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let si = wid.z;
    let seq = seqs[si];
    // Partitions are numbered from the one holding the window's first key (the first one
    // without a window): the host launches only those the window spans.
    let part = window_lo(seq.ctx_len - 1u) / PART + wid.x;
    let start = part * PART;
    let end = min(start + PART, seq.ctx_len);
    if (si >= step.num_decode_seqs || start >= seq.ctx_len) {
        return;
    }
    // keys k0 + u, u < n_valid: the partition's part of the window (partitions wholly before
    // it write nothing; decode_reduce starts after them)
    let k0 = max(start, window_lo(seq.ctx_len - 1u));
    if (k0 >= end) {
        return;
    }
    let n_valid = end - k0;
    let hs = head_slice(wid.y);
    let kvh = hs.kvh;
    let h0 = hs.h0;
    let nh = hs.nh;
    let words = HEAD_DIM / 2u;
    let t = lid.x;
    let fresh = fresh_from(seq.ctx_len - 1u);  // keys from here on are read fresh

    let q_row = seq.q_start * p.qkv_stride + p.q_offset + h0 * HEAD_DIM;
    for (var i = t; i < nh * HEAD_DIM; i += WG) {
        q_sh[i] = qkv[q_row + i];
    }
    if (t < n_valid) {
        let pos = k0 + t;
        row_sh[t] = kv_row(block_tables[seq.table_start + pos / p.block_size], kvh, pos);
    }
    if (t < nh) {
        ulo_sh[t] = 0u;
        uhi_sh[t] = n_valid;
    }
    workgroupBarrier();
    if (t < n_valid) {
        let pos = k0 + t;
        for (var h = 0u; h < nh; h++) {
            s_sh[h * PART + t] = qk_score(h * HEAD_DIM, seq, kvh, pos, row_sh[t], pos >= fresh);
        }
    }
    partition_softmax(t, nh);
    if (ONE_PASS) {
        if (t < nh) {
            lp_sh[t] = partition_sum(t);
        }
        workgroupBarrier();
        for (var i = t; i < nh * words; i += WG) {
            let h = i / words;
            let w = i % words;
            let o = partition_pv(h, k0, fresh, seq, kvh, w);
            let sf = sink_fold(h0 + h, mp_sh[h], lp_sh[h]);
            let ob = seq.q_start * p.out_stride + (h0 + h) * HEAD_DIM + 2u * w;
            partials[ob] = o.x * sf.x / sf.y;
            partials[ob + 1u] = o.y * sf.x / sf.y;
        }
        return;
    }
    let stride = HEAD_DIM + 2u;
    if (t < nh) {
        let ob = ((si * p.num_heads + h0 + t) * p.max_partitions + part) * stride;
        partials[ob] = mp_sh[t];
        partials[ob + 1u] = partition_sum(t);
    }
    for (var i = t; i < nh * words; i += WG) {
        let h = i / words;
        let w = i % words;
        let o = partition_pv(h, k0, fresh, seq, kvh, w);
        let ob = ((si * p.num_heads + h0 + h) * p.max_partitions + part) * stride + 2u + 2u * w;
        partials[ob] = o.x;
        partials[ob + 1u] = o.y;
    }
}
