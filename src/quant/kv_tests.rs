//! KV formats: flag parsing and refusals, head-block byte counts, and small golden head blocks
//! written out word by word (the vectors a WGSL mirror can start from).

use super::*;
use half::f16;

use KvFormat::{Fp8E4m3, Fp8E5m2, Int4, Int8, F16};
use ScaleGranularity::{PerChannel, PerHead, PerTensor, PerToken};

fn q(format: KvFormat, granularity: ScaleGranularity) -> KvQuant {
    KvQuant::new(KvPart::K, format, granularity).unwrap()
}

#[test]
fn names_round_trip() {
    for f in KvFormat::ALL {
        assert_eq!(f.name().parse::<KvFormat>(), Ok(f));
        assert_eq!(f.to_string(), f.name());
    }
    for g in ScaleGranularity::ALL {
        assert_eq!(g.name().to_uppercase().parse::<ScaleGranularity>(), Ok(g));
    }
    let err = "fp8".parse::<KvFormat>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown --kv-cache-dtype \"fp8\"; supported: f16, fp8-e4m3, fp8-e5m2, int8, int4"
    );
    let err = "per-row".parse::<ScaleGranularity>().unwrap_err().to_string();
    assert!(err.ends_with("supported: per-tensor, per-channel, per-token, per-head"), "{err}");
    assert_eq!(serde_json::to_value(Fp8E5m2).unwrap(), "fp8-e5m2");
}

#[test]
fn spec_defaults() {
    let f16_spec = KvCacheSpec::new(F16, None, None, false).unwrap();
    assert_eq!(f16_spec, KvCacheSpec::default());
    assert_eq!(f16_spec.k, KvQuant::F16);
    assert_eq!(f16_spec.k.scale_name(), "none");
    assert_eq!(f16_spec.to_string(), "f16");
    for format in [Fp8E4m3, Fp8E5m2, Int8, Int4] {
        let spec = KvCacheSpec::new(format, None, None, false).unwrap();
        assert_eq!(spec.k, q(format, PerChannel));
        assert_eq!(spec.v, q(format, PerToken));
        assert_eq!(spec.format(), format);
    }
    let spec = KvCacheSpec::new(Fp8E4m3, Some(PerTensor), Some(PerHead), true).unwrap();
    assert_eq!(spec.to_string(), "fp8-e4m3 (K per-tensor, V per-head) rotated");
    assert_eq!(spec.v.scale_name(), "per-head");
    // Rotation with f16 is allowed (a control run).
    assert!(KvCacheSpec::new(F16, None, None, true).unwrap().rotate);
}

#[test]
fn refuses_bad_combinations_naming_the_flag() {
    let err = KvCacheSpec::new(F16, Some(PerToken), None, false).unwrap_err();
    assert_eq!(err, KvQuantError::ScaleWithF16 { part: KvPart::K, granularity: PerToken });
    assert_eq!(
        err.to_string(),
        "--kv-k-scale per-token needs a quantized --kv-cache-dtype (fp8-e4m3, fp8-e5m2, int8, \
         int4); f16 stores no scales: drop --kv-k-scale or choose a quantized dtype"
    );
    let err = KvCacheSpec::new(F16, None, Some(PerTensor), false).unwrap_err();
    assert!(err.to_string().starts_with("--kv-v-scale per-tensor needs a quantized"), "{err}");
    for format in [Int8, Int4] {
        let err = KvCacheSpec::new(format, None, Some(PerTensor), false).unwrap_err();
        assert_eq!(err, KvQuantError::PerTensorNeedsCalibration { part: KvPart::V, format });
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!(
                "--kv-v-scale per-tensor is not available with --kv-cache-dtype {format}"
            )),
            "{msg}"
        );
        assert!(msg.contains("calibrated") && msg.contains("per-token or per-channel"), "{msg}");
        assert!(!KvQuant { format, granularity: PerTensor }.is_valid());
    }
    for format in [Fp8E4m3, Fp8E5m2] {
        assert!(KvCacheSpec::new(format, Some(PerTensor), Some(PerTensor), false).is_ok());
    }
    assert!(!KvQuant { format: F16, granularity: PerHead }.is_valid());
}

