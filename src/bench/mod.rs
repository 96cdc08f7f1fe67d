//! Benchmark workloads and their reports (JSON + Markdown table, SVG plots). Speed is measured
//! here, never asserted in tests.
//!
//! | file | concept |
//! |---|---|
//! | `bandwidth.rs` | `bench bandwidth`: the adapter's read and copy bandwidth (the roofline's ceiling) |
//! | `decode.rs` | `bench decode`: prefill/decode speed by context length, attention GPU time |
//! | `kvquant.rs` | `bench kv-quant`: per KV format × scales × rotation: bytes, tokens that fit, PPL, KLD, top-1, attention time |
//! | `workload.rs` | seeded text cut to exact token counts; the multi-turn chat workload and its prefill arithmetic |
//! | `multiturn.rs` | `bench multiturn`: users × turns on one engine per KV budget; per-turn reports |
//! | `multiturn_report.rs` | acceptance figures, Markdown tables and plot panels of a multi-turn report |
//! | `concurrency.rs` | `bench concurrency`: 1, 2, 4, 8 … concurrent requests; TTFT, TPOT, throughput, KV peak |
//! | `serve.rs` | `bench serve`: the multi-turn chat workload as HTTP streaming clients of any OpenAI endpoint |
//! | `plot.rs` | SVG line plots |
//! | `stats.rs` | percentiles and means |

pub mod bandwidth;
pub mod concurrency;
pub mod decode;
pub mod kvquant;
pub mod multiturn;
pub mod multiturn_report;
pub mod plot;
#[cfg(test)]
mod report_tests;
pub mod serve;
pub mod stats;
pub mod workload;
#[cfg(test)]
mod workload_tests;
