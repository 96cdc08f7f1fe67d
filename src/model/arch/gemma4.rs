//! Gemma 4 (dense text; GGUF `gemma4`, HF `Gemma4ForCausalLM`) as a flat list of dispatches:
//! Gemma 3's layer ([`super::gemma3`]) with the layer's own head shape, V normed, and the
//! layer's output scale.
//!
//! ```text
//! hidden = embed(tokens) · sqrt(hidden_size)
//! per layer (heads of the layer's shape: ModelConfig::layer_heads):
//!             normed = rms_norm(hidden)            · attn_norm
//!             raw    = normed · [Wq|Wk|Wv]ᵀ            into the qk scratch (no Wv with K = V:
//!                                                     the raw K rows are the values)
//!             q, k   = rms_norm(q_h) · attn_q_norm, rms_norm(k_h) · attn_k_norm  → qkv
//!             v      = rms_norm(v_h)  (no weight)       → qkv  (raw K's heads with K = V)
//!             rope(q, k)                              NEOX; sliding: base 10k; global:
//!                                                     proportional (RopeScaling::Proportional)
//!             kv_write(k, v → pool[layer])            (with rope, one dispatch, for f16)
//!             attn   = attention(q, pool[layer])      scale 1 (ModelConfig::attention_scale)
//!             sublayer = attn · Woᵀ
//!             hidden += rms_norm(sublayer)         · post_attention_norm
//!             normed = rms_norm(hidden)            · ffn_norm
//!             ffn    = gelu_tanh(normed · Wgateᵀ) · (normed · Wupᵀ)
//!             sublayer = ffn · Wdownᵀ
//!             hidden = (hidden + rms_norm(sublayer) · post_ffw_norm) · layer_output_scale
//!                                                     one op: hidden · s + norm · (w · s)
//! logits_in = rms_norm(hidden[logit_rows]) · output_norm
//! logits    = softcap(logits_in · token_embdᵀ)      cap · tanh(x / cap)
//! ```
//!
//! Quirks, as transformers' `modeling_gemma4.py` and llama.cpp's `src/models/gemma4.cpp`
//! decide them: norms are plain `x · w` (no Gemma 3 `1 + w`, in HF and GGUF alike); V's norm
//! has no weight; with K = V (`attention_k_eq_v`, the global layers) V is the raw K projection,
//! normed but not rotated; the global layers' heads are wider (512 where the sliding layers'
//! are 256) and fewer, so their KV blocks share the pool with the sliding layers' at the
//! widest block size (`quant::pool_heads`); scores are not scaled (scale 1).

use super::common::Builder;
use crate::kernels::linear::TokenRows;
use crate::kernels::rms_norm::{HeadRows, NormIo, NormRows, RmsNormOp};
use crate::model::weights::{self, fused, gpu_bytes, matrix};
use crate::model::{ModelError, Op};

/// Appends one Gemma 4 layer's ops; returns the bytes of its weights.
pub(super) fn layer(b: &Builder, l: usize, ops: &mut Vec<Op>) -> Result<u64, ModelError> {
    let (c, gpu, act, file, max) = (b.c, b.gpu, b.act, b.file, b.max_binding);
    let name = |t: &str| format!("blk.{l}.{t}");
    let hidden = c.hidden_size;
    let layout = b.layout(l);
    let (kvh, hd) = c.layer_heads(l);
    let (q_rows, kv_rows) = (c.num_heads * hd, kvh * hd);
    let k_eq_v = c.layer_values_from_keys(l);
    let mut raw_tensors =
        vec![(name("attn_q.weight"), q_rows, None), (name("attn_k.weight"), kv_rows, None)];
    if !k_eq_v {
        raw_tensors.push((name("attn_v.weight"), kv_rows, None));
    }
    let raw = fused(gpu, file, &name("attn_qkv"), &raw_tensors, hidden, max)?;
    let o_name = name("attn_output.weight");
    let o = matrix(gpu, file, &o_name, hidden, q_rows, max)?;
    let ffn = c.intermediate_size;
    let down = matrix(gpu, file, &name("ffn_down.weight"), hidden, ffn, max)?;
    let bytes: u64 = raw.iter().map(|p| &p.weight).chain([&o, &down]).map(gpu_bytes).sum();

    // Q, K (and V) before their norms, stacked in the qk scratch
    let input = b.sublayer_input(l, "attn_norm", ops)?;
    let raw_width = (raw_tensors.len() - 1) * kv_rows + q_rows;
    b.fused_ops(&name("qkv"), &raw, &input, (&act.qk, raw_width as u32, 0), ops);
    ops.push(b.qk_norms_from(l, raw_width as u32)?);
    // V: its heads (the raw K's with K = V) normed without a weight into qkv
    let v_from = if k_eq_v { q_rows } else { q_rows + kv_rows };
    let ones = gpu.storage_buffer_init(&name("v_norm"), bytemuck::cast_slice(&vec![1.0f32; hd]));
    let rows = HeadRows {
        heads: kvh as u32,
        x_stride: raw_width as u32,
        x_offset: v_from as u32,
        out_stride: layout.stride(),
        out_offset: layout.v_offset(),
        split: kvh as u32,
    };
    let io = NormIo {
        step: &b.step.step,
        x: &act.qk,
        weight: &ones,
        out: &act.qkv,
        rows: NormRows::Heads(rows),
        accumulate: false,
    };
    let v_norm = RmsNormOp::new(gpu, b.kernels, &name("v_norm"), hd as u32, c.rms_norm_eps, io);
    ops.push(Op::RmsNorm(v_norm));
    b.rope_attention(l, ops);
    ops.push(Op::Linear(b.linear(&o_name, &o, &act.attn, &act.sublayer, false, TokenRows::Step)));
    let post_attn = name("post_attention_norm.weight");
    ops.push(b.norm(&post_attn, &act.sublayer, &act.hidden, NormRows::Step, true)?);

    let input = b.sublayer_input(l, "ffn_norm", ops)?;
    let gate_up_bytes = b.gated_mlp_in(l, c.activation, &input, ops)?;
    let down_name = name("ffn_down.weight");
    ops.push(Op::Linear(b.linear(
        &down_name,
        &down,
        &act.ffn,
        &act.sublayer,
        false,
        TokenRows::Step,
    )));
    // hidden = (hidden + norm(sublayer) · w) · s = hidden · s + norm(sublayer) · (w · s)
    let scale = weights::vector(file, &name("layer_output_scale.weight"), 1)?[0];
    if !scale.is_finite() {
        return Err(ModelError::Unsupported(format!(
            "{} = {scale} is not finite; the model file is broken",
            name("layer_output_scale.weight")
        )));
    }
    let post_ffw = name("post_ffw_norm.weight");
    let mut w = weights::vector(file, &post_ffw, hidden)?;
    w.iter_mut().for_each(|x| *x = (*x + c.norm_weight_offset) * scale);
    let w = gpu.storage_buffer_init(&post_ffw, bytemuck::cast_slice(&w));
    let io = NormIo {
        step: &b.step.step,
        x: &act.sublayer,
        weight: &w,
        out: &act.hidden,
        rows: NormRows::Step,
        accumulate: true,
    };
    let eps = c.rms_norm_eps;
    let post = RmsNormOp::scaled(gpu, b.kernels, &post_ffw, hidden as u32, eps, io, scale);
    ops.push(Op::RmsNorm(post));
    Ok(bytes + gate_up_bytes)
}
