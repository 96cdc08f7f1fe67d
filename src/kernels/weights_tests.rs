//! The repacked layout against gguf-py: a CPU reading of the packed words, written from the
//! layout table of `kernels::weights` (not from the packing code) and doing what the WGSL
//! `w_values` does, must give gguf-py's dequantization bit for bit (fixtures in
//! `assets/fixtures/quant/`: the sane-scale K-quant blocks and the wide set, whose f16 scales
//! take every kind of finite value).

use super::weights::{block_unit, super_unit, PackedWeight, WeightError, WeightFormat, TILE_ROWS};
use half::f16;
use std::path::PathBuf;

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/fixtures/quant").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn f16_low(word: u32) -> f32 {
    f16::from_bits(word as u16).to_f32()
}

/// Element `e` (0..32) of block `b` of row `n`, read from the packed layout as the kernels do
/// (the module doc's table of `kernels::weights`).
fn packed_value(p: &PackedWeight, n: usize, b: usize, e: usize) -> f32 {
    let blocks = p.cols / 32;
    let i = block_unit(n, b, p.rows, blocks);
    let side = p.format.side_layout(p.rows, blocks);
    let s = &p.scales;
    let a = |k: usize| s[side.per_unit * i + k];
    let half = |j: usize| f16_low(s[side.halves_at + j / 2] >> (16 * (j % 2)));
    let su = super_unit(n, b, p.rows, blocks);
    // byte k of the super-block's region-B words
    let super_byte = |k: usize| (s[side.super_at + 4 * su + k / 4] >> (8 * (k % 4))) as u8;
    let w = &p.words[p.format.words_per_block() * i..];
    // Nibble words: byte e % 4 of word e / 8, low nibble for e % 8 < 4.
    let nibble = (w[e / 8] >> (8 * (e % 4) + 4 * ((e % 8) / 4))) & 0xF;
    // High-bit word: bit 8i + k is element 4k + i's.
    let high_bit = |h: u32| ((h >> (8 * (e % 4) + e / 4)) & 1) << 4;
    // Q4_K / Q5_K: ggml's get_scale_min_k4 over the 12 scale bytes after d and dmin
    let k_scale = || {
        let (j, q) = (b % 8, |k: usize| super_byte(4 + k));
        let (sc, m) = match j < 4 {
            true => (q(j) & 63, q(j + 4) & 63),
            false => {
                ((q(j + 4) & 0xF) | ((q(j - 4) >> 6) << 4), (q(j + 4) >> 4) | ((q(j) >> 6) << 4))
            }
        };
        let f16_at =
            |k: usize| f16::from_bits(u16::from_le_bytes([super_byte(k), super_byte(k + 1)]));
        (f16_at(0).to_f32() * f32::from(sc), f16_at(2).to_f32() * f32::from(m))
    };
    match p.format {
        WeightFormat::Q8_0 => f32::from((w[e / 4] >> (8 * (e % 4))) as u8 as i8) * half(i),
        WeightFormat::Q4_0 => (nibble as f32 - 8.0) * half(i),
        WeightFormat::Q5_0 => ((nibble | high_bit(a(0))) as f32 - 16.0) * half(i),
        WeightFormat::Q4_K => {
            let (d, m) = k_scale();
            nibble as f32 * d - m
        }
        WeightFormat::Q5_K => {
            let (d, m) = k_scale();
            (nibble | high_bit(a(0))) as f32 * d - m
        }
        WeightFormat::Q6_K => {
            // High-pair word e / 16: bits 8i + 2k, 8i + 2k + 1 are element 16h + 4k + i's.
            let r = e % 16;
            let pair = (a(e / 16) >> (8 * (r % 4) + 2 * (r / 4))) & 3;
            let sc = super_byte(2 * (b % 8) + e / 16) as i8;
            let d = half(su) * f32::from(sc);
            ((nibble | (pair << 4)) as f32 - 32.0) * d
        }
        WeightFormat::MXFP4 => {
            // the code's doubled e2m1 value (bit 3 the sign; code 8 is +0) times 2^(e − 128),
            // e byte i of region C
            const DOUBLED: [f32; 8] = [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0];
            let e = (s[side.halves_at + i / 4] >> (8 * (i % 4))) & 0xFF;
            let v = DOUBLED[(nibble & 7) as usize] * 2f64.powi(e as i32 - 128) as f32;
            if nibble & 8 != 0 && v != 0.0 {
                -v
            } else {
                v
            }
        }
        other => unreachable!("{other:?} is not read here"),
    }
}

/// The fixture's rows, repeated to `rows` rows (several tiles, a short last one, odd counts:
/// every region offset and unit formula in play), packed and read back against gguf-py.
fn check_fixture(format: WeightFormat, rows: usize, cols: usize, bin: &str, deq: &str) {
    let data = fixture(bin);
    let want = f32s(&fixture(deq));
    assert_eq!(want.len(), rows * cols, "{deq} size");
    let row_bytes = format.file_row_bytes(cols);
    for many in [rows, 2 * rows + 1, 131] {
        let bytes: Vec<u8> =
            (0..many).flat_map(|n| data[n % rows * row_bytes..][..row_bytes].to_vec()).collect();
        let packed = PackedWeight::pack(bin, format, many, cols, &bytes).unwrap();
        // the GPU holds the file's bytes, plus at most 32 bytes of padding a side region
        let gpu = 4 * (packed.words.len() + packed.scales.len());
        assert!(gpu >= bytes.len() && gpu <= bytes.len() + 96, "{bin}: {gpu} for {}", bytes.len());
        for n in 0..many {
            for c in 0..cols {
                let got = packed_value(&packed, n, c / 32, c % 32);
                let w = want[n % rows * cols + c];
                assert!(
                    got.to_bits() == w.to_bits(),
                    "{bin} × {many} rows: row {n} column {c}: packed reads {got}, gguf-py {w}"
                );
            }
        }
    }
}

