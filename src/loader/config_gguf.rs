//! [`ModelConfig`] from GGUF metadata (`{arch}.*` keys, as llama.cpp's `llama-model.cpp` reads
//! them) and the tensor list: Llama, Qwen2, Qwen3, Gemma 3, DeepSeek-V2/V3.

use super::config::{
    full_layers, inv_sqrt, Activation, Architecture, AttentionKind, DeltaNet, GlobalLayers,
    LayerSpec, Mla, ModelConfig, MoeScoring, Rope, RopeScaling, RopeStyle, SUPPORTED,
};
use super::error::LoadError;
use super::gguf::GgufFile;
use super::gguf_value::GgufArray;
use crate::quant::dequantize_row;

/// Gemma 3's local (sliding) layers: RoPE base 10,000, unscaled (llama.cpp hard-codes
/// `rope_freq_base_train_swa`; GGUF has no key for it).
const GEMMA3_LOCAL_THETA: f64 = 10_000.0;
/// Gemma 3: every 6th layer (`il % 6 == 5`) is global (llama.cpp `set_swa_pattern(6)`).
const GEMMA3_SWA_PATTERN: usize = 6;
/// Gemma 3 27B is known by its layer count (llama.cpp `LLM_TYPE_27B`); its softmax scale is
/// `1/sqrt(hidden / heads)` = 1/sqrt(168), not `1/sqrt(head_dim)`.
const GEMMA3_27B_LAYERS: usize = 62;

