//! [`ModelConfig`]: the hyper-parameters of a decoder-only model, resolved once from GGUF
//! metadata or an HF `config.json`, validated, and never mutated afterwards.

use super::error::LoadError;
use super::gguf::GgufFile;
use serde::{Deserialize, Serialize};

/// The architectures kvrun runs, as named in errors.
const SUPPORTED: &str = "Llama (incl. Mistral without sliding window), Qwen2";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Architecture {
    /// Llama 1/2/3 and everything shaped like it. Mistral is `general.architecture = llama` in
    /// GGUF and `MistralForCausalLM` in HF; both load as Llama.
    Llama,
    /// Qwen2 / Qwen2.5: Llama plus biases on the q/k/v projections.
    Qwen2,
    /// Gemma 3 (text): Q/K norms, GELU-tanh MLP, scaled embeddings, post-norms, and
    /// interleaved sliding-window (local) and full (global) layers with their own RoPE.
    Gemma3,
}

/// How a layer's attention sees the past.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum AttentionKind {
    /// Every earlier position of the sequence.
    Full,
    /// A query at position p sees keys at positions (p - window, p].
    Sliding { window: usize },
    // MLA's Latent comes later.
}

/// How RoPE's rotation frequencies are changed for long contexts, as HF's
/// `modeling_rope_utils` defines them (see `kernels::rope::rope_table`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[j] = theta^(-2j/head_dim)`.
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// YaRN: a ramp between interpolated and extrapolated frequencies over the dimensions,
    /// and cos/sin multiplied by `attention_factor` (HF's "mscale").
    Yarn {
        factor: f64,
        original_max_position_embeddings: usize,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
    },
}

/// One layer's rotary embedding.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Rope {
    /// The base of the frequencies (`rope_theta`, GGUF `rope.freq_base`).
    pub theta: f64,
    pub scaling: RopeScaling,
}

/// What differs from layer to layer.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LayerSpec {
    pub attention: AttentionKind,
    pub rope: Rope,
}

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Activation {
    /// `silu(gate) · up`: Llama, Qwen2.
    Silu,
    /// `gelu_tanh(gate) · up` (HF `gelu_pytorch_tanh`): Gemma.
    GeluTanh,
}

/// Which element pairs RoPE rotates.
///
/// Why two: llama.cpp's `convert_hf_to_gguf.py` permutes the rows of Llama's `q_proj` and
/// `k_proj` (`LlamaModel.permute`), undoing HF's own permutation, so GGUF Llama rotates adjacent
/// pairs (ggml's `LLAMA_ROPE_TYPE_NORM`) while the very same weights in HF safetensors rotate
/// half-split pairs (`rotate_half`). kvrun does not re-permute weights at load; it records the
/// style here instead. Qwen2 is never permuted, so it is NEOX in both formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Pairs `(x[2i], x[2i+1])`: GGUF Llama.
    Interleaved,
    /// Pairs `(x[i], x[i + head_dim/2])`: HF Llama, Qwen2 in both formats.
    Neox,
}

/// Model hyper-parameters shared by every layer.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    /// Per layer: attention kind and RoPE. `len() == num_layers` (checked by `validate`).
    pub layers: Vec<LayerSpec>,
    pub rope_style: RopeStyle,
    pub max_position_embeddings: usize,
    /// The LM head reuses `token_embd.weight` (GGUF: no `output.weight`; HF:
    /// `tie_word_embeddings`).
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases (`blk.N.attn_{q,k,v}.bias`), as in Qwen2.
    pub attention_bias: bool,
    /// An RMSNorm over each Q and K head (`blk.N.attn_{q,k}_norm.weight`, [head_dim]) before
    /// RoPE, as in Gemma 3.
    pub qk_norm: bool,
    pub activation: Activation,
    /// Multiply the embedding rows by this (Gemma: `sqrt(hidden_size)`); `None` for Llama.
    pub embedding_scale: Option<f32>,
    /// An extra RMSNorm after attention (`blk.N.post_attention_norm.weight`) and after the MLP
    /// (`blk.N.post_ffw_norm.weight`), before each residual add, as in Gemma 2/3.
    pub post_norms: bool,
    /// The softmax scale of attention scores: `1/sqrt(head_dim)` for Llama; Gemma 3:
    /// `1/sqrt(query_pre_attn_scalar)`, which differs from head_dim for 27B.
    pub attention_scale: f32,
    /// Added to every RMSNorm weight when it is read. Why: HF Gemma stores `w` and computes
    /// `x · (1 + w)`, while llama.cpp's converter adds the 1 into GGUF Gemma weights; 1.0 for
    /// HF Gemma, 0.0 everywhere else.
    pub norm_weight_offset: f32,
}

