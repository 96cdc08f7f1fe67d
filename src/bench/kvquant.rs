//! `kvrun bench kv-quant`: for each KV format × scale granularity × rotation, what it costs
//! (bytes per token, tokens that fit a budget), what it does to quality (perplexity and Δ% vs
//! f16 KV, mean KL divergence and top-1 agreement against the f16-KV run on the same chunks)
//! and what attention costs per decoded token at short and long context (GPU timestamps).

use std::str::FromStr;

use super::bandwidth::{BandwidthBench, BandwidthReport};
use super::decode::{DecodeBench, DecodeReport};
use super::plot::{Panel, Series};
use crate::engine::{Engine, EngineConfig, EngineError, PerplexityOptions};
use crate::quant::{KvCacheSpec, KvFormat, ScaleGranularity};

/// One setting, written `FORMAT[:K_SCALE[:V_SCALE]][+rot]`, e.g. `int4:per-channel:per-token+rot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSetting(pub KvCacheSpec);

impl FromStr for KvSetting {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (body, rotate) = match s.trim().strip_suffix("+rot") {
            Some(b) => (b, true),
            None => (s.trim(), false),
        };
        let mut parts = body.split(':');
        let format: KvFormat = parts.next().unwrap_or("").parse().map_err(|e| format!("{e}"))?;
        let scale = |p: Option<&str>| -> Result<Option<ScaleGranularity>, String> {
            p.map(|x| x.parse().map_err(|e| format!("{e}"))).transpose()
        };
        let k = scale(parts.next())?;
        let v = scale(parts.next())?;
        if parts.next().is_some() {
            return Err(format!("`{s}`: expected FORMAT[:K_SCALE[:V_SCALE]][+rot]"));
        }
        KvCacheSpec::new(format, k, v, rotate).map(KvSetting).map_err(|e| format!("`{s}`: {e}"))
    }
}

impl std::fmt::Display for KvSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.0;
        write!(f, "{}", s.format())?;
        if s.format().is_quantized() {
            write!(f, ":{}:{}", s.k.granularity, s.v.granularity)?;
        }
        if s.rotate {
            f.write_str("+rot")?;
        }
        Ok(())
    }
}

/// The settings `bench kv-quant` runs by default: every format with its default scales
/// (K per-channel, V per-token), the ablations that show why those are the defaults (per-token
/// K, per-tensor FP8), and rotation at 8 and 4 bits.
pub const DEFAULT_SETTINGS: &str = "f16,fp8-e4m3,fp8-e4m3:per-tensor:per-tensor,fp8-e5m2,int8,\
     int8:per-token:per-token,int8+rot,int4,int4:per-token:per-token,int4+rot";

/// The workload.
#[derive(Clone, Debug)]
pub struct KvQuantBench {
    pub settings: Vec<KvSetting>,
    /// Perplexity chunk length (`-c`) and how many chunks.
    pub ctx: usize,
    pub chunks: Option<usize>,
    /// Context lengths at which decode attention is timed (short and long).
    pub context_lengths: Vec<usize>,
    /// Decode steps timed per context length.
    pub timed_steps: usize,
    /// Decode timing rounds per setting (at least 1; see `run`).
    pub rounds: usize,
    /// The budget "tokens that fit" is computed for.
    pub budget_bytes: u64,
}

/// One setting's figures; keys as in DESIGN.md ("Machine-readable output").
#[derive(Clone, Debug, serde::Serialize)]
pub struct KvQuantRow {
    pub kv_cache_dtype: String,
    pub k_scale: Option<String>,
    pub v_scale: Option<String>,
    pub rotate: bool,
    /// Pool bytes per token, scales included (`KvLayout::bytes_per_token`).
    pub kv_bytes_per_token: f64,
    /// f16 staging of partial last blocks, per running sequence (quantized formats).
    pub staging_bytes_per_sequence: u64,
    /// Whole blocks' tokens that fit `budget_bytes` (one sequence's staging subtracted).
    pub tokens_in_budget: u64,
    pub ppl: f64,
    pub ppl_delta_pct: f64,
    pub kld_mean: f64,
    pub top1_agreement: f64,
    /// Attention GPU ms per decoded token at each of `context_lengths` (None without
    /// timestamp queries).
    pub attention_gpu_ms_per_token: Vec<Option<f64>>,
    /// Each round's attention GPU ms per decoded token, per context length (`[context][round]`;
    /// `attention_gpu_ms_per_token` is their median).
    pub attention_gpu_ms_by_round: Vec<Vec<Option<f64>>>,
    /// Decode tokens per second at each context length (median over the rounds).
    pub decode_tokens_per_s: Vec<f64>,
    /// KV bytes one decode step's attention reads at each of `context_lengths` (scales
    /// included), and the GB/s and fraction of the adapter's read bandwidth that is.
    pub attention_kv_bytes_per_step: Vec<u64>,
    pub attention_gb_s: Vec<Option<f64>>,
    pub attention_bandwidth_fraction: Vec<Option<f64>>,
}

