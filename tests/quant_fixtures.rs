//! kvrun's CPU (de)quantizers against llama.cpp's gguf-py, through fixtures committed in
//! `assets/fixtures/quant/` (made by `make_quant_fixtures.py` there).

use kvrun::quant::{dequantize_row, quantize_row, GgmlType};
use std::path::PathBuf;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/fixtures/quant")
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(fixture_dir().join(name)).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

fn read_f32(name: &str) -> Vec<f32> {
    read(name).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

struct Manifest {
    rows: usize,
    cols: usize,
    /// (type, whether `<TYPE>.bin` is gguf-py's quantization of `input.f32`)
    types: Vec<(GgmlType, bool)>,
}

fn manifest() -> Manifest {
    let json: serde_json::Value = serde_json::from_slice(&read("manifest.json")).unwrap();
    let by_name = |name: &str| {
        GgmlType::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .unwrap_or_else(|| panic!("unknown type {name} in manifest"))
    };
    let types = json["types"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, v)| (by_name(name), v["from_input"].as_bool().unwrap()))
        .collect();
    Manifest {
        rows: json["rows"].as_u64().unwrap() as usize,
        cols: json["cols"].as_u64().unwrap() as usize,
        types,
    }
}

#[test]
fn manifest_covers_every_type() {
    let m = manifest();
    for ty in GgmlType::ALL {
        assert!(m.types.iter().any(|(t, _)| *t == ty), "no fixture for {ty}");
    }
}

#[test]
fn quantize_matches_gguf_py_bytes() {
    let m = manifest();
    let input = read_f32("input.f32");
    for &(ty, from_input) in &m.types {
        if !from_input {
            continue;
        }
        let expected = read(&format!("{}.bin", ty.name()));
        let row_bytes = ty.row_bytes(m.cols).unwrap();
        for (row, x) in input.chunks_exact(m.cols).enumerate() {
            let got = quantize_row(ty, x).unwrap();
            let want = &expected[row * row_bytes..(row + 1) * row_bytes];
            if let Some(i) = (0..row_bytes).find(|&i| got[i] != want[i]) {
                panic!(
                    "{ty} row {row}: first differing byte {i} (block {}, byte {}): ours {:#04x}, gguf-py {:#04x}",
                    i / ty.block_bytes(),
                    i % ty.block_bytes(),
                    got[i],
                    want[i]
                );
            }
        }
    }
}

#[test]
fn dequantize_matches_gguf_py_floats() {
    let m = manifest();
    for &(ty, _) in &m.types {
        let bytes = read(&format!("{}.bin", ty.name()));
        let expected = read_f32(&format!("{}.deq.f32", ty.name()));
        let row_bytes = ty.row_bytes(m.cols).unwrap();
        assert_eq!(bytes.len(), m.rows * row_bytes, "{ty} fixture size");
        for (row, src) in bytes.chunks_exact(row_bytes).enumerate() {
            let mut got = vec![0f32; m.cols];
            dequantize_row(ty, src, &mut got).unwrap();
            let want = &expected[row * m.cols..(row + 1) * m.cols];
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    g.to_bits() == w.to_bits(),
                    "{ty} row {row} element {i}: ours {g}, gguf-py {w}"
                );
            }
        }
    }
}
