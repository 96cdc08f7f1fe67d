//! Buffers allocated once at load: per-step inputs, activations, and the paged KV pool.

use super::{ForwardBatch, ModelError, ModelOptions};
use crate::gpu::Gpu;
use crate::kernels::attention::{partials_bytes, partitions};
use crate::kernels::kv_quantize::stage_words;
use crate::kernels::moe::TilePlan;
use crate::kernels::rope::rope_table_with_freq_factors;
use crate::kernels::{KvQuantLayout, SeqInfo, StepInfo};
use crate::loader::{AttentionKind, ModelConfig};
use crate::quant::{head_block_words, pool_heads};

/// The small inputs rewritten every step.
pub(super) struct StepBuffers {
    /// StepInfo (uniform)
    pub step: wgpu::Buffer,
    /// [max_tokens] u32
    pub token_ids: wgpu::Buffer,
    /// [max_tokens] u32
    pub positions: wgpu::Buffer,
    /// [groups][max_tokens] u32: one slot mapping per KV-cache group
    pub slot_mapping: Vec<wgpu::Buffer>,
    /// [max_seqs] SeqInfo
    pub seqs: wgpu::Buffer,
    /// [groups][block_table_capacity] u32: the concatenated tables of each group
    pub block_tables: Vec<wgpu::Buffer>,
    /// [tile_capacity] (seq index, first query) u32 pairs
    pub tiles: wgpu::Buffer,
    /// [max_logit_rows] u32
    pub logit_rows: wgpu::Buffer,
    /// [max_logit_rows] u32 each logit row's target token (`LogitReadback::TargetLogprobs`)
    pub logit_targets: wgpu::Buffer,
    /// [max_logit_rows] `RowSampling`: how each logit row is sampled on the GPU
    pub logit_sampling: wgpu::Buffer,
    /// [edit_capacity] `LogitEdit`: the samplers' logit shaping on the GPU
    pub logit_edits: wgpu::Buffer,
    /// Quantized KV: [max_tokens] (token row, stage slot · block_size + offset) u32 pairs
    pub stage_rows: wgpu::Buffer,
    /// Quantized KV: [groups][completed_capacity] (block, stage slot, first row, staged) u32 ×4
    pub completed_blocks: Vec<wgpu::Buffer>,
    pub block_table_capacity: usize,
    pub tile_capacity: usize,
    pub completed_capacity: usize,
    /// `EDITS_PER_SEQ` for each sequence a step may hold.
    pub edit_capacity: usize,
}

impl StepBuffers {
    /// Bytes of every buffer (what a pool sized from a budget leaves room for).
    pub fn bytes(&self) -> u64 {
        let one = [
            &self.step,
            &self.token_ids,
            &self.positions,
            &self.seqs,
            &self.tiles,
            &self.logit_rows,
            &self.logit_targets,
            &self.logit_sampling,
            &self.logit_edits,
            &self.stage_rows,
        ];
        let many = self.slot_mapping.iter().chain(&self.block_tables).chain(&self.completed_blocks);
        one.into_iter().chain(many).map(wgpu::Buffer::size).sum()
    }

    pub fn new(gpu: &Gpu, o: &ModelOptions) -> Self {
        let u32s = |label: &str, n: usize| gpu.storage_buffer(label, (n.max(1) * 4) as u64);
        let block_table_capacity = o.max_num_seqs * o.max_model_len.div_ceil(o.block_size);
        // every sequence can leave one partial tile, the rest are full tiles of ≥ 8 queries
        let tile_capacity = o.max_num_seqs + o.max_num_batched_tokens.div_ceil(8);
        // a chunk of n tokens completes at most n / block_size + 1 blocks
        let completed_capacity = o.max_num_seqs + o.max_num_batched_tokens / o.block_size;
        // a step samples at most one row a sequence, each within EDITS_PER_SEQ edits
        let edit_capacity = o.max_num_seqs * crate::kernels::logit_edit::EDITS_PER_SEQ;
        StepBuffers {
            step: gpu.uniform_buffer_init("step info", bytemuck::bytes_of(&StepInfo::default())),
            token_ids: u32s("token ids", o.max_num_batched_tokens),
            positions: u32s("positions", o.max_num_batched_tokens),
            slot_mapping: (0..o.kv_groups.len())
                .map(|g| u32s(&format!("slot mapping group {g}"), o.max_num_batched_tokens))
                .collect(),
            seqs: gpu.storage_buffer(
                "seq infos",
                (o.max_num_seqs * std::mem::size_of::<SeqInfo>()) as u64,
            ),
            block_tables: (0..o.kv_groups.len())
                .map(|g| u32s(&format!("block tables group {g}"), block_table_capacity))
                .collect(),
            tiles: u32s("prefill tiles", 2 * tile_capacity),
            logit_rows: u32s("logit rows", o.max_logit_rows),
            logit_targets: u32s("logit targets", o.max_logit_rows),
            logit_sampling: u32s("logit sampling", 8 * o.max_logit_rows),
            logit_edits: u32s("logit edits", 8 * edit_capacity),
            stage_rows: u32s("stage rows", 2 * o.max_num_batched_tokens),
            completed_blocks: (0..o.kv_groups.len())
                .map(|g| u32s(&format!("completed blocks group {g}"), 4 * completed_capacity))
                .collect(),
            block_table_capacity,
            tile_capacity,
            completed_capacity,
            edit_capacity,
        }
    }

