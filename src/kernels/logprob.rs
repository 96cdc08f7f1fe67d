//! Host half of `shaders/logits/logprob.wgsl`: each logit row's log-probability of a target
//! token, log softmax(row)[target], reduced on the GPU in f32 (one fixed summation order), so
//! perplexity and prompt logprobs read back 4 bytes a row, not the row
//! (`model::LogitReadback::TargetLogprobs`). The results follow the step's argmax ids in the
//! same buffer.

use super::source::{LOGIT_ROWS, STEP};
use super::{Kernels, RowDispatch, StepShape};
use crate::gpu::{BindingKind, Gpu};

/// A row without a target: skipped (WGSL `NO_TARGET`).
pub const NO_TARGET: u32 = u32::MAX;

/// Binding order of the logprob kernel.
pub const BINDINGS: [BindingKind; 5] = [
    BindingKind::Uniform,          // step: StepInfo (num_logits rows)
    BindingKind::Uniform,          // p: VocabParams
    BindingKind::StorageRead,      // logits: [num_logits, vocab]
    BindingKind::StorageRead,      // targets: [num_logits] u32
    BindingKind::StorageReadWrite, // out: [2 · num_logits] u32, the logprobs after the ids
];

one_variant_key!(
    /// The logprob pipeline (one variant).
    LogprobKey,
    parts: [STEP, LOGIT_ROWS, include_str!("../../shaders/logits/logprob.wgsl")],
    bindings: BINDINGS,
);

/// One logprob dispatch over the step's logit rows: one workgroup a row.
pub struct LogprobOp(RowDispatch);

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
        let buffers = [logits, targets, out];
        LogprobOp(RowDispatch::new(gpu, kernels, LogprobKey, "logprob", step, vocab, &buffers))
    }

    /// Records the dispatch when the step asks for target logprobs
    /// (`StepShape::logprob_rows`); returns the dispatches made.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        self.0.record(pass, shape.logprob_rows)
    }
}
