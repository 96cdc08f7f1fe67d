//! KV-cache formats: what `--kv-cache-dtype`, `--kv-k-scale`, `--kv-v-scale` and `--kv-rotate`
//! mean ([`KvCacheSpec`]), which combinations exist, and the word layout of one *head block*
//! ([`head_block_words`]). The codecs are in `kv_block.rs`.
//!
//! ## Head block: the unit of quantization
//!
//! `block_size` tokens × `head_dim` channels of one KV head, of K or of V, in one layer. It is
//! one contiguous run of little-endian u32 words in the pool, data first, then scales:
//!
//! ```text
//! data   [block_size, head_dim] elements, token-major, packed into u32 words:
//!          f16        2 a word, half i  = element 2w+i (low half first)
//!          fp8, int8  4 a word, byte i  = element 4w+i (int8 as two's complement)
//!          int4       8 a word, nibble i = element 8w+i (low nibble first)
//! scales f16 values, 2 a word (low half first): n scales, then for int4 n minimums
//!          (f16 index n + g), the region rounded up to whole words (a padding half is 0)
//!          and then to an even total: the lane attention kernels read the pool as u64;
//!          n = block_size (per-token) | head_dim (per-channel) | 1 (per-head) | 0 (per-tensor)
//!
//! data_words  = block_size × head_dim × bits / 32     bits = 16 | 8 | 8 | 8 | 4
//! scale_words = 0 if n = 0, else
//!               even(data_words + ceil(n × (2 if int4 else 1) / 2)) − data_words
//! total_words = data_words + scale_words
//! ```
//! (even(x): x rounded up to a multiple of 2. Padding words are never written or read.)
//! Token `t` starts at data word `t × head_dim × bits / 32`, so `head_dim` must fill whole words:
//! even for f16, a multiple of 8 for the quantized formats ([`KvCacheSpec::check_head_dim`]).

use std::fmt;

/// Storage format of K and V (`--kv-cache-dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KvFormat {
    /// IEEE half precision, no scales (the default).
    #[default]
    F16,
    /// OCP FP8 e4m3 ("e4m3fn": no inf, max 448) times a scale.
    Fp8E4m3,
    /// FP8 e5m2 (IEEE-like, max 57344) times a scale.
    Fp8E5m2,
    /// Symmetric int8: `q × scale`, `q ∈ [-127, 127]`.
    Int8,
    /// Asymmetric int4: `q × scale + min`, `q ∈ [0, 15]`.
    Int4,
}

impl KvFormat {
    /// Every format, in CLI order.
    pub const ALL: [KvFormat; 5] =
        [KvFormat::F16, KvFormat::Fp8E4m3, KvFormat::Fp8E5m2, KvFormat::Int8, KvFormat::Int4];

    /// The name users type and JSON reports.
    pub const fn name(self) -> &'static str {
        match self {
            KvFormat::F16 => "f16",
            KvFormat::Fp8E4m3 => "fp8-e4m3",
            KvFormat::Fp8E5m2 => "fp8-e5m2",
            KvFormat::Int8 => "int8",
            KvFormat::Int4 => "int4",
        }
    }

    /// Bits of one stored element.
    pub const fn bits_per_element(self) -> usize {
        match self {
            KvFormat::F16 => 16,
            KvFormat::Fp8E4m3 | KvFormat::Fp8E5m2 | KvFormat::Int8 => 8,
            KvFormat::Int4 => 4,
        }
    }

    /// Whether values are stored with scales (every format but f16).
    pub const fn is_quantized(self) -> bool {
        !matches!(self, KvFormat::F16)
    }

    /// Whether each scale has a minimum next to it (asymmetric int4).
    pub const fn has_min(self) -> bool {
        matches!(self, KvFormat::Int4)
    }
}

/// Over which values one scale is shared (`--kv-k-scale`, `--kv-v-scale`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleGranularity {
    /// One static scale per layer and K|V, fixed at 1.0 (no calibration); no scale is stored.
    /// FP8 only (vLLM's default); f16 is also this, with its implicit scale of 1.
    PerTensor,
    /// One scale per channel of each head block (over its `block_size` tokens). K's default:
    /// K has outlier channels.
    PerChannel,
    /// One scale per token of each head block (over its `head_dim` channels). V's default.
    PerToken,
    /// One scale per head block (over all its tokens and channels).
    PerHead,
}

impl ScaleGranularity {
    /// Every granularity, in CLI order.
    pub const ALL: [ScaleGranularity; 4] = [
        ScaleGranularity::PerTensor,
        ScaleGranularity::PerChannel,
        ScaleGranularity::PerToken,
        ScaleGranularity::PerHead,
    ];

