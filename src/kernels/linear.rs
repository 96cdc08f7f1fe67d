//! Host half of the linear kernels (`shaders/linear/`): out[t, n] (+)= Σ_k W[n, k] · x[t, k]
//! (+ bias), or with the GLU epilogue out[t, i] = act(Σ_k W[2i, k] · x[t, k]) · Σ_k W[2i + 1, k]
//! · x[t, k]. Three kernels compute the same sums in the same order: the GPU variant's matvec
//! (`linear.wgsl`) and tiled prefill GEMM (`linear_tiled.wgsl`), and the subgroup variant for CPU
//! adapters (`linear_subgroup.wgsl`).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::glu;
use super::source::{self, GLU, RMS, STEP, U64, WEIGHTS, WEIGHTS_STORAGE};
use super::weights::{WeightFormat, TILE_ROWS};
use super::{check_grid, groups, GpuWeight, Kernel, KernelConfig, KernelFeatures, Kernels};
use super::{LaneLoads, StepShape};
use crate::gpu::{BindingKind, Capabilities, Gpu, Pipeline};
use crate::loader::Activation;

/// How the linear kernel loads its inputs. Both variants compute the same sums (the reduction
/// is defined once, in shaders/common/weights.wgsl), so the choice only affects speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum LinearVariant {
    /// One row per invocation, inputs read by every invocation (a cache broadcast on GPUs).
    Gpu,
    /// CPU adapters: inputs loaded once per 8 lanes and shared with subgroupBroadcast, four rows
    /// per lane, two rows' weights per load (64-bit views). Needs subgroups of at least 8 lanes
    /// and 64-bit shader integers.
    Subgroup,
}

/// Whether the device can run [`LinearVariant::Subgroup`]: subgroups of at least 8 lanes,
/// 64-bit shader integers and as many storage buffers as its bindings.
pub fn can_run_subgroup(caps: &Capabilities) -> bool {
    let storage = bindings(LinearVariant::Subgroup)
        .iter()
        .filter(|b| !matches!(b, BindingKind::Uniform))
        .count() as u32;
    caps.subgroups
        && caps.subgroup_min_size >= 8
        && caps.shader_int64
        && caps.max_storage_buffers_per_shader_stage >= storage
}

/// Tokens computed per invocation by the linear kernel (the arithmetic per token is the same,
/// so a token's result never depends on the tile). [`TokenTile::for_count`] is the one place
/// that picks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenTile {
    /// Decode-sized steps: one token per invocation, no wasted work.
    One,
    /// Prefill: several tokens per invocation share each weight load.
    Many,
    /// Long prefill chunks on the subgroup variant: twice `Many`'s tokens share each block's
    /// decoded weights.
    Wide,
    /// Prefill on the GPU variant (steps of more than [`SPLIT_MAX_TOKENS`]): the tiled GEMM
    /// (`shaders/linear/linear_tiled.wgsl`), a workgroup of 128 invocations a tile of 64 rows ×
    /// 32 tokens, each block's weights decoded once into workgroup memory for the 32 tokens.
    Tiled,
}

