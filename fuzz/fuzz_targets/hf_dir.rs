#![no_main]
//! Fuzz target: see `entries::hf_dir` (fuzz/entries.rs), shared with tests/fuzz_regressions.rs.

// Each target uses one of the shared entry points.
#[allow(dead_code)]
#[path = "../entries.rs"]
mod entries;

libfuzzer_sys::fuzz_target!(|data: &[u8]| entries::hf_dir(data));
