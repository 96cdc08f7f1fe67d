//! `kvrun plan`: the KV-cache arithmetic for a model and a target (context length,
//! concurrency, budget), before anything is loaded. Needs no GPU.

use std::path::Path;

use super::args::{KvFormatArgs, ModelArgs};
use crate::engine::{
    kv_groups_at, model_kv_layout, DEFAULT_MAX_MODEL_LEN_CAP, DEFAULT_STATE_SNAPSHOTS_PER_SEQ,
};
use crate::kv::{parse_bytes, plan, PlanHeads, PlanInput};
use crate::loader::{HfConfigExtras, ModelConfig, ModelFile};

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
    /// Tokens of one step (a prefill chunk): a sliding-window sequence holds the window before
    /// a chunk's first token and the chunk.
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Recurrent models: state snapshot slots for prefix reuse (default 2 per sequence).
    #[arg(long)]
    pub state_snapshots: Option<usize>,
}

/// Parameters of a config, for the weight bytes of a bare config.json.
fn parameter_count(c: &ModelConfig) -> u64 {
    let (d, f, v) = (c.hidden_size as u64, c.intermediate_size as u64, c.vocab_size as u64);
    let h = c.num_heads as u64;
    let attention = match c.mla {
        None => {
            let q = h * c.head_dim as u64;
            let kv = (c.num_kv_heads * c.head_dim) as u64;
            // Qwen3.5's output gate: q_proj holds a gate row for every query row
            let q_proj = if c.attn_output_gate { 2 * d * q } else { d * q };
            // q/k/v biases (Qwen2, gpt-oss); gpt-oss's o bias and attention sinks
            let biases = if c.attention_bias { q + 2 * kv } else { 0 }
                + if c.arch == crate::loader::Architecture::GptOss { d + h } else { 0 };
            q_proj + 2 * d * kv + q * d + biases
        }
        Some(m) => {
            let q_out = h * m.q_head_dim() as u64;
            let q = match m.q_lora_rank {
                Some(r) => d * r as u64 + r as u64 + r as u64 * q_out,
                None => d * q_out,
            };
            let (rank, dv) = (m.kv_lora_rank as u64, m.v_head_dim as u64);
            let kv =
                d * m.latent_width() as u64 + rank + rank * h * (m.qk_nope_head_dim as u64 + dv);
            q + kv + h * dv * d
        }
    };
    // the two sub-layer norms, Gemma's two post-norms, the Q/K norms of Qwen3 and Gemma 3
    let norms = 2 * d
        + if c.post_norms { 2 * d } else { 0 }
        + if c.qk_norm { 2 * c.head_dim as u64 } else { 0 };
    // a mixture of experts: the router and every expert's gate, up and down, the shared
    // expert's and its gate's (Qwen3.5-MoE)
    let moe_mlp = c.moe.map_or(0, |m| {
        let (e, ffn) = (m.experts as u64, m.expert_ffn as u64);
        d * e * (1 + 3 * ffn)
            + 3 * d * m.shared_ffn as u64
            + if m.shared_gate { d } else { 0 }
            // gpt-oss: the router's bias and each expert's gate, up and down biases
            + if m.biases { e + e * (2 * ffn + d) } else { 0 }
    });
    let mlp = 3 * d * f + norms;
    let moe_layers = (0..c.num_layers).filter(|&l| c.is_moe_layer(l)).count() as u64;
    // a Gated DeltaNet layer: q|k|v, z, b, a in; the conv; A_log, dt_bias; the gated norm; out
    let recurrent = c.delta_net.map_or(0, |n| {
        let (conv, value, heads) =
            (n.conv_channels() as u64, n.value_dim() as u64, n.value_heads as u64);
        d * (conv + value + 2 * heads)
            + conv * n.conv_taps as u64
            + 2 * heads
            + n.value_head_dim as u64
            + value * d
    });
    let recurrent_layers = c.num_recurrent_layers() as u64;
    let embeddings = if c.tie_word_embeddings { v * d } else { 2 * v * d };
    embeddings
        + (c.num_layers as u64 - recurrent_layers) * (attention + mlp)
        + recurrent_layers * (recurrent + mlp - if c.qk_norm { 2 * c.head_dim as u64 } else { 0 })
        + moe_layers * moe_mlp
        - moe_layers * 3 * d * f
        + d
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
    /// The weights one token reads: all of them, less the experts it is not routed to (a
    /// mixture of experts reads `experts_used` of `experts`).
    pub active_weight_bytes: u64,
}

/// `total` less the share of `expert_bytes` a token's unchosen experts hold.
fn active_bytes(config: &ModelConfig, total: u64, expert_bytes: u64) -> u64 {
    match config.moe {
        Some(m) => {
            let unused = (m.experts - m.experts_used) as u128;
            total - (expert_bytes as u128 * unused / m.experts as u128) as u64
        }
        None => total,
    }
}

/// Whether a tensor is one expert's or a stack of experts' (GGUF `ffn_gate_exps`, HF
/// `ffn_gate.E` as `loader::hf` names them, transformers' gpt-oss `hf_gate_up_proj`).
fn is_expert_tensor(name: &str) -> bool {
    if name.contains("_exps.")
        || name.contains(".hf_gate_up_proj")
        || name.contains(".hf_down_proj")
    {
        return true;
    }
    let mut parts = name.rsplit('.');
    let (_, expert) = (parts.next(), parts.next());
    expert.is_some_and(|e| e.parse::<usize>().is_ok())
        && ["ffn_gate", "ffn_up", "ffn_down"].contains(&parts.next().unwrap_or(""))
}

