//! Host half of `shaders/kv_write/kv_write.wgsl`: scatter new K/V rows into the paged pool.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::rope::QkvLayout;
use super::source::{KV_POOL, STEP};
use super::{record_per_token, Kernels, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};

/// Mirror of WGSL `KvWriteParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct KvWriteParams {
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub block_size: u32,
    pub qkv_stride: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    /// 0 when the values are the keys' first channels (`QkvLayout::values_in_keys`).
    pub write_v: u32,
    /// KV heads a pool block has room for, and the layer's first of them
    /// ([`QkvLayout::pool_heads`], [`QkvLayout::pool_head_base`]).
    pub pool_heads: u32,
    pub pool_head_base: u32,
    pub _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<KvWriteParams>() == 48);

/// Binding order of the KV write kernel.
pub const BINDINGS: [BindingKind; 6] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: KvWriteParams
    BindingKind::StorageRead,      // qkv: [tokens, qkv_stride]
    BindingKind::StorageRead,      // slot_mapping: [tokens]
    BindingKind::StorageReadWrite, // k_pool: [blocks, kv_heads, block_size, head_dim / 2] f16x2
    BindingKind::StorageReadWrite, // v_pool: same (not written when the values are in the keys)
];

one_variant_key!(
    /// The f16 KV write pipeline (one variant).
    KvWriteKey,
    parts: [STEP, KV_POOL, include_str!("../../shaders/kv_write/kv_write.wgsl")],
    bindings: BINDINGS,
);

pub struct KvWriteOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    words_per_token: u32,
    wg_limit: u32,
}

impl KvWriteOp {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        step: &wgpu::Buffer,
        qkv: &wgpu::Buffer,
        slot_mapping: &wgpu::Buffer,
        k_pool: &wgpu::Buffer,
        v_pool: &wgpu::Buffer,
        layout: QkvLayout,
        block_size: u32,
    ) -> Self {
        let pipeline = kernels.pipeline(gpu, KvWriteKey);
        let params = KvWriteParams {
            num_kv_heads: layout.num_kv_heads,
            head_dim: layout.head_dim,
            block_size,
            qkv_stride: layout.stride(),
            k_offset: layout.k_offset(),
            v_offset: layout.v_offset(),
            write_v: u32::from(!layout.values_in_keys),
            pool_heads: layout.pool_heads,
            pool_head_base: layout.pool_head_base,
            _pad: [0; 3],
        };
        let ubuf = gpu.uniform_buffer_init("kv_write", bytemuck::bytes_of(&params));
        let bind_group =
            pipeline.bind_group(gpu, "kv_write", &[step, &ubuf, qkv, slot_mapping, k_pool, v_pool]);
        KvWriteOp {
            bind_group,
            pipeline,
            words_per_token: layout.num_kv_heads * layout.head_dim / 2,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        let (pipeline, group) = (&self.pipeline, &self.bind_group);
        record_per_token(pass, pipeline, group, self.words_per_token, shape, self.wg_limit)
    }
}
