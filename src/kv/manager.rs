//! [`KvManager`]: the block pool, the optional [`PrefixCache`] and one [`BlockTable`] per live
//! sequence. The scheduler's only door to KV memory: admit (`num_cached_tokens`, `can_begin`,
//! `begin_sequence`), grow (`reserve` → slot mapping, evicting cached blocks when short), share
//! (`cache_full_blocks`, `fork_sequence`) and finish (`release_sequence`).
//!
//! ## Ownership with the prefix cache
//!
//! Every block in a table holds one pool reference, and every cached block one more (the
//! tree's). A sequence locks the cached path it reads (its matched prefix, then every block it
//! caches), so each cached block a table holds is locked, and an unlocked cached block is held
//! by the tree alone: evicting it frees it. Hence free + evictable blocks are exactly the blocks
//! an allocation can get, and admission counts them both ([`KvManager::can_begin`]).
//!
//! **Eager caching**: a block enters the cache as soon as it is full and computed
//! ([`KvManager::cache_full_blocks`], called after each step), so concurrent sequences that share
//! a prompt start (a system prompt) reuse each other's blocks, not only finished ones'. If two
//! sequences computed the same block at once, the first to cache it wins and the other switches
//! to that copy, freeing its own; so a sequence's table always starts with exactly its locked
//! cached path. With the cache disabled none of this happens: no hits, and release frees a
//! sequence's blocks as before.
//!
//! ## KV-cache groups
//!
//! A model whose layers attend differently (sliding-window and full layers) has several
//! [`KvGroups`]; each live sequence holds one [`BlockTable`] per group, all over the one pool
//! and all with the same token count, so every figure below in blocks is per group × groups.
//! After each step [`KvManager::slide_windows`] drops the blocks of sliding groups that fall
//! wholly before the next query's window: a sliding table holds at most
//! [`GroupKind::max_live_blocks`] blocks however long the sequence grows.
//!
//! The prefix cache needs one full-attention group (the *anchor*, [`PrefixCache::anchor`]; an
//! all-sliding model gets [`KvError::PrefixCacheWithSlidingWindow`]). Its nodes carry the other
//! groups' blocks as companions. A hit of `k` blocks gives the new sequence the path in the
//! anchor and full tables, and in each sliding table [`NULL_BLOCK`] entries before the window
//! of its first query, then the window's cached companions (a prefix is usable only when those
//! are cached). Caching inserts every group's full computed blocks at once; a sliding block
//! that falls out of the window stays cached, and once only the tree holds it it is evictable
//! even though its node is locked (the cache's *loose* companions): the manager tells the cache
//! ([`PrefixCache::refresh`]) after each ref change of a cached block.

use std::collections::HashMap;

use super::block_pool::{BlockId, BlockPool};
use super::block_table::{BlockTable, NULL_BLOCK};
use super::error::KvError;
use super::groups::{GroupKind, KvGroups};
use super::host_tier::{HostTier, HostTierStats, KvMoves};
use super::layout::KvLayout;
use super::prefix_cache::{Namespace, PrefixCache};
use super::quota::Tenants;

/// Identifies a sequence (a request's running state) in the KV cache.
pub type SeqId = u64;

/// Counters and gauges of the KV cache, for metrics and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KvStats {
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Blocks in the free list.
    pub num_free_blocks: usize,
    /// Blocks in the prefix cache (locked or not), every group's (nodes and companions).
    pub num_cached_blocks: usize,
    /// Cached blocks no live sequence uses: free for the taking (unlocked nodes with their
    /// companions, and sliding companions only the tree holds).
    pub num_evictable_blocks: usize,
    /// Prompt tokens looked up by [`KvManager::begin_sequence`] (0 with the cache disabled).
    pub prefix_query_tokens: u64,
    /// Of those, tokens found in the cache.
    pub prefix_hit_tokens: u64,
    /// Cached blocks evicted to make room, ever.
    pub num_evicted_blocks: u64,
    /// Fraction of blocks held by live sequences, `0.0..=1.0` (see [`KvManager::usage`]).
    pub usage: f32,
    /// Recurrent models: state snapshot slots in all, and those holding a cached prefix's
    /// snapshot (the rest are free or being written).
    pub num_snapshot_slots: u32,
    pub num_snapshots: usize,
    /// Snapshots evicted to free a slot, ever.
    pub num_evicted_snapshots: u64,
    /// Of the hit tokens, those brought back from the host tier.
    pub host_hit_tokens: u64,
    /// The host tier's counters (all 0 without one).
    pub host: HostTierStats,
}

