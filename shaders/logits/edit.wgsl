// The CPU sampler's logit shaping (sample::Sampler: logit bias, the repetition, frequency and
// presence penalties, min_tokens' end-of-sequence mask) on the GPU, as sparse edits of the logit
// rows before the argmax and the draw: one invocation an edit, each edit one (row, token) with
// every operation the sampler applies to that logit, in its order. The host lists each
// (row, token) once (kernels::logit_edit), so no two invocations touch one logit. The same f32
// operations as the sampler's, so the same bits: l + bias; l · (1 / r) where l > 0, else l · r;
// l − penalty; −inf.

struct LogitEdit {
    row: u32,
    id: u32,
    flags: u32,           // EDIT_*
    bias: f32,
    penalty: f32,         // frequency · count + presence, formed on the host
    repetition: f32,      // r
    inv_repetition: f32,  // 1 / r, formed on the host
    _pad: u32,
}

const EDIT_BIAS: u32 = 1u;
const EDIT_REPETITION: u32 = 2u;
const EDIT_PENALTY: u32 = 4u;
const EDIT_MASK: u32 = 8u;

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: VocabParams;
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;  // [num_logits, vocab]
@group(0) @binding(3) var<storage, read> edits: array<LogitEdit>;   // [num_logit_edits]

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wid.x + wid.y * nwg.x) * 64u + lid;
    if (i >= step.num_logit_edits) {
        return;
    }
    let e = edits[i];
    let at = e.row * p.vocab + e.id;
    var l = logits[at];
    if ((e.flags & EDIT_BIAS) != 0u) {
        l = l + e.bias;
    }
    if ((e.flags & EDIT_REPETITION) != 0u) {
        l = select(l * e.repetition, l * e.inv_repetition, l > 0.0);
    }
    if ((e.flags & EDIT_PENALTY) != 0u) {
        l = l - e.penalty;
    }
    if ((e.flags & EDIT_MASK) != 0u) {
        l = bitcast<f32>(0xFF800000u);
    }
    logits[at] = l;
}
