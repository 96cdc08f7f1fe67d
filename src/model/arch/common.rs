//! The pieces every architecture's builder shares: [`Builder`] holds what `arch::load` allocated
//! and appends ops; [`validate`] checks what every kernel needs.

use super::super::buffers::{Activations, KvPool, StatePool, StepBuffers};
use super::super::weights::{self, matrix, FusedPart, GateUp};
use super::super::{ModelError, ModelOptions, Op};
use crate::gpu::Gpu;
use crate::kernels::argmax::ArgmaxOp;
use crate::kernels::attention::{partitions, AttentionIo, AttentionOp, KvQuantIo, MAX_HEAD_DIM};
use crate::kernels::embedding::EmbeddingOp;
use crate::kernels::glu::GluOp;
use crate::kernels::kv_quantize::{KvQuantizeIo, KvQuantizeOp, KvStageOp};
use crate::kernels::kv_write::KvWriteOp;
use crate::kernels::linear::{InputNorm, LinearIo, LinearOp, TokenRows};
use crate::kernels::logit_edit::LogitEditOp;
use crate::kernels::logprob::LogprobOp;
use crate::kernels::rms_norm::{HeadRows, NormIo, NormRows, RmsNormOp};
use crate::kernels::rope::{QkvLayout, RopeHeads, RopeOp, RopePairs};
use crate::kernels::rope_kv_write::{self, RopeKvIo, RopeKvWriteOp};
use crate::kernels::rotate::MAX_HEAD_DIM as ROTATE_MAX_HEAD_DIM;
use crate::kernels::rotate::{RotateOp, RotateRows};
use crate::kernels::sampling::SampleOp;
use crate::kernels::softcap::SoftcapOp;
use crate::kernels::{GpuWeight, Kernels};
use std::num::NonZeroU32;

use crate::loader::{Activation, ModelConfig, ModelFile, RopeStyle};
use crate::quant::pool_heads;

/// How a sub-layer's first projections read their input ([`Builder::sublayer_input`]): the
/// `normed` rows an RMSNorm op wrote, or the `hidden` rows normed on load by each projection.
pub(super) struct SublayerInput {
    /// The norm's weight and epsilon when the projections apply it.
    on_load: Option<(wgpu::Buffer, f32)>,
}

impl SublayerInput {
    /// The rows `normed` holds (an RMSNorm op, or the architecture itself, wrote them).
    pub(super) fn normed() -> Self {
        SublayerInput { on_load: None }
    }

    /// The buffer a projection reads and the norm it applies on load.
    fn x<'a>(&'a self, act: &'a Activations) -> (&'a wgpu::Buffer, Option<InputNorm<'a>>) {
        match &self.on_load {
            Some((weight, eps)) => (&act.hidden, Some(InputNorm { weight, eps: *eps })),
            None => (&act.normed, None),
        }
    }
}

/// Layer `l`'s place in the KV cache ([`Builder::layer_kv`]).
struct LayerKv<'b> {
    /// Its KV-cache group: which block table and slot mapping it reads.
    group: usize,
    /// Its slot's pool buffers.
    k: &'b wgpu::Buffer,
    v: &'b wgpu::Buffer,
    /// A quantized pool's layout and the layer's f16 staging.
    quant: Option<KvQuantIo<'b>>,
}

