//! [`KvLayout`]: how many bytes the KV cache of one token, one block and one budget take, as plain
//! functions of the model shape and of what one *head block* costs ([`KvStorage`]) (DESIGN.md,
//! "The KV cache: numbers every room agrees on").
//!
//! A head block is `block_size` tokens × `head_dim` channels of one KV head, of K or of V, in one
//! layer: the unit the KV formats quantize, with its scales stored next to it. kv/ knows no
//! formats: the engine computes a head block's bytes (`quant::head_block_words`) and hands them
//! over in [`KvStorage`].
//!
//! ```text
//! bytes_per_block   = num_layers × num_kv_heads × (k_head_block_bytes + v_head_block_bytes)
//! bytes_per_token   = bytes_per_block / block_size          (a ratio; may be fractional)
//! staging_per_seq   = num_layers × num_kv_heads × block_size × head_dim × 2 × (K staged + V staged)
//! ```
//! For f16 a head block is `block_size × head_dim × 2` bytes, so bytes_per_token is the familiar
//! `2 × layers × kv_heads × head_dim × 2`. Budgets use whole blocks and integer bytes only.
//! MLA caches one latent row per token and layer whose first channels are also the values
//! (`engine::model_kv_storage`): one "KV head" of `kv_lora_rank + qk_rope_head_dim`
//! and a V head block of 0 bytes, so `bytes_per_token = layers × latent width × 2`.

use super::error::{KvError, LayoutDim};

/// How one head block of K (or of V) is stored, as far as kv/ needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeadBlockStorage {
    /// Pool bytes of one head block: data + scales (`4 × quant::head_block_words().total_words`).
    pub bytes: u64,
    /// Whether the partial last block of a running sequence waits in an f16 staging area until
    /// it is full (per-channel and per-head scales; `quant::needs_staging`).
    pub staged: bool,
    /// The scale granularity's name, for reports: `"per-channel"` …, `"none"` for f16.
    pub scale_name: &'static str,
}

/// How K and V are stored: the figures [`KvLayout`] needs, for one `(block_size, head_dim)`.
/// Built by the engine from a `quant::KvCacheSpec` (`engine::kv_storage`), or [`KvStorage::f16`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvStorage {
    /// The `--kv-cache-dtype` name, for reports (`"f16"`, `"int8"` …).
    pub dtype_name: &'static str,
    pub k: HeadBlockStorage,
    pub v: HeadBlockStorage,
}

impl KvStorage {
    /// Unquantized f16 (the default): 2 bytes an element, no scales, no staging.
    pub const fn f16(block_size: usize, head_dim: usize) -> Self {
        let elements = (block_size as u64).saturating_mul(head_dim as u64);
        let head_block = HeadBlockStorage {
            bytes: elements.saturating_mul(2), // saturates into KvError::LayoutTooLarge
            staged: false,
            scale_name: "none",
        };
        KvStorage { dtype_name: "f16", k: head_block, v: head_block }
    }

    /// This storage for keys whose first channels are also the values (MLA's latent
    /// `[c_kv ; k_pe]`): the same K head block, a V head block of 0 bytes (its staging, scale
    /// name and dtype kept: the staged f16 rows still have a V half).
    pub const fn values_in_keys(self) -> Self {
        KvStorage { v: HeadBlockStorage { bytes: 0, ..self.v }, ..self }
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
    /// Bytes of a K and a V head block of this `block_size` and `head_dim`.
    pub storage: KvStorage,
}

/// Largest accepted `--block-size`.
pub const MAX_BLOCK_SIZE: usize = 1024;

impl KvLayout {
    /// Checks and builds a layout. O(1). `storage` must describe head blocks of this
    /// `block_size` and `head_dim` (kv/ cannot check that; it checks that they are not empty).
    pub fn new(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        storage: KvStorage,
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
        if storage.k.bytes == 0 {
            return Err(KvError::ZeroDim { dim: LayoutDim::HeadBlockBytes });
        }
        let layout = KvLayout { num_layers, num_kv_heads, head_dim, block_size, storage };
        // Every figure below is at most one of these two, so checking them makes them all safe.
        let heads = num_layers as u128 * num_kv_heads as u128;
        let head_block_bytes = u128::from(storage.k.bytes) + u128::from(storage.v.bytes);
        let staging_bytes = (4 * block_size as u128).checked_mul(head_dim as u128);
        let largest = staging_bytes
            .map(|staging| staging.max(head_block_bytes))
            .and_then(|bytes| bytes.checked_mul(heads));
        match largest {
            Some(bytes) if bytes <= u128::from(u64::MAX) => Ok(layout),
            _ => Err(KvError::LayoutTooLarge { block_size }),
        }
    }

