// The workgroup family's partition arithmetic (common/attention.wgsl for the order it
// implements), written once for decode_partials.wgsl and prefill.wgsl. Both kernels hold, for
// the partition in hand and each of their `rows` (query heads in decode, query tokens in
// prefill):
//   q_sh[r, HEAD_DIM]   the query
//   s_sh[r, PART]       the scores, then their exponentials
//   row_sh[u]           kv_row of the partition's key u (the KV reader's handle)
//   ulo_sh[r], uhi_sh[r] the query's valid keys [ulo, uhi) of the partition (empty if equal)
//   mp_sh[r]            the partition's max
// Inner loops step 8 at a time (then one at a time for the rest) in the order of operations of
// one at a time: llvmpipe stops an invocation's loops after 65,535 iterations in total
// (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS, shared by all loops), and a prefill tile walks every
// partition of a long context (DESIGN.md, "Traps").

const WG: u32 = 64u;        // invocations per workgroup (and PART_WORKGROUP)
const MAX_ROWS: u32 = 16u;  // most queries a workgroup holds (heads in decode, tokens in prefill)

fn qk_pair(q_off: u32, k: vec2<f32>, w: u32, s: f32) -> f32 {
    return fma(q_sh[q_off + 2u * w + 1u], k.y, fma(q_sh[q_off + 2u * w], k.x, s));
}

// q · k over HEAD_DIM (an fma chain over the channel pairs) × scale: the query at q_sh[q_off],
// the key at `pos` (row handle `row`, read fresh or from the pool: the KV reader's k_pair).
// The chain is written twice, `fresh` a constant in each, so the reader's choice of copy is made
// once per key, not once per channel pair (on llvmpipe a per-pair branch runs both copies'
// loads for every pair); a reader that reads no key fresh (KV_FRESH false) keeps one chain.
fn qk_score(q_off: u32, seq: SeqInfo, kvh: u32, pos: u32, row: u32, fresh: bool) -> f32 {
    if (KV_FRESH && fresh) {
        return qk_chain(q_off, seq, kvh, pos, row, true) * p.scale;
    }
    return qk_chain(q_off, seq, kvh, pos, row, false) * p.scale;
}

fn qk_chain(q_off: u32, seq: SeqInfo, kvh: u32, pos: u32, row: u32, fresh: bool) -> f32 {
    var s = 0.0;
    var w = 0u;
    for (; w + 8u <= HEAD_DIM / 2u; w += 8u) {
        s = qk_pair(q_off, k_pair(seq, kvh, pos, row, fresh, w), w, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, row, fresh, w + 1u), w + 1u, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, row, fresh, w + 2u), w + 2u, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, row, fresh, w + 3u), w + 3u, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, row, fresh, w + 4u), w + 4u, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, row, fresh, w + 5u), w + 5u, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, row, fresh, w + 6u), w + 6u, s);
        s = qk_pair(q_off, k_pair(seq, kvh, pos, row, fresh, w + 7u), w + 7u, s);
    }
    for (; w < HEAD_DIM / 2u; w++) {
        s = qk_pair(q_off, k_pair(seq, kvh, pos, row, fresh, w), w, s);
    }
    return s;
}

// Max of row r's scores over its valid keys of the partition, from NEG_BIG.
fn partition_max(r: u32) -> f32 {
    var m = NEG_BIG;
    var u = ulo_sh[r];
    for (; u + 8u <= uhi_sh[r]; u += 8u) {
        let i = r * PART + u;
        m = max(max(max(max(max(max(max(max(m, s_sh[i]), s_sh[i + 1u]), s_sh[i + 2u]),
            s_sh[i + 3u]), s_sh[i + 4u]), s_sh[i + 5u]), s_sh[i + 6u]), s_sh[i + 7u]);
    }
    for (; u < uhi_sh[r]; u++) {
        m = max(m, s_sh[r * PART + u]);
    }
    return m;
}

// Σ of row r's exponentials over its valid keys of the partition, left to right from 0.
fn partition_sum(r: u32) -> f32 {
    var l = 0.0;
    var u = ulo_sh[r];
    for (; u + 8u <= uhi_sh[r]; u += 8u) {
        let i = r * PART + u;
        l = l + s_sh[i] + s_sh[i + 1u] + s_sh[i + 2u] + s_sh[i + 3u] + s_sh[i + 4u]
            + s_sh[i + 5u] + s_sh[i + 6u] + s_sh[i + 7u];
    }
    for (; u < uhi_sh[r]; u++) {
        l = l + s_sh[r * PART + u];
    }
    return l;
}

// The softmax of the partition for `rows` queries, run by every invocation t of the workgroup
// once the scores and ranges are written: mp_sh[r] = m_p, then each valid score becomes
// exp(s − m_p). Afterwards partition_sum(r) is l_p and partition_pv the output. One barrier
// before each phase and one after the last.
fn partition_softmax(t: u32, rows: u32) {
    workgroupBarrier();
    if (t < rows) {
        mp_sh[t] = partition_max(t);
    }
    workgroupBarrier();
    for (var i = t; i < rows * PART; i += WG) {
        let r = i / PART;
        let u = i % PART;
        if (u >= ulo_sh[r] && u < uhi_sh[r]) {
            s_sh[i] = exp(s_sh[i] - mp_sh[r]);
        }
    }
    workgroupBarrier();
}

fn pv1(r: u32, u: u32, first: u32, fresh: u32, seq: SeqInfo, kvh: u32, w: u32, o: vec2<f32>) -> vec2<f32> {
    let pos = first + u;
    let v = v_pair(seq, kvh, pos, row_sh[u], pos >= fresh, w);
    return fma(vec2<f32>(s_sh[r * PART + u]), v, o);
}

// o_p of row r for channel pair w: Σ e_u · v_u over its valid keys, left to right from 0 (an
// fma chain). Key u of the partition sits at position first + u; keys from `fresh` on (the
// query's fresh_from) are read fresh.
fn partition_pv(r: u32, first: u32, fresh: u32, seq: SeqInfo, kvh: u32, w: u32) -> vec2<f32> {
    var o = vec2<f32>(0.0);
    var u = ulo_sh[r];
    let hi = uhi_sh[r];
    for (; u + 8u <= hi; u += 8u) {
        o = pv1(r, u, first, fresh, seq, kvh, w, o);
        o = pv1(r, u + 1u, first, fresh, seq, kvh, w, o);
        o = pv1(r, u + 2u, first, fresh, seq, kvh, w, o);
        o = pv1(r, u + 3u, first, fresh, seq, kvh, w, o);
        o = pv1(r, u + 4u, first, fresh, seq, kvh, w, o);
        o = pv1(r, u + 5u, first, fresh, seq, kvh, w, o);
        o = pv1(r, u + 6u, first, fresh, seq, kvh, w, o);
        o = pv1(r, u + 7u, first, fresh, seq, kvh, w, o);
    }
    for (; u < hi; u++) {
        o = pv1(r, u, first, fresh, seq, kvh, w, o);
    }
    return o;
}
