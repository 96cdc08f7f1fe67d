//! [`BlockTable`]: one sequence's block ids in token order, and the slot of each of its tokens.
//!
//! Token position `pos` lives in block `blocks[pos / block_size]` at offset `pos % block_size`, so
//! its slot (its row in every layer's K and V buffers) is
//! `blocks[pos / block_size] × block_size + pos % block_size`. Blocks are claimed lazily: a table
//! always holds exactly `ceil(num_tokens / block_size)` entries.
//!
//! A sliding-window group drops the blocks that fall wholly before the window
//! ([`BlockTable::drop_before`]): their entries become [`NULL_BLOCK`] (the GPU never reads them:
//! the attention kernels start at the window), so the live blocks stay bounded however long the
//! sequence grows.

use std::ops::Range;

use super::block_pool::{BlockId, BlockPool};
use super::error::KvError;

/// The entry of a dropped block (out of a sliding window): no block, never read.
pub const NULL_BLOCK: BlockId = BlockId::MAX;

/// The blocks of one sequence. Every live block in it holds one reference in the [`BlockPool`]
/// the table was grown from; give them back with [`BlockTable::release`] before dropping the
/// table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockTable {
    /// [num_blocks] block ids, in token order; the first `num_dropped` are [`NULL_BLOCK`].
    blocks: Vec<BlockId>,
    /// Leading entries dropped by [`BlockTable::drop_before`].
    num_dropped: usize,
    /// Tokens reserved so far; `ceil(num_tokens / block_size) == blocks.len()`.
    num_tokens: usize,
    block_size: usize,
}

