//! The reading of a multi-turn report: acceptance figures (small vs large budget) and the
//! Markdown tables.

use super::multiturn::{MultiturnReport, RunReport};
use crate::kv::format_bytes;

/// Prefill saving the issue asks of the large budget over the small one (default workload).
pub const MIN_PREFILL_RATIO: f64 = 4.0;
/// TTFT p50 saving the issue asks of the large budget over the small one (default workload).
pub const MIN_TTFT_RATIO: f64 = 3.0;

/// Prefill saving the issue asks of the host tier over the same GPU budget without it.
pub const MIN_TIER_PREFILL_RATIO: f64 = 2.2;

/// A budget with the host tier (`--kv-offloading-size`) against the same budget without it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TierAcceptance {
    pub budget: String,
    pub host: u64,
    /// Computed prefill tokens, without ÷ with the tier.
    pub prefill_ratio: f64,
    /// Median TTFT over all requests, without ÷ with the tier.
    pub ttft_p50_ratio: f64,
    /// Computed prefill tokens with the tier minus the whole-block ideal.
    pub over_block_ideal_tokens: i64,
    /// `over_block_ideal_tokens ≤ users × turns × block_size`.
    pub within_one_block_per_turn: bool,
    pub replies_identical: bool,
    /// All of: prefill ratio at least [`MIN_TIER_PREFILL_RATIO`], TTFT lower, within one
    /// block per turn of the whole-block ideal, identical replies.
    pub pass: bool,
}

impl TierAcceptance {
    /// `None` unless a run with the tier and the same budget's run without it (cache on) ran.
    pub fn new(report: &MultiturnReport) -> Option<Self> {
        let tier = report.runs.iter().find(|r| r.kv_offloading_size.is_some())?;
        let base = report.runs.iter().find(|r| {
            r.prefix_cache
                && r.kv_offloading_size.is_none()
                && r.kv_cache_blocks == tier.kv_cache_blocks
        })?;
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
        let prefill_ratio = ratio(
            base.totals.computed_prefill_tokens as f64,
            tier.totals.computed_prefill_tokens as f64,
        );
        let ttft_p50_ratio = ratio(base.totals.ttft_ms_p50, tier.totals.ttft_ms_p50);
        let a = &report.arithmetic;
        let over = tier.totals.computed_prefill_tokens as i64 - a.ideal_block_prefill_tokens as i64;
        let within = over <= a.one_block_per_turn_tokens as i64;
        Some(TierAcceptance {
            budget: base.label.clone(),
            host: tier.kv_offloading_size.unwrap_or(0),
            prefill_ratio,
            ttft_p50_ratio,
            over_block_ideal_tokens: over,
            within_one_block_per_turn: within,
            replies_identical: report.replies_identical,
            pass: prefill_ratio >= MIN_TIER_PREFILL_RATIO
                && ttft_p50_ratio > 1.0
                && within
                && report.replies_identical,
        })
    }
}

/// The smallest budget with the prefix cache on against the largest one.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Acceptance {
    pub small: String,
    pub large: String,
    /// Computed prefill tokens, small ÷ large.
    pub prefill_ratio: f64,
    /// Median TTFT over all requests, small ÷ large.
    pub ttft_p50_ratio: f64,
    /// Computed prefill tokens of the large budget minus the ideal.
    pub large_over_ideal_tokens: i64,
    /// `large_over_ideal_tokens ≤ users × turns × block_size`.
    pub large_within_one_block_per_turn: bool,
    pub replies_identical: bool,
    /// All of: ratios at least [`MIN_PREFILL_RATIO`] and [`MIN_TTFT_RATIO`], within one block
    /// per turn of the ideal, identical replies.
    pub pass: bool,
}

