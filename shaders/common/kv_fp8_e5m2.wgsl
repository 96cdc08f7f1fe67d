// KV format fp8-e5m2: x' = decode(c) × s, s = f16(amax / 57344), or s = 1 per-tensor
// (quant/kv_block.rs, quant/fp8.rs). Same interface as kv_int8.wgsl.
// Raw values: an e5m2 code is exactly the high byte of the f16 with the same value (same bias,
// inf and NaN included), so decode = unpack2x16float of the code shifted up by 8.

const KVQ_BITS: u32 = 8u;
const KVQ_HAS_MIN: bool = false;
const KVQ_WORDS8: u32 = 2u;

fn kvq_group_scale(lo: f32, hi: f32) -> vec2<f32> {
    let amax = max(abs(lo), abs(hi));
    return vec2<f32>(nonzero_scale(f16_bits(div_rn(amax, 57344.0))), 0.0);
}

fn kvq_encode(x: f32, sm: vec2<f32>) -> u32 {
    return fp8_e5m2_encode(div_rn(x, sm.x));
}

fn kvq_raw2(w: u32, k: u32) -> vec2<f32> {
    let s = w >> (16u * k);
    return unpack2x16float(((s & 0xFFu) << 8u) | ((s & 0xFF00u) << 16u));
}

fn kvq_raw4(w: u32) -> vec4<f32> {
    return vec4<f32>(kvq_raw2(w, 0u), kvq_raw2(w, 1u));
}

fn kvq_raw8(w0: u32, w1: u32) -> Raw8 {
    return Raw8(kvq_raw4(w0), kvq_raw4(w1));
}
