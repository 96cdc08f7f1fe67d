//! Host half of `shaders/delta_net/`: the kernels of a Gated DeltaNet layer (Qwen3.5's linear
//! attention, as transformers' `Qwen3_5GatedDeltaNet` defines it), whose per-sequence memory
//! is a fixed-size state instead of K/V rows:
//!
//! ```text
//! qkv   = silu(causal_conv1d(x_qkv))        ConvOp: conv.wgsl, then conv_state.wgsl
//!                                           (conv state: the last taps − 1 inputs)
//! o     = gated_delta_rule(q, k, v, a, b)   ScanOp: scan.wgsl (recurrent state [v_heads, DK, dv])
//! o     = rms_norm(o) · w · silu(z)         GatedNormOp: gated_norm.wgsl
//! ```
//!
//! States live in slots (`SeqInfo::state_slot`): the conv pool is `[slots, taps − 1,
//! channels]` f32, the recurrent pool `[slots, v_heads, DK, dv]` f32 (transformers' layout).
//! A step that starts its sequence (position 0) starts from zero states whatever its slot
//! holds, so slots are never cleared and a preempted sequence recomputed from its start is
//! right.
//! Prefill and decode run the same per-token update in one fixed order, so a state's bits do
//! not depend on how its tokens were split into steps or batched with others
//! (`tests/kernel_delta_net.rs` checks it bit for bit); the scan walks at most
//! [`SCAN_TOKENS`] tokens of each sequence per dispatch and the conv at most
//! [`CONV_TOKENS`] per invocation, for llvmpipe's 65,535 loop iterations (DESIGN "Traps").
//!
//! GPU shape: the conv spreads over channels × sequences × token chunks; the scan over value
//! heads × column tiles × sequences, each invocation holding one state column in registers
//! (vec4s) with q and k shared in workgroup memory — the layout of llama.cpp's
//! `ggml-webgpu/wgsl-shaders/gated_delta_net.wgsl` and `ggml-vulkan/…/gated_delta_net.comp`
//! (one invocation per state column, the column in registers), with the column tiles added so
//! a decode batch fills more workgroups; the gated norm a 64-wide workgroup per (token, head)
//! row. Nothing here was shaped by lavapipe's speed.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::source::{RMS, STEP};
use super::{check_grid, groups, Kernel, Kernels, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};

/// Tokens of a sequence one conv invocation walks (WGSL `CT` in `conv.wgsl`).
pub const CONV_TOKENS: u32 = 256;
/// Most conv taps (WGSL `MAX_TAPS`): Qwen3.5 uses 4, short-conv hybrids 3.
pub const MAX_TAPS: u32 = 8;
/// Tokens of each sequence one scan dispatch walks.
pub const SCAN_TOKENS: u32 = 128;
/// Key head sizes the scan is built for (WGSL `DK`, a constant: the state column is a
/// private array).
pub const SCAN_KEY_DIMS: [u32; 3] = [64, 128, 256];

/// Mirror of WGSL `ConvParams` (`conv.wgsl`, `conv_state.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ConvParams {
    pub channels: u32,
    pub x_stride: u32,
    pub x_offset: u32,
    pub out_stride: u32,
}
const _: () = assert!(std::mem::size_of::<ConvParams>() == 16);

/// Mirror of WGSL `ScanParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct ScanParams {
    pub k_heads: u32,
    pub v_heads: u32,
    pub dv: u32,
    pub qkv_stride: u32,
    pub q_offset: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    pub ab_stride: u32,
    pub b_offset: u32,
    pub a_offset: u32,
    pub out_stride: u32,
    pub token_base: u32,
    pub token_count: u32,
    pub k_tiled: u32,
    pub _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<ScanParams>() == 64);

/// Mirror of WGSL `GatedNormParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct GatedNormParams {
    pub v_heads: u32,
    pub dv: u32,
    pub o_stride: u32,
    pub z_stride: u32,
    pub z_offset: u32,
    pub eps: f32,
    pub _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<GatedNormParams>() == 32);

/// Binding order of `conv.wgsl`.
pub const CONV_BINDINGS: [BindingKind; 7] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: ConvParams
    BindingKind::StorageRead,      // seqs: [num_seqs] SeqInfo
    BindingKind::StorageRead,      // x: [tokens, x_stride]
    BindingKind::StorageRead,      // w: [channels, taps]
    BindingKind::StorageRead,      // state: [slots, taps − 1, channels]
    BindingKind::StorageReadWrite, // out: [tokens, out_stride]
];

