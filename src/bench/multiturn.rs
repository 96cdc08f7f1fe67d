//! `kvrun bench multiturn`: U users share a system prompt and chat for T turns, as concurrent
//! requests on one engine; run once per KV budget (and optionally without the prefix cache) to
//! show what reuse saves in computed prefill tokens and time to first token.
//!
//! Scheduling of the workload: every user's turn 1 is submitted at once; a user's next turn is
//! submitted right after the step in which its previous reply finished. Replies are greedy with
//! end-of-sequence ignored, so each has exactly `reply_tokens` tokens and every run (any budget,
//! cache on or off) must produce the same replies — `replies_sha256` checks it.
//!
//! Attribution: prompt, cached and computed prefill tokens, TTFT, decode speed and preemptions
//! are the requests' own ([`crate::sched::Usage`], [`crate::engine::RequestTiming`]); evictions
//! of a step go to the newest turn in flight during it; KV usage peaks count for every turn in
//! flight. `attention_gpu_ms` is the attention GPU time (timestamp queries) of the steps from a
//! request's submission to its first token, mean over the turn's requests: a step shared by
//! several requests counts for each of them.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

use super::stats::{mean, percentile};
use super::workload::{MultiturnWorkload, PrefillArithmetic, SplitMix64};
use crate::engine::{CompletionRequest, Engine, EngineConfig, OutputEvent};
use crate::kv::{parse_bytes, KvLayout};
use crate::model::Timing;
use crate::sched::{FinishReason, RequestId, SchedulerStats, Usage};

/// A KV budget as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Budget {
    /// The smallest that holds one conversation at its longest (`one`).
    OneConversation,
    /// Every user's whole conversation at once (`all`).
    AllConversations,
    Bytes(u64),
}

impl Budget {
    /// `one`, `all`, or a byte size (`64MiB`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "one" => Ok(Budget::OneConversation),
            "all" => Ok(Budget::AllConversations),
            other => parse_bytes(other).map(Budget::Bytes).map_err(|e| e.to_string()),
        }
    }

    pub fn label(&self) -> String {
        match self {
            Budget::OneConversation => "one".into(),
            Budget::AllConversations => "all".into(),
            Budget::Bytes(b) => crate::kv::format_bytes(*b),
        }
    }

    /// Bytes, for a workload whose longest conversation is `max_model_len` tokens.
    pub fn bytes(&self, sizes: &BudgetSizes) -> u64 {
        match self {
            Budget::OneConversation => sizes.one_conversation_bytes,
            Budget::AllConversations => sizes.all_conversations_bytes,
            Budget::Bytes(b) => *b,
        }
    }
}

/// The two named budgets of a workload, in bytes of whole blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BudgetSizes {
    /// Blocks for one conversation at its longest (`max_model_len` tokens).
    pub one_conversation_bytes: u64,
    /// `users ×` that.
    pub all_conversations_bytes: u64,
}

impl BudgetSizes {
    pub fn new(layout: &KvLayout, max_model_len: usize, users: usize) -> Self {
        let one = layout.blocks_for_tokens(max_model_len) as u64 * layout.bytes_per_block();
        BudgetSizes { one_conversation_bytes: one, all_conversations_bytes: one * users as u64 }
    }
}

/// One run of the workload: a budget and whether the prefix cache is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSetting {
    pub label: String,
    pub kv_cache_memory: u64,
    pub prefix_cache: bool,
    /// Host RAM for the blocks the pool evicts (`--kv-offloading-size`); `None`: no host tier.
    pub kv_offloading_size: Option<u64>,
}

impl RunSetting {
    /// `base` sized for this run of `workload`: one sequence per user, the longest
    /// conversation as context length, this budget and cache setting.
    pub fn engine_config(&self, base: &EngineConfig, workload: &MultiturnWorkload) -> EngineConfig {
        EngineConfig {
            max_num_seqs: workload.spec.users,
            max_model_len: Some(workload.longest_conversation()),
            kv_cache_memory: Some(self.kv_cache_memory),
            enable_prefix_cache: self.prefix_cache,
            kv_offloading_size: self.kv_offloading_size,
            max_logit_rows: None,
            ..base.clone()
        }
    }
}

