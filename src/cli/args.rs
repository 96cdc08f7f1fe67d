//! Flag groups shared by several subcommands (names mirror vLLM and llama.cpp).

use std::path::PathBuf;

use crate::engine::{default_model_path, EngineConfig};
use crate::gpu::GpuOptions;
use crate::kernels::KernelFamily;
use crate::kv::parse_bytes;
use crate::quant::{KvCacheSpec, KvFormat, ScaleGranularity};

/// The model to load.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A .gguf file or an HF directory (config.json, *.safetensors, tokenizer.json).
    /// Default: $KVRUN_MODEL, else the model scripts/fetch-models.sh fetches.
    #[arg(short, long)]
    pub model: Option<PathBuf>,
}

impl ModelArgs {
    /// The model path, or an error that says how to get the default model.
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        if let Some(p) = &self.model {
            return Ok(p.clone());
        }
        let p = default_model_path();
        if !p.exists() {
            anyhow::bail!(
                "no model given (-m) and the default model {} is missing; run scripts/fetch-models.sh \
                 or pass -m PATH",
                p.display()
            );
        }
        Ok(p)
    }
}

/// KV cache and context sizing.
#[derive(clap::Args, Debug, Clone)]
pub struct KvArgs {
    /// Context length per sequence (prompt + output). Default: the model's, at most 8192.
    #[arg(short = 'c', long = "max-model-len")]
    pub max_model_len: Option<usize>,
    /// KV cache budget, e.g. 256MiB, 6GiB. Default: what the sequences at full length need.
    #[arg(long, value_parser = parse_budget, conflicts_with = "gpu_memory_utilization")]
    pub kv_cache_memory: Option<u64>,
    /// Size the KV cache from the adapter's memory instead (vLLM's flag): this fraction of
    /// the budget `kvrun info` reports, less the weights and activations, e.g. 0.9. Without
    /// -c, the context is fitted to the pool where it holds less than the default.
    #[arg(long)]
    pub gpu_memory_utilization: Option<f64>,
    /// Host RAM for KV blocks the GPU pool evicts, e.g. 4GiB (vLLM's flag): a prefix that
    /// comes back (a conversation's next turn, a preempted sequence) is copied in, not
    /// recomputed. Needs the prefix cache; not yet for sliding-window or recurrent models.
    #[arg(long, value_parser = parse_budget)]
    pub kv_offloading_size: Option<u64>,
    /// Keep KV blocks in this folder across restarts (a system prompt's KV survives the
    /// process): what the host tier drops and, at shutdown, the cached blocks. Damaged or
    /// foreign files are recomputed, with a warning. Brings a host tier of up to 1 GiB when
    /// --kv-offloading-size is not given.
    #[arg(long, value_name = "DIR")]
    pub kv_cache_dir: Option<PathBuf>,
    /// Most bytes --kv-cache-dir holds, e.g. 20GiB (default 4GiB); the least recently used
    /// blocks go first.
    #[arg(long, value_parser = parse_budget, requires = "kv_cache_dir")]
    pub kv_cache_dir_size: Option<u64>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Most tokens computed in one step (the prefill chunk size).
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    /// Do not reuse KV blocks of earlier requests that share a prefix (for comparison).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Recurrent models (Qwen3.5): state slots kept for prefix-cache snapshots, one sequence's
    /// states each (`kvrun plan` prints their bytes); 0 turns prefix reuse off for them.
    /// Default: 2 per --max-num-seqs.
    #[arg(long)]
    pub state_snapshots: Option<usize>,
    /// A Jinja chat template to use instead of the model's (llama-server's flag).
    #[arg(long)]
    pub chat_template_file: Option<PathBuf>,
    #[command(flatten)]
    pub format: KvFormatArgs,
    /// Kernel variants: auto (chosen from the adapter) or gpu (the discrete-GPU variants —
    /// tiled linear, workgroup attention — forced on any adapter, to compare them).
    #[arg(long, default_value = "auto", value_parser = parse_family)]
    pub kernel_family: KernelFamily,
}

