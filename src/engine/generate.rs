//! One prompt, streamed: chunked prefill, then one decode step per token until EOS, a stop
//! string, the token limit or the context limit.

use std::time::Instant;

use super::{Engine, EngineError};
use crate::model::{ForwardBatch, LogitsWanted, SeqChunk, StepTiming};
use crate::output::{Detokenizer, FinishReason, OutputStream, StopCondition};
use crate::sample::{Sampler, SamplingParams};

/// A generation request on token ids.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Stop when the output contains one of these (the output is cut before it).
    pub stop: Vec<String>,
    /// Keep generating past EOS (benchmarks).
    pub ignore_eos: bool,
}

/// What a generation produced, with its timings.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GenerateOutput {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    /// Seconds from the start of the request to the first generated token.
    pub ttft_s: f64,
    /// Seconds spent in decode steps (after the first token).
    pub decode_s: f64,
    /// GPU time of the prefill steps, summed (when the model measures timing).
    #[serde(skip)]
    pub prefill_timing: Option<StepTiming>,
    /// GPU time of each decode step (when the model measures timing).
    #[serde(skip)]
    pub decode_timings: Vec<StepTiming>,
}

impl GenerateOutput {
    /// Decode speed after the first token.
    pub fn decode_tokens_per_s(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1);
        if n == 0 || self.decode_s == 0.0 {
            0.0
        } else {
            n as f64 / self.decode_s
        }
    }
}

impl Engine {
    /// Generates from `req.prompt`, calling `on_text` with each new piece of text.
    pub fn generate(
        &mut self,
        req: &GenerateRequest,
        mut on_text: impl FnMut(&str),
    ) -> Result<GenerateOutput, EngineError> {
        req.params.validate()?;
        self.check_prompt(req.prompt.len())?;
        let start = Instant::now();
        let max_new =
            req.params.max_tokens.min(self.resolved.max_model_len - req.prompt.len()).max(1);
        let mut sampler = Sampler::new(&req.params);
        let stop = StopCondition {
            max_tokens: max_new,
            eos_ids: if req.ignore_eos { Vec::new() } else { self.tokenizer.eos_ids().to_vec() },
            stop_strings: req.stop.clone(),
        };
        let mut out = OutputStream::new(stop, Detokenizer::new(true));
        let seq = 0;
        self.kv.add_sequence(seq)?;
        let result = self.run_sequence(seq, req, &mut sampler, &mut out, &mut on_text, start);
        self.kv.free_sequence(seq)?;
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn run_sequence(
        &mut self,
        seq: u64,
        req: &GenerateRequest,
        sampler: &mut Sampler,
        out: &mut OutputStream,
        on_text: &mut dyn FnMut(&str),
        start: Instant,
    ) -> Result<GenerateOutput, EngineError> {
        let n = req.prompt.len();
        let logits = self.prefill(seq, &req.prompt, 0, |r| {
            if r.end == n {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            }
        })?;
        let prefill_timing = logits.iter().filter_map(|l| l.timing.clone()).reduce(|mut a, b| {
            a.add(&b);
            a
        });
        let mut decode_timings = Vec::new();
        let mut token = sampler.sample(logits.last().expect("one chunk at least").row(0));
        let ttft_s = start.elapsed().as_secs_f64();
        let decode_start = Instant::now();
        let mut tokens = Vec::new();
        let finish_reason = loop {
            tokens.push(token);
            let delta = out.push(&self.tokenizer, token)?;
            on_text(&delta.text);
            if let Some(reason) = delta.finish {
                break reason;
            }
            let pos = n + tokens.len() - 1;
            self.kv.reserve(seq, 1)?;
            let table = self.kv.table(seq).expect("sequence registered").as_slice();
            let chunk = SeqChunk {
                tokens: &[token],
                start_pos: pos,
                block_table: table,
                logits: LogitsWanted::Last,
            };
            let batch =
                ForwardBatch::new(&[chunk], self.resolved.block_size, self.model.query_tile());
            let logits = self.model.forward(&batch)?;
            token = sampler.sample(logits.row(0));
            decode_timings.extend(logits.timing);
        };
        Ok(GenerateOutput {
            tokens,
            text: out.text().to_string(),
            finish_reason,
            prompt_tokens: n,
            ttft_s,
            decode_s: decode_start.elapsed().as_secs_f64(),
            prefill_timing,
            decode_timings,
        })
    }
}
