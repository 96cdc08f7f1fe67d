//! Host half of `shaders/rope/rope_kv_write.wgsl`: RoPE on Q and K and the f16 KV write in one
//! dispatch, for whole heads of a head_dim that is a multiple of 4 when nothing runs between the
//! two (no `--kv-rotate`, an f16 pool). The same rotation (`shaders/common/rope_pair.wgsl`) and
//! pool addressing (`shaders/common/kv_pool.wgsl`) as [`super::rope`] and [`super::kv_write`],
//! which run separately otherwise.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::rope::{QkvLayout, RopePairs};
use super::source::{KV_POOL, ROPE_PAIR, STEP};
use super::{record_per_token, Kernels, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};

/// Mirror of WGSL `RopeKvParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RopeKvParams {
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub style: u32,
    pub qkv_stride: u32,
    pub block_size: u32,
    /// KV heads a pool block has room for ([`QkvLayout::pool_heads`]).
    pub pool_heads: u32,
    /// The layer's first pool head ([`QkvLayout::pool_head_base`]).
    pub pool_head_base: u32,
}
const _: () = assert!(std::mem::size_of::<RopeKvParams>() == 32);

/// Binding order of the fused kernel.
pub const BINDINGS: [BindingKind; 8] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: RopeKvParams
    BindingKind::StorageReadWrite, // qkv: [tokens, qkv_stride]
    BindingKind::StorageRead,      // positions: [tokens]
    BindingKind::StorageRead,      // table: [max_positions, head_dim / 2] (cos, sin)
    BindingKind::StorageRead,      // slot_mapping: [tokens]
    BindingKind::StorageReadWrite, // k_pool: [blocks, kv_heads, block_size, head_dim / 2] f16x2
    BindingKind::StorageReadWrite, // v_pool: same
];

one_variant_key!(
    /// The fused RoPE + f16 KV write pipeline (one variant).
    RopeKvWriteKey,
    parts: [STEP, ROPE_PAIR, KV_POOL, include_str!("../../shaders/rope/rope_kv_write.wgsl")],
    bindings: BINDINGS,
);

/// Whether the fused kernel can serve `layout`: whole Q/K/V heads of 4-channel units.
pub fn fits(layout: QkvLayout) -> bool {
    layout.head_dim.is_multiple_of(4) && !layout.values_in_keys
}

/// Where the fused op reads and writes.
pub struct RopeKvIo<'a> {
    pub step: &'a wgpu::Buffer,
    pub qkv: &'a wgpu::Buffer,
    pub positions: &'a wgpu::Buffer,
    pub table: &'a wgpu::Buffer,
    pub slot_mapping: &'a wgpu::Buffer,
    pub k_pool: &'a wgpu::Buffer,
    pub v_pool: &'a wgpu::Buffer,
}

pub struct RopeKvWriteOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    units_per_token: u32,
    wg_limit: u32,
}

impl RopeKvWriteOp {
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        layout: QkvLayout,
        pairs: RopePairs,
        block_size: u32,
        io: RopeKvIo<'_>,
    ) -> Self {
        assert!(fits(layout), "RoPE + KV write over {layout:?}");
        let pipeline = kernels.pipeline(gpu, RopeKvWriteKey);
        let params = RopeKvParams {
            num_heads: layout.num_heads,
            num_kv_heads: layout.num_kv_heads,
            head_dim: layout.head_dim,
            style: pairs.style(),
            qkv_stride: layout.stride(),
            block_size,
            pool_heads: layout.pool_heads,
            pool_head_base: layout.pool_head_base,
        };
        let ubuf = gpu.uniform_buffer_init("rope_kv_write", bytemuck::bytes_of(&params));
        let buffers =
            [io.step, &ubuf, io.qkv, io.positions, io.table, io.slot_mapping, io.k_pool, io.v_pool];
        let bind_group = pipeline.bind_group(gpu, "rope_kv_write", &buffers);
        RopeKvWriteOp {
            bind_group,
            pipeline,
            units_per_token: (layout.num_heads + 2 * layout.num_kv_heads) * layout.head_dim / 4,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        let (pipeline, group) = (&self.pipeline, &self.bind_group);
        record_per_token(pass, pipeline, group, self.units_per_token, shape, self.wg_limit)
    }
}
