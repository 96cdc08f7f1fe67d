//! One request run to completion through the step loop: the single-sequence case of the same
//! path every batch takes.

use super::{CompletionRequest, Engine, EngineError, OutputEvent, RequestTiming};
use crate::sched::{FinishReason, Usage};

/// A generation request on token ids (the CLI's `generate`, benchmarks).
pub type GenerateRequest = CompletionRequest;

/// What a generation produced, with its timings.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GenerateOutput {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    #[serde(flatten)]
    pub timing: RequestTiming,
}

impl GenerateOutput {
    /// Decode speed after the first token.
    pub fn decode_tokens_per_s(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1);
        if n == 0 || self.timing.decode_s == 0.0 {
            0.0
        } else {
            n as f64 / self.timing.decode_s
        }
    }
}

impl Engine {
    /// Runs `req` alone until it finishes, calling `on_text` with each new piece of text.
    /// Other unfinished requests, if any, run along in the same steps.
    pub fn generate(
        &mut self,
        req: &GenerateRequest,
        mut on_text: impl FnMut(&str),
    ) -> Result<GenerateOutput, EngineError> {
        let id = self.add_request(req.clone())?;
        let mut tokens = Vec::new();
        let mut text = String::new();
        loop {
            for event in self.step()? {
                match event {
                    OutputEvent::Delta { id: e, text: t, token, .. } if e == id => {
                        tokens.push(token);
                        text.push_str(&t);
                        on_text(&t);
                    }
                    OutputEvent::Finished { id: e, reason, usage, text: t, timing } if e == id => {
                        text.push_str(&t);
                        on_text(&t);
                        return Ok(GenerateOutput {
                            tokens,
                            text,
                            finish_reason: reason,
                            usage,
                            timing,
                        });
                    }
                    _ => {}
                }
            }
        }
    }
}
