//! The Llama family (Llama 2/3, SmolLM2, Mistral without window, Qwen2 with QKV bias) as a flat
//! list of dispatches:
//!
//! ```text
//! hidden = embed(tokens)
//! per layer:  normed = rms_norm(hidden)            · attn_norm
//!             qkv    = normed · [Wq|Wk|Wv]ᵀ (+ bias)   one fused linear when the types agree
//!             rope(q, k)                              pairs per ModelConfig::rope_style
//!             [rotate(q, k, v)]                       --kv-rotate: Hadamard per head
//!             f16 KV:       kv_write(k, v → pool[layer])            through the slot mapping
//!                           attn = paged_attention(q, pool[layer])
//!             quantized KV: kv_quantize(blocks completed this step → pool[layer])
//!                           attn = paged_attention_kvq(q, pool[layer], staging, own rows)
//!                           kv_stage(rows of partial last blocks → staging[layer])
//!             [rotate(attn)]                          undoes V's rotation
//!             hidden += attn · Woᵀ
//!             normed = rms_norm(hidden)            · ffn_norm
//!             gate_up = normed · [Wgate|Wup]ᵀ
//!             ffn    = silu(gate) · up
//!             hidden += ffn · Wdownᵀ
//! logits_in = rms_norm(hidden[logit_rows]) · output_norm
//! logits    = logits_in · Woutᵀ                       Wout = token_embd when tied (no output.weight)
//! ```

use std::sync::Arc;

use super::buffers::{Activations, KvPool, StepBuffers};
use super::weights::{self, fused, gpu_bytes, matrix, FusedPart};
use super::{Model, ModelError, ModelOptions, Op};
use crate::gpu::Gpu;
use crate::kernels::attention::KvQuantIo;
use crate::kernels::attention::{partitions, AttentionIo, AttentionOp, MAX_HEAD_DIM};
use crate::kernels::embedding::EmbeddingOp;
use crate::kernels::glu::GluOp;
use crate::kernels::kv_quantize::{KvQuantizeIo, KvQuantizeOp, KvStageOp};
use crate::kernels::kv_write::KvWriteOp;
use crate::kernels::linear::{LinearIo, LinearOp, TokenRows};
use crate::kernels::rms_norm::{NormRows, RmsNormOp};
use crate::kernels::rope::{rope_table, QkvLayout, RopeOp, RopePairs};
use crate::kernels::rotate::{RotateOp, RotateRows};
use crate::kernels::Kernels;
use crate::loader::{Activation, Architecture, AttentionKind, ModelConfig, ModelFile, RopeStyle};

fn validate(c: &ModelConfig, o: &ModelOptions) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::Unsupported(m));
    if c.hidden_size % 32 != 0 || c.intermediate_size % 32 != 0 {
        return bad(format!(
            "hidden size {} and FFN size {} must be multiples of 32 for the GPU kernels",
            c.hidden_size, c.intermediate_size
        ));
    }
    if c.head_dim % 2 != 0 || c.head_dim > MAX_HEAD_DIM as usize || c.head_dim < 8 {
        return bad(format!("head_dim {} is not supported (even, 8..={MAX_HEAD_DIM})", c.head_dim));
    }
    let distinct_ropes = c.distinct_ropes().len();
    let unsupported = [
        (c.arch == Architecture::Gemma3, "the Gemma 3 architecture"),
        (c.qk_norm, "Q/K norms"),
        (c.post_norms, "post-attention/post-MLP norms"),
        (c.activation != Activation::Silu, "a GELU MLP"),
        (c.layers.iter().any(|l| l.attention != AttentionKind::Full), "sliding-window attention"),
        (distinct_ropes > 1, "layers with different RoPE"),
        (
            (c.attention_scale * (c.head_dim as f32).sqrt() - 1.0).abs() > 1e-5,
            "an attention scale other than 1/sqrt(head_dim)",
        ),
    ];
    if let Some((_, what)) = unsupported.iter().find(|(on, _)| *on) {
        return bad(format!("this model uses {what}, which the GPU forward does not run yet"));
    }
    if o.block_size == 0
        || o.max_model_len == 0
        || o.max_num_batched_tokens == 0
        || o.max_num_seqs == 0
    {
        return bad(
            "block size, context length, batch tokens and sequences must all be at least 1".into(),
        );
    }
    if o.num_blocks == 0 {
        return bad("the KV pool needs at least one block; raise --kv-cache-memory".into());
    }
    if let Err(e) = o.kv_cache.check_head_dim(c.head_dim) {
        return bad(e.to_string());
    }
    if o.kv_cache.format().is_quantized()
        && o.block_size.max(c.head_dim) > crate::kernels::kv_quantize::MAX_GROUPS
    {
        return bad(format!(
            "quantized KV needs --block-size at most {}",
            crate::kernels::kv_quantize::MAX_GROUPS
        ));
    }
    Ok(())
}

