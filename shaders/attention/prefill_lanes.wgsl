// Paged prefill attention for CPU adapters: one subgroup of 8 lanes per (tile of up to 8 query
// tokens of one sequence, query head). Lane j holds channels [j·HEAD_DIM/8, (j+1)·HEAD_DIM/8)
// of every query and of the outputs, and owns query j's softmax state (its score comes out of
// the butterfly in lane j). Partitions of PART keys are walked left to right, each in one pass
// with a running max, with the same per-query arithmetic as decode_partials_lanes +
// decode_reduce, so a token's output is the same bits whether it was prefilled or decoded. Causal: keys past a query's position, or before
// its sliding window (window_lo), add 0; keys before the tile's first window are not read.

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> qkv: array<vec4<f32>>;        // [tokens, qkv_stride / 4]
@group(0) @binding(3) var<storage, read> k_pool: array<vec4<u32>>;     // [blocks, kv_heads, block_size, HEAD_DIM/8] f16x8
@group(0) @binding(4) var<storage, read> v_pool: array<vec4<u32>>;     // same
@group(0) @binding(5) var<storage, read> seqs: array<SeqInfo>;         // [num_seqs]
@group(0) @binding(6) var<storage, read> block_tables: array<u32>;     // concatenated tables
@group(0) @binding(7) var<storage, read> tiles: array<vec2<u32>>;      // [num_prefill_tiles] (seq index, first query index)
@group(0) @binding(8) var<storage, read_write> out: array<f32>;        // [tokens, out_stride]

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
    let q = tile_queries(first_tok, nq, h, lane);
    let mine = lane < nq;       // this lane's query exists
    let my_pos = pos0 + lane;   // and sits at this position
    let my_lo = window_lo(my_pos);  // and sees keys [my_lo, my_pos]

    var m_run = NEG_BIG;
    var l_run = 0.0;
    var o: array<Lane, 8>;  // zeros
    for (var start = tile_lo / PART * PART; start <= last; start += PART) {
        let end = min(start + PART, last + 1u);
        let first = max(start, tile_lo);
        // one pass with a running max per query (fold_key), as decode_partials_lanes
        var m = NEG_BIG;
        var l = 0.0;
        var op: array<Lane, 8>;  // zeros
        // block by block, the row index stepped per key: no division per key
        var pos = first;
        while (pos < end) {
            let blk = pos / bs;
            let seg = min(end, (blk + 1u) * bs);
            var row = pool_row(block_tables[table + blk], pos, kvh, lane);
            for (; pos < seg; pos++) {
                let s = scores(q, k_lane(row), lane);
                let v = v_lane(row);
                row += HEAD_DIM / 8u;
                let f = fold_key(m, l, s, mine && pos >= my_lo && pos <= my_pos);
                m = f.x;
                l = f.y;
                op = merge_tile(op, f.z, v, f.w);
            }
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
        o = merge_partition(o, a, op, b);
    }

    store_tile(first_tok, nq, h, lane, o, l_run);
}
