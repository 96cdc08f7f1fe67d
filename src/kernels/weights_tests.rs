//! The repacked layout against gguf-py: a CPU reading of the packed words, written from the
//! layout table of `kernels::weights` (not from the packing code) and doing what the WGSL
//! `w_values` does, must give gguf-py's dequantization bit for bit (fixtures in
//! `assets/fixtures/quant/`: the sane-scale K-quant blocks and the wide set, whose f16 scales
//! take every kind of finite value).

use super::weights::{block_unit, PackedWeight, WeightError, WeightFormat, TILE_ROWS};
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

/// Element `e` (0..32) of block `b` of row `n`, read from the packed layout as the kernels do.
fn packed_value(p: &PackedWeight, n: usize, b: usize, e: usize) -> f32 {
    let i = block_unit(n, b, p.rows, p.cols / 32);
    let w = &p.words[4 * i..4 * i + 4];
    let swb = p.format.scale_words_per_block();
    let s = &p.scales[swb * i..swb * i + swb];
    // Nibble words: byte e % 4 of word e / 8, low nibble for e % 8 < 4.
    let nibble = (w[e / 8] >> (8 * (e % 4) + 4 * ((e % 8) / 4))) & 0xF;
    // High-bit word: bit 8i + k is element 4k + i's.
    let high_bit = |h: u32| ((h >> (8 * (e % 4) + e / 4)) & 1) << 4;
    match p.format {
        WeightFormat::Q5_0 => ((nibble | high_bit(s[1])) as f32 - 16.0) * f16_low(s[0]),
        WeightFormat::Q4_K => nibble as f32 * f32::from_bits(s[0]) - f32::from_bits(s[1]),
        WeightFormat::Q5_K => {
            (nibble | high_bit(s[2])) as f32 * f32::from_bits(s[0]) - f32::from_bits(s[1])
        }
        WeightFormat::Q6_K => {
            // High-pair word e / 16: bits 8i + 2k, 8i + 2k + 1 are element 16h + 4k + i's.
            let r = e % 16;
            let pair = (s[e / 16] >> (8 * (r % 4) + 2 * (r / 4))) & 3;
            let sc = (s[2] >> (16 + 8 * (e / 16))) as u8 as i8;
            let d = f16_low(s[2]) * f32::from(sc);
            ((nibble | (pair << 4)) as f32 - 32.0) * d
        }
        other => unreachable!("{other:?} is not read here"),
    }
}

fn check_fixture(format: WeightFormat, rows: usize, cols: usize, bin: &str, deq: &str) {
    let packed = PackedWeight::pack(bin, format, rows, cols, &fixture(bin)).unwrap();
    let want = f32s(&fixture(deq));
    assert_eq!(want.len(), rows * cols, "{deq} size");
    for n in 0..rows {
        for c in 0..cols {
            let got = packed_value(&packed, n, c / 32, c % 32);
            let w = want[n * cols + c];
            assert!(
                got.to_bits() == w.to_bits(),
                "{bin}: row {n} column {c}: packed reads {got}, gguf-py {w}"
            );
        }
    }
}

const NEW_FORMATS: [WeightFormat; 4] =
    [WeightFormat::Q5_0, WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K];

#[test]
fn packed_blocks_read_back_as_gguf_py_dequantizes() {
    let manifest: serde_json::Value = serde_json::from_slice(&fixture("manifest.json")).unwrap();
    let size = |m: &serde_json::Value| {
        (m["rows"].as_u64().unwrap() as usize, m["cols"].as_u64().unwrap() as usize)
    };
    let (rows, cols) = size(&manifest);
    let wide = &manifest["wide"];
    let (wide_rows, wide_cols) = size(wide);
    for format in NEW_FORMATS {
        let name = format!("{format:?}");
        check_fixture(format, rows, cols, &format!("{name}.bin"), &format!("{name}.deq.f32"));
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
        assert!(format.scale_words_per_block() <= format.words_per_block(), "{format:?}");
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
