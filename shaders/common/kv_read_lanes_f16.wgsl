// The lane-parallel attention kernels' KV reader over an f16 pool ([blocks, kv_heads,
// block_size, HEAD_DIM / 8] vec4<u32>, 8 f16 a vec4): lane j reads its channels
// [j·HEAD_DIM/8, (j+1)·HEAD_DIM/8) of a row.
//
// A KV reader of the lanes family (this file; kv_quant_lanes.wgsl over a quantized pool) defines,
// so that decode_partials_lanes.wgsl and prefill_lanes.wgsl are one body for every pool:
//   bindings 3, 4, 5   k_pool, v_pool, stage (an f16 pool has no staging: the host binds the K
//                      pool there and nothing reads it)
//   KV_FRESH           whether any key is read fresh, in f16 from staging or this step's qkv
//                      (kv_lane_f16), instead of from the pool
//   fresh_from(qpos)   the first key position a query at qpos reads fresh
//   k_block_base(hb), v_block_base(hb)   where head block hb (block · kv_heads + kvh) starts
//   LaneScales, k_lane_scales, v_lane_scales   what a head block's keys share (per-channel scales)
//   KQuery, k_fold, k_lane_dot, k_score, query_total   a query as a block's keys see it, and a
//                      score from this lane's part of it
//   k_lane_raw, k_token_sm, v_lane_load, v_token_sm, v_weight, v_min_acc, v_min_apply
//                      token t of a head block, and how its value row enters the output
// Over an f16 pool every one of these is the plain row and the plain dot product: the bits of
// a score are lanes_sum(lane_dot(q, k)) × scale, and a value row enters o with the key's weight.

@group(0) @binding(3) var<storage, read> k_pool: array<vec4<u32>>;  // [blocks, kv_heads, block_size, HEAD_DIM/8] f16x8
@group(0) @binding(4) var<storage, read> v_pool: array<vec4<u32>>;  // same

// Every key is in the pool: none is read fresh.
const KV_FRESH: bool = false;

fn fresh_from(qpos: u32) -> u32 {
    return 0xFFFFFFFFu;
}

// This lane's channels of a key (from_k) or value row: `i` is the row's first vec4<u32> plus
// lane · WPL (the pool holds two f16 per u32). Every caller passes a constant `from_k`, so
// once inlined only one pool's load is left.
fn kv_lane(from_k: bool, i: u32) -> Lane {
    var r = lane_zero();
    for (var j = 0u; j < WPL; j++) {
        var w: vec4<u32>;
        if (from_k) {
            w = k_pool[i + j];
        } else {
            w = v_pool[i + j];
        }
        r.v[2u * j] = f16x4(w.x, w.y);
        r.v[2u * j + 1u] = f16x4(w.z, w.w);
    }
    return r;
}

// vec4<u32> index of head block hb's first row (K and V pools alike).
fn k_block_base(hb: u32) -> u32 {
    return hb * p.block_size * (HEAD_DIM / 8u);
}

fn v_block_base(hb: u32) -> u32 {
    return k_block_base(hb);
}

// vec4<u32> index of this lane's part of row t of the head block at `base`.
fn lane_row(base: u32, t: u32, lane: u32) -> u32 {
    return base + t * (HEAD_DIM / 8u) + lane * WPL;
}

// f16 rows share nothing per block.
struct LaneScales {
    none: f32,
}

fn k_lane_scales(base: u32, lane: u32) -> LaneScales {
    return LaneScales(0.0);
}

fn v_lane_scales(base: u32, lane: u32) -> LaneScales {
    return LaneScales(0.0);
}

// The query itself.
struct KQuery {
    q: Lane,
}

fn k_fold(q: Lane, ks: LaneScales) -> KQuery {
    return KQuery(q);
}

fn k_lane_dot(kq: KQuery, raw: Lane) -> f32 {
    return lane_dot(kq.q, raw);
}

fn k_score(d: f32, sm: vec2<f32>, qsum: f32) -> f32 {
    return d;
}

// No score needs the query's Σ.
fn query_total(q: Lane) -> f32 {
    return 0.0;
}

fn k_lane_raw(base: u32, t: u32, lane: u32) -> Lane {
    return kv_lane(true, lane_row(base, t, lane));
}

fn k_token_sm(base: u32, t: u32) -> vec2<f32> {
    return vec2<f32>(1.0, 0.0);
}

fn v_lane_load(base: u32, t: u32, lane: u32, cs: LaneScales) -> Lane {
    return kv_lane(false, lane_row(base, t, lane));
}

fn v_token_sm(base: u32, t: u32) -> vec2<f32> {
    return vec2<f32>(1.0, 0.0);
}

fn v_weight(e: f32, sm: vec2<f32>) -> f32 {
    return e;
}

fn v_min_acc(e: f32, sm: vec2<f32>, acc: f32) -> f32 {
    return acc;
}

fn v_min_apply(o: Lane, acc: f32) -> Lane {
    return o;
}

// The key's row as it is in the pool (fresh_from never sends a key here).
fn kv_lane_f16(part: u32, seq: SeqInfo, pos: u32, kvh: u32, lane: u32) -> Lane {
    let hb = block_tables[seq.table_start + pos / p.block_size] * p.pool_heads + p.pool_head_base + kvh;
    return kv_lane(part == 0u, lane_row(k_block_base(hb), pos % p.block_size, lane));
}
