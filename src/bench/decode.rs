//! `kvrun bench decode`: prefill and decode speed at several context lengths, and GPU time of
//! attention vs the rest per decoded token (timestamp queries, where the adapter has them).
//!
//! The roofline: decode is bandwidth-bound, so each point also gives the bytes a decode step
//! reads (every linear weight once, plus the KV history each group attends to, from the
//! layout) and the achieved GB/s, as a fraction of the adapter's read bandwidth measured by
//! [`super::bandwidth`] on the same adapter in the same run — in total and, with `per_op`,
//! for the linear layers and the attention of each group kind.

use std::collections::BTreeMap;

use super::bandwidth::BandwidthReport;
use crate::engine::{CompletionRequest, Engine, EngineError};
use crate::kv::GroupKind;
use crate::model::{StepTiming, Timing};
use crate::sample::SamplingParams;

/// The workload.
#[derive(Clone, Debug)]
pub struct DecodeBench {
    /// Context lengths (prompt tokens) to decode at.
    pub context_lengths: Vec<usize>,
    /// Tokens decoded per context length (wall-clock speed).
    pub decode_tokens: usize,
    /// Decode steps measured with timestamp queries per context length.
    pub timed_steps: usize,
    /// Time every kernel kind separately (slower, the wall-clock figures too; for profiling).
    pub per_op: bool,
    /// The adapter's bandwidth ([`super::bandwidth::BandwidthBench::run`] on the engine's
    /// GPU): the roofline's ceiling; `None` leaves the roofline out.
    pub bandwidth: Option<BandwidthReport>,
    /// How the decoded tokens are sampled (its `max_tokens` is the bench's): greedy by
    /// default; random sampling draws on the GPU (`kernels::sampling`) and a repetition penalty
    /// shapes the logits there (`kernels::logit_edit`).
    pub sampling: SamplingParams,
}

/// Bytes one decode step reads at a context length (the roofline's numerator).
#[derive(Clone, Debug, serde::Serialize)]
pub struct StepBytes {
    /// Every linear layer's weight once and the experts one token is routed to
    /// (`Model::linear_weight_bytes`).
    pub weights: u64,
    /// Of `weights`, the routed experts' rows (`Model::expert_weight_bytes`; 0 when dense).
    pub expert_weights: u64,
    /// KV read by the attention of full-attention groups: every key of the context.
    pub kv_full: u64,
    /// KV read by the attention of sliding groups: the keys of the window.
    pub kv_sliding: u64,
    /// Recurrent layers (Gated DeltaNet): each one's conv and recurrent state of the sequence,
    /// read and written once a step (2 × the state bytes), whatever the context; 0 without.
    pub state: u64,
    pub total: u64,
}

/// Achieved bandwidth of a decode step, total and per kernel kind.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Roofline {
    pub achieved_gb_s: f64,
    /// `achieved_gb_s` ÷ the adapter's read bandwidth.
    pub fraction: f64,
    /// KV read by all attention (both group kinds) per GPU ms of attention, and its fraction.
    pub attention_gb_s: Option<f64>,
    pub attention_fraction: Option<f64>,
    /// GB/s and fraction of "linear", "moe_experts", "attention", "attention_sliding", "delta_scan" (the
    /// recurrent states; the conv state's few bytes are counted there too) (with `per_op`).
    pub gb_s_by_kind: BTreeMap<&'static str, f64>,
    pub fraction_by_kind: BTreeMap<&'static str, f64>,
}

/// One context length's figures.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DecodePoint {
    pub context_length: usize,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    /// GPU milliseconds per decoded token: attention, and everything.
    pub attention_gpu_ms_per_token: Option<f64>,
    pub gpu_ms_per_token: Option<f64>,
    /// Compute dispatches per decoded token (one kernel launch each: what fusing ops reduces).
    pub dispatches_per_token: Option<f64>,
    /// Host milliseconds per decoded token recording and submitting the step's commands
    /// (`StepTiming::host_ms`, the timed steps'): beside `gpu_ms_per_token`, whether decode is
    /// bound by the host's command encoding rather than the GPU.
    pub host_ms_per_token: Option<f64>,
    /// Bytes of logits read back to the host per decoded token (`StepTiming::readback_bytes`,
    /// the timed steps'): 4 where the GPU samples greedily (the bench decodes greedily), a
    /// whole vocabulary row × 4 where the host samples.
    pub readback_bytes_per_token: Option<f64>,
    /// GPU ms per decoded token by kernel kind (with `per_op`).
    pub gpu_ms_by_kind: BTreeMap<&'static str, f64>,
    /// GPU ms of the prompt's prefill by kernel kind (with `per_op`: the first run's, which
    /// computes the whole prompt).
    pub prefill_gpu_ms_by_kind: BTreeMap<&'static str, f64>,
    /// KV bytes the sequence held at most (measured every step), all groups.
    pub kv_bytes_used: u64,
    /// The same per KV-cache group, in table order (one entry for a model whose layers all
    /// attend fully): a sliding group's stays flat past its window.
    pub kv_bytes_by_group: Vec<u64>,
    /// Bytes a timed decode step reads, at the mean context of the timed steps.
    pub step_bytes: StepBytes,
    /// Achieved bandwidth (needs GPU timings and the bandwidth measurement).
    pub roofline: Option<Roofline>,
}

