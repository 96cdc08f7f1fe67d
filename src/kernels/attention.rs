//! Host half of the paged attention kernels (`shaders/attention/`): decode (split-K partials +
//! reduce) and prefill, in two families ([`AttentionVariant`]). All of a family's kernels share
//! the arithmetic of `shaders/common/attention.wgsl`, so a token's output does not depend on
//! which kernel computed it.
//!
//! One kernel body per family and phase serves every pool: a KV reader snippet prepended
//! before it ([`KvReader`]: `shaders/common/kv_read_f16.wgsl` or `kv_read_quant.wgsl` for the
//! workgroup family, `kv_read_lanes_f16.wgsl` or `kv_quant_lanes.wgsl` for the lanes family)
//! binds the pools and says how a key and a value are read (`fresh_from`, `k_pair`, …), so
//! f16 and quantized KV differ only in that snippet and one binding list serves both.

use std::num::NonZeroU32;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::kv_quantize::{KvQuantKey, KvQuantLayout};
use super::rope::QkvLayout;
use super::source::{kv_snippet, KV_CODEC, STEP, U64};
use super::{check_grid, Kernel, KernelConfig, KernelFeatures, Kernels, LaneLoads, StepShape};
use crate::gpu::{BindingKind, Capabilities, Gpu, Pipeline};
use crate::quant::ScaleGranularity;

/// How the attention kernels split their work. Decode and prefill of one variant share their
/// arithmetic exactly; the two variants differ in the order of the score sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum AttentionVariant {
    /// A workgroup of 64 per (partition | query tile), scores and weights in workgroup memory.
    Workgroup,
    /// CPU adapters: one subgroup of exactly 8 lanes per query head, each lane holding
    /// head_dim / 8 channels; no workgroup memory, no barriers. head_dim 64, 128 or 256
    /// ([`lanes_serve`]).
    Lanes,
}

/// Whether the device can run [`AttentionVariant::Lanes`]: subgroups of exactly 8 lanes.
pub fn can_run_lanes(caps: &Capabilities) -> bool {
    super::rms_norm::can_run_lanes(caps)
}

/// The smallest partition of any family (the workgroup family's;
/// [`KernelConfig::partition_keys`]): the partials buffer's capacity and
/// `StepShape::max_decode_partitions` count in it, which bounds the partitions of every family.
pub const PARTITION: u32 = 64;
/// Largest head size the attention kernels serve: Gemma 4's global heads (512) and DeepSeek's
/// MLA latent (512 + 64). The workgroup family holds `query_tile` / `heads_per_workgroup` heads
/// of it in 2048 floats of workgroup memory (3 at 576) and each invocation at most 16 output
/// pairs of a tile (3 × 288 / 64 = 13.5); the lanes family serves 64, 128 and 256 only
/// ([`lanes_serve`]), so wider heads take the workgroup family on every adapter.
pub const MAX_HEAD_DIM: u32 = 576;

/// Mirror of WGSL `AttnParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct AttnParams {
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub block_size: u32,
    pub qkv_stride: u32,
    pub q_offset: u32,
    pub out_stride: u32,
    pub heads_per_wg: u32,
    pub max_partitions: u32,
    pub scale: f32,
    /// Quantized KV only (0 for f16): where the step's own K and V rows are in qkv, and the
    /// pool and staging geometry ([`KvQuantLayout`]).
    pub k_offset: u32,
    pub v_offset: u32,
    pub stage_slots: u32,
    pub k_head_block_words: u32,
    pub v_head_block_words: u32,
    pub k_data_words: u32,
    pub v_data_words: u32,
    /// Sliding window W: a query at position p sees keys (p − W, p]; 0 = full causal.
    pub window: u32,
    /// KV heads a pool block has room for ([`QkvLayout::pool_heads`]).
    pub pool_heads: u32,
    /// The layer's first pool head ([`QkvLayout::pool_head_base`]).
    pub pool_head_base: u32,
    /// 1: `sinks` holds each query head's attention sink logit (gpt-oss); 0: no sinks.
    pub sinks_on: u32,
    /// Query head h's sink logit at `[h / 4][h % 4]` (up to [`MAX_SINK_HEADS`] heads).
    pub sinks: [[f32; 4]; 32],
}
const _: () = assert!(std::mem::size_of::<AttnParams>() == 80 + 512);

/// Most query heads a layer with attention sinks may have (WGSL `AttnParams::sinks`); the
/// loader refuses a model with more by name.
pub const MAX_SINK_HEADS: u32 = 128;
const _: () = assert!(MAX_SINK_HEADS as usize == crate::loader::MAX_SINK_HEADS);

