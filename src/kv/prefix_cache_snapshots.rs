//! State snapshots on [`PrefixCache`] nodes (see the module docs of `prefix_cache.rs`): for a
//! model with recurrent layers (Gated DeltaNet), whose per-sequence state cannot be cut back to
//! a shorter prefix, a cached prefix of `k` blocks is usable only when node `k − 1` holds a
//! snapshot of the recurrent states after its last token. Snapshots live in a fixed number of
//! slots (`--state-snapshots`; the GPU buffers are the model's, the slot numbers are kept here):
//! a slot is free, owned by one node, or *taken* by a running sequence that writes a step's
//! state into it (the manager's pending targets) and then gives it to a node or back.
//!
//! A snapshot is not a block: it adds no pool reference and no lock. Removing a node frees its
//! slot; when no slot is free, [`PrefixCache::take_snapshot_slot`] evicts the snapshot of the
//! least recently used snapshot (attached or restored; ties: the lowest slot), even of a locked node — a sequence copies the
//! snapshot it restores from before any later step writes the slot (the engine records restore
//! copies ahead of the step's kernels), so a snapshot is needed only until then.

use std::collections::{BTreeSet, HashMap};

use super::{BlockId, Namespace, PrefixCache};

/// The snapshot slots of a cache: `0..total`, each free, owned by a node or taken.
#[derive(Clone, Debug, Default)]
pub(super) struct SnapshotSlots {
    total: u32,
    /// Free slots; the lowest is taken first.
    free: BTreeSet<u32>,
    /// Slot → the node owning it (its snapshot) and the clock of its last use (attached, or
    /// matched by a sequence that restores it).
    owners: HashMap<u32, (BlockId, u64)>,
    /// Snapshots evicted to free a slot, ever.
    evicted: u64,
}

impl SnapshotSlots {
    pub(super) fn new(total: u32) -> Self {
        SnapshotSlots { total, free: (0..total).collect(), ..SnapshotSlots::default() }
    }

    /// `slot` is free again (no longer owned, if it was).
    fn release(&mut self, slot: u32) {
        self.owners.remove(&slot);
        self.free.insert(slot);
    }
}

impl PrefixCache {
    /// Makes cached prefixes usable only where a node holds a state snapshot, with `slots`
    /// snapshot slots (0: no prefix is usable). Call on an empty cache.
    pub fn with_state_snapshots(mut self, slots: u32) -> Self {
        assert!(self.nodes.is_empty(), "snapshots are set up on an empty cache");
        self.snapshots = Some(SnapshotSlots::new(slots));
        self
    }

    /// Whether cached prefixes need state snapshots (a model with recurrent layers).
    pub fn needs_snapshots(&self) -> bool {
        self.snapshots.is_some()
    }

    /// The snapshot slot of `node`, if it holds one (`None` for an uncached block).
    pub fn snapshot_of(&self, node: BlockId) -> Option<u32> {
        self.nodes.get(&node).and_then(|n| n.snapshot)
    }

    /// Snapshot slots in all, and those owned by nodes.
    pub fn num_snapshots(&self) -> (u32, usize) {
        self.snapshots.as_ref().map_or((0, 0), |s| (s.total, s.owners.len()))
    }

    /// Snapshots evicted to free a slot, ever.
    pub fn num_evicted_snapshots(&self) -> u64 {
        self.snapshots.as_ref().map_or(0, |s| s.evicted)
    }

    /// Takes a slot for a sequence to write a snapshot into: a free one, else the slot of the
    /// least recently used node's snapshot (which the node loses). `None` without snapshots or
    /// when every slot is taken. O(snapshots).
    pub fn take_snapshot_slot(&mut self) -> Option<u32> {
        self.take_snapshot_slot_in(None)
    }

    /// Like [`PrefixCache::take_snapshot_slot`], but when no slot is free the least recently
    /// used snapshot of namespace `own` goes first, if it has one (a tenant with a KV quota
    /// gives up its own snapshots before anyone else's). O(snapshots).
    pub fn take_snapshot_slot_in(&mut self, own: Option<Namespace>) -> Option<u32> {
        let s = self.snapshots.as_mut()?;
        if let Some(slot) = s.free.pop_first() {
            return Some(slot);
        }
        let slot = own
            .and_then(|ns| self.oldest_snapshot(Some(ns)))
            .or_else(|| self.oldest_snapshot(None))?;
        self.evict_snapshot(slot);
        Some(slot)
    }

    /// The slot of the least recently used snapshot, of namespace `filter` if given. By the
    /// snapshot's own use, not its node's: a walk stamps every node of a path, so a
    /// conversation's superseded snapshots would look as fresh as its newest. Ties: the lowest
    /// slot. O(snapshots).
    fn oldest_snapshot(&self, filter: Option<Namespace>) -> Option<u32> {
        let s = self.snapshots.as_ref()?;
        s.owners
            .iter()
            .filter(|(_, (node, _))| filter.is_none_or(|ns| self.nodes[node].namespace == ns))
            .min_by_key(|(&slot, &(_, used))| (used, slot))
            .map(|(&slot, _)| slot)
    }