/// See [`ModelConfig::from_gguf`].
pub(super) fn parse(file: &GgufFile) -> Result<ModelConfig, LoadError> {
    let arch_name = file.get_str("general.architecture").ok_or_else(|| {
        LoadError::config(
            "GGUF key general.architecture is missing; the file was not written by a llama.cpp \
             converter, re-convert it",
        )
    })?;
    let (arch, rope_style) = match arch_name {
        // GGUF Llama Q/K rows were permuted by the converter: adjacent-pair RoPE.
        "llama" => (Architecture::Llama, RopeStyle::Interleaved),
        "qwen2" => (Architecture::Qwen2, RopeStyle::Neox),
        // not permuted either (llama.cpp's Qwen3Model converts as Qwen2Model): NEOX
        "qwen3" => (Architecture::Qwen3, RopeStyle::Neox),
        "qwen3moe" => (Architecture::Qwen3Moe, RopeStyle::Neox),
        "gemma3" => (Architecture::Gemma3, RopeStyle::Neox),
        "gemma4" => (Architecture::Gemma4, RopeStyle::Neox),
        // not permuted by the converter; RoPE on adjacent pairs (ggml's NORM), as HF DeepSeek
        "deepseek2" => (Architecture::Deepseek2, RopeStyle::Interleaved),
        // llama.cpp's IMROPE: NEOX pairs, each from one of three positions, equal for text
        "qwen35" => (Architecture::Qwen35, RopeStyle::Neox),
        // Qwen3.5-MoE: Qwen3.5's layers, a mixture of experts for every MLP
        "qwen35moe" => (Architecture::Qwen35, RopeStyle::Neox),
        // transformers' gpt-oss rotates halves (rotate_half); llama.cpp's rope type NEOX
        "gpt-oss" => (Architecture::GptOss, RopeStyle::Neox),
        other => {
            return Err(LoadError::UnsupportedArchitecture {
                found: other.to_string(),
                supported: SUPPORTED,
            })
        }
    };
    let m = GgufKeys { file, arch: arch_name };
    let hidden_size = m.usize("embedding_length")?;
    let num_heads = m.usize("attention.head_count")?;
    if num_heads == 0 {
        return Err(LoadError::config(format!(
            "{arch_name}.attention.head_count is 0; the model's config is broken, re-download or \
             re-convert it"
        )));
    }
    let head_dim = m.usize_or("attention.key_length", hidden_size / num_heads)?;
    // DeepSeek's rope.dimension_count is its MLA RoPE part (deepseek2 below)
    let rotary_dims = match arch {
        Architecture::Deepseek2 => None,
        _ => rotary_dims(&m, arch, head_dim)?,
    };
    let vocab_size = match m.opt_usize("vocab_size")? {
        Some(v) => v,
        None => gguf_vocab_len(file)?,
    };
    let num_layers = m.usize("block_count")?;
    if num_layers > super::config::MAX_LAYERS {
        // Before the per-layer attributes are built from it: the tensors tell the truth.
        let present = super::check::layers_present(file.tensors().iter().map(|t| t.name.as_str()));
        if present < num_layers {
            return Err(super::check::too_few_layers(num_layers, present));
        }
        super::config::check_num_layers(num_layers, "block_count")?;
    }
    let max_pos = m.usize("context_length")?;
    let rope =
        Rope { theta: m.f64_or("rope.freq_base", 10_000.0)?, scaling: scaling(&m, max_pos)? };
    let mut config = ModelConfig {
        arch,
        hidden_size,
        // the experts' width where a mixture has no dense MLP (qwen35moe writes no such key)
        intermediate_size: match m.opt_usize("feed_forward_length")? {
            Some(f) => f,
            None => m.usize("expert_feed_forward_length")?,
        },
        num_layers,
        num_heads,
        // Gemma 4's is a per-layer array (gemma4 below)
        num_kv_heads: match arch {
            Architecture::Gemma4 => num_heads,
            _ => m.usize_or("attention.head_count_kv", num_heads)?,
        },
        head_dim,
        vocab_size,
        rms_norm_eps: m.f32("attention.layer_norm_rms_epsilon")?,
        layers: full_layers(num_layers, rope),
        rope_style,
        max_position_embeddings: max_pos,
        tie_word_embeddings: file.tensor_info("output.weight").is_none(),
        attention_bias: file.tensor_info("blk.0.attn_q.bias").is_some(),
        // Qwen3's per-head norms (llama.cpp `LLM_ARCH_QWEN3`: attn_q_norm, attn_k_norm)
        qk_norm: matches!(arch, Architecture::Qwen3 | Architecture::Qwen3Moe),
        activation: Activation::Silu,
        embedding_scale: None,
        post_norms: false,
        attention_scale: inv_sqrt(head_dim),
        norm_weight_offset: 0.0,
        rope_freq_factors: rope_freq_factors(file)?,
        mla: None,
        rotary_dims,
        moe_layers: 0,
        moe: None,
        delta_net: None,
        attn_output_gate: false,
        global_layers: None,
        final_logit_softcap: None,
    };
    if arch == Architecture::Gemma3 {
        gemma3(&m, &mut config)?;
    }
    if arch == Architecture::Gemma4 {
        gemma4(&m, &mut config)?;
    }
    if arch == Architecture::Deepseek2 {
        deepseek2(&m, &mut config)?;
    }
    if arch == Architecture::Qwen35 {
        qwen35(&m, &mut config)?;
    }
    if arch == Architecture::Qwen3Moe {
        qwen3moe(&m, &mut config)?;
    }
    if arch_name == "qwen35moe" {
        qwen35moe(&m, &mut config)?;
    }
    if arch == Architecture::GptOss {
        gpt_oss(&m, &mut config)?;
    }
    config.validate()?;
    Ok(config)
}

/// Qwen3-MoE (llama.cpp `llama_model_qwen3moe`): every layer's MLP is `expert_count` experts
/// of `expert_feed_forward_length` channels, `expert_used_count` a token; llama.cpp always
/// renormalises the chosen experts' weights for this architecture (its converter writes no key
/// for `norm_topk_prob`).
fn qwen3moe(m: &GgufKeys<'_>, c: &mut ModelConfig) -> Result<(), LoadError> {
    let (experts, used) = (m.usize("expert_count")?, m.usize("expert_used_count")?);
    let ffn = m.usize("expert_feed_forward_length")?;
    c.moe = Some(super::config::Moe::every_layer(experts, used, ffn, true));
    c.moe_layers = c.num_layers;
    Ok(())
}

