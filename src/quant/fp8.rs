//! FP8, emulated: bit-exact encode (f32 → 8-bit code) and decode (code → f32) of the two KV
//! formats, written with integer operations on the f32 bits so that WGSL can mirror them line
//! for line (wgpu has no FP8 type).
//!
//! | format | layout | bias | max finite | inf | NaN codes | smallest subnormal |
//! |---|---|---|---|---|---|---|
//! | e4m3 (OCP "e4m3fn") | s.eeee.mmm | 7 | 448 (`0x7E`) | none | `S.1111.111` | 2^-9 |
//! | e5m2 (IEEE-like) | s.eeeee.mm | 15 | 57344 (`0x7B`) | `S.11111.00` | `S.11111.{01,10,11}` | 2^-16 |
//!
//! ## Encoding policy (the oracle in `assets/fixtures/fp8/` checks all of it)
//!
//! - **Rounding**: round to nearest, ties to even, in one step from the f32 value (no double
//!   rounding), subnormals included. Values below half the smallest subnormal become ±0;
//!   exactly half rounds to ±0 (even).
//! - **Saturation**: a finite value whose magnitude is ≥ the max finite value, and ±inf, encode
//!   as ±max finite (`0x7E`/`0xFE` for e4m3, `0x7B`/`0xFB` for e5m2). The cache never stores
//!   inf, and never turns a large finite value into NaN (ml_dtypes' plain cast does both: e4m3
//!   above 464 → NaN, e5m2 above 61440 → inf). Equivalently: clamp to ±max, then round.
//! - **NaN** keeps its sign and becomes the quiet NaN code ml_dtypes also writes: `0x7F`/`0xFF`
//!   (e4m3), `0x7E`/`0xFE` (e5m2).
//! - **Zero** keeps its sign: -0.0 → `0x80`.
//!
//! Decoding is exact (every FP8 value is an f32); NaN codes decode to a quiet f32 NaN with the
//! code's sign, e5m2 `0x7C`/`0xFC` to ±inf.

/// Largest finite e4m3 ("e4m3fn") value.
pub const FP8_E4M3_MAX: f32 = 448.0;
/// Largest finite e5m2 value.
pub const FP8_E5M2_MAX: f32 = 57344.0;

/// The numbers that tell the two formats apart.
struct Fp8Spec {
    /// Mantissa (fraction) bits.
    man_bits: u32,
    /// Exponent bias.
    bias: i32,
    /// Magnitude code of the largest finite value.
    max_code: u8,
    /// Magnitude code written for NaN.
    nan_code: u8,
    /// Bits of the largest finite value as an f32.
    max_f32_bits: u32,
    /// Whether the all-ones exponent means inf/NaN (e5m2) rather than ordinary values (e4m3fn,
    /// where only `S.1111.111` is NaN).
    ieee_specials: bool,
}

const E4M3: Fp8Spec = Fp8Spec {
    man_bits: 3,
    bias: 7,
    max_code: 0x7E,
    nan_code: 0x7F,
    max_f32_bits: FP8_E4M3_MAX.to_bits(),
    ieee_specials: false,
};

const E5M2: Fp8Spec = Fp8Spec {
    man_bits: 2,
    bias: 15,
    max_code: 0x7B,
    nan_code: 0x7E,
    max_f32_bits: FP8_E5M2_MAX.to_bits(),
    ieee_specials: true,
};

/// f32 → e4m3fn code (round to nearest even, saturating; policy in the module docs).
pub fn fp8_e4m3_encode(x: f32) -> u8 {
    encode(x, &E4M3)
}

/// e4m3fn code → f32 (exact; `0x7F`/`0xFF` → NaN).
pub fn fp8_e4m3_decode(code: u8) -> f32 {
    decode(code, &E4M3)
}

/// f32 → e5m2 code (round to nearest even, saturating, ±inf → ±57344; policy in the module docs).
pub fn fp8_e5m2_encode(x: f32) -> u8 {
    encode(x, &E5M2)
}

/// e5m2 code → f32 (exact; `0x7C`/`0xFC` → ±inf, `0x7D..=0x7F` and `0xFD..=0xFF` → NaN).
pub fn fp8_e5m2_decode(code: u8) -> f32 {
    decode(code, &E5M2)
}

/// `v / 2^shift` rounded to nearest, ties to even. `1 ≤ shift ≤ 31`.
fn round_shift_even(v: u32, shift: u32) -> u32 {
    let q = v >> shift;
    let rem = v & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    if rem > half || (rem == half && q & 1 == 1) {
        q + 1
    } else {
        q
    }
}

