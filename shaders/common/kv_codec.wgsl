// Bit-exact WGSL mirrors of the CPU KV codecs (quant/fp8.rs, quant/kv_block.rs), for the kernels
// that quantize (kv_quantize) and the codec test kernel. Wherever WGSL leaves rounding open, the
// work is done on integer bits:
//   f16_bits   f32 → f16, round to nearest even (WGSL does not pin pack2x16float's rounding)
//   fp8_encode f32 → fp8, round to nearest even, saturating (quant/fp8.rs line for line)
//   div_rn     a / b correctly rounded (WGSL only promises 2.5 ulp for f32 division): the
//              quotient is corrected with an exact residual until it is the nearest f32, so a
//              code never lands one step away from the CPU's at a rounding boundary.

// Scale granularities, as quant::ScaleGranularity (values set by kernels::kv_quant::gran_code).
const GRAN_TENSOR: u32 = 0u;   // no stored scale: s = 1 (fp8 only)
const GRAN_CHANNEL: u32 = 1u;  // one scale per channel of a head block
const GRAN_TOKEN: u32 = 2u;    // one scale per token of a head block
const GRAN_HEAD: u32 = 3u;     // one scale per head block

// Raw values (before × s + m) of 8 consecutive codes, as a format snippet decodes them.
struct Raw8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// `v / 2^shift` rounded to nearest, ties to even; 1 ≤ shift ≤ 31.
fn round_shift_even(v: u32, shift: u32) -> u32 {
    let q = v >> shift;
    let rem = v & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    return select(q, q + 1u, rem > half || (rem == half && (q & 1u) == 1u));
}

// f32 → f16 bits, round to nearest even (half::f16::from_f32). NaN → 0x7E00 with the sign.
fn f16_bits(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    let sign = (bits >> 16u) & 0x8000u;
    let a = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) {
        return sign | 0x7E00u;
    }
    if (a >= 0x477FF000u) {
        return sign | 0x7C00u;  // ≥ 65520 rounds to inf
    }
    let e = i32(a >> 23u) - 112;  // f16 biased exponent if x is an f16 normal
    if (e >= 1) {
        // a carry out of the mantissa correctly bumps the exponent
        return sign | round_shift_even((u32(e) << 23u) | (a & 0x7FFFFFu), 13u);
    }
    if ((a >> 23u) == 0u) {
        return sign;  // f32 zero or subnormal: far under half the smallest f16 subnormal
    }
    // f16 subnormal: the value in units of 2^-24
    let significand = (a & 0x7FFFFFu) | 0x800000u;
    return sign | round_shift_even(significand, min(13u + u32(1 - e), 31u));
}

// The f32 value of f16 bits (exact).
fn f16_value(bits: u32) -> f32 {
    return unpack2x16float(bits).x;
}

// a − y·b, exactly, for y within a few thousand ulp of a / b and b with at most 12 significant
// bits (every divisor here: an f16 scale, 127, 15, 448, 57344, 1). y is split into two halves
// of 12 bits, so both products are exact; a − yh·b is exact (Sterbenz), and every term is a
// multiple of ulp(y)·ulp(b) below 2^24 of them, so the last subtraction is exact too.
fn div_resid(a: f32, y: f32, b: f32) -> f32 {
    let yh = bitcast<f32>(bitcast<u32>(y) & 0xFFFFF000u);
    let yl = y - yh;
    return (a - yh * b) - yl * b;
}

// a / b rounded to nearest even, as IEEE (and the CPU) divides; b > 0 with at most 12
// significant bits, a finite with |a| ≥ 2^-24 or 0 (values of f16 data and their differences).
fn div_rn(a: f32, b: f32) -> f32 {
    return div_rn_near(a, b, abs(a) / b);
}

