//! The experts' projections after the router (`shaders/moe/experts.wgsl`, `align.wgsl`,
//! `grouped.wgsl`, `combine.wgsl`): [`ExpertsOp`] runs gate|up with the GLU epilogue into
//! `h [tokens · used, ffn]`, then down, weighted and summed in rank order into the residual,
//! on one of two paths that give the same bits ([`ExpertPath`]).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::super::source::{self, GLU, STEP, WEIGHTS, WEIGHTS_STORAGE};
use super::super::weights::WeightFormat;
use super::super::{check_grid, groups, GpuWeight, Kernel, KernelConfig, Kernels, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};
use crate::loader::Activation;

/// (Token, rank) pairs in a tile of the grouped path (WGSL `TILE` of `align.wgsl` and
/// `grouped.wgsl`).
pub const TILE_PAIRS: u32 = 8;

/// Most parts of a stacked down weight the grouped path sums in order (`combine.wgsl`'s 64
/// bounds); a weight in more parts runs the per-token path at every step size.
pub const MAX_PARTS: usize = 63;

/// How a step computes its experts ([`ExpertPath::choose`]). Both paths compute every (token, rank) pair's sums alone,
/// in one order (w_dot per block, chunks of 8 blocks, the chunk sums left to right; the ranks
/// in order within each part of the down weight), so a token's output has the same bits on
/// either and the choice is speed only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum ExpertPath {
    /// Each pair reads its expert's rows (llama.cpp's `mul_mat_vec_id`): decode, where a step's
    /// pairs rarely share an expert.
    PerToken,
    /// Pairs grouped by expert into tiles of [`TILE_PAIRS`] (count → prefix sum → scatter,
    /// vLLM's `moe_align_block_size`), one matmul over (row tile, pair tile) that skips
    /// empty experts (llama.cpp's MUL_MAT_ID `mul_mm`), then the rank-order sum: each expert's
    /// weights are read once per tile of its pairs.
    Grouped,
}

impl ExpertPath {
    /// The one place that picks the path: grouped where the adapter takes it
    /// ([`KernelConfig::moe_grouped`]) once a step has at least two pairs per expert on
    /// average (`tokens · used ≥ 2 · experts`), where tiles start to share weight reads; a
    /// decode step of a few sequences stays per token.
    pub fn choose(config: &KernelConfig, tokens: u32, used: u32, experts: u32) -> Self {
        let pairs = u64::from(tokens) * u64::from(used);
        if config.moe_grouped && pairs >= 2 * u64::from(experts) {
            ExpertPath::Grouped
        } else {
            ExpertPath::PerToken
        }
    }
}

/// Where `align.wgsl` writes a step's tiles, in one buffer of u32 words sized for the most
/// pairs a step can have (see the WGSL for the layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TilePlan {
    pub experts: u32,
    /// Most tiles a step of `max_pairs` pairs can need: ⌊pairs / TILE⌋ whole tiles, plus one
    /// partial tile per expert that has pairs.
    pub max_tiles: u32,
    pub starts_at: u32,
    pub tiles_at: u32,
    pub sorted_at: u32,
    /// Words of the buffer.
    pub words: u64,
}

impl TilePlan {
    pub fn new(max_tokens: usize, used: usize, experts: usize) -> Self {
        let pairs = (max_tokens.max(1) * used) as u64;
        let max_tiles = pairs / u64::from(TILE_PAIRS) + pairs.min(experts as u64);
        let starts_at = 1 + experts as u64;
        let tiles_at = starts_at + experts as u64;
        let sorted_at = tiles_at + max_tiles;
        let words = sorted_at + max_tiles * u64::from(TILE_PAIRS);
        let u = |v: u64| u32::try_from(v).expect("a tile plan within u32 words");
        TilePlan {
            experts: experts as u32,
            max_tiles: u(max_tiles),
            starts_at: u(starts_at),
            tiles_at: u(tiles_at),
            sorted_at: u(sorted_at),
            words,
        }
    }

    /// Tiles a step of `pairs` pairs can need (the grouped matmul's grid).
    fn tiles_for(&self, pairs: u32) -> u32 {
        (pairs / TILE_PAIRS + pairs.min(self.experts)).min(self.max_tiles)
    }
}