fn encode(x: f32, s: &Fp8Spec) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7FFF_FFFF;
    if abs > 0x7F80_0000 {
        return sign | s.nan_code;
    }
    if abs >= s.max_f32_bits {
        return sign | s.max_code; // saturate, ±inf included
    }
    let exp32 = (abs >> 23) as i32; // biased f32 exponent; 0 for ±0 and f32 subnormals
    let exp8 = exp32 - 127 + s.bias; // biased FP8 exponent if the value is an FP8 normal
    let shift = 23 - s.man_bits; // f32 mantissa bits dropped
    let magnitude = if exp8 >= 1 {
        // FP8 normal: rebias the exponent, drop mantissa bits. A carry out of the mantissa
        // correctly bumps the exponent; `abs < max` keeps the result ≤ max_code.
        round_shift_even(((exp8 as u32) << 23) | (abs & 0x7F_FFFF), shift)
    } else if exp32 == 0 {
        0 // below 2^-126: far under half the smallest FP8 subnormal
    } else {
        // FP8 subnormal: the code is the value in units of the smallest subnormal,
        // significand × 2^(exp32 - 150) / 2^(1 - bias - man_bits). A result of 2^man_bits is
        // the smallest normal, which is also its correct code.
        let significand = (abs & 0x7F_FFFF) | 0x80_0000;
        round_shift_even(significand, (shift + (1 - exp8) as u32).min(31))
    };
    sign | magnitude as u8
}

/// 2^e as an f32, for `-126 ≤ e ≤ 127` (built from bits, so exact).
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

fn decode(code: u8, s: &Fp8Spec) -> f32 {
    let negative = code & 0x80 != 0;
    let magnitude = code & 0x7F;
    let exp = i32::from(magnitude >> s.man_bits);
    let man = u32::from(magnitude) & ((1 << s.man_bits) - 1);
    let all_ones_exp = exp == (1 << (7 - s.man_bits)) - 1;
    let value = if magnitude == 0x7F || (s.ieee_specials && all_ones_exp && man != 0) {
        f32::NAN
    } else if s.ieee_specials && all_ones_exp {
        f32::INFINITY
    } else if exp == 0 {
        man as f32 * pow2(1 - s.bias - s.man_bits as i32)
    } else {
        ((1 << s.man_bits) | man) as f32 * pow2(exp - s.bias - s.man_bits as i32)
    };
    if negative {
        -value
    } else {
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(fp8_e4m3_decode(0x7E), 448.0);
        assert_eq!(fp8_e4m3_decode(0x01), 2f32.powi(-9));
        assert_eq!(fp8_e4m3_decode(0x08), 2f32.powi(-6)); // smallest normal
        assert_eq!(fp8_e4m3_decode(0x38), 1.0);
        assert!(fp8_e4m3_decode(0x7F).is_nan() && fp8_e4m3_decode(0xFF).is_nan());
        assert_eq!(fp8_e5m2_decode(0x7B), 57344.0);
        assert_eq!(fp8_e5m2_decode(0x01), 2f32.powi(-16));
        assert_eq!(fp8_e5m2_decode(0x3C), 1.0);
        assert_eq!(fp8_e5m2_decode(0x7C), f32::INFINITY);
        assert_eq!(fp8_e5m2_decode(0xFC), f32::NEG_INFINITY);
        assert!(fp8_e5m2_decode(0x7D).is_nan() && fp8_e5m2_decode(0xFE).is_nan());
        assert_eq!(fp8_e4m3_decode(0x80).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn every_finite_code_round_trips() {
        for code in 0..=255u8 {
            let x = fp8_e4m3_decode(code);
            if !x.is_nan() {
                assert_eq!(fp8_e4m3_encode(x), code, "e4m3 {code:#04x}");
            }
            let y = fp8_e5m2_decode(code);
            if y.is_finite() {
                assert_eq!(fp8_e5m2_encode(y), code, "e5m2 {code:#04x}");
            }
        }
    }

    #[test]
    fn saturation_nan_and_ties() {
        for x in [448.0, 464.0, 465.0, 1e6, f32::MAX, f32::INFINITY] {
            assert_eq!(fp8_e4m3_encode(x), 0x7E, "{x}");
            assert_eq!(fp8_e4m3_encode(-x), 0xFE, "{x}");
        }
        for x in [57344.0, 61440.0, 65504.0, f32::INFINITY] {
            assert_eq!(fp8_e5m2_encode(x), 0x7B, "{x}");
            assert_eq!(fp8_e5m2_encode(-x), 0xFB, "{x}");
        }
        assert_eq!(fp8_e4m3_encode(f32::NAN), 0x7F);
        assert_eq!(fp8_e4m3_encode(-f32::NAN), 0xFF);
        assert_eq!(fp8_e5m2_encode(f32::NAN), 0x7E);
        // 1.0625 is halfway between 1.0 (0x38, even) and 1.125 (0x39): ties to even.
        assert_eq!(fp8_e4m3_encode(1.0625), 0x38);
        assert_eq!(fp8_e4m3_encode(1.1875), 0x3A);
        // Half the smallest subnormal → 0; a hair more → the smallest subnormal.
        assert_eq!(fp8_e4m3_encode(2f32.powi(-10)), 0x00);
        assert_eq!(fp8_e4m3_encode(2f32.powi(-10) * 1.0001), 0x01);
        assert_eq!(fp8_e5m2_encode(-2f32.powi(-17)), 0x80);
        assert_eq!(fp8_e4m3_encode(1e-30), 0x00);
        assert_eq!(fp8_e4m3_encode(f32::from_bits(1)), 0x00);
    }
}