/// Binding order of both decode partials kernels (`decode_partials.wgsl`,
/// `decode_partials_lanes.wgsl`), over any pool: bindings 3–5 are the KV reader's.
pub const DECODE_PARTIALS_BINDINGS: [BindingKind; 9] = [
    BindingKind::Uniform,     // step: StepInfo
    BindingKind::Uniform,     // p: AttnParams
    BindingKind::StorageRead, // qkv: [tokens, qkv_stride]
    BindingKind::StorageRead, // k_pool: f16 [blocks, kv_heads, block_size, head_dim / 2] f16x2,
    //                                quantized [blocks, kv_heads, k_head_block_words]
    BindingKind::StorageRead, // v_pool: as k_pool (v_head_block_words)
    BindingKind::StorageRead, // stage: quantized [2, stage_slots, kv_heads, block_size,
    //                                head_dim / 2] f16x2; f16: the K pool again, unread
    BindingKind::StorageRead,      // seqs: [num_seqs] SeqInfo
    BindingKind::StorageRead,      // block_tables: concatenated
    BindingKind::StorageReadWrite, // partials: [decode_seqs, num_heads, max_partitions, head_dim + 2]
];

/// Binding order of `decode_reduce.wgsl`.
pub const DECODE_REDUCE_BINDINGS: [BindingKind; 5] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: AttnParams
    BindingKind::StorageRead,      // partials
    BindingKind::StorageRead,      // seqs
    BindingKind::StorageReadWrite, // out: [tokens, out_stride]
];

/// Binding order of both prefill kernels (`prefill.wgsl`, `prefill_lanes.wgsl`), over any
/// pool: bindings 3–5 are the KV reader's, as [`DECODE_PARTIALS_BINDINGS`].
pub const PREFILL_BINDINGS: [BindingKind; 10] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: AttnParams
    BindingKind::StorageRead,      // qkv
    BindingKind::StorageRead,      // k_pool
    BindingKind::StorageRead,      // v_pool
    BindingKind::StorageRead,      // stage
    BindingKind::StorageRead,      // seqs
    BindingKind::StorageRead,      // block_tables
    BindingKind::StorageRead,      // tiles
    BindingKind::StorageReadWrite, // out: [tokens, out_stride]
];

/// Query tokens per prefill tile: the lane variant takes one per lane; the workgroup variant
/// fills 2048 floats of workgroup memory with them.
pub fn query_tile(variant: AttentionVariant, head_dim: u32) -> u32 {
    match variant {
        AttentionVariant::Lanes => 8,
        AttentionVariant::Workgroup => (2048 / head_dim).min(16),
    }
}

/// Query tokens per prefill tile of every layer of a model whose heads have these sizes: the
/// tile of the widest in the family that serves them all (`KernelConfig::attention_for`).
pub fn model_query_tile(config: &KernelConfig, head_dims: &[u32]) -> u32 {
    let widest = head_dims.iter().copied().max().expect("a model has a head size");
    query_tile(config.attention_for(head_dims), widest)
}

/// Query heads of one KV group handled by one decode workgroup: the workgroup variant fills
/// 2048 floats of workgroup memory with their queries; the lanes variant keeps at most
/// `LANE_HEADS` (4, `shaders/common/decode_lanes.wgsl`) in registers.
pub fn heads_per_workgroup(variant: AttentionVariant, group: u32, head_dim: u32) -> u32 {
    match variant {
        AttentionVariant::Workgroup => group.min(16).min(2048 / head_dim).max(1),
        AttentionVariant::Lanes => group.clamp(1, LANE_HEADS),
    }
}

/// The `slice_heads` of a decode pipeline ([`AttnKey::decode`]): for the lanes
/// variant the most query heads one subgroup's slice has ([`heads_per_workgroup`]), so the
/// kernel's per-head steps past it are compiled out; the workgroup variant takes none (0).
pub fn slice_heads(variant: AttentionVariant, heads_per_wg: u32) -> u32 {
    match variant {
        AttentionVariant::Workgroup => 0,
        AttentionVariant::Lanes => heads_per_wg,
    }
}

/// How a pipeline reads the KV pool: the lanes variant over a quantized pool as the config's
/// [`KernelConfig::lane_loads`] (WGSL `common/kv_pool_lanes_u32.wgsl` or `_u64.wgsl`); every
/// other kernel reads its pool one way, and takes `Words32`.
pub fn pool_loads(variant: AttentionVariant, quantized: bool, config: &KernelConfig) -> LaneLoads {
    match variant {
        AttentionVariant::Lanes if quantized => config.lane_loads,
        _ => LaneLoads::Words32,
    }
}

