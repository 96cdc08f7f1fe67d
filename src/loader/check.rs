//! [`check_tensors`]: the config and the tensors of a model file must tell the same story.
//!
//! Buffers, `plan` figures and kernel dispatches are all sized from [`ModelConfig`]; a file whose
//! metadata claims a million layers or a 2^31-token vocabulary next to a small model's tensors
//! must be refused here, before anything is allocated from those numbers.

use super::error::LoadError;
use super::{Architecture, AttentionKind, ModelFile, SourceFormat};
use std::collections::BTreeSet;

/// One dimension the config implies: its config name and value.
type Dim = (&'static str, usize);

/// Every tensor the Llama family needs (and Gemma 3's and Qwen3's norms, DeepSeek's MLA
/// projections), with the shape the config implies, then a comparison
/// against the file. Layer count first, so a huge `block_count` costs one pass over the names.
pub(super) fn check_tensors(file: &ModelFile) -> Result<(), LoadError> {
    let c = file.config();
    if c.moe_layers > 0 && c.moe.is_none() {
        return Err(LoadError::config(format!(
            "{} of this model's {} layers are mixture-of-experts with a routing kvrun does not \
             run yet (it runs softmax routing — Qwen3-MoE, Qwen3.5-MoE, DeepSeek-V2 — and \
             DeepSeek-V3's biased sigmoid, noaux_tc); `kvrun plan` sizes its KV cache",
            c.moe_layers, c.num_layers
        )));
    }
    let layers = layers_present(file.tensor_names().into_iter());
    if layers < c.num_layers {
        return Err(too_few_layers(c.num_layers, layers));
    }
    let hidden: Dim = ("hidden_size", c.hidden_size);
    let ffn: Dim = ("intermediate_size", c.intermediate_size);
    let vocab: Dim = ("vocab_size", c.vocab_size);
    expect(file, "token_embd.weight", &[vocab, hidden])?;
    expect(file, "output_norm.weight", &[hidden])?;
    if file.has_tensor("output.weight") {
        expect(file, "output.weight", &[vocab, hidden])?;
    }
    for l in 0..c.num_layers {
        let name = |t: &str| format!("blk.{l}.{t}");
        // the layer's heads (Gemma 4's global layers have their own: ModelConfig::layer_heads)
        let (kvh, hd) = c.layer_heads(l);
        let global = (kvh, hd) != (c.num_kv_heads, c.head_dim);
        let head_dim = (if global { "global head_dim" } else { "head_dim" }, hd);
        let q_rows = product("num_heads × head_dim", ("num_heads", c.num_heads), head_dim)?;
        let kv_rows = product("num_kv_heads × head_dim", ("num_kv_heads", kvh), head_dim)?;
        // Qwen3.5's gated attention: each head's q_proj rows are its query, then its gate
        let q_proj_rows = match c.attn_output_gate {
            true => product("2 × num_heads × head_dim", ("2", 2), q_rows)?,
            false => q_rows,
        };
        expect(file, &name("attn_norm.weight"), &[hidden])?;
        let recurrent = c.layers[l].attention == AttentionKind::Recurrent;
        if let (true, Some(d)) = (recurrent, c.delta_net) {
            delta_net(file, l, d, hidden)?;
        } else if let Some(m) = c.mla {
            mla_attention(file, l, m, c.num_heads, hidden)?;
        } else {
            let rows = (q_proj_rows, q_rows, kv_rows);
            let v = !c.layer_values_from_keys(l);
            llama_attention(file, l, (c.attention_bias, v), rows, hidden)?;
        }
        if c.arch == Architecture::Gemma4 {
            expect(file, &name("layer_output_scale.weight"), &[("1", 1)])?;
        }
        if c.arch == Architecture::GptOss {
            expect(file, &name("attn_output.bias"), &[hidden])?;
            expect(file, &name("attn_sinks.weight"), &[("num_heads", c.num_heads)])?;
        }
        if c.qk_norm && !recurrent {
            // Qwen3, Gemma 3: one RMSNorm weight over each Q head and each K head
            expect(file, &name("attn_q_norm.weight"), &[head_dim])?;
            expect(file, &name("attn_k_norm.weight"), &[head_dim])?;
        }
        if c.post_norms {
            expect(file, &name("post_attention_norm.weight"), &[hidden])?;
            expect(file, &name("post_ffw_norm.weight"), &[hidden])?;
        }
        // Qwen3.5's GGUF names the norm before the MLP post_attention_norm (Gemma's
        // post_attention_norm is the norm after attention, checked above)
        let ffn_norm = match c.arch {
            Architecture::Qwen35 | Architecture::GptOss => "post_attention_norm.weight",
            _ => "ffn_norm.weight",
        };
        expect(file, &name(ffn_norm), &[hidden])?;
        if let Some(m) = c.moe.filter(|m| m.is_layer(l)) {
            experts(file, l, m, hidden)?;
            continue;
        }
        expect(file, &name("ffn_gate.weight"), &[ffn, hidden])?;
        expect(file, &name("ffn_up.weight"), &[ffn, hidden])?;
        expect(file, &name("ffn_down.weight"), &[hidden, ffn])?;
    }
    Ok(())
}

/// A mixture-of-experts MLP's tensors: the router [experts, hidden] and the experts' gate, up
/// and down projections, stacked (GGUF `ffn_gate_exps` [experts, ffn, hidden]) or one tensor
/// per expert (HF, mapped to `ffn_gate.E` [ffn, hidden]).
fn experts(file: &ModelFile, l: usize, m: super::Moe, hidden: Dim) -> Result<(), LoadError> {
    let name = |t: &str| format!("blk.{l}.{t}");
    let experts = ("expert_count", m.experts);
    let ffn = ("expert_feed_forward_length", m.expert_ffn);
    expect(file, &name("ffn_gate_inp.weight"), &[experts, hidden])?;
    if m.biases && file.format() != SourceFormat::Gguf {
        // gpt-oss as transformers saves it: fused gate|up, down, both [in, out] per expert
        let gate_up = ("2 × expert_feed_forward_length", 2 * m.expert_ffn);
        expect(file, &name("ffn_gate_inp.bias"), &[experts])?;
        if file.has_tensor(&name("hf_gate_up_proj_blocks")) {
            // the MXFP4 checkpoints: blocks of 32 along each row's inputs
            mxfp4_experts(file, &name("hf_gate_up_proj"), [experts, gate_up, hidden])?;
            mxfp4_experts(file, &name("hf_down_proj"), [experts, hidden, ffn])?;
        } else {
            expect(file, &name("hf_gate_up_proj"), &[experts, hidden, gate_up])?;
            expect(file, &name("hf_down_proj"), &[experts, ffn, hidden])?;
        }
        expect(file, &name("hf_gate_up_proj_bias"), &[experts, gate_up])?;
        expect(file, &name("ffn_down_exps.bias"), &[experts, hidden])?;
        return Ok(());
    }
    if m.scoring == super::MoeScoring::SigmoidBiased {
        expect(file, &name("exp_probs_b.bias"), &[experts])?;
    }
    if m.biases {
        expect(file, &name("ffn_gate_inp.bias"), &[experts])?;
        expect(file, &name("ffn_gate_exps.bias"), &[experts, ffn])?;
        expect(file, &name("ffn_up_exps.bias"), &[experts, ffn])?;
        expect(file, &name("ffn_down_exps.bias"), &[experts, hidden])?;
    }
    if file.has_tensor(&name("ffn_gate_exps.weight")) || file.format() == SourceFormat::Gguf {
        expect(file, &name("ffn_gate_exps.weight"), &[experts, ffn, hidden])?;
        expect(file, &name("ffn_up_exps.weight"), &[experts, ffn, hidden])?;
        expect(file, &name("ffn_down_exps.weight"), &[experts, hidden, ffn])?;
        return shared_experts(file, l, m, hidden);
    }
    for e in 0..m.experts {
        expect(file, &name(&format!("ffn_gate.{e}.weight")), &[ffn, hidden])?;
        expect(file, &name(&format!("ffn_up.{e}.weight")), &[ffn, hidden])?;
        expect(file, &name(&format!("ffn_down.{e}.weight")), &[hidden, ffn])?;
    }
    shared_experts(file, l, m, hidden)
}

/// The shared expert: one MLP of `shared_ffn` channels (DeepSeek's `n_shared_experts ×
/// expert_ffn`), and Qwen3.5-MoE's gate vector.
fn shared_experts(file: &ModelFile, l: usize, m: super::Moe, hidden: Dim) -> Result<(), LoadError> {
    if m.shared_ffn == 0 {
        return Ok(());
    }
    let name = |t: &str| format!("blk.{l}.{t}");
    if m.shared_gate {
        expect(file, &name("ffn_gate_inp_shexp.weight"), &[("1", 1), hidden])?;
    }
    let ffn = ("the shared expert's channels", m.shared_ffn);
    expect(file, &name("ffn_gate_shexp.weight"), &[ffn, hidden])?;
    expect(file, &name("ffn_up_shexp.weight"), &[ffn, hidden])?;
    expect(file, &name("ffn_down_shexp.weight"), &[hidden, ffn])
}

/// A Gated DeltaNet layer's tensors (llama.cpp's `qwen35` names; HF's mapped by
/// `hf::canonical_name_for`): its conv weight [channels, taps] (GGUF) or [channels, 1, taps]
/// (HF), its decay as GGUF's `ssm_a` (−exp(A_log)) or HF's `ssm_a_log`.
fn delta_net(file: &ModelFile, l: usize, d: super::DeltaNet, hidden: Dim) -> Result<(), LoadError> {
    let name = |t: &str| format!("blk.{l}.{t}");
    let channels =
        ("2 × key heads × key_head_dim + value heads × value_head_dim", d.conv_channels());
    let value = ("linear value heads × value_head_dim", d.value_dim());
    let heads = ("linear value heads", d.value_heads);
    let taps = ("linear conv kernel", d.conv_taps);
    expect(file, &name("attn_qkv.weight"), &[channels, hidden])?;
    expect(file, &name("attn_gate.weight"), &[value, hidden])?;
    expect(file, &name("ssm_beta.weight"), &[heads, hidden])?;
    expect(file, &name("ssm_alpha.weight"), &[heads, hidden])?;
    let conv = name("ssm_conv1d.weight");
    if file.tensor(&conv)?.shape.len() == 3 {
        expect(file, &conv, &[channels, ("1", 1), taps])?;
    } else {
        expect(file, &conv, &[channels, taps])?;
    }
    expect(file, &name("ssm_dt.bias"), &[heads])?;
    // the decay: GGUF's −exp(A_log), HF's A_log (named for the file's format when missing)
    match file.format() {
        super::SourceFormat::Gguf => expect(file, &name("ssm_a"), &[heads])?,
        super::SourceFormat::HfSafetensors => expect(file, &name("ssm_a_log"), &[heads])?,
    }
    expect(file, &name("ssm_norm.weight"), &[("linear value_head_dim", d.value_head_dim)])?;
    expect(file, &name("ssm_out.weight"), &[hidden, value])
}

/// Q (with its gate rows, Qwen3.5), K, V (unless `v_proj` is false: K = V; and biases) and the
/// output projection of a Llama-style layer; `rows`: (q_proj rows, query channels, K/V rows).
fn llama_attention(
    file: &ModelFile,
    l: usize,
    (bias, v_proj): (bool, bool),
    (q_proj_rows, q_rows, kv_rows): (Dim, Dim, Dim),
    hidden: Dim,
) -> Result<(), LoadError> {
    let name = |t: &str| format!("blk.{l}.{t}");
    {
        expect(file, &name("attn_q.weight"), &[q_proj_rows, hidden])?;
        expect(file, &name("attn_k.weight"), &[kv_rows, hidden])?;
        // none with K = V (Gemma 4's global layers)
        if v_proj {
            expect(file, &name("attn_v.weight"), &[kv_rows, hidden])?;
        }
        if bias {
            expect(file, &name("attn_q.bias"), &[q_rows])?;
            expect(file, &name("attn_k.bias"), &[kv_rows])?;
            expect(file, &name("attn_v.bias"), &[kv_rows])?;
        }
        expect(file, &name("attn_output.weight"), &[hidden, q_rows])?;
    }
    Ok(())
}

/// The attention tensors of an MLA layer (HF DeepSeek names mapped by `hf::canonical_name`).
fn mla_attention(
    file: &ModelFile,
    l: usize,
    m: super::Mla,
    heads: usize,
    hidden: Dim,
) -> Result<(), LoadError> {
    let name = |t: &str| format!("blk.{l}.{t}");
    let heads = ("num_attention_heads", heads);
    let q_rows = product("heads × (qk_nope + qk_rope)", heads, ("q_head_dim", m.q_head_dim()))?;
    let kv_b_rows = product(
        "heads × (qk_nope + v_head_dim)",
        heads,
        ("qk_nope_head_dim + v_head_dim", m.qk_nope_head_dim + m.v_head_dim),
    )?;
    let o_cols = product("heads × v_head_dim", heads, ("v_head_dim", m.v_head_dim))?;
    match m.q_lora_rank {
        Some(r) => {
            let rank = ("q_lora_rank", r);
            expect(file, &name("attn_q_a.weight"), &[rank, hidden])?;
            expect(file, &name("attn_q_a_norm.weight"), &[rank])?;
            expect(file, &name("attn_q_b.weight"), &[q_rows, rank])?;
        }
        None => expect(file, &name("attn_q.weight"), &[q_rows, hidden])?,
    }
    let latent = ("kv_lora_rank + qk_rope_head_dim", m.latent_width());
    let rank = ("kv_lora_rank", m.kv_lora_rank);
    expect(file, &name("attn_kv_a_mqa.weight"), &[latent, hidden])?;
    expect(file, &name("attn_kv_a_norm.weight"), &[rank])?;
    if file.has_tensor(&name("attn_k_b.weight")) {
        // GGUF, current converter: kv_b split per head, K's part transposed
        let (nope, v) = (("qk_nope_head_dim", m.qk_nope_head_dim), ("v_head_dim", m.v_head_dim));
        expect(file, &name("attn_k_b.weight"), &[heads, rank, nope])?;
        expect(file, &name("attn_v_b.weight"), &[heads, v, rank])?;
    } else {
        expect(file, &name("attn_kv_b.weight"), &[kv_b_rows, rank])?;
    }
    expect(file, &name("attn_output.weight"), &[hidden, o_cols])
}

/// How many layers `blk.0 … blk.N-1` have at least one tensor (the leading run without gaps).
pub(super) fn layers_present<'a>(names: impl Iterator<Item = &'a str>) -> usize {
    let present: BTreeSet<usize> =
        names.filter_map(|n| n.strip_prefix("blk.")?.split('.').next()?.parse().ok()).collect();
    (0..).find(|l| !present.contains(l)).unwrap_or(0)
}

