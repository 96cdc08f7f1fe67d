// Shared by the lane-parallel attention kernels for CPU adapters (decode_partials_lanes,
// prefill_lanes): a subgroup of 8 lanes computes one query head, lane j holding channels
// [j·HEAD_DIM/8, (j+1)·HEAD_DIM/8). No workgroup memory, no barriers: on a CPU adapter every
// workgroup-memory access and barrier is expensive, vector ops across the 8 lanes are not.
//
// A score is Σ over the lanes of each lane's partial dot product, combined by a butterfly
// whose pairs are fixed — lanes l and l^4, then l^2, then l^1 — so every kernel (one query or
// eight at a time) adds the same numbers in the same tree and gets the same bits.
// Per partition of PART keys one pass, left to right, with a running max (fold_key): no key
// is read twice. Partitions are merged left to right with merge_factors (common/attention.wgsl),
// as the workgroup kernels do; those take two passes per partition (max, then exp), so the two
// families round differently and each is checked against the CPU reference.

const LANES: u32 = 8u;
override WPL: u32 = HEAD_DIM / 64u;  // vec4<u32> (8 f16 channels each) per lane per key row: 1, 2 or 4
override LANE_VECS: u32 = 2u * WPL;  // vec4<f32> of a lane's channels in use

// One lane's channels of a row of q or v: 8 × WPL values in v[0 .. LANE_VECS) (head sizes 64,
// 128, 256). Every loop over v is bounded by the override LANE_VECS, a constant once the
// pipeline is built, so it unrolls and the vectors stay in registers; the unused ones are never
// read.
struct Lane {
    v: array<vec4<f32>, 8>,
}

fn lane_zero() -> Lane {
    return Lane(array<vec4<f32>, 8>());
}

fn f16x4(a: u32, b: u32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(a), unpack2x16float(b));
}

// This lane's channels of query row `token`, head h (qkv holds f32).
fn q_lane(token: u32, h: u32, lane: u32) -> Lane {
    let i = (token * p.qkv_stride + p.q_offset + h * HEAD_DIM) / 4u + lane * LANE_VECS;
    var r = lane_zero();
    for (var j = 0u; j < LANE_VECS; j++) {
        r.v[j] = qkv[i + j];
    }
    return r;
}

// The dot product of channels [8g, 8g + 8) of two lanes, as group_dot: fma, then a pairwise sum.
fn group8_dot(q: Lane, k: Lane, g: u32) -> f32 {
    let p = fma(q.v[2u * g], k.v[2u * g], q.v[2u * g + 1u] * k.v[2u * g + 1u]);
    return (p.x + p.y) + (p.z + p.w);
}

// This lane's partial dot product q·k over its channels: the groups of 8 summed left to right.
fn lane_dot(q: Lane, k: Lane) -> f32 {
    var s = group8_dot(q, k, 0u);
    for (var g = 1u; g < WPL; g++) {
        s = s + group8_dot(q, k, g);
    }
    return s;
}

// Σ of x over the 8 lanes, the same value in every lane.
fn lanes_sum(x: f32) -> f32 {
    let a = x + subgroupShuffleXor(x, 4u);
    let b = a + subgroupShuffleXor(a, 2u);
    return b + subgroupShuffleXor(b, 1u);
}

// Eight sums at once: lane l passes its partials for queries 0..7 (lo = 0..3, hi = 4..7) and
// gets back the Σ over lanes for query l — the same tree as lanes_sum.
fn lanes_sum_scatter(lo: vec4<f32>, hi: vec4<f32>, lane: u32) -> f32 {
    let first = lane < 4u;
    let h1 = select(hi, lo, first) + subgroupShuffleXor(select(lo, hi, first), 4u);
    let second = (lane & 2u) == 0u;
    let h2 = select(h1.zw, h1.xy, second) + subgroupShuffleXor(select(h1.xy, h1.zw, second), 2u);
    let third = (lane & 1u) == 0u;
    return select(h2.y, h2.x, third) + subgroupShuffleXor(select(h2.x, h2.y, third), 1u);
}

// Running output merged with a partition's: fma(o, a, o_p · b) (common/attention.wgsl).
fn lane_merge(o: Lane, a: f32, op: Lane, b: f32) -> Lane {
    var r = o;
    for (var j = 0u; j < LANE_VECS; j++) {
        r.v[j] = fma(o.v[j], vec4<f32>(a), op.v[j] * b);
    }
    return r;
}

// b where take_b, else a, over this lane's channels.
fn lane_pick(a: Lane, b: Lane, take_b: bool) -> Lane {
    var r = a;
    for (var j = 0u; j < LANE_VECS; j++) {
        r.v[j] = select(a.v[j], b.v[j], take_b);
    }
    return r;
}

// Element by element a ∘ b over this lane's channels.
fn lane_mul(a: Lane, b: Lane) -> Lane {
    var r = a;
    for (var j = 0u; j < LANE_VECS; j++) {
        r.v[j] = a.v[j] * b.v[j];
    }
    return r;
}

// One key's score s folded into a query's running softmax (max m, sum l): merge_factors with
// the key as a partition of one. Returns (m', l', c, e): m' = max(m, s), l' = fma(l, c, e), and
// for the caller's outputs o' = lane_merge(o, c, v, e × V's weight), c = exp(m − m') rescaling
// what is summed so far, e = exp(s − m') the key's weight. A key the query does not see (`sees`
// false: prefill's causal / window mask) gives (m, l, 1, 0): nothing changes. Decode (one query
// per head) and prefill (eight per tile) fold every key here, so they take the same bits.
// (Values, not pointers: with `ptr<function, f32>` arguments naga 30's SPIR-V writer panicked.)
fn fold_key(m: f32, l: f32, s: f32, sees: bool) -> vec4<f32> {
    let f = merge_factors(m, s);
    let c = select(1.0, f.x, sees);
    let e = select(0.0, f.y, sees);
    return vec4<f32>(select(m, f.z, sees), fma(l, c, e), c, e);
}
