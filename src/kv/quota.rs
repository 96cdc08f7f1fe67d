//! Tenant KV quotas on the [`KvManager`]: a namespace (a tenant) may be capped at a number of
//! blocks it holds, running and cached together. Over its quota a tenant gives up its own
//! cached blocks first (least recently used first); if that is not enough its sequences wait
//! (admission) or one of its own running sequences is preempted — never another tenant's.
//! A tenant with a quota that needs room while the pool is short also evicts its own cached
//! blocks before anyone else's.
//!
//! What a tenant holds: the blocks of its sequences' tables beyond their cached prefix (private
//! blocks), plus every block cached under its namespace (locked by its running sequences or
//! not). Namespaces share no blocks, so the per-tenant counts add up to at most the pool.
//!
//! Recurrent models (Qwen3.5): a sequence's states (every recurrent layer's conv and delta-rule
//! state) live outside the block pool, in fixed slots, but they are KV memory all the same: a
//! quota counts each state a tenant holds — one per running sequence, one per snapshot slot
//! its steps write or its cached prefixes own — as [`KvManager::state_blocks`] blocks (its
//! bytes over a block's, rounded up). A quota tenant short of room gives up its own least
//! recently used cached blocks (and the snapshots on them), then its own snapshots; a
//! snapshot its step would take without room is skipped (the prefix stays cached, usable at
//! an earlier snapshot); when every snapshot slot is taken it reuses its own oldest
//! snapshot's slot before anyone else's.
//!
//! Guarantees: a tenant never holds more blocks than its quota; when the quotas of the tenants
//! with quotas, plus what the others hold, fit in the pool, no allocation of a tenant with a
//! quota evicts another tenant's cached blocks. Not guaranteed: a quota is a cap, not a
//! reservation (another tenant's load can still fill the pool and make this one wait), and
//! tenants without a quota keep evicting least recently used blocks pool-wide.

use std::collections::HashMap;

use super::block_table::BlockTable;
use super::error::KvError;
use super::manager::KvManager;
use super::prefix_cache::Namespace;

/// A tracked tenant's KV numbers (see [`KvManager::tenant_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantKvStats {
    pub namespace: u64,
    /// Blocks the tenant holds now (running + cached), its recurrent states included as
    /// [`KvManager::state_blocks`] each.
    pub num_held_blocks: usize,
    /// Recurrent models: states it holds (running sequences, snapshots being written or
    /// cached); 0 for attention-only models.
    pub num_held_states: usize,
    /// Its cap, if it has one.
    pub quota_blocks: Option<usize>,
    /// Prompt tokens of its sequences looked up in the prefix cache, and found there.
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
}

/// Per tracked namespace: its quota and counters.
#[derive(Clone, Debug, Default)]
pub(super) struct Tenants {
    map: HashMap<u64, TenantKvStats>,
}

impl Tenants {
    pub(super) fn quota(&self, namespace: Namespace) -> Option<usize> {
        self.map.get(&namespace?)?.quota_blocks
    }

    /// Counts a lookup of `query` prompt tokens with `hit` found, if the namespace is tracked.
    pub(super) fn count_lookup(&mut self, namespace: Namespace, query: usize, hit: usize) {
        if let Some(t) = namespace.and_then(|ns| self.map.get_mut(&ns)) {
            t.prefix_query_tokens += query as u64;
            t.prefix_hit_tokens += hit as u64;
        }
    }
}

impl KvManager {
    /// Recurrent models: counts one sequence's states as `state_blocks` blocks toward tenant
    /// quotas (its bytes over a block's, rounded up), with `running_slots` running-state slots
    /// (`max_num_seqs`). Call before any tenant is set.
    pub fn with_sequence_states(mut self, state_blocks: usize, running_slots: usize) -> Self {
        self.state_blocks = state_blocks;
        self.state_slots = running_slots;
        self
    }

    /// What one sequence's recurrent states count toward a quota, in blocks (0 without).
    pub fn state_blocks(&self) -> usize {
        self.state_blocks
    }

    /// The KV memory quotas divide, in blocks: the pool, plus every state slot (running and
    /// snapshot) as [`KvManager::state_blocks`] each.
    pub fn quota_capacity(&self) -> usize {
        let snapshots = self.cache.as_ref().map_or(0, |c| c.num_snapshots().0 as usize);
        self.num_blocks() + self.state_blocks * (self.state_slots + snapshots)
    }

