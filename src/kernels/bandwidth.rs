//! Host half of `shaders/bandwidth/`: the memory-bandwidth probes of `kvrun bench bandwidth`,
//! the ceiling decode is measured against (decode reads every weight and the KV history once
//! per token, so its speed limit is bandwidth ÷ bytes per token).
//!
//! Both probes walk a buffer of 16-byte words in a grid-stride loop (consecutive invocations
//! touch consecutive words, so loads coalesce on a GPU): `Read` XOR-folds every word into one
//! word per invocation (the loads cannot be dropped; the writes are 1/`words_per_invocation` of
//! the traffic), `Copy` writes every word to a second buffer. Each probe loads its words as
//! `vec4<u32>` and, where the adapter has 64-bit shader integers, also as `vec2<u64>`
//! ([`BandwidthLoads`]): a GPU moves the same 16 bytes either way, but llvmpipe loads each
//! lane's components one at a time, so there the u64 view reads twice the bytes per load
//! instruction (the linear kernels read weights that way). The ceiling is the best of them.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{check_grid, grid_2d, Kernel, KernelFeatures, Kernels};
use crate::gpu::{BindingKind, Capabilities, Gpu, Pipeline};

/// Bytes of one word (a `vec4<u32>` or `vec2<u64>`).
pub const WORD_BYTES: u64 = 16;
/// Invocations per workgroup (`@workgroup_size` of both shaders).
pub const WORKGROUP: u32 = 256;
/// Most invocations a grid has: 4,096 workgroups keep the largest GPUs busy while each
/// invocation still loops over several words (llvmpipe runs a workgroup per thread).
pub const MAX_INVOCATIONS: u32 = 4096 * WORKGROUP;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BandwidthProbe {
    /// Every word read once.
    Read,
    /// Every word read once and written once.
    Copy,
}

/// How a probe loads its 16-byte words (the WGSL type `Word`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BandwidthLoads {
    /// `vec4<u32>`: every adapter.
    U32x4,
    /// `vec2<u64>`: adapters with 64-bit shader integers.
    U64x2,
}

impl BandwidthLoads {
    pub const ALL: [BandwidthLoads; 2] = [BandwidthLoads::U32x4, BandwidthLoads::U64x2];

    /// The WGSL type of one word, as the report names it.
    pub fn name(self) -> &'static str {
        match self {
            BandwidthLoads::U32x4 => "vec4<u32>",
            BandwidthLoads::U64x2 => "vec2<u64>",
        }
    }

    /// The WGSL line defining `Word` (prepended to the probe's source).
    pub fn wgsl_alias(self) -> &'static str {
        match self {
            BandwidthLoads::U32x4 => "alias Word = vec4<u32>;\n",
            BandwidthLoads::U64x2 => "alias Word = vec2<u64>;\n",
        }
    }

    /// The load widths an adapter with `caps` runs.
    pub fn available(caps: &Capabilities) -> Vec<BandwidthLoads> {
        if caps.shader_int64 {
            Self::ALL.to_vec()
        } else {
            vec![BandwidthLoads::U32x4]
        }
    }
}

/// Every (probe, load width) an adapter with `caps` runs, reads first: what `bench
/// bandwidth` measures and the kernel tests check.
pub fn probe_runs(caps: &Capabilities) -> Vec<(BandwidthProbe, BandwidthLoads)> {
    let widths = BandwidthLoads::available(caps);
    BandwidthProbe::ALL.into_iter().flat_map(|p| widths.iter().map(move |&l| (p, l))).collect()
}

impl BandwidthProbe {
    pub const ALL: [BandwidthProbe; 2] = [BandwidthProbe::Read, BandwidthProbe::Copy];

