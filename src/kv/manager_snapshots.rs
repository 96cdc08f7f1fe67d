//! State snapshots through [`KvManager`] (recurrent models; the slots are the prefix cache's,
//! `prefix_cache_snapshots.rs`). A step that crosses a block boundary `P` writes the states
//! after token `P − 1` into a slot taken for it ([`KvManager::snapshot_target`]: the branch
//! point the step crosses, else its last boundary); once the step is cached the slot goes to
//! the node of the block ending at `P` (or back, if that node has one). A sequence that begins on a cached prefix
//! copies the snapshot at its end into its own states before its first step
//! ([`KvManager::snapshot_restore`]). Kept: branch points (where a sequence leaves the cached
//! tree: a shared system prompt) and the prompt's last boundary (a regenerated reply); of the
//! others — the ends of prefill chunks, then of decode steps — only a sequence's newest stays,
//! which it leaves behind when it ends (the end of its generated text, where the next chat
//! turn resumes). Slots being few (a 9B Qwen3.5's states are 50 MiB a sequence), a
//! conversation then holds about two.

use super::{BlockId, KvError, KvManager, SeqId, SnapshotTarget};

impl KvManager {
    /// Turns on state snapshots with `slots` slots: from now on a cached prefix is usable only
    /// where a snapshot ends it. A no-op without a prefix cache. Call before any sequence.
    pub fn with_state_snapshots(mut self, slots: u32) -> Self {
        self.cache = self.cache.map(|c| c.with_state_snapshots(slots));
        self
    }

    /// The snapshot slot `seq`'s first step restores its states from: the one ending its cached
    /// prefix. `None` without snapshots or without a hit. Ask right after
    /// [`KvManager::begin_sequence`]: a later [`KvManager::snapshot_target`] may take the slot
    /// (the restore copy, recorded ahead of the step's kernels, still reads it whole).
    pub fn snapshot_restore(&self, seq: SeqId) -> Option<u32> {
        let s = self.seqs.get(&seq)?;
        let cache = self.cache.as_ref().filter(|c| c.needs_snapshots())?;
        let slot = cache.snapshot_of(s.locked?);
        debug_assert!(slot.is_some(), "a usable prefix ends at a snapshot");
        slot
    }

    /// Where `seq`'s step over positions `start..end` writes a snapshot, one at most: the block
    /// boundary where `tokens` (the sequence's tokens through `end` at least) leave the cached
    /// tree, if the step crosses it before its last boundary and no snapshot is there (a
    /// branch point: the prefix other sequences share, such as a system prompt, becomes
    /// usable); else the last block boundary `P` in `start + 1..=end`, unless the cache has a
    /// snapshot there. A slot is taken for it (a free one, else the least recently used
    /// snapshot's). `prompt_end`: the last block boundary within the prompt. `None`: no
    /// snapshot this step. Errors if `seq` is not live. O(P) when a boundary is crossed.
    ///
    /// A tenant with a KV quota counts the slot as a state it holds: it gives up its own oldest
    /// snapshot (then cached blocks) to make room under its quota, or the step writes no
    /// snapshot; with every slot taken it reuses its own oldest snapshot's slot first.
    pub fn snapshot_target(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        start: usize,
        end: usize,
        prompt_end: usize,
    ) -> Result<Option<SnapshotTarget>, KvError> {
        let s = self.seqs.get(&seq).ok_or(KvError::UnknownSequence(seq))?;
        let Some(cache) = self.cache.as_ref().filter(|c| c.needs_snapshots()) else {
            return Ok(None);
        };
        let b = self.layout.block_size;
        let last = end / b * b;
        if last <= start || s.snapshot_target.is_some() {
            return Ok(None);
        }
        let path = cache.peek(s.namespace, &tokens[..last]);
        let snapshotted = path.last().is_some_and(|&n| cache.snapshot_of(n).is_some());
        let branch = path.len() * b;
        let (pos, keep) = match branch > start && branch < last && !snapshotted {
            true => (branch, true),
            false if branch == last && snapshotted => return Ok(None), // cached already
            false => (last, last == prompt_end),
        };
        // A tenant with a quota makes room for the state under it, or skips the snapshot.
        let namespace = s.namespace;
        let own = self.tenants.quota(namespace).map(|_| namespace);
        if !self.make_state_room(namespace) {
            return Ok(None);
        }
        let cache = self.cache.as_mut().expect("checked above");
        let target =
            cache.take_snapshot_slot_in(own).map(|slot| SnapshotTarget { slot, pos, keep });
        self.seqs.get_mut(&seq).expect("live").snapshot_target = target;
        Ok(target)
    }

    /// Once `seq`'s first `full` blocks are cached: gives its written snapshot to the node of
    /// the block ending at its position (or the slot back if that node has one), and unless
    /// it is one to keep, drops the sequence's previous such snapshot. Nothing while the
    /// target is not computed.
    pub(super) fn settle_snapshot(&mut self, seq: SeqId, full: usize) {
        let b = self.layout.block_size;
        let (Some(s), Some(cache)) = (self.seqs.get_mut(&seq), self.cache.as_mut()) else {
            return;
        };
        let Some(target) = s.snapshot_target.filter(|t| t.pos <= full * b) else { return };
        s.snapshot_target = None;
        let node: BlockId =
            cache.path(s.locked.expect("a full block is cached"))[target.pos / b - 1];
        if !cache.attach_snapshot(node, target.slot) {
            cache.give_back_snapshot_slot(target.slot);
            return;
        }
        if !target.keep {
            if let Some((old, slot)) = s.newest_snapshot.replace((node, target.slot)) {
                cache.drop_snapshot(old, slot);
            }
        }
    }
}
