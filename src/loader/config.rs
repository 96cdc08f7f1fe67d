//! [`ModelConfig`]: the hyper-parameters of a decoder-only model, resolved once from GGUF
//! metadata or an HF `config.json`, validated, and never mutated afterwards.

use super::error::LoadError;
use super::gguf::GgufFile;
use serde::Serialize;

/// The architectures kvrun runs, as named in errors.
pub(super) const SUPPORTED: &str =
    "Llama (incl. Mistral), Qwen2, Qwen3, Qwen3-MoE, Qwen3.5, Qwen3.5-MoE, \
     Gemma 3, Gemma 4 (dense text), DeepSeek-V2/V3 (MLA, experts), gpt-oss";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Architecture {
    /// Llama 1/2/3 and everything shaped like it. Mistral is `general.architecture = llama` in
    /// GGUF and `MistralForCausalLM` in HF; both load as Llama.
    Llama,
    /// Qwen2 / Qwen2.5: Llama plus biases on the q/k/v projections.
    Qwen2,
    /// Qwen3 (dense): Qwen2 without the q/k/v biases, with an RMSNorm over each Q and K head
    /// before RoPE (plain weights, not Gemma's `1 + w`) and an explicit head_dim (0.6B:
    /// 16 heads × 128 ≠ hidden 1024).
    Qwen3,
    /// Qwen3-MoE (`Qwen3MoeForCausalLM`, GGUF `qwen3moe`): Qwen3's attention with a
    /// mixture-of-experts MLP in every layer ([`Moe`]: softmax routing over the experts, the
    /// top `experts_used`, no shared expert).
    Qwen3Moe,
    /// Gemma 3 (text): Q/K norms, GELU-tanh MLP, scaled embeddings, post-norms, and
    /// interleaved sliding-window (local) and full (global) layers with their own RoPE.
    Gemma3,
    /// Gemma 4 (dense text; `Gemma4ForCausalLM`, the text model of
    /// `Gemma4ForConditionalGeneration`, GGUF `gemma4`): Gemma 3's layout with global layers of
    /// their own head shape and K = V ([`GlobalLayers`]), proportional RoPE on them
    /// ([`RopeScaling::Proportional`]), V RMS-normed without a weight, attention scale 1,
    /// plain `x · w` norms, a per-layer output scale (`layer_output_scale`) and a final logit
    /// soft-cap. Per-layer embeddings (E2B/E4B), KV sharing across layers and the MoE block
    /// (26B-A4B) are refused at load.
    Gemma4,
    /// DeepSeek-V2/V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`): multi-head latent
    /// attention ([`Mla`]) and SwiGLU MLPs; mixture-of-experts layers ([`Moe`]: V2's softmax
    /// routing, group-limited or not, or V3's biased sigmoid; scaled, with shared experts)
    /// from `first_k_dense_replace` on.
    Deepseek2,
    /// Qwen3.5 (dense; `Qwen3_5ForCausalLM`, the text model of
    /// `Qwen3_5ForConditionalGeneration`, GGUF `qwen35`): a hybrid whose layers are mostly Gated
    /// DeltaNet ([`DeltaNet`], [`AttentionKind::Recurrent`]: a fixed-size state per sequence,
    /// no KV) with every fourth a full attention layer with an output gate, Q/K norms and
    /// partial RoPE; RMSNorms `x · (1 + w)` (zero-centred). Qwen3.5-MoE (`Qwen3_5MoeForCausalLM`,
    /// GGUF `qwen35moe`) is this architecture with [`Moe`] in every layer and a sigmoid-gated
    /// shared expert.
    Qwen35,
    /// gpt-oss (`GptOssForCausalLM`, GGUF `gpt-oss`): Llama's layer with biases on q, k, v and
    /// o, an attention sink per query head, sliding-window (even layers) and full layers in
    /// turn, YaRN without truncation, and a mixture of biased experts in every layer (softmax
    /// over the router's top k logits, the router biased too) with the clamped SwiGLU
    /// ([`Activation::SwigluOai`]).
    GptOss,
}

