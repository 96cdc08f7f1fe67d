//! CPU reference codecs of the KV formats over one head block (layout: `kv.rs`). The WGSL
//! kernels mirror these bit for bit, so every rounding step is spelled out.
//!
//! ## Scales and codes, per group of values that share a scale
//!
//! ```text
//! int8  s = f16(amax / 127)          q = clamp(rne(x / s), -127, 127)   x' = q × s
//! fp8   s = f16(amax / M)            c = encode(x / s)                   x' = decode(c) × s
//!       M = 448 (e4m3) | 57344 (e5m2); per-tensor: s = 1, not stored
//! int4  m = f16(min), s = f16((max - min) / 15)
//!                                    q = clamp(rne((x - m) / s), 0, 15)  x' = q × s + m
//! f16   c = f16(x)                                                       x' = c
//! ```
//! - `amax`, `min`, `max` are over the group (a token's channels, a channel's tokens, or the
//!   whole head block). A scale that rounds to 0 in f16 (`amax = 0`, or so small that the ratio
//!   underflows f16) is stored as 1.0 instead, so nothing divides by zero.
//! - The quantizer uses the **stored** f16 `s` and `m`, so dequantization reproduces exactly
//!   what it intended. f32 → f16 is round to nearest even.
//! - All arithmetic is f32. `x / s` is a plain f32 division (not `x × (1/s)`); `rne` rounds
//!   half to even (`round_ties_even`, WGSL `round`). `q × s` is exact in f32 (an integer of ≤ 8
//!   bits times an 11-bit f16 significand), so fused and unfused `q × s + m` agree.
//! - FP8 encode rounds to nearest even and saturates at ±M (policy in `fp8.rs`).
//! - Inputs are f16-representable finite values (the cache holds f16 first). Non-finite input
//!   never panics but gives unspecified codes (NaN: fp8 NaN, int8 0, int4 0).
//!
//! ## Error bound of a round trip (tested in `kv_tests.rs`)
//!
//! With `s`, `m` the stored values, ignoring f32 rounding (≤ `s × 2^-17` more):
//! ```text
//! int8  |x - x'| ≤ max(s / 2, amax - 127 s)
//! int4  |x - x'| ≤ max(s / 2, max - (15 s + m))
//! fp8   |x - x'| ≤ max(s × ulp(x / s) / 2, amax - M s)      ulp at the FP8 exponent of x / s
//! ```
//! The second terms are the clamp at the top: `s` rounded to f16 can be a little below the
//! exact ratio. For a scale in f16's normal range they are ≤ `2^-11 × amax` (resp. `max - min`),
//! well under `s / 2`, so the bound is the familiar `s / 2`.
//!
//! ## Notes for the WGSL mirror
//!
//! - WGSL only promises f32 `x / y` to 2.5 ULP (not correctly rounded, unlike `+ - ×`). A GPU
//!   code can therefore differ by one step from this reference where `x / s` (or
//!   `amax / 127` before the f16 rounding of a scale) lies within a few ULP of a rounding
//!   boundary; exact ties such as the golden tests' are safe where `s` is a power of two. A GPU
//!   test should allow exactly that, or the kernel must divide correctly rounded.
//! - WGSL does not pin the rounding of f32 → f16 conversions; round scales to f16 with
//!   integer operations on the bits (nearest, ties to even) to match `half::f16::from_f32`.
//! - Per-token scales of two tokens share a u32: writing one token's scale must keep the
//!   other half ([`quantize_token`] does a read-modify-write).

use half::f16;

use super::fp8::{
    fp8_e4m3_decode, fp8_e4m3_encode, fp8_e5m2_decode, fp8_e5m2_encode, FP8_E4M3_MAX, FP8_E5M2_MAX,
};
use super::kv::{head_block_words, needs_staging, KvFormat, KvQuant, ScaleGranularity};

/// Smallest and largest value of a group.
#[derive(Clone, Copy, Debug)]
struct Range {
    min: f32,
    max: f32,
}

impl Range {
    const EMPTY: Range = Range { min: f32::INFINITY, max: f32::NEG_INFINITY };

    fn add(self, x: f32) -> Range {
        Range { min: self.min.min(x), max: self.max.max(x) }
    }

    fn of(values: &[f32]) -> Range {
        values.iter().fold(Range::EMPTY, |r, &x| r.add(x))
    }

    fn amax(self) -> f32 {
        self.min.abs().max(self.max.abs())
    }
}

/// A group's stored scale and minimum (0 for the symmetric formats).
#[derive(Clone, Copy, Debug, PartialEq)]
struct GroupScale {
    scale: f16,
    min: f16,
}

impl GroupScale {
    /// Per-tensor (and f16): scale 1, nothing stored.
    const UNIT: GroupScale = GroupScale { scale: f16::ONE, min: f16::ZERO };

