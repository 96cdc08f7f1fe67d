//! Architectures as flat lists of dispatches, with their weights, activations and the paged KV
//! pool on the GPU. Everything is allocated at load; a step only uploads the small per-step
//! inputs of a [`ForwardBatch`] and records the op list into one compute pass.

mod arch;
mod batch;
mod buffers;
mod kv_transfer;
mod limits;
mod weights;

use std::sync::Arc;

pub use batch::{
    slot_of, ForwardBatch, LogitReadback, Logits, LogitsWanted, SeqChunk, StateWork, StepTiming,
};
pub use buffers::{KvPool, StatePool};

use crate::gpu::{Gpu, GpuError, GpuTimer};
use crate::kernels::argmax::ArgmaxOp;
use crate::kernels::attention::AttentionOp;
use crate::kernels::delta_net::{ConvOp, GatedNormOp, ScanOp};
use crate::kernels::embedding::EmbeddingOp;
use crate::kernels::gate::GateOp;
use crate::kernels::glu::GluOp;
use crate::kernels::kv_quantize::{KvQuantizeOp, KvStageOp};
use crate::kernels::kv_write::KvWriteOp;
use crate::kernels::linear::LinearOp;
use crate::kernels::logit_edit::LogitEditOp;
use crate::kernels::logprob::{LogprobOp, NO_TARGET};
use crate::kernels::moe::{ExpertsOp, RouteOp};
use crate::kernels::rms_norm::RmsNormOp;
use crate::kernels::rope::RopeOp;
use crate::kernels::rope_kv_write::RopeKvWriteOp;
use crate::kernels::rotate::RotateOp;
use crate::kernels::sampling::SampleOp;
use crate::kernels::softcap::SoftcapOp;
use crate::kernels::weights::WeightError;
use crate::kernels::{Kernels, StepShape};
use crate::kv::{GroupKind, KvGroups};
use crate::loader::{AttentionKind, LoadError, ModelConfig, ModelFile};
use crate::quant::KvCacheSpec;
use buffers::{Activations, StepBuffers};

/// Sizes fixed at load: every buffer is allocated for these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelOptions {
    /// Most tokens computed in one step (the prefill chunk size).
    pub max_num_batched_tokens: usize,
    /// Most sequences in one step.
    pub max_num_seqs: usize,
    /// Most rows of logits one step returns.
    pub max_logit_rows: usize,
    /// Context length per sequence (positions, block table length, decode partitions).
    pub max_model_len: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Blocks in the KV pool.
    pub num_blocks: usize,
    /// How K and V are stored (f16, or quantized with f16 staging for `max_num_seqs`
    /// sequences) and whether they are rotated.
    pub kv_cache: KvCacheSpec,
    /// Which layers share a block table ([`KvGroups::uniform`] when every layer attends
    /// fully); one pool buffer per slot of a block, one table and slot mapping per group.
    pub kv_groups: KvGroups,
    /// Recurrent layers: state slots kept for prefix-cache snapshots, after the
    /// `max_num_seqs` running slots ([`Model::snapshot_slot`]); 0 for other models.
    pub state_snapshots: usize,
}

/// A KV pool sized from a byte budget ([`Model::load_fitting`]): `bytes` for the step buffers,
/// activations and pool together (the weights, quantized-KV staging and recurrent states are
/// the caller's to leave out), in blocks of `bytes_per_block` (`kv::KvLayout::bytes_per_block`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvFit {
    pub bytes: u64,
    pub bytes_per_block: u64,
}

/// The KV-cache group kind a layer of `attention` kind belongs to at a context of
/// `max_model_len` tokens: a window covering the context is full attention; a recurrent layer
/// keeps no KV (`None`). The one place that decides it (`engine::kv_groups` builds the groups
/// from it, [`check_kv_groups`] checks them against it).
pub fn layer_group_kind(attention: AttentionKind, max_model_len: usize) -> Option<GroupKind> {
    match attention {
        AttentionKind::Sliding { window } if window < max_model_len => {
            Some(GroupKind::Sliding { window })
        }
        AttentionKind::Sliding { .. } | AttentionKind::Full => Some(GroupKind::Full),
        AttentionKind::Recurrent => None,
    }
}

