//! Host half of `shaders/kv_quantize/`: quantized KV cache writes.
//!
//! - `kv_quantize.wgsl`: quantizes the head blocks completed in a step, bit for bit as
//!   [`crate::quant::quantize_head_block`], from the sequence's f16 staging slot and the step's
//!   qkv rows.
//! - `kv_stage.wgsl`: copies the step's rows that land in a partial last block into the
//!   sequence's staging slot (f16).
//! - `codec_test.wgsl`: the WGSL codecs on arrays, for the tests against `quant/`.
//!
//! Per layer and step, with quantized KV: `kv_quantize` before the attention kernels (they read
//! the blocks completed in this step), `kv_stage` after them (a chunk that completes a block and
//! starts the next would otherwise overwrite staged rows the completed block still needs).
//!
//! Staging buffer (one per layer, K and V halves): `[2, stage_slots, kv_heads, block_size,
//! head_dim / 2]` u32 (two f16). One buffer rather than two keeps the prefill kernel within
//! WebGPU's default of 8 storage bindings per stage.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::rope::QkvLayout;
use super::source::{kv_snippet, KV_CODEC, STEP};
use super::{check_grid, groups, Kernel, Kernels, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};
use crate::quant::{head_block_words, KvCacheSpec, KvFormat, KvQuant, ScaleGranularity};

/// The code formats a quantized pool can hold (every [`KvFormat`] but f16); selects the
/// `shaders/common/kv_<format>.wgsl` snippet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvCodeFormat {
    Fp8E4m3,
    Fp8E5m2,
    Int8,
    Int4,
}

impl KvCodeFormat {
    pub const ALL: [KvCodeFormat; 4] =
        [KvCodeFormat::Fp8E4m3, KvCodeFormat::Fp8E5m2, KvCodeFormat::Int8, KvCodeFormat::Int4];

    /// The code format of `format`; `None` for f16 (no codes, no scales).
    pub fn of(format: KvFormat) -> Option<Self> {
        match format {
            KvFormat::F16 => None,
            KvFormat::Fp8E4m3 => Some(KvCodeFormat::Fp8E4m3),
            KvFormat::Fp8E5m2 => Some(KvCodeFormat::Fp8E5m2),
            KvFormat::Int8 => Some(KvCodeFormat::Int8),
            KvFormat::Int4 => Some(KvCodeFormat::Int4),
        }
    }

    pub fn format(self) -> KvFormat {
        match self {
            KvCodeFormat::Fp8E4m3 => KvFormat::Fp8E4m3,
            KvCodeFormat::Fp8E5m2 => KvFormat::Fp8E5m2,
            KvCodeFormat::Int8 => KvFormat::Int8,
            KvCodeFormat::Int4 => KvFormat::Int4,
        }
    }
}

/// What a quantized-KV kernel variant is compiled for: the code format (a snippet) and the
/// K and V granularities (override constants `K_GRAN`, `V_GRAN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvQuantKey {
    pub format: KvCodeFormat,
    pub k: ScaleGranularity,
    pub v: ScaleGranularity,
}

impl KvQuantKey {
    /// The key of a spec; `None` for f16 KV.
    pub fn of(spec: &KvCacheSpec) -> Option<Self> {
        Some(KvQuantKey {
            format: KvCodeFormat::of(spec.format())?,
            k: spec.k.granularity,
            v: spec.v.granularity,
        })
    }

