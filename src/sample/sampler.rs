//! [`Sampler`]: one sequence's next-token choice from its logits.
//!
//! Greedy (temperature 0) is a single allocation-free pass. Otherwise, in order:
//! 1. drop NaN logits, scale by `1 / temperature`;
//! 2. top-k: keep the `k` largest (ties → lower token id);
//! 3. softmax over what is left (max subtracted first);
//! 4. top-p: sort descending (ties → lower token id) and keep the shortest prefix whose
//!    probability reaches `p`;
//! 5. draw from the kept tokens with the sequence's seeded RNG.
//!
//! Before either, when asked: `logit_bias` added, then the repetition penalty (prompt and
//! output tokens: a positive logit times 1 / r, others times r), the frequency and presence
//! penalties (output tokens), as vLLM orders them (vLLM divides by r; the reciprocal, formed once,
//! is what a GPU multiplies by exactly: `kernels::logit_edit` applies the same edits there);
//! `min_p` drops, after the softmax, tokens below `min_p` × the largest probability.
//! Log-probabilities ([`token_logprobs`]) are those of the model's own logits (vLLM's default,
//! `raw_logprobs`).

use std::cmp::Ordering;
use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::params::SamplingParams;
use crate::kernels::logit_edit::{self, LogitEdit};
use crate::kernels::sampling::RowSampling;

/// Picks tokens for one sequence; owns that sequence's RNG, seeded from
/// [`SamplingParams::seed`]. Same seed and same logits → same tokens, within one build (the RNG
/// is rand's `StdRng`, whose algorithm rand may change between major versions).
#[derive(Clone, Debug)]
pub struct Sampler {
    mode: Mode,
    rng: StdRng,
    /// [num_candidates] (scaled logit, then weight; token id): scratch reused across steps.
    candidates: Vec<(f32, u32)>,
    min_p: Option<f32>,
    /// What changes the logits first; `None` when nothing does.
    shaping: Option<Box<Shaping>>,
    /// [vocab] the shaped logits: scratch reused across steps.
    shaped: Vec<f32>,
}

/// Logit bias and penalties, with the tokens they count.
#[derive(Clone, Debug)]
struct Shaping {
    bias: Vec<(u32, f32)>,
    presence: f32,
    frequency: f32,
    repetition: f32,
    /// 1 / `repetition`, what a positive logit is multiplied by.
    inv_repetition: f32,
    /// The prompt's distinct tokens (the repetition penalty counts them).
    prompt: Vec<u32>,
    /// End-of-sequence ids, masked while fewer than `min_tokens` tokens are out.
    eos: Vec<u32>,
    min_tokens: usize,
    /// Output tokens so far, with their counts.
    output: HashMap<u32, u32>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Greedy,
    Random { temperature: f32, top_k: Option<usize>, top_p: Option<f32> },
}

impl Sampler {
    /// A sampler for one sequence. `params` should have passed [`SamplingParams::validate`];
    /// out-of-range values never panic here: a temperature that is not finite and > 0 means
    /// greedy, `top_k` of 0 and `top_p` outside `(0, 1)` mean no filter.
    pub fn new(params: &SamplingParams) -> Self {
        let t = params.temperature;
        let mode = if t.is_finite() && t > 0.0 {
            Mode::Random {
                temperature: t,
                top_k: params.top_k.filter(|&k| k > 0),
                top_p: params.top_p.filter(|&p| p > 0.0 && p < 1.0),
            }
        } else {
            Mode::Greedy
        };
        Sampler {
            mode,
            rng: StdRng::seed_from_u64(params.seed),
            candidates: Vec::new(),
            min_p: params.min_p.filter(|&p| p > 0.0),
            shaping: None,
            shaped: Vec::new(),
        }
    }

    /// [`Sampler::new`] for a sequence whose prompt is `prompt`, with `logit_bias` (token id,
    /// added to its logit; ids beyond the vocabulary are ignored), the penalties of `params`,
    /// and `eos` (the end-of-sequence ids `params.min_tokens` holds back).
    pub fn with_context(
        params: &SamplingParams,
        prompt: &[u32],
        logit_bias: &[(u32, f32)],
        eos: &[u32],
    ) -> Self {
        let mut sampler = Sampler::new(params);
        let min_tokens = if eos.is_empty() { 0 } else { params.min_tokens };
        if params.has_penalties() || !logit_bias.is_empty() || min_tokens > 0 {
            let mut prompt = prompt.to_vec();
            prompt.sort_unstable();
            prompt.dedup();
            sampler.shaping = Some(Box::new(Shaping {
                bias: logit_bias.to_vec(),
                presence: params.presence_penalty,
                frequency: params.frequency_penalty,
                repetition: params.repetition_penalty,
                inv_repetition: 1.0 / params.repetition_penalty,
                prompt,
                eos: eos.to_vec(),
                min_tokens,
                output: HashMap::new(),
            }));
        }
        sampler
    }

