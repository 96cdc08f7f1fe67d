// Paged prefill attention over a quantized KV pool: prefill.wgsl with the dequantization fused
// into the loads (common/kv_quant.wgsl). One workgroup per (tile of up to QT query tokens of one
// sequence, query head). Which copy of a key a query reads depends on the query: a key in an
// earlier block than the query's is dequantized, one in the query's own block is f16 (staging
// or this step's qkv row). Keys before a query's window (window_lo) are neither read nor
// counted. Per query the arithmetic is decode_partials_kvq.wgsl + decode_reduce.wgsl's, so a
// token's output is the same bits in both.

const WG: u32 = 64u;
const MAX_QT: u32 = 16u;
const MAX_EPT: u32 = 16u;     // output elements (f16 pairs) per invocation

override QT: u32 = 16u;       // query tokens per tile: min(16, 2048 / HEAD_DIM)

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;            // [tokens, qkv_stride]
@group(0) @binding(3) var<storage, read> k_pool: array<u32>;         // [blocks, kv_heads, k_head_block_words]
@group(0) @binding(4) var<storage, read> v_pool: array<u32>;         // [blocks, kv_heads, v_head_block_words]
@group(0) @binding(5) var<storage, read> stage: array<u32>;          // [2, stage_slots, kv_heads, block_size, HEAD_DIM/2] f16x2
@group(0) @binding(6) var<storage, read> seqs: array<SeqInfo>;       // [num_seqs]
@group(0) @binding(7) var<storage, read> block_tables: array<u32>;   // concatenated tables
@group(0) @binding(8) var<storage, read> tiles: array<vec2<u32>>;    // [num_prefill_tiles] (seq index, first query index)
@group(0) @binding(9) var<storage, read_write> out: array<f32>;      // [tokens, out_stride]

var<workgroup> q_sh: array<f32, 2048>;     // [QT, HEAD_DIM]
var<workgroup> s_sh: array<f32, 1024>;     // [QT, PART] scores, then exp
var<workgroup> hb_sh: array<u32, PART_WORKGROUP>;    // head block index (block · kv_heads + kvh) of each key
var<workgroup> ulo_sh: array<u32, MAX_QT>; // valid keys of the partition per query:
var<workgroup> uhi_sh: array<u32, MAX_QT>; //   start + [ulo, uhi), empty if ulo = uhi
var<workgroup> mp_sh: array<f32, MAX_QT>;  // partition max per query
var<workgroup> m_sh: array<f32, MAX_QT>;   // running max per query
var<workgroup> l_sh: array<f32, MAX_QT>;   // running sum per query
var<workgroup> a_sh: array<f32, MAX_QT>;   // merge factor of the running output
var<workgroup> b_sh: array<f32, MAX_QT>;   // merge factor of the partition output

fn kv_pair_f16(part: u32, seq: SeqInfo, kvh: u32, pos: u32, w: u32) -> vec2<f32> {
    let chunk = seq.ctx_len - seq.q_len;
    if (pos < chunk) {
        return unpack2x16float(stage[stage_row(part, seq.stage_slot, kvh, pos % p.block_size) + w]);
    }
    let off = select(p.k_offset, p.v_offset, part == 1u);
    let r = (seq.q_start + pos - chunk) * p.qkv_stride + off + kvh * HEAD_DIM + 2u * w;
    return f16_round2(vec2<f32>(qkv[r], qkv[r + 1u]));
}

// Inner loops below step 8 at a time (then one at a time for the rest) in the same order of
// operations as one at a time, as in prefill.wgsl: llvmpipe stops an invocation's loops after
// 65,535 iterations in total (DESIGN.md, "Traps").

fn qk_pair(q_off: u32, k: vec2<f32>, w: u32, s: f32) -> f32 {
    return fma(q_sh[q_off + 2u * w + 1u], k.y, fma(q_sh[q_off + 2u * w], k.x, s));
}

fn k_pair(seq: SeqInfo, kvh: u32, pos: u32, base: u32, quant: bool, w: u32) -> vec2<f32> {
    if (quant) {
        return k_pair_q(base, pos % p.block_size, w);
    }
    return kv_pair_f16(0u, seq, kvh, pos, w);
}

fn qk_score(q_off: u32, seq: SeqInfo, kvh: u32, pos: u32, hb: u32, quant: bool) -> f32 {
    let base = hb * p.k_head_block_words;
    var s = 0.0;
    var w = 0u;
    for (; w + 8u <= HEAD_DIM / 2u; w += 8u) {
        s = qk_pair(q_off, k_pair(seq, kvh, pos, base, quant, w), w, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, base, quant, w + 1u), w + 1u, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, base, quant, w + 2u), w + 2u, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, base, quant, w + 3u), w + 3u, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, base, quant, w + 4u), w + 4u, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, base, quant, w + 5u), w + 5u, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, base, quant, w + 6u), w + 6u, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, base, quant, w + 7u), w + 7u, s);
    }
    for (; w < HEAD_DIM / 2u; w++) {
        s = qk_pair(q_off, k_pair(seq, kvh, pos, base, quant, w), w, s);
    }
    return s * p.scale;
}

fn v_pair(seq: SeqInfo, kvh: u32, pos: u32, hb: u32, quant: bool, w: u32) -> vec2<f32> {
    if (quant) {
        return v_pair_q(hb * p.v_head_block_words, pos % p.block_size, w);
    }
    return kv_pair_f16(1u, seq, kvh, pos, w);
}