    /// An f16 layout ([`KvStorage::f16`]), today's default. O(1).
    pub fn f16(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
    ) -> Result<Self, KvError> {
        let storage = KvStorage::f16(block_size, head_dim);
        KvLayout::new(num_layers, num_kv_heads, head_dim, block_size, storage)
    }

    /// Bytes of one block, data and scales, K and V, every layer and KV head:
    /// `num_layers × num_kv_heads × (k.bytes + v.bytes)`. Exact.
    pub fn bytes_per_block(&self) -> u64 {
        let head_blocks = self.num_layers as u64 * self.num_kv_heads as u64;
        head_blocks * (self.storage.k.bytes + self.storage.v.bytes)
    }

    /// Bytes a token costs on average: `bytes_per_block / block_size`. For display: with
    /// per-block scales it need not be a whole number; budgets use [`Self::bytes_per_block`].
    pub fn bytes_per_token(&self) -> f64 {
        self.bytes_per_block() as f64 / self.block_size as f64
    }

    /// f16 staging a running sequence needs besides its pool blocks: one block of K and/or V
    /// (those whose granularity is staged), every layer and KV head:
    /// `num_layers × num_kv_heads × block_size × head_dim × 2 × (k.staged + v.staged)`. 0 when
    /// nothing is staged.
    pub fn staging_bytes_per_sequence(&self) -> u64 {
        let staged = u64::from(self.storage.k.staged) + u64::from(self.storage.v.staged);
        let f16_head_block = 2 * self.block_size as u64 * self.head_dim as u64;
        self.num_layers as u64 * self.num_kv_heads as u64 * f16_head_block * staged
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
        KvLayout::f16(layers, kv_heads, head_dim, 16).unwrap()
    }

    #[test]
    fn llama2_7b_figures() {
        let l = f16(32, 32, 128);
        assert_eq!(l.bytes_per_token(), (512 * KIB) as f64);
        assert_eq!(l.bytes_per_block(), 16 * 512 * KIB);
        assert_eq!(4096 / 16 * l.bytes_per_block(), 2 * GIB);
        assert_eq!(8 * 4096 / 16 * l.bytes_per_block(), 16 * GIB);
        assert_eq!(l.blocks_for_tokens(4096), 256);
        assert_eq!(l.tokens_for_budget(2 * GIB), 4096);
        assert_eq!(l.staging_bytes_per_sequence(), 0);
    }

    #[test]
    fn gqa_mqa_and_real_models() {
        assert_eq!(f16(32, 8, 128).bytes_per_token(), (128 * KIB) as f64); // GQA, Llama-3-8B
        assert_eq!(f16(32, 8, 128).bytes_per_token(), 131_072.0);
        assert_eq!(f16(32, 1, 128).bytes_per_token(), (16 * KIB) as f64); // MQA
        assert_eq!(f16(30, 3, 64).bytes_per_token(), 23_040.0); // SmolLM2-135M: 22.5 KiB
    }

