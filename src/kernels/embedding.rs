//! Host half of `shaders/embedding/embedding.wgsl`: out[t, :] = scale · W[token_ids[t], :].

use bytemuck::{Pod, Zeroable};

use super::source::{weight_snippet, STEP, WEIGHTS, WEIGHTS_STORAGE};
use super::{check_grid, groups, GpuWeight, Kernel, Kernels, StepShape, WeightFormat};
use crate::gpu::{BindingKind, Gpu, Pipeline};
use std::sync::Arc;

/// Mirror of WGSL `EmbeddingParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct EmbeddingParams {
    pub k: u32,
    pub rows: u32,
    pub row_offset: u32,
    pub out_stride: u32,
    pub scale: f32,
    pub _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<EmbeddingParams>() == 32);

/// Binding order of the embedding kernel.
pub const BINDINGS: [BindingKind; 6] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: EmbeddingParams
    BindingKind::StorageRead,      // wq: words (kernels::weights::block_unit)
    BindingKind::StorageRead,      // ws: side words, the same units
    BindingKind::StorageRead,      // token_ids: [tokens]
    BindingKind::StorageReadWrite, // out: [tokens, out_stride]
];

/// An embedding pipeline: the weight format (its snippet).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EmbeddingKey {
    pub format: WeightFormat,
}

impl Kernel for EmbeddingKey {
    fn parts(&self) -> Vec<&'static str> {
        let kernel = include_str!("../../shaders/embedding/embedding.wgsl");
        vec![STEP, WEIGHTS, WEIGHTS_STORAGE, weight_snippet(self.format), kernel]
    }

    fn bindings(&self) -> Vec<BindingKind> {
        BINDINGS.to_vec()
    }

    fn all() -> Vec<Self> {
        WeightFormat::ALL.into_iter().map(|format| EmbeddingKey { format }).collect()
    }
}

/// The embedding lookup of a model, one bind group per vocabulary part.
pub struct EmbeddingOp {
    parts: Vec<wgpu::BindGroup>,
    pipeline: Arc<Pipeline>,
    groups_x: u32,
    wg_limit: u32,
}

impl EmbeddingOp {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        w: &GpuWeight,
        step: &wgpu::Buffer,
        token_ids: &wgpu::Buffer,
        out: &wgpu::Buffer,
        out_stride: u32,
        scale: f32,
    ) -> Self {
        let pipeline = kernels.pipeline(gpu, EmbeddingKey { format: w.format });
        let parts = w
            .parts
            .iter()
            .map(|part| {
                let params = EmbeddingParams {
                    k: w.cols as u32,
                    rows: part.rows as u32,
                    row_offset: part.row_offset as u32,
                    out_stride,
                    scale,
                    _pad: [0; 3],
                };
                let ubuf = gpu.uniform_buffer_init("embedding", bytemuck::bytes_of(&params));
                pipeline.bind_group(
                    gpu,
                    "embedding",
                    &[step, &ubuf, &part.words, &part.scales, token_ids, out],
                )
            })
            .collect();
        EmbeddingOp {
            parts,
            pipeline,
            groups_x: groups(w.cols as u32 / 32, 64),
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        if shape.num_tokens == 0 {
            return 0;
        }
        pass.set_pipeline(&self.pipeline.pipeline);
        let grid = [self.groups_x, shape.num_tokens, 1];
        check_grid(grid, self.wg_limit);
        for bg in &self.parts {
            pass.set_bind_group(0, bg, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        }
        self.parts.len() as u32
    }
}
