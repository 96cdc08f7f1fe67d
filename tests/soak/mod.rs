//! The soak workload, shared by `tests/engine_soak.rs` (a few hundred requests, in CI) and
//! `examples/soak.rs` (10,000 by default): requests of mixed lengths, half of them sharing one
//! of a few prefixes, pushed through one `Engine` with the prefix cache on and a KV pool small
//! enough that admissions evict cached blocks and running sequences get preempted; a seeded
//! share of them cancelled at random moments. [`Soak::run`] checks every step that the KV
//! bookkeeping is intact and that each request ends exactly once; [`SoakReport::check`] checks
//! the end state (pool full again, eviction and preemption happened, RSS flat after warm-up).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Instant;

use kvrun::engine::{CompletionRequest, Engine, EngineConfig, OutputEvent};
use kvrun::sched::{FinishReason, RequestId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Tiny model: 2 layers × 2 KV heads × head_dim 16 × K and V × f16 = 256 bytes per token.
const BYTES_PER_TOKEN: usize = 256;
const BLOCK_SIZE: usize = 4;
/// 40 blocks = 160 token slots for up to 6 running sequences of up to 122 tokens.
const NUM_BLOCKS: usize = 40;
const MAX_MODEL_LEN: usize = 128;
/// Requests kept submitted (running + waiting) at any time.
const IN_FLIGHT: usize = 10;
/// Chance, per step, that one live request is cancelled.
const CANCEL_PER_STEP: f64 = 0.02;
/// RSS growth allowed between the end of warm-up and the end of the run.
pub const MAX_RSS_GROWTH_MIB: f64 = 64.0;

pub fn config() -> EngineConfig {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny-llama/tiny-llama-q.gguf");
    let mut cfg = EngineConfig::new(path);
    cfg.block_size = BLOCK_SIZE;
    cfg.max_model_len = Some(MAX_MODEL_LEN);
    cfg.kv_cache_memory = Some((NUM_BLOCKS * BLOCK_SIZE * BYTES_PER_TOKEN) as u64);
    cfg.enable_prefix_cache = true;
    cfg.max_num_seqs = 6;
    cfg.max_num_batched_tokens = 64;
    cfg
}

/// What a soak run saw.
#[derive(Debug)]
pub struct SoakReport {
    pub requests: usize,
    pub finished: usize,
    pub finished_stop: usize,
    pub cancelled: usize,
    pub tokens: u64,
    pub steps: u64,
    pub preemptions: u64,
    pub evicted_blocks: u64,
    pub prefix_hit_tokens: u64,
    pub num_blocks: usize,
    /// Free blocks after the last request and `reset_prefix_cache`.
    pub free_blocks_at_end: usize,
    pub wall_s: f64,
    pub rss_start_mib: f64,
    pub rss_warm_mib: f64,
    pub rss_end_mib: f64,
}

impl SoakReport {
    /// The figures, one per line.
    pub fn print(&self) {
        let r = self;
        println!(
            "requests {}: finished {} (stop {}), cancelled {}",
            r.requests, r.finished, r.finished_stop, r.cancelled
        );
        println!("tokens {}, steps {}, wall {:.1} s", r.tokens, r.steps, r.wall_s);
        println!(
            "preemptions {}, evicted blocks {}, prefix-hit tokens {}",
            r.preemptions, r.evicted_blocks, r.prefix_hit_tokens
        );
        println!("blocks free at end {} of {}", r.free_blocks_at_end, r.num_blocks);
        println!(
            "RSS MiB: start {:.1}, after warm-up {:.1}, end {:.1}",
            r.rss_start_mib, r.rss_warm_mib, r.rss_end_mib
        );
    }

    /// The end-state checks (the per-step ones ran during [`run`]).
    pub fn check(&self) {
        assert_eq!(
            self.finished + self.cancelled,
            self.requests,
            "requests unaccounted: {self:#?}"
        );
        assert_eq!(self.free_blocks_at_end, self.num_blocks, "blocks leaked: {self:#?}");
        assert!(self.preemptions > 0, "no preemption: the pool is not tiny enough: {self:#?}");
        assert!(self.evicted_blocks > 0, "no eviction: the pool is not tiny enough: {self:#?}");
        assert!(self.cancelled > 0, "no request was cancelled: {self:#?}");
        let growth = self.rss_end_mib - self.rss_warm_mib;
        assert!(growth < MAX_RSS_GROWTH_MIB, "RSS grew {growth:.1} MiB after warm-up: {self:#?}");
    }
}

/// Resident set size of this process (`VmRSS` in `/proc/self/status`), in MiB; 0 where there
/// is no `/proc`.
pub fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// A request: half extend one of `prefixes`, the rest are fresh; prompt 1–90 tokens,
/// `max_tokens` 1–32 (so prompt + output fits `MAX_MODEL_LEN`); half ignore EOS.
fn request(rng: &mut StdRng, prefixes: &[Vec<u32>]) -> CompletionRequest {
    let mut prompt = if rng.random_bool(0.5) {
        prefixes[rng.random_range(0..prefixes.len())].clone()
    } else {
        Vec::new()
    };
    let extra = rng.random_range(1..=90 - prompt.len().min(89));
    prompt.extend((0..extra).map(|_| rng.random_range(3..256u32)));
    let mut req = CompletionRequest::new(prompt, rng.random_range(1..=32));
    req.ignore_eos = rng.random_bool(0.5);
    req
}

/// Runs `requests` requests through a fresh engine; panics on any broken invariant.
pub fn run(requests: usize, seed: u64) -> SoakReport {
    let mut rng = StdRng::seed_from_u64(seed);
    let prefixes: Vec<Vec<u32>> =
        (0..6).map(|i| (0..8 + 8 * i).map(|_| rng.random_range(3..256u32)).collect()).collect();
    let mut engine = Engine::load(&config()).unwrap_or_else(|e| panic!("load: {e}"));
    let warm_up = (requests / 10).max(50).min(requests);
    let (rss_start_mib, mut rss_warm_mib) = (rss_mib(), None);
    let start = Instant::now();
    let mut live: BTreeSet<RequestId> = BTreeSet::new();
    let (mut submitted, mut ended) = (0, 0);
    let (mut finished, mut finished_stop, mut cancelled, mut tokens, mut steps) = (0, 0, 0, 0, 0);
    while ended < requests {
        while submitted < requests && live.len() < IN_FLIGHT {
            let id = engine.add_request(request(&mut rng, &prefixes)).unwrap();
            assert!(live.insert(id), "request id {id} handed out twice");
            submitted += 1;
        }
        if !live.is_empty() && rng.random_bool(CANCEL_PER_STEP) {
            let id = *live.iter().nth(rng.random_range(0..live.len())).unwrap();
            match engine.cancel(id) {
                Some(OutputEvent::Finished {
                    id: got, reason: FinishReason::Cancelled, ..
                }) => {
                    assert_eq!(got, id);
                }
                other => panic!("cancel of live request {id} gave {other:?}"),
            }
            live.remove(&id);
            cancelled += 1;
            ended += 1;
        }
        for event in engine.step().unwrap() {
            let id = event.id();
            assert!(live.contains(&id), "event for request {id}, which already ended: {event:?}");
            match event {
                OutputEvent::Delta { .. } => tokens += 1,
                OutputEvent::Finished { reason, .. } => {
                    assert_ne!(reason, FinishReason::Cancelled, "request {id} cancelled itself");
                    finished_stop += usize::from(reason == FinishReason::Stop);
                    live.remove(&id);
                    finished += 1;
                    ended += 1;
                }
                other => panic!("request {id}: not asked for: {other:?}"),
            }
        }
        steps += 1;
        engine.scheduler().kv().check_integrity().unwrap_or_else(|e| panic!("step {steps}: {e}"));
        if rss_warm_mib.is_none() && ended >= warm_up {
            rss_warm_mib = Some(rss_mib());
        }
    }
    assert!(!engine.has_unfinished(), "the engine still holds requests after all ended");
    let wall_s = start.elapsed().as_secs_f64();
    let stats = engine.scheduler().stats();
    engine.reset_prefix_cache();
    engine.scheduler().kv().check_integrity().unwrap();
    SoakReport {
        requests,
        finished,
        finished_stop,
        cancelled,
        tokens,
        steps,
        preemptions: stats.num_preemptions,
        evicted_blocks: stats.num_evicted_blocks,
        prefix_hit_tokens: stats.prefix_hit_tokens,
        num_blocks: engine.config().num_blocks,
        free_blocks_at_end: engine.scheduler().kv().num_free_blocks(),
        wall_s,
        rss_start_mib,
        rss_warm_mib: rss_warm_mib.unwrap_or(rss_start_mib),
        rss_end_mib: rss_mib(),
    }
}