    /// Writes the batch's inputs (sizes already checked against the capacities).
    pub fn upload(&self, gpu: &Gpu, b: &ForwardBatch) {
        let q = &gpu.queue;
        q.write_buffer(&self.step, 0, bytemuck::bytes_of(&b.step_info()));
        let write = |buf: &wgpu::Buffer, data: &[u32]| {
            if !data.is_empty() {
                q.write_buffer(buf, 0, bytemuck::cast_slice(data));
            }
        };
        write(&self.token_ids, &b.token_ids);
        write(&self.positions, &b.positions);
        for (buf, data) in self.slot_mapping.iter().zip(&b.slot_mapping) {
            write(buf, data);
        }
        for (buf, data) in self.block_tables.iter().zip(&b.block_tables) {
            write(buf, data);
        }
        write(&self.tiles, bytemuck::cast_slice(&b.prefill_tiles));
        write(&self.logit_rows, &b.logit_rows);
        if b.readback == super::LogitReadback::TargetLogprobs {
            write(&self.logit_targets, &b.logit_targets);
        }
        write(&self.logit_sampling, bytemuck::cast_slice(&b.logit_sampling));
        write(&self.logit_edits, bytemuck::cast_slice(&b.logit_edits));
        write(&self.stage_rows, bytemuck::cast_slice(&b.stage_rows));
        for (buf, data) in self.completed_blocks.iter().zip(&b.completed_blocks) {
            write(buf, bytemuck::cast_slice(data));
        }
        if !b.seqs.is_empty() {
            q.write_buffer(&self.seqs, 0, bytemuck::cast_slice(&b.seqs));
        }
    }
}

/// Activations, sized for the largest step.
pub(super) struct Activations {
    /// [max_tokens, hidden] residual stream
    pub hidden: wgpu::Buffer,
    /// [max_tokens, hidden] normed input of a sub-layer
    pub normed: wgpu::Buffer,
    /// [max_tokens, (heads + 2 kv_heads) · head_dim] fused Q, K, V
    pub qkv: wgpu::Buffer,
    /// Q/K norms (Gemma 3): [max_tokens, (heads + kv_heads) · head_dim] Q and K before their
    /// per-head norms, which write them into `qkv` (1 float otherwise)
    pub qk: wgpu::Buffer,
    /// Post-norms (Gemma 3): [max_tokens, hidden] a sub-layer's output before its post-norm
    /// and residual add (1 float otherwise)
    pub sublayer: wgpu::Buffer,
    /// [max_tokens, heads · head_dim]
    pub attn: wgpu::Buffer,
    /// MLA's intermediate rows (`None` for other models).
    pub mla: Option<MlaActivations>,
    /// Gated attention (Qwen3.5): [max_tokens, heads · head_dim] the output gates (1 float
    /// otherwise)
    pub attn_gate: wgpu::Buffer,
    /// Gated DeltaNet layers' rows (`None` without recurrent layers).
    pub delta: Option<DeltaActivations>,
    /// Mixture-of-experts rows (`None` without experts).
    pub moe: Option<MoeActivations>,
    /// [max_tokens, 2 · ffn] fused gate and up projections (`ModelConfig::dense_ffn_width`)
    pub gate_up: wgpu::Buffer,
    /// [max_tokens, ffn]
    pub ffn: wgpu::Buffer,
    /// [max_logit_rows, hidden] final-normed rows that get logits
    pub logits_in: wgpu::Buffer,
    /// [max_logit_rows, vocab]
    pub logits: wgpu::Buffer,
    /// MAP_READ copy of `logits`
    pub logits_staging: wgpu::Buffer,
    /// [2, max_logit_rows] u32: each logit row's argmax (greedy sampling on the GPU), then its
    /// target log-probability (`kernels::logprob`) as f32 bits, from word num_logits on
    pub token_ids: wgpu::Buffer,
    /// MAP_READ copy of `token_ids`
    pub token_ids_staging: wgpu::Buffer,
    /// [max_seqs, heads, max_partitions, head_dim + 2] decode split-K partials
    pub partials: wgpu::Buffer,
    /// One per distinct layer RoPE (`ModelConfig::distinct_ropes` order):
    /// [max_model_len, head_dim / 2] (cos, sin)
    pub rope_tables: Vec<wgpu::Buffer>,
}

