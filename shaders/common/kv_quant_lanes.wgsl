// The lane-parallel attention kernels' view of a quantized KV pool (common/kv_quant.wgsl for
// the layout and the which-copy rule): lane j dequantizes its channels
// [j·HEAD_DIM/8, (j+1)·HEAD_DIM/8) of a key or value row into a Lane16, exactly the values the
// workgroup kernels get pair by pair (same raw × s + m per element).

// Per-channel scales and minimums of this lane's channels, loaded once per head block.
struct LaneScales {
    s: Lane16,
    m: Lane16,
}

fn f16x4_at_k(i: u32) -> vec4<f32> {
    return f16x4(k_pool[i], k_pool[i + 1u]);
}

fn f16x4_at_v(i: u32) -> vec4<f32> {
    return f16x4(v_pool[i], v_pool[i + 1u]);
}

// This lane's per-channel K scales (and int4 minimums) of the head block at word `base`; unused
// (zero) for the other granularities.
fn k_lane_scales(base: u32, lane: u32) -> LaneScales {
    var r = LaneScales(lane_zero(), lane_zero());
    if (K_GRAN != GRAN_CHANNEL) {
        return r;
    }
    let c0 = lane * 8u * WPL;
    let si = base + p.k_data_words + c0 / 2u;
    let mi = base + p.k_data_words + (HEAD_DIM + c0) / 2u;
    r.s.a = f16x4_at_k(si);
    r.s.b = f16x4_at_k(si + 2u);
    if (KVQ_HAS_MIN) {
        r.m.a = f16x4_at_k(mi);
        r.m.b = f16x4_at_k(mi + 2u);
    }
    if (WPL > 1u) {
        r.s.c = f16x4_at_k(si + 4u);
        r.s.d = f16x4_at_k(si + 6u);
        if (KVQ_HAS_MIN) {
            r.m.c = f16x4_at_k(mi + 4u);
            r.m.d = f16x4_at_k(mi + 6u);
        }
    }
    return r;
}

fn v_lane_scales(base: u32, lane: u32) -> LaneScales {
    var r = LaneScales(lane_zero(), lane_zero());
    if (V_GRAN != GRAN_CHANNEL) {
        return r;
    }
    let c0 = lane * 8u * WPL;
    let si = base + p.v_data_words + c0 / 2u;
    let mi = base + p.v_data_words + (HEAD_DIM + c0) / 2u;
    r.s.a = f16x4_at_v(si);
    r.s.b = f16x4_at_v(si + 2u);
    if (KVQ_HAS_MIN) {
        r.m.a = f16x4_at_v(mi);
        r.m.b = f16x4_at_v(mi + 2u);
    }
    if (WPL > 1u) {
        r.s.c = f16x4_at_v(si + 4u);
        r.s.d = f16x4_at_v(si + 6u);
        if (KVQ_HAS_MIN) {
            r.m.c = f16x4_at_v(mi + 4u);
            r.m.d = f16x4_at_v(mi + 6u);
        }
    }
    return r;
}

// raw × s + m, element by element (per-channel) or with one (s, m) for the whole row.
fn lane_affine(r: Lane16, s: Lane16, m: Lane16) -> Lane16 {
    return Lane16(r.a * s.a + m.a, r.b * s.b + m.b, r.c * s.c + m.c, r.d * s.d + m.d);
}

fn lane_affine1(r: Lane16, sm: vec2<f32>) -> Lane16 {
    return Lane16(r.a * sm.x + sm.y, r.b * sm.x + sm.y, r.c * sm.x + sm.y, r.d * sm.x + sm.y);
}

