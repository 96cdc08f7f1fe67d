//! Host half of `shaders/logits/argmax.wgsl`: greedy sampling on the GPU. Each logit row of the
//! step becomes the index of its largest logit, the CPU sampler's greedy choice exactly (NaN
//! never picked, a row of NaN gives 0, +inf wins, ties and ±0 to the lowest index), so a step
//! whose every logit row is a greedy sample reads back 4 bytes a row instead of the row
//! (`model::LogitReadback::Argmax`).

use super::source::{LOGIT_ROWS, STEP};
use super::{Kernels, RowDispatch, StepShape};
use crate::gpu::{BindingKind, Gpu};

/// Binding order of the argmax kernel.
pub const BINDINGS: [BindingKind; 4] = [
    BindingKind::Uniform,          // step: StepInfo (num_logits rows)
    BindingKind::Uniform,          // p: VocabParams
    BindingKind::StorageRead,      // logits: [num_logits, vocab]
    BindingKind::StorageReadWrite, // token_ids: [num_logits] u32
];

one_variant_key!(
    /// The argmax pipeline (one variant).
    ArgmaxKey,
    parts: [STEP, LOGIT_ROWS, include_str!("../../shaders/logits/argmax.wgsl")],
    bindings: BINDINGS,
);

/// One argmax dispatch over the step's logit rows: one workgroup a row.
pub struct ArgmaxOp(RowDispatch);

impl ArgmaxOp {
    /// `logits` holds rows of `vocab` f32, `token_ids` one u32 a row.
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        step: &wgpu::Buffer,
        logits: &wgpu::Buffer,
        token_ids: &wgpu::Buffer,
        vocab: u32,
    ) -> Self {
        assert!(vocab > 0, "argmax over an empty vocabulary");
        let rows = logits.size() / (u64::from(vocab) * 4);
        assert!(token_ids.size() >= rows * 4, "token_ids holds fewer rows than logits");
        ArgmaxOp(RowDispatch::new(
            gpu,
            kernels,
            ArgmaxKey,
            "argmax",
            step,
            vocab,
            &[logits, token_ids],
        ))
    }

    /// Records the dispatch when the step asks for its logit rows' argmax
    /// (`StepShape::argmax_rows`); returns the dispatches made.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        self.0.record(pass, shape.argmax_rows)
    }
}