    /// Whether this sampler's choice is the plain argmax of the logits (greedy, nothing shaping
    /// them).
    pub fn is_greedy(&self) -> bool {
        self.mode == Mode::Greedy && self.shaping.is_none()
    }

    /// Whether this sampler draws at random (temperature > 0).
    pub fn is_random(&self) -> bool {
        matches!(self.mode, Mode::Random { .. })
    }

    /// Whether something shapes the logits before the choice (bias, penalties, min_tokens).
    pub fn shapes_logits(&self) -> bool {
        self.shaping.is_some()
    }

    /// Whether this sampler's choice can be made on the GPU, so its step need not read the
    /// logits back: its shaping expressible as edits ([`Sampler::gpu_edits`]: distinct bias
    /// ids, at most `logit_edit::EDITS_PER_SEQ` tokens touched), then greedy (`kernels::argmax`,
    /// the same choice) or, where the adapter samples on the GPU (`gpu_sampling`), a random draw
    /// (`kernels::sampling`, [`Sampler::gpu_row`]). Depends on this sequence's state alone.
    pub fn picks_on_gpu(&self, gpu_sampling: bool) -> bool {
        self.shaping.as_ref().is_none_or(|s| s.edits_fit())
            && (self.mode == Mode::Greedy || gpu_sampling)
    }

    /// Whether this sampler's random choice can be made on the GPU (`kernels::sampling`): random
    /// mode with any shaping expressible as edits, so the choice needs only the (edited)
    /// logits and one uniform draw ([`Sampler::gpu_row`]).
    pub fn samples_on_gpu(&self) -> bool {
        self.is_random() && self.picks_on_gpu(true)
    }

    /// Appends the edits that shape logit row `row` (a `vocab`-wide row) as [`Shaping`] would:
    /// one per token touched, ids beyond the vocabulary left out, in id order. Nothing without
    /// shaping. Only where [`Sampler::picks_on_gpu`].
    pub fn gpu_edits(&self, row: u32, vocab: usize, out: &mut Vec<LogitEdit>) {
        if let Some(s) = &self.shaping {
            s.edits(row, vocab, out);
        }
    }

    /// Counts a token the GPU picked (after [`Sampler::gpu_edits`] or [`Sampler::gpu_row`]), as
    /// [`Sampler::sample`] counts its own: the penalties and min_tokens see it.
    pub fn accept(&mut self, token: u32) {
        if let Some(s) = &mut self.shaping {
            *s.output.entry(token).or_default() += 1;
        }
    }

    /// The next token's sampling on the GPU, its uniform draw taken from this sequence's RNG
    /// now (one draw a token, as [`Sampler::sample`] takes); `None` where
    /// [`Sampler::samples_on_gpu`] is false. The GPU applies the same rules (temperature,
    /// top-k, min-p, top-p) with the draw as the inverse CDF in their order.
    pub fn gpu_row(&mut self) -> Option<RowSampling> {
        let Mode::Random { temperature, top_k, top_p } = self.mode else { return None };
        if !self.samples_on_gpu() {
            return None;
        }
        Some(RowSampling::random(temperature, top_k, top_p, self.min_p, self.rng.random()))
    }

