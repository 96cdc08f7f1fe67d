//! Qwen3.5 (dense; GGUF `qwen35`, HF `Qwen3_5ForCausalLM`) as a flat list of dispatches: three
//! of every four layers Gated DeltaNet, the fourth gated full attention.
//!
//! ```text
//! hidden = embed(tokens)
//! Gated DeltaNet layer (AttentionKind::Recurrent; kernels::delta_net):
//!             normed = rms_norm(hidden)            · (1 + attn_norm)
//!             proj   = normed · [Wqkv|Wz|Wb|Wa]ᵀ      stacked rows (attn_qkv, attn_gate,
//!                                                  ssm_beta, ssm_alpha), one output row
//!             qkv    = silu(conv1d(proj.qkv))       with the sequence's conv state
//!             o      = gated_delta_rule(qkv, proj.b, proj.a)   the sequence's recurrent state
//!             o      = rms_norm(o_h) · ssm_norm · silu(proj.z_h)     per value head
//!             hidden += o · Woutᵀ                   ssm_out
//! attention layer (AttentionKind::Full):
//!             normed = rms_norm(hidden)            · (1 + attn_norm)
//!             qk     = normed · [Wq|Wk]ᵀ            Wq: the query rows of each head's
//!                                                  [query; gate] rows of attn_q, gathered
//!                                                  with attn_k into one weight at load
//!             gate   = normed · Wgateᵀ              the gate rows
//!             v      = normed · Wvᵀ                 into qkv
//!             q, k   = rms_norm(q_h) · (1 + attn_q_norm), … k → qkv
//!             rope(q, k)                           NEOX pairs, the first quarter of each head
//!             attn   = attention(q, pool[layer])
//!             attn  *= sigmoid(gate)
//!             hidden += attn · Woᵀ
//! per layer:  normed = rms_norm(hidden)            · (1 + post_attention_norm)
//!             ffn    = silu(normed · Wgateᵀ) · (normed · Wupᵀ)
//!             hidden += ffn · Wdownᵀ
//!             Qwen3.5-MoE instead: the experts and the sigmoid-gated shared expert of
//!             arch/moe.rs (Builder::moe_mlp)
//! logits    = rms_norm(hidden[logit_rows]) · (1 + output_norm) · Woutᵀ
//! ```
//!
//! Quirks, as transformers' `modeling_qwen3_5.py` and llama.cpp's `qwen35` decide them: every
//! RMSNorm but the DeltaNet's gated one is zero-centred, `x · (1 + w)` (HF stores `w`, the GGUF
//! converter adds the 1: `norm_weight_offset`); GGUF stores the decay as `ssm_a = −exp(A_log)`,
//! HF as `A_log`; GGUF's value heads are tiled over the key heads (`DeltaNet::key_heads_tiled`).

use super::common::Builder;
use crate::kernels::delta_net::{
    ConvDims, ConvIo, ConvOp, GatedNormDims, GatedNormIo, GatedNormOp, ScanDims, ScanIo, ScanOp,
};
use crate::kernels::gate::{GateDims, GateOp};
use crate::kernels::linear::TokenRows;
use crate::loader::{Activation, AttentionKind, DeltaNet, SourceFormat};
use crate::model::buffers::{delta_proj_width, StatePool};
use crate::model::weights::{fused, gathered_rows, gpu_bytes, matrix, values, vector, FusedPart};
use crate::model::{ModelError, Op};

/// Appends one Qwen3.5 layer's ops; returns the bytes of its weights.
pub(super) fn layer(b: &Builder, l: usize, ops: &mut Vec<Op>) -> Result<u64, ModelError> {
    let c = b.c;
    let bytes = match (c.layers[l].attention, c.delta_net) {
        (AttentionKind::Recurrent, Some(d)) => delta_net(b, l, d, ops)?,
        _ => gated_attention(b, l, ops)?,
    };
    if c.is_moe_layer(l) {
        // Qwen3.5-MoE: experts and a sigmoid-gated shared expert (arch/moe.rs)
        return Ok(bytes + b.moe_mlp(l, "post_attention_norm", ops)?);
    }
    let (act, name) = (b.act, |t: &str| format!("blk.{l}.{t}"));
    let input = b.sublayer_input(l, "post_attention_norm", ops)?;
    let gate_up_bytes = b.gated_mlp_in(l, Activation::Silu, &input, ops)?;
    let down = matrix(
        b.gpu,
        b.file,
        &name("ffn_down.weight"),
        c.hidden_size,
        c.intermediate_size,
        b.max_binding,
    )?;
    ops.push(Op::Linear(b.linear(
        &name("ffn_down"),
        &down,
        &act.ffn,
        &act.hidden,
        true,
        TokenRows::Step,
    )));
    Ok(bytes + gate_up_bytes + gpu_bytes(&down))
}