/// The model's shape from a `.gguf` file, an HF directory or a bare config.json.
pub fn model_shape(path: &Path) -> anyhow::Result<ModelShape> {
    if path.is_file() && path.extension().is_some_and(|e| e == "json") {
        let json = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let (config, extras) =
            ModelConfig::from_hf_config_json_with_extras(&json).map_err(|e| e.in_file(path))?;
        let bytes = dtype_bytes(&extras);
        let experts = config.moe.map_or(0, |m| {
            let layers = (0..config.num_layers).filter(|&l| config.is_moe_layer(l)).count();
            (layers * m.experts * 3 * m.expert_ffn * config.hidden_size) as u64
        });
        // gpt-oss ships its experts' weights in MXFP4: 17 bytes a block of 32
        let expert_bytes = match extras.quant_method.as_deref() {
            Some("mxfp4") => experts / 32 * 17,
            _ => experts * bytes,
        };
        let weight_bytes = (parameter_count(&config) - experts) * bytes + expert_bytes;
        let active_weight_bytes = active_bytes(&config, weight_bytes, expert_bytes);
        return Ok(ModelShape { config, weight_bytes, active_weight_bytes });
    }
    let file = ModelFile::open(path)?;
    let config = file.config().clone();
    let weight_bytes = file.weight_bytes();
    let mut expert_bytes = 0u64;
    for name in file.tensor_names().into_iter().filter(|n| is_expert_tensor(n)) {
        expert_bytes += file.tensor(name)?.data.len() as u64;
    }
    let active_weight_bytes = active_bytes(&config, weight_bytes, expert_bytes);
    Ok(ModelShape { config, weight_bytes, active_weight_bytes })
}

/// The KV head shapes of a model whose layers have several (Gemma 4), with the bytes a token
/// costs in each and the room its pool blocks have; empty for one shape.
fn head_shapes(
    config: &ModelConfig,
    spec: &crate::quant::KvCacheSpec,
    block_size: usize,
) -> anyhow::Result<Vec<PlanHeads>> {
    let shapes = config.head_shapes();
    if shapes.len() < 2 {
        return Ok(Vec::new());
    }
    let room = crate::quant::pool_heads(spec, block_size, &shapes, config.values_in_keys())?;
    let per_slot = crate::model::layers_per_slot(config);
    let mut out = Vec::new();
    for (&(kv_heads, head_dim), pool_heads) in shapes.iter().zip(room) {
        let storage = crate::engine::kv_storage(spec, block_size, head_dim)?;
        let of_shape: Vec<usize> = (0..config.num_layers)
            .filter(|&l| config.layers[l].attention != crate::loader::AttentionKind::Recurrent)
            .filter(|&l| config.layer_heads(l) == (kv_heads, head_dim))
            .collect();
        let layers = of_shape.len();
        let layers_per_slot = of_shape.iter().map(|&l| per_slot[l]).min().unwrap_or(1);
        let head_block = storage.k.bytes + storage.v.bytes;
        out.push(PlanHeads {
            kv_heads,
            head_dim,
            layers,
            pool_heads,
            layers_per_slot,
            kv_bytes_per_block_per_layer: kv_heads as u64 * head_block,
        });
    }
    Ok(out)
}

pub fn run(args: &PlanArgs) -> anyhow::Result<()> {
    let ModelShape { config, weight_bytes, active_weight_bytes } =
        model_shape(&args.model.path()?)?;
    let spec = args.format.spec()?;
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
    // The groups and the block the engine would use (engine::ResolvedConfig does the same).
    let planned = crate::kv::PlannedContext {
        max_model_len,
        block_size: args.block_size,
        step_tokens: args.max_num_batched_tokens,
    };
    let groups = kv_groups_at(&config, planned, 1);
    let layout = model_kv_layout(&spec, args.block_size, &config, &groups)?;
    let kv_cache_memory = args.kv_cache_memory.as_deref().map(parse_bytes).transpose()?;
    let head_shapes = head_shapes(&config, &spec, args.block_size)?;
    let p = plan(&PlanInput {
        head_shapes,
        layout,
        groups,
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_model_len,
        max_num_seqs: args.max_num_seqs,
        kv_cache_memory,
        weight_bytes,
        active_weight_bytes,
        kv_bytes_per_token_expanded: config.mla.map(|m| {
            let per_head = (m.q_head_dim() + m.v_head_dim) as u64;
            config.num_layers as u64 * config.num_heads as u64 * per_head * 2
        }),
        state_bytes_per_layer: config.delta_net.map_or(0, |d| d.state_bytes()),
        state_layers: config.num_recurrent_layers(),
        // as the engine resolves it (where a layer's buffer would outgrow a binding, the
        // engine keeps fewer; the adapter decides that, plan does not open one)
        state_snapshots: match config.num_recurrent_layers() {
            0 => 0,
            _ => {
                args.state_snapshots.unwrap_or(DEFAULT_STATE_SNAPSHOTS_PER_SEQ * args.max_num_seqs)
            }
        },
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
        return Ok(());
    }
    print!("{p}");
    Ok(())
}
