//! Next-token sampling: [`SamplingParams`] (checked once by [`SamplingParams::validate`]) and one
//! [`Sampler`] per sequence, which owns that sequence's seeded RNG.
//!
//! | file | concept |
//! |---|---|
//! | `params.rs` | [`SamplingParams`], [`SampleError`]: temperature, top-k, top-p, min-p, penalties, log-probabilities, seed, max tokens |
//! | `sampler.rs` | [`Sampler`]: greedy fast path (one pass, no allocation); bias → penalties → temperature → top-k → softmax → min-p → top-p → draw; [`token_logprobs`] |
//!
//! Rules: temperature 0 is greedy (argmax, ties → lowest token id); NaN logits are never picked
//! (all NaN → token 0); ties in top-k and top-p go to the lower token id; the same seed and logits
//! give the same tokens.

mod params;
mod sampler;

pub use params::{SampleError, SamplingParams, MAX_TOP_LOGPROBS};
pub use sampler::{token_logprobs, token_rank, Sampler, TokenLogprobs};
