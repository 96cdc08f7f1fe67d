// Paged prefill attention: one workgroup per (tile of up to QT query tokens of one sequence,
// query head). Causal over the sequence's cached keys and this step's new keys, all read from
// the pool through the block table (kv_write ran first), each query within its sliding window
// (window_lo). Partitions are walked left to right, from the one holding the tile's first
// window_lo, and merged exactly like decode_partials + decode_reduce do (common/attention.wgsl).

const WG: u32 = 64u;
const MAX_QT: u32 = 16u;
const MAX_EPT: u32 = 16u;     // output elements (f16 pairs) per invocation

override QT: u32 = 16u;       // query tokens per tile: min(16, 2048 / HEAD_DIM)

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;            // [tokens, qkv_stride]
@group(0) @binding(3) var<storage, read> k_pool: array<u32>;         // [blocks, kv_heads, block_size, HEAD_DIM/2] f16x2
@group(0) @binding(4) var<storage, read> v_pool: array<u32>;         // same
@group(0) @binding(5) var<storage, read> seqs: array<SeqInfo>;       // [num_seqs]
@group(0) @binding(6) var<storage, read> block_tables: array<u32>;   // concatenated tables
@group(0) @binding(7) var<storage, read> tiles: array<vec2<u32>>;    // [num_prefill_tiles] (seq index, first query index)
@group(0) @binding(8) var<storage, read_write> out: array<f32>;      // [tokens, out_stride]

var<workgroup> q_sh: array<f32, 2048>;     // [QT, HEAD_DIM]
var<workgroup> s_sh: array<f32, 1024>;     // [QT, PART] scores, then exp
var<workgroup> base_sh: array<u32, PART_WORKGROUP>;  // word offset of each key's row in the pools
var<workgroup> ulo_sh: array<u32, MAX_QT>; // valid keys of the partition per query:
var<workgroup> uhi_sh: array<u32, MAX_QT>; //   start + [ulo, uhi), empty if ulo = uhi
var<workgroup> mp_sh: array<f32, MAX_QT>;  // partition max per query
var<workgroup> m_sh: array<f32, MAX_QT>;   // running max per query
var<workgroup> l_sh: array<f32, MAX_QT>;   // running sum per query
var<workgroup> a_sh: array<f32, MAX_QT>;   // merge factor of the running output
var<workgroup> b_sh: array<f32, MAX_QT>;   // merge factor of the partition output

// Inner loops below step 8 at a time (then one at a time for the rest) in the same order of
// operations as one at a time: the bits are those of decode_partials. Why: llvmpipe stops every
// loop of a shader invocation after 65,535 iterations in total (gallivm's
// LP_MAX_TGSI_LOOP_ITERATIONS, shared by all loops), and a tile walks every partition of a long
// context; fewer iterations per partition keep long prefills within it (DESIGN.md, "Traps").

fn qk_pair(q_off: u32, kb: u32, w: u32, s: f32) -> f32 {
    let k = unpack2x16float(k_pool[kb + w]);
    return fma(q_sh[q_off + 2u * w + 1u], k.y, fma(q_sh[q_off + 2u * w], k.x, s));
}

fn qk_score(q_off: u32, kb: u32) -> f32 {
    var s = 0.0;
    var w = 0u;
    for (; w + 8u <= HEAD_DIM / 2u; w += 8u) {
        s = qk_pair(q_off, kb, w, s);
        s = qk_pair(q_off, kb, w + 1u, s);
        s = qk_pair(q_off, kb, w + 2u, s);
        s = qk_pair(q_off, kb, w + 3u, s);
        s = qk_pair(q_off, kb, w + 4u, s);
        s = qk_pair(q_off, kb, w + 5u, s);
        s = qk_pair(q_off, kb, w + 6u, s);
        s = qk_pair(q_off, kb, w + 7u, s);
    }
    for (; w < HEAD_DIM / 2u; w++) {
        s = qk_pair(q_off, kb, w, s);
    }
    return s * p.scale;
}

fn pv1(qi: u32, u: u32, w: u32, o: vec2<f32>) -> vec2<f32> {
    return fma(vec2<f32>(s_sh[qi * PART + u]), unpack2x16float(v_pool[base_sh[u] + w]), o);
}

// o = Σ e_u · v_u over keys u in [lo, hi) of the partition, left to right, for word w.
fn pv(qi: u32, lo: u32, hi: u32, w: u32) -> vec2<f32> {
    var o = vec2<f32>(0.0);
    var u = lo;
    for (; u + 8u <= hi; u += 8u) {
        o = pv1(qi, u, w, o);
        o = pv1(qi, u + 1u, w, o);
        o = pv1(qi, u + 2u, w, o);
        o = pv1(qi, u + 3u, w, o);
        o = pv1(qi, u + 4u, w, o);
        o = pv1(qi, u + 5u, w, o);
        o = pv1(qi, u + 6u, w, o);
        o = pv1(qi, u + 7u, w, o);
    }
    for (; u < hi; u++) {
        o = pv1(qi, u, w, o);
    }
    return o;
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
            let block = block_tables[seq.table_start + pos / p.block_size];
            base_sh[t] = ((block * p.num_kv_heads + kvh) * p.block_size + pos % p.block_size) * words;
        }
        workgroupBarrier();
        if (needed) {
            for (var qi = 0u; qi < nq; qi++) {
                if (pos <= pos0 + qi && pos >= window_lo(pos0 + qi)) {
                    s_sh[qi * PART + t] = qk_score(qi * HEAD_DIM, base_sh[t]);
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
                let o = pv(qi, ulo_sh[qi], uhi_sh[qi], e % words);
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
