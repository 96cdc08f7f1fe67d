//! Host half of the paged attention kernels (`shaders/attention/`): decode (split-K partials +
//! reduce) and prefill. All three share the arithmetic of `shaders/common/attention.wgsl`, so a
//! token's output does not depend on which kernel computed it.

use std::num::NonZeroU32;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::kv_quantize::KvQuantLayout;
use super::rope::QkvLayout;
use super::{
    check_grid, AttentionVariant, KernelConfig, Kernels, LaneLoads, PipelineKey, StepShape,
};
use crate::gpu::{BindingKind, Gpu, Pipeline};

/// The smallest partition of any family (the workgroup family's;
/// [`KernelConfig::partition_keys`]): the partials buffer's capacity and
/// `StepShape::max_decode_partitions` count in it, which bounds the partitions of every family.
pub const PARTITION: u32 = 64;
/// Largest head size the kernels' workgroup arrays hold.
pub const MAX_HEAD_DIM: u32 = 256;

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
    pub _pad0: u32,
    pub _pad1: u32,
    pub _pad2: u32,
}
const _: () = assert!(std::mem::size_of::<AttnParams>() == 80);

/// Binding order of `decode_partials.wgsl`.
pub const DECODE_PARTIALS_BINDINGS: [BindingKind; 8] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: AttnParams
    BindingKind::StorageRead,      // qkv: [tokens, qkv_stride]
    BindingKind::StorageRead,      // k_pool: [blocks, kv_heads, block_size, head_dim / 2] f16x2
    BindingKind::StorageRead,      // v_pool: same
    BindingKind::StorageRead,      // seqs: [num_seqs] SeqInfo
    BindingKind::StorageRead,      // block_tables: concatenated
    BindingKind::StorageReadWrite, // partials: [decode_seqs, num_heads, max_partitions, head_dim + 2]
];

/// Binding order of `decode_partials_kvq.wgsl` and `decode_partials_lanes_kvq.wgsl`.
pub const DECODE_PARTIALS_KVQ_BINDINGS: [BindingKind; 9] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: AttnParams
    BindingKind::StorageRead,      // qkv: [tokens, qkv_stride]
    BindingKind::StorageRead,      // k_pool: [blocks, kv_heads, k_head_block_words]
    BindingKind::StorageRead,      // v_pool: [blocks, kv_heads, v_head_block_words]
    BindingKind::StorageRead,      // stage: [2, stage_slots, kv_heads, block_size, head_dim / 2]
    BindingKind::StorageRead,      // seqs: [num_seqs] SeqInfo
    BindingKind::StorageRead,      // block_tables: concatenated
    BindingKind::StorageReadWrite, // partials
];

/// Binding order of `decode_reduce.wgsl`.
pub const DECODE_REDUCE_BINDINGS: [BindingKind; 5] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: AttnParams
    BindingKind::StorageRead,      // partials
    BindingKind::StorageRead,      // seqs
    BindingKind::StorageReadWrite, // out: [tokens, out_stride]
];

/// Binding order of `prefill.wgsl`.
pub const PREFILL_BINDINGS: [BindingKind; 9] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: AttnParams
    BindingKind::StorageRead,      // qkv
    BindingKind::StorageRead,      // k_pool
    BindingKind::StorageRead,      // v_pool
    BindingKind::StorageRead,      // seqs
    BindingKind::StorageRead,      // block_tables
    BindingKind::StorageRead,      // tiles: [num_prefill_tiles] (seq index, first query index)
    BindingKind::StorageReadWrite, // out: [tokens, out_stride]
];

