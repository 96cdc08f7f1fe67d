//! Perplexity with llama.cpp's `llama-perplexity` convention, so results compare one to one:
//! the text is tokenized once (BOS first if the model adds one), cut into consecutive chunks of
//! `ctx` tokens, the first token of each chunk replaced by BOS where the model uses one, and only
//! the second half of each chunk's predictions scored (positions ctx/2 .. ctx-2 predict the
//! next token). Each chunk starts from an empty KV cache.

use std::time::Instant;

use super::{Engine, EngineError};
use crate::model::LogitsWanted;

/// What to measure.
#[derive(Clone, Debug)]
pub struct PerplexityOptions {
    /// Tokens per chunk (`-c`).
    pub ctx: usize,
    /// Score at most this many chunks (`--chunks`); default all.
    pub max_chunks: Option<usize>,
}

/// The result; serialized as the `perplexity --json` object.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PerplexityReport {
    pub ppl: f64,
    /// Standard error of the PPL estimate (llama.cpp's ±).
    pub ppl_stderr: f64,
    pub chunks: usize,
    pub tokens_scored: usize,
    pub ctx: usize,
    pub kv_cache_dtype: String,
    pub seconds: f64,
    /// Running PPL after each chunk (llama.cpp prints these as `[1]…,[2]…`).
    pub running_ppl: Vec<f64>,
}

/// -log softmax(logits)[target], computed in f64 with the max subtracted.
pub fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    -(logits[target as usize] as f64 - max - sum.ln())
}

impl Engine {
    /// Perplexity of `text`. `on_chunk(i, running_ppl)` is called after each chunk.
    pub fn perplexity(
        &mut self,
        text: &str,
        opts: &PerplexityOptions,
        mut on_chunk: impl FnMut(usize, f64),
    ) -> Result<PerplexityReport, EngineError> {
        let ctx = opts.ctx;
        if ctx < 4 || ctx > self.resolved.max_model_len {
            return Err(EngineError::Config(format!(
                "perplexity needs 4 ≤ -c ≤ {} (the context the engine was loaded with); got {ctx}",
                self.resolved.max_model_len
            )));
        }
        let add_bos = self.tokenizer.add_bos();
        let tokens = self.tokenizer.encode(text, true)?;
        if tokens.len() < 2 * ctx {
            return Err(EngineError::Config(format!(
                "the text has {} tokens; perplexity with -c {ctx} needs at least {} (two chunks); \
                 give a longer text or a smaller -c",
                tokens.len(),
                2 * ctx
            )));
        }
        let n_chunks = (tokens.len() / ctx).min(opts.max_chunks.unwrap_or(usize::MAX));
        let first = ctx / 2;
        let start = Instant::now();
        let (mut nll_sum, mut nll2_sum, mut count) = (0.0f64, 0.0f64, 0usize);
        let mut running = Vec::new();
        for i in 0..n_chunks {
            let mut chunk = tokens[i * ctx..(i + 1) * ctx].to_vec();
            if add_bos {
                if let Some(bos) = self.tokenizer.bos_id() {
                    chunk[0] = bos;
                }
            }
            let seq = u64::MAX - i as u64;
            self.sched.kv_mut().ok_or(EngineError::Busy("perplexity"))?.add_sequence(seq)?;
            let result = self.score(seq, &chunk, |range| {
                let lo = range.start.max(first);
                let hi = range.end.min(ctx - 1);
                if lo < hi {
                    LogitsWanted::Range(lo - range.start..hi - range.start)
                } else {
                    LogitsWanted::None
                }
            });
            self.sched.kv_mut().ok_or(EngineError::Busy("perplexity"))?.free_sequence(seq)?;
            let mut pos = first;
            for logits in result? {
                for r in 0..logits.num_rows() {
                    let v = nll(logits.row(r), chunk[pos + 1]);
                    nll_sum += v;
                    nll2_sum += v * v;
                    count += 1;
                    pos += 1;
                }
            }
            let ppl = (nll_sum / count as f64).exp();
            running.push(ppl);
            on_chunk(i, ppl);
        }
        let mean = nll_sum / count as f64;
        let var = (nll2_sum / count as f64 - mean * mean).max(0.0);
        let ppl = mean.exp();
        Ok(PerplexityReport {
            ppl,
            ppl_stderr: ppl * (var / (count as f64 - 1.0).max(1.0)).sqrt(),
            chunks: n_chunks,
            tokens_scored: count,
            ctx,
            kv_cache_dtype: self.resolved.kv_cache.format().to_string(),
            seconds: start.elapsed().as_secs_f64(),
            running_ppl: running,
        })
    }
}
