// Paged decode attention over a quantized KV pool, split-K part: decode_partials.wgsl with the
// dequantization fused into the loads (common/kv_quant.wgsl). One workgroup per (partition of
// PART key positions, slice of the query heads of one KV head, decode sequence). Keys before the
// query's own block are dequantized pair by pair from their head blocks; the own block's keys
// are f16, from the staging slot or this step's qkv row. prefill_kvq.wgsl repeats the
// arithmetic per query, so a token's output is the same bits in both.

const WG: u32 = 64u;
const MAX_HEADS_PER_WG: u32 = 16u;

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;             // [tokens, qkv_stride]
@group(0) @binding(3) var<storage, read> k_pool: array<u32>;          // [blocks, kv_heads, k_head_block_words]
@group(0) @binding(4) var<storage, read> v_pool: array<u32>;          // [blocks, kv_heads, v_head_block_words]
@group(0) @binding(5) var<storage, read> stage: array<u32>;           // [2, stage_slots, kv_heads, block_size, HEAD_DIM/2] f16x2
@group(0) @binding(6) var<storage, read> seqs: array<SeqInfo>;        // [num_seqs]; decode ones first
@group(0) @binding(7) var<storage, read> block_tables: array<u32>;    // concatenated tables
@group(0) @binding(8) var<storage, read_write> partials: array<f32>;  // [decode_seqs, num_heads, max_partitions, HEAD_DIM + 2]

var<workgroup> q_sh: array<f32, 2048>;    // [heads_per_wg, HEAD_DIM]
var<workgroup> s_sh: array<f32, 1024>;    // [heads_per_wg, PART] scores, then exp
var<workgroup> hb_sh: array<u32, PART_WORKGROUP>;   // head block index (block · kv_heads + kvh) of each key
var<workgroup> m_sh: array<f32, MAX_HEADS_PER_WG>;

// Channels 2w, 2w+1 of K (part 0) or V (part 1) at `pos` of `seq` in f16: staging before the
// step's chunk, else the step's qkv row rounded to f16.
fn kv_pair_f16(part: u32, seq: SeqInfo, kvh: u32, pos: u32, w: u32) -> vec2<f32> {
    let chunk = seq.ctx_len - seq.q_len;
    if (pos < chunk) {
        return unpack2x16float(stage[stage_row(part, seq.stage_slot, kvh, pos % p.block_size) + w]);
    }
    let off = select(p.k_offset, p.v_offset, part == 1u);
    let r = (seq.q_start + pos - chunk) * p.qkv_stride + off + kvh * HEAD_DIM + 2u * w;
    return f16_round2(vec2<f32>(qkv[r], qkv[r + 1u]));
}

// q · k over HEAD_DIM (fma chain over channel pairs) × scale; k quantized or f16.
fn qk_score(q_off: u32, seq: SeqInfo, kvh: u32, pos: u32, hb: u32, quant: bool) -> f32 {
    var s = 0.0;
    if (quant) {
        let base = hb * p.k_head_block_words;
        let t = pos % p.block_size;
        for (var w = 0u; w < HEAD_DIM / 2u; w++) {
            let k = k_pair_q(base, t, w);
            s = fma(q_sh[q_off + 2u * w], k.x, s);
            s = fma(q_sh[q_off + 2u * w + 1u], k.y, s);
        }
    } else {
        for (var w = 0u; w < HEAD_DIM / 2u; w++) {
            let k = kv_pair_f16(0u, seq, kvh, pos, w);
            s = fma(q_sh[q_off + 2u * w], k.x, s);
            s = fma(q_sh[q_off + 2u * w + 1u], k.y, s);
        }
    }
    return s * p.scale;
}

fn v_pair(seq: SeqInfo, kvh: u32, pos: u32, hb: u32, quant: bool, w: u32) -> vec2<f32> {
    if (quant) {
        return v_pair_q(hb * p.v_head_block_words, pos % p.block_size, w);
    }
    return kv_pair_f16(1u, seq, kvh, pos, w);
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
    let own = (seq.ctx_len - 1u) / p.block_size * p.block_size;  // keys before: quantized

    let q_row = seq.q_start * p.qkv_stride + p.q_offset + h0 * HEAD_DIM;
    for (var i = t; i < nh * HEAD_DIM; i += WG) {
        q_sh[i] = qkv[q_row + i];
    }
    if (t < n_valid) {
        let pos = k0 + t;
        hb_sh[t] = block_tables[seq.table_start + pos / p.block_size] * p.num_kv_heads + kvh;
    }
    workgroupBarrier();
    if (t < n_valid) {
        let pos = k0 + t;
        for (var h = 0u; h < nh; h++) {
            s_sh[h * PART + t] = qk_score(h * HEAD_DIM, seq, kvh, pos, hb_sh[t], pos < own);
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
            let pos = k0 + u;
            o = fma(vec2<f32>(s_sh[h * PART + u]), v_pair(seq, kvh, pos, hb_sh[u], pos < own, w), o);
        }
        let ob = ((si * p.num_heads + h0 + h) * p.max_partitions + part) * stride + 2u + 2u * w;
        partials[ob] = o.x;
        partials[ob + 1u] = o.y;
    }
}
