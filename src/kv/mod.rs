//! Host-side KV cache bookkeeping: which block holds which token of which sequence, and what it
//! all costs in bytes. No GPU types and no imports from other rooms; tested on the CPU alone.
//!
//! ## Map
//!
//! | file | concept |
//! |---|---|
//! | `layout.rs` | [`KvLayout`], [`KvStorage`]: bytes per block / token / budget and f16 staging, from the model shape and the bytes of a head block |
//! | `plan.rs` | [`plan()`]: the arithmetic `kvrun plan` prints ([`Plan`], stable JSON keys) |
//! | `bytes.rs` | [`parse_bytes`] (`6GiB`, `64MB`, `1.5GiB`) and [`format_bytes`] (`22.5 KiB`) |
//! | `block_pool.rs` | [`BlockPool`]: block ids `0..num_blocks`, FIFO free list, ref counts |
//! | `groups.rs` | [`KvGroups`]: layers grouped by attention kind ([`GroupKind`]: full, sliding window), one block table per group |
//! | `block_table.rs` | [`BlockTable`]: one sequence's blocks in token order; position → slot; blocks dropped out of a window |
//! | `prefix_cache.rs` | [`PrefixCache`]: radix tree over full blocks keyed by token ids (+ [`Namespace`]); lock, LRU evict |
//! | `prefix_cache_companions.rs` | other groups' blocks on each node (companions): usable length across a window, loose companions |
//! | `prefix_cache_snapshots.rs` | recurrent models: state snapshot slots owned by nodes; a prefix is usable where one ends it |
//! | `manager.rs` | [`KvManager`]: the pool plus a table per live sequence; the scheduler's door |
//! | `manager_integrity.rs` | [`KvManager::check_integrity`]: every invariant, the first violation named |
//! | `host_tier.rs` | [`HostTier`]: host-RAM slots under the pool, keyed by [`BlockKey`] (a SHA-256 token chain); LRU; [`KvMoves`] |
//! | `manager_tier.rs` | the manager's host tier: evicted blocks written back, hits brought back at admission |
//! | `manager_snapshots.rs` | recurrent models: which step writes a snapshot where, restore on a hit |
//! | `quota.rs` | tenant KV quotas on the manager: blocks held per namespace, own-first eviction |
//! | `error.rs` | [`KvError`]: every refusal, with the flag to change |
//!
//! ## Numbers (DESIGN.md, normative)
//!
//! ```text
//! head block      = block_size tokens × head_dim channels of one KV head, K or V, one layer
//!                   (the unit of KV quantization; its bytes include its scales)
//! bytes_per_block = num_layers × num_kv_heads × (K head block + V head block bytes)
//!                   (num_layers = the layer slots of one group's block, `KvGroups`)
//! bytes_per_token = bytes_per_block / block_size
//!                 = 2 (K, V) × num_layers × num_kv_heads × head_dim × 2 for f16
//! blocks(tokens)  = ceil(tokens / block_size)
//! blocks(budget)  = floor(budget / bytes_per_block)          whole blocks only
//! slot(pos)       = table[pos / block_size] × block_size + pos % block_size   (u32)
//! ```
//! Llama-2-7B (32 layers, 32 KV heads, head_dim 128, f16): 512 KiB a token, 2 GiB for 4096 tokens.
//!
//! ## Ownership
//!
//! Every block in a table holds one reference in the pool. [`KvManager::fork_sequence`] shares a
//! sequence's *full* blocks (ref count + 1); the partial last block is never shared, so shared
//! blocks are never written. A block returns to the free list when its last holder frees it.
//! All growing operations are all-or-nothing: on [`KvError::OutOfBlocks`] nothing changed.
//!
//! With the prefix cache on ([`KvManager::with_prefix_cache`]) the [`PrefixCache`] is one more
//! holder: it keeps a reference on each full, computed block a sequence gives it (eagerly, after
//! the step that filled it), sequences lock the cached path they read, and unlocked cached blocks
//! are evicted least recently used first, only when an allocation would otherwise fail. Free +
//! evictable blocks are what admission may count on. With several groups the tree is keyed by
//! the first full group's blocks and each node carries the other groups' blocks (companions); a
//! sliding companion out of every window stays cached and is evictable once only the tree holds
//! it (see `prefix_cache.rs`).

mod block_pool;
mod block_table;
mod bytes;
mod error;
mod groups;
mod host_tier;
#[cfg(test)]
mod host_tier_proptests;
mod layout;
mod manager;
#[cfg(test)]
mod manager_cache_tests;
#[cfg(test)]
mod manager_groups_tests;
#[cfg(test)]
mod manager_snapshot_tests;
mod plan;
mod prefix_cache;
#[cfg(test)]
mod prefix_cache_proptests;
#[cfg(test)]
mod proptests;
mod quota;

pub use block_pool::{BlockId, BlockPool};
pub use block_table::{BlockTable, NULL_BLOCK};
pub use bytes::{format_bytes, parse_bytes};
pub use error::{ByteSizeProblem, KvError, LayoutDim, PlanField};
pub use groups::{GroupKind, KvGroup, KvGroups, PlannedContext};
pub use host_tier::{BlockKey, HostSlot, HostTier, HostTierStats, KvMoves};
pub use layout::{HeadBlockStorage, KvLayout, KvStorage, MAX_BLOCK_SIZE};
pub use manager::{KvManager, KvStats, SeqId, SnapshotTarget};
pub use plan::{plan, staging_bytes_per_sequence, Plan, PlanHeads, PlanInput};
pub use prefix_cache::{Namespace, PrefixCache};
pub use quota::TenantKvStats;
