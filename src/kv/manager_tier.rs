//! The manager's host tier (`host_tier.rs`): what the GPU pool evicts is written back to host
//! slots, a prefix that continues into host keys is brought back at admission, and the copies
//! go to the engine as the step's [`KvMoves`]. One group of full attention and no recurrent
//! states: the tree's nodes are then exactly the pool's cached blocks.

use super::*;
use crate::kv::host_tier::{chain_keys, BlockKey, HostSlot, HostTier, KvMoves};

impl KvManager {
    /// Adds a host tier of `num_slots` blocks under the pool. Errors unless the prefix cache is
    /// on, the model has one full-attention group and no recurrent states.
    pub fn with_host_tier(mut self, num_slots: usize) -> Result<Self, KvError> {
        let why = if self.cache.is_none() {
            Some("it needs the prefix cache (drop --no-prefix-cache)")
        } else if self.groups.len() != 1 || self.groups.kind(0) != GroupKind::Full {
            Some(
                "the model's sliding-window layers keep a second KV-cache group, not offloaded yet",
            )
        } else if self.state_blocks > 0
            || self.cache.as_ref().is_some_and(|c| c.num_snapshots().0 > 0)
        {
            Some("the model's recurrent states are not offloaded yet")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(KvError::HostTierUnsupported(why));
        }
        self.cache.as_mut().expect("checked").log_evictions();
        self.host = Some(HostTier::new(num_slots));
        Ok(self)
    }

    /// The host tier, if any.
    pub fn host_tier(&self) -> Option<&HostTier> {
        self.host.as_ref()
    }

    /// The copies the steps planned since the last call need, to run before the next step;
    /// host slots read by its loads become reusable now, so run them before planning again.
    pub fn take_moves(&mut self) -> KvMoves {
        if let Some(host) = &mut self.host {
            host.release_pending();
        }
        std::mem::take(&mut self.moves)
    }

    /// Writes back the blocks the tree evicted since the last call (those not already in the
    /// host tier).
    pub(super) fn sync_tier(&mut self) {
        let (Some(cache), Some(host)) = (&mut self.cache, &mut self.host) else { return };
        for (block, key) in cache.take_evicted() {
            if let Some(slot) = host.store(key) {
                self.moves.offload.push((block, slot));
            }
        }
        self.moves.spill.extend(host.take_dropped());
    }

    /// Spills what the host tier drops from now on (a disk tier below it): the moves' `spill`.
    pub fn spill_host_drops(&mut self) {
        if let Some(host) = &mut self.host {
            host.keep_dropped();
        }
    }

    /// Takes a block read from the disk tier into the host tier: its slot, to be filled after
    /// the moves that are then taken (a spill of what it dropped) have run; `None` if it is
    /// here already or the tier has no slot to give. Call between steps, not within one.
    pub fn admit_to_host(&mut self, key: BlockKey) -> Option<HostSlot> {
        let host = self.host.as_mut()?;
        let slot = host.store(key);
        self.moves.spill.extend(host.take_dropped());
        slot
    }

    /// The keys of `tokens`' full cacheable blocks (what a prompt could take from any tier) and
    /// how many of them the pool and the host tier hold now, in order from the start.
    pub fn tier_keys(&self, namespace: Namespace, tokens: &[u32]) -> (Vec<BlockKey>, usize) {
        let tokens = self.cacheable(tokens);
        let gpu = self.peek_prefix(namespace, tokens).len();
        let keys = chain_keys(namespace, tokens, self.layout.block_size);
        let host = self.host.as_ref();
        let held =
            gpu + keys[gpu..].iter().take_while(|k| host.is_some_and(|h| h.contains(k))).count();
        (keys, held)
    }

    /// Every cached block of the pool and its key (to persist at shutdown).
    pub fn cached_block_keys(&self) -> Vec<(BlockId, BlockKey)> {
        self.cache.as_ref().map_or(Vec::new(), PrefixCache::block_keys)
    }

    /// The keys of the host tier's blocks that continue a cached GPU path of `gpu_len` blocks
    /// over `tokens` (cacheable, whole blocks), in order; empty without a tier.
    pub(super) fn host_continuation(
        &self,
        namespace: Namespace,
        tokens: &[u32],
        gpu_len: usize,
    ) -> Vec<BlockKey> {
        let Some(host) = &self.host else { return Vec::new() };
        if host.stats().num_used == 0 {
            return Vec::new();
        }
        chain_keys(namespace, tokens, self.layout.block_size)
            .into_iter()
            .skip(gpu_len)
            .take_while(|k| host.contains(k))
            .collect()
    }

    /// Extends the locked cached path `path` of a sequence being begun with the host blocks
    /// that continue it over `tokens` (cacheable): each gets a pool block (evicting if needed),
    /// joins the tree, and is loaded by this step's moves; the lock moves to the new end.
    /// Leaves `path` as it was when the pool cannot take them all. Returns the path.
    pub(super) fn extend_from_host(
        &mut self,
        namespace: Namespace,
        tokens: &[u32],
        path: Vec<BlockId>,
    ) -> Vec<BlockId> {
        let keys = self.host_continuation(namespace, tokens, path.len());
        let n = keys.len();
        if n == 0 || !self.fits(namespace, n, 0) {
            return path;
        }
        let host = self.host.as_mut().expect("keys come from the tier");
        let slots: Vec<_> = keys.iter().map(|k| host.load(k).expect("found above")).collect();
        self.make_room_for(namespace, n).expect("fits");
        let blocks = self.pool.allocate_n(n).expect("room made");
        let b = self.layout.block_size;
        let mut longer = path.clone();
        longer.extend_from_slice(&blocks);
        let cache = self.cache.as_mut().expect("a tier needs the cache");
        let last = cache.insert(&mut self.pool, namespace, &tokens[..longer.len() * b], &longer);
        let last = last.expect("n ≥ 1");
        debug_assert_eq!(Some(&last), blocks.last());
        cache.lock_in(&self.pool, last);
        if let Some(&old) = path.last() {
            cache.unlock(old);
        }
        for &block in &blocks {
            self.pool.decref(block); // the tree's reference holds it now
        }
        self.moves.load.extend(slots.into_iter().zip(blocks));
        self.host_hit_tokens += (n * b) as u64;
        longer
    }

    /// The tier part of [`KvManager::check_integrity`]: the tier's own.
    pub(super) fn check_tier(&self) -> Result<(), String> {
        self.host.as_ref().map_or(Ok(()), HostTier::check_integrity)
    }
}
