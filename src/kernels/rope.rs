//! Host half of `shaders/rope/rope.wgsl`: rotary position embedding of Q and K, in place.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::source::{ROPE_PAIR, STEP};
use super::{record_per_token, Kernels, StepShape};
use crate::gpu::{BindingKind, Gpu, Pipeline};
use crate::loader::{Rope, RopeScaling};

/// Which elements of a head form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairs {
    /// (x[2j], x[2j+1]): GGUF llama, whose Q/K rows llama.cpp's converter permuted.
    Interleaved,
    /// (x[j], x[j + head_dim/2]): HF layout ("rotate_half"), Qwen2, Gemma.
    Neox,
}

impl RopePairs {
    /// The kernels' `style` parameter.
    pub fn style(self) -> u32 {
        match self {
            RopePairs::Interleaved => 0,
            RopePairs::Neox => 1,
        }
    }
}

/// Mirror of WGSL `RopeParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RopeParams {
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub style: u32,
    pub qkv_stride: u32,
    pub q_offset: u32,
    pub k_offset: u32,
    pub head_stride: u32,
}
const _: () = assert!(std::mem::size_of::<RopeParams>() == 32);

/// Binding order of the RoPE kernel.
pub const BINDINGS: [BindingKind; 5] = [
    BindingKind::Uniform,          // step: StepInfo
    BindingKind::Uniform,          // p: RopeParams
    BindingKind::StorageReadWrite, // qkv: [tokens, qkv_stride]
    BindingKind::StorageRead,      // positions: [tokens]
    BindingKind::StorageRead,      // table: [max_positions, head_dim / 2] (cos, sin)
];

one_variant_key!(
    /// The RoPE pipeline (one variant).
    RopeKey,
    parts: [STEP, ROPE_PAIR, include_str!("../../shaders/rope/rope.wgsl")],
    bindings: BINDINGS,
);

/// `attention_factor · (cos, sin)` of `pos · inv_freq[j]` for every position and pair,
/// computed in f64, with `inv_freq` from [`inv_freqs`] (`attention_factor` is 1 except for YaRN).
/// [max_positions, head_dim / 2] (cos, sin)
pub fn rope_table(head_dim: usize, rope: &Rope, max_positions: usize) -> Vec<[f32; 2]> {
    rope_table_with_freq_factors(head_dim, rope, None, max_positions)
}

/// [`rope_table`] with each pair's frequency divided by `freq_factors[j]` (GGUF
/// `rope_freqs.weight`, as ggml's `rope_ext` applies it: `theta / freq_factor`).
/// [max_positions, head_dim / 2] (cos, sin)
pub fn rope_table_with_freq_factors(
    head_dim: usize,
    rope: &Rope,
    freq_factors: Option<&[f32]>,
    max_positions: usize,
) -> Vec<[f32; 2]> {
    let mut inv_freq = inv_freqs(head_dim, rope);
    if let Some(factors) = freq_factors {
        assert_eq!(factors.len(), inv_freq.len(), "one frequency factor per rotated pair");
        inv_freq.iter_mut().zip(factors).for_each(|(f, d)| *f /= f64::from(*d));
    }
    let mscale = match rope.scaling {
        RopeScaling::Yarn { attention_factor, .. } => attention_factor,
        _ => 1.0,
    };
    let mut table = Vec::with_capacity(max_positions * inv_freq.len());
    for pos in 0..max_positions {
        for f in &inv_freq {
            let angle = pos as f64 * f;
            table.push([(mscale * angle.cos()) as f32, (mscale * angle.sin()) as f32]);
        }
    }
    table
}

