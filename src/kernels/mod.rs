//! Host half of every WGSL kernel: the `#[repr(C)]` params struct, the binding order, the
//! dispatch size and the preconditions. Each submodule pairs with a folder of `shaders/`
//! (`rope_kv_write` with one file of `shaders/rope/`, the fused RoPE + KV write).
//! [`reference`] holds the plain f32 CPU version of each kernel, the oracle of the tests.
//!
//! Pipelines are cached by [`PipelineKey`], an enum of kernel × variant; variants are chosen at
//! run time from the device's capabilities in one function, [`KernelConfig::choose`].

pub mod attention;
pub mod bandwidth;
pub mod embedding;
pub mod glu;
pub mod kv_quantize;
pub mod kv_write;
pub mod linear;
pub mod reference;
pub mod rms_norm;
pub mod rope;
pub mod rope_kv_write;
pub mod rotate;
pub mod source;
pub mod weight_textures;
pub mod weights;
#[cfg(test)]
mod weights_tests;

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use crate::gpu::{Capabilities, Gpu, Pipeline, PipelineCache};
use crate::loader::Activation;
pub use kv_quantize::{KvCodeFormat, KvQuantKey, KvQuantLayout};
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
    pub _pad: u32,
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
    pub _pad: [u32; 3],
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
}

/// How the linear kernel loads its inputs. Both variants compute the same sums (the reduction
/// is defined once, in shaders/common/weights.wgsl), so the choice only affects speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum LinearVariant {
    /// One row per invocation, inputs read by every invocation (a cache broadcast on GPUs).
    Gpu,
    /// CPU adapters: inputs loaded once per 8 lanes and shared with subgroupBroadcast, four rows
    /// per lane, two rows' weights per load (64-bit views). Needs subgroups of at least 8 lanes
    /// and 64-bit shader integers.
    Subgroup,
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

/// How the attention kernels split their work. Decode and prefill of one variant share their
/// arithmetic exactly; the two variants differ in the order of the score sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum AttentionVariant {
    /// A workgroup of 64 per (partition | query tile), scores and weights in workgroup memory.
    Workgroup,
    /// CPU adapters: one subgroup of exactly 8 lanes per query head, each lane holding
    /// head_dim / 8 channels; no workgroup memory, no barriers. head_dim 64 or 128.
    Lanes,
}

/// How the RMSNorm kernel sums a row's squares. Both give the same bits (the lane variant plays
/// the workgroup's 64 invocations, eight per lane, and its tree's levels in the same order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum NormVariant {
    /// A workgroup of 64 per row, the tree through workgroup memory (`shaders/norm/rms_norm.wgsl`).
    Workgroup,
    /// CPU adapters: one subgroup of exactly 8 lanes per row, no workgroup memory or barriers
    /// (`shaders/norm/rms_norm_lanes.wgsl`).
    Lanes,
}

/// How the Hadamard rotation of `--kv-rotate` spreads a head over invocations. Both give
/// `quant::fwht_inplace`'s bits (the same butterflies in the same order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum RotateVariant {
    /// One invocation per (head, token row), the head in a private array
    /// (`shaders/rotate/hadamard.wgsl`): any head size, any adapter.
    Invocation,
    /// One subgroup of 8 lanes per (head, token row), the last three levels by shuffles
    /// (`shaders/rotate/hadamard_lanes.wgsl`): head_dim 32 to 256, subgroups of at least 8.
    Lanes,
}

/// Tokens computed per invocation by the linear kernel (the arithmetic per token is the same,
/// so a token's result never depends on the tile). [`TokenTile::for_count`] is the one place
/// that picks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenTile {
    /// Decode-sized steps: one token per invocation, no wasted work.
    One,
    /// Prefill: several tokens per invocation share each weight load.
    Many,
    /// Long prefill chunks on the subgroup variant: twice `Many`'s tokens share each block's
    /// decoded weights.
    Wide,
}