/// Binding order of `conv_state.wgsl`.
pub const CONV_STATE_BINDINGS: [BindingKind; 5] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: ConvParams
    BindingKind::StorageRead,      // seqs: [num_seqs] SeqInfo
    BindingKind::StorageRead,      // x: [tokens, x_stride]
    BindingKind::StorageReadWrite, // state: [slots, taps − 1, channels]
];

/// Binding order of `scan.wgsl`.
pub const SCAN_BINDINGS: [BindingKind; 8] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: ScanParams
    BindingKind::StorageRead,      // seqs: [num_seqs] SeqInfo
    BindingKind::StorageRead,      // qkv: [tokens, qkv_stride] (the conv's output)
    BindingKind::StorageRead,      // ab: [tokens, ab_stride]
    BindingKind::StorageRead,      // head_params: [v_heads, 2] (neg_a, dt_bias)
    BindingKind::StorageReadWrite, // state: [slots, v_heads, DK, dv]
    BindingKind::StorageReadWrite, // out: [tokens, out_stride]
];

/// Binding order of `gated_norm.wgsl`.
pub const GATED_NORM_BINDINGS: [BindingKind; 5] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: GatedNormParams
    BindingKind::StorageRead,      // z: [tokens, z_stride]
    BindingKind::StorageRead,      // w: [dv]
    BindingKind::StorageReadWrite, // o: [tokens, o_stride], normed in place
];

/// The conv's taps and `ConvParams`, shared by `conv.wgsl` and `conv_state.wgsl`.
const CONV_PARAMS: &str = include_str!("../../shaders/delta_net/conv_params.wgsl");
const DK_64: &str = "const DK: u32 = 64u;\n";
const DK_128: &str = "const DK: u32 = 128u;\n";
const DK_256: &str = "const DK: u32 = 256u;\n";

/// A Gated DeltaNet pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeltaNetKey {
    /// The causal conv1d + SiLU of `taps` taps (WGSL `CONV_K`).
    Conv { taps: u32 },
    /// The conv state's advance past the step.
    ConvState { taps: u32 },
    /// The gated delta rule for key heads of `dk` channels, `cols` state columns a workgroup
    /// (WGSL `COLS`, [`scan_columns`]).
    Scan { dk: u32, cols: u32 },
    /// The gated RMSNorm.
    GatedNorm,
}

/// Columns of state one scan workgroup takes for value heads of `dv` channels: the widest of
/// 64, 32, 16, 8, 4 that divides `dv` (a subgroup or two on GPUs, more workgroups for short
/// batches than whole heads would give); `None` when `dv` is not a multiple of 4.
pub fn scan_columns(dv: u32) -> Option<u32> {
    [64, 32, 16, 8, 4].into_iter().find(|&c| dv.is_multiple_of(c))
}

impl Kernel for DeltaNetKey {
    fn parts(&self) -> Vec<&'static str> {
        match self {
            DeltaNetKey::Conv { .. } => {
                vec![STEP, CONV_PARAMS, include_str!("../../shaders/delta_net/conv.wgsl")]
            }
            DeltaNetKey::ConvState { .. } => {
                vec![STEP, CONV_PARAMS, include_str!("../../shaders/delta_net/conv_state.wgsl")]
            }
            DeltaNetKey::Scan { dk, .. } => {
                let dk = match dk {
                    64 => DK_64,
                    128 => DK_128,
                    256 => DK_256,
                    _ => panic!("no scan for key heads of {dk} channels ({SCAN_KEY_DIMS:?})"),
                };
                vec![STEP, dk, include_str!("../../shaders/delta_net/scan.wgsl")]
            }
            DeltaNetKey::GatedNorm => {
                vec![STEP, RMS, include_str!("../../shaders/delta_net/gated_norm.wgsl")]
            }
        }
    }

    fn constants(&self) -> Vec<(&'static str, f64)> {
        match *self {
            DeltaNetKey::Conv { taps } | DeltaNetKey::ConvState { taps } => {
                vec![("CONV_K", f64::from(taps))]
            }
            DeltaNetKey::Scan { cols, .. } => vec![("COLS", f64::from(cols))],
            DeltaNetKey::GatedNorm => Vec::new(),
        }
    }

    fn bindings(&self) -> Vec<BindingKind> {
        match self {
            DeltaNetKey::Conv { .. } => CONV_BINDINGS.to_vec(),
            DeltaNetKey::ConvState { .. } => CONV_STATE_BINDINGS.to_vec(),
            DeltaNetKey::Scan { .. } => SCAN_BINDINGS.to_vec(),
            DeltaNetKey::GatedNorm => GATED_NORM_BINDINGS.to_vec(),
        }
    }

    fn all() -> Vec<Self> {
        let mut all = Vec::new();
        for taps in 2..=MAX_TAPS {
            all.push(DeltaNetKey::Conv { taps });
            all.push(DeltaNetKey::ConvState { taps });
        }
        for dk in SCAN_KEY_DIMS {
            for cols in [4, 8, 16, 32, 64] {
                all.push(DeltaNetKey::Scan { dk, cols });
            }
        }
        all.push(DeltaNetKey::GatedNorm);
        all
    }
}

