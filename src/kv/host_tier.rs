//! [`HostTier`]: the host-RAM tier under the GPU pool (`--kv-offloading-size`), as bookkeeping:
//! which host slot holds the KV of which cached block. The bytes live with whoever moves them
//! (the engine's host store); this room only decides.
//!
//! A block is named by its [`BlockKey`]: a SHA-256 chain over its namespace and the token ids of
//! every block from the sequence start to it, so one key means one prefix (as vLLM's block
//! hashes and SGLang's HiRadixTree do). The radix tree's nodes carry their key; a block the GPU
//! pool evicts is written back to a host slot (write-back: nothing moves while a block is hot on
//! the GPU), and a prefix that runs on past the GPU's cached path into host keys is copied back
//! before the step that reads it. The tier is inclusive: a block copied back keeps its host copy,
//! so evicting it again copies nothing (a block's KV is the same bits however often it is
//! computed or moved). The host tier drops the least recently stored or hit entry first; a host
//! slot a load reads is not dropped until the step's moves have run
//! ([`HostTier::release_pending`]), so no write in the same step can reuse it.

use std::collections::{BTreeSet, HashMap};

use sha2::{Digest, Sha256};

use super::block_pool::BlockId;
use super::prefix_cache::Namespace;

/// A cached block's name: SHA-256 of its parent's key and its token ids ([`chain_key`]).
pub type BlockKey = [u8; 32];

/// A slot of the host tier, `0..num_slots`: `block_bytes` bytes at `slot × block_bytes`.
pub type HostSlot = u32;

/// The key a sequence's first block chains from: its namespace.
pub fn root_key(namespace: Namespace) -> BlockKey {
    let mut h = Sha256::new();
    h.update(b"kvrun kv root");
    match namespace {
        None => h.update([0u8]),
        Some(ns) => {
            h.update([1u8]);
            h.update(ns.to_le_bytes());
        }
    }
    h.finalize().into()
}

/// The key of a block holding `tokens` after the block keyed `parent`.
pub fn chain_key(parent: &BlockKey, tokens: &[u32]) -> BlockKey {
    let mut h = Sha256::new();
    h.update(parent);
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().into()
}

/// The keys of the full blocks of `tokens` in `namespace`, in order.
pub fn chain_keys(namespace: Namespace, tokens: &[u32], block_size: usize) -> Vec<BlockKey> {
    let mut key = root_key(namespace);
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            key = chain_key(&key, block);
            key
        })
        .collect()
}

/// The copies a step needs before it runs, in this order: every `spill` (host slot → disk: an
/// entry the full host tier dropped, with a disk tier below), every `offload` (GPU block → host
/// slot: an evicted block written back), then every `load` (host slot → GPU block: a host hit
/// brought back). A GPU block may appear in both offload and load (evicted, then reused for a
/// load), a host slot in spill and offload (dropped, then reused): reading out first keeps both
/// right.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvMoves {
    pub spill: Vec<(HostSlot, BlockKey)>,
    pub offload: Vec<(BlockId, HostSlot)>,
    pub load: Vec<(HostSlot, BlockId)>,
}

impl KvMoves {
    pub fn is_empty(&self) -> bool {
        self.spill.is_empty() && self.offload.is_empty() && self.load.is_empty()
    }
}

/// Counters of the host tier since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostTierStats {
    /// Host slots in all.
    pub num_slots: usize,
    /// Slots holding a block now.
    pub num_used: usize,
    /// Blocks written back from the GPU pool.
    pub num_offloaded: u64,
    /// Blocks copied back to the GPU pool (host hits).
    pub num_loaded: u64,
    /// Blocks dropped from the host tier to make room (lost: a later hit recomputes them).
    pub num_dropped: u64,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    slot: HostSlot,
    last_access: u64,
}

/// The host tier's slots and index; see the module docs.
#[derive(Clone, Debug)]
pub struct HostTier {
    entries: HashMap<BlockKey, Entry>,
    /// `(last_access, slot)` of every entry: the eviction order, oldest first.
    lru: BTreeSet<(u64, HostSlot)>,
    /// [num_slots] the key held by each slot.
    by_slot: Vec<Option<BlockKey>>,
    free: Vec<HostSlot>,
    /// Slots read by this step's loads: not dropped before the moves have run.
    pending: BTreeSet<HostSlot>,
    /// Slots given to blocks whose bytes this step's moves have yet to write: a drop of one
    /// spills nothing (the bytes are not there yet).
    fresh: BTreeSet<HostSlot>,
    /// With a disk tier below: entries dropped since the last [`HostTier::take_dropped`], to
    /// spill (slot, key), whose bytes are still in the slot until the moves run.
    dropped: Option<Vec<(HostSlot, BlockKey)>>,
    clock: u64,
    stats: HostTierStats,
}