/// How many layers of each layer's head shape one pool slot holds (`kv::KvGroups::
/// from_packed_layers`): a block is sized for the widest shape (`quant::pool_heads`), and a
/// narrower shape whose heads fill a whole fraction of it packs that many layers into a slot
/// (Gemma 4's 4 × 512 global layers, two to a 16 × 256 block); 1 for every layer of a model with
/// one shape. Computed for f16: the formats the pool accepts for these shapes (`pool_heads`)
/// have the same room in every shape's head blocks, which `arch::common::validate` checks.
pub fn layers_per_slot(c: &ModelConfig) -> Vec<usize> {
    let shapes = c.head_shapes();
    let f16 = crate::quant::KvCacheSpec::default();
    let room = crate::quant::pool_heads(&f16, 16, &shapes, c.values_in_keys())
        .unwrap_or_else(|_| shapes.iter().map(|&(kvh, _)| kvh).collect());
    (0..c.num_layers)
        .map(|l| {
            let shape = c.layer_heads(l);
            let i = shapes.iter().position(|&s| s == shape).expect("a layer's shape is listed");
            (room[i] / shape.0.max(1)).max(1)
        })
        .collect()
}

/// The KV-cache groups must be the ones the config's layers call for at this context
/// (`engine::kv_groups`): each layer in a group of its own attention kind, so that no layer
/// attends wider or narrower than its config says, and no recurrent layer in any.
fn check_kv_groups(c: &ModelConfig, o: &ModelOptions) -> Result<(), ModelError> {
    let groups = &o.kv_groups;
    if groups.num_layers() != c.num_layers {
        return Err(ModelError::Unsupported(format!(
            "the KV-cache groups cover {} layers, the model has {}",
            groups.num_layers(),
            c.num_layers
        )));
    }
    for (l, layer) in c.layers.iter().enumerate() {
        let want = layer_group_kind(layer.attention, o.max_model_len);
        let got = groups.has_kv(l).then(|| groups.kind(groups.layer_slot(l).0));
        if got != want {
            let name = |k: Option<GroupKind>| match k {
                Some(k) => format!("{k:?}"),
                None => "recurrent (no KV)".to_string(),
            };
            return Err(ModelError::Unsupported(format!(
                "layer {l} attends as {} but its KV-cache group is {}; build the groups with \
                 engine::kv_groups",
                name(want),
                name(got)
            )));
        }
    }
    Ok(())
}

/// Errors while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Weight(#[from] WeightError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(
        "tensor '{tensor}' has type {dtype}, which kvrun's GPU kernels cannot read yet \
         (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K); convert the \
         model, e.g. `llama-quantize in.gguf out.gguf Q4_K_M`"
    )]
    UnsupportedWeight { tensor: String, dtype: String },
    #[error("tensor '{tensor}' has shape {shape:?}, expected {expected:?}")]
    BadShape { tensor: String, shape: Vec<usize>, expected: Vec<usize> },
    #[error("{0}")]
    Unsupported(String),
    #[error(
        "the KV pool of one layer ({bytes} bytes for {blocks} blocks) exceeds the adapter's \
         largest storage binding ({limit} bytes): at most {max_blocks} blocks fit; lower \
         --kv-cache-memory to at most {max_budget_mib}MiB"
    )]
    KvPoolTooLarge { bytes: u64, blocks: usize, limit: u64, max_blocks: u64, max_budget_mib: u64 },
    #[error(
        "the quantized-KV staging of one layer ({bytes} bytes for {seqs} sequences) exceeds the \
         adapter's largest storage binding ({limit} bytes); lower --max-num-seqs to at most \
         {max_seqs}"
    )]
    StagingTooLarge { bytes: u64, seqs: usize, limit: u64, max_seqs: u64 },
    #[error(
        "the {buffer} buffer would need {} bytes for {value} {unit}, more than the adapter's \
         largest buffer binding ({limit} bytes): at most {largest} fit; lower {flag}",
        bytes.map_or("more than 2^64".to_string(), |b| b.to_string())
    )]
    BufferTooLarge {
        buffer: &'static str,
        /// What `value` counts (tokens, logit rows, sequences, positions).
        unit: &'static str,
        /// `None` when the size overflows u64.
        bytes: Option<u64>,
        limit: u64,
        flag: &'static str,
        value: usize,
        largest: u64,
    },
    #[error(
        "the memory left for the KV cache ({budget} bytes) holds no block once the activations \
         ({activations} bytes) are allocated; raise --gpu-memory-utilization, or lower \
         --max-num-batched-tokens or --max-num-seqs"
    )]
    NoRoomForKv { budget: u64, activations: u64 },
    #[error("this step has {got} {what}, more than the {max} the model was loaded for")]
    BatchTooLarge { what: &'static str, got: usize, max: usize },
}