/// The buffers of a [`ConvOp`].
pub struct ConvIo<'a> {
    pub step: &'a wgpu::Buffer,
    pub seqs: &'a wgpu::Buffer,
    /// The conv's input rows (the layer's `in_proj_qkv` output), channel 0 at `x_offset`.
    pub x: &'a wgpu::Buffer,
    /// `[channels, taps]` f32.
    pub weight: &'a wgpu::Buffer,
    /// `[slots, taps − 1, channels]` f32.
    pub state: &'a wgpu::Buffer,
    /// `[tokens, out_stride]` f32: channel c at column c.
    pub out: &'a wgpu::Buffer,
}

/// The conv's sizes: channels, taps, and where they sit in the rows of x and out.
#[derive(Clone, Copy, Debug)]
pub struct ConvDims {
    pub channels: u32,
    pub taps: u32,
    pub x_stride: u32,
    pub x_offset: u32,
    pub out_stride: u32,
}

/// The causal conv1d + SiLU over each sequence's step tokens, then its state's advance: two
/// dispatches.
pub struct ConvOp {
    conv: (Arc<Pipeline>, wgpu::BindGroup),
    advance: (Arc<Pipeline>, wgpu::BindGroup),
    channels: u32,
    wg_limit: u32,
}

impl ConvOp {
    #[track_caller]
    pub fn new(gpu: &Gpu, kernels: &Kernels, io: ConvIo<'_>, d: ConvDims) -> Self {
        assert!(
            (2..=MAX_TAPS).contains(&d.taps),
            "a conv of {} taps (2..={MAX_TAPS} are built)",
            d.taps
        );
        assert!(d.channels > 0, "a conv over no channels");
        assert!(d.x_offset + d.channels <= d.x_stride, "the conv's channels overrun a row of x");
        assert!(d.channels <= d.out_stride, "the conv's channels overrun a row of out");
        let state_per_slot = u64::from(d.taps - 1) * u64::from(d.channels) * 4;
        assert!(io.state.size() >= state_per_slot, "the conv state holds no slot");
        let w_bytes = u64::from(d.taps) * u64::from(d.channels) * 4;
        assert!(io.weight.size() >= w_bytes, "the conv weight holds fewer than channels × taps");
        let params = ConvParams {
            channels: d.channels,
            x_stride: d.x_stride,
            x_offset: d.x_offset,
            out_stride: d.out_stride,
        };
        let ubuf = gpu.uniform_buffer_init("delta_net conv", bytemuck::bytes_of(&params));
        let conv = kernels.pipeline(gpu, DeltaNetKey::Conv { taps: d.taps });
        let conv_group = conv.bind_group(
            gpu,
            "delta_net conv",
            &[io.step, &ubuf, io.seqs, io.x, io.weight, io.state, io.out],
        );
        let advance = kernels.pipeline(gpu, DeltaNetKey::ConvState { taps: d.taps });
        let advance_group = advance.bind_group(
            gpu,
            "delta_net conv state",
            &[io.step, &ubuf, io.seqs, io.x, io.state],
        );
        ConvOp {
            conv: (conv, conv_group),
            advance: (advance, advance_group),
            channels: d.channels,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    /// Records the conv and the state's advance; returns the dispatches made.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        if shape.num_seqs == 0 {
            return 0;
        }
        let x = groups(self.channels, 64);
        let chunks = shape.max_seq_tokens.div_ceil(CONV_TOKENS).max(1);
        for (grid, (pipeline, group)) in
            [([x, shape.num_seqs, chunks], &self.conv), ([x, shape.num_seqs, 1], &self.advance)]
        {
            check_grid(grid, self.wg_limit);
            pass.set_pipeline(&pipeline.pipeline);
            pass.set_bind_group(0, group, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        }
        2
    }
}

/// The buffers of a [`ScanOp`].
pub struct ScanIo<'a> {
    pub step: &'a wgpu::Buffer,
    pub seqs: &'a wgpu::Buffer,
    /// The conv's output rows: q heads, k heads, v heads at their offsets.
    pub qkv: &'a wgpu::Buffer,
    /// Rows holding each value head's b (β's input) and a (the decay's input).
    pub ab: &'a wgpu::Buffer,
    /// `[v_heads, 2]` f32: −exp(A_log), dt_bias.
    pub head_params: &'a wgpu::Buffer,
    /// `[slots, v_heads, dk, dv]` f32.
    pub state: &'a wgpu::Buffer,
    /// `[tokens, out_stride]` f32: value head h's outputs at h · dv.
    pub out: &'a wgpu::Buffer,
}