#[test]
fn head_dim_checks() {
    let int4 = KvCacheSpec::new(Int4, None, None, false).unwrap();
    assert!(int4.check_head_dim(64).is_ok());
    assert!(int4.check_head_dim(72).is_ok());
    let err = int4.check_head_dim(68).unwrap_err();
    assert_eq!(err, KvQuantError::HeadDim { head_dim: 68, format: Int4, multiple: 8 });
    assert!(err.to_string().ends_with("is 68; use --kv-cache-dtype f16"), "{err}");
    assert!(KvCacheSpec::default().check_head_dim(6).is_ok());
    assert!(KvCacheSpec::default().check_head_dim(7).is_err());
    let rotated = KvCacheSpec::new(Int8, None, None, true).unwrap();
    assert!(rotated.check_head_dim(128).is_ok());
    let err = rotated.check_head_dim(96).unwrap_err();
    assert_eq!(err, KvQuantError::RotateNeedsPowerOfTwo { head_dim: 96 });
}

#[test]
fn staging() {
    assert!(needs_staging(PerChannel) && needs_staging(PerHead));
    assert!(!needs_staging(PerToken) && !needs_staging(PerTensor));
}

/// Bytes of a head block: (format, granularity, bytes at block 16 × head_dim 64 (SmolLM2),
/// words at block 3 × head_dim 8). Hand-computed: data bytes = 16·64·bits/8 = 2048 | 1024 | 512;
/// scales 2 B each (int4: + 2 B min each), rounded up to whole words, then the block to an even
/// number of words (+ 1 word where marked "pad"; f16 and per-tensor store no scales, no pad).
const LAYOUTS: [(KvFormat, ScaleGranularity, u64, usize); 15] = [
    (F16, PerTensor, 2048, 12),
    (Fp8E4m3, PerTensor, 1024, 6),
    (Fp8E4m3, PerToken, 1024 + 16 * 2, 6 + 2),
    (Fp8E4m3, PerChannel, 1024 + 64 * 2, 6 + 4),
    (Fp8E4m3, PerHead, 1024 + 4 + 4, 6 + 1 + 1), // pad
    (Fp8E5m2, PerTensor, 1024, 6),
    (Fp8E5m2, PerToken, 1024 + 32, 6 + 2),
    (Fp8E5m2, PerChannel, 1024 + 128, 6 + 4),
    (Fp8E5m2, PerHead, 1024 + 4 + 4, 6 + 1 + 1), // pad
    (Int8, PerToken, 1024 + 32, 6 + 2),
    (Int8, PerChannel, 1024 + 128, 6 + 4),
    (Int8, PerHead, 1024 + 4 + 4, 6 + 1 + 1), // pad
    (Int4, PerToken, 512 + 16 * 4, 3 + 3),
    (Int4, PerChannel, 512 + 64 * 4, 3 + 8 + 1), // pad at 3 × 8
    (Int4, PerHead, 512 + 4 + 4, 3 + 1),         // pad at 16 × 64
];

#[test]
fn head_block_bytes_by_hand() {
    for (format, granularity, smol_bytes, tiny_words) in LAYOUTS {
        let qq = q(format, granularity);
        let smol = head_block_words(qq, 16, 64);
        assert_eq!(smol.bytes(), smol_bytes, "{format} {granularity}");
        assert_eq!(smol.total_words, smol.data_words + smol.scale_words);
        assert_eq!(smol.data_words * 4, 16 * 64 * format.bits_per_element() / 8);
        assert_eq!(head_block_words(qq, 3, 8).total_words, tiny_words, "{format} {granularity}");
        // Every valid pair is listed.
        assert!(qq.is_valid());
    }
    let valid = KvFormat::ALL
        .iter()
        .flat_map(|f| ScaleGranularity::ALL.map(|g| KvQuant { format: *f, granularity: g }))
        .filter(|qq| qq.is_valid())
        .count();
    assert_eq!(valid, LAYOUTS.len());
}

