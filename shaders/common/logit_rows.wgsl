// What the kernels that run one workgroup a logit row share (argmax, logprob, sampling):
// their params (kernels::VocabParams) and the integer key of a logit.

struct VocabParams {
    vocab: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// An f32 as an integer key that orders as the value does (WGSL lets a compiler assume no NaN
// and no infinity in float comparisons, so logits compare as integers): the sign bit flipped
// for positives, every bit for negatives, −0 mapped to +0's key first. Returns (valid, key):
// valid 0 for NaN, which has no key.
fn logit_key(x: f32) -> vec2<u32> {
    var bits = bitcast<u32>(x);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        return vec2<u32>(0u, 0u);
    }
    if (bits == 0x80000000u) {
        bits = 0u;
    }
    let key = select(bits ^ 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);
    return vec2<u32>(1u, key);
}
