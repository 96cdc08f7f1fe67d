// The lane-parallel attention kernels' KV reader over a quantized pool (the interface:
// kv_read_lanes_f16.wgsl; common/kv_quant.wgsl for the layout, the staging binding and the
// which-copy rule, fresh_from): lane j reads the codes of its channels
// [j·HEAD_DIM/8, (j+1)·HEAD_DIM/8) of a key or value row into a Lane, and the scales are
// applied where they cost least (k_fold and below).
//
// The pools' bindings and their word loads (pool_pair, pool_word) come from
// kv_pool_lanes_u32.wgsl or kv_pool_lanes_u64.wgsl (kernels::LaneLoads). Head blocks are whole
// word pairs (quant/kv.rs pads the scale region to an even word count), and for the head sizes
// these kernels serve (64, 128, 256) a lane's codes and per-channel scales start at even words.

fn k_word(i: u32) -> u32 {
    return pool_word(true, i);
}

fn v_word(i: u32) -> u32 {
    return pool_word(false, i);
}

// Word index of head block hb (block · kv_heads + kvh) in the K / V pool.
fn k_block_base(hb: u32) -> u32 {
    return hb * p.k_head_block_words;
}

fn v_block_base(hb: u32) -> u32 {
    return hb * p.v_head_block_words;
}

// Per-channel scales and minimums of this lane's channels, loaded once per head block.
struct LaneScales {
    s: Lane,
    m: Lane,
}

// Four f16 values at even word i of the K (from_k) or V pool.
fn f16x4_at(from_k: bool, i: u32) -> vec4<f32> {
    let d = pool_pair(from_k, i / 2u);
    return f16x4(d.x, d.y);
}

// This lane's per-channel scales (and int4 minimums) of the K (from_k) or V head block at word
// `base`; unused (zero) for the other granularities.
fn lane_scales(from_k: bool, base: u32, lane: u32) -> LaneScales {
    var r = LaneScales(lane_zero(), lane_zero());
    if (select(V_GRAN, K_GRAN, from_k) != GRAN_CHANNEL) {
        return r;
    }
    let c0 = lane * 4u * LANE_VECS;
    let data = base + select(p.v_data_words, p.k_data_words, from_k);
    let si = data + c0 / 2u;
    let mi = data + (HEAD_DIM + c0) / 2u;
    for (var j = 0u; j < LANE_VECS; j++) {
        r.s.v[j] = f16x4_at(from_k, si + 2u * j);
        if (KVQ_HAS_MIN) {
            r.m.v[j] = f16x4_at(from_k, mi + 2u * j);
        }
    }
    return r;
}

fn k_lane_scales(base: u32, lane: u32) -> LaneScales {
    return lane_scales(true, base, lane);
}

fn v_lane_scales(base: u32, lane: u32) -> LaneScales {
    return lane_scales(false, base, lane);
}

// raw × s + m, element by element (per-channel V; + m only for formats with minimums).
fn lane_affine(r: Lane, s: Lane, m: Lane) -> Lane {
    var a = lane_mul(r, s);
    if (KVQ_HAS_MIN) {
        for (var j = 0u; j < LANE_VECS; j++) {
            a.v[j] = a.v[j] + m.v[j];
        }
    }
    return a;
}

// Word of this lane's first code of token t in the head block at word `base`.
fn lane_code_word(base: u32, t: u32, lane: u32) -> u32 {
    return base + (t * HEAD_DIM + lane * 8u * WPL) * KVQ_BITS / 32u;
}

// This lane's raw codes of token t of the K (from_k) or V head block at word `base`: 8 × WPL
// codes, one word pair for each 8 int8 / fp8 codes and for each 16 int4 ones; 8 int4 codes (WPL 1)
// are one word.
fn lane_raw(from_k: bool, base: u32, t: u32, lane: u32) -> Lane {
    let i = lane_code_word(base, t, lane);
    var r = lane_zero();
    if (KVQ_WORDS8 == 1u && WPL == 1u) {
        let r0 = kvq_raw8(pool_word(from_k, i), 0u);
        r.v[0] = r0.lo;
        r.v[1] = r0.hi;
        return r;
    }
    if (KVQ_WORDS8 == 2u) {
        for (var g = 0u; g < WPL; g++) {
            let d = pool_pair(from_k, i / 2u + g);
            let r0 = kvq_raw8(d.x, d.y);
            r.v[2u * g] = r0.lo;
            r.v[2u * g + 1u] = r0.hi;
        }
        return r;
    }
    for (var u = 0u; u < WPL / 2u; u++) {
        let d = pool_pair(from_k, i / 2u + u);
        let r0 = kvq_raw8(d.x, 0u);
        let r1 = kvq_raw8(d.y, 0u);
        r.v[4u * u] = r0.lo;
        r.v[4u * u + 1u] = r0.hi;
        r.v[4u * u + 2u] = r1.lo;
        r.v[4u * u + 3u] = r1.hi;
    }
    return r;
}

fn k_lane_raw(base: u32, t: u32, lane: u32) -> Lane {
    return lane_raw(true, base, t, lane);
}

fn v_lane_raw(base: u32, t: u32, lane: u32) -> Lane {
    return lane_raw(false, base, t, lane);
}

