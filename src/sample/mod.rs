//! Next-token sampling: [`SamplingParams`], checked once by [`SamplingParams::validate`].

mod params;

pub use params::{SampleError, SamplingParams};
