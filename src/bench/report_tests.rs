//! GPU-free tests of the reports: the JSON keys DESIGN.md promises, the acceptance figures, the
//! tables and the plot panels, on hand-made runs.

use super::concurrency::{ConcurrencyReport, LevelReport};
use super::multiturn::{Budget, BudgetSizes, MultiturnReport, RunReport, RunTotals, TurnReport};
use super::multiturn_report::{Acceptance, TierAcceptance};
use super::workload::{Framing, MultiturnSpec, PrefillArithmetic};

fn turn(turn: usize, computed: u64, ttft: f64) -> TurnReport {
    TurnReport {
        turn,
        requests: 2,
        prompt_tokens: 1000,
        cached_tokens: 1000 - computed,
        computed_prefill_tokens: computed,
        ttft_ms_p50: ttft,
        ttft_ms_p99: ttft * 1.5,
        attention_gpu_ms: Some(12.5),
        decode_tokens_per_s: 9.5,
        kv_usage_peak: 0.5,
        evictions: 3,
        preemptions: 1,
    }
}

fn run(label: &str, blocks: usize, cache: bool, computed: [u64; 2], ttft: f64) -> RunReport {
    RunReport {
        label: label.into(),
        kv_cache_memory: blocks as u64 * 368_640,
        kv_cache_blocks: blocks,
        prefix_cache: cache,
        kv_offloading_size: None,
        turns: vec![turn(1, computed[0], ttft), turn(2, computed[1], ttft)],
        totals: RunTotals {
            prompt_tokens: 2000,
            cached_tokens: 2000 - computed[0] - computed[1],
            computed_prefill_tokens: computed[0] + computed[1],
            generated_tokens: 64,
            ttft_ms_p50: ttft,
            ttft_ms_p99: ttft * 1.5,
            evictions: 3,
            preemptions: 1,
            kv_usage_peak: 0.9,
            wall_s: 10.0,
            host_hit_tokens: 0,
            host_offloaded_blocks: 0,
            host_loaded_blocks: 0,
            host_bytes_moved: 0,
        },
        replies_sha256: "ab".repeat(32),
    }
}

fn report(runs: Vec<RunReport>) -> MultiturnReport {
    let mut r = MultiturnReport {
        model: "m.gguf".into(),
        adapter: "llvmpipe".into(),
        backend: "Vulkan".into(),
        workload: MultiturnSpec {
            users: 2,
            system_tokens: 256,
            turns: 2,
            user_tokens_min: 50,
            user_tokens_max: 100,
            reply_tokens: 16,
            seed: 0,
            framing: Framing::ChatTemplate,
        },
        block_size: 16,
        max_model_len: 600,
        budgets: BudgetSizes { one_conversation_bytes: 1, all_conversations_bytes: 2 },
        arithmetic: PrefillArithmetic {
            no_reuse_prefill_tokens: 2000,
            ideal_prefill_tokens: 400,
            ideal_block_prefill_tokens: 430,
            system_only_prefill_tokens: 1800,
            one_block_per_turn_tokens: 64,
        },
        replies_identical: runs.windows(2).all(|w| w[0].replies_sha256 == w[1].replies_sha256),
        runs,
        acceptance: None,
        tier_acceptance: None,
    };
    r.acceptance = Acceptance::new(&r);
    r.tier_acceptance = TierAcceptance::new(&r);
    r
}

#[test]
fn multiturn_json_has_the_design_keys() {
    let r = report(vec![
        run("one", 40, true, [900, 900], 900.0),
        run("all", 80, true, [300, 130], 200.0),
    ]);
    let v = serde_json::to_value(&r).unwrap();
    let runs = v["runs"].as_array().expect("runs: a list");
    assert_eq!(runs.len(), 2);
    for run in runs {
        assert!(run["kv_cache_memory"].is_u64(), "bytes");
        assert!(run["prefix_cache"].is_boolean());
        assert_eq!(run["replies_sha256"].as_str().unwrap().len(), 64);
        for t in run["turns"].as_array().expect("turns: a list") {
            for key in [
                "turn",
                "prompt_tokens",
                "cached_tokens",
                "computed_prefill_tokens",
                "ttft_ms_p50",
                "ttft_ms_p99",
                "attention_gpu_ms",
                "decode_tokens_per_s",
            ] {
                assert!(t.get(key).is_some_and(|x| x.is_number()), "turns[].{key}");
            }
        }
        for key in
            ["computed_prefill_tokens", "cached_tokens", "ttft_ms_p50", "evictions", "preemptions"]
        {
            assert!(run["totals"].get(key).is_some_and(|x| x.is_number()), "totals.{key}");
        }
    }
    assert!(v["arithmetic"]["ideal_prefill_tokens"].is_u64());
    assert!(v["acceptance"]["pass"].is_boolean());
    assert_eq!(v["workload"]["framing"], "chat_template");
}

#[test]
fn acceptance_compares_the_smallest_and_largest_cached_budgets() {
    let no_cache = run("all", 80, false, [1000, 1000], 1000.0);
    let r = report(vec![
        run("one", 40, true, [900, 900], 900.0),
        run("all", 80, true, [300, 130], 200.0),
        no_cache,
    ]);
    let a = r.acceptance.as_ref().unwrap();
    assert_eq!((a.small.as_str(), a.large.as_str()), ("one", "all"));
    assert!((a.prefill_ratio - 1800.0 / 430.0).abs() < 1e-9);
    assert!((a.ttft_p50_ratio - 4.5).abs() < 1e-9);
    assert_eq!(a.large_over_ideal_tokens, 30);
    assert!(a.large_within_one_block_per_turn && a.replies_identical && a.pass);
    // Too little saving fails; one budget alone has nothing to compare.
    let weak = report(vec![
        run("one", 40, true, [500, 500], 300.0),
        run("all", 80, true, [300, 130], 200.0),
    ]);
    assert!(!weak.acceptance.unwrap().pass);
    assert!(report(vec![run("all", 80, true, [300, 130], 200.0)]).acceptance.is_none());
    let mut differ = run("all", 80, true, [300, 130], 200.0);
    differ.replies_sha256 = "cd".repeat(32);
    let r = report(vec![run("one", 40, true, [900, 900], 900.0), differ]);
    assert!(!r.replies_identical && !r.acceptance.unwrap().pass);
}

