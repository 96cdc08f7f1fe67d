// Paged prefill attention for CPU adapters: one subgroup of 8 lanes per (tile of up to 8 query
// tokens of one sequence, query head). Lane j holds channels [j·HEAD_DIM/8, (j+1)·HEAD_DIM/8)
// of every query and of the outputs, and owns query j's softmax state (its score comes out of
// the butterfly in lane j). Partitions of PART keys are walked left to right, each in one pass
// with a running max, with the same per-query arithmetic as decode_partials_lanes +
// decode_reduce, so a token's output is the same bits whether it was prefilled or decoded.
// One body for every pool, through the KV reader prepended before it
// (common/kv_read_lanes_f16.wgsl, kv_quant_lanes.wgsl). Which copy of a key each query reads
// follows the reader's fresh_from: over a quantized pool a key in an earlier block than the
// query's is read from its head block, a key in the query's own block fresh in f16; keys in
// the blocks the tile's queries occupy can be both (pooled for a later query of the tile, fresh
// for one in the same block): both scores are computed and each lane keeps its query's. An f16
// pool reads every key from the pool. Causal: keys past a query's position, or before its
// sliding window (window_lo), add 0; keys before the tile's first window are not read.

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> qkv: array<vec4<f32>>;        // [tokens, qkv_stride / 4]
// bindings 3, 4, 5: k_pool, v_pool, stage (the KV reader's)
@group(0) @binding(6) var<storage, read> seqs: array<SeqInfo>;         // [num_seqs]
@group(0) @binding(7) var<storage, read> block_tables: array<u32>;     // concatenated tables
@group(0) @binding(8) var<storage, read> tiles: array<vec2<u32>>;      // [num_prefill_tiles] (seq index, first query index)
@group(0) @binding(9) var<storage, read_write> out: array<f32>;        // [tokens, out_stride]

// The 8 queries' scores for one pooled key (k_lane_raw and k_token_sm; kq: the queries folded
// for its block; qsum: lane j's query's query_total); lane j gets query j's.
fn pooled_scores(kq: array<KQuery, 8>, raw: Lane, sm: vec2<f32>, qsum: f32, lane: u32) -> f32 {
    let lo = vec4<f32>(k_lane_dot(kq[0], raw), k_lane_dot(kq[1], raw), k_lane_dot(kq[2], raw), k_lane_dot(kq[3], raw));
    let hi = vec4<f32>(k_lane_dot(kq[4], raw), k_lane_dot(kq[5], raw), k_lane_dot(kq[6], raw), k_lane_dot(kq[7], raw));
    return k_score(lanes_sum_scatter(lo, hi, lane), sm, qsum) * p.scale;
}

// The tile's queries as the keys of one head block see them (k_fold).
fn fold_tile(q: array<Lane, 8>, ks: LaneScales) -> array<KQuery, 8> {
    return array<KQuery, 8>(
        k_fold(q[0], ks), k_fold(q[1], ks), k_fold(q[2], ks), k_fold(q[3], ks),
        k_fold(q[4], ks), k_fold(q[5], ks), k_fold(q[6], ks), k_fold(q[7], ks),
    );
}

// The minimums' sums added to the tile's outputs: op[i] = v_min_apply(op[i], mv of lane i).
fn min_apply_tile(op: array<Lane, 8>, mv: f32) -> array<Lane, 8> {
    var r = op;
    r[0] = v_min_apply(op[0], subgroupShuffle(mv, 0u));
    r[1] = v_min_apply(op[1], subgroupShuffle(mv, 1u));
    r[2] = v_min_apply(op[2], subgroupShuffle(mv, 2u));
    r[3] = v_min_apply(op[3], subgroupShuffle(mv, 3u));
    r[4] = v_min_apply(op[4], subgroupShuffle(mv, 4u));
    r[5] = v_min_apply(op[5], subgroupShuffle(mv, 5u));
    r[6] = v_min_apply(op[6], subgroupShuffle(mv, 6u));
    r[7] = v_min_apply(op[7], subgroupShuffle(mv, 7u));
    return r;
}

// Query i's output after a key of a block holding both copies: the fresh row vf (weight e) if
// the query sits in that block (fresh_i), else the pooled one vq (v_weight); (c, e) from
// lane i.
fn merge_mixed(op: Lane, i: u32, c: f32, e: f32, vq: Lane, vsm: vec2<f32>, vf: Lane, fresh_i: bool) -> Lane {
    let c_i = subgroupShuffle(c, i);
    let e_i = subgroupShuffle(e, i);
    let w_i = select(v_weight(e_i, vsm), e_i, fresh_i);
    return lane_merge(op, c_i, lane_pick(vq, vf, fresh_i), w_i);
}

