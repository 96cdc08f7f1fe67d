// KV format int8 (symmetric): x' = q × s, q ∈ [-127, 127], s = f16(amax / 127) (quant/kv_block.rs).
// Defines what every quantized-KV kernel asks of a format: the bits of a code, the stored
// scale (and minimum) of a group, encode, and the raw values (before × s + m) of 8 or 2 codes.

const KVQ_BITS: u32 = 8u;
const KVQ_HAS_MIN: bool = false;
const KVQ_WORDS8: u32 = 2u;  // data words holding 8 consecutive codes

// (s, m) of a group with range [lo, hi], as the f16 values stored.
fn kvq_group_scale(lo: f32, hi: f32) -> vec2<f32> {
    let amax = max(abs(lo), abs(hi));
    return vec2<f32>(nonzero_scale(f16_bits(div_rn(amax, 127.0))), 0.0);
}

fn kvq_encode(x: f32, sm: vec2<f32>) -> u32 {
    let q = clamp(round(div_rn(x, sm.x)), -127.0, 127.0);
    return u32(i32(q)) & 0xFFu;
}

// The 4 signed bytes of w, low byte first.
fn kvq_raw4(w: u32) -> vec4<f32> {
    let shifted = vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u);
    return vec4<f32>(bitcast<vec4<i32>>(shifted) >> vec4<u32>(24u));
}

// Codes 0..8 of a run that starts a data word (w1: the next word).
fn kvq_raw8(w0: u32, w1: u32) -> Raw8 {
    return Raw8(kvq_raw4(w0), kvq_raw4(w1));
}

// Codes 2k and 2k+1 of word w.
fn kvq_raw2(w: u32, k: u32) -> vec2<f32> {
    let shifted = vec2<u32>(w >> (16u * k)) << vec2<u32>(24u, 16u);
    return vec2<f32>(bitcast<vec2<i32>>(shifted) >> vec2<u32>(24u));
}