/// The report (`--json`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct KvQuantReport {
    pub adapter: String,
    pub model: String,
    pub text: String,
    pub ctx: usize,
    pub chunks: usize,
    pub tokens_scored: usize,
    pub budget_bytes: u64,
    pub context_lengths: Vec<usize>,
    /// Decode timing rounds per setting (`--rounds`).
    pub rounds: usize,
    /// The adapter's bandwidth, measured once before the settings.
    pub bandwidth: BandwidthReport,
    pub rows: Vec<KvQuantRow>,
}

impl KvQuantBench {
    /// The engine configuration of `setting` derived from `base` (same model and sizes).
    pub fn engine_config(&self, base: &EngineConfig, setting: KvSetting) -> EngineConfig {
        let longest = self.context_lengths.iter().copied().max().unwrap_or(0);
        let mut cfg = base.clone();
        cfg.kv_cache = setting.0;
        cfg.max_num_seqs = 1;
        cfg.enable_prefix_cache = false;
        cfg.max_model_len = Some(self.ctx.max(longest + self.timed_steps + 2));
        cfg.kv_cache_memory = None;
        cfg.max_logit_rows = Some(self.ctx.min(cfg.max_num_batched_tokens));
        cfg
    }

    /// Runs every setting on `text`. `progress(setting, step)` is called as it goes.
    ///
    /// Round 1 loads each setting in turn and measures its quality and its decode; rounds 2 …
    /// `rounds` time decode again, the settings in serpentine order (reversed in even rounds,
    /// so a drift of the machine over the run does not favour the settings run first). A
    /// setting's timings are the medians over its rounds.
    pub fn run(
        &self,
        base: &EngineConfig,
        text: &str,
        text_name: &str,
        model_name: &str,
        mut progress: impl FnMut(&KvSetting, &str),
    ) -> Result<KvQuantReport, EngineError> {
        let f16 = KvSetting(KvCacheSpec::default());
        let mut reference = Engine::load(&self.engine_config(base, f16))?;
        let opts = PerplexityOptions { ctx: self.ctx, max_chunks: self.chunks };
        let bandwidth = BandwidthBench::default().run(reference.gpu())?;
        let decode = DecodeBench {
            context_lengths: self.context_lengths.clone(),
            decode_tokens: self.timed_steps,
            timed_steps: self.timed_steps,
            per_op: false,
            bandwidth: Some(bandwidth.clone()),
            sampling: Default::default(),
        };
        let mut rows = Vec::new();
        let mut decodes: Vec<Vec<DecodeReport>> = Vec::new();
        let (mut chunks, mut tokens_scored) = (0, 0);
        for setting in &self.settings {
            progress(setting, "load");
            let mut own = match *setting == f16 {
                true => None,
                false => Some(Engine::load(&self.engine_config(base, *setting))?),
            };
            progress(setting, "perplexity");
            let (ppl, delta, kld, top1) = match own.as_mut() {
                None => {
                    let r = reference.perplexity(text, &opts, |_, _| {})?;
                    (chunks, tokens_scored) = (r.chunks, r.tokens_scored);
                    (r.ppl, 0.0, 0.0, 1.0)
                }
                Some(engine) => {
                    let r = engine.perplexity_vs(text, &opts, Some(&mut reference), |_, _| {})?;
                    (chunks, tokens_scored) = (r.chunks, r.tokens_scored);
                    let k = r.kld.ok_or_else(|| {
                        EngineError::Config("the f16 baseline reported no KLD".into())
                    })?;
                    (r.ppl, k.ppl_delta_pct, k.kld_mean, k.top1_agreement)
                }
            };
            progress(setting, "decode");
            let engine = own.as_mut().unwrap_or(&mut reference);
            decodes.push(vec![decode.run(engine, model_name)?]);
            let layout = engine.kv_layout();
            let per_block = layout.bytes_per_block();
            let staging = crate::kv::staging_bytes_per_sequence(layout, &engine.config().kv_groups);
            let blocks = self.budget_bytes.saturating_sub(staging) / per_block;
            let spec = setting.0;
            let quantized = spec.format().is_quantized();
            rows.push(KvQuantRow {
                kv_cache_dtype: spec.format().name().to_string(),
                k_scale: quantized.then(|| spec.k.granularity.name().to_string()),
                v_scale: quantized.then(|| spec.v.granularity.name().to_string()),
                rotate: spec.rotate,
                kv_bytes_per_token: layout.bytes_per_token(),
                staging_bytes_per_sequence: staging,
                tokens_in_budget: blocks * layout.block_size as u64,
                ppl,
                ppl_delta_pct: delta,
                kld_mean: kld,
                top1_agreement: top1,
                attention_gpu_ms_per_token: Vec::new(),
                attention_gpu_ms_by_round: Vec::new(),
                decode_tokens_per_s: Vec::new(),
                attention_kv_bytes_per_step: Vec::new(),
                attention_gb_s: Vec::new(),
                attention_bandwidth_fraction: Vec::new(),
            });
        }
        for round in 2..=self.rounds {
            for i in serpentine(self.settings.len(), round) {
                let setting = &self.settings[i];
                progress(setting, &format!("decode, round {round}"));
                let mut own = match *setting == f16 {
                    true => None,
                    false => Some(Engine::load(&self.engine_config(base, *setting))?),
                };
                let engine = own.as_mut().unwrap_or(&mut reference);
                decodes[i].push(decode.run(engine, model_name)?);
            }
        }
        for (row, runs) in rows.iter_mut().zip(&decodes) {
            row.fill_timings(runs, bandwidth.read_gb_s);
        }
        Ok(KvQuantReport {
            adapter: reference.gpu().info.name.clone(),
            model: model_name.to_string(),
            text: text_name.to_string(),
            ctx: self.ctx,
            chunks,
            tokens_scored,
            budget_bytes: self.budget_bytes,
            context_lengths: self.context_lengths.clone(),
            rounds: self.rounds,
            bandwidth,
            rows,
        })
    }
}

