//! [`SamplingParams`]: what a request asks of the sampler, checked once at intake by
//! [`SamplingParams::validate`].

/// How to pick each next token. Mirrors the CLI flags `--temperature`, `--top-k`, `--top-p`,
/// `--seed`, `-n/--max-tokens`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 = greedy (argmax). Finite and ≥ 0.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens (≥ 1); `None` = all.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p`, in `(0, 1]`;
    /// `None` = all.
    pub top_p: Option<f32>,
    /// Seed of the sequence's RNG: the same seed and logits give the same tokens.
    pub seed: u64,
    /// Most tokens to generate (enforced by the scheduler, not the sampler).
    pub max_tokens: usize,
    /// Drop tokens whose probability is below `min_p` × the most likely one's, in `[0, 1]`;
    /// `None` = none dropped.
    pub min_p: Option<f32>,
    /// Subtracted once from the logit of every token the output already holds, in `[-2, 2]`.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per time the output holds it, in `[-2, 2]`.
    pub frequency_penalty: f32,
    /// Divides a positive (multiplies a negative) logit of every token in the prompt or the
    /// output, > 0; 1 = off (HF's and vLLM's repetition penalty).
    pub repetition_penalty: f32,
    /// Report the chosen token's log-probability and this many most likely alternatives
    /// (`0..=20`); `None` = no log-probabilities.
    pub logprobs: Option<usize>,
    /// End-of-sequence tokens cannot be sampled before this many tokens are generated.
    pub min_tokens: usize,
}

/// Most alternatives a request may ask log-probabilities for (OpenAI's cap).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl Default for SamplingParams {
    /// Greedy, no top-k/top-p/min-p, no penalties, seed 0, 256 tokens.
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
            max_tokens: 256,
            min_p: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logprobs: None,
            min_tokens: 0,
        }
    }
}

impl SamplingParams {
    /// Checks every field's range; the error names the flag and the accepted values.
    pub fn validate(&self) -> Result<(), SampleError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(SampleError::Temperature(self.temperature));
        }
        if self.top_k == Some(0) {
            return Err(SampleError::TopK);
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(SampleError::TopP(p));
            }
        }
        if let Some(p) = self.min_p {
            if !(0.0..=1.0).contains(&p) {
                return Err(SampleError::MinP(p));
            }
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(SampleError::Penalty(name, v));
            }
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(SampleError::RepetitionPenalty(r));
        }
        if self.logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
            return Err(SampleError::TopLogprobs(self.logprobs.unwrap_or(0)));
        }
        if self.min_tokens > self.max_tokens {
            return Err(SampleError::MinTokens(self.min_tokens, self.max_tokens));
        }
        Ok(())
    }

    /// Whether the logits are changed before choosing (penalties, `min_p` aside).
    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }

    /// Whether these parameters pick the argmax (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// Invalid sampling parameters, each message naming the fix.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum SampleError {
    #[error("--temperature {0} is invalid; use a finite value ≥ 0 (0 = greedy)")]
    Temperature(f32),
    #[error("--top-k 0 is invalid; use at least 1, or leave it unset to keep every token")]
    TopK,
    #[error("--top-p {0} is invalid; use a value in (0, 1] (1 keeps every token)")]
    TopP(f32),
    #[error("min_p {0} is invalid; use a value in [0, 1] (0 keeps every token)")]
    MinP(f32),
    #[error("{0} {1} is invalid; use a value in [-2, 2] (0 = off)")]
    Penalty(&'static str, f32),
    #[error("repetition_penalty {0} is invalid; use a finite value > 0 (1 = off)")]
    RepetitionPenalty(f32),
    #[error("top_logprobs {0} is invalid; use at most 20")]
    TopLogprobs(usize),
    #[error("min_tokens {0} is more than max_tokens {1}; lower min_tokens or raise max_tokens")]
    MinTokens(usize, usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_greedy() {
        let params = SamplingParams::default();
        assert!(params.is_greedy());
        assert_eq!(params.max_tokens, 256);
        assert_eq!(params.validate(), Ok(()));
    }

    #[test]
    fn rejects_out_of_range_values() {
        let with = |f: fn(&mut SamplingParams)| {
            let mut params = SamplingParams::default();
            f(&mut params);
            params.validate()
        };
        assert_eq!(with(|p| p.temperature = -0.5), Err(SampleError::Temperature(-0.5)));
        assert!(with(|p| p.temperature = f32::NAN).is_err());
        assert!(with(|p| p.temperature = f32::INFINITY).is_err());
        assert_eq!(with(|p| p.top_k = Some(0)), Err(SampleError::TopK));
        assert_eq!(with(|p| p.top_p = Some(0.0)), Err(SampleError::TopP(0.0)));
        assert_eq!(with(|p| p.top_p = Some(1.5)), Err(SampleError::TopP(1.5)));
        assert!(with(|p| p.top_p = Some(f32::NAN)).is_err());
        assert_eq!(with(|p| p.top_p = Some(1.0)), Ok(()));
        assert_eq!(with(|p| p.top_k = Some(1)), Ok(()));
        assert_eq!(with(|p| p.temperature = 1e-6), Ok(()));
        let msg = SampleError::TopP(1.5).to_string();
        assert_eq!(msg, "--top-p 1.5 is invalid; use a value in (0, 1] (1 keeps every token)");
    }
}