    /// Tracks `namespace` as a tenant (per-tenant stats) and caps it at `quota_blocks` blocks
    /// (`None`: no cap). Errors if the cap is below `min_blocks` (what one sequence of the
    /// longest allowed length needs: a lower cap could never run it) plus one sequence's
    /// states, or above [`KvManager::quota_capacity`], and with
    /// [`KvError::QuotaWithSlidingWindow`] for a cap on a model with several KV-cache groups
    /// and the prefix cache on (not supported yet: cached companions are not counted per
    /// tenant).
    pub fn set_tenant(
        &mut self,
        namespace: u64,
        quota_blocks: Option<usize>,
        min_blocks: usize,
    ) -> Result<(), KvError> {
        if quota_blocks.is_some() && self.cache.is_some() && self.groups().len() > 1 {
            return Err(KvError::QuotaWithSlidingWindow);
        }
        if let Some(q) = quota_blocks {
            let min_blocks = min_blocks + self.state_blocks;
            if q < min_blocks || q > self.quota_capacity() {
                return Err(KvError::BadQuota {
                    quota_blocks: q,
                    min_blocks,
                    num_blocks: self.quota_capacity(),
                });
            }
        }
        let entry = self.tenants.map.entry(namespace).or_default();
        entry.namespace = namespace;
        entry.quota_blocks = quota_blocks;
        Ok(())
    }

    /// Blocks `namespace` holds now: its sequences' private blocks plus its cached blocks,
    /// plus [`KvManager::state_blocks`] per state it holds. O(live sequences), O(their
    /// blocks) with several groups and the cache on, plus O(snapshots) with states.
    pub fn num_held_blocks(&self, namespace: Namespace) -> usize {
        let private = |s: &super::manager::SeqKv| -> usize {
            match &self.cache {
                Some(cache) if s.tables.len() > 1 => s
                    .tables
                    .iter()
                    .flat_map(BlockTable::live_blocks)
                    .filter(|&&b| !cache.holds(b))
                    .count(),
                _ => {
                    s.tables.iter().map(BlockTable::num_live_blocks).sum::<usize>()
                        - s.num_cached_blocks
                }
            }
        };
        let private: usize =
            self.seqs.values().filter(|s| s.namespace == namespace).map(private).sum();
        let cached = self.cache.as_ref().map_or(0, |c| c.num_cached_blocks_in(namespace));
        private + cached + self.state_blocks * self.num_held_states(namespace)
    }

    /// Recurrent states `namespace` holds: one per live sequence and per snapshot slot its
    /// sequences write, plus the snapshots of its cached prefixes. 0 without states.
    /// O(live sequences + snapshots).
    pub fn num_held_states(&self, namespace: Namespace) -> usize {
        if self.state_blocks == 0 {
            return 0;
        }
        let seqs = self.seqs.values().filter(|s| s.namespace == namespace);
        let running: usize = seqs.map(super::manager::SeqKv::num_states).sum();
        running + self.cache.as_ref().map_or(0, |c| c.num_snapshots_in(namespace))
    }

    /// What `namespace` could give up under its quota: its evictable cached blocks, and its
    /// cached snapshots (any may go: a restore copies its snapshot before a later step writes
    /// the slot). In blocks.
    fn own_reclaimable(&self, namespace: Namespace) -> usize {
        self.cache.as_ref().map_or(0, |c| {
            c.num_evictable_blocks_in(namespace) + self.state_blocks * c.num_snapshots_in(namespace)
        })
    }

    /// Blocks a sequence of `namespace` may still claim under its quota, counting what it
    /// could give up of its own ([`KvManager::own_reclaimable`]) as claimable; `usize::MAX`
    /// without a quota.
    pub(super) fn quota_room(&self, namespace: Namespace) -> usize {
        let Some(quota) = self.tenants.quota(namespace) else { return usize::MAX };
        quota.saturating_sub(self.num_held_blocks(namespace)) + self.own_reclaimable(namespace)
    }

    /// Blocks a sequence of `namespace` can claim now: the pool's free and evictable blocks,
    /// within its quota.
    pub(super) fn claimable_blocks(&self, namespace: Namespace) -> usize {
        self.num_free_or_evictable_blocks().min(self.quota_room(namespace))
    }

    /// Whether `blocks` pool blocks plus `states` new recurrent states fit for `namespace`
    /// now: the blocks in the pool's free and evictable ones, blocks and states within its
    /// quota.
    pub(super) fn fits(&self, namespace: Namespace, blocks: usize, states: usize) -> bool {
        blocks <= self.num_free_or_evictable_blocks()
            && blocks + states * self.state_blocks <= self.quota_room(namespace)
    }

