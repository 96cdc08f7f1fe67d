//! Host half of every WGSL kernel. A kernel family is one module, paired with a folder of
//! `shaders/` (`rope_kv_write` with one file of `shaders/rope/`, the fused RoPE + KV write): its
//! variant enums and what the adapter needs to run them (`can_run_*`), its `#[repr(C)]` params
//! struct, its key and the [`Kernel`] implementation that says the key's WGSL parts, constants,
//! bindings and every variant, the op that binds and records it, the dispatch size and the
//! preconditions. [`reference`] holds the plain f32 CPU version of each kernel, the oracle of
//! the tests; [`source`] the WGSL snippets several families share and the join.
//!
//! Pipelines are cached by [`PipelineKey`], which wraps one key per family; variants are chosen
//! at run time from the device's capabilities in one function, [`KernelConfig::choose`].

/// A kernel family with one variant: its key (a unit struct, documented at the call) and the
/// key's [`Kernel`] implementation from its WGSL parts and its binding order.
macro_rules! one_variant_key {
    ($(#[$meta:meta])* $key:ident, parts: [$($part:expr),+ $(,)?], bindings: $bindings:expr $(,)?) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct $key;

        impl $crate::kernels::Kernel for $key {
            fn parts(&self) -> Vec<&'static str> {
                vec![$($part),+]
            }

            fn bindings(&self) -> Vec<$crate::gpu::BindingKind> {
                $bindings.to_vec()
            }

            fn all() -> Vec<Self> {
                vec![$key]
            }
        }
    };
}

pub mod argmax;
pub mod attention;
pub mod bandwidth;
pub mod delta_net;
pub mod embedding;
pub mod gate;
pub mod glu;
pub mod kv_quantize;
pub mod kv_write;
pub mod linear;
pub mod logit_edit;
pub mod logprob;
pub mod moe;
pub mod reference;
pub mod rms_norm;
pub mod rope;
pub mod rope_kv_write;
pub mod rotate;
pub mod sampling;
pub mod softcap;
pub mod source;
pub mod weight_textures;
pub mod weights;
#[cfg(test)]
mod weights_tests;

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use crate::gpu::{BindingKind, Capabilities, Gpu, Pipeline, PipelineCache};
pub use attention::AttentionVariant;
pub use kv_quantize::{KvCodeFormat, KvQuantKey, KvQuantLayout};
pub use linear::{LinearVariant, TokenTile};
pub use rms_norm::NormVariant;
pub use rotate::RotateVariant;
pub use weights::{GpuWeight, PackedWeight, WeightFormat};

/// Mirror of WGSL `StepInfo` (shaders/common/step.wgsl): the counts of one step.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct StepInfo {
    pub num_tokens: u32,
    pub num_logits: u32,
    pub num_seqs: u32,
    pub num_decode_seqs: u32,
    pub num_prefill_tiles: u32,
    /// Quantized KV: rows `kv_stage` copies into staging slots.
    pub num_stage_rows: u32,
    /// Quantized KV: head blocks `kv_quantize` quantizes (per KV head and K|V).
    pub num_completed_blocks: u32,
    /// Logit edits `logit_edit` applies before the argmax (`model::ForwardBatch::logit_edits`).
    pub num_logit_edits: u32,
}
const _: () = assert!(std::mem::size_of::<StepInfo>() == 32);

/// Mirror of WGSL `SeqInfo`: one sequence of a step.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct SeqInfo {
    /// Row of the sequence's first query token in the step's activations.
    pub q_start: u32,
    /// Query tokens of the sequence in this step (1 for decode).
    pub q_len: u32,
    /// Tokens in the KV cache once this step's K/V are written.
    pub ctx_len: u32,
    /// Index of the sequence's first block id in the concatenated block tables.
    pub table_start: u32,
    /// Quantized KV: the f16 staging slot holding the sequence's partial last block.
    pub stage_slot: u32,
    /// Recurrent layers (Gated DeltaNet): the slot of the sequence's conv and recurrent states
    /// (`kernels::delta_net`).
    pub state_slot: u32,
    /// Recurrent layers: the state slot that also receives the states after the step's first
    /// `snapshot_len` tokens (a prefix-cache snapshot); `snapshot_len` 0 = none.
    pub snapshot_slot: u32,
    pub snapshot_len: u32,
}
const _: () = assert!(std::mem::size_of::<SeqInfo>() == 32);

