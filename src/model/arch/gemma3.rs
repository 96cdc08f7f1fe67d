//! Gemma 3 (text, GGUF `general.architecture = gemma3`) as a flat list of dispatches:
//!
//! ```text
//! hidden = embed(tokens) · sqrt(hidden_size)           ModelConfig::embedding_scale (f32, as HF)
//! per layer:  normed = rms_norm(hidden)            · attn_norm
//!             qk     = normed · [Wq|Wk]ᵀ                into the qk scratch, then per head:
//!             q, k   = rms_norm(q_h) · attn_q_norm, rms_norm(k_h) · attn_k_norm  → qkv
//!                                                     (one dispatch over all Q and K heads)
//!             v      = normed · Wvᵀ                     straight into qkv
//!             rope(q, k)                              NEOX pairs, the layer's own table
//!                                                     (sliding layers base 10k, global 1e6)
//!             [rotate(q, k, v)]                       --kv-rotate
//!             kv_write(k, v → pool[layer])            f16: with rope, one dispatch (see llama.rs)
//!             attn   = attention(q, pool[layer])      the layer's AttentionKind (see below)
//!             [rotate(attn)]
//!             sublayer = attn · Woᵀ
//!             hidden += rms_norm(sublayer)         · post_attention_norm
//!             normed = rms_norm(hidden)            · ffn_norm
//!             ffn    = gelu_tanh(normed · Wgateᵀ) · (normed · Wupᵀ)
//!                                                 one linear (GLU epilogue) when the types agree
//!             sublayer = ffn · Wdownᵀ
//!             hidden += rms_norm(sublayer)         · post_ffw_norm
//! logits_in = rms_norm(hidden[logit_rows]) · output_norm
//! logits    = logits_in · token_embdᵀ                 tied
//! ```
//!
//! Quirks, as llama.cpp's `llama_model_gemma3` and HF's `modeling_gemma3.py` decide them: GGUF
//! norm weights already hold HF's `1 + w` (the converter adds the 1; `norm_weight_offset` is
//! 0 here); Q/K are not permuted (NEOX RoPE); scores are scaled by `attention_scale` =
//! `query_pre_attn_scalar^-0.5`, which is `1/sqrt(head_dim)` except for 27B (the attention
//! kernels take the config's scale).
//!
//! Sliding-window layers attend through their KV-cache group's window (`kv::KvGroups`: at
//! -c ≤ 512 every layer is one full group; past it 5 sliding groups roll their blocks).

use super::common::Builder;
use crate::kernels::linear::TokenRows;
use crate::kernels::rms_norm::NormRows;
use crate::model::weights::{fused, gpu_bytes, matrix};
use crate::model::{ModelError, Op};

/// Appends one Gemma 3 layer's ops; returns the bytes of its weights.
pub(super) fn layer(b: &Builder, l: usize, ops: &mut Vec<Op>) -> Result<u64, ModelError> {
    let (c, gpu, act, file, max) = (b.c, b.gpu, b.act, b.file, b.max_binding);
    let name = |t: &str| format!("blk.{l}.{t}");
    let hidden = c.hidden_size;
    let layout = b.layout(l);
    let (q_rows, kv_rows) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let qk_tensors =
        [(name("attn_q.weight"), q_rows, None), (name("attn_k.weight"), kv_rows, None)];
    let qk = fused(gpu, file, &name("attn_qk"), &qk_tensors, hidden, max)?;
    let v =
        fused(gpu, file, &name("attn_v"), &[(name("attn_v.weight"), kv_rows, None)], hidden, max)?;
    let o_name = name("attn_output.weight");
    let o = matrix(gpu, file, &o_name, hidden, q_rows, max)?;
    let ffn = c.intermediate_size;
    let down = matrix(gpu, file, &name("ffn_down.weight"), hidden, ffn, max)?;
    let parts = qk.iter().chain(&v).map(|p| &p.weight);
    let bytes: u64 = parts.chain([&o, &down]).map(gpu_bytes).sum();

    let input = b.sublayer_input(l, "attn_norm", ops)?;
    let qk_width = (q_rows + kv_rows) as u32;
    b.fused_ops(&name("qk"), &qk, &input, (&act.qk, qk_width, 0), ops);
    b.fused_ops(&name("v"), &v, &input, (&act.qkv, layout.stride(), qk_width), ops);
    ops.push(b.qk_norms(l)?);
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
    let post_ffw = name("post_ffw_norm.weight");
    ops.push(b.norm(&post_ffw, &act.sublayer, &act.hidden, NormRows::Step, true)?);
    Ok(bytes + gate_up_bytes)
}