impl TokenTile {
    /// The tiles a variant's linear kernel is built for.
    pub fn of_variant(variant: LinearVariant) -> &'static [TokenTile] {
        match variant {
            LinearVariant::Gpu => &[TokenTile::One, TokenTile::Many, TokenTile::Tiled],
            LinearVariant::Subgroup => &[TokenTile::One, TokenTile::Many, TokenTile::Wide],
        }
    }

    /// Tokens per invocation for a variant (the GPU variant has no wide tile: as `Many`), or
    /// for `Tiled` per workgroup.
    pub fn tokens(self, variant: LinearVariant) -> u32 {
        match (self, variant) {
            (TokenTile::One, _) => 1,
            (TokenTile::Many | TokenTile::Wide, LinearVariant::Gpu) => 4,
            (TokenTile::Many, LinearVariant::Subgroup) => 8,
            (TokenTile::Wide, LinearVariant::Subgroup) => 16,
            (TokenTile::Tiled, _) => TILED_TOKENS,
        }
    }

    /// The tile that suits a step with `count` token rows. The subgroup variant's wide tile
    /// costs ~0.9 × as much per token as its 8-token one on lavapipe (docs/measured.md), but
    /// tiles past the last token compute copies: it takes the wide tile where
    /// `⌈count / 16⌉ · 1.8 ≤ ⌈count / 8⌉` (9–16, 25–32, 41–48 and ≥ 57 tokens). The GPU
    /// variant takes the tiled GEMM past [`SPLIT_MAX_TOKENS`] (where split-K stops): there one
    /// read of the weight serves 32 tokens instead of 4, worth a partly empty last tile.
    pub fn for_count(count: u32, variant: LinearVariant) -> Self {
        if count <= 2 {
            TokenTile::One
        } else if variant == LinearVariant::Gpu && count > SPLIT_MAX_TOKENS {
            TokenTile::Tiled
        } else if variant == LinearVariant::Subgroup
            && count.div_ceil(16) * 9 <= count.div_ceil(8) * 5
        {
            TokenTile::Wide
        } else {
            TokenTile::Many
        }
    }
}

/// A linear pipeline: the weight format (its snippet) and how the variant tiles and loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinearKey {
    pub format: WeightFormat,
    pub variant: LinearVariant,
    pub tile: TokenTile,
    /// The subgroup variant's rows per weight load ([`RowLoad::for_part`]); always `One` for
    /// the GPU variant.
    pub load: RowLoad,
    /// The GPU variant's invocations per weight row ([`split_groups`], WGSL `SPLIT`); always 1
    /// for the subgroup variant.
    pub split: u32,
    /// The subgroup variant's x loads ([`KernelConfig::lane_loads`], WGSL `LANE_LOAD_BITS`);
    /// always `Words32` for the GPU variant.
    pub loads: LaneLoads,
}

/// Tokens per workgroup of the tiled GEMM (WGSL `TOKENS` of `linear_tiled.wgsl`).
pub const TILED_TOKENS: u32 = 32;

/// What every linear kernel shares: params, flags, bindings 0–6, the output epilogue.
const IO: &str = include_str!("../../shaders/linear/io.wgsl");
/// The GPU variant's RMSNorm on load (binding 7, the norm's sums and the normed input block).
const NORM_ON_LOAD: &str = include_str!("../../shaders/linear/norm_on_load.wgsl");

impl Kernel for LinearKey {
    fn parts(&self) -> Vec<&'static str> {
        let weights = source::weight_snippet(self.format);
        match (self.variant, self.tile) {
            (LinearVariant::Gpu, tile) => {
                let kernel = if tile == TokenTile::Tiled {
                    include_str!("../../shaders/linear/linear_tiled.wgsl")
                } else {
                    include_str!("../../shaders/linear/linear.wgsl")
                };
                vec![STEP, GLU, WEIGHTS, WEIGHTS_STORAGE, weights, RMS, IO, NORM_ON_LOAD, kernel]
            }
            (LinearVariant::Subgroup, _) => vec![
                STEP,
                GLU,
                WEIGHTS,
                weights,
                U64,
                IO,
                include_str!("../../shaders/linear/linear_subgroup.wgsl"),
            ],
        }
    }

    fn constants(&self) -> Vec<(&'static str, f64)> {
        let tt = ("TT", f64::from(self.tile.tokens(self.variant)));
        match self.variant {
            // the tiled GEMM's shape is fixed in its WGSL (workgroup arrays are sized by it)
            LinearVariant::Gpu if self.tile == TokenTile::Tiled => vec![],
            LinearVariant::Gpu => vec![tt, ("SPLIT", f64::from(self.split))],
            LinearVariant::Subgroup => vec![
                tt,
                ("ROW_LOAD", f64::from(self.load.rows())),
                ("LANE_LOAD_BITS", f64::from(self.loads.bits())),
            ],
        }
    }

    fn bindings(&self) -> Vec<BindingKind> {
        bindings(self.variant)
    }

    fn features(&self) -> KernelFeatures {
        let sub = self.variant == LinearVariant::Subgroup;
        KernelFeatures { subgroups: sub, int64: sub }
    }

    /// Every format, tile, row load and split of each variant (the tiled GEMM unsplit); the
    /// subgroup variant with both x load widths.
    fn all() -> Vec<Self> {
        let mut keys = Vec::new();
        for format in WeightFormat::ALL {
            for (variant, loads, splits) in [
                (LinearVariant::Gpu, &[RowLoad::One][..], &SPLITS[..]),
                (LinearVariant::Subgroup, &RowLoad::ALL[..], &[1][..]),
            ] {
                let widths: &[LaneLoads] = match variant {
                    LinearVariant::Gpu => &[LaneLoads::Words32],
                    LinearVariant::Subgroup => &[LaneLoads::Words32, LaneLoads::Words64],
                };
                for &tile in TokenTile::of_variant(variant) {
                    let splits = if tile == TokenTile::Tiled { &[1][..] } else { splits };
                    for &load in loads {
                        for &split in splits {
                            for &x in widths {
                                keys.push(LinearKey {
                                    format,
                                    variant,
                                    tile,
                                    load,
                                    split,
                                    loads: x,
                                });
                            }
                        }
                    }
                }
            }
        }
        keys
    }
}