pub(super) fn load(
    gpu: Arc<Gpu>,
    kernels: &Kernels,
    file: &ModelFile,
    options: ModelOptions,
) -> Result<Model, ModelError> {
    let c = file.config().clone();
    validate(&c, &options)?;
    let max_binding = kernels.config.max_binding_bytes;
    super::limits::check_buffer_sizes(&c, &options, max_binding)?;
    let table = rope_table(c.head_dim, &c.layers[0].rope, options.max_model_len);
    let scope = gpu.allocation_scope();
    let step = StepBuffers::new(&gpu, &options);
    let act = Activations::new(&gpu, &c, &options, &table);
    let kv = KvPool::new(&gpu, &c, &options, max_binding)?;
    let b = Builder {
        gpu: &gpu,
        kernels,
        file,
        c: &c,
        o: &options,
        step: &step,
        act: &act,
        kv: &kv,
        max_binding,
    };
    let (ops, weight_bytes) = b.build()?;
    scope.finish(
        "the weights, activations and KV pool",
        weight_bytes + kv.bytes + kv.staging_bytes,
    )?;
    let variant = kernels.config.attention(c.head_dim as u32);
    let query_tile = crate::kernels::attention::query_tile(variant, c.head_dim as u32) as usize;
    Ok(Model {
        gpu,
        config: c,
        options,
        ops,
        step,
        act,
        kv,
        weight_bytes,
        timer: None,
        timing: super::Timing::Off,
        query_tile,
    })
}

struct Builder<'a> {
    gpu: &'a Gpu,
    kernels: &'a Kernels,
    file: &'a ModelFile,
    c: &'a ModelConfig,
    o: &'a ModelOptions,
    step: &'a StepBuffers,
    act: &'a Activations,
    kv: &'a KvPool,
    max_binding: u64,
}

