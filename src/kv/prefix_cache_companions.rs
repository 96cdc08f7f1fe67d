//! The companions of [`PrefixCache`] nodes (see the module docs of `prefix_cache.rs`): the
//! blocks of the groups other than the anchor, the usable length of a cached path across a
//! sliding window, and the *loose* set (sliding companions of locked nodes that only the tree
//! holds, evictable nonetheless).

use std::collections::BTreeSet;

use super::{BlockId, BlockPool, GroupKind, Node, PrefixCache};

impl PrefixCache {
    /// The block of group `group` at `node`: the node itself for the anchor, else its companion.
    /// Panics if `node` is not cached.
    pub fn block_of(&self, node: BlockId, group: usize) -> Option<BlockId> {
        if group == self.anchor {
            return Some(node);
        }
        self.nodes[&node].companions[group]
    }

    /// Whether `block` is a loose companion (evictable while its node is locked). O(log n).
    pub fn is_loose(&self, block: BlockId) -> bool {
        self.owners
            .get(&block)
            .is_some_and(|&(node, _)| self.loose.contains(&(self.nodes[&node].last_access, block)))
    }

    /// Longest usable start of `path` (nodes from the root, as [`PrefixCache::peek`] returns):
    /// the largest `k ≤ path.len()` such that, for every sliding group, each node from the one
    /// holding the first key a query at position `k·b` sees up to node `k − 1` has that
    /// group's companion, and, with state snapshots (recurrent models), node `k − 1` holds one
    /// (`prefix_cache_snapshots.rs`). `path.len()` with one group and no snapshots.
    /// O(path.len() · g).
    pub fn usable_len(&self, path: &[BlockId]) -> usize {
        let b = self.block_size;
        // missing[i]: 1 + the last node index < i without a companion in some group, per group.
        let sliding: Vec<(usize, GroupKind)> = self
            .kinds
            .iter()
            .enumerate()
            .filter(|(_, k)| matches!(k, GroupKind::Sliding { .. }))
            .map(|(g, &k)| (g, k))
            .collect();
        if sliding.is_empty() {
            return self.snapshot_usable_len(path, path.len());
        }
        let mut last_missing = vec![vec![0usize; sliding.len()]; path.len() + 1];
        for (i, &node) in path.iter().enumerate() {
            for (j, &(g, _)) in sliding.iter().enumerate() {
                last_missing[i + 1][j] = match self.nodes[&node].companions[g] {
                    Some(_) => last_missing[i][j],
                    None => i + 1,
                };
            }
        }
        (0..=path.len())
            .rev()
            .find(|&k| {
                self.snapshot_usable_len(path, k) == k
                    && sliding
                        .iter()
                        .enumerate()
                        .all(|(j, &(_, kind))| last_missing[k][j] <= kind.first_visible(k * b) / b)
            })
            .unwrap_or(0)
    }

    /// Call after changing the pool ref count of `block`: if it is a sliding companion of a
    /// locked node, it becomes loose when only the tree holds it and stops being loose
    /// otherwise. A no-op for any other block. O(log n).
    pub fn refresh(&mut self, pool: &BlockPool, block: BlockId) {
        let Some(&(node, g)) = self.owners.get(&block) else { return };
        let node = &self.nodes[&node];
        if node.lock_count == 0 || self.kinds[g] == GroupKind::Full {
            return;
        }
        let key = (node.last_access, block);
        if pool.ref_count(block) == 1 {
            self.loose.insert(key);
        } else {
            self.loose.remove(&key);
        }
    }

    /// The companions part of [`PrefixCache::check_integrity`] for one node.
    pub(super) fn check_companions(
        &self,
        pool: &BlockPool,
        id: BlockId,
        node: &Node,
    ) -> Result<(), String> {
        if node.companions.len() != self.kinds.len() || node.companions[self.anchor].is_some() {
            return Err(format!("block {id}: companions do not match the groups"));
        }
        for (g, &c) in node.companions.iter().enumerate() {
            match c {
                None if g != self.anchor && self.kinds[g] == GroupKind::Full => {
                    return Err(format!("block {id}: no companion in full group {g}"));
                }
                None => {}
                Some(c) => {
                    if (c as usize) >= pool.num_blocks() || pool.ref_count(c) == 0 {
                        return Err(format!("companion {c} is out of range or free in the pool"));
                    }
                    if self.nodes.contains_key(&c) {
                        return Err(format!("companion {c} is also a node"));
                    }
                }
            }
        }
        Ok(())
    }

    /// Makes `block` the companion of `node` in `group`, taking the tree's reference.
    pub(super) fn add_companion(
        &mut self,
        pool: &mut BlockPool,
        node: BlockId,
        group: usize,
        block: BlockId,
    ) {
        assert!(!self.holds(block), "block {block} is already cached under another prefix");
        pool.incref(block);
        self.owners.insert(block, (node, group));
        let n = self.nodes.get_mut(&node).expect("companion's node");
        debug_assert!(n.companions[group].is_none());
        n.companions[group] = Some(block);
        let (ns, unlocked) = (n.namespace, n.lock_count == 0);
        let count = self.count_mut(ns);
        count.cached += 1;
        if unlocked {
            count.unlocked += 1;
            self.num_unlocked += 1;
        }
        self.refresh(pool, block);
    }

    /// Drops the loose companion `key.1` from its node and the tree's reference on it.
    pub(super) fn evict_loose(
        &mut self,
        pool: &mut BlockPool,
        key: (u64, BlockId),
        out: &mut Vec<BlockId>,
    ) {
        let block = key.1;
        self.loose.remove(&key);
        let (node, g) = self.owners.remove(&block).expect("a loose block is a companion");
        let n = self.nodes.get_mut(&node).expect("companion's node");
        n.companions[g] = None;
        let ns = n.namespace;
        self.count_mut(ns).cached -= 1;
        pool.decref(block);
        out.push(block);
    }

    /// The sliding-group companions `node` has. O(g).
    pub(super) fn sliding_companions(&self, node: BlockId) -> Vec<BlockId> {
        let companions = &self.nodes[&node].companions;
        companions
            .iter()
            .zip(&self.kinds)
            .filter(|(_, k)| matches!(k, GroupKind::Sliding { .. }))
            .filter_map(|(c, _)| *c)
            .collect()
    }

    /// The part of [`PrefixCache::check_integrity`] about the companion indexes: the reverse
    /// map holds exactly the companions, and the loose set exactly the sliding companions of
    /// locked nodes with pool ref count 1.
    pub(super) fn check_companion_index(&self, pool: &BlockPool) -> Result<(), String> {
        let mut owned = 0;
        for (&c, &(node, g)) in &self.owners {
            let held = self.nodes.get(&node).and_then(|n| n.companions.get(g).copied().flatten());
            if held != Some(c) {
                return Err(format!("companion {c}: the reverse map says node {node}, group {g}"));
            }
            owned += 1;
        }
        let companions: usize = self.nodes.values().map(|n| n.num_blocks() - 1).sum();
        if owned != companions {
            return Err(format!("{companions} companions, {owned} in the reverse map"));
        }
        let loose: BTreeSet<(u64, BlockId)> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.lock_count > 0)
            .flat_map(|(&id, n)| {
                self.sliding_companions(id).into_iter().map(move |c| (n.last_access, c))
            })
            .filter(|&(_, c)| pool.ref_count(c) == 1)
            .collect();
        if loose != self.loose {
            return Err("the loose set is not the sliding companions only the tree holds".into());
        }
        Ok(())
    }
}