    /// Takes owned `slot` from its node (an eviction, counted); the slot is neither free nor
    /// owned after (taken).
    fn evict_snapshot(&mut self, slot: u32) {
        let s = self.snapshots.as_mut().expect("a cache with snapshots");
        let (node, _) = s.owners.remove(&slot).expect("an owned slot");
        s.evicted += 1;
        self.nodes.get_mut(&node).expect("owner node").snapshot = None;
    }

    /// Evicts the least recently used snapshot of `namespace` (its slot is free again);
    /// false if it holds none. O(snapshots).
    pub fn evict_snapshot_in(&mut self, namespace: Namespace) -> bool {
        let Some(slot) = self.oldest_snapshot(Some(namespace)) else { return false };
        self.evict_snapshot(slot);
        self.snapshots.as_mut().expect("a cache with snapshots").release(slot);
        true
    }

    /// Snapshots held by nodes of `namespace`. O(snapshots).
    pub fn num_snapshots_in(&self, namespace: Namespace) -> usize {
        self.snapshots.as_ref().map_or(0, |s| {
            s.owners.values().filter(|(node, _)| self.nodes[node].namespace == namespace).count()
        })
    }

    /// Gives a taken `slot` to `node` as its snapshot; returns false (and keeps nothing) when
    /// the node already holds one — the caller gives the slot back. Panics if `node` is not
    /// cached.
    pub fn attach_snapshot(&mut self, node: BlockId, slot: u32) -> bool {
        let s = self.snapshots.as_mut().expect("a cache with snapshots");
        let n = self.nodes.get_mut(&node).expect("attach to a cached node");
        if n.snapshot.is_some() {
            return false;
        }
        n.snapshot = Some(slot);
        s.owners.insert(slot, (node, self.clock));
        true
    }

    /// Stamps `node`'s snapshot as used now (a sequence restores it). A no-op without one.
    pub fn touch_snapshot(&mut self, node: BlockId) {
        let clock = self.clock;
        if let (Some(slot), Some(s)) = (self.snapshot_of(node), self.snapshots.as_mut()) {
            s.owners.insert(slot, (node, clock));
        }
    }

    /// Returns a taken `slot` to the free list.
    pub fn give_back_snapshot_slot(&mut self, slot: u32) {
        let s = self.snapshots.as_mut().expect("a cache with snapshots");
        debug_assert!(!s.free.contains(&slot) && !s.owners.contains_key(&slot));
        s.release(slot);
    }

    /// Frees `node`'s snapshot if it is still `slot` (it may have been evicted since).
    pub fn drop_snapshot(&mut self, node: BlockId, slot: u32) {
        if self.snapshot_of(node) != Some(slot) {
            return;
        }
        self.nodes.get_mut(&node).expect("cached").snapshot = None;
        self.snapshots.as_mut().expect("a cache with snapshots").release(slot);
    }

    /// A node leaves the tree: its snapshot slot, if any, is free again.
    pub(super) fn free_snapshot_of_removed(&mut self, snapshot: Option<u32>) {
        if let (Some(slot), Some(s)) = (snapshot, self.snapshots.as_mut()) {
            s.release(slot);
        }
    }

    /// The largest `k ≤ limit` at which `path` may end: node `k − 1` holds a snapshot (or `k`
    /// is 0), `limit` itself without snapshots.
    pub(super) fn snapshot_usable_len(&self, path: &[BlockId], limit: usize) -> usize {
        if self.snapshots.is_none() {
            return limit;
        }
        (1..=limit).rev().find(|&k| self.nodes[&path[k - 1]].snapshot.is_some()).unwrap_or(0)
    }

    /// The snapshot part of [`PrefixCache::check_integrity`]: every slot is below the total and
    /// in one place only; owners and nodes agree. Returns the slots taken (neither free nor
    /// owned), which the manager matches against its sequences' targets.
    pub(in crate::kv) fn check_snapshots(&self) -> Result<Vec<u32>, String> {
        let Some(s) = &self.snapshots else {
            return match self.nodes.values().any(|n| n.snapshot.is_some()) {
                true => Err("a node holds a snapshot in a cache without them".into()),
                false => Ok(Vec::new()),
            };
        };
        let mut seen = vec![false; s.total as usize];
        for &slot in s.free.iter().chain(s.owners.keys()) {
            let Some(mark) = seen.get_mut(slot as usize) else {
                return Err(format!("snapshot slot {slot} of {}", s.total));
            };
            if std::mem::replace(mark, true) {
                return Err(format!("snapshot slot {slot} is free or owned twice"));
            }
        }
        for (&slot, &(node, used)) in &s.owners {
            if used > self.clock {
                return Err(format!("snapshot slot {slot}: used at {used}, after the clock"));
            }
            if self.snapshot_of(node) != Some(slot) {
                return Err(format!("snapshot slot {slot}: its node {node} does not hold it"));
            }
        }
        let held = self.nodes.values().filter(|n| n.snapshot.is_some()).count();
        if held != s.owners.len() {
            return Err(format!("{held} nodes hold snapshots, {} slots owned", s.owners.len()));
        }
        Ok((0..s.total).filter(|&slot| !seen[slot as usize]).collect())
    }
}
