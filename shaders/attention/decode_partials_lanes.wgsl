// Paged decode attention, split-K part, for CPU adapters: one subgroup of 8 lanes per
// (partition of PART keys, slice of up to LANE_HEADS query heads of one KV head, decode
// sequence); lane j holds channels [j·HEAD_DIM/8, (j+1)·HEAD_DIM/8)
// (common/attention_lanes.wgsl). Each key and value row is loaded once for the slice's heads
// (GQA/MQA, and MLA's one latent head). One pass over the partition's keys with a running max
// (fold_key): no second read of each key. One body for every pool, through the KV reader
// prepended before it: common/kv_read_lanes_f16.wgsl (the plain rows), or kv_quant_lanes.wgsl
// (the codes read per key, the scales applied per block or per score where the algebra allows;
// the query's own block read fresh in f16 from staging or this step's qkv row, fresh_from).
// prefill_lanes.wgsl repeats this arithmetic per query in the same order, so a token's output
// is the same bits in both. Writes (m_p, l_p, o_p) like decode_partials.wgsl, so
// decode_reduce.wgsl merges them.

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> qkv: array<vec4<f32>>;       // [tokens, qkv_stride / 4]
// bindings 3, 4, 5: k_pool, v_pool, stage (the KV reader's)
@group(0) @binding(6) var<storage, read> seqs: array<SeqInfo>;        // [num_seqs]; decode ones first
@group(0) @binding(7) var<storage, read> block_tables: array<u32>;    // concatenated tables
@group(0) @binding(8) var<storage, read_write> partials: array<f32>;  // [decode_seqs, num_heads, max_partitions, HEAD_DIM + 2]; ONE_PASS: out [tokens, out_stride]

// ONE_PASS (every window of the step in one partition): the output, normalised as
// decode_reduce would, into binding 8 (common/decode_lanes.wgsl, write_partial); no reduce runs.
override ONE_PASS: bool = false;

// The score of a pooled key (k_lane_raw and k_token_sm) for a query folded for its block (qsum:
// the query's query_total), the same value in every lane.
fn pooled_score(kq: KQuery, raw: Lane, sm: vec2<f32>, qsum: f32) -> f32 {
    return k_score(lanes_sum(k_lane_dot(kq, raw)), sm, qsum) * p.scale;
}

// Head h after a pooled key of score s: its row v (v_lane_load) weighted by v_weight, the
// minimums' sum by v_min_acc.
fn head_fold_pooled(h: Head, s: f32, v: Lane, vsm: vec2<f32>) -> Head {
    let f = fold_key(h.m, h.l, s, true);
    return Head(f.x, f.y, lane_merge(h.o, f.z, v, v_weight(f.w, vsm)), v_min_acc(f.w, vsm, h.mv * f.z));
}

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
    // Σ of each query's channels (k_score; 0 where no score needs it)
    let qsum = vec4<f32>(
        lanes_sum(query_total(q[0])),
        lanes_sum(query_total(q[1])),
        lanes_sum(query_total(q[2])),
        lanes_sum(query_total(q[3])),
    );
    var st = slice_new();
    let table = seq.table_start;
    let bs = p.block_size;
    let fresh = fresh_from(seq.ctx_len - 1u);  // keys from here on are read fresh
    let p_end = min(end, fresh);               // keys [k0, p_end) come from the pool

    // One pass (fold_key): the pooled keys block by block, then the fresh ones.
    var pos = k0;
    while (pos < p_end) {
        let blk = pos / bs;
        let hb = block_tables[table + blk] * p.pool_heads + p.pool_head_base + kvh;
        let kb = k_block_base(hb);
        let vb = v_block_base(hb);
        let ks = k_lane_scales(kb, lane);
        let vs = v_lane_scales(vb, lane);
        let kq = array<KQuery, LANE_HEADS>(k_fold(q[0], ks), k_fold(q[1], ks), k_fold(q[2], ks), k_fold(q[3], ks));
        let seg = min(p_end, (blk + 1u) * bs);
        for (var t = pos % bs; pos < seg; pos++) {
            let raw = k_lane_raw(kb, t, lane);
            let sm = k_token_sm(kb, t);
            let v = v_lane_load(vb, t, lane, vs);
            let vsm = v_token_sm(vb, t);
            t++;
            st[0] = head_fold_pooled(st[0], pooled_score(kq[0], raw, sm, qsum.x), v, vsm);
            if (has_head(nh, 1u)) {
                st[1] = head_fold_pooled(st[1], pooled_score(kq[1], raw, sm, qsum.y), v, vsm);
            }
            if (has_head(nh, 2u)) {
                st[2] = head_fold_pooled(st[2], pooled_score(kq[2], raw, sm, qsum.z), v, vsm);
            }
            if (has_head(nh, 3u)) {
                st[3] = head_fold_pooled(st[3], pooled_score(kq[3], raw, sm, qsum.w), v, vsm);
            }
        }
    }
    for (pos = max(k0, fresh); pos < end; pos++) {
        let k = kv_lane_f16(0u, seq, pos, kvh, lane);
        let v = kv_lane_f16(1u, seq, pos, kvh, lane);
        st = fold_slice(st, q, nh, k, v);
    }
    st[0].o = v_min_apply(st[0].o, st[0].mv);
    st[1].o = v_min_apply(st[1].o, st[1].mv);
    st[2].o = v_min_apply(st[2].o, st[2].mv);
    st[3].o = v_min_apply(st[3].o, st[3].mv);

    write_partials(si, hs, part, lane, st);
}