/// gpt-oss (llama.cpp `llama_model_gpt_oss`): even layers attend through
/// `attention.sliding_window`, odd ones fully (llama.cpp's swa pattern 2); YaRN without
/// truncation, as gpt-oss's own config defines it (GGUF has no key for it; llama.cpp rounds:
/// assets/tiny-gpt-oss); every MLP `expert_count` biased experts of
/// `expert_feed_forward_length`, `expert_used_count` a token, softmax over the chosen ones'
/// logits (renormalised softmax), the clamped SwiGLU.
fn gpt_oss(m: &GgufKeys<'_>, c: &mut ModelConfig) -> Result<(), LoadError> {
    let window = m.usize("attention.sliding_window")?;
    for (il, layer) in c.layers.iter_mut().enumerate() {
        if let RopeScaling::Yarn { ref mut truncate, .. } = layer.rope.scaling {
            *truncate = false;
        }
        if il % 2 == 0 && window > 0 && window < c.max_position_embeddings {
            layer.attention = AttentionKind::Sliding { window };
        }
    }
    let (experts, used) = (m.usize("expert_count")?, m.usize("expert_used_count")?);
    let ffn = m.usize("expert_feed_forward_length")?;
    c.moe = Some(super::config::Moe {
        biases: true,
        ..super::config::Moe::every_layer(experts, used, ffn, true)
    });
    c.moe_layers = c.num_layers;
    c.activation = Activation::SwigluOai;
    Ok(())
}

/// DeepSeek-V2/V3's experts (llama.cpp `llama_model_deepseek2`): `expert_count` routed experts
/// of `expert_feed_forward_length`, `expert_used_count` a token, `expert_shared_count` shared
/// ones, `expert_weights_scale` (the routed scaling factor), `expert_weights_norm`, group-limited
/// routing over `expert_group_count` groups of which `expert_group_used_count` are chosen;
/// layers from `leading_dense_block_count` on. `expert_gating_func` 1 (or absent, as in older
/// V2 files) is softmax, 2 sigmoid with the per-expert choice bias (DeepSeek-V3); any other is
/// `None`, and the model is refused at open as one with experts kvrun does not run.
fn deepseek2_moe(
    m: &GgufKeys<'_>,
    first_dense: usize,
) -> Result<Option<super::config::Moe>, LoadError> {
    let scoring = match m.usize_or("expert_gating_func", 1)? {
        1 => MoeScoring::Softmax,
        2 => MoeScoring::SigmoidBiased,
        _ => return Ok(None),
    };
    let expert_ffn = m.usize("expert_feed_forward_length")?;
    let shared = m.usize_or("expert_shared_count", 0)?;
    Ok(Some(super::config::Moe {
        experts: m.usize("expert_count")?,
        experts_used: m.usize("expert_used_count")?,
        expert_ffn,
        norm_topk_prob: m.bool_or("expert_weights_norm", false)?,
        scoring,
        biases: false,
        shared_ffn: shared.checked_mul(expert_ffn).ok_or_else(|| {
            LoadError::config(format!("{shared} shared experts overflow; re-convert the model"))
        })?,
        shared_gate: false,
        routed_scale: m.f64_or("expert_weights_scale", 1.0)? as f32,
        groups: m.usize_or("expert_group_count", 1)?.max(1),
        groups_used: m.usize_or("expert_group_used_count", 1)?.max(1),
        first_dense,
        layer_step: 1,
    }))
}

/// Qwen3.5-MoE (llama.cpp `llama_model_qwen35moe`): every layer's MLP is `expert_count` experts
/// of `expert_feed_forward_length`, `expert_used_count` a token (renormalised), and a shared
/// expert of `expert_shared_feed_forward_length` gated by `sigmoid(x · ffn_gate_inp_shexp)`.
fn qwen35moe(m: &GgufKeys<'_>, c: &mut ModelConfig) -> Result<(), LoadError> {
    let (experts, used) = (m.usize("expert_count")?, m.usize("expert_used_count")?);
    let ffn = m.usize("expert_feed_forward_length")?;
    c.moe = Some(super::config::Moe {
        shared_ffn: m.usize("expert_shared_feed_forward_length")?,
        shared_gate: true,
        ..super::config::Moe::every_layer(experts, used, ffn, true)
    });
    c.moe_layers = c.num_layers;
    Ok(())
}