    /// The name users type and JSON reports.
    pub const fn name(self) -> &'static str {
        match self {
            ScaleGranularity::PerTensor => "per-tensor",
            ScaleGranularity::PerChannel => "per-channel",
            ScaleGranularity::PerToken => "per-token",
            ScaleGranularity::PerHead => "per-head",
        }
    }

    /// Scales stored in one head block: `0 | head_dim | block_size | 1`.
    pub const fn scales_per_head_block(self, block_size: usize, head_dim: usize) -> usize {
        match self {
            ScaleGranularity::PerTensor => 0,
            ScaleGranularity::PerChannel => head_dim,
            ScaleGranularity::PerToken => block_size,
            ScaleGranularity::PerHead => 1,
        }
    }
}

/// Whether a head block with this granularity can only be quantized once all its tokens are
/// known (per-channel, per-head): the partial last block of a running sequence then waits in an
/// f16 staging area and is quantized in place when it fills (KIVI). Per-token and per-tensor
/// quantize each token as it is written.
pub const fn needs_staging(granularity: ScaleGranularity) -> bool {
    matches!(granularity, ScaleGranularity::PerChannel | ScaleGranularity::PerHead)
}

/// K or V, to name the right flag in errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvPart {
    K,
    V,
}

impl KvPart {
    /// The scale flag of this part.
    pub const fn scale_flag(self) -> &'static str {
        match self {
            KvPart::K => "--kv-k-scale",
            KvPart::V => "--kv-v-scale",
        }
    }
}

/// How K or V is stored: a format and its scale granularity. Valid pairs are made by
/// [`KvQuant::new`] (or [`KvQuant::F16`]); the codecs assert [`KvQuant::is_valid`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct KvQuant {
    pub format: KvFormat,
    pub granularity: ScaleGranularity,
}

impl KvQuant {
    /// Unscaled f16: per-tensor with the implicit scale 1, no scale words.
    pub const F16: KvQuant =
        KvQuant { format: KvFormat::F16, granularity: ScaleGranularity::PerTensor };

    /// Checks that `format` can use `granularity`; `part` only names the flag in the error.
    /// Refused: any granularity but per-tensor with f16 (f16 stores no scales); per-tensor with
    /// int8/int4 (it needs a calibrated static scale, which kvrun does not have).
    pub fn new(
        part: KvPart,
        format: KvFormat,
        granularity: ScaleGranularity,
    ) -> Result<Self, KvQuantError> {
        let q = KvQuant { format, granularity };
        match (format, granularity) {
            (KvFormat::F16, ScaleGranularity::PerTensor) => Ok(q),
            (KvFormat::F16, _) => Err(KvQuantError::ScaleWithF16 { part, granularity }),
            (KvFormat::Int8 | KvFormat::Int4, ScaleGranularity::PerTensor) => {
                Err(KvQuantError::PerTensorNeedsCalibration { part, format })
            }
            _ => Ok(q),
        }
    }

    /// Whether [`KvQuant::new`] accepts this pair.
    pub fn is_valid(self) -> bool {
        KvQuant::new(KvPart::K, self.format, self.granularity).is_ok()
    }

    /// The granularity as reported: its name, or `"none"` for unscaled f16.
    pub const fn scale_name(self) -> &'static str {
        if self.format.is_quantized() {
            self.granularity.name()
        } else {
            "none"
        }
    }

    /// f16 values in a head block's scale region: the scales, and as many minimums for int4.
    pub const fn scale_values(self, block_size: usize, head_dim: usize) -> usize {
        let n = self.granularity.scales_per_head_block(block_size, head_dim);
        if self.format.has_min() {
            2 * n
        } else {
            n
        }
    }
}

/// Word counts of one head block (module docs for the layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeadBlockLayout {
    /// u32 words of packed elements: `block_size × head_dim × bits / 32` (rounded up).
    pub data_words: usize,
    /// u32 words of f16 scales (and int4 minimums): `ceil(scale_values / 2)`, plus one when
    /// that leaves the head block an odd number of words (module docs).
    pub scale_words: usize,
    /// `data_words + scale_words`.
    pub total_words: usize,
}

impl HeadBlockLayout {
    /// Bytes of the whole head block: `4 × total_words`.
    pub const fn bytes(&self) -> u64 {
        4 * self.total_words as u64
    }
}

