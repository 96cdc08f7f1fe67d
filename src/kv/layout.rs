//! [`KvLayout`]: how many bytes the KV cache of one token, one block and one budget take, as plain
//! functions of the model shape (DESIGN.md, "The KV cache: numbers every room agrees on").
//!
//! ```text
//! bytes_per_vector          = ceil(head_dim × bits_per_element / 8) + scale bytes per vector
//! bytes_per_token_per_layer = 2 (K and V) × num_kv_heads × bytes_per_vector
//! bytes_per_token           = num_layers × bytes_per_token_per_layer
//! bytes_per_block           = block_size × bytes_per_token
//! ```
//! For f16 this is the familiar `2 × layers × kv_heads × head_dim × 2`.

use super::error::{KvError, LayoutDim, SupportedDtypes};

/// Storage format of K and V in the block pool.
///
/// Only f16 exists today. Quantized formats (fp8, int8, int4 with scales) slot in as new variants:
/// they only have to answer [`KvDtype::bits_per_element`] and [`KvDtype::scale_bytes_per_vector`],
/// and every figure in [`KvLayout`] follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum KvDtype {
    /// IEEE half precision, no scales.
    #[serde(rename = "f16")]
    F16,
}

impl KvDtype {
    /// Every variant, in CLI order.
    pub const ALL: [KvDtype; 1] = [KvDtype::F16];

    /// The name users type after `--kv-cache-dtype` and the value of the `kv_cache_dtype` JSON key.
    pub const fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
        }
    }

    /// Bits one stored element takes. Bits, not bytes, because int4 packs two elements a byte.
    pub const fn bits_per_element(self) -> u64 {
        match self {
            KvDtype::F16 => 16,
        }
    }

    /// Scale (and zero-point) bytes stored next to each head vector of `head_dim` elements, i.e. per
    /// token, per layer, per KV head, for K and for V separately. Zero for unscaled formats.
    pub const fn scale_bytes_per_vector(self, _head_dim: u64) -> u64 {
        match self {
            KvDtype::F16 => 0,
        }
    }

    /// Bytes of one head vector (`[head_dim]` elements plus its scales), rounded up to whole bytes.
    pub const fn bytes_per_vector(self, head_dim: u64) -> u64 {
        (head_dim * self.bits_per_element()).div_ceil(8) + self.scale_bytes_per_vector(head_dim)
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvDtype {
    type Err = KvError;

    /// Parses a `--kv-cache-dtype` value, case-insensitively.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KvDtype::ALL
            .into_iter()
            .find(|dtype| dtype.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| KvError::UnknownDtype {
                input: s.to_owned(),
                supported: SupportedDtypes,
            })
    }
}

/// Shape of the KV cache of one model: the only input of every byte figure.
///
/// Build it with [`KvLayout::new`], which checks the ranges the arithmetic below relies on
/// (non-zero dimensions, `block_size` in `1..=1024`, a block's bytes fit in `u64`). The fields are
/// public for reading; a hand-built layout that skips `new` may divide by zero or overflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvLayout {
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Tokens per block (default 16; any value in `1..=1024`, a power of two is not required).
    pub block_size: usize,
    pub dtype: KvDtype,
}

/// Largest accepted `--block-size`.
pub const MAX_BLOCK_SIZE: usize = 1024;

