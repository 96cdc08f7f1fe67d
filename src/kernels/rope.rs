//! Host half of `shaders/rope/rope.wgsl`: rotary position embedding of Q and K, in place.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{check_grid, groups, Kernels, PipelineKey, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};

/// Which elements of a head form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairs {
    /// (x[2j], x[2j+1]): GGUF llama, whose Q/K rows llama.cpp's converter permuted.
    Interleaved,
    /// (x[j], x[j + head_dim/2]): HF layout ("rotate_half"), Qwen2, Gemma.
    Neox,
}

/// Mirror of WGSL `RopeParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RopeParams {
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub style: u32,
    pub qkv_stride: u32,
    pub q_offset: u32,
    pub k_offset: u32,
    pub _pad: u32,
}
const _: () = assert!(std::mem::size_of::<RopeParams>() == 32);

/// Binding order of the RoPE kernel.
pub const BINDINGS: [BindingKind; 5] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: RopeParams
    BindingKind::StorageReadWrite, // qkv: [tokens, qkv_stride]
    BindingKind::StorageRead,      // positions: [tokens]
    BindingKind::StorageRead,      // table: [max_positions, head_dim / 2] (cos, sin)
];

/// cos/sin of `pos · theta^(-2j/head_dim)` for every position and pair, computed in f64.
/// [max_positions, head_dim / 2] (cos, sin)
pub fn rope_table(head_dim: usize, theta: f64, max_positions: usize) -> Vec<[f32; 2]> {
    let half = head_dim / 2;
    let inv_freq: Vec<f64> =
        (0..half).map(|j| theta.powf(-((2 * j) as f64) / head_dim as f64)).collect();
    let mut table = Vec::with_capacity(max_positions * half);
    for pos in 0..max_positions {
        for f in &inv_freq {
            let angle = pos as f64 * f;
            table.push([angle.cos() as f32, angle.sin() as f32]);
        }
    }
    table
}

/// Shape of the Q and K heads inside the fused qkv activation.
#[derive(Clone, Copy, Debug)]
pub struct QkvLayout {
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
}

impl QkvLayout {
    /// Floats per token row: Q heads, then K heads, then V heads.
    pub fn stride(&self) -> u32 {
        (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
    }
    pub fn k_offset(&self) -> u32 {
        self.num_heads * self.head_dim
    }
    pub fn v_offset(&self) -> u32 {
        (self.num_heads + self.num_kv_heads) * self.head_dim
    }
}

pub struct RopeOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    pairs_per_token: u32,
    wg_limit: u32,
}

impl RopeOp {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        step: &wgpu::Buffer,
        qkv: &wgpu::Buffer,
        positions: &wgpu::Buffer,
        table: &wgpu::Buffer,
        layout: QkvLayout,
        pairs: RopePairs,
    ) -> Self {
        let pipeline = kernels.pipeline(gpu, PipelineKey::Rope);
        let params = RopeParams {
            num_heads: layout.num_heads,
            num_kv_heads: layout.num_kv_heads,
            head_dim: layout.head_dim,
            style: match pairs {
                RopePairs::Interleaved => 0,
                RopePairs::Neox => 1,
            },
            qkv_stride: layout.stride(),
            q_offset: 0,
            k_offset: layout.k_offset(),
            _pad: 0,
        };
        let ubuf = gpu.uniform_buffer_init("rope", bytemuck::bytes_of(&params));
        let bind_group = pipeline.bind_group(gpu, "rope", &[step, &ubuf, qkv, positions, table]);
        RopeOp {
            bind_group,
            pipeline,
            pairs_per_token: (layout.num_heads + layout.num_kv_heads) * layout.head_dim / 2,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) {
        if shape.num_tokens == 0 {
            return;
        }
        let grid = [groups(self.pairs_per_token, 64), shape.num_tokens, 1];
        check_grid(grid, self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
    }
}
