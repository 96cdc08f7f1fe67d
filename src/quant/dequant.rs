//! CPU dequantization of one row of ggml blocks to f32: the oracle every GPU kernel is tested
//! against. Each function follows ggml's `dequantize_row_*` in `ggml-quants.c` operation by
//! operation (same products in the same order, no fused multiply-add), so results match ggml and
//! gguf-py bit for bit.

use super::ggml::{GgmlType, QuantError, QK, QK_K};
use half::{bf16, f16};

/// Dequantize one row: `src` holds `dst.len() / ty.block_elems()` blocks of `ty`.
///
/// `dst.len()` must be a whole number of blocks and `src.len()` exactly `ty.row_bytes(dst.len())`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let expected = ty.row_bytes(dst.len())?;
    if src.len() != expected {
        return Err(QuantError::ByteLenMismatch { ty, elems: dst.len(), expected, got: src.len() });
    }
    let block_fn: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => |b, y| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => |b, y| y[0] = f16_at(b, 0),
        GgmlType::BF16 => |b, y| y[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        GgmlType::Q4_0 => block_q4_0,
        GgmlType::Q4_1 => block_q4_1,
        GgmlType::Q5_0 => block_q5_0,
        GgmlType::Q5_1 => block_q5_1,
        GgmlType::Q8_0 => block_q8_0,
        GgmlType::Q2_K => block_q2_k,
        GgmlType::Q3_K => block_q3_k,
        GgmlType::Q4_K => block_q4_k,
        GgmlType::Q5_K => block_q5_k,
        GgmlType::Q6_K => block_q6_k,
        GgmlType::MXFP4 => block_mxfp4,
        GgmlType::I8 => |b, y| y[0] = f32::from(b[0] as i8),
    };
    for (block, out) in
        src.chunks_exact(ty.block_bytes()).zip(dst.chunks_exact_mut(ty.block_elems()))
    {
        block_fn(block, out);
    }
    Ok(())
}

/// The little-endian f16 at byte `at`, widened to f32.
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// `block_q4_0 { d: f16, qs: [u8; 16] }`: low nibbles are elements 0..16, high nibbles 16..32.
fn block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..QK / 2 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + QK / 2] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// ggml's `kvalues_mxfp4`: the e2m1 values doubled (sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6).
pub(crate) const KVALUES_MXFP4: [i8; 16] =
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `ggml_e8m0_to_fp32_half`: the E8M0 scale `2^(e − 127)` halved (the codes are doubled),
/// subnormal for e < 2.
pub(crate) fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { u32::from(e - 1) << 23 };
    f32::from_bits(bits)
}

/// `block_mxfp4 { e: u8, qs: [u8; 16] }`: low nibbles are elements 0..16, high nibbles 16..32,
/// `y = kvalues_mxfp4[q] · e8m0_half(e)`.
fn block_mxfp4(b: &[u8], y: &mut [f32]) {
    let d = e8m0_to_f32_half(b[0]);
    let qs = &b[1..17];
    for j in 0..QK / 2 {
        y[j] = f32::from(KVALUES_MXFP4[usize::from(qs[j] & 0x0F)]) * d;
        y[j + QK / 2] = f32::from(KVALUES_MXFP4[usize::from(qs[j] >> 4)]) * d;
    }
}

/// `block_q4_1 { d: f16, m: f16, qs: [u8; 16] }`: `y = q·d + m`.
fn block_q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..20];
    for j in 0..QK / 2 {
        y[j] = (qs[j] & 0x0F) as f32 * d + m;
        y[j + QK / 2] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// The 5th bits of a Q5 block: bit `j` of the little-endian u32 `qh` is element `j`'s.
fn q5_high_bits(qh: &[u8]) -> u32 {
    u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]])
}

/// `block_q5_0 { d: f16, qh: [u8; 4], qs: [u8; 16] }`: `y = (q − 16)·d`.
fn block_q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = q5_high_bits(&b[2..6]);
    let qs = &b[6..22];
    for j in 0..QK / 2 {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + QK / 2)) & 1) << 4;
        y[j] = (((qs[j] & 0x0F) as u32 | h0) as i32 - 16) as f32 * d;
        y[j + QK / 2] = (((qs[j] >> 4) as u32 | h1) as i32 - 16) as f32 * d;
    }
}

