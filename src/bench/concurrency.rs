//! `kvrun bench concurrency`: batches of 1, 2, 4, 8 … requests submitted together, each with
//! its own seeded prompt of a fixed length (distinct text, so the prefix cache has nothing to
//! share; `cached_tokens` shows it) and a fixed output length (end-of-sequence ignored). Per level: KV bytes
//! held at the peak, TTFT (mean, p99), time per output token, generated tokens per second over
//! the whole level, and request latency.

use std::collections::HashSet;
use std::time::Instant;

use anyhow::{bail, Context};

use super::stats::{mean, percentile};
use super::workload::{exact_tokens, SplitMix64};
use crate::engine::{CompletionRequest, Engine, EngineConfig, OutputEvent};
use crate::sched::RequestId;

/// The workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConcurrencyBench {
    /// Requests submitted together, one level after the other.
    pub levels: Vec<usize>,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    pub seed: u64,
}

/// One level's figures.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LevelReport {
    pub concurrency: usize,
    /// Most KV bytes held by live sequences after any step of the level.
    pub kv_bytes_peak: u64,
    pub kv_blocks_peak: usize,
    /// Prompt tokens served by the prefix cache (0 when the prompts are distinct).
    pub cached_tokens: u64,
    pub ttft_ms_mean: f64,
    pub ttft_ms_p99: f64,
    /// Seconds between output tokens after the first, per request, mean over requests.
    pub tpot_ms_mean: f64,
    /// Generated tokens ÷ wall time of the level.
    pub throughput_tokens_per_s: f64,
    /// Submission to last token.
    pub latency_ms_mean: f64,
    pub latency_ms_p99: f64,
    pub wall_s: f64,
}

/// The report; `--json` writes it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ConcurrencyReport {
    pub model: String,
    pub adapter: String,
    pub backend: String,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    pub block_size: usize,
    pub kv_cache_memory: u64,
    pub prefix_cache: bool,
    pub levels: Vec<LevelReport>,
}

impl ConcurrencyBench {
    /// Refuses empty or zero levels and zero lengths.
    pub fn validate(&self) -> Result<(), String> {
        if self.levels.is_empty() || self.levels.contains(&0) {
            return Err("--levels needs one or more concurrency levels of at least 1".into());
        }
        if self.prompt_tokens == 0 || self.output_tokens == 0 {
            return Err("--prompt-tokens and --output-tokens must be at least 1".into());
        }
        Ok(())
    }

    /// `base` sized for the workload: as many sequences as the largest level, each `prompt +
    /// output` tokens long unless `base` sets the context length; the budget, if not given,
    /// holds them all.
    pub fn engine_config(&self, base: &EngineConfig) -> EngineConfig {
        let max_level = self.levels.iter().copied().max().unwrap_or(1);
        EngineConfig {
            max_num_seqs: max_level,
            max_model_len: base.max_model_len.or(Some(self.prompt_tokens + self.output_tokens)),
            max_logit_rows: None,
            ..base.clone()
        }
    }

    /// Runs every level on `engine` (sized by [`ConcurrencyBench::engine_config`]), calling
    /// `on_token` per generated token.
    pub fn run(
        &self,
        engine: &mut Engine,
        model_name: &str,
        on_token: &mut dyn FnMut(),
    ) -> anyhow::Result<ConcurrencyReport> {
        self.validate().map_err(anyhow::Error::msg)?;
        let warm = self.prompt(engine, u64::MAX, 0, self.prompt_tokens.min(32))?;
        let mut req = CompletionRequest::new(warm, 4);
        req.ignore_eos = true;
        engine.generate(&req, |_| {}).context("warm-up request")?;
        engine.reset_prefix_cache();
        let mut levels = Vec::new();
        for &level in &self.levels {
            levels.push(self.run_level(engine, level, on_token)?);
        }
        let gpu = engine.gpu();
        Ok(ConcurrencyReport {
            model: model_name.to_string(),
            adapter: gpu.info.name.clone(),
            backend: format!("{:?}", gpu.info.backend),
            prompt_tokens: self.prompt_tokens,
            output_tokens: self.output_tokens,
            block_size: engine.config().block_size,
            kv_cache_memory: engine.config().kv_cache_memory,
            prefix_cache: engine.scheduler().kv().prefix_cache().is_some(),
            levels,
        })
    }