/// Whether the lanes variant serves a head size: 8 × WPL channels a lane, WPL (WGSL, vec4<u32>
/// of 8 f16 a lane per row) 1, 2 or 4 (`shaders/common/attention_lanes.wgsl`).
pub fn lanes_serve(head_dim: u32) -> bool {
    matches!(head_dim, 64 | 128 | 256)
}

/// Most query heads one lanes-variant decode subgroup serves (WGSL `LANE_HEADS`).
pub const LANE_HEADS: u32 = 4;

/// Partitions of [`PARTITION`] keys needed for `ctx_len` keys: at least those of any family.
pub fn partitions(ctx_len: u32) -> u32 {
    ctx_len.div_ceil(PARTITION)
}

/// Bytes of the decode partials buffer.
pub fn partials_bytes(
    max_decode_seqs: u32,
    num_heads: u32,
    max_partitions: u32,
    head_dim: u32,
) -> u64 {
    u64::from(max_decode_seqs)
        * u64::from(num_heads)
        * u64::from(max_partitions)
        * u64::from(head_dim + 2)
        * 4
}

/// Every partition size an attention pipeline can get ([`KernelConfig::partition_keys`]): the
/// workgroup family's first, then every other [`KernelConfig::lane_partition`] picks for some
/// host.
pub fn partition_sizes() -> Vec<u32> {
    let mut parts = vec![PARTITION];
    for threads in 0..=64 {
        let part = KernelConfig::lane_partition(threads);
        if !parts.contains(&part) {
            parts.push(part);
        }
    }
    parts
}

/// Which pass of attention a pipeline computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnPhase {
    /// Decode partials: one partition of a decode sequence's keys for a slice of query heads.
    Decode,
    /// Prefill: a tile of query tokens over all their keys.
    Prefill,
}

/// A decode partials or prefill pipeline: the phase, the family, the head size, the pool's KV
/// reader and the family's sizes. [`AttnKey::decode`] and [`AttnKey::prefill`] set each field
/// as the phase and family use it (unused ones fixed), so one configuration has one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttnKey {
    pub phase: AttnPhase,
    pub variant: AttentionVariant,
    pub head_dim: u32,
    /// The pool: `None` f16, `Some` quantized (the reader dequantizes in its loads).
    pub kv: Option<KvQuantKey>,
    /// How the lanes family reads a quantized pool ([`pool_loads`]); `Words32` elsewhere.
    pub loads: LaneLoads,
    /// Keys per partition ([`KernelConfig::partition_keys`], WGSL `PART`).
    pub part: u32,
    /// Lanes decode: the most query heads one subgroup's slice has ([`slice_heads`], WGSL
    /// `SLICE_HEADS`); 0 elsewhere.
    pub slice_heads: u32,
    /// Prefill: query tokens per tile ([`query_tile`]; WGSL `QT` of the workgroup family, a
    /// lane each in the lanes family); 0 for decode.
    pub query_tile: u32,
    /// Decode: the one-pass kernel (WGSL `ONE_PASS`), which writes the normalised output
    /// where every window of the step lies in one partition ([`AttentionOp::record`]
    /// chooses it per step) and needs no reduce; false for the split-K partials and prefill.
    pub one_pass: bool,
}

impl AttnKey {
    /// The decode partials pipeline of a layer whose decode workgroups serve `heads_per_wg`
    /// query heads ([`heads_per_workgroup`]).
    pub fn decode(
        config: &KernelConfig,
        head_dim: u32,
        kv: Option<KvQuantKey>,
        heads_per_wg: u32,
    ) -> Self {
        Self::decode_in(config.attention(head_dim), config, head_dim, kv, heads_per_wg)
    }

    /// [`AttnKey::decode`] in the given family.
    fn decode_in(
        variant: AttentionVariant,
        config: &KernelConfig,
        head_dim: u32,
        kv: Option<KvQuantKey>,
        heads_per_wg: u32,
    ) -> Self {
        AttnKey {
            phase: AttnPhase::Decode,
            variant,
            head_dim,
            kv,
            loads: pool_loads(variant, kv.is_some(), config),
            part: config.partition_keys(variant),
            slice_heads: slice_heads(variant, heads_per_wg),
            query_tile: 0,
            one_pass: false,
        }
    }

    /// The prefill pipeline of a layer.
    pub fn prefill(config: &KernelConfig, head_dim: u32, kv: Option<KvQuantKey>) -> Self {
        let variant = config.attention(head_dim);
        Self::prefill_in(variant, config, head_dim, kv, query_tile(variant, head_dim))
    }