/// One dispatch (or dispatch group) of the forward pass.
enum Op {
    Embedding(EmbeddingOp),
    RmsNorm(RmsNormOp),
    Linear(LinearOp),
    Rope(RopeOp),
    RopeKvWrite(RopeKvWriteOp),
    Rotate(RotateOp),
    KvWrite(KvWriteOp),
    KvQuantize(KvQuantizeOp),
    KvStage(KvStageOp),
    Attention(AttentionOp),
    Glu(GluOp),
    /// The samplers' logit shaping (bias, penalties) as edits, before the argmax.
    LogitEdit(LogitEditOp),
    Argmax(ArgmaxOp),
    Sample(SampleOp),
    /// Each logit row's log-probability of its target token.
    Logprob(LogprobOp),
    /// The final logit soft-cap (Gemma 4).
    Softcap(SoftcapOp),
    /// Gated attention's output gate (Qwen3.5).
    Gate(GateOp),
    /// A Gated DeltaNet layer's conv and its state's advance.
    DeltaConv(ConvOp),
    /// A Gated DeltaNet layer's scan (the recurrent state's update).
    DeltaScan(ScanOp),
    /// A Gated DeltaNet layer's gated RMSNorm.
    DeltaNorm(GatedNormOp),
    /// Mixture of experts: each token's experts and weights from the router's logits.
    MoeRoute(RouteOp),
    /// Mixture of experts: the chosen experts' gate|up and down projections.
    MoeExperts(Box<ExpertsOp>),
}

impl Op {
    /// Short name of the op's kernel, for per-op timing reports.
    fn kind(&self) -> &'static str {
        match self {
            Op::Embedding(_) => "embedding",
            Op::RmsNorm(_) => "rms_norm",
            Op::Linear(_) => "linear",
            Op::Rope(_) => "rope",
            Op::RopeKvWrite(_) => "rope_kv_write",
            Op::Rotate(_) => "rotate",
            Op::KvWrite(_) => "kv_write",
            Op::KvQuantize(_) => "kv_quantize",
            Op::KvStage(_) => "kv_stage",
            Op::Attention(op) if op.is_windowed() => "attention_sliding",
            Op::Attention(_) => "attention",
            Op::Glu(_) => "glu",
            Op::LogitEdit(_) => "logit_edit",
            Op::Argmax(_) => "argmax",
            Op::Sample(_) => "sample",
            Op::Logprob(_) => "logprob",
            Op::Softcap(_) => "softcap",
            Op::Gate(_) => "gate",
            Op::DeltaConv(_) => "delta_conv",
            Op::DeltaScan(_) => "delta_scan",
            Op::DeltaNorm(_) => "delta_norm",
            Op::MoeRoute(_) => "moe_route",
            Op::MoeExperts(_) => "moe_experts",
        }
    }

    /// Records the op; returns how many dispatches it made.
    fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        match self {
            Op::Embedding(op) => op.record(pass, shape),
            Op::RmsNorm(op) => op.record(pass, shape),
            Op::Linear(op) => op.record(pass, shape),
            Op::Rope(op) => op.record(pass, shape),
            Op::RopeKvWrite(op) => op.record(pass, shape),
            Op::Rotate(op) => op.record(pass, shape),
            Op::KvWrite(op) => op.record(pass, shape),
            Op::KvQuantize(op) => op.record(pass, shape),
            Op::KvStage(op) => op.record(pass, shape),
            Op::Attention(op) => op.record(pass, shape),
            Op::Glu(op) => op.record(pass, shape),
            Op::LogitEdit(op) => op.record(pass, shape),
            Op::Argmax(op) => op.record(pass, shape),
            Op::Sample(op) => op.record(pass, shape),
            Op::Logprob(op) => op.record(pass, shape),
            Op::Softcap(op) => op.record(pass, shape),
            Op::Gate(op) => op.record(pass, shape),
            Op::DeltaConv(op) => op.record(pass, shape),
            Op::DeltaScan(op) => op.record(pass, shape),
            Op::DeltaNorm(op) => op.record(pass, shape),
            Op::MoeRoute(op) => op.record(pass, shape),
            Op::MoeExperts(op) => op.record(pass, shape),
        }
    }
}

