//! Host half of `shaders/norm/rms_norm.wgsl`: out[r] = x[src(r)] / rms(x[src(r)]) * w.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{check_grid, Kernels, PipelineKey, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};

/// Mirror of WGSL `RmsNormParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RmsNormParams {
    pub dim: u32,
    pub eps: f32,
    pub x_stride: u32,
    pub out_stride: u32,
    pub gather: u32,
    pub _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<RmsNormParams>() == 32);

/// Binding order of the RMSNorm kernel.
pub const BINDINGS: [BindingKind; 6] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: RmsNormParams
    BindingKind::StorageRead,      // x: [tokens, x_stride]
    BindingKind::StorageRead,      // w: [dim]
    BindingKind::StorageRead,      // rows: [num_logits] (gather only)
    BindingKind::StorageReadWrite, // out: [rows, out_stride]
];

/// Which rows a norm reads.
pub enum NormRows<'a> {
    /// Row r of x for every token r of the step.
    Step,
    /// Row `rows[r]` of x for each of the step's `num_logits` logit rows.
    Gather(&'a wgpu::Buffer),
}

pub struct RmsNormOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    gather: bool,
    wg_limit: u32,
}

impl RmsNormOp {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        label: &str,
        step: &wgpu::Buffer,
        x: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        out: &wgpu::Buffer,
        dim: u32,
        eps: f32,
        rows: NormRows<'_>,
    ) -> Self {
        let pipeline = kernels.pipeline(gpu, PipelineKey::RmsNorm);
        let gather = matches!(rows, NormRows::Gather(_));
        let params = RmsNormParams {
            dim,
            eps,
            x_stride: dim,
            out_stride: dim,
            gather: gather as u32,
            _pad: [0; 3],
        };
        let ubuf = gpu.uniform_buffer_init(label, bytemuck::bytes_of(&params));
        let placeholder;
        let rows_buf = match rows {
            NormRows::Gather(b) => b,
            NormRows::Step => {
                placeholder = gpu.storage_buffer("no gather", 4);
                &placeholder
            }
        };
        let bind_group = pipeline.bind_group(gpu, label, &[step, &ubuf, x, weight, rows_buf, out]);
        RmsNormOp {
            bind_group,
            pipeline,
            gather,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) {
        let count = if self.gather { shape.num_logits } else { shape.num_tokens };
        if count == 0 {
            return;
        }
        check_grid([count, 1, 1], self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(count, 1, 1);
    }
}