// merge_mixed for the tile's queries (positions pos0 + i) after a key of block blk, which some
// query of the tile sits in.
fn merge_tile_mixed(op: array<Lane, 8>, c: f32, e: f32, vq: Lane, vsm: vec2<f32>, vf: Lane, pos0: u32, blk: u32) -> array<Lane, 8> {
    let bs = p.block_size;
    var r = op;
    r[0] = merge_mixed(op[0], 0u, c, e, vq, vsm, vf, pos0 / bs == blk);
    r[1] = merge_mixed(op[1], 1u, c, e, vq, vsm, vf, (pos0 + 1u) / bs == blk);
    r[2] = merge_mixed(op[2], 2u, c, e, vq, vsm, vf, (pos0 + 2u) / bs == blk);
    r[3] = merge_mixed(op[3], 3u, c, e, vq, vsm, vf, (pos0 + 3u) / bs == blk);
    r[4] = merge_mixed(op[4], 4u, c, e, vq, vsm, vf, (pos0 + 4u) / bs == blk);
    r[5] = merge_mixed(op[5], 5u, c, e, vq, vsm, vf, (pos0 + 5u) / bs == blk);
    r[6] = merge_mixed(op[6], 6u, c, e, vq, vsm, vf, (pos0 + 6u) / bs == blk);
    r[7] = merge_mixed(op[7], 7u, c, e, vq, vsm, vf, (pos0 + 7u) / bs == blk);
    return r;
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
    let fresh0 = fresh_from(pos0);    // keys from here on are fresh for some query of the tile
    let fresh_last = fresh_from(last); // keys before this are pooled for some query of the tile
    let q = tile_queries(first_tok, nq, h, lane);
    // lane j: Σ of query j's channels (k_score; 0 where no score needs it), the same tree as
    // decode's lanes_sum
    let my_qsum = lanes_sum_scatter(
        vec4<f32>(query_total(q[0]), query_total(q[1]), query_total(q[2]), query_total(q[3])),
        vec4<f32>(query_total(q[4]), query_total(q[5]), query_total(q[6]), query_total(q[7])),
        lane,
    );
    let mine = lane < nq;       // this lane's query exists
    let my_pos = pos0 + lane;   // and sits at this position
    let my_lo = window_lo(my_pos);  // and sees keys [my_lo, my_pos]
    let my_blk = my_pos / bs;

    var m_run = NEG_BIG;
    var l_run = 0.0;
    var o: array<Lane, 8>;  // zeros
    for (var start = tile_lo / PART * PART; start <= last; start += PART) {
        let end = min(start + PART, last + 1u);
        let first = max(start, tile_lo);
        // one pass with a running max per query (fold_key), as decode_partials_lanes
        var m = NEG_BIG;
        var l = 0.0;
        var mv = 0.0;  // Σ e × V's minimums of this lane's query (v_min_acc)
        var op: array<Lane, 8>;  // zeros
        var pos = first;
        while (pos < end) {
            let blk = pos / bs;
            let seg = min(end, (blk + 1u) * bs);
            let pooled = pos < fresh_last;  // some query of the tile reads this block pooled
            let fresh = pos >= fresh0;      // some query of the tile reads it fresh
            let hb = block_tables[table + blk] * p.pool_heads + p.pool_head_base + kvh;
            let kb = k_block_base(hb);
            let vb = v_block_base(hb);
            var kq: array<KQuery, 8>;
            var vs: LaneScales;
            if (pooled) {
                kq = fold_tile(q, k_lane_scales(kb, lane));
                vs = v_lane_scales(vb, lane);
            }
            if (!fresh) {
                // Every query of the tile reads this block pooled: the loop below without its
                // per-query choice of copy (the same operations and bits). An f16 pool's only
                // path.
                for (var t = pos % bs; pos < seg; pos++) {
                    let s = pooled_scores(kq, k_lane_raw(kb, t, lane), k_token_sm(kb, t), my_qsum, lane);
                    let v = v_lane_load(vb, t, lane, vs);
                    let vsm = v_token_sm(vb, t);
                    let sees = mine && pos >= my_lo && pos <= my_pos;
                    let f = fold_key(m, l, s, sees);
                    m = f.x;
                    l = f.y;
                    mv = select(mv, v_min_acc(f.w, vsm, mv * f.z), sees);
                    let w = v_weight(f.w, vsm);
                    op = merge_tile(op, f.z, v, w);
                    t++;
                }
                continue;
            }
            for (var t = pos % bs; pos < seg; pos++) {
                var s = 0.0;
                // a block no query reads pooled may not be quantized yet: zeros, not its words
                var vq = lane_zero();
                var vsm = vec2<f32>(0.0);
                var vf = lane_zero();
                if (pooled) {
                    s = pooled_scores(kq, k_lane_raw(kb, t, lane), k_token_sm(kb, t), my_qsum, lane);
                    vq = v_lane_load(vb, t, lane, vs);
                    vsm = v_token_sm(vb, t);
                }
                let own_key = my_blk == blk;  // this lane's query reads the fresh copy
                {
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
                op = merge_tile_mixed(op, f.z, f.w, vq, vsm, vf, pos0, blk);
                t++;
            }
        }
        op = min_apply_tile(op, mv);
        // fold this partition into the running state (queries with no key here keep theirs)
        let has = mine && start <= my_pos && my_lo < start + PART;
        let f = merge_factors(m_run, m);
        let a = select(1.0, f.x, has);
        let b = select(0.0, f.y, has);
        if (has) {
            l_run = fma(l_run, f.x, l * f.y);
            m_run = f.z;
        }
        o = merge_partition(o, a, op, b);
    }

    store_tile(first_tok, nq, h, lane, o, vec2<f32>(m_run, l_run));
}
