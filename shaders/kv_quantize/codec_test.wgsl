// Test kernel for the WGSL codecs (common/kv_codec.wgsl and one format snippet) against the CPU
// oracle (quant/): one invocation per input i writes
//   codes[i]  = [fp8_e4m3_encode(a), fp8_e5m2_encode(a), bits(fp8_e4m3_decode(i % 256)),
//                bits(fp8_e5m2_decode(i % 256)), bits(div_rn(a, b)), f16_bits(a),
//                kvq_encode(a, (b, m)), bits(div_rn_near(a, b, |a| / b moved by (i % 2001) − 1000 ulp))]
//   raw[i]    = [kvq_raw8(words[i], words[i + 1]) (8), kvq_raw2(words[i], k) for k = 0..3 (8)]
// with a = a_in[i], b = b_in[i], m = m_in[i]. Not used by the model.

@group(0) @binding(0) var<storage, read> a_in: array<f32>;        // [n]
@group(0) @binding(1) var<storage, read> b_in: array<f32>;        // [n] positive divisors / scales
@group(0) @binding(2) var<storage, read> m_in: array<f32>;        // [n] int4 minimums
@group(0) @binding(3) var<storage, read> words: array<u32>;       // [n + 1] packed codes
@group(0) @binding(4) var<storage, read_write> codes: array<u32>; // [n, 8]
@group(0) @binding(5) var<storage, read_write> raw: array<f32>;   // [n, 16]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&a_in)) {
        return;
    }
    let a = a_in[i];
    let b = b_in[i];
    let o = i * 8u;
    codes[o] = fp8_e4m3_encode(a);
    codes[o + 1u] = fp8_e5m2_encode(a);
    codes[o + 2u] = bitcast<u32>(fp8_e4m3_decode(i % 256u));
    codes[o + 3u] = bitcast<u32>(fp8_e5m2_decode(i % 256u));
    codes[o + 4u] = bitcast<u32>(div_rn(a, b));
    codes[o + 5u] = f16_bits(a);
    codes[o + 6u] = kvq_encode(a, vec2<f32>(b, m_in[i]));
    let skewed = bitcast<f32>(bitcast<u32>(abs(a) / b) + (i % 2001u) - 1000u);
    codes[o + 7u] = bitcast<u32>(div_rn_near(a, b, skewed));
    let r8 = kvq_raw8(words[i], words[i + 1u]);
    let r = i * 16u;
    for (var j = 0u; j < 4u; j++) {
        raw[r + j] = r8.lo[j];
        raw[r + 4u + j] = r8.hi[j];
    }
    for (var k = 0u; k < 4u; k++) {
        var v = vec2<f32>(0.0);
        if (k < 16u / KVQ_BITS) {
            v = kvq_raw2(words[i], k);
        }
        raw[r + 8u + 2u * k] = v.x;
        raw[r + 9u + 2u * k] = v.y;
    }
}