/// A Gated DeltaNet layer's token mixer: projections, conv, scan, gated norm, output.
fn delta_net(b: &Builder, l: usize, d: DeltaNet, ops: &mut Vec<Op>) -> Result<u64, ModelError> {
    let (c, gpu, file, max, k) = (b.c, b.gpu, b.file, b.max_binding, b.kernels);
    let name = |t: &str| format!("blk.{l}.{t}");
    let delta = b.act.delta.as_ref().expect("delta_net activations for a recurrent layer");
    let hidden = c.hidden_size;
    let (channels, value_dim, heads) = (d.conv_channels(), d.value_dim(), d.value_heads);
    let width = delta_proj_width(&d);
    let tensors = [
        (name("attn_qkv.weight"), channels, None),
        (name("attn_gate.weight"), value_dim, None),
        (name("ssm_beta.weight"), heads, None),
        (name("ssm_alpha.weight"), heads, None),
    ];
    let proj = fused(gpu, file, &name("delta_in"), &tensors, hidden, max)?;
    let out_name = name("ssm_out.weight");
    let out = matrix(gpu, file, &out_name, hidden, value_dim, max)?;
    let bytes: u64 = proj.iter().map(|p| gpu_bytes(&p.weight)).sum::<u64>() + gpu_bytes(&out);

    let input = b.sublayer_input(l, "attn_norm", ops)?;
    b.fused_ops(&name("delta_in"), &proj, &input, (&delta.proj, width as u32, 0), ops);

    let conv_w = values(file, &name("ssm_conv1d.weight"), channels * d.conv_taps)?;
    let conv_w = gpu.storage_buffer_init(&name("ssm_conv1d"), bytemuck::cast_slice(&conv_w));
    let slot = StatePool::index(c, l);
    let (s, states) = (b.step, b.states);
    let conv_io = ConvIo {
        step: &s.step,
        seqs: &s.seqs,
        x: &delta.proj,
        weight: &conv_w,
        state: &states.conv[slot],
        out: &delta.conv,
    };
    let conv_dims = ConvDims {
        channels: channels as u32,
        taps: d.conv_taps as u32,
        x_stride: width as u32,
        x_offset: 0,
        out_stride: channels as u32,
    };
    ops.push(Op::DeltaConv(ConvOp::new(gpu, k, conv_io, conv_dims)));

    // per value head: the decay's −exp(A_log) (GGUF ssm_a holds it; HF A_log) and dt_bias
    let neg_a = match file.format() {
        SourceFormat::Gguf => vector(file, &name("ssm_a"), heads)?,
        SourceFormat::HfSafetensors => {
            vector(file, &name("ssm_a_log"), heads)?.iter().map(|a| -a.exp()).collect()
        }
    };
    let dt_bias = vector(file, &name("ssm_dt.bias"), heads)?;
    let head_params: Vec<f32> = neg_a.iter().zip(&dt_bias).flat_map(|(a, t)| [*a, *t]).collect();
    let head_params =
        gpu.storage_buffer_init(&name("ssm_a_dt"), bytemuck::cast_slice(&head_params));
    let key_dim = (d.key_heads * d.key_head_dim) as u32;
    let scan_io = ScanIo {
        step: &s.step,
        seqs: &s.seqs,
        qkv: &delta.conv,
        ab: &delta.proj,
        head_params: &head_params,
        state: &states.recurrent[slot],
        out: &delta.o,
    };
    let b_offset = (channels + value_dim) as u32;
    let scan_dims = ScanDims {
        k_heads: d.key_heads as u32,
        v_heads: heads as u32,
        dk: d.key_head_dim as u32,
        dv: d.value_head_dim as u32,
        qkv_stride: channels as u32,
        q_offset: 0,
        k_offset: key_dim,
        v_offset: 2 * key_dim,
        ab_stride: width as u32,
        b_offset,
        a_offset: b_offset + heads as u32,
        out_stride: value_dim as u32,
        max_seq_tokens: b.o.max_num_batched_tokens as u32,
        k_tiled: d.key_heads_tiled,
    };
    ops.push(Op::DeltaScan(ScanOp::new(gpu, k, scan_io, scan_dims)));

    // the gated norm's weight is plain w (no zero-centring in either format)
    let norm_w = vector(file, &name("ssm_norm.weight"), d.value_head_dim)?;
    let norm_w = gpu.storage_buffer_init(&name("ssm_norm"), bytemuck::cast_slice(&norm_w));
    let norm_io = GatedNormIo { step: &s.step, z: &delta.proj, weight: &norm_w, o: &delta.o };
    let norm_dims = GatedNormDims {
        v_heads: heads as u32,
        dv: d.value_head_dim as u32,
        o_stride: value_dim as u32,
        z_stride: width as u32,
        z_offset: channels as u32,
        eps: c.rms_norm_eps,
    };
    ops.push(Op::DeltaNorm(GatedNormOp::new(gpu, k, norm_io, norm_dims)));
    ops.push(Op::Linear(b.linear(
        &name("ssm_out"),
        &out,
        &delta.o,
        &b.act.hidden,
        true,
        TokenRows::Step,
    )));
    Ok(bytes)
}

