//! Host half of `shaders/gate/sigmoid_gate.wgsl`: the output gate of gated attention
//! (Qwen3.5's `attn_output · sigmoid(gate)` before `o_proj`), in place over each token row; and
//! with one gate a row, Qwen3.5-MoE's shared-expert gate (`h · sigmoid(x · w)`).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::source::STEP;
use super::{record_per_token, Kernels, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};

/// Mirror of WGSL `GateParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct GateParams {
    pub width: u32,
    pub x_stride: u32,
    pub g_stride: u32,
    pub g_offset: u32,
    pub g_step: u32,
    pub _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<GateParams>() == 32);

/// Binding order of the gate kernel.
pub const BINDINGS: [BindingKind; 4] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: GateParams
    BindingKind::StorageRead,      // g: [tokens, g_stride]
    BindingKind::StorageReadWrite, // x: [tokens, x_stride], gated in place
];

one_variant_key!(
    /// The sigmoid gate pipeline (one variant).
    GateKey,
    parts: [STEP, include_str!("../../shaders/gate/sigmoid_gate.wgsl")],
    bindings: BINDINGS,
);

/// Where the gate reads and writes: `width` channels of x rows (`x_stride` floats) gated by
/// the channels at `g_offset` of g rows (`g_stride`), or with `per_row` all by the one gate
/// at `g_offset`.
#[derive(Clone, Copy, Debug)]
pub struct GateDims {
    pub width: u32,
    pub x_stride: u32,
    pub g_stride: u32,
    pub g_offset: u32,
    pub per_row: bool,
}

/// `x ← x · sigmoid(g)`: one dispatch.
pub struct GateOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    width: u32,
    wg_limit: u32,
}

impl GateOp {
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        step: &wgpu::Buffer,
        g: &wgpu::Buffer,
        x: &wgpu::Buffer,
        d: GateDims,
    ) -> Self {
        assert!(d.width > 0 && d.width <= d.x_stride, "the gated channels overrun a row of x");
        let gates = if d.per_row { 1 } else { d.width };
        assert!(d.g_offset + gates <= d.g_stride, "the gates overrun a row of g");
        let pipeline = kernels.pipeline(gpu, GateKey);
        let params = GateParams {
            width: d.width,
            x_stride: d.x_stride,
            g_stride: d.g_stride,
            g_offset: d.g_offset,
            g_step: u32::from(!d.per_row),
            _pad: [0; 3],
        };
        let ubuf = gpu.uniform_buffer_init("sigmoid gate", bytemuck::bytes_of(&params));
        let bind_group = pipeline.bind_group(gpu, "sigmoid gate", &[step, &ubuf, g, x]);
        GateOp {
            bind_group,
            pipeline,
            width: d.width,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        let (pipeline, group) = (&self.pipeline, &self.bind_group);
        record_per_token(pass, pipeline, group, self.width, shape, self.wg_limit)
    }
}