/// Where a step of a sequence writes its recurrent states' snapshot
/// ([`KvManager::snapshot_target`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotTarget {
    /// The snapshot slot written (`0..state_snapshots`).
    pub slot: u32,
    /// The position the snapshot is at: a block boundary, the states after token `pos − 1`.
    pub pos: usize,
    /// Kept when a newer one of the same sequence comes (a branch point, the prompt's last
    /// boundary); else only the sequence's newest such snapshot stays.
    keep: bool,
}

/// The KV state of one live sequence.
#[derive(Clone, Debug)]
pub(super) struct SeqKv {
    /// One table per group, the same token count in each. The cache fields below refer to the
    /// anchor group's table ([`PrefixCache::anchor`]).
    pub(super) tables: Vec<BlockTable>,
    pub(super) namespace: Namespace,
    /// Leading blocks of this sequence's token path that are in the prefix cache (matched at
    /// begin or cached since); `table` starts with exactly those nodes' blocks.
    pub(super) num_cached_blocks: usize,
    /// The deepest of them: this sequence holds one lock on the path root..=`locked`.
    locked: Option<BlockId>,
    /// The `next_pos` of the last [`KvManager::slide_windows`] (0 before any).
    slid_to: usize,
    /// Recurrent models: the snapshot slot the sequence's current step writes, until the step
    /// is cached ([`KvManager::cache_full_blocks`] gives it to its node).
    snapshot_target: Option<SnapshotTarget>,
    /// Its newest snapshot not kept `(node, slot)`: dropped when a newer one comes.
    newest_snapshot: Option<(BlockId, u32)>,
}

impl SeqKv {
    /// Recurrent states the sequence holds: its running state, and the snapshot slot its step
    /// writes, if any.
    pub(super) fn num_states(&self) -> usize {
        1 + usize::from(self.snapshot_target.is_some())
    }
}

/// KV bookkeeping of every live sequence, and the prefix cache if enabled. A block's ref count
/// equals the number of tables holding it, plus one if it is cached.
#[derive(Clone, Debug)]
pub struct KvManager {
    layout: KvLayout,
    groups: KvGroups,
    pub(super) pool: BlockPool,
    pub(super) seqs: HashMap<SeqId, SeqKv>,
    /// `None` = prefix caching disabled (`--no-prefix-cache`).
    pub(super) cache: Option<PrefixCache>,
    /// Tracked tenants: quotas and per-tenant counters (`quota.rs`).
    pub(super) tenants: Tenants,
    /// Recurrent models: one sequence's states (every recurrent layer's) in blocks, rounded
    /// up — what a running sequence and a snapshot count toward a tenant's quota; 0 without.
    pub(super) state_blocks: usize,
    /// Running-state slots (`max_num_seqs`; the snapshot slots are the cache's).
    pub(super) state_slots: usize,
    prefix_query_tokens: u64,
    prefix_hit_tokens: u64,
    pub(super) num_evicted_blocks: u64,
    /// The host tier under the pool (`--kv-offloading-size`, `manager_tier.rs`).
    pub(super) host: Option<HostTier>,
    /// The copies the steps planned since [`KvManager::take_moves`] need.
    pub(super) moves: KvMoves,
    /// Of the hit tokens, those brought back from the host tier.
    pub(super) host_hit_tokens: u64,
}

impl KvManager {
    /// A manager over `num_blocks` blocks of `layout.block_size` tokens, all free, without a
    /// prefix cache. O(num_blocks).
    ///
    /// Errors with [`KvError::TooManySlots`] if `num_blocks × block_size` exceeds 2^32 (slots are
    /// `u32`). Zero blocks is allowed: every reservation then fails with `OutOfBlocks`.
    pub fn new(layout: KvLayout, num_blocks: usize) -> Result<Self, KvError> {
        KvManager::with_prefix_cache(layout, num_blocks, false)
    }

    /// Like [`KvManager::new`], with a prefix cache when `enabled`.
    pub fn with_prefix_cache(
        layout: KvLayout,
        num_blocks: usize,
        enabled: bool,
    ) -> Result<Self, KvError> {
        let groups = KvGroups::uniform(layout.num_layers);
        KvManager::with_groups(layout, groups, num_blocks, enabled)
    }