/// Host-side numbers from which every dispatch size of a step is derived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepShape {
    pub num_tokens: u32,
    pub num_logits: u32,
    pub num_decode_seqs: u32,
    /// Largest number of key partitions of any decode sequence (ceil(ctx_len / PART)).
    pub max_decode_partitions: u32,
    pub num_prefill_tiles: u32,
    /// Quantized KV: rows staged by `kv_stage`.
    pub num_stage_rows: u32,
    /// Quantized KV: blocks completed in this step (`kv_quantize` workgroups along x).
    pub num_completed_blocks: u32,
    /// Sequences in the step (decode ones first).
    pub num_seqs: u32,
    /// Most query tokens of any sequence in the step (the recurrent layers' dispatches walk
    /// each sequence's tokens in order: `kernels::delta_net`).
    pub max_seq_tokens: u32,
    /// Logit rows whose argmax the GPU computes (greedy sampling on the GPU,
    /// `model::LogitReadback::Argmax`): `num_logits` then, else 0.
    pub argmax_rows: u32,
    /// Logit rows whose target logprob the GPU computes (`model::LogitReadback::
    /// TargetLogprobs`): `num_logits` then, else 0.
    pub logprob_rows: u32,
    /// Logit rows the GPU samples at random (`kernels::sampling`, after the argmax):
    /// `num_logits` when the step samples any row so, else 0.
    pub sample_rows: u32,
    /// Logit edits (`kernels::logit_edit`, before the argmax): the sampler's bias and penalties
    /// for the rows the GPU picks.
    pub logit_edits: u32,
}

/// How wide the components are that the CPU variants load lane by lane: the subgroup linear
/// kernel's inputs (x) and the lane attention kernels' quantized KV pools. llvmpipe loads each
/// lane's components one at a time; the same bits either way, only the speed differs by host
/// (`KernelConfig::choose`; DESIGN.md, "Traps").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum LaneLoads {
    /// 32-bit components (x as `vec4<f32>`, the pools as `vec2<u32>`): cheaper where the host
    /// has masked loads (AVX-512), and on adapters without 64-bit shader integers.
    Words32,
    /// 64-bit components (x as `vec2<u64>`, the pools as `u64`): half as many where every lane's
    /// load spills its vector (AVX2 and other hosts without masked loads).
    Words64,
}

impl LaneLoads {
    /// The pipeline constant (WGSL `LANE_LOAD_BITS`).
    pub const fn bits(self) -> u32 {
        match self {
            LaneLoads::Words32 => 32,
            LaneLoads::Words64 => 64,
        }
    }
}

/// What a kernel variant needs of the adapter beyond core WGSL (and `unpack2x16float`): the
/// features it is only chosen with (`KernelConfig::choose`), which a validator must allow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelFeatures {
    /// Subgroup operations (`enable subgroups` is implied by wgpu's naga).
    pub subgroups: bool,
    /// 64-bit shader integers (`u64`).
    pub int64: bool,
}

/// A kernel family's facts about its pipelines: implemented by the key type in the family's
/// own module (`LinearKey` in `linear.rs`, `AttnKey` in `attention.rs`, …), so adding a variant
/// touches that module and its WGSL only. [`PipelineKey`] wraps the keys; [`source::spec`]
/// joins what they say.
pub trait Kernel: Copy + Eq + std::hash::Hash + std::fmt::Debug {
    /// The WGSL the variant is built from, in order: the shared snippets of `shaders/common/`
    /// it needs first, its own kernel file last ([`source::wgsl`] joins them).
    fn parts(&self) -> Vec<&'static str>;
    /// Values of its WGSL `override` constants.
    fn constants(&self) -> Vec<(&'static str, f64)> {
        Vec::new()
    }
    /// Binding order of group 0 (the shape of each entry is commented where it is declared).
    fn bindings(&self) -> Vec<BindingKind>;
    /// The adapter features the variant needs.
    fn features(&self) -> KernelFeatures {
        KernelFeatures::default()
    }
    /// Every variant the runtime can build, which `tests/shaders_compile.rs` compiles for
    /// Vulkan, Metal and DX12 (head sizes a spread of the served ones).
    fn all() -> Vec<Self>;
}