/// A Gated DeltaNet layer's shape (Qwen3.5's linear attention, transformers'
/// `Qwen3_5GatedDeltaNet`): q and k heads of `key_head_dim`, v heads of `value_head_dim`, a
/// causal conv of `conv_taps` over the q|k|v channels. Its per-sequence memory is a conv state
/// of `conv_taps − 1` inputs and a recurrent state `[value_heads, key_head_dim,
/// value_head_dim]` f32, whatever the context length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct DeltaNet {
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    pub conv_taps: usize,
    /// Value head h reads key head h % key_heads: llama.cpp's converter reorders a GGUF's value
    /// heads that way; transformers' (HF) order is h / (value_heads / key_heads).
    pub key_heads_tiled: bool,
}

impl DeltaNet {
    /// Channels of the conv (and of `in_proj_qkv`'s output): q, k, v.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim
    }

    /// Channels of the values (and of the gate `z` and the output's input).
    pub fn value_dim(&self) -> usize {
        self.value_heads * self.value_head_dim
    }

    /// f32 bytes of one sequence's recurrent state `[value heads, key_head_dim,
    /// value_head_dim]` in one layer (the larger of a slot's two buffers).
    pub fn recurrent_state_bytes(&self) -> u64 {
        4 * (self.value_heads * self.key_head_dim * self.value_head_dim) as u64
    }

    /// f32 bytes of one sequence's state in one layer: the conv state and the recurrent state.
    pub fn state_bytes(&self) -> u64 {
        let conv = (self.conv_taps.saturating_sub(1) * self.conv_channels()) as u64;
        4 * conv + self.recurrent_state_bytes()
    }

    /// Every size in `1..=2^16`, value heads whole groups of key heads, taps ≥ 2.
    pub(super) fn check(&self) -> Result<(), LoadError> {
        let dims = [
            ("linear key heads", self.key_heads),
            ("linear value heads", self.value_heads),
            ("linear key head dim", self.key_head_dim),
            ("linear value head dim", self.value_head_dim),
            ("linear conv kernel", self.conv_taps),
        ];
        if let Some((name, v)) = dims.iter().find(|(_, v)| *v == 0 || *v > 1 << 16) {
            return Err(LoadError::config(format!(
                "Gated DeltaNet {name} = {v} is 0 or absurdly large; the model's config is broken"
            )));
        }
        if !self.value_heads.is_multiple_of(self.key_heads) || self.conv_taps < 2 {
            return Err(LoadError::config(format!(
                "Gated DeltaNet with {} value heads over {} key heads and a {}-tap conv: the \
                 value heads must be whole groups of key heads and the conv at least 2 taps; \
                 the model's config is broken",
                self.value_heads, self.key_heads, self.conv_taps
            )));
        }
        Ok(())
    }
}

/// Multi-head latent attention (DeepSeek-V2/V3): per token and layer the KV cache holds one
/// compressed latent `c_kv` (`kv_lora_rank`) and one RoPE key `k_pe` (`qk_rope_head_dim`)
/// shared by all heads. A head's key is `[W_UK_h · c_kv ; k_pe]` and its value `W_UV_h · c_kv`
/// (`kv_b_proj`); kvrun folds `W_UK_h` into the query and `W_UV_h` into the output (the
/// absorbed form), so attention itself is one MQA "head" of `kv_lora_rank + qk_rope_head_dim`
/// channels whose values are the first `kv_lora_rank` of its keys. For such a model
/// [`ModelConfig::head_dim`] is that latent width and `num_kv_heads` is 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Mla {
    /// Rank of the query's low-rank path (`q_a_proj → RMSNorm → q_b_proj`); `None`: `q_proj`.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    /// Per-head query/key channels without RoPE (`W_UK_h` has this many rows).
    pub qk_nope_head_dim: usize,
    /// Channels of the RoPE part of each query head and of the shared `k_pe`.
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
}