// This lane's raw codes of token t of the K head block at word `base`.
fn k_lane_raw(base: u32, t: u32, lane: u32) -> Lane16 {
    let i = base + (t * HEAD_DIM + lane * 8u * WPL) * KVQ_BITS / 32u;
    var w1 = 0u;
    if (KVQ_WORDS8 > 1u) {
        w1 = k_pool[i + 1u];
    }
    let r0 = kvq_raw8(k_pool[i], w1);
    var r = Lane16(r0.lo, r0.hi, vec4<f32>(0.0), vec4<f32>(0.0));
    if (WPL > 1u) {
        let j = i + KVQ_WORDS8;
        var w3 = 0u;
        if (KVQ_WORDS8 > 1u) {
            w3 = k_pool[j + 1u];
        }
        let r1 = kvq_raw8(k_pool[j], w3);
        r.c = r1.lo;
        r.d = r1.hi;
    }
    return r;
}

fn v_lane_raw(base: u32, t: u32, lane: u32) -> Lane16 {
    let i = base + (t * HEAD_DIM + lane * 8u * WPL) * KVQ_BITS / 32u;
    var w1 = 0u;
    if (KVQ_WORDS8 > 1u) {
        w1 = v_pool[i + 1u];
    }
    let r0 = kvq_raw8(v_pool[i], w1);
    var r = Lane16(r0.lo, r0.hi, vec4<f32>(0.0), vec4<f32>(0.0));
    if (WPL > 1u) {
        let j = i + KVQ_WORDS8;
        var w3 = 0u;
        if (KVQ_WORDS8 > 1u) {
            w3 = v_pool[j + 1u];
        }
        let r1 = kvq_raw8(v_pool[j], w3);
        r.c = r1.lo;
        r.d = r1.hi;
    }
    return r;
}

// Token t of the K head block at word `base`, dequantized (`cs`: from k_lane_scales).
fn k_lane_q(base: u32, t: u32, lane: u32, cs: LaneScales) -> Lane16 {
    let raw = k_lane_raw(base, t, lane);
    if (K_GRAN == GRAN_CHANNEL) {
        return lane_affine(raw, cs.s, cs.m);
    }
    return lane_affine1(raw, k_token_sm(base, t));
}

fn v_lane_q(base: u32, t: u32, lane: u32, cs: LaneScales) -> Lane16 {
    let raw = v_lane_raw(base, t, lane);
    if (V_GRAN == GRAN_CHANNEL) {
        return lane_affine(raw, cs.s, cs.m);
    }
    return lane_affine1(raw, v_token_sm(base, t));
}

fn f16_round4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(f16_round2(v.xy), f16_round2(v.zw));
}

// This lane's channels of K (part 0) or V (part 1) at position `pos` of `seq`, in f16: from the
// staging slot before the step's chunk, else from the step's qkv row (rounded to f16).
fn kv_lane_f16(part: u32, seq: SeqInfo, pos: u32, kvh: u32, lane: u32) -> Lane16 {
    let chunk = seq.ctx_len - seq.q_len;
    var r = lane_zero();
    if (pos < chunk) {
        let i = stage_row(part, seq.stage_slot, kvh, pos % p.block_size) + lane * 4u * WPL;
        r.a = f16x4(stage[i], stage[i + 1u]);
        r.b = f16x4(stage[i + 2u], stage[i + 3u]);
        if (WPL > 1u) {
            r.c = f16x4(stage[i + 4u], stage[i + 5u]);
            r.d = f16x4(stage[i + 6u], stage[i + 7u]);
        }
        return r;
    }
    let off = select(p.k_offset, p.v_offset, part == 1u);
    let i = ((seq.q_start + pos - chunk) * p.qkv_stride + off + kvh * HEAD_DIM) / 4u + lane * 2u * WPL;
    r.a = f16_round4(qkv[i]);
    r.b = f16_round4(qkv[i + 1u]);
    if (WPL > 1u) {
        r.c = f16_round4(qkv[i + 2u]);
        r.d = f16_round4(qkv[i + 3u]);
    }
    return r;
}

fn lane_pick(a: Lane16, b: Lane16, take_b: bool) -> Lane16 {
    return Lane16(select(a.a, b.a, take_b), select(a.b, b.b, take_b), select(a.c, b.c, take_b), select(a.d, b.d, take_b));
}
