//! [`KvManager`]: the block pool plus one [`BlockTable`] per live sequence. The scheduler's only
//! door to KV memory: admit (`can_allocate`, `add_sequence`), grow (`reserve` → slot mapping),
//! share (`fork_sequence`) and finish (`free_sequence`).

use std::collections::HashMap;

use super::block_pool::BlockPool;
use super::block_table::BlockTable;
use super::error::KvError;
use super::layout::KvLayout;

/// Identifies a sequence (a request's running state) in the KV cache.
pub type SeqId = u64;

/// KV bookkeeping of every live sequence. Each block in a table holds one reference in the pool,
/// so a block's ref count equals the number of tables that hold it.
#[derive(Clone, Debug)]
pub struct KvManager {
    layout: KvLayout,
    pool: BlockPool,
    tables: HashMap<SeqId, BlockTable>,
}

impl KvManager {
    /// A manager over `num_blocks` blocks of `layout.block_size` tokens, all free.
    /// O(num_blocks).
    ///
    /// Errors with [`KvError::TooManySlots`] if `num_blocks × block_size` exceeds 2^32 (slots are
    /// `u32`). Zero blocks is allowed: every reservation then fails with `OutOfBlocks`.
    pub fn new(layout: KvLayout, num_blocks: usize) -> Result<Self, KvError> {
        if num_blocks as u128 * layout.block_size as u128 > 1u128 << 32 {
            return Err(KvError::TooManySlots { num_blocks, block_size: layout.block_size });
        }
        Ok(KvManager { layout, pool: BlockPool::new(num_blocks), tables: HashMap::new() })
    }

    /// A manager over the whole blocks that fit in `budget_bytes`
    /// ([`KvLayout::require_blocks_for_budget`]). Errors if that is not one block, or too many.
    pub fn from_budget(layout: KvLayout, budget_bytes: u64) -> Result<Self, KvError> {
        KvManager::new(layout, layout.require_blocks_for_budget(budget_bytes)?)
    }

    /// The layout the pool was sized with.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Read-only view of the pool (ref counts, free count).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Extra blocks `seq` must claim to hold `new_tokens` more tokens; an unknown `seq` counts as
    /// an empty table (so admission can ask before [`KvManager::add_sequence`]). O(1).
    pub fn blocks_needed(&self, seq: SeqId, new_tokens: usize) -> usize {
        match self.tables.get(&seq) {
            Some(table) => table.blocks_needed_for(table.num_tokens() + new_tokens),
            None => self.layout.blocks_for_tokens(new_tokens),
        }
    }

    /// Whether [`KvManager::reserve`] of `new_tokens` for `seq` would succeed now. O(1).
    pub fn can_allocate(&self, seq: SeqId, new_tokens: usize) -> bool {
        self.blocks_needed(seq, new_tokens) <= self.pool.num_free()
    }

    /// Starts an empty table for `seq`. Claims no blocks. Errors if `seq` is already live.
    pub fn add_sequence(&mut self, seq: SeqId) -> Result<(), KvError> {
        if self.tables.contains_key(&seq) {
            return Err(KvError::SequenceExists(seq));
        }
        self.tables.insert(seq, BlockTable::new(self.layout.block_size));
        Ok(())
    }

    /// Reserves the next `num_new_tokens` positions of `seq` and returns their slots, in order
    /// (the step's slot mapping for this sequence). Claims blocks only as positions enter them.
    /// All or nothing: on error nothing changed. O(num_new_tokens).
    pub fn reserve(&mut self, seq: SeqId, num_new_tokens: usize) -> Result<Vec<u32>, KvError> {
        let table = self.tables.get_mut(&seq).ok_or(KvError::UnknownSequence(seq))?;
        let start = table.num_tokens();
        table.append_tokens(&mut self.pool, num_new_tokens)?;
        Ok(table.slot_mapping(start..start + num_new_tokens))
    }