/// One turn of every user, aggregated.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TurnReport {
    /// 1-based.
    pub turn: usize,
    pub requests: usize,
    /// Σ over users.
    pub prompt_tokens: u64,
    /// Σ of prefix-cache hits at first admission.
    pub cached_tokens: u64,
    /// Σ of tokens computed in prefill chunks, recomputation after preemption included.
    pub computed_prefill_tokens: u64,
    pub ttft_ms_p50: f64,
    pub ttft_ms_p99: f64,
    /// Attention GPU ms up to the first token, mean over requests (see the module docs).
    pub attention_gpu_ms: Option<f64>,
    /// Decode tokens per second of each request after its first token, mean over requests.
    pub decode_tokens_per_s: f64,
    /// Highest fraction of KV blocks held by live sequences while the turn was in flight.
    pub kv_usage_peak: f64,
    /// Cached blocks evicted in steps where this was the newest turn in flight.
    pub evictions: u64,
    pub preemptions: u64,
}

/// A run's totals.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RunTotals {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// The scheduler's count over the run (recomputation included).
    pub computed_prefill_tokens: u64,
    pub generated_tokens: u64,
    /// Over every request of the run.
    pub ttft_ms_p50: f64,
    pub ttft_ms_p99: f64,
    pub evictions: u64,
    pub preemptions: u64,
    pub kv_usage_peak: f64,
    pub wall_s: f64,
    /// Of `cached_tokens`' admissions, tokens brought back from the host tier (0 without one).
    pub host_hit_tokens: u64,
    /// Blocks written back to the host tier, and copied back from it.
    pub host_offloaded_blocks: u64,
    pub host_loaded_blocks: u64,
    /// Bytes those copies moved over the bus, both ways.
    pub host_bytes_moved: u64,
}

/// One run's report.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RunReport {
    /// The budget as given (`one`, `all`, `64 MiB`).
    pub label: String,
    /// Bytes asked for; the pool holds `kv_cache_blocks` whole blocks of it.
    pub kv_cache_memory: u64,
    pub kv_cache_blocks: usize,
    pub prefix_cache: bool,
    /// The host tier's bytes (`--kv-offloading-size`), if the run had one.
    pub kv_offloading_size: Option<u64>,
    pub turns: Vec<TurnReport>,
    pub totals: RunTotals,
    /// SHA-256 of every reply's token ids (u32 little-endian), users then turns in order.
    pub replies_sha256: String,
}

/// What one request reported when it finished.
struct Sample {
    turn: usize,
    usage: Usage,
    ttft_ms: f64,
    decode_tokens_per_s: f64,
    attention_ms: Option<f64>,
}

/// Per-turn figures only the step loop sees.
#[derive(Clone, Copy, Default)]
struct TurnSteps {
    evictions: u64,
    kv_usage_peak: f64,
}

/// Compiles the pipelines (CPU adapters compile on first dispatch) with a short request, then
/// empties the prefix cache.
fn warm_up(engine: &mut Engine) -> anyhow::Result<()> {
    let len = (engine.config().max_model_len / 2).clamp(1, 24);
    let prompt = super::workload::exact_tokens(
        engine.tokenizer(),
        &mut SplitMix64::derive(0, &[u64::MAX - 1]),
        len,
    )?;
    let mut req = CompletionRequest::new(prompt, 4);
    req.ignore_eos = true;
    engine.generate(&req, |_| {})?;
    engine.reset_prefix_cache();
    Ok(())
}

/// The conversations in flight: each user's history and its open request.
struct Conversations<'w> {
    workload: &'w MultiturnWorkload,
    histories: Vec<Vec<u32>>,
    /// `[users][turns]` reply token ids.
    replies: Vec<Vec<Vec<u32>>>,
    /// request → (user, turn, tokens so far)
    open: HashMap<RequestId, (usize, usize, Vec<u32>)>,
}

impl<'w> Conversations<'w> {
    fn new(workload: &'w MultiturnWorkload) -> Self {
        let users = workload.spec.users;
        Conversations {
            workload,
            histories: vec![workload.system.clone(); users],
            replies: vec![Vec::new(); users],
            open: HashMap::new(),
        }
    }

    /// Submits `user`'s turn `turn`: the history so far plus the turn's message.
    fn submit(&mut self, engine: &mut Engine, user: usize, turn: usize) -> anyhow::Result<()> {
        let history = &mut self.histories[user];
        history.extend_from_slice(&self.workload.messages[user][turn]);
        let mut req = CompletionRequest::new(history.clone(), self.workload.spec.reply_tokens);
        req.ignore_eos = true;
        let id = engine.add_request(req)?;
        self.open.insert(id, (user, turn, Vec::new()));
        Ok(())
    }

    fn newest_turn(&self) -> Option<usize> {
        self.open.values().map(|&(_, t, _)| t).max()
    }

