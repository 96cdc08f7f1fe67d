//! Host half of `shaders/moe/`: a mixture-of-experts MLP as three ops after the router's
//! logits (an ordinary [`super::linear`] projection):
//!
//! - [`RouteOp`] (`route.wgsl`): per token, the router logits' scores (softmax, or DeepSeek-V3's
//!   sigmoid with a choice bias: [`MoeScoring`]), the `used` best experts (ties to the lower
//!   index) and their weights, renormalised where the model says (`norm_topk_prob`) → `ids`,
//!   `weights` `[tokens, used]`;
//! - [`ExpertOp`] in [`ExpertMode::GateUp`] (`experts.wgsl`): each (token, rank) pair's expert
//!   gate|up rows with the GLU epilogue → `h [tokens · used, ffn]`;
//! - [`ExpertOp`] in [`ExpertMode::Down`]: each token's experts' down rows, weighted and summed
//!   in rank order, added to the residual.
//!
//! A step reads only the chosen experts' weights (llama.cpp's `mul_mat_vec_id`); every token's
//! result depends on its own routing alone, so outputs are the same under any batching. A
//! stacked weight larger than a binding comes in parts of whole experts, a dispatch each.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::source::{self, GLU, STEP, WEIGHTS, WEIGHTS_STORAGE};
use super::weights::WeightFormat;
use super::{check_grid, groups, record_per_token, GpuWeight, Kernel, Kernels, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};
use crate::loader::{Activation, MoeScoring};

/// Most experts a token may use (WGSL `MAX_USED`; the largest served model uses 10).
pub const MAX_USED: u32 = 32;

/// Mirror of WGSL `RouteParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RouteParams {
    pub experts: u32,
    pub used: u32,
    pub flags: u32,
    pub logits_stride: u32,
    pub groups: u32,
    pub groups_used: u32,
    pub scale: f32,
    pub _pad: u32,
}
const _: () = assert!(std::mem::size_of::<RouteParams>() == 32);

/// `RouteParams::flags`: divide the chosen probabilities by their sum.
pub const FLAG_NORM: u32 = 1;
/// `RouteParams::flags`: sigmoid scores, chosen by score + bias ([`MoeScoring::SigmoidBiased`]).
pub const FLAG_SIGMOID: u32 = 2;

/// Binding order of the routing kernel.
pub const ROUTE_BINDINGS: [BindingKind; 6] = [
    BindingKind::Uniform,          // step: StepInfo (num_tokens)
    BindingKind::Uniform,          // p: RouteParams
    BindingKind::StorageRead,      // logits: [tokens, logits_stride]
    BindingKind::StorageReadWrite, // ids: [tokens, used]
    BindingKind::StorageReadWrite, // weights: [tokens, used]
    BindingKind::StorageRead,      // bias: [experts] (sigmoid scores; else not read)
];

/// The routing pipeline (one variant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RouteKey;

impl Kernel for RouteKey {
    fn parts(&self) -> Vec<&'static str> {
        vec![STEP, include_str!("../../shaders/moe/route.wgsl")]
    }

    fn bindings(&self) -> Vec<BindingKind> {
        ROUTE_BINDINGS.to_vec()
    }

    fn all() -> Vec<Self> {
        vec![RouteKey]
    }
}

/// Most expert groups of group-limited routing (WGSL: one bit a group).
pub const MAX_GROUPS: u32 = 32;

// the loader refuses, by name, a model the routing kernel cannot hold: its bounds are these
const _: () = assert!(MAX_USED as usize == crate::loader::Moe::MAX_USED);
const _: () = assert!(MAX_GROUPS as usize == crate::loader::Moe::MAX_GROUPS);

/// How a model routes its tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Routing {
    pub experts: u32,
    pub used: u32,
    /// Renormalise the chosen experts' probabilities to sum to 1 (`norm_topk_prob`).
    pub norm: bool,
    pub scoring: MoeScoring,
    /// The chosen weights' factor (DeepSeek's routed scaling factor; 1 for Qwen3-MoE).
    pub scale: f32,
    /// Group-limited routing: `groups` equal runs of experts, of which the `groups_used` of
    /// highest value (softmax: their best expert's; sigmoid: the sum of their two best choice
    /// values) are chosen from (1 and 1: no limit).
    pub groups: u32,
    pub groups_used: u32,
}

impl Routing {
    /// Softmax routing to the top `used` of `experts`, without groups or scale.
    pub fn top(experts: u32, used: u32, norm: bool) -> Self {
        let scoring = MoeScoring::Softmax;
        Routing { experts, used, norm, scoring, scale: 1.0, groups: 1, groups_used: 1 }
    }
}

/// One routing dispatch: a workgroup per token.
pub struct RouteOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    wg_limit: u32,
}

