//! Host half of `shaders/logits/logprob.wgsl`: each logit row's log-probability of a target
//! token, log softmax(row)[target], reduced on the GPU in f32 (one fixed summation order), so
//! perplexity and prompt logprobs read back 4 bytes a row, not the row
//! (`model::LogitReadback::TargetLogprobs`). The results follow the step's argmax ids in the
//! same buffer.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::source::STEP;
use super::{check_grid, grid_2d, Kernel, Kernels, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};

/// A row without a target: skipped (WGSL `NO_TARGET`).
pub const NO_TARGET: u32 = u32::MAX;

/// Mirror of WGSL `LogprobParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct LogprobParams {
    pub vocab: u32,
    pub _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<LogprobParams>() == 16);

/// Binding order of the logprob kernel.
pub const BINDINGS: [BindingKind; 5] = [
    BindingKind::Uniform,          // step: StepInfo (num_logits rows)
    BindingKind::Uniform,          // p: LogprobParams
    BindingKind::StorageRead,      // logits: [num_logits, vocab]
    BindingKind::StorageRead,      // targets: [num_logits] u32
    BindingKind::StorageReadWrite, // out: [2 · num_logits] u32, the logprobs after the ids
];

/// The logprob pipeline (one variant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogprobKey;

impl Kernel for LogprobKey {
    fn parts(&self) -> Vec<&'static str> {
        vec![STEP, include_str!("../../shaders/logits/logprob.wgsl")]
    }

    fn bindings(&self) -> Vec<BindingKind> {
        BINDINGS.to_vec()
    }

    fn all() -> Vec<Self> {
        vec![LogprobKey]
    }
}

/// One logprob dispatch over the step's logit rows: one workgroup a row.
pub struct LogprobOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    wg_limit: u32,
}

impl LogprobOp {
    /// `logits` holds rows of `vocab` f32, `targets` one u32 a row ([`NO_TARGET`]: none), `out`
    /// two u32 a row (the argmax ids, then the logprobs as f32 bits).
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        step: &wgpu::Buffer,
        logits: &wgpu::Buffer,
        targets: &wgpu::Buffer,
        out: &wgpu::Buffer,
        vocab: u32,
    ) -> Self {
        assert!(vocab > 0, "log softmax over an empty vocabulary");
        let rows = logits.size() / (u64::from(vocab) * 4);
        assert!(targets.size() >= rows * 4, "targets holds fewer rows than logits");
        assert!(out.size() >= rows * 8, "out holds fewer than two words a row");
        let pipeline = kernels.pipeline(gpu, LogprobKey);
        let params = LogprobParams { vocab, _pad: [0; 3] };
        let ubuf = gpu.uniform_buffer_init("logprob", bytemuck::bytes_of(&params));
        let bind_group = pipeline.bind_group(gpu, "logprob", &[step, &ubuf, logits, targets, out]);
        LogprobOp {
            bind_group,
            pipeline,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    /// Records the dispatch when the step asks for target logprobs
    /// (`StepShape::logprob_rows`); returns the dispatches made.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        if shape.logprob_rows == 0 {
            return 0;
        }
        let grid = grid_2d(shape.logprob_rows, self.wg_limit);
        check_grid(grid, self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        1
    }
}
