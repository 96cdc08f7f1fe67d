//! Checking kvrun against llama.cpp's greedy runs (`assets/reference/*.json`, `greedy.prompts`:
//! prompt ids, the 16 generated ids and llama.cpp's top-2 logits at every step, written by
//! `assets/reference/tools/greedy_ids.cpp`).

use kvrun::engine::{CompletionRequest, Engine, GenerateRequest};
use serde_json::Value;

/// How far kvrun's logits may sit from llama.cpp's on the same quantized weights: the two round
/// differently (llama.cpp's CPU build quantizes activations to 8 bits for its quantized dot
/// products and uses flash attention; kvrun keeps f32 activations), so a logit moves by a few
/// tenths at most, and the top-1 − top-2 margin by as much.
pub struct Tolerance {
    /// |kvrun − llama.cpp| for the logit of llama.cpp's top-1 and of its top-2 token.
    pub logit: f64,
    /// |kvrun's margin − llama.cpp's margin| (top-1 logit − top-2 logit). A step whose margin in
    /// llama.cpp's run is below this is a near-tie: either of the two is a correct greedy choice.
    pub margin: f64,
}

/// What one prompt's check saw.
pub struct Agreement {
    /// Largest |Δ logit| over the top-1 and top-2 tokens of every step.
    pub max_logit_diff: f64,
    /// Largest and mean |Δ margin| over every step.
    pub max_margin_diff: f64,
    pub mean_margin_diff: f64,
    /// Free-running greedy tokens compared (all of them, or up to the first near-tie where
    /// kvrun took llama.cpp's second choice).
    pub compared: usize,
    pub steps: usize,
    pub text: String,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32
}

impl Agreement {
    /// One line for the test's output: the measured differences and what was compared.
    pub fn report(&self, prompt: &str) {
        eprintln!(
            "{prompt:?}: max |Δlogit| {:.4}, |Δmargin| max {:.4} mean {:.4}, {} of {} greedy \
             tokens compared, {:?}",
            self.max_logit_diff,
            self.max_margin_diff,
            self.mean_margin_diff,
            self.compared,
            self.steps,
            self.text
        );
    }
}

/// One reference prompt, two ways. Teacher-forced: kvrun reads the prompt followed by
/// llama.cpp's own generated tokens, so every step is compared at the same context, at the logit
/// level (top-1 and top-2 logits and the margin within `tol`, kvrun's argmax = llama.cpp's top-1
/// unless the step is a near-tie). Free-running: kvrun's own greedy tokens (the decode path)
/// equal llama.cpp's up to the first near-tie where kvrun took the other of the top two.
pub fn check_greedy(engine: &mut Engine, case: &Value, tol: &Tolerance) -> Agreement {
    let prompt_text = case["prompt"].as_str().unwrap();
    let prompt = engine.tokenizer().encode(prompt_text, true).unwrap();
    assert_eq!(prompt, ids(&case["prompt_ids"]), "{prompt_text:?}: prompt ids");
    let generated = ids(&case["generated_ids"]);
    let steps = case["steps"].as_array().unwrap();
    assert_eq!(steps.len(), generated.len(), "{prompt_text:?}: reference steps");
    assert!(steps.len() >= 5, "{prompt_text:?}: the reference has {} steps", steps.len());
    let n = steps.len();

    // Teacher-forced: the logits of positions prompt.len() − 1 .. prompt.len() + n − 1, each
    // predicting step i's token.
    let mut forced = prompt.clone();
    forced.extend_from_slice(&generated[..n - 1]);
    let mut req = CompletionRequest::new(forced, 1);
    req.ignore_eos = true;
    req.prompt_logits_from = Some(prompt.len() - 1);
    let id = engine.add_request(req).unwrap();
    while engine.has_unfinished() {
        engine.step().unwrap();
    }
    let rows = engine.take_prompt_logits(id);
    assert_eq!(rows.len(), n, "{prompt_text:?}: prompt-logit rows");
    let (mut max_logit_diff, mut max_margin_diff, mut sum_margin_diff) = (0f64, 0f64, 0f64);
    for (step, (want, row)) in steps.iter().zip(&rows).enumerate() {
        let top1 = want["top1"].as_u64().unwrap() as u32;
        let top2 = want["top2"].as_u64().unwrap() as u32;
        let (l1, l2) = (want["top1_logit"].as_f64().unwrap(), want["top2_logit"].as_f64().unwrap());
        let margin = l1 - l2;
        let (g1, g2) = (f64::from(row[top1 as usize]), f64::from(row[top2 as usize]));
        let (d1, d2, dm) = ((g1 - l1).abs(), (g2 - l2).abs(), ((g1 - g2) - margin).abs());
        max_logit_diff = max_logit_diff.max(d1).max(d2);
        max_margin_diff = max_margin_diff.max(dm);
        sum_margin_diff += dm;
        let at = format!(
            "{prompt_text:?} step {step}: kvrun top-1/top-2 logits {g1:.4}/{g2:.4}, llama.cpp \
             {l1:.4}/{l2:.4} (tokens {top1}/{top2})"
        );
        assert!(d1.max(d2) <= tol.logit, "{at}: logit off by more than {}", tol.logit);
        assert!(dm <= tol.margin, "{at}: margin off by {dm:.4} > {}", tol.margin);
        let best = argmax(row);
        if margin < tol.margin {
            assert!(best == top1 || best == top2, "{at}: near-tie, kvrun's argmax is {best}");
        } else {
            assert_eq!(best, top1, "{at}: kvrun's argmax");
        }
    }

    // Free-running greedy through the decode path.
    let mut req = GenerateRequest::new(prompt, n);
    req.ignore_eos = true;
    let out = engine.generate(&req, |_| {}).unwrap();
    assert_eq!(out.tokens.len(), n, "{prompt_text:?}: EOS is ignored, so exactly {n} tokens");
    let mut compared = 0;
    for (step, (&token, want)) in out.tokens.iter().zip(steps).enumerate() {
        let top1 = want["top1"].as_u64().unwrap() as u32;
        let top2 = want["top2"].as_u64().unwrap() as u32;
        let margin = want["margin"].as_f64().unwrap();
        compared = step + 1;
        if margin < tol.margin {
            assert!(
                token == top1 || token == top2,
                "{prompt_text:?} step {step} (near-tie, margin {margin}): kvrun {token}, \
                 llama.cpp's top two {top1}, {top2}; kvrun {:?}",
                out.tokens
            );
            if token != top1 {
                break; // a different, equally valid continuation from here on
            }
        } else {
            assert_eq!(
                token, top1,
                "{prompt_text:?} step {step} (margin {margin}): kvrun {:?} ({:?}), llama.cpp \
                 {generated:?}",
                out.tokens, out.text
            );
        }
    }
    let mean_margin_diff = sum_margin_diff / n as f64;
    Agreement {
        max_logit_diff,
        max_margin_diff,
        mean_margin_diff,
        compared,
        steps: n,
        text: out.text,
    }
}