    /// Picks the next token from `logits` (`[vocab_size]`). Greedy: O(vocab), no allocation, no
    /// RNG draw. Random: O(vocab) plus, with top-p, a sort of a head that holds the nucleus
    /// (O(n log n) for a nucleus of n, at least 256); one RNG draw.
    ///
    /// NaN logits are never picked; if every logit is NaN the answer is token 0. A `+inf` logit
    /// wins outright (the first one, if several). Panics if `logits` is empty.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        assert!(!logits.is_empty(), "cannot sample from empty logits");
        let mut shaped = std::mem::take(&mut self.shaped);
        let logits = match &self.shaping {
            Some(s) => {
                s.apply(logits, &mut shaped);
                &shaped[..]
            }
            None => logits,
        };
        let token = match self.mode {
            Mode::Greedy => argmax(logits),
            Mode::Random { temperature, top_k, top_p } => {
                self.sample_random(logits, temperature, top_k, top_p)
            }
        };
        self.shaped = shaped;
        if let Some(s) = &mut self.shaping {
            *s.output.entry(token).or_default() += 1;
        }
        token
    }

    fn sample_random(
        &mut self,
        logits: &[f32],
        temperature: f32,
        top_k: Option<usize>,
        top_p: Option<f32>,
    ) -> u32 {
        let best = argmax(logits);
        let max = logits[best as usize] / temperature;
        if !max.is_finite() {
            // All NaN / -inf, a +inf logit, or a temperature so small the scaled max overflows:
            // the distribution is a point mass on the argmax.
            return best;
        }
        let candidates = &mut self.candidates;
        candidates.clear();
        candidates.extend(
            (0u32..).zip(logits).filter(|(_, l)| !l.is_nan()).map(|(id, &l)| (l / temperature, id)),
        );
        if let Some(k) = top_k.filter(|&k| k < candidates.len()) {
            candidates.select_nth_unstable_by(k - 1, descending);
            candidates.truncate(k);
        }
        let mut total = 0.0f64;
        for (value, _) in candidates.iter_mut() {
            *value = (*value - max).exp();
            total += f64::from(*value);
        }
        if let Some(min_p) = self.min_p {
            // the largest weight is exp(0) = 1 (the argmax is always kept): drop below min_p
            candidates.retain(|&(w, _)| w >= min_p);
            total = candidates.iter().map(|&(w, _)| f64::from(w)).sum();
        }
        if let Some(p) = top_p {
            // The nucleus is a prefix of the descending order: sort only a head that holds it
            // (the order is total, so the head sorts as the whole would), four times longer
            // until it does, not the whole vocabulary.
            let target = f64::from(p) * total;
            let mut head = TOP_P_HEAD.min(candidates.len());
            let (kept, len) = loop {
                if head < candidates.len() {
                    candidates.select_nth_unstable_by(head - 1, descending);
                }
                candidates[..head].sort_unstable_by(descending);
                let mut kept = 0.0f64;
                let mut len = 0;
                while len < head && (len == 0 || kept < target) {
                    kept += f64::from(candidates[len].0);
                    len += 1;
                }
                if kept >= target || head == candidates.len() {
                    break (kept, len);
                }
                head = (4 * head).min(candidates.len());
            };
            candidates.truncate(len);
            total = kept;
        }
        let draw = self.rng.random::<f64>() * total;
        let mut cumulative = 0.0f64;
        for &(weight, id) in candidates.iter() {
            cumulative += f64::from(weight);
            if draw < cumulative {
                return id;
            }
        }
        best // unreachable in exact arithmetic: cumulative ends at total > draw
    }
}

