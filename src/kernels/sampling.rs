//! Host half of `shaders/logits/sample.wgsl`: random sampling on the GPU. Each logit row gets
//! the token the CPU sampler's rules draw (`sample::Sampler`, random mode: temperature, top-k,
//! min-p, top-p, in that order) from one uniform draw the host made with the sequence's seeded
//! RNG ([`RowSampling`]), so a sampled step reads back 4 bytes a row, not the row. It runs after
//! the argmax kernel and reads its result: rows at temperature 0 keep the argmax.
//!
//! The filters and the draw are radix selections over the row in the sampler's order (scaled
//! logit descending, id ascending), with weights exp(s − max) in 64-bit fixed point (2^31 for
//! the maximum), so the result is one integer computation whatever the summation order:
//! [`reference_sample`] is the same math on the CPU, written with a sort, and the token it
//! gives is the kernel's, bit for bit. Against the CPU sampler (f64 sums of f32 weights) the
//! distribution is the same but for weights below 2^−32 of the maximum's, which are never drawn.
//!
//! GPU anchor: the selection is PyTorch's CUDA radix select for `topk`
//! (`aten/src/ATen/native/cuda/SortingRadixSelect.cuh`: 8-bit digits of an order-preserving
//! integer key, a histogram a pass, descending into the bin that holds the target), here with
//! weight histograms too so top-p and the draw select the same way; vLLM's GPU top-k/top-p
//! sampling is the behaviour it replaces on the host (ids back, not rows).

use bytemuck::{Pod, Zeroable};

use super::source::{LOGIT_ROWS, STEP};
use super::{Kernels, RowDispatch, StepShape};
use crate::gpu::{BindingKind, Gpu};

/// How one logit row is sampled (mirror of WGSL `RowSampling`): the sampler's parameters and
/// the row's uniform draw.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RowSampling {
    /// > 0; 0 keeps the argmax (greedy, and rows nothing samples).
    pub temperature: f32,
    /// Keep the `top_k` most likely; 0: all.
    pub top_k: u32,
    /// top-p as p · 2^32 ([`RowSampling::fraction`]); 0: off.
    pub top_p: u32,
    /// Drop weights below `min_p` of the maximum's; 0: none dropped.
    pub min_p: f32,
    /// The uniform draw u in [0, 1) as u · 2^32.
    pub draw: u32,
    pub _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<RowSampling>() == 32);

/// The same bits (a batch compares equal to itself; floats compare by their bits).
impl PartialEq for RowSampling {
    fn eq(&self, other: &Self) -> bool {
        bytemuck::bytes_of(self) == bytemuck::bytes_of(other)
    }
}

impl Eq for RowSampling {}

impl RowSampling {
    /// A row that keeps its argmax.
    pub const GREEDY: RowSampling =
        RowSampling { temperature: 0.0, top_k: 0, top_p: 0, min_p: 0.0, draw: 0, _pad: [0; 3] };

    /// A random row: `temperature` > 0, `top_k` (`None`: all), `top_p` in (0, 1) (`None` or 1:
    /// off), `min_p` in (0, 1] (`None`: off), and the row's draw (u · 2^32).
    pub fn random(
        temperature: f32,
        top_k: Option<usize>,
        top_p: Option<f32>,
        min_p: Option<f32>,
        draw: u32,
    ) -> Self {
        RowSampling {
            temperature,
            top_k: top_k.map_or(0, |k| k.min(u32::MAX as usize) as u32),
            top_p: top_p.filter(|&p| p > 0.0 && p < 1.0).map_or(0, Self::fraction),
            min_p: min_p.filter(|&p| p > 0.0).unwrap_or(0.0),
            draw,
            _pad: [0; 3],
        }
    }

    /// A fraction in (0, 1) as the nearest multiple of 2^−32 (at least 1, below 2^32).
    pub fn fraction(p: f32) -> u32 {
        (f64::from(p) * 4_294_967_296.0).round().clamp(1.0, 4_294_967_295.0) as u32
    }
}

/// Binding order of the sampling kernel.
pub const BINDINGS: [BindingKind; 5] = [
    BindingKind::Uniform,          // step: StepInfo (num_logits rows)
    BindingKind::Uniform,          // p: VocabParams
    BindingKind::StorageRead,      // logits: [num_logits, vocab]
    BindingKind::StorageRead,      // rows: [num_logits] RowSampling
    BindingKind::StorageReadWrite, // token_ids: [num_logits] u32, the argmax in, the token out
];

