//! [`StepPlan`]: what one step computes, the scheduler's output and the engine's input. Plain
//! data: the engine turns it into a GPU batch (token ids, positions, slot mapping, block tables).

use std::ops::Range;

use super::request::RequestId;
use crate::kv::KvMoves;

/// The work of one step: one entry per scheduled sequence, decodes first, then prefill chunks of
/// running sequences, then newly admitted ones. Σ `tokens.len()` ≤ `max_num_batched_tokens` and
/// `seqs.len()` ≤ `max_num_seqs`. Pass it back, unchanged, to [`super::Scheduler::commit`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    pub seqs: Vec<ScheduledSeq>,
    /// With a host tier: the KV copies to make before the step (blocks the pool evicted
    /// written back, host hits brought back), in [`KvMoves`]' order.
    pub kv_moves: KvMoves,
}

impl StepPlan {
    /// Tokens computed this step (the batch size in tokens).
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }

    /// Whether there is nothing to compute.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
}

/// One sequence's share of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub id: RequestId,
    /// Position of `tokens[0]`; positions `0..start_pos` already hold KV (computed or cached).
    pub start_pos: usize,
    /// `[num_tokens]` token ids to compute now: a prefill chunk, or the one decode token.
    pub tokens: Vec<u32>,
    /// `[groups][ceil((start_pos + num_tokens) / block_size)]` the sequence's block ids per
    /// KV-cache group, in token order: each covers every position up to
    /// `start_pos + tokens.len()`; entries of blocks dropped out of a sliding window are
    /// [`crate::kv::NULL_BLOCK`] (never read). Slot of position `p` in group `g`:
    /// `block_tables[g][p / block_size] × block_size + p % block_size`.
    pub block_tables: Vec<Vec<u32>>,
    /// `[groups][num_tokens]` the slots of `tokens` in each group, as
    /// [`crate::kv::KvManager::reserve`] returned them: where the step writes their K and V.
    pub slot_mapping: Vec<Vec<u32>>,
    /// Sample a next token from the last position: true for decodes and for the chunk that
    /// completes the prompt (prompt + already generated tokens after a preemption).
    pub sample: bool,
    /// Rows of `tokens` (chunk-relative) whose logits the request asked for as prompt logits
    /// ([`super::Request::prompt_logits_from`]); empty for most chunks. When `sample` is set too
    /// it ends at the last row.
    pub prompt_logits: Range<usize>,
    /// Prefix-cache hit of the request at its first admission, for usage reporting.
    pub num_cached_tokens: usize,
    /// Recurrent models, the first step after a prefix-cache hit: the state snapshot slot
    /// holding the states after `start_pos − 1`, which the engine copies into the sequence's own
    /// states before the step ([`crate::kv::KvManager::snapshot_restore`]).
    pub restore_state: Option<u32>,
    /// Recurrent models: `(snapshot slot, n)`: the step also writes the states after its first
    /// `n` tokens into that slot, a block boundary ([`crate::kv::KvManager::snapshot_target`]).
    pub snapshot: Option<(u32, usize)>,
}

impl ScheduledSeq {
    /// Positions of `tokens`: `start_pos..start_pos + tokens.len()`.
    pub fn positions(&self) -> Range<usize> {
        self.start_pos..self.start_pos + self.tokens.len()
    }
}