impl Shaping {
    /// `out` = `logits` with the bias added and the penalties applied.
    fn apply(&self, logits: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.extend_from_slice(logits);
        for &(id, bias) in &self.bias {
            if let Some(l) = out.get_mut(id as usize) {
                *l += bias;
            }
        }
        if self.repetition != 1.0 {
            let seen = self.prompt.iter().copied().chain(self.output.keys().copied());
            let mut done = std::collections::HashSet::new();
            for id in seen {
                let Some(l) = out.get_mut(id as usize) else { continue };
                if done.insert(id) {
                    *l = if *l > 0.0 { *l * self.inv_repetition } else { *l * self.repetition };
                }
            }
        }
        for (&id, &count) in &self.output {
            if let Some(l) = out.get_mut(id as usize) {
                *l -= self.frequency * count as f32 + self.presence;
            }
        }
        if self.masks_eos() {
            for &id in &self.eos {
                if let Some(l) = out.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Whether the end-of-sequence ids are masked now (fewer than `min_tokens` out).
    fn masks_eos(&self) -> bool {
        self.output.values().sum::<u32>() < self.min_tokens as u32
    }

    /// Whether [`Shaping::edits`] can express this shaping within `EDITS_PER_SEQ` edits: bias
    /// ids distinct (the sampler adds a repeated id's biases one after the other, which one
    /// edit cannot), and the tokens it may touch few enough (a bound: the lists' lengths).
    fn edits_fit(&self) -> bool {
        let mut ids: Vec<u32> = self.bias.iter().map(|&(id, _)| id).collect();
        ids.sort_unstable();
        let distinct = ids.windows(2).all(|w| w[0] != w[1]);
        let repetition = if self.repetition != 1.0 { self.prompt.len() } else { 0 };
        let bound = self.bias.len() + repetition + self.output.len() + self.eos.len();
        distinct && bound <= logit_edit::EDITS_PER_SEQ
    }

    /// [`Shaping::apply`] as edits of row `row`: per token, the operations `apply` makes on
    /// its logit, flagged in its order (each a no-op where `apply` skips it).
    fn edits(&self, row: u32, vocab: usize, out: &mut Vec<LogitEdit>) {
        type ById = std::collections::BTreeMap<u32, LogitEdit>;
        fn at<'a>(by_id: &'a mut ById, blank: &LogitEdit, id: u32) -> &'a mut LogitEdit {
            by_id.entry(id).or_insert(LogitEdit { id, ..*blank })
        }
        let blank = LogitEdit {
            row,
            repetition: self.repetition,
            inv_repetition: self.inv_repetition,
            ..LogitEdit::default()
        };
        let mut by_id = ById::new();
        for &(id, bias) in &self.bias {
            let e = at(&mut by_id, &blank, id);
            e.flags |= logit_edit::EDIT_BIAS;
            e.bias = bias;
        }
        if self.repetition != 1.0 {
            for &id in self.prompt.iter().chain(self.output.keys()) {
                at(&mut by_id, &blank, id).flags |= logit_edit::EDIT_REPETITION;
            }
        }
        for (&id, &count) in &self.output {
            let e = at(&mut by_id, &blank, id);
            e.flags |= logit_edit::EDIT_PENALTY;
            e.penalty = self.frequency * count as f32 + self.presence;
        }
        if self.masks_eos() {
            for &id in &self.eos {
                at(&mut by_id, &blank, id).flags |= logit_edit::EDIT_MASK;
            }
        }
        out.extend(by_id.into_values().filter(|e| (e.id as usize) < vocab));
    }
}

/// The log-probability of a chosen token and of the most likely tokens, from the model's own
/// logits (log-softmax in f64; NaN logits count as −∞).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// The `k` most likely tokens, most likely first (ties: lower id).
    pub top: Vec<(u32, f32)>,
}

/// [`TokenLogprobs`] of `token` with the `k` most likely alternatives. O(vocab + k log vocab).
pub fn token_logprobs(logits: &[f32], token: u32, k: usize) -> TokenLogprobs {
    let finite = |l: f32| if l.is_nan() { f32::NEG_INFINITY } else { l };
    let max = logits.iter().copied().map(finite).fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| (f64::from(finite(l)) - f64::from(max)).exp()).sum();
    let log_z = f64::from(max) + sum.ln();
    let lp = |l: f32| (f64::from(finite(l)) - log_z) as f32;
    let mut top: Vec<(f32, u32)> = (0u32..).zip(logits).map(|(id, &l)| (finite(l), id)).collect();
    let k = k.min(top.len());
    if k > 0 && k < top.len() {
        top.select_nth_unstable_by(k - 1, descending);
    }
    top.truncate(k);
    top.sort_unstable_by(descending);
    TokenLogprobs {
        token,
        logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| lp(l)),
        top: top.into_iter().map(|(l, id)| (id, lp(l))).collect(),
    }
}

/// The rank of `token` among `logits` (1 = the most likely): one more than the tokens with a
/// larger logit, or an equal one and a lower id (the order [`token_logprobs`] lists them in).
/// O(vocab).
pub fn token_rank(logits: &[f32], token: u32) -> u32 {
    let finite = |l: f32| if l.is_nan() { f32::NEG_INFINITY } else { l };
    let Some(&own) = logits.get(token as usize) else { return logits.len() as u32 + 1 };
    let own = finite(own);
    let before = (0u32..)
        .zip(logits)
        .filter(|&(id, &l)| finite(l) > own || (finite(l) == own && id < token))
        .count();
    before as u32 + 1
}

/// Candidates top-p sorts first ([`Sampler::sample`]); more when their weight falls short.
const TOP_P_HEAD: usize = 256;

/// Larger value first; equal values by lower token id. Values are never NaN here.
fn descending(a: &(f32, u32), b: &(f32, u32)) -> Ordering {
    b.0.partial_cmp(&a.0).unwrap_or(Ordering::Equal).then(a.1.cmp(&b.1))
}

