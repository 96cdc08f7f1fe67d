//! Round trips of every valid format × granularity stay within the bound their stored scales
//! imply (stated in `kv_block.rs`), on seeded data with outlier channels and as a property test.
//! The checker reads scales straight from the layout spec (`kv.rs`), independently of the codec,
//! and also re-derives each stored scale from the group's values.

use super::*;
use half::f16;
use proptest::prelude::*;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Every valid (format, granularity) pair, f16 included.
fn valid_quants() -> Vec<KvQuant> {
    KvFormat::ALL
        .iter()
        .flat_map(|&format| {
            ScaleGranularity::ALL.map(|granularity| KvQuant { format, granularity })
        })
        .filter(|q| q.is_valid())
        .collect()
}

/// f16 half `i` of the scale region, read as the layout spec says.
fn stored_half(words: &[u32], data_words: usize, i: usize) -> f32 {
    f16::from_bits((words[data_words + i / 2] >> (16 * (i % 2))) as u16).to_f32()
}

fn spec_group(g: ScaleGranularity, token: usize, channel: usize) -> Option<usize> {
    match g {
        ScaleGranularity::PerTensor => None,
        ScaleGranularity::PerChannel => Some(channel),
        ScaleGranularity::PerToken => Some(token),
        ScaleGranularity::PerHead => Some(0),
    }
}

fn f16_round(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

fn nonzero(s: f32) -> f32 {
    if s == 0.0 {
        1.0
    } else {
        s
    }
}

/// Half an FP8 ulp at `y ≥ 0` (subnormal spacing below the smallest normal).
fn fp8_half_ulp(format: KvFormat, y: f64) -> f64 {
    let (man, bias) = if format == KvFormat::Fp8E4m3 { (3, 7) } else { (2, 15) };
    let exp = if y > 0.0 { y.log2().floor() as i32 } else { 1 - bias };
    2f64.powi(exp.max(1 - bias) - man - 1)
}

/// What a group's stored scale (and int4 minimum) must be, from its values.
fn expected_scale(format: KvFormat, group: &[f32]) -> (f32, f32) {
    let min = group.iter().fold(f32::INFINITY, |a, &b| a.min(b));
    let max = group.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let amax = min.abs().max(max.abs());
    match format {
        KvFormat::F16 => (1.0, 0.0),
        KvFormat::Int8 => (nonzero(f16_round(amax / 127.0)), 0.0),
        KvFormat::Fp8E4m3 => (nonzero(f16_round(amax / FP8_E4M3_MAX)), 0.0),
        KvFormat::Fp8E5m2 => (nonzero(f16_round(amax / FP8_E5M2_MAX)), 0.0),
        KvFormat::Int4 => (nonzero(f16_round((max - min) / 15.0)), f16_round(min)),
    }
}

/// The bound of `kv_block.rs` for element `x` of a group, plus f32 rounding slack.
fn bound(q: KvQuant, x: f32, back: f32, group: &[f32], s: f32, m: f32) -> f64 {
    let (x, s, m) = (f64::from(x), f64::from(s), f64::from(m));
    let amax = group.iter().fold(0.0f64, |a, &b| a.max(f64::from(b).abs()));
    let max = group.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(f64::from(b)));
    let y = x.abs() / s;
    let main = match q.format {
        KvFormat::F16 => 0.0,
        KvFormat::Int8 => (s / 2.0).max(amax - 127.0 * s),
        KvFormat::Int4 => (s / 2.0).max(max - (15.0 * s + m)),
        KvFormat::Fp8E4m3 => (s * fp8_half_ulp(q.format, y)).max(amax - 448.0 * s),
        KvFormat::Fp8E5m2 => (s * fp8_half_ulp(q.format, y)).max(amax - 57344.0 * s),
    };
    main + s * (y + 1.0) * 2f64.powi(-22) + f64::from(back).abs() * 2f64.powi(-23)
}

/// Checks the first `num_tokens` tokens of `words` against `values` (`[block_size, head_dim]`);
/// the error names the first bad element.
fn check_round_trip(
    q: KvQuant,
    (bs, hd): (usize, usize),
    values: &[f32],
    words: &[u32],
    num_tokens: usize,
) -> Result<(), String> {
    let layout = head_block_words(q, bs, hd);
    let n = q.granularity.scales_per_head_block(bs, hd);
    let back = dequantize_head_block(q, bs, hd, words, num_tokens);
    for i in 0..num_tokens * hd {
        let (t, c) = (i / hd, i % hd);
        let g = spec_group(q.granularity, t, c);
        let members: Vec<f32> = (0..num_tokens * hd)
            .filter(|&j| spec_group(q.granularity, j / hd, j % hd) == g)
            .map(|j| values[j])
            .collect();
        let (s, m) = match g {
            None => (1.0, 0.0),
            Some(g) if q.format.has_min() => (
                stored_half(words, layout.data_words, g),
                stored_half(words, layout.data_words, n + g),
            ),
            Some(g) => (stored_half(words, layout.data_words, g), 0.0),
        };
        if g.is_some() && (s, m) != expected_scale(q.format, &members) {
            return Err(format!(
                "{q:?} element ({t}, {c}): stored scale/min {s}/{m}, expected {:?}",
                expected_scale(q.format, &members)
            ));
        }
        let err = (f64::from(values[i]) - f64::from(back[i])).abs();
        let limit = bound(q, values[i], back[i], &members, s, m);
        if err > limit {
            return Err(format!(
                "{q:?} {bs}x{hd} element ({t}, {c}): {} came back as {}, error {err} > bound {limit} (s {s}, m {m})",
                values[i], back[i]
            ));
        }
    }
    Ok(())
}