    /// [`AttnKey::prefill`] in the given family with `query_tile` queries a tile.
    fn prefill_in(
        variant: AttentionVariant,
        config: &KernelConfig,
        head_dim: u32,
        kv: Option<KvQuantKey>,
        query_tile: u32,
    ) -> Self {
        AttnKey {
            phase: AttnPhase::Prefill,
            variant,
            head_dim,
            kv,
            loads: pool_loads(variant, kv.is_some(), config),
            part: config.partition_keys(variant),
            slice_heads: 0,
            query_tile,
            one_pass: false,
        }
    }

    /// The KV reader snippets of the key's pool and family (the interface they share:
    /// `shaders/common/kv_read_f16.wgsl`, `kv_read_lanes_f16.wgsl`).
    fn reader(&self) -> Vec<&'static str> {
        let Some(kv) = self.kv else {
            return vec![match self.variant {
                AttentionVariant::Workgroup => KV_READ_F16,
                AttentionVariant::Lanes => KV_READ_LANES_F16,
            }];
        };
        let mut parts = vec![KV_CODEC, kv_snippet(kv.format), KV_QUANT];
        match (self.variant, self.loads) {
            (AttentionVariant::Workgroup, _) => parts.push(KV_READ_QUANT),
            (AttentionVariant::Lanes, LaneLoads::Words32) => {
                parts.extend([KV_POOL_LANES_U32, KV_QUANT_LANES])
            }
            (AttentionVariant::Lanes, LaneLoads::Words64) => {
                parts.extend([U64, KV_POOL_LANES_U64, KV_QUANT_LANES])
            }
        }
        parts
    }
}

/// `shaders/common/` snippets of the attention kernels only (the shared ones: [`super::source`]).
const ATTENTION: &str = include_str!("../../shaders/common/attention.wgsl");
const ATTENTION_WORKGROUP: &str = include_str!("../../shaders/common/attention_workgroup.wgsl");
const ATTENTION_LANES: &str = include_str!("../../shaders/common/attention_lanes.wgsl");
const DECODE_LANES: &str = include_str!("../../shaders/common/decode_lanes.wgsl");
const PREFILL_LANES: &str = include_str!("../../shaders/common/prefill_lanes.wgsl");
const KV_READ_F16: &str = include_str!("../../shaders/common/kv_read_f16.wgsl");
const KV_READ_QUANT: &str = include_str!("../../shaders/common/kv_read_quant.wgsl");
const KV_READ_LANES_F16: &str = include_str!("../../shaders/common/kv_read_lanes_f16.wgsl");
const KV_QUANT: &str = include_str!("../../shaders/common/kv_quant.wgsl");
const KV_QUANT_LANES: &str = include_str!("../../shaders/common/kv_quant_lanes.wgsl");
const KV_POOL_LANES_U32: &str = include_str!("../../shaders/common/kv_pool_lanes_u32.wgsl");
const KV_POOL_LANES_U64: &str = include_str!("../../shaders/common/kv_pool_lanes_u64.wgsl");