/// What an HF `config.json` says beyond [`ModelConfig`] (for `kvrun plan` on a bare config).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HfConfigExtras {
    /// `torch_dtype` (or the newer `dtype`), e.g. `"bfloat16"`.
    pub torch_dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    /// `eos_token_id`, an int or a list in the file.
    pub eos_token_ids: Vec<u32>,
}

/// The fields of an HF `config.json` kvrun reads.
#[derive(Deserialize)]
struct HfConfigJson {
    #[serde(default)]
    architectures: Vec<String>,
    hidden_size: usize,
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
    rope_scaling: Option<serde_json::Value>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<serde_json::Value>,
}

/// `eos_token_id` as HF writes it: absent, an int, or a list of ints.
pub(crate) fn token_id_list(value: Option<&serde_json::Value>) -> Vec<u32> {
    let as_id = |v: &serde_json::Value| v.as_u64().and_then(|x| u32::try_from(x).ok());
    match value {
        Some(serde_json::Value::Array(items)) => items.iter().filter_map(as_id).collect(),
        Some(v) => as_id(v).into_iter().collect(),
        None => Vec::new(),
    }
}

impl ModelConfig {
    /// From an HF `config.json` (e.g. a bare one given to `kvrun plan`).
    pub fn from_hf_config_json(json: &str) -> Result<Self, LoadError> {
        Self::from_hf_config_json_with_extras(json).map(|(config, _)| config)
    }

    /// From an HF `config.json`, also returning what it says about dtype and special tokens.
    pub fn from_hf_config_json_with_extras(
        json: &str,
    ) -> Result<(Self, HfConfigExtras), LoadError> {
        let c: HfConfigJson = serde_json::from_str(json).map_err(|e| {
            LoadError::config(format!(
                "config.json is not a Llama/Qwen2-style config ({e}); pass the model's own \
                 config.json"
            ))
        })?;
        let arch_name = c.architectures.first().map(String::as_str).unwrap_or("");
        let arch = match arch_name {
            "LlamaForCausalLM" | "MistralForCausalLM" => Architecture::Llama,
            "Qwen2ForCausalLM" => Architecture::Qwen2,
            other => {
                return Err(LoadError::UnsupportedArchitecture {
                    found: if other.is_empty() { "(none given)" } else { other }.to_string(),
                    supported: SUPPORTED,
                })
            }
        };
        let max_pos = c.max_position_embeddings.unwrap_or(2048);
        check_sliding_window(arch_name, arch, &c, max_pos)?;
        check_hf_rope_scaling(c.rope_scaling.as_ref())?;
        let num_kv_heads = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
        let head_dim = c.head_dim.unwrap_or(c.hidden_size / c.num_attention_heads.max(1));
        let config = ModelConfig {
            arch,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_layers: c.num_hidden_layers,
            num_heads: c.num_attention_heads,
            num_kv_heads,
            head_dim,
            vocab_size: c.vocab_size,
            rms_norm_eps: c.rms_norm_eps.unwrap_or(1e-6) as f32,
            layers: full_layers(
                c.num_hidden_layers,
                Rope { theta: c.rope_theta.unwrap_or(10_000.0), scaling: RopeScaling::None },
            ),
            // HF safetensors weights are not permuted: rotate_half pairs for every arch.
            rope_style: RopeStyle::Neox,
            max_position_embeddings: max_pos,
            tie_word_embeddings: c.tie_word_embeddings,
            attention_bias: arch == Architecture::Qwen2 || c.attention_bias,
            qk_norm: false,
            activation: Activation::Silu,
            embedding_scale: None,
            post_norms: false,
            attention_scale: inv_sqrt(head_dim),
            norm_weight_offset: 0.0,
        };
        config.validate()?;
        let extras = HfConfigExtras {
            torch_dtype: c.torch_dtype.or(c.dtype),
            bos_token_id: c.bos_token_id,
            eos_token_ids: token_id_list(c.eos_token_id.as_ref()),
        };
        Ok((config, extras))
    }