/// Layout of the golden blocks: 1 token × 8 channels.
fn golden(qq: KvQuant, values: [f32; 8]) -> Vec<u32> {
    let words = quantize_head_block(qq, 1, 8, &values);
    if !needs_staging(qq.granularity) {
        let mut by_token = vec![0; words.len()];
        quantize_token(qq, 1, 8, 0, &values, &mut by_token);
        assert_eq!(by_token, words, "{qq:?}: token path differs from block path");
    }
    words
}

#[test]
fn golden_int8() {
    // amax 127 → s = 1.0 (0x3C00); ties round to even: 0.5 → 0, 63.5 → 64, 64.5 → 64.
    let words = golden(q(Int8, PerToken), [1.0, -2.0, 0.5, 127.0, 0.0, -127.0, 63.5, 64.5]);
    assert_eq!(words, [0x7F00_FE01, 0x4040_8100, 0x0000_3C00, 0]); // + a padding word
    let back = dequantize_head_block(q(Int8, PerToken), 1, 8, &words, 1);
    assert_eq!(back, [1.0, -2.0, 0.0, 127.0, 0.0, -127.0, 64.0, 64.0]);
}

#[test]
fn golden_int4() {
    // min -1, max 14 → s = 1.0, m = -1.0; q = rne(x + 1): 1.5 → 2. Scale half, then min half.
    let words = golden(q(Int4, PerToken), [-1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 7.0, 14.0]);
    assert_eq!(words, [0xF843_2210, 0xBC00_3C00]);
    let back = dequantize_head_block(q(Int4, PerToken), 1, 8, &words, 1);
    assert_eq!(back, [-1.0, 0.0, 1.0, 1.0, 2.0, 3.0, 7.0, 14.0]);
}