    /// Starts `child` as a copy of `parent` that shares the parent's full blocks (ref counts +1)
    /// and holds `num_full_blocks × block_size` tokens; the child recomputes any partial tail into
    /// its own blocks. Errors if `parent` is unknown or `child` is live. O(parent's blocks).
    pub fn fork_sequence(&mut self, parent: SeqId, child: SeqId) -> Result<(), KvError> {
        if self.tables.contains_key(&child) {
            return Err(KvError::SequenceExists(child));
        }
        let parent_table = self.tables.get(&parent).ok_or(KvError::UnknownSequence(parent))?;
        let child_table = parent_table.fork(&mut self.pool);
        self.tables.insert(child, child_table);
        Ok(())
    }

    /// The block table of `seq`, if live.
    pub fn table(&self, seq: SeqId) -> Option<&BlockTable> {
        self.tables.get(&seq)
    }

    /// Ends `seq`: drops its references, freeing blocks no other sequence shares. Errors if `seq`
    /// is not live. O(its blocks).
    pub fn free_sequence(&mut self, seq: SeqId) -> Result<(), KvError> {
        let mut table = self.tables.remove(&seq).ok_or(KvError::UnknownSequence(seq))?;
        table.release(&mut self.pool);
        Ok(())
    }

    /// Live sequences.
    pub fn num_sequences(&self) -> usize {
        self.tables.len()
    }

    /// Blocks in the pool, free or used.
    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    /// Blocks free to claim.
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    /// Fraction of blocks in use, `0.0..=1.0` (the `kv_cache_usage_perc` metric).
    pub fn usage(&self) -> f32 {
        self.pool.usage()
    }