/// [`PipelineKey`]: one variant per kernel family, each wrapping the family's key; its methods
/// hand each question to that key's [`Kernel`] implementation.
macro_rules! pipeline_keys {
    ($($(#[$doc:meta])* $name:ident($key:ty),)*) => {
        /// Typed pipeline key: kernel family × its variant. Never a string.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum PipelineKey {
            $($(#[$doc])* $name($key),)*
        }

        impl PipelineKey {
            pub fn parts(&self) -> Vec<&'static str> {
                match self { $(PipelineKey::$name(k) => k.parts(),)* }
            }
            pub fn constants(&self) -> Vec<(&'static str, f64)> {
                match self { $(PipelineKey::$name(k) => k.constants(),)* }
            }
            pub fn bindings(&self) -> Vec<BindingKind> {
                match self { $(PipelineKey::$name(k) => k.bindings(),)* }
            }
            pub fn features(&self) -> KernelFeatures {
                match self { $(PipelineKey::$name(k) => k.features(),)* }
            }
            /// Every family's [`Kernel::all`].
            pub fn all() -> Vec<PipelineKey> {
                let mut keys = Vec::new();
                $(keys.extend(<$key as Kernel>::all().into_iter().map(PipelineKey::$name));)*
                keys
            }
        }

        $(impl From<$key> for PipelineKey {
            fn from(key: $key) -> Self {
                PipelineKey::$name(key)
            }
        })*
    };
}

pipeline_keys! {
    Linear(linear::LinearKey),
    Embedding(embedding::EmbeddingKey),
    RmsNorm(rms_norm::NormKey),
    Rope(rope::RopeKey),
    KvWrite(kv_write::KvWriteKey),
    /// RoPE and the f16 KV write in one dispatch.
    RopeKvWrite(rope_kv_write::RopeKvWriteKey),
    /// Quantized KV: quantize the head blocks completed in a step.
    KvQuantize(kv_quantize::QuantizeKey),
    /// Quantized KV: copy rows of partial blocks to staging.
    KvStage(kv_quantize::StageKey),
    /// Test kernel of the WGSL codecs (`shaders/kv_quantize/codec_test.wgsl`).
    KvCodecTest(kv_quantize::CodecTestKey),
    /// The Hadamard rotation of `--kv-rotate`.
    Rotate(rotate::RotateKey),
    /// The gated MLP activation act(gate) · up.
    Glu(glu::GluKey),
    /// A memory-bandwidth probe (`kvrun bench bandwidth`).
    Bandwidth(bandwidth::BandwidthKey),
    /// Paged attention: decode partials and prefill, over any pool.
    Attention(attention::AttnKey),
    /// Paged attention: the merge of the decode partials.
    AttnReduce(attention::ReduceKey),
    /// Greedy sampling on the GPU: each logit row's argmax.
    Argmax(argmax::ArgmaxKey),
    /// The sampler's logit bias and penalties, as sparse edits of the logit rows.
    LogitEdit(logit_edit::LogitEditKey),
    /// Each logit row's log-probability of a target token (perplexity, prompt logprobs).
    Logprob(logprob::LogprobKey),
    /// Random sampling on the GPU: each logit row's token drawn by the sampler's rules.
    Sample(sampling::SampleKey),
    /// The final logit soft-cap, cap · tanh(logit / cap).
    Softcap(softcap::SoftcapKey),
    /// A Gated DeltaNet layer's conv, state advance, scan and gated norm.
    DeltaNet(delta_net::DeltaNetKey),
    /// Gated attention's output gate, x · sigmoid(g).
    Gate(gate::GateKey),
    /// Mixture of experts: each token's experts and their weights from the router's logits.
    MoeRoute(moe::RouteKey),
    /// Mixture of experts: the chosen experts' gate|up or down projections, per pair or
    /// grouped by expert.
    MoeExperts(moe::ExpertKey),
    /// Mixture of experts, grouped path: the tiling of the pairs and the rank-order sum.
    MoeStage(moe::ExpertStageKey),
}

/// Kernel choices resolved once from the device's capabilities.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelConfig {
    /// Largest byte size of one storage binding (weights and KV pools are split to fit).
    pub max_binding_bytes: u64,
    /// Workgroup memory available to the attention kernels.
    pub workgroup_memory: u32,
    /// How linear layers load their inputs.
    pub linear: LinearVariant,
    /// Whether the GPU linear variant splits a row over invocations in short steps (split-K,
    /// [`linear::split_groups`]): on GPUs. A CPU adapter forced onto the GPU variant runs it
    /// one invocation a row: there the split's barriers made the kernel 1.4–1.6× slower
    /// (docs/measured.md).
    pub split_k: bool,
    /// Whether the lane-parallel attention kernels can run (subgroups of exactly 8 lanes and
    /// 64-bit shader integers on a CPU adapter); they are used for head sizes 64, 128 and 256.
    pub lanes_attention: bool,
    /// Whether the RMSNorm runs as one 8-lane subgroup per row ([`NormVariant::Lanes`]): on a
    /// CPU adapter with subgroups of exactly 8 lanes.
    pub lanes_norm: bool,
    /// Whether the `--kv-rotate` rotation runs as one subgroup of 8 lanes per head
    /// ([`RotateVariant::Lanes`], for head sizes 32 to 256): on any adapter with subgroups of at
    /// least 8 lanes (the one-invocation kernel is slow on GPUs and CPUs alike).
    pub lanes_rotate: bool,
    /// Component width of the CPU variants' lane-by-lane loads ([`LaneLoads`]).
    pub lane_loads: LaneLoads,
    /// Keys per partition of the lanes attention family (WGSL `PART`,
    /// [`KernelConfig::lane_partition`]): 64, 128 or 256.
    pub lane_partition: u32,
    /// Whether mixtures of experts take the grouped path in steps with enough pairs per expert
    /// ([`moe::ExpertPath::choose`]): on GPUs, where it reads each expert's weights once per
    /// tile of 8 pairs instead of once per pair. A CPU adapter stays per token: there its
    /// barriers cost more than the weight reads it saves (lavapipe, 512-token prefill of a
    /// 64-expert top-8 model: 30.6 against 34.4 tokens/s, docs/measured.md). Both paths give
    /// the same bits.
    pub moe_grouped: bool,
    /// Whether random sampling draws on the GPU (`kernels::sampling`, only the token id read
    /// back): on GPUs, where it spares reading a 1 MiB logits row a token (Gemma's 262,144
    /// vocabulary) to the host. A CPU adapter reads the row and samples on the CPU: there the
    /// kernel's passes over the row (one workgroup, one host thread) cost more than the copy
    /// (lavapipe, Gemma 3 270M: the kernel 17 ms a token at temperature 0.8, 31 ms with top-p
    /// 0.95; the row's copy and the CPU sampler together about 2 ms, docs/measured.md). Both
    /// draw by the same rules; greedy picks the argmax on the GPU on every adapter.
    pub gpu_sampling: bool,
}

/// Which family of kernel variants to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelFamily {
    /// Chosen from the device's capabilities ([`KernelConfig::choose`]).
    #[default]
    Auto,
    /// The variants a discrete GPU selects (tiled linear, workgroup attention), whatever the
    /// device: lets tests run them end to end on a CPU adapter.
    Gpu,
}