impl Acceptance {
    /// `None` unless two different budgets ran with the prefix cache on.
    pub fn new(report: &MultiturnReport) -> Option<Self> {
        let cached: Vec<&RunReport> = report
            .runs
            .iter()
            .filter(|r| r.prefix_cache && r.kv_offloading_size.is_none())
            .collect();
        let small = cached.iter().min_by_key(|r| r.kv_cache_blocks)?;
        let large = cached.iter().max_by_key(|r| r.kv_cache_blocks)?;
        if small.kv_cache_blocks == large.kv_cache_blocks {
            return None;
        }
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
        let prefill_ratio = ratio(
            small.totals.computed_prefill_tokens as f64,
            large.totals.computed_prefill_tokens as f64,
        );
        let ttft_p50_ratio = ratio(small.totals.ttft_ms_p50, large.totals.ttft_ms_p50);
        let over = large.totals.computed_prefill_tokens as i64
            - report.arithmetic.ideal_prefill_tokens as i64;
        let within = over <= report.arithmetic.one_block_per_turn_tokens as i64;
        Some(Acceptance {
            small: small.label.clone(),
            large: large.label.clone(),
            prefill_ratio,
            ttft_p50_ratio,
            large_over_ideal_tokens: over,
            large_within_one_block_per_turn: within,
            replies_identical: report.replies_identical,
            pass: prefill_ratio >= MIN_PREFILL_RATIO
                && ttft_p50_ratio >= MIN_TTFT_RATIO
                && within
                && report.replies_identical,
        })
    }
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.0}"))
}

fn run_title(r: &RunReport) -> String {
    let host = r.kv_offloading_size.map_or(String::new(), |h| {
        let t = &r.totals;
        format!(
            ", host tier {}: {} tokens from host, {} blocks written back, {} loaded, {} moved",
            format_bytes(h),
            t.host_hit_tokens,
            t.host_offloaded_blocks,
            t.host_loaded_blocks,
            format_bytes(t.host_bytes_moved)
        )
    });
    format!(
        "{} ({}, {} blocks), prefix cache {}{host}",
        r.label,
        format_bytes(r.kv_cache_memory),
        r.kv_cache_blocks,
        if r.prefix_cache { "on" } else { "off" }
    )
}

impl MultiturnReport {
    /// Markdown: the workload and its arithmetic, a table per run, a summary and the verdict.
    pub fn markdown(&self) -> String {
        let w = &self.workload;
        let a = &self.arithmetic;
        let mut s = format!(
            "`bench multiturn` — {} on {} ({})\n\n{} users × {} turns; system prompt {} tokens; \
             user messages {}–{} tokens; replies {} tokens (greedy); framing {:?}; seed {}; \
             block size {}; context {} tokens\n\n",
            self.model,
            self.adapter,
            self.backend,
            w.users,
            w.turns,
            w.system_tokens,
            w.user_tokens_min,
            w.user_tokens_max,
            w.reply_tokens,
            w.framing,
            w.seed,
            self.block_size,
            self.max_model_len
        );
        s += &format!(
            "Prefill arithmetic: no reuse {} tokens; ideal {} (system once, each message once, \
             last token of each earlier reply); whole-block ideal {}; one block per turn = {}; \
             system prompt reused only {} (a budget too small for the histories tends to this: \
             {:.2}× the whole-block ideal).\n\
             Budgets: one conversation = {}, all conversations = {}.\n",
            a.no_reuse_prefill_tokens,
            a.ideal_prefill_tokens,
            a.ideal_block_prefill_tokens,
            a.one_block_per_turn_tokens,
            a.system_only_prefill_tokens,
            a.system_only_prefill_tokens as f64 / a.ideal_block_prefill_tokens.max(1) as f64,
            format_bytes(self.budgets.one_conversation_bytes),
            format_bytes(self.budgets.all_conversations_bytes),
        );
        for r in &self.runs {
            s += &format!("\n### {}\n\n", run_title(r));
            s += "| turn | prompt | cached | computed prefill | TTFT p50 ms | TTFT p99 ms | \
                  attention GPU ms | decode tok/s | KV peak | evictions | preemptions |\n";
            s += "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
            for t in &r.turns {
                s += &format!(
                    "| {} | {} | {} | {} | {:.0} | {:.0} | {} | {:.2} | {:.0}% | {} | {} |\n",
                    t.turn,
                    t.prompt_tokens,
                    t.cached_tokens,
                    t.computed_prefill_tokens,
                    t.ttft_ms_p50,
                    t.ttft_ms_p99,
                    opt_ms(t.attention_gpu_ms),
                    t.decode_tokens_per_s,
                    t.kv_usage_peak * 100.0,
                    t.evictions,
                    t.preemptions
                );
            }
        }
        s += &self.summary_markdown();
        s
    }