impl RouteOp {
    /// `logits` holds each token's `experts` f32 router logits in rows of `logits_stride`
    /// floats; `bias` the experts' f32 choice biases, given exactly for sigmoid scoring; `ids`
    /// and `weights` get `[tokens, used]`.
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        step: &wgpu::Buffer,
        (logits, logits_stride): (&wgpu::Buffer, u32),
        bias: Option<&wgpu::Buffer>,
        [ids, weights]: [&wgpu::Buffer; 2],
        routing: Routing,
    ) -> Self {
        let Routing { experts, used, norm, scoring, scale, groups, groups_used } = routing;
        let sigmoid = scoring == MoeScoring::SigmoidBiased;
        assert_eq!(sigmoid, bias.is_some(), "a choice bias exactly for sigmoid scoring");
        assert!(
            !sigmoid || groups == 1 || experts / groups >= 2,
            "sigmoid groups rank by their two best of {experts} experts in {groups} groups"
        );
        assert!(logits_stride >= experts, "router rows of {logits_stride} for {experts} experts");
        assert!(
            used > 0 && used <= experts && used <= MAX_USED,
            "{used} experts a token of {experts} (at most {MAX_USED})"
        );
        assert!(
            groups > 0 && groups <= MAX_GROUPS && experts.is_multiple_of(groups),
            "{experts} experts in {groups} groups"
        );
        assert!(
            groups_used > 0 && groups_used <= groups && groups_used * (experts / groups) >= used,
            "{used} experts from {groups_used} of {groups} groups"
        );
        let pipeline = kernels.pipeline(gpu, RouteKey);
        let flags = if norm { FLAG_NORM } else { 0 } | if sigmoid { FLAG_SIGMOID } else { 0 };
        let params = RouteParams {
            experts,
            used,
            flags,
            logits_stride,
            groups,
            groups_used,
            scale,
            _pad: 0,
        };
        let ubuf = gpu.uniform_buffer_init("moe route", bytemuck::bytes_of(&params));
        // softmax reads no bias: the logits stand in for the binding
        let bias = bias.unwrap_or(logits);
        let bind_group =
            pipeline.bind_group(gpu, "moe route", &[step, &ubuf, logits, ids, weights, bias]);
        RouteOp { bind_group, pipeline, wg_limit: gpu.limits.max_compute_workgroups_per_dimension }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        record_per_token(pass, &self.pipeline, &self.bind_group, 64, shape, self.wg_limit)
    }
}

/// Which projection of the experts an [`ExpertOp`] computes (WGSL `MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpertMode {
    /// Gate|up rows interleaved per expert, the GLU epilogue: `h[t · used + j]`.
    GateUp(Activation),
    /// Down rows, the ranks' outputs weighted and summed, added to the residual.
    Down,
}

/// Mirror of WGSL `ExpertParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ExpertParams {
    pub k: u32,
    pub rows: u32,
    pub total_rows: u32,
    pub used: u32,
    pub x_stride: u32,
    pub out_stride: u32,
    pub glu_kind: u32,
    pub expert_base: u32,
    pub part_experts: u32,
    pub has_bias: u32,
    pub _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<ExpertParams>() == 48);

/// Binding order of the expert kernel.
pub const EXPERT_BINDINGS: [BindingKind; 9] = [
    BindingKind::Uniform,          // step: StepInfo (num_tokens)
    BindingKind::Uniform,          // p: ExpertParams
    BindingKind::StorageRead,      // wq: the stacked weight's words
    BindingKind::StorageRead,      // ws: its side words
    BindingKind::StorageRead,      // x: [rows of x, x_stride]
    BindingKind::StorageRead,      // ids: [tokens, used]
    BindingKind::StorageRead,      // weights: [tokens, used]
    BindingKind::StorageReadWrite, // out: [rows of out, out_stride]
    BindingKind::StorageRead,      // bias: [experts, rows] (has_bias; else not read)
];

/// An expert pipeline: the weight format and the projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExpertKey {
    pub format: WeightFormat,
    /// `MODE_DOWN` or `MODE_GATE_UP` (the activation is a parameter, not a variant).
    pub down: bool,
}

impl Kernel for ExpertKey {
    fn parts(&self) -> Vec<&'static str> {
        vec![
            STEP,
            GLU,
            WEIGHTS,
            WEIGHTS_STORAGE,
            source::weight_snippet(self.format),
            include_str!("../../shaders/moe/experts.wgsl"),
        ]
    }

    fn constants(&self) -> Vec<(&'static str, f64)> {
        vec![("MODE", if self.down { 1.0 } else { 0.0 })]
    }

    fn bindings(&self) -> Vec<BindingKind> {
        EXPERT_BINDINGS.to_vec()
    }

    fn all() -> Vec<Self> {
        WeightFormat::ALL
            .iter()
            .flat_map(|&format| [false, true].map(|down| ExpertKey { format, down }))
            .collect()
    }
}

