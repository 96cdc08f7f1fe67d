//! [`ModelConfig`] from an HF `config.json`: Llama, Mistral, Qwen2, Qwen3, and Gemma 3 (flat
//! `Gemma3ForCausalLM`, or `Gemma3ForConditionalGeneration` with the text model under
//! `text_config`), each layer's attention kind and RoPE as `transformers` derives them.

use super::config::{
    inv_sqrt, token_id_list, yarn_mscale, Activation, Architecture, AttentionKind, DeltaNet,
    GlobalLayers, HfConfigExtras, LayerSpec, Mla, ModelConfig, MoeScoring, Rope, RopeScaling,
    RopeStyle, SUPPORTED,
};
use super::error::LoadError;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The fields of an HF `config.json` (or its `text_config`) kvrun reads.
#[derive(Deserialize)]
struct HfConfigJson {
    hidden_size: usize,
    /// 0 when absent (Qwen3.5-MoE has no dense MLP; a dense model without it is refused)
    #[serde(default)]
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    max_position_embeddings: Option<usize>,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    /// Qwen2: layers from this index on use the window (when `use_sliding_window`).
    max_window_layers: Option<usize>,
    /// Newer configs: `"sliding_attention"` / `"full_attention"` per layer.
    layer_types: Option<Vec<String>>,
    rope_scaling: Option<Value>,
    /// transformers ≥ 5: `{rope_type, rope_theta, …}`, or one such dict per layer type.
    rope_parameters: Option<Value>,
    // Gemma 3 (defaults filled in from `Gemma3TextConfig` before parsing)
    hidden_activation: Option<String>,
    query_pre_attn_scalar: Option<f64>,
    rope_local_base_freq: Option<f64>,
    sliding_window_pattern: Option<usize>,
    // DeepSeek-V2/V3 (MLA, MoE)
    q_lora_rank: Option<usize>,
    kv_lora_rank: Option<usize>,
    qk_nope_head_dim: Option<usize>,
    qk_rope_head_dim: Option<usize>,
    v_head_dim: Option<usize>,
    n_routed_experts: Option<usize>,
    first_k_dense_replace: Option<usize>,
    moe_layer_freq: Option<usize>,
    // Qwen3-MoE
    num_experts: Option<usize>,
    /// transformers ≥ 5 writes Qwen3-MoE's `num_experts` under this name
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    // DeepSeek-V2's MoEGate
    n_shared_experts: Option<usize>,
    // Qwen3.5-MoE's shared expert
    shared_expert_intermediate_size: Option<usize>,
    // gpt-oss's clamped SwiGLU
    swiglu_alpha: Option<f64>,
    swiglu_limit: Option<f64>,
    routed_scaling_factor: Option<f64>,
    topk_method: Option<String>,
    scoring_func: Option<String>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    /// DeepSeek-V3: RoPE pairs adjacent channels (true, the default) or halves
    rope_interleave: Option<bool>,
    // Qwen3.5 (Gated DeltaNet layers)
    linear_conv_kernel_dim: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    full_attention_interval: Option<usize>,
    partial_rotary_factor: Option<f64>,
    // Gemma 4 (defaults filled in from `Gemma4TextConfig` before parsing)
    attention_k_eq_v: Option<bool>,
    final_logit_softcapping: Option<f64>,
    hidden_size_per_layer_input: Option<usize>,
    num_kv_shared_layers: Option<usize>,
    enable_moe_block: Option<bool>,
    /// Gemma 3 writes a bool, Gemma 4 `"vision"` / `"all"`
    use_bidirectional_attention: Option<Value>,
    /// `{layer index: {head_dim, num_key_value_heads}}` as transformers saves it, or the
    /// `global_head_dim` / `num_global_key_value_heads` it is built from
    per_layer_config: Option<Map<String, Value>>,
    global_head_dim: Option<usize>,
    num_global_key_value_heads: Option<usize>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<Value>,
}

/// `Gemma3TextConfig`'s defaults (transformers 4.50+) for the keys Google's configs omit, most
/// visibly in the `text_config` of `Gemma3ForConditionalGeneration` (gemma-3-4b-it …).
const GEMMA3_TEXT_DEFAULTS: &str = r#"{
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
    "rope_theta": 1000000.0, "attention_bias": false, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6,
    "bos_token_id": 2, "eos_token_id": 1
}"#;

/// `Gemma4TextConfig`'s defaults (transformers 5.2x) for the keys a config may omit. Its
/// `hidden_size_per_layer_input` default (256: per-layer embeddings) is refused.
const GEMMA4_TEXT_DEFAULTS: &str = r#"{
    "vocab_size": 262144, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
    "attention_bias": false, "sliding_window": 512, "hidden_size_per_layer_input": 256,
    "attention_k_eq_v": false, "num_kv_shared_layers": 0, "enable_moe_block": false,
    "bos_token_id": 2, "eos_token_id": 1
}"#;

fn json_error(e: impl std::fmt::Display) -> LoadError {
    LoadError::config(format!(
        "config.json is not a Llama/Qwen2/Qwen3/Gemma3-style config ({e}); pass the model's own \
         config.json"
    ))
}

