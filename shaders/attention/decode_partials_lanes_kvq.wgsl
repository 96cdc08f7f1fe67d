// Paged decode attention over a quantized KV pool, split-K part, for CPU adapters: one subgroup
// of 8 lanes per (partition of PART keys, slice of up to LANE_HEADS query heads of one KV head,
// decode sequence), as decode_partials_lanes.wgsl (each key and value row loaded once for the
// slice's heads). Keys before the query's own block come from their quantized head blocks: the
// codes are read per key, the scales applied per block or per score where the algebra allows
// (common/kv_quant_lanes.wgsl, k_fold and below); the own block's keys are f16, from the
// staging slot or this step's qkv row. prefill_lanes_kvq.wgsl repeats this arithmetic in the
// same order, so a token's output is the same bits in both.

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> qkv: array<vec4<f32>>;       // [tokens, qkv_stride / 4]
@group(0) @binding(3) var<storage, read> k_pool: array<u64>;          // [blocks, kv_heads, k_head_block_words / 2]
@group(0) @binding(4) var<storage, read> v_pool: array<u64>;          // [blocks, kv_heads, v_head_block_words / 2]
@group(0) @binding(5) var<storage, read> stage: array<u32>;           // [2, stage_slots, kv_heads, block_size, HEAD_DIM/2] f16x2
@group(0) @binding(6) var<storage, read> seqs: array<SeqInfo>;        // [num_seqs]; decode ones first
@group(0) @binding(7) var<storage, read> block_tables: array<u32>;    // concatenated tables
@group(0) @binding(8) var<storage, read_write> partials: array<f32>;  // [decode_seqs, num_heads, max_partitions, HEAD_DIM + 2]

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
    var q: array<Lane16, LANE_HEADS>;
    var qsum: array<f32, LANE_HEADS>;  // Σ of each query's channels (k_score)
    var m: array<f32, LANE_HEADS>;
    var l: array<f32, LANE_HEADS>;
    var o: array<Lane16, LANE_HEADS>;
    var mv: array<f32, LANE_HEADS>;    // Σ e × V's minimums (v_min_acc)
    for (var i = 0u; i < LANE_HEADS; i++) {
        q[i] = q_lane(seq.q_start, hs.h0 + min(i, nh - 1u), lane);
        qsum[i] = lanes_sum(lane_total(q[i]));
        m[i] = NEG_BIG;
        l[i] = 0.0;
        o[i] = lane_zero();
        mv[i] = 0.0;
    }
    let table = seq.table_start;
    let bs = p.block_size;
    let own = (seq.ctx_len - 1u) / bs * bs;  // first key of the query's own (f16) block
    let q_end = min(end, own);               // keys [k0, q_end) are quantized

    // One pass (fold_key): the quantized keys, then the own block's f16 ones.
    var pos = k0;
    while (pos < q_end) {
        let blk = pos / bs;
        let hb = block_tables[table + blk] * p.num_kv_heads + kvh;
        let kb = hb * p.k_head_block_words;
        let vb = hb * p.v_head_block_words;
        let ks = k_lane_scales(kb, lane);
        let vs = v_lane_scales(vb, lane);
        var kq: array<KQuery, LANE_HEADS>;
        for (var i = 0u; i < LANE_HEADS; i++) {
            kq[i] = k_fold(q[i], ks);
        }
        let seg = min(q_end, (blk + 1u) * bs);
        for (var t = pos % bs; pos < seg; pos++) {
            let raw = k_lane_raw(kb, t, lane);
            let sm = k_token_sm(kb, t);
            let v = v_lane_load(vb, t, lane, vs);
            let vsm = v_token_sm(vb, t);
            t++;
            for (var i = 0u; i < LANE_HEADS; i++) {
                if (i < nh) {
                    let s = k_score(lanes_sum(k_lane_dot(kq[i], raw)), sm, qsum[i]) * p.scale;
                    let f = fold_key(m[i], l[i], s, true);
                    m[i] = f.x;
                    l[i] = f.y;
                    o[i] = lane_merge(o[i], f.z, v, v_weight(f.w, vsm));
                    mv[i] = v_min_acc(f.w, vsm, mv[i] * f.z);
                }
            }
        }
    }
    for (pos = max(k0, own); pos < end; pos++) {
        let k = kv_lane_f16(0u, seq, pos, kvh, lane);
        let v = kv_lane_f16(1u, seq, pos, kvh, lane);
        for (var i = 0u; i < LANE_HEADS; i++) {
            if (i < nh) {
                let f = fold_key(m[i], l[i], lanes_sum(lane_dot(q[i], k)) * p.scale, true);
                m[i] = f.x;
                l[i] = f.y;
                o[i] = lane_merge(o[i], f.z, v, f.w);
                mv[i] = mv[i] * f.z;
            }
        }
    }
    for (var i = 0u; i < LANE_HEADS; i++) {
        o[i] = v_min_apply(o[i], mv[i]);
    }

    write_partials(si, hs, part, lane, m, l, o);
}