/// Binding order of `prefill_kvq.wgsl` and `prefill_lanes_kvq.wgsl`.
pub const PREFILL_KVQ_BINDINGS: [BindingKind; 10] = [
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

/// Query heads of one KV group handled by one decode workgroup: the workgroup variant fills
/// 2048 floats of workgroup memory with their queries; the lanes variant keeps at most
/// `LANE_HEADS` (4, `shaders/common/decode_lanes.wgsl`) in registers.
pub fn heads_per_workgroup(variant: AttentionVariant, group: u32, head_dim: u32) -> u32 {
    match variant {
        AttentionVariant::Workgroup => group.min(16).min(2048 / head_dim).max(1),
        AttentionVariant::Lanes => group.clamp(1, LANE_HEADS),
    }
}

/// The `slice_heads` of a decode pipeline (`PipelineKey::AttnDecodePartials`): for the lanes
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
    /// A quantized pool: its geometry and the layer's staging buffer; `None` for f16.
    pub kv_quant: Option<KvQuantIo<'a>>,
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
    prefill_bg: wgpu::BindGroup,
    partials_pl: Arc<Pipeline>,
    reduce_pl: Arc<Pipeline>,
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
        let hd = layout.head_dim;
        assert!(
            hd % 2 == 0 && hd <= MAX_HEAD_DIM,
            "head_dim {hd} must be even and at most {MAX_HEAD_DIM}"
        );
        assert!(
            layout.num_heads % layout.num_kv_heads == 0,
            "query heads must be a multiple of KV heads"
        );
        let group = layout.num_heads / layout.num_kv_heads;
        let variant = kernels.config.attention(hd);
        let heads_per_wg = heads_per_workgroup(variant, group, hd);
        let q = io.kv_quant.map(|q| q.layout);
        if let (true, Some(q)) = (layout.values_in_keys, q) {
            assert!(
                q.k_head_block_words == q.v_head_block_words && q.k_data_words == q.v_data_words,
                "values in the keys (MLA) need one quantization for K and V"
            );
        }
        if q.is_some() {
            assert!(hd % 8 == 0, "quantized KV needs head_dim a multiple of 8, got {hd}");
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
            ..Default::default()
        };
        let ubuf = gpu.uniform_buffer_init("attention", bytemuck::bytes_of(&params));
        let kv = q.map(|q| q.key);
        let slice_heads = slice_heads(variant, heads_per_wg);
        let loads = pool_loads(variant, kv.is_some(), &kernels.config);
        let part = kernels.config.partition_keys(variant);
        let partials_pl = kernels.pipeline(
            gpu,
            PipelineKey::AttnDecodePartials { head_dim: hd, variant, kv, slice_heads, loads, part },
        );
        let reduce_pl = kernels.pipeline(gpu, PipelineKey::AttnDecodeReduce { head_dim: hd, part });
        let query_tile = query_tile(variant, hd);
        let prefill_pl = kernels.pipeline(
            gpu,
            PipelineKey::AttnPrefill { head_dim: hd, query_tile, variant, kv, loads, part },
        );
        // the quantized kernels bind the staging buffer right after the pools
        let stage = io.kv_quant.map(|q| q.stage);
        let pools: Vec<&wgpu::Buffer> = [io.k_pool, io.v_pool].into_iter().chain(stage).collect();
        let mut partials_bufs = vec![io.step, &ubuf, io.qkv];
        partials_bufs.extend(&pools);
        partials_bufs.extend([io.seqs, io.block_tables, io.partials]);
        let partials_bg = partials_pl.bind_group(gpu, "attention decode partials", &partials_bufs);
        let reduce_bg = reduce_pl.bind_group(
            gpu,
            "attention decode reduce",
            &[io.step, &ubuf, io.partials, io.seqs, io.out],
        );
        let mut prefill_bufs = vec![io.step, &ubuf, io.qkv];
        prefill_bufs.extend(&pools);
        prefill_bufs.extend([io.seqs, io.block_tables, io.prefill_tiles, io.out]);
        let prefill_bg = prefill_pl.bind_group(gpu, "attention prefill", &prefill_bufs);
        AttentionOp {
            partials_bg,
            reduce_bg,
            prefill_bg,
            partials_pl,
            reduce_pl,
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
            pass.set_pipeline(&self.partials_pl.pipeline);
            pass.set_bind_group(0, &self.partials_bg, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
            let grid = [self.num_heads, shape.num_decode_seqs, 1];
            check_grid(grid, self.wg_limit);
            pass.set_pipeline(&self.reduce_pl.pipeline);
            pass.set_bind_group(0, &self.reduce_bg, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
            dispatches += 2;
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