    fn of(format: KvFormat, r: Range) -> GroupScale {
        let symmetric = |max_code: f32| GroupScale {
            scale: nonzero(f16::from_f32(r.amax() / max_code)),
            min: f16::ZERO,
        };
        match format {
            KvFormat::F16 => GroupScale::UNIT,
            KvFormat::Int8 => symmetric(127.0),
            KvFormat::Fp8E4m3 => symmetric(FP8_E4M3_MAX),
            KvFormat::Fp8E5m2 => symmetric(FP8_E5M2_MAX),
            KvFormat::Int4 => GroupScale {
                scale: nonzero(f16::from_f32((r.max - r.min) / 15.0)),
                min: f16::from_f32(r.min),
            },
        }
    }
}

/// A scale of 0 would divide by zero: store 1 instead (its group quantizes to q = 0 / the min).
fn nonzero(scale: f16) -> f16 {
    if scale.to_f32() == 0.0 {
        f16::ONE
    } else {
        scale
    }
}

/// The code of `x` (in the low `bits` bits).
fn encode(format: KvFormat, x: f32, g: GroupScale) -> u32 {
    let (s, m) = (g.scale.to_f32(), g.min.to_f32());
    match format {
        KvFormat::F16 => u32::from(f16::from_f32(x).to_bits()),
        KvFormat::Fp8E4m3 => u32::from(fp8_e4m3_encode(x / s)),
        KvFormat::Fp8E5m2 => u32::from(fp8_e5m2_encode(x / s)),
        KvFormat::Int8 => ((x / s).round_ties_even().clamp(-127.0, 127.0) as i32 as u32) & 0xFF,
        KvFormat::Int4 => ((x - m) / s).round_ties_even().clamp(0.0, 15.0) as u32,
    }
}

/// The value a code stands for.
fn decode(format: KvFormat, code: u32, g: GroupScale) -> f32 {
    let (s, m) = (g.scale.to_f32(), g.min.to_f32());
    match format {
        KvFormat::F16 => f16::from_bits(code as u16).to_f32(),
        KvFormat::Fp8E4m3 => fp8_e4m3_decode(code as u8) * s,
        KvFormat::Fp8E5m2 => fp8_e5m2_decode(code as u8) * s,
        KvFormat::Int8 => f32::from(code as u8 as i8) * s,
        KvFormat::Int4 => code as f32 * s + m,
    }
}

/// The scale group of element `(token, channel)`; `None` for per-tensor (no stored scale).
fn group(granularity: ScaleGranularity, token: usize, channel: usize) -> Option<usize> {
    match granularity {
        ScaleGranularity::PerTensor => None,
        ScaleGranularity::PerChannel => Some(channel),
        ScaleGranularity::PerToken => Some(token),
        ScaleGranularity::PerHead => Some(0),
    }
}

/// Writes the `bits`-bit `code` of element `idx` into the data region.
fn put_code(words: &mut [u32], bits: usize, idx: usize, code: u32) {
    let per_word = 32 / bits;
    let shift = (idx % per_word) * bits;
    let mask = (u32::MAX >> (32 - bits)) << shift;
    let word = &mut words[idx / per_word];
    *word = (*word & !mask) | ((code << shift) & mask);
}

/// Reads the `bits`-bit code of element `idx` from the data region.
fn get_code(words: &[u32], bits: usize, idx: usize) -> u32 {
    let per_word = 32 / bits;
    (words[idx / per_word] >> ((idx % per_word) * bits)) & (u32::MAX >> (32 - bits))
}

/// Where a head block's scale region starts and how many scales it has (`n`; int4 minimums
/// follow at f16 index `n + g`).
#[derive(Clone, Copy)]
struct ScaleRegion {
    first_word: usize,
    n: usize,
    has_min: bool,
}

impl ScaleRegion {
    fn of(q: KvQuant, block_size: usize, head_dim: usize) -> ScaleRegion {
        ScaleRegion {
            first_word: head_block_words(q, block_size, head_dim).data_words,
            n: q.granularity.scales_per_head_block(block_size, head_dim),
            has_min: q.format.has_min(),
        }
    }

    fn store(self, words: &mut [u32], g: usize, gs: GroupScale) {
        put_code(&mut words[self.first_word..], 16, g, u32::from(gs.scale.to_bits()));
        if self.has_min {
            put_code(&mut words[self.first_word..], 16, self.n + g, u32::from(gs.min.to_bits()));
        }
    }

    fn load(self, words: &[u32], g: usize) -> GroupScale {
        let half = |i| f16::from_bits(get_code(&words[self.first_word..], 16, i) as u16);
        let min = if self.has_min { half(self.n + g) } else { f16::ZERO };
        GroupScale { scale: half(g), min }
    }
}

/// Preconditions shared by the entry points (caller bugs, not user input).
#[track_caller]
fn check(q: KvQuant, block_size: usize, head_dim: usize, words_len: usize) {
    assert!(q.is_valid(), "invalid KV quantization {q:?}; build it with KvQuant::new");
    let unit = if q.format.is_quantized() { 8 } else { 2 };
    assert!(
        block_size > 0 && head_dim > 0 && head_dim.is_multiple_of(unit),
        "bad head_dim {head_dim}"
    );
    let want = head_block_words(q, block_size, head_dim).total_words;
    assert_eq!(words_len, want, "a head block of {q:?} is {want} words");
}