impl TokenTile {
    /// The tiles a variant's linear kernel is built for.
    pub fn of_variant(variant: LinearVariant) -> &'static [TokenTile] {
        match variant {
            LinearVariant::Gpu => &[TokenTile::One, TokenTile::Many],
            LinearVariant::Subgroup => &[TokenTile::One, TokenTile::Many, TokenTile::Wide],
        }
    }

    /// Tokens per invocation for a variant (the GPU variant has no wide tile: as `Many`).
    pub fn tokens(self, variant: LinearVariant) -> u32 {
        match (self, variant) {
            (TokenTile::One, _) => 1,
            (TokenTile::Many | TokenTile::Wide, LinearVariant::Gpu) => 4,
            (TokenTile::Many, LinearVariant::Subgroup) => 8,
            (TokenTile::Wide, LinearVariant::Subgroup) => 16,
        }
    }

    /// The tile that suits a step with `count` token rows. The subgroup variant's wide tile
    /// costs ~0.9 × as much per token as its 8-token one on lavapipe (README "Measured"), but
    /// tiles past the last token compute copies: it takes the wide tile where
    /// `⌈count / 16⌉ · 1.8 ≤ ⌈count / 8⌉` (9–16, 25–32, 41–48 and ≥ 57 tokens).
    pub fn for_count(count: u32, variant: LinearVariant) -> Self {
        if count <= 2 {
            TokenTile::One
        } else if variant == LinearVariant::Subgroup
            && count.div_ceil(16) * 9 <= count.div_ceil(8) * 5
        {
            TokenTile::Wide
        } else {
            TokenTile::Many
        }
    }
}