/// The scan's sizes and where its inputs sit in their rows.
#[derive(Clone, Copy, Debug)]
pub struct ScanDims {
    pub k_heads: u32,
    pub v_heads: u32,
    pub dk: u32,
    pub dv: u32,
    pub qkv_stride: u32,
    pub q_offset: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    pub ab_stride: u32,
    pub b_offset: u32,
    pub a_offset: u32,
    pub out_stride: u32,
    /// Most query tokens a sequence may have in one step (bind groups are made for that many
    /// [`SCAN_TOKENS`] dispatches).
    pub max_seq_tokens: u32,
    /// Value head h reads key head h % k_heads (a GGUF's order: llama.cpp's converter tiles
    /// the value heads) instead of h / (v_heads / k_heads) (transformers').
    pub k_tiled: bool,
}

/// The gated delta rule: ⌈longest sequence's step tokens / [`SCAN_TOKENS`]⌉ dispatches, each
/// continuing the states the previous one left.
pub struct ScanOp {
    pipeline: Arc<Pipeline>,
    /// One bind group per dispatch (its own `token_base`).
    groups: Vec<wgpu::BindGroup>,
    x_groups: u32,
    wg_limit: u32,
}

impl ScanOp {
    #[track_caller]
    pub fn new(gpu: &Gpu, kernels: &Kernels, io: ScanIo<'_>, d: ScanDims) -> Self {
        assert!(SCAN_KEY_DIMS.contains(&d.dk), "no scan for key heads of {} channels", d.dk);
        assert!(d.k_heads > 0 && d.v_heads.is_multiple_of(d.k_heads), "v_heads % k_heads");
        let cols = scan_columns(d.dv).expect("value heads a multiple of 4 channels");
        let (k_width, v_width) = (d.k_heads * d.dk, d.v_heads * d.dv);
        assert!(d.q_offset + k_width <= d.qkv_stride, "q heads overrun a row of qkv");
        assert!(d.k_offset + k_width <= d.qkv_stride, "k heads overrun a row of qkv");
        assert!(d.v_offset + v_width <= d.qkv_stride, "v heads overrun a row of qkv");
        assert!(d.b_offset.max(d.a_offset) + d.v_heads <= d.ab_stride, "a, b overrun ab");
        assert!(v_width <= d.out_stride, "the outputs overrun a row of out");
        assert!(io.head_params.size() >= u64::from(d.v_heads) * 8, "head_params: [v_heads, 2]");
        let per_slot = u64::from(d.v_heads) * u64::from(d.dk) * u64::from(d.dv) * 4;
        assert!(io.state.size() >= per_slot, "the recurrent state holds no slot");
        let pipeline = kernels.pipeline(gpu, DeltaNetKey::Scan { dk: d.dk, cols });
        let dispatches = d.max_seq_tokens.div_ceil(SCAN_TOKENS).max(1);
        let groups = (0..dispatches)
            .map(|i| {
                let params = ScanParams {
                    k_heads: d.k_heads,
                    v_heads: d.v_heads,
                    dv: d.dv,
                    qkv_stride: d.qkv_stride,
                    q_offset: d.q_offset,
                    k_offset: d.k_offset,
                    v_offset: d.v_offset,
                    ab_stride: d.ab_stride,
                    b_offset: d.b_offset,
                    a_offset: d.a_offset,
                    out_stride: d.out_stride,
                    token_base: i * SCAN_TOKENS,
                    token_count: SCAN_TOKENS,
                    k_tiled: u32::from(d.k_tiled),
                    _pad: [0; 2],
                };
                let ubuf = gpu.uniform_buffer_init("delta_net scan", bytemuck::bytes_of(&params));
                pipeline.bind_group(
                    gpu,
                    "delta_net scan",
                    &[io.step, &ubuf, io.seqs, io.qkv, io.ab, io.head_params, io.state, io.out],
                )
            })
            .collect();
        ScanOp {
            pipeline,
            groups,
            x_groups: d.v_heads * (d.dv / cols),
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    /// Records the step's scan dispatches; returns how many.
    #[track_caller]
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        if shape.num_seqs == 0 {
            return 0;
        }
        let dispatches = shape.max_seq_tokens.div_ceil(SCAN_TOKENS) as usize;
        assert!(
            dispatches <= self.groups.len(),
            "a sequence of {} step tokens: the scan was built for {}",
            shape.max_seq_tokens,
            self.groups.len() as u32 * SCAN_TOKENS
        );
        let grid = [self.x_groups, shape.num_seqs, 1];
        check_grid(grid, self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        for group in &self.groups[..dispatches] {
            pass.set_bind_group(0, group, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        }
        dispatches as u32
    }
}

/// The buffers of a [`GatedNormOp`].
pub struct GatedNormIo<'a> {
    pub step: &'a wgpu::Buffer,
    /// The gate rows (the layer's `in_proj_z` output).
    pub z: &'a wgpu::Buffer,
    /// `[dv]` f32.
    pub weight: &'a wgpu::Buffer,
    /// The scan's outputs, normed in place.
    pub o: &'a wgpu::Buffer,
}

/// The gated RMSNorm's sizes.
#[derive(Clone, Copy, Debug)]
pub struct GatedNormDims {
    pub v_heads: u32,
    pub dv: u32,
    pub o_stride: u32,
    pub z_stride: u32,
    pub z_offset: u32,
    pub eps: f32,
}

/// `o ← rms_norm(o) · w · silu(z)` per token and value head: one dispatch.
pub struct GatedNormOp {
    pipeline: Arc<Pipeline>,
    bind_group: wgpu::BindGroup,
    v_heads: u32,
    wg_limit: u32,
}

impl GatedNormOp {
    #[track_caller]
    pub fn new(gpu: &Gpu, kernels: &Kernels, io: GatedNormIo<'_>, d: GatedNormDims) -> Self {
        let width = d.v_heads * d.dv;
        assert!(d.dv > 0 && width <= d.o_stride, "the heads overrun a row of o");
        assert!(d.z_offset + width <= d.z_stride, "the gates overrun a row of z");
        assert!(io.weight.size() >= u64::from(d.dv) * 4, "the norm weight holds fewer than dv");
        let params = GatedNormParams {
            v_heads: d.v_heads,
            dv: d.dv,
            o_stride: d.o_stride,
            z_stride: d.z_stride,
            z_offset: d.z_offset,
            eps: d.eps,
            _pad: [0; 2],
        };
        let ubuf = gpu.uniform_buffer_init("delta_net gated norm", bytemuck::bytes_of(&params));
        let pipeline = kernels.pipeline(gpu, DeltaNetKey::GatedNorm);
        let bind_group = pipeline.bind_group(
            gpu,
            "delta_net gated norm",
            &[io.step, &ubuf, io.z, io.weight, io.o],
        );
        GatedNormOp {
            pipeline,
            bind_group,
            v_heads: d.v_heads,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        if shape.num_tokens == 0 {
            return 0;
        }
        let grid = [self.v_heads, shape.num_tokens, 1];
        check_grid(grid, self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        1
    }
}