/// A full attention layer with Qwen3.5's output gate: each head's `attn_q` rows are its query
/// rows then its gate rows, gathered at load into the Q|K projection (for the Q/K norms; two
/// when `attn_q` and `attn_k` differ in format) and the gate projection.
fn gated_attention(b: &Builder, l: usize, ops: &mut Vec<Op>) -> Result<u64, ModelError> {
    let (c, gpu, act, file, max) = (b.c, b.gpu, b.act, b.file, b.max_binding);
    let name = |t: &str| format!("blk.{l}.{t}");
    let (hidden, hd, heads) = (c.hidden_size, c.head_dim, c.num_heads);
    let layout = b.layout(l);
    let (q_rows, kv_rows) = (heads * hd, c.num_kv_heads * hd);
    let (q_name, k_name) = (name("attn_q.weight"), name("attn_k.weight"));
    let query: Vec<_> = (0..heads).map(|h| 2 * h * hd..(2 * h + 1) * hd).collect();
    let gate: Vec<_> = (0..heads).map(|h| (2 * h + 1) * hd..(2 * h + 2) * hd).collect();
    let all_k: Vec<_> = std::iter::once(0..kv_rows).collect(); // every row of attn_k
    let gather = |label: &str, sources: &[(&str, usize, &[std::ops::Range<usize>])]| {
        gathered_rows(gpu, file, label, hidden, sources, max)
    };
    let (q_src, k_src) =
        ((q_name.as_str(), 2 * q_rows, &query[..]), (k_name.as_str(), kv_rows, &all_k[..]));
    // Q|K as one weight where the formats agree, else Q and K apart (offsets in the qk scratch)
    let qk: Vec<FusedPart> = match gather(&name("attn_qk"), &[q_src, k_src])? {
        Some(weight) => vec![FusedPart { weight, out_offset: 0, bias: None }],
        None => {
            let q = gather(&name("attn_q"), &[q_src])?.expect("one source");
            let k = gather(&name("attn_k"), &[k_src])?.expect("one source");
            vec![
                FusedPart { weight: q, out_offset: 0, bias: None },
                FusedPart { weight: k, out_offset: q_rows as u32, bias: None },
            ]
        }
    };
    let g_src = (q_name.as_str(), 2 * q_rows, &gate[..]);
    let wgate = gather(&name("attn_gate"), &[g_src])?.expect("one source");
    let v =
        fused(gpu, file, &name("attn_v"), &[(name("attn_v.weight"), kv_rows, None)], hidden, max)?;
    let o_name = name("attn_output.weight");
    let o = matrix(gpu, file, &o_name, hidden, q_rows, max)?;
    let parts = qk.iter().chain(&v).map(|p| &p.weight);
    let bytes: u64 = parts.chain([&wgate, &o]).map(gpu_bytes).sum();

    let input = b.sublayer_input(l, "attn_norm", ops)?;
    let qk_width = (q_rows + kv_rows) as u32;
    b.fused_ops(&name("qk"), &qk, &input, (&act.qk, qk_width, 0), ops);
    b.fused_ops(&name("v"), &v, &input, (&act.qkv, layout.stride(), qk_width), ops);
    let g_part = [FusedPart { weight: wgate, out_offset: 0, bias: None }];
    b.fused_ops(&name("gate"), &g_part, &input, (&act.attn_gate, q_rows as u32, 0), ops);
    ops.push(b.qk_norms(l)?);
    b.rope_attention(l, ops);
    let gate_dims = GateDims {
        width: q_rows as u32,
        x_stride: q_rows as u32,
        g_stride: q_rows as u32,
        g_offset: 0,
        per_row: false,
    };
    ops.push(Op::Gate(GateOp::new(
        gpu,
        b.kernels,
        &b.step.step,
        &act.attn_gate,
        &act.attn,
        gate_dims,
    )));
    ops.push(Op::Linear(b.linear(&o_name, &o, &act.attn, &act.hidden, true, TokenRows::Step)));
    Ok(bytes)
}
