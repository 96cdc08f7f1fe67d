// Greedy sampling on the GPU: the index of the largest logit of each logit row, the CPU
// sampler's argmax exactly (sample::Sampler, greedy): NaN is never picked (a row of NaN gives
// 0), +inf wins, equal values go to the lowest index, −0 equals +0. One workgroup per row: each
// invocation scans a strided part of the vocabulary, then a tree over the workgroup.
//
// Values compare as integers (`logit_key`, shaders/common/logit_rows.wgsl). A
// candidate is (valid, key, index); the best is valid over invalid, then the larger key, then
// the lower index: a total order, so any tree gives the same answer.

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: VocabParams;
@group(0) @binding(2) var<storage, read> logits: array<f32>;         // [num_logits, vocab]
@group(0) @binding(3) var<storage, read_write> token_ids: array<u32>; // [num_logits]

var<workgroup> valid_sh: array<u32, WG>;
var<workgroup> key_sh: array<u32, WG>;
var<workgroup> idx_sh: array<u32, WG>;

// Whether candidate b beats candidate a.
fn better(va: u32, ka: u32, ia: u32, vb: u32, kb: u32, ib: u32) -> bool {
    if (va != vb) {
        return vb > va;
    }
    if (va == 1u && ka != kb) {
        return kb > ka;
    }
    return ib < ia;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    let t = lid.x;
    // rows past the step's are skipped (uniformly: row is the same for the whole workgroup)
    let live = row < step.num_logits;
    var v = 0u;
    var k = 0u;
    var i = 0xFFFFFFFFu;
    if (live) {
        let base = row * p.vocab;
        for (var j = t; j < p.vocab; j += WG) {
            let c = logit_key(logits[base + j]);
            if (better(v, k, i, c.x, c.y, j)) {
                v = c.x;
                k = c.y;
                i = j;
            }
        }
    }
    valid_sh[t] = v;
    key_sh[t] = k;
    idx_sh[t] = i;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half /= 2u) {
        if (t < half) {
            let o = t + half;
            if (better(valid_sh[t], key_sh[t], idx_sh[t], valid_sh[o], key_sh[o], idx_sh[o])) {
                valid_sh[t] = valid_sh[o];
                key_sh[t] = key_sh[o];
                idx_sh[t] = idx_sh[o];
            }
        }
        workgroupBarrier();
    }
    if (live && t == 0u) {
        // a row of NaN only: index 0, as the CPU sampler
        token_ids[row] = select(0u, idx_sh[0], valid_sh[0] == 1u);
    }
}