    /// Values of the `K_GRAN`/`V_GRAN` override constants.
    pub fn constants(self) -> [(&'static str, f64); 2] {
        [("K_GRAN", gran_code(self.k)), ("V_GRAN", gran_code(self.v))]
    }

    /// Every (format, K granularity, V granularity) a quantized pool can have.
    pub fn all() -> Vec<KvQuantKey> {
        let mut keys = Vec::new();
        for format in KvCodeFormat::ALL {
            let valid = |g| KvQuant { format: format.format(), granularity: g }.is_valid();
            for k in ScaleGranularity::ALL.into_iter().filter(|&g| valid(g)) {
                for v in ScaleGranularity::ALL.into_iter().filter(|&g| valid(g)) {
                    keys.push(KvQuantKey { format, k, v });
                }
            }
        }
        keys
    }
}

/// WGSL `GRAN_*` (shaders/common/kv_codec.wgsl) of a granularity.
pub fn gran_code(g: ScaleGranularity) -> f64 {
    match g {
        ScaleGranularity::PerTensor => 0.0,
        ScaleGranularity::PerChannel => 1.0,
        ScaleGranularity::PerToken => 2.0,
        ScaleGranularity::PerHead => 3.0,
    }
}

/// Geometry of a quantized KV pool as the kernels address it. Built from the same
/// [`head_block_words`] the byte plan uses, so pool, plan and kernels agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvQuantLayout {
    pub key: KvQuantKey,
    /// u32 words of one K head block: codes, then scales.
    pub k_head_block_words: u32,
    pub v_head_block_words: u32,
    /// u32 words of codes at the start of a K head block.
    pub k_data_words: u32,
    pub v_data_words: u32,
    /// Staging slots (sequences that can run at once).
    pub stage_slots: u32,
}

impl KvQuantLayout {
    /// The layout of `spec` for this shape; `None` for f16 KV.
    pub fn new(
        spec: &KvCacheSpec,
        block_size: usize,
        head_dim: usize,
        stage_slots: usize,
    ) -> Option<Self> {
        let key = KvQuantKey::of(spec)?;
        let k = head_block_words(spec.k, block_size, head_dim);
        let v = head_block_words(spec.v, block_size, head_dim);
        Some(KvQuantLayout {
            key,
            k_head_block_words: k.total_words as u32,
            v_head_block_words: v.total_words as u32,
            k_data_words: k.data_words as u32,
            v_data_words: v.data_words as u32,
            stage_slots: stage_slots as u32,
        })
    }
}

/// u32 words of one layer's staging buffer: `2 × stage_slots × kv_heads × block_size ×
/// head_dim / 2`.
pub fn stage_words(
    stage_slots: usize,
    num_kv_heads: usize,
    block_size: usize,
    head_dim: usize,
) -> usize {
    2 * stage_slots * num_kv_heads * block_size * head_dim / 2
}

/// Mirror of WGSL `KvQuantizeParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct KvQuantizeParams {
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub block_size: u32,
    pub qkv_stride: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    pub stage_slots: u32,
    pub k_head_block_words: u32,
    pub v_head_block_words: u32,
    pub k_data_words: u32,
    pub v_data_words: u32,
    /// KV heads (head blocks) a pool block has room for ([`QkvLayout::pool_heads`]).
    pub pool_heads: u32,
    /// The layer's first pool head ([`QkvLayout::pool_head_base`]).
    pub pool_head_base: u32,
    pub _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<KvQuantizeParams>() == 64);

/// Binding order of `kv_quantize.wgsl`.
pub const QUANTIZE_BINDINGS: [BindingKind; 7] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: KvQuantizeParams
    BindingKind::StorageRead,      // qkv: [tokens, qkv_stride]
    BindingKind::StorageRead,      // stage: [2, stage_slots, kv_heads, block_size, head_dim / 2]
    BindingKind::StorageRead,      // completed: [num_completed_blocks] (block, slot, row, staged)
    BindingKind::StorageReadWrite, // k_pool: [blocks, kv_heads, k_head_block_words]
    BindingKind::StorageReadWrite, // v_pool: [blocks, kv_heads, v_head_block_words]
];

/// A `kv_quantize` pipeline: the pool's format and granularities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantizeKey {
    pub kv: KvQuantKey,
}

impl Kernel for QuantizeKey {
    fn parts(&self) -> Vec<&'static str> {
        let kernel = include_str!("../../shaders/kv_quantize/kv_quantize.wgsl");
        vec![STEP, KV_CODEC, kv_snippet(self.kv.format), kernel]
    }

    fn constants(&self) -> Vec<(&'static str, f64)> {
        self.kv.constants().to_vec()
    }

    fn bindings(&self) -> Vec<BindingKind> {
        QUANTIZE_BINDINGS.to_vec()
    }

    fn all() -> Vec<Self> {
        KvQuantKey::all().into_iter().map(|kv| QuantizeKey { kv }).collect()
    }
}