/// Qwen3.5 (llama.cpp `llama_model_qwen35::load_arch_hparams`): the Gated DeltaNet's shape
/// from `ssm.*` (`state_size` is both head sizes, `group_count` the key heads,
/// `time_step_rank` the value heads, `inner_size` all value channels), its layers from
/// `attention.recurrent_layers` or else every layer but each `full_attention_interval`-th
/// (default 4); value heads tiled over the key heads (the converter reorders them); the
/// converter already added 1 to the zero-centred norms, so `norm_weight_offset` stays 0.
fn qwen35(m: &GgufKeys<'_>, c: &mut ModelConfig) -> Result<(), LoadError> {
    let state = m.usize("ssm.state_size")?;
    let value_heads = m.usize("ssm.time_step_rank")?;
    let inner = m.usize("ssm.inner_size")?;
    if value_heads == 0 || inner != value_heads * state {
        return Err(LoadError::config(format!(
            "{0}.ssm.inner_size = {inner} is not ssm.time_step_rank ({value_heads}) × \
             ssm.state_size ({state}); re-convert the model",
            m.arch
        )));
    }
    let delta = DeltaNet {
        key_heads: m.usize("ssm.group_count")?,
        value_heads,
        key_head_dim: state,
        value_head_dim: state,
        conv_taps: m.usize("ssm.conv_kernel")?,
        key_heads_tiled: true,
    };
    delta.check()?;
    let key = format!("{}.attention.recurrent_layers", m.arch);
    let recurrent: Vec<bool> = match m.file.get(&key) {
        Some(v) => match v.as_array() {
            Some(GgufArray::Bool(b)) if b.len() >= c.num_layers => b[..c.num_layers].to_vec(),
            _ => {
                return Err(LoadError::config(format!(
                    "{key} must be an array of {} booleans; re-convert the model",
                    c.num_layers
                )))
            }
        },
        None => {
            let interval = m.usize_or("full_attention_interval", 4)?.max(1);
            (0..c.num_layers).map(|i| (i + 1) % interval != 0).collect()
        }
    };
    for (layer, r) in c.layers.iter_mut().zip(recurrent) {
        if r {
            layer.attention = AttentionKind::Recurrent;
        }
    }
    c.delta_net = Some(delta);
    c.qk_norm = true;
    c.attn_output_gate = true;
    Ok(())
}

/// Gemma 3 (llama.cpp `llama_load_hparams_gemma3`): with `attention.sliding_window` > 0, layers
/// `il % 6 != 5` slide over that window with the local RoPE, the rest are global with the file's
/// RoPE (incl. its scaling); without it every layer is global. The converter already added 1 to
/// the norm weights, so `norm_weight_offset` stays 0.
fn gemma3(m: &GgufKeys<'_>, c: &mut ModelConfig) -> Result<(), LoadError> {
    let local = Rope { theta: GEMMA3_LOCAL_THETA, scaling: RopeScaling::None };
    if let Some(window) = m.opt_usize("attention.sliding_window")?.filter(|w| *w > 0) {
        for (il, layer) in c.layers.iter_mut().enumerate() {
            if il % GEMMA3_SWA_PATTERN < GEMMA3_SWA_PATTERN - 1 {
                let attention = if window >= c.max_position_embeddings {
                    AttentionKind::Full
                } else {
                    AttentionKind::Sliding { window }
                };
                *layer = LayerSpec { attention, rope: local };
            }
        }
    }
    c.qk_norm = true;
    c.activation = Activation::GeluTanh;
    c.embedding_scale = Some((c.hidden_size as f64).sqrt() as f32);
    c.post_norms = true;
    c.attention_scale = if c.num_layers == GEMMA3_27B_LAYERS {
        inv_sqrt(c.hidden_size / c.num_heads)
    } else {
        inv_sqrt(c.head_dim)
    };
    Ok(())
}