/// The order of `n` settings in round `round` (1-based): forward in odd rounds, reversed in
/// even ones.
fn serpentine(n: usize, round: usize) -> Vec<usize> {
    match round % 2 {
        1 => (0..n).collect(),
        _ => (0..n).rev().collect(),
    }
}

/// The median of the present values (`None` if there are none).
fn median(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = values.flatten().collect();
    super::stats::percentile(&v, 50.0)
}

impl KvQuantRow {
    /// The timing columns from the setting's decode runs (one per round): medians, and each
    /// round's attention time. GB/s and the bandwidth fraction follow the median time.
    fn fill_timings(&mut self, runs: &[DecodeReport], read_gb_s: f64) {
        let contexts = runs.first().map_or(0, |r| r.points.len());
        self.attention_gpu_ms_by_round = (0..contexts)
            .map(|c| runs.iter().map(|r| r.points[c].attention_gpu_ms_per_token).collect())
            .collect();
        self.attention_gpu_ms_per_token =
            self.attention_gpu_ms_by_round.iter().map(|v| median(v.iter().copied())).collect();
        self.decode_tokens_per_s = (0..contexts)
            .map(|c| median(runs.iter().map(|r| Some(r.points[c].decode_tokens_per_s))))
            .map(|m| m.unwrap_or(0.0))
            .collect();
        self.attention_kv_bytes_per_step = runs.first().map_or(Vec::new(), |r| {
            r.points.iter().map(|p| p.step_bytes.kv_full + p.step_bytes.kv_sliding).collect()
        });
        self.attention_gb_s = self
            .attention_kv_bytes_per_step
            .iter()
            .zip(&self.attention_gpu_ms_per_token)
            .map(|(&b, ms)| ms.filter(|&t| t > 0.0).map(|t| super::decode::gb_s(b, t)))
            .collect();
        self.attention_bandwidth_fraction = self
            .attention_gb_s
            .iter()
            .map(|g| g.filter(|_| read_gb_s > 0.0).map(|g| g / read_gb_s))
            .collect();
    }

    /// " (min–max)" of context `i`'s rounds when there are several, else "".
    fn spread(&self, i: usize) -> String {
        let v: Vec<f64> = self.attention_gpu_ms_by_round[i].iter().flatten().copied().collect();
        let (lo, hi) = (super::stats::percentile(&v, 0.0), super::stats::percentile(&v, 100.0));
        match (v.len(), lo, hi) {
            (2.., Some(lo), Some(hi)) => format!(" ({lo:.2}–{hi:.2})"),
            _ => String::new(),
        }
    }

    fn label(&self) -> String {
        let mut s = self.kv_cache_dtype.clone();
        if let (Some(k), Some(v)) = (&self.k_scale, &self.v_scale) {
            s += &format!(" K {k} V {v}");
        }
        if self.rotate {
            s += " +rot";
        }
        s
    }
}

