//! The Llama family (Llama 2/3, SmolLM2, Mistral without window, Qwen2 with QKV bias, Qwen3 with
//! Q/K norms, Qwen3-MoE: Qwen3 with experts for its MLP) as a flat list of dispatches:
//!
//! ```text
//! hidden = embed(tokens)
//! per layer:  normed = rms_norm(hidden)            · attn_norm   (applied on load by the
//!                                                 projections where the linear variant can)
//!             qkv    = normed · [Wq|Wk|Wv]ᵀ (+ bias)   one fused linear when the types agree
//!             Qwen3: qk = normed · [Wq|Wk]ᵀ into the qk scratch, v = normed · Wvᵀ into qkv,
//!                    q, k = rms_norm(q_h) · attn_q_norm, rms_norm(k_h) · attn_k_norm → qkv
//!                    (one dispatch over all Q and K heads, as gemma3.rs)
//!             rope(q, k)                              pairs per ModelConfig::rope_style
//!             [rotate(q, k, v)]                       --kv-rotate: Hadamard per head
//!             f16 KV:       kv_write(k, v → pool[layer])            through the slot mapping
//!                           (one rope_kv_write dispatch with rope, without --kv-rotate)
//!                           attn = paged_attention(q, pool[layer])
//!             quantized KV: kv_quantize(blocks completed this step → pool[layer])
//!                           attn = paged_attention(q, pool[layer]; the quantized reader:
//!                                  head blocks, the own block fresh from staging / qkv)
//!                           kv_stage(rows of partial last blocks → staging[layer])
//!             [rotate(attn)]                          undoes V's rotation
//!             hidden += attn · Woᵀ
//!             normed = rms_norm(hidden)            · ffn_norm    (the same)
//!             ffn    = silu(normed · Wgateᵀ) · (normed · Wupᵀ)
//!                                                 one linear (GLU epilogue) when the types agree
//!             hidden += ffn · Wdownᵀ
//!             Qwen3-MoE instead (Builder::moe_mlp, kernels::moe): normed = rms_norm(hidden),
//!                    logits = normed · Wrouterᵀ, ids, weights = top-k of softmax(logits),
//!                    h[t, j] = silu(gate_e · normed) · (up_e · normed), e = ids[t, j],
//!                    hidden += Σ_j weights[t, j] · down_e(h[t, j])
//! logits_in = rms_norm(hidden[logit_rows]) · output_norm
//! logits    = logits_in · Woutᵀ                       Wout = token_embd when tied (no output.weight)
//! ```

use super::common::Builder;
use crate::kernels::linear::{LinearIo, LinearOp, TokenRows};
use crate::loader::{Activation, Architecture, ModelConfig};
use crate::model::weights::{fused, gpu_bytes, matrix, vector, vector_buffer};
use crate::model::{ModelError, Op};

/// Refuses what this builder does not run (the Gemma pieces are not wired in here).
pub(super) fn check(c: &ModelConfig) -> Result<(), ModelError> {
    let unsupported = [
        (c.arch == Architecture::Gemma3, "the Gemma 3 architecture"),
        (
            c.qk_norm && !matches!(c.arch, Architecture::Qwen3 | Architecture::Qwen3Moe),
            "Q/K norms outside Qwen3",
        ),
        (
            c.moe.is_some() != matches!(c.arch, Architecture::Qwen3Moe | Architecture::GptOss),
            "experts outside Qwen3-MoE and gpt-oss",
        ),
        (c.post_norms, "post-attention/post-MLP norms"),
        (
            c.activation != Activation::Silu
                && !(c.arch == Architecture::GptOss && c.activation == Activation::SwigluOai),
            "an MLP activation other than SwiGLU (gpt-oss: its clamped SwiGLU)",
        ),
    ];
    if let Some((_, what)) = unsupported.iter().find(|(on, _)| *on) {
        return Err(ModelError::Unsupported(format!(
            "this model uses {what}, which the Llama forward does not run"
        )));
    }
    Ok(())
}