/// Mirror of WGSL `ExpertParams` (`shaders/moe/expert_params.wgsl`, both paths' kernels): the
/// plan's offsets last (the per-pair path does not read them).
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
    pub tiles_at: u32,
    pub sorted_at: u32,
}
const _: () = assert!(std::mem::size_of::<ExpertParams>() == 48);

/// Mirror of WGSL `AlignParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct AlignParams {
    experts: u32,
    used: u32,
    starts_at: u32,
    tiles_at: u32,
    sorted_at: u32,
    max_tiles: u32,
    _pad: [u32; 2],
}

/// Mirror of WGSL `CombineParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
struct CombineParams {
    rows: u32,
    used: u32,
    out_stride: u32,
    d_stride: u32,
    parts: u32,
    _pad: [u32; 3],
    bounds: [u32; MAX_PARTS + 1],
}
const _: () = assert!(std::mem::size_of::<CombineParams>() == 32 + 256);

/// Binding order of the per-token expert kernel.
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

/// Binding order of the grouped expert kernel.
pub const GROUPED_BINDINGS: [BindingKind; 8] = [
    BindingKind::Uniform,          // step: StepInfo (num_tokens)
    BindingKind::Uniform,          // p: ExpertParams
    BindingKind::StorageRead,      // wq: the stacked weight's words
    BindingKind::StorageRead,      // ws: its side words
    BindingKind::StorageRead,      // x: [rows of x, x_stride]
    BindingKind::StorageRead,      // plan: the tile plan
    BindingKind::StorageReadWrite, // out: [pairs, out_stride]
    BindingKind::StorageRead,      // bias: [experts, rows] (has_bias; else not read)
];

/// An expert pipeline: the weight format, the projection and the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExpertKey {
    pub format: WeightFormat,
    /// `MODE_DOWN` or `MODE_GATE_UP` (the activation is a parameter, not a variant).
    pub down: bool,
    pub path: ExpertPath,
}

impl Kernel for ExpertKey {
    fn parts(&self) -> Vec<&'static str> {
        let body = match self.path {
            ExpertPath::PerToken => include_str!("../../../shaders/moe/experts.wgsl"),
            ExpertPath::Grouped => include_str!("../../../shaders/moe/grouped.wgsl"),
        };
        let params = include_str!("../../../shaders/moe/expert_params.wgsl");
        vec![STEP, GLU, WEIGHTS, WEIGHTS_STORAGE, source::weight_snippet(self.format), params, body]
    }

    fn constants(&self) -> Vec<(&'static str, f64)> {
        vec![("MODE", if self.down { 1.0 } else { 0.0 })]
    }

    fn bindings(&self) -> Vec<BindingKind> {
        match self.path {
            ExpertPath::PerToken => EXPERT_BINDINGS.to_vec(),
            ExpertPath::Grouped => GROUPED_BINDINGS.to_vec(),
        }
    }

    fn all() -> Vec<Self> {
        let paths = [ExpertPath::PerToken, ExpertPath::Grouped];
        WeightFormat::ALL
            .iter()
            .flat_map(|&format| [false, true].map(|down| (format, down)))
            .flat_map(|(format, down)| paths.map(|path| ExpertKey { format, down, path }))
            .collect()
    }
}

/// The grouped path's tiling (`align.wgsl`) and its rank-order sum (`combine.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpertStageKey {
    Align,
    Combine,
}

impl Kernel for ExpertStageKey {
    fn parts(&self) -> Vec<&'static str> {
        match self {
            ExpertStageKey::Align => vec![STEP, include_str!("../../../shaders/moe/align.wgsl")],
            ExpertStageKey::Combine => {
                vec![STEP, include_str!("../../../shaders/moe/combine.wgsl")]
            }
        }
    }

    fn bindings(&self) -> Vec<BindingKind> {
        match self {
            ExpertStageKey::Align => vec![
                BindingKind::Uniform,          // step: StepInfo (num_tokens)
                BindingKind::Uniform,          // p: AlignParams
                BindingKind::StorageRead,      // ids: [tokens, used]
                BindingKind::StorageReadWrite, // plan: the tile plan
            ],
            ExpertStageKey::Combine => vec![
                BindingKind::Uniform,          // step: StepInfo (num_tokens)
                BindingKind::Uniform,          // p: CombineParams
                BindingKind::StorageRead,      // ids: [tokens, used]
                BindingKind::StorageRead,      // weights: [tokens, used]
                BindingKind::StorageRead,      // d: [tokens · used, d_stride]
                BindingKind::StorageReadWrite, // out: [tokens, out_stride]
            ],
        }
    }

    fn all() -> Vec<Self> {
        vec![ExpertStageKey::Align, ExpertStageKey::Combine]
    }
}