impl HostTier {
    /// An empty tier of `num_slots` blocks.
    pub fn new(num_slots: usize) -> Self {
        let num_slots = num_slots.min(HostSlot::MAX as usize);
        HostTier {
            entries: HashMap::new(),
            lru: BTreeSet::new(),
            by_slot: vec![None; num_slots],
            free: (0..num_slots as HostSlot).rev().collect(),
            pending: BTreeSet::new(),
            fresh: BTreeSet::new(),
            dropped: None,
            clock: 0,
            stats: HostTierStats { num_slots, ..HostTierStats::default() },
        }
    }

    pub fn num_slots(&self) -> usize {
        self.by_slot.len()
    }

    pub fn contains(&self, key: &BlockKey) -> bool {
        self.entries.contains_key(key)
    }

    pub fn stats(&self) -> HostTierStats {
        HostTierStats { num_used: self.entries.len(), ..self.stats }
    }

    /// Takes `key` in (a block the GPU pool evicts): returns the slot its bytes go to, dropping
    /// the least recently used entry when no slot is free; `None` when the block is already
    /// here (it is only stamped: nothing to copy) or the tier has no slot to give (it is
    /// lost).
    pub fn store(&mut self, key: BlockKey) -> Option<HostSlot> {
        self.clock += 1;
        if let Some(e) = self.entries.get_mut(&key) {
            self.lru.remove(&(e.last_access, e.slot));
            e.last_access = self.clock;
            self.lru.insert((e.last_access, e.slot));
            return None;
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let oldest =
                    self.lru.iter().map(|&(_, s)| s).find(|s| !self.pending.contains(s))?;
                let old = self.by_slot[oldest as usize].expect("an indexed slot holds a key");
                self.remove(&old);
                self.stats.num_dropped += 1;
                if let Some(dropped) =
                    self.dropped.as_mut().filter(|_| !self.fresh.contains(&oldest))
                {
                    dropped.push((oldest, old));
                }
                self.free.pop().expect("just freed")
            }
        };
        self.entries.insert(key, Entry { slot, last_access: self.clock });
        self.lru.insert((self.clock, slot));
        self.by_slot[slot as usize] = Some(key);
        self.stats.num_offloaded += 1;
        self.fresh.insert(slot);
        Some(slot)
    }

    /// Keeps the entries dropped from now on for [`HostTier::take_dropped`] (a disk tier).
    pub fn keep_dropped(&mut self) {
        self.dropped.get_or_insert_with(Vec::new);
    }

    /// The entries dropped since the last call whose bytes are in their slot: spill them
    /// before the moves that follow write the slots.
    pub fn take_dropped(&mut self) -> Vec<(HostSlot, BlockKey)> {
        self.dropped.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Every entry, `(key, slot)`, least recently used first.
    pub fn entries_by_age(&self) -> Vec<(BlockKey, HostSlot)> {
        let key = |s: HostSlot| self.by_slot[s as usize].expect("an indexed slot holds a key");
        self.lru.iter().map(|&(_, s)| (key(s), s)).collect()
    }

    /// `key`'s slot, for a load back to the GPU: the entry stays (stamped as used now) and is
    /// not dropped before [`HostTier::release_pending`]. `None` if the key is not here.
    pub fn load(&mut self, key: &BlockKey) -> Option<HostSlot> {
        self.clock += 1;
        let e = self.entries.get_mut(key)?;
        self.lru.remove(&(e.last_access, e.slot));
        e.last_access = self.clock;
        self.lru.insert((e.last_access, e.slot));
        self.pending.insert(e.slot);
        self.stats.num_loaded += 1;
        Some(e.slot)
    }

    /// Drops every entry (`kvrun`'s cache reset); returns how many there were.
    pub fn clear(&mut self) -> usize {
        let keys: Vec<BlockKey> = self.entries.keys().copied().collect();
        for key in &keys {
            self.remove(key);
        }
        keys.len()
    }

    /// Lets this step's loaded slots be dropped again: call once their copies are taken.
    pub fn release_pending(&mut self) {
        self.pending.clear();
        self.fresh.clear();
    }

    /// Every entry's key and slot, for the property tests.
    #[cfg(test)]
    pub(super) fn entries(&self) -> Vec<(BlockKey, HostSlot)> {
        self.entries.iter().map(|(k, e)| (*k, e.slot)).collect()
    }

    fn remove(&mut self, key: &BlockKey) {
        if let Some(e) = self.entries.remove(key) {
            self.lru.remove(&(e.last_access, e.slot));
            self.by_slot[e.slot as usize] = None;
            self.free.push(e.slot);
        }
    }

    /// Every slot is exactly one of free or an entry's, and a pending slot is an entry's; the
    /// index, the LRU order and the slots agree. The message names the first violation.
    pub fn check_integrity(&self) -> Result<(), String> {
        let n = self.num_slots();
        let mut seen = vec![false; n];
        let mut mark = |slot: HostSlot, what: &str| -> Result<(), String> {
            let s = seen
                .get_mut(slot as usize)
                .ok_or_else(|| format!("host slot {slot} ({what}) out of range"))?;
            if std::mem::replace(s, true) {
                return Err(format!("host slot {slot} ({what}) is counted twice"));
            }
            Ok(())
        };
        for &slot in &self.free {
            mark(slot, "free")?;
        }
        for (key, e) in &self.entries {
            mark(e.slot, "used")?;
            if self.by_slot[e.slot as usize] != Some(*key) {
                return Err(format!("host slot {} does not name its entry", e.slot));
            }
            if !self.lru.contains(&(e.last_access, e.slot)) {
                return Err(format!("host slot {} is missing from the LRU order", e.slot));
            }
        }
        if self.lru.len() != self.entries.len() {
            return Err(format!(
                "{} LRU entries, {} host entries",
                self.lru.len(),
                self.entries.len()
            ));
        }
        if let Some(slot) = seen.iter().position(|&s| !s) {
            return Err(format!("host slot {slot} is neither free nor used"));
        }
        if let Some(slot) = self.pending.iter().find(|&&s| self.by_slot[s as usize].is_none()) {
            return Err(format!("host slot {slot} is being loaded but holds nothing"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> BlockKey {
        chain_key(&root_key(None), &[i])
    }

    #[test]
    fn keys_chain_over_the_whole_prefix_and_the_namespace() {
        let a = chain_keys(None, &[1, 2, 3, 4], 2);
        let b = chain_keys(None, &[9, 9, 3, 4], 2);
        assert_eq!(a.len(), 2);
        assert_ne!(a[1], b[1], "same block after another prefix");
        assert_ne!(a, chain_keys(Some(1), &[1, 2, 3, 4], 2), "namespaces share nothing");
        assert_eq!(a, chain_keys(None, &[1, 2, 3, 4, 5], 2), "partial blocks have no key");
    }

    #[test]
    fn full_tier_drops_the_least_recently_used() {
        let mut t = HostTier::new(2);
        let s0 = t.store(key(0)).unwrap();
        let s1 = t.store(key(1)).unwrap();
        assert_eq!(t.store(key(0)), None, "already here: stamped");
        let s2 = t.store(key(2)).unwrap();
        assert_eq!(s2, s1, "key 1 was the oldest");
        assert!(t.contains(&key(0)) && !t.contains(&key(1)));
        assert_eq!(t.stats().num_dropped, 1);
        assert_ne!(s0, s2);
        t.check_integrity().unwrap();
    }

    #[test]
    fn a_loaded_slot_is_not_reused_before_the_moves_ran() {
        let mut t = HostTier::new(1);
        let s = t.store(key(0)).unwrap();
        assert_eq!(t.load(&key(0)), Some(s));
        assert!(t.contains(&key(0)), "inclusive: the host copy stays");
        assert_eq!(t.store(key(0)), None, "evicted again: nothing to copy");
        assert_eq!(t.store(key(1)), None, "the only slot is still being read");
        t.check_integrity().unwrap();
        t.release_pending();
        assert_eq!(t.store(key(1)), Some(s));
        assert!(!t.contains(&key(0)));
        assert_eq!(t.clear(), 1);
        assert_eq!(t.stats().num_used, 0);
        t.check_integrity().unwrap();
    }

    #[test]
    fn no_slots_no_tier() {
        let mut t = HostTier::new(0);
        assert_eq!(t.store(key(0)), None);
        t.check_integrity().unwrap();
    }
}