/// `block_q5_1 { d: f16, m: f16, qh: [u8; 4], qs: [u8; 16] }`: `y = q·d + m`.
fn block_q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = q5_high_bits(&b[4..8]);
    let qs = &b[8..24];
    for j in 0..QK / 2 {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + QK / 2)) & 1) << 4;
        y[j] = ((qs[j] & 0x0F) as u32 | h0) as f32 * d + m;
        y[j + QK / 2] = ((qs[j] >> 4) as u32 | h1) as f32 * d + m;
    }
}

/// `block_q8_0 { d: f16, qs: [i8; 32] }`: `y = q·d`.
fn block_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (yj, &q) in y.iter_mut().zip(&b[2..34]) {
        *yj = q as i8 as f32 * d;
    }
}

/// `block_q2_K { scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16 }`: 16 sub-blocks of 16, each
/// with a 4-bit scale (low nibble) and 4-bit min (high nibble); 2-bit quants.
fn block_q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (e, ye) in y.iter_mut().enumerate().take(QK_K) {
        let sc = scales[e / 16];
        let dl = d * (sc & 0x0F) as f32;
        let ml = dmin * (sc >> 4) as f32;
        let shift = 2 * ((e % 128) / 32);
        let q = (qs[(e / 128) * 32 + e % 32] >> shift) & 3;
        *ye = dl * q as f32 - ml;
    }
}

/// `block_q3_K { hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16 }`: 16 sub-blocks of 16
/// with signed 6-bit scales; 2 low bits in `qs`, the 3rd bit in `hmask` (bit clear means −4).
fn block_q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let packed = &b[96..108];
    let d = f16_at(b, 108);
    let mut scales = [0i8; 16];
    for (k, s) in scales.iter_mut().enumerate() {
        let lo = (packed[k % 8] >> (4 * (k / 8))) & 0x0F;
        let hi = (packed[8 + k % 4] >> (2 * (k / 4))) & 0x03;
        *s = (lo | (hi << 4)) as i8 - 32;
    }
    for (e, ye) in y.iter_mut().enumerate().take(QK_K) {
        let dl = d * scales[e / 16] as f32;
        let shift = 2 * ((e % 128) / 32);
        let low = ((qs[(e / 128) * 32 + e % 32] >> shift) & 3) as i8;
        let high_set = hmask[e % 32] & (1 << (e / 32)) != 0;
        *ye = dl * (low - if high_set { 0 } else { 4 }) as f32;
    }
}

