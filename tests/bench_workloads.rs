//! The benchmark workloads end to end on the tiny test model: a tiny multi-turn chat (2 users,
//! 32-token system prompt, 2 turns) under two KV budgets and without the prefix cache, and a
//! short concurrency sweep. Skips when no GPU adapter exists.

use std::path::PathBuf;

use kvrun::bench::concurrency::ConcurrencyBench;
use kvrun::bench::multiturn::{self, BudgetSizes, RunReport, RunSetting};
use kvrun::bench::workload::{Framing, MultiturnSpec, MultiturnWorkload};
use kvrun::engine::{Engine, EngineConfig, EngineError, ResolvedConfig};
use kvrun::gpu::GpuError;
use kvrun::loader::ModelFile;
use kvrun::tokenizer::Tokenizer;

fn tiny_model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny-llama/tiny-llama-q.gguf")
}

/// The engine for `cfg`, or `None` (the test then skips) when there is no GPU adapter.
fn load(cfg: &EngineConfig) -> Option<Engine> {
    match Engine::load(cfg) {
        Ok(engine) => Some(engine),
        Err(EngineError::Gpu(e @ GpuError::NoAdapter { .. })) => {
            eprintln!("SKIPPING: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn workload() -> MultiturnWorkload {
    let file = ModelFile::open(&tiny_model()).unwrap();
    let tok = Tokenizer::from_source(file.tokenizer_source().unwrap()).unwrap();
    let spec = MultiturnSpec {
        users: 2,
        system_tokens: 32,
        turns: 2,
        user_tokens_min: 24,
        user_tokens_max: 40,
        reply_tokens: 8,
        seed: 3,
        framing: Framing::Raw,
    };
    MultiturnWorkload::generate(&spec, &tok, None).unwrap()
}

fn sizes(base: &EngineConfig, w: &MultiturnWorkload) -> BudgetSizes {
    let probe = RunSetting {
        label: String::new(),
        kv_cache_memory: 0,
        prefix_cache: true,
        kv_offloading_size: None,
    };
    let mut cfg = probe.engine_config(base, w);
    cfg.kv_cache_memory = None;
    let file = ModelFile::open(&base.model).unwrap();
    let (_, layout) = ResolvedConfig::resolve(&cfg, file.config()).unwrap();
    BudgetSizes::new(&layout, w.longest_conversation(), w.spec.users)
}

fn run(base: &EngineConfig, w: &MultiturnWorkload, setting: &RunSetting) -> Option<RunReport> {
    let mut engine = load(&setting.engine_config(base, w))?;
    let mut tokens = 0;
    let report = multiturn::run(&mut engine, w, setting, true, &mut || tokens += 1).unwrap();
    assert_eq!(tokens, w.spec.users * w.spec.turns * w.spec.reply_tokens);
    // The run checks this too; the test says it out loud.
    let kv = engine.scheduler().kv();
    kv.check_integrity().unwrap();
    assert_eq!(kv.num_sequences(), 0);
    assert_eq!(kv.num_free_or_evictable_blocks(), kv.num_blocks(), "no leaked blocks");
    Some(report)
}

#[test]
fn tiny_multiturn_reuses_history_with_identical_replies() {
    let w = workload();
    let base = EngineConfig::new(tiny_model());
    let sizes = sizes(&base, &w);
    let setting = |label: &str, bytes: u64, cache: bool| RunSetting {
        label: label.into(),
        kv_cache_memory: bytes,
        prefix_cache: cache,
        kv_offloading_size: None,
    };
    let Some(one) = run(&base, &w, &setting("one", sizes.one_conversation_bytes, true)) else {
        return;
    };
    let all = run(&base, &w, &setting("all", sizes.all_conversations_bytes, true)).unwrap();
    let off = run(&base, &w, &setting("all", sizes.all_conversations_bytes, false)).unwrap();
    let tier = RunSetting {
        kv_offloading_size: Some(sizes.all_conversations_bytes),
        ..setting("one + host", sizes.one_conversation_bytes, true)
    };
    let tier = run(&base, &w, &tier).unwrap();
    let arithmetic = w.arithmetic(16);
    for r in [&one, &all, &off, &tier] {
        eprintln!(
            "{} cache {}: computed prefill {} (turns {:?}), cached {}, evictions {}, preemptions {}",
            r.label,
            r.prefix_cache,
            r.totals.computed_prefill_tokens,
            r.turns.iter().map(|t| t.computed_prefill_tokens).collect::<Vec<_>>(),
            r.totals.cached_tokens,
            r.totals.evictions,
            r.totals.preemptions
        );
        assert_eq!(r.turns.len(), 2);
        let per_turn: u64 = r.turns.iter().map(|t| t.computed_prefill_tokens).sum();
        assert_eq!(per_turn, r.totals.computed_prefill_tokens, "per-turn counts add up");
        assert_eq!(r.totals.generated_tokens, 2 * 2 * 8);
    }
    assert_eq!(one.replies_sha256, all.replies_sha256, "replies differ across budgets");
    assert_eq!(all.replies_sha256, off.replies_sha256, "replies differ without the cache");
    assert_eq!(one.replies_sha256, tier.replies_sha256, "replies differ with the host tier");
    if one.totals.evictions > 0 {
        // what the small pool evicted comes back from host memory instead of being recomputed
        assert!(tier.totals.host_hit_tokens > 0 && tier.totals.host_loaded_blocks > 0);
        assert!(tier.totals.computed_prefill_tokens < one.totals.computed_prefill_tokens);
        assert!(tier.totals.host_bytes_moved > 0);
    }
    assert!(one.turns[1].cached_tokens > 0 && all.turns[1].cached_tokens > 0);
    assert_eq!(off.totals.cached_tokens, 0);
    assert_eq!(off.totals.computed_prefill_tokens, arithmetic.no_reuse_prefill_tokens);
    assert!(all.totals.computed_prefill_tokens < off.totals.computed_prefill_tokens);
    assert!(one.totals.computed_prefill_tokens < off.totals.computed_prefill_tokens);
    assert!(
        all.totals.computed_prefill_tokens
            <= arithmetic.ideal_prefill_tokens + arithmetic.one_block_per_turn_tokens,
        "the budget that holds every history computes within a block per turn of the ideal"
    );
}

#[test]
fn tiny_concurrency_sweep() {
    let bench =
        ConcurrencyBench { levels: vec![1, 3], prompt_tokens: 20, output_tokens: 5, seed: 1 };
    let cfg = bench.engine_config(&EngineConfig::new(tiny_model()));
    let Some(mut engine) = load(&cfg) else { return };
    let mut tokens = 0;
    let report = bench.run(&mut engine, "tiny", &mut || tokens += 1).unwrap();
    assert_eq!(tokens, (1 + 3) * 5);
    assert_eq!(report.levels.len(), 2);
    let bytes_per_block = engine.kv_layout().bytes_per_block();
    for (level, l) in [1u64, 3].iter().zip(&report.levels) {
        // 25 tokens per sequence at the end = 2 blocks of 16 each.
        assert_eq!(l.kv_bytes_peak, level * 2 * bytes_per_block, "level {level}");
        assert_eq!(l.cached_tokens, 0, "distinct prompts share nothing");
        assert!(l.throughput_tokens_per_s > 0.0 && l.ttft_ms_mean > 0.0 && l.tpot_ms_mean > 0.0);
        // With at most 3 samples the interpolated p99 lies above the mean.
        assert!(l.ttft_ms_p99 >= l.ttft_ms_mean - 1e-9, "level {level}: p99 below the mean");
        assert!(l.latency_ms_p99 >= l.ttft_ms_p99 - 1e-9);
    }
    engine.scheduler().kv().check_integrity().unwrap();
}
