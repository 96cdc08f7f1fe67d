//! Requests as the engine's callers see them: what comes in ([`CompletionRequest`]), what goes
//! out ([`OutputEvent`]), and the per-request state between the two (sampler, detokenizer with
//! stop strings, timings).

use std::time::Instant;

use crate::constrain::GrammarMatcher;
use crate::model::StepTiming;
use crate::output::{Detokenizer, OutputStream, StopCondition};
use crate::sample::{Sampler, SamplingParams, TokenLogprobs};
use crate::sched::{FinishReason, Request, RequestId, Usage};
use crate::tokenizer::Tokenizer;

use super::metrics::Metrics;
use super::FrontendError;

/// A generation request on token ids.
#[derive(Clone, Debug)]
pub struct CompletionRequest {
    /// Prompt token ids (render a chat template and tokenize first for chat).
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Stop when the output contains one of these (the output is cut before it).
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens (benchmarks).
    pub ignore_eos: bool,
    /// Prefix-cache isolation key: requests share cached blocks only within one namespace.
    pub namespace: Option<u64>,
    /// Also compute the logits of the prompt positions from this one on (perplexity); the
    /// engine keeps them for [`super::Engine::take_prompt_logits`].
    pub prompt_logits_from: Option<usize>,
    /// With `prompt_logits_from`: keep only each of those positions' log-probability of the
    /// next prompt token ([`super::Engine::take_prompt_logprobs`]), reduced on the GPU where
    /// the step allows (`model::LogitReadback::TargetLogprobs`: 8 bytes a row on the bus, not
    /// the vocabulary's logits), not the rows.
    pub prompt_logprobs_only: bool,
    /// Report each prompt position's token log-probability with this many most likely
    /// alternatives (vLLM's `prompt_logprobs`): one [`OutputEvent::PromptLogprobs`] before the
    /// first token. Its prompt is computed whole (no prefix-cache hit: a cached position has no
    /// logits); each row is reduced as it comes, none is kept.
    pub prompt_logprobs: Option<usize>,
    /// (token id, added to its logit) for every sampled token.
    pub logit_bias: Vec<(u32, f32)>,
    /// Ids that end the output as end-of-sequence does, without their text, also with
    /// `ignore_eos` (vLLM's `stop_token_ids`); `min_tokens` holds them back too.
    pub stop_token_ids: Vec<u32>,
    /// Leave special tokens out of the output's text (end-of-sequence never has text).
    pub skip_special_tokens: bool,
    /// The grammar the output follows (structured outputs: [`super::Frontend::compile`]).
    pub grammar: Option<GrammarMatcher>,
}

impl CompletionRequest {
    /// Greedy, `max_tokens` tokens, no stop strings, the shared namespace.
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> Self {
        CompletionRequest {
            prompt,
            params: SamplingParams { max_tokens, ..SamplingParams::default() },
            stop: Vec::new(),
            ignore_eos: false,
            namespace: None,
            prompt_logits_from: None,
            prompt_logprobs_only: false,
            prompt_logprobs: None,
            logit_bias: Vec::new(),
            stop_token_ids: Vec::new(),
            skip_special_tokens: true,
            grammar: None,
        }
    }

    /// What the engine accepts: a prompt, `max_tokens` ≥ 1, sampling parameters in range.
    pub fn validate(&self) -> Result<(), FrontendError> {
        self.params.validate()?;
        if self.params.max_tokens == 0 {
            return Err(FrontendError::ZeroMaxTokens);
        }
        if self.prompt.is_empty() {
            return Err(FrontendError::EmptyPrompt);
        }
        if self.grammar.is_some() && (self.ignore_eos || self.params.min_tokens > 0) {
            // a complete grammar ends the output (or allows only end-of-sequence)
            return Err(FrontendError::Constraint(
                "a structured output ends where its grammar is complete, so it cannot be \
                 combined with ignore_eos or min_tokens; remove those"
                    .into(),
            ));
        }
        Ok(())
    }

    pub(super) fn to_sched(&self, id: RequestId) -> Request {
        Request {
            id,
            prompt: self.prompt.clone(),
            namespace: self.namespace,
            prompt_logits_from: match self.prompt_logprobs {
                Some(_) => Some(0),
                None => self.prompt_logits_from,
            },
        }
    }