impl Kernel for AttnKey {
    /// The family's shared snippets, the KV reader, the family's phase helpers, the body.
    fn parts(&self) -> Vec<&'static str> {
        let mut parts = vec![STEP, ATTENTION];
        if self.variant == AttentionVariant::Lanes {
            parts.push(ATTENTION_LANES);
        }
        parts.extend(self.reader());
        parts.extend(match (self.variant, self.phase) {
            (AttentionVariant::Workgroup, AttnPhase::Decode) => {
                [ATTENTION_WORKGROUP, include_str!("../../shaders/attention/decode_partials.wgsl")]
            }
            (AttentionVariant::Workgroup, AttnPhase::Prefill) => {
                [ATTENTION_WORKGROUP, include_str!("../../shaders/attention/prefill.wgsl")]
            }
            (AttentionVariant::Lanes, AttnPhase::Decode) => {
                [DECODE_LANES, include_str!("../../shaders/attention/decode_partials_lanes.wgsl")]
            }
            (AttentionVariant::Lanes, AttnPhase::Prefill) => {
                [PREFILL_LANES, include_str!("../../shaders/attention/prefill_lanes.wgsl")]
            }
        });
        parts
    }

    fn constants(&self) -> Vec<(&'static str, f64)> {
        let mut c = vec![("HEAD_DIM", f64::from(self.head_dim)), ("PART", f64::from(self.part))];
        if self.phase == AttnPhase::Decode {
            c.push(("ONE_PASS", f64::from(u8::from(self.one_pass))));
        }
        match (self.variant, self.phase) {
            (AttentionVariant::Lanes, AttnPhase::Decode) => {
                c.push(("SLICE_HEADS", f64::from(self.slice_heads)))
            }
            (AttentionVariant::Workgroup, AttnPhase::Prefill) => {
                c.push(("QT", f64::from(self.query_tile)))
            }
            _ => {}
        }
        c.extend(self.kv.map(KvQuantKey::constants).into_iter().flatten());
        c
    }

    fn bindings(&self) -> Vec<BindingKind> {
        match self.phase {
            AttnPhase::Decode => DECODE_PARTIALS_BINDINGS.to_vec(),
            AttnPhase::Prefill => PREFILL_BINDINGS.to_vec(),
        }
    }

    /// The lanes family needs subgroups, and 64-bit integers where it reads a quantized pool
    /// as `u64` ([`LaneLoads::Words64`]).
    fn features(&self) -> KernelFeatures {
        let lanes = self.variant == AttentionVariant::Lanes;
        let u64_pool = lanes && self.kv.is_some() && self.loads == LaneLoads::Words64;
        KernelFeatures { subgroups: lanes, int64: u64_pool }
    }

    /// Both phases of both families at a spread of head sizes (decode split-K and one-pass): every quantized format with its
    /// default granularities at every head size and every valid (K, V) granularity pair at
    /// head_dim 64; the lanes decode kernels at every slice size, the lanes kernels over a
    /// quantized pool with both load widths, the workgroup family at its one partition size
    /// and the lanes family at every one; prefill also at a 512- and a 576-channel head's tile.
    fn all() -> Vec<Self> {
        let parts_all = partition_sizes();
        let mut keys = Vec::new();
        for head_dim in [16, 64, 128, 256, 512, 576] {
            for variant in [AttentionVariant::Workgroup, AttentionVariant::Lanes] {
                if variant == AttentionVariant::Lanes && !lanes_serve(head_dim) {
                    continue;
                }
                let mut kvs: Vec<Option<KvQuantKey>> = vec![None];
                kvs.extend(
                    KvQuantKey::all()
                        .into_iter()
                        .filter(|kv| {
                            head_dim == 64
                                || (kv.k == ScaleGranularity::PerChannel
                                    && kv.v == ScaleGranularity::PerToken)
                        })
                        .map(Some),
                );
                let (slices, parts) = match variant {
                    AttentionVariant::Workgroup => (0..=0, &parts_all[..1]),
                    AttentionVariant::Lanes => (1..=LANE_HEADS, &parts_all[..]),
                };
                for kv in kvs {
                    let widths: &[LaneLoads] = match (variant, kv) {
                        (AttentionVariant::Lanes, Some(_)) => {
                            &[LaneLoads::Words32, LaneLoads::Words64]
                        }
                        _ => &[LaneLoads::Words32],
                    };
                    for &loads in widths {
                        for &part in parts {
                            let key = AttnKey {
                                phase: AttnPhase::Decode,
                                variant,
                                head_dim,
                                kv,
                                loads,
                                part,
                                slice_heads: 0,
                                query_tile: 0,
                                one_pass: false,
                            };
                            for slice_heads in slices.clone() {
                                for one_pass in [false, true] {
                                    keys.push(AttnKey { slice_heads, one_pass, ..key });
                                }
                            }
                            let tile = query_tile(variant, head_dim);
                            let phase = AttnPhase::Prefill;
                            keys.push(AttnKey { phase, query_tile: tile, ..key });
                            // a narrower layer beside 512- or 576-channel heads takes their
                            // tile (AttentionOp::for_heads_of: Gemma 4)
                            for wide in [512, 576].map(|w| (w, query_tile(variant, w))) {
                                if head_dim < wide.0 && wide.1 != tile {
                                    keys.push(AttnKey { phase, query_tile: wide.1, ..key });
                                }
                            }
                        }
                    }
                }
            }
        }
        keys
    }
}

/// A decode reduce pipeline: the head size and the partials' family's partition size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReduceKey {
    pub head_dim: u32,
    /// As [`AttnKey::part`] of the decode partials it merges.
    pub part: u32,
}

