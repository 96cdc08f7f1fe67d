//! Host half of `shaders/glu/glu.wgsl`: the gated MLP activation out = act(gate) · up, the
//! activation (`shaders/common/glu.wgsl`: SwiGLU for Llama and Qwen2, GeGLU with
//! tanh-approximated GELU for Gemma) a pipeline constant.
//!
//! The same activation also runs as the epilogue of the gate/up linear layer when gate and up
//! share a weight format (`linear::LinearIo::glu`, rows interleaved by
//! `model::weights::gate_up`): then no GLU dispatch runs at all. This op is what runs when
//! their formats differ.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::source::{GLU, STEP};
use super::{record_per_token, Kernel, Kernels, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};
use crate::loader::Activation;

/// Mirror of WGSL `GluParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct GluParams {
    pub ffn: u32,
    pub in_stride: u32,
    pub _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<GluParams>() == 16);

/// The WGSL code of an activation (`GLU_SILU`, `GLU_GELU_TANH`, `GLU_SWIGLU_OAI` in
/// `shaders/common/glu.wgsl`).
pub fn kind(activation: Activation) -> u32 {
    match activation {
        Activation::Silu => 1,
        Activation::GeluTanh => 2,
        Activation::SwigluOai => 3,
    }
}

/// Binding order of the GLU kernel.
pub const BINDINGS: [BindingKind; 4] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: GluParams
    BindingKind::StorageRead,      // gate_up: [tokens, 2 * ffn] (gate columns, then up)
    BindingKind::StorageReadWrite, // out: [tokens, ffn]
];

/// A GLU pipeline: the activation (WGSL `GLU`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GluKey {
    pub activation: Activation,
}

impl Kernel for GluKey {
    fn parts(&self) -> Vec<&'static str> {
        vec![STEP, GLU, include_str!("../../shaders/glu/glu.wgsl")]
    }

    fn constants(&self) -> Vec<(&'static str, f64)> {
        vec![("GLU", f64::from(kind(self.activation)))]
    }

    fn bindings(&self) -> Vec<BindingKind> {
        BINDINGS.to_vec()
    }

    fn all() -> Vec<Self> {
        Activation::ALL.map(|activation| GluKey { activation }).to_vec()
    }
}

pub struct GluOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    ffn: u32,
    wg_limit: u32,
}

impl GluOp {
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        activation: Activation,
        step: &wgpu::Buffer,
        gate_up: &wgpu::Buffer,
        out: &wgpu::Buffer,
        ffn: u32,
    ) -> Self {
        assert!(ffn > 0, "GLU over an FFN of 0 columns");
        let pipeline = kernels.pipeline(gpu, GluKey { activation });
        let params = GluParams { ffn, in_stride: 2 * ffn, _pad: [0; 2] };
        let ubuf = gpu.uniform_buffer_init("glu", bytemuck::bytes_of(&params));
        let bind_group = pipeline.bind_group(gpu, "glu", &[step, &ubuf, gate_up, out]);
        GluOp {
            bind_group,
            pipeline,
            ffn,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        let (pipeline, group) = (&self.pipeline, &self.bind_group);
        record_per_token(pass, pipeline, group, self.ffn, shape, self.wg_limit)
    }
}
