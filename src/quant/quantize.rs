//! CPU quantization of one f32 row, bit-exact with ggml's reference quantizers
//! (`quantize_row_q4_0_ref` … in `ggml-quants.c`): scales are computed in f32 and only the stored
//! copy is rounded to f16, quants use the f32 inverse scale, truncation and clamping are the same.

use super::ggml::{GgmlType, QuantError, QK};
use half::f16;

/// Quantize one row of `src.len()` elements (a whole number of blocks of `ty`).
pub fn quantize_row(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let row_bytes = ty.row_bytes(src.len())?;
    let mut out = Vec::with_capacity(row_bytes);
    match ty {
        GgmlType::F32 => src.iter().for_each(|x| out.extend(x.to_le_bytes())),
        GgmlType::F16 => {
            src.iter().for_each(|&x| out.extend(f16::from_f32(x).to_bits().to_le_bytes()))
        }
        GgmlType::BF16 => src.iter().for_each(|&x| out.extend(f32_to_bf16_bits(x).to_le_bytes())),
        GgmlType::Q4_0 => src.chunks_exact(QK).for_each(|x| block_q4_0(x, &mut out)),
        GgmlType::Q4_1 => src.chunks_exact(QK).for_each(|x| block_q4_1(x, &mut out)),
        GgmlType::Q5_0 => src.chunks_exact(QK).for_each(|x| block_q5_0(x, &mut out)),
        GgmlType::Q5_1 => src.chunks_exact(QK).for_each(|x| block_q5_1(x, &mut out)),
        GgmlType::Q8_0 => src.chunks_exact(QK).for_each(|x| block_q8_0(x, &mut out)),
        GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::MXFP4
        | GgmlType::I8 => return Err(QuantError::QuantizeUnsupported(ty)),
    }
    debug_assert_eq!(out.len(), row_bytes);
    Ok(out)
}

/// ggml's `ggml_compute_fp32_to_bf16`: NaN becomes a quiet NaN, everything else rounds to nearest
/// even.
fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

fn push_f16(out: &mut Vec<u8>, x: f32) {
    out.extend(f16::from_f32(x).to_bits().to_le_bytes());
}

/// The inverse scale as ggml computes it: `d ? 1/d : 0`.
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// The element with the largest magnitude, keeping its sign; the first one wins ties.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// (min, max) starting from (FLT_MAX, −FLT_MAX) as ggml does.
fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter().fold((f32::MAX, -f32::MAX), |(lo, hi), &v| {
        (if v < lo { v } else { lo }, if v > hi { v } else { hi })
    })
}

/// C's `(int8_t)(x)` for the small non-negative values quantizers produce, then `MIN(limit, ·)`.
fn trunc_clamp(x: f32, limit: u8) -> u8 {
    ((x as i8) as u8).min(limit)
}

fn block_q4_0(x: &[f32], out: &mut Vec<u8>) {
    let d = signed_absmax(x) / -8.0;
    let id = inverse(d);
    push_f16(out, d);
    for j in 0..QK / 2 {
        let lo = trunc_clamp(x[j] * id + 8.5, 15);
        let hi = trunc_clamp(x[j + QK / 2] * id + 8.5, 15);
        out.push(lo | (hi << 4));
    }
}

fn block_q4_1(x: &[f32], out: &mut Vec<u8>) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    push_f16(out, d);
    push_f16(out, min);
    for j in 0..QK / 2 {
        let lo = trunc_clamp((x[j] - min) * id + 0.5, 15);
        let hi = trunc_clamp((x[j + QK / 2] - min) * id + 0.5, 15);
        out.push(lo | (hi << 4));
    }
}

/// Packs 32 five-bit quants as `qh` (the 5th bits, u32 LE) then `qs` (nibbles, low half first).
fn push_q5_quants(q: &[u8; QK], out: &mut Vec<u8>) {
    let qh = q.iter().enumerate().fold(0u32, |acc, (j, &v)| acc | (((v as u32 & 0x10) >> 4) << j));
    out.extend(qh.to_le_bytes());
    out.extend((0..QK / 2).map(|j| (q[j] & 0x0F) | ((q[j + QK / 2] & 0x0F) << 4)));
}