/// The shape rules of the kernels and the options, whatever the architecture.
pub(super) fn validate(c: &ModelConfig, o: &ModelOptions) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::Unsupported(m));
    if let Some(m) = c.moe.filter(|m| !m.expert_ffn.is_multiple_of(32)) {
        return bad(format!(
            "experts of {} channels: kvrun's expert kernels need a multiple of 32",
            m.expert_ffn
        ));
    }
    if !c.hidden_size.is_multiple_of(32) || !c.intermediate_size.is_multiple_of(32) {
        return bad(format!(
            "hidden size {} and FFN size {} must be multiples of 32 for the GPU kernels",
            c.hidden_size, c.intermediate_size
        ));
    }
    if c.mla.is_some() && c.head_dim > MAX_HEAD_DIM as usize {
        return bad(format!(
            "this model's MLA latent (kv_lora_rank + qk_rope_head_dim = {} channels) is wider \
             than the attention kernels' {MAX_HEAD_DIM}",
            c.head_dim
        ));
    }
    for (_, hd) in c.head_shapes() {
        if o.kv_cache.rotate && hd > ROTATE_MAX_HEAD_DIM as usize {
            return bad(format!(
                "--kv-rotate rotates heads of at most {ROTATE_MAX_HEAD_DIM} channels and this \
                 model's are {hd}; drop --kv-rotate"
            ));
        }
        if hd % 2 != 0 || hd > MAX_HEAD_DIM as usize || hd < 8 {
            return bad(format!("head_dim {hd} is not supported (even, 8..={MAX_HEAD_DIM})"));
        }
        if let Err(e) = o.kv_cache.check_head_dim(hd) {
            return bad(e.to_string());
        }
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
    let shapes = c.head_shapes();
    let room = match pool_heads(&o.kv_cache, o.block_size, &shapes, c.values_in_keys()) {
        Ok(room) => room,
        Err(e) => return bad(e.to_string()),
    };
    // layers packed into a slot each take their own heads of its blocks
    for l in (0..c.num_layers).filter(|&l| o.kv_groups.has_kv(l)) {
        let (kvh, hd) = c.layer_heads(l);
        let room = room[shapes.iter().position(|&s| s == (kvh, hd)).expect("listed")];
        if (o.kv_groups.layer_place(l) + 1) * kvh > room {
            return bad(format!(
                "layer {l}'s KV heads ({kvh} × {hd}) do not fit their place in the pool's \
                 blocks of {room} such heads with this --kv-cache-dtype; use f16"
            ));
        }
    }
    if o.kv_cache.format().is_quantized()
        && o.block_size.max(c.max_head_dim()) > crate::kernels::kv_quantize::MAX_GROUPS
    {
        return bad(format!(
            "quantized KV needs --block-size at most {}",
            crate::kernels::kv_quantize::MAX_GROUPS
        ));
    }
    Ok(())
}

/// What `arch::load` allocated, and the helpers that append the ops of one architecture.
pub(super) struct Builder<'a> {
    pub gpu: &'a Gpu,
    pub kernels: &'a Kernels,
    pub file: &'a ModelFile,
    pub c: &'a ModelConfig,
    pub o: &'a ModelOptions,
    pub step: &'a StepBuffers,
    pub act: &'a Activations,
    pub kv: &'a KvPool,
    /// The recurrent layers' states (empty without them).
    pub states: &'a StatePool,
    pub max_binding: u64,
}