impl Mla {
    /// Every rank and head size in `1..=2^20`: what the sums below and every byte count
    /// downstream need. Parsers call it before using them.
    pub(super) fn check_dims(&self) -> Result<(), LoadError> {
        let dims = [
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("v_head_dim", self.v_head_dim),
            ("q_lora_rank", self.q_lora_rank.unwrap_or(1)),
        ];
        match dims.iter().find(|(_, v)| *v == 0 || *v > 1 << 20) {
            Some((name, v)) => Err(LoadError::config(format!(
                "MLA {name} = {v} is 0 or absurdly large; the model's config is broken"
            ))),
            None => Ok(()),
        }
    }

    /// Channels of one query head: `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn q_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Channels one token caches per layer: `kv_lora_rank + qk_rope_head_dim`.
    pub fn latent_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

/// What Gemma 4's full-attention ("global") layers do differently from its sliding ones: a
/// KV head shape of their own (fewer, wider heads: 512 channels where the sliding layers have
/// 256), and K = V (`attention_k_eq_v`).
/// A mixture-of-experts MLP (Qwen3-MoE, DeepSeek-V2/V3): per token, a router (`ffn_gate_inp`,
/// [experts, hidden]) scores every expert ([`MoeScoring`]: softmax into probabilities, or
/// DeepSeek-V3's sigmoid with a bias for the choice), the
/// `experts_used` best-scored experts run (each a SwiGLU MLP of `expert_ffn` channels) and
/// their outputs are summed weighted by those probabilities — renormalised to sum to 1 when
/// `norm_topk_prob`, then times `routed_scale` — plus a shared expert every token runs: a dense
/// MLP of `shared_ffn` channels (DeepSeek's shared experts: `n_shared_experts · expert_ffn`;
/// Qwen3.5-MoE's, times `sigmoid(x · ffn_gate_inp_shexp)` when `shared_gate`). With `groups` > 1 (DeepSeek-V2's group-limited greedy routing) the
/// experts are `groups` equal groups and a token chooses among the `groups_used` groups of
/// highest best probability only. Layers `first_dense..` whose index is a multiple of
/// `layer_step` are mixtures; the others are dense.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Moe {
    pub experts: usize,
    pub experts_used: usize,
    pub expert_ffn: usize,
    pub norm_topk_prob: bool,
    pub scoring: MoeScoring,
    /// Channels of the shared expert's MLP (0: none).
    pub shared_ffn: usize,
    /// The shared expert's output is scaled by a sigmoid gate of the input (Qwen3.5-MoE).
    pub shared_gate: bool,
    /// The router (`ffn_gate_inp.bias`) and every expert's rows (`ffn_{gate,up,down}_exps.bias`)
    /// have biases (gpt-oss).
    pub biases: bool,
    pub routed_scale: f32,
    pub groups: usize,
    pub groups_used: usize,
    pub first_dense: usize,
    pub layer_step: usize,
}

/// Most query heads of a layer with attention sinks (gpt-oss): the attention kernels' own
/// bound, `kernels::attention::MAX_SINK_HEADS` (asserted equal there).
pub const MAX_SINK_HEADS: usize = 128;

/// How a mixture's router turns its logits into the experts' weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoeScoring {
    /// Softmax over all experts; the most probable are chosen and weighted by their
    /// probabilities; groups (DeepSeek-V2's `group_limited_greedy`) rank by their best expert.
    /// Qwen3-MoE, Qwen3.5-MoE, DeepSeek-V2; llama.cpp `expert_gating_func` 1.
    Softmax,
    /// DeepSeek-V3's `noaux_tc`: each expert's score is `sigmoid(logit)`; the choice ranks
    /// `score + bias` (the router's per-expert `e_score_correction_bias`, GGUF
    /// `blk.L.exp_probs_b.bias`), groups by the sum of their two best biased scores; the chosen
    /// are weighted by their unbiased scores. llama.cpp `expert_gating_func` 2.
    SigmoidBiased,
}