/// Where an [`ExpertOp`] reads and writes.
pub struct ExpertIo<'a> {
    pub step: &'a wgpu::Buffer,
    /// GateUp: the normed input `[tokens, x_stride]`; Down: `h [tokens · used, x_stride]`.
    pub x: &'a wgpu::Buffer,
    pub x_stride: u32,
    pub ids: &'a wgpu::Buffer,
    pub weights: &'a wgpu::Buffer,
    /// GateUp: `h`; Down: the residual stream, accumulated into.
    pub out: &'a wgpu::Buffer,
    pub out_stride: u32,
    /// Every expert's row biases (gpt-oss), f32 `[experts, rows per expert]` in the weight's
    /// row order (GateUp: gate and up interleaved); `None`: no biases.
    pub bias: Option<&'a wgpu::Buffer>,
}

/// One projection of the chosen experts: a dispatch per part of the stacked weight.
pub struct ExpertOp {
    bind_groups: Vec<wgpu::BindGroup>,
    pipeline: Arc<Pipeline>,
    /// Weight bytes one token reads: its `used` experts' share of the stacked weight.
    token_weight_bytes: u64,
    rows: u32,
    used: u32,
    down: bool,
    wg_limit: u32,
}

impl ExpertOp {
    /// `weight`: `experts` experts' rows stacked (`rows_per_expert` each; GateUp: gate and up
    /// rows interleaved, `model::weights::expert_gate_up`), in parts of whole experts
    /// (`GpuWeight::upload_in_runs`).
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        mode: ExpertMode,
        weight: &GpuWeight,
        experts: u32,
        used: u32,
        io: ExpertIo<'_>,
    ) -> Self {
        let rows = weight.rows as u32 / experts;
        assert_eq!(rows * experts, weight.rows as u32, "whole experts");
        let down = mode == ExpertMode::Down;
        assert!(down || rows.is_multiple_of(2), "gate/up pairs");
        assert!(weight.cols.is_multiple_of(32) && io.x_stride.is_multiple_of(4));
        assert!(used > 0 && used <= experts, "{used} experts a token of {experts}");
        if let Some(b) = io.bias {
            let need = u64::from(experts) * u64::from(rows) * 4;
            assert!(b.size() >= need, "expert biases of {} bytes, {need} needed", b.size());
        }
        let glu_kind = match mode {
            ExpertMode::GateUp(act) => super::glu::kind(act),
            ExpertMode::Down => 0,
        };
        let pipeline = kernels.pipeline(gpu, ExpertKey { format: weight.format, down });
        let label = if down { "moe down" } else { "moe gate_up" };
        let mut bind_groups = Vec::new();
        let mut part_bytes = 0;
        for part in &weight.parts {
            let whole = |r: usize| (r as u32).is_multiple_of(rows);
            assert!(whole(part.row_offset) && whole(part.rows), "parts of whole experts");
            let params = ExpertParams {
                k: weight.cols as u32,
                rows,
                total_rows: part.rows as u32,
                used,
                x_stride: io.x_stride,
                out_stride: io.out_stride,
                glu_kind,
                expert_base: part.row_offset as u32 / rows,
                part_experts: part.rows as u32 / rows,
                has_bias: u32::from(io.bias.is_some()),
                _pad: [0; 2],
            };
            let ubuf = gpu.uniform_buffer_init(label, bytemuck::bytes_of(&params));
            // no biases: the input stands in for the binding, unread
            let bias = io.bias.unwrap_or(io.x);
            let buffers =
                [io.step, &ubuf, &part.words, &part.scales, io.x, io.ids, io.weights, io.out, bias];
            bind_groups.push(pipeline.bind_group(gpu, label, &buffers));
            part_bytes += part.words.size() + part.scales.size();
        }
        let token_weight_bytes = part_bytes * u64::from(used) / u64::from(experts);
        ExpertOp {
            bind_groups,
            pipeline,
            token_weight_bytes,
            rows,
            used,
            down,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    /// Weight bytes one token's step reads: its chosen experts' rows (the stacked weight's
    /// bytes × used / experts; a batch of tokens reads the union of their experts).
    pub fn token_weight_bytes(&self) -> u64 {
        self.token_weight_bytes
    }

    /// Rows of this op's grid: (token, rank) pairs for GateUp, tokens for Down.
    fn grid_rows(&self, shape: &StepShape) -> u32 {
        if self.down {
            shape.num_tokens
        } else {
            shape.num_tokens * self.used
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        let ys = self.grid_rows(shape);
        if ys == 0 {
            return 0;
        }
        // (token, rank) pairs past the per-dimension limit fold into z
        let y = ys.min(self.wg_limit);
        let grid = [groups(self.rows, 64), y, ys.div_ceil(y)];
        check_grid(grid, self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        for group in &self.bind_groups {
            pass.set_bind_group(0, group, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        }
        self.bind_groups.len() as u32
    }
}