/// The word layout of one head block of `q`. Exact for the shapes `check_head_dim` accepts
/// (otherwise the data region is rounded up to whole words). O(1).
pub const fn head_block_words(q: KvQuant, block_size: usize, head_dim: usize) -> HeadBlockLayout {
    let data_words = (block_size * head_dim * q.format.bits_per_element()).div_ceil(32);
    let scale_values = q.scale_values(block_size, head_dim);
    // Padded so the head block is whole u64s (the lane kernels read the pool as u64).
    let scale_words = if scale_values == 0 {
        0
    } else {
        (data_words + scale_values.div_ceil(2)).next_multiple_of(2) - data_words
    };
    HeadBlockLayout { data_words, scale_words, total_words: data_words + scale_words }
}

/// How layers of different KV head shapes (`(kv_heads, head_dim)`: Gemma 4's sliding and
/// global layers) share the pool. Every layer slot's K (V) buffer has one block size, that of
/// the widest shape (most K + V words a block), so a block id means the same bytes whichever
/// KV-cache group owns it and one block pool serves them all (the layer slots of
/// `kv::KvGroups`). A narrower shape addresses the block in its own head blocks and leaves the
/// rest unused: returns, per shape, the head blocks a pool block has room for ("pool heads",
/// `kernels::rope::QkvLayout::pool_heads`): the widest's `kv_heads` for it, and for another
/// `widest K block words / its K head block words`, which must be whole and give V's block
/// too. f16 always divides for power-of-two head sizes; a quantized format whose scales do not
/// grow with head_dim (per-token) may not, and is refused. With one shape: its `kv_heads`.
/// `values_in_keys` (MLA): V blocks of 0 words. O(shapes).
pub fn pool_heads(
    spec: &KvCacheSpec,
    block_size: usize,
    shapes: &[(usize, usize)],
    values_in_keys: bool,
) -> Result<Vec<usize>, KvQuantError> {
    if let [(kvh, _)] = shapes {
        return Ok(vec![*kvh]);
    }
    let words = |q: KvQuant, hd: usize| head_block_words(q, block_size, hd).total_words;
    let v_words = |hd: usize| if values_in_keys { 0 } else { words(spec.v, hd) };
    let block = |&(kvh, hd): &(usize, usize)| (kvh * words(spec.k, hd), kvh * v_words(hd));
    let Some(widest) = shapes.iter().copied().max_by_key(|s| {
        let (k, v) = block(s);
        k + v
    }) else {
        return Ok(Vec::new());
    };
    let (k_block, v_block) = block(&widest);
    shapes
        .iter()
        .map(|&(kvh, hd)| {
            let (k_hb, v_hb) = (words(spec.k, hd), v_words(hd));
            // 0-word head blocks (a 0 block size, refused elsewhere) divide nothing
            let heads = k_block.checked_div(k_hb).unwrap_or(0);
            if heads > 0 && heads * k_hb == k_block && heads * v_hb == v_block && heads >= kvh {
                Ok(heads)
            } else {
                Err(KvQuantError::MixedHeadShapes {
                    format: spec.format(),
                    narrow: (kvh, hd),
                    wide: widest,
                })
            }
        })
        .collect()
}

/// The whole KV-cache storage choice: K's and V's [`KvQuant`] and the Hadamard rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize)]
pub struct KvCacheSpec {
    pub k: KvQuant,
    pub v: KvQuant,
    /// Rotate K, Q and V by the orthonormal Hadamard matrix over `head_dim` before quantizing
    /// (`--kv-rotate`). Allowed with f16 too, where it only costs time: a control that separates
    /// the rotation's own rounding from the quantization error.
    pub rotate: bool,
}

impl Default for KvQuant {
    fn default() -> Self {
        KvQuant::F16
    }
}

impl KvCacheSpec {
    /// Resolves the CLI flags. `k_scale`/`v_scale` default to per-channel K and per-token V for
    /// the quantized formats; with f16 they must be absent (f16 stores no scales). Errors name
    /// the flag to change (see [`KvQuant::new`] for the refused pairs). The model's `head_dim`
    /// is checked later by [`KvCacheSpec::check_head_dim`].
    pub fn new(
        format: KvFormat,
        k_scale: Option<ScaleGranularity>,
        v_scale: Option<ScaleGranularity>,
        rotate: bool,
    ) -> Result<Self, KvQuantError> {
        let resolve = |part, given: Option<ScaleGranularity>, default| match (format, given) {
            (KvFormat::F16, None) => Ok(KvQuant::F16),
            (KvFormat::F16, Some(granularity)) => {
                Err(KvQuantError::ScaleWithF16 { part, granularity })
            }
            (_, given) => KvQuant::new(part, format, given.unwrap_or(default)),
        };
        Ok(KvCacheSpec {
            k: resolve(KvPart::K, k_scale, ScaleGranularity::PerChannel)?,
            v: resolve(KvPart::V, v_scale, ScaleGranularity::PerToken)?,
            rotate,
        })
    }