#[test]
fn markdown_and_panels_show_every_run() {
    let r = report(vec![
        run("one", 40, true, [900, 900], 900.0),
        run("all", 80, false, [1000, 1000], 950.0),
    ]);
    let md = r.markdown();
    assert!(md.contains("| turn | prompt | cached | computed prefill |"), "{md}");
    assert!(md.contains("### one (14.06 MiB, 40 blocks), prefix cache on"), "{md}");
    assert!(md.contains("prefix cache off"));
    assert!(md.contains("Replies identical across runs: yes"));
    let panels = r.panels();
    assert_eq!(panels.len(), 2);
    assert_eq!(panels[0].series.len(), 2);
    assert_eq!(panels[1].series[1].points, vec![(1.0, 1000.0), (2.0, 1000.0)]);
    assert!(panels[1].series[1].name.contains("no prefix cache"));
    assert!(super::plot::render_svg(&panels).unwrap().contains("TTFT p50 per turn"));
}

#[test]
fn budgets_parse_names_and_sizes() {
    assert_eq!(Budget::parse("one"), Ok(Budget::OneConversation));
    assert_eq!(Budget::parse(" all"), Ok(Budget::AllConversations));
    assert_eq!(Budget::parse("64MiB"), Ok(Budget::Bytes(64 << 20)));
    assert!(Budget::parse("lots").is_err());
    let sizes = BudgetSizes { one_conversation_bytes: 10, all_conversations_bytes: 40 };
    assert_eq!(Budget::OneConversation.bytes(&sizes), 10);
    assert_eq!(Budget::AllConversations.bytes(&sizes), 40);
    assert_eq!(Budget::Bytes(7).bytes(&sizes), 7);
    assert_eq!(Budget::Bytes(64 << 20).label(), "64 MiB");
}

#[test]
fn concurrency_json_and_table() {
    let level = |c: usize| LevelReport {
        concurrency: c,
        kv_bytes_peak: 3 << 20,
        kv_blocks_peak: 8,
        cached_tokens: 0,
        ttft_ms_mean: 100.0,
        ttft_ms_p99: 150.0,
        tpot_ms_mean: 80.0,
        throughput_tokens_per_s: 12.5 * c as f64,
        latency_ms_mean: 2000.0,
        latency_ms_p99: 2500.0,
        wall_s: 3.0,
    };
    let r = ConcurrencyReport {
        model: "m".into(),
        adapter: "a".into(),
        backend: "b".into(),
        prompt_tokens: 256,
        output_tokens: 32,
        block_size: 16,
        kv_cache_memory: 1 << 30,
        prefix_cache: false,
        levels: vec![level(1), level(2)],
    };
    let v = serde_json::to_value(&r).unwrap();
    for l in v["levels"].as_array().unwrap() {
        for key in [
            "concurrency",
            "kv_bytes_peak",
            "ttft_ms_mean",
            "ttft_ms_p99",
            "tpot_ms_mean",
            "throughput_tokens_per_s",
            "latency_ms_p99",
        ] {
            assert!(l.get(key).is_some_and(|x| x.is_number()), "levels[].{key}");
        }
    }
    let md = r.markdown();
    assert!(md.contains("| 2 | 3 MiB | 100 | 150 | 80.0 | 25.00 | 2000 | 2500 | 3.0 |"), "{md}");
}

/// A host-tier run is compared with its own budget's run without the tier (not with the
/// largest budget), and kept out of the small-vs-large acceptance.
#[test]
fn tier_acceptance_compares_the_same_budget() {
    let mut tier = run("one + host all", 40, true, [300, 140], 300.0);
    tier.kv_offloading_size = Some(1 << 30);
    tier.totals.host_hit_tokens = 900;
    let r = report(vec![
        run("one", 40, true, [900, 900], 900.0),
        tier,
        run("all", 80, true, [300, 130], 200.0),
    ]);
    let a = r.acceptance.as_ref().expect("one vs all");
    assert_eq!((a.small.as_str(), a.large.as_str()), ("one", "all"));
    let t = r.tier_acceptance.as_ref().expect("one vs one + host");
    assert_eq!(t.budget, "one");
    assert!((t.prefill_ratio - 1800.0 / 440.0).abs() < 1e-9);
    assert!((t.ttft_p50_ratio - 3.0).abs() < 1e-9);
    assert_eq!(t.over_block_ideal_tokens, 440 - 430);
    assert!(t.within_one_block_per_turn && t.pass);
    let md = r.markdown();
    assert!(md.contains("host tier 1 GiB: 900 tokens from host"), "{md}");
    assert!(
        md.contains("Host tier (one with 1 GiB of host RAM vs without): computed prefill 4.09×"),
        "{md}"
    );
    let mut slow = r.clone();
    slow.runs[1].totals.ttft_ms_p50 = 950.0;
    assert!(!TierAcceptance::new(&slow).unwrap().pass, "a slower TTFT fails");
}
