// Log-probabilities on the GPU: for each logit row with a target token, log softmax(row)[target]
// = x[target] − (max + log Σ exp(x − max)), in f32 with one fixed order of summation (each
// invocation sums its strided part of the vocabulary in index order, then a tree over the
// workgroup), so a row's value never depends on the step it was computed in. Perplexity and
// prompt logprobs read back 4 bytes a row this way instead of the row (`model::LogitReadback::
// TargetLogprobs`). One workgroup per row; a row whose target is NO_TARGET is skipped. The
// results go after the step's argmax ids in the same buffer: out[num_logits + row].

const WG: u32 = 256u;
const NO_TARGET: u32 = 0xFFFFFFFFu;

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: VocabParams;
@group(0) @binding(2) var<storage, read> logits: array<f32>;        // [num_logits, vocab]
@group(0) @binding(3) var<storage, read> targets: array<u32>;       // [num_logits]
@group(0) @binding(4) var<storage, read_write> out: array<u32>;     // [2 · num_logits]

var<workgroup> sh: array<f32, WG>;

// The tree over the workgroup's values (max or sum); every invocation gets the result.
fn reduce(v: f32, t: u32, is_max: bool) -> f32 {
    sh[t] = v;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half /= 2u) {
        if (t < half) {
            let o = sh[t + half];
            sh[t] = select(sh[t] + o, max(sh[t], o), is_max);
        }
        workgroupBarrier();
    }
    let r = sh[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    let t = lid.x;
    // uniform per workgroup: row is the workgroup's
    if (row >= step.num_logits) {
        return;
    }
    let tgt = targets[row];
    if (tgt == NO_TARGET) {
        return;
    }
    let base = row * p.vocab;
    var m = -3.4028235e38;
    for (var j = t; j < p.vocab; j += WG) {
        m = max(m, logits[base + j]);
    }
    m = reduce(m, t, true);
    var s = 0.0;
    for (var j = t; j < p.vocab; j += WG) {
        s += exp(logits[base + j] - m);
    }
    s = reduce(s, t, false);
    if (t == 0u) {
        let lp = logits[base + min(tgt, p.vocab - 1u)] - m - log(s);
        out[step.num_logits + row] = bitcast<u32>(lp);
    }
}