/// Largest `max(block_size, head_dim)` the kernel's workgroup arrays hold (scale groups).
pub const MAX_GROUPS: usize = 1024;

/// Buffers of one layer's quantize op.
pub struct KvQuantizeIo<'a> {
    pub step: &'a wgpu::Buffer,
    pub qkv: &'a wgpu::Buffer,
    pub stage: &'a wgpu::Buffer,
    pub completed: &'a wgpu::Buffer,
    pub k_pool: &'a wgpu::Buffer,
    pub v_pool: &'a wgpu::Buffer,
}

/// One layer's `kv_quantize` dispatch: (completed blocks, kv_heads, K|V) workgroups.
pub struct KvQuantizeOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    num_kv_heads: u32,
    /// K and V (2), or K only (1) when the values are the keys' first channels (MLA).
    parts: u32,
    wg_limit: u32,
}

impl KvQuantizeOp {
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        layout: QkvLayout,
        block_size: u32,
        kv: KvQuantLayout,
        io: KvQuantizeIo<'_>,
    ) -> Self {
        assert!(
            (block_size as usize).max(layout.head_dim as usize) <= MAX_GROUPS,
            "kv_quantize holds at most {MAX_GROUPS} scale groups per head block"
        );
        assert!(layout.head_dim.is_multiple_of(8), "quantized KV needs head_dim a multiple of 8");
        let params = KvQuantizeParams {
            num_kv_heads: layout.num_kv_heads,
            head_dim: layout.head_dim,
            block_size,
            qkv_stride: layout.stride(),
            k_offset: layout.k_offset(),
            v_offset: layout.v_offset(),
            stage_slots: kv.stage_slots,
            k_head_block_words: kv.k_head_block_words,
            v_head_block_words: kv.v_head_block_words,
            k_data_words: kv.k_data_words,
            v_data_words: kv.v_data_words,
            pool_heads: layout.pool_heads,
            pool_head_base: layout.pool_head_base,
            _pad: [0; 3],
        };
        let ubuf = gpu.uniform_buffer_init("kv_quantize", bytemuck::bytes_of(&params));
        let pipeline = kernels.pipeline(gpu, QuantizeKey { kv: kv.key });
        let bind_group = pipeline.bind_group(
            gpu,
            "kv_quantize",
            &[io.step, &ubuf, io.qkv, io.stage, io.completed, io.k_pool, io.v_pool],
        );
        KvQuantizeOp {
            bind_group,
            pipeline,
            num_kv_heads: layout.num_kv_heads,
            parts: if layout.values_in_keys { 1 } else { 2 },
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        if shape.num_completed_blocks == 0 {
            return 0;
        }
        let grid = [shape.num_completed_blocks, self.num_kv_heads, self.parts];
        check_grid(grid, self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        1
    }
}

/// Mirror of WGSL `KvStageParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct KvStageParams {
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub block_size: u32,
    pub qkv_stride: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    pub stage_slots: u32,
    pub _pad: u32,
}
const _: () = assert!(std::mem::size_of::<KvStageParams>() == 32);

/// Binding order of `kv_stage.wgsl`.
pub const STAGE_BINDINGS: [BindingKind; 5] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: KvStageParams
    BindingKind::StorageRead,      // qkv: [tokens, qkv_stride]
    BindingKind::StorageRead,      // stage_rows: [num_stage_rows] (row, slot · block_size + offset)
    BindingKind::StorageReadWrite, // stage: [2, stage_slots, kv_heads, block_size, head_dim / 2]
];

one_variant_key!(
    /// The `kv_stage` pipeline (one variant).
    StageKey,
    parts: [STEP, include_str!("../../shaders/kv_quantize/kv_stage.wgsl")],
    bindings: STAGE_BINDINGS,
);

/// One layer's `kv_stage` dispatch: one invocation per (word of a row, staged row).
pub struct KvStageOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    words_per_row: u32,
    wg_limit: u32,
}