    /// From GGUF metadata (`{arch}.*` keys) and the tensor list (tied head, biases).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, LoadError> {
        let arch_name = file.get_str("general.architecture").ok_or_else(|| {
            LoadError::config(
                "GGUF key general.architecture is missing; the file was not written by a \
                 llama.cpp converter, re-convert it",
            )
        })?;
        let (arch, rope_style) = match arch_name {
            // GGUF Llama Q/K rows were permuted by the converter: adjacent-pair RoPE.
            "llama" => (Architecture::Llama, RopeStyle::Interleaved),
            "qwen2" => (Architecture::Qwen2, RopeStyle::Neox),
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
                "{arch_name}.attention.head_count is 0; the model's config is broken, \
                 re-download or re-convert it"
            )));
        }
        let head_dim = m.usize_or("attention.key_length", hidden_size / num_heads.max(1))?;
        check_gguf_rope(&m, head_dim)?;
        let vocab_size = match m.opt_usize("vocab_size")? {
            Some(v) => v,
            None => gguf_vocab_len(file)?,
        };
        let num_layers = m.usize("block_count")?;
        let theta = f64::from(m.f32_or("rope.freq_base", 10_000.0)?);
        let config = ModelConfig {
            arch,
            hidden_size,
            intermediate_size: m.usize("feed_forward_length")?,
            num_layers,
            num_heads,
            num_kv_heads: m.usize_or("attention.head_count_kv", num_heads)?,
            head_dim,
            vocab_size,
            rms_norm_eps: m.f32("attention.layer_norm_rms_epsilon")?,
            layers: full_layers(num_layers, Rope { theta, scaling: RopeScaling::None }),
            rope_style,
            max_position_embeddings: m.usize("context_length")?,
            tie_word_embeddings: file.tensor_info("output.weight").is_none(),
            attention_bias: file.tensor_info("blk.0.attn_q.bias").is_some(),
            qk_norm: false,
            activation: Activation::Silu,
            embedding_scale: None,
            post_norms: false,
            attention_scale: inv_sqrt(head_dim),
            norm_weight_offset: 0.0,
        };
        config.validate()?;
        Ok(config)
    }

    /// The shape rules every kernel relies on.
    pub fn validate(&self) -> Result<(), LoadError> {
        let sizes = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(LoadError::config(format!(
                "{name} is 0; the model's config is broken, re-download or re-convert it"
            )));
        }
        if self.num_heads % self.num_kv_heads != 0 {
            return Err(LoadError::config(format!(
                "num_heads = {} is not a multiple of num_kv_heads = {}; grouped-query attention \
                 needs whole groups, so the config is broken",
                self.num_heads, self.num_kv_heads
            )));
        }
        if self.head_dim % 2 != 0 {
            return Err(LoadError::config(format!(
                "head_dim = {} is odd; RoPE rotates pairs, so it must be even",
                self.head_dim
            )));
        }
        if self.sizes_overflow() {
            return Err(LoadError::config(format!(
                "the sizes (hidden_size {}, intermediate_size {}, num_layers {}, num_heads {}, \
                 num_kv_heads {}, head_dim {}, vocab_size {}, max_position_embeddings {}) \
                 overflow 64-bit arithmetic in the weight or KV-cache byte counts; the config is \
                 broken, re-download or re-convert it",
                self.hidden_size,
                self.intermediate_size,
                self.num_layers,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.vocab_size,
                self.max_position_embeddings
            )));
        }
        let positive = |v: f32| v.is_finite() && v > 0.0;
        if !positive(self.rms_norm_eps) || !positive(self.attention_scale) {
            return Err(LoadError::config(format!(
                "rms_norm_eps = {} and the attention scale {} must be positive and finite",
                self.rms_norm_eps, self.attention_scale
            )));
        }
        if !self.norm_weight_offset.is_finite()
            || self.embedding_scale.is_some_and(|s| !positive(s))
        {
            return Err(LoadError::config(format!(
                "norm weight offset {} and embedding scale {:?} must be finite (and the scale \
                 positive); the model's config is broken",
                self.norm_weight_offset, self.embedding_scale
            )));
        }
        self.validate_layers()
    }

    /// One [`LayerSpec`] per layer, each window at least 1, each RoPE well-formed.
    fn validate_layers(&self) -> Result<(), LoadError> {
        if self.layers.len() != self.num_layers {
            return Err(LoadError::config(format!(
                "{} layer specs for num_layers = {}; the model's config is broken",
                self.layers.len(),
                self.num_layers
            )));
        }
        for (i, layer) in self.layers.iter().enumerate() {
            if layer.attention == (AttentionKind::Sliding { window: 0 }) {
                return Err(LoadError::config(format!(
                    "layer {i} has a sliding window of 0 tokens; the model's config is broken"
                )));
            }
            let theta = layer.rope.theta;
            if !(theta.is_finite() && theta > 0.0) {
                return Err(LoadError::config(format!(
                    "layer {i}: rope_theta = {theta} must be positive and finite"
                )));
            }
        }
        Ok(())
    }

    /// Every distinct [`Rope`] of the layers, in order of first use (one RoPE table each).
    pub fn distinct_ropes(&self) -> Vec<Rope> {
        let mut ropes: Vec<Rope> = Vec::new();
        for layer in &self.layers {
            if !ropes.contains(&layer.rope) {
                ropes.push(layer.rope);
            }
        }
        ropes
    }
}

/// `num_layers` full-attention layers sharing one RoPE (Llama, Qwen2 without a window).
fn full_layers(num_layers: usize, rope: Rope) -> Vec<LayerSpec> {
    vec![LayerSpec { attention: AttentionKind::Full, rope }; num_layers]
}

