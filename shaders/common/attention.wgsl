// Shared by the paged attention kernels (decode partials, decode reduce, prefill). They all
// compute, for one query token at position P, exactly the same sequence of float operations:
//
//   the query sees keys [lo, P]: lo = window_lo(P) (0 without a sliding window, else
//   max(0, P + 1 − window): HF's (P − W, P]);
//   keys are cut into partitions of PART positions aligned to absolute position 0;
//   per partition p, the query's valid keys are u in [max(start, lo), min(start + PART, P + 1));
//   a partition with no valid key for the query is skipped entirely (never merged); else
//     s_u  = qk_score(q, k_u)                       (fma chain over head_dim, then * scale)
//     m_p  = max_u s_u                              (from NEG_BIG)
//     e_u  = exp(s_u - m_p)
//     l_p  = e_0 + e_1 + ... (left to right, from 0)
//     o_p  = fma chain over u of e_u * v_u          (per dimension, from 0)
//   partitions merged left to right (merge_factors) from m = NEG_BIG, L = 0, O = 0, starting at
//   partition lo / PART; with attention sinks (gpt-oss) the head's sink logit is merged last as
//   a partition of one key and no value (sink_fold); out = O / L.
// That is the workgroup family (decode_partials, prefill). The lanes family for CPU adapters
// (common/attention_lanes.wgsl) computes m_p, l_p, o_p in one pass over the partition's keys
// instead, each key folded in with merge_factors(m, s_u) as a partition of one (fold_key),
// and merges partitions the same way. Within a family every kernel takes the same operations.
//
// So a token's attention output is bit-identical whether it was computed in a prefill chunk,
// alone in a decode step, or next to other sequences. No kernel reads a block table entry or a
// pool row for a position before lo: the KV manager frees blocks wholly out of the window.

struct AttnParams {
    num_heads: u32,       // query heads
    num_kv_heads: u32,
    block_size: u32,
    qkv_stride: u32,      // floats between token rows of qkv
    q_offset: u32,        // float offset of query head 0 in a row of qkv
    out_stride: u32,      // floats between token rows of the attention output
    heads_per_wg: u32,    // decode: query heads of one KV group handled by one workgroup
    max_partitions: u32,  // decode: partition capacity of the partials buffer per (seq, head)
    scale: f32,           // 1 / sqrt(head_dim)
    // quantized KV only (common/kv_quant.wgsl); 0 for f16
    k_offset: u32,        // float offset of KV head 0's K in a row of qkv
    v_offset: u32,        // float offset of KV head 0's V in a row of qkv
    stage_slots: u32,     // staging slots per K|V half of the staging buffer
    k_head_block_words: u32, // u32 words of one K head block (codes + scales)
    v_head_block_words: u32,
    k_data_words: u32,    // u32 words of codes at the start of a K head block
    v_data_words: u32,
    window: u32,          // sliding window W: keys (P − W, P] for a query at P; 0 = full causal
    pool_heads: u32,      // KV heads a pool block has room for (common/kv_pool.wgsl)
    pool_head_base: u32,  // the layer's first of them (common/kv_pool.wgsl)
    sinks_on: u32,        // 1: sinks holds the query heads' attention sinks (gpt-oss)
    sinks: array<vec4<f32>, 32>,  // query head h's sink logit at [h / 4][h % 4] (≤ 128 heads)
}

// Key positions per partition (kernels::KernelConfig::partition_keys): 64 for the workgroup
// family (its workgroup size; its arrays are sized PART_WORKGROUP), 64, 128 or 256 by host for
// the lanes family. Decode partials, decode reduce and prefill of one family take the same PART.
override PART: u32 = 64u;
const PART_WORKGROUP: u32 = 64u;  // PART of the workgroup family
const NEG_BIG: f32 = -3.0e38; // running max before the first partition (finite: no inf - inf)

override HEAD_DIM: u32 = 64u; // even, at most 576 (kernels::attention::MAX_HEAD_DIM)

// First key position a query at position `pos` sees: pos + 1 − window, or 0.
fn window_lo(pos: u32) -> u32 {
    if (p.window == 0u || pos < p.window) {
        return 0u;
    }
    return pos + 1u - p.window;
}

// Decode: the query heads workgroup row `y` serves, [h0, h0 + nh) of KV head kvh — a slice of
// at most p.heads_per_wg heads of one KV group (kernels::attention::heads_per_workgroup), so
// each key and value row is read once for all of them.
struct HeadSlice {
    kvh: u32,
    h0: u32,
    nh: u32,
}

fn head_slice(y: u32) -> HeadSlice {
    let group = p.num_heads / p.num_kv_heads;
    let slices = (group + p.heads_per_wg - 1u) / p.heads_per_wg;
    let kvh = y / slices;
    let h0 = kvh * group + (y % slices) * p.heads_per_wg;
    return HeadSlice(kvh, h0, min(p.heads_per_wg, kvh * group + group - h0));
}

// Merge factors for folding partition (m_p) into running max m_run: (a, b, m_new) such that
// L' = fma(L, a, l_p * b) and O' = fma(O, a, o_p * b).
fn merge_factors(m_run: f32, m_p: f32) -> vec3<f32> {
    let m_new = max(m_run, m_p);
    return vec3<f32>(exp(m_run - m_new), exp(m_p - m_new), m_new);
}

// Query head h's attention sink (gpt-oss: a learned logit in the softmax's denominator that
// brings no value) folded into the query's merged max m and sum l, as a partition of one key
// whose output is zero: (a, l') with out = O · a / l'. Without sinks (1, l): the same bits as
// O / l. Every kernel's last step, so prefill and decode fold it alike.
fn sink_fold(h: u32, m: f32, l: f32) -> vec2<f32> {
    if (p.sinks_on == 0u) {
        return vec2<f32>(1.0, l);
    }
    let f = merge_factors(m, p.sinks[h / 4u][h % 4u]);
    return vec2<f32>(f.x, fma(l, f.x, f.y));
}