/// Where an [`ExpertsOp`] reads and writes.
pub struct ExpertsIo<'a> {
    pub step: &'a wgpu::Buffer,
    /// The normed input `[tokens, x_stride]`.
    pub x: &'a wgpu::Buffer,
    pub x_stride: u32,
    /// The router's `[tokens, used]` choices (u32) and weights (f32).
    pub ids: &'a wgpu::Buffer,
    pub weights: &'a wgpu::Buffer,
    /// `[tokens · used, ffn]`: each pair's act(gate) · up.
    pub h: &'a wgpu::Buffer,
    /// The residual stream `[tokens, out_stride]`, accumulated into.
    pub out: &'a wgpu::Buffer,
    pub out_stride: u32,
    /// The grouped path's tile plan ([`TilePlan`] words for `max_tokens`) and each pair's down
    /// row `[max_tokens · used, hidden]`; `None`: the per-token path only.
    pub grouped: Option<GroupedScratch<'a>>,
    /// Every expert's row biases (gpt-oss), f32 `[experts, rows per expert]` in the weights'
    /// row order (gate|up: gate and up interleaved); `None`: no biases.
    pub biases: Option<[&'a wgpu::Buffer; 2]>,
}

/// The grouped path's scratch buffers (see [`ExpertsIo::grouped`]).
pub struct GroupedScratch<'a> {
    pub plan: &'a wgpu::Buffer,
    pub down_rows: &'a wgpu::Buffer,
    /// Tokens the buffers are sized for.
    pub max_tokens: usize,
}

/// The projections' dispatches of one path: a pipeline and a bind group per part.
struct Projection {
    pipeline: Arc<Pipeline>,
    bind_groups: Vec<wgpu::BindGroup>,
    /// Rows per expert (the grid's x).
    rows: u32,
}

impl Projection {
    fn record(&self, pass: &mut wgpu::ComputePass<'_>, ys: u32, wg_limit: u32) -> u32 {
        record_rows(pass, &self.pipeline, &self.bind_groups, groups(self.rows, 64), ys, wg_limit)
    }
}