    /// A manager for a model with KV-cache groups: `layout` describes one pool block
    /// (`layout.num_layers` = [`KvGroups::slots_per_block`]), and each sequence holds one table
    /// per group. Errors like [`KvManager::new`], on a layout that does not match the groups,
    /// and with [`KvError::PrefixCacheWithSlidingWindow`] when `prefix_cache` is asked for a
    /// model without a full-attention group.
    pub fn with_groups(
        layout: KvLayout,
        groups: KvGroups,
        num_blocks: usize,
        prefix_cache: bool,
    ) -> Result<Self, KvError> {
        if num_blocks as u128 * layout.block_size as u128 > 1u128 << 32 {
            return Err(KvError::TooManySlots { num_blocks, block_size: layout.block_size });
        }
        assert_eq!(
            layout.num_layers,
            groups.slots_per_block(),
            "the layout's layers must be the groups' slots per block"
        );
        let kinds: Vec<GroupKind> = (0..groups.len()).map(|g| groups.kind(g)).collect();
        if prefix_cache && !kinds.contains(&GroupKind::Full) {
            return Err(KvError::PrefixCacheWithSlidingWindow);
        }
        let enabled = prefix_cache;
        Ok(KvManager {
            layout,
            groups,
            pool: BlockPool::new(num_blocks),
            seqs: HashMap::new(),
            cache: enabled.then(|| PrefixCache::with_groups(layout.block_size, &kinds)),
            tenants: Tenants::default(),
            state_blocks: 0,
            state_slots: 0,
            prefix_query_tokens: 0,
            prefix_hit_tokens: 0,
            num_evicted_blocks: 0,
            host: None,
            moves: KvMoves::default(),
            host_hit_tokens: 0,
        })
    }

    /// A manager over the whole blocks that fit in `budget_bytes`
    /// ([`KvLayout::require_blocks_for_budget`]), without a prefix cache. Errors if that is not
    /// one block, or too many.
    pub fn from_budget(layout: KvLayout, budget_bytes: u64) -> Result<Self, KvError> {
        KvManager::new(layout, layout.require_blocks_for_budget(budget_bytes)?)
    }

    /// The layout the pool was sized with.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// The KV-cache groups (one block table each per sequence).
    pub fn groups(&self) -> &KvGroups {
        &self.groups
    }

    /// Read-only view of the pool (ref counts, free count).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Read-only view of the prefix cache; `None` when disabled.
    pub fn prefix_cache(&self) -> Option<&PrefixCache> {
        self.cache.as_ref()
    }

    /// Most blocks one sequence holds at once: [`KvGroups::blocks_for_lone_sequence`].
    pub fn blocks_for_lone_sequence(&self, max_len: usize, step_tokens: usize) -> usize {
        self.groups.blocks_for_lone_sequence(self.layout.block_size, max_len, step_tokens)
    }

    /// Extra blocks `seq` must claim to hold `new_tokens` more tokens; an unknown `seq` counts as
    /// an empty table (so admission can ask before [`KvManager::add_sequence`]). O(1).
    pub fn blocks_needed(&self, seq: SeqId, new_tokens: usize) -> usize {
        match self.seqs.get(&seq) {
            Some(s) => {
                s.tables.iter().map(|t| t.blocks_needed_for(t.num_tokens() + new_tokens)).sum()
            }
            None => self.groups.len() * self.layout.blocks_for_tokens(new_tokens),
        }
    }

    /// Whether [`KvManager::reserve`] of `new_tokens` for `seq` would succeed now, counting
    /// evictable cached blocks as free. O(1).
    pub fn can_allocate(&self, seq: SeqId, new_tokens: usize) -> bool {
        let namespace = self.namespace_of(seq).flatten();
        self.blocks_needed(seq, new_tokens) <= self.claimable_blocks(namespace)
    }

    /// The namespace of live sequence `seq`.
    pub fn namespace_of(&self, seq: SeqId) -> Option<Namespace> {
        self.seqs.get(&seq).map(|s| s.namespace)
    }

