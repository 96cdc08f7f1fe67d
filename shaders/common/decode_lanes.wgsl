// Shared by the lane-parallel decode kernels (decode_partials_lanes, decode_partials_lanes_kvq):
// a subgroup serves a slice of up to LANE_HEADS query heads of one KV head, so each key and
// value row is loaded once for all of them, and writes each head's partition result.
//
// The per-head state (q, m, l, o) lives in arrays indexed only by constant-trip loops
// (`for i < LANE_HEADS { if (i < nh) … }`), which the compiler unrolls into registers. One loop
// bounded by `nh` anywhere sends the arrays to memory for the whole kernel: on llvmpipe that
// cost 1.5–1.8× at ctx 4096 (DESIGN.md, "Traps").

const LANE_HEADS: u32 = 4u;  // most query heads per subgroup (AttnParams.heads_per_wg)

// (m_p, l_p, o_p) of query head h, partition `part` into the partials buffer
// ([decode_seqs, num_heads, max_partitions, HEAD_DIM + 2], as decode_partials.wgsl).
fn write_partial(si: u32, h: u32, part: u32, lane: u32, m: f32, l: f32, o: Lane16) {
    let base = ((si * p.num_heads + h) * p.max_partitions + part) * (HEAD_DIM + 2u);
    if (lane == 0u) {
        partials[base] = m;
        partials[base + 1u] = l;
    }
    let c = base + 2u + lane * 8u * WPL;
    for (var i = 0u; i < 4u; i++) {
        partials[c + i] = o.a[i];
        partials[c + 4u + i] = o.b[i];
        if (WPL > 1u) {
            partials[c + 8u + i] = o.c[i];
            partials[c + 12u + i] = o.d[i];
        }
    }
}

// The slice's heads' results (write_partial for each of hs.nh heads).
fn write_partials(si: u32, hs: HeadSlice, part: u32, lane: u32, m: array<f32, LANE_HEADS>, l: array<f32, LANE_HEADS>, o: array<Lane16, LANE_HEADS>) {
    for (var i = 0u; i < LANE_HEADS; i++) {
        if (i < hs.nh) {
            write_partial(si, hs.h0 + i, part, lane, m[i], l[i], o[i]);
        }
    }
}