impl KernelConfig {
    /// [`KernelConfig::choose`], then `family` forced.
    pub fn choose_family(caps: &Capabilities, family: KernelFamily) -> Self {
        let auto = Self::choose(caps);
        match family {
            KernelFamily::Auto => auto,
            KernelFamily::Gpu => {
                let linear = LinearVariant::Gpu;
                KernelConfig {
                    linear,
                    lanes_attention: false,
                    lanes_norm: false,
                    moe_grouped: true,
                    gpu_sampling: true,
                    ..auto
                }
            }
        }
    }

    /// 64-bit lane loads where the adapter has 64-bit integers and the host no AVX-512: on the
    /// AVX-512 Xeon 32-bit components read int8 KV 0.85–0.93× and the linear inputs 0.92–0.96×
    /// the time; on the AVX2-only EPYC each lane's load spilled its vector, so there the fewer
    /// 64-bit components paid (DESIGN.md, "Traps").
    pub fn lane_loads(caps: &Capabilities) -> LaneLoads {
        if caps.shader_int64 && !caps.host_avx512 {
            LaneLoads::Words64
        } else {
            LaneLoads::Words32
        }
    }

    /// Keys per partition of the lanes attention family, from the host's threads (llvmpipe's
    /// workers): a decode workgroup's fixed work (the queries' loads, the partials' stores,
    /// decode_reduce's merge per partition) cost more than 64 keys on the 2-thread Xeon, where
    /// 256 took SmolLM2's decode attention at 4096 keys from 0.99–1.08 to 0.89–0.95 ms
    /// (docs/measured.md); more threads need more workgroups to share a short context, so 128 up to 4
    /// threads and the workgroup family's 64 past that (neither measured).
    pub fn lane_partition(host_threads: u32) -> u32 {
        match host_threads {
            0..=2 => 4 * attention::PARTITION,
            3..=4 => 2 * attention::PARTITION,
            _ => attention::PARTITION,
        }
    }