    /// Whether live sequence `seq` is held back by its tenant's quota rather than by the pool
    /// (the scheduler then preempts within the tenant). False for an unknown `seq`.
    pub fn is_quota_bound(&self, seq: super::SeqId) -> bool {
        self.namespace_of(seq).is_some_and(|ns| self.is_quota_bound_ns(ns))
    }

    /// Whether `namespace`'s quota, not the pool, is what limits its next allocation.
    pub fn is_quota_bound_ns(&self, namespace: Namespace) -> bool {
        self.quota_room(namespace) < self.num_free_or_evictable_blocks()
    }

    /// Makes `needed` blocks claimable for a sequence of `namespace` without breaking its
    /// quota: over the quota it evicts its own cached blocks (least recently used first),
    /// then its own snapshots; when the free list is short, a tenant with a quota evicts its
    /// own cached blocks before anyone else's. All or nothing: on error nothing was evicted.
    pub(super) fn make_room_for(
        &mut self,
        namespace: Namespace,
        needed: usize,
    ) -> Result<(), KvError> {
        let Some(quota) = self.tenants.quota(namespace) else { return self.make_room(needed) };
        let room = self.quota_room(namespace);
        if needed > room {
            return Err(KvError::OverQuota { needed, room, quota_blocks: quota });
        }
        let available = self.num_free_or_evictable_blocks();
        if needed > available {
            return Err(KvError::OutOfBlocks { needed, free: available });
        }
        let over = (self.num_held_blocks(namespace) + needed).saturating_sub(quota);
        let short = needed.saturating_sub(self.pool.num_free());
        self.give_up_own(namespace, over, short);
        self.make_room(needed)
    }

    /// A quota tenant gives up its own: least recently used cached blocks (with any snapshots
    /// on them) until `over` blocks of its holdings and `short` pool blocks are freed, then
    /// its oldest snapshots while still `over`. Stops early when it has nothing left to give.
    fn give_up_own(&mut self, namespace: Namespace, mut over: usize, mut short: usize) {
        let Some(cache) = self.cache.as_mut() else { return };
        while over > 0 || short > 0 {
            let snapshots = cache.num_snapshots_in(namespace);
            let evicted = cache.evict_in(&mut self.pool, namespace, 1).len();
            if evicted == 0 {
                break;
            }
            self.num_evicted_blocks += evicted as u64;
            let states = snapshots - cache.num_snapshots_in(namespace);
            over = over.saturating_sub(evicted + states * self.state_blocks);
            short = short.saturating_sub(evicted);
        }
        while over > 0 && cache.evict_snapshot_in(namespace) {
            over = over.saturating_sub(self.state_blocks);
        }
    }

    /// Makes room under `namespace`'s quota for one more state (a snapshot its step would
    /// write), giving up its own oldest snapshot first, then its cached blocks. False (nothing
    /// given up) when it cannot; true without a quota or states.
    pub(super) fn make_state_room(&mut self, namespace: Namespace) -> bool {
        let Some(quota) = self.tenants.quota(namespace).filter(|_| self.state_blocks > 0) else {
            return true;
        };
        if self.state_blocks > self.quota_room(namespace) {
            return false;
        }
        let mut over = (self.num_held_blocks(namespace) + self.state_blocks).saturating_sub(quota);
        let cache = self.cache.as_mut().expect("snapshots live in the prefix cache");
        while over > 0 && cache.evict_snapshot_in(namespace) {
            over = over.saturating_sub(self.state_blocks);
        }
        self.give_up_own(namespace, over, 0);
        true
    }

    /// Every tracked tenant's numbers, by namespace. O(tenants × live sequences).
    pub fn tenant_stats(&self) -> Vec<TenantKvStats> {
        let mut out: Vec<TenantKvStats> = self
            .tenants
            .map
            .values()
            .map(|t| TenantKvStats {
                num_held_blocks: self.num_held_blocks(Some(t.namespace)),
                num_held_states: self.num_held_states(Some(t.namespace)),
                ..*t
            })
            .collect();
        out.sort_by_key(|t| t.namespace);
        out
    }

