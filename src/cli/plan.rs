//! `kvrun plan`: the KV-cache arithmetic for a model and a target (context length,
//! concurrency, budget), before anything is loaded. Needs no GPU.

use std::path::Path;

use super::args::{KvFormatArgs, ModelArgs};
use crate::engine::{kv_storage, DEFAULT_MAX_MODEL_LEN_CAP};
use crate::kv::{parse_bytes, plan, KvLayout, PlanInput};
use crate::loader::{AttentionKind, HfConfigExtras, ModelConfig, ModelFile};

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
    /// The KV format (`--kv-rotate` changes no size; it is accepted so a run's flags can be
    /// planned as they are).
    #[command(flatten)]
    pub format: KvFormatArgs,
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

/// What `plan` knows about a model before loading it.
pub struct ModelShape {
    pub config: ModelConfig,
    /// Exact for model files, estimated from `torch_dtype` for a bare config.json.
    pub weight_bytes: u64,
    /// The window when every layer slides over the same one (Mistral v0.1): `plan` sizes the
    /// KV cache with at most `window` tokens (+ one block of slack) per sequence. Mixed layers
    /// (Gemma 3) are planned as full attention until the plan is per KV-cache group.
    pub sliding_window: Option<usize>,
}

/// The model's shape from a `.gguf` file, an HF directory or a bare config.json.
pub fn model_shape(path: &Path) -> anyhow::Result<ModelShape> {
    if path.is_file() && path.extension().is_some_and(|e| e == "json") {
        let json = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let (config, extras) =
            ModelConfig::from_hf_config_json_with_extras(&json).map_err(|e| e.in_file(path))?;
        let weight_bytes = parameter_count(&config) * dtype_bytes(&extras);
        let sliding_window = uniform_window(&config);
        return Ok(ModelShape { config, weight_bytes, sliding_window });
    }
    let file = ModelFile::open(path)?;
    Ok(ModelShape {
        config: file.config().clone(),
        weight_bytes: file.weight_bytes(),
        sliding_window: uniform_window(file.config()),
    })
}

/// The window every layer slides over, when they all share one.
fn uniform_window(c: &ModelConfig) -> Option<usize> {
    let mut windows = c.layers.iter().map(|l| match l.attention {
        AttentionKind::Sliding { window } => Some(window),
        AttentionKind::Full => None,
    });
    let first = windows.next()??;
    windows.all(|w| w == Some(first)).then_some(first)
}

/// The `plan --json` object: the [`Plan`] keys, plus `sliding_window` where the model has one.
#[derive(serde::Serialize)]
struct PlanJson {
    #[serde(flatten)]
    plan: crate::kv::Plan,
    #[serde(skip_serializing_if = "Option::is_none")]
    sliding_window: Option<usize>,
}

pub fn run(args: &PlanArgs) -> anyhow::Result<()> {
    let ModelShape { config, weight_bytes, sliding_window } = model_shape(&args.model.path()?)?;
    let spec = args.format.spec()?;
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
    let model_len = config.max_position_embeddings;
    if max_model_len > model_len {
        anyhow::bail!(
            "-c {max_model_len} exceeds the model's context length of {model_len} tokens; use at \
             most {model_len}"
        );
    }
    let kv_cache_memory = args.kv_cache_memory.as_deref().map(parse_bytes).transpose()?;
    // A sliding-window sequence holds at most `window` tokens of KV plus one block of slack
    // (DESIGN.md); the plan counts that many and still reports the context asked for.
    let kv_tokens_per_sequence = match sliding_window {
        Some(window) => max_model_len.min(window + args.block_size),
        None => max_model_len,
    };
    let mut p = plan(&PlanInput {
        layout,
        max_model_len: kv_tokens_per_sequence,
        max_num_seqs: args.max_num_seqs,
        kv_cache_memory,
        weight_bytes,
    })?;
    p.max_model_len = max_model_len;
    if args.json {
        let json = PlanJson { plan: p, sliding_window };
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    print!("{p}");
    if let Some(window) = sliding_window {
        let held = if kv_tokens_per_sequence < max_model_len {
            format!(
                "a sequence holds at most {kv_tokens_per_sequence} tokens of KV (the window + \
                 one block)"
            )
        } else {
            format!("-c {max_model_len} fits in the window, which changes nothing here")
        };
        println!(
            "note: sliding_window {window}: {held}; kvrun cannot run sliding-window models yet"
        );
    }
    Ok(())
}