/// Appends one transformer layer's ops; returns the bytes of its weights.
pub(super) fn layer(b: &Builder, l: usize, ops: &mut Vec<Op>) -> Result<u64, ModelError> {
    let (c, gpu, act, file, max) = (b.c, b.gpu, b.act, b.file, b.max_binding);
    let name = |t: &str| format!("blk.{l}.{t}");
    let hidden = c.hidden_size;
    let layout = b.layout(l);
    let bias = |t: &str| c.attention_bias.then(|| name(&format!("{t}.bias")));
    let (q_rows, kv_rows) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let q = (name("attn_q.weight"), q_rows, bias("attn_q"));
    let k = (name("attn_k.weight"), kv_rows, bias("attn_k"));
    let v = (name("attn_v.weight"), kv_rows, bias("attn_v"));
    // `proj`: Q|K|V into qkv; with Q/K norms Q|K only, into the scratch the norms read, and V
    // (`v`) straight into qkv
    let (proj, v) = match c.qk_norm {
        false => (fused(gpu, file, &name("attn_qkv"), &[q, k, v], hidden, max)?, Vec::new()),
        true => (
            fused(gpu, file, &name("attn_qk"), &[q, k], hidden, max)?,
            fused(gpu, file, &name("attn_v"), &[v], hidden, max)?,
        ),
    };
    let o_name = name("attn_output.weight");
    let o = matrix(gpu, file, &o_name, hidden, q_rows, max)?;
    // gpt-oss: o_proj's bias and each query head's attention sink
    let gpt_oss = c.arch == Architecture::GptOss;
    let o_bias = match gpt_oss {
        true => Some(vector_buffer(gpu, file, &name("attn_output.bias"), hidden)?),
        false => None,
    };
    let sinks = match gpt_oss {
        true => Some(vector(file, &name("attn_sinks.weight"), c.num_heads)?),
        false => None,
    };
    let parts = proj.iter().chain(&v).map(|p| &p.weight);
    let bytes: u64 = parts.chain([&o]).map(gpu_bytes).sum();

    let input = b.sublayer_input(l, "attn_norm", ops)?;
    if c.qk_norm {
        let qk_width = (q_rows + kv_rows) as u32;
        b.fused_ops(&name("qk"), &proj, &input, (&act.qk, qk_width, 0), ops);
        b.fused_ops(&name("v"), &v, &input, (&act.qkv, layout.stride(), qk_width), ops);
        ops.push(b.qk_norms(l)?);
    } else {
        b.fused_ops(&name("qkv"), &proj, &input, (&act.qkv, layout.stride(), 0), ops);
    }
    b.rope_attention_sinks(l, sinks.as_deref(), ops);
    let o_io = LinearIo {
        bias: o_bias.as_ref(),
        ..b.dense_io(&o, &act.attn, &act.hidden, true, TokenRows::Step)
    };
    ops.push(Op::Linear(LinearOp::new(gpu, b.kernels, &o_name, &o, o_io)));
    let bytes = bytes + o_bias.as_ref().map_or(0, wgpu::Buffer::size);
    if c.is_moe_layer(l) {
        let norm = if gpt_oss { "post_attention_norm" } else { "ffn_norm" };
        return Ok(bytes + b.moe_mlp(l, norm, ops)?);
    }
    let ffn = c.intermediate_size;
    let down = matrix(gpu, file, &name("ffn_down.weight"), hidden, ffn, max)?;
    let input = b.sublayer_input(l, "ffn_norm", ops)?;
    let gate_up_bytes = b.gated_mlp_in(l, Activation::Silu, &input, ops)?;
    let down_op = b.linear(&name("ffn_down"), &down, &act.ffn, &act.hidden, true, TokenRows::Step);
    ops.push(Op::Linear(down_op));
    Ok(bytes + gate_up_bytes + gpu_bytes(&down))
}