/// MLA's rows besides `qkv` (which holds the absorbed queries and the latent key, `[heads +
/// 1, kv_lora_rank + qk_rope_head_dim]`) and `attn` (the attention's latent outputs).
pub(super) struct MlaActivations {
    /// [max_tokens, q_lora_rank] `q_a_proj` output, then (`q_a_normed`) its RMSNorm
    pub q_a: wgpu::Buffer,
    pub q_a_normed: wgpu::Buffer,
    /// [max_tokens, heads · (qk_nope + qk_rope)] the per-head queries before absorption
    pub q: wgpu::Buffer,
    /// [max_tokens, kv_lora_rank] `c_kv` before its RMSNorm
    pub c_kv: wgpu::Buffer,
    /// [max_tokens, heads · v_head_dim] per-head values (`W_UV_h` of the latent outputs)
    pub v: wgpu::Buffer,
}

/// A mixture-of-experts MLP's rows (`kernels::moe`).
pub(super) struct MoeActivations {
    /// [max_tokens, experts (+ 1)] the router's logits (and, with a gated shared expert, its
    /// gate's logit: `ModelConfig::moe_logits_width`)
    pub logits: wgpu::Buffer,
    /// [max_tokens, experts used] each token's experts (u32) and their weights (f32)
    pub ids: wgpu::Buffer,
    pub weights: wgpu::Buffer,
    /// [max_tokens · experts used, expert ffn] each (token, expert) pair's act(gate) · up
    pub h: wgpu::Buffer,
    /// Prefill grouped by expert: the step's tiles (`kernels::moe::TilePlan`, u32) and
    /// [max_tokens · experts used, hidden] each pair's down row before the rank-order sum
    pub plan: wgpu::Buffer,
    pub down_rows: wgpu::Buffer,
}

/// A Gated DeltaNet layer's rows (`kernels::delta_net`).
pub(super) struct DeltaActivations {
    /// [max_tokens, delta_proj_width] the input projections, stacked: q|k|v (the conv's
    /// input), z (the gates), b, a
    pub proj: wgpu::Buffer,
    /// [max_tokens, conv channels] the conv's output (the scan's q, k, v)
    pub conv: wgpu::Buffer,
    /// [max_tokens, value heads · value_head_dim] the scan's outputs, gated-normed in place
    pub o: wgpu::Buffer,
}

/// Columns of [`DeltaActivations::proj`]: conv channels, then z, then b and a (one a value
/// head each).
pub(super) fn delta_proj_width(d: &crate::loader::DeltaNet) -> usize {
    d.conv_channels() + d.value_dim() + 2 * d.value_heads
}

