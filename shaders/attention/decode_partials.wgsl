// Paged decode attention, split-K part (FlashDecoding): one workgroup per
// (partition of PART key positions, slice of the query heads of one KV head, decode sequence).
// GQA/MQA by index broadcast: query head h reads KV head h / (num_heads / num_kv_heads); the
// keys of a partition are read once for all query heads of the slice.
// Writes (m_p, l_p, o_p[HEAD_DIM]) per (sequence, query head, partition); decode_reduce merges.

const WG: u32 = 64u;
const MAX_HEADS_PER_WG: u32 = 16u;

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;             // [tokens, qkv_stride]
@group(0) @binding(3) var<storage, read> k_pool: array<u32>;          // [blocks, kv_heads, block_size, HEAD_DIM/2] f16x2
@group(0) @binding(4) var<storage, read> v_pool: array<u32>;          // same
@group(0) @binding(5) var<storage, read> seqs: array<SeqInfo>;        // [num_seqs]; decode ones first
@group(0) @binding(6) var<storage, read> block_tables: array<u32>;    // concatenated tables
@group(0) @binding(7) var<storage, read_write> partials: array<f32>;  // [decode_seqs, num_heads, max_partitions, HEAD_DIM + 2]

var<workgroup> q_sh: array<f32, 2048>;    // [heads_per_wg, HEAD_DIM]
var<workgroup> s_sh: array<f32, 1024>;    // [heads_per_wg, PART] scores, then exp
var<workgroup> base_sh: array<u32, PART_WORKGROUP>; // word offset of each key's row in the pools
var<workgroup> m_sh: array<f32, MAX_HEADS_PER_WG>;

fn qk_score(q_off: u32, kb: u32) -> f32 {
    var s = 0.0;
    for (var w = 0u; w < HEAD_DIM / 2u; w++) {
        let k = unpack2x16float(k_pool[kb + w]);
        s = fma(q_sh[q_off + 2u * w], k.x, s);
        s = fma(q_sh[q_off + 2u * w + 1u], k.y, s);
    }
    return s * p.scale;
}

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

    let q_row = seq.q_start * p.qkv_stride + p.q_offset + h0 * HEAD_DIM;
    for (var i = t; i < nh * HEAD_DIM; i += WG) {
        q_sh[i] = qkv[q_row + i];
    }
    if (t < n_valid) {
        let pos = k0 + t;
        let block = block_tables[seq.table_start + pos / p.block_size];
        base_sh[t] = ((block * p.num_kv_heads + kvh) * p.block_size + pos % p.block_size) * words;
    }
    workgroupBarrier();
    if (t < n_valid) {
        for (var h = 0u; h < nh; h++) {
            s_sh[h * PART + t] = qk_score(h * HEAD_DIM, base_sh[t]);
        }
    }
    workgroupBarrier();
    if (t < nh) {
        var m = NEG_BIG;
        for (var u = 0u; u < n_valid; u++) {
            m = max(m, s_sh[t * PART + u]);
        }
        m_sh[t] = m;
    }
    workgroupBarrier();
    for (var i = t; i < nh * PART; i += WG) {
        if (i % PART < n_valid) {
            s_sh[i] = exp(s_sh[i] - m_sh[i / PART]);
        }
    }
    workgroupBarrier();
    let stride = HEAD_DIM + 2u;
    if (t < nh) {
        var l = 0.0;
        for (var u = 0u; u < n_valid; u++) {
            l = l + s_sh[t * PART + u];
        }
        let ob = ((si * p.num_heads + h0 + t) * p.max_partitions + part) * stride;
        partials[ob] = m_sh[t];
        partials[ob + 1u] = l;
    }
    for (var i = t; i < nh * words; i += WG) {
        let h = i / words;
        let w = i % words;
        var o = vec2<f32>(0.0);
        for (var u = 0u; u < n_valid; u++) {
            o = fma(vec2<f32>(s_sh[h * PART + u]), unpack2x16float(v_pool[base_sh[u] + w]), o);
        }
        let ob = ((si * p.num_heads + h0 + h) * p.max_partitions + part) * stride + 2u + 2u * w;
        partials[ob] = o.x;
        partials[ob + 1u] = o.y;
    }
}