/// `bind_groups` each dispatched over `x` × `ys` workgroups, rows past the per-dimension limit
/// folded into z (the shaders number a row `wid.y + wid.z · nwg.y`).
fn record_rows(
    pass: &mut wgpu::ComputePass<'_>,
    pipeline: &Pipeline,
    bind_groups: &[wgpu::BindGroup],
    x: u32,
    ys: u32,
    wg_limit: u32,
) -> u32 {
    if ys == 0 {
        return 0;
    }
    let y = ys.min(wg_limit);
    let grid = [x, y, ys.div_ceil(y)];
    check_grid(grid, wg_limit);
    pass.set_pipeline(&pipeline.pipeline);
    for group in bind_groups {
        pass.set_bind_group(0, group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
    }
    bind_groups.len() as u32
}

/// The grouped path's dispatches.
struct Grouped {
    plan: TilePlan,
    align: (Arc<Pipeline>, wgpu::BindGroup),
    gate_up: Projection,
    down: Projection,
    combine: (Arc<Pipeline>, wgpu::BindGroup),
    hidden: u32,
}

/// One projection's dispatches: a bind group per part of its weight, `rest` the bindings after
/// the part's words and side words.
#[allow(clippy::too_many_arguments)]
fn projection(
    gpu: &Gpu,
    kernels: &Kernels,
    key: ExpertKey,
    w: &GpuWeight,
    rows: u32,
    base: ExpertParams,
    step: &wgpu::Buffer,
    rest: &[&wgpu::Buffer],
) -> Projection {
    let pipeline = kernels.pipeline(gpu, key);
    let label = if key.down { "moe down" } else { "moe gate_up" };
    let bind_groups = w
        .parts
        .iter()
        .map(|part| {
            let whole = |r: usize| (r as u32).is_multiple_of(rows);
            assert!(whole(part.row_offset) && whole(part.rows), "parts of whole experts");
            let p = ExpertParams {
                k: w.cols as u32,
                rows,
                total_rows: part.rows as u32,
                expert_base: part.row_offset as u32 / rows,
                part_experts: part.rows as u32 / rows,
                ..base
            };
            let ubuf = gpu.uniform_buffer_init(label, bytemuck::bytes_of(&p));
            let mut all = vec![step, &ubuf, &part.words, &part.scales];
            all.extend_from_slice(rest);
            pipeline.bind_group(gpu, label, &all)
        })
        .collect();
    Projection { pipeline, bind_groups, rows }
}

/// A mixture's routed experts, gate|up then down, on the path [`ExpertPath::choose`] picks.
pub struct ExpertsOp {
    /// gate|up and down, each pair reading its expert's rows.
    per_token: [Projection; 2],
    grouped: Option<Grouped>,
    /// Weight bytes one token reads: its `used` experts' share of the stacked weights.
    token_weight_bytes: u64,
    experts: u32,
    used: u32,
    config: KernelConfig,
    wg_limit: u32,
}

impl ExpertsOp {
    /// `gate_up`: `experts` experts' gate and up rows interleaved (`model::weights::
    /// expert_gate_up`), `down` their down rows, both stacked in parts of whole experts
    /// (`GpuWeight::upload_in_runs`); `used` experts a token.
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        activation: Activation,
        [gate_up, down]: [&GpuWeight; 2],
        [experts, used]: [u32; 2],
        io: ExpertsIo<'_>,
    ) -> Self {
        let gu_rows = gate_up.rows as u32 / experts;
        let hidden = down.rows as u32 / experts;
        assert_eq!(gu_rows * experts, gate_up.rows as u32, "whole experts");
        assert_eq!(hidden * experts, down.rows as u32, "whole experts");
        assert!(gu_rows.is_multiple_of(2), "gate/up pairs");
        let ffn = gu_rows / 2;
        assert_eq!(down.cols as u32, ffn, "down's columns are the experts' channels");
        assert!(gate_up.cols.is_multiple_of(32) && down.cols.is_multiple_of(32));
        assert!(io.x_stride.is_multiple_of(4) && io.x_stride >= gate_up.cols as u32);
        assert!(used > 0 && used <= experts, "{used} experts a token of {experts}");
        let [gu_bias, down_bias] = match io.biases {
            Some([g, d]) => {
                for (b, rows) in [(g, gu_rows), (d, hidden)] {
                    let need = u64::from(experts) * u64::from(rows) * 4;
                    assert!(b.size() >= need, "expert biases of {} bytes, {need} needed", b.size());
                }
                [g, d]
            }
            // no biases: the input stands in for the binding, unread
            None => [io.x, io.h],
        };
        let base = ExpertParams {
            used,
            glu_kind: super::super::glu::kind(activation),
            has_bias: u32::from(io.biases.is_some()),
            ..Default::default()
        };
        let gu_base = ExpertParams { x_stride: io.x_stride, out_stride: ffn, ..base };
        let down_base = ExpertParams { x_stride: ffn, out_stride: io.out_stride, ..base };
        let key = |down, path| ExpertKey { format: gate_up.format, down, path };
        let down_key = |path| ExpertKey { format: down.format, down: true, path };
        let per_token = [
            projection(
                gpu,
                kernels,
                key(false, ExpertPath::PerToken),
                gate_up,
                gu_rows,
                gu_base,
                io.step,
                &[io.x, io.ids, io.weights, io.h, gu_bias],
            ),
            projection(
                gpu,
                kernels,
                down_key(ExpertPath::PerToken),
                down,
                hidden,
                down_base,
                io.step,
                &[io.h, io.ids, io.weights, io.out, down_bias],
            ),
        ];
        let grouped = io.grouped.as_ref().filter(|_| down.parts.len() <= MAX_PARTS).map(|g| {
            let plan = TilePlan::new(g.max_tokens, used as usize, experts as usize);
            assert!(g.plan.size() >= plan.words * 4, "a tile plan of {} words", plan.words);
            let pairs = (g.max_tokens * used as usize) as u64;
            let need = pairs * u64::from(hidden) * 4;
            assert!(g.down_rows.size() >= need, "down rows of {need} bytes");
            let offsets =
                ExpertParams { tiles_at: plan.tiles_at, sorted_at: plan.sorted_at, ..base };
            let gate_up = projection(
                gpu,
                kernels,
                key(false, ExpertPath::Grouped),
                gate_up,
                gu_rows,
                ExpertParams { x_stride: io.x_stride, out_stride: ffn, ..offsets },
                io.step,
                &[io.x, g.plan, io.h, gu_bias],
            );
            let down_proj = projection(
                gpu,
                kernels,
                down_key(ExpertPath::Grouped),
                down,
                hidden,
                ExpertParams { x_stride: ffn, out_stride: hidden, ..offsets },
                io.step,
                &[io.h, g.plan, g.down_rows, down_bias],
            );
            let align_params = AlignParams {
                experts,
                used,
                starts_at: plan.starts_at,
                tiles_at: plan.tiles_at,
                sorted_at: plan.sorted_at,
                max_tiles: plan.max_tiles,
                _pad: [0; 2],
            };
            let pipeline = kernels.pipeline(gpu, ExpertStageKey::Align);
            let ubuf = gpu.uniform_buffer_init("moe align", bytemuck::bytes_of(&align_params));
            let bind = pipeline.bind_group(gpu, "moe align", &[io.step, &ubuf, io.ids, g.plan]);
            let align = (pipeline, bind);
            let mut bounds = [experts; MAX_PARTS + 1];
            for (q, part) in down.parts.iter().enumerate() {
                bounds[q] = part.row_offset as u32 / hidden;
            }
            let combine_params = CombineParams {
                rows: hidden,
                used,
                out_stride: io.out_stride,
                d_stride: hidden,
                parts: down.parts.len() as u32,
                _pad: [0; 3],
                bounds,
            };
            let pipeline = kernels.pipeline(gpu, ExpertStageKey::Combine);
            let ubuf = gpu.uniform_buffer_init("moe combine", bytemuck::bytes_of(&combine_params));
            let buffers = [io.step, &ubuf, io.ids, io.weights, g.down_rows, io.out];
            let bind_group = pipeline.bind_group(gpu, "moe combine", &buffers);
            let combine = (pipeline, bind_group);
            Grouped { plan, align, gate_up, down: down_proj, combine, hidden }
        });
        let bytes = |w: &GpuWeight| -> u64 {
            w.parts.iter().map(|p| p.words.size() + p.scales.size()).sum()
        };
        let token_weight_bytes =
            (bytes(gate_up) + bytes(down)) * u64::from(used) / u64::from(experts);
        ExpertsOp {
            per_token,
            grouped,
            token_weight_bytes,
            experts,
            used,
            config: kernels.config.clone(),
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    /// Weight bytes one token's step reads: its chosen experts' rows (the stacked weights'
    /// bytes × used / experts; a batch of tokens reads the union of their experts).
    pub fn token_weight_bytes(&self) -> u64 {
        self.token_weight_bytes
    }

    /// The path a step of `tokens` tokens takes: [`ExpertPath::choose`]'s, per token where the
    /// op has no grouped path.
    pub fn path_for(&self, tokens: u32) -> ExpertPath {
        match self.grouped {
            Some(_) => ExpertPath::choose(&self.config, tokens, self.used, self.experts),
            None => ExpertPath::PerToken,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        self.record_path(pass, shape, self.path_for(shape.num_tokens))
    }

    /// Records the step on `path` (tests run both; [`ExpertsOp::record`] picks).
    pub fn record_path(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        shape: &StepShape,
        path: ExpertPath,
    ) -> u32 {
        let tokens = shape.num_tokens;
        if tokens == 0 {
            return 0;
        }
        let pairs = tokens * self.used;
        let lim = self.wg_limit;
        match (path, &self.grouped) {
            (ExpertPath::Grouped, Some(g)) => {
                let tiles = g.plan.tiles_for(pairs);
                let align =
                    record_rows(pass, &g.align.0, std::slice::from_ref(&g.align.1), 1, 1, lim);
                let gu = g.gate_up.record(pass, tiles, lim);
                let down = g.down.record(pass, tiles, lim);
                let sum = std::slice::from_ref(&g.combine.1);
                let combine =
                    record_rows(pass, &g.combine.0, sum, groups(g.hidden, 64), tokens, lim);
                align + gu + down + combine
            }
            (ExpertPath::Grouped, None) => panic!("this op has no grouped path"),
            (ExpertPath::PerToken, _) => {
                let [gate_up, down] = &self.per_token;
                gate_up.record(pass, pairs, lim) + down.record(pass, tokens, lim)
            }
        }
    }
}
