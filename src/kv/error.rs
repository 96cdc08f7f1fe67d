//! [`KvError`]: every way KV bookkeeping can refuse a request, each message naming the fix.

use super::SeqId;

/// A dimension of [`super::KvLayout`] that must be non-zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutDim {
    NumLayers,
    NumKvHeads,
    HeadDim,
    /// Bytes of a K or V head block ([`super::HeadBlockStorage::bytes`]).
    HeadBlockBytes,
}

impl std::fmt::Display for LayoutDim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LayoutDim::NumLayers => "num_layers",
            LayoutDim::NumKvHeads => "num_kv_heads",
            LayoutDim::HeadDim => "head_dim",
            LayoutDim::HeadBlockBytes => "the bytes of a KV head block",
        })
    }
}

/// What is wrong with a byte-size string given to [`super::parse_bytes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByteSizeProblem {
    /// Nothing but whitespace.
    Empty,
    /// The number part is missing or malformed (e.g. `GiB`, `1.2.3GB`, `-4GB`).
    BadNumber,
    /// The unit is not one of B, kB/KB, MB, GB, TB, KiB, MiB, GiB, TiB.
    UnknownUnit,
    /// A bare `K`, `M`, `G` or `T`: decimal or binary is not clear.
    AmbiguousUnit,
    /// The value does not fit in 64 bits.
    TooLarge,
}

impl std::fmt::Display for ByteSizeProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ByteSizeProblem::Empty => "it is empty",
            ByteSizeProblem::BadNumber => "expected a non-negative number such as 6, 1.5 or 512",
            ByteSizeProblem::UnknownUnit => {
                "unknown unit; use B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"
            }
            ByteSizeProblem::AmbiguousUnit => {
                "a bare K/M/G/T is ambiguous; write e.g. GB (10^9 bytes) or GiB (2^30 bytes)"
            }
            ByteSizeProblem::TooLarge => "it does not fit in 64 bits",
        })
    }
}

/// Errors of the KV bookkeeping. Messages are written for the person running `kvrun` and say
/// which flag to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error(
        "prefix caching needs at least one full-attention layer, and every layer of this model \
         uses a sliding window shorter than the context; run without --enable-prefix-caching \
         (or with --no-prefix-cache)"
    )]
    PrefixCacheWithSlidingWindow,

    #[error(
        "tenant KV quotas do not support prefix caching on this model's sliding-window layers \
         yet; drop --tenant-kv-quota or run with --no-prefix-cache"
    )]
    QuotaWithSlidingWindow,

    #[error("--kv-offloading-size cannot be used here: {0}; run without it")]
    HostTierUnsupported(&'static str),

    #[error("{dim} must be at least 1 (got 0); check the model's config")]
    ZeroDim { dim: LayoutDim },

    #[error("--block-size {block_size} is out of range; use 1..=1024 (default 16)")]
    BlockSize { block_size: usize },

    #[error(
        "a KV block of {block_size} tokens of this model does not fit in 64 bits; lower --block-size"
    )]
    LayoutTooLarge { block_size: usize },

    #[error(
        "--kv-cache-memory {budget} holds no block of {bytes_per_block} bytes \
         (block_size × bytes_per_token); raise it to at least {bytes_per_block}"
    )]
    BudgetTooSmall { budget: u64, bytes_per_block: u64 },

    #[error(
        "{num_blocks} KV blocks of {block_size} tokens exceed the 2^32 slots a u32 slot mapping \
         addresses; lower --kv-cache-memory or --block-size"
    )]
    TooManySlots { num_blocks: usize, block_size: usize },

    #[error(
        "KV cache is full: need {needed} more blocks, {free} free; \
         raise --kv-cache-memory or lower --max-num-seqs / -c"
    )]
    OutOfBlocks { needed: usize, free: usize },

    #[error(
        "the tenant's KV quota of {quota_blocks} blocks is reached: need {needed} more blocks, \
         {room} claimable within the quota; raise its --tenant-kv-quota"
    )]
    OverQuota { needed: usize, room: usize, quota_blocks: usize },

    #[error(
        "a KV quota of {quota_blocks} blocks is invalid: it must hold one full-context sequence \
         ({min_blocks} blocks) and at most the whole pool ({num_blocks} blocks); change \
         --tenant-kv-quota, -c or --kv-cache-memory"
    )]
    BadQuota { quota_blocks: usize, min_blocks: usize, num_blocks: usize },

    #[error("{what} must be at least 1 (got 0)")]
    ZeroPlanInput { what: PlanField },

    #[error(
        "sequence {0} is already in the KV cache (internal error: sequence ids must be unique)"
    )]
    SequenceExists(SeqId),

    #[error(
        "sequence {0} is not in the KV cache (internal error: add it before use, free it once)"
    )]
    UnknownSequence(SeqId),

    #[error("invalid byte size {input:?}: {problem}")]
    ByteSize { input: String, problem: ByteSizeProblem },
}

/// A plan input that must be non-zero, named by its CLI flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanField {
    MaxModelLen,
    MaxNumSeqs,
    MaxNumBatchedTokens,
}

impl std::fmt::Display for PlanField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PlanField::MaxModelLen => "-c/--max-model-len",
            PlanField::MaxNumSeqs => "--max-num-seqs",
            PlanField::MaxNumBatchedTokens => "--max-num-batched-tokens",
        })
    }
}