impl Activations {
    /// Bytes of every buffer, staging copies included (what a pool sized from a budget leaves
    /// room for). Lists every field: a new buffer belongs here too.
    pub fn bytes(&self) -> u64 {
        let mut all = vec![
            &self.hidden,
            &self.normed,
            &self.qkv,
            &self.qk,
            &self.sublayer,
            &self.attn,
            &self.attn_gate,
            &self.gate_up,
            &self.ffn,
            &self.logits_in,
            &self.logits,
            &self.logits_staging,
            &self.token_ids,
            &self.token_ids_staging,
            &self.partials,
        ];
        all.extend(&self.rope_tables);
        if let Some(m) = &self.mla {
            all.extend([&m.q_a, &m.q_a_normed, &m.q, &m.c_kv, &m.v]);
        }
        if let Some(d) = &self.delta {
            all.extend([&d.proj, &d.conv, &d.o]);
        }
        if let Some(m) = &self.moe {
            all.extend([&m.logits, &m.ids, &m.weights, &m.h, &m.plan, &m.down_rows]);
        }
        all.into_iter().map(wgpu::Buffer::size).sum()
    }

    pub fn new(gpu: &Gpu, c: &ModelConfig, o: &ModelOptions) -> Self {
        let f32s = |label: &str, rows: usize, cols: usize| {
            gpu.storage_buffer(label, (rows.max(1) * cols * 4) as u64)
        };
        let t = o.max_num_batched_tokens;
        // the widest layer's rows (Gemma 4: its global layers' wider heads)
        let widest = |f: &dyn Fn(usize, usize) -> usize| {
            (0..c.num_layers).map(|l| c.layer_heads(l)).map(|(kvh, hd)| f(kvh, hd)).max()
        };
        let v_heads = |kvh| if c.values_in_keys() { 0 } else { kvh };
        let qkv = widest(&|kvh, hd| (c.num_heads + kvh + v_heads(kvh)) * hd).unwrap_or(0);
        // Q and K before their norms, and (Gemma 4) V before its own
        let v_norm_heads = |kvh| if c.global_layers.is_some() { kvh } else { 0 };
        let qk = widest(&|kvh, hd| (c.num_heads + kvh + v_norm_heads(kvh)) * hd).unwrap_or(0);
        let attn_width = c.num_heads * c.max_head_dim();
        let logits_bytes = (o.max_logit_rows.max(1) * c.vocab_size * 4) as u64;
        // the dense layers' and shared experts' MLP (a mixture's routed rows are `moe`)
        let dense_ffn = c.dense_ffn_width().max(1);
        Activations {
            hidden: f32s("hidden", t, c.hidden_size),
            normed: f32s("normed", t, c.hidden_size),
            qkv: f32s("qkv", t, qkv),
            qk: match c.qk_norm {
                true => f32s("qk before norms", t, qk),
                false => f32s("no qk norms", 1, 1),
            },
            sublayer: match c.post_norms {
                true => f32s("sub-layer out", t, c.hidden_size),
                false => f32s("no post norms", 1, 1),
            },
            attn: f32s("attention out", t, attn_width),
            mla: c.mla.map(|m| MlaActivations {
                q_a: f32s("mla q_a", t, m.q_lora_rank.unwrap_or(1)),
                q_a_normed: f32s("mla q_a normed", t, m.q_lora_rank.unwrap_or(1)),
                q: f32s("mla q", t, c.num_heads * m.q_head_dim()),
                c_kv: f32s("mla c_kv", t, m.kv_lora_rank),
                v: f32s("mla v", t, c.num_heads * m.v_head_dim),
            }),
            attn_gate: match c.attn_output_gate {
                true => f32s("attention gates", t, attn_width),
                false => f32s("no attention gates", 1, 1),
            },
            delta: c.delta_net.map(|d| DeltaActivations {
                proj: f32s("delta_net projections", t, delta_proj_width(&d)),
                conv: f32s("delta_net conv out", t, d.conv_channels()),
                o: f32s("delta_net out", t, d.value_dim()),
            }),
            moe: c.moe.map(|m| MoeActivations {
                logits: f32s("moe router logits", t, m.experts + usize::from(m.shared_gate)),
                ids: f32s("moe expert ids", t, m.experts_used),
                weights: f32s("moe expert weights", t, m.experts_used),
                h: f32s("moe expert rows", t * m.experts_used, m.expert_ffn),
                plan: gpu.storage_buffer(
                    "moe tile plan",
                    TilePlan::new(t, m.experts_used, m.experts).words * 4,
                ),
                down_rows: f32s("moe down rows", t * m.experts_used, c.hidden_size),
            }),
            gate_up: f32s("gate_up", t, 2 * dense_ffn),
            ffn: f32s("ffn", t, dense_ffn),
            logits_in: f32s("logits in", o.max_logit_rows, c.hidden_size),
            logits: gpu.storage_buffer("logits", logits_bytes),
            logits_staging: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("logits staging"),
                size: logits_bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            token_ids: gpu.storage_buffer("argmax token ids", (o.max_logit_rows.max(1) * 8) as u64),
            token_ids_staging: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("argmax token ids staging"),
                size: (o.max_logit_rows.max(1) * 8) as u64,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            partials: gpu.storage_buffer(
                "decode partials",
                partials_bytes(
                    o.max_num_seqs as u32,
                    c.num_heads as u32,
                    partitions(o.max_model_len as u32),
                    c.max_head_dim() as u32,
                ),
            ),
            rope_tables: c
                .distinct_ropes()
                .iter()
                .map(|(r, dim)| {
                    let factors = c.rope_freq_factors.as_deref();
                    let table = rope_table_with_freq_factors(*dim, r, factors, o.max_model_len);
                    gpu.storage_buffer_init("rope table", bytemuck::cast_slice(&table))
                })
                .collect(),
        }
    }
}

