//! DeepSeek-V2/V3 with dense MLPs (HF `DeepseekV2ForCausalLM` / `DeepseekV3ForCausalLM`, GGUF
//! `deepseek2`): multi-head latent attention in the absorbed form, as a flat list of
//! dispatches. `R` = kv_lora_rank, `dn`/`dr` = qk_nope/qk_rope head dims, `dv` = v_head_dim,
//! `W_UK_h`/`W_UV_h` = head h's `[dn, R]` / `[dv, R]` rows of `kv_b_proj`.
//!
//! ```text
//! per layer:  normed = rms_norm(hidden)              · attn_norm
//!             q      = normed · Wqᵀ, or rms_norm(normed · Wq_aᵀ) · q_a_norm · Wq_bᵀ  [H, dn + dr]
//!             qkv.Q_h[0..R]  = q_h[0..dn] · W_UK_h            per head: the absorbed query
//!             qkv.Q_h[R..]   = (normed | q_a) · Wq_pe,hᵀ      per head: q's RoPE rows, in place
//!             qkv.K[0..R]    = rms_norm(normed · Wkv_a[0..R]ᵀ) · kv_a_norm          c_kv
//!             qkv.K[R..]     = normed · Wkv_a[R..]ᵀ                                 k_pe
//!             rope(Q_h[R..], K[R..])                 adjacent pairs, the layer's table (YaRN)
//!             kv_write(K → pool[layer])              one latent row per token: no V
//!             attn_h = attention(Q_h, pool[layer])   MQA over [c_kv ; k_pe], values = c_kv
//!                                                    (the pool's first R channels), scale
//!                                                    1/√(dn + dr) · YaRN mscale²
//!             v_h    = attn_h[0..R] · W_UV_hᵀ        per head
//!             hidden += v · Woᵀ
//!             MLP as Llama (SwiGLU)
//! ```
//!
//! Why the absorbed form for prefill too: it reads the latent cache as it is (one MQA head of
//! R + dr channels), so prefill, decode and prefix reuse share one kernel and one cache layout;
//! the expanded form would materialise per-head K and V of every cached token for every
//! prefill chunk. On lavapipe, which is compute-bound, an MHA model with the same heads (a lower
//! bound for the expanded form) prefills 4096 tokens faster (`scripts/mla-vs-mha.sh`: 3,181 vs
//! 2,191 tok/s): the trade-off is left for a GPU measurement. `tests/kernel_attention.rs`
//! (`mla_absorbed_attention_matches_the_expanded_form`) checks the absorbed GPU path against
//! the expanded attention on the CPU. Per layer this costs 3 + 3H linear dispatches (the
//! per-head ones are small); a grouped-row linear would make them 3.

use super::common::Builder;
use crate::kernels::linear::{LinearIo, LinearOp, TokenRows};
use crate::kernels::rms_norm::{HeadRows, NormRows};
use crate::kernels::GpuWeight;
use crate::loader::Activation;
use crate::model::weights::{gpu_bytes, matrix, matrix_f32, matrix_rows, matrix_values};
use crate::model::{ModelError, Op};

/// `out[t, out_offset..] = x[t, x_offset..] · wᵀ` over rows of the given strides.
fn strided(
    b: &Builder,
    label: &str,
    w: &GpuWeight,
    (x, x_stride, x_offset): (&wgpu::Buffer, usize, usize),
    (out, out_stride, out_offset): (&wgpu::Buffer, usize, usize),
) -> Op {
    Op::Linear(LinearOp::new(
        b.gpu,
        b.kernels,
        label,
        w,
        LinearIo {
            step: &b.step.step,
            x,
            x_stride: x_stride as u32,
            x_offset: x_offset as u32,
            out,
            out_stride: out_stride as u32,
            out_offset: out_offset as u32,
            bias: None,
            accumulate: false,
            rows: TokenRows::Step,
            glu: None,
            norm: None,
        },
    ))
}