    /// Checks every invariant: the pool's own, each table's own (right block count, no block
    /// twice, the layout's block size), and that each block's ref count equals the number of
    /// tables holding it. O(num_blocks + total table length × log). The message names the first
    /// violation.
    pub fn check_integrity(&self) -> Result<(), String> {
        self.pool.check_integrity()?;
        let mut holders = vec![0u32; self.pool.num_blocks()];
        for (seq, table) in &self.tables {
            table.check_integrity().map_err(|e| format!("sequence {seq}: {e}"))?;
            if table.block_size() != self.layout.block_size {
                return Err(format!("sequence {seq}: table has the wrong block size"));
            }
            for &id in table.as_slice() {
                let held = holders
                    .get_mut(id as usize)
                    .ok_or_else(|| format!("sequence {seq} holds block {id}, out of range"))?;
                *held += 1;
            }
        }
        for (id, &count) in holders.iter().enumerate() {
            let refs = self.pool.ref_count(id as u32);
            if count != refs {
                return Err(format!("block {id}: {count} tables hold it, ref count {refs}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvDtype;

    /// 4 blocks of 4 tokens, 2 layers × 1 KV head × head_dim 2: 16 bytes a token.
    fn tiny() -> KvManager {
        let layout = KvLayout::new(2, 1, 2, 4, KvDtype::F16).unwrap();
        KvManager::new(layout, 4).unwrap()
    }

    #[test]
    fn reserve_returns_the_new_slots() {
        let mut kv = tiny();
        kv.add_sequence(7).unwrap();
        assert_eq!(kv.reserve(7, 5).unwrap(), vec![0, 1, 2, 3, 4]);
        assert_eq!(kv.reserve(7, 1).unwrap(), vec![5]);
        kv.add_sequence(9).unwrap();
        assert_eq!(kv.reserve(9, 2).unwrap(), vec![8, 9]);
        assert_eq!(kv.table(7).unwrap().as_slice(), &[0, 1]);
        assert_eq!(kv.reserve(7, 0).unwrap(), Vec::<u32>::new());
        assert_eq!(kv.num_free_blocks(), 1);
        assert_eq!(kv.usage(), 0.75);
        kv.check_integrity().unwrap();
    }

    #[test]
    fn full_cache_says_what_to_do_and_changes_nothing() {
        let mut kv = tiny();
        kv.add_sequence(1).unwrap();
        kv.reserve(1, 10).unwrap();
        assert!(kv.can_allocate(1, 6));
        assert!(!kv.can_allocate(1, 7));
        assert!(kv.can_allocate(2, 4)); // unknown sequence = empty table
        assert!(!kv.can_allocate(2, 5));
        let err = kv.reserve(1, 7).unwrap_err();
        assert_eq!(
            err.to_string(),
            "KV cache is full: need 2 more blocks, 1 free; \
             raise --kv-cache-memory or lower --max-num-seqs / -c"
        );
        assert_eq!(kv.table(1).unwrap().num_tokens(), 10);
        assert_eq!(kv.num_free_blocks(), 1);
        kv.check_integrity().unwrap();
    }

    #[test]
    fn free_returns_blocks_and_ids_are_checked() {
        let mut kv = tiny();
        kv.add_sequence(1).unwrap();
        assert_eq!(kv.add_sequence(1), Err(KvError::SequenceExists(1)));
        assert_eq!(kv.reserve(2, 1), Err(KvError::UnknownSequence(2)));
        kv.reserve(1, 16).unwrap();
        kv.free_sequence(1).unwrap();
        assert_eq!(kv.free_sequence(1), Err(KvError::UnknownSequence(1)));
        assert_eq!(kv.num_free_blocks(), 4);
        assert_eq!(kv.num_sequences(), 0);
        kv.check_integrity().unwrap();
    }

    #[test]
    fn fork_shares_full_blocks_until_the_last_holder_frees() {
        let mut kv = tiny();
        kv.add_sequence(1).unwrap();
        kv.reserve(1, 6).unwrap(); // blocks 0 (full), 1 (partial)
        kv.fork_sequence(1, 2).unwrap();
        assert_eq!(kv.table(2).unwrap().as_slice(), &[0]);
        assert_eq!(kv.reserve(2, 3).unwrap(), vec![8, 9, 10]); // child's own block 2
        assert_eq!(kv.fork_sequence(1, 2), Err(KvError::SequenceExists(2)));
        assert_eq!(kv.fork_sequence(5, 6), Err(KvError::UnknownSequence(5)));
        kv.check_integrity().unwrap();
        kv.free_sequence(1).unwrap();
        assert_eq!(kv.pool().ref_count(0), 1);
        assert_eq!(kv.num_free_blocks(), 2);
        kv.free_sequence(2).unwrap();
        assert_eq!(kv.num_free_blocks(), 4);
        kv.check_integrity().unwrap();
    }

    #[test]
    fn sized_from_a_budget() {
        let smol = KvLayout::new(30, 3, 64, 16, KvDtype::F16).unwrap();
        let kv = KvManager::from_budget(smol, 1 << 30).unwrap();
        assert_eq!(kv.num_blocks(), (1 << 30) / (16 * 23_040));
        let err = KvManager::from_budget(smol, 368_639).unwrap_err();
        assert!(err.to_string().contains("raise it to at least 368640"));
    }

    #[test]
    fn slots_must_fit_u32() {
        let layout = KvLayout::new(1, 1, 1, 1024, KvDtype::F16).unwrap();
        assert!(KvManager::new(layout, 1 << 22).is_ok()); // slots 0..2^32
        let err = KvManager::new(layout, (1 << 22) + 1).unwrap_err();
        assert!(matches!(err, KvError::TooManySlots { .. }), "{err}");
    }

    #[test]
    fn integrity_catches_a_leaked_reference() {
        let mut kv = tiny();
        kv.add_sequence(1).unwrap();
        kv.reserve(1, 4).unwrap();
        kv.pool.incref(0); // a reference no table holds
        assert_eq!(kv.check_integrity(), Err("block 0: 1 tables hold it, ref count 2".into()));
    }
}