/// The recurrent layers' states (Gated DeltaNet), `max_num_seqs + state_snapshots` slots each:
/// a running sequence's slot is its running slot (`SeqInfo::state_slot`, the engine's staging
/// slot); a step at position 0 starts from zero states whatever the slot holds
/// (`kernels::delta_net`). The slots after them hold prefix-cache snapshots
/// (`Model::snapshot_slot`): the scan and conv-state kernels write one where a step asks
/// (`SeqInfo::snapshot_slot`), and a hit copies it into the sequence's slot before its first
/// step ([`StatePool::record_restores`]).
pub struct StatePool {
    /// Per recurrent layer, in layer order: `[slots, taps − 1, conv channels]` f32.
    pub conv: Vec<wgpu::Buffer>,
    /// Per recurrent layer: `[slots, value heads, key_head_dim, value_head_dim]` f32.
    pub recurrent: Vec<wgpu::Buffer>,
    /// Bytes of all of them.
    pub bytes: u64,
    /// Bytes of one slot's conv state and recurrent state, in each layer.
    slot_bytes: (u64, u64),
    /// One slot of the larger kind: restores go through it (a copy within one buffer is not
    /// allowed). `None` without recurrent layers.
    scratch: Option<wgpu::Buffer>,
}

impl StatePool {
    pub(super) fn new(gpu: &Gpu, c: &ModelConfig, o: &ModelOptions) -> Self {
        let (mut conv, mut recurrent, mut bytes) = (Vec::new(), Vec::new(), 0);
        let Some(d) = c.delta_net else {
            return StatePool { conv, recurrent, bytes, slot_bytes: (0, 0), scratch: None };
        };
        let slots = (o.max_num_seqs + o.state_snapshots) as u64;
        let conv_slot = 4 * ((d.conv_taps - 1) * d.conv_channels()) as u64;
        let rec_slot = 4 * (d.value_heads * d.key_head_dim * d.value_head_dim) as u64;
        // sizes checked against the binding limit by limits::check_buffer_sizes
        let layers = c.layers.iter().enumerate();
        for (l, _) in layers.filter(|(_, s)| s.attention == AttentionKind::Recurrent) {
            conv.push(gpu.storage_buffer(&format!("conv state layer {l}"), slots * conv_slot));
            recurrent
                .push(gpu.storage_buffer(&format!("recurrent state layer {l}"), slots * rec_slot));
            bytes += slots * (conv_slot + rec_slot);
        }
        let scratch = Some(gpu.storage_buffer("state restore scratch", conv_slot.max(rec_slot)));
        StatePool { conv, recurrent, bytes, slot_bytes: (conv_slot, rec_slot), scratch }
    }

    /// Records the copies of `restores` (`[from slot, to slot]`) in every recurrent layer.
    pub(super) fn record_restores(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        restores: &[[u32; 2]],
    ) {
        let (conv_slot, rec_slot) = self.slot_bytes;
        for &[from, to] in restores {
            let (from, to) = (u64::from(from), u64::from(to));
            let scratch = self.scratch.as_ref().expect("restores need recurrent layers");
            let conv = self.conv.iter().map(|b| (b, conv_slot));
            for (buf, slot) in conv.chain(self.recurrent.iter().map(|b| (b, rec_slot))) {
                encoder.copy_buffer_to_buffer(buf, from * slot, scratch, 0, slot);
                encoder.copy_buffer_to_buffer(scratch, 0, buf, to * slot, slot);
            }
        }
    }

