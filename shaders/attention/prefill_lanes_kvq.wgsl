// Paged prefill attention over a quantized KV pool for CPU adapters: prefill_lanes.wgsl reading
// the codes and applying the scales per block or per score (common/kv_quant_lanes.wgsl). One subgroup of 8 lanes per
// (tile of up to 8 query tokens, query head); lane j owns query j's softmax state.
// Which copy of a key each query reads follows common/kv_quant.wgsl: a key in an earlier block
// than the query's is dequantized, a key in the query's own block is f16. Keys in the blocks the
// tile's queries occupy can be both (quantized for a later query of the tile, f16 for one in the
// same block): both scores are computed and each lane keeps its query's. Keys before the tile's
// first window (window_lo) are not read; those before a query's own window add 0. Per query the
// arithmetic is decode_partials_lanes_kvq.wgsl + decode_reduce.wgsl's, bit for bit.

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> qkv: array<vec4<f32>>;        // [tokens, qkv_stride / 4]
@group(0) @binding(3) var<storage, read> k_pool: array<u64>;           // [blocks, kv_heads, k_head_block_words / 2]
@group(0) @binding(4) var<storage, read> v_pool: array<u64>;           // [blocks, kv_heads, v_head_block_words / 2]
@group(0) @binding(5) var<storage, read> stage: array<u32>;            // [2, stage_slots, kv_heads, block_size, HEAD_DIM/2] f16x2
@group(0) @binding(6) var<storage, read> seqs: array<SeqInfo>;         // [num_seqs]
@group(0) @binding(7) var<storage, read> block_tables: array<u32>;     // concatenated tables
@group(0) @binding(8) var<storage, read> tiles: array<vec2<u32>>;      // [num_prefill_tiles] (seq index, first query index)
@group(0) @binding(9) var<storage, read_write> out: array<f32>;        // [tokens, out_stride]

const QT: u32 = 8u;  // queries per tile = lanes

// The 8 queries' scores for one f16 key; lane j gets query j's.
fn scores(q: array<Lane16, 8>, k: Lane16, lane: u32) -> f32 {
    let lo = vec4<f32>(lane_dot(q[0], k), lane_dot(q[1], k), lane_dot(q[2], k), lane_dot(q[3], k));
    let hi = vec4<f32>(lane_dot(q[4], k), lane_dot(q[5], k), lane_dot(q[6], k), lane_dot(q[7], k));
    return lanes_sum_scatter(lo, hi, lane) * p.scale;
}