// div_rn from an estimate y0 of |a| / b within a few thousand ulp (WGSL promises 2.5): one
// correction by the exact residual, then steps of one ulp until y is the nearest f32.
fn div_rn_near(a: f32, b: f32, y0: f32) -> f32 {
    let x = abs(a);
    if (x == 0.0) {
        return a;
    }
    var y = y0 + div_resid(x, y0, b) / b;  // within one ulp now
    for (var i = 0u; i < 3u; i++) {
        let r2 = 2.0 * div_resid(x, y, b);  // 2 (x − y·b), exact
        let u = bitcast<u32>(y);
        let up = (bitcast<f32>(u + 1u) - y) * b;  // b · gap to the next f32 above, exact
        let dn = (y - bitcast<f32>(u - 1u)) * b;  // b · gap to the next f32 below
        let odd = (u & 1u) == 1u;
        if (r2 > up || (r2 == up && odd)) {
            y = bitcast<f32>(u + 1u);
        } else if (-r2 > dn || (-r2 == dn && odd)) {
            y = bitcast<f32>(u - 1u);
        } else {
            break;
        }
    }
    return select(y, -y, a < 0.0);
}

// A scale that rounds to 0 in f16 is stored as 1 (quant::kv_block::nonzero).
fn nonzero_scale(bits: u32) -> f32 {
    let s = f16_value(bits);
    return select(s, 1.0, s == 0.0);
}

// f32 → fp8 code (quant/fp8.rs `encode`): the format is (mantissa bits, bias, largest finite
// magnitude code, NaN magnitude code, f32 bits of the largest finite value).
fn fp8_encode(x: f32, man_bits: u32, bias: i32, max_code: u32, nan_code: u32, max_bits: u32) -> u32 {
    let bits = bitcast<u32>(x);
    let sign = (bits >> 24u) & 0x80u;
    let a = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) {
        return sign | nan_code;
    }
    if (a >= max_bits) {
        return sign | max_code;  // saturate, ±inf included
    }
    let exp32 = i32(a >> 23u);
    let exp8 = exp32 - 127 + bias;
    let shift = 23u - man_bits;
    var magnitude = 0u;
    if (exp8 >= 1) {
        magnitude = round_shift_even((u32(exp8) << 23u) | (a & 0x7FFFFFu), shift);
    } else if (exp32 != 0) {
        let significand = (a & 0x7FFFFFu) | 0x800000u;
        magnitude = round_shift_even(significand, min(shift + u32(1 - exp8), 31u));
    }
    return sign | magnitude;
}

// 2^e as an f32 for -126 ≤ e ≤ 127 (built from bits, exact).
fn pow2(e: i32) -> f32 {
    return bitcast<f32>(u32(e + 127) << 23u);
}

// fp8 code → f32 (quant/fp8.rs `decode`); `ieee`: the all-ones exponent means inf/NaN (e5m2).
fn fp8_decode(code: u32, man_bits: u32, bias: i32, ieee: bool) -> f32 {
    let magnitude = code & 0x7Fu;
    let e = i32(magnitude >> man_bits);
    let man = magnitude & ((1u << man_bits) - 1u);
    let all_ones = e == (1 << (7u - man_bits)) - 1;
    var v: f32;
    if (magnitude == 0x7Fu || (ieee && all_ones && man != 0u)) {
        v = bitcast<f32>(0x7FC00000u | (code & 0u));  // a run-time NaN (not a constant)
    } else if (ieee && all_ones) {
        v = bitcast<f32>(0x7F800000u | (code & 0u));
    } else if (e == 0) {
        v = f32(man) * pow2(1 - bias - i32(man_bits));
    } else {
        v = f32((1u << man_bits) | man) * pow2(e - bias - i32(man_bits));
    }
    return select(v, -v, (code & 0x80u) != 0u);
}

fn fp8_e4m3_encode(x: f32) -> u32 {
    return fp8_encode(x, 3u, 7, 0x7Eu, 0x7Fu, 0x43E00000u);  // max 448
}

fn fp8_e5m2_encode(x: f32) -> u32 {
    return fp8_encode(x, 2u, 15, 0x7Bu, 0x7Eu, 0x47600000u);  // max 57344
}

fn fp8_e4m3_decode(code: u32) -> f32 {
    return fp8_decode(code, 3u, 7, false);
}

fn fp8_e5m2_decode(code: u32) -> f32 {
    return fp8_decode(code, 2u, 15, true);
}

// Values as the f16 cache holds them: both halves rounded through pack2x16float, the same
// operation kv_stage stores with, so staged and freshly computed rows agree bit for bit.
fn f16_round2(v: vec2<f32>) -> vec2<f32> {
    return unpack2x16float(pack2x16float(v));
}
