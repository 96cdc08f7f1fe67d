// Random sampling on the GPU: each logit row's token drawn by the CPU sampler's rules
// (sample::Sampler, random mode) from the row's logits and one uniform draw the host made with
// the sequence's seeded RNG, so only the token id comes back (4 bytes, not the row).
//
// The CPU sampler scales by 1/temperature, keeps the top k (ties: lower id), takes the softmax
// weights exp(s − max), drops those below min_p, keeps the shortest prefix of the rest in
// descending order whose weight reaches top_p of their total, and draws from what is left.
// Every filter keeps a prefix of one order: scaled logit descending, then id ascending. Here an
// element's place in that order is the 64-bit key (~logit_key(s), id), ascending, and each
// filter is one selection: the first element, in key order among those kept so far, at which
// the running count (top-k) or running weight (top-p, then the draw itself) reaches a target.
// A selection is a radix select: 8 bits of the key a pass, a histogram of the kept elements in
// that bin range (counts and weights) in workgroup memory, a scan of its 256 bins, the first bin
// that reaches the target; 4 passes settle the scaled logit, and the id follows in one pass when
// the logit is unique (4 more where it is tied). Weights are fixed point (w · 2^31, rounded) in
// 64-bit sums (two u32 words, the carry added when the low word wraps), so sums and targets are
// exact integers and every order of summation gives the same bits. The draw is the inverse CDF
// in key order: the first element whose running weight exceeds floor(total · draw / 2^32).
//
// Rows at temperature 0 keep the argmax the argmax kernel wrote before this one (the greedy
// choice); a row whose scaled maximum is not finite (a +inf logit, a temperature so small the
// maximum overflows) keeps it too, as the CPU sampler returns its argmax then. A weight below
// 2^−32 of the maximum's rounds to 0 and is never drawn. One workgroup per row.

const WG: u32 = 256u;
// a weight of 1 (the maximum's) in fixed point
const ONE: f32 = 2147483648.0;

// Mirror of kernels::sample::RowSampling.
struct RowSampling {
    temperature: f32, // ≤ 0: keep the argmax
    top_k: u32,       // 0: off
    top_p: u32,       // p · 2^32, 0: off
    min_p: f32,       // ≤ 0: off
    draw: u32,        // the uniform draw u · 2^32, u in [0, 1)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: VocabParams;
@group(0) @binding(2) var<storage, read> logits: array<f32>;         // [num_logits, vocab]
@group(0) @binding(3) var<storage, read> rows: array<RowSampling>;   // [num_logits]
@group(0) @binding(4) var<storage, read_write> token_ids: array<u32>; // [num_logits]: argmax in, token out

// one pass's histogram: weight (two words) and count of each bin
var<workgroup> bin_lo: array<atomic<u32>, WG>;
var<workgroup> bin_hi: array<atomic<u32>, WG>;
var<workgroup> bin_n: array<atomic<u32>, WG>;
// the scan of the bins' weights; the tree of the total
var<workgroup> sum_lo: array<u32, WG>;
var<workgroup> sum_hi: array<u32, WG>;
// the first bin that reaches the target (WG: none), then the smallest id of a unique element
var<workgroup> first: atomic<u32>;
// what the bin that reached decided, written by its invocation, read uniformly:
// [before.lo, before.hi, through.lo, through.hi, count]
var<workgroup> chosen: array<u32, 5>;
var<workgroup> chosen_bin: u32;
var<workgroup> chosen_id: u32;

// ---- 64-bit unsigned arithmetic on (lo, hi) word pairs

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

fn ge64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y > b.y || (a.y == b.y && a.x >= b.x);
}

// The full product a · b as (lo, hi).
fn mul32(a: u32, b: u32) -> vec2<u32> {
    let al = a & 0xFFFFu;
    let ah = a >> 16u;
    let bl = b & 0xFFFFu;
    let bh = b >> 16u;
    let ll = al * bl;
    let lh = al * bh;
    let hl = ah * bl;
    let hh = ah * bh;
    let mid = lh + hl;
    let mid_carry = select(0u, 0x10000u, mid < lh);
    let lo = ll + (mid << 16u);
    let lo_carry = select(0u, 1u, lo < ll);
    return vec2<u32>(lo, hh + (mid >> 16u) + mid_carry + lo_carry);
}

// floor(a · f / 2^32): a scaled by the fraction f / 2^32.
fn scale64(a: vec2<u32>, f: u32) -> vec2<u32> {
    let p0 = mul32(a.x, f);
    let p1 = mul32(a.y, f);
    let lo = p0.y + p1.x;
    return vec2<u32>(lo, p1.y + select(0u, 1u, lo < p0.y));
}

