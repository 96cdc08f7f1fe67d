//! Random weights in every GPU weight format, as file bytes and as the values the GGUF block
//! definitions give them (independent of the kernels' repacking): the linear and expert kernel
//! tests' inputs.

use half::{bf16, f16};
use kvrun::kernels::WeightFormat;
use kvrun::quant::{dequantize_row, GgmlType};
use rand::rngs::StdRng;
use rand::Rng;

/// Random file bytes of `rows` rows in `format`, and their values decoded straight from the
/// GGUF block definitions (independent of the kernels' repacking).
pub fn random_weight(
    rng: &mut StdRng,
    format: WeightFormat,
    rows: usize,
    cols: usize,
) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::new();
    let mut values = Vec::new();
    for _ in 0..rows {
        match format {
            WeightFormat::F32 => {
                for _ in 0..cols {
                    let v: f32 = rng.random_range(-1.0..1.0);
                    bytes.extend(v.to_le_bytes());
                    values.push(v);
                }
            }
            WeightFormat::F16 => {
                for _ in 0..cols {
                    let v = f16::from_f32(rng.random_range(-1.0..1.0));
                    bytes.extend(v.to_le_bytes());
                    values.push(v.to_f32());
                }
            }
            WeightFormat::Bf16 => {
                for _ in 0..cols {
                    let v = bf16::from_f32(rng.random_range(-1.0..1.0));
                    bytes.extend(v.to_le_bytes());
                    values.push(v.to_f32());
                }
            }
            WeightFormat::Q8_0 => {
                for _ in 0..cols / 32 {
                    let d = f16::from_f32(rng.random_range(0.001..0.02));
                    bytes.extend(d.to_le_bytes());
                    for _ in 0..32 {
                        let q: i8 = rng.random();
                        bytes.push(q as u8);
                        values.push(f32::from(q) * d.to_f32());
                    }
                }
            }
            WeightFormat::Q5_0 | WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K => {
                let (row_bytes, row_values) = random_5_6_bit_row(rng, format, cols);
                bytes.extend(row_bytes);
                values.extend(row_values);
            }
            WeightFormat::MXFP4 => {
                // random codes, E8M0 scales 2^-10 .. 2^-4 (values up to ±0.375)
                let mut row: Vec<u8> = (0..cols / 32 * 17).map(|_| rng.random()).collect();
                for block in row.chunks_exact_mut(17) {
                    block[0] = rng.random_range(118..=124);
                }
                let mut row_values = vec![0f32; cols];
                dequantize_row(GgmlType::MXFP4, &row, &mut row_values).unwrap();
                bytes.extend(row);
                values.extend(row_values);
            }
            WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
                for _ in 0..cols / 32 {
                    let d = f16::from_f32(rng.random_range(0.01..0.2));
                    let m = f16::from_f32(rng.random_range(-1.0..0.0));
                    bytes.extend(d.to_le_bytes());
                    if format == WeightFormat::Q4_1 {
                        bytes.extend(m.to_le_bytes());
                    }
                    let qs: Vec<u8> = (0..16).map(|_| rng.random()).collect();
                    bytes.extend(&qs);
                    for e in 0..32 {
                        let q = if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 };
                        values.push(if format == WeightFormat::Q4_0 {
                            (f32::from(q) - 8.0) * d.to_f32()
                        } else {
                            f32::from(q) * d.to_f32() + m.to_f32()
                        });
                    }
                }
            }
        }
    }
    (bytes, values)
}

/// One row of random Q5_0 / K-quant blocks with sane f16 scales, and its values from the CPU
/// dequantizer (bit-exact with gguf-py, `tests/quant_fixtures.rs`).
pub fn random_5_6_bit_row(
    rng: &mut StdRng,
    format: WeightFormat,
    cols: usize,
) -> (Vec<u8>, Vec<f32>) {
    // ggml type, f16 scale fields (byte offset, range)
    let (ty, scales): (GgmlType, &[(usize, std::ops::Range<f32>)]) = match format {
        WeightFormat::Q5_0 => (GgmlType::Q5_0, &[(0, 0.01..0.1)]),
        WeightFormat::Q4_K => (GgmlType::Q4_K, &[(0, 0.001..0.01), (2, 0.001..0.02)]),
        WeightFormat::Q5_K => (GgmlType::Q5_K, &[(0, 0.001..0.01), (2, 0.001..0.02)]),
        WeightFormat::Q6_K => (GgmlType::Q6_K, &[(208, 0.0001..0.002)]),
        other => unreachable!("{other:?}"),
    };
    let mut bytes = Vec::new();
    for _ in 0..cols / ty.block_elems() {
        let mut block: Vec<u8> = (0..ty.block_bytes()).map(|_| rng.random()).collect();
        for (at, range) in scales {
            let d = f16::from_f32(rng.random_range(range.clone()));
            block[*at..at + 2].copy_from_slice(&d.to_le_bytes());
        }
        bytes.extend(block);
    }
    let mut values = vec![0f32; cols];
    dequantize_row(ty, &bytes, &mut values).unwrap();
    (bytes, values)
}
