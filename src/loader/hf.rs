//! An HF model directory: `config.json`, `model.safetensors` or sharded
//! `model.safetensors.index.json`, `tokenizer.json`, `tokenizer_config.json`, and
//! `generation_config.json` when present.
//!
//! Tensors are renamed to kvrun's canonical (GGUF) names at open and stay byte slices of the
//! shard maps. Weights are not re-permuted: HF Llama keeps its half-split RoPE pairs
//! ([`super::RopeStyle::Neox`]).

use super::config::{token_id_list, Architecture, HfConfigExtras, ModelConfig};
use super::error::LoadError;
use crate::quant::GgmlType;
use crate::tokenizer::{HfTokenizerConfig, TokenizerSource};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// One tensor's place in a shard.
#[derive(Clone, Debug)]
pub(super) struct HfTensor {
    pub shard: usize,
    pub dtype: GgmlType,
    /// Outermost first, as safetensors stores it (`[out, in]` for a Linear weight).
    pub shape: Vec<usize>,
    /// Absolute byte range in the shard file.
    pub start: usize,
    pub end: usize,
}

/// An opened HF directory.
pub struct HfModel {
    dir: PathBuf,
    config: ModelConfig,
    extras: HfConfigExtras,
    shards: Vec<memmap2::Mmap>,
    /// Canonical name → tensor.
    tensors: BTreeMap<String, HfTensor>,
}

/// HF parameter names of an architecture → kvrun's canonical (GGUF) names, as llama.cpp's
/// converter names them. [`canonical_name`] for every architecture but Gemma 3 and 4, whose
/// `post_attention_layernorm` is the norm after attention (GGUF `post_attention_norm`), not
/// the one before the MLP (`pre_feedforward_layernorm`, GGUF `ffn_norm`), and whose text model
/// inside `Gemma3ForConditionalGeneration` is `model.language_model.*` (transformers ≥ 5) or
/// `language_model.model.*` (4.x); the vision tower's tensors keep their names and are unused.
/// Gemma 4's `layer_scalar` is GGUF `layer_output_scale`.
pub fn canonical_name_for(arch: Architecture, hf: &str) -> String {
    if arch == Architecture::Qwen35 {
        return qwen35_name(hf);
    }
    if arch == Architecture::GptOss {
        return gpt_oss_name(hf);
    }
    if !matches!(arch, Architecture::Gemma3 | Architecture::Gemma4) {
        return canonical_name(hf);
    }
    let hf = match hf
        .strip_prefix("model.language_model.")
        .or_else(|| hf.strip_prefix("language_model.model."))
    {
        Some(rest) => format!("model.{rest}"),
        None => match hf.strip_prefix("language_model.lm_head.") {
            Some(rest) => format!("lm_head.{rest}"),
            None => hf.to_string(),
        },
    };
    let gemma = |layer: &str, param: &str| -> Option<String> {
        let mapped = match param {
            "post_attention_layernorm.weight" => "post_attention_norm.weight",
            "pre_feedforward_layernorm.weight" => "ffn_norm.weight",
            "post_feedforward_layernorm.weight" => "post_ffw_norm.weight",
            // Gemma 4's per-layer output scale (a [1] buffer)
            "layer_scalar" => "layer_output_scale.weight",
            _ => return None,
        };
        Some(format!("blk.{layer}.{mapped}"))
    };
    hf.strip_prefix("model.layers.")
        .and_then(|rest| rest.split_once('.'))
        .and_then(|(layer, param)| gemma(layer, param))
        .unwrap_or_else(|| canonical_name(&hf))
}