    /// Most tokens [`KvManager::reserve`] can take for `seq` now: the room left in its last
    /// block plus `block_size` per free or evictable block for each group. 0 for an unknown
    /// `seq`. O(1).
    pub fn num_reservable_tokens(&self, seq: SeqId) -> usize {
        let Some(s) = self.seqs.get(&seq) else { return 0 };
        let table = &s.tables[0]; // all tables have the same tokens, hence the same room
        let room = table.capacity() - table.num_tokens();
        let per_group = self.claimable_blocks(s.namespace) / self.groups.len();
        room + per_group * self.layout.block_size
    }

    /// Tokens of `tokens` that [`KvManager::begin_sequence`] would take from the cache now,
    /// without touching anything: whole cached blocks, capped at the largest block multiple ≤
    /// `tokens.len() − 1` so that at least the last token is computed (its logits are needed).
    /// 0 with the cache disabled. O(tokens.len()).
    pub fn num_cached_tokens(&self, namespace: Namespace, tokens: &[u32]) -> usize {
        let gpu = self.peek_prefix(namespace, tokens).len();
        let host = self.host_continuation(namespace, self.cacheable(tokens), gpu).len();
        (gpu + host) * self.layout.block_size
    }

    /// Whether [`KvManager::begin_sequence`] for `tokens`, then [`KvManager::reserve`] of
    /// `num_new_tokens` (the tokens after the cached prefix), would succeed now. Exact: matched
    /// blocks that are evictable now stop being evictable once locked (and loose companions
    /// once the new sequence's window holds them), and are not counted twice.
    /// O(tokens.len() · groups).
    pub fn can_begin(&self, namespace: Namespace, tokens: &[u32], num_new_tokens: usize) -> bool {
        let matched = self.peek_prefix(namespace, tokens);
        let no_longer_evictable = match &self.cache {
            Some(cache) => self.evictable_taken_by(cache, &matched),
            None => 0,
        };
        // host hits need pool blocks like computed tokens do
        let host = self.host_continuation(namespace, self.cacheable(tokens), matched.len()).len();
        let num_cached_tokens = (matched.len() + host) * self.layout.block_size;
        let needed =
            self.layout.blocks_for_tokens(num_cached_tokens + num_new_tokens) - matched.len();
        let states = usize::from(self.state_blocks > 0); // its running state
        self.fits(namespace, needed * self.groups.len() + no_longer_evictable, states)
    }

    /// Evictable blocks that beginning a sequence on the usable cached `path` would make
    /// unevictable: every block of a node it locks first, less the sliding companions that stay
    /// loose (only the tree holds them and the new window does not take them), plus the loose
    /// companions of already locked nodes that the window takes. O(path.len() · groups).
    fn evictable_taken_by(&self, cache: &PrefixCache, path: &[BlockId]) -> usize {
        let b = self.layout.block_size;
        let num_tokens = path.len() * b;
        let mut taken = 0;
        for (idx, &node) in path.iter().enumerate() {
            let newly_locked = cache.lock_count(node) == Some(0);
            for g in 0..self.groups.len() {
                let Some(block) = cache.block_of(node, g) else { continue };
                let kind = self.groups.kind(g);
                let in_window = idx >= kind.first_visible(num_tokens) / b;
                let sliding = matches!(kind, GroupKind::Sliding { .. });
                let tree_only = self.pool.ref_count(block) == 1;
                let was_evictable = newly_locked || (sliding && tree_only);
                let stays_evictable = sliding && tree_only && !in_window;
                taken += usize::from(was_evictable && !stays_evictable);
            }
        }
        taken
    }

    /// Starts an empty table for `seq` in the default namespace, matching nothing. Claims no
    /// blocks. Errors if `seq` is already live.
    pub fn add_sequence(&mut self, seq: SeqId) -> Result<(), KvError> {
        self.insert_sequence(seq, self.empty_tables(), None, None)
    }

