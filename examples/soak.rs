//! The soak run: 10,000 requests (or `KVRUN_SOAK_REQUESTS`) of mixed lengths through the tiny
//! model with the prefix cache on, a KV pool that forces eviction and preemption, and seeded
//! random cancels; prints the figures, then checks them (`tests/soak/mod.rs`).
//!
//! `XDG_RUNTIME_DIR=/tmp WGPU_BACKEND=vulkan cargo run --release --example soak`

#[path = "../tests/soak/mod.rs"]
mod soak;

fn main() {
    let requests = std::env::var("KVRUN_SOAK_REQUESTS").ok().and_then(|v| v.parse().ok());
    let seed = std::env::var("KVRUN_SOAK_SEED").ok().and_then(|v| v.parse().ok());
    let report = soak::run(requests.unwrap_or(10_000), seed.unwrap_or(1));
    report.print();
    report.check();
    println!("soak ok");
}
