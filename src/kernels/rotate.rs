//! Host half of `shaders/rotate/` (`hadamard.wgsl`, `hadamard_lanes.wgsl`, their shared
//! `rotate_io.wgsl`): the KV rotation (`--kv-rotate`), the
//! orthonormal Hadamard transform of every head of a row, in place, bit for bit as
//! [`crate::quant::fwht_inplace`]. Applied to Q, K and V after RoPE (q·k unchanged; K and V are
//! stored rotated) and to the attention output (H is its own inverse, so V's rotation is undone).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::source::STEP;
use super::{check_grid, record_per_token, Kernel, KernelFeatures, Kernels, StepShape};
use crate::gpu::{BindingKind, Capabilities, Gpu, Pipeline};

/// How the Hadamard rotation of `--kv-rotate` spreads a head over invocations. Both give
/// `quant::fwht_inplace`'s bits (the same butterflies in the same order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum RotateVariant {
    /// One invocation per (head, token row), the head in a private array
    /// (`shaders/rotate/hadamard.wgsl`): any head size, any adapter.
    Invocation,
    /// One subgroup of 8 lanes per (head, token row), the last three levels by shuffles
    /// (`shaders/rotate/hadamard_lanes.wgsl`): head_dim 32 to 256, subgroups of at least 8.
    Lanes,
}

/// Whether the device can run [`RotateVariant::Lanes`]: subgroups of at least 8 lanes, so a
/// workgroup of 8 is one subgroup.
pub fn can_run_lanes(caps: &Capabilities) -> bool {
    caps.subgroups && caps.subgroup_min_size >= 8
}

/// Largest head size either variant rotates (the invocation kernel's private array,
/// `shaders/rotate/hadamard.wgsl`).
pub const MAX_HEAD_DIM: u32 = 256;

/// Whether the lane variant serves a head size: 4 × NV channels a lane in NV vec4s, NV 1 to 8
/// (`shaders/rotate/hadamard_lanes.wgsl`).
pub fn lanes_serve(head_dim: u32) -> bool {
    head_dim.is_power_of_two() && (32..=256).contains(&head_dim)
}

/// Mirror of WGSL `RotateParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RotateParams {
    pub heads: u32,
    pub row_stride: u32,
    pub offset: u32,
    pub scale: f32,
}
const _: () = assert!(std::mem::size_of::<RotateParams>() == 16);

/// Binding order of the rotation kernel.
pub const BINDINGS: [BindingKind; 3] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: RotateParams
    BindingKind::StorageReadWrite, // x: [tokens, row_stride]
];

/// A rotation pipeline: the head size (WGSL `HEAD_DIM`) and the variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RotateKey {
    pub head_dim: u32,
    pub variant: RotateVariant,
}

impl Kernel for RotateKey {
    fn parts(&self) -> Vec<&'static str> {
        let kernel = match self.variant {
            RotateVariant::Invocation => include_str!("../../shaders/rotate/hadamard.wgsl"),
            RotateVariant::Lanes => include_str!("../../shaders/rotate/hadamard_lanes.wgsl"),
        };
        vec![STEP, include_str!("../../shaders/rotate/rotate_io.wgsl"), kernel]
    }

    fn constants(&self) -> Vec<(&'static str, f64)> {
        vec![("HEAD_DIM", f64::from(self.head_dim))]
    }

    fn bindings(&self) -> Vec<BindingKind> {
        BINDINGS.to_vec()
    }

    fn features(&self) -> KernelFeatures {
        KernelFeatures { subgroups: self.variant == RotateVariant::Lanes, int64: false }
    }

    /// Both variants at a spread of head sizes (the lane one where it serves them).
    fn all() -> Vec<Self> {
        let mut keys = Vec::new();
        for head_dim in [16, 64, 128, 256] {
            keys.push(RotateKey { head_dim, variant: RotateVariant::Invocation });
            if lanes_serve(head_dim) {
                keys.push(RotateKey { head_dim, variant: RotateVariant::Lanes });
            }
        }
        keys
    }
}

/// Which heads of each token row to rotate.
#[derive(Clone, Copy, Debug)]
pub struct RotateRows {
    /// Heads per row, contiguous from `offset`.
    pub heads: u32,
    pub head_dim: u32,
    /// Floats between token rows.
    pub row_stride: u32,
    /// Float offset of the first rotated head in a row.
    pub offset: u32,
}

/// One rotation dispatch over the step's token rows of a buffer.
pub struct RotateOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    variant: RotateVariant,
    heads: u32,
    wg_limit: u32,
}

impl RotateOp {
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        label: &str,
        step: &wgpu::Buffer,
        x: &wgpu::Buffer,
        rows: RotateRows,
    ) -> Self {
        let d = rows.head_dim;
        assert!(
            d.is_power_of_two() && d <= MAX_HEAD_DIM,
            "rotation needs a power-of-two head_dim ≤ {MAX_HEAD_DIM}"
        );
        let params = RotateParams {
            heads: rows.heads,
            row_stride: rows.row_stride,
            offset: rows.offset,
            // as quant::fwht_inplace computes it (exact for d = 4^k)
            scale: (d as f32).sqrt().recip(),
        };
        let ubuf = gpu.uniform_buffer_init(label, bytemuck::bytes_of(&params));
        let variant = kernels.config.rotate(d);
        let pipeline = kernels.pipeline(gpu, RotateKey { head_dim: d, variant });
        let bind_group = pipeline.bind_group(gpu, label, &[step, &ubuf, x]);
        RotateOp {
            bind_group,
            pipeline,
            variant,
            heads: rows.heads,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    /// One dispatch (none for a step without tokens): 64-wide workgroups over the heads
    /// (`Invocation`) or one 8-lane workgroup per head (`Lanes`), per token.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        let (pipeline, group) = (&self.pipeline, &self.bind_group);
        match self.variant {
            RotateVariant::Invocation => {
                record_per_token(pass, pipeline, group, self.heads, shape, self.wg_limit)
            }
            RotateVariant::Lanes => {
                if shape.num_tokens == 0 {
                    return 0;
                }
                let grid = [self.heads, shape.num_tokens, 1];
                check_grid(grid, self.wg_limit);
                pass.set_pipeline(&pipeline.pipeline);
                pass.set_bind_group(0, group, &[]);
                pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
                1
            }
        }
    }
}
