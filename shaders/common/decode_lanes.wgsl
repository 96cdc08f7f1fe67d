// Shared by the lane-parallel decode kernel (decode_partials_lanes, every KV reader):
// a subgroup serves a slice of up to LANE_HEADS query heads of one KV head, so each key and
// value row is loaded once for all of them, and writes each head's partition result.
//
// The per-head state (q, Head) lives in arrays indexed only by constants: every per-head step
// is written out for heads 0..3, `if (has_head(nh, i))` guarding heads past the slice. A loop
// over the heads is unrolled by llvmpipe only while its body is small (at head_dim 256 it was
// not), and one loop left in place sends the arrays to memory for the whole kernel: on
// llvmpipe that cost 1.5–1.8× at ctx 4096 with a loop bounded by `nh`, 3.6× at head_dim 256
// (DESIGN.md, "Traps").

const LANE_HEADS: u32 = 4u;  // most query heads per subgroup (AttnParams.heads_per_wg)
// The most heads a slice of this pipeline has (AttnParams.heads_per_wg, 1 to LANE_HEADS;
// kernels::attention::slice_heads). llvmpipe runs an `if` on a uniform value as a mask, not a
// branch, so the steps of a head past every slice would still be computed (a quarter of the
// per-key work at SmolLM2's 3 heads a slice); past SLICE_HEADS they fold away at pipeline
// creation. Slices at the end of an uneven group (6 heads: 4 + 2) still check nh.
override SLICE_HEADS: u32 = LANE_HEADS;

// Whether a slice of nh heads has head i (i a constant).
fn has_head(nh: u32, i: u32) -> bool {
    return i < SLICE_HEADS && i < nh;
}

// One query head's running softmax over the keys folded so far (fold_key): max m, sum l,
// outputs o and, for quantized V with minimums, mv = Σ e × the minimums (v_min_acc).
struct Head {
    m: f32,
    l: f32,
    o: Lane,
    mv: f32,
}

fn head_new() -> Head {
    return Head(NEG_BIG, 0.0, lane_zero(), 0.0);
}

// Head h after a key of score s whose value row v enters o as it is (f16 rows).
fn head_fold(h: Head, s: f32, v: Lane) -> Head {
    let f = fold_key(h.m, h.l, s, true);
    return Head(f.x, f.y, lane_merge(h.o, f.z, v, f.w), h.mv * f.z);
}

// The score of query q against an f16 key row k, the same value in every lane.
fn head_score(q: Lane, k: Lane) -> f32 {
    return lanes_sum(lane_dot(q, k)) * p.scale;
}

// The slice's heads (queries q, states st; nh of them) after an f16 key row k and its value
// row v.
fn fold_slice(st: array<Head, LANE_HEADS>, q: array<Lane, LANE_HEADS>, nh: u32, k: Lane, v: Lane) -> array<Head, LANE_HEADS> {
    var r = st;
    r[0] = head_fold(st[0], head_score(q[0], k), v);
    if (has_head(nh, 1u)) {
        r[1] = head_fold(st[1], head_score(q[1], k), v);
    }
    if (has_head(nh, 2u)) {
        r[2] = head_fold(st[2], head_score(q[2], k), v);
    }
    if (has_head(nh, 3u)) {
        r[3] = head_fold(st[3], head_score(q[3], k), v);
    }
    return r;
}

// The queries of the slice's heads (heads past nh repeat its last: loaded, never used).
fn slice_queries(token: u32, hs: HeadSlice, lane: u32) -> array<Lane, LANE_HEADS> {
    let n = hs.nh - 1u;
    return array<Lane, LANE_HEADS>(
        q_lane(token, hs.h0, lane),
        q_lane(token, hs.h0 + min(1u, n), lane),
        q_lane(token, hs.h0 + min(2u, n), lane),
        q_lane(token, hs.h0 + min(3u, n), lane),
    );
}

fn slice_new() -> array<Head, LANE_HEADS> {
    return array<Head, LANE_HEADS>(head_new(), head_new(), head_new(), head_new());
}

// (m_p, l_p, o_p) of query head h, partition `part` into the partials buffer
// ([decode_seqs, num_heads, max_partitions, HEAD_DIM + 2], as decode_partials.wgsl); with
// ONE_PASS the output O · a / l' (sink_fold), as decode_reduce writes it, into the output.
fn write_partial(si: u32, h: u32, part: u32, lane: u32, st: Head) {
    if (ONE_PASS) {
        let sf = sink_fold(h, st.m, st.l);
        let c = seqs[si].q_start * p.out_stride + h * HEAD_DIM + lane * 4u * LANE_VECS;
        for (var j = 0u; j < LANE_VECS; j++) {
            for (var i = 0u; i < 4u; i++) {
                partials[c + 4u * j + i] = st.o.v[j][i] * sf.x / sf.y;
            }
        }
        return;
    }
    let base = ((si * p.num_heads + h) * p.max_partitions + part) * (HEAD_DIM + 2u);
    if (lane == 0u) {
        partials[base] = st.m;
        partials[base + 1u] = st.l;
    }
    let c = base + 2u + lane * 4u * LANE_VECS;
    for (var j = 0u; j < LANE_VECS; j++) {
        for (var i = 0u; i < 4u; i++) {
            partials[c + 4u * j + i] = st.o.v[j][i];
        }
    }
}

// The slice's heads' results (write_partial for each of hs.nh heads).
fn write_partials(si: u32, hs: HeadSlice, part: u32, lane: u32, st: array<Head, LANE_HEADS>) {
    write_partial(si, hs.h0, part, lane, st[0]);
    if (has_head(hs.nh, 1u)) {
        write_partial(si, hs.h0 + 1u, part, lane, st[1]);
    }
    if (has_head(hs.nh, 2u)) {
        write_partial(si, hs.h0 + 2u, part, lane, st[2]);
    }
    if (has_head(hs.nh, 3u)) {
        write_partial(si, hs.h0 + 3u, part, lane, st[3]);
    }
}