// ---- one element of a row

struct Elem {
    kept: bool,
    key: u32,    // ~logit_key(scaled logit): ascending = the CPU sampler's descending
    weight: u32, // exp(s − max) · 2^31, rounded
}

// What a row's filters have settled so far: the cut (the last kept key and id) and min_p.
struct Row {
    base: u32,
    temperature: f32,
    max_s: f32,
    min_p: f32,
    cut_key: u32,
    cut_id: u32,
}

fn elem(r: Row, j: u32) -> Elem {
    var e: Elem;
    let s = logits[r.base + j] / r.temperature;
    let k = logit_key(s);
    e.key = ~k.y;
    // −inf (and a scaled logit so far below the maximum that the difference overflows) weighs 0
    let d = s - r.max_s;
    let w = select(exp(d), 0.0, (bitcast<u32>(d) & 0x7F800000u) == 0x7F800000u);
    e.weight = u32(w * ONE + 0.5);
    e.kept = k.x == 1u && (e.key < r.cut_key || (e.key == r.cut_key && j <= r.cut_id))
        && (r.min_p <= 0.0 || w >= r.min_p);
    return e;
}

// The byte of the key (digit < 4) or of the id (digits 4..7) a pass bins by, or WG when the
// element lies outside the bin range the earlier passes chose (`pre_key`, `pre_id`).
fn digit_of(e: Elem, j: u32, digit: u32, pre_key: u32, pre_id: u32) -> u32 {
    if (digit < 4u) {
        let shift = 24u - 8u * digit;
        if (digit > 0u && (e.key >> (shift + 8u)) != (pre_key >> (shift + 8u))) {
            return WG;
        }
        return (e.key >> shift) & 0xFFu;
    }
    let shift = 24u - 8u * (digit - 4u);
    if (e.key != pre_key || (digit > 4u && (j >> (shift + 8u)) != (pre_id >> (shift + 8u)))) {
        return WG;
    }
    return (j >> shift) & 0xFFu;
}

// Whether a running amount reaches the goal: ≥, or > where `strict`.
fn reaches(sum: vec2<u32>, goal: vec2<u32>, strict: bool) -> bool {
    if (strict) {
        return !ge64(goal, sum);
    }
    return ge64(sum, goal);
}