    /// Starts `seq` for a sequence whose tokens begin with `tokens` (the prompt, or prompt +
    /// generated tokens when recomputing after preemption): the longest cached prefix (see
    /// [`KvManager::num_cached_tokens`]) becomes the start of its tables, each block shared
    /// (incref) and the path locked; a sliding table gets the cached blocks of its first
    /// query's window only, the entries before it dropped. Returns the number of cached
    /// tokens; the caller computes from there. Counts the query and hit tokens. Claims free
    /// blocks only for host-tier hits (the path continues into them: `manager_tier.rs`, whose
    /// copies go in the next moves), evicting if it must. Errors if `seq` is already live.
    /// O(tokens.len()).
    ///
    /// Recurrent models: the sequence's running state counts toward its tenant's quota from
    /// here; the [`KvManager::reserve`] that follows (ask [`KvManager::snapshot_restore`]
    /// first) gives up the tenant's own cached blocks or snapshots if the state needs room.
    /// Check [`KvManager::can_begin`] first.
    pub fn begin_sequence(
        &mut self,
        seq: SeqId,
        namespace: Namespace,
        tokens: &[u32],
    ) -> Result<usize, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::SequenceExists(seq));
        }
        let cap = self.cacheable_len(tokens.len());
        let matched = match &mut self.cache {
            Some(cache) => cache.match_prefix(namespace, &tokens[..cap]),
            None => Vec::new(),
        };
        if let (Some(cache), Some(&last)) = (&mut self.cache, matched.last()) {
            cache.lock_in(&self.pool, last);
            cache.touch_snapshot(last); // restored from (recurrent models)
        }
        let matched = self.extend_from_host(namespace, &tokens[..cap], matched);
        let locked = matched.last().copied();
        if self.cache.is_some() {
            let hit = matched.len() * self.layout.block_size;
            self.prefix_query_tokens += tokens.len() as u64;
            self.prefix_hit_tokens += hit as u64;
            self.tenants.count_lookup(namespace, tokens.len(), hit);
        }
        let tables = self.tables_from_path(&matched);
        let num_cached_tokens = matched.len() * self.layout.block_size;
        self.insert_sequence(seq, tables, namespace, locked)?;
        Ok(num_cached_tokens)
    }

    /// Reserves the next `num_new_tokens` positions of `seq` in every group and returns their
    /// slots, `[group][token]` in order (the step's slot mapping for this sequence). Claims
    /// blocks only as positions enter them; when the free list is short, first evicts least
    /// recently used unlocked cached blocks. All or nothing: on error the tables and pool are
    /// unchanged and nothing was evicted. O(groups × num_new_tokens + evicted × log).
    pub fn reserve(&mut self, seq: SeqId, num_new_tokens: usize) -> Result<Vec<Vec<u32>>, KvError> {
        let s = self.seqs.get(&seq).ok_or(KvError::UnknownSequence(seq))?;
        let namespace = s.namespace;
        self.make_room_for(namespace, self.blocks_needed(seq, num_new_tokens))?;
        let tables = &mut self.seqs.get_mut(&seq).expect("checked above").tables;
        let mut slots = Vec::with_capacity(tables.len());
        for table in tables.iter_mut() {
            let start = table.num_tokens();
            table.append_tokens(&mut self.pool, num_new_tokens).expect("make_room freed enough");
            slots.push(table.slot_mapping(start..start + num_new_tokens));
        }
        Ok(slots)
    }

    /// Drops the blocks of `seq`'s sliding-window tables that lie wholly before the window of a
    /// query at `next_pos` (the next position it computes): after this a sliding table holds at
    /// most [`GroupKind::max_live_blocks`] blocks. A no-op for full groups. Call after every
    /// step (the scheduler's commit), when no GPU work reads the dropped blocks. Returns the
    /// blocks dropped. Errors if `seq` is not live. O(dropped).
    pub fn slide_windows(&mut self, seq: SeqId, next_pos: usize) -> Result<usize, KvError> {
        let s = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSequence(seq))?;
        let mut dropped = 0;
        s.slid_to = next_pos;
        for (g, table) in s.tables.iter_mut().enumerate() {
            if let GroupKind::Sliding { .. } = self.groups.kind(g) {
                let first = self.groups.kind(g).first_visible(next_pos);
                for block in table.drop_before(&mut self.pool, first) {
                    if let Some(cache) = &mut self.cache {
                        cache.refresh(&self.pool, block); // it may be cached and now loose
                    }
                    dropped += 1;
                }
            }
        }
        Ok(dropped)
    }

    /// Caches the blocks of `seq` that `computed_tokens` fills (its tokens whose KV is computed,
    /// from position 0) and that are not cached yet, and moves the sequence's lock to the end
    /// of the longer path. Every group's block at a cached index goes in with it (a sliding
    /// table's dropped entries as missing companions); where the tree already holds a block
    /// the table switches to it, and a missing sliding companion is taken from the table. Call
    /// after every step (eager caching), before [`KvManager::slide_windows`]. A no-op with the
    /// cache disabled. Errors if `seq` is not live. O(computed_tokens.len() · groups) when a
    /// block is added.
    ///
    /// Panics if `computed_tokens` is longer than the reserved tokens of `seq`; it must also
    /// start with the tokens of earlier calls and of [`KvManager::begin_sequence`].
    pub fn cache_full_blocks(
        &mut self,
        seq: SeqId,
        computed_tokens: &[u32],
    ) -> Result<(), KvError> {
        let s = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSequence(seq))?;
        let Some(cache) = &mut self.cache else { return Ok(()) };
        let anchor = cache.anchor();
        let num_tokens = s.tables[anchor].num_tokens();
        assert!(
            computed_tokens.len() <= num_tokens,
            "sequence {seq}: {} computed tokens, only {num_tokens} reserved",
            computed_tokens.len(),
        );
        let full = computed_tokens.len() / self.layout.block_size;
        if full <= s.num_cached_blocks {
            self.settle_snapshot(seq, full);
            return Ok(());
        }
        let prefix = &computed_tokens[..full * self.layout.block_size];
        let rows: Vec<&[BlockId]> = s.tables.iter().map(|t| &t.as_slice()[..full]).collect();
        let last =
            cache.insert_groups(&mut self.pool, s.namespace, prefix, &rows).expect("full ≥ 1");
        cache.lock_in(&self.pool, last);
        if let Some(old) = s.locked.replace(last) {
            cache.unlock(old);
        }
        let path = cache.path(last);
        let cached = s.num_cached_blocks;
        debug_assert_eq!(&path[..cached], &s.tables[anchor].as_slice()[..cached], "tokens changed");
        for (idx, &node) in path.iter().enumerate().skip(cached) {
            for (g, table) in s.tables.iter_mut().enumerate() {
                let have = table.as_slice()[idx];
                let Some(want) = cache.block_of(node, g) else { continue };
                if have != NULL_BLOCK && have != want {
                    // Another sequence cached this block first: read its copy, free ours.
                    table.swap_block(&mut self.pool, idx, want);
                    cache.refresh(&self.pool, want);
                }
            }
        }
        s.num_cached_blocks = full;
        self.settle_snapshot(seq, full);
        Ok(())
    }

    /// Ends `seq` (finished, preempted or cancelled): caches its computed full blocks like
    /// [`KvManager::cache_full_blocks`], unlocks its path and drops its references, freeing the
    /// blocks that neither the cache nor another sequence holds. With the cache disabled this is
    /// [`KvManager::free_sequence`]. Errors if `seq` is not live. O(its blocks).
    pub fn release_sequence(&mut self, seq: SeqId, computed_tokens: &[u32]) -> Result<(), KvError> {
        self.cache_full_blocks(seq, computed_tokens)?;
        let mut s = self.seqs.remove(&seq).expect("cache_full_blocks checked it");
        if let (Some(cache), Some(target)) = (&mut self.cache, s.snapshot_target) {
            cache.give_back_snapshot_slot(target.slot); // its step was never computed
        }
        if let (Some(cache), Some(last)) = (&mut self.cache, s.locked) {
            cache.unlock(last);
        }
        for table in &mut s.tables {
            let blocks = table.live_blocks().to_vec();
            table.release(&mut self.pool);
            if let Some(cache) = &mut self.cache {
                for block in blocks {
                    cache.refresh(&self.pool, block); // a companion may now be loose
                }
            }
        }
        Ok(())
    }

    /// Ends `seq` without caching anything more: unlocks its path and drops its references.
    /// Errors if `seq` is not live. O(its blocks).
    pub fn free_sequence(&mut self, seq: SeqId) -> Result<(), KvError> {
        self.release_sequence(seq, &[])
    }

    /// Starts `child` as a copy of `parent` that shares the start of the parent's table (ref
    /// counts +1) and recomputes the rest into its own blocks. Without a prefix cache it shares
    /// all full blocks; with one, only the parent's cached prefix (and locks that path too), so
    /// that every cached block a table holds stays locked. Errors if `parent` is unknown or
    /// `child` is live. O(parent's blocks).
    pub fn fork_sequence(&mut self, parent: SeqId, child: SeqId) -> Result<(), KvError> {
        if self.seqs.contains_key(&child) {
            return Err(KvError::SequenceExists(child));
        }
        let p = self.seqs.get(&parent).ok_or(KvError::UnknownSequence(parent))?;
        let namespace = p.namespace;
        let (tables, locked) = match &mut self.cache {
            None => (p.tables.iter().map(|t| t.fork(&mut self.pool)).collect(), None),
            Some(cache) => {
                // The parent's cached path, cut to what a new window can read (all of it with
                // one group: the parent may have slid past companions since evicted).
                let mut path = p.locked.map_or(Vec::new(), |last| cache.path(last));
                path.truncate(cache.usable_len(&path));
                if let Some(&last) = path.last() {
                    cache.lock_in(&self.pool, last);
                }
                (self.tables_from_path(&path), path.last().copied())
            }
        };
        self.insert_sequence(child, tables, namespace, locked)
    }

    /// The block table of `seq` in the first group (the only one of a model whose layers all
    /// attend fully), if live.
    pub fn table(&self, seq: SeqId) -> Option<&BlockTable> {
        self.seqs.get(&seq).map(|s| &s.tables[0])
    }

    /// Blocks the live sequences' tables hold, per group (a block two tables share counts
    /// twice). O(sequences × groups).
    pub fn held_blocks_by_group(&self) -> Vec<usize> {
        let mut held = vec![0; self.groups.len()];
        for s in self.seqs.values() {
            for (g, table) in s.tables.iter().enumerate() {
                held[g] += table.num_live_blocks();
            }
        }
        held
    }

    /// The block tables of `seq`, one per group, if live.
    pub fn tables(&self, seq: SeqId) -> Option<&[BlockTable]> {
        self.seqs.get(&seq).map(|s| s.tables.as_slice())
    }

    /// Live sequences.
    pub fn num_sequences(&self) -> usize {
        self.seqs.len()
    }

    /// Blocks in the pool, free or used.
    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    /// Blocks in the free list.
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    /// Blocks an allocation can get now: free ones plus evictable cached ones. O(1).
    pub fn num_free_or_evictable_blocks(&self) -> usize {
        self.pool.num_free() + self.cache.as_ref().map_or(0, PrefixCache::num_evictable_blocks)
    }

    /// Fraction of blocks held by live sequences, `0.0..=1.0`: evictable cached blocks count as
    /// free (the `kv_cache_usage_perc` metric, as vLLM reports it).
    pub fn usage(&self) -> f32 {
        match self.num_blocks() {
            0 => 0.0,
            n => 1.0 - self.num_free_or_evictable_blocks() as f32 / n as f32,
        }
    }

    /// Evicts every unlocked cached block (all of them once no sequence is live); returns how
    /// many. O(k log n). The host tier is emptied too (its blocks are not counted).
    pub fn clear_prefix_cache(&mut self) -> usize {
        let Some(cache) = &mut self.cache else { return 0 };
        let evicted = cache.evict(&mut self.pool, usize::MAX).len();
        cache.take_evicted(); // dropped, not written back
        if let Some(host) = &mut self.host {
            host.clear();
        }
        self.num_evicted_blocks += evicted as u64;
        evicted
    }

    /// Counters and gauges now.
    pub fn stats(&self) -> KvStats {
        KvStats {
            num_blocks: self.num_blocks(),
            num_free_blocks: self.num_free_blocks(),
            num_cached_blocks: self.cache.as_ref().map_or(0, PrefixCache::num_cached_blocks),
            num_evictable_blocks: self.cache.as_ref().map_or(0, PrefixCache::num_evictable_blocks),
            prefix_query_tokens: self.prefix_query_tokens,
            prefix_hit_tokens: self.prefix_hit_tokens,
            num_evicted_blocks: self.num_evicted_blocks,
            usage: self.usage(),
            num_snapshot_slots: self.cache.as_ref().map_or(0, |c| c.num_snapshots().0),
            num_snapshots: self.cache.as_ref().map_or(0, |c| c.num_snapshots().1),
            num_evicted_snapshots: self
                .cache
                .as_ref()
                .map_or(0, PrefixCache::num_evicted_snapshots),
            host_hit_tokens: self.host_hit_tokens,
            host: self.host.as_ref().map(HostTier::stats).unwrap_or_default(),
        }
    }

    /// Tokens of a `len`-token sequence that may come from the cache: the largest multiple of
    /// `block_size` ≤ `len − 1`.
    fn cacheable_len(&self, len: usize) -> usize {
        len.saturating_sub(1) / self.layout.block_size * self.layout.block_size
    }

    /// The part of `tokens` that may come from the cache ([`Self::cacheable_len`]).
    pub(super) fn cacheable<'t>(&self, tokens: &'t [u32]) -> &'t [u32] {
        &tokens[..self.cacheable_len(tokens.len())]
    }

    /// The cached blocks [`KvManager::begin_sequence`] would match (nothing touched): the
    /// usable part of the cached path ([`PrefixCache::usable_len`]).
    pub(super) fn peek_prefix(&self, namespace: Namespace, tokens: &[u32]) -> Vec<BlockId> {
        match &self.cache {
            Some(cache) => {
                let mut path = cache.peek(namespace, &tokens[..self.cacheable_len(tokens.len())]);
                path.truncate(cache.usable_len(&path));
                path
            }
            None => Vec::new(),
        }
    }

    /// The tables of a new sequence whose first `path.len()` blocks come from the cache (a
    /// usable, locked path): the path in the anchor table, its companions in the full ones, and
    /// in each sliding table [`NULL_BLOCK`] entries before the window of a query at the path's
    /// end, then the window's companions. Takes one reference on each block. Empty tables for
    /// an empty path. O(path.len() · groups).
    fn tables_from_path(&mut self, path: &[BlockId]) -> Vec<BlockTable> {
        let b = self.layout.block_size;
        let Some(cache) = &mut self.cache else { return self.empty_tables() };
        let mut tables = Vec::with_capacity(self.groups.len());
        for g in 0..self.groups.len() {
            let dropped = (self.groups.kind(g).first_visible(path.len() * b) / b).min(path.len());
            let blocks: Vec<BlockId> = path[dropped..]
                .iter()
                .map(|&node| cache.block_of(node, g).expect("a usable path has its window"))
                .collect();
            tables.push(BlockTable::from_shared_after(&mut self.pool, dropped, &blocks, b));
            for block in blocks {
                cache.refresh(&self.pool, block); // no longer loose
            }
        }
        tables
    }

    /// Makes `needed` blocks free, evicting cached blocks if the free list is short; on
    /// [`KvError::OutOfBlocks`] nothing was evicted.
    /// With a host tier the evicted blocks (and any a tenant gave up before) are written back.
    pub(super) fn make_room(&mut self, needed: usize) -> Result<(), KvError> {
        let free = self.pool.num_free();
        let available = self.num_free_or_evictable_blocks();
        if needed > free && needed <= available {
            let cache = self.cache.as_mut().expect("evictable blocks imply a cache");
            let evicted = cache.evict(&mut self.pool, needed - free);
            self.num_evicted_blocks += evicted.len() as u64;
        }
        self.sync_tier();
        if needed > available {
            return Err(KvError::OutOfBlocks { needed, free: available });
        }
        Ok(())
    }

    /// One empty table per group.
    fn empty_tables(&self) -> Vec<BlockTable> {
        vec![BlockTable::new(self.layout.block_size); self.groups.len()]
    }

    /// Registers a new live sequence. Errors if `seq` is live (nothing changed: callers check
    /// first, before taking references).
    fn insert_sequence(
        &mut self,
        seq: SeqId,
        tables: Vec<BlockTable>,
        namespace: Namespace,
        locked: Option<BlockId>,
    ) -> Result<(), KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::SequenceExists(seq));
        }
        let anchor = self.cache.as_ref().map_or(0, PrefixCache::anchor);
        let num_cached_blocks = if locked.is_some() { tables[anchor].num_blocks() } else { 0 };
        // A hit's sliding tables start at the window of its first computed query.
        let slid_to = if locked.is_some() { tables[anchor].num_tokens() } else { 0 };
        self.seqs.insert(
            seq,
            SeqKv {
                tables,
                namespace,
                num_cached_blocks,
                locked,
                slid_to,
                snapshot_target: None,
                newest_snapshot: None,
            },
        );
        Ok(())
    }
}

#[path = "manager_snapshots.rs"]
mod snapshots;

#[path = "manager_integrity.rs"]
mod integrity;

#[path = "manager_tier.rs"]
mod tier;

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
