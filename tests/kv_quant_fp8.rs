//! kvrun's FP8 codec against ml_dtypes, through fixtures committed in `assets/fixtures/fp8/`
//! (made by `make_fp8_fixtures.py` there): decode of all 256 codes of each format, and encode of
//! tricky inputs (every FP8 value, every midpoint and its f32 neighbours, around max and the
//! subnormals, ±0, ±inf, NaN, f32 extremes) plus seeded random ones. The expected codes are
//! ml_dtypes' under kvrun's saturation policy (`clip(x, ±max)` first).

use kvrun::quant::{fp8_e4m3_decode, fp8_e4m3_encode, fp8_e5m2_decode, fp8_e5m2_encode};
use std::path::PathBuf;

fn read(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/fixtures/fp8").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

fn read_f32(name: &str) -> Vec<f32> {
    read(name).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

type Codec = (&'static str, fn(f32) -> u8, fn(u8) -> f32);
const CODECS: [Codec; 2] =
    [("e4m3", fp8_e4m3_encode, fp8_e4m3_decode), ("e5m2", fp8_e5m2_encode, fp8_e5m2_decode)];

#[test]
fn decode_all_256_codes_bit_exact() {
    for (name, _, decode) in CODECS {
        let want = read_f32(&format!("decode_{name}.f32"));
        assert_eq!(want.len(), 256);
        for (code, want) in want.iter().enumerate() {
            let got = decode(code as u8);
            let same = if want.is_nan() { got.is_nan() } else { got.to_bits() == want.to_bits() };
            assert!(same, "{name} code {code:#04x}: got {got:e}, ml_dtypes {want:e}");
        }
    }
}

#[test]
fn encode_fixture_bit_exact() {
    let inputs = read_f32("encode_input.f32");
    let manifest: serde_json::Value = serde_json::from_slice(&read("manifest.json")).unwrap();
    assert_eq!(manifest["encode_inputs"].as_u64(), Some(inputs.len() as u64));
    assert!(inputs.len() > 5000, "the fixture lost its cases");
    for (name, encode, _) in CODECS {
        let want = read(&format!("encode_{name}.u8"));
        assert_eq!(want.len(), inputs.len());
        let mut bad = inputs.iter().zip(&want).enumerate().filter(|(_, (x, w))| encode(**x) != **w);
        if let Some((i, (x, w))) = bad.next() {
            panic!(
                "{name} input #{i} {x:e} (bits {:#010x}): got {:#04x}, expected {w:#04x} ({} more)",
                x.to_bits(),
                encode(*x),
                bad.count()
            );
        }
    }
}

#[test]
fn fixture_covers_the_edges() {
    let inputs = read_f32("encode_input.f32");
    let has = |pred: &dyn Fn(f32) -> bool| inputs.iter().any(|x| pred(*x));
    assert!(has(&|x| x.is_nan() && x.is_sign_negative()));
    assert!(has(&|x| x == f32::INFINITY) && has(&|x| x == f32::NEG_INFINITY));
    assert!(has(&|x| x == 0.0 && x.is_sign_negative()));
    assert!(has(&|x| x == 464.0) && has(&|x| x == 61440.0)); // max + half an ulp
    assert!(has(&|x| x == 2f32.powi(-10)) && has(&|x| x == 2f32.powi(-17))); // half min subnormal
    assert!(has(&|x| x.is_subnormal()));
}