    /// Request `idx` of `level`: seeded text of exactly `len` tokens.
    fn prompt(
        &self,
        engine: &Engine,
        level: u64,
        idx: u64,
        len: usize,
    ) -> anyhow::Result<Vec<u32>> {
        let mut rng = SplitMix64::derive(self.seed, &[level, idx]);
        Ok(exact_tokens(engine.tokenizer(), &mut rng, len)?)
    }

    fn run_level(
        &self,
        engine: &mut Engine,
        level: usize,
        on_token: &mut dyn FnMut(),
    ) -> anyhow::Result<LevelReport> {
        let mut open = HashSet::<RequestId>::new();
        for idx in 0..level {
            let prompt = self.prompt(engine, level as u64, idx as u64, self.prompt_tokens)?;
            let mut req = CompletionRequest::new(prompt, self.output_tokens);
            req.ignore_eos = true;
            open.insert(engine.add_request(req)?);
        }
        let started = Instant::now();
        let (mut ttft, mut tpot, mut latency) = (Vec::new(), Vec::new(), Vec::new());
        let (mut cached, mut generated, mut peak_blocks) = (0u64, 0u64, 0usize);
        while engine.has_unfinished() {
            for event in engine.step()? {
                match event {
                    OutputEvent::Delta { .. } => {
                        generated += 1;
                        on_token();
                    }
                    OutputEvent::Finished { id, usage, timing, .. } if open.remove(&id) => {
                        if usage.completion_tokens != self.output_tokens {
                            bail!("a request ended after {} tokens", usage.completion_tokens);
                        }
                        ttft.push(timing.ttft_s * 1e3);
                        latency.push((timing.ttft_s + timing.decode_s) * 1e3);
                        let decoded = usage.completion_tokens.saturating_sub(1);
                        if decoded > 0 {
                            tpot.push(timing.decode_s * 1e3 / decoded as f64);
                        }
                        cached += usage.cached_tokens as u64;
                    }
                    OutputEvent::Finished { .. } | OutputEvent::PromptLogprobs { .. } => {}
                }
            }
            let kv = engine.scheduler().kv();
            peak_blocks = peak_blocks.max(kv.num_blocks() - kv.num_free_or_evictable_blocks());
        }
        let wall_s = started.elapsed().as_secs_f64();
        engine.reset_prefix_cache();
        Ok(LevelReport {
            concurrency: level,
            kv_bytes_peak: peak_blocks as u64 * engine.kv_layout().bytes_per_block(),
            kv_blocks_peak: peak_blocks,
            cached_tokens: cached,
            ttft_ms_mean: mean(&ttft).unwrap_or(0.0),
            ttft_ms_p99: percentile(&ttft, 99.0).unwrap_or(0.0),
            tpot_ms_mean: mean(&tpot).unwrap_or(0.0),
            throughput_tokens_per_s: generated as f64 / wall_s,
            latency_ms_mean: mean(&latency).unwrap_or(0.0),
            latency_ms_p99: percentile(&latency, 99.0).unwrap_or(0.0),
            wall_s,
        })
    }
}

impl ConcurrencyReport {
    /// A Markdown table, one row per level.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "`bench concurrency` — {} on {} ({}); prompts {} tokens, outputs {} tokens; KV budget \
             {}; prefix cache {}\n\n",
            self.model,
            self.adapter,
            self.backend,
            self.prompt_tokens,
            self.output_tokens,
            crate::kv::format_bytes(self.kv_cache_memory),
            if self.prefix_cache { "on" } else { "off" }
        );
        s += "| concurrency | KV peak | TTFT mean ms | TTFT p99 ms | TPOT mean ms | \
              throughput tok/s | latency mean ms | latency p99 ms | wall s |\n";
        s += "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
        for l in &self.levels {
            s += &format!(
                "| {} | {} | {:.0} | {:.0} | {:.1} | {:.2} | {:.0} | {:.0} | {:.1} |\n",
                l.concurrency,
                crate::kv::format_bytes(l.kv_bytes_peak),
                l.ttft_ms_mean,
                l.ttft_ms_p99,
                l.tpot_ms_mean,
                l.throughput_tokens_per_s,
                l.latency_ms_mean,
                l.latency_ms_p99,
                l.wall_s
            );
        }
        s
    }
}