/// ggml's `get_scale_min_k4`: the `j`-th 6-bit (scale, min) pair of a Q4_K/Q5_K block.
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// `block_q4_K { d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128] }`: 8 sub-blocks of 32;
/// each 64-element chunk takes the low then the high nibbles of 32 bytes of `qs`.
fn block_q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for chunk in 0..QK_K / 64 {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let q = &qs[32 * chunk..32 * chunk + 32];
        let out = &mut y[64 * chunk..64 * chunk + 64];
        for l in 0..32 {
            out[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `block_q5_K { d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }`: Q4_K plus
/// a 5th bit per element, bit `2·chunk` (low nibbles) or `2·chunk + 1` (high) of `qh[l]`.
fn block_q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for chunk in 0..QK_K / 64 {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * chunk), 1u8 << (2 * chunk + 1));
        let q = &qs[32 * chunk..32 * chunk + 32];
        let out = &mut y[64 * chunk..64 * chunk + 64];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            out[l] = d1 * ((q[l] & 0x0F) + h1) as f32 - m1;
            out[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// `block_q6_K { ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16 }`: two 128-element
/// halves; 4 low bits from `ql`, 2 high bits from `qh`, minus 32; 16 sub-blocks of 16.
fn block_q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let out = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            out[l] = d * sc[is] as i8 as f32 * q1 as f32;
            out[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            out[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            out[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_bits().to_le_bytes()
    }

    #[test]
    fn q4_0_nibble_order_low_first() {
        // d = 0.5; qs[j] = low nibble j % 16, high nibble 15 - j % 16.
        let mut block = f16_bytes(0.5).to_vec();
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q4_0, &block, &mut y).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 0.5, "element {j}");
            assert_eq!(y[j + 16], ((15 - j) as f32 - 8.0) * 0.5, "element {}", j + 16);
        }
    }

    #[test]
    fn q4_1_applies_min() {
        let mut block = f16_bytes(0.25).to_vec();
        block.extend(f16_bytes(-1.0));
        block.extend([0x21u8; 16]); // low nibble 1, high nibble 2
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q4_1, &block, &mut y).unwrap();
        assert!(y[..16].iter().all(|&v| v == -0.75));
        assert!(y[16..].iter().all(|&v| v == -0.5));
    }

    #[test]
    fn q5_0_and_q5_1_use_the_high_bit_word() {
        // qh bit j set for j = 0 and j = 16 (elements 0 and 16 get +16).
        let qh = (1u32 | (1 << 16)).to_le_bytes();
        let mut b0 = f16_bytes(1.0).to_vec();
        b0.extend(qh);
        b0.extend([0x00u8; 16]);
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q5_0, &b0, &mut y).unwrap();
        assert_eq!((y[0], y[1], y[16], y[17]), (0.0, -16.0, 0.0, -16.0));

        let mut b1 = f16_bytes(2.0).to_vec();
        b1.extend(f16_bytes(1.0));
        b1.extend(qh);
        b1.extend([0xF1u8; 16]);
        dequantize_row(GgmlType::Q5_1, &b1, &mut y).unwrap();
        assert_eq!((y[0], y[1], y[16], y[17]), (35.0, 3.0, 63.0, 31.0));
    }

    #[test]
    fn q8_0_is_signed() {
        let mut block = f16_bytes(0.5).to_vec();
        block.extend((0..32).map(|j| (j as i8 - 16) as u8));
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q8_0, &block, &mut y).unwrap();
        for (j, v) in y.iter().enumerate() {
            assert_eq!(*v, (j as f32 - 16.0) * 0.5);
        }
    }

    #[test]
    fn q6_k_constant_block() {
        // All quants 33 (ql nibble 1, qh bits 2) minus 32 = 1; scales 2; d = 0.5 -> every y = 1.
        let mut block = vec![0x11u8; 128];
        block.extend([0xAAu8; 64]);
        block.extend([2u8; 16]);
        block.extend(f16_bytes(0.5));
        let mut y = [0f32; 256];
        dequantize_row(GgmlType::Q6_K, &block, &mut y).unwrap();
        assert!(y.iter().all(|&v| v == 1.0), "{:?}", &y[..8]);
    }

    #[test]
    fn q4_k_first_scales_and_mins() {
        // Scales j<4 = 1, mins j<4 = 2 (bytes 0..4 = 1, 4..8 = 2); j>=4 from bytes 8..12 = 0x00.
        let mut block = f16_bytes(1.0).to_vec();
        block.extend(f16_bytes(0.5));
        block.extend([1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0]);
        block.extend([0x53u8; 128]);
        let mut y = [0f32; 256];
        dequantize_row(GgmlType::Q4_K, &block, &mut y).unwrap();
        assert_eq!(y[0], 3.0 - 1.0); // chunk 0 low nibble, sub-block 0
        assert_eq!(y[32], 5.0 - 1.0); // chunk 0 high nibble, sub-block 1
        assert_eq!(y[128], 0.0); // chunk 2 low nibble, sub-block 4: scale 0, min 0
    }

    #[test]
    fn length_errors_are_reported() {
        let mut y = [0f32; 32];
        assert!(matches!(
            dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut y),
            Err(QuantError::ByteLenMismatch { expected: 18, got: 17, .. })
        ));
        let mut y = [0f32; 31];
        assert!(matches!(
            dequantize_row(GgmlType::Q8_0, &[0u8; 34], &mut y),
            Err(QuantError::NotBlockMultiple { .. })
        ));
    }
}