#[test]
fn golden_fp8() {
    // amax 448 → s = 1. 0.001 → smallest subnormal (0x01); 100 is a tie between 96 and 104 → 96.
    let values = [448.0, -448.0, 1.0, 0.0, 0.001, 2.0, -3.0, 100.0];
    let words = golden(q(Fp8E4m3, PerHead), values);
    assert_eq!(words, [0x0038_FE7E, 0x6CC4_4001, 0x0000_3C00, 0]); // + a padding word
                                                                   // Per-tensor: scale 1, nothing stored; 65504 saturates to 448.
    let words = golden(q(Fp8E4m3, PerTensor), [65504.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]);
    assert_eq!(words, [0x0000_387E, 0xB800_0000]);
    // e5m2 per-channel: every channel its own scale. Channel 0: 57344 = max → s = 1. Channel 1:
    // s = f16(1 / 57344), an f16 subnormal (293 × 2^-24), a bit above the exact ratio, so
    // 1 / s = 57261.7 → 57344 (0x7B) again.
    let words = golden(q(Fp8E5m2, PerChannel), [57344.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(&words[..2], [0x0000_7B7B, 0]);
    let scale = |i: usize| f16::from_bits((words[2 + i / 2] >> (16 * (i % 2))) as u16);
    assert_eq!(scale(0).to_f32(), 1.0);
    assert_eq!(scale(1).to_bits(), 293);
    assert_eq!(scale(2).to_f32(), 1.0, "an all-zero channel stores scale 1");
}

#[test]
fn f16_is_exact_and_unscaled() {
    let values = [1.0, -2.5, 65504.0, 6e-8, -0.0, 0.333_251_95, 1024.0, -1.0];
    let words = golden(KvQuant::F16, values);
    assert_eq!(words.len(), 4);
    assert_eq!(words[0], 0xC100_3C00); // [1.0, -2.5] as f16 halves, low first
    let back = dequantize_head_block(KvQuant::F16, 1, 8, &words, 1);
    let want: Vec<f32> = values.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
    assert_eq!(back, want);
}

#[test]
fn token_writes_touch_only_their_slots() {
    let (bs, hd) = (5, 8);
    for qq in [q(Int8, PerToken), q(Int4, PerToken), q(Fp8E5m2, PerTensor), KvQuant::F16] {
        let layout = head_block_words(qq, bs, hd);
        let values: Vec<f32> = (0..bs * hd).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let whole = quantize_head_block(qq, bs, hd, &values);
        // Tokens written one at a time, out of order, into a block full of sentinels.
        let mut block = vec![0xDEAD_BEEF; layout.total_words];
        for t in [3, 0, 4, 1, 2] {
            quantize_token(qq, bs, hd, t, &values[t * hd..(t + 1) * hd], &mut block);
        }
        // Written: the data and the scale values' words; then possibly a padding half and a
        // padding word (the even total), never written.
        let written = layout.data_words + qq.scale_values(bs, hd) / 2;
        assert_eq!(block[..written], whole[..written], "{qq:?}");
        if qq.scale_values(bs, hd) % 2 == 1 {
            assert_eq!(block[written] >> 16, 0xDEAD, "{qq:?}: padding half was written");
        }
        let pad_words =
            layout.total_words - layout.data_words - qq.scale_values(bs, hd).div_ceil(2);
        for w in &block[layout.total_words - pad_words..] {
            assert_eq!(*w, 0xDEAD_BEEF, "{qq:?}: padding word was written");
        }
        if qq.scale_values(bs, hd) > 0 {
            assert_eq!(layout.total_words % 2, 0, "{qq:?}: not whole u64s");
        }
        // A partially filled block reads back its first tokens.
        let first_two = dequantize_head_block(qq, bs, hd, &block, 2);
        assert_eq!(first_two, dequantize_head_block(qq, bs, hd, &whole, 2));
    }
}

/// Layers of two head shapes share pool blocks sized for the widest (Gemma 4 31B's 16 × 256
/// sliding and 4 × 512 global heads): f16 and per-channel int8 blocks divide, each global
/// layer using half of its slot's block; per-token V scales (one per token whatever the width)
/// do not, and the refusal names the fix. One shape: its own KV heads; MLA: no V.
#[test]
fn pool_heads_of_mixed_head_shapes() {
    let shapes = [(16, 256), (4, 512)];
    let f16 = KvCacheSpec::default();
    assert_eq!(pool_heads(&f16, 16, &shapes, false), Ok(vec![16, 8]));
    // the wider shape first makes no difference: the widest block decides
    assert_eq!(pool_heads(&f16, 16, &[(1, 512), (4, 256)], false), Ok(vec![2, 4]));
    let channel = KvCacheSpec::new(Int8, Some(PerChannel), Some(PerChannel), false).unwrap();
    assert_eq!(pool_heads(&channel, 16, &shapes, false), Ok(vec![16, 8]));
    let token = KvCacheSpec::new(Int8, None, None, false).unwrap();
    let err = pool_heads(&token, 16, &shapes, false).unwrap_err();
    assert_eq!(
        err,
        KvQuantError::MixedHeadShapes { format: Int8, narrow: (4, 512), wide: (16, 256) }
    );
    assert!(err.to_string().contains("--kv-cache-dtype f16"), "{err}");
    assert_eq!(pool_heads(&token, 16, &[(3, 64)], false), Ok(vec![3]));
    assert_eq!(pool_heads(&f16, 16, &[(1, 576)], true), Ok(vec![1]));
    // a block size of 0 (refused by the engine first) divides nothing and never panics
    assert!(pool_heads(&f16, 0, &shapes, false).is_err());
    assert_eq!(pool_heads(&f16, 0, &[(3, 64)], false), Ok(vec![3]));
    // a narrower shape with more heads than the widest block has room for cannot happen
    // (the widest has the most words); 3 × 256 beside 1 × 512 does not divide
    let err = pool_heads(&f16, 16, &[(3, 256), (1, 512)], false).unwrap_err();
    assert!(matches!(err, KvQuantError::MixedHeadShapes { .. }), "{err}");
}
