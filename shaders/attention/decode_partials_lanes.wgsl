// Paged decode attention, split-K part, for CPU adapters: one subgroup of 8 lanes per
// (partition of PART keys, query head, decode sequence); lane j holds channels
// [j·HEAD_DIM/8, (j+1)·HEAD_DIM/8) (common/attention_lanes.wgsl). Two passes over the
// partition's keys: the max score, then exp / sum / weighted V. Writes (m_p, l_p, o_p) like
// decode_partials.wgsl, so decode_reduce.wgsl merges them.
// GQA/MQA by index broadcast: query head h reads KV head h / (num_heads / num_kv_heads).

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
    let h = wid.y;
    let kvh = h / (p.num_heads / p.num_kv_heads);
    let q = q_lane(seq.q_start, h, lane);
    let table = seq.table_start;

    var m = NEG_BIG;
    for (var pos = k0; pos < end; pos++) {
        let row = pool_row(block_tables[table + pos / p.block_size], pos, kvh, lane);
        m = max(m, lanes_sum(lane_dot(q, k_lane(row))) * p.scale);
    }
    var l = 0.0;
    var o = lane_zero();
    for (var pos = k0; pos < end; pos++) {
        let row = pool_row(block_tables[table + pos / p.block_size], pos, kvh, lane);
        let e = exp(lanes_sum(lane_dot(q, k_lane(row))) * p.scale - m);
        l = l + e;
        o = lane_fma(e, v_lane(row), o);
    }

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