/// The report; `--json` prints it (keys as in DESIGN.md plus the per-point details).
#[derive(Clone, Debug, serde::Serialize)]
pub struct DecodeReport {
    pub adapter: String,
    pub backend: String,
    pub model: String,
    pub context_lengths: Vec<usize>,
    pub prefill_tokens_per_s: Vec<f64>,
    pub decode_tokens_per_s: Vec<f64>,
    pub attention_gpu_ms_per_token: Vec<Option<f64>>,
    /// The adapter's bandwidth, measured before the points (`None` when skipped).
    pub bandwidth: Option<BandwidthReport>,
    pub points: Vec<DecodePoint>,
}

/// A prompt of exactly `n` tokens: ordinary English, repeated.
fn prompt_tokens(engine: &Engine, n: usize) -> Result<Vec<u32>, EngineError> {
    let text =
        "The history of the city begins with a small settlement on the river, where traders \
                met to exchange grain, cloth and news from distant places. ";
    let unit = engine.tokenizer().encode(text, false)?;
    Ok(unit.iter().cycle().take(n).copied().collect())
}

/// Per-step averages of summed GPU timings.
fn per_token(
    sum: Option<&StepTiming>,
    steps: usize,
) -> (Option<f64>, Option<f64>, BTreeMap<&'static str, f64>) {
    let Some(sum) = sum.filter(|_| steps > 0) else {
        return (None, None, BTreeMap::new());
    };
    let n = steps as f64;
    let by_kind = sum.by_kind.iter().map(|(k, v)| (*k, v / n)).collect();
    (Some(sum.attention_ms / n), Some(sum.total_ms / n), by_kind)
}

/// Bytes a decode step reads when each sequence attends to `keys` keys: the linear weights,
/// per group `layers × min(keys, window) × bytes per token and layer` (the layout's bytes per
/// token cover the group's layer slots; padding slots are never read), and the recurrent
/// layers' states read and written.
fn step_bytes(engine: &Engine, keys: usize) -> StepBytes {
    let layout = engine.kv_layout();
    let per_layer_token = layout.bytes_per_token() / layout.num_layers.max(1) as f64;
    let (mut kv_full, mut kv_sliding) = (0u64, 0u64);
    for group in engine.config().kv_groups.groups() {
        let (read, sum) = match group.kind {
            GroupKind::Full => (keys, &mut kv_full),
            GroupKind::Sliding { window } => (keys.min(window), &mut kv_sliding),
        };
        *sum += (group.layers.len() as f64 * read as f64 * per_layer_token).round() as u64;
    }
    let weights = engine.model().linear_weight_bytes();
    let expert_weights = engine.model().expert_weight_bytes();
    let state = 2 * engine.model().config().state_bytes_per_sequence();
    let total = weights + kv_full + kv_sliding + state;
    StepBytes { weights, expert_weights, kv_full, kv_sliding, state, total }
}

/// GB/s (10^9 bytes per second) of `bytes` moved in `ms`.
pub(super) fn gb_s(bytes: u64, ms: f64) -> f64 {
    bytes as f64 / (ms * 1e6)
}

fn roofline(
    bytes: &StepBytes,
    (attention_ms, total_ms): (Option<f64>, Option<f64>),
    by_kind_ms: &BTreeMap<&'static str, f64>,
    bandwidth: Option<&BandwidthReport>,
) -> Option<Roofline> {
    let (ms, ceiling) = (total_ms.filter(|&t| t > 0.0)?, bandwidth?.read_gb_s);
    let achieved_gb_s = gb_s(bytes.total, ms);
    let attention_gb_s =
        attention_ms.filter(|&t| t > 0.0).map(|t| gb_s(bytes.kv_full + bytes.kv_sliding, t));
    let mut gb_s_by_kind = BTreeMap::new();
    for (kind, b) in [
        ("linear", bytes.weights - bytes.expert_weights),
        ("moe_experts", bytes.expert_weights),
        ("attention", bytes.kv_full),
        ("attention_sliding", bytes.kv_sliding),
        ("delta_scan", bytes.state),
    ] {
        if let Some(&t) = by_kind_ms.get(kind).filter(|&&t| t > 0.0 && b > 0) {
            gb_s_by_kind.insert(kind, gb_s(b, t));
        }
    }
    let fraction_by_kind = gb_s_by_kind.iter().map(|(k, v)| (*k, v / ceiling)).collect();
    Some(Roofline {
        achieved_gb_s,
        fraction: achieved_gb_s / ceiling,
        attention_gb_s,
        attention_fraction: attention_gb_s.map(|g| g / ceiling),
        gb_s_by_kind,
        fraction_by_kind,
    })
}