    /// Index of recurrent layer `l`'s buffers.
    pub fn index(c: &ModelConfig, l: usize) -> usize {
        c.layers[..l].iter().filter(|s| s.attention == AttentionKind::Recurrent).count()
    }
}

/// The paged KV pool on the GPU: per layer one K and one V buffer of
/// `[num_blocks, kv_heads]` head blocks (`quant::head_block_words`: codes, then scales; for f16
/// `[block_size, head_dim / 2]` u32 of two f16), and with quantized KV one f16 staging buffer
/// per layer (`[2 (K, V), max_num_seqs, kv_heads, block_size, head_dim / 2]` u32) for the
/// running sequences' partial last blocks. Block ids address the same slot range in every layer.
pub struct KvPool {
    pub k: Vec<wgpu::Buffer>,
    /// The K buffers themselves when the values live in the keys (MLA's latent).
    pub v: Vec<wgpu::Buffer>,
    /// Quantized KV: staging per model layer (not per slot); empty for f16.
    pub stage: Vec<wgpu::Buffer>,
    pub num_blocks: usize,
    pub block_size: usize,
    /// Bytes one block takes in one slot's K buffer, and in its V buffer (0 where the values
    /// live in the keys).
    pub k_block_bytes: u64,
    pub v_block_bytes: u64,
    /// Bytes of all K and V buffers together: `num_blocks × KvLayout::bytes_per_block`.
    pub bytes: u64,
    /// Bytes of all staging buffers: `max_num_seqs × staging_bytes_per_sequence` of
    /// `kv::plan` (one layer's share of `KvLayout::staging_bytes_per_sequence`, every layer).
    pub staging_bytes: u64,
    /// Quantized KV: how the kernels address the pool (the model-wide head shape's; another
    /// shape's: [`KvPool::quant`]); `None` for f16.
    pub quant: Option<KvQuantLayout>,
    /// Per head shape `(kv_heads, head_dim)` of the model's layers, the KV heads a pool block
    /// has room for in that shape (`quant::pool_heads`: every slot buffer's blocks are sized
    /// for the widest shape).
    pool_heads: Vec<((usize, usize), usize)>,
    spec: crate::quant::KvCacheSpec,
    stage_slots: usize,
}

impl KvPool {
    /// Per head shape, the KV heads a pool block has room for, and the bytes one block takes
    /// in one slot's K buffer and in its V buffer.
    #[allow(clippy::type_complexity)]
    fn block_shape(
        c: &ModelConfig,
        o: &ModelOptions,
    ) -> Result<(Vec<((usize, usize), usize)>, u64, u64), ModelError> {
        // Layers of different head shapes share the slot buffers, every block sized for the
        // widest (quant::pool_heads; model-wide shape first, every shape's block alike).
        let shapes = c.head_shapes();
        let heads = pool_heads(&o.kv_cache, o.block_size, &shapes, c.values_in_keys())
            .map_err(|e| ModelError::Unsupported(e.to_string()))?;
        let pool_heads: Vec<_> = shapes.iter().copied().zip(heads).collect();
        let ((_, head_dim), room) = pool_heads[0];
        // bytes one block takes in one slot's K (V) buffer: [pool_heads] head blocks
        let hb_bytes = |q| head_block_words(q, o.block_size, head_dim).bytes();
        // MLA: the values are the latent keys' first channels; no V buffer of their own
        let v_heads = if c.values_in_keys() { 0 } else { room as u64 };
        let (k_block, v_block) =
            (room as u64 * hb_bytes(o.kv_cache.k), v_heads * hb_bytes(o.kv_cache.v));
        Ok((pool_heads, k_block, v_block))
    }

    /// The most blocks a pool can have with no slot buffer larger than `max_binding`.
    pub(super) fn max_blocks(
        c: &ModelConfig,
        o: &ModelOptions,
        max_binding: u64,
    ) -> Result<usize, ModelError> {
        let (_, k_block, v_block) = Self::block_shape(c, o)?;
        Ok(usize::try_from(max_binding / k_block.max(v_block).max(1)).unwrap_or(usize::MAX))
    }