    fn summary_markdown(&self) -> String {
        let mut s = "\n### Summary\n\n| budget | prefix cache | computed prefill | ÷ ideal | \
                     cached | of which host | prompt reused | TTFT p50 ms | TTFT p99 ms | \
                     evictions | preemptions | wall s | replies sha256 |\n\
                     |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
            .to_string();
        let ideal = self.arithmetic.ideal_prefill_tokens.max(1) as f64;
        for r in &self.runs {
            let t = &r.totals;
            s += &format!(
                "| {} ({}) | {} | {} | {:.2} | {} | {} | {:.1}% | {:.0} | {:.0} | {} | {} | {:.1} \
                 | `{}` |\n",
                r.label,
                format_bytes(r.kv_cache_memory),
                if r.prefix_cache { "on" } else { "off" },
                t.computed_prefill_tokens,
                t.computed_prefill_tokens as f64 / ideal,
                t.cached_tokens,
                t.host_hit_tokens,
                // of the prompt tokens: taken from the cache
                100.0 * t.cached_tokens as f64
                    / (t.cached_tokens + t.computed_prefill_tokens).max(1) as f64,
                t.ttft_ms_p50,
                t.ttft_ms_p99,
                t.evictions,
                t.preemptions,
                t.wall_s,
                &r.replies_sha256[..16.min(r.replies_sha256.len())]
            );
        }
        s += &format!(
            "\nReplies identical across runs: {}\n",
            if self.replies_identical { "yes" } else { "NO" }
        );
        if let Some(a) = &self.acceptance {
            s += &format!(
                "\nAcceptance ({} vs {}): computed prefill {:.2}× fewer (want ≥ {MIN_PREFILL_RATIO}), \
                 TTFT p50 {:.2}× lower (want ≥ {MIN_TTFT_RATIO}), large budget {} tokens over the \
                 ideal (within one block per turn: {}), replies identical: {} → {}\n",
                a.small,
                a.large,
                a.prefill_ratio,
                a.ttft_p50_ratio,
                a.large_over_ideal_tokens,
                if a.large_within_one_block_per_turn { "yes" } else { "no" },
                if a.replies_identical { "yes" } else { "no" },
                if a.pass { "PASS" } else { "FAIL" }
            );
        }
        if let Some(a) = &self.tier_acceptance {
            s += &format!(
                "\nHost tier ({} with {} of host RAM vs without): computed prefill {:.2}× fewer \
                 (want ≥ {MIN_TIER_PREFILL_RATIO}), TTFT p50 {:.2}× lower (want > 1), {} tokens \
                 over the whole-block ideal (within one block per turn: {}), replies identical: \
                 {} → {}\n",
                a.budget,
                format_bytes(a.host),
                a.prefill_ratio,
                a.ttft_p50_ratio,
                a.over_block_ideal_tokens,
                if a.within_one_block_per_turn { "yes" } else { "no" },
                if a.replies_identical { "yes" } else { "no" },
                if a.pass { "PASS" } else { "FAIL" }
            );
        }
        s
    }
}

impl MultiturnReport {
    /// The plot: TTFT p50 and computed prefill tokens per turn, one line per run.
    pub fn panels(&self) -> Vec<super::plot::Panel> {
        use super::plot::{Panel, Series};
        let series = |f: fn(&super::multiturn::TurnReport) -> f64| -> Vec<Series> {
            self.runs
                .iter()
                .map(|r| Series {
                    name: format!(
                        "{} ({}){}",
                        r.label,
                        format_bytes(r.kv_cache_memory),
                        if r.prefix_cache { "" } else { ", no prefix cache" }
                    ),
                    points: r.turns.iter().map(|t| (t.turn as f64, f(t))).collect(),
                })
                .collect()
        };
        vec![
            Panel {
                title: "TTFT p50 per turn".into(),
                x_label: "turn".into(),
                y_label: "TTFT p50 (ms)".into(),
                series: series(|t| t.ttft_ms_p50),
            },
            Panel {
                title: "computed prefill tokens per turn".into(),
                x_label: "turn".into(),
                y_label: "tokens (all users)".into(),
                series: series(|t| t.computed_prefill_tokens as f64),
            },
        ]
    }
}