impl DecodeBench {
    /// Runs the workload. Each context length's requests have their own prefix-cache
    /// namespace: its first request computes the whole prompt (the prefill figure; longer
    /// prompts start with the shorter ones, which must not count as cached), and where the
    /// engine caches prefixes its timed second request reuses that prompt's blocks instead of
    /// computing it again (a long context's prefill is most of the bench on a slow adapter).
    pub fn run(&self, engine: &mut Engine, model_name: &str) -> Result<DecodeReport, EngineError> {
        let request = |prompt: Vec<u32>, max_tokens: usize, namespace: u64| {
            let mut r = CompletionRequest::new(prompt, max_tokens);
            r.params = SamplingParams { max_tokens, ..self.sampling };
            r.ignore_eos = true;
            r.namespace = Some(namespace);
            r
        };
        // Every point must fit before the first one runs (a long bench must not fail at its end).
        let max_model_len = engine.config().max_model_len;
        let need = self.decode_tokens.max(self.timed_steps) + 1;
        if let Some(&ctx) = self.context_lengths.iter().find(|&&c| c + need > max_model_len) {
            return Err(EngineError::Config(format!(
                "--context-lengths {ctx} plus {need} decoded tokens exceeds the context the \
                 engine was loaded with ({max_model_len}); raise -c to at least {} or use \
                 shorter context lengths",
                ctx + need
            )));
        }
        // Warm-up: CPU adapters compile each pipeline on its first dispatch. Within -c: a
        // short context length's default -c can be below 40 + 4 tokens.
        let warm_prompt = 40.min(max_model_len / 2).max(1);
        let warm_out = 4.min(max_model_len - warm_prompt).max(1);
        engine
            .generate(&request(prompt_tokens(engine, warm_prompt)?, warm_out, u64::MAX), |_| {})?;
        let mut points = Vec::new();
        for &ctx in &self.context_lengths {
            let prompt = prompt_tokens(engine, ctx)?;
            // With `per_op` the first run's prefill is timed per kernel (the timed rerun below
            // reuses the prompt's blocks and computes only its tail); its wall-clock figures
            // then include the extra passes and readbacks.
            engine.model_mut().set_timing(if self.per_op { Timing::PerOp } else { Timing::Off });
            engine.take_peak_kv_blocks();
            let ns = ctx as u64;
            let out =
                engine.generate(&request(prompt.clone(), self.decode_tokens + 1, ns), |_| {})?;
            let block_bytes = engine.kv_layout().bytes_per_block();
            let kv_bytes_by_group: Vec<u64> =
                engine.take_peak_kv_blocks().iter().map(|&b| b as u64 * block_bytes).collect();
            let kv_bytes_used = kv_bytes_by_group.iter().sum();
            let timing = if self.per_op { Timing::PerOp } else { Timing::Attention };
            engine.model_mut().set_timing(timing);
            let timed = engine.generate(&request(prompt, self.timed_steps + 1, ns), |_| {})?;
            engine.model_mut().set_timing(Timing::Off);
            let t = &timed.timing;
            let (attn, total, by_kind) = per_token(t.decode_gpu.as_deref(), t.decode_steps);
            let dispatches_per_token = t
                .decode_gpu
                .as_ref()
                .filter(|_| t.decode_steps > 0)
                .map(|g| g.dispatches as f64 / t.decode_steps as f64);
            let host_ms_per_token = t
                .decode_gpu
                .as_ref()
                .filter(|_| t.decode_steps > 0)
                .map(|g| g.host_ms / t.decode_steps as f64);
            let readback_bytes_per_token = t
                .decode_gpu
                .as_ref()
                .filter(|_| t.decode_steps > 0)
                .map(|g| g.readback_bytes as f64 / t.decode_steps as f64);
            // The timed decode steps attend to ctx + 1 … ctx + timed_steps keys.
            let step_bytes = step_bytes(engine, ctx + 1 + self.timed_steps.saturating_sub(1) / 2);
            let roofline = roofline(&step_bytes, (attn, total), &by_kind, self.bandwidth.as_ref());
            points.push(DecodePoint {
                context_length: ctx,
                prefill_tokens_per_s: ctx as f64 / out.timing.ttft_s,
                decode_tokens_per_s: out.decode_tokens_per_s(),
                attention_gpu_ms_per_token: attn,
                gpu_ms_per_token: total,
                dispatches_per_token,
                host_ms_per_token,
                readback_bytes_per_token,
                gpu_ms_by_kind: by_kind,
                prefill_gpu_ms_by_kind: out
                    .timing
                    .prefill_gpu
                    .clone()
                    .map(|t| t.by_kind)
                    .unwrap_or_default(),
                kv_bytes_used,
                kv_bytes_by_group,
                step_bytes,
                roofline,
            });
        }
        let gpu = engine.gpu();
        Ok(DecodeReport {
            adapter: gpu.info.name.clone(),
            backend: format!("{:?}", gpu.info.backend),
            model: model_name.to_string(),
            context_lengths: self.context_lengths.clone(),
            prefill_tokens_per_s: points.iter().map(|p| p.prefill_tokens_per_s).collect(),
            decode_tokens_per_s: points.iter().map(|p| p.decode_tokens_per_s).collect(),
            attention_gpu_ms_per_token: points
                .iter()
                .map(|p| p.attention_gpu_ms_per_token)
                .collect(),
            bandwidth: self.bandwidth.clone(),
            points,
        })
    }
}

