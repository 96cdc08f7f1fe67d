// Shared by the lane-parallel prefill kernel (prefill_lanes, every KV reader): a tile's 8
// queries, their outputs and the steps on them. Every per-query step is written out for
// queries 0..7, not looped: llvmpipe unrolls a loop only while its body is small (at head_dim
// 256 these were not), and one loop left in place sends the tile's arrays to memory for the
// whole kernel and, at 8 iterations a key, ran into llvmpipe's 65,535 loop iterations per
// invocation past 8,191 keys (DESIGN.md, "Traps").

const QT: u32 = 8u;  // queries per tile = lanes

// The tile's queries: tokens first_tok .. first_tok + nq − 1 (rows past nq repeat the last:
// loaded, never used), head h.
fn tile_queries(first_tok: u32, nq: u32, h: u32, lane: u32) -> array<Lane, 8> {
    let n = nq - 1u;
    return array<Lane, 8>(
        q_lane(first_tok, h, lane),
        q_lane(first_tok + min(1u, n), h, lane),
        q_lane(first_tok + min(2u, n), h, lane),
        q_lane(first_tok + min(3u, n), h, lane),
        q_lane(first_tok + min(4u, n), h, lane),
        q_lane(first_tok + min(5u, n), h, lane),
        q_lane(first_tok + min(6u, n), h, lane),
        q_lane(first_tok + min(7u, n), h, lane),
    );
}

// The 8 queries' partial dot products with one key row k, lanes_sum_scatter's operands.
fn tile_dots(q: array<Lane, 8>, k: Lane) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(
        vec4<f32>(lane_dot(q[0], k), lane_dot(q[1], k), lane_dot(q[2], k), lane_dot(q[3], k)),
        vec4<f32>(lane_dot(q[4], k), lane_dot(q[5], k), lane_dot(q[6], k), lane_dot(q[7], k)),
    );
}

// The 8 queries' scores for one f16 key row k; lane j gets query j's.
fn scores(q: array<Lane, 8>, k: Lane, lane: u32) -> f32 {
    let d = tile_dots(q, k);
    return lanes_sum_scatter(d[0], d[1], lane) * p.scale;
}

// The tile's outputs after one key: op[i] = lane_merge(op[i], c, v, w) with query i's (c, w)
// from lane i.
fn merge_tile(op: array<Lane, 8>, c: f32, v: Lane, w: f32) -> array<Lane, 8> {
    var r = op;
    r[0] = lane_merge(op[0], subgroupShuffle(c, 0u), v, subgroupShuffle(w, 0u));
    r[1] = lane_merge(op[1], subgroupShuffle(c, 1u), v, subgroupShuffle(w, 1u));
    r[2] = lane_merge(op[2], subgroupShuffle(c, 2u), v, subgroupShuffle(w, 2u));
    r[3] = lane_merge(op[3], subgroupShuffle(c, 3u), v, subgroupShuffle(w, 3u));
    r[4] = lane_merge(op[4], subgroupShuffle(c, 4u), v, subgroupShuffle(w, 4u));
    r[5] = lane_merge(op[5], subgroupShuffle(c, 5u), v, subgroupShuffle(w, 5u));
    r[6] = lane_merge(op[6], subgroupShuffle(c, 6u), v, subgroupShuffle(w, 6u));
    r[7] = lane_merge(op[7], subgroupShuffle(c, 7u), v, subgroupShuffle(w, 7u));
    return r;
}

// The running outputs merged with a partition's: o[i] = lane_merge(o[i], a, op[i], b) with
// query i's (a, b) from lane i.
fn merge_partition(o: array<Lane, 8>, a: f32, op: array<Lane, 8>, b: f32) -> array<Lane, 8> {
    var r = o;
    r[0] = lane_merge(o[0], subgroupShuffle(a, 0u), op[0], subgroupShuffle(b, 0u));
    r[1] = lane_merge(o[1], subgroupShuffle(a, 1u), op[1], subgroupShuffle(b, 1u));
    r[2] = lane_merge(o[2], subgroupShuffle(a, 2u), op[2], subgroupShuffle(b, 2u));
    r[3] = lane_merge(o[3], subgroupShuffle(a, 3u), op[3], subgroupShuffle(b, 3u));
    r[4] = lane_merge(o[4], subgroupShuffle(a, 4u), op[4], subgroupShuffle(b, 4u));
    r[5] = lane_merge(o[5], subgroupShuffle(a, 5u), op[5], subgroupShuffle(b, 5u));
    r[6] = lane_merge(o[6], subgroupShuffle(a, 6u), op[6], subgroupShuffle(b, 6u));
    r[7] = lane_merge(o[7], subgroupShuffle(a, 7u), op[7], subgroupShuffle(b, 7u));
    return r;
}

// Query i's output row o · a / l' (m, l from lane i, the head's sink folded in: sink_fold) to
// token `token` of out, head h, if i < nq.
fn store_query(i: u32, nq: u32, token: u32, h: u32, lane: u32, o: Lane, ml: vec2<f32>) {
    let sf = sink_fold(h, subgroupShuffle(ml.x, i), subgroupShuffle(ml.y, i));
    if (i < nq) {
        let c = token * p.out_stride + h * HEAD_DIM + lane * 4u * LANE_VECS;
        for (var j = 0u; j < LANE_VECS; j++) {
            for (var k = 0u; k < 4u; k++) {
                out[c + 4u * j + k] = o.v[j][k] * sf.x / sf.y;
            }
        }
    }
}

// The tile's output rows (tokens first_tok .. first_tok + nq − 1); ml: this lane's query's
// running max and sum.
fn store_tile(first_tok: u32, nq: u32, h: u32, lane: u32, o: array<Lane, 8>, ml: vec2<f32>) {
    store_query(0u, nq, first_tok, h, lane, o[0], ml);
    store_query(1u, nq, first_tok + 1u, h, lane, o[1], ml);
    store_query(2u, nq, first_tok + 2u, h, lane, o[2], ml);
    store_query(3u, nq, first_tok + 3u, h, lane, o[3], ml);
    store_query(4u, nq, first_tok + 4u, h, lane, o[4], ml);
    store_query(5u, nq, first_tok + 5u, h, lane, o[5], ml);
    store_query(6u, nq, first_tok + 6u, h, lane, o[6], ml);
    store_query(7u, nq, first_tok + 7u, h, lane, o[7], ml);
}