// Quantized keys and values are never dequantized per key where the algebra lets the scales
// move out of the per-key work (on llvmpipe the per-element affine cost as much as the loads):
//   q · (raw ∘ s + m)     = (q ∘ s) · raw + q · m        per-channel K: folded into q per block
//   q · (raw × s_t + m_t) = (q · raw) × s_t + m_t × Σq   per-token / per-head K: on the score
//   Σ_t e_t (raw_t × s_t + m_t) = Σ_t (e_t s_t) raw_t + Σ_t e_t m_t   V but per-channel: the
//                                  weight carries s_t, the minimums' sum is added once at the end
// Per-channel V is dequantized per key (raw ∘ s + m): its scales change from block to block
// inside a partition. Decode and prefill (lanes) use these in the same order, so a token's
// output is the same bits in both; the workgroup kernels dequantize per element and round
// differently (both are checked against the CPU reference).

// A query as the keys of one head block see it: q ∘ s for per-channel K (else q), and this
// lane's part of q · m (per-channel int4: the minimums' term of every score in the block).
struct KQuery {
    q: Lane,
    b: f32,
}

fn k_fold(q: Lane, ks: LaneScales) -> KQuery {
    if (K_GRAN != GRAN_CHANNEL) {
        return KQuery(q, 0.0);
    }
    let qs = lane_mul(q, ks.s);
    if (KVQ_HAS_MIN) {
        return KQuery(qs, lane_dot(q, ks.m));
    }
    return KQuery(qs, 0.0);
}

// This lane's part of a score against the raw codes of a key (summed over lanes by the caller).
fn k_lane_dot(kq: KQuery, raw: Lane) -> f32 {
    let d = lane_dot(kq.q, raw);
    if (K_GRAN == GRAN_CHANNEL && KVQ_HAS_MIN) {
        return d + kq.b;
    }
    return d;
}

// The score from the lanes' sum `d` of k_lane_dot: × the key's scale, + its minimum × Σq
// (`sm`: k_token_sm; `qsum`: lanes' sum of lane_total(q)). Per-channel and per-tensor K: d.
fn k_score(d: f32, sm: vec2<f32>, qsum: f32) -> f32 {
    if (K_GRAN == GRAN_CHANNEL || K_GRAN == GRAN_TENSOR) {
        return d;
    }
    if (KVQ_HAS_MIN) {
        return fma(d, sm.x, sm.y * qsum);
    }
    return d * sm.x;
}

// Σ of channels [8g, 8g + 8) of q, and of all this lane's channels, in lane_dot's order.
fn group8_total(q: Lane, g: u32) -> f32 {
    let a = q.v[2u * g];
    let b = q.v[2u * g + 1u];
    return (a.x + a.y) + (a.z + a.w) + ((b.x + b.y) + (b.z + b.w));
}

fn lane_total(q: Lane) -> f32 {
    var s = group8_total(q, 0u);
    for (var g = 1u; g < WPL; g++) {
        s = s + group8_total(q, g);
    }
    return s;
}

// What k_score needs of a query: this lane's Σ of its channels.
fn query_total(q: Lane) -> f32 {
    return lane_total(q);
}

// Token t of the V head block at `base` as the accumulation takes it: per-channel V
// dequantized (`cs`: v_lane_scales), else the raw codes (v_weight carries the scale).
fn v_lane_load(base: u32, t: u32, lane: u32, cs: LaneScales) -> Lane {
    let raw = v_lane_raw(base, t, lane);
    if (V_GRAN == GRAN_CHANNEL) {
        return lane_affine(raw, cs.s, cs.m);
    }
    return raw;
}

// The weight of v_lane_load's row in o: e × s_t (`sm`: v_token_sm), or e.
fn v_weight(e: f32, sm: vec2<f32>) -> f32 {
    if (V_GRAN == GRAN_CHANNEL || V_GRAN == GRAN_TENSOR) {
        return e;
    }
    return e * sm.x;
}

// The running Σ e × m_t of the minimums (int4 V but per-channel), and o with it added.
fn v_min_acc(e: f32, sm: vec2<f32>, acc: f32) -> f32 {
    if (KVQ_HAS_MIN && V_GRAN != GRAN_CHANNEL) {
        return fma(e, sm.y, acc);
    }
    return acc;
}

fn v_min_apply(o: Lane, acc: f32) -> Lane {
    if (KVQ_HAS_MIN && V_GRAN != GRAN_CHANNEL) {
        var r = o;
        for (var j = 0u; j < LANE_VECS; j++) {
            r.v[j] = o.v[j] + vec4<f32>(acc);
        }
        return r;
    }
    return o;
}

fn f16_round4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(f16_round2(v.xy), f16_round2(v.zw));
}

// This lane's channels of K (part 0) or V (part 1) at position `pos` of `seq`, in f16: from the
// staging slot before the step's chunk, else from the step's qkv row (rounded to f16).
fn kv_lane_f16(part: u32, seq: SeqInfo, pos: u32, kvh: u32, lane: u32) -> Lane {
    let chunk = seq.ctx_len - seq.q_len;
    var r = lane_zero();
    if (pos < chunk) {
        let i = stage_row(part, seq.stage_slot, kvh, pos % p.block_size) + lane * 2u * LANE_VECS;
        for (var j = 0u; j < LANE_VECS; j++) {
            r.v[j] = f16x4(stage[i + 2u * j], stage[i + 2u * j + 1u]);
        }
        return r;
    }
    let off = select(p.k_offset, p.v_offset, part == 1u);
    let i = ((seq.q_start + pos - chunk) * p.qkv_stride + off + kvh * HEAD_DIM) / 4u + lane * LANE_VECS;
    for (var j = 0u; j < LANE_VECS; j++) {
        r.v[j] = f16_round4(qkv[i + j]);
    }
    return r;
}