impl KvLayout {
    /// Checks and builds a layout. O(1).
    pub fn new(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Result<Self, KvError> {
        for (value, dim) in [
            (num_layers, LayoutDim::NumLayers),
            (num_kv_heads, LayoutDim::NumKvHeads),
            (head_dim, LayoutDim::HeadDim),
        ] {
            if value == 0 {
                return Err(KvError::ZeroDim { dim });
            }
        }
        if !(1..=MAX_BLOCK_SIZE).contains(&block_size) {
            return Err(KvError::BlockSize { block_size });
        }
        let layout = KvLayout { num_layers, num_kv_heads, head_dim, block_size, dtype };
        // Every figure below is at most bytes_per_block, so checking it once makes them all safe.
        let block_bytes = u128::from(dtype.bytes_per_vector(head_dim as u64))
            .checked_mul(2 * num_kv_heads as u128)
            .and_then(|b| b.checked_mul(num_layers as u128))
            .and_then(|b| b.checked_mul(block_size as u128));
        match block_bytes {
            Some(b) if b <= u128::from(u64::MAX) => Ok(layout),
            _ => Err(KvError::LayoutTooLarge { block_size }),
        }
    }

    /// K and V bytes of one token in one layer: `2 × num_kv_heads × bytes_per_vector(head_dim)`.
    pub fn bytes_per_token_per_layer(&self) -> u64 {
        2 * self.num_kv_heads as u64 * self.dtype.bytes_per_vector(self.head_dim as u64)
    }

    /// K and V bytes of one token in every layer: `num_layers × bytes_per_token_per_layer`.
    pub fn bytes_per_token(&self) -> u64 {
        self.num_layers as u64 * self.bytes_per_token_per_layer()
    }

    /// Bytes of one block: `block_size × bytes_per_token`.
    pub fn bytes_per_block(&self) -> u64 {
        self.block_size as u64 * self.bytes_per_token()
    }

    /// Blocks that hold `tokens` tokens: `ceil(tokens / block_size)`.
    pub fn blocks_for_tokens(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Whole blocks that fit in `budget_bytes`: `floor(budget / bytes_per_block)` (saturates at
    /// `usize::MAX` on targets where it would not fit).
    pub fn blocks_for_budget(&self, budget_bytes: u64) -> usize {
        usize::try_from(budget_bytes / self.bytes_per_block()).unwrap_or(usize::MAX)
    }

    /// Tokens that fit in `budget_bytes`, counting whole blocks only:
    /// `blocks_for_budget × block_size` (saturating).
    pub fn tokens_for_budget(&self, budget_bytes: u64) -> usize {
        self.blocks_for_budget(budget_bytes).saturating_mul(self.block_size)
    }

    /// Like [`KvLayout::blocks_for_budget`], but a budget below one block is an error naming the
    /// smallest budget that works. O(1).
    pub fn require_blocks_for_budget(&self, budget_bytes: u64) -> Result<usize, KvError> {
        match self.blocks_for_budget(budget_bytes) {
            0 => Err(KvError::BudgetTooSmall {
                budget: budget_bytes,
                bytes_per_block: self.bytes_per_block(),
            }),
            n => Ok(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1 << 10;
    const GIB: u64 = 1 << 30;

    fn f16(layers: usize, kv_heads: usize, head_dim: usize) -> KvLayout {
        KvLayout::new(layers, kv_heads, head_dim, 16, KvDtype::F16).unwrap()
    }

    #[test]
    fn llama2_7b_figures() {
        let l = f16(32, 32, 128);
        assert_eq!(l.bytes_per_token(), 512 * KIB);
        assert_eq!(l.bytes_per_token_per_layer(), 16 * KIB);
        assert_eq!(l.bytes_per_block(), 16 * 512 * KIB);
        assert_eq!(4096 * l.bytes_per_token(), 2 * GIB);
        assert_eq!(8 * 4096 * l.bytes_per_token(), 16 * GIB);
        assert_eq!(l.blocks_for_tokens(4096), 256);
        assert_eq!(l.tokens_for_budget(2 * GIB), 4096);
    }

    #[test]
    fn gqa_mqa_and_real_models() {
        assert_eq!(f16(32, 8, 128).bytes_per_token(), 128 * KIB); // GQA, Llama-3-8B, Mistral-7B
        assert_eq!(f16(32, 8, 128).bytes_per_token(), 131_072);
        assert_eq!(f16(32, 1, 128).bytes_per_token(), 16 * KIB); // MQA
        assert_eq!(f16(30, 3, 64).bytes_per_token(), 23_040); // SmolLM2-135M: 22.5 KiB
    }

    #[test]
    fn block_rounding() {
        let l = KvLayout::new(30, 3, 64, 16, KvDtype::F16).unwrap();
        assert_eq!(l.blocks_for_tokens(0), 0);
        assert_eq!(l.blocks_for_tokens(1), 1);
        assert_eq!(l.blocks_for_tokens(16), 1);
        assert_eq!(l.blocks_for_tokens(17), 2);
        let block = l.bytes_per_block();
        assert_eq!(l.blocks_for_budget(block - 1), 0);
        assert_eq!(l.blocks_for_budget(3 * block + block / 2), 3);
        assert_eq!(l.tokens_for_budget(3 * block + block / 2), 48);
        assert_eq!(l.require_blocks_for_budget(2 * block), Ok(2));
        let err = l.require_blocks_for_budget(1000).unwrap_err();
        assert_eq!(err, KvError::BudgetTooSmall { budget: 1000, bytes_per_block: 368_640 });
        assert!(err.to_string().contains("raise it to at least 368640"));
    }

    #[test]
    fn odd_block_sizes() {
        for block_size in [1, 3, 7, 1000, 1024] {
            let l = KvLayout::new(2, 1, 4, block_size, KvDtype::F16).unwrap();
            assert_eq!(l.bytes_per_block(), block_size as u64 * 32);
            assert_eq!(l.blocks_for_tokens(block_size + 1), 2);
        }
    }

    #[test]
    fn rejects_bad_shapes() {
        let dims = [(0, 1, 1), (1, 0, 1), (1, 1, 0)];
        let want = [LayoutDim::NumLayers, LayoutDim::NumKvHeads, LayoutDim::HeadDim];
        for ((l, h, d), dim) in dims.into_iter().zip(want) {
            let err = KvLayout::new(l, h, d, 16, KvDtype::F16).unwrap_err();
            assert_eq!(err, KvError::ZeroDim { dim });
        }
        for block_size in [0, 1025] {
            let err = KvLayout::new(1, 1, 1, block_size, KvDtype::F16).unwrap_err();
            assert_eq!(err, KvError::BlockSize { block_size });
        }
        let err = KvLayout::new(usize::MAX, 1 << 20, 1 << 20, 1024, KvDtype::F16).unwrap_err();
        assert_eq!(err, KvError::LayoutTooLarge { block_size: 1024 });
    }

    #[test]
    fn dtype_names() {
        assert_eq!("F16".parse::<KvDtype>(), Ok(KvDtype::F16));
        assert_eq!(KvDtype::F16.to_string(), "f16");
        let err = "fp8".parse::<KvDtype>().unwrap_err();
        assert_eq!(err.to_string(), "unknown --kv-cache-dtype \"fp8\"; supported: f16");
        assert_eq!(KvDtype::F16.bytes_per_vector(64), 128);
    }
}