/// K-like data: per-channel magnitudes from 1/8 to 4, two outlier channels (one offset), a
/// constant channel and, in blocks of 3+ tokens, an all-zero token. f16-representable.
fn block_values(rng: &mut StdRng, bs: usize, hd: usize) -> Vec<f32> {
    let base: Vec<f32> = (0..hd).map(|_| 2f32.powf(rng.random_range(-3.0..2.0))).collect();
    let mut values = vec![0.0f32; bs * hd];
    for t in 0..bs {
        for c in 0..hd {
            let mut x = rng.random_range(-1.0f32..1.0) * base[c];
            if c == 1 {
                x *= 40.0;
            } else if c == hd - 2 {
                x = x * 15.0 - 30.0;
            } else if c == 0 {
                x = 0.75;
            }
            values[t * hd + c] = if bs >= 3 && t == 1 { 0.0 } else { f16_round(x) };
        }
    }
    values
}

#[test]
fn every_format_and_granularity_within_bound() {
    let mut rng = StdRng::seed_from_u64(42);
    for (bs, hd) in [(16, 64), (16, 128), (5, 8), (1, 16), (3, 24)] {
        for q in valid_quants() {
            for _ in 0..3 {
                let values = block_values(&mut rng, bs, hd);
                let words = quantize_head_block(q, bs, hd, &values);
                check_round_trip(q, (bs, hd), &values, &words, bs).unwrap();
            }
        }
    }
}

#[test]
fn token_by_token_partial_blocks_within_bound() {
    let mut rng = StdRng::seed_from_u64(43);
    let (bs, hd) = (16, 64);
    for q in valid_quants().into_iter().filter(|q| !needs_staging(q.granularity)) {
        let values = block_values(&mut rng, bs, hd);
        let mut words = vec![0u32; head_block_words(q, bs, hd).total_words];
        for t in 0..7 {
            quantize_token(q, bs, hd, t, &values[t * hd..(t + 1) * hd], &mut words);
        }
        check_round_trip(q, (bs, hd), &values, &words, 7).unwrap();
    }
}

#[test]
fn normal_range_scales_give_half_a_step() {
    // With scales in f16's normal range, the clamp term is below s/2: the bound is s/2.
    let mut rng = StdRng::seed_from_u64(44);
    let values = block_values(&mut rng, 16, 64);
    for format in [KvFormat::Int8, KvFormat::Int4] {
        for granularity in [ScaleGranularity::PerToken, ScaleGranularity::PerChannel] {
            let q = KvQuant { format, granularity };
            let words = quantize_head_block(q, 16, 64, &values);
            let back = dequantize_head_block(q, 16, 64, &words, 16);
            let data_words = head_block_words(q, 16, 64).data_words;
            for i in 0..16 * 64 {
                let g = spec_group(granularity, i / 64, i % 64).unwrap();
                let s = f64::from(stored_half(&words, data_words, g));
                let err = (f64::from(values[i]) - f64::from(back[i])).abs();
                assert!(err <= s / 2.0 * (1.0 + 1e-5), "{q:?} element {i}: {err} > {s}/2");
            }
        }
    }
}

#[test]
fn per_channel_k_beats_per_token_on_outlier_channels() {
    let mut rng = StdRng::seed_from_u64(45);
    let values = block_values(&mut rng, 16, 64);
    let mse = |granularity| {
        let q = KvQuant { format: KvFormat::Int4, granularity };
        let back = dequantize_head_block(q, 16, 64, &quantize_head_block(q, 16, 64, &values), 16);
        values.iter().zip(&back).map(|(a, b)| f64::from(a - b).powi(2)).sum::<f64>()
    };
    let (per_channel, per_token) =
        (mse(ScaleGranularity::PerChannel), mse(ScaleGranularity::PerToken));
    assert!(per_channel * 4.0 < per_token, "per-channel {per_channel} vs per-token {per_token}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Any shape, magnitudes from f16 subnormals to near f16 max: no panic, within the bound.
    #[test]
    fn round_trip_never_panics_and_stays_within_bound(
        qi in 0usize..15,
        bs in 1usize..=20,
        hd8 in 1usize..=8,
        exp in -24i32..=15,
        zeros in 0usize..4,
        seed in any::<u64>(),
    ) {
        let quants = valid_quants();
        let q = quants[qi % quants.len()];
        let hd = 8 * hd8;
        let mut rng = StdRng::seed_from_u64(seed);
        let magnitude = 2f32.powi(exp).min(65504.0);
        let mut values: Vec<f32> =
            (0..bs * hd).map(|_| f16_round(rng.random_range(-1.0f32..=1.0) * magnitude)).collect();
        for _ in 0..zeros * bs {
            let i = rng.random_range(0..values.len());
            values[i] = 0.0;
        }
        let words = quantize_head_block(q, bs, hd, &values);
        prop_assert_eq!(words.len(), head_block_words(q, bs, hd).total_words);
        check_round_trip(q, (bs, hd), &values, &words, bs).map_err(TestCaseError::fail)?;
    }
}