    /// SmolLM2-135M (30 layers, 3 KV heads, head_dim 64, block 16) with int8 K per-channel and
    /// V per-token, head-block bytes as quant computes them: K 16·64 + 64·2 = 1152,
    /// V 16·64 + 16·2 = 1056.
    #[test]
    fn quantized_storage_counts_scales_and_staging() {
        let storage = KvStorage {
            dtype_name: "int8",
            k: HeadBlockStorage { bytes: 1152, staged: true, scale_name: "per-channel" },
            v: HeadBlockStorage { bytes: 1056, staged: false, scale_name: "per-token" },
        };
        let l = KvLayout::new(30, 3, 64, 16, storage).unwrap();
        assert_eq!(l.bytes_per_block(), 30 * 3 * 2208);
        assert_eq!(l.bytes_per_block(), 198_720);
        assert_eq!(l.bytes_per_token(), 12_420.0);
        assert_eq!(l.staging_bytes_per_sequence(), 30 * 3 * 16 * 64 * 2);
        assert_eq!(l.blocks_for_budget(1 << 30), (1 << 30) / 198_720);
        // A per-head scale in a block of 3 tokens: bytes per token is not whole.
        let odd = KvStorage {
            dtype_name: "int8",
            k: HeadBlockStorage { bytes: 3 * 8 + 4, staged: true, scale_name: "per-head" },
            v: HeadBlockStorage { bytes: 3 * 8 + 8, staged: false, scale_name: "per-token" },
        };
        let l = KvLayout::new(1, 1, 8, 3, odd).unwrap();
        assert_eq!(l.bytes_per_block(), 60);
        assert_eq!(l.bytes_per_token(), 20.0);
        let l = KvLayout::new(1, 2, 8, 3, KvStorage { v: odd.k, ..odd }).unwrap();
        assert_eq!(l.bytes_per_block(), 112);
        assert!((l.bytes_per_token() - 112.0 / 3.0).abs() < 1e-12);
        assert_eq!(l.staging_bytes_per_sequence(), 2 * 2 * 3 * 8 * 2);
    }

    #[test]
    fn block_rounding() {
        let l = KvLayout::f16(30, 3, 64, 16).unwrap();
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
            let l = KvLayout::f16(2, 1, 4, block_size).unwrap();
            assert_eq!(l.bytes_per_block(), block_size as u64 * 32);
            assert_eq!(l.blocks_for_tokens(block_size + 1), 2);
        }
    }

    #[test]
    fn rejects_bad_shapes() {
        let dims = [(0, 1, 1), (1, 0, 1), (1, 1, 0)];
        let want = [LayoutDim::NumLayers, LayoutDim::NumKvHeads, LayoutDim::HeadDim];
        for ((l, h, d), dim) in dims.into_iter().zip(want) {
            let err = KvLayout::f16(l, h, d, 16).unwrap_err();
            assert_eq!(err, KvError::ZeroDim { dim });
        }
        for block_size in [0, 1025] {
            let err = KvLayout::f16(1, 1, 1, block_size).unwrap_err();
            assert_eq!(err, KvError::BlockSize { block_size });
        }
        let err = KvLayout::f16(usize::MAX, 1 << 20, 1 << 20, 1024).unwrap_err();
        assert_eq!(err, KvError::LayoutTooLarge { block_size: 1024 });
        let err = KvLayout::f16(usize::MAX, usize::MAX, usize::MAX, 1024).unwrap_err();
        assert_eq!(err, KvError::LayoutTooLarge { block_size: 1024 });
        let mut empty = KvStorage::f16(16, 64);
        empty.k.bytes = 0;
        let err = KvLayout::new(1, 1, 64, 16, empty).unwrap_err();
        assert_eq!(err, KvError::ZeroDim { dim: LayoutDim::HeadBlockBytes });
    }

    /// MLA: values inside the keys cost no V bytes; DeepSeek-V3's 61 layers of one 576-wide
    /// latent are 70,272 bytes a token.
    #[test]
    fn values_in_keys_cost_only_the_keys() {
        let s = KvStorage::f16(16, 576).values_in_keys();
        assert_eq!((s.k.bytes, s.v.bytes), (16 * 576 * 2, 0));
        let layout = KvLayout::new(61, 1, 576, 16, s).unwrap();
        assert_eq!(layout.bytes_per_token(), 70_272.0);
        assert_eq!(layout.staging_bytes_per_sequence(), 0);
    }

    #[test]
    fn f16_storage() {
        let s = KvStorage::f16(16, 64);
        assert_eq!(s.k.bytes, 2048);
        assert_eq!((s.dtype_name, s.k.scale_name, s.k.staged), ("f16", "none", false));
        assert_eq!(s.k, s.v);
    }
}
