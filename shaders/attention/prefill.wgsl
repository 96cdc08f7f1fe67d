// Paged prefill attention: one workgroup per (tile of up to QT query tokens of one sequence,
// query head). Causal over the sequence's cached keys and this step's new keys, read through the
// KV reader prepended before this body (common/kv_read_f16.wgsl: every row from the pool, which
// kv_write filled first; kv_read_quant.wgsl: a key in an earlier block than the query's
// dequantized from its head block, one in the query's own block read fresh in f16 — which copy
// depends on the query, fresh_from), each query within its sliding window (window_lo).
// Partitions are walked left to right, from the one holding the tile's first window_lo, and
// merged exactly like decode_partials + decode_reduce do (common/attention.wgsl,
// common/attention_workgroup.wgsl), so a token's output is the same bits in both.

const MAX_EPT: u32 = 16u;     // output elements (f16 pairs) per invocation

override QT: u32 = 16u;       // query tokens per tile: min(16, 2048 / HEAD_DIM)

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;            // [tokens, qkv_stride]
// bindings 3, 4, 5: k_pool, v_pool, stage (the KV reader's)
@group(0) @binding(6) var<storage, read> seqs: array<SeqInfo>;       // [num_seqs]
@group(0) @binding(7) var<storage, read> block_tables: array<u32>;   // concatenated tables
@group(0) @binding(8) var<storage, read> tiles: array<vec2<u32>>;    // [num_prefill_tiles] (seq index, first query index)
@group(0) @binding(9) var<storage, read_write> out: array<f32>;      // [tokens, out_stride]

var<workgroup> q_sh: array<f32, 2048>;      // [QT, HEAD_DIM]
var<workgroup> s_sh: array<f32, 1024>;      // [QT, PART] scores, then exp
var<workgroup> row_sh: array<u32, PART_WORKGROUP>;  // kv_row of each key
var<workgroup> ulo_sh: array<u32, MAX_ROWS>; // valid keys of the partition per query:
var<workgroup> uhi_sh: array<u32, MAX_ROWS>; //   start + [ulo, uhi), empty if ulo = uhi
var<workgroup> mp_sh: array<f32, MAX_ROWS>;  // partition max per query
var<workgroup> m_sh: array<f32, MAX_ROWS>;   // running max per query
var<workgroup> l_sh: array<f32, MAX_ROWS>;   // running sum per query
var<workgroup> a_sh: array<f32, MAX_ROWS>;   // merge factor of the running output
var<workgroup> b_sh: array<f32, MAX_ROWS>;   // merge factor of the partition output

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
            row_sh[t] = kv_row(block_tables[seq.table_start + pos / p.block_size], kvh, pos);
        }
        workgroupBarrier();
        if (needed) {
            for (var qi = 0u; qi < nq; qi++) {
                let qpos = pos0 + qi;
                if (pos <= qpos && pos >= window_lo(qpos)) {
                    let fresh = pos >= fresh_from(qpos);
                    s_sh[qi * PART + t] = qk_score(qi * HEAD_DIM, seq, kvh, pos, row_sh[t], fresh);
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
        partition_softmax(t, nq);
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
                let o = partition_pv(qi, start, fresh_from(pos0 + qi), seq, kvh, e % words);
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
            let sf = sink_fold(h, m_sh[qi], l_sh[qi]);
            out[ob] = o_acc[j].x * sf.x / sf.y;
            out[ob + 1u] = o_acc[j].y * sf.x / sf.y;
        }
    }
}