impl BlockTable {
    /// An empty table. Panics if `block_size` is 0 (a [`super::KvLayout`] never has one).
    pub fn new(block_size: usize) -> Self {
        assert!(block_size > 0, "block_size must be at least 1");
        BlockTable { blocks: Vec::new(), num_dropped: 0, num_tokens: 0, block_size }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Tokens reserved in this table.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Entries (live blocks and dropped ones): `ceil(num_tokens / block_size)`.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks held (entries not dropped).
    pub fn num_live_blocks(&self) -> usize {
        self.blocks.len() - self.num_dropped
    }

    /// Leading entries dropped out of a sliding window.
    pub fn num_dropped(&self) -> usize {
        self.num_dropped
    }

    /// The live blocks, in token order.
    pub fn live_blocks(&self) -> &[BlockId] {
        &self.blocks[self.num_dropped..]
    }

    /// Blocks completely filled with reserved tokens (the ones that may be shared).
    pub fn num_full_blocks(&self) -> usize {
        self.num_tokens / self.block_size
    }

    /// Tokens the held blocks can take: `num_blocks × block_size`.
    pub fn capacity(&self) -> usize {
        self.blocks.len() * self.block_size
    }

    /// The block ids in token order, dropped ones as [`NULL_BLOCK`]: the row the GPU reads for
    /// this sequence.
    pub fn as_slice(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Slot of the token at `pos`: `block_id × block_size + pos % block_size`. O(1).
    ///
    /// Panics if `pos ≥ num_tokens` (reserve positions with [`BlockTable::append_tokens`] first),
    /// if its block was dropped, or if the slot does not fit in `u32` (prevented by
    /// [`super::KvManager::new`]).
    #[track_caller]
    pub fn slot(&self, pos: usize) -> u32 {
        assert!(
            pos < self.num_tokens,
            "position {pos} is not reserved (table holds {} tokens)",
            self.num_tokens
        );
        assert!(pos / self.block_size >= self.num_dropped, "position {pos} was dropped");
        let block = u64::from(self.blocks[pos / self.block_size]);
        let slot = block * self.block_size as u64 + (pos % self.block_size) as u64;
        u32::try_from(slot).expect("slot beyond u32: pool too large for its block size")
    }

    /// Slots of the tokens at `positions`, in order. O(len). Panics like [`BlockTable::slot`].
    #[track_caller]
    pub fn slot_mapping(&self, positions: Range<usize>) -> Vec<u32> {
        positions.map(|pos| self.slot(pos)).collect()
    }

    /// Extra blocks this table must claim to hold `new_total_tokens` tokens (0 if it already can).
    pub fn blocks_needed_for(&self, new_total_tokens: usize) -> usize {
        new_total_tokens.div_ceil(self.block_size).saturating_sub(self.blocks.len())
    }

    /// Reserves `n` more token positions (`num_tokens..num_tokens + n`), claiming from `pool` only
    /// the blocks those positions enter. All or nothing: on [`KvError::OutOfBlocks`] neither the
    /// table nor the pool changed. O(n / block_size).
    pub fn append_tokens(&mut self, pool: &mut BlockPool, n: usize) -> Result<(), KvError> {
        let new_total = self.num_tokens + n;
        let needed = self.blocks_needed_for(new_total);
        let new_blocks = pool
            .allocate_n(needed)
            .ok_or(KvError::OutOfBlocks { needed, free: pool.num_free() })?;
        self.blocks.extend(new_blocks);
        self.num_tokens = new_total;
        Ok(())
    }

    /// Drops this table's reference to each of its blocks (freeing those it alone held) and
    /// empties it. O(num_blocks).
    pub fn release(&mut self, pool: &mut BlockPool) {
        for id in self.blocks.drain(self.num_dropped..) {
            pool.decref(id);
        }
        self.blocks.clear();
        self.num_dropped = 0;
        self.num_tokens = 0;
    }

    /// Drops this table's reference to every block that lies wholly before position `pos`
    /// (its last position `< pos`), leaving [`NULL_BLOCK`] entries: a sliding window whose next
    /// query reads keys from `pos` on. Returns the blocks dropped (each freed unless someone
    /// else holds it). Call between steps, when no GPU work reads them. O(dropped).
    pub fn drop_before(&mut self, pool: &mut BlockPool, pos: usize) -> Vec<BlockId> {
        let end = (pos / self.block_size).min(self.blocks.len());
        let mut dropped = Vec::new();
        for entry in self.blocks.iter_mut().take(end).skip(self.num_dropped) {
            let id = std::mem::replace(entry, NULL_BLOCK);
            pool.decref(id);
            dropped.push(id);
        }
        self.num_dropped = self.num_dropped.max(end);
        dropped
    }

    /// A new table that shares this one's full blocks (one `incref` each) and holds
    /// `num_full_blocks × block_size` tokens. The partial last block is not shared: the fork
    /// claims its own block when it appends, so shared blocks are never written. O(num_blocks).
    pub fn fork(&self, pool: &mut BlockPool) -> BlockTable {
        let full = self.num_full_blocks();
        let dropped = self.num_dropped.min(full);
        let mut table = BlockTable::from_shared(pool, &self.blocks[dropped..full], self.block_size);
        table.blocks.splice(0..0, std::iter::repeat_n(NULL_BLOCK, dropped));
        table.num_dropped = dropped;
        table.num_tokens = full * self.block_size;
        table
    }

    /// A new table whose first blocks are `blocks`, already full and held by someone else (a
    /// parent sequence, the prefix cache): takes one reference on each (`incref`) and holds
    /// `blocks.len() × block_size` tokens. The table never writes them: its next token starts a
    /// new block. Panics if a block is free (see [`BlockPool::incref`]). O(blocks.len()).
    pub fn from_shared(pool: &mut BlockPool, blocks: &[BlockId], block_size: usize) -> BlockTable {
        assert!(block_size > 0, "block_size must be at least 1");
        for &id in blocks {
            pool.incref(id);
        }
        BlockTable {
            blocks: blocks.to_vec(),
            num_dropped: 0,
            num_tokens: blocks.len() * block_size,
            block_size,
        }
    }

    /// Like [`BlockTable::from_shared`], after `num_dropped` dropped entries: a sliding table
    /// that starts at the first block a window sees. Holds `(num_dropped + blocks.len()) ×
    /// block_size` tokens. O(num_dropped + blocks.len()).
    pub fn from_shared_after(
        pool: &mut BlockPool,
        num_dropped: usize,
        blocks: &[BlockId],
        block_size: usize,
    ) -> BlockTable {
        let mut table = BlockTable::from_shared(pool, blocks, block_size);
        table.blocks.splice(0..0, std::iter::repeat_n(NULL_BLOCK, num_dropped));
        table.num_dropped = num_dropped;
        table.num_tokens = table.blocks.len() * block_size;
        table
    }

    /// Replaces the full block at `idx` by `block`, which holds the same KV (a cached copy):
    /// takes a reference on `block` and drops this table's reference on the old one (freeing it
    /// if that was the last). Call between steps, when no GPU work reads the old block. O(1).
    ///
    /// Panics if block `idx` is not full or `block` is free.
    pub fn swap_block(&mut self, pool: &mut BlockPool, idx: usize, block: BlockId) {
        assert!(idx < self.num_full_blocks(), "block {idx} of the table is not full");
        assert!(idx >= self.num_dropped, "block {idx} of the table was dropped");
        pool.incref(block);
        pool.decref(std::mem::replace(&mut self.blocks[idx], block));
    }

    /// Checks the table's own invariants: `ceil(num_tokens / block_size)` entries, exactly the
    /// first `num_dropped` null, no block twice. O(num_blocks log num_blocks).
    pub fn check_integrity(&self) -> Result<(), String> {
        let want = self.num_tokens.div_ceil(self.block_size);
        if self.blocks.len() != want {
            return Err(format!(
                "table of {} tokens holds {} blocks, expected {want}",
                self.num_tokens,
                self.blocks.len()
            ));
        }
        let nulls = self.blocks.iter().filter(|&&id| id == NULL_BLOCK).count();
        if nulls != self.num_dropped {
            return Err(format!(
                "table has {nulls} null entries, {} dropped ones",
                self.num_dropped
            ));
        }
        if self.blocks[..self.num_dropped].iter().any(|&id| id != NULL_BLOCK) {
            return Err("a dropped entry holds a block".into());
        }
        let mut sorted = self.live_blocks().to_vec();
        sorted.sort_unstable();
        match sorted.windows(2).find(|w| w[0] == w[1]) {
            Some(w) => Err(format!("block {} appears twice in one table", w[0])),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_blocks_lazily() {
        let mut pool = BlockPool::new(4);
        let mut table = BlockTable::new(4);
        assert_eq!(table.blocks_needed_for(5), 2);
        table.append_tokens(&mut pool, 5).unwrap();
        assert_eq!((table.num_tokens(), table.num_blocks(), table.capacity()), (5, 2, 8));
        table.append_tokens(&mut pool, 3).unwrap(); // fills block 1, claims nothing
        assert_eq!(table.num_blocks(), 2);
        assert_eq!(table.blocks_needed_for(8), 0);
        assert_eq!(table.blocks_needed_for(9), 1);
        table.append_tokens(&mut pool, 0).unwrap();
        assert_eq!(pool.num_free(), 2);
        table.check_integrity().unwrap();
    }

    #[test]
    fn slots_follow_the_table_not_the_position() {
        let mut pool = BlockPool::new(4);
        let mut other = BlockTable::new(4);
        other.append_tokens(&mut pool, 4).unwrap(); // takes block 0
        let mut table = BlockTable::new(4);
        table.append_tokens(&mut pool, 4).unwrap(); // block 1
        other.release(&mut pool); // block 0 goes to the back of the free list
        table.append_tokens(&mut pool, 3).unwrap(); // block 2
        assert_eq!(table.as_slice(), &[1, 2]);
        assert_eq!(table.slot(0), 4);
        assert_eq!(table.slot(3), 7);
        assert_eq!(table.slot(4), 8);
        assert_eq!(table.slot_mapping(2..7), vec![6, 7, 8, 9, 10]);
    }

    #[test]
    #[should_panic(expected = "position 5 is not reserved")]
    fn slot_past_the_reserved_tokens_panics() {
        let mut pool = BlockPool::new(4);
        let mut table = BlockTable::new(4);
        table.append_tokens(&mut pool, 5).unwrap();
        table.slot(5);
    }

    #[test]
    fn out_of_blocks_changes_nothing() {
        let mut pool = BlockPool::new(4);
        let mut table = BlockTable::new(4);
        table.append_tokens(&mut pool, 6).unwrap();
        let before = table.clone();
        let err = table.append_tokens(&mut pool, 11).unwrap_err();
        assert_eq!(err, KvError::OutOfBlocks { needed: 3, free: 2 });
        assert_eq!(table, before);
        assert_eq!(pool.num_free(), 2);
        table.append_tokens(&mut pool, 10).unwrap(); // exactly fills the pool
        assert_eq!(pool.num_free(), 0);
        pool.check_integrity().unwrap();
    }

    #[test]
    fn dropping_before_a_window_frees_whole_blocks_only() {
        let mut pool = BlockPool::new(4);
        let mut table = BlockTable::new(4);
        table.append_tokens(&mut pool, 11).unwrap(); // blocks 0, 1, 2
        assert_eq!(table.drop_before(&mut pool, 7), vec![0]); // block 1 holds position 7
        assert_eq!(table.as_slice(), &[NULL_BLOCK, 1, 2]);
        assert_eq!((table.num_live_blocks(), table.num_dropped()), (2, 1));
        assert_eq!(table.drop_before(&mut pool, 7), Vec::<BlockId>::new());
        assert_eq!(table.slot(7), 7);
        table.check_integrity().unwrap();
        let fork = table.fork(&mut pool);
        assert_eq!(fork.as_slice(), &[NULL_BLOCK, 1]);
        fork.check_integrity().unwrap();
        let mut fork = fork;
        fork.release(&mut pool);
        assert_eq!(table.drop_before(&mut pool, 100), vec![1, 2]);
        assert_eq!(table.num_live_blocks(), 0);
        table.append_tokens(&mut pool, 2).unwrap(); // position 12 starts a new block
        assert_eq!(table.as_slice(), &[NULL_BLOCK, NULL_BLOCK, NULL_BLOCK, 3]);
        table.release(&mut pool);
        assert_eq!(pool.num_free(), 4);
        pool.check_integrity().unwrap();
    }

    #[test]
    #[should_panic(expected = "position 3 was dropped")]
    fn slot_of_a_dropped_position_panics() {
        let mut pool = BlockPool::new(4);
        let mut table = BlockTable::new(4);
        table.append_tokens(&mut pool, 6).unwrap();
        table.drop_before(&mut pool, 4);
        table.slot(3);
    }

    #[test]
    fn release_returns_every_block() {
        let mut pool = BlockPool::new(4);
        let mut table = BlockTable::new(3);
        table.append_tokens(&mut pool, 10).unwrap();
        assert_eq!(pool.num_free(), 0);
        table.release(&mut pool);
        assert_eq!((table.num_tokens(), table.num_blocks()), (0, 0));
        assert_eq!(pool.num_free(), 4);
        pool.check_integrity().unwrap();
    }

    #[test]
    fn fork_shares_full_blocks_only() {
        let mut pool = BlockPool::new(4);
        let mut parent = BlockTable::new(4);
        parent.append_tokens(&mut pool, 9).unwrap(); // blocks 0, 1 full; block 2 partial
        let mut child = parent.fork(&mut pool);
        assert_eq!(child.as_slice(), &[0, 1]);
        assert_eq!(child.num_tokens(), 8);
        assert_eq!((pool.ref_count(0), pool.ref_count(1), pool.ref_count(2)), (2, 2, 1));
        child.append_tokens(&mut pool, 1).unwrap(); // its own block for position 8
        assert_eq!(child.as_slice(), &[0, 1, 3]);
        assert_ne!(child.slot(8), parent.slot(8));
        parent.release(&mut pool);
        assert_eq!(pool.num_free(), 1); // block 2 only; 0 and 1 still held by the child
        child.release(&mut pool);
        assert_eq!(pool.num_free(), 4);
        pool.check_integrity().unwrap();
    }

    #[test]
    fn integrity_catches_wrong_block_count() {
        let table = BlockTable { blocks: vec![0, 0], num_dropped: 0, num_tokens: 5, block_size: 4 };
        assert_eq!(table.check_integrity(), Err("block 0 appears twice in one table".into()));
        let table = BlockTable { blocks: vec![0], num_dropped: 0, num_tokens: 5, block_size: 4 };
        assert!(table.check_integrity().unwrap_err().contains("expected 2"));
    }
}
