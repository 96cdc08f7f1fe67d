//! Host half of `shaders/elementwise/silu_mul.wgsl`: out = silu(gate) * up.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{check_grid, groups, Kernels, PipelineKey, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};

/// Mirror of WGSL `SiluMulParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct SiluMulParams {
    pub ffn: u32,
    pub in_stride: u32,
    pub _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<SiluMulParams>() == 16);

/// Binding order of the SiLU-multiply kernel.
pub const BINDINGS: [BindingKind; 4] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: SiluMulParams
    BindingKind::StorageRead,      // gate_up: [tokens, 2 * ffn]
    BindingKind::StorageReadWrite, // out: [tokens, ffn]
];

pub struct SiluMulOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    ffn: u32,
    wg_limit: u32,
}

impl SiluMulOp {
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        step: &wgpu::Buffer,
        gate_up: &wgpu::Buffer,
        out: &wgpu::Buffer,
        ffn: u32,
    ) -> Self {
        let pipeline = kernels.pipeline(gpu, PipelineKey::SiluMul);
        let params = SiluMulParams { ffn, in_stride: 2 * ffn, _pad: [0; 2] };
        let ubuf = gpu.uniform_buffer_init("silu_mul", bytemuck::bytes_of(&params));
        let bind_group = pipeline.bind_group(gpu, "silu_mul", &[step, &ubuf, gate_up, out]);
        SiluMulOp {
            bind_group,
            pipeline,
            ffn,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) {
        if shape.num_tokens == 0 {
            return;
        }
        let grid = [groups(self.ffn, 64), shape.num_tokens, 1];
        check_grid(grid, self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
    }
}
