//! `kvrun bench decode`: prefill and decode speed at several context lengths, and GPU time of
//! attention vs the rest per decoded token (timestamp queries, where the adapter has them).

use std::collections::BTreeMap;

use crate::engine::{CompletionRequest, Engine, EngineError};
use crate::model::{StepTiming, Timing};

/// The workload.
#[derive(Clone, Debug)]
pub struct DecodeBench {
    /// Context lengths (prompt tokens) to decode at.
    pub context_lengths: Vec<usize>,
    /// Tokens decoded per context length (wall-clock speed).
    pub decode_tokens: usize,
    /// Decode steps measured with timestamp queries per context length.
    pub timed_steps: usize,
    /// Time every kernel kind separately (slower; for profiling).
    pub per_op: bool,
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
    /// GPU ms per decoded token by kernel kind (with `per_op`).
    pub gpu_ms_by_kind: BTreeMap<&'static str, f64>,
    /// GPU ms of the prompt's prefill by kernel kind (with `per_op`).
    pub prefill_gpu_ms_by_kind: BTreeMap<&'static str, f64>,
    /// KV bytes the sequence held at most (measured every step), all groups.
    pub kv_bytes_used: u64,
    /// The same per KV-cache group, in table order (one entry for a model whose layers all
    /// attend fully): a sliding group's stays flat past its window.
    pub kv_bytes_by_group: Vec<u64>,
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

impl DecodeBench {
    /// Runs the workload (the engine should have prefix caching off, so every prompt is computed).
    pub fn run(&self, engine: &mut Engine, model_name: &str) -> Result<DecodeReport, EngineError> {
        let request = |prompt: Vec<u32>, max_tokens: usize| {
            let mut r = CompletionRequest::new(prompt, max_tokens);
            r.ignore_eos = true;
            r
        };
        // Warm-up: CPU adapters compile each pipeline on its first dispatch.
        engine.generate(&request(prompt_tokens(engine, 40)?, 4), |_| {})?;
        let mut points = Vec::new();
        for &ctx in &self.context_lengths {
            let prompt = prompt_tokens(engine, ctx)?;
            engine.model_mut().set_timing(Timing::Off);
            engine.take_peak_kv_blocks();
            let out = engine.generate(&request(prompt.clone(), self.decode_tokens + 1), |_| {})?;
            let block_bytes = engine.kv_layout().bytes_per_block();
            let kv_bytes_by_group: Vec<u64> =
                engine.take_peak_kv_blocks().iter().map(|&b| b as u64 * block_bytes).collect();
            let kv_bytes_used = kv_bytes_by_group.iter().sum();
            let timing = if self.per_op { Timing::PerOp } else { Timing::Attention };
            engine.model_mut().set_timing(timing);
            let timed = engine.generate(&request(prompt, self.timed_steps + 1), |_| {})?;
            engine.model_mut().set_timing(Timing::Off);
            let t = &timed.timing;
            let (attn, total, by_kind) = per_token(t.decode_gpu.as_ref(), t.decode_steps);
            points.push(DecodePoint {
                context_length: ctx,
                prefill_tokens_per_s: ctx as f64 / out.timing.ttft_s,
                decode_tokens_per_s: out.decode_tokens_per_s(),
                attention_gpu_ms_per_token: attn,
                gpu_ms_per_token: total,
                gpu_ms_by_kind: by_kind,
                prefill_gpu_ms_by_kind: t
                    .prefill_gpu
                    .clone()
                    .map(|t| t.by_kind)
                    .unwrap_or_default(),
                kv_bytes_used,
                kv_bytes_by_group,
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
            points,
        })
    }
}

impl DecodeReport {
    /// A Markdown table of the points.
    pub fn markdown(&self) -> String {
        let mut s =
            format!("`bench decode` — {} on {} ({})\n\n", self.model, self.adapter, self.backend);
        s += "| context | prefill tok/s | decode tok/s | attention GPU ms/token | total GPU ms/token | KV bytes | KV bytes by group |\n";
        s += "|---:|---:|---:|---:|---:|---:|---|\n";
        let ms = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.2}"));
        for p in &self.points {
            let groups: Vec<String> =
                p.kv_bytes_by_group.iter().map(|&b| crate::kv::format_bytes(b)).collect();
            s += &format!(
                "| {} | {:.1} | {:.2} | {} | {} | {} | {} |\n",
                p.context_length,
                p.prefill_tokens_per_s,
                p.decode_tokens_per_s,
                ms(p.attention_gpu_ms_per_token),
                ms(p.gpu_ms_per_token),
                crate::kv::format_bytes(p.kv_bytes_used),
                groups.join(" · ")
            );
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
