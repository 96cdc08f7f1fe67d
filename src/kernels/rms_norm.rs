//! Host half of `shaders/norm/rms_norm.wgsl` (and its CPU-adapter twin `rms_norm_lanes.wgsl`,
//! the same bits: [`super::NormVariant`]): out[r] (+)= x[src(r)] / rms(x[src(r)]) * w, over
//! whole token rows (the sub-layer norms), gathered rows (the final norm of the logit rows), or
//! each head of a token row (Gemma 3's Q/K norms: `heads` rows of `dim` per token, Q and K
//! heads with their own weights in one dispatch); with
//! `accumulate` the result is added to `out` (Gemma's post-norms before the residual add).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::source::{RMS, STEP};
use super::{check_grid, grid_2d, Kernel, KernelFeatures, Kernels, StepShape};
use crate::gpu::{BindingKind, Capabilities, Gpu, Pipeline};

/// How the RMSNorm kernel sums a row's squares. Both give the same bits (the lane variant plays
/// the workgroup's 64 invocations, eight per lane, and its tree's levels in the same order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum NormVariant {
    /// A workgroup of 64 per row, the tree through workgroup memory (`shaders/norm/rms_norm.wgsl`).
    Workgroup,
    /// CPU adapters: one subgroup of exactly 8 lanes per row, no workgroup memory or barriers
    /// (`shaders/norm/rms_norm_lanes.wgsl`).
    Lanes,
}

/// Whether the device can run [`NormVariant::Lanes`]: subgroups of exactly 8 lanes.
pub fn can_run_lanes(caps: &Capabilities) -> bool {
    caps.subgroups && caps.subgroup_min_size == 8 && caps.subgroup_max_size == 8
}

/// Mirror of WGSL `RmsNormParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RmsNormParams {
    pub dim: u32,
    pub eps: f32,
    pub x_stride: u32,
    pub out_stride: u32,
    /// FLAG_*
    pub flags: u32,
    pub heads: u32,
    pub x_offset: u32,
    pub out_offset: u32,
    pub split: u32,
    /// With [`FLAG_ACCUMULATE`]: `out = out · out_scale + result` (1.0: a plain residual add).
    pub out_scale: f32,
    pub _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<RmsNormParams>() == 48);

pub const FLAG_GATHER: u32 = 1;
pub const FLAG_ACCUMULATE: u32 = 2;

/// Binding order of the RMSNorm kernel.
pub const BINDINGS: [BindingKind; 6] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: RmsNormParams
    BindingKind::StorageRead,      // x: [tokens, x_stride]; a row's heads from x_offset
    BindingKind::StorageRead,      // w: [dim], or [2, dim] for heads with a split
    BindingKind::StorageRead,      // rows: [num_logits] (gather only)
    BindingKind::StorageReadWrite, // out: [rows, out_stride]; a row's heads from out_offset
];

/// An RMSNorm pipeline: the variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NormKey {
    pub variant: NormVariant,
}

impl Kernel for NormKey {
    fn parts(&self) -> Vec<&'static str> {
        let kernel = match self.variant {
            NormVariant::Workgroup => include_str!("../../shaders/norm/rms_norm.wgsl"),
            NormVariant::Lanes => include_str!("../../shaders/norm/rms_norm_lanes.wgsl"),
        };
        vec![STEP, RMS, include_str!("../../shaders/norm/rms_norm_io.wgsl"), kernel]
    }

    fn bindings(&self) -> Vec<BindingKind> {
        BINDINGS.to_vec()
    }

    fn features(&self) -> KernelFeatures {
        KernelFeatures { subgroups: self.variant == NormVariant::Lanes, int64: false }
    }

    fn all() -> Vec<Self> {
        [NormVariant::Workgroup, NormVariant::Lanes].map(|variant| NormKey { variant }).to_vec()
    }
}

/// Which rows a norm reads.
pub enum NormRows<'a> {
    /// Row r of x for every token r of the step.
    Step,
    /// Row `rows[r]` of x for each of the step's `num_logits` logit rows.
    Gather(&'a wgpu::Buffer),
    /// Every head of every token of the step: `dim` is the head size, each head normed on its
    /// own (Gemma 3's Q/K norms). x and out must be different buffers.
    Heads(HeadRows),
}