/// Formats whose CPU reading here is gguf-py's bit for bit (Q4_1's `d · q + m` is one fma in
/// the kernels, two roundings in gguf-py: its kernel tests compare with a tolerance).
const NEW_FORMATS: [WeightFormat; 5] = [
    WeightFormat::Q5_0,
    WeightFormat::Q4_K,
    WeightFormat::Q5_K,
    WeightFormat::Q6_K,
    WeightFormat::MXFP4,
];
const EXACT_FORMATS: [WeightFormat; 7] = [
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::Q5_0,
    WeightFormat::Q4_K,
    WeightFormat::Q5_K,
    WeightFormat::Q6_K,
    WeightFormat::MXFP4,
];

#[test]
fn packed_blocks_read_back_as_gguf_py_dequantizes() {
    let manifest: serde_json::Value = serde_json::from_slice(&fixture("manifest.json")).unwrap();
    let size = |m: &serde_json::Value| {
        (m["rows"].as_u64().unwrap() as usize, m["cols"].as_u64().unwrap() as usize)
    };
    let (rows, cols) = size(&manifest);
    let wide = &manifest["wide"];
    let (wide_rows, wide_cols) = size(wide);
    for format in EXACT_FORMATS {
        let name = format!("{format:?}");
        check_fixture(format, rows, cols, &format!("{name}.bin"), &format!("{name}.deq.f32"));
    }
    for format in NEW_FORMATS {
        let name = format!("{format:?}");
        assert!(wide["types"].as_array().unwrap().iter().any(|t| t == &name[..]), "{name}");
        check_fixture(
            format,
            wide_rows,
            wide_cols,
            &format!("{name}.wide.bin"),
            &format!("{name}.wide.deq.f32"),
        );
    }
}

#[test]
fn k_quants_need_whole_super_blocks() {
    for format in [WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K] {
        let cols = 288;
        let err = PackedWeight::pack("blk.0.ffn_up.weight", format, 2, cols, &[]).unwrap_err();
        assert!(matches!(err, WeightError::BadColumns { cols: 288, multiple: 256, .. }), "{err:?}");
        assert!(err.to_string().contains("not a multiple of 256"), "{err}");
    }
    // Q5_0 blocks are 32 elements: 288 columns is fine.
    let q5_0 = vec![0u8; 2 * WeightFormat::Q5_0.file_row_bytes(288)];
    assert!(PackedWeight::pack("w", WeightFormat::Q5_0, 2, 288, &q5_0).is_ok());
}

#[test]
fn side_words_never_outgrow_the_words() {
    for format in WeightFormat::ALL {
        assert!(format.words_per_block() % 4 == 0, "{format:?}: whole vec4s");
        // a part sized by its words also fits its side words (and textures of them)
        for (rows, blocks) in [(1, 8), (3, 8), (64, 16), (131, 24)] {
            let side = format.side_layout(rows, blocks).words;
            assert!(side <= rows * blocks * format.words_per_block(), "{format:?}");
        }
        let (elems, _) = format.file_block();
        assert_eq!(format.column_multiple() % 32, 0, "{format:?}");
        assert_eq!(format.column_multiple() % elems, 0, "{format:?}");
    }
}

/// The tiled layout is a bijection of (row, block) onto the units, neighbouring rows of a
/// block are neighbouring units (the pair loads and GPU coalescing rely on it), and each tile
/// is one stretch of units — for row counts with and without a short last tile.
#[test]
fn block_units_tile_the_matrix() {
    for (rows, blocks) in [(1, 3), (2, 1), (63, 2), (64, 5), (65, 2), (70, 3), (129, 18), (200, 1)]
    {
        let mut seen = vec![false; rows * blocks];
        for n in 0..rows {
            for b in 0..blocks {
                let u = block_unit(n, b, rows, blocks);
                assert!(!seen[u], "rows {rows} blocks {blocks}: unit {u} twice");
                seen[u] = true;
                let first = n - n % TILE_ROWS;
                let tile_units = first * blocks..(first + TILE_ROWS).min(rows) * blocks;
                assert!(tile_units.contains(&u), "rows {rows}: ({n}, {b}) outside its tile");
                if n % TILE_ROWS != 0 {
                    assert_eq!(
                        u,
                        block_unit(n - 1, b, rows, blocks) + 1,
                        "rows {rows}: ({n}, {b})"
                    );
                }
            }
        }
        assert!(seen.iter().all(|&s| s), "rows {rows} blocks {blocks}: a unit unused");
    }
}

/// WGSL's `w_unit` tiles with the same row count.
#[test]
fn wgsl_tile_rows_match() {
    let wgsl = crate::kernels::source::WEIGHTS;
    assert!(wgsl.contains(&format!("const W_TILE_ROWS: u32 = {TILE_ROWS}u;")));
}