/// gpt-oss's HF names → llama.cpp's `gpt-oss` GGUF names where the tensors are the same
/// (`post_attention_layernorm` is GGUF `post_attention_norm`, the sinks `attn_sinks`, the
/// router `ffn_gate_inp`, down's biases `ffn_down_exps.bias`); the experts' fused weights keep
/// transformers' layout under names of their own, `hf_gate_up_proj` `[experts, hidden,
/// 2 · ffn]` (gate and up columns interleaved), its bias `hf_gate_up_proj_bias`, and
/// `hf_down_proj` `[experts, ffn, hidden]` (`model::weights` transposes them at load); the
/// published MXFP4 checkpoints' `hf_{gate_up,down}_proj_{blocks,scales}` (byte tensors,
/// repacked into MXFP4 blocks at load).
fn gpt_oss_name(hf: &str) -> String {
    let mapped = hf.strip_prefix("model.layers.").and_then(|rest| rest.split_once('.')).and_then(
        |(layer, param)| {
            let name = match param {
                "post_attention_layernorm.weight" => "post_attention_norm.weight",
                "self_attn.sinks" => "attn_sinks.weight",
                "mlp.router.weight" => "ffn_gate_inp.weight",
                "mlp.router.bias" => "ffn_gate_inp.bias",
                "mlp.experts.gate_up_proj" => "hf_gate_up_proj",
                "mlp.experts.gate_up_proj_bias" => "hf_gate_up_proj_bias",
                "mlp.experts.down_proj" => "hf_down_proj",
                "mlp.experts.down_proj_bias" => "ffn_down_exps.bias",
                // the MXFP4 checkpoints' experts (`*_blocks` [experts, rows, blocks, 16] code
                // pairs, `*_scales` [experts, rows, blocks] E8M0 bytes)
                "mlp.experts.gate_up_proj_blocks" => "hf_gate_up_proj_blocks",
                "mlp.experts.gate_up_proj_scales" => "hf_gate_up_proj_scales",
                "mlp.experts.down_proj_blocks" => "hf_down_proj_blocks",
                "mlp.experts.down_proj_scales" => "hf_down_proj_scales",
                _ => return None,
            };
            Some(format!("blk.{layer}.{name}"))
        },
    );
    mapped.unwrap_or_else(|| canonical_name(hf))
}

/// Qwen3.5's HF names → llama.cpp's `qwen35` GGUF names: the text model of
/// `Qwen3_5ForConditionalGeneration` is `model.language_model.*` (its vision tower and MTP
/// head keep their names and are unused); `post_attention_layernorm` (the norm before the MLP)
/// is GGUF `post_attention_norm`; the Gated DeltaNet's tensors are `attn_qkv`, `attn_gate`,
/// `ssm_*`. `A_log` keeps a name of its own: GGUF stores `ssm_a = −exp(A_log)` instead.
fn qwen35_name(hf: &str) -> String {
    let hf = match hf.strip_prefix("model.language_model.") {
        Some(rest) => format!("model.{rest}"),
        None => hf.to_string(),
    };
    let mapped = hf.strip_prefix("model.layers.").and_then(|rest| rest.split_once('.')).and_then(
        |(layer, param)| {
            let name = match param {
                "post_attention_layernorm.weight" => "post_attention_norm.weight",
                "linear_attn.in_proj_qkv.weight" => "attn_qkv.weight",
                "linear_attn.in_proj_z.weight" => "attn_gate.weight",
                "linear_attn.in_proj_b.weight" => "ssm_beta.weight",
                "linear_attn.in_proj_a.weight" => "ssm_alpha.weight",
                "linear_attn.conv1d.weight" => "ssm_conv1d.weight",
                "linear_attn.dt_bias" => "ssm_dt.bias",
                "linear_attn.A_log" => "ssm_a_log",
                "linear_attn.norm.weight" => "ssm_norm.weight",
                "linear_attn.out_proj.weight" => "ssm_out.weight",
                // Qwen3.5-MoE's shared expert and its gate
                "mlp.shared_expert.gate_proj.weight" => "ffn_gate_shexp.weight",
                "mlp.shared_expert.up_proj.weight" => "ffn_up_shexp.weight",
                "mlp.shared_expert.down_proj.weight" => "ffn_down_shexp.weight",
                "mlp.shared_expert_gate.weight" => "ffn_gate_inp_shexp.weight",
                _ => return None,
            };
            Some(format!("blk.{layer}.{name}"))
        },
    );
    mapped.unwrap_or_else(|| canonical_name(&hf))
}