/// A loaded model: weights, activations, KV pool and the op list, on one GPU.
pub struct Model {
    gpu: Arc<Gpu>,
    config: ModelConfig,
    options: ModelOptions,
    ops: Vec<Op>,
    step: StepBuffers,
    act: Activations,
    kv: KvPool,
    /// The recurrent layers' states; held for the model's life (its ops bind them).
    #[allow(dead_code)]
    states: StatePool,
    weight_bytes: u64,
    timer: Option<GpuTimer>,
    timing: Timing,
    query_tile: usize,
}

/// How much of each step to time with timestamp queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    Off,
    /// Attention vs everything else: one extra pass per layer.
    Attention,
    /// Every op in its own pass (profiling; slower).
    PerOp,
}

/// The most blocks a KV pool for `options` can have on an adapter whose buffers bind at most
/// `max_binding` bytes: each layer slot is one K and one V buffer holding every block's slot.
pub fn max_kv_pool_blocks(
    c: &ModelConfig,
    options: &ModelOptions,
    max_binding: u64,
) -> Result<usize, ModelError> {
    buffers::KvPool::max_blocks(c, options, max_binding)
}

impl Model {
    /// Uploads the weights of `file` and allocates every buffer for `options`.
    pub fn load(
        gpu: Arc<Gpu>,
        kernels: &Kernels,
        file: &ModelFile,
        options: ModelOptions,
    ) -> Result<Self, ModelError> {
        check_kv_groups(file.config(), &options)?;
        arch::load(gpu, kernels, file, options, None)
    }