/// See [`ModelConfig::from_hf_config_json_with_extras`].
pub(super) fn parse(json: &str) -> Result<(ModelConfig, HfConfigExtras), LoadError> {
    let top: Value = serde_json::from_str(json).map_err(json_error)?;
    let arch_name = top
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let arch = match arch_name.as_str() {
        "LlamaForCausalLM" | "MistralForCausalLM" => Architecture::Llama,
        "Qwen2ForCausalLM" => Architecture::Qwen2,
        "Qwen3ForCausalLM" => Architecture::Qwen3,
        "Qwen3MoeForCausalLM" => Architecture::Qwen3Moe,
        "GptOssForCausalLM" => Architecture::GptOss,
        "Gemma3ForCausalLM" | "Gemma3ForConditionalGeneration" => Architecture::Gemma3,
        "Gemma4ForCausalLM" | "Gemma4ForConditionalGeneration" => Architecture::Gemma4,
        "DeepseekV2ForCausalLM" | "DeepseekV3ForCausalLM" => Architecture::Deepseek2,
        "Qwen3_5ForCausalLM"
        | "Qwen3_5ForConditionalGeneration"
        | "Qwen3_5MoeForCausalLM"
        | "Qwen3_5MoeForConditionalGeneration" => Architecture::Qwen35,
        other => {
            return Err(LoadError::UnsupportedArchitecture {
                found: if other.is_empty() { "(none given)" } else { other }.to_string(),
                supported: SUPPORTED,
            })
        }
    };
    let mut text = match arch_name.as_str() {
        "Gemma3ForConditionalGeneration"
        | "Gemma4ForConditionalGeneration"
        | "Qwen3_5ForConditionalGeneration"
        | "Qwen3_5MoeForConditionalGeneration" => match top.get("text_config") {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        },
        _ => top.as_object().cloned().unwrap_or_default(),
    };
    let defaults = match arch {
        Architecture::Gemma3 => Some(GEMMA3_TEXT_DEFAULTS),
        Architecture::Gemma4 => Some(GEMMA4_TEXT_DEFAULTS),
        _ => None,
    };
    if let Some(defaults) = defaults {
        let defaults: Map<String, Value> = serde_json::from_str(defaults).expect("valid defaults");
        for (key, value) in defaults {
            text.entry(key).or_insert(value);
        }
    }
    let c: HfConfigJson = serde_json::from_value(Value::Object(text)).map_err(json_error)?;
    super::config::check_num_layers(c.num_hidden_layers, "num_hidden_layers")?;
    let config = match arch {
        Architecture::Gemma3 => gemma3(&c)?,
        Architecture::Gemma4 => gemma4(&c)?,
        Architecture::Deepseek2 => deepseek2(&c, arch_name == "DeepseekV3ForCausalLM")?,
        Architecture::Qwen35 if arch_name.starts_with("Qwen3_5Moe") => qwen35moe(&c)?,
        Architecture::Qwen35 => qwen35(&c)?,
        Architecture::Qwen3Moe => qwen3moe(&c)?,
        Architecture::GptOss => gpt_oss(&c)?,
        _ => llama_like(arch, &c)?,
    };
    config.validate()?;
    // the outer config of a multimodal model carries dtype and special tokens
    let outer = |key: &str| top.get(key).filter(|v| !v.is_null());
    let extras = HfConfigExtras {
        torch_dtype: outer("torch_dtype")
            .or_else(|| outer("dtype"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .or(c.torch_dtype)
            .or(c.dtype),
        bos_token_id: outer("bos_token_id")
            .and_then(Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
            .or(c.bos_token_id),
        eos_token_ids: match outer("eos_token_id") {
            Some(v) => token_id_list(Some(v)),
            None => token_id_list(c.eos_token_id.as_ref()),
        },
        quant_method: outer("quantization_config")
            .and_then(|q| q.get("quant_method"))
            .and_then(Value::as_str)
            .map(str::to_string),
    };
    Ok((config, extras))
}

/// The shape fields every architecture shares, with Llama's quirks.
fn base(arch: Architecture, c: &HfConfigJson, layers: Vec<LayerSpec>) -> ModelConfig {
    let head_dim = c.head_dim.unwrap_or(c.hidden_size / c.num_attention_heads.max(1));
    ModelConfig {
        arch,
        hidden_size: c.hidden_size,
        intermediate_size: c.intermediate_size,
        num_layers: c.num_hidden_layers,
        num_heads: c.num_attention_heads,
        num_kv_heads: c.num_key_value_heads.unwrap_or(c.num_attention_heads),
        head_dim,
        vocab_size: c.vocab_size,
        rms_norm_eps: c.rms_norm_eps.unwrap_or(1e-6) as f32,
        layers,
        // HF safetensors weights are not permuted: rotate_half pairs for every arch.
        rope_style: RopeStyle::Neox,
        max_position_embeddings: c.max_position_embeddings.unwrap_or(2048),
        tie_word_embeddings: c.tie_word_embeddings,
        attention_bias: arch == Architecture::Qwen2 || c.attention_bias,
        // Qwen3Attention: q_norm, k_norm over each head before RoPE
        qk_norm: matches!(arch, Architecture::Qwen3 | Architecture::Qwen3Moe),
        activation: Activation::Silu,
        embedding_scale: None,
        post_norms: false,
        attention_scale: inv_sqrt(head_dim),
        norm_weight_offset: 0.0,
        rope_freq_factors: None,
        mla: None,
        rotary_dims: None,
        moe_layers: 0,
        moe: None,
        delta_net: None,
        attn_output_gate: false,
        global_layers: None,
        final_logit_softcap: None,
    }
}

/// Llama, Mistral, Qwen2, Qwen3: one RoPE; full attention unless a window applies. Mistral
/// (v0.1) slides every layer over `sliding_window` tokens (`use_sliding_window` absent = on);
/// Qwen2 and Qwen3 only with `use_sliding_window: true`, and then only layers
/// `max_window_layers..` (HF `Qwen2Config.layer_types`, `Qwen3Config.layer_types`). A
/// `layer_types` list, when given, decides instead.
fn llama_like(arch: Architecture, c: &HfConfigJson) -> Result<ModelConfig, LoadError> {
    let max_pos = c.max_position_embeddings.unwrap_or(2048);
    let (theta, params) = rope_params(c, "full_attention")?;
    let rope = hf_rope(theta, params, max_pos)?;
    let window_on = c.use_sliding_window.unwrap_or(arch == Architecture::Llama);
    let window = c.sliding_window.filter(|_| window_on);
    let first_sliding = match arch {
        Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Qwen3Moe => {
            c.max_window_layers.unwrap_or(28)
        }
        _ => 0,
    };
    let kinds = match &c.layer_types {
        Some(types) => layer_types(types, c.num_hidden_layers, c.sliding_window, max_pos)?,
        None => (0..c.num_hidden_layers)
            .map(|i| match window {
                Some(w) if i >= first_sliding => sliding(w, max_pos),
                _ => AttentionKind::Full,
            })
            .collect(),
    };
    let layers = kinds.into_iter().map(|attention| LayerSpec { attention, rope }).collect();
    Ok(base(arch, c, layers))
}

/// gpt-oss (`GptOssConfig`): Llama's layer with q/k/v/o biases (`attention_bias`, true by
/// default) and attention sinks, `layer_types` sliding and full in turn over `sliding_window`,
/// YaRN as `rope_parameters` says (gpt-oss: truncate false), every MLP `num_local_experts`
/// biased experts of `intermediate_size`, `num_experts_per_tok` a token (softmax over the
/// chosen logits: renormalised softmax), the clamped SwiGLU of `swiglu_alpha` 1.702 and
/// `swiglu_limit` 7 (other values are refused: the kernel's are constants).
fn gpt_oss(c: &HfConfigJson) -> Result<ModelConfig, LoadError> {
    let (alpha, limit) = (c.swiglu_alpha.unwrap_or(1.702), c.swiglu_limit.unwrap_or(7.0));
    if (alpha - 1.702).abs() > 1e-9 || (limit - 7.0).abs() > 1e-9 {
        return Err(LoadError::config(format!(
            "gpt-oss swiglu_alpha {alpha} / swiglu_limit {limit}: kvrun runs gpt-oss's 1.702 and \
             7 only"
        )));
    }
    let need = |v: Option<usize>, key: &str| {
        v.ok_or_else(|| LoadError::config(format!("a gpt-oss config.json lacks {key}")))
    };
    let mut config = llama_like(Architecture::GptOss, c)?;
    config.attention_bias = true;
    config.activation = Activation::SwigluOai;
    config.moe = Some(super::config::Moe {
        biases: true,
        ..super::config::Moe::every_layer(
            need(c.num_local_experts.or(c.num_experts), "num_local_experts")?,
            need(c.num_experts_per_tok, "num_experts_per_tok")?,
            c.intermediate_size,
            true,
        )
    });
    config.moe_layers = config.num_layers;
    Ok(config)
}

/// Qwen3-MoE (`Qwen3MoeConfig`): Qwen3's attention, every layer's MLP `num_experts` experts of
/// `moe_intermediate_size` channels, `num_experts_per_tok` a token, `norm_topk_prob`
/// (transformers' default: false). Dense layers among them (`mlp_only_layers`,
/// `decoder_sparse_step` > 1) are refused: no published checkpoint has them.
fn qwen3moe(c: &HfConfigJson) -> Result<ModelConfig, LoadError> {
    let mut config = llama_like(Architecture::Qwen3Moe, c)?;
    let dense = c.mlp_only_layers.as_ref().is_some_and(|l| !l.is_empty());
    if dense || c.decoder_sparse_step.unwrap_or(1) != 1 {
        return Err(LoadError::config(
            "a Qwen3-MoE config with dense layers (mlp_only_layers, decoder_sparse_step > 1) is \
             not supported: kvrun runs Qwen3-MoE with experts in every layer",
        ));
    }
    let need = |v: Option<usize>, key: &str| {
        v.ok_or_else(|| LoadError::config(format!("Qwen3-MoE config.json lacks {key}")))
    };
    config.moe = Some(super::config::Moe::every_layer(
        need(c.num_experts.or(c.num_local_experts), "num_experts")?,
        need(c.num_experts_per_tok, "num_experts_per_tok")?,
        need(c.moe_intermediate_size, "moe_intermediate_size")?,
        c.norm_topk_prob.unwrap_or(false),
    ));
    config.moe_layers = config.num_layers;
    Ok(config)
}

/// Gemma 3: five sliding layers (RoPE base `rope_local_base_freq`, never scaled) for every
/// full one (`rope_theta`, with `rope_scaling`), Q/K norms, GELU-tanh, `sqrt(hidden)` embedding
/// scale, post-norms, softmax scale `1/sqrt(query_pre_attn_scalar)`, RMSNorm `x · (1 + w)`.
fn gemma3(c: &HfConfigJson) -> Result<ModelConfig, LoadError> {
    let max_pos = c.max_position_embeddings.unwrap_or(131_072);
    let kinds = match &c.layer_types {
        Some(types) => layer_types(types, c.num_hidden_layers, c.sliding_window, max_pos)?,
        None => {
            let pattern = c.sliding_window_pattern.unwrap_or(6).max(1);
            let window = c.sliding_window.unwrap_or(4096);
            (0..c.num_hidden_layers)
                .map(|i| match (i + 1) % pattern {
                    0 => AttentionKind::Full,
                    _ => sliding(window, max_pos),
                })
                .collect()
        }
    };
    let (theta, params) = rope_params(c, "full_attention")?;
    let global = hf_rope(theta, params, max_pos)?;
    let local = match rope_params(c, "sliding_attention")? {
        // transformers ≥ 5 gives the local RoPE its own dict
        (theta, Some(p)) if c.rope_parameters.as_ref().is_some_and(per_layer_type) => {
            hf_rope(theta, Some(p), max_pos)?
        }
        _ => Rope { theta: c.rope_local_base_freq.unwrap_or(10_000.0), scaling: RopeScaling::None },
    };
    let layers = kinds
        .into_iter()
        .map(|attention| {
            let rope = if attention == AttentionKind::Full { global } else { local };
            LayerSpec { attention, rope }
        })
        .collect();
    match c.hidden_activation.as_deref() {
        Some("gelu_pytorch_tanh" | "gelu_tanh") | None => {}
        Some(other) => {
            return Err(LoadError::config(format!(
                "Gemma 3 with hidden_activation '{other}' is not supported (kvrun runs \
                 gelu_pytorch_tanh); use the model's original config.json"
            )))
        }
    }
    let scalar = c.query_pre_attn_scalar.unwrap_or(256.0);
    Ok(ModelConfig {
        qk_norm: true,
        activation: Activation::GeluTanh,
        embedding_scale: Some((c.hidden_size as f64).sqrt() as f32),
        post_norms: true,
        attention_scale: (1.0 / scalar.sqrt()) as f32,
        norm_weight_offset: 1.0,
        max_position_embeddings: max_pos,
        ..base(Architecture::Gemma3, c, layers)
    })
}

/// Gemma 4 (dense text) as `modeling_gemma4.py` defines it: Gemma 3's layers (sliding and
/// full by `layer_types`, every sixth full by default) with the full layers' head size and KV
/// heads from `per_layer_config` (or `global_head_dim` / `num_global_key_value_heads`, the
/// latter only with `attention_k_eq_v`, as `Gemma4TextConfig` builds it), RoPE per layer type
/// (proportional on the full layers), attention scale 1, plain `x · w` norms, the final logit
/// soft-cap. Per-layer embeddings, KV sharing, MoE blocks and bidirectional attention are
/// refused by name.
fn gemma4(c: &HfConfigJson) -> Result<ModelConfig, LoadError> {
    let refuse = |what: &str| {
        Err(LoadError::config(format!(
            "this Gemma 4 config uses {what}, which kvrun does not run yet (it runs the dense \
             Gemma 4 text models: 12B/31B-style, no per-layer embeddings, KV sharing or MoE)"
        )))
    };
    if c.hidden_size_per_layer_input.unwrap_or(0) > 0 {
        return refuse("per-layer embeddings (hidden_size_per_layer_input, the E-series)");
    }
    if c.num_kv_shared_layers.unwrap_or(0) > 0 {
        return refuse("KV sharing across layers (num_kv_shared_layers)");
    }
    if c.enable_moe_block == Some(true) {
        return refuse("mixture-of-experts blocks (enable_moe_block, 26B-A4B)");
    }
    if c.use_bidirectional_attention.as_ref().and_then(Value::as_str) == Some("all") {
        return refuse("bidirectional attention (use_bidirectional_attention = all)");
    }
    let max_pos = c.max_position_embeddings.unwrap_or(131_072);
    let window = c.sliding_window.unwrap_or(512);
    let kinds = match &c.layer_types {
        Some(types) => layer_types(types, c.num_hidden_layers, Some(window), max_pos)?,
        None => (0..c.num_hidden_layers)
            .map(|i| match (i + 1) % 6 {
                0 => AttentionKind::Full,
                _ => sliding(window, max_pos),
            })
            .collect(),
    };
    // transformers forces the last layer to full attention
    let mut kinds = kinds;
    if let Some(last) = kinds.last_mut() {
        *last = AttentionKind::Full;
    }
    let rope_of = |layer_type: &str, default_theta: f64| -> Result<Rope, LoadError> {
        match c.rope_parameters.as_ref().filter(|p| per_layer_type(p)) {
            Some(p) => {
                let params = p.get(layer_type).filter(|v| !v.is_null());
                let theta = match params.and_then(|p| p.get("rope_theta")) {
                    None => default_theta,
                    Some(v) => {
                        v.as_f64().ok_or_else(|| bad_value("rope_parameters", "rope_theta", v))?
                    }
                };
                hf_rope(theta, params, max_pos)
            }
            None => Ok(Rope {
                theta: default_theta,
                scaling: match layer_type {
                    "full_attention" => {
                        RopeScaling::Proportional { partial_rotary_factor: 0.25, factor: 1.0 }
                    }
                    _ => RopeScaling::None,
                },
            }),
        }
    };
    let global = rope_of("full_attention", 1_000_000.0)?;
    let local = rope_of("sliding_attention", 10_000.0)?;
    let layers = kinds
        .into_iter()
        .map(|attention| {
            let rope = if attention == AttentionKind::Full { global } else { local };
            LayerSpec { attention, rope }
        })
        .collect::<Vec<_>>();
    match c.hidden_activation.as_deref() {
        Some("gelu_pytorch_tanh" | "gelu_tanh") | None => {}
        Some(other) => {
            return Err(LoadError::config(format!(
                "Gemma 4 with hidden_activation '{other}' is not supported (kvrun runs \
                 gelu_pytorch_tanh); use the model's original config.json"
            )))
        }
    }
    let k_eq_v = c.attention_k_eq_v.unwrap_or(false);
    let base = base(Architecture::Gemma4, c, layers);
    let global_shape = gemma4_global_shape(c, &base, k_eq_v)?;
    Ok(ModelConfig {
        qk_norm: true,
        activation: Activation::GeluTanh,
        embedding_scale: Some((c.hidden_size as f64).sqrt() as f32),
        post_norms: true,
        attention_scale: 1.0,
        norm_weight_offset: 0.0,
        max_position_embeddings: max_pos,
        final_logit_softcap: c.final_logit_softcapping.map(|x| x as f32),
        global_layers: Some(global_shape),
        ..base
    })
}

/// The full layers' [`GlobalLayers`]: `per_layer_config`'s override of every full layer (one
/// shape for all of them, none for a sliding layer; a full layer it does not list has the
/// sliding layers' shape), else `global_head_dim` (default 512) and, with K = V,
/// `num_global_key_value_heads`.
fn gemma4_global_shape(
    c: &HfConfigJson,
    base: &ModelConfig,
    values_from_keys: bool,
) -> Result<GlobalLayers, LoadError> {
    let broken = |m: String| LoadError::config(format!("{m}; the model's config is broken"));
    let mut shape = GlobalLayers {
        num_kv_heads: match values_from_keys {
            true => c.num_global_key_value_heads.unwrap_or(base.num_kv_heads),
            false => base.num_kv_heads,
        },
        head_dim: c.global_head_dim.unwrap_or(512),
        values_from_keys,
    };
    let Some(per_layer) = &c.per_layer_config else { return Ok(shape) };
    // saved by transformers: the full layers it lists differ, the others are the sliding shape
    shape.num_kv_heads = base.num_kv_heads;
    shape.head_dim = base.head_dim;
    let mut seen: Option<(usize, usize)> = None;
    for (key, entry) in per_layer {
        let layer: usize =
            key.parse().ok().filter(|&l| l < base.num_layers).ok_or_else(|| {
                broken(format!("per_layer_config has an entry for layer '{key}'"))
            })?;
        if base.layers[layer].attention != AttentionKind::Full {
            return Err(broken(format!(
                "per_layer_config changes layer {layer}, a sliding layer (kvrun runs one head \
                 shape for the sliding layers)"
            )));
        }
        let get = |k: &str, default: usize| match entry.get(k) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .map(|x| x as usize)
                .ok_or_else(|| broken(format!("per_layer_config.{key}.{k} = {v}"))),
        };
        let this =
            (get("num_key_value_heads", base.num_kv_heads)?, get("head_dim", base.head_dim)?);
        if seen.is_some_and(|s| s != this) {
            return Err(broken(format!(
                "per_layer_config gives the full layers different head shapes ({seen:?} and \
                 {this:?}); kvrun runs one"
            )));
        }
        seen = Some(this);
    }
    if let Some((num_kv_heads, head_dim)) = seen {
        shape.num_kv_heads = num_kv_heads;
        shape.head_dim = head_dim;
    }
    Ok(shape)
}

/// DeepSeek-V2/V3 as `modeling_deepseek.py` defines it: multi-head latent attention ([`Mla`]),
/// RoPE on the `qk_rope_head_dim` channels only, in adjacent pairs (HF de-interleaves q_pe and
/// k_pe before `rotate_half`, the same scores as rotating pairs in place), YaRN as configured,
/// softmax scale `1/sqrt(qk_nope + qk_rope)` times `mscale(factor, mscale_all_dim)²` under
/// YaRN. Layer `l` is mixture-of-experts when `n_routed_experts` is set, `l ≥
/// first_k_dense_replace` and `l % moe_layer_freq == 0`; its routing is V2's softmax unless the
/// config says otherwise, and for `v3` (`DeepseekV3ForCausalLM`, whose transformers config
/// carries no `scoring_func`) V3's sigmoid (`noaux_tc`).
fn deepseek2(c: &HfConfigJson, v3: bool) -> Result<ModelConfig, LoadError> {
    if c.rope_interleave == Some(false) {
        return Err(LoadError::config(
            "rope_interleave = false (RoPE on the halves of DeepSeek's rotary channels) is not \
             run; kvrun rotates adjacent pairs, as DeepSeek's own checkpoints do"
                .to_string(),
        ));
    }
    let need = |key: &str, v: Option<usize>| {
        v.ok_or_else(|| {
            LoadError::config(format!(
                "a DeepSeek config needs '{key}'; pass the model's own config.json"
            ))
        })
    };
    let mla = Mla {
        q_lora_rank: c.q_lora_rank,
        kv_lora_rank: need("kv_lora_rank", c.kv_lora_rank)?,
        qk_nope_head_dim: need("qk_nope_head_dim", c.qk_nope_head_dim)?,
        qk_rope_head_dim: need("qk_rope_head_dim", c.qk_rope_head_dim)?,
        v_head_dim: need("v_head_dim", c.v_head_dim)?,
    };
    mla.check_dims()?;
    let max_pos = c.max_position_embeddings.unwrap_or(4096);
    let (theta, params) = rope_params(c, "full_attention")?;
    let rope = hf_rope(theta, params, max_pos)?;
    let mut scale = 1.0 / (mla.q_head_dim().max(1) as f64).sqrt();
    if let RopeScaling::Yarn { factor, .. } = rope.scaling {
        let all_dim = params.and_then(|p| p.get("mscale_all_dim")).and_then(Value::as_f64);
        if let Some(m) = all_dim.filter(|m| *m != 0.0 && m.is_finite()) {
            let mscale = yarn_mscale(factor, m);
            scale *= mscale * mscale;
        }
    }
    let freq = c.moe_layer_freq.unwrap_or(1).max(1);
    let first_moe = c.first_k_dense_replace.unwrap_or(0);
    let moe_layers = match c.n_routed_experts {
        Some(n) if n > 0 => {
            (0..c.num_hidden_layers).filter(|l| *l >= first_moe && l % freq == 0).count()
        }
        _ => 0,
    };
    let layers = super::config::full_layers(c.num_hidden_layers, rope);
    let moe = match moe_layers {
        0 => None,
        _ => deepseek2_moe(c, v3, first_moe, freq)?,
    };
    Ok(ModelConfig {
        num_kv_heads: 1,
        head_dim: mla.latent_width(),
        rope_style: RopeStyle::Interleaved,
        attention_scale: scale as f32,
        max_position_embeddings: max_pos,
        mla: Some(mla),
        moe_layers,
        moe,
        ..base(Architecture::Deepseek2, c, layers)
    })
}

/// DeepSeek's experts as its `MoEGate` routes them: V2's softmax scores, the top
/// `num_experts_per_tok` (`greedy`, or `group_limited_greedy` over `n_group` groups of which
/// `topk_group` are kept), or V3's sigmoid scores with the choice bias (`noaux_tc`, groups
/// always); renormalised when `norm_topk_prob`, times `routed_scaling_factor`;
/// `n_shared_experts` shared experts. `scoring_func` and `topk_method` default to V2's, or to
/// V3's for `v3`. Another pairing of the two is `None`, and the model is refused at open.
fn deepseek2_moe(
    c: &HfConfigJson,
    v3: bool,
    first_dense: usize,
    layer_step: usize,
) -> Result<Option<super::config::Moe>, LoadError> {
    let (scoring, method) = match v3 {
        true => ("sigmoid", "noaux_tc"),
        false => ("softmax", "greedy"),
    };
    let method = c.topk_method.as_deref().unwrap_or(method);
    let scoring = match (c.scoring_func.as_deref().unwrap_or(scoring), method) {
        ("softmax", "greedy" | "group_limited_greedy") => MoeScoring::Softmax,
        ("sigmoid", "noaux_tc") => MoeScoring::SigmoidBiased,
        _ => return Ok(None),
    };
    let need = |v: Option<usize>, key: &str| {
        v.ok_or_else(|| LoadError::config(format!("a DeepSeek MoE config.json lacks {key}")))
    };
    let grouped = method != "greedy";
    Ok(Some(super::config::Moe {
        experts: need(c.n_routed_experts, "n_routed_experts")?,
        experts_used: need(c.num_experts_per_tok, "num_experts_per_tok")?,
        expert_ffn: need(c.moe_intermediate_size, "moe_intermediate_size")?,
        norm_topk_prob: c.norm_topk_prob.unwrap_or(v3),
        scoring,
        biases: false,
        shared_ffn: c
            .n_shared_experts
            .unwrap_or(0)
            .saturating_mul(c.moe_intermediate_size.unwrap_or(0)),
        shared_gate: false,
        routed_scale: c.routed_scaling_factor.unwrap_or(1.0) as f32,
        groups: if grouped { c.n_group.unwrap_or(1) } else { 1 },
        groups_used: if grouped { c.topk_group.unwrap_or(1) } else { 1 },
        first_dense,
        layer_step,
    }))
}

/// Qwen3.5-MoE (`Qwen3_5MoeTextConfig`): Qwen3.5's layers, every MLP `num_experts` experts of
/// `moe_intermediate_size`, `num_experts_per_tok` a token, always renormalised (its router
/// has no `norm_topk_prob`), and a shared expert of `shared_expert_intermediate_size` gated by
/// `sigmoid(x · shared_expert_gate)`.
fn qwen35moe(c: &HfConfigJson) -> Result<ModelConfig, LoadError> {
    let need = |v: Option<usize>, key: &str| {
        v.ok_or_else(|| LoadError::config(format!("a Qwen3.5-MoE config.json lacks {key}")))
    };
    let ffn = need(c.moe_intermediate_size, "moe_intermediate_size")?;
    let moe = super::config::Moe {
        shared_ffn: need(c.shared_expert_intermediate_size, "shared_expert_intermediate_size")?,
        shared_gate: true,
        ..super::config::Moe::every_layer(
            need(c.num_experts.or(c.num_local_experts), "num_experts")?,
            need(c.num_experts_per_tok, "num_experts_per_tok")?,
            ffn,
            true,
        )
    };
    let mut config = qwen35(c)?;
    if config.intermediate_size == 0 {
        config.intermediate_size = ffn;
    }
    config.moe = Some(moe);
    config.moe_layers = config.num_layers;
    Ok(config)
}

/// Qwen3.5 (dense) as `modeling_qwen3_5.py` defines it: `layer_types` (else every
/// `full_attention_interval`-th layer, default 4, full) of Gated DeltaNet (`linear_attention`)
/// and gated full attention; Q/K norms; partial RoPE over `partial_rotary_factor` (default
/// 0.25) of each head, NEOX pairs (its interleaved mRoPE sections coincide for text, whose
/// three position ids are equal); RMSNorms `x · (1 + w)` except the DeltaNet's gated norm.
fn qwen35(c: &HfConfigJson) -> Result<ModelConfig, LoadError> {
    let max_pos = c.max_position_embeddings.unwrap_or(32_768);
    let need = |key: &str, v: Option<usize>| {
        v.ok_or_else(|| {
            LoadError::config(format!(
                "a Qwen3.5 config needs '{key}'; pass the model's own config.json"
            ))
        })
    };
    let delta_net = DeltaNet {
        key_heads: need("linear_num_key_heads", c.linear_num_key_heads)?,
        value_heads: need("linear_num_value_heads", c.linear_num_value_heads)?,
        key_head_dim: need("linear_key_head_dim", c.linear_key_head_dim)?,
        value_head_dim: need("linear_value_head_dim", c.linear_value_head_dim)?,
        conv_taps: c.linear_conv_kernel_dim.unwrap_or(4),
        key_heads_tiled: false,
    };
    delta_net.check()?;
    let kinds: Vec<AttentionKind> = match &c.layer_types {
        Some(types) => {
            if types.len() != c.num_hidden_layers {
                return Err(LoadError::config(format!(
                    "layer_types lists {} layers but num_hidden_layers = {}; the config is \
                     broken",
                    types.len(),
                    c.num_hidden_layers
                )));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(AttentionKind::Full),
                    "linear_attention" => Ok(AttentionKind::Recurrent),
                    other => Err(LoadError::config(format!(
                        "Qwen3.5 layer type '{other}' is not supported (full_attention, \
                         linear_attention)"
                    ))),
                })
                .collect::<Result<_, _>>()?
        }
        None => {
            let interval = c.full_attention_interval.unwrap_or(4).max(1);
            (0..c.num_hidden_layers)
                .map(|i| match (i + 1) % interval {
                    0 => AttentionKind::Full,
                    _ => AttentionKind::Recurrent,
                })
                .collect()
        }
    };
    let (theta, params) = rope_params(c, "full_attention")?;
    let rope = hf_rope(theta, params, max_pos)?;
    let factor = params
        .and_then(|p| p.get("partial_rotary_factor"))
        .and_then(Value::as_f64)
        .or(c.partial_rotary_factor)
        .unwrap_or(0.25);
    let base = base(Architecture::Qwen35, c, Vec::new());
    if !(factor.is_finite() && factor > 0.0 && factor <= 1.0) {
        return Err(LoadError::config(format!(
            "partial_rotary_factor = {factor} must be in (0, 1]; fix the model's config.json"
        )));
    }
    let dims = (base.head_dim as f64 * factor) as usize;
    let rotary_dims = (dims < base.head_dim).then_some(dims);
    let layers = kinds.into_iter().map(|attention| LayerSpec { attention, rope }).collect();
    Ok(ModelConfig {
        layers,
        qk_norm: true,
        norm_weight_offset: 1.0,
        rotary_dims,
        max_position_embeddings: max_pos,
        delta_net: Some(delta_net),
        attn_output_gate: true,
        global_layers: None,
        final_logit_softcap: None,
        ..base
    })
}

fn sliding(window: usize, max_pos: usize) -> AttentionKind {
    // a window covering every position is full attention
    if window >= max_pos {
        AttentionKind::Full
    } else {
        AttentionKind::Sliding { window }
    }
}

/// HF `layer_types` → attention kinds.
fn layer_types(
    types: &[String],
    num_layers: usize,
    window: Option<usize>,
    max_pos: usize,
) -> Result<Vec<AttentionKind>, LoadError> {
    if types.len() != num_layers {
        return Err(LoadError::config(format!(
            "layer_types lists {} layers but num_hidden_layers = {num_layers}; the config is \
             broken",
            types.len()
        )));
    }
    types
        .iter()
        .map(|t| match (t.as_str(), window) {
            ("full_attention", _) => Ok(AttentionKind::Full),
            ("sliding_attention", Some(w)) => Ok(sliding(w, max_pos)),
            ("sliding_attention", None) => Err(LoadError::config(
                "layer_types has sliding_attention layers but sliding_window is not set; the \
                 config is broken",
            )),
            (other, _) => Err(LoadError::config(format!(
                "layer type '{other}' is not supported (kvrun runs full_attention and \
                 sliding_attention)"
            ))),
        })
        .collect()
}

/// Whether a `rope_parameters` value is keyed by layer type (transformers ≥ 5, Gemma 3).
fn per_layer_type(v: &Value) -> bool {
    v.get("full_attention").is_some() || v.get("sliding_attention").is_some()
}

/// The theta and scaling dict for `layer_type`: `rope_parameters` when present (flat, or keyed
/// by layer type), else `rope_theta` + `rope_scaling`.
fn rope_params<'a>(
    c: &'a HfConfigJson,
    layer_type: &str,
) -> Result<(f64, Option<&'a Value>), LoadError> {
    let default_theta = c.rope_theta.unwrap_or(10_000.0);
    let Some(p) = c.rope_parameters.as_ref().filter(|v| !v.is_null()) else {
        return Ok((default_theta, c.rope_scaling.as_ref()));
    };
    let p = if per_layer_type(p) { p.get(layer_type).unwrap_or(&Value::Null) } else { p };
    let theta = match p.get("rope_theta") {
        None => default_theta,
        Some(v) => v.as_f64().ok_or_else(|| bad_value("rope_parameters", "rope_theta", v))?,
    };
    Ok((theta, Some(p)))
}