    /// When the request ends: the one place that decides it (the scheduler only ends a sequence
    /// whose context is full). `max_tokens` is clipped to what the context leaves.
    fn stop_condition(&self, tokenizer: &Tokenizer, max_model_len: usize) -> StopCondition {
        StopCondition {
            max_tokens: self.params.max_tokens.min(max_model_len.saturating_sub(self.prompt.len())),
            eos_ids: {
                let eos = if self.ignore_eos { &[][..] } else { tokenizer.eos_ids() };
                let mut ids = eos.to_vec();
                ids.extend(self.stop_token_ids.iter().filter(|id| !eos.contains(id)));
                ids
            },
            stop_strings: self.stop.clone(),
        }
    }
}

/// Time spent on a request, measured by the engine.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RequestTiming {
    /// Seconds from `add_request` to the first generated token.
    pub ttft_s: f64,
    /// Seconds from the first to the last generated token.
    pub decode_s: f64,
    /// GPU time of the steps up to the first token (when the model measures it), summed.
    /// (Both boxed: every `OutputEvent` is as large as its largest variant, this one.)
    #[serde(skip)]
    pub prefill_gpu: Option<Box<StepTiming>>,
    /// GPU time of the steps after the first token, summed, and how many there were.
    #[serde(skip)]
    pub decode_gpu: Option<Box<StepTiming>>,
    pub decode_steps: usize,
}

/// What [`super::Engine::step`] reports, in order, per request. Non-exhaustive: an embedder
/// matches the events it asked for and passes over the rest.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum OutputEvent {
    /// A generated token and the text it completes (may be empty while a character or a
    /// possible stop string is incomplete).
    /// `logprobs`: the token's log-probability and the most likely alternatives, when the
    /// request asked for them ([`SamplingParams::logprobs`]).
    Delta { id: RequestId, text: String, token: u32, logprobs: Option<Box<TokenLogprobs>> },
    /// The prompt's token log-probabilities (when the request asked for them:
    /// [`CompletionRequest::prompt_logprobs`]), before its first `Delta`: one entry per prompt
    /// position from the second on (the first has no context), each with its rank among the
    /// vocabulary (1 = the most likely).
    PromptLogprobs { id: RequestId, logprobs: Vec<(TokenLogprobs, u32)> },
    /// The request ended. `text` is what was still held back; `usage` counts tokens.
    Finished {
        id: RequestId,
        reason: FinishReason,
        usage: Usage,
        text: String,
        timing: RequestTiming,
    },
}

impl OutputEvent {
    pub fn id(&self) -> RequestId {
        match self {
            OutputEvent::Delta { id, .. }
            | OutputEvent::PromptLogprobs { id, .. }
            | OutputEvent::Finished { id, .. } => *id,
        }
    }
}

/// A request's prompt log-probabilities while its prompt is computed
/// ([`CompletionRequest::prompt_logprobs`]).
pub(super) struct PromptLogprobs {
    /// Alternatives per position.
    pub k: usize,
    pub prompt: Vec<u32>,
    /// (entry, rank) per position from the second on, so far.
    pub entries: Vec<(TokenLogprobs, u32)>,
}

/// An unfinished request's state in the engine.
pub(super) struct Active {
    pub sampler: Sampler,
    /// Alternatives to report with each token's log-probability; `None`: none asked.
    pub logprobs: Option<usize>,
    /// The log-probabilities of the token sampled this step, until its event goes out.
    pub sampled_logprobs: Option<Box<TokenLogprobs>>,
    /// A request that keeps only its prompt positions' next-token log-probabilities
    /// ([`CompletionRequest::prompt_logprobs_only`]): its prompt, whose tokens are the targets.
    pub prompt_targets: Option<Vec<u32>>,
    /// The grammar the output follows; its next mask is computed beside the GPU's step.
    pub grammar: Option<GrammarMatcher>,
    /// Whether the engine keeps this request's prompt logit rows
    /// ([`CompletionRequest::prompt_logits_from`]): its last row must stay the model's.
    keeps_prompt_logits: bool,
    /// Prompt log-probabilities asked for ([`CompletionRequest::prompt_logprobs`]): the
    /// alternatives wanted, the prompt, the entries so far (sent before the first token).
    pub prompt_logprobs: Option<PromptLogprobs>,
    out: OutputStream,
    arrived: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    prefill_gpu: Option<StepTiming>,
    decode_gpu: Option<StepTiming>,
    decode_steps: usize,
}