/// Mirror of WGSL `LinearParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct LinearParams {
    pub k: u32,
    pub rows: u32,
    pub row_offset: u32,
    pub flags: u32,
    pub x_stride: u32,
    pub x_offset: u32,
    pub out_stride: u32,
    pub out_offset: u32,
    pub norm_eps: f32,
    pub _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<LinearParams>() == 48);

pub const FLAG_BIAS: u32 = 1;
pub const FLAG_ACCUMULATE: u32 = 2;
pub const FLAG_LOGIT_ROWS: u32 = 4;
/// Bits 3–4 of the flags: the GLU epilogue's activation (`glu::kind`; 0 = none).
pub const FLAG_GLU_SHIFT: u32 = 3;
/// x is RMSNorm'd on load (the GPU variant; `shaders/linear/linear.wgsl`).
pub const FLAG_NORM: u32 = 32;

/// Binding order of the linear kernel.
pub const BINDINGS: [BindingKind; 7] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: LinearParams
    BindingKind::StorageRead,      // wq: words (kernels::weights::block_unit)
    BindingKind::StorageRead,      // ws: side words, the same units
    BindingKind::StorageRead,      // x: [tokens, x_stride]
    BindingKind::StorageRead,      // bias: [row_offset + rows]
    BindingKind::StorageReadWrite, // out: [tokens, out_stride]
];

/// Binding order of a variant: [`BINDINGS`], then for the GPU variant the input norm's weight
/// (`norm_w`, read under [`FLAG_NORM`]), for the subgroup variant the weight's words and
/// side words as textures (`wt`, `st`: `kernels::weight_textures`) and x again as its u64 view
/// (`x2`).
pub fn bindings(variant: LinearVariant) -> Vec<BindingKind> {
    let mut b = BINDINGS.to_vec();
    match variant {
        LinearVariant::Gpu => b.push(BindingKind::StorageRead),
        LinearVariant::Subgroup => b.extend([
            BindingKind::TextureU32,  // wt: words, rgba32uint texels
            BindingKind::TextureU32,  // st: side words, rgba32uint texels
            BindingKind::StorageRead, // x2: x's buffer as vec2<u64>
        ]),
    }
    b
}

/// Whether `variant` can RMSNorm its input on load ([`LinearIo::norm`]): the GPU variant,
/// where the norm's sums cost a few coalesced loads per workgroup. The subgroup variant for
/// CPU adapters cannot: on lavapipe the per-lane loads of those sums cost more than the
/// rms_norm dispatch they save (DESIGN.md, "The flow of one step").
pub fn norms_on_load(variant: LinearVariant) -> bool {
    variant == LinearVariant::Gpu
}

/// The GPU variant's split-K group counts (WGSL `SPLIT`): the pipelines there can be.
pub const SPLITS: [u32; 4] = [1, 2, 4, 8];