    pub fn name(self) -> &'static str {
        match self {
            BandwidthProbe::Read => "read",
            BandwidthProbe::Copy => "copy",
        }
    }

    /// Bytes a run over `words` words moves: read, plus written for `Copy` (the read probe's
    /// per-invocation folds, at most 1/8 of a 128 MiB read, are not counted).
    pub fn bytes_moved(self, words: u32) -> u64 {
        let read = u64::from(words) * WORD_BYTES;
        match self {
            BandwidthProbe::Read => read,
            BandwidthProbe::Copy => 2 * read,
        }
    }

    /// Words of the destination buffer: one fold per invocation, or a full copy.
    pub fn dst_words(self, words: u32) -> u32 {
        match self {
            BandwidthProbe::Read => invocations(words),
            BandwidthProbe::Copy => words,
        }
    }
}

/// Invocations of the grid over `words` words (its stride): at most [`MAX_INVOCATIONS`].
pub fn invocations(words: u32) -> u32 {
    words.clamp(1, MAX_INVOCATIONS)
}

/// Mirror of WGSL `BandwidthParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct BandwidthParams {
    pub words: u32,
    pub invocations: u32,
    pub _pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<BandwidthParams>() == 16);

/// Binding order of both probes.
pub const BINDINGS: [BindingKind; 3] = [
    BindingKind::Uniform,          // p: BandwidthParams
    BindingKind::StorageRead,      // src: [words] Word
    BindingKind::StorageReadWrite, // dst: [dst_words] Word
];

/// A probe pipeline: what it does and how it loads its words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BandwidthKey {
    pub probe: BandwidthProbe,
    pub loads: BandwidthLoads,
}

impl Kernel for BandwidthKey {
    fn parts(&self) -> Vec<&'static str> {
        let kernel = match self.probe {
            BandwidthProbe::Read => include_str!("../../shaders/bandwidth/read.wgsl"),
            BandwidthProbe::Copy => include_str!("../../shaders/bandwidth/copy.wgsl"),
        };
        vec![self.loads.wgsl_alias(), include_str!("../../shaders/bandwidth/params.wgsl"), kernel]
    }

    fn bindings(&self) -> Vec<BindingKind> {
        BINDINGS.to_vec()
    }

    fn features(&self) -> KernelFeatures {
        KernelFeatures { subgroups: false, int64: self.loads == BandwidthLoads::U64x2 }
    }

    fn all() -> Vec<Self> {
        let loads = BandwidthLoads::ALL;
        let keys =
            BandwidthProbe::ALL.map(|probe| loads.map(|loads| BandwidthKey { probe, loads }));
        keys.into_iter().flatten().collect()
    }
}

pub struct BandwidthOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    grid: [u32; 3],
    wg_limit: u32,
}

impl BandwidthOp {
    /// `src` holds `words` words, `dst` at least `probe.dst_words(words)`; `loads` one of
    /// [`BandwidthLoads::available`].
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        probe: BandwidthProbe,
        loads: BandwidthLoads,
        src: &wgpu::Buffer,
        dst: &wgpu::Buffer,
        words: u32,
    ) -> Self {
        assert!(words > 0, "a bandwidth probe over 0 words");
        assert!(src.size() >= u64::from(words) * WORD_BYTES, "src smaller than {words} words");
        let dst_bytes = u64::from(probe.dst_words(words)) * WORD_BYTES;
        assert!(dst.size() >= dst_bytes, "dst smaller than {dst_bytes} bytes");
        let pipeline = kernels.pipeline(gpu, BandwidthKey { probe, loads });
        let n = invocations(words);
        let params = BandwidthParams { words, invocations: n, _pad: [0; 2] };
        let ubuf = gpu.uniform_buffer_init("bandwidth", bytemuck::bytes_of(&params));
        let bind_group = pipeline.bind_group(gpu, "bandwidth", &[&ubuf, src, dst]);
        let wg_limit = gpu.limits.max_compute_workgroups_per_dimension;
        let grid = grid_2d(n.div_ceil(WORKGROUP), wg_limit);
        BandwidthOp { bind_group, pipeline, grid, wg_limit }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        check_grid(self.grid, self.wg_limit);
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(self.grid[0], self.grid[1], self.grid[2]);
    }
}