    pub(super) fn new(
        gpu: &Gpu,
        c: &ModelConfig,
        o: &ModelOptions,
        max_binding: u64,
    ) -> Result<Self, ModelError> {
        let (pool_heads, k_block, v_block) = Self::block_shape(c, o)?;
        let blocks = o.num_blocks as u64;
        let (k_layer, v_layer) = (blocks.saturating_mul(k_block), blocks.saturating_mul(v_block));
        if k_layer.max(v_layer) > max_binding {
            let max_blocks = max_binding / k_block.max(v_block).max(1);
            let block_bytes = (k_block + v_block) * o.kv_groups.slots_per_block() as u64;
            return Err(ModelError::KvPoolTooLarge {
                bytes: k_layer.max(v_layer),
                blocks: o.num_blocks,
                limit: max_binding,
                max_blocks,
                max_budget_mib: (max_blocks * block_bytes) >> 20,
            });
        }
        let quant = KvQuantLayout::new(&o.kv_cache, o.block_size, c.head_dim, o.max_num_seqs);
        // each layer's staging in its own shape
        let stage_bytes = |l: usize| {
            let (kvh, hd) = c.layer_heads(l);
            let words = stage_words(o.max_num_seqs, kvh, o.block_size, hd);
            if quant.is_some() {
                4 * words as u64
            } else {
                0
            }
        };
        let kv_layers: Vec<usize> = (0..c.num_layers).filter(|&l| o.kv_groups.has_kv(l)).collect();
        let stage_layer = kv_layers.iter().map(|&l| stage_bytes(l)).max().unwrap_or(0);
        if stage_layer > max_binding {
            let per_seq = stage_layer / o.max_num_seqs.max(1) as u64;
            return Err(ModelError::StagingTooLarge {
                bytes: stage_layer,
                seqs: o.max_num_seqs,
                limit: max_binding,
                max_seqs: max_binding / per_seq.max(1),
            });
        }
        let (mut k, mut v, mut stage) = (Vec::new(), Vec::new(), Vec::new());
        // One K and one V buffer per layer slot of a block (KV-cache groups: layer l lives in
        // slot `kv_groups.layer_slot(l).1`, at the blocks of its group's table).
        let slots = o.kv_groups.slots_per_block();
        for slot in 0..slots {
            let k_buf = gpu.storage_buffer(&format!("kv pool K slot {slot}"), k_layer);
            v.push(match c.values_in_keys() {
                true => k_buf.clone(),
                false => gpu.storage_buffer(&format!("kv pool V slot {slot}"), v_layer),
            });
            k.push(k_buf);
        }
        // Staging is per layer, not per slot: layers of different groups share a slot's pool
        // buffer at different blocks, but a sequence's partial last block has one staging row
        // range per layer.
        if quant.is_some() {
            for &l in &kv_layers {
                stage.push(gpu.storage_buffer(&format!("kv staging layer {l}"), stage_bytes(l)));
            }
        }
        let slots = slots as u64;
        Ok(KvPool {
            k,
            v,
            stage,
            num_blocks: o.num_blocks,
            block_size: o.block_size,
            k_block_bytes: k_block,
            v_block_bytes: v_block,
            bytes: (k_layer + v_layer) * slots,
            staging_bytes: kv_layers.iter().map(|&l| stage_bytes(l)).sum(),
            quant,
            pool_heads,
            spec: o.kv_cache,
            stage_slots: o.max_num_seqs,
        })
    }

    /// The KV heads a pool block has room for in head blocks of `(kv_heads, head_dim)`, a
    /// shape of the model's layers.
    pub fn pool_heads(&self, kv_heads: usize, head_dim: usize) -> usize {
        let shape = (kv_heads, head_dim);
        let found = self.pool_heads.iter().find(|(s, _)| *s == shape);
        found.expect("a layer's head shape is among the model's").1
    }

    /// Quantized KV: how the kernels address the pool and staging of a layer with heads of
    /// `head_dim`; `None` for f16.
    pub fn quant(&self, head_dim: usize) -> Option<KvQuantLayout> {
        KvQuantLayout::new(&self.spec, self.block_size, head_dim, self.stage_slots)
    }
}
