//! What comes in ([`Request`]), what goes out ([`TokenEvent`], [`FinishReason`], [`Usage`]) and
//! every refusal ([`SchedError`]).

use crate::kv::Namespace;

/// Identifies a request (and its sequence) for its whole life; unique among unfinished requests.
pub type RequestId = u64;

/// A generation request as the scheduler sees it: token ids in, token ids out. It runs until
/// the engine ends it ([`super::Scheduler::finish`]: a stop token, `max_tokens`, a stop string,
/// a cancel) or its context is full.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub id: RequestId,
    /// `[prompt_len]` token ids; at least one, fewer than `max_model_len`.
    pub prompt: Vec<u32>,
    /// Prefix-cache isolation key: requests share cached blocks only within one namespace.
    pub namespace: Namespace,
    /// Compute logits for the prompt positions from this one on (perplexity): those positions
    /// are never taken from the prefix cache, and each step's plan names them in
    /// [`super::ScheduledSeq::prompt_logits`], once each, preemption included.
    pub prompt_logits_from: Option<usize>,
}

/// Why a request ended: decided by the engine's output stage (stop tokens, `max_tokens`, stop
/// strings) and passed in through [`super::Scheduler::finish`]; the scheduler itself ends a
/// sequence only when its context is full ([`FinishReason::Length`]).
pub use crate::output::FinishReason;

/// Token counts of a request, as OpenAI's `usage` reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache at the request's first admission.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Tokens this request computed in prefill chunks, recomputation after preemption included
    /// (`prompt_tokens − cached_tokens` when it was never preempted).
    #[serde(default)]
    pub computed_prefill_tokens: usize,
    /// Times this request was preempted (and recomputed).
    #[serde(default)]
    pub num_preemptions: usize,
}

/// What one step produced for one request, in order: its sampled token, then possibly its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenEvent {
    /// A newly generated token (including a stop token, which comes right before `Finished`).
    Token { id: RequestId, token: u32 },
    /// The request ended; its blocks are already released.
    Finished { id: RequestId, reason: FinishReason, usage: Usage },
}

/// A [`super::SchedulerConfig`] limit that must be at least 1, named by its CLI flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigField {
    MaxNumSeqs,
    MaxNumBatchedTokens,
    MaxModelLen,
}

impl std::fmt::Display for ConfigField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConfigField::MaxNumSeqs => "--max-num-seqs",
            ConfigField::MaxNumBatchedTokens => "--max-num-batched-tokens",
            ConfigField::MaxModelLen => "-c/--max-model-len",
        })
    }
}

/// Refusals of the scheduler: bad requests (at [`super::Scheduler::add_request`]) and bad
/// configurations (at [`super::Scheduler::new`]). Messages name the fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    #[error("request {id}: the prompt is empty; give at least one token")]
    EmptyPrompt { id: RequestId },

    #[error(
        "request {id}: the prompt has {prompt_len} tokens, but -c/--max-model-len is \
         {max_model_len} and the prompt must be shorter to leave room for a generated token; \
         shorten the prompt or raise -c above {prompt_len}"
    )]
    PromptTooLong { id: RequestId, prompt_len: usize, max_model_len: usize },

    #[error("request id {0} is already in use by an unfinished request; ids must be unique")]
    DuplicateId(RequestId),

    #[error("{0} must be at least 1 (got 0)")]
    ZeroLimit(ConfigField),

    #[error(
        "the KV cache holds {num_blocks} blocks of {block_size} tokens, fewer than the \
         {needed} blocks one sequence of -c/--max-model-len {max_model_len} needs; raise \
         --kv-cache-memory or lower -c"
    )]
    PoolTooSmall { num_blocks: usize, block_size: usize, needed: usize, max_model_len: usize },
}