    /// The `--kv-cache-dtype` (K and V always share it).
    pub const fn format(&self) -> KvFormat {
        self.k.format
    }

    /// Checks the model's `head_dim` against this spec: token rows must fill whole u32 words
    /// (even for f16, a multiple of 8 for quantized formats), and rotation needs a power of two.
    pub fn check_head_dim(&self, head_dim: usize) -> Result<(), KvQuantError> {
        let format = self.format();
        let multiple = if format.is_quantized() { 8 } else { 2 };
        if head_dim == 0 || !head_dim.is_multiple_of(multiple) {
            return Err(KvQuantError::HeadDim { head_dim, format, multiple });
        }
        if self.rotate {
            super::hadamard::check_rotation_dim(head_dim)?;
        }
        Ok(())
    }
}

impl fmt::Display for KvFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for ScaleGranularity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `f16`, `int8 (K per-channel, V per-token)`, `fp8-e4m3 (K per-tensor, V per-tensor) rotated`.
impl fmt::Display for KvCacheSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.format())?;
        if self.format().is_quantized() {
            write!(f, " (K {}, V {})", self.k.granularity, self.v.granularity)?;
        }
        if self.rotate {
            f.write_str(" rotated")?;
        }
        Ok(())
    }
}

/// Names joined by ", " (for "supported:" lists in errors).
fn names(list: impl IntoIterator<Item = &'static str>) -> String {
    list.into_iter().collect::<Vec<_>>().join(", ")
}

impl std::str::FromStr for KvFormat {
    type Err = KvQuantError;

    /// Parses a `--kv-cache-dtype` value, case-insensitively.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let found = KvFormat::ALL.into_iter().find(|x| x.name().eq_ignore_ascii_case(s.trim()));
        found.ok_or_else(|| KvQuantError::UnknownFormat { input: s.to_owned() })
    }
}

impl std::str::FromStr for ScaleGranularity {
    type Err = KvQuantError;

    /// Parses a `--kv-k-scale` / `--kv-v-scale` value, case-insensitively.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let found =
            ScaleGranularity::ALL.into_iter().find(|x| x.name().eq_ignore_ascii_case(s.trim()));
        found.ok_or_else(|| KvQuantError::UnknownGranularity { input: s.to_owned() })
    }
}

impl serde::Serialize for KvFormat {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl serde::Serialize for ScaleGranularity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// Refused KV-cache settings; each message names the flag to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvQuantError {
    #[error(
        "unknown --kv-cache-dtype {input:?}; supported: {}",
        names(KvFormat::ALL.map(KvFormat::name))
    )]
    UnknownFormat { input: String },

    #[error(
        "unknown KV scale granularity {input:?} (--kv-k-scale/--kv-v-scale); supported: {}",
        names(ScaleGranularity::ALL.map(ScaleGranularity::name))
    )]
    UnknownGranularity { input: String },

    #[error(
        "{flag} {granularity} needs a quantized --kv-cache-dtype (fp8-e4m3, fp8-e5m2, int8, \
         int4); f16 stores no scales: drop {flag} or choose a quantized dtype",
        flag = part.scale_flag()
    )]
    ScaleWithF16 { part: KvPart, granularity: ScaleGranularity },

    #[error(
        "{flag} per-tensor is not available with --kv-cache-dtype {format}: it needs a \
         calibrated static scale, which kvrun does not have; use {flag} per-token or per-channel \
         (or per-head), or an fp8 dtype, where per-tensor means a fixed scale of 1.0",
        flag = part.scale_flag()
    )]
    PerTensorNeedsCalibration { part: KvPart, format: KvFormat },

    #[error(
        "--kv-cache-dtype {format} needs head_dim to be a multiple of {multiple} (whole u32 words \
         per token), but this model's head_dim is {head_dim}{}",
        if format.is_quantized() { "; use --kv-cache-dtype f16" } else { "" }
    )]
    HeadDim { head_dim: usize, format: KvFormat, multiple: usize },

    #[error(
        "--kv-rotate needs a power-of-two head_dim (a Hadamard matrix of that size), but this \
         model's head_dim is {head_dim}; drop --kv-rotate"
    )]
    RotateNeedsPowerOfTwo { head_dim: usize },

    #[error(
        "--kv-cache-dtype {format} with these --kv-k-scale/--kv-v-scale cannot share pool blocks \
         between this model's layers of {} KV heads × {} channels and of {} × {}: a block sized \
         for the wider is not a whole number of the narrower's head blocks; use --kv-cache-dtype \
         f16, or per-channel scales for K and V",
        narrow.0, narrow.1, wide.0, wide.1
    )]
    MixedHeadShapes { format: KvFormat, narrow: (usize, usize), wide: (usize, usize) },
}
