// Reading a quantized KV pool inside the attention kernels: dequantization is fused into the
// loads (codes → raw × s + m in registers; there is no dequantized copy anywhere). Prepended by
// kernels::source after kv_codec.wgsl and the format snippet (KVQ_*, kvq_raw*).
//
// Pool, per layer, K and V alike: [num_blocks, kv_heads] head blocks of p.k_head_block_words
//   u32: codes (token-major, KVQ_BITS each) then f16 scales, int4 minimums at f16 n + g
//   (quant/kv.rs). Block b, KV head h: word base (b · pool_heads + pool_head_base + h) ·
//   head_block_words (pool_heads, pool_head_base: common/kv_pool.wgsl).
// Staging: [2 (K, V), stage_slots, kv_heads, block_size, HEAD_DIM / 2] f16x2 — each running
//   sequence's partial last block (kv_stage writes it, kv_quantize reads it once the block fills).
// Word i of a pool is k_word(i) / v_word(i): kv_read_quant.wgsl over array<u32> bindings (the
//   workgroup kernels), kv_quant_lanes.wgsl over array<vec2<u32>> or array<u64> ones (head blocks
//   are whole word pairs; kv_pool_lanes_u32.wgsl, kv_pool_lanes_u64.wgsl).
//
// Which copy of key position k a query at position P reads — a function of (P, k) only, so a
// token's output is the same bits whether it was prefilled or decoded:
//   k < fresh_from(P), an earlier block → the quantized head block (complete: kv_quantize ran
//                                          first)
//   otherwise (P's own block), fresh     → f16: staging for k before the step's chunk, else the
//                                          step's own qkv row rounded to f16 (f16_round2)

override K_GRAN: u32 = 1u;  // GRAN_* of K
override V_GRAN: u32 = 2u;  // GRAN_* of V

@group(0) @binding(5) var<storage, read> stage: array<u32>;  // [2, stage_slots, kv_heads, block_size, HEAD_DIM/2] f16x2

// The first key a query at qpos reads fresh: its own block's first position.
const KV_FRESH: bool = true;

fn fresh_from(qpos: u32) -> u32 {
    return qpos / p.block_size * p.block_size;
}

// Scales one head block stores for granularity g.
fn gran_scales(g: u32) -> u32 {
    switch g {
        case GRAN_CHANNEL: { return HEAD_DIM; }
        case GRAN_TOKEN: { return p.block_size; }
        case GRAN_HEAD: { return 1u; }
        default: { return 0u; }
    }
}

// u32 index of word 0 of staged row (slot, KV head, offset in block) in the K (0) or V (1) half.
fn stage_row(part: u32, slot: u32, kvh: u32, off: u32) -> u32 {
    return (((part * p.stage_slots + slot) * p.num_kv_heads + kvh) * p.block_size + off) * (HEAD_DIM / 2u);
}

// f16 value i of the scale region of the K head block at word `base`.
fn k_half(base: u32, i: u32) -> f32 {
    return unpack2x16float(k_word(base + p.k_data_words + i / 2u))[i & 1u];
}

fn v_half(base: u32, i: u32) -> f32 {
    return unpack2x16float(v_word(base + p.v_data_words + i / 2u))[i & 1u];
}

// (s, m) of token t of a K head block, for every granularity but per-channel.
fn k_token_sm(base: u32, t: u32) -> vec2<f32> {
    if (K_GRAN == GRAN_TENSOR || K_GRAN == GRAN_CHANNEL) {
        return vec2<f32>(1.0, 0.0);
    }
    let g = select(0u, t, K_GRAN == GRAN_TOKEN);
    var m = 0.0;
    if (KVQ_HAS_MIN) {
        m = k_half(base, gran_scales(K_GRAN) + g);
    }
    return vec2<f32>(k_half(base, g), m);
}

fn v_token_sm(base: u32, t: u32) -> vec2<f32> {
    if (V_GRAN == GRAN_TENSOR || V_GRAN == GRAN_CHANNEL) {
        return vec2<f32>(1.0, 0.0);
    }
    let g = select(0u, t, V_GRAN == GRAN_TOKEN);
    var m = 0.0;
    if (KVQ_HAS_MIN) {
        m = v_half(base, gran_scales(V_GRAN) + g);
    }
    return vec2<f32>(v_half(base, g), m);
}

// Channels 2w and 2w+1 of token t of the K head block at word `base`, dequantized.
fn k_pair_q(base: u32, t: u32, w: u32) -> vec2<f32> {
    let e = t * HEAD_DIM + 2u * w;
    let per = 32u / KVQ_BITS;
    let raw = kvq_raw2(k_word(base + e / per), (e % per) / 2u);
    if (K_GRAN == GRAN_CHANNEL) {
        let s = unpack2x16float(k_word(base + p.k_data_words + w));
        var m = vec2<f32>(0.0);
        if (KVQ_HAS_MIN) {
            m = unpack2x16float(k_word(base + p.k_data_words + HEAD_DIM / 2u + w));
        }
        return raw * s + m;
    }
    let sm = k_token_sm(base, t);
    return raw * sm.x + sm.y;
}

fn v_pair_q(base: u32, t: u32, w: u32) -> vec2<f32> {
    let e = t * HEAD_DIM + 2u * w;
    let per = 32u / KVQ_BITS;
    let raw = kvq_raw2(v_word(base + e / per), (e % per) / 2u);
    if (V_GRAN == GRAN_CHANNEL) {
        let s = unpack2x16float(v_word(base + p.v_data_words + w));
        var m = vec2<f32>(0.0);
        if (KVQ_HAS_MIN) {
            m = unpack2x16float(v_word(base + p.v_data_words + HEAD_DIM / 2u + w));
        }
        return raw * s + m;
    }
    let sm = v_token_sm(base, t);
    return raw * sm.x + sm.y;
}