/// Typed pipeline key: kernel × variant. Never a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PipelineKey {
    Linear {
        format: WeightFormat,
        variant: LinearVariant,
        tile: TokenTile,
        /// The subgroup variant's rows per weight load ([`linear::RowLoad::for_part`]); always
        /// `One` for the GPU variant.
        load: linear::RowLoad,
        /// The GPU variant's invocations per weight row ([`linear::split_groups`], WGSL
        /// `SPLIT`); always 1 for the subgroup variant.
        split: u32,
        /// The subgroup variant's x loads ([`KernelConfig::lane_loads`], WGSL
        /// `LANE_LOAD_BITS`); always `Words32` for the GPU variant.
        loads: LaneLoads,
    },
    Embedding {
        format: WeightFormat,
    },
    RmsNorm {
        variant: NormVariant,
    },
    Rope,
    KvWrite,
    /// RoPE and the f16 KV write in one dispatch.
    RopeKvWrite,
    /// Quantized KV: quantize the head blocks completed in a step.
    KvQuantize {
        kv: KvQuantKey,
    },
    /// Quantized KV: copy rows of partial blocks to staging.
    KvStage,
    /// Test kernel of the WGSL codecs (`shaders/kv_quantize/codec_test.wgsl`).
    KvCodecTest {
        format: KvCodeFormat,
    },
    /// The Hadamard rotation of `--kv-rotate`.
    Rotate {
        head_dim: u32,
        variant: RotateVariant,
    },
    /// The gated MLP activation act(gate) · up.
    Glu {
        activation: Activation,
    },
    /// A memory-bandwidth probe (`kvrun bench bandwidth`).
    Bandwidth {
        probe: bandwidth::BandwidthProbe,
        loads: bandwidth::BandwidthLoads,
    },
    /// `kv`: `None` reads an f16 pool, `Some` a quantized one (dequantization fused).
    AttnDecodePartials {
        head_dim: u32,
        variant: AttentionVariant,
        kv: Option<KvQuantKey>,
        /// The lanes variant: the most query heads a subgroup's slice has
        /// (`attention::slice_heads`), a pipeline constant; 0 for the workgroup variant.
        slice_heads: u32,
        /// How the lanes variant reads a quantized pool ([`attention::pool_loads`]).
        loads: LaneLoads,
        /// Keys per partition (`KernelConfig::partition_keys`, WGSL `PART`).
        part: u32,
    },
    AttnDecodeReduce {
        head_dim: u32,
        /// As `AttnDecodePartials::part`: the partials' family's.
        part: u32,
    },
    AttnPrefill {
        head_dim: u32,
        query_tile: u32,
        variant: AttentionVariant,
        kv: Option<KvQuantKey>,
        /// As `AttnDecodePartials::loads`.
        loads: LaneLoads,
        /// As `AttnDecodePartials::part`.
        part: u32,
    },
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
    /// (README "Measured").
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
                KernelConfig { linear, lanes_attention: false, lanes_norm: false, ..auto }
            }
        }
    }

    /// Whether the device can run `LinearVariant::Subgroup`: subgroups of at least 8 lanes,
    /// 64-bit shader integers and as many storage buffers as its bindings.
    pub fn can_run_subgroup_linear(caps: &Capabilities) -> bool {
        let storage = linear::bindings(LinearVariant::Subgroup)
            .iter()
            .filter(|b| !matches!(b, crate::gpu::BindingKind::Uniform))
            .count() as u32;
        caps.subgroups
            && caps.subgroup_min_size >= 8
            && caps.shader_int64
            && caps.max_storage_buffers_per_shader_stage >= storage
    }

    /// Whether the device can run `NormVariant::Lanes`: subgroups of exactly 8 lanes.
    pub fn can_run_lanes_norm(caps: &Capabilities) -> bool {
        caps.subgroups && caps.subgroup_min_size == 8 && caps.subgroup_max_size == 8
    }

    /// Whether the device can run `RotateVariant::Lanes`: subgroups of at least 8 lanes, so a
    /// workgroup of 8 is one subgroup.
    pub fn can_run_lanes_rotate(caps: &Capabilities) -> bool {
        caps.subgroups && caps.subgroup_min_size >= 8
    }

    /// Whether the device can run `AttentionVariant::Lanes`: subgroups of exactly 8 lanes.
    pub fn can_run_lanes_attention(caps: &Capabilities) -> bool {
        Self::can_run_lanes_norm(caps)
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
    /// 256 took SmolLM2's decode attention at 4096 keys from 0.99–1.08 to 0.89–0.95 ms (README
    /// "Measured"); more threads need more workgroups to share a short context, so 128 up to 4
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
        let subgroup_linear = caps.is_cpu && Self::can_run_subgroup_linear(caps);
        let lanes_attention = caps.is_cpu && Self::can_run_lanes_attention(caps);
        let linear = if subgroup_linear { LinearVariant::Subgroup } else { LinearVariant::Gpu };
        KernelConfig {
            max_binding_bytes: caps.max_storage_buffer_binding_size.min(caps.max_buffer_size),
            workgroup_memory: caps.max_compute_workgroup_storage_size,
            linear,
            split_k: !caps.is_cpu,
            lanes_attention,
            lanes_norm: caps.is_cpu && Self::can_run_lanes_norm(caps),
            lanes_rotate: Self::can_run_lanes_rotate(caps),
            lane_loads: Self::lane_loads(caps),
            lane_partition: Self::lane_partition(caps.host_threads),
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
        if self.lanes_attention && attention::lanes_serve(head_dim) {
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

    /// The pipeline for `key`, compiled on first use.
    pub fn pipeline(&self, gpu: &Gpu, key: PipelineKey) -> Arc<Pipeline> {
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

#[cfg(test)]
mod token_tile_tests {
    use super::{LinearVariant, TokenTile};

    /// The wide tile where its padded cost is lower, never on the GPU variant; every tile the
    /// choice can return is one the variant builds.
    #[test]
    fn for_count_picks_by_padded_cost() {
        let sub = |c| TokenTile::for_count(c, LinearVariant::Subgroup);
        for c in [1, 2] {
            assert_eq!(sub(c), TokenTile::One, "{c}");
        }
        for c in (3..=8).chain(17..=24).chain(33..=40).chain(49..=56) {
            assert_eq!(sub(c), TokenTile::Many, "{c}");
        }
        for c in (9..=16).chain(25..=32).chain(41..=48).chain(57..=4096) {
            assert_eq!(sub(c), TokenTile::Wide, "{c}");
        }
        for variant in [LinearVariant::Gpu, LinearVariant::Subgroup] {
            for c in 1..=4096 {
                let tile = TokenTile::for_count(c, variant);
                assert!(TokenTile::of_variant(variant).contains(&tile), "{variant:?} {c}");
            }
        }
        assert!(!TokenTile::of_variant(LinearVariant::Gpu).contains(&TokenTile::Wide));
    }
}