impl KvQuantReport {
    /// The Markdown table.
    pub fn markdown(&self) -> String {
        let ms = |v: &Option<f64>| v.map(|x| format!("{x:.2}")).unwrap_or_else(|| "–".into());
        let ctx_cols: String = self
            .context_lengths
            .iter()
            .map(|c| format!(" attn ms/tok @{c} | attn GB/s (of read bw) @{c} |"))
            .collect();
        let ctx_rule: String = self.context_lengths.iter().map(|_| "---:|---:|").collect();
        let mut s = format!(
            "kv-quant on {} ({}), perplexity: {} chunks of {} ({} tokens scored) of {}; tokens \
             that fit {}\n\nAdapter read bandwidth {:.2} GB/s ({}); attention GB/s = KV bytes \
             a decode step reads ÷ attention GPU time.{}\n\n| KV | bytes/token | tokens in budget \
             | PPL | ΔPPL % | mean KLD | top-1 agree % |{ctx_cols}\n\
             |---|---:|---:|---:|---:|---:|---:|{ctx_rule}\n",
            self.model,
            self.adapter,
            self.chunks,
            self.ctx,
            self.tokens_scored,
            self.text,
            crate::kv::format_bytes(self.budget_bytes),
            self.bandwidth.read_gb_s,
            self.bandwidth.timing,
            match self.rounds {
                0 | 1 => String::new(),
                n => format!(
                    " Attention times: median of {n} rounds, the settings alternating \
                     (min–max in brackets)."
                ),
            }
        );
        for r in &self.rows {
            let attn: String = (0..r.attention_gpu_ms_per_token.len())
                .map(|i| {
                    let gbs = match (r.attention_gb_s[i], r.attention_bandwidth_fraction[i]) {
                        (Some(g), Some(f)) => format!("{g:.2} ({:.0} %)", 100.0 * f),
                        _ => "–".into(),
                    };
                    format!(" {}{} | {gbs} |", ms(&r.attention_gpu_ms_per_token[i]), r.spread(i))
                })
                .collect();
            s += &format!(
                "| {} | {:.0} | {} | {:.4} | {:+.2} | {:.5} | {:.2} |{attn}\n",
                r.label(),
                r.kv_bytes_per_token,
                r.tokens_in_budget,
                r.ppl,
                r.ppl_delta_pct,
                r.kld_mean,
                r.top1_agreement * 100.0,
            );
        }
        s
    }

    /// ΔPPL % against bytes per token, one point per setting (one series per rotation).
    pub fn plot(&self) -> Vec<Panel> {
        let series = |rotate: bool, name: &str| Series {
            name: name.to_string(),
            points: self
                .rows
                .iter()
                .filter(|r| r.rotate == rotate)
                .map(|r| (r.kv_bytes_per_token, r.ppl_delta_pct))
                .collect(),
        };
        vec![Panel {
            title: format!("KV formats: quality vs size ({})", self.model),
            x_label: "KV bytes per token".into(),
            y_label: "ΔPPL vs f16 KV (%)".into(),
            series: vec![series(false, "unrotated"), series(true, "Hadamard-rotated")]
                .into_iter()
                .filter(|s| !s.points.is_empty())
                .collect(),
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_print_back() {
        for s in DEFAULT_SETTINGS.split(',') {
            let parsed: KvSetting = s.parse().unwrap();
            let again: KvSetting = parsed.to_string().parse().unwrap();
            assert_eq!(parsed, again, "{s}");
        }
        let s: KvSetting = "int4+rot".parse().unwrap();
        assert!(s.0.rotate);
        assert_eq!(s.0.k.granularity, ScaleGranularity::PerChannel);
        assert_eq!(s.0.v.granularity, ScaleGranularity::PerToken);
        assert_eq!(s.to_string(), "int4:per-channel:per-token+rot");
    }

    #[test]
    fn bad_settings_are_refused_with_the_reason() {
        let err = "int4:per-tensor".parse::<KvSetting>().unwrap_err();
        assert!(err.contains("per-tensor"), "{err}");
        assert!("int9".parse::<KvSetting>().is_err());
        assert!("int8:per-token:per-token:x".parse::<KvSetting>().is_err());
        assert!("f16:per-token".parse::<KvSetting>().is_err());
    }

    #[test]
    fn rounds_alternate_and_report_medians() {
        assert_eq!(serpentine(3, 1), [0, 1, 2]);
        assert_eq!(serpentine(3, 2), [2, 1, 0]);
        assert_eq!(serpentine(3, 3), [0, 1, 2]);
        assert_eq!(median([Some(3.0), None, Some(1.0), Some(2.0)].into_iter()), Some(2.0));
        assert_eq!(median([None, None].into_iter()), None);
    }
}