fn block_q5_0(x: &[f32], out: &mut Vec<u8>) {
    let d = signed_absmax(x) / -16.0;
    let id = inverse(d);
    push_f16(out, d);
    let mut q = [0u8; QK];
    for (qj, &xj) in q.iter_mut().zip(x) {
        *qj = trunc_clamp(xj * id + 16.5, 31);
    }
    push_q5_quants(&q, out);
}

fn block_q5_1(x: &[f32], out: &mut Vec<u8>) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    push_f16(out, d);
    push_f16(out, min);
    let mut q = [0u8; QK];
    for (qj, &xj) in q.iter_mut().zip(x) {
        *qj = trunc_clamp((xj - min) * id + 0.5, 31);
    }
    push_q5_quants(&q, out);
}

fn block_q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    push_f16(out, d);
    // `roundf`: half away from zero, like f32::round.
    out.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row;

    /// Deterministic values in roughly [-2, 2) (a tiny LCG; no RNG dependency in unit tests).
    fn sample_row(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    #[test]
    fn round_trips_within_the_scale_bound() {
        let x = sample_row(256, 7);
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0] {
            let q = quantize_row(ty, &x).unwrap();
            let mut y = vec![0f32; x.len()];
            dequantize_row(ty, &q, &mut y).unwrap();
            for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
                let (lo, hi) = min_max(xb);
                // One quantization step is range/levels; allow it plus f16 rounding of d and m.
                let levels = match ty {
                    GgmlType::Q4_0 | GgmlType::Q4_1 => 15.0,
                    GgmlType::Q5_0 | GgmlType::Q5_1 => 31.0,
                    _ => 254.0,
                };
                let bound = (hi - lo).max(2.0 * lo.abs().max(hi.abs())) / levels + 1e-2;
                for (a, b) in xb.iter().zip(yb) {
                    assert!((a - b).abs() <= bound, "{ty}: {a} vs {b}, bound {bound}");
                }
            }
        }
    }

    #[test]
    fn float_types_round_trip() {
        let x = sample_row(64, 3);
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let q = quantize_row(ty, &x).unwrap();
            let mut y = vec![0f32; 64];
            dequantize_row(ty, &q, &mut y).unwrap();
            let tol = match ty {
                GgmlType::F32 => 0.0,
                GgmlType::F16 => 1e-3,
                _ => 1e-2,
            };
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= tol * a.abs().max(1.0), "{ty}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn q8_0_rounds_half_away_from_zero_and_zero_block_is_zero() {
        // amax 127 makes d = 1, id = 1: 2.5 -> 3, -2.5 -> -3.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        let q = quantize_row(GgmlType::Q8_0, &x).unwrap();
        assert_eq!(&q[..2], &f16::from_f32(1.0).to_bits().to_le_bytes());
        assert_eq!((q[2], q[3] as i8, q[4] as i8), (127, 3, -3));
        let zero = quantize_row(GgmlType::Q4_0, &[0f32; 32]).unwrap();
        // ggml computes d = 0 / -8 = -0.0, stored as f16 0x8000.
        assert_eq!(zero[..2], [0x00, 0x80]);
        assert!(zero[2..].iter().all(|&b| b == 0x88));
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_quiets_nan() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80); // tie -> even
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82); // tie -> even
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7f80_0001)), 0x7fc0);
    }

    #[test]
    fn k_quants_are_refused_with_a_clear_error() {
        let err = quantize_row(GgmlType::Q4_K, &[0f32; 256]).unwrap_err();
        assert_eq!(err, QuantError::QuantizeUnsupported(GgmlType::Q4_K));
        assert!(err.to_string().contains("Q8_0"));
    }
}
