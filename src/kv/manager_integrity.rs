//! [`KvManager::check_integrity`]: every invariant of the manager, its pool, tables and cache,
//! for the tests and the scheduler's debug checks.

use std::collections::HashMap;

use super::*;

impl KvManager {
    /// Checks every invariant: the pool's and the cache's own; each table's own (right block
    /// count, no block twice, the layout's block size); each block's ref count = tables holding
    /// it + 1 if cached (as a node or a companion); each table starts with its sequence's locked
    /// cached path (the anchor's blocks, a full group's companions; a sliding table the path's
    /// companions or dropped entries) and holds no other cached block; a sliding table holds
    /// no block before its window and at most its live bound; and each node's lock count is
    /// the number of sequences whose path runs through it. O(num_blocks + Σ table lengths × depth). The
    /// message names the first violation.
    pub fn check_integrity(&self) -> Result<(), String> {
        self.pool.check_integrity()?;
        let mut holders = vec![0u32; self.pool.num_blocks()];
        let mut locks: HashMap<BlockId, u32> = HashMap::new();
        for (seq, s) in &self.seqs {
            self.check_tables(*seq, s)?;
            for &id in s.tables.iter().flat_map(BlockTable::live_blocks) {
                let held = holders
                    .get_mut(id as usize)
                    .ok_or_else(|| format!("sequence {seq} holds block {id}, out of range"))?;
                *held += 1;
            }
            self.check_cached_prefix(*seq, s, &mut locks)?;
        }
        if let Some(cache) = &self.cache {
            cache.check_integrity(&self.pool)?;
            let mut taken = cache.check_snapshots()?;
            let mut targets: Vec<u32> =
                self.seqs.values().filter_map(|s| s.snapshot_target).map(|t| t.slot).collect();
            taken.sort_unstable();
            targets.sort_unstable();
            if taken != targets {
                return Err(format!(
                    "snapshot slots {taken:?} are neither free nor cached; sequences write {targets:?}"
                ));
            }
            for id in 0..self.pool.num_blocks() as BlockId {
                holders[id as usize] += u32::from(cache.holds(id));
                let Some(count) = cache.lock_count(id) else { continue };
                let want = locks.get(&id).copied().unwrap_or(0);
                if count != want {
                    return Err(format!("cached block {id}: lock count {count}, {want} paths"));
                }
            }
        }
        for (id, &count) in holders.iter().enumerate() {
            let refs = self.pool.ref_count(id as BlockId);
            if count != refs {
                return Err(format!(
                    "block {id}: {count} holders (tables + prefix cache), ref count {refs}"
                ));
            }
        }
        self.check_tier()?;
        self.check_quotas()
    }

    /// The tables part of [`KvManager::check_integrity`]: one per group, each sound, with the
    /// layout's block size and the same tokens; a sliding table holds no block wholly before
    /// the window of the query at its last slide, hence at most
    /// [`GroupKind::max_live_blocks`] for the tokens reserved since.
    fn check_tables(&self, seq: SeqId, s: &SeqKv) -> Result<(), String> {
        if s.tables.len() != self.groups.len() {
            return Err(format!(
                "sequence {seq}: {} tables, {} groups",
                s.tables.len(),
                self.groups.len()
            ));
        }
        let num_tokens = s.tables[0].num_tokens();
        for (g, table) in s.tables.iter().enumerate() {
            table.check_integrity().map_err(|e| format!("sequence {seq}, group {g}: {e}"))?;
            if table.block_size() != self.layout.block_size || table.num_tokens() != num_tokens {
                return Err(format!("sequence {seq}, group {g}: wrong block size or tokens"));
            }
            let kind = self.groups.kind(g);
            let Some(bound) =
                kind.max_live_blocks(self.layout.block_size, num_tokens.saturating_sub(s.slid_to))
            else {
                continue;
            };
            let first = kind.first_visible(s.slid_to);
            let stale =
                table.num_dropped() < (first / self.layout.block_size).min(table.num_blocks());
            if stale || table.num_live_blocks() > bound {
                return Err(format!(
                    "sequence {seq}, group {g}: {} live blocks ({} dropped) after sliding to \
                     {}: the bound is {bound}",
                    table.num_live_blocks(),
                    table.num_dropped(),
                    s.slid_to
                ));
            }
        }
        Ok(())
    }

    /// The per-sequence cache part of [`KvManager::check_integrity`]: adds the sequence's lock to
    /// `locks` (one per node of its path).
    fn check_cached_prefix(
        &self,
        seq: SeqId,
        s: &SeqKv,
        locks: &mut HashMap<BlockId, u32>,
    ) -> Result<(), String> {
        let Some(cache) = &self.cache else {
            return match (s.num_cached_blocks, s.locked) {
                (0, None) => Ok(()),
                _ => Err(format!("sequence {seq} has a cached prefix without a cache")),
            };
        };
        let path = match s.locked {
            Some(last) if cache.contains(last) => cache.path(last),
            Some(last) => return Err(format!("sequence {seq} locks uncached block {last}")),
            None => Vec::new(),
        };
        let table = &s.tables[cache.anchor()];
        if path.len() != s.num_cached_blocks || path.len() > table.num_full_blocks() {
            return Err(format!(
                "sequence {seq}: {} cached blocks, locked path of {}, {} full blocks",
                s.num_cached_blocks,
                path.len(),
                table.num_full_blocks()
            ));
        }
        for &id in &path {
            *locks.entry(id).or_default() += 1;
        }
        let prefix = &table.as_slice()[..path.len()];
        if prefix != path {
            return Err(format!("sequence {seq}: its table does not start with its cached path"));
        }
        for (g, table) in s.tables.iter().enumerate() {
            let (prefix, rest) = table.as_slice().split_at(path.len());
            for (idx, (&have, &node)) in prefix.iter().zip(&path).enumerate() {
                let want = cache.block_of(node, g);
                // Full tables hold the path's blocks; a sliding one may have dropped them.
                let sliding = matches!(self.groups.kind(g), GroupKind::Sliding { .. });
                if Some(have) != want && !(sliding && have == NULL_BLOCK) {
                    return Err(format!(
                        "sequence {seq}, group {g}: block {idx} is {have}, its cached node's \
                         is {want:?}"
                    ));
                }
            }
            if let Some(id) = rest.iter().find(|&&id| id != NULL_BLOCK && cache.holds(id)) {
                return Err(format!("sequence {seq} holds cached block {id} off its locked path"));
            }
        }
        Ok(())
    }
}
