//! Benchmark workloads and their reports (JSON + Markdown table). Speed is measured here, never
//! asserted in tests.

pub mod decode;