/// Gemma 4 (llama.cpp `src/models/gemma4.cpp`): `attention.sliding_window_pattern` (one bool a
/// layer, true = sliding) over `attention.sliding_window`; the sliding layers' head size in
/// `attention.key_length_swa`, the global layers' in `attention.key_length`; KV heads
/// `attention.head_count_kv`, a number or one per layer; RoPE base `rope.freq_base` on global
/// layers and `rope.freq_base_swa` (default 10,000) on sliding ones; the global layers'
/// proportional RoPE as `rope_freqs` divisors (1 for the pairs that turn, 1e30 for the rest:
/// [`RopeScaling::Proportional`]); K = V where a global layer has no `attn_v`; attention scale
/// 1; `final_logit_softcapping`, which llama.cpp applies at 30 when the key is absent. Norm
/// weights are plain `w` (the converter adds nothing). Per-layer embeddings, KV sharing and
/// experts are refused.
fn gemma4(m: &GgufKeys<'_>, c: &mut ModelConfig) -> Result<(), LoadError> {
    let refuse = |what: &str| {
        Err(LoadError::config(format!(
            "this Gemma 4 file uses {what}, which kvrun does not run yet (it runs the dense \
             Gemma 4 text models: no per-layer embeddings, KV sharing or experts)"
        )))
    };
    if m.usize_or("embedding_length_per_layer_input", 0)? > 0 {
        return refuse("per-layer embeddings (the E-series)");
    }
    if m.usize_or("attention.shared_kv_layers", 0)? > 0 {
        return refuse("KV sharing across layers");
    }
    if m.usize_or("expert_count", 0)? > 0 {
        return refuse("mixture-of-experts layers (26B-A4B)");
    }
    let n = c.num_layers;
    let key = |s: &str| format!("{}.{s}", m.arch);
    let per_layer = |suffix: &str| -> Result<Option<Vec<u64>>, LoadError> {
        let k = key(suffix);
        let values: Option<Vec<u64>> = match m.file.get(&k).and_then(|v| v.as_array()) {
            None => return Ok(None),
            Some(GgufArray::U32(v)) => Some(v.iter().map(|&x| u64::from(x)).collect()),
            Some(GgufArray::I32(v)) => v.iter().map(|&x| u64::try_from(x).ok()).collect(),
            Some(GgufArray::U64(v)) => Some(v.clone()),
            Some(_) => None,
        };
        match values {
            Some(v) if v.len() == n => Ok(Some(v)),
            _ => Err(LoadError::config(format!(
                "{k} must be {n} non-negative integers (one a layer) or one number; re-convert \
                 the model"
            ))),
        }
    };
    let pattern_key = key("attention.sliding_window_pattern");
    let sliding: Vec<bool> = match m.file.get(&pattern_key).and_then(|v| v.as_array()) {
        Some(GgufArray::Bool(b)) if b.len() == n => b.clone(),
        _ => {
            return Err(LoadError::config(format!(
                "{pattern_key} must be an array of {n} booleans (true = sliding); re-convert \
                 the model"
            )))
        }
    };
    let window = m.usize("attention.sliding_window")?;
    let hd_swa = m.usize("attention.key_length_swa")?;
    let hd_full = c.head_dim; // attention.key_length
    for (k, v) in [("key_length", "value_length"), ("key_length_swa", "value_length_swa")] {
        let (a, b) =
            (m.opt_usize(&format!("attention.{k}"))?, m.opt_usize(&format!("attention.{v}"))?);
        if b.is_some() && a != b {
            return Err(LoadError::config(format!(
                "{0}.attention.{k} = {a:?} differs from {0}.attention.{v} = {b:?}; Gemma 4's K \
                 and V heads have one size, re-convert the model",
                m.arch
            )));
        }
    }
    let kv_heads: Vec<usize> = match per_layer("attention.head_count_kv")? {
        Some(v) => v.into_iter().map(|x| x as usize).collect(),
        None => vec![m.usize_or("attention.head_count_kv", c.num_heads)?; n],
    };
    let of_kind = |want_sliding: bool| -> Result<Option<usize>, LoadError> {
        let mut heads = kv_heads.iter().zip(&sliding).filter(|(_, s)| **s == want_sliding);
        let Some((&first, _)) = heads.next() else { return Ok(None) };
        if heads.any(|(&h, _)| h != first) {
            return Err(LoadError::config(format!(
                "{}.attention.head_count_kv gives layers of one kind different KV head counts; \
                 kvrun runs one per kind",
                m.arch
            )));
        }
        Ok(Some(first))
    };
    let kv_full = of_kind(false)?.ok_or_else(|| {
        LoadError::config(format!(
            "{pattern_key} marks every layer sliding; Gemma 4 has full-attention layers, \
             re-convert the model"
        ))
    })?;
    let kv_swa = of_kind(true)?.unwrap_or(kv_full);
    let global_theta = c.layers.first().map_or(1e6, |l| l.rope.theta);
    let local =
        Rope { theta: m.f64_or("rope.freq_base_swa", 10_000.0)?, scaling: RopeScaling::None };
    let global = Rope {
        theta: global_theta,
        scaling: proportional_from_freqs(c.rope_freq_factors.take(), hd_full, m.arch)?,
    };
    for (layer, &s) in c.layers.iter_mut().zip(&sliding) {
        *layer = match s {
            true => LayerSpec {
                attention: if window >= c.max_position_embeddings {
                    AttentionKind::Full
                } else {
                    AttentionKind::Sliding { window }
                },
                rope: local,
            },
            false => LayerSpec { attention: AttentionKind::Full, rope: global },
        };
    }
    let first_global = sliding.iter().position(|s| !s).expect("a full layer, checked above");
    let values_from_keys =
        m.file.tensor_info(&format!("blk.{first_global}.attn_v.weight")).is_none();
    c.head_dim = hd_swa;
    c.num_kv_heads = kv_swa;
    c.global_layers =
        Some(GlobalLayers { num_kv_heads: kv_full, head_dim: hd_full, values_from_keys });
    c.rotary_dims = None;
    c.qk_norm = true;
    c.activation = Activation::GeluTanh;
    c.embedding_scale = Some((c.hidden_size as f64).sqrt() as f32);
    c.post_norms = true;
    c.attention_scale = 1.0;
    c.final_logit_softcap = Some(m.opt_f32("final_logit_softcapping")?.unwrap_or(30.0));
    Ok(())
}

