//! Host half of `shaders/moe/`: a mixture-of-experts MLP as two ops after the router's
//! logits (an ordinary [`super::linear`] projection):
//!
//! - [`RouteOp`] (`route.wgsl`): per token, the router logits' scores (softmax, or DeepSeek-V3's
//!   sigmoid with a choice bias: [`MoeScoring`]), the `used` best experts (ties to the lower
//!   index) and their weights, renormalised where the model says (`norm_topk_prob`) → `ids`,
//!   `weights` `[tokens, used]`;
//! - [`ExpertsOp`] ([`experts`]): each (token, rank) pair's expert gate|up rows with the GLU
//!   epilogue → `h [tokens · used, ffn]`, then each token's experts' down rows, weighted and
//!   summed in rank order, added to the residual — per pair (`experts.wgsl`, decode) or grouped
//!   by expert into tiles (`align.wgsl`, `grouped.wgsl`, `combine.wgsl`, prefill), with the
//!   same bits either way ([`ExpertPath`]).
//!
//! A step reads only the chosen experts' weights (llama.cpp's `mul_mat_vec_id`, and prefill its
//! MUL_MAT_ID `mul_mm`); every token's result depends on its own routing alone, so outputs are
//! the same under any batching. A stacked weight larger than a binding comes in parts of whole
//! experts, a dispatch each.

mod experts;

pub use experts::{
    ExpertKey, ExpertParams, ExpertPath, ExpertStageKey, ExpertsIo, ExpertsOp, GroupedScratch,
    TilePlan, EXPERT_BINDINGS, GROUPED_BINDINGS, MAX_PARTS, TILE_PAIRS,
};

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::source::STEP;
use super::{record_per_token, Kernels, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};
use crate::loader::MoeScoring;

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

one_variant_key!(
    /// The routing pipeline (one variant).
    RouteKey,
    parts: [STEP, include_str!("../../shaders/moe/route.wgsl")],
    bindings: ROUTE_BINDINGS,
);

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
