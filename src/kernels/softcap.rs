//! Host half of `shaders/logits/softcap.wgsl`: the final logit soft-cap,
//! `logit ← cap · tanh(logit / cap)` over the step's logit rows, in place after the LM head
//! (Gemma 4's `final_logit_softcapping`).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::source::STEP;
use super::{check_grid, Kernels, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};

/// Mirror of WGSL `SoftcapParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct SoftcapParams {
    pub vocab: u32,
    pub cap: f32,
    pub _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<SoftcapParams>() == 16);

/// Binding order of the soft-cap kernel.
pub const BINDINGS: [BindingKind; 3] = [
    BindingKind::Uniform,          // step: StepInfo (num_logits rows)
    BindingKind::Uniform,          // p: SoftcapParams
    BindingKind::StorageReadWrite, // logits: [num_logits, vocab], capped in place
];

one_variant_key!(
    /// The soft-cap pipeline (one variant).
    SoftcapKey,
    parts: [STEP, include_str!("../../shaders/logits/softcap.wgsl")],
    bindings: BINDINGS,
);

/// One dispatch over the step's logit rows: `ceil(vocab / 64)` × rows workgroups.
pub struct SoftcapOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    vocab: u32,
    wg_limit: u32,
}

impl SoftcapOp {
    /// `logits` holds rows of `vocab` f32; `cap` is positive and finite.
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        step: &wgpu::Buffer,
        logits: &wgpu::Buffer,
        vocab: u32,
        cap: f32,
    ) -> Self {
        assert!(vocab > 0 && cap.is_finite() && cap > 0.0, "soft-cap {cap} over {vocab} logits");
        let pipeline = kernels.pipeline(gpu, SoftcapKey);
        let params = SoftcapParams { vocab, cap, _pad: [0; 2] };
        let ubuf = gpu.uniform_buffer_init("logit softcap", bytemuck::bytes_of(&params));
        let bind_group = pipeline.bind_group(gpu, "logit softcap", &[step, &ubuf, logits]);
        SoftcapOp {
            bind_group,
            pipeline,
            vocab,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    /// Records the dispatch when the step has logit rows; returns the dispatches made.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        if shape.num_logits == 0 {
            return 0;
        }
        let grid = [self.vocab.div_ceil(64), shape.num_logits, 1];
        check_grid(grid, self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        1
    }
}
