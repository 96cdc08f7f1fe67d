// Weight format MXFP4 (OCP microscaling FP4, GGUF MXFP4): per block 4 u32 of nibbles (1 vec4),
// each an e2m1 code (bit 3 the sign; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6), and one E8M0 scale
// byte e (side bytes from word 0, one a unit: the file's 17 bytes). As ggml and gguf-py
// compute it: value = kvalues_mxfp4[code] · 2^(e − 128), kvalues the magnitudes doubled
// (0, 1, 2, 3, 4, 6, 8, 12) — exact in f32, so the block dot is d · Σ kvalue·x.
const W_VEC4_PER_BLOCK: u32 = 1u;

struct WRaw {
    q: vec4<u32>,
    e: u32,
}

fn w_load(n: u32, b: u32, rows: u32, blocks: u32) -> WRaw {
    let i = w_unit(n, b, rows, blocks);
    return WRaw(w_q(i), w_byte(0u, i));
}

// Four codes (bytes of a word after masking) → their doubled e2m1 values: m < 2 is m itself,
// else (2 + (m & 1)) · 2^((m >> 1) − 1); bit 3 negates (code 8 is +0, as kvalues_mxfp4 has it).
fn mxfp4_vec(codes: u32) -> vec4<f32> {
    let c = unpack4xU8(codes);
    let m = c & vec4<u32>(7u);
    let big = (vec4<u32>(2u) + (m & vec4<u32>(1u))) << ((max(m, vec4<u32>(2u)) >> vec4<u32>(1u)) - vec4<u32>(1u));
    let mag = vec4<f32>(select(big, m, m < vec4<u32>(2u)));
    return select(mag, -mag, ((c & vec4<u32>(8u)) != vec4<u32>(0u)) & (m != vec4<u32>(0u)));
}

// ggml_e8m0_to_fp32_half: 2^(e − 128), subnormal below e = 2.
fn e8m0_half(e: u32) -> f32 {
    return bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
}

fn w_decode(r: WRaw) -> WFloat {
    let m = 0x0F0F0F0Fu;
    let q = r.q;
    let v = V8(mxfp4_vec(q.x & m), mxfp4_vec((q.x >> 4u) & m),
               mxfp4_vec(q.y & m), mxfp4_vec((q.y >> 4u) & m),
               mxfp4_vec(q.z & m), mxfp4_vec((q.z >> 4u) & m),
               mxfp4_vec(q.w & m), mxfp4_vec((q.w >> 4u) & m));
    return WFloat(v, e8m0_half(r.e), 0.0);
}

fn w_combine(qdot: f32, sx: f32, w: WFloat) -> f32 {
    return w.d * qdot;
}

fn w_values(w: WFloat) -> V8 {
    return v8_scale(w.q, w.d);
}