fn bad_value(what: &str, key: &str, v: &Value) -> LoadError {
    LoadError::config(format!(
        "{what}.{key} = {v} is not a valid value; fix the model's config.json"
    ))
}

/// HF `rope_scaling` (or `rope_parameters`) → [`Rope`]: absent, null or type "default" is plain
/// RoPE; "linear", "llama3" and "yarn" as `modeling_rope_utils` reads them; other types are
/// refused by name. The YaRN attention factor is resolved here (explicit `attention_factor`,
/// else from `mscale` / `mscale_all_dim`, else `0.1 ln(factor) + 1`); `factor` is taken as
/// given (older transformers; the newer `max_position_embeddings / original` override is not
/// applied).
pub(super) fn hf_rope(
    theta: f64,
    params: Option<&Value>,
    max_pos: usize,
) -> Result<Rope, LoadError> {
    let plain = Ok(Rope { theta, scaling: RopeScaling::None });
    let Some(obj) = params.and_then(Value::as_object) else {
        return plain;
    };
    let kind = obj.get("rope_type").or_else(|| obj.get("type")).and_then(Value::as_str);
    let num = |key: &str| -> Result<Option<f64>, LoadError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(Some)
                .ok_or_else(|| bad_value("rope_scaling", key, v)),
        }
    };
    let need = |key: &str| -> Result<f64, LoadError> {
        num(key)?.ok_or_else(|| {
            LoadError::config(format!(
                "rope_scaling of type '{}' needs '{key}'; fix the model's config.json",
                kind.unwrap_or("?")
            ))
        })
    };
    let positions = |x: f64| x as usize;
    let scaling = match kind {
        None => {
            if obj.is_empty() {
                return plain;
            }
            return Err(LoadError::config(
                "rope_scaling has no rope_type (or type); fix the model's config.json",
            ));
        }
        Some("default") => RopeScaling::None,
        Some("proportional") => RopeScaling::Proportional {
            partial_rotary_factor: match obj.get("partial_rotary_factor") {
                None | Some(Value::Null) => 1.0,
                Some(v) => v
                    .as_f64()
                    .filter(|x| (0.0..=1.0).contains(x))
                    .ok_or_else(|| bad_value("rope_parameters", "partial_rotary_factor", v))?,
            },
            factor: num("factor")?.unwrap_or(1.0),
        },
        Some("linear") => RopeScaling::Linear { factor: need("factor")? },
        Some("llama3") => RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: positions(need("original_max_position_embeddings")?),
        },
        Some("yarn") => {
            let factor = need("factor")?;
            let attention_factor =
                match (num("attention_factor")?, num("mscale")?, num("mscale_all_dim")?) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(all)) => yarn_mscale(factor, m) / yarn_mscale(factor, all),
                    _ => yarn_mscale(factor, 1.0),
                };
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: num("original_max_position_embeddings")?
                    .map_or(max_pos, positions),
                beta_fast: num("beta_fast")?.unwrap_or(32.0),
                beta_slow: num("beta_slow")?.unwrap_or(1.0),
                attention_factor,
                truncate: obj.get("truncate").and_then(Value::as_bool).unwrap_or(true),
            }
        }
        Some(other) => {
            return Err(LoadError::config(format!(
                "rope_scaling type '{other}' is not supported (kvrun implements default, \
                 linear, llama3 and yarn); use a model without it"
            )))
        }
    };
    Ok(Rope { theta, scaling })
}