impl Active {
    /// Whether the GPU can pick this request's next token, so its step need not read the
    /// logits row back: its sampler can choose there ([`Sampler::picks_on_gpu`]: greedy, or
    /// where the adapter samples on the GPU (`gpu_sampling`, `KernelConfig::gpu_sampling`) a
    /// random draw, either after its bias and penalties as logit edits), and nothing else needs
    /// the row (no log-probabilities, no grammar mask yet, no kept prompt logits once it is
    /// edited). Depends on the request alone, so its tokens do not depend on its batch. The one
    /// place that decides it: the step's layout asks it, and so does the sampling after the step.
    pub fn picks_on_gpu(&self, gpu_sampling: bool) -> bool {
        self.sampler.picks_on_gpu(gpu_sampling)
            && self.logprobs.is_none()
            && self.grammar.as_ref().is_none_or(|g| !g.is_active())
            && !(self.keeps_prompt_logits && self.sampler.shapes_logits())
    }

    /// Whether this request's next token is drawn at random on the GPU (`kernels::sampling`).
    pub fn draws_on_gpu(&self, gpu_sampling: bool) -> bool {
        self.picks_on_gpu(gpu_sampling) && self.sampler.is_random()
    }

    /// Whether this request's logits are shaped on the GPU (`kernels::logit_edit`) before its
    /// token is picked there.
    pub fn edits_on_gpu(&self, gpu_sampling: bool) -> bool {
        self.picks_on_gpu(gpu_sampling) && self.sampler.shapes_logits()
    }

    pub fn new(req: &CompletionRequest, tokenizer: &Tokenizer, max_model_len: usize) -> Self {
        let stop = req.stop_condition(tokenizer, max_model_len);
        Active {
            sampler: Sampler::with_context(
                &req.params,
                &req.prompt,
                &req.logit_bias,
                &stop.eos_ids,
            ),
            logprobs: req.params.logprobs,
            sampled_logprobs: None,
            prompt_targets: (req.prompt_logprobs_only && req.prompt_logits_from.is_some())
                .then(|| req.prompt.clone()),
            grammar: req.grammar.clone(),
            keeps_prompt_logits: req.prompt_logits_from.is_some(),
            prompt_logprobs: req.prompt_logprobs.map(|k| PromptLogprobs {
                k,
                prompt: req.prompt.clone(),
                entries: Vec::new(),
            }),
            out: OutputStream::new(stop, Detokenizer::new(req.skip_special_tokens)),
            arrived: Instant::now(),
            first_token: None,
            last_token: None,
            prefill_gpu: None,
            decode_gpu: None,
            decode_steps: 0,
        }
    }

    /// Adds a step's GPU time to a request unfinished during it: to its prefill until its first
    /// token, to its decode after.
    pub fn add_step_timing(&mut self, t: Option<&StepTiming>) {
        let Some(t) = t else { return };
        let sum = if self.first_token.is_none() {
            &mut self.prefill_gpu
        } else {
            self.decode_steps += 1;
            &mut self.decode_gpu
        };
        sum.get_or_insert_with(StepTiming::default).add(t);
    }

    /// A new token: its text delta, and the end it makes (a stop token, `max_tokens`, a stop
    /// string), if it ends the request.
    pub fn push(
        &mut self,
        tok: &Tokenizer,
        token: u32,
        now: Instant,
        metrics: &Metrics,
    ) -> (String, Option<FinishReason>) {
        match self.last_token {
            None => metrics.observe_ttft((now - self.arrived).as_secs_f64()),
            Some(last) => metrics.observe_tpot((now - last).as_secs_f64()),
        }
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
        let completes = self.grammar.as_ref().is_some_and(|g| g.is_finished());
        match self.out.push_token(tok, token, completes) {
            Ok(delta) => (delta.text, delta.finish),
            Err(_) => (String::new(), None),
        }
    }

    /// The end the output stage decided, if any: after [`Active::flush`] always (a stop token or
    /// stop string that also filled the context ends as `stop`, not as the scheduler's `length`).
    pub fn decided(&self) -> Option<FinishReason> {
        self.out.finish_reason()
    }

    /// Text still held back (an incomplete character or a possible stop string prefix).
    pub fn flush(&mut self, tok: &Tokenizer) -> String {
        self.out.finish(tok).unwrap_or_default()
    }

    pub fn finished(
        self,
        id: RequestId,
        reason: FinishReason,
        usage: Usage,
        text: String,
    ) -> OutputEvent {
        let timing = RequestTiming {
            ttft_s: self.first_token.map_or(0.0, |t| (t - self.arrived).as_secs_f64()),
            decode_s: match (self.first_token, self.last_token) {
                (Some(a), Some(b)) => (b - a).as_secs_f64(),
                _ => 0.0,
            },
            prefill_gpu: self.prefill_gpu.map(Box::new),
            decode_gpu: self.decode_gpu.map(Box::new),
            decode_steps: self.decode_steps,
        };
        OutputEvent::Finished { id, reason, usage, text, timing }
    }
}
