//! [`check_tensors`]: the config and the tensors of a model file must tell the same story.
//!
//! Buffers, `plan` figures and kernel dispatches are all sized from [`ModelConfig`]; a file whose
//! metadata claims a million layers or a 2^31-token vocabulary next to a small model's tensors
//! must be refused here, before anything is allocated from those numbers.

use super::error::LoadError;
use super::ModelFile;
use std::collections::BTreeSet;

/// One dimension the config implies: its config name and value.
type Dim = (&'static str, usize);

/// Every tensor the Llama family needs (and Gemma 3's and Qwen3's norms, DeepSeek's MLA
/// projections), with the shape the config implies, then a comparison
/// against the file. Layer count first, so a huge `block_count` costs one pass over the names.
pub(super) fn check_tensors(file: &ModelFile) -> Result<(), LoadError> {
    let c = file.config();
    if c.moe_layers > 0 {
        return Err(LoadError::config(format!(
            "{} of this model's {} layers are mixture-of-experts, which kvrun does not run yet \
             (`kvrun plan` sizes its KV cache); use a model whose layers are all dense",
            c.moe_layers, c.num_layers
        )));
    }
    let layers = layers_present(file.tensor_names().into_iter());
    if layers < c.num_layers {
        return Err(too_few_layers(c.num_layers, layers));
    }
    let head_dim = ("head_dim", c.head_dim);
    let q_rows = product("num_heads × head_dim", ("num_heads", c.num_heads), head_dim)?;
    let kv_rows = product("num_kv_heads × head_dim", ("num_kv_heads", c.num_kv_heads), head_dim)?;
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
        expect(file, &name("attn_norm.weight"), &[hidden])?;
        if let Some(m) = c.mla {
            mla_attention(file, l, m, c.num_heads, hidden)?;
        } else {
            llama_attention(file, l, c.attention_bias, q_rows, kv_rows, hidden)?;
        }
        if c.qk_norm {
            // Qwen3, Gemma 3: one RMSNorm weight over each Q head and each K head
            expect(file, &name("attn_q_norm.weight"), &[head_dim])?;
            expect(file, &name("attn_k_norm.weight"), &[head_dim])?;
        }
        if c.post_norms {
            expect(file, &name("post_attention_norm.weight"), &[hidden])?;
            expect(file, &name("post_ffw_norm.weight"), &[hidden])?;
        }
        expect(file, &name("ffn_norm.weight"), &[hidden])?;
        expect(file, &name("ffn_gate.weight"), &[ffn, hidden])?;
        expect(file, &name("ffn_up.weight"), &[ffn, hidden])?;
        expect(file, &name("ffn_down.weight"), &[hidden, ffn])?;
    }
    Ok(())
}

/// Q, K, V (and biases) and the output projection of a Llama-style layer.
fn llama_attention(
    file: &ModelFile,
    l: usize,
    bias: bool,
    q_rows: Dim,
    kv_rows: Dim,
    hidden: Dim,
) -> Result<(), LoadError> {
    let name = |t: &str| format!("blk.{l}.{t}");
    {
        expect(file, &name("attn_q.weight"), &[q_rows, hidden])?;
        expect(file, &name("attn_k.weight"), &[kv_rows, hidden])?;
        expect(file, &name("attn_v.weight"), &[kv_rows, hidden])?;
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