/// Gemma 4's `rope_freqs.weight` ([head_dim / 2] divisors: 1 for the pairs that turn, then
/// 1e30 for the rest, as llama.cpp's converter writes proportional RoPE) →
/// [`RopeScaling::Proportional`]; absent: every pair turns. Other contents are refused.
fn proportional_from_freqs(
    factors: Option<Vec<f32>>,
    head_dim: usize,
    arch: &str,
) -> Result<RopeScaling, LoadError> {
    let whole = RopeScaling::Proportional { partial_rotary_factor: 1.0, factor: 1.0 };
    let Some(f) = factors else { return Ok(whole) };
    let turning = f.iter().take_while(|&&x| x == 1.0).count();
    if f.len() != head_dim / 2 || f[turning..].iter().any(|&x| x < 1e29) {
        return Err(LoadError::config(format!(
            "rope_freqs.weight of this {arch} file is not proportional RoPE over {} pairs (1 for \
             the pairs that turn, then 1e30); re-convert the model",
            head_dim / 2
        )));
    }
    Ok(RopeScaling::Proportional {
        partial_rotary_factor: (2 * turning) as f64 / head_dim as f64,
        factor: 1.0,
    })
}

/// DeepSeek-V2/V3 (llama.cpp `LLM_ARCH_DEEPSEEK2`). Two converter generations: the current one
/// writes `key_length` = kv_lora_rank + rope dims (the absorbed MQA head), `value_length` =
/// kv_lora_rank, the per-head sizes in `key_length_mla` / `value_length_mla`, `head_count_kv` 1
/// and `attn_k_b` / `attn_v_b`; the older one writes the per-head sizes in `key_length` /
/// `value_length`, `head_count_kv` = heads and one `attn_kv_b`. Layers from
/// `leading_dense_block_count` on are mixture-of-experts when `expert_count` > 0. Under YaRN,
/// llama.cpp leaves cos/sin unscaled for this arch and scales scores by `mscale²` with
/// `mscale = 1 + yarn_log_multiplier · ln(factor)` (HF: `0.1 · mscale_all_dim`).
fn deepseek2(m: &GgufKeys<'_>, c: &mut ModelConfig) -> Result<(), LoadError> {
    let kv_lora_rank = m.usize("attention.kv_lora_rank")?;
    let rope_dims = m.usize("rope.dimension_count")?;
    let (q_head_dim, v_head_dim) = match m.opt_usize("attention.key_length_mla")? {
        Some(k) => (k, m.usize("attention.value_length_mla")?),
        None => (m.usize("attention.key_length")?, m.usize("attention.value_length")?),
    };
    if rope_dims == 0 || q_head_dim <= rope_dims {
        return Err(LoadError::config(format!(
            "{}: key length {q_head_dim} must exceed rope.dimension_count {rope_dims} (a RoPE \
             part and a part without); re-convert the model",
            m.arch
        )));
    }
    let mla = Mla {
        q_lora_rank: m.opt_usize("attention.q_lora_rank")?.filter(|r| *r > 0),
        kv_lora_rank,
        qk_nope_head_dim: q_head_dim - rope_dims,
        qk_rope_head_dim: rope_dims,
        v_head_dim,
    };
    mla.check_dims()?;
    let mut scale = 1.0 / (q_head_dim as f64).sqrt();
    for layer in &mut c.layers {
        if let RopeScaling::Yarn { factor, ref mut attention_factor, .. } = layer.rope.scaling {
            *attention_factor = 1.0;
            let log_mul = m.f64_or("rope.scaling.yarn_log_multiplier", 0.0)?;
            // llama.cpp's yarn_log_multiplier is HF's 0.1 · mscale_all_dim
            let mscale = super::config::yarn_mscale(factor, 10.0 * log_mul);
            scale = mscale * mscale / (q_head_dim as f64).sqrt();
        }
    }
    if m.usize_or("expert_count", 0)? > 0 {
        let dense = m.usize_or("leading_dense_block_count", 0)?.min(c.num_layers);
        c.moe_layers = c.num_layers - dense;
        c.moe = deepseek2_moe(m, dense)?;
    }
    c.num_kv_heads = 1;
    c.head_dim = mla.latent_width();
    c.attention_scale = scale as f32;
    c.mla = Some(mla);
    Ok(())
}