    /// Keys per partition of an attention family (WGSL `PART`): fixed for a device, so results
    /// never depend on the batch. The workgroup family's is its workgroup size
    /// ([`attention::PARTITION`]); every family's is whole `PARTITION`s.
    pub fn partition_keys(&self, variant: AttentionVariant) -> u32 {
        match variant {
            AttentionVariant::Workgroup => attention::PARTITION,
            AttentionVariant::Lanes => self.lane_partition,
        }
    }

    /// The one place where kernel variants are chosen from device capabilities.
    pub fn choose(caps: &Capabilities) -> Self {
        let subgroup_linear = caps.is_cpu && linear::can_run_subgroup(caps);
        let lanes_attention = caps.is_cpu && attention::can_run_lanes(caps);
        let linear = if subgroup_linear { LinearVariant::Subgroup } else { LinearVariant::Gpu };
        KernelConfig {
            max_binding_bytes: caps.max_storage_buffer_binding_size.min(caps.max_buffer_size),
            workgroup_memory: caps.max_compute_workgroup_storage_size,
            linear,
            split_k: !caps.is_cpu,
            lanes_attention,
            lanes_norm: caps.is_cpu && rms_norm::can_run_lanes(caps),
            lanes_rotate: rotate::can_run_lanes(caps),
            lane_loads: Self::lane_loads(caps),
            lane_partition: Self::lane_partition(caps.host_threads),
            moe_grouped: !caps.is_cpu,
            gpu_sampling: !caps.is_cpu,
        }
    }

    /// Whether a sub-layer's projections RMSNorm their input as they load it
    /// (`shaders/linear/linear.wgsl`) instead of after a separate rms_norm dispatch: where
    /// the linear variant can ([`linear::norms_on_load`]).
    pub fn norm_on_load(&self) -> bool {
        linear::norms_on_load(self.linear)
    }

    /// The RMSNorm variant.
    pub fn norm(&self) -> NormVariant {
        if self.lanes_norm {
            NormVariant::Lanes
        } else {
            NormVariant::Workgroup
        }
    }

    /// The rotation variant for a head size.
    pub fn rotate(&self, head_dim: u32) -> RotateVariant {
        if self.lanes_rotate && rotate::lanes_serve(head_dim) {
            RotateVariant::Lanes
        } else {
            RotateVariant::Invocation
        }
    }

    /// The attention variant for a head size.
    pub fn attention(&self, head_dim: u32) -> AttentionVariant {
        self.attention_for(&[head_dim])
    }

    /// The attention variant of a model whose layers have heads of these sizes: the one that
    /// serves all of them (the lanes family serves 64, 128 and 256 only; the workgroup family
    /// every size), so that every layer takes one step's prefill tiles
    /// ([`attention::model_query_tile`]).
    pub fn attention_for(&self, head_dims: &[u32]) -> AttentionVariant {
        if self.lanes_attention && head_dims.iter().all(|&hd| attention::lanes_serve(hd)) {
            AttentionVariant::Lanes
        } else {
            AttentionVariant::Workgroup
        }
    }
}