/// Inputs per chunk of a row's sum (WGSL `CHUNK_BLOCKS` blocks of 32): the unit of the fixed
/// reduction order, and of the split-K work.
pub const CHUNK_INPUTS: usize = 256;

/// Most token rows a step may have for the GPU variant to split its rows (split-K): decode
/// steps and small batches of them, whose grids of whole rows are a few workgroups; longer
/// steps have token tiles enough.
pub const SPLIT_MAX_TOKENS: u32 = 16;

/// Invocations per weight row of the linear kernel for a step of `count` token rows (WGSL
/// `SPLIT`, [`SPLITS`]): the one place that picks it. Where `config` splits
/// (`KernelConfig::split_k`: GPUs), the GPU variant splits a row's chunks of [`CHUNK_INPUTS`]
/// over up to 8 invocations in steps of at most [`SPLIT_MAX_TOKENS`] (decode, the LM head),
/// one chunk each a round, so such a step's few thousand rows put up to 8 times the loads in
/// flight (whole rows left SmolLM2's 576-row projections 9 workgroups at decode). The chunk
/// sums are still added in chunk order: the same bits as whole rows. The subgroup variant
/// splits rows over its lanes its own way: 1. Halved while the row groups would pass the
/// device's `limit` of workgroups per dimension.
pub fn split_groups(config: &KernelConfig, count: u32, k: usize, rows: usize, limit: u32) -> u32 {
    if !config.split_k || config.linear != LinearVariant::Gpu || count > SPLIT_MAX_TOKENS {
        return 1;
    }
    let mut split = (k.div_ceil(CHUNK_INPUTS).next_power_of_two() as u32).min(SPLITS[3]);
    while split > 1 && groups(rows as u32, TILE_ROWS as u32 / split) > limit {
        split /= 2;
    }
    split
}

/// Which count of the step the token rows follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenRows {
    /// Every token of the step (`StepInfo::num_tokens`).
    Step,
    /// The rows gathered for the LM head (`StepInfo::num_logits`).
    Logits,
}

/// Where a linear layer reads and writes (strides and offsets in f32 elements).
pub struct LinearIo<'a> {
    pub step: &'a wgpu::Buffer,
    pub x: &'a wgpu::Buffer,
    pub x_stride: u32,
    pub x_offset: u32,
    pub out: &'a wgpu::Buffer,
    pub out_stride: u32,
    pub out_offset: u32,
    pub bias: Option<&'a wgpu::Buffer>,
    /// Add the result to what `out` holds (a residual connection).
    pub accumulate: bool,
    pub rows: TokenRows,
    /// The GLU epilogue: the weight's rows 2i and 2i + 1 are gate row i and up row i
    /// (`model::weights::gate_up`), and output column i gets act(gate) · up instead of the
    /// two sums. Needs no bias, no accumulation, and parts of even rows at even offsets.
    pub glu: Option<Activation>,
    /// RMSNorm the input rows on load: the layer reads a sub-layer's un-normed input and sees
    /// the bits the rms_norm kernel would have written (one dispatch fewer). Only where
    /// [`norms_on_load`] (the builder asks `KernelConfig::norm_on_load`).
    pub norm: Option<InputNorm<'a>>,
}

/// An RMSNorm a linear layer applies to its input rows as it loads them: x / rms(x) · weight
/// over the k inputs, as `rms_norm::RmsNormOp` computes it.
#[derive(Clone, Copy)]
pub struct InputNorm<'a> {
    /// The norm's weight: k f32.
    pub weight: &'a wgpu::Buffer,
    pub eps: f32,
}

/// Where the subgroup linear kernel fetches a weight part's words from (WGSL `ROW_LOAD`: its
/// `w_q` / `w_s` / `w_s4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowLoad {
    /// From the storage buffers: a part of odd row count, and always the GPU variant (which
    /// loads one row per invocation and ignores this).
    One,
    /// From the weight textures (`kernels::weight_textures`): a part of even row count (no
    /// part splits a gate/up row pair).
    Pairs,
}

