//! `kvrun plan`: the KV-cache arithmetic for a model and a target (context length,
//! concurrency, budget), before anything is loaded. Needs no GPU.

use std::path::Path;

use super::args::ModelArgs;
use crate::engine::{kv_storage, DEFAULT_MAX_MODEL_LEN_CAP};
use crate::kv::{parse_bytes, plan, KvLayout, PlanInput};
use crate::loader::{HfConfigExtras, ModelConfig, ModelFile};
use crate::quant::{KvCacheSpec, KvFormat, ScaleGranularity};

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// A .gguf file, an HF directory, or a bare config.json.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Context length per sequence. Default: the model's, at most 8192.
    #[arg(short = 'c', long)]
    pub max_model_len: Option<usize>,
    /// Concurrent sequences to plan for.
    #[arg(long, default_value_t = 1)]
    pub max_num_seqs: usize,
    /// KV budget (e.g. 6GiB). Default: what max_num_seqs full sequences need.
    #[arg(long)]
    pub kv_cache_memory: Option<String>,
    /// KV storage format: f16, fp8-e4m3, fp8-e5m2, int8, int4.
    #[arg(long, default_value = "f16")]
    pub kv_cache_dtype: KvFormat,
    /// K scale granularity: per-tensor (fp8 only), per-channel, per-token, per-head.
    /// Default for quantized dtypes: per-channel.
    #[arg(long)]
    pub kv_k_scale: Option<ScaleGranularity>,
    /// V scale granularity: per-tensor (fp8 only), per-channel, per-token, per-head.
    /// Default for quantized dtypes: per-token.
    #[arg(long)]
    pub kv_v_scale: Option<ScaleGranularity>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Parameters of a Llama-family config, for the weight bytes of a bare config.json.
fn parameter_count(c: &ModelConfig) -> u64 {
    let (d, f, v) = (c.hidden_size as u64, c.intermediate_size as u64, c.vocab_size as u64);
    let q = (c.num_heads * c.head_dim) as u64;
    let kv = (c.num_kv_heads * c.head_dim) as u64;
    let per_layer = d * q + 2 * d * kv + q * d + 3 * d * f + 2 * d;
    let embeddings = if c.tie_word_embeddings { v * d } else { 2 * v * d };
    embeddings + c.num_layers as u64 * per_layer + d
}

fn dtype_bytes(extras: &HfConfigExtras) -> u64 {
    match extras.torch_dtype.as_deref() {
        Some("float32") => 4,
        _ => 2,
    }
}

/// The model's config and weight bytes (exact for files, estimated from the dtype for a config).
pub fn model_shape(path: &Path) -> anyhow::Result<(ModelConfig, u64)> {
    if path.is_file() && path.extension().is_some_and(|e| e == "json") {
        let json = std::fs::read_to_string(path)?;
        let (config, extras) = ModelConfig::from_hf_config_json_with_extras(&json)?;
        let bytes = parameter_count(&config) * dtype_bytes(&extras);
        return Ok((config, bytes));
    }
    let file = ModelFile::open(path)?;
    Ok((file.config().clone(), file.weight_bytes()))
}

pub fn run(args: &PlanArgs) -> anyhow::Result<()> {
    let (config, weight_bytes) = model_shape(&args.model.path()?)?;
    let spec = KvCacheSpec::new(args.kv_cache_dtype, args.kv_k_scale, args.kv_v_scale, false)?;
    let storage = kv_storage(&spec, args.block_size, config.head_dim)?;
    let layout = KvLayout::new(
        config.num_layers,
        config.num_kv_heads,
        config.head_dim,
        args.block_size,
        storage,
    )?;
    let max_model_len = args
        .max_model_len
        .unwrap_or_else(|| config.max_position_embeddings.min(DEFAULT_MAX_MODEL_LEN_CAP));
    let kv_cache_memory = args.kv_cache_memory.as_deref().map(parse_bytes).transpose()?;
    let p = plan(&PlanInput {
        layout,
        max_model_len,
        max_num_seqs: args.max_num_seqs,
        kv_cache_memory,
        weight_bytes,
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else {
        print!("{p}");
    }
    Ok(())
}
