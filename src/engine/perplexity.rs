//! Perplexity with llama.cpp's `llama-perplexity` convention, so results compare one to one:
//! the text is tokenized once (BOS first if the model adds one), cut into consecutive chunks of
//! `ctx` tokens, the first token of each chunk replaced by BOS where the model uses one, and only
//! the second half of each chunk's predictions scored (positions ctx/2 .. ctx-2 predict the
//! next token). Each chunk starts from an empty KV cache.
//!
//! KL-divergence mode ([`Engine::perplexity_vs`]): a second engine (the baseline, e.g. f16 KV)
//! scores the same chunks, and at every scored position the token distributions are compared:
//! mean KL(P_base ‖ P_this) and how often both put the same token first. Perplexity alone hides
//! damage that moves probability between wrong tokens; KLD and top-1 agreement do not.

use std::time::Instant;

use super::{CompletionRequest, Engine, EngineError};

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
    /// Against a baseline engine (`--kld`): distribution distance per scored position.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kld: Option<KldReport>,
}

/// This run's token distributions against a baseline's on the same positions.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KldReport {
    /// The baseline's KV format (e.g. `f16`).
    pub base_kv_cache_dtype: String,
    /// The baseline's perplexity on the same positions.
    pub base_ppl: f64,
    /// (ppl / base_ppl − 1) × 100.
    pub ppl_delta_pct: f64,
    /// Mean over positions of KL(P_base ‖ P_this) in nats.
    pub kld_mean: f64,
    /// Standard error of `mean_kld`.
    pub kld_stderr: f64,
    /// Largest KLD of one position.
    pub max_kld: f64,
    /// Fraction of positions whose most likely token is the same in both runs.
    pub top1_agreement: f64,
}

/// log softmax(logits) in f64.
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max + logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
    logits.iter().map(|&l| l as f64 - lse).collect()
}

/// KL(P ‖ Q) from log-probabilities, in nats (≥ 0 up to rounding).
pub fn kl_divergence(log_p: &[f64], log_q: &[f64]) -> f64 {
    log_p.iter().zip(log_q).map(|(&lp, &lq)| lp.exp() * (lp - lq)).sum::<f64>().max(0.0)
}

fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

#[derive(Default)]
struct Sums {
    nll: f64,
    nll2: f64,
    count: usize,
}

impl Sums {
    fn add(&mut self, v: f64) {
        self.nll += v;
        self.nll2 += v * v;
        self.count += 1;
    }
    fn mean(&self) -> f64 {
        self.nll / self.count.max(1) as f64
    }
    fn stderr(&self) -> f64 {
        let m = self.mean();
        let var = (self.nll2 / self.count.max(1) as f64 - m * m).max(0.0);
        (var / (self.count as f64 - 1.0).max(1.0)).sqrt()
    }
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
        on_chunk: impl FnMut(usize, f64),
    ) -> Result<PerplexityReport, EngineError> {
        self.perplexity_vs(text, opts, None, on_chunk)
    }

    /// [`Engine::perplexity`], and with `base` (an engine on the same model, e.g. with f16 KV)
    /// also the KL divergence and top-1 agreement of this engine's token distributions against
    /// `base`'s, position by position (the report's `kld`). Both engines must be idle.
    pub fn perplexity_vs(
        &mut self,
        text: &str,
        opts: &PerplexityOptions,
        mut base: Option<&mut Engine>,
        mut on_chunk: impl FnMut(usize, f64),
    ) -> Result<PerplexityReport, EngineError> {
        let ctx = opts.ctx;
        check_options(opts, self.resolved.max_model_len)?;
        let add_bos = self.frontend.tokenizer().add_bos();
        let tokens = self.frontend.tokenizer().encode(text, true)?;
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
        let (mut sums, mut base_sums, mut kld) =
            (Sums::default(), Sums::default(), Sums::default());
        let (mut max_kld, mut agree) = (0.0f64, 0usize);
        let mut running = Vec::new();
        for i in 0..n_chunks {
            let mut chunk = tokens[i * ctx..(i + 1) * ctx].to_vec();
            if add_bos {
                if let Some(bos) = self.frontend.tokenizer().bos_id() {
                    chunk[0] = bos;
                }
            }
            if base.is_none() {
                // only each position's log-probability of its target, reduced on the GPU
                for lp in self.scored_logprobs(&chunk, first)? {
                    sums.add(-f64::from(lp));
                }
                let ppl = sums.mean().exp();
                running.push(ppl);
                on_chunk(i, ppl);
                continue;
            }
            let rows = self.scored_rows(&chunk, first)?;
            let base_rows = match base.as_deref_mut() {
                Some(b) => {
                    if b.frontend.tokenizer().vocab_size() != self.frontend.tokenizer().vocab_size()
                    {
                        return Err(EngineError::Config(
                            "the KLD baseline engine has another vocabulary; load the same model"
                                .into(),
                        ));
                    }
                    Some(b.scored_rows(&chunk, first)?)
                }
                None => None,
            };
            for (r, logits) in rows.iter().enumerate() {
                let target = chunk[first + r + 1];
                sums.add(nll(logits, target));
                if let Some(base_rows) = &base_rows {
                    let b = &base_rows[r];
                    base_sums.add(nll(b, target));
                    let d = kl_divergence(&log_softmax(b), &log_softmax(logits));
                    kld.add(d);
                    max_kld = max_kld.max(d);
                    agree += usize::from(argmax(b) == argmax(logits));
                }
            }
            let ppl = sums.mean().exp();
            running.push(ppl);
            on_chunk(i, ppl);
        }
        let ppl = sums.mean().exp();
        let kld = base.map(|b| {
            let base_ppl = base_sums.mean().exp();
            KldReport {
                base_kv_cache_dtype: b.resolved.kv_cache.to_string(),
                base_ppl,
                ppl_delta_pct: (ppl / base_ppl - 1.0) * 100.0,
                kld_mean: kld.mean(),
                kld_stderr: kld.stderr(),
                max_kld,
                top1_agreement: agree as f64 / kld.count.max(1) as f64,
            }
        });
        Ok(PerplexityReport {
            ppl,
            ppl_stderr: ppl * sums.stderr(),
            chunks: n_chunks,
            tokens_scored: sums.count,
            ctx,
            kv_cache_dtype: self.resolved.kv_cache.format().to_string(),
            seconds: start.elapsed().as_secs_f64(),
            running_ppl: running,
            kld,
        })
    }

    /// The logits of positions `first .. chunk.len() − 1` of a chunk (each predicts the next
    /// token): an ordinary request through the scheduler that asks for prompt logits from
    /// `first` (so none of those positions comes from the prefix cache) and one greedy token,
    /// which is discarded. Needs an idle engine: the steps it runs would otherwise carry other
    /// requests' events, which it drops.
    fn scored_rows(&mut self, chunk: &[u32], first: usize) -> Result<Vec<Vec<f32>>, EngineError> {
        let id = self.run_scored(chunk, first, false)?;
        let mut rows = self.take_prompt_logits(id);
        debug_assert_eq!(rows.len(), chunk.len() - first);
        rows.truncate(chunk.len() - 1 - first); // the last position predicts past the chunk
        Ok(rows)
    }

    /// [`Engine::scored_rows`]'s positions' log-probabilities of their next token only
    /// ([`CompletionRequest::prompt_logprobs_only`]: 8 bytes a position read back, not the
    /// vocabulary's logits).
    fn scored_logprobs(&mut self, chunk: &[u32], first: usize) -> Result<Vec<f32>, EngineError> {
        let id = self.run_scored(chunk, first, true)?;
        let mut lps = self.take_prompt_logprobs(id);
        debug_assert_eq!(lps.len(), chunk.len() - first);
        lps.truncate(chunk.len() - 1 - first); // the last position predicts past the chunk
        Ok(lps)
    }

    /// Runs `chunk` as a request with prompt logits from `first` (their log-probabilities only
    /// with `logprobs_only`) to its end; returns its id.
    fn run_scored(
        &mut self,
        chunk: &[u32],
        first: usize,
        logprobs_only: bool,
    ) -> Result<crate::sched::RequestId, EngineError> {
        if self.has_unfinished() {
            return Err(EngineError::Busy("perplexity"));
        }
        let mut req = CompletionRequest::new(chunk.to_vec(), 1);
        req.ignore_eos = true;
        req.prompt_logits_from = Some(first);
        req.prompt_logprobs_only = logprobs_only;
        let id = self.add_request(req)?;
        while self.has_unfinished() {
            self.step()?;
        }
        Ok(id)
    }
}