/// Quantizes one full head block. `values`: `[block_size, head_dim]` f16-representable values.
/// Returns the head block's `total_words` words (layout in `kv.rs`): codes, then scales.
/// Per-token and per-tensor give the same words as [`quantize_token`] on every token.
/// Panics on a shape mismatch or an invalid `q` (caller bugs). O(block_size × head_dim).
#[track_caller]
pub fn quantize_head_block(
    q: KvQuant,
    block_size: usize,
    head_dim: usize,
    values: &[f32], // [block_size, head_dim]
) -> Vec<u32> {
    let layout = head_block_words(q, block_size, head_dim);
    check(q, block_size, head_dim, layout.total_words);
    assert_eq!(values.len(), block_size * head_dim, "values must be [block_size, head_dim]");
    let region = ScaleRegion::of(q, block_size, head_dim);
    let element_group = |i: usize| group(q.granularity, i / head_dim, i % head_dim);
    let mut ranges = vec![Range::EMPTY; region.n];
    for (i, &x) in values.iter().enumerate() {
        if let Some(g) = element_group(i) {
            ranges[g] = ranges[g].add(x);
        }
    }
    let scales: Vec<GroupScale> = ranges.iter().map(|r| GroupScale::of(q.format, *r)).collect();
    let mut words = vec![0u32; layout.total_words]; // [total_words]
    for (g, gs) in scales.iter().enumerate() {
        region.store(&mut words, g, *gs);
    }
    let bits = q.format.bits_per_element();
    for (i, &x) in values.iter().enumerate() {
        let gs = element_group(i).map_or(GroupScale::UNIT, |g| scales[g]);
        put_code(&mut words, bits, i, encode(q.format, x, gs));
    }
    words
}

/// Quantizes one token into its slots of a head block, the path of granularities that need no
/// staging (per-token, per-tensor, and f16): writes token `token_idx`'s data words (whole
/// words: `head_dim × bits / 32` of them) and, for per-token, its scale slot (and int4 minimum
/// slot); every other word and half-word is left as it was. Note that two tokens' f16 scales
/// share a word, so a GPU writer must not overwrite the neighbour's half.
///
/// `values`: `[head_dim]`; `head_block`: `[total_words]`. Panics (caller bug) if `q` needs
/// staging ([`needs_staging`]), on a shape mismatch or `token_idx ≥ block_size`.
#[track_caller]
pub fn quantize_token(
    q: KvQuant,
    block_size: usize,
    head_dim: usize,
    token_idx: usize,
    values: &[f32],         // [head_dim]
    head_block: &mut [u32], // [total_words]
) {
    check(q, block_size, head_dim, head_block.len());
    assert!(!needs_staging(q.granularity), "{q:?} quantizes whole blocks, not tokens");
    assert!(token_idx < block_size, "token {token_idx} outside a block of {block_size}");
    assert_eq!(values.len(), head_dim, "values must be [head_dim]");
    let gs = match q.granularity {
        ScaleGranularity::PerToken => GroupScale::of(q.format, Range::of(values)),
        _ => GroupScale::UNIT,
    };
    if q.granularity == ScaleGranularity::PerToken {
        ScaleRegion::of(q, block_size, head_dim).store(head_block, token_idx, gs);
    }
    let bits = q.format.bits_per_element();
    for (c, &x) in values.iter().enumerate() {
        put_code(head_block, bits, token_idx * head_dim + c, encode(q.format, x, gs));
    }
}

/// The value of element `(token_idx, channel)` of a quantized head block (`[total_words]`).
/// O(1). Panics on a shape mismatch or an index out of range.
#[track_caller]
pub fn dequantize_element(
    q: KvQuant,
    block_size: usize,
    head_dim: usize,
    head_block: &[u32], // [total_words]
    token_idx: usize,
    channel: usize,
) -> f32 {
    check(q, block_size, head_dim, head_block.len());
    assert!(token_idx < block_size && channel < head_dim, "element ({token_idx}, {channel})");
    let gs = group(q.granularity, token_idx, channel)
        .map_or(GroupScale::UNIT, |g| ScaleRegion::of(q, block_size, head_dim).load(head_block, g));
    let code = get_code(head_block, q.format.bits_per_element(), token_idx * head_dim + channel);
    decode(q.format, code, gs)
}

/// Dequantizes the first `num_tokens` tokens of a head block (`[total_words]`): returns
/// `[num_tokens, head_dim]`. Panics on a shape mismatch or `num_tokens > block_size`.
#[track_caller]
pub fn dequantize_head_block(
    q: KvQuant,
    block_size: usize,
    head_dim: usize,
    head_block: &[u32], // [total_words]
    num_tokens: usize,
) -> Vec<f32> {
    assert!(num_tokens <= block_size, "{num_tokens} tokens in a block of {block_size}");
    (0..num_tokens * head_dim)
        .map(|i| {
            dequantize_element(q, block_size, head_dim, head_block, i / head_dim, i % head_dim)
        })
        .collect()
}