impl KvStageOp {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        step: &wgpu::Buffer,
        qkv: &wgpu::Buffer,
        stage_rows: &wgpu::Buffer,
        stage: &wgpu::Buffer,
        layout: QkvLayout,
        block_size: u32,
        stage_slots: u32,
    ) -> Self {
        let params = KvStageParams {
            num_kv_heads: layout.num_kv_heads,
            head_dim: layout.head_dim,
            block_size,
            qkv_stride: layout.stride(),
            k_offset: layout.k_offset(),
            v_offset: layout.v_offset(),
            stage_slots,
            _pad: 0,
        };
        let ubuf = gpu.uniform_buffer_init("kv_stage", bytemuck::bytes_of(&params));
        let pipeline = kernels.pipeline(gpu, StageKey);
        let bind_group =
            pipeline.bind_group(gpu, "kv_stage", &[step, &ubuf, qkv, stage_rows, stage]);
        KvStageOp {
            bind_group,
            pipeline,
            words_per_row: layout.num_kv_heads * layout.head_dim / 2,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        if shape.num_stage_rows == 0 {
            return 0;
        }
        let grid = [groups(self.words_per_row, 64), shape.num_stage_rows, 1];
        check_grid(grid, self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        1
    }
}

/// Binding order of `codec_test.wgsl`.
pub const CODEC_TEST_BINDINGS: [BindingKind; 6] = [
    BindingKind::StorageRead,      // a_in: [n]
    BindingKind::StorageRead,      // b_in: [n]
    BindingKind::StorageRead,      // m_in: [n]
    BindingKind::StorageRead,      // words: [n + 1]
    BindingKind::StorageReadWrite, // codes: [n, 8]
    BindingKind::StorageReadWrite, // raw: [n, 16]
];

/// The codec test pipeline of a code format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CodecTestKey {
    pub format: KvCodeFormat,
}

impl Kernel for CodecTestKey {
    fn parts(&self) -> Vec<&'static str> {
        let kernel = include_str!("../../shaders/kv_quantize/codec_test.wgsl");
        vec![KV_CODEC, kv_snippet(self.format), kernel]
    }

    fn bindings(&self) -> Vec<BindingKind> {
        CODEC_TEST_BINDINGS.to_vec()
    }

    fn all() -> Vec<Self> {
        KvCodeFormat::ALL.map(|format| CodecTestKey { format }).to_vec()
    }
}

/// What the codec test kernel computed for every input (layout in `codec_test.wgsl`).
#[derive(Clone, Debug)]
pub struct CodecOutputs {
    /// [n, 8]
    pub codes: Vec<u32>,
    /// [n, 16]
    pub raw: Vec<f32>,
}

/// Runs `codec_test.wgsl` with `format`'s snippet on `a`, `b`, `m` (`[n]` each) and `words`
/// (`[n + 1]`). Test-only; submits and waits.
#[track_caller]
pub fn run_codec_test(
    gpu: &Gpu,
    kernels: &Kernels,
    format: KvCodeFormat,
    a: &[f32],
    b: &[f32],
    m: &[f32],
    words: &[u32],
) -> Result<CodecOutputs, crate::gpu::GpuError> {
    let n = a.len();
    assert!(n > 0 && b.len() == n && m.len() == n && words.len() == n + 1, "codec test shapes");
    let pipeline = kernels.pipeline(gpu, CodecTestKey { format });
    let buf = |label: &str, data: &[u8]| gpu.storage_buffer_init(label, data);
    let (a_b, b_b, m_b) = (
        buf("codec a", bytemuck::cast_slice(a)),
        buf("codec b", bytemuck::cast_slice(b)),
        buf("codec m", bytemuck::cast_slice(m)),
    );
    let w_b = buf("codec words", bytemuck::cast_slice(words));
    let codes = gpu.storage_buffer("codec codes", (n * 8 * 4) as u64);
    let raw = gpu.storage_buffer("codec raw", (n * 16 * 4) as u64);
    let bg = pipeline.bind_group(gpu, "codec test", &[&a_b, &b_b, &m_b, &w_b, &codes, &raw]);
    let mut enc = gpu
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("codec test") });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("codec test"),
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline.pipeline);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(groups(n as u32, 64), 1, 1);
    }
    gpu.queue.submit([enc.finish()]);
    Ok(CodecOutputs { codes: gpu.read_u32(&codes, 0, n * 8)?, raw: gpu.read_f32(&raw, 0, n * 16)? })
}
