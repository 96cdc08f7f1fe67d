// KV format int4 (asymmetric): x' = q × s + m, q ∈ [0, 15], m = f16(min), s = f16((max − min) / 15)
// (quant/kv_block.rs). Same interface as kv_int8.wgsl.

const KVQ_BITS: u32 = 4u;
const KVQ_HAS_MIN: bool = true;
const KVQ_WORDS8: u32 = 1u;

fn kvq_group_scale(lo: f32, hi: f32) -> vec2<f32> {
    let s = nonzero_scale(f16_bits(div_rn(hi - lo, 15.0)));
    return vec2<f32>(s, f16_value(f16_bits(lo)));
}

fn kvq_encode(x: f32, sm: vec2<f32>) -> u32 {
    return u32(clamp(round(div_rn(x - sm.y, sm.x)), 0.0, 15.0));
}

// The 8 nibbles of w0, low nibble first (w1 unused: one word holds 8 codes).
fn kvq_raw8(w0: u32, w1: u32) -> Raw8 {
    let lo = (vec4<u32>(w0) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(0xFu);
    let hi = (vec4<u32>(w0) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(0xFu);
    return Raw8(vec4<f32>(lo), vec4<f32>(hi));
}

fn kvq_raw2(w: u32, k: u32) -> vec2<f32> {
    return vec2<f32>((vec2<u32>(w) >> vec2<u32>(8u * k, 8u * k + 4u)) & vec2<u32>(0xFu));
}