impl Builder<'_> {
    fn layout(&self) -> QkvLayout {
        QkvLayout {
            num_heads: self.c.num_heads as u32,
            num_kv_heads: self.c.num_kv_heads as u32,
            head_dim: self.c.head_dim as u32,
        }
    }

    fn build(&self) -> Result<(Vec<Op>, u64), ModelError> {
        let (c, gpu, act) = (self.c, self.gpu, self.act);
        let hidden = c.hidden_size;
        let embd =
            matrix(gpu, self.file, "token_embd.weight", c.vocab_size, hidden, self.max_binding)?;
        let mut bytes = gpu_bytes(&embd);
        let mut ops = vec![Op::Embedding(EmbeddingOp::new(
            gpu,
            self.kernels,
            &embd,
            &self.step.step,
            &self.step.token_ids,
            &act.hidden,
            hidden as u32,
            c.embedding_scale.unwrap_or(1.0),
        ))];
        let progress =
            indicatif::ProgressBar::new(c.num_layers as u64).with_message("uploading layers");
        for layer in 0..c.num_layers {
            bytes += self.layer(layer, &mut ops)?;
            progress.inc(1);
        }
        progress.finish_and_clear();
        let norm = self.norm_weight("output_norm.weight")?;
        let norm = gpu.storage_buffer_init("output_norm", bytemuck::cast_slice(&norm));
        ops.push(Op::RmsNorm(RmsNormOp::new(
            gpu,
            self.kernels,
            "output_norm",
            &self.step.step,
            &act.hidden,
            &norm,
            &act.logits_in,
            hidden as u32,
            c.rms_norm_eps,
            NormRows::Gather(&self.step.logit_rows),
        )));
        let head = if self.file.has_tensor("output.weight") {
            let w =
                matrix(gpu, self.file, "output.weight", c.vocab_size, hidden, self.max_binding)?;
            bytes += gpu_bytes(&w);
            w
        } else {
            embd
        };
        ops.push(Op::Linear(self.linear(
            "lm_head",
            &head,
            &act.logits_in,
            &act.logits,
            0,
            None,
            false,
            TokenRows::Logits,
        )));
        Ok((ops, bytes))
    }

    /// Appends one transformer layer's ops; returns the bytes of its weights.
    fn layer(&self, l: usize, ops: &mut Vec<Op>) -> Result<u64, ModelError> {
        let (c, gpu, act, k) = (self.c, self.gpu, self.act, self.kernels);
        let name = |t: &str| format!("blk.{l}.{t}");
        let hidden = c.hidden_size;
        let layout = self.layout();
        let mut bytes = 0;
        let bias = |t: &str| c.attention_bias.then(|| name(&format!("{t}.bias")));
        let qkv_tensors = [
            (name("attn_q.weight"), c.num_heads * c.head_dim, bias("attn_q")),
            (name("attn_k.weight"), c.num_kv_heads * c.head_dim, bias("attn_k")),
            (name("attn_v.weight"), c.num_kv_heads * c.head_dim, bias("attn_v")),
        ];
        let qkv = fused(gpu, self.file, &name("attn_qkv"), &qkv_tensors, hidden, self.max_binding)?;
        let o = matrix(
            gpu,
            self.file,
            &name("attn_output.weight"),
            hidden,
            c.num_heads * c.head_dim,
            self.max_binding,
        )?;
        let ffn = c.intermediate_size;
        let gate_up_tensors =
            [(name("ffn_gate.weight"), ffn, None), (name("ffn_up.weight"), ffn, None)];
        let gate_up = fused(
            gpu,
            self.file,
            &name("ffn_gate_up"),
            &gate_up_tensors,
            hidden,
            self.max_binding,
        )?;
        let down = matrix(gpu, self.file, &name("ffn_down.weight"), hidden, ffn, self.max_binding)?;
        for w in qkv.iter().chain(&gate_up).map(|p| &p.weight).chain([&o, &down]) {
            bytes += gpu_bytes(w);
        }

        ops.push(self.norm(l, "attn_norm")?);
        self.fused_ops(&name("qkv"), &qkv, layout.stride(), &act.qkv, ops);
        let pairs = match c.rope_style {
            RopeStyle::Interleaved => RopePairs::Interleaved,
            RopeStyle::Neox => RopePairs::Neox,
        };
        let s = self.step;
        ops.push(Op::Rope(RopeOp::new(
            gpu,
            k,
            &s.step,
            &act.qkv,
            &s.positions,
            &act.rope_table,
            layout,
            pairs,
        )));
        if self.o.kv_cache.rotate {
            ops.push(self.rotate(&act.qkv, layout.stride() / layout.head_dim, layout.stride()));
        }
        self.attention(l, ops);
        if self.o.kv_cache.rotate {
            let width = layout.num_heads * layout.head_dim;
            ops.push(self.rotate(&act.attn, layout.num_heads, width));
        }
        ops.push(Op::Linear(self.linear(
            &name("attn_output"),
            &o,
            &act.attn,
            &act.hidden,
            0,
            None,
            true,
            TokenRows::Step,
        )));
        ops.push(self.norm(l, "ffn_norm")?);
        self.fused_ops(&name("gate_up"), &gate_up, 2 * ffn as u32, &act.gate_up, ops);
        let act_fn = crate::loader::Activation::Silu;
        ops.push(Op::Glu(GluOp::new(gpu, k, act_fn, &s.step, &act.gate_up, &act.ffn, ffn as u32)));
        ops.push(Op::Linear(self.linear(
            &name("ffn_down"),
            &down,
            &act.ffn,
            &act.hidden,
            0,
            None,
            true,
            TokenRows::Step,
        )));
        Ok(bytes)
    }

    /// Writes this step's K and V into layer `l`'s pool and attends: `kv_write` + attention
    /// for f16, `kv_quantize` + attention + `kv_stage` for a quantized pool.
    fn attention(&self, l: usize, ops: &mut Vec<Op>) {
        let (gpu, k, act, s) = (self.gpu, self.kernels, self.act, self.step);
        let layout = self.layout();
        let (kp, vp) = (&self.kv.k[l], &self.kv.v[l]);
        let bs = self.o.block_size as u32;
        let kv_quant = self.kv.quant.map(|q| KvQuantIo { layout: q, stage: &self.kv.stage[l] });
        match kv_quant {
            None => ops.push(Op::KvWrite(KvWriteOp::new(
                gpu,
                k,
                &s.step,
                &act.qkv,
                &s.slot_mapping,
                kp,
                vp,
                layout,
                bs,
            ))),
            Some(q) => ops.push(Op::KvQuantize(KvQuantizeOp::new(
                gpu,
                k,
                layout,
                bs,
                q.layout,
                KvQuantizeIo {
                    step: &s.step,
                    qkv: &act.qkv,
                    stage: q.stage,
                    completed: &s.completed_blocks,
                    k_pool: kp,
                    v_pool: vp,
                },
            ))),
        }
        let io = AttentionIo {
            step: &s.step,
            qkv: &act.qkv,
            k_pool: kp,
            v_pool: vp,
            seqs: &s.seqs,
            block_tables: &s.block_tables,
            prefill_tiles: &s.tiles,
            partials: &act.partials,
            out: &act.attn,
            kv_quant,
        };
        let parts = partitions(self.o.max_model_len as u32);
        ops.push(Op::Attention(AttentionOp::new(gpu, k, layout, bs, parts, io)));
        if let Some(q) = kv_quant {
            ops.push(Op::KvStage(KvStageOp::new(
                gpu,
                k,
                &s.step,
                &act.qkv,
                &s.stage_rows,
                q.stage,
                layout,
                bs,
                q.layout.stage_slots,
            )));
        }
    }

    /// The Hadamard rotation of the first `heads` heads of every step row of `x`.
    fn rotate(&self, x: &wgpu::Buffer, heads: u32, row_stride: u32) -> Op {
        let rows = RotateRows { heads, head_dim: self.c.head_dim as u32, row_stride, offset: 0 };
        Op::Rotate(RotateOp::new(self.gpu, self.kernels, "rotate", &self.step.step, x, rows))
    }

    fn norm(&self, l: usize, which: &str) -> Result<Op, ModelError> {
        let name = format!("blk.{l}.{which}.weight");
        let w = self.norm_weight(&name)?;
        let w = self.gpu.storage_buffer_init(&name, bytemuck::cast_slice(&w));
        Ok(Op::RmsNorm(RmsNormOp::new(
            self.gpu,
            self.kernels,
            &name,
            &self.step.step,
            &self.act.hidden,
            &w,
            &self.act.normed,
            self.c.hidden_size as u32,
            self.c.rms_norm_eps,
            NormRows::Step,
        )))
    }

    /// An RMSNorm weight [hidden] with `ModelConfig::norm_weight_offset` added (HF Gemma's 1 + w).
    fn norm_weight(&self, name: &str) -> Result<Vec<f32>, ModelError> {
        let mut w = weights::vector(self.file, name, self.c.hidden_size)?;
        w.iter_mut().for_each(|x| *x += self.c.norm_weight_offset);
        Ok(w)
    }

    /// One linear op per part of a fused projection from `normed` into `out` (row stride `stride`).
    fn fused_ops(
        &self,
        label: &str,
        parts: &[FusedPart],
        stride: u32,
        out: &wgpu::Buffer,
        ops: &mut Vec<Op>,
    ) {
        for p in parts {
            let op = LinearOp::new(
                self.gpu,
                self.kernels,
                label,
                &p.weight,
                LinearIo {
                    step: &self.step.step,
                    x: &self.act.normed,
                    x_stride: self.c.hidden_size as u32,
                    x_offset: 0,
                    out,
                    out_stride: stride,
                    out_offset: p.out_offset,
                    bias: p.bias.as_ref(),
                    accumulate: false,
                    rows: TokenRows::Step,
                },
            );
            ops.push(Op::Linear(op));
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        label: &str,
        w: &crate::kernels::GpuWeight,
        x: &wgpu::Buffer,
        out: &wgpu::Buffer,
        out_offset: u32,
        bias: Option<&wgpu::Buffer>,
        accumulate: bool,
        rows: TokenRows,
    ) -> LinearOp {
        LinearOp::new(
            self.gpu,
            self.kernels,
            label,
            w,
            LinearIo {
                step: &self.step.step,
                x,
                x_stride: w.cols as u32,
                x_offset: 0,
                out,
                out_stride: w.rows as u32,
                out_offset,
                bias,
                accumulate,
                rows,
            },
        )
    }
}