// The 8 queries' scores for one quantized key (its raw codes and k_token_sm; kq: the queries
// folded for its block; qsum: lane j's query's Σ); lane j gets query j's.
fn quant_scores(kq: array<KQuery, 8>, raw: Lane16, sm: vec2<f32>, qsum: f32, lane: u32) -> f32 {
    let lo = vec4<f32>(k_lane_dot(kq[0], raw), k_lane_dot(kq[1], raw), k_lane_dot(kq[2], raw), k_lane_dot(kq[3], raw));
    let hi = vec4<f32>(k_lane_dot(kq[4], raw), k_lane_dot(kq[5], raw), k_lane_dot(kq[6], raw), k_lane_dot(kq[7], raw));
    return k_score(lanes_sum_scatter(lo, hi, lane), sm, qsum) * p.scale;
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
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
    let first_tok = seq.q_start + tile.y;
    let table = seq.table_start;
    let bs = p.block_size;
    let own0 = pos0 / bs * bs;     // keys from here on are f16 for some query of the tile
    let own_last = last / bs * bs; // keys before this are quantized for some query of the tile
    var q: array<Lane16, 8>;
    for (var i = 0u; i < QT; i++) {
        q[i] = q_lane(first_tok + min(i, nq - 1u), h, lane);
    }
    // lane j: Σ of query j's channels (k_score), the same tree as decode's lanes_sum
    let my_qsum = lanes_sum_scatter(
        vec4<f32>(lane_total(q[0]), lane_total(q[1]), lane_total(q[2]), lane_total(q[3])),
        vec4<f32>(lane_total(q[4]), lane_total(q[5]), lane_total(q[6]), lane_total(q[7])),
        lane,
    );
    let mine = lane < nq;       // this lane's query exists
    let my_pos = pos0 + lane;   // and sits at this position
    let my_lo = window_lo(my_pos);  // and sees keys [my_lo, my_pos]
    let my_blk = my_pos / bs;

    var m_run = NEG_BIG;
    var l_run = 0.0;
    var o: array<Lane16, 8>;
    for (var i = 0u; i < QT; i++) {
        o[i] = lane_zero();
    }
    for (var start = tile_lo / PART * PART; start <= last; start += PART) {
        let end = min(start + PART, last + 1u);
        let first = max(start, tile_lo);
        // one pass with a running max per query (fold_key), as decode_partials_lanes_kvq
        var m = NEG_BIG;
        var l = 0.0;
        var mv = 0.0;  // Σ e × V's minimums of this lane's query (v_min_acc)
        var op: array<Lane16, 8>;
        for (var i = 0u; i < QT; i++) {
            op[i] = lane_zero();
        }
        var pos = first;
        while (pos < end) {
            let blk = pos / bs;
            let seg = min(end, (blk + 1u) * bs);
            let quant = pos < own_last;  // some query of the tile is past this block
            let f16 = pos >= own0;       // some query of the tile is in this block
            let hb = block_tables[table + blk] * p.num_kv_heads + kvh;
            let kb = hb * p.k_head_block_words;
            let vb = hb * p.v_head_block_words;
            var kq: array<KQuery, 8>;
            var vs: LaneScales;
            if (quant) {
                let ks = k_lane_scales(kb, lane);
                for (var i = 0u; i < QT; i++) {
                    kq[i] = k_fold(q[i], ks);
                }
                vs = v_lane_scales(vb, lane);
            }
            if (!f16) {
                // Every query of the tile reads this block's quantized copy: the loop below
                // without its per-query choice of copy (the same operations and bits).
                for (var t = pos % bs; pos < seg; pos++) {
                    let s = quant_scores(kq, k_lane_raw(kb, t, lane), k_token_sm(kb, t), my_qsum, lane);
                    let v = v_lane_load(vb, t, lane, vs);
                    let vsm = v_token_sm(vb, t);
                    let sees = mine && pos >= my_lo && pos <= my_pos;
                    let f = fold_key(m, l, s, sees);
                    m = f.x;
                    l = f.y;
                    mv = select(mv, v_min_acc(f.w, vsm, mv * f.z), sees);
                    let w = v_weight(f.w, vsm);
                    for (var i = 0u; i < QT; i++) {
                        op[i] = lane_merge(op[i], subgroupShuffle(f.z, i), v, subgroupShuffle(w, i));
                    }
                    t++;
                }
                continue;
            }
            for (var t = pos % bs; pos < seg; pos++) {
                var s = 0.0;
                // a block no query reads quantized may not be quantized yet: zeros, not its words
                var vq = lane_zero();
                var vsm = vec2<f32>(0.0);
                var vf = lane_zero();
                if (quant) {
                    s = quant_scores(kq, k_lane_raw(kb, t, lane), k_token_sm(kb, t), my_qsum, lane);
                    vq = v_lane_load(vb, t, lane, vs);
                    vsm = v_token_sm(vb, t);
                }
                let own_key = f16 && my_blk == blk;  // this lane's query reads the f16 copy
                if (f16) {
                    let sf = scores(q, kv_lane_f16(0u, seq, pos, kvh, lane), lane);
                    s = select(s, sf, own_key);
                    vf = kv_lane_f16(1u, seq, pos, kvh, lane);
                }
                let sees = mine && pos >= my_lo && pos <= my_pos;
                let f = fold_key(m, l, s, sees);
                m = f.x;
                l = f.y;
                let mc = mv * f.z;
                mv = select(mv, select(v_min_acc(f.w, vsm, mc), mc, own_key), sees);
                for (var i = 0u; i < QT; i++) {
                    let c_i = subgroupShuffle(f.z, i);
                    let e_i = subgroupShuffle(f.w, i);
                    let f16_i = f16 && (pos0 + i) / bs == blk;
                    let w_i = select(v_weight(e_i, vsm), e_i, f16_i);
                    op[i] = lane_merge(op[i], c_i, lane_pick(vq, vf, f16_i), w_i);
                }
                t++;
            }
        }
        for (var i = 0u; i < QT; i++) {
            op[i] = v_min_apply(op[i], subgroupShuffle(mv, i));
        }
        // fold this partition into the running state (queries with no key here keep theirs)
        let has = mine && start <= my_pos && my_lo < start + PART;
        let f = merge_factors(m_run, m);
        let a = select(1.0, f.x, has);
        let b = select(0.0, f.y, has);
        if (has) {
            l_run = fma(l_run, f.x, l * f.y);
            m_run = f.z;
        }
        for (var i = 0u; i < QT; i++) {
            o[i] = lane_merge(o[i], subgroupShuffle(a, i), op[i], subgroupShuffle(b, i));
        }
    }

    for (var i = 0u; i < QT; i++) {
        let l_i = subgroupShuffle(l_run, i);
        if (i < nq) {
            let c = (first_tok + i) * p.out_stride + h * HEAD_DIM + lane * 8u * WPL;
            let r = o[i];
            for (var j = 0u; j < 4u; j++) {
                out[c + j] = r.a[j] / l_i;
                out[c + 4u + j] = r.b[j] / l_i;
                if (WPL > 1u) {
                    out[c + 8u + j] = r.c[j] / l_i;
                    out[c + 12u + j] = r.d[j] / l_i;
                }
            }
        }
    }
}
