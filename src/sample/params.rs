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
}

impl Default for SamplingParams {
    /// Greedy, no top-k/top-p, seed 0, 256 tokens.
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: None, top_p: None, seed: 0, max_tokens: 256 }
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
        Ok(())
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