impl Kernel for ReduceKey {
    fn parts(&self) -> Vec<&'static str> {
        vec![STEP, ATTENTION, include_str!("../../shaders/attention/decode_reduce.wgsl")]
    }

    fn constants(&self) -> Vec<(&'static str, f64)> {
        vec![("HEAD_DIM", f64::from(self.head_dim)), ("PART", f64::from(self.part))]
    }

    fn bindings(&self) -> Vec<BindingKind> {
        DECODE_REDUCE_BINDINGS.to_vec()
    }

    fn all() -> Vec<Self> {
        let parts = partition_sizes();
        let keys = [16, 64, 128, 256, 512, 576].map(|head_dim| {
            parts.iter().map(move |&part| ReduceKey { head_dim, part }).collect::<Vec<_>>()
        });
        keys.into_iter().flatten().collect()
    }
}

/// Buffers one attention layer reads and writes.
pub struct AttentionIo<'a> {
    pub step: &'a wgpu::Buffer,
    pub qkv: &'a wgpu::Buffer,
    pub k_pool: &'a wgpu::Buffer,
    pub v_pool: &'a wgpu::Buffer,
    pub seqs: &'a wgpu::Buffer,
    pub block_tables: &'a wgpu::Buffer,
    pub prefill_tiles: &'a wgpu::Buffer,
    pub partials: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
    /// A quantized pool: its geometry and the layer's staging buffer; `None` for f16 (the K
    /// pool is bound in the staging buffer's place, unread).
    pub kv_quant: Option<KvQuantIo<'a>>,
    /// Each query head's attention sink logit (gpt-oss: one more term `exp(sink − m)` in the
    /// softmax's denominator, with no value); `None`: no sinks. At most [`MAX_SINK_HEADS`].
    pub sinks: Option<&'a [f32]>,
}

/// What the attention kernels need of a quantized pool besides the K and V buffers.
#[derive(Clone, Copy)]
pub struct KvQuantIo<'a> {
    pub layout: KvQuantLayout,
    /// `[2, stage_slots, kv_heads, block_size, head_dim / 2]` f16x2
    pub stage: &'a wgpu::Buffer,
}

/// One layer's attention: decode and prefill bind groups over the layer's KV pool.
pub struct AttentionOp {
    partials_bg: wgpu::BindGroup,
    reduce_bg: wgpu::BindGroup,
    /// The one-pass decode kernel's: the partials' bindings with the output in the last.
    one_pass_bg: wgpu::BindGroup,
    prefill_bg: wgpu::BindGroup,
    partials_pl: Arc<Pipeline>,
    reduce_pl: Arc<Pipeline>,
    one_pass_pl: Arc<Pipeline>,
    prefill_pl: Arc<Pipeline>,
    num_heads: u32,
    decode_y: u32,
    wg_limit: u32,
    /// Decode partitions a query's window spans at most (`window_partitions`); `None` for full
    /// attention.
    window_partitions: Option<u32>,
    /// The family's partition in [`PARTITION`]s (`partition_keys` / `PARTITION`).
    part_units: u32,
}

/// Partitions of `part` keys that the keys (p − W, p] of a window W span at most:
/// ⌈(W − 1) / part⌉ + 1. The decode kernels number partitions from the one holding the window's
/// first key, so a sliding layer launches this many per sequence, not one per `part` keys of
/// the whole context.
pub fn window_partitions(window: u32, part: u32) -> u32 {
    window.saturating_sub(1).div_ceil(part) + 1
}

impl AttentionOp {
    /// Whether the layer attends through a sliding window (timings report it apart).
    pub fn is_windowed(&self) -> bool {
        self.window_partitions.is_some()
    }