/// `-c` between 4 and the engine's context, `--chunks` at least 1.
fn check_options(opts: &PerplexityOptions, max_model_len: usize) -> Result<(), EngineError> {
    let ctx = opts.ctx;
    let message = if ctx < 4 {
        format!(
            "perplexity -c {ctx} is too small: each chunk scores its second half, so -c must be \
             at least 4"
        )
    } else if ctx > max_model_len {
        format!(
            "perplexity -c {ctx} exceeds the context the engine was loaded with \
             ({max_model_len}); use at most {max_model_len}"
        )
    } else if opts.max_chunks == Some(0) {
        "--chunks 0 scores nothing; give at least 1 (or leave it out to score every chunk)"
            .to_string()
    } else {
        return Ok(());
    };
    Err(EngineError::Config(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_divergence_against_a_hand_computed_value() {
        // P = softmax([0, ln 3]) = (1/4, 3/4); Q = (1/2, 1/2):
        // KL = 1/4 ln(1/2) + 3/4 ln(3/2) = 0.130812...
        let p = log_softmax(&[0.0, 3f32.ln()]);
        let q = log_softmax(&[5.0, 5.0]);
        let want = 0.25 * 0.5f64.ln() + 0.75 * 1.5f64.ln();
        assert!((kl_divergence(&p, &q) - want).abs() < 1e-7, "{}", kl_divergence(&p, &q));
        // KL(P ‖ P) = 0, also for logits shifted by a constant (softmax ignores it)
        let r = log_softmax(&[1000.0, 1000.0 + 3f32.ln()]);
        assert!(kl_divergence(&p, &r).abs() < 1e-6);
        // and it is not symmetric
        assert!((kl_divergence(&q, &p) - kl_divergence(&p, &q)).abs() > 1e-3);
    }

    #[test]
    fn argmax_takes_the_first_of_equal_maxima() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
        assert_eq!(nll(&[0.0, 0.0], 1), 2f64.ln());
    }

    #[test]
    fn options_are_checked_with_messages_that_name_the_flag() {
        let opts = |ctx, max_chunks| PerplexityOptions { ctx, max_chunks };
        let err = |o: PerplexityOptions| check_options(&o, 512).unwrap_err().to_string();
        assert!(err(opts(3, None)).contains("at least 4"), "{}", err(opts(3, None)));
        assert!(!err(opts(3, None)).contains("≤ 3"));
        assert!(err(opts(1024, None)).contains("at most 512"));
        assert!(err(opts(64, Some(0))).contains("--chunks 0"));
        check_options(&opts(4, Some(1)), 512).unwrap();
        check_options(&opts(512, None), 512).unwrap();
    }
}
