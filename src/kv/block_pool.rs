//! [`BlockPool`]: the fixed set of KV block ids, a FIFO free list and a ref count per block.
//!
//! A block with ref count 0 is free and sits in the free list exactly once; a block with ref
//! count ≥ 1 is held by that many owners (block tables, later the prefix cache) and is not in the
//! free list. Sharing a block is `incref`; every owner drops it with `decref`, and the last one
//! returns it to the free list. The pool knows nothing about tokens or sequences.

use std::collections::VecDeque;

/// Index of a block in the pool; the same id addresses the same slot range in every layer's K
/// and V buffers. A block table is a `u32` array of these.
pub type BlockId = u32;

/// Block ids `0..num_blocks` with ref counts and a free list.
///
/// Allocation order is FIFO: initially ascending ids, and a freed block goes to the back, so the
/// most recently freed blocks are reused last (deterministic for a given history of calls).
#[derive(Clone, Debug)]
pub struct BlockPool {
    /// [num_blocks] owners of each block; 0 = free.
    ref_counts: Vec<u32>,
    /// [num_free] free block ids, next to allocate at the front.
    free: VecDeque<BlockId>,
}

impl BlockPool {
    /// A pool with every block free. O(num_blocks).
    ///
    /// Panics if `num_blocks` exceeds 2^32 (ids are `u32`); callers size pools from a byte budget
    /// through [`super::KvManager::new`], which reports that as an error first.
    pub fn new(num_blocks: usize) -> Self {
        assert!(
            num_blocks == 0 || BlockId::try_from(num_blocks - 1).is_ok(),
            "a block pool holds at most 2^32 blocks (u32 ids), asked for {num_blocks}"
        );
        BlockPool {
            ref_counts: vec![0; num_blocks],
            free: (0..num_blocks).map(|id| id as BlockId).collect(),
        }
    }

    /// Total number of blocks, free or used.
    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks in the free list (ref count 0).
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Blocks with at least one owner.
    pub fn num_used(&self) -> usize {
        self.num_blocks() - self.num_free()
    }

    /// Fraction of blocks in use, in `0.0..=1.0` (0 for an empty pool). The
    /// `kv_cache_usage_perc` metric.
    pub fn usage(&self) -> f32 {
        match self.num_blocks() {
            0 => 0.0,
            n => self.num_used() as f32 / n as f32,
        }
    }

