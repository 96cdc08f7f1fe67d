//! Soak, CI size: a few hundred requests of mixed lengths with the prefix cache on, a KV pool
//! small enough to evict and preempt, and seeded random cancels (`tests/soak/mod.rs`). The full
//! 10,000-request run: `cargo run --release --example soak`. `KVRUN_SOAK_REQUESTS` sets the
//! count for either.

mod common;
mod soak;

#[test]
fn mixed_requests_with_eviction_preemption_and_cancels() {
    if common::gpu().is_none() {
        return;
    }
    let requests = std::env::var("KVRUN_SOAK_REQUESTS").ok().and_then(|v| v.parse().ok());
    let report = soak::run(requests.unwrap_or(500), 1);
    report.print();
    report.check();
}