    /// [`Model::load`] with the KV pool sized from a byte budget instead of
    /// `options.num_blocks` (`--gpu-memory-utilization`): the blocks `fit` holds after the step
    /// buffers and activations are allocated ([`Model::kv_pool`] says how many).
    pub fn load_fitting(
        gpu: Arc<Gpu>,
        kernels: &Kernels,
        file: &ModelFile,
        options: ModelOptions,
        fit: KvFit,
    ) -> Result<Self, ModelError> {
        check_kv_groups(file.config(), &options)?;
        arch::load(gpu, kernels, file, options, Some(fit))
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn options(&self) -> &ModelOptions {
        &self.options
    }

    pub fn kv_pool(&self) -> &KvPool {
        &self.kv
    }

    /// Bytes of weights on the GPU (after repacking).
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// Weight bytes a decode step of one sequence reads: every linear layer's weight once (the
    /// LM head's too, tied or not) and the experts one token is routed to
    /// ([`Model::expert_weight_bytes`]); the embedding lookup reads one row, not counted.
    pub fn linear_weight_bytes(&self) -> u64 {
        let linear: u64 = self
            .ops
            .iter()
            .map(|op| if let Op::Linear(l) = op { l.weight_bytes() } else { 0 })
            .sum();
        linear + self.expert_weight_bytes()
    }

    /// Of [`Model::linear_weight_bytes`], the experts' rows one token reads (`kernels::moe`: k
    /// of each layer's experts); 0 for dense models.
    pub fn expert_weight_bytes(&self) -> u64 {
        let token = |op: &Op| if let Op::MoeExperts(e) = op { e.token_weight_bytes() } else { 0 };
        self.ops.iter().map(token).sum()
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Query tokens per prefill tile of this model's attention kernel (for [`ForwardBatch::new`]).
    pub fn query_tile(&self) -> usize {
        self.query_tile
    }

    /// Measures GPU time of every following step, where the adapter has timestamp queries.
    pub fn set_timing(&mut self, timing: Timing) {
        self.timing = timing;
        let passes = timed_segments(&self.ops, timing == Timing::PerOp).len() as u32;
        self.timer = if timing == Timing::Off { None } else { GpuTimer::new(&self.gpu, passes) };
    }

    /// The state slot of prefix-cache snapshot `snapshot` (`0..state_snapshots`): after the
    /// running slots.
    pub fn snapshot_slot(&self, snapshot: u32) -> u32 {
        self.options.max_num_seqs as u32 + snapshot
    }

    /// Runs one step: uploads the batch's inputs, records every op, reads the logits back.
    pub fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, ModelError> {
        self.check_capacity(batch)?;
        self.step.upload(&self.gpu, batch);
        let shape = batch.shape();
        let recording = std::time::Instant::now();
        let mut encoder = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        // before any kernel: a restored snapshot's slot may be written again in this step
        self.states.record_restores(&mut encoder, &batch.state_restores);
        let dispatches: u32 = match self.timer.as_mut() {
            None => {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("forward"),
                    timestamp_writes: None,
                });
                self.ops.iter().map(|op| op.record(&mut pass, &shape)).sum()
            }
            Some(timer) => {
                record_timed(&self.ops, self.timing == Timing::PerOp, timer, &mut encoder, &shape)
            }
        };
        let rows = batch.logit_rows.len();
        let vocab = self.config.vocab_size;
        // the logit rows whole, and/or each row's token id (its argmax, or its sample on the
        // GPU), then its target log-probability
        let row_bytes = match batch.readback {
            LogitReadback::Rows => (rows * vocab * 4) as u64,
            _ => 0,
        };
        let id_bytes = match batch.readback {
            LogitReadback::TargetLogprobs => (rows * 8) as u64,
            _ if batch.returns_token_ids() => (rows * 4) as u64,
            _ => 0,
        };
        for (src, staging, bytes) in [
            (&self.act.logits, &self.act.logits_staging, row_bytes),
            (&self.act.token_ids, &self.act.token_ids_staging, id_bytes),
        ] {
            if bytes > 0 {
                encoder.copy_buffer_to_buffer(src, 0, staging, 0, bytes);
            }
        }
        let bytes = row_bytes + id_bytes;
        if let Some(timer) = &self.timer {
            timer.resolve(&mut encoder);
        }
        self.gpu.queue.submit([encoder.finish()]);
        let host_ms = recording.elapsed().as_secs_f64() * 1e3;
        if bytes == 0 {
            self.gpu.wait_idle()?;
        }
        let data = match row_bytes {
            0 => Vec::new(),
            n => bytemuck::pod_collect_to_vec(&self.gpu.map_and_read(&self.act.logits_staging, n)?),
        };
        let words: Vec<u32> = match id_bytes {
            0 => Vec::new(),
            n => bytemuck::pod_collect_to_vec(
                &self.gpu.map_and_read(&self.act.token_ids_staging, n)?,
            ),
        };
        let (ids, lps) = words.split_at(words.len().min(rows));
        let token_ids = (id_bytes > 0).then(|| ids.to_vec());
        let target_logprobs = (batch.readback == LogitReadback::TargetLogprobs).then(|| {
            let lps = lps.iter().zip(&batch.logit_targets);
            lps.map(|(&b, &t)| if t == NO_TARGET { f32::NAN } else { f32::from_bits(b) }).collect()
        });
        // a validation error in this step's commands means the logits are not to be trusted
        self.gpu.check_errors()?;
        let timing = match &self.timer {
            Some(timer) => Some(StepTiming {
                dispatches: u64::from(dispatches),
                host_ms,
                readback_bytes: bytes,
                ..split_timing(&self.ops, self.timing == Timing::PerOp, &timer.read_ms(&self.gpu)?)
            }),
            None => None,
        };
        Ok(Logits {
            vocab,
            data,
            token_ids,
            target_logprobs,
            chunks: batch.logit_chunks.clone(),
            timing,
        })
    }