    fn replies_sha256(&self) -> String {
        let mut h = Sha256::new();
        for token in self.replies.iter().flatten().flatten() {
            h.update(token.to_le_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Runs `workload` once on `engine` (freshly loaded for `setting`), calling `on_token` per
/// generated token. Fails if a reply ends early, or if the KV bookkeeping is not intact and
/// whole (every block free or evictable) at the end.
pub fn run(
    engine: &mut Engine,
    workload: &MultiturnWorkload,
    setting: &RunSetting,
    gpu_timing: bool,
    on_token: &mut dyn FnMut(),
) -> anyhow::Result<RunReport> {
    let spec = &workload.spec;
    warm_up(engine).context("warm-up request")?;
    engine.model_mut().set_timing(if gpu_timing { Timing::Attention } else { Timing::Off });
    let baseline = engine.scheduler().stats();
    let started = Instant::now();
    let mut conv = Conversations::new(workload);
    for user in 0..spec.users {
        conv.submit(engine, user, 0)?;
    }
    let mut samples = Vec::new();
    let mut steps = vec![TurnSteps::default(); spec.turns];
    let mut prev = baseline;
    while engine.has_unfinished() {
        let newest = conv.newest_turn();
        let in_flight: Vec<usize> = conv.open.values().map(|&(_, t, _)| t).collect();
        let events = engine.step()?;
        let now = engine.scheduler().stats();
        if let Some(t) = newest {
            steps[t].evictions += now.num_evicted_blocks - prev.num_evicted_blocks;
        }
        for t in in_flight {
            steps[t].kv_usage_peak = steps[t].kv_usage_peak.max(f64::from(now.kv_usage));
        }
        prev = now;
        for event in events {
            if let Some(next) = record(&mut conv, event, &mut samples, on_token)? {
                conv.submit(engine, next.0, next.1)?;
            }
        }
    }
    engine.model_mut().set_timing(Timing::Off);
    let wall_s = started.elapsed().as_secs_f64();
    check_kv_whole(engine)?;
    let turns = (0..spec.turns).map(|t| turn_report(t, &samples, steps[t])).collect();
    let block_bytes = engine.model().kv_block_bytes();
    let after = engine.scheduler().stats();
    let totals = totals(&samples, &baseline, &after, &steps, wall_s, block_bytes);
    Ok(RunReport {
        label: setting.label.clone(),
        kv_cache_memory: setting.kv_cache_memory,
        kv_cache_blocks: engine.config().num_blocks,
        prefix_cache: setting.prefix_cache,
        kv_offloading_size: setting.kv_offloading_size,
        turns,
        totals,
        replies_sha256: conv.replies_sha256(),
    })
}

/// Takes one event: a token joins its reply; a finished reply joins the history and its
/// sample is recorded. Returns the (user, turn) to submit next, if any.
fn record(
    conv: &mut Conversations<'_>,
    event: OutputEvent,
    samples: &mut Vec<Sample>,
    on_token: &mut dyn FnMut(),
) -> anyhow::Result<Option<(usize, usize)>> {
    let reply_tokens = conv.workload.spec.reply_tokens;
    match event {
        OutputEvent::PromptLogprobs { .. } => Ok(None), // never asked for
        OutputEvent::Delta { id, token, .. } => {
            if let Some(open) = conv.open.get_mut(&id) {
                open.2.push(token);
                on_token();
            }
            Ok(None)
        }
        OutputEvent::Finished { id, reason, usage, timing, .. } => {
            let Some((user, turn, reply)) = conv.open.remove(&id) else { return Ok(None) };
            if reason != FinishReason::Length || reply.len() != reply_tokens {
                bail!(
                    "user {user} turn {}: the reply ended after {} of {reply_tokens} tokens \
                     ({reason:?}); the context length must be too short",
                    turn + 1,
                    reply.len()
                );
            }
            let decoded = reply.len().saturating_sub(1) as f64;
            samples.push(Sample {
                turn,
                usage,
                ttft_ms: timing.ttft_s * 1e3,
                decode_tokens_per_s: if timing.decode_s > 0.0 {
                    decoded / timing.decode_s
                } else {
                    0.0
                },
                attention_ms: timing.prefill_gpu.as_ref().map(|t| t.attention_ms),
            });
            conv.histories[user].extend_from_slice(&reply);
            conv.replies[user].push(reply);
            let next = turn + 1;
            Ok((next < conv.workload.spec.turns).then_some((user, next)))
        }
    }
}

/// The KV bookkeeping is intact, no sequence is live, and every block is free or evictable.
fn check_kv_whole(engine: &Engine) -> anyhow::Result<()> {
    let kv = engine.scheduler().kv();
    kv.check_integrity()
        .map_err(|e| anyhow::anyhow!("KV bookkeeping broken after the run: {e}"))?;
    if kv.num_sequences() != 0 || kv.num_free_or_evictable_blocks() != kv.num_blocks() {
        bail!(
            "KV blocks leaked: {} live sequences, {} of {} blocks free or evictable",
            kv.num_sequences(),
            kv.num_free_or_evictable_blocks(),
            kv.num_blocks()
        );
    }
    Ok(())
}

fn turn_report(turn: usize, samples: &[Sample], steps: TurnSteps) -> TurnReport {
    let s: Vec<&Sample> = samples.iter().filter(|s| s.turn == turn).collect();
    let sum = |f: fn(&Usage) -> usize| s.iter().map(|x| f(&x.usage) as u64).sum::<u64>();
    let ttft: Vec<f64> = s.iter().map(|x| x.ttft_ms).collect();
    let attention: Option<Vec<f64>> = s.iter().map(|x| x.attention_ms).collect();
    let decode: Vec<f64> = s.iter().map(|x| x.decode_tokens_per_s).collect();
    TurnReport {
        turn: turn + 1,
        requests: s.len(),
        prompt_tokens: sum(|u| u.prompt_tokens),
        cached_tokens: sum(|u| u.cached_tokens),
        computed_prefill_tokens: sum(|u| u.computed_prefill_tokens),
        ttft_ms_p50: percentile(&ttft, 50.0).unwrap_or(0.0),
        ttft_ms_p99: percentile(&ttft, 99.0).unwrap_or(0.0),
        attention_gpu_ms: attention.and_then(|a| mean(&a)),
        decode_tokens_per_s: mean(&decode).unwrap_or(0.0),
        kv_usage_peak: steps.kv_usage_peak,
        evictions: steps.evictions,
        preemptions: sum(|u| u.num_preemptions),
    }
}

fn totals(
    samples: &[Sample],
    before: &SchedulerStats,
    after: &SchedulerStats,
    steps: &[TurnSteps],
    wall_s: f64,
    block_bytes: u64,
) -> RunTotals {
    let offloaded = after.host.num_offloaded - before.host.num_offloaded;
    let loaded = after.host.num_loaded - before.host.num_loaded;
    let ttft: Vec<f64> = samples.iter().map(|x| x.ttft_ms).collect();
    let sum = |f: fn(&Usage) -> usize| samples.iter().map(|x| f(&x.usage) as u64).sum::<u64>();
    RunTotals {
        prompt_tokens: sum(|u| u.prompt_tokens),
        cached_tokens: sum(|u| u.cached_tokens),
        computed_prefill_tokens: after.computed_prefill_tokens - before.computed_prefill_tokens,
        generated_tokens: after.generation_tokens - before.generation_tokens,
        ttft_ms_p50: percentile(&ttft, 50.0).unwrap_or(0.0),
        ttft_ms_p99: percentile(&ttft, 99.0).unwrap_or(0.0),
        evictions: after.num_evicted_blocks - before.num_evicted_blocks,
        preemptions: after.num_preemptions - before.num_preemptions,
        kv_usage_peak: steps.iter().map(|s| s.kv_usage_peak).fold(0.0, f64::max),
        wall_s,
        host_hit_tokens: after.host_hit_tokens - before.host_hit_tokens,
        host_offloaded_blocks: offloaded,
        host_loaded_blocks: loaded,
        host_bytes_moved: (offloaded + loaded) * block_bytes,
    }
}

/// The whole report of `kvrun bench multiturn`; `--json` writes it (keys as in DESIGN.md,
/// plus the workload, the arithmetic and the acceptance figures).
#[derive(Clone, Debug, serde::Serialize)]
pub struct MultiturnReport {
    pub model: String,
    pub adapter: String,
    pub backend: String,
    pub workload: super::workload::MultiturnSpec,
    pub block_size: usize,
    /// Context length: the longest conversation, last reply included.
    pub max_model_len: usize,
    pub budgets: BudgetSizes,
    pub arithmetic: PrefillArithmetic,
    pub runs: Vec<RunReport>,
    /// Every run produced the same replies.
    pub replies_identical: bool,
    /// Smallest vs largest budget with the prefix cache on, when both ran.
    pub acceptance: Option<super::multiturn_report::Acceptance>,
    /// A budget with the host tier against the same budget without it, when both ran.
    pub tier_acceptance: Option<super::multiturn_report::TierAcceptance>,
}