impl RowLoad {
    /// The row load of a weight part of `rows` rows.
    pub fn for_part(variant: LinearVariant, rows: usize) -> RowLoad {
        match variant {
            LinearVariant::Gpu => RowLoad::One,
            LinearVariant::Subgroup if rows.is_multiple_of(2) => RowLoad::Pairs,
            LinearVariant::Subgroup => RowLoad::One,
        }
    }

    /// Rows per load (WGSL `ROW_LOAD`).
    pub fn rows(self) -> u32 {
        match self {
            RowLoad::One => 1,
            RowLoad::Pairs => 2,
        }
    }

    pub const ALL: [RowLoad; 2] = [RowLoad::One, RowLoad::Pairs];
}

/// One weight part ready to record: its bind group, rows and a pipeline for each token tile of
/// the variant (`TokenTile::of_variant`) and split-K group count it can take ([`split_groups`]:
/// 1, and the part's split for short steps).
struct Part {
    bind_group: wgpu::BindGroup,
    rows: u32,
    pipelines: Vec<((TokenTile, u32), Arc<Pipeline>)>,
}

/// One linear layer ready to record: a bind group per weight part.
pub struct LinearOp {
    parts: Vec<Part>,
    /// The kernel choices it was built with ([`split_groups`] reads them per step).
    config: KernelConfig,
    /// Inputs per row.
    k: usize,
    variant: LinearVariant,
    rows: TokenRows,
    wg_limit: u32,
    weight_bytes: u64,
}

impl LinearOp {
    #[track_caller]
    pub fn new(gpu: &Gpu, kernels: &Kernels, label: &str, w: &GpuWeight, io: LinearIo<'_>) -> Self {
        assert!(
            io.x_stride.is_multiple_of(4) && io.x_offset.is_multiple_of(4),
            "{label}: x rows must be vec4-aligned"
        );
        assert!(w.cols.is_multiple_of(32), "{label}: {} columns is not a multiple of 32", w.cols);
        let variant = kernels.config.linear;
        let wg_limit = gpu.limits.max_compute_workgroups_per_dimension;
        // the pipelines of a part of `rows` rows: each tile, whole rows and (where it splits)
        // split-K for short steps
        let loads = match variant {
            LinearVariant::Subgroup => kernels.config.lane_loads,
            LinearVariant::Gpu => LaneLoads::Words32,
        };
        let pipelines = |rows| {
            let load = RowLoad::for_part(variant, rows);
            let short = split_groups(&kernels.config, 1, w.cols, rows, wg_limit);
            let mut out = Vec::new();
            for &tile in TokenTile::of_variant(variant) {
                let split_k = short > 1 && tile != TokenTile::Tiled;
                for split in if split_k { vec![1, short] } else { vec![1] } {
                    let key = LinearKey { format: w.format, variant, tile, load, split, loads };
                    out.push(((tile, split), kernels.pipeline(gpu, key)));
                }
            }
            out
        };
        let mut flags = 0;
        if io.bias.is_some() {
            flags |= FLAG_BIAS;
        }
        if io.accumulate {
            flags |= FLAG_ACCUMULATE;
        }
        if io.rows == TokenRows::Logits {
            flags |= FLAG_LOGIT_ROWS;
        }
        if let Some(activation) = io.glu {
            assert!(
                io.bias.is_none() && !io.accumulate,
                "{label}: GLU epilogue with bias or residual"
            );
            let even = |n: usize| n.is_multiple_of(2);
            assert!(
                w.parts.iter().all(|p| even(p.rows) && even(p.row_offset)),
                "{label}: GLU epilogue over a weight part that splits a gate/up pair"
            );
            flags |= glu::kind(activation) << FLAG_GLU_SHIFT;
        }
        if let Some(norm) = io.norm {
            assert!(norms_on_load(variant), "{label}: the {variant:?} linear cannot norm on load");
            assert_eq!(norm.weight.size(), w.cols as u64 * 4, "{label}: norm weight of k floats");
            flags |= FLAG_NORM;
        }
        let placeholder;
        let bias = match io.bias {
            Some(b) => b,
            None => {
                placeholder = gpu.storage_buffer("no bias", 4);
                &placeholder
            }
        };
        let no_norm;
        let norm_weight = match io.norm {
            Some(n) => n.weight,
            None => {
                no_norm = gpu.storage_buffer("no norm", 16);
                &no_norm
            }
        };
        let parts = w
            .parts
            .iter()
            .map(|part| {
                let params = LinearParams {
                    k: w.cols as u32,
                    rows: part.rows as u32,
                    row_offset: part.row_offset as u32,
                    flags,
                    x_stride: io.x_stride,
                    x_offset: io.x_offset,
                    out_stride: io.out_stride,
                    out_offset: io.out_offset,
                    norm_eps: io.norm.map_or(0.0, |n| n.eps),
                    _pad: [0; 3],
                };
                let ubuf = gpu.uniform_buffer_init(label, bytemuck::bytes_of(&params));
                let buffers = [io.step, &ubuf, &part.words, &part.scales, io.x, bias, io.out];
                let mut resources: Vec<_> = buffers.iter().map(|b| b.as_entire_binding()).collect();
                match variant {
                    LinearVariant::Gpu => resources.push(norm_weight.as_entire_binding()),
                    LinearVariant::Subgroup => {
                        let textures = part.textures(gpu, label);
                        resources.extend([
                            wgpu::BindingResource::TextureView(&textures.words),
                            wgpu::BindingResource::TextureView(&textures.scales),
                            io.x.as_entire_binding(),
                        ]);
                    }
                }
                let pipelines = pipelines(part.rows);
                let bind_group = pipelines[0].1.bind_group_of(gpu, label, resources);
                Part { bind_group, rows: part.rows as u32, pipelines }
            })
            .collect();
        LinearOp {
            parts,
            config: kernels.config.clone(),
            k: w.cols,
            variant,
            rows: io.rows,
            wg_limit,
            weight_bytes: w.parts.iter().map(|p| p.words.size() + p.scales.size()).sum(),
        }
    }

