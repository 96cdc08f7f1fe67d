// Mixture-of-experts routing (Qwen3-MoE, DeepSeek-V2/V3, as transformers' routers and
// llama.cpp's build_moe_ffn): per token, each expert's score p and choice value c in f32 —
//   softmax (Qwen3-MoE, DeepSeek-V2):           p = softmax(router logits), c = p (ranked by the
//                                               logits, the same order);
//   FLAG_SIGMOID (DeepSeek-V3's noaux_tc):      p = sigmoid(logit), c = p + bias[e] —
// the USED experts of highest c (ties: the lower expert index first), and their weights p_j,
// divided by Σ_j p_j when FLAG_NORM (norm_topk_prob), then times `scale` (the routed scaling
// factor). With groups > 1 the experts are `groups` equal runs, and only the `groups_used`
// groups of highest group value (ties: the lower group) are chosen from: a group's best c
// (DeepSeek-V2's group_limited_greedy), or with FLAG_SIGMOID the sum of its two best c
// (noaux_tc). Writes ids[t, j] and weights[t, j] in rank order.
//
// One workgroup of 64 invocations per token: the experts are strided over the invocations, the
// max, the sum of exponentials and each rank's choice are workgroup trees in one fixed order,
// so a token's routing never depends on the batch.

struct RouteParams {
    experts: u32,        // router logits per token
    used: u32,           // experts chosen per token (≤ MAX_USED)
    flags: u32,          // FLAG_NORM | FLAG_SIGMOID
    logits_stride: u32,  // floats between tokens' router logits
    groups: u32,         // expert groups (1: no group limit; ≤ 32)
    groups_used: u32,    // groups chosen from
    scale: f32,          // the chosen weights' factor
    _pad: u32,
}

const FLAG_NORM: u32 = 1u;
const FLAG_SIGMOID: u32 = 2u;
const MAX_USED: u32 = 32u;  // kernels::moe::MAX_USED

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: RouteParams;
@group(0) @binding(2) var<storage, read> logits: array<f32>;        // [tokens, logits_stride]
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;     // [tokens, used]
@group(0) @binding(4) var<storage, read_write> weights: array<f32>; // [tokens, used]
@group(0) @binding(5) var<storage, read> bias: array<f32>;          // [experts] (FLAG_SIGMOID)

var<workgroup> tree_v: array<f32, 64>;
var<workgroup> tree_i: array<u32, 64>;
var<workgroup> picked: array<u32, MAX_USED>;

// Workgroup max of v (every invocation gets it).
fn tree_max(lid: u32, v: f32) -> f32 {
    tree_v[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            tree_v[lid] = max(tree_v[lid], tree_v[lid + s]);
        }
        workgroupBarrier();
    }
    let r = tree_v[0];
    workgroupBarrier();
    return r;
}

// Workgroup sum of v: a fixed tree (every invocation gets it).
fn tree_sum(lid: u32, v: f32) -> f32 {
    tree_v[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            tree_v[lid] = tree_v[lid] + tree_v[lid + s];
        }
        workgroupBarrier();
    }
    let r = tree_v[0];
    workgroupBarrier();
    return r;
}

// (v, i) beats (w, j): the higher value, and on a tie the lower index.
fn beats(v: f32, i: u32, w: f32, j: u32) -> bool {
    return v > w || (v == w && i < j);
}

// The workgroup's best (value, index) pair; every invocation gets the index.
fn tree_best(lid: u32, v: f32, i: u32) -> u32 {
    tree_v[lid] = v;
    tree_i[lid] = i;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s && beats(tree_v[lid + s], tree_i[lid + s], tree_v[lid], tree_i[lid])) {
            tree_v[lid] = tree_v[lid + s];
            tree_i[lid] = tree_i[lid + s];
        }
        workgroupBarrier();
    }
    let r = tree_i[0];
    workgroupBarrier();
    return r;
}

fn is_picked(e: u32, count: u32) -> bool {
    for (var j = 0u; j < count; j++) {
        if (picked[j] == e) {
            return true;
        }
    }
    return false;
}

fn sigmoid_scores() -> bool {
    return (p.flags & FLAG_SIGMOID) != 0u;
}

// The value expert e is ranked by: its logit (softmax: the order of p) or sigmoid + bias.
fn choice(row: u32, e: u32) -> f32 {
    let l = logits[row + e];
    if (sigmoid_scores()) {
        return 1.0 / (1.0 + exp(-l)) + bias[e];
    }
    return l;
}

// A group's value: its best choice value, or with sigmoid scores the sum of its two best.
fn group_value(row: u32, g: u32, size: u32) -> f32 {
    var best = bitcast<f32>(0xff7fffffu);
    var second = bitcast<f32>(0xff7fffffu);
    for (var e = g * size; e < (g + 1u) * size; e++) {
        let v = choice(row, e);
        if (v > best) {
            second = best;
            best = v;
        } else if (v > second) {
            second = v;
        }
    }
    if (sigmoid_scores()) {
        return best + second;
    }
    return best;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.y;
    if (t >= step.num_tokens) {
        return;
    }
    let row = t * p.logits_stride;
    // softmax's max and sum of exponentials (unused by sigmoid scores)
    var m = bitcast<f32>(0xff7fffffu);
    for (var e = lid; e < p.experts; e += 64u) {
        m = max(m, logits[row + e]);
    }
    m = tree_max(lid, m);
    var s = 0.0;
    for (var e = lid; e < p.experts; e += 64u) {
        s += exp(logits[row + e] - m);
    }
    s = tree_sum(lid, s);
    // group-limited routing: a bit per group that may be chosen from
    var allowed = 0xFFFFFFFFu;
    let size = p.experts / max(p.groups, 1u);
    if (p.groups > 1u) {
        var gv = bitcast<f32>(0xff7fffffu);
        if (lid < p.groups) {
            gv = group_value(row, lid, size);
        }
        allowed = 0u;
        for (var r = 0u; r < p.groups_used; r++) {
            let open = lid < p.groups && ((allowed >> lid) & 1u) == 0u;
            let best = tree_best(lid, select(bitcast<f32>(0xff7fffffu), gv, open),
                                 select(p.groups, lid, open));
            allowed |= 1u << best;
        }
    }
    for (var j = 0u; j < p.used; j++) {
        // invocations with no candidate left offer (-max, experts): never chosen over a real one
        var bv = bitcast<f32>(0xff7fffffu);
        var bi = p.experts;
        for (var e = lid; e < p.experts; e += 64u) {
            let v = choice(row, e);
            let open = ((allowed >> (e / size)) & 1u) != 0u;
            if (open && !is_picked(e, j) && beats(v, e, bv, bi)) {
                bv = v;
                bi = e;
            }
        }
        let best = tree_best(lid, bv, bi);
        if (lid == 0u) {
            picked[j] = best;
        }
        workgroupBarrier();
    }
    if (lid != 0u) {
        return;
    }
    var score: array<f32, MAX_USED>;
    var total = 0.0;
    for (var j = 0u; j < p.used; j++) {
        let l = logits[row + picked[j]];
        if (sigmoid_scores()) {
            score[j] = 1.0 / (1.0 + exp(-l));
        } else {
            score[j] = exp(l - m) / s;
        }
        total += score[j];
    }
    for (var j = 0u; j < p.used; j++) {
        var w = score[j];
        if ((p.flags & FLAG_NORM) != 0u) {
            w = w / total;
        }
        w = w * p.scale;
        ids[t * p.used + j] = picked[j];
        weights[t * p.used + j] = w;
    }
}