/// Layer `l`'s `W_UK_hᵀ` ([H, R, dn]) and `W_UV_h` ([H, dv, R]) as f32, from `attn_k_b` and
/// `attn_v_b` (GGUF, current converter: already in these shapes) or from `attn_kv_b` ([H · (dn
/// + dv), R]: HF, older GGUF), split per head and K's part transposed.
fn absorbed_weights(b: &Builder, l: usize) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
    let (c, file) = (b.c, b.file);
    let m = c.mla.expect("a DeepSeek config has MLA");
    let (heads, rank, dn, dv) = (c.num_heads, m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim);
    let name = |t: &str| format!("blk.{l}.{t}");
    if file.has_tensor(&name("attn_k_b.weight")) {
        let k_b = file.tensor(&name("attn_k_b.weight"))?;
        let v_b = file.tensor(&name("attn_v_b.weight"))?;
        let values = |t: crate::loader::TensorView<'_>, shape: [usize; 3]| {
            if t.shape != shape {
                return Err(ModelError::BadShape {
                    tensor: t.name.clone(),
                    shape: t.shape.clone(),
                    expected: shape.to_vec(),
                });
            }
            t.to_f32().map_err(|e| ModelError::Unsupported(format!("tensor '{}': {e}", t.name)))
        };
        return Ok((values(k_b, [heads, rank, dn])?, values(v_b, [heads, dv, rank])?));
    }
    let kv_b = matrix_values(file, &name("attn_kv_b.weight"), heads * (dn + dv), rank)?;
    let mut uk_t = Vec::with_capacity(heads * rank * dn);
    let mut uv = Vec::with_capacity(heads * dv * rank);
    for h in 0..heads {
        let head = &kv_b[h * (dn + dv) * rank..][..(dn + dv) * rank];
        uk_t.extend((0..rank).flat_map(|j| (0..dn).map(move |i| head[i * rank + j])));
        uv.extend_from_slice(&head[dn * rank..]);
    }
    Ok((uk_t, uv))
}