/// The rotation frequency of each pair, as HF's `modeling_rope_utils` computes them
/// (`_compute_default_rope_parameters`, `_compute_linear_scaling_rope_parameters`,
/// `_compute_llama3_parameters`, `_compute_yarn_parameters`).
/// [head_dim / 2]
pub fn inv_freqs(head_dim: usize, rope: &Rope) -> Vec<f64> {
    let dim = head_dim as f64;
    let base: Vec<f64> =
        (0..head_dim / 2).map(|j| rope.theta.powf(-((2 * j) as f64) / dim)).collect();
    match rope.scaling {
        RopeScaling::None => base,
        RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
        RopeScaling::Proportional { partial_rotary_factor, factor } => {
            // transformers' _compute_proportional_rope_parameters: int(p · d // 2) pairs turn
            let rotated = (partial_rotary_factor * dim / 2.0).floor() as usize;
            let keep = |(j, f): (usize, f64)| if j < rotated { f / factor } else { 0.0 };
            base.into_iter().enumerate().map(keep).collect()
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let old_len = original_max_position_embeddings as f64;
            let (low_wavelen, high_wavelen) =
                (old_len / low_freq_factor, old_len / high_freq_factor);
            let scale = |f: f64| {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                if wavelen < high_wavelen {
                    f
                } else if wavelen > low_wavelen {
                    f / factor
                } else {
                    let smooth = (old_len / wavelen - low_freq_factor)
                        / (high_freq_factor - low_freq_factor);
                    (1.0 - smooth) * f / factor + smooth * f
                }
            };
            base.into_iter().map(scale).collect()
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } => {
            // the dimension (of head_dim) at which a frequency turns `rotations` times over the
            // original context
            let correction_dim = |rotations: f64| {
                let max_pos = original_max_position_embeddings as f64;
                dim * (max_pos / (rotations * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * rope.theta.ln())
            };
            let (low, high) = (correction_dim(beta_fast), correction_dim(beta_slow));
            let (low, high) = if truncate { (low.floor(), high.ceil()) } else { (low, high) };
            let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
            if low == high {
                high += 0.001;
            }
            let ramp = |j: usize| ((j as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let blend = |(j, f): (usize, f64)| {
                let extrapolation = 1.0 - ramp(j);
                f / factor * (1.0 - extrapolation) + f * extrapolation
            };
            base.into_iter().enumerate().map(blend).collect()
        }
    }
}

/// Shape of the Q and K heads inside the fused qkv activation.
#[derive(Clone, Copy, Debug)]
pub struct QkvLayout {
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    /// The values are the first channels of the keys (MLA's latent `[c_kv ; k_pe]`): a row has
    /// no V heads, the KV pool no V buffer of its own, and `kv_write` writes K only.
    pub values_in_keys: bool,
    /// KV heads (head blocks) one block of the layer's pool buffers has room for: the pool
    /// kernels address KV head h of block b at head block `b · pool_heads + pool_head_base +
    /// h`. `num_kv_heads` for a model whose layers all have one head shape; more for a layer
    /// narrower than the widest of its pool slot (Gemma 4's sliding and global heads:
    /// `quant::pool_heads` decides).
    pub pool_heads: u32,
    /// The first of those heads that are the layer's (narrower layers packed into one slot:
    /// `kv::KvGroups::layer_slot`'s sub-slot × `num_kv_heads`); 0 otherwise.
    pub pool_head_base: u32,
}

impl QkvLayout {
    /// Q heads on `num_kv_heads` K heads and as many V heads, a pool block of exactly them.
    pub fn new(num_heads: u32, num_kv_heads: u32, head_dim: u32) -> Self {
        QkvLayout {
            num_heads,
            num_kv_heads,
            head_dim,
            values_in_keys: false,
            pool_heads: num_kv_heads,
            pool_head_base: 0,
        }
    }

    /// This layout over pool blocks with room for `pool_heads` KV heads (≥ `num_kv_heads`).
    pub fn with_pool_heads(self, pool_heads: u32) -> Self {
        self.with_pool_heads_from(pool_heads, 0)
    }

    /// This layout over pool blocks with room for `pool_heads` KV heads, the layer's from
    /// `base` on (`base + num_kv_heads ≤ pool_heads`).
    pub fn with_pool_heads_from(self, pool_heads: u32, base: u32) -> Self {
        assert!(
            base + self.num_kv_heads <= pool_heads,
            "a pool block holds every KV head of a layer"
        );
        QkvLayout { pool_heads, pool_head_base: base, ..self }
    }

    /// Floats per token row: Q heads, then K heads, then V heads (none when the values live
    /// in the keys).
    pub fn stride(&self) -> u32 {
        let v_heads = if self.values_in_keys { 0 } else { self.num_kv_heads };
        (self.num_heads + self.num_kv_heads + v_heads) * self.head_dim
    }
    pub fn k_offset(&self) -> u32 {
        self.num_heads * self.head_dim
    }
    /// Where V head 0 starts: K's own place when the values live in the keys.
    pub fn v_offset(&self) -> u32 {
        match self.values_in_keys {
            true => self.k_offset(),
            false => (self.num_heads + self.num_kv_heads) * self.head_dim,
        }
    }
}

/// Which channels of which heads RoPE rotates, in place in the qkv activation: `rot_dim`
/// channels starting at `q_offset + h · head_stride` (query head h) and `k_offset + h ·
/// head_stride` (key head h). Whole heads for most models (`From<QkvLayout>`); MLA rotates the
/// last `qk_rope_head_dim` channels of each latent head ([`RopeHeads::tail`]).
#[derive(Clone, Copy, Debug)]
pub struct RopeHeads {
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub rot_dim: u32,
    pub head_stride: u32,
    pub qkv_stride: u32,
    pub q_offset: u32,
    pub k_offset: u32,
}

impl From<QkvLayout> for RopeHeads {
    fn from(l: QkvLayout) -> Self {
        RopeHeads {
            num_heads: l.num_heads,
            num_kv_heads: l.num_kv_heads,
            rot_dim: l.head_dim,
            head_stride: l.head_dim,
            qkv_stride: l.stride(),
            q_offset: 0,
            k_offset: l.k_offset(),
        }
    }
}

impl RopeHeads {
    /// The first `rot_dim` channels of every Q and K head of `l` (partial RoPE).
    pub fn head(l: QkvLayout, rot_dim: u32) -> Self {
        RopeHeads { rot_dim, ..RopeHeads::from(l) }
    }

    /// The last `rot_dim` channels of every Q and K head of `l`.
    pub fn tail(l: QkvLayout, rot_dim: u32) -> Self {
        let skip = l.head_dim - rot_dim;
        RopeHeads { rot_dim, q_offset: skip, k_offset: l.k_offset() + skip, ..RopeHeads::from(l) }
    }
}

pub struct RopeOp {
    bind_group: wgpu::BindGroup,
    pipeline: Arc<Pipeline>,
    pairs_per_token: u32,
    wg_limit: u32,
}

impl RopeOp {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        step: &wgpu::Buffer,
        qkv: &wgpu::Buffer,
        positions: &wgpu::Buffer,
        table: &wgpu::Buffer,
        heads: RopeHeads,
        pairs: RopePairs,
    ) -> Self {
        let pipeline = kernels.pipeline(gpu, RopeKey);
        let params = RopeParams {
            num_heads: heads.num_heads,
            num_kv_heads: heads.num_kv_heads,
            head_dim: heads.rot_dim,
            style: pairs.style(),
            qkv_stride: heads.qkv_stride,
            q_offset: heads.q_offset,
            k_offset: heads.k_offset,
            head_stride: heads.head_stride,
        };
        let ubuf = gpu.uniform_buffer_init("rope", bytemuck::bytes_of(&params));
        let bind_group = pipeline.bind_group(gpu, "rope", &[step, &ubuf, qkv, positions, table]);
        RopeOp {
            bind_group,
            pipeline,
            pairs_per_token: (heads.num_heads + heads.num_kv_heads) * heads.rot_dim / 2,
            wg_limit: gpu.limits.max_compute_workgroups_per_dimension,
        }
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        let (pipeline, group) = (&self.pipeline, &self.bind_group);
        record_per_token(pass, pipeline, group, self.pairs_per_token, shape, self.wg_limit)
    }
}
