//! [`Sequence`]: the running state of one request, waiting or running.

use crate::kv::Namespace;

use super::request::{FinishReason, Request, Usage};

/// Whether a sequence has sampled since it was (re-)admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Computing its tokens (prompt, plus generated ones after a preemption), chunk by chunk.
    Prefill,
    /// One token a step: the last sampled one.
    Decode,
}

/// A request's state. Positions `0..num_computed_tokens` of `tokens` hold KV in the sequence's
/// block table (computed, or taken from the prefix cache); the rest are still to compute.
#[derive(Clone, Debug)]
pub(super) struct Sequence {
    pub namespace: Namespace,
    /// `[num_prompt_tokens + generated]` the prompt, then every generated token.
    pub tokens: Vec<u32>,
    pub num_prompt_tokens: usize,
    /// 0 while waiting (a preempted sequence recomputes from scratch, cache permitting).
    pub num_computed_tokens: usize,
    /// Prefix-cache hit at the first admission; `None` before it.
    pub first_num_cached_tokens: Option<usize>,
    pub phase: Phase,
    /// Tokens computed in prefill chunks so far, recomputation included.
    pub num_computed_prefill_tokens: usize,
    pub num_preemptions: usize,
    /// Prompt positions whose logits the request wants, from here to the prompt's end (the
    /// start advances as they are computed, so a recompute does not return them twice); empty
    /// for a request that wants none.
    pub prompt_logits: std::ops::Range<usize>,
}

impl Sequence {
    /// A waiting sequence for `request`.
    pub fn new(request: Request) -> Self {
        let prompt_len = request.prompt.len();
        Sequence {
            namespace: request.namespace,
            num_prompt_tokens: request.prompt.len(),
            tokens: request.prompt,
            num_computed_tokens: 0,
            first_num_cached_tokens: None,
            phase: Phase::Prefill,
            num_computed_prefill_tokens: 0,
            num_preemptions: 0,
            prompt_logits: match request.prompt_logits_from {
                Some(from) => from.min(prompt_len)..prompt_len,
                None => 0..0,
            },
        }
    }

    /// The tokens the prefix cache may match: all of them, or, while prompt logits are still
    /// wanted, only those before the first wanted position (a cached position has no logits).
    pub fn cacheable_tokens(&self) -> &[u32] {
        match self.prompt_logits.is_empty() {
            true => &self.tokens,
            false => &self.tokens[..self.prompt_logits.start + 1],
        }
    }

    /// The most tokens a chunk from position `start` may take so that at most `rows` of them
    /// are prompt positions whose logits are wanted (the positions before the first wanted one
    /// are free); unbounded for a request that wants none.
    pub fn prompt_logit_cap(&self, start: usize, rows: usize) -> usize {
        match self.prompt_logits.is_empty() {
            true => usize::MAX,
            false => self.prompt_logits.start.saturating_sub(start).saturating_add(rows),
        }
    }

    /// Rows of a chunk over `positions` whose prompt logits are wanted, chunk-relative.
    pub fn prompt_logit_rows(&self, positions: std::ops::Range<usize>) -> std::ops::Range<usize> {
        let lo = positions.start.max(self.prompt_logits.start);
        let hi = positions.end.min(self.prompt_logits.end);
        match lo < hi {
            true => lo - positions.start..hi - positions.start,
            false => 0..0,
        }
    }

    pub fn num_generated(&self) -> usize {
        self.tokens.len() - self.num_prompt_tokens
    }

    /// Tokens still to compute before the next sample.
    pub fn num_remaining(&self) -> usize {
        self.tokens.len() - self.num_computed_tokens
    }

    /// The tokens whose KV is in the table.
    pub fn computed_tokens(&self) -> &[u32] {
        &self.tokens[..self.num_computed_tokens]
    }

    /// Whether the sequence must end now that its last token was sampled: its context is full
    /// (every other end is the engine's decision).
    pub fn finish_reason(&self, max_model_len: usize) -> Option<FinishReason> {
        (self.tokens.len() >= max_model_len).then_some(FinishReason::Length)
    }

    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.num_prompt_tokens,
            cached_tokens: self.first_num_cached_tokens.unwrap_or(0),
            completion_tokens: self.num_generated(),
            computed_prefill_tokens: self.num_computed_prefill_tokens,
            num_preemptions: self.num_preemptions,
        }
    }
}