    /// Bytes of the weight this op reads once per step (words and scales on the GPU).
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// Records the dispatches of this layer for a step of `shape`.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        let count = match self.rows {
            TokenRows::Step => shape.num_tokens,
            TokenRows::Logits => shape.num_logits,
        };
        if count == 0 {
            return 0;
        }
        let tile = TokenTile::for_count(count, self.variant);
        for part in &self.parts {
            let split =
                split_groups(&self.config, count, self.k, part.rows as usize, self.wg_limit);
            let pipeline = part
                .pipelines
                .iter()
                .find_map(|(key, p)| (*key == (tile, split)).then_some(p))
                .expect("for_count and split_groups pick a pipeline the part built");
            // rows per workgroup: one tile of the weight layout (64 invocations × 1 row, split-K
            // groups of 64 / split invocations, 16 lanes × 4 rows, or the tiled GEMM's 64 × 32)
            let rows_per_group = TILE_ROWS as u32 / split;
            let (row_groups, token_groups) =
                (groups(part.rows, rows_per_group), groups(count, tile.tokens(self.variant)));
            // the subgroup variant walks token tiles first (x), so a weight tile stays in cache
            let grid = match self.variant {
                LinearVariant::Gpu => [row_groups, token_groups, 1],
                LinearVariant::Subgroup => [token_groups, row_groups, 1],
            };
            check_grid(grid, self.wg_limit);
            pass.set_pipeline(&pipeline.pipeline);
            pass.set_bind_group(0, &part.bind_group, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        }
        self.parts.len() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::{split_groups, KernelConfig, LinearVariant, SPLIT_MAX_TOKENS};

    fn config(linear: LinearVariant, split_k: bool) -> KernelConfig {
        KernelConfig {
            max_binding_bytes: 1 << 27,
            workgroup_memory: 16384,
            linear,
            split_k,
            lanes_attention: false,
            lanes_norm: false,
            lanes_rotate: false,
            lane_loads: super::LaneLoads::Words32,
            lane_partition: 64,
            moe_grouped: false,
            gpu_sampling: false,
        }
    }

    /// Split-K only for the GPU variant where the config splits, in steps of at most
    /// SPLIT_MAX_TOKENS: a group per chunk of 256 inputs up to 8 (a power of two), halved while
    /// the row groups pass the workgroup limit.
    #[test]
    fn split_groups_by_chunks_tokens_and_limit() {
        let split = config(LinearVariant::Gpu, true);
        let gpu = |k, rows, limit| split_groups(&split, 1, k, rows, limit);
        assert_eq!(gpu(64, 100, 65535), 1);
        assert_eq!(gpu(256, 100, 65535), 1);
        assert_eq!(gpu(320, 100, 65535), 2);
        assert_eq!(gpu(576, 576, 65535), 4);
        assert_eq!(gpu(1536, 576, 65535), 8);
        assert_eq!(gpu(14336, 4096, 65535), 8);
        // 262,144 rows: 8 groups make 32,768 workgroups of 8 rows; a limit of 20,000 takes 4
        assert_eq!(gpu(640, 262_144, 65535), 4);
        assert_eq!(gpu(4096, 262_144, 65535), 8);
        assert_eq!(gpu(4096, 262_144, 20_000), 4);
        assert_eq!(gpu(4096, 262_144, 1000), 1);
        for count in [2, 3, 9, SPLIT_MAX_TOKENS] {
            assert_eq!(split_groups(&split, count, 4096, 4096, 65535), 8, "{count}");
        }
        for count in [SPLIT_MAX_TOKENS + 1, 64, 512] {
            assert_eq!(split_groups(&split, count, 4096, 4096, 65535), 1, "{count}");
        }
        let unsplit = config(LinearVariant::Gpu, false);
        let subgroup = config(LinearVariant::Subgroup, true);
        for count in [1, 9, 64] {
            assert_eq!(split_groups(&unsplit, count, 4096, 4096, 65535), 1);
            assert_eq!(split_groups(&subgroup, count, 4096, 4096, 65535), 1);
        }
    }
}