/// `1/sqrt(head_dim)`: the softmax scale of every architecture but Gemma 3 27B.
pub(crate) fn inv_sqrt(head_dim: usize) -> f32 {
    (1.0 / (head_dim.max(1) as f64).sqrt()) as f32
}

impl ModelConfig {
    /// Whether f32 bytes of all weights, or f32 K+V bytes of one `max_position_embeddings`
    /// sequence, overflow u64: every size downstream (`plan`, buffers) is then meaningless.
    fn sizes_overflow(&self) -> bool {
        let sizes = || -> Option<()> {
            let n = |v: usize| u64::try_from(v).ok();
            let (hidden, ffn, layers) =
                (n(self.hidden_size)?, n(self.intermediate_size)?, n(self.num_layers)?);
            let q = n(self.num_heads)?.checked_mul(n(self.head_dim)?)?;
            let kv = n(self.num_kv_heads)?.checked_mul(n(self.head_dim)?)?;
            let attn = hidden.checked_mul(q.checked_mul(2)?.checked_add(kv.checked_mul(2)?)?)?;
            let mlp = hidden.checked_mul(ffn)?.checked_mul(3)?;
            let layer = attn.checked_add(mlp)?.checked_add(hidden.checked_mul(2)?)?;
            let embd = n(self.vocab_size)?.checked_mul(hidden)?.checked_mul(2)?;
            layers.checked_mul(layer)?.checked_add(embd)?.checked_mul(4)?;
            let kv_token = layers.checked_mul(kv)?.checked_mul(2 * 4)?;
            kv_token.checked_mul(n(self.max_position_embeddings)?)?;
            Some(())
        };
        sizes().is_none()
    }
}

/// Sliding-window attention is refused until kvrun implements it (Mistral v0.1 has a 4096
/// window under 32k positions). A window no smaller than the context changes nothing; Qwen2
/// configs carry a `sliding_window` that only counts when `use_sliding_window` is true.
fn check_sliding_window(
    arch_name: &str,
    arch: Architecture,
    c: &HfConfigJson,
    max_pos: usize,
) -> Result<(), LoadError> {
    let window_on = c.use_sliding_window.unwrap_or(arch == Architecture::Llama);
    match (window_on, c.sliding_window) {
        (true, Some(window)) if window < max_pos => Err(LoadError::config(format!(
            "{arch_name} uses sliding-window attention (sliding_window = {window} < \
             max_position_embeddings = {max_pos}), which kvrun does not support yet; use a \
             model without a sliding window (e.g. Mistral-7B v0.2 or later)"
        ))),
        _ => Ok(()),
    }
}

/// HF `rope_scaling`: absent, null or type "default" is plain RoPE; anything else changes the
/// rotation frequencies, which kvrun does not implement yet.
fn check_hf_rope_scaling(scaling: Option<&serde_json::Value>) -> Result<(), LoadError> {
    let Some(obj) = scaling.and_then(|v| v.as_object()) else {
        return Ok(());
    };
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("unknown");
    if kind == "default" {
        return Ok(());
    }
    Err(LoadError::config(format!(
        "rope_scaling type '{kind}' is not supported yet (kvrun implements plain RoPE); use a \
         model without rope_scaling"
    )))
}

/// GGUF RoPE keys that would change the rotation: partial rotary dims and frequency scaling.
fn check_gguf_rope(m: &GgufKeys<'_>, head_dim: usize) -> Result<(), LoadError> {
    if let Some(dims) = m.opt_usize("rope.dimension_count")? {
        if dims != head_dim {
            return Err(LoadError::config(format!(
                "{}.rope.dimension_count = {dims} differs from head_dim = {head_dim} (partial \
                 rotary embeddings), which kvrun does not support yet",
                m.arch
            )));
        }
    }
    let scaling = m.file.get_str(&format!("{}.rope.scaling.type", m.arch));
    let has_freqs = m.file.tensor_info("rope_freqs.weight").is_some();
    if matches!(scaling, Some(s) if s != "none") || has_freqs {
        return Err(LoadError::config(format!(
            "this GGUF scales RoPE frequencies ({}), which kvrun does not support yet; use a \
             model without rope scaling",
            scaling.unwrap_or("rope_freqs.weight, Llama-3.1 style")
        )));
    }
    Ok(())
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

    fn f32_or(&self, suffix: &str, default: f32) -> Result<f32, LoadError> {
        Ok(self.opt_f32(suffix)?.unwrap_or(default))
    }

    fn missing(&self, suffix: &str) -> LoadError {
        LoadError::config(format!(
            "GGUF key {}.{suffix} is missing; the file is incomplete, re-convert it with a \
             current llama.cpp",
            self.arch
        ))
    }
}