/// The config claims `num_layers` layers, the tensors hold `present`.
pub(super) fn too_few_layers(num_layers: usize, present: usize) -> LoadError {
    LoadError::ConfigMismatch {
        config: format!("{num_layers} layers (GGUF block_count, HF num_hidden_layers)"),
        tensors: format!("{present} (no tensor named blk.{present}.*)"),
    }
}

/// `a × b` as one dimension named `label`, or an error when it overflows.
fn product(label: &'static str, a: Dim, b: Dim) -> Result<Dim, LoadError> {
    let value = a.1.checked_mul(b.1).ok_or_else(|| {
        LoadError::config(format!(
            "{label} = {} × {} overflows; the model's config is broken, re-download or \
             re-convert it",
            a.1, b.1
        ))
    })?;
    Ok((label, value))
}

/// gpt-oss's MXFP4 experts as transformers' checkpoints store them: `{base}_blocks`
/// `[experts, rows, cols / 32, 16]` and `{base}_scales` `[experts, rows, cols / 32]`, bytes.
fn mxfp4_experts(
    file: &ModelFile,
    base: &str,
    [experts, rows, cols]: [Dim; 3],
) -> Result<(), LoadError> {
    if !cols.1.is_multiple_of(32) {
        return Err(LoadError::config(format!(
            "'{base}_blocks' holds MXFP4 blocks of 32 along {} {}, which is not a multiple of              32; the model's config is broken",
            cols.0, cols.1
        )));
    }
    let blocks = ("32-element blocks", cols.1 / 32);
    expect(file, &format!("{base}_blocks"), &[experts, rows, blocks, ("bytes a block", 16)])?;
    expect(file, &format!("{base}_scales"), &[experts, rows, blocks])?;
    for part in ["blocks", "scales"] {
        let t = file.tensor(&format!("{base}_{part}"))?;
        if t.dtype != crate::quant::GgmlType::I8 {
            return Err(LoadError::config(format!(
                "'{base}_{part}' is {}; an MXFP4 checkpoint stores its experts' codes and scales                  as U8 bytes",
                t.dtype
            )));
        }
    }
    Ok(())
}

fn expect(file: &ModelFile, name: &str, dims: &[Dim]) -> Result<(), LoadError> {
    let t = file.tensor(name)?;
    if t.shape.len() == dims.len() && t.shape.iter().zip(dims).all(|(s, d)| *s == d.1) {
        return Ok(());
    }
    let implied: Vec<String> = dims.iter().map(|(n, v)| format!("{n} {v}")).collect();
    Err(LoadError::ConfigMismatch {
        config: format!("'{name}' is [{}]", implied.join(", ")),
        tensors: format!("{:?}", t.shape),
    })
}