#[cfg(test)]
mod token_tile_tests {
    use super::{LinearVariant, TokenTile};

    /// The wide tile where its padded cost is lower, never on the GPU variant; every tile the
    /// choice can return is one the variant builds.
    #[test]
    fn for_count_picks_by_padded_cost() {
        let sub = |c| TokenTile::for_count(c, LinearVariant::Subgroup);
        for c in [1, 2] {
            assert_eq!(sub(c), TokenTile::One, "{c}");
        }
        for c in (3..=8).chain(17..=24).chain(33..=40).chain(49..=56) {
            assert_eq!(sub(c), TokenTile::Many, "{c}");
        }
        for c in (9..=16).chain(25..=32).chain(41..=48).chain(57..=4096) {
            assert_eq!(sub(c), TokenTile::Wide, "{c}");
        }
        for variant in [LinearVariant::Gpu, LinearVariant::Subgroup] {
            for c in 1..=4096 {
                let tile = TokenTile::for_count(c, variant);
                assert!(TokenTile::of_variant(variant).contains(&tile), "{variant:?} {c}");
            }
        }
        assert!(!TokenTile::of_variant(LinearVariant::Gpu).contains(&TokenTile::Wide));
        assert!(!TokenTile::of_variant(LinearVariant::Subgroup).contains(&TokenTile::Tiled));
    }

    /// The GPU variant: one token a row at decode, the 4-token matvec up to 16 tokens (where
    /// split-K may run), the tiled GEMM past that.
    #[test]
    fn for_count_tiles_the_gpu_variant_past_split_k() {
        let gpu = |c| TokenTile::for_count(c, LinearVariant::Gpu);
        assert_eq!(gpu(1), TokenTile::One);
        assert_eq!(gpu(2), TokenTile::One);
        for c in 3..=super::SPLIT_MAX_TOKENS {
            assert_eq!(gpu(c), TokenTile::Many, "{c}");
        }
        for c in super::SPLIT_MAX_TOKENS + 1..=4096 {
            assert_eq!(gpu(c), TokenTile::Tiled, "{c}");
        }
        assert_eq!(TokenTile::Tiled.tokens(LinearVariant::Gpu), super::TILED_TOKENS);
    }
}
