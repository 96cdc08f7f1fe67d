//! Stop conditions and the per-sequence output stream: detokenized deltas, EOS, `max_tokens`,
//! and stop strings found in the text even when split across tokens.

use super::detokenizer::Detokenizer;
use crate::tokenizer::{Tokenizer, TokenizerError};
use serde::{Deserialize, Serialize};

/// When a sequence ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopCondition {
    /// Most tokens to generate (EOS included); the token that reaches it ends the sequence.
    pub max_tokens: usize,
    /// Ids that end the sequence without adding text (`Tokenizer::eos_ids`).
    pub eos_ids: Vec<u32>,
    /// Texts that end the sequence; the output is cut before the first one found.
    pub stop_strings: Vec<String>,
}

/// Why a request ended (OpenAI's `finish_reason`); the one type every room uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` generated, or the context (`-c`) is full.
    Length,
    /// Cancelled by the caller (or its client went away).
    Cancelled,
}

/// What one token adds to a sequence's output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutputDelta {
    /// New text, safe to show (never half a character, never part of a stop string).
    pub text: String,
    /// Set on the token that ends the sequence.
    pub finish: Option<FinishReason>,
}

/// The output side of one sequence: feed generated ids, get text deltas and the end.
#[derive(Clone, Debug)]
pub struct OutputStream {
    detok: Detokenizer,
    stop: StopCondition,
    /// Detokenized text not yet emitted because it may be the start of a stop string.
    held: String,
    /// All text emitted so far.
    text: String,
    num_tokens: usize,
    finished: Option<FinishReason>,
}

impl OutputStream {
    pub fn new(stop: StopCondition, detok: Detokenizer) -> Self {
        OutputStream {
            detok,
            stop,
            held: String::new(),
            text: String::new(),
            num_tokens: 0,
            finished: None,
        }
    }

    /// Feed one generated id. After the sequence has finished, further ids are ignored.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<OutputDelta, TokenizerError> {
        self.push_token(tok, id, false)
    }

    /// Feed one generated id; `completes`: it completes the output's grammar (structured
    /// outputs), which ends the output with its text, as a stop (a stop string still cuts).
    pub fn push_token(
        &mut self,
        tok: &Tokenizer,
        id: u32,
        completes: bool,
    ) -> Result<OutputDelta, TokenizerError> {
        if let Some(reason) = self.finished {
            return Ok(OutputDelta { text: String::new(), finish: Some(reason) });
        }
        self.num_tokens += 1;
        let is_eos = self.stop.eos_ids.contains(&id);
        if !is_eos {
            let new = self.detok.step(tok, id)?;
            self.held.push_str(&new);
        }
        let reached_max = self.num_tokens >= self.stop.max_tokens;
        if is_eos || completes || reached_max {
            let rest = self.detok.flush(tok)?;
            self.held.push_str(&rest);
        }
        if let Some(cut) = self.first_stop_string() {
            self.held.truncate(cut);
            return Ok(self.emit(self.held.len(), Some(FinishReason::Stop)));
        }
        if is_eos || completes {
            return Ok(self.emit(self.held.len(), Some(FinishReason::Stop)));
        }
        if reached_max {
            return Ok(self.emit(self.held.len(), Some(FinishReason::Length)));
        }
        let keep = self.stop_prefix_suffix_len();
        Ok(self.emit(self.held.len() - keep, None))
    }

    /// Move `held[..n]` to the output.
    fn emit(&mut self, n: usize, finish: Option<FinishReason>) -> OutputDelta {
        let text: String = self.held.drain(..n).collect();
        self.text.push_str(&text);
        self.finished = finish;
        OutputDelta { text, finish }
    }

    /// Byte offset in `held` of the earliest stop string.
    fn first_stop_string(&self) -> Option<usize> {
        self.stop
            .stop_strings
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
    }

    /// Length of the longest end of `held` that is a proper prefix of some stop string (it must
    /// wait for the next tokens).
    fn stop_prefix_suffix_len(&self) -> usize {
        let mut keep = 0;
        for s in &self.stop.stop_strings {
            for k in (1..s.len()).rev() {
                if k <= keep {
                    break;
                }
                if s.is_char_boundary(k) && self.held.ends_with(&s[..k]) {
                    keep = k;
                    break;
                }
            }
        }
        keep
    }

    /// Ends the stream from outside (the scheduler stopped on an end-of-sequence token or a
    /// length limit): flushes the detokenizer and returns everything still held back, cut
    /// before a stop string if one completed. Idempotent.
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String, TokenizerError> {
        if self.finished.is_some() {
            return Ok(String::new());
        }
        let rest = self.detok.flush(tok)?;
        self.held.push_str(&rest);
        let reason = match self.first_stop_string() {
            Some(cut) => {
                self.held.truncate(cut);
                FinishReason::Stop
            }
            None => FinishReason::Length,
        };
        Ok(self.emit(self.held.len(), Some(reason)).text)
    }

    /// All text emitted so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finished
    }

    /// Ids pushed so far (EOS included).
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reason_serializes_lowercase() {
        assert_eq!(serde_json::to_string(&FinishReason::Stop).unwrap(), "\"stop\"");
        assert_eq!(serde_json::to_string(&FinishReason::Length).unwrap(), "\"length\"");
        let back: FinishReason = serde_json::from_str("\"length\"").unwrap();
        assert_eq!(back, FinishReason::Length);
    }
}