/// Where the heads of a [`NormRows::Heads`] norm sit (in f32 elements): token t's head h reads
/// `x[t * x_stride + x_offset + h * dim ..][..dim]` and writes the same place of `out`.
#[derive(Clone, Copy, Debug)]
pub struct HeadRows {
    pub heads: u32,
    pub x_stride: u32,
    pub x_offset: u32,
    pub out_stride: u32,
    pub out_offset: u32,
    /// Heads from this one on take the weight's second row (`weight` is then [2, dim]): Q and
    /// K heads with their own norm weights in one dispatch. `heads` for one weight.
    pub split: u32,
}

/// What a norm reads and writes.
pub struct NormIo<'a> {
    pub step: &'a wgpu::Buffer,
    pub x: &'a wgpu::Buffer,
    /// [dim]
    pub weight: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
    pub rows: NormRows<'a>,
    /// Add the result to what `out` holds (a residual connection).
    pub accumulate: bool,
}

pub struct RmsNormOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    gather: bool,
    /// Rows per token (1 but for `NormRows::Heads`).
    heads: u32,
    wg_limit: u32,
}

impl RmsNormOp {
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        label: &str,
        dim: u32,
        eps: f32,
        io: NormIo<'_>,
    ) -> Self {
        Self::scaled(gpu, kernels, label, dim, eps, io, 1.0)
    }

    /// [`RmsNormOp::new`] with `accumulate` scaling what `out` holds by `out_scale` before the
    /// add: `out = out · out_scale + result`. Gemma 4's layer scalar multiplies the residual
    /// stream after the MLP's post-norm add, `(h + y) · s`, which is `h · s + y · s`: this op
    /// with `out_scale` s and the post-norm's weight times s.
    #[track_caller]
    pub fn scaled(
        gpu: &Gpu,
        kernels: &Kernels,
        label: &str,
        dim: u32,
        eps: f32,
        io: NormIo<'_>,
        out_scale: f32,
    ) -> Self {
        assert!(out_scale == 1.0 || io.accumulate, "{label}: a scale of what is not accumulated");
        let NormIo { step, x, weight, out, rows, accumulate } = io;
        let pipeline = kernels.pipeline(gpu, NormKey { variant: kernels.config.norm() });
        assert!(dim > 0, "{label}: a norm over 0 elements");
        let gather = matches!(rows, NormRows::Gather(_));
        let heads = match rows {
            NormRows::Heads(h) => h,
            NormRows::Step | NormRows::Gather(_) => {
                let (x_stride, out_stride) = (dim, dim);
                HeadRows { heads: 1, x_stride, x_offset: 0, out_stride, out_offset: 0, split: 1 }
            }
        };
        assert!(
            heads.heads > 0
                && heads.x_offset + heads.heads * dim <= heads.x_stride
                && heads.out_offset + heads.heads * dim <= heads.out_stride,
            "{label}: {heads:?} of {dim} floats do not fit their rows"
        );
        let weight_rows = if heads.split < heads.heads { 2 } else { 1 };
        assert!(
            weight.size() >= u64::from(weight_rows * dim) * 4,
            "{label}: the weight holds fewer than {weight_rows} rows of {dim}"
        );
        let params = RmsNormParams {
            dim,
            eps,
            x_stride: heads.x_stride,
            out_stride: heads.out_stride,
            flags: if gather { FLAG_GATHER } else { 0 }
                | if accumulate { FLAG_ACCUMULATE } else { 0 },
            heads: heads.heads,
            x_offset: heads.x_offset,
            out_offset: heads.out_offset,
            split: heads.split,
            out_scale,
            _pad: [0; 2],
        };
        let ubuf = gpu.uniform_buffer_init(label, bytemuck::bytes_of(&params));
        let placeholder;
        let rows_buf = match rows {
            NormRows::Gather(b) => b,
            NormRows::Step | NormRows::Heads(_) => {
                placeholder = gpu.storage_buffer("no gather", 4);
                &placeholder
            }
        };
        let bind_group = pipeline.bind_group(gpu, label, &[step, &ubuf, x, weight, rows_buf, out]);
        RmsNormOp {
            bind_group,
            pipeline,
            gather,
            heads: heads.heads,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        let count = if self.gather { shape.num_logits } else { shape.num_tokens };
        if count == 0 {
            return 0;
        }
        // one workgroup per (row, head): tokens × heads can pass the per-dimension limit
        let grid = grid_2d(count * self.heads, self.wg_limit);
        check_grid(grid, self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        1
    }
}