/// The kernels of one device: configuration and compiled pipelines.
pub struct Kernels {
    pub config: KernelConfig,
    cache: PipelineCache<PipelineKey>,
}

impl Kernels {
    pub fn new(gpu: &Gpu) -> Self {
        Self::with_config(KernelConfig::choose(&gpu.caps))
    }

    /// Kernels with an explicit configuration (tests force each variant this way).
    pub fn with_config(config: KernelConfig) -> Self {
        Kernels { config, cache: PipelineCache::default() }
    }

    /// The pipeline for `key` (any family's key), compiled on first use.
    pub fn pipeline(&self, gpu: &Gpu, key: impl Into<PipelineKey>) -> Arc<Pipeline> {
        let key = key.into();
        self.cache.get(gpu, key, || source::spec(key))
    }
}

/// Workgroup count for `n` items at `per_group` items per workgroup.
pub fn groups(n: u32, per_group: u32) -> u32 {
    n.div_ceil(per_group)
}

/// A grid of `n` workgroups: along x up to `limit`, the rest folded into y. The shader numbers
/// its workgroup `wid.x + wid.y * num_workgroups.x` and skips numbers from `n` on (the last
/// y row may be partial).
pub fn grid_2d(n: u32, limit: u32) -> [u32; 3] {
    let x = n.min(limit).max(1);
    [x, n.div_ceil(x), 1]
}

/// Fails loudly when a dispatch would exceed the per-dimension workgroup limit.
#[track_caller]
pub fn check_grid(grid: [u32; 3], limit: u32) {
    assert!(
        grid.iter().all(|&g| g <= limit),
        "dispatch grid {grid:?} exceeds the device limit of {limit} workgroups per dimension"
    );
}

/// Mirror of the WGSL params of the kernels that run one workgroup a logit row (argmax,
/// logprob, sampling): the vocabulary.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct VocabParams {
    pub vocab: u32,
    pub _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<VocabParams>() == 16);

/// A kernel that runs one workgroup a logit row (argmax, logprob, sampling): its pipeline, its
/// bind group (the step's `StepInfo`, a [`VocabParams`] uniform, then the kernel's buffers)
/// and its dispatch.
pub struct RowDispatch {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    wg_limit: u32,
}

impl RowDispatch {
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        key: impl Into<PipelineKey>,
        label: &str,
        step: &wgpu::Buffer,
        vocab: u32,
        buffers: &[&wgpu::Buffer],
    ) -> Self {
        let pipeline = kernels.pipeline(gpu, key);
        let params = VocabParams { vocab, _pad: [0; 3] };
        let ubuf = gpu.uniform_buffer_init(label, bytemuck::bytes_of(&params));
        let mut all = vec![step, &ubuf];
        all.extend_from_slice(buffers);
        let bind_group = pipeline.bind_group(gpu, label, &all);
        RowDispatch {
            bind_group,
            pipeline,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    /// Records the dispatch over `rows` logit rows (nothing for 0); returns the dispatches made.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, rows: u32) -> u32 {
        if rows == 0 {
            return 0;
        }
        let grid = grid_2d(rows, self.wg_limit);
        check_grid(grid, self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        1
    }
}

/// Records one dispatch of `pipeline` with 64-wide workgroups over `per_token` invocations
/// (x) for each token of the step (y), the grid of the elementwise kernels (RoPE, KV write,
/// GLU, rotation); nothing for a step without tokens. Returns the dispatches made.
pub fn record_per_token(
    pass: &mut wgpu::ComputePass<'_>,
    pipeline: &Pipeline,
    bind_group: &wgpu::BindGroup,
    per_token: u32,
    shape: &StepShape,
    wg_limit: u32,
) -> u32 {
    if shape.num_tokens == 0 {
        return 0;
    }
    let grid = [groups(per_token, 64), shape.num_tokens, 1];
    check_grid(grid, wg_limit);
    pass.set_pipeline(&pipeline.pipeline);
    pass.set_bind_group(0, bind_group, &[]);
    pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
    1
}