impl Moe {
    /// Most experts a token may use: the routing kernel's (`kernels::moe::MAX_USED`, which
    /// asserts the two agree at compile time).
    pub const MAX_USED: usize = 32;
    /// Most expert groups (the routing kernel keeps the chosen ones in one 32-bit mask:
    /// `kernels::moe::MAX_GROUPS`).
    pub const MAX_GROUPS: usize = 32;

    /// Qwen3-MoE's: experts in every layer, no shared expert, one group, unscaled.
    pub fn every_layer(experts: usize, experts_used: usize, expert_ffn: usize, norm: bool) -> Self {
        Moe {
            experts,
            experts_used,
            expert_ffn,
            norm_topk_prob: norm,
            scoring: MoeScoring::Softmax,
            shared_ffn: 0,
            shared_gate: false,
            biases: false,
            routed_scale: 1.0,
            groups: 1,
            groups_used: 1,
            first_dense: 0,
            layer_step: 1,
        }
    }

    /// Whether layer `l`'s MLP is this mixture (else it is dense).
    pub fn is_layer(&self, l: usize) -> bool {
        l >= self.first_dense && l.is_multiple_of(self.layer_step.max(1))
    }

    pub(super) fn check(&self) -> Result<(), LoadError> {
        let Moe { experts, experts_used, expert_ffn, groups, groups_used, .. } = *self;
        if experts == 0 || experts > 1 << 16 || expert_ffn == 0 || expert_ffn > 1 << 20 {
            return Err(LoadError::config(format!(
                "{experts} experts of {expert_ffn} channels: both must be positive and sane; the \
                 model's config is broken"
            )));
        }
        if experts_used == 0 || experts_used > experts || experts_used > Self::MAX_USED {
            return Err(LoadError::config(format!(
                "{experts_used} experts used per token of {experts}: it must be 1 to {} (and at \
                 most {}); the model's config is broken",
                experts,
                Self::MAX_USED
            )));
        }
        let whole = groups > 0 && experts.is_multiple_of(groups) && groups <= Self::MAX_GROUPS;
        let enough = groups_used > 0
            && groups_used <= groups
            && groups_used * (experts / groups.max(1)) >= experts_used;
        if !whole || !enough {
            return Err(LoadError::config(format!(
                "{experts} experts in {groups} groups, {groups_used} of them chosen, for \
                 {experts_used} experts a token: the groups must divide the experts (at most {}) \
                 and the chosen ones hold enough experts; the model's config is broken",
                Self::MAX_GROUPS
            )));
        }
        if self.scoring == MoeScoring::SigmoidBiased && groups > 1 && experts / groups < 2 {
            return Err(LoadError::config(format!(
                "{experts} experts in {groups} groups: sigmoid routing ranks a group by its two \
                 best experts, so a group needs at least two; the model's config is broken"
            )));
        }
        if !(self.routed_scale.is_finite() && self.routed_scale > 0.0) || self.shared_ffn > 1 << 20
        {
            return Err(LoadError::config(format!(
                "routed scaling factor {} and a shared expert of {} channels: the factor must be \
                 positive and finite, the shared expert sane; the model's config is broken",
                self.routed_scale, self.shared_ffn
            )));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct GlobalLayers {
    /// KV heads of these layers (their query heads are the model's `num_heads`).
    pub num_kv_heads: usize,
    /// Channels of each of their Q, K and V heads.
    pub head_dim: usize,
    /// No V projection: the values are the K projection's rows, RMS-normed without a weight
    /// and not rotated (HF `attention_k_eq_v`; GGUF: no `attn_v`).
    pub values_from_keys: bool,
}

/// How a layer's attention sees the past.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum AttentionKind {
    /// Every earlier position of the sequence.
    Full,
    /// A query at position p sees keys at positions (p - window, p].
    Sliding { window: usize },
    /// No attention and no KV: a recurrent layer (Gated DeltaNet, [`ModelConfig::delta_net`])
    /// whose memory of the past is a fixed-size state per sequence.
    Recurrent,
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
        /// The ramp's ends rounded to whole dimensions (HF's `truncate`, true unless the
        /// config says false: gpt-oss; llama.cpp always rounds).
        truncate: bool,
    },
    /// Gemma 4's "proportional" RoPE (global layers): NEOX pairs over the whole head, the first
    /// `floor(partial_rotary_factor · head_dim / 2)` with frequencies `theta^(-2j/head_dim)`,
    /// the rest not rotated (frequency 0), every frequency divided by `factor`. llama.cpp
    /// stores the same as `rope_freqs` divisors of 1 and 1e30.
    Proportional { partial_rotary_factor: f64, factor: f64 },
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
    /// `silu(gate) · up`: Llama, Qwen2, Qwen3.
    Silu,
    /// `gelu_tanh(gate) · up` (HF `gelu_pytorch_tanh`): Gemma.
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (transformers' `GptOssExperts`, ggml's `swiglu_oai`):
    /// `g · σ(1.702 g) · (u + 1)` with `g = min(gate, 7)`, `u = clamp(up, −7, 7)`.
    SwigluOai,
}

impl Activation {
    pub const ALL: [Activation; 3] =
        [Activation::Silu, Activation::GeluTanh, Activation::SwigluOai];
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
    /// RoPE, as in Gemma 3 and Qwen3.
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
    /// [head_dim / 2] divisors of each pair's RoPE frequency on every layer: GGUF
    /// `rope_freqs.weight`, in which llama.cpp's converter precomputes Llama 3.1's `llama3`
    /// scaling (the GGUF carries no scaling keys then). `None`: no divisors.
    pub rope_freq_factors: Option<Vec<f32>>,
    /// Partial rotary embeddings: RoPE rotates the first `d` channels of every Q and K head
    /// (pairs as `rope_style` says, within those `d`, frequencies `base^(-2i/d)`) and leaves
    /// the rest as they are: a Gemma 3 GGUF's `rope.dimension_count` below head_dim, which
    /// llama.cpp passes as `n_rot` (the HF architectures kvrun loads rotate whole heads, as
    /// transformers does whatever `partial_rotary_factor` says). `None`: whole heads. Even,
    /// below head_dim.
    pub rotary_dims: Option<usize>,
    /// Multi-head latent attention (DeepSeek); `None` for every other architecture.
    pub mla: Option<Mla>,
    /// Layers whose MLP is a mixture of experts. Without [`ModelConfig::moe`] (DeepSeek's
    /// experts) kvrun does not run them: a model with any is refused at load (`plan` still sizes
    /// its KV).
    pub moe_layers: usize,
    /// The experts' shape where kvrun runs them (Qwen3-MoE, DeepSeek-V2).
    pub moe: Option<Moe>,
    /// The shape of the [`AttentionKind::Recurrent`] layers (Qwen3.5's Gated DeltaNet);
    /// `None` when there are none.
    pub delta_net: Option<DeltaNet>,
    /// The attention output is multiplied by `sigmoid(gate)` before `o_proj`, the gate being
    /// the second half of each head's `q_proj` rows (Qwen3.5's gated attention).
    pub attn_output_gate: bool,
    /// `logits = cap · tanh(logits / cap)` after the LM head (Gemma 4's
    /// `final_logit_softcapping`); `None`: none.
    pub final_logit_softcap: Option<f32>,
    /// Gemma 4: the full-attention layers' own head shape and K = V; `None`: every layer with
    /// attention has `num_kv_heads` heads of `head_dim` ([`ModelConfig::layer_heads`]).
    pub global_layers: Option<GlobalLayers>,
}

/// What an HF `config.json` says beyond [`ModelConfig`] (for `kvrun plan` on a bare config).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HfConfigExtras {
    /// `torch_dtype` (or the newer `dtype`), e.g. `"bfloat16"`.
    pub torch_dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    /// `eos_token_id`, an int or a list in the file.
    pub eos_token_ids: Vec<u32>,
    /// `quantization_config.quant_method`, e.g. `"mxfp4"` (gpt-oss's experts).
    pub quant_method: Option<String>,
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
        super::config_hf::parse(json)
    }

    /// From GGUF metadata (`{arch}.*` keys) and the tensor list (tied head, biases, RoPE
    /// frequency factors).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, LoadError> {
        super::config_gguf::parse(file)
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
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(LoadError::config(format!(
                "num_heads = {} is not a multiple of num_kv_heads = {}; grouped-query attention \
                 needs whole groups, so the config is broken",
                self.num_heads, self.num_kv_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(LoadError::config(format!(
                "head_dim = {} is odd; RoPE rotates pairs, so it must be even",
                self.head_dim
            )));
        }
        if self.arch == Architecture::GptOss && self.num_heads > MAX_SINK_HEADS {
            return Err(LoadError::config(format!(
                "{} query heads with attention sinks: kvrun's attention kernels hold the sinks of \
                 at most {MAX_SINK_HEADS} heads; the model's config is broken",
                self.num_heads
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
        if let Some(d) = self.rotary_dims {
            if d == 0 || d % 2 != 0 || d >= self.head_dim || self.mla.is_some() {
                return Err(LoadError::config(format!(
                    "{d} rotary channels of a {}-channel head: partial RoPE needs an even \
                     count below head_dim (and no MLA, whose RoPE part has its own width); the \
                     model's config is broken",
                    self.head_dim
                )));
            }
        }
        if self.final_logit_softcap.is_some_and(|c| !positive(c)) {
            return Err(LoadError::config(format!(
                "final logit soft-cap {:?} must be positive and finite; the model's config is \
                 broken",
                self.final_logit_softcap
            )));
        }
        self.validate_global_layers()?;
        self.validate_mla()?;
        self.validate_delta_net()?;
        if let Some(m) = self.moe {
            m.check()?;
        }
        self.validate_layers()
    }

    /// Gemma 4's global layers: whole groups of query heads over their KV heads, an even head
    /// size within the byte counts' range, no MLA.
    fn validate_global_layers(&self) -> Result<(), LoadError> {
        let Some(g) = self.global_layers else { return Ok(()) };
        let (kvh, hd) = (g.num_kv_heads, g.head_dim);
        if kvh == 0 || hd == 0 || hd % 2 != 0 || hd > 1 << 16 || !self.num_heads.is_multiple_of(kvh)
        {
            return Err(LoadError::config(format!(
                "global layers of {kvh} KV heads × {hd} channels under {} query heads: the head \
                 size must be even and the query heads whole groups of the KV heads; the \
                 model's config is broken",
                self.num_heads
            )));
        }
        if self.mla.is_some() {
            return Err(LoadError::config("global layers of their own shape beside MLA"));
        }
        Ok(())
    }

    /// Recurrent layers exactly when there is a [`DeltaNet`] shape, and at least one layer with
    /// attention (the KV cache, positions and the scheduler hang on it).
    fn validate_delta_net(&self) -> Result<(), LoadError> {
        let recurrent = self.num_recurrent_layers();
        match self.delta_net {
            Some(d) => d.check()?,
            None if recurrent > 0 => {
                return Err(LoadError::config(format!(
                    "{recurrent} recurrent (linear attention) layers but no Gated DeltaNet \
                     shape; the model's config is broken"
                )))
            }
            None => {}
        }
        if recurrent == self.layers.len() && !self.layers.is_empty() {
            return Err(LoadError::config(
                "every layer is recurrent (linear attention); kvrun needs at least one \
                 attention layer"
                    .to_string(),
            ));
        }
        Ok(())
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
            check_scaling(&layer.rope.scaling).map_err(|m| {
                LoadError::config(format!("layer {i}: {m}; fix the model's config"))
            })?;
        }
        if let Some(f) = &self.rope_freq_factors {
            if f.len() != self.rope_dim() / 2 || f.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
                return Err(LoadError::config(format!(
                    "rope_freqs.weight has {} factors for head_dim = {} (needs one per rotated \
                     channel pair, {}, all positive); re-convert the model",
                    f.len(),
                    self.head_dim,
                    self.rope_dim() / 2
                )));
            }
        }
        Ok(())
    }

    /// Channels RoPE rotates in each Q/K head: `qk_rope_head_dim` with MLA (the last ones),
    /// [`ModelConfig::rotary_dims`] with partial RoPE (the first ones), else `head_dim`.
    pub fn rope_dim(&self) -> usize {
        match self.mla {
            Some(m) => m.qk_rope_head_dim,
            None => self.rotary_dims.unwrap_or(self.head_dim),
        }
    }

    /// Whether the values live inside the cached keys (MLA's latent): the KV cache then holds
    /// one row of `head_dim` per token and layer, not a K and a V row.
    pub fn values_in_keys(&self) -> bool {
        self.mla.is_some()
    }

    /// MLA's shape rules: every rank non-zero, an even RoPE part, and the KV shape it implies
    /// (one latent "head" of `kv_lora_rank + qk_rope_head_dim`).
    fn validate_mla(&self) -> Result<(), LoadError> {
        let Some(m) = self.mla else { return Ok(()) };
        m.check_dims()?;
        if m.qk_rope_head_dim % 2 != 0 {
            return Err(LoadError::config(format!(
                "qk_rope_head_dim = {} is odd; RoPE rotates pairs, so it must be even",
                m.qk_rope_head_dim
            )));
        }
        if self.num_kv_heads != 1 || self.head_dim != m.latent_width() {
            return Err(LoadError::config(format!(
                "an MLA model caches one latent of kv_lora_rank + qk_rope_head_dim = {} channels \
                 per token, not {} heads of {}",
                m.latent_width(),
                self.num_kv_heads,
                self.head_dim
            )));
        }
        Ok(())
    }

    /// Whether layer `l`'s MLP is a mixture of experts kvrun runs ([`Moe::is_layer`]).
    pub fn is_moe_layer(&self, l: usize) -> bool {
        self.moe.is_some_and(|m| m.is_layer(l))
    }

    /// Widest dense MLP a step computes: the dense layers' (`intermediate_size`) where there
    /// are any, and the shared experts' of a mixture; 0 for a mixture in every layer without
    /// shared experts.
    pub fn dense_ffn_width(&self) -> usize {
        let dense = (0..self.num_layers).any(|l| !self.is_moe_layer(l));
        let shared = self.moe.map_or(0, |m| m.shared_ffn);
        shared.max(if dense { self.intermediate_size } else { 0 })
    }

    /// Layers whose memory is a recurrent state instead of KV ([`AttentionKind::Recurrent`]).
    pub fn num_recurrent_layers(&self) -> usize {
        self.layers.iter().filter(|l| l.attention == AttentionKind::Recurrent).count()
    }

    /// f32 bytes of one sequence's states over every recurrent layer (conv + recurrent state,
    /// [`DeltaNet::state_bytes`] each), whatever its length; 0 for attention-only models.
    pub fn state_bytes_per_sequence(&self) -> u64 {
        let per_layer = self.delta_net.map_or(0, |d| d.state_bytes());
        per_layer.saturating_mul(self.num_recurrent_layers() as u64)
    }

    /// Every distinct [`Rope`] of the layers with the channels it rotates
    /// ([`ModelConfig::layer_rope_dim`]), in order of first use (one RoPE table each).
    pub fn distinct_ropes(&self) -> Vec<(Rope, usize)> {
        let mut ropes: Vec<(Rope, usize)> = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            let rope = (layer.rope, self.layer_rope_dim(l));
            if !ropes.contains(&rope) {
                ropes.push(rope);
            }
        }
        ropes
    }

    /// Layer `l`'s KV heads and head size: [`GlobalLayers`]' on Gemma 4's full-attention
    /// layers, else `(num_kv_heads, head_dim)`.
    pub fn layer_heads(&self, l: usize) -> (usize, usize) {
        match (self.global_layers, self.layers[l].attention) {
            (Some(g), AttentionKind::Full) => (g.num_kv_heads, g.head_dim),
            _ => (self.num_kv_heads, self.head_dim),
        }
    }

    /// The distinct `(kv_heads, head_dim)` of the layers with attention, the model-wide one
    /// first: what the KV pool's blocks must hold (`quant::pool_heads`).
    pub fn head_shapes(&self) -> Vec<(usize, usize)> {
        let mut shapes = vec![(self.num_kv_heads, self.head_dim)];
        for l in 0..self.layers.len() {
            let shape = self.layer_heads(l);
            if self.layers[l].attention != AttentionKind::Recurrent && !shapes.contains(&shape) {
                shapes.push(shape);
            }
        }
        shapes
    }

    /// The widest head of any layer (activations and partials are sized for it).
    pub fn max_head_dim(&self) -> usize {
        self.global_layers.map_or(self.head_dim, |g| g.head_dim.max(self.head_dim))
    }

    /// Whether layer `l` takes its values from its K projection ([`GlobalLayers`]).
    pub fn layer_values_from_keys(&self, l: usize) -> bool {
        self.global_layers.is_some_and(|g| g.values_from_keys)
            && self.layers[l].attention == AttentionKind::Full
    }

    /// Channels RoPE rotates in layer `l`'s heads: [`ModelConfig::rope_dim`] with the layer's
    /// own head size.
    pub fn layer_rope_dim(&self, l: usize) -> usize {
        match (self.mla, self.rotary_dims) {
            (Some(m), _) => m.qk_rope_head_dim,
            (None, Some(d)) => d,
            (None, None) => self.layer_heads(l).1,
        }
    }
}

/// The ranges [`kernels::rope::inv_freqs`](crate::kernels::rope::inv_freqs) relies on.
fn check_scaling(s: &RopeScaling) -> Result<(), String> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    match *s {
        RopeScaling::None => Ok(()),
        RopeScaling::Linear { factor } if positive(factor) => Ok(()),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } if positive(factor)
            && positive(low_freq_factor)
            && high_freq_factor.is_finite()
            && high_freq_factor > low_freq_factor
            && original_max_position_embeddings > 0 =>
        {
            Ok(())
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            attention_factor,
            ..
        } if positive(factor)
            && original_max_position_embeddings > 0
            && positive(beta_fast)
            && positive(beta_slow)
            && positive(attention_factor) =>
        {
            Ok(())
        }
        RopeScaling::Proportional { partial_rotary_factor, factor }
            if (0.0..=1.0).contains(&partial_rotary_factor) && positive(factor) =>
        {
            Ok(())
        }
        other => Err(format!(
            "RoPE scaling {other:?} is out of range (factors and betas positive, Llama 3 \
             high_freq_factor > low_freq_factor, original context > 0)"
        )),
    }
}

/// Most layers a config may declare: far above any published model (≤ a few hundred), low
/// enough that the per-layer attributes are never a memory bomb.
pub(crate) const MAX_LAYERS: usize = 4096;

/// Refuses a layer count above [`MAX_LAYERS`] before anything is sized from it (0 is refused
/// by `validate`, with the other dimensions).
pub(super) fn check_num_layers(num_layers: usize, key: &str) -> Result<(), LoadError> {
    if num_layers > MAX_LAYERS {
        return Err(LoadError::config(format!(
            "{key} = {num_layers} is too large: kvrun accepts at most {MAX_LAYERS} layers; the \
             config is corrupt"
        )));
    }
    Ok(())
}

/// `num_layers` full-attention layers sharing one RoPE (Llama, Qwen2 without a window).
pub(super) fn full_layers(num_layers: usize, rope: Rope) -> Vec<LayerSpec> {
    vec![LayerSpec { attention: AttentionKind::Full, rope }; num_layers]
}

/// YaRN's magnitude correction `0.1 · m · ln(scale) + 1` (1 for `scale ≤ 1`), as HF's
/// `get_mscale` / DeepSeek's `yarn_get_mscale` compute it.
pub(crate) fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
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