one_variant_key!(
    /// The sampling pipeline (one variant).
    SampleKey,
    parts: [STEP, LOGIT_ROWS, include_str!("../../shaders/logits/sample.wgsl")],
    bindings: BINDINGS,
);

/// One sampling dispatch over the step's logit rows: one workgroup a row.
pub struct SampleOp(RowDispatch);

impl SampleOp {
    /// `logits` holds rows of `vocab` f32, `rows` one [`RowSampling`] a row, `token_ids` one
    /// u32 a row (each row's argmax, written before this op runs).
    #[track_caller]
    pub fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        step: &wgpu::Buffer,
        logits: &wgpu::Buffer,
        rows: &wgpu::Buffer,
        token_ids: &wgpu::Buffer,
        vocab: u32,
    ) -> Self {
        assert!(vocab > 0, "sampling from an empty vocabulary");
        let n = logits.size() / (u64::from(vocab) * 4);
        assert!(rows.size() >= n * 32, "rows holds fewer RowSampling than logits rows");
        assert!(token_ids.size() >= n * 4, "token_ids holds fewer rows than logits");
        let buffers = [logits, rows, token_ids];
        SampleOp(RowDispatch::new(gpu, kernels, SampleKey, "sample", step, vocab, &buffers))
    }

    /// Records the dispatch when the step samples rows on the GPU (`StepShape::sample_rows`);
    /// returns the dispatches made.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, shape: &StepShape) -> u32 {
        self.0.record(pass, shape.sample_rows)
    }
}

/// The kernel's math on the CPU, written with a sort: the token `s` draws from `row`.
/// Greedy rows (and rows whose scaled maximum is not finite) give the argmax (NaN never,
/// lowest id on ties, 0 for a row of NaN).
pub fn reference_sample(row: &[f32], s: &RowSampling) -> u32 {
    let key = |x: f32| -> Option<u32> {
        if x.is_nan() {
            return None;
        }
        let bits = if x == 0.0 { 0 } else { x.to_bits() };
        Some(if bits & 0x8000_0000 != 0 { !bits } else { bits ^ 0x8000_0000 })
    };
    let mut argmax = 0u32;
    let mut best: Option<u32> = None;
    for (id, &l) in (0u32..).zip(row) {
        if let Some(k) = key(l) {
            if best.is_none_or(|b| k > b) {
                best = Some(k);
                argmax = id;
            }
        }
    }
    let max_s = row[argmax as usize] / s.temperature;
    if s.temperature <= 0.0 || best.is_none() || !max_s.is_finite() {
        return argmax;
    }
    // (order key ascending = scaled logit descending, id, weight · 2^31 rounded, weight)
    let mut order: Vec<(u32, u32, u64, f32)> = (0u32..)
        .zip(row)
        .filter_map(|(id, &l)| {
            let v = l / s.temperature;
            let k = key(v)?;
            let d = v - max_s;
            let w = if d.is_finite() { d.exp() } else { 0.0 };
            Some((!k, id, (w * 2_147_483_648.0 + 0.5) as u64, w))
        })
        .collect();
    order.sort_unstable_by_key(|&(k, id, _, _)| (k, id));
    if s.top_k > 0 {
        order.truncate(s.top_k as usize);
    }
    if s.min_p > 0.0 {
        order.retain(|e| e.3 >= s.min_p);
    }
    // the first element whose running weight reaches (or exceeds, `strict`) the target
    let first = |order: &[(u32, u32, u64, f32)], target: u64, strict: bool| {
        let mut sum = 0u64;
        order.iter().position(|e| {
            sum += e.2;
            if strict {
                sum > target
            } else {
                sum >= target
            }
        })
    };
    let mut total: u64 = order.iter().map(|e| e.2).sum();
    let scale = |total: u64, f: u32| ((u128::from(total) * u128::from(f)) >> 32) as u64;
    if s.top_p > 0 {
        if let Some(last) = first(&order, scale(total, s.top_p), false) {
            order.truncate(last + 1);
            total = order.iter().map(|e| e.2).sum();
        }
    }
    first(&order, scale(total, s.draw), true).map_or(argmax, |i| order[i].1)
}