/// Partial rotary embeddings: `rope.dimension_count` below head_dim is llama.cpp's `n_rot`, the
/// channels its RoPE rotates at the start of each head (NEOX or interleaved pairs within them).
/// Only architectures whose llama.cpp graph rotates `n_rot` channels take it (Gemma 3, Qwen3.5:
/// a quarter of each head); Llama,
/// Qwen2 and Qwen3 assert `n_rot == head_dim` there, so such a file is refused, as by llama.cpp.
/// `None` when absent or whole heads; more than head_dim is an error.
fn rotary_dims(
    m: &GgufKeys<'_>,
    arch: Architecture,
    head_dim: usize,
) -> Result<Option<usize>, LoadError> {
    let Some(dims) = m.opt_usize("rope.dimension_count")? else { return Ok(None) };
    if dims > head_dim {
        return Err(LoadError::config(format!(
            "{}.rope.dimension_count = {dims} exceeds head_dim = {head_dim}: RoPE cannot rotate \
             more channels than a head has; re-convert the model",
            m.arch
        )));
    }
    if dims < head_dim && !matches!(arch, Architecture::Gemma3 | Architecture::Qwen35) {
        return Err(LoadError::config(format!(
            "{0}.rope.dimension_count = {dims} differs from head_dim = {head_dim} (partial rotary \
             embeddings): the {0} architecture rotates whole heads (llama.cpp refuses this file \
             too); re-convert the model, or fix the key if the model rotates whole heads",
            m.arch
        )));
    }
    Ok((dims < head_dim).then_some(dims))
}

/// `{arch}.rope.scaling.*` (llama.cpp `LLM_KV_ROPE_SCALING_*`): type "none" / absent, "linear"
/// (`factor`, or the older `rope.scale_linear`), "yarn" (`factor`, `original_context_length`,
/// `yarn_beta_fast` 32, `yarn_beta_slow` 1; the attention factor is llama.cpp's
/// `attn_factor · (1 + 0.1 ln factor)`). Other types are refused by name.
fn scaling(m: &GgufKeys<'_>, max_pos: usize) -> Result<RopeScaling, LoadError> {
    let key = format!("{}.rope.scaling.type", m.arch);
    let kind = match m.file.get(&key) {
        None => None,
        Some(v) => Some(v.as_str().ok_or_else(|| m.bad_type(&key, "a string"))?),
    };
    let factor = || -> Result<f64, LoadError> {
        match m.opt_f64("rope.scaling.factor")? {
            Some(f) => Ok(f),
            None => m.opt_f64("rope.scale_linear")?.ok_or_else(|| m.missing("rope.scaling.factor")),
        }
    };
    match kind {
        None | Some("none") => match m.opt_f64("rope.scale_linear")? {
            Some(factor) if factor != 1.0 => Ok(RopeScaling::Linear { factor }),
            _ => Ok(RopeScaling::None),
        },
        Some("linear") => Ok(RopeScaling::Linear { factor: factor()? }),
        Some("yarn") => {
            let factor = factor()?;
            let mscale = super::config::yarn_mscale(factor, 1.0);
            Ok(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: m
                    .usize_or("rope.scaling.original_context_length", max_pos)?,
                beta_fast: m.f64_or("rope.scaling.yarn_beta_fast", 32.0)?,
                beta_slow: m.f64_or("rope.scaling.yarn_beta_slow", 1.0)?,
                attention_factor: m.f64_or("rope.scaling.attn_factor", 1.0)? * mscale,
                // GGUF has no key for it: llama.cpp always rounds (gpt-oss sets it apart)
                truncate: true,
            })
        }
        Some(other) => Err(LoadError::config(format!(
            "{key} = '{other}' is not supported (kvrun implements none, linear and yarn, and \
             Llama 3.1's rope_freqs.weight); use a model without it"
        ))),
    }
}

