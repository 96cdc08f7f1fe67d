// Paged decode attention, split-K part, for CPU adapters: one subgroup of 8 lanes per
// (partition of PART keys, slice of up to LANE_HEADS query heads of one KV head, decode
// sequence); lane j holds channels [j·HEAD_DIM/8, (j+1)·HEAD_DIM/8)
// (common/attention_lanes.wgsl). Each key and value row is loaded and unpacked once for the
// slice's heads (GQA/MQA, and MLA's one latent head). One pass over the partition's keys with
// a running max (common/attention_lanes.wgsl, fold_key): no second read of each key. Per head
// the arithmetic is prefill_lanes.wgsl's, so the bits depend neither on the slicing nor on
// whether the token was prefilled or decoded. Writes (m_p, l_p, o_p) like decode_partials.wgsl,
// so decode_reduce.wgsl merges them.

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> qkv: array<vec4<f32>>;        // [tokens, qkv_stride / 4]
@group(0) @binding(3) var<storage, read> k_pool: array<vec4<u32>>;     // [blocks, kv_heads, block_size, HEAD_DIM/8] f16x8
@group(0) @binding(4) var<storage, read> v_pool: array<vec4<u32>>;     // same
@group(0) @binding(5) var<storage, read> seqs: array<SeqInfo>;         // [num_seqs]; decode ones first
@group(0) @binding(6) var<storage, read> block_tables: array<u32>;     // concatenated tables
@group(0) @binding(7) var<storage, read_write> partials: array<f32>;   // [decode_seqs, num_heads, max_partitions, HEAD_DIM + 2]

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
    let si = wid.z;
    if (si >= step.num_decode_seqs) {
        return;
    }
    let seq = seqs[si];
    // Partitions are numbered from the one holding the window's first key (the first one
    // without a window): the host launches only those the window spans.
    let part = window_lo(seq.ctx_len - 1u) / PART + wid.x;
    let start = part * PART;
    if (start >= seq.ctx_len) {
        return;
    }
    let end = min(start + PART, seq.ctx_len);
    // keys [k0, end): the partition's part of the window (partitions wholly before it write
    // nothing; decode_reduce starts after them)
    let k0 = max(start, window_lo(seq.ctx_len - 1u));
    if (k0 >= end) {
        return;
    }
    // query heads [h0, h0 + nh) of KV head kvh (p.heads_per_wg ≤ LANE_HEADS per slice)
    let hs = head_slice(wid.y);
    let kvh = hs.kvh;
    let nh = hs.nh;
    let q = slice_queries(seq.q_start, hs, lane);
    var st = slice_new();
    let table = seq.table_start;
    let bs = p.block_size;

    // Block by block, the row index stepped per key: no division per key.
    var pos = k0;
    while (pos < end) {
        let blk = pos / bs;
        let seg = min(end, (blk + 1u) * bs);
        var row = pool_row(block_tables[table + blk], pos, kvh, lane);
        for (; pos < seg; pos++) {
            let k = k_lane(row);
            let v = v_lane(row);
            row += HEAD_DIM / 8u;
            st = fold_slice(st, q, nh, k, v);
        }
    }

    write_partials(si, hs, part, lane, st);
}