    /// `window`: the layer's sliding window W (a query at position p attends to keys
    /// (p − W, p], exactly as HF); `None` for full causal attention. The kernels read no block
    /// table entry and no pool block for a position before a query's window, so the KV manager
    /// may free those blocks (a null table entry) and reuse them. `scale` multiplies the
    /// scores before the softmax (`ModelConfig::attention_scale`: 1/√head_dim for most models).
    /// With `layout.values_in_keys` (MLA) pass the K pool as `io.v_pool` too: the values are
    /// read from the keys' first channels and the output has the keys' width.
    #[track_caller]
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        layout: QkvLayout,
        block_size: u32,
        max_partitions: u32,
        window: Option<NonZeroU32>,
        scale: f32,
        io: AttentionIo<'_>,
    ) -> Self {
        let args = (block_size, max_partitions, window, scale);
        Self::for_heads_of(gpu, kernels, layout, &[layout.head_dim], args, io)
    }

    /// [`AttentionOp::new`] for a layer of a model whose layers have heads of `model_head_dims`
    /// (Gemma 4: 256 and 512): the family that serves them all
    /// (`KernelConfig::attention_for`) and the prefill tile of the widest
    /// ([`model_query_tile`]), so that every layer takes one step's prefill tiles
    /// (`Model::query_tile`).
    #[track_caller]
    pub fn for_heads_of(
        gpu: &Gpu,
        kernels: &Kernels,
        layout: QkvLayout,
        model_head_dims: &[u32],
        (block_size, max_partitions, window, scale): (u32, u32, Option<NonZeroU32>, f32),
        io: AttentionIo<'_>,
    ) -> Self {
        let hd = layout.head_dim;
        let mut head_dims = model_head_dims.to_vec();
        head_dims.push(hd);
        assert!(
            hd.is_multiple_of(2) && hd <= MAX_HEAD_DIM,
            "head_dim {hd} must be even and at most {MAX_HEAD_DIM}"
        );
        assert!(
            layout.num_heads.is_multiple_of(layout.num_kv_heads),
            "query heads must be a multiple of KV heads"
        );
        let group = layout.num_heads / layout.num_kv_heads;
        let config = &kernels.config;
        let variant = config.attention_for(&head_dims);
        let heads_per_wg = heads_per_workgroup(variant, group, hd);
        let q = io.kv_quant.map(|q| q.layout);
        if let (true, Some(q)) = (layout.values_in_keys, q) {
            assert!(
                q.k_head_block_words == q.v_head_block_words && q.k_data_words == q.v_data_words,
                "values in the keys (MLA) need one quantization for K and V"
            );
        }
        if q.is_some() {
            assert!(hd.is_multiple_of(8), "quantized KV needs head_dim a multiple of 8, got {hd}");
        }
        let mut sinks = [[0f32; 4]; 32];
        if let Some(s) = io.sinks {
            assert!(
                s.len() == layout.num_heads as usize && s.len() <= MAX_SINK_HEADS as usize,
                "{} sinks for {} query heads (at most {MAX_SINK_HEADS})",
                s.len(),
                layout.num_heads
            );
            for (h, v) in s.iter().enumerate() {
                sinks[h / 4][h % 4] = *v;
            }
        }
        let params = AttnParams {
            num_heads: layout.num_heads,
            num_kv_heads: layout.num_kv_heads,
            block_size,
            qkv_stride: layout.stride(),
            q_offset: 0,
            out_stride: layout.num_heads * hd,
            heads_per_wg,
            max_partitions,
            scale,
            k_offset: layout.k_offset(),
            v_offset: layout.v_offset(),
            stage_slots: q.map_or(0, |q| q.stage_slots),
            k_head_block_words: q.map_or(0, |q| q.k_head_block_words),
            v_head_block_words: q.map_or(0, |q| q.v_head_block_words),
            k_data_words: q.map_or(0, |q| q.k_data_words),
            v_data_words: q.map_or(0, |q| q.v_data_words),
            window: window.map_or(0, NonZeroU32::get),
            pool_heads: layout.pool_heads,
            pool_head_base: layout.pool_head_base,
            sinks_on: u32::from(io.sinks.is_some()),
            sinks,
        };
        let ubuf = gpu.uniform_buffer_init("attention", bytemuck::bytes_of(&params));
        let kv = q.map(|q| q.key);
        let decode = AttnKey::decode_in(variant, config, hd, kv, heads_per_wg);
        let part = decode.part;
        let partials_pl = kernels.pipeline(gpu, decode);
        let one_pass_pl = kernels.pipeline(gpu, AttnKey { one_pass: true, ..decode });
        let reduce_pl = kernels.pipeline(gpu, ReduceKey { head_dim: hd, part });
        let tile = model_query_tile(config, &head_dims);
        let prefill_pl = kernels.pipeline(gpu, AttnKey::prefill_in(variant, config, hd, kv, tile));
        // the KV reader's three bindings: an f16 pool has no staging, the K pool stands in
        let stage = io.kv_quant.map_or(io.k_pool, |q| q.stage);
        let pools = [io.k_pool, io.v_pool, stage];
        let mut partials_bufs = vec![io.step, &ubuf, io.qkv];
        partials_bufs.extend(pools);
        partials_bufs.extend([io.seqs, io.block_tables, io.partials]);
        let partials_bg = partials_pl.bind_group(gpu, "attention decode partials", &partials_bufs);
        *partials_bufs.last_mut().expect("bindings") = io.out;
        let one_pass_bg = one_pass_pl.bind_group(gpu, "attention decode one pass", &partials_bufs);
        let reduce_bg = reduce_pl.bind_group(
            gpu,
            "attention decode reduce",
            &[io.step, &ubuf, io.partials, io.seqs, io.out],
        );
        let mut prefill_bufs = vec![io.step, &ubuf, io.qkv];
        prefill_bufs.extend(pools);
        prefill_bufs.extend([io.seqs, io.block_tables, io.prefill_tiles, io.out]);
        let prefill_bg = prefill_pl.bind_group(gpu, "attention prefill", &prefill_bufs);
        AttentionOp {
            partials_bg,
            reduce_bg,
            one_pass_bg,
            prefill_bg,
            partials_pl,
            reduce_pl,
            one_pass_pl,
            prefill_pl,
            num_heads: layout.num_heads,
            // slices of one KV group's query heads, one read of each key per slice
            decode_y: layout.num_kv_heads * group.div_ceil(heads_per_wg),
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
            window_partitions: window.map(|w| window_partitions(w.get(), part)),
            part_units: part / PARTITION,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        let mut dispatches = 0;
        if shape.num_decode_seqs > 0 {
            // ⌈⌈ctx / PARTITION⌉ / units⌉ = ⌈ctx / part⌉
            let full = shape.max_decode_partitions.div_ceil(self.part_units);
            let parts = self.window_partitions.map_or(full, |w| w.min(full));
            let grid = [parts, self.decode_y, shape.num_decode_seqs];
            check_grid(grid, self.wg_limit);
            if parts == 1 {
                // every window of the step in one partition: one dispatch writes the output
                // (the same bits as partials + reduce, whose merge of one partition is exact)
                pass.set_pipeline(&self.one_pass_pl.pipeline);
                pass.set_bind_group(0, &self.one_pass_bg, &[]);
                pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
                dispatches += 1;
            } else {
                dispatches += 2;
                self.record_split(pass, grid, shape.num_decode_seqs);
            }
        }
        if shape.num_prefill_tiles > 0 {
            let grid = [shape.num_prefill_tiles, self.num_heads, 1];
            check_grid(grid, self.wg_limit);
            pass.set_pipeline(&self.prefill_pl.pipeline);
            pass.set_bind_group(0, &self.prefill_bg, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
            dispatches += 1;
        }
        dispatches
    }

    /// Split-K decode: the partials over `grid`, then the reduce.
    fn record_split(&self, pass: &mut wgpu::ComputePass<'_>, grid: [u32; 3], decode_seqs: u32) {
        pass.set_pipeline(&self.partials_pl.pipeline);
        pass.set_bind_group(0, &self.partials_bg, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        let grid = [self.num_heads, decode_seqs, 1];
        check_grid(grid, self.wg_limit);
        pass.set_pipeline(&self.reduce_pl.pipeline);
        pass.set_bind_group(0, &self.reduce_bg, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
    }
}

#[cfg(test)]
mod tests {
    use super::{window_partitions, LANE_HEADS, PARTITION};

    /// The lanes decode kernels size their per-head registers with WGSL's `LANE_HEADS`; the
    /// host slices query heads by this crate's.
    #[test]
    fn lane_heads_match_the_shader() {
        let wgsl = include_str!("../../shaders/common/decode_lanes.wgsl");
        assert!(wgsl.contains(&format!("const LANE_HEADS: u32 = {LANE_HEADS}u;")));
    }

    /// The partitions the keys (p − W, p] span, over every query position and window up to a
    /// few partitions: never more than `window_partitions(W)`, and that many for some p.
    #[test]
    fn window_partitions_bound_every_query_exactly() {
        for part in [17, PARTITION] {
            for w in 1..(4 * part + 3) {
                let spans = (0..(8 * part)).map(|p| {
                    let lo = (p + 1).saturating_sub(w);
                    p / part - lo / part + 1
                });
                assert_eq!(spans.max(), Some(window_partitions(w, part)), "window {w}");
            }
        }
    }

    /// Every partition size a host can get is whole `PARTITION`s, so counts in `PARTITION`s
    /// bound them (the partials buffer, `StepShape::max_decode_partitions`), and the grid's
    /// ⌈⌈ctx / PARTITION⌉ / units⌉ is ⌈ctx / part⌉.
    #[test]
    fn partitions_are_whole_units() {
        use crate::kernels::KernelConfig;
        for threads in [0, 1, 2, 3, 4, 8, 64] {
            let part = KernelConfig::lane_partition(threads);
            assert_eq!(part % PARTITION, 0, "{threads} threads");
            for ctx in 0..(3 * part + 5) {
                let units = part / PARTITION;
                assert_eq!(ctx.div_ceil(PARTITION).div_ceil(units), ctx.div_ceil(part));
            }
        }
    }
}
