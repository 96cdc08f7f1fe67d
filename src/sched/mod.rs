//! Continuous batching, no GPU: requests wait, run and finish; each step the [`Scheduler`] picks
//! which sequences compute how many tokens ([`StepPlan`]) within a token budget, asking
//! [`crate::kv::KvManager`] for blocks and prefix-cache hits. The engine runs the plan, samples,
//! and hands the tokens back to [`Scheduler::commit`], which returns [`TokenEvent`]s.
//!
//! | file | concept |
//! |---|---|
//! | `request.rs` | [`Request`] in; [`TokenEvent`], [`FinishReason`], [`Usage`] out; [`SchedError`] |
//! | `sequence.rs` | a request's running state: tokens, computed count, phase |
//! | `plan.rs` | [`StepPlan`], [`ScheduledSeq`]: one step's work, plain data for the engine |
//! | `scheduler.rs` | [`Scheduler`], [`SchedulerConfig`], [`SchedulerStats`]: queues and policy |
//! | `sim.rs` (tests) | a fake model and a step loop that checks every invariant each step |
//! | `sim_tests.rs` | scenarios on it: chunking, preemption, cancel, shared prompts, multi-turn chat, random workloads |
//!
//! ## Lifecycle
//!
//! ```text
//! add_request ─▶ waiting ─(admit: prefix hit + first chunk)─▶ running ─(prefill chunks)─▶ decode
//!                   ▲                                            │
//!                   └──── preempted (recompute; front of queue) ─┘ ─▶ finished / cancelled
//! ```
//!
//! ## Policy of one [`Scheduler::schedule`] call
//!
//! 1. **Decodes first**: each running sequence in decode gets its one token, in admission order.
//! 2. **Prefill chunks**: running sequences still prefilling continue with `min(remaining, budget
//!    left)` tokens, fewer if the pool holds fewer (chunked prefill: long prompts span steps and
//!    share them with decodes).
//! 3. **Admission**, first come first served, while `running < max_num_seqs`, budget is left and
//!    the pool has the chunk's blocks (free + evictable cached blocks, [`crate::kv::KvManager::can_begin`]).
//!    The prefix-cache match comes first, so only the uncached part is computed; a hit covering
//!    the whole prompt still computes its last token. **Cache-aware deferral**: a request whose
//!    first uncached full block is being prefilled right now by a running sequence (same tokens,
//!    same namespace) waits; a step or two later it is a cache hit. This is what makes a system
//!    prompt shared by requests arriving together be computed once. It cannot starve: it waits
//!    only on a running sequence, which either caches the block or is preempted.
//! 4. **Preemption by recompute**: a running sequence that cannot get a block, even after
//!    evicting unlocked cached blocks, preempts the most recently admitted running sequence (itself
//!    when it is the most recent; never an error): the victim's computed full blocks go to the
//!    prefix cache, its generated tokens are kept, it goes to the front of the waiting queue and
//!    later re-prefills prompt + generated tokens, mostly as a cache hit. A lone sequence always
//!    fits, since [`Scheduler::new`] refuses a pool smaller than one `max_model_len` sequence.
//!
//! Invariants of every plan: Σ tokens ≤ `max_num_batched_tokens`, entries ≤ `max_num_seqs`,
//! each block table covers its chunk, decodes are one token, `sample` is set exactly on chunks
//! that end the known tokens.

mod plan;
#[cfg(test)]
mod quota_tests;
mod request;
mod scheduler;
mod sequence;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod sim_tests;

pub use plan::{ScheduledSeq, StepPlan};
pub use request::{ConfigField, FinishReason, Request, RequestId, SchedError, TokenEvent, Usage};
pub use scheduler::{FinishedCounts, Scheduler, SchedulerConfig, SchedulerStats, TenantStats};