/// `rope_freqs.weight` [head_dim / 2] f32: per-pair frequency divisors (Llama 3.1 GGUFs).
fn rope_freq_factors(file: &GgufFile) -> Result<Option<Vec<f32>>, LoadError> {
    let Some(info) = file.tensor_info("rope_freqs.weight") else {
        return Ok(None);
    };
    let mut out = vec![0.0f32; info.n_elements];
    dequantize_row(info.ggml_type, file.tensor_data(info), &mut out).map_err(|e| {
        LoadError::config(format!("tensor rope_freqs.weight: {e}; re-convert the model"))
    })?;
    Ok(Some(out))
}

/// The vocabulary size from `tokenizer.ggml.tokens`, or else the embedding's row count.
fn gguf_vocab_len(file: &GgufFile) -> Result<usize, LoadError> {
    if let Some(tokens) = file.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
        return Ok(tokens.len());
    }
    file.tensor_info("token_embd.weight").and_then(|t| t.dims.get(1).copied()).ok_or_else(|| {
        LoadError::config(
            "the vocabulary size is unknown: no vocab_size key, no tokenizer.ggml.tokens and \
                 no token_embd.weight; re-convert the model",
        )
    })
}

/// Typed, error-reporting access to `{arch}.{suffix}` keys.
struct GgufKeys<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl GgufKeys<'_> {
    fn bad_type(&self, key: &str, want: &str) -> LoadError {
        LoadError::config(format!(
            "GGUF key {key} should be {want} but is {:?}; the file is corrupt, re-convert it",
            self.file.get(key)
        ))
    }

    fn opt_usize(&self, suffix: &str) -> Result<Option<usize>, LoadError> {
        let key = format!("{}.{suffix}", self.arch);
        match self.file.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| self.bad_type(&key, "a non-negative integer")),
        }
    }

    fn usize(&self, suffix: &str) -> Result<usize, LoadError> {
        self.opt_usize(suffix)?.ok_or_else(|| self.missing(suffix))
    }

    fn usize_or(&self, suffix: &str, default: usize) -> Result<usize, LoadError> {
        Ok(self.opt_usize(suffix)?.unwrap_or(default))
    }

    fn opt_f32(&self, suffix: &str) -> Result<Option<f32>, LoadError> {
        let key = format!("{}.{suffix}", self.arch);
        match self.file.get(&key) {
            None => Ok(None),
            Some(v) => v.as_f32().map(Some).ok_or_else(|| self.bad_type(&key, "a float")),
        }
    }

    fn f32(&self, suffix: &str) -> Result<f32, LoadError> {
        self.opt_f32(suffix)?.ok_or_else(|| self.missing(suffix))
    }

    fn opt_f64(&self, suffix: &str) -> Result<Option<f64>, LoadError> {
        Ok(self.opt_f32(suffix)?.map(f64::from))
    }

    fn f64_or(&self, suffix: &str, default: f64) -> Result<f64, LoadError> {
        Ok(self.opt_f64(suffix)?.unwrap_or(default))
    }

    fn bool_or(&self, suffix: &str, default: bool) -> Result<bool, LoadError> {
        let key = format!("{}.{suffix}", self.arch);
        match self.file.get(&key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.bad_type(&key, "a bool")),
        }
    }

    fn missing(&self, suffix: &str) -> LoadError {
        LoadError::config(format!(
            "GGUF key {}.{suffix} is missing; the file is incomplete, re-convert it with a \
             current llama.cpp",
            self.arch
        ))
    }
}