// o + e_u · v_u for key u of the partition starting at `start`, for query qi and word w.
fn pv1(seq: SeqInfo, kvh: u32, start: u32, qi: u32, qblk: u32, u: u32, w: u32, o: vec2<f32>) -> vec2<f32> {
    let kpos = start + u;
    let v = v_pair(seq, kvh, kpos, hb_sh[u], kpos / p.block_size < qblk, w);
    return fma(vec2<f32>(s_sh[qi * PART + u]), v, o);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    if (wid.x >= step.num_prefill_tiles) {
        return;
    }
    let tile = tiles[wid.x];
    let seq = seqs[tile.x];
    let h = wid.y;
    let kvh = h / (p.num_heads / p.num_kv_heads);
    let nq = min(QT, seq.q_len - tile.y);
    let pos0 = seq.ctx_len - seq.q_len + tile.y;  // position of the tile's first query
    let last = pos0 + nq - 1u;
    let tile_lo = window_lo(pos0);  // no query of the tile sees a key before this
    let words = HEAD_DIM / 2u;
    let t = lid.x;
    let bs = p.block_size;

    for (var i = t; i < nq * HEAD_DIM; i += WG) {
        let qi = i / HEAD_DIM;
        let tok = seq.q_start + tile.y + qi;
        q_sh[i] = qkv[tok * p.qkv_stride + p.q_offset + h * HEAD_DIM + i % HEAD_DIM];
    }
    if (t < nq) {
        m_sh[t] = NEG_BIG;
        l_sh[t] = 0.0;
    }
    var o_acc: array<vec2<f32>, MAX_EPT>;
    let ept = (QT * words + WG - 1u) / WG;
    for (var j = 0u; j < ept; j++) {
        o_acc[j] = vec2<f32>(0.0);
    }

    for (var start = tile_lo / PART * PART; start <= last; start += PART) {
        let pos = start + t;
        let needed = pos >= tile_lo && pos <= last;
        if (needed) {
            hb_sh[t] = block_tables[seq.table_start + pos / bs] * p.num_kv_heads + kvh;
        }
        workgroupBarrier();
        if (needed) {
            for (var qi = 0u; qi < nq; qi++) {
                let qpos = pos0 + qi;
                if (pos <= qpos && pos >= window_lo(qpos)) {
                    s_sh[qi * PART + t] = qk_score(qi * HEAD_DIM, seq, kvh, pos, hb_sh[t], pos / bs < qpos / bs);
                }
            }
        }
        if (t < nq) {
            let qpos = pos0 + t;
            let a = max(start, window_lo(qpos));
            let b = min(start + PART, qpos + 1u);
            ulo_sh[t] = select(0u, a - start, a < b);
            uhi_sh[t] = select(0u, b - start, a < b);
        }
        workgroupBarrier();
        if (t < nq) {
            mp_sh[t] = partition_max(t);
        }
        workgroupBarrier();
        for (var i = t; i < nq * PART; i += WG) {
            let u = i % PART;
            if (u >= ulo_sh[i / PART] && u < uhi_sh[i / PART]) {
                s_sh[i] = exp(s_sh[i] - mp_sh[i / PART]);
            }
        }
        workgroupBarrier();
        if (t < nq && ulo_sh[t] < uhi_sh[t]) {
            let l = partition_sum(t);
            let f = merge_factors(m_sh[t], mp_sh[t]);
            l_sh[t] = fma(l_sh[t], f.x, l * f.y);
            m_sh[t] = f.z;
            a_sh[t] = f.x;
            b_sh[t] = f.y;
        }
        workgroupBarrier();
        for (var j = 0u; j < ept; j++) {
            let e = t + j * WG;
            let qi = e / words;
            if (qi < nq && ulo_sh[qi] < uhi_sh[qi]) {
                let w = e % words;
                let qblk = (pos0 + qi) / bs;
                var o = vec2<f32>(0.0);
                var u = ulo_sh[qi];
                for (; u + 8u <= uhi_sh[qi]; u += 8u) {
                    o = pv1(seq, kvh, start, qi, qblk, u, w, o);
                    o = pv1(seq, kvh, start, qi, qblk, u + 1u, w, o);
                    o = pv1(seq, kvh, start, qi, qblk, u + 2u, w, o);
                    o = pv1(seq, kvh, start, qi, qblk, u + 3u, w, o);
                    o = pv1(seq, kvh, start, qi, qblk, u + 4u, w, o);
                    o = pv1(seq, kvh, start, qi, qblk, u + 5u, w, o);
                    o = pv1(seq, kvh, start, qi, qblk, u + 6u, w, o);
                    o = pv1(seq, kvh, start, qi, qblk, u + 7u, w, o);
                }
                for (; u < uhi_sh[qi]; u++) {
                    o = pv1(seq, kvh, start, qi, qblk, u, w, o);
                }
                o_acc[j] = fma(o_acc[j], vec2<f32>(a_sh[qi]), o * b_sh[qi]);
            }
        }
        workgroupBarrier();
    }

    for (var j = 0u; j < ept; j++) {
        let e = t + j * WG;
        let qi = e / words;
        if (qi < nq) {
            let w = e % words;
            let tok = seq.q_start + tile.y + qi;
            let ob = tok * p.out_stride + h * HEAD_DIM + 2u * w;
            out[ob] = o_acc[j].x / l_sh[qi];
            out[ob + 1u] = o_acc[j].y / l_sh[qi];
        }
    }
}
