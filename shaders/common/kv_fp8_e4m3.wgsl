// KV format fp8-e4m3 ("e4m3fn"): x' = decode(c) × s, s = f16(amax / 448), or s = 1 per-tensor
// (quant/kv_block.rs, quant/fp8.rs). Same interface as kv_int8.wgsl.
// Raw values: an e4m3 magnitude shifted into an f16 (s.eeee.mmm → s.0eeee.mmm0000000) is the
// value / 2^8 (bias 7 vs 15, subnormals included), so decode = unpack2x16float × 256; the NaN
// magnitude 0x7F is patched to an f16 NaN first.

const KVQ_BITS: u32 = 8u;
const KVQ_HAS_MIN: bool = false;
const KVQ_WORDS8: u32 = 2u;

fn kvq_group_scale(lo: f32, hi: f32) -> vec2<f32> {
    let amax = max(abs(lo), abs(hi));
    return vec2<f32>(nonzero_scale(f16_bits(div_rn(amax, 448.0))), 0.0);
}

fn kvq_encode(x: f32, sm: vec2<f32>) -> u32 {
    return fp8_e4m3_encode(div_rn(x, sm.x));
}

// f16 bits of the low byte's code (bits 0..16) and the next byte's (bits 16..32); NaN → 0x7E00.
fn e4m3_pair_f16(s: u32) -> u32 {
    var lo = ((s & 0x80u) << 8u) | ((s & 0x7Fu) << 7u);
    var hi = ((s & 0x8000u) << 16u) | ((s & 0x7F00u) << 15u);
    lo = select(lo, lo | 0x7E00u, (s & 0x7Fu) == 0x7Fu);
    hi = select(hi, hi | 0x7E000000u, (s & 0x7F00u) == 0x7F00u);
    return lo | hi;
}

fn kvq_raw2(w: u32, k: u32) -> vec2<f32> {
    return unpack2x16float(e4m3_pair_f16(w >> (16u * k))) * 256.0;
}

fn kvq_raw4(w: u32) -> vec4<f32> {
    return vec4<f32>(kvq_raw2(w, 0u), kvq_raw2(w, 1u));
}

fn kvq_raw8(w0: u32, w1: u32) -> Raw8 {
    return Raw8(kvq_raw4(w0), kvq_raw4(w1));
}
