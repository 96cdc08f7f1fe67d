//! TODO

pub mod metrics;
