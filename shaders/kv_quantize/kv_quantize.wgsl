// Quantizes the KV head blocks completed in this step, bit for bit as
// quant::quantize_head_block: one workgroup per (completed block, KV head, K|V).
// A completed block's block_size tokens come from two places: the first `staged` positions
// (those before the step's chunk) from the sequence's f16 staging slot, the rest from this
// step's qkv rows, rounded to f16 exactly as kv_stage rounds them. So the block's codes depend
// only on its block_size f16 rows, whichever steps computed them.
// Per workgroup: (1) the range of every scale group → its stored (s, m) in workgroup memory;
// (2) the scale words (two f16 per word, one writer each); (3) the code words (one writer
// each). Granularities are override constants, the format a snippet (KVQ_*, kvq_*).
// Pool layout: common/kv_quant.wgsl; head block layout: quant/kv.rs.

struct KvQuantizeParams {
    num_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    qkv_stride: u32,          // floats between token rows of qkv
    k_offset: u32,            // float offset of KV head 0's K in a row
    v_offset: u32,
    stage_slots: u32,         // staging slots per K|V half of the staging buffer
    k_head_block_words: u32,  // u32 words of a K head block: codes, then scales
    v_head_block_words: u32,
    k_data_words: u32,        // u32 words of codes in a K head block
    v_data_words: u32,
    pool_heads: u32,          // KV heads a pool block has room for (common/kv_pool.wgsl)
    pool_head_base: u32,      // the layer's first of them
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

override K_GRAN: u32 = 1u;
override V_GRAN: u32 = 2u;

const WG: u32 = 64u;
const MAX_GROUPS: u32 = 1024u;  // max(block_size, head_dim) scale groups

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: KvQuantizeParams;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;                 // [tokens, qkv_stride]
@group(0) @binding(3) var<storage, read> stage: array<u32>;               // [2, stage_slots, kv_heads, block_size, head_dim/2] f16x2
@group(0) @binding(4) var<storage, read> completed: array<vec4<u32>>;     // [num_completed_blocks] (block id, staging slot, first row, staged tokens)
@group(0) @binding(5) var<storage, read_write> k_pool: array<u32>;        // [blocks, kv_heads, k_head_block_words]
@group(0) @binding(6) var<storage, read_write> v_pool: array<u32>;        // [blocks, kv_heads, v_head_block_words]

var<workgroup> g_s: array<f32, MAX_GROUPS>;  // stored scale of each group
var<workgroup> g_m: array<f32, MAX_GROUPS>;  // stored minimum (int4) of each group
var<workgroup> lo_sh: array<f32, WG>;        // per-head partial ranges
var<workgroup> hi_sh: array<f32, WG>;

// Element (token t, channel c) of K (part 0) or V (part 1) of KV head h of completed block `blk`.
fn value(part: u32, blk: vec4<u32>, h: u32, t: u32, c: u32) -> f32 {
    if (t < blk.w) {
        let row = ((part * p.stage_slots + blk.y) * p.num_kv_heads + h) * p.block_size + t;
        return unpack2x16float(stage[row * (p.head_dim / 2u) + c / 2u])[c & 1u];
    }
    let off = select(p.k_offset, p.v_offset, part == 1u);
    let x = qkv[(blk.z + t - blk.w) * p.qkv_stride + off + h * p.head_dim + c];
    return f16_round2(vec2<f32>(x, 0.0)).x;
}

fn num_groups(g: u32) -> u32 {
    switch g {
        case GRAN_CHANNEL: { return p.head_dim; }
        case GRAN_TOKEN: { return p.block_size; }
        case GRAN_HEAD: { return 1u; }
        default: { return 0u; }
    }
}

fn group_of(g: u32, t: u32, c: u32) -> u32 {
    return select(select(0u, t, g == GRAN_TOKEN), c, g == GRAN_CHANNEL);
}

// f16 number j of the scale region: the n scales, then (int4) the n minimums, then 0.
fn scale_half(j: u32, n: u32) -> u32 {
    if (j < n) {
        return f16_bits(g_s[j]);
    }
    if (KVQ_HAS_MIN && j < 2u * n) {
        return f16_bits(g_m[j - n]);
    }
    return 0u;
}

fn store(part: u32, i: u32, w: u32) {
    if (part == 0u) {
        k_pool[i] = w;
    } else {
        v_pool[i] = w;
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    if (wid.x >= step.num_completed_blocks) {
        return;
    }
    let blk = completed[wid.x];
    let h = wid.y;
    let part = wid.z;
    let tid = lid.x;
    let gran = select(K_GRAN, V_GRAN, part == 1u);
    let n = num_groups(gran);
    let bs = p.block_size;
    let hd = p.head_dim;

    // (1) ranges → stored scales
    if (gran == GRAN_HEAD) {
        var lo = 3.4e38;
        var hi = -3.4e38;
        for (var i = tid; i < bs * hd; i += WG) {
            let x = value(part, blk, h, i / hd, i % hd);
            lo = min(lo, x);
            hi = max(hi, x);
        }
        lo_sh[tid] = lo;
        hi_sh[tid] = hi;
    } else if (gran != GRAN_TENSOR) {
        for (var g = tid; g < n; g += WG) {
            var lo = 3.4e38;
            var hi = -3.4e38;
            if (gran == GRAN_CHANNEL) {
                for (var t = 0u; t < bs; t++) {
                    let x = value(part, blk, h, t, g);
                    lo = min(lo, x);
                    hi = max(hi, x);
                }
            } else {
                for (var c = 0u; c < hd; c++) {
                    let x = value(part, blk, h, g, c);
                    lo = min(lo, x);
                    hi = max(hi, x);
                }
            }
            let sm = kvq_group_scale(lo, hi);
            g_s[g] = sm.x;
            g_m[g] = sm.y;
        }
    }
    workgroupBarrier();
    if (gran == GRAN_HEAD && tid == 0u) {
        var lo = lo_sh[0];
        var hi = hi_sh[0];
        for (var i = 1u; i < WG; i++) {
            lo = min(lo, lo_sh[i]);
            hi = max(hi, hi_sh[i]);
        }
        let sm = kvq_group_scale(lo, hi);
        g_s[0] = sm.x;
        g_m[0] = sm.y;
    }
    workgroupBarrier();

    let hbw = select(p.k_head_block_words, p.v_head_block_words, part == 1u);
    let dw = select(p.k_data_words, p.v_data_words, part == 1u);
    let base = (blk.x * p.pool_heads + p.pool_head_base + h) * hbw;
    // (2) scale words
    let halves = select(n, 2u * n, KVQ_HAS_MIN);
    for (var i = tid; i < (halves + 1u) / 2u; i += WG) {
        store(part, base + dw + i, scale_half(2u * i, n) | (scale_half(2u * i + 1u, n) << 16u));
    }
    // (3) code words
    let per = 32u / KVQ_BITS;
    for (var i = tid; i < dw; i += WG) {
        var word = 0u;
        for (var j = 0u; j < per; j++) {
            let e = i * per + j;
            let t = e / hd;
            let c = e % hd;
            var sm = vec2<f32>(1.0, 0.0);
            if (gran != GRAN_TENSOR) {
                let g = group_of(gran, t, c);
                sm = vec2<f32>(g_s[g], g_m[g]);
            }
            word = word | (kvq_encode(value(part, blk, h, t, c), sm) << (j * KVQ_BITS));
        }
        store(part, base + i, word);
    }
}