/// HF Llama/Qwen2/Qwen3/DeepSeek parameter names → kvrun's canonical (GGUF) names. Names this
/// does not know (e.g. `rotary_emb.inv_freq` in old checkpoints) are kept as they are.
pub fn canonical_name(hf: &str) -> String {
    match hf {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let Some(rest) = hf.strip_prefix("model.layers.") else {
        return hf.to_string();
    };
    let Some((layer, param)) = rest.split_once('.') else {
        return hf.to_string();
    };
    let mapped = match param {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.o_proj.bias" => "attn_output.bias",
        // the per-head Q/K norms of Qwen3 and Gemma 3
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        // the router of Qwen3-MoE and DeepSeek; their experts (`mlp.experts.E.*`) below
        "mlp.gate.weight" => "ffn_gate_inp.weight",
        // DeepSeek-V3's per-expert choice bias
        "mlp.gate.e_score_correction_bias" => "exp_probs_b.bias",
        // DeepSeek's shared experts (one MLP)
        "mlp.shared_experts.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_experts.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_experts.down_proj.weight" => "ffn_down_shexp.weight",
        // DeepSeek-V2/V3 (MLA), as llama.cpp's deepseek2 names them
        "self_attn.q_a_proj.weight" => "attn_q_a.weight",
        "self_attn.q_a_layernorm.weight" => "attn_q_a_norm.weight",
        "self_attn.q_b_proj.weight" => "attn_q_b.weight",
        "self_attn.kv_a_proj_with_mqa.weight" => "attn_kv_a_mqa.weight",
        "self_attn.kv_a_layernorm.weight" => "attn_kv_a_norm.weight",
        "self_attn.kv_b_proj.weight" => "attn_kv_b.weight",
        _ => return expert_name(layer, param).unwrap_or_else(|| hf.to_string()),
    };
    format!("blk.{layer}.{mapped}")
}

/// An expert's projection, `mlp.experts.E.gate_proj.weight` → `blk.L.ffn_gate.E.weight` (GGUF
/// stacks every expert of a layer in one `ffn_gate_exps`; an HF checkpoint keeps one tensor per
/// expert, which the model's loader stacks).
fn expert_name(layer: &str, param: &str) -> Option<String> {
    let (expert, proj) = param.strip_prefix("mlp.experts.")?.split_once('.')?;
    let expert: usize = expert.parse().ok()?;
    let base = match proj {
        "gate_proj.weight" => "ffn_gate",
        "up_proj.weight" => "ffn_up",
        "down_proj.weight" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{base}.{expert}.weight"))
}

fn read_text(path: &Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path).map_err(|error| LoadError::Io { path: path.to_path_buf(), error })
}

fn ggml_type_of(dtype: Dtype, name: &str, path: &Path) -> Result<GgmlType, LoadError> {
    match dtype {
        Dtype::F32 => Ok(GgmlType::F32),
        Dtype::F16 => Ok(GgmlType::F16),
        Dtype::BF16 => Ok(GgmlType::BF16),
        // gpt-oss's MXFP4 experts: packed codes and E8M0 scales, repacked at load
        Dtype::U8 if name.ends_with("_blocks") || name.ends_with("_scales") => Ok(GgmlType::I8),
        other => Err(LoadError::Safetensors {
            path: path.to_path_buf(),
            message: format!(
                "tensor '{name}' has dtype {other:?}; kvrun reads F32, F16 and BF16 \
                 safetensors (use an unquantized checkpoint, or a GGUF for quantized weights)"
            ),
        }),
    }
}

/// The shard file names: `model.safetensors`, or the values of the index's `weight_map`.
fn shard_names(dir: &Path) -> Result<Vec<String>, LoadError> {
    if dir.join("model.safetensors").is_file() {
        return Ok(vec!["model.safetensors".into()]);
    }
    let index_path = dir.join("model.safetensors.index.json");
    if !index_path.is_file() {
        return Err(LoadError::Safetensors {
            path: dir.to_path_buf(),
            message: "has neither model.safetensors nor model.safetensors.index.json; download \
                      the model's weights into this directory"
                .into(),
        });
    }
    let index: serde_json::Value = serde_json::from_str(&read_text(&index_path)?).map_err(|e| {
        LoadError::Json { path: index_path.clone(), message: format!("{e}; re-download it") }
    })?;
    let map = index["weight_map"].as_object().ok_or_else(|| LoadError::Json {
        path: index_path.clone(),
        message: "has no weight_map object; re-download it".into(),
    })?;
    let mut names: Vec<String> = Vec::new();
    for file in map.values() {
        let file = file.as_str().unwrap_or("");
        if file.is_empty() || file.contains(['/', '\\']) || file.starts_with('.') {
            return Err(LoadError::Json {
                path: index_path.clone(),
                message: format!(
                    "weight_map names shard '{file}', which is not a file name in the directory"
                ),
            });
        }
        if !names.iter().any(|n| n == file) {
            names.push(file.to_string());
        }
    }
    names.sort();
    Ok(names)
}

impl HfModel {
    pub fn open(dir: &Path) -> Result<Self, LoadError> {
        let config_path = dir.join("config.json");
        let (config, extras) = ModelConfig::from_hf_config_json_with_extras(&read_text(
            &config_path,
        )?)
        .map_err(|e| match e {
            LoadError::Config(message) => LoadError::Json { path: config_path.clone(), message },
            other => other,
        })?;
        let mut shards = Vec::new();
        let mut tensors = BTreeMap::new();
        for (idx, name) in shard_names(dir)?.into_iter().enumerate() {
            let path = dir.join(&name);
            let map = super::mmap::map_file(&path)?;
            let (header_len, meta) =
                SafeTensors::read_metadata(&map).map_err(|e| LoadError::Safetensors {
                    path: path.clone(),
                    message: format!("{e}; the file is corrupt or incomplete, re-download it"),
                })?;
            let data_start = 8 + header_len;
            for (hf_name, info) in meta.tensors() {
                let canonical = canonical_name_for(config.arch, &hf_name);
                let tensor = HfTensor {
                    shard: idx,
                    dtype: ggml_type_of(info.dtype, &hf_name, &path)?,
                    shape: info.shape.clone(),
                    start: data_start + info.data_offsets.0,
                    end: data_start + info.data_offsets.1,
                };
                if tensors.insert(canonical, tensor).is_some() {
                    return Err(LoadError::DuplicateTensor(hf_name));
                }
            }
            shards.push(map);
        }
        Ok(HfModel { dir: dir.to_path_buf(), config, extras, shards, tensors })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn extras(&self) -> &HfConfigExtras {
        &self.extras
    }

    pub(super) fn tensors(&self) -> &BTreeMap<String, HfTensor> {
        &self.tensors
    }

    pub(super) fn tensor_bytes(&self, t: &HfTensor) -> &[u8] {
        &self.shards[t.shard][t.start..t.end]
    }

    /// `tokenizer.json` plus what the config files say about templates and special tokens.
    pub fn tokenizer_source(&self) -> Result<TokenizerSource, LoadError> {
        let tokenizer_json = self.dir.join("tokenizer.json");
        if !tokenizer_json.is_file() {
            return Err(LoadError::Json {
                path: tokenizer_json,
                message: "is missing; kvrun needs the model's tokenizer.json (download it into \
                          the model directory)"
                    .into(),
            });
        }
        let config_path = self.dir.join("tokenizer_config.json");
        let mut config = if config_path.is_file() {
            HfTokenizerConfig::from_json(&read_text(&config_path)?).map_err(|e| {
                LoadError::Json { path: config_path.clone(), message: e.to_string() }
            })?
        } else {
            HfTokenizerConfig::default()
        };
        let jinja = self.dir.join("chat_template.jinja");
        if config.chat_template.is_none() && jinja.is_file() {
            config.chat_template = Some(read_text(&jinja)?);
        }
        let mut extra = self.extras.eos_token_ids.clone();
        let gen_path = self.dir.join("generation_config.json");
        if gen_path.is_file() {
            let gen: HashMap<String, serde_json::Value> =
                serde_json::from_str(&read_text(&gen_path)?).map_err(|e| LoadError::Json {
                    path: gen_path.clone(),
                    message: format!("{e}; re-download it"),
                })?;
            extra.extend(token_id_list(gen.get("eos_token_id")));
        }
        extra.dedup();
        config.extra_eos_ids = extra;
        Ok(TokenizerSource::HfJson { tokenizer_json, config: Some(config) })
    }
}
