//! Host half of `shaders/logits/argmax.wgsl`: greedy sampling on the GPU. Each logit row of the
//! step becomes the index of its largest logit, the CPU sampler's greedy choice exactly (NaN
//! never picked, a row of NaN gives 0, +inf wins, ties and ±0 to the lowest index), so a step
//! whose every logit row is a greedy sample reads back 4 bytes a row instead of the row
//! (`model::LogitReadback::Argmax`).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::source::{LOGIT_KEY, STEP};
use super::{check_grid, grid_2d, Kernel, Kernels, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};

/// Mirror of WGSL `ArgmaxParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ArgmaxParams {
    pub vocab: u32,
    pub _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<ArgmaxParams>() == 16);

/// Binding order of the argmax kernel.
pub const BINDINGS: [BindingKind; 4] = [
    BindingKind::Uniform,          // step: StepInfo (num_logits rows)
    BindingKind::Uniform,          // p: ArgmaxParams
    BindingKind::StorageRead,      // logits: [num_logits, vocab]
    BindingKind::StorageReadWrite, // token_ids: [num_logits] u32
];

/// The argmax pipeline (one variant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ArgmaxKey;

impl Kernel for ArgmaxKey {
    fn parts(&self) -> Vec<&'static str> {
        vec![STEP, LOGIT_KEY, include_str!("../../shaders/logits/argmax.wgsl")]
    }

    fn bindings(&self) -> Vec<BindingKind> {
        BINDINGS.to_vec()
    }

    fn all() -> Vec<Self> {
        vec![ArgmaxKey]
    }
}

/// One argmax dispatch over the step's logit rows: one workgroup a row.
pub struct ArgmaxOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    wg_limit: u32,
}

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
        let pipeline = kernels.pipeline(gpu, ArgmaxKey);
        let params = ArgmaxParams { vocab, _pad: [0; 3] };
        let ubuf = gpu.uniform_buffer_init("argmax", bytemuck::bytes_of(&params));
        let bind_group = pipeline.bind_group(gpu, "argmax", &[step, &ubuf, logits, token_ids]);
        ArgmaxOp { bind_group, pipeline, wg_limit: gpu.limits.max_compute_workgroups_per_dimension }
    }

    /// Records the dispatch when the step asks for its logit rows' argmax
    /// (`StepShape::argmax_rows`); returns the dispatches made.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        if shape.argmax_rows == 0 {
            return 0;
        }
        let grid = grid_2d(shape.argmax_rows, self.wg_limit);
        check_grid(grid, self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        1
    }
}