impl DecodeReport {
    /// A Markdown table of the points.
    pub fn markdown(&self) -> String {
        let mut s =
            format!("`bench decode` — {} on {} ({})\n\n", self.model, self.adapter, self.backend);
        if let Some(b) = &self.bandwidth {
            s += &format!(
                "Adapter bandwidth ({}, {} buffer): read {:.2} GB/s, copy {:.2} GB/s; a decode \
                 step reads every linear weight once plus the KV its groups attend to.\n\n",
                b.timing,
                crate::kv::format_bytes(b.buffer_bytes),
                b.read_gb_s,
                b.copy_gb_s
            );
        }
        s += "| context | prefill tok/s | decode tok/s | attention GPU ms/token | total GPU ms/token | dispatches/token | host ms/token | readback B/token | bytes/step | GB/s | of read bandwidth | KV bytes | KV bytes by group |\n";
        s += "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
        let ms = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.2}"));
        for p in &self.points {
            let groups: Vec<String> =
                p.kv_bytes_by_group.iter().map(|&b| crate::kv::format_bytes(b)).collect();
            let (gbs, frac) = match &p.roofline {
                Some(r) => {
                    (format!("{:.2}", r.achieved_gb_s), format!("{:.1} %", 100.0 * r.fraction))
                }
                None => ("n/a".into(), "n/a".into()),
            };
            s += &format!(
                "| {} | {:.1} | {:.2} | {} | {} | {} | {} | {} | {} | {gbs} | {frac} | {} | {} |\n",
                p.context_length,
                p.prefill_tokens_per_s,
                p.decode_tokens_per_s,
                ms(p.attention_gpu_ms_per_token),
                ms(p.gpu_ms_per_token),
                p.dispatches_per_token.map_or("n/a".to_string(), |d| format!("{d:.0}")),
                ms(p.host_ms_per_token),
                p.readback_bytes_per_token.map_or("n/a".to_string(), |b| format!("{b:.0}")),
                crate::kv::format_bytes(p.step_bytes.total),
                crate::kv::format_bytes(p.kv_bytes_used),
                groups.join(" · ")
            );
        }
        for p in &self.points {
            let Some(r) = p.roofline.as_ref().filter(|r| !r.gb_s_by_kind.is_empty()) else {
                continue;
            };
            s += &format!("\ncontext {}: achieved bandwidth by kernel: ", p.context_length);
            s += &r
                .gb_s_by_kind
                .iter()
                .map(|(k, v)| format!("{k} {v:.2} GB/s ({:.1} %)", 100.0 * r.fraction_by_kind[k]))
                .collect::<Vec<_>>()
                .join(", ");
            s += "\n";
        }
        for p in self.points.iter().filter(|p| !p.gpu_ms_by_kind.is_empty()) {
            s += &format!("\ncontext {}: decode GPU ms/token by kernel: ", p.context_length);
            s += &p
                .gpu_ms_by_kind
                .iter()
                .map(|(k, v)| format!("{k} {v:.2}"))
                .collect::<Vec<_>>()
                .join(", ");
            s += "\n  prefill GPU ms by kernel: ";
            s += &p
                .prefill_gpu_ms_by_kind
                .iter()
                .map(|(k, v)| format!("{k} {v:.1}"))
                .collect::<Vec<_>>()
                .join(", ");
            s += "\n";
        }
        s
    }
}