impl Builder<'_> {
    /// The whole op list and the bytes of the weights: the embedding, `layer` for every layer
    /// (the architecture's own ops), the final norm and the LM head.
    pub fn build(
        &self,
        layer: impl Fn(&Builder, usize, &mut Vec<Op>) -> Result<u64, ModelError>,
    ) -> Result<(Vec<Op>, u64), ModelError> {
        let (embedding, embd) = self.embedding()?;
        let mut bytes = weights::gpu_bytes(&embd);
        let mut ops = vec![embedding];
        let progress =
            indicatif::ProgressBar::new(self.c.num_layers as u64).with_message("uploading layers");
        for l in 0..self.c.num_layers {
            bytes += layer(self, l, &mut ops)?;
            progress.inc(1);
        }
        progress.finish_and_clear();
        bytes += self.output(embd, &mut ops)?;
        Ok((ops, bytes))
    }

    /// Layer `l`'s Q/K/V heads ([`ModelConfig::layer_heads`]) and the room its pool blocks
    /// have ([`KvPool::pool_heads`]).
    pub fn layout(&self, l: usize) -> QkvLayout {
        let (kv_heads, head_dim) = self.c.layer_heads(l);
        let room = self.kv.pool_heads(kv_heads, head_dim) as u32;
        // a layer packed into a slot beside others of its shape: its own heads of the block
        let base = match self.o.kv_groups.has_kv(l) {
            true => (self.o.kv_groups.layer_place(l) * kv_heads) as u32,
            false => 0,
        };
        QkvLayout {
            values_in_keys: self.c.values_in_keys(),
            ..QkvLayout::new(self.c.num_heads as u32, kv_heads as u32, head_dim as u32)
        }
        .with_pool_heads_from(room, base)
    }

    /// `hidden = token_embd[tokens] · embedding_scale`; returns the op and the table (the LM
    /// head when tied).
    pub fn embedding(&self) -> Result<(Op, GpuWeight), ModelError> {
        let (c, hidden) = (self.c, self.c.hidden_size);
        let embd = matrix(
            self.gpu,
            self.file,
            "token_embd.weight",
            c.vocab_size,
            hidden,
            self.max_binding,
        )?;
        let op = Op::Embedding(EmbeddingOp::new(
            self.gpu,
            self.kernels,
            &embd,
            &self.step.step,
            &self.step.token_ids,
            &self.act.hidden,
            hidden as u32,
            c.embedding_scale.unwrap_or(1.0),
        ));
        Ok((op, embd))
    }

    /// The final norm of the logit rows and the LM head (`output.weight`, or `embd` when tied);
    /// returns the bytes of `output.weight` (0 when tied).
    pub fn output(&self, embd: GpuWeight, ops: &mut Vec<Op>) -> Result<u64, ModelError> {
        let (c, act) = (self.c, self.act);
        let rows = NormRows::Gather(&self.step.logit_rows);
        ops.push(self.norm("output_norm.weight", &act.hidden, &act.logits_in, rows, false)?);
        let (head, bytes) = if self.file.has_tensor("output.weight") {
            let w = matrix(
                self.gpu,
                self.file,
                "output.weight",
                c.vocab_size,
                c.hidden_size,
                self.max_binding,
            )?;
            let bytes = weights::gpu_bytes(&w);
            (w, bytes)
        } else {
            (embd, 0)
        };
        let lm_head =
            self.linear("lm_head", &head, &act.logits_in, &act.logits, false, TokenRows::Logits);
        ops.push(Op::Linear(lm_head));
        if let Some(cap) = c.final_logit_softcap {
            let step = &self.step.step;
            let vocab = c.vocab_size as u32;
            ops.push(Op::Softcap(SoftcapOp::new(
                self.gpu,
                self.kernels,
                step,
                &act.logits,
                vocab,
                cap,
            )));
        }
        // the samplers' bias and penalties on the GPU, before the choices
        let vocab = c.vocab_size as u32;
        let step = &self.step.step;
        let edits = &self.step.logit_edits;
        ops.push(Op::LogitEdit(LogitEditOp::new(
            self.gpu,
            self.kernels,
            step,
            &act.logits,
            edits,
            vocab,
        )));
        // greedy sampling on the GPU, for steps that read back argmaxes only
        let argmax =
            ArgmaxOp::new(self.gpu, self.kernels, step, &act.logits, &act.token_ids, vocab);
        ops.push(Op::Argmax(argmax));
        // random sampling on the GPU, from the argmaxes (greedy rows keep theirs)
        let rows = &self.step.logit_sampling;
        let sample =
            SampleOp::new(self.gpu, self.kernels, step, &act.logits, rows, &act.token_ids, vocab);
        ops.push(Op::Sample(sample));
        // target log-probabilities on the GPU (perplexity, prompt logprobs), after the argmaxes
        let targets = &self.step.logit_targets;
        let logprob = LogprobOp::new(
            self.gpu,
            self.kernels,
            step,
            &act.logits,
            targets,
            &act.token_ids,
            vocab,
        );
        ops.push(Op::Logprob(logprob));
        Ok(bytes)
    }

    /// RMSNorm of hidden-sized rows with the file's weight `name` (plus
    /// `ModelConfig::norm_weight_offset`, HF Gemma's 1 + w): `out (+)= norm(x) · w` over `rows`
    /// (the step's, or the gathered logit rows). Per-head norms: [`Builder::norm_dim`].
    pub fn norm(
        &self,
        name: &str,
        x: &wgpu::Buffer,
        out: &wgpu::Buffer,
        rows: NormRows<'_>,
        accumulate: bool,
    ) -> Result<Op, ModelError> {
        debug_assert!(!matches!(rows, NormRows::Heads(_)), "{name}: per-head rows need norm_dim");
        self.norm_dim(name, self.c.hidden_size, x, out, rows, accumulate)
    }

    /// [`Builder::norm`] over rows of `dim` elements, whatever the model's head_dim (MLA's
    /// `q_a_layernorm` and `kv_a_layernorm` over `[heads: 1]` rows of their rank).
    pub fn norm_dim(
        &self,
        name: &str,
        dim: usize,
        x: &wgpu::Buffer,
        out: &wgpu::Buffer,
        rows: NormRows<'_>,
        accumulate: bool,
    ) -> Result<Op, ModelError> {
        let weight = self.norm_weight(name, dim)?;
        let io = NormIo { step: &self.step.step, x, weight: &weight, out, rows, accumulate };
        let eps = self.c.rms_norm_eps;
        Ok(Op::RmsNorm(RmsNormOp::new(self.gpu, self.kernels, name, dim as u32, eps, io)))
    }

    /// A norm's weight `name` of `dim` floats on the GPU, plus
    /// `ModelConfig::norm_weight_offset`.
    fn norm_weight(&self, name: &str, dim: usize) -> Result<wgpu::Buffer, ModelError> {
        let mut w = weights::vector(self.file, name, dim)?;
        w.iter_mut().for_each(|x| *x += self.c.norm_weight_offset);
        Ok(self.gpu.storage_buffer_init(name, bytemuck::cast_slice(&w)))
    }

    /// `normed = rms_norm(hidden) · blk.l.which` (the input of a sub-layer) as its own op.
    pub fn input_norm(&self, l: usize, which: &str) -> Result<Op, ModelError> {
        let name = format!("blk.{l}.{which}.weight");
        self.norm(&name, &self.act.hidden, &self.act.normed, NormRows::Step, false)
    }

    /// The input of a sub-layer whose projections are [`Builder::fused_ops`] or
    /// [`Builder::gated_mlp_in`]: `rms_norm(hidden) · blk.l.which`, normed on load by those
    /// projections where `KernelConfig::norm_on_load` says so, else by an
    /// [`Builder::input_norm`] op appended here.
    pub fn sublayer_input(
        &self,
        l: usize,
        which: &str,
        ops: &mut Vec<Op>,
    ) -> Result<SublayerInput, ModelError> {
        if !self.kernels.config.norm_on_load() {
            ops.push(self.input_norm(l, which)?);
            return Ok(SublayerInput::normed());
        }
        let weight = self.norm_weight(&format!("blk.{l}.{which}.weight"), self.c.hidden_size)?;
        Ok(SublayerInput { on_load: Some((weight, self.c.rms_norm_eps)) })
    }

    /// Per-head RMSNorms of Q and K (`blk.l.attn_q_norm`, `attn_k_norm`, [head_dim]) from `qk`
    /// (`[tokens, (heads + kv_heads) · head_dim]`, Q heads then K heads) into their places in
    /// `qkv` (Q then K heads too): one dispatch, the K heads on the weight's second row.
    pub fn qk_norms(&self, l: usize) -> Result<Op, ModelError> {
        let layout = self.layout(l);
        self.qk_norms_from(l, (layout.num_heads + layout.num_kv_heads) * layout.head_dim)
    }

    /// [`Builder::qk_norms`] from `qk` rows of `x_stride` floats (Gemma 4 stacks its V heads
    /// after the K heads there, for their own norm).
    pub fn qk_norms_from(&self, l: usize, x_stride: u32) -> Result<Op, ModelError> {
        let layout = self.layout(l);
        let (hd, act) = (layout.head_dim as usize, self.act);
        let mut w = Vec::with_capacity(2 * hd);
        for which in ["attn_q_norm", "attn_k_norm"] {
            w.extend(weights::vector(self.file, &format!("blk.{l}.{which}.weight"), hd)?);
        }
        w.iter_mut().for_each(|x| *x += self.c.norm_weight_offset);
        let name = format!("blk.{l}.attn_qk_norms");
        let weight = self.gpu.storage_buffer_init(&name, bytemuck::cast_slice(&w));
        let heads = layout.num_heads + layout.num_kv_heads;
        let rows = HeadRows {
            heads,
            x_stride,
            x_offset: 0,
            out_stride: layout.stride(),
            out_offset: 0,
            split: layout.num_heads,
        };
        let io = NormIo {
            step: &self.step.step,
            x: &act.qk,
            weight: &weight,
            out: &act.qkv,
            rows: NormRows::Heads(rows),
            accumulate: false,
        };
        let (eps, dim) = (self.c.rms_norm_eps, layout.head_dim);
        Ok(Op::RmsNorm(RmsNormOp::new(self.gpu, self.kernels, &name, dim, eps, io)))
    }

    /// Layer `l`'s RoPE table (its own base and scaling) and pair style.
    fn rope_table(&self, l: usize) -> (&wgpu::Buffer, RopePairs) {
        let c = self.c;
        let pairs = match c.rope_style {
            RopeStyle::Interleaved => RopePairs::Interleaved,
            RopeStyle::Neox => RopePairs::Neox,
        };
        let key = (c.layers[l].rope, c.layer_rope_dim(l));
        let rope = c.distinct_ropes().iter().position(|r| *r == key);
        let table =
            &self.act.rope_tables[rope.expect("every layer's RoPE is among the distinct ones")];
        (table, pairs)
    }

    /// RoPE on the Q and K heads of `qkv` with layer `l`'s table (its own base and scaling).
    pub fn rope(&self, l: usize) -> Op {
        let (c, s) = (self.c, self.step);
        let (table, pairs) = self.rope_table(l);
        let (gpu, k, qkv) = (self.gpu, self.kernels, &self.act.qkv);
        let heads = match (c.mla, c.rotary_dims) {
            (Some(m), _) => RopeHeads::tail(self.layout(l), m.qk_rope_head_dim as u32),
            (None, Some(d)) => RopeHeads::head(self.layout(l), d as u32),
            (None, None) => self.layout(l).into(),
        };
        Op::Rope(RopeOp::new(gpu, k, &s.step, qkv, &s.positions, table, heads, pairs))
    }

    /// The attention block of a layer with whole Q/K/V heads in `qkv`: RoPE, [`--kv-rotate`],
    /// this step's K and V into the pool, attention, [the inverse rotation]. RoPE and the KV
    /// write are one dispatch (`rope_kv_write`) when nothing runs between them — an f16 pool
    /// and no rotation — and the heads fit its 4-channel units; otherwise each op runs alone.
    pub fn rope_attention(&self, l: usize, ops: &mut Vec<Op>) {
        self.rope_attention_sinks(l, None, ops);
    }

    /// [`Self::rope_attention`] with each query head's attention sink logit (gpt-oss).
    pub fn rope_attention_sinks(&self, l: usize, sinks: Option<&[f32]>, ops: &mut Vec<Op>) {
        let layout = self.layout(l);
        // the fused kernel rotates whole heads: partial RoPE runs rope, then the KV write
        let fused = self.kv.quant.is_none()
            && !self.o.kv_cache.rotate
            && self.c.rotary_dims.is_none()
            && rope_kv_write::fits(layout);
        if !fused {
            ops.push(self.rope(l));
            self.kv_rotate(l, true, ops);
            self.attention_sinks(l, sinks, ops);
            self.kv_rotate(l, false, ops);
            return;
        }
        let kv = self.layer_kv(l);
        let (table, pairs) = self.rope_table(l);
        let io = RopeKvIo {
            step: &self.step.step,
            qkv: &self.act.qkv,
            positions: &self.step.positions,
            table,
            slot_mapping: &self.step.slot_mapping[kv.group],
            k_pool: kv.k,
            v_pool: kv.v,
        };
        let bs = self.o.block_size as u32;
        let op = RopeKvWriteOp::new(self.gpu, self.kernels, layout, pairs, bs, io);
        ops.push(Op::RopeKvWrite(op));
        self.attend(l, sinks, ops);
    }

    /// Where layer `l`'s K and V live: the layer's KV-cache group (`ModelOptions::kv_groups`,
    /// checked against the config's `AttentionKind`s by `Model::load`) picks the pool buffers
    /// of its slot and the group's block table and slot mapping.
    fn layer_kv(&self, l: usize) -> LayerKv<'_> {
        let (group, slot) = self.o.kv_groups.layer_slot(l);
        let stage =
            |q| KvQuantIo { layout: q, stage: &self.kv.stage[self.o.kv_groups.kv_index(l)] };
        let quant = self.kv.quant(self.c.layer_heads(l).1).map(stage);
        LayerKv { group, k: &self.kv.k[slot], v: &self.kv.v[slot], quant }
    }

    /// Writes this step's K and V into layer `l`'s pool and attends: `kv_write` + attention
    /// for f16, `kv_quantize` + attention + `kv_stage` for a quantized pool.
    ///
    /// The layer's KV-cache group ([`Self::layer_kv`]) decides where its K and V live — the
    /// pool buffer of its slot, at the blocks of its group's table — and its sliding window.
    pub fn attention(&self, l: usize, ops: &mut Vec<Op>) {
        self.attention_sinks(l, None, ops);
    }

    /// [`Self::attention`] with each query head's attention sink logit (gpt-oss).
    fn attention_sinks(&self, l: usize, sinks: Option<&[f32]>, ops: &mut Vec<Op>) {
        let (gpu, k, act, s) = (self.gpu, self.kernels, self.act, self.step);
        let layout = self.layout(l);
        let LayerKv { group, k: kp, v: vp, quant } = self.layer_kv(l);
        let bs = self.o.block_size as u32;
        match quant {
            None => ops.push(Op::KvWrite(KvWriteOp::new(
                gpu,
                k,
                &s.step,
                &act.qkv,
                &s.slot_mapping[group],
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
                    completed: &s.completed_blocks[group],
                    k_pool: kp,
                    v_pool: vp,
                },
            ))),
        }
        self.attend(l, sinks, ops);
    }

    /// Attention over layer `l`'s pool once this step's K and V are in it, and for a quantized
    /// pool the `kv_stage` of the rows of partial blocks after it.
    fn attend(&self, l: usize, sinks: Option<&[f32]>, ops: &mut Vec<Op>) {
        let (gpu, k, act, s) = (self.gpu, self.kernels, self.act, self.step);
        let layout = self.layout(l);
        let LayerKv { group, k: kp, v: vp, quant: kv_quant } = self.layer_kv(l);
        let bs = self.o.block_size as u32;
        let io = AttentionIo {
            step: &s.step,
            qkv: &act.qkv,
            k_pool: kp,
            v_pool: vp,
            seqs: &s.seqs,
            block_tables: &s.block_tables[group],
            prefill_tiles: &s.tiles,
            partials: &act.partials,
            out: &act.attn,
            kv_quant,
            sinks,
        };
        let parts = partitions(self.o.max_model_len as u32);
        let window = NonZeroU32::new(self.o.kv_groups.kind(group).window() as u32);
        let args = (bs, parts, window, self.c.attention_scale);
        let dims = self.c.head_shapes().iter().map(|&(_, hd)| hd as u32).collect::<Vec<_>>();
        ops.push(Op::Attention(AttentionOp::for_heads_of(gpu, k, layout, &dims, args, io)));
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

    /// `--kv-rotate`: the Hadamard rotation of Q, K and V before attention (`before: true`) or
    /// the inverse rotation of the attention output after it. Nothing without `--kv-rotate`.
    pub fn kv_rotate(&self, l: usize, before: bool, ops: &mut Vec<Op>) {
        if !self.o.kv_cache.rotate {
            return;
        }
        let layout = self.layout(l);
        let (x, heads, row_stride) = if before {
            (&self.act.qkv, layout.stride() / layout.head_dim, layout.stride())
        } else {
            (&self.act.attn, layout.num_heads, layout.num_heads * layout.head_dim)
        };
        let rows = RotateRows { heads, head_dim: layout.head_dim, row_stride, offset: 0 };
        let op = RotateOp::new(self.gpu, self.kernels, "rotate", &self.step.step, x, rows);
        ops.push(Op::Rotate(op));
    }

    /// The gated MLP's first half for layer `l`: `ffn = act(normed · Wgateᵀ) · (normed · Wupᵀ)`.
    /// Gate and up of one format: one linear over their interleaved rows with the GLU epilogue;
    /// otherwise their stacked parts into `gate_up` and a GLU op. Returns the weights' bytes.
    pub fn gated_mlp_in(
        &self,
        l: usize,
        activation: Activation,
        input: &SublayerInput,
        ops: &mut Vec<Op>,
    ) -> Result<u64, ModelError> {
        let dense = ("", self.c.intermediate_size);
        self.gated_mlp_in_of(l, dense, activation, input, ops)
    }

    /// [`Builder::gated_mlp_in`] of the MLP whose tensors are `blk.l.ffn_gate{suffix}` (and
    /// `ffn_up{suffix}`), `ffn` channels wide: `("", intermediate_size)` for the dense MLP,
    /// `("_shexp", …)` for DeepSeek's shared experts.
    pub(super) fn gated_mlp_in_of(
        &self,
        l: usize,
        (suffix, ffn): (&str, usize),
        activation: Activation,
        input: &SublayerInput,
        ops: &mut Vec<Op>,
    ) -> Result<u64, ModelError> {
        let (s, act) = (self.step, self.act);
        let label = format!("blk.{l}.ffn_gate_up{suffix}");
        let names =
            [format!("blk.{l}.ffn_gate{suffix}.weight"), format!("blk.{l}.ffn_up{suffix}.weight")];
        let names = [names[0].as_str(), names[1].as_str()];
        let shape = [ffn, self.c.hidden_size];
        let w = weights::gate_up(self.gpu, self.file, &label, names, shape, self.max_binding)?;
        match &w {
            GateUp::Interleaved(weight) => {
                let (x, norm) = input.x(act);
                let io = LinearIo {
                    out_stride: ffn as u32,
                    glu: Some(activation),
                    norm,
                    ..self.dense_io(weight, x, &act.ffn, false, TokenRows::Step)
                };
                ops.push(Op::Linear(LinearOp::new(self.gpu, self.kernels, &label, weight, io)));
            }
            GateUp::Stacked(parts) => {
                self.fused_ops(&label, parts, input, (&act.gate_up, 2 * ffn as u32, 0), ops);
                let k = self.kernels;
                let (gu, out) = (&act.gate_up, &act.ffn);
                let op = GluOp::new(self.gpu, k, activation, &s.step, gu, out, ffn as u32);
                ops.push(Op::Glu(op));
            }
        }
        Ok(w.weights().into_iter().map(weights::gpu_bytes).sum())
    }

    /// One linear op per part of a fused projection from the sub-layer's `input` into `out` =
    /// (buffer, row stride, column offset): a part's rows land at column
    /// `out_offset + part.out_offset` of rows of `out_stride`.
    pub fn fused_ops(
        &self,
        label: &str,
        parts: &[FusedPart],
        input: &SublayerInput,
        (out, out_stride, out_offset): (&wgpu::Buffer, u32, u32),
        ops: &mut Vec<Op>,
    ) {
        let (x, norm) = input.x(self.act);
        for p in parts {
            let op = LinearOp::new(
                self.gpu,
                self.kernels,
                label,
                &p.weight,
                LinearIo {
                    step: &self.step.step,
                    x,
                    x_stride: self.c.hidden_size as u32,
                    x_offset: 0,
                    out,
                    out_stride,
                    out_offset: out_offset + p.out_offset,
                    bias: p.bias.as_ref(),
                    accumulate: false,
                    rows: TokenRows::Step,
                    glu: None,
                    norm,
                },
            );
            ops.push(Op::Linear(op));
        }
    }

    /// `out (+)= x · wᵀ` over dense rows (`x`: [rows, w.cols], `out`: [rows, w.rows]).
    pub fn linear(
        &self,
        label: &str,
        w: &GpuWeight,
        x: &wgpu::Buffer,
        out: &wgpu::Buffer,
        accumulate: bool,
        rows: TokenRows,
    ) -> LinearOp {
        let io = self.dense_io(w, x, out, accumulate, rows);
        LinearOp::new(self.gpu, self.kernels, label, w, io)
    }

    /// Where [`Self::linear`] reads and writes.
    pub(super) fn dense_io<'a>(
        &'a self,
        w: &GpuWeight,
        x: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        accumulate: bool,
        rows: TokenRows,
    ) -> LinearIo<'a> {
        LinearIo {
            step: &self.step.step,
            x,
            x_stride: w.cols as u32,
            x_offset: 0,
            out,
            out_stride: w.rows as u32,
            out_offset: 0,
            bias: None,
            accumulate,
            rows,
            glu: None,
            norm: None,
        }
    }
}