/// Index of the largest non-NaN logit, lowest index on ties; 0 if all are NaN. One pass, no
/// allocation.
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_value = f32::NAN;
    for (i, &value) in logits.iter().enumerate() {
        if value > best_value || (best_value.is_nan() && !value.is_nan()) {
            best = i;
            best_value = value;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_k: Option<usize>, top_p: Option<f32>, seed: u64) -> Sampler {
        Sampler::new(&SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
            ..SamplingParams::default()
        })
    }

    fn greedy() -> Sampler {
        Sampler::new(&SamplingParams::default())
    }

    fn softmax(logits: &[f32], temperature: f32) -> Vec<f64> {
        let scaled: Vec<f64> = logits.iter().map(|&l| f64::from(l / temperature)).collect();
        let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = scaled.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        exps.iter().map(|e| e / sum).collect()
    }

    /// Counts of each token over `draws` samples.
    fn histogram(s: &mut Sampler, logits: &[f32], draws: usize) -> Vec<usize> {
        let mut counts = vec![0; logits.len()];
        for _ in 0..draws {
            counts[s.sample(logits) as usize] += 1;
        }
        counts
    }

    /// Pearson's chi-square statistic of `counts` against probabilities `want` (zeros skipped,
    /// but a count where `want` is 0 fails the test).
    fn chi_square(counts: &[usize], want: &[f64]) -> f64 {
        let n: usize = counts.iter().sum();
        let mut chi2 = 0.0;
        for (&c, &p) in counts.iter().zip(want) {
            if p == 0.0 {
                assert_eq!(c, 0, "drew a token of probability 0");
                continue;
            }
            let expected = p * n as f64;
            chi2 += (c as f64 - expected).powi(2) / expected;
        }
        chi2
    }

    /// Seeded pseudo-random logits in [-4, 4).
    fn random_logits(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.random::<f32>() * 8.0 - 4.0).collect()
    }

    #[test]
    fn greedy_picks_lowest_index_on_ties() {
        assert_eq!(greedy().sample(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(greedy().sample(&[-1.0]), 0);
        assert_eq!(greedy().sample(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(greedy().sample(&[0.0, f32::INFINITY, f32::INFINITY]), 1);
    }

    #[test]
    fn greedy_ignores_nan() {
        let nan = f32::NAN;
        assert_eq!(greedy().sample(&[nan, 1.0, nan, 2.0, nan]), 3);
        assert_eq!(greedy().sample(&[nan, f32::NEG_INFINITY]), 1);
        assert_eq!(greedy().sample(&[5.0, nan]), 0);
        assert_eq!(greedy().sample(&[nan, nan, nan]), 0); // documented: all NaN → token 0
    }

    #[test]
    fn greedy_ignores_the_seed() {
        let logits = random_logits(100, 1);
        let want = greedy().sample(&logits);
        for seed in 0..5 {
            assert_eq!(sampler(0.0, Some(3), Some(0.5), seed).sample(&logits), want);
        }
    }

    #[test]
    fn frequencies_follow_the_softmax() {
        let logits = [1.0, 2.0, 0.5, 3.0, -1.0];
        let mut s = sampler(0.8, None, None, 42);
        let counts = histogram(&mut s, &logits, 200_000);
        let chi2 = chi_square(&counts, &softmax(&logits, 0.8));
        assert!(chi2 < 18.47, "chi² = {chi2} (df 4, p = 0.001 bound 18.47), {counts:?}");
    }

    #[test]
    fn top_k_stays_in_the_k_largest_with_renormalized_odds() {
        let logits = random_logits(50, 7);
        let mut order: Vec<usize> = (0..50).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let top5 = &order[..5];
        let mut s = sampler(2.0, Some(5), None, 3);
        let counts = histogram(&mut s, &logits, 50_000);
        let mut want = vec![0.0; 50];
        let kept: Vec<f32> = top5.iter().map(|&i| logits[i]).collect();
        for (&i, p) in top5.iter().zip(softmax(&kept, 2.0)) {
            want[i] = p;
        }
        let chi2 = chi_square(&counts, &want); // asserts nothing outside the top 5
        assert!(chi2 < 18.47, "chi² = {chi2}, {counts:?}");
    }

    #[test]
    fn top_k_ties_keep_the_lower_ids() {
        let mut s = sampler(1.0, Some(2), None, 0);
        let counts = histogram(&mut s, &[1.0, 5.0, 5.0, 5.0], 1000);
        assert_eq!((counts[0], counts[3]), (0, 0), "{counts:?}");
        assert!(counts[1] > 400 && counts[2] > 400, "{counts:?}");
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        for seed in 0..20 {
            let logits = random_logits(64, seed);
            let want = greedy().sample(&logits);
            let mut s = sampler(1.5, None, Some(1e-6), seed);
            for _ in 0..10 {
                assert_eq!(s.sample(&logits), want);
            }
        }
        assert_eq!(sampler(1.0, None, Some(1e-6), 0).sample(&[2.0, 5.0, 5.0]), 1);
    }

    #[test]
    fn top_p_keeps_the_smallest_nucleus() {
        let probs = [0.5f32, 0.3, 0.15, 0.05];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let mut s = sampler(1.0, None, Some(0.75), 11);
        let counts = histogram(&mut s, &logits, 100_000);
        let chi2 = chi_square(&counts, &[0.625, 0.375, 0.0, 0.0]);
        assert!(chi2 < 10.83, "chi² = {chi2} (df 1), {counts:?}");
        let mut s = sampler(1.0, None, Some(0.85), 11);
        let counts = histogram(&mut s, &logits, 100_000);
        let chi2 = chi_square(&counts, &[0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]);
        assert!(chi2 < 13.82, "chi² = {chi2} (df 2), {counts:?}");
    }

    /// A nucleus longer than the head top-p sorts first (about 1,000 of 4,000 near-equal
    /// tokens, so the head grows from 256): the same tokens as sorting the whole vocabulary,
    /// draw for draw.
    #[test]
    fn top_p_past_its_first_head_is_the_full_sort() {
        let logits: Vec<f32> = (0..4000).map(|i| 1.0 - (i % 97) as f32 * 1e-4).collect();
        let full_sort = |seed: u64| {
            // the nucleus by a full sort, then the same draw
            let mut rng = StdRng::seed_from_u64(seed);
            let max = logits.iter().copied().fold(f32::MIN, f32::max);
            let mut c: Vec<(f32, u32)> =
                (0u32..).zip(&logits).map(|(i, &l)| ((l - max).exp(), i)).collect();
            let total: f64 = c.iter().map(|&(w, _)| f64::from(w)).sum();
            c.sort_unstable_by(descending);
            let (mut kept, mut len) = (0.0f64, 0);
            while len < c.len() && (len == 0 || kept < 0.25 * total) {
                kept += f64::from(c[len].0);
                len += 1;
            }
            assert!(len > 256, "the nucleus fits the first head ({len})");
            let draw = rng.random::<f64>() * kept;
            let mut cumulative = 0.0f64;
            c[..len]
                .iter()
                .find(|&&(w, _)| {
                    cumulative += f64::from(w);
                    draw < cumulative
                })
                .unwrap()
                .1
        };
        for seed in 0..50 {
            let mut s = sampler(1.0, None, Some(0.25), seed);
            assert_eq!(s.sample(&logits), full_sort(seed), "seed {seed}");
        }
    }

    #[test]
    fn top_k_then_top_p() {
        // top-k 3 leaves [0.5, 0.3, 0.15]/0.95; top-p 0.8 of that needs 0.5 + 0.3 (0.842).
        let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        let mut s = sampler(1.0, Some(3), Some(0.8), 5);
        let counts = histogram(&mut s, &logits, 10_000);
        assert_eq!((counts[2], counts[3]), (0, 0), "{counts:?}");
    }

    #[test]
    fn random_mode_never_picks_nan_or_minus_infinity() {
        let (nan, neg) = (f32::NAN, f32::NEG_INFINITY);
        let mut s = sampler(1.0, None, None, 9);
        let counts = histogram(&mut s, &[nan, 0.0, neg, 0.0, nan], 10_000);
        assert_eq!((counts[0], counts[2], counts[4]), (0, 0, 0), "{counts:?}");
        assert_eq!(s.sample(&[nan, nan]), 0);
        assert_eq!(s.sample(&[0.0, f32::INFINITY, 1.0]), 1);
        assert_eq!(sampler(1e-30, None, None, 0).sample(&[1.0, 2.0, 1.5]), 1);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_different_tokens() {
        let logits = random_logits(1000, 99);
        let run = |seed| {
            let mut s = sampler(1.0, Some(100), Some(0.95), seed);
            (0..200).map(|_| s.sample(&logits)).collect::<Vec<u32>>()
        };
        assert_eq!(run(1234), run(1234));
        assert_ne!(run(1234), run(1235));
    }

    #[test]
    fn invalid_params_do_not_panic() {
        let logits = [0.0, 1.0, 2.0];
        assert_eq!(sampler(f32::NAN, None, None, 0).sample(&logits), 2);
        assert_eq!(sampler(-1.0, None, None, 0).sample(&logits), 2);
        let mut s = sampler(1.0, Some(0), Some(f32::NAN), 0);
        assert!(s.sample(&logits) < 3);
    }

    fn shaped(params: SamplingParams, prompt: &[u32], bias: &[(u32, f32)]) -> Sampler {
        Sampler::with_context(&params, prompt, bias, &[])
    }

    /// Greedy over shaped logits: the bias and each penalty move the argmax as the formulas
    /// say, counting the prompt (repetition) and the sampler's own output (all three).
    #[test]
    fn bias_and_penalties_shape_the_logits() {
        let plain = SamplingParams::default();
        // bias: +3 on token 0 beats token 2's lead of 2
        let mut s = shaped(plain, &[], &[(0, 3.0), (99, 5.0)]);
        assert!(!s.is_greedy() && s.shapes_logits(), "a bias shapes the logits");
        assert_eq!(s.sample(&[1.0, 0.0, 3.0]), 0);
        // repetition 2 over the prompt: 3.0 → 1.5 (below 2.0); a negative logit is multiplied
        let rep = SamplingParams { repetition_penalty: 2.0, ..plain };
        assert_eq!(shaped(rep, &[2], &[]).sample(&[1.0, 2.0, 3.0]), 1);
        assert_eq!(shaped(rep, &[0], &[]).sample(&[-1.0, -1.5, -3.0]), 1);
        // frequency: each repeat costs 0.6 more; presence: once
        let freq = SamplingParams { frequency_penalty: 0.6, ..plain };
        let mut s = shaped(freq, &[], &[]);
        let logits = [2.0, 1.0, 0.0];
        let picks: Vec<u32> = (0..4).map(|_| s.sample(&logits)).collect();
        // 2.0, then 1.4 vs 1.0, then 0.8 vs 1.0, then 0.8 vs 0.4
        assert_eq!(picks, [0, 0, 1, 0]);
        let pres = SamplingParams { presence_penalty: 1.5, ..plain };
        let mut s = shaped(pres, &[], &[]);
        let picks: Vec<u32> = (0..3).map(|_| s.sample(&logits)).collect();
        assert_eq!(picks, [0, 1, 0], "2 1 0, then 0.5 1 0, then 0.5 -0.5 0 (once, not per use)");
        assert!(shaped(plain, &[1, 2], &[]).is_greedy(), "no shaping: the GPU's argmax serves");
        // min_tokens: the end-of-sequence token 2 is held back for two tokens
        let min2 = SamplingParams { min_tokens: 2, ..plain };
        let mut s = Sampler::with_context(&min2, &[], &[], &[2]);
        let picks: Vec<u32> = (0..3).map(|_| s.sample(&[0.0, 1.0, 5.0])).collect();
        assert_eq!(picks, [1, 1, 2]);
    }

    /// min_p keeps only tokens within the factor of the most likely one.
    /// The GPU's edits (`gpu_edits`, applied as `kernels::logit_edit` applies them) shape the
    /// logits to the bits `Shaping::apply` gives: bias, repetition over prompt and output (on
    /// positive, negative and ±0 logits), frequency and presence over output counts, min_tokens'
    /// mask, ids past the vocabulary; over a sequence's tokens as `accept` counts them.
    #[test]
    fn gpu_edits_are_the_shaping() {
        use crate::kernels::logit_edit::reference_edit;
        use rand::seq::SliceRandom;
        let mut rng = StdRng::seed_from_u64(5);
        let vocab = 40;
        for case in 0..60 {
            let params = SamplingParams {
                repetition_penalty: [1.0, 1.3, 0.7][case % 3],
                frequency_penalty: [0.0, 0.45][case % 2],
                presence_penalty: [0.0, 1.1, -0.3][case % 3],
                min_tokens: case % 4,
                ..SamplingParams::default()
            };
            let prompt: Vec<u32> =
                (0..rng.random_range(0..20)).map(|_| rng.random_range(0..45)).collect();
            let mut ids: Vec<u32> = (0..45).collect();
            ids.shuffle(&mut rng);
            let bias: Vec<(u32, f32)> =
                ids[..case % 7].iter().map(|&id| (id, rng.random_range(-4.0..4.0))).collect();
            let mut s = Sampler::with_context(&params, &prompt, &bias, &[3, 41]);
            for _ in 0..6 {
                let mut logits: Vec<f32> =
                    (0..vocab).map(|_| rng.random_range(-8.0f32..8.0)).collect();
                logits[0] = 0.0;
                logits[1] = -0.0;
                let Some(shaping) = &s.shaping else { continue };
                assert!(s.picks_on_gpu(false) && s.picks_on_gpu(true), "case {case}");
                let mut want = Vec::new();
                shaping.apply(&logits, &mut want);
                let mut edits = Vec::new();
                s.gpu_edits(2, vocab, &mut edits);
                let mut got = vec![7.0; 2 * vocab];
                got.extend_from_slice(&logits);
                reference_edit(&mut got, vocab, &edits);
                assert!(got[..2 * vocab].iter().all(|&v| v == 7.0), "only row 2 is edited");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got[2 * vocab..]), bits(&want), "case {case}");
                s.accept(rng.random_range(0..vocab as u32));
            }
        }
        // a repeated bias id adds twice on the CPU, which one edit cannot: the CPU keeps it
        let twice =
            Sampler::with_context(&SamplingParams::default(), &[], &[(4, 1.0), (4, 2.0)], &[]);
        assert!(!twice.picks_on_gpu(true));
        // too many tokens touched for the step buffers' share of a sequence
        let rep = SamplingParams { repetition_penalty: 1.2, ..SamplingParams::default() };
        let long: Vec<u32> = (0..crate::kernels::logit_edit::EDITS_PER_SEQ as u32 + 1).collect();
        assert!(!Sampler::with_context(&rep, &long, &[], &[]).picks_on_gpu(true));
        assert!(Sampler::with_context(&rep, &long[1..], &[], &[]).picks_on_gpu(false));
    }

    #[test]
    fn min_p_drops_the_unlikely() {
        let params =
            |min_p| SamplingParams { temperature: 1.0, min_p, seed: 3, ..Default::default() };
        // probabilities ∝ e^0, e^-1, e^-3: ratios 1, 0.37, 0.05
        let logits = [0.0, -1.0, -3.0];
        let mut s = Sampler::new(&params(Some(0.2)));
        let counts = histogram(&mut s, &logits, 4000);
        assert_eq!(counts[2], 0, "{counts:?}");
        let want = [1.0 / (1.0 + (-1.0f64).exp()), (-1.0f64).exp() / (1.0 + (-1.0f64).exp()), 0.0];
        assert!(chi_square(&counts[..2], &want[..2]) < 15.0, "{counts:?}");
        let mut all = Sampler::new(&params(Some(0.0)));
        assert!(histogram(&mut all, &logits, 4000)[2] > 0);
    }

    /// Log-probabilities equal an f64 log-softmax; alternatives most likely first, ties to the
    /// lower id; NaN counts as −∞.
    #[test]
    fn token_logprobs_are_the_log_softmax() {
        let logits = random_logits(500, 4);
        let max = logits.iter().fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l)));
        let z: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum::<f64>().ln() + max;
        let lp = token_logprobs(&logits, 17, 5);
        assert_eq!(lp.token, 17);
        assert!((f64::from(lp.logprob) - (f64::from(logits[17]) - z)).abs() < 1e-5);
        let mut order: Vec<u32> = (0..500).collect();
        order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        let ids: Vec<u32> = lp.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, order[..5]);
        for &(id, l) in &lp.top {
            assert!((f64::from(l) - (f64::from(logits[id as usize]) - z)).abs() < 1e-5);
        }
        let tied = token_logprobs(&[1.0, f32::NAN, 1.0, 0.0], 3, 2);
        assert_eq!(tied.top.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 2]);
        assert!((tied.top[0].1 - tied.top[1].1).abs() < 1e-7);
        assert_eq!(token_logprobs(&[0.0, f32::NAN], 1, 0).logprob, f32::NEG_INFINITY);
    }
}