// The selection: the first kept element, in key order, whose running amount (1 each, or its
// weight where `by_weight`) reaches `goal`. Returns (found, key, id, through.lo, through.hi):
// the element and the running amount through it.
fn select_first(r: Row, t: u32, by_weight: bool, goal: vec2<u32>, strict: bool) -> array<u32, 5> {
    var pre_key = 0u;
    var pre_id = 0u;
    var before = vec2<u32>(0u, 0u);
    var through = vec2<u32>(0u, 0u);
    for (var digit = 0u; digit < 8u; digit += 1u) {
        atomicStore(&bin_lo[t], 0u);
        atomicStore(&bin_hi[t], 0u);
        atomicStore(&bin_n[t], 0u);
        if (t == 0u) {
            atomicStore(&first, WG);
        }
        workgroupBarrier();
        for (var j = t; j < p.vocab; j += WG) {
            let e = elem(r, j);
            if (!e.kept) {
                continue;
            }
            let d = digit_of(e, j, digit, pre_key, pre_id);
            if (d == WG) {
                continue;
            }
            let amount = select(1u, e.weight, by_weight);
            let old = atomicAdd(&bin_lo[d], amount);
            if (old + amount < old) {
                atomicAdd(&bin_hi[d], 1u);
            }
            atomicAdd(&bin_n[d], 1u);
        }
        workgroupBarrier();
        // inclusive scan of the bins' amounts (Hillis–Steele over the workgroup)
        let own = vec2<u32>(atomicLoad(&bin_lo[t]), atomicLoad(&bin_hi[t]));
        var acc = own;
        sum_lo[t] = acc.x;
        sum_hi[t] = acc.y;
        workgroupBarrier();
        for (var off = 1u; off < WG; off *= 2u) {
            var add = vec2<u32>(0u, 0u);
            if (t >= off) {
                add = vec2<u32>(sum_lo[t - off], sum_hi[t - off]);
            }
            workgroupBarrier();
            acc = add64(acc, add);
            sum_lo[t] = acc.x;
            sum_hi[t] = acc.y;
            workgroupBarrier();
        }
        // the running amount is monotone: the first non-empty bin that reaches holds the element
        let upto = add64(before, acc);
        let n = atomicLoad(&bin_n[t]);
        if (n > 0u && reaches(upto, goal, strict)) {
            atomicMin(&first, t);
        }
        workgroupBarrier();
        if (atomicLoad(&first) == t) {
            let b = sub64(upto, own);
            chosen = array<u32, 5>(b.x, b.y, upto.x, upto.y, n);
            chosen_bin = t;
        }
        let found = workgroupUniformLoad(&chosen_bin);
        if (found == WG) {
            return array<u32, 5>(0u, 0u, 0u, 0u, 0u);
        }
        let c = workgroupUniformLoad(&chosen);
        before = vec2<u32>(c[0], c[1]);
        through = vec2<u32>(c[2], c[3]);
        if (digit < 4u) {
            pre_key |= found << (24u - 8u * digit);
        } else {
            pre_id |= found << (24u - 8u * (digit - 4u));
        }
        if (t == 0u) {
            chosen_bin = WG;
        }
        if (digit == 3u && c[4] == 1u) {
            // a unique scaled logit: its id is the one kept element with that key
            if (t == 0u) {
                atomicStore(&first, 0xFFFFFFFFu);
            }
            workgroupBarrier();
            for (var j = t; j < p.vocab; j += WG) {
                let e = elem(r, j);
                if (e.kept && e.key == pre_key) {
                    atomicMin(&first, j);
                }
            }
            workgroupBarrier();
            if (t == 0u) {
                chosen_id = atomicLoad(&first);
            }
            pre_id = workgroupUniformLoad(&chosen_id);
            break;
        }
    }
    return array<u32, 5>(1u, pre_key, pre_id, through.x, through.y);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    let t = lid.x;
    if (t == 0u) {
        chosen_bin = WG;
    }
    // rows past the step's are skipped (uniformly: row is the same for the whole workgroup)
    if (row >= step.num_logits) {
        return;
    }
    let rs = rows[row];
    if (!(rs.temperature > 0.0)) {
        return; // greedy: the argmax stays
    }
    var r: Row;
    r.base = row * p.vocab;
    r.temperature = rs.temperature;
    if (t == 0u) {
        chosen_id = token_ids[row];
    }
    let argmax = min(workgroupUniformLoad(&chosen_id), p.vocab - 1u);
    r.max_s = logits[r.base + argmax] / r.temperature;
    let max_key = logit_key(r.max_s);
    if (max_key.x == 0u || (bitcast<u32>(r.max_s) & 0x7F800000u) == 0x7F800000u) {
        return; // all NaN, +inf, or an overflowing scale: the argmax, as the CPU sampler
    }
    r.min_p = 0.0;
    r.cut_key = 0xFFFFFFFFu;
    r.cut_id = 0xFFFFFFFFu;
    // top-k: the k-th element in key order is the last kept
    if (rs.top_k > 0u) {
        let k = select_first(r, t, false, vec2<u32>(rs.top_k, 0u), false);
        if (k[0] == 1u) {
            r.cut_key = k[1];
            r.cut_id = k[2];
        }
    }
    // min_p: a weight threshold, applied in `elem`
    r.min_p = rs.min_p;
    // the total weight of what is kept
    var total = vec2<u32>(0u, 0u);
    for (var j = t; j < p.vocab; j += WG) {
        let e = elem(r, j);
        if (e.kept) {
            total = add64(total, vec2<u32>(e.weight, 0u));
        }
    }
    sum_lo[t] = total.x;
    sum_hi[t] = total.y;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half /= 2u) {
        if (t < half) {
            let o = add64(vec2<u32>(sum_lo[t], sum_hi[t]), vec2<u32>(sum_lo[t + half], sum_hi[t + half]));
            sum_lo[t] = o.x;
            sum_hi[t] = o.y;
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        chosen = array<u32, 5>(sum_lo[0], sum_hi[0], 0u, 0u, 0u);
    }
    let sums = workgroupUniformLoad(&chosen);
    total = vec2<u32>(sums[0], sums[1]);
    // top-p: the first element whose running weight reaches p of the total is the last kept
    if (rs.top_p > 0u) {
        let q = select_first(r, t, true, scale64(total, rs.top_p), false);
        if (q[0] == 1u) {
            r.cut_key = q[1];
            r.cut_id = q[2];
            total = vec2<u32>(q[3], q[4]);
        }
    }
    // the draw: the first element whose running weight exceeds floor(total · u)
    let pick = select_first(r, t, true, scale64(total, rs.draw), true);
    if (t == 0u && pick[0] == 1u) {
        token_ids[row] = pick[2];
    }
}
