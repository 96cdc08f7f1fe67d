//! Next-token sampling: [`SamplingParams`] (checked once by [`SamplingParams::validate`]) and one
//! [`Sampler`] per sequence, which owns that sequence's seeded RNG.
//!
//! | file | concept |
//! |---|---|
//! | `params.rs` | [`SamplingParams`], [`SampleError`]: temperature, top-k, top-p, seed, max tokens |
//! | `sampler.rs` | [`Sampler`]: greedy fast path (one pass, no allocation); temperature → top-k → softmax → top-p → draw |
//!
//! Rules: temperature 0 is greedy (argmax, ties → lowest token id); NaN logits are never picked
//! (all NaN → token 0); ties in top-k and top-p go to the lower token id; the same seed and logits
//! give the same tokens.

mod params;
mod sampler;

pub use params::{SampleError, SamplingParams};
pub use sampler::Sampler;