/// Appends one DeepSeek layer's ops; returns the bytes of its weights.
pub(super) fn layer(b: &Builder, l: usize, ops: &mut Vec<Op>) -> Result<u64, ModelError> {
    let (c, gpu, act, file, max) = (b.c, b.gpu, b.act, b.file, b.max_binding);
    let m = c.mla.expect("a DeepSeek config has MLA");
    let mla = act.mla.as_ref().expect("MLA activations are allocated for an MLA config");
    let name = |t: &str| format!("blk.{l}.{t}");
    let (hidden, heads) = (c.hidden_size, c.num_heads);
    let (rank, dn, dv) = (m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim);
    let (qd, latent) = (m.q_head_dim(), m.latent_width());
    let layout = b.layout(l);
    let stride = layout.stride() as usize;
    let k_off = layout.k_offset() as usize;
    let mut weights: Vec<GpuWeight> = Vec::new();
    let mut push = |w: GpuWeight| weights.push(w);

    // the query input: normed, or q-LoRA's normed q_a
    ops.push(b.input_norm(l, "attn_norm")?);
    let (q_name, q_in, q_cols) = match m.q_lora_rank {
        Some(r) => {
            let qa_name = name("attn_q_a.weight");
            let qa = matrix(gpu, file, &qa_name, r, hidden, max)?;
            ops.push(Op::Linear(b.linear(
                &qa_name,
                &qa,
                &act.normed,
                &mla.q_a,
                false,
                TokenRows::Step,
            )));
            push(qa);
            let rows = HeadRows {
                heads: 1,
                x_stride: r as u32,
                x_offset: 0,
                out_stride: r as u32,
                out_offset: 0,
                split: 1,
            };
            let norm = name("attn_q_a_norm.weight");
            ops.push(b.norm_dim(
                &norm,
                r,
                &mla.q_a,
                &mla.q_a_normed,
                NormRows::Heads(rows),
                false,
            )?);
            (name("attn_q_b.weight"), &mla.q_a_normed, r)
        }
        None => (name("attn_q.weight"), &act.normed, hidden),
    };
    let q_rows = heads * qd;
    let wq = matrix(gpu, file, &q_name, q_rows, q_cols, max)?;
    ops.push(strided(b, &q_name, &wq, (q_in, q_cols, 0), (&mla.q, q_rows, 0)));
    push(wq);
    // per head: the RoPE rows of q straight into qkv, and q_nope · W_UK_h (absorbed)
    let (uk_t, uv) = absorbed_weights(b, l)?;
    for h in 0..heads {
        let rows = h * qd + dn..(h + 1) * qd;
        let w_pe = matrix_rows(gpu, file, &q_name, [q_rows, q_cols], rows, max)?;
        let pe_out = (&act.qkv, stride, h * latent + rank);
        ops.push(strided(b, &q_name, &w_pe, (q_in, q_cols, 0), pe_out));
        push(w_pe);
        let label = name(&format!("W_UK head {h}"));
        let w_uk = matrix_f32(gpu, &label, &uk_t[h * rank * dn..][..rank * dn], rank, dn, max)?;
        let q_nope = (&mla.q, q_rows, h * qd);
        ops.push(strided(b, &label, &w_uk, q_nope, (&act.qkv, stride, h * latent)));
        push(w_uk);
    }
    // the latent key: c_kv (normed) and k_pe, into qkv's K row
    let kv_a_name = name("attn_kv_a_mqa.weight");
    let w_ckv = matrix_rows(gpu, file, &kv_a_name, [latent, hidden], 0..rank, max)?;
    ops.push(strided(b, &kv_a_name, &w_ckv, (&act.normed, hidden, 0), (&mla.c_kv, rank, 0)));
    push(w_ckv);
    let rows = HeadRows {
        heads: 1,
        x_stride: rank as u32,
        x_offset: 0,
        out_stride: stride as u32,
        out_offset: k_off as u32,
        split: 1,
    };
    let kv_norm = name("attn_kv_a_norm.weight");
    ops.push(b.norm_dim(&kv_norm, rank, &mla.c_kv, &act.qkv, NormRows::Heads(rows), false)?);
    let w_kpe = matrix_rows(gpu, file, &kv_a_name, [latent, hidden], rank..latent, max)?;
    ops.push(strided(
        b,
        &kv_a_name,
        &w_kpe,
        (&act.normed, hidden, 0),
        (&act.qkv, stride, k_off + rank),
    ));
    push(w_kpe);

    ops.push(b.rope(l));
    b.attention(l, ops);
    // per head: v_h = attn_h[0..R] · W_UV_hᵀ
    for h in 0..heads {
        let label = name(&format!("W_UV head {h}"));
        let w_uv = matrix_f32(gpu, &label, &uv[h * dv * rank..][..dv * rank], dv, rank, max)?;
        let attn = (&act.attn, heads * latent, h * latent);
        ops.push(strided(b, &label, &w_uv, attn, (&mla.v, heads * dv, h * dv)));
        push(w_uv);
    }
    let o_name = name("attn_output.weight");
    let o = matrix(gpu, file, &o_name, hidden, heads * dv, max)?;
    ops.push(Op::Linear(b.linear(&o_name, &o, &mla.v, &act.hidden, true, TokenRows::Step)));
    push(o);

    if c.is_moe_layer(l) {
        let bytes: u64 = weights.iter().map(gpu_bytes).sum();
        return Ok(bytes + b.moe_mlp(l, "ffn_norm", ops)?);
    }
    let ffn = c.intermediate_size;
    let down = matrix(gpu, file, &name("ffn_down.weight"), hidden, ffn, max)?;
    let input = b.sublayer_input(l, "ffn_norm", ops)?;
    let gate_up_bytes = b.gated_mlp_in(l, Activation::Silu, &input, ops)?;
    let down_op = b.linear(&name("ffn_down"), &down, &act.ffn, &act.hidden, true, TokenRows::Step);
    ops.push(Op::Linear(down_op));
    let bytes: u64 = weights.iter().chain([&down]).map(gpu_bytes).sum();
    Ok(bytes + gate_up_bytes)
}
