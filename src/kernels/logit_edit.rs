//! Host half of `shaders/logits/edit.wgsl`: the sampler's logit shaping on the GPU (logit bias,
//! the repetition, frequency and presence penalties, min_tokens' end-of-sequence mask:
//! `sample::Sampler`), as sparse edits of the logit rows recorded before the argmax and the
//! draw. A request that shapes its logits then picks its token on the GPU like any other (4 bytes
//! back, not the row: 1 MiB a token on Gemma's 262,144 vocabulary). The sampler lists its edits
//! (`Sampler::gpu_edits`), one per token it touches, with every operation it applies to that
//! logit; [`reference_edit`] is the same arithmetic on the CPU.
//!
//! One invocation an edit, 64 a workgroup: a step's edits are a few per token of the requests'
//! contexts, a dispatch of microseconds.

use bytemuck::{Pod, Zeroable};

use super::source::{LOGIT_ROWS, STEP};
use super::{groups, Kernels, RowDispatch, StepShape};
use crate::gpu::{BindingKind, Gpu};

/// One logit's shaping (mirror of WGSL `LogitEdit`): the operations flagged, in this order:
/// `+ bias`; `· inv_repetition` where the logit is > 0, else `· repetition`; `− penalty`; −∞.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct LogitEdit {
    /// The logit row (index among the step's logit rows).
    pub row: u32,
    /// The token (< the vocabulary).
    pub id: u32,
    /// `EDIT_*`.
    pub flags: u32,
    pub bias: f32,
    /// frequency · count + presence (f32, formed as the sampler forms it).
    pub penalty: f32,
    pub repetition: f32,
    /// 1 / repetition (f32): the sampler multiplies by it, so GPUs need no exact division.
    pub inv_repetition: f32,
    pub _pad: u32,
}
const _: () = assert!(std::mem::size_of::<LogitEdit>() == 32);

/// The same bits (a batch compares equal to itself; floats compare by their bits).
impl PartialEq for LogitEdit {
    fn eq(&self, other: &Self) -> bool {
        bytemuck::bytes_of(self) == bytemuck::bytes_of(other)
    }
}

impl Eq for LogitEdit {}

pub const EDIT_BIAS: u32 = 1;
pub const EDIT_REPETITION: u32 = 2;
pub const EDIT_PENALTY: u32 = 4;
/// The logit becomes −∞ (an end-of-sequence id before `min_tokens`).
pub const EDIT_MASK: u32 = 8;

/// Most edits one sequence's row may take on the GPU (`Sampler::gpu_edits`): a sampler that
/// would need more shapes its logits on the CPU (it reads its row back). The step buffers hold
/// this many per sequence.
pub const EDITS_PER_SEQ: usize = 2048;

impl LogitEdit {
    /// The edited logit: the sampler's operations on `l`, in its order.
    pub fn apply(&self, mut l: f32) -> f32 {
        if self.flags & EDIT_BIAS != 0 {
            l += self.bias;
        }
        if self.flags & EDIT_REPETITION != 0 {
            l = if l > 0.0 { l * self.inv_repetition } else { l * self.repetition };
        }
        if self.flags & EDIT_PENALTY != 0 {
            l -= self.penalty;
        }
        if self.flags & EDIT_MASK != 0 {
            l = f32::NEG_INFINITY;
        }
        l
    }
}

/// The kernel's arithmetic on the CPU: `logits` ([rows, vocab]) with every edit applied.
pub fn reference_edit(logits: &mut [f32], vocab: usize, edits: &[LogitEdit]) {
    for e in edits {
        let at = e.row as usize * vocab + e.id as usize;
        logits[at] = e.apply(logits[at]);
    }
}

/// Binding order of the edit kernel.
pub const BINDINGS: [BindingKind; 4] = [
    BindingKind::Uniform,          // step: StepInfo (num_logit_edits)
    BindingKind::Uniform,          // p: VocabParams
    BindingKind::StorageReadWrite, // logits: [num_logits, vocab]
    BindingKind::StorageRead,      // edits: [num_logit_edits] LogitEdit
];

one_variant_key!(
    /// The edit pipeline (one variant).
    LogitEditKey,
    parts: [STEP, LOGIT_ROWS, include_str!("../../shaders/logits/edit.wgsl")],
    bindings: BINDINGS,
);

/// One edit dispatch over the step's logit edits (`StepInfo::num_logit_edits`).
pub struct LogitEditOp(RowDispatch);

impl LogitEditOp {
    /// `logits` holds rows of `vocab` f32, `edits` [`LogitEdit`]s.
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        step: &wgpu::Buffer,
        logits: &wgpu::Buffer,
        edits: &wgpu::Buffer,
        vocab: u32,
    ) -> Self {
        assert!(vocab > 0, "logit edits over an empty vocabulary");
        LogitEditOp(RowDispatch::new(
            gpu,
            kernels,
            LogitEditKey,
            "logit edits",
            step,
            vocab,
            &[logits, edits],
        ))
    }

    /// Records the dispatch when the step has edits (`StepShape::logit_edits`); returns the
    /// dispatches made.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        self.0.record(pass, groups(shape.logit_edits, 64))
    }
}