    fn check_capacity(&self, b: &ForwardBatch) -> Result<(), ModelError> {
        let o = &self.options;
        // Every group's concatenated tables have the same length.
        let table_entries = b.block_tables.iter().map(Vec::len).max().unwrap_or(0);
        let groups = (b.block_tables.len(), self.step.block_tables.len());
        if groups.0 != groups.1 || b.slot_mapping.len() != groups.1 {
            return Err(ModelError::Unsupported(format!(
                "the batch has block tables for {} KV-cache groups, the model {}",
                groups.0, groups.1
            )));
        }
        let checks = [
            ("tokens", b.num_tokens(), o.max_num_batched_tokens),
            ("sequences", b.seqs.len(), o.max_num_seqs),
            ("logit rows", b.logit_rows.len(), o.max_logit_rows),
            ("block table entries", table_entries, self.step.block_table_capacity),
            ("prefill tiles", b.prefill_tiles.len(), self.step.tile_capacity),
            ("completed KV blocks", b.num_completed_blocks(), self.step.completed_capacity),
        ];
        for (what, got, max) in checks {
            if got > max {
                return Err(ModelError::BatchTooLarge { what, got, max });
            }
        }
        let edits = (b.logit_edits.len(), self.step.edit_capacity);
        if edits.0 > edits.1 {
            return Err(ModelError::BatchTooLarge {
                what: "logit edits",
                got: edits.0,
                max: edits.1,
            });
        }
        if let Some(e) = b.logit_edits.iter().find(|e| {
            e.row as usize >= b.logit_rows.len() || e.id as usize >= self.config.vocab_size
        }) {
            return Err(ModelError::Unsupported(format!(
                "a logit edit of row {} token {} lies outside the step's {} rows of {} logits",
                e.row,
                e.id,
                b.logit_rows.len(),
                self.config.vocab_size
            )));
        }
        let sampled = b.logit_sampling.len();
        if sampled != 0 && sampled != b.logit_rows.len() {
            return Err(ModelError::Unsupported(format!(
                "the batch samples {sampled} rows on the GPU but has {} logit rows; give every \
                 logit row a RowSampling (RowSampling::GREEDY for those not sampled)",
                b.logit_rows.len()
            )));
        }
        if self.kv.quant.is_some() {
            if let Some(s) = b.seqs.iter().find(|s| s.stage_slot as usize >= o.max_num_seqs) {
                return Err(ModelError::BatchTooLarge {
                    what: "as staging slot index",
                    got: s.stage_slot as usize,
                    max: o.max_num_seqs - 1,
                });
            }
        }
        let state_slots = (o.max_num_seqs + o.state_snapshots) as u32;
        let snapshots = b.seqs.iter().filter(|s| s.snapshot_len > 0).map(|s| s.snapshot_slot);
        let restores = b.state_restores.iter().flatten().copied();
        if let Some(slot) = snapshots.chain(restores).find(|&s| s >= state_slots) {
            return Err(ModelError::BatchTooLarge {
                what: "as state slot index",
                got: slot as usize,
                max: state_slots as usize - 1,
            });
        }
        if let Some(s) = b.seqs.iter().find(|s| s.ctx_len as usize > o.max_model_len) {
            return Err(ModelError::BatchTooLarge {
                what: "context tokens",
                got: s.ctx_len as usize,
                max: o.max_model_len,
            });
        }
        Ok(())
    }
}

/// The ops cut into timed passes: each attention op alone and the ops between them together,
/// or (`per_op`) every op alone. (range of ops, is attention)
fn timed_segments(ops: &[Op], per_op: bool) -> Vec<(std::ops::Range<usize>, bool)> {
    let mut segments = Vec::new();
    let mut i = 0;
    while i < ops.len() {
        let attention = matches!(ops[i], Op::Attention(_));
        let end = if attention || per_op {
            i + 1
        } else {
            ops[i..]
                .iter()
                .position(|op| matches!(op, Op::Attention(_)))
                .map_or(ops.len(), |p| i + p)
        };
        segments.push((i..end, attention));
        i = end;
    }
    segments
}

/// Records every segment of `timed_segments` as its own pass with timestamps; returns the
/// dispatches made.
fn record_timed(
    ops: &[Op],
    per_op: bool,
    timer: &mut GpuTimer,
    encoder: &mut wgpu::CommandEncoder,
    shape: &StepShape,
) -> u32 {
    timer.reset();
    let mut dispatches = 0;
    for (range, attention) in timed_segments(ops, per_op) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(if attention { "attention" } else { "forward" }),
            timestamp_writes: timer.next_pass(),
        });
        for op in &ops[range] {
            dispatches += op.record(&mut pass, shape);
        }
    }
    dispatches
}

/// Sums the passes of `record_timed` into attention time, total time and (per op) time by kind.
fn split_timing(ops: &[Op], per_op: bool, pass_ms: &[f64]) -> StepTiming {
    let mut t = StepTiming::default();
    for (ms, (range, attention)) in pass_ms.iter().zip(timed_segments(ops, per_op)) {
        t.total_ms += ms;
        if attention {
            t.attention_ms += ms;
        }
        if per_op {
            *t.by_kind.entry(ops[range.start].kind()).or_default() += ms;
            tracing::trace!(op = range.start, kind = ops[range.start].kind(), ms, "op GPU time");
        }
    }
    t
}