    /// The part of [`KvManager::check_integrity`] about quotas: no tenant holds more than its
    /// quota.
    pub(super) fn check_quotas(&self) -> Result<(), String> {
        for t in self.tenants.map.values() {
            let held = self.num_held_blocks(Some(t.namespace));
            if let Some(q) = t.quota_blocks.filter(|&q| held > q) {
                return Err(format!(
                    "tenant {:#x} holds {held} blocks, over its quota of {q}",
                    t.namespace
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvLayout;

    const A: u64 = 1;
    const B: u64 = 2;
    const C: u64 = 3;

    /// Runs a sequence of `tokens` in `ns` to the end: its full blocks stay cached.
    fn donate(kv: &mut KvManager, seq: u64, ns: u64, tokens: &[u32]) {
        kv.begin_sequence(seq, Some(ns), tokens).unwrap();
        kv.reserve(seq, tokens.len()).unwrap();
        kv.cache_full_blocks(seq, tokens).unwrap();
        kv.release_sequence(seq, tokens).unwrap();
        kv.check_integrity().unwrap();
    }

    #[test]
    fn a_short_pool_takes_a_quota_tenants_own_cached_blocks_first() {
        // Block size 1: blocks = tokens. B's 3 cached blocks are older than A's 5.
        let layout = KvLayout::f16(1, 1, 1, 1).unwrap();
        let mut kv = KvManager::with_prefix_cache(layout, 10, true).unwrap();
        kv.set_tenant(A, Some(8), 1).unwrap();
        kv.set_tenant(B, None, 1).unwrap();
        donate(&mut kv, 1, B, &[1, 2, 99]);
        donate(&mut kv, 2, A, &[3, 4, 5, 6, 99]);
        assert_eq!(kv.num_held_blocks(Some(B)), 3);
        assert_eq!(kv.num_held_blocks(Some(A)), 5);
        // Tenant C (no quota) takes every free block.
        kv.begin_sequence(3, Some(C), &[7, 7]).unwrap();
        kv.reserve(3, 2).unwrap();
        assert_eq!(kv.num_free_blocks(), 0);
        // A needs a block: under its quota, but the pool is short. It gives up its own.
        kv.begin_sequence(4, Some(A), &[8]).unwrap();
        kv.reserve(4, 1).unwrap();
        kv.check_integrity().unwrap();
        assert_eq!(kv.num_held_blocks(Some(B)), 3, "B's older blocks were not taken");
        assert_eq!(kv.num_held_blocks(Some(A)), 5, "A gave one cached block for its new one");
    }

    #[test]
    fn quotas_are_refused_on_a_hybrid_model_with_the_cache() {
        use crate::kv::{GroupKind, KvGroups};
        let groups =
            KvGroups::from_layer_kinds(&[GroupKind::Sliding { window: 4 }, GroupKind::Full]);
        let layout = KvLayout::f16(groups.slots_per_block(), 1, 1, 1).unwrap();
        let mut kv = KvManager::with_groups(layout, groups.clone(), 20, true).unwrap();
        let err = kv.set_tenant(A, Some(10), 1).unwrap_err();
        assert_eq!(err, KvError::QuotaWithSlidingWindow);
        assert!(err.to_string().contains("--tenant-kv-quota"), "{err}");
        kv.set_tenant(A, None, 1).unwrap(); // stats only
        donate(&mut kv, 1, A, &[1, 2, 3, 99]);
        assert_eq!(kv.num_held_blocks(Some(A)), kv.stats().num_cached_blocks);
        let mut plain = KvManager::with_groups(layout, groups, 20, false).unwrap();
        plain.set_tenant(A, Some(10), 1).unwrap(); // without the cache quotas work as before
    }

    #[test]
    fn over_its_quota_a_tenant_evicts_its_own_and_then_is_refused() {
        let layout = KvLayout::f16(1, 1, 1, 1).unwrap();
        let mut kv = KvManager::with_prefix_cache(layout, 20, true).unwrap();
        kv.set_tenant(A, Some(5), 1).unwrap();
        donate(&mut kv, 1, A, &[1, 2, 3, 4, 99]);
        assert_eq!(kv.num_held_blocks(Some(A)), 5);
        kv.begin_sequence(2, Some(A), &[5, 6, 7]).unwrap();
        assert!(kv.is_quota_bound(2), "5 of 20 blocks: the quota binds");
        assert!(kv.can_allocate(2, 5));
        assert!(!kv.can_allocate(2, 6));
        kv.reserve(2, 5).unwrap(); // evicts its 5 cached blocks
        assert_eq!(kv.num_held_blocks(Some(A)), 5);
        let e = kv.reserve(2, 1).unwrap_err();
        assert!(matches!(e, KvError::OverQuota { needed: 1, room: 0, quota_blocks: 5 }), "{e}");
        kv.check_integrity().unwrap();
        let stats = kv.tenant_stats();
        assert_eq!(stats.len(), 1);
        assert_eq!((stats[0].num_held_blocks, stats[0].quota_blocks), (5, Some(5)));
        assert_eq!(stats[0].prefix_query_tokens, 8);
    }
}