    /// Owners of block `id` (0 = free). Panics if `id` is out of range.
    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.ref_counts[id as usize]
    }

    /// Takes the next free block with ref count 1, or `None` when the pool is empty. O(1).
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = self.free.pop_front()?;
        self.ref_counts[id as usize] = 1;
        Some(id)
    }

    /// Takes `n` free blocks (ref count 1 each), in allocation order, or `None` and no change when
    /// fewer than `n` are free. O(n).
    pub fn allocate_n(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.free.len() {
            return None;
        }
        let ids: Vec<BlockId> = self.free.drain(..n).collect();
        for &id in &ids {
            self.ref_counts[id as usize] = 1;
        }
        Some(ids)
    }

    /// Adds an owner to a used block (sharing it). O(1).
    ///
    /// Panics if the block is free: only a block someone holds can be shared, so this is a bug in
    /// the caller's bookkeeping, not a user error.
    pub fn incref(&mut self, id: BlockId) {
        let count = &mut self.ref_counts[id as usize];
        assert!(*count > 0, "incref of free block {id}: share only blocks you hold");
        *count = count.checked_add(1).unwrap_or_else(|| panic!("block {id} has 2^32 owners"));
    }

    /// Drops one owner of a used block; returns `true` when that was the last one and the block
    /// went back to the free list (at the back). O(1).
    ///
    /// Panics if the block is already free (a double free: a bug in the caller's bookkeeping).
    pub fn decref(&mut self, id: BlockId) -> bool {
        let count = &mut self.ref_counts[id as usize];
        assert!(*count > 0, "decref of free block {id}: double free");
        *count -= 1;
        if *count == 0 {
            self.free.push_back(id);
            return true;
        }
        false
    }

    /// Checks the pool's invariants: every id in range, in the free list at most once and then
    /// with ref count 0; every id not in the free list has ref count ≥ 1; free + used = total.
    /// O(num_blocks). For tests and debug assertions; the message names the first violation.
    pub fn check_integrity(&self) -> Result<(), String> {
        let mut in_free_list = vec![false; self.num_blocks()];
        for &id in &self.free {
            let seen = in_free_list
                .get_mut(id as usize)
                .ok_or_else(|| format!("free list holds block {id}, out of range"))?;
            if *seen {
                return Err(format!("block {id} is in the free list twice"));
            }
            *seen = true;
            if self.ref_counts[id as usize] != 0 {
                let count = self.ref_counts[id as usize];
                return Err(format!("free block {id} has ref count {count}"));
            }
        }
        let zero_refs = self.ref_counts.iter().filter(|&&c| c == 0).count();
        if zero_refs != self.free.len() {
            let lost = (0..self.num_blocks())
                .find(|&id| self.ref_counts[id] == 0 && !in_free_list[id])
                .map_or(String::new(), |id| format!(" (block {id})"));
            return Err(format!(
                "{zero_refs} blocks have ref count 0 but {} are in the free list{lost}",
                self.free.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_allocation_order() {
        let mut pool = BlockPool::new(4);
        assert_eq!(pool.allocate(), Some(0));
        assert_eq!(pool.allocate(), Some(1));
        assert!(pool.decref(0));
        assert_eq!(pool.allocate_n(2), Some(vec![2, 3]));
        assert_eq!(pool.allocate(), Some(0)); // freed blocks are reused last
        assert_eq!(pool.allocate(), None);
        assert_eq!(pool.num_free(), 0);
        assert_eq!(pool.usage(), 1.0);
        pool.check_integrity().unwrap();
    }

    #[test]
    fn allocate_n_is_all_or_nothing() {
        let mut pool = BlockPool::new(4);
        pool.allocate().unwrap();
        assert_eq!(pool.allocate_n(4), None);
        assert_eq!(pool.num_free(), 3);
        assert_eq!(pool.allocate_n(0), Some(vec![]));
        assert_eq!(pool.allocate_n(3), Some(vec![1, 2, 3]));
        pool.check_integrity().unwrap();
    }

    #[test]
    fn shared_block_is_freed_by_its_last_owner() {
        let mut pool = BlockPool::new(4);
        let id = pool.allocate().unwrap();
        pool.incref(id);
        assert_eq!(pool.ref_count(id), 2);
        assert!(!pool.decref(id));
        assert_eq!(pool.num_used(), 1);
        assert!(pool.decref(id));
        assert_eq!(pool.num_used(), 0);
        assert_eq!(pool.usage(), 0.0);
        pool.check_integrity().unwrap();
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_panics() {
        let mut pool = BlockPool::new(4);
        let id = pool.allocate().unwrap();
        pool.decref(id);
        pool.decref(id);
    }

    #[test]
    #[should_panic(expected = "incref of free block 2")]
    fn sharing_a_free_block_panics() {
        BlockPool::new(4).incref(2);
    }

    #[test]
    fn integrity_names_the_violation() {
        let mut pool = BlockPool::new(4);
        pool.free.push_back(1);
        assert_eq!(pool.check_integrity(), Err("block 1 is in the free list twice".into()));

        let mut pool = BlockPool::new(4);
        pool.allocate();
        pool.ref_counts[0] = 0; // leaked: neither used nor free
        let err = pool.check_integrity().unwrap_err();
        assert!(err.contains("(block 0)"), "{err}");

        let mut pool = BlockPool::new(4);
        pool.ref_counts[3] = 1; // used but still in the free list
        let err = pool.check_integrity().unwrap_err();
        assert_eq!(err, "free block 3 has ref count 1");

        let mut pool = BlockPool::new(4);
        pool.free.push_back(9);
        assert!(pool.check_integrity().unwrap_err().contains("out of range"));
    }

    #[test]
    fn empty_pool() {
        let mut pool = BlockPool::new(0);
        assert_eq!(pool.allocate(), None);
        assert_eq!(pool.usage(), 0.0);
        pool.check_integrity().unwrap();
    }
}