fn parse_family(s: &str) -> Result<KernelFamily, String> {
    match s {
        "auto" => Ok(KernelFamily::Auto),
        "gpu" => Ok(KernelFamily::Gpu),
        other => Err(format!("unknown kernel family '{other}' (auto, gpu)")),
    }
}

/// How K and V are stored.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct KvFormatArgs {
    /// KV storage format: f16, fp8-e4m3, fp8-e5m2, int8, int4.
    #[arg(long, default_value = "f16")]
    pub kv_cache_dtype: KvFormat,
    /// K scale granularity: per-tensor (fp8 only), per-channel, per-token, per-head.
    /// Default for quantized formats: per-channel (within each head).
    #[arg(long)]
    pub kv_k_scale: Option<ScaleGranularity>,
    /// V scale granularity: per-tensor (fp8 only), per-channel, per-token, per-head.
    /// Default for quantized formats: per-token.
    #[arg(long)]
    pub kv_v_scale: Option<ScaleGranularity>,
    /// Rotate K, Q and V by an orthonormal Hadamard transform per head before storing KV
    /// (spreads outlier channels before quantization; scores are unchanged).
    #[arg(long)]
    pub kv_rotate: bool,
}

fn parse_budget(s: &str) -> Result<u64, String> {
    parse_bytes(s).map_err(|e| e.to_string())
}

impl KvArgs {
    /// An engine configuration for `model` with these sizes and `max_num_seqs` sequences.
    pub fn engine_config(
        &self,
        model: PathBuf,
        gpu: GpuOptions,
        max_num_seqs: usize,
    ) -> anyhow::Result<EngineConfig> {
        Ok(EngineConfig {
            model,
            gpu,
            block_size: self.block_size,
            kv_cache_memory: self.kv_cache_memory,
            gpu_memory_utilization: self.gpu_memory_utilization,
            gpu_memory_utilization_default: None,
            kv_offloading_size: self.kv_offloading_size,
            kv_cache_dir: self.kv_cache_dir.clone(),
            kv_cache_dir_size: self.kv_cache_dir_size,
            max_model_len: self.max_model_len,
            max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_logit_rows: None,
            kv_cache: self.kv_cache_spec()?,
            enable_prefix_cache: !self.no_prefix_cache,
            state_snapshots: self.state_snapshots,
            chat_template_file: self.chat_template_file.clone(),
            tenants: Vec::new(),
            kernel_family: self.kernel_family,
        })
    }

    /// The KV format flags as one checked spec (bad combinations are refused here).
    pub fn kv_cache_spec(&self) -> anyhow::Result<KvCacheSpec> {
        self.format.spec()
    }
}

impl KvFormatArgs {
    /// The flags as one checked spec (bad combinations are refused here).
    pub fn spec(&self) -> anyhow::Result<KvCacheSpec> {
        Ok(KvCacheSpec::new(self.kv_cache_dtype, self.kv_k_scale, self.kv_v_scale, self.kv_rotate)?)
    }
}

/// Sampling flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 256)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub filters: SamplingFilterArgs,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    pub fn params(&self) -> crate::sample::SamplingParams {
        crate::sample::SamplingParams {
            seed: self.seed,
            max_tokens: self.max_tokens,
            ..self.filters.params()
        }
    }
}

/// How each token is picked: the flags `generate`, `chat` and `bench decode` share.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingFilterArgs {
    /// Softmax temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the k most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the most likely tokens up to this probability mass.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than this fraction of the most likely one (0–1).
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Penalize tokens already in the prompt or the output (> 0; 1 = off; llama.cpp's
    /// --repeat-penalty, over the whole sequence).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
}

impl SamplingFilterArgs {
    /// These flags over the defaults (seed 0).
    pub fn params(&self) -> crate::sample::SamplingParams {
        crate::sample::SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            ..crate::sample::SamplingParams::default()
        }
    }
}
