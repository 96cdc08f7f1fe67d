//! Random sampling on the GPU (`kernels::sampling`, after `kernels::argmax`) against its CPU
//! reference, token for token, and against the CPU sampler's distribution (`sample::Sampler`'s
//! rules in f64) by a chi-square test on 10,000 draws.

mod common;

use common::*;
use kvrun::kernels::argmax::ArgmaxOp;
use kvrun::kernels::sampling::{reference_sample, RowSampling, SampleOp};
use kvrun::kernels::{StepInfo, StepShape};
use rand::Rng;

/// Each row's token from the GPU, in steps of at most 32 MiB of logits.
fn sample_on_gpu(t: &TestGpu, rows: &[Vec<f32>], params: &[RowSampling]) -> Vec<u32> {
    let per_step = ((32 << 20) / (rows[0].len() * 4)).max(1);
    let steps = rows.chunks(per_step).zip(params.chunks(per_step));
    steps.flat_map(|(rows, params)| sample_step(t, rows, params)).collect()
}

/// One step's tokens: the argmax op, then the sampling op, in one pass (as a model's step
/// records them). Rows past the step's keep their sentinel.
fn sample_step(t: &TestGpu, rows: &[Vec<f32>], params: &[RowSampling]) -> Vec<u32> {
    let gpu = &t.gpu;
    let vocab = rows[0].len();
    let n = rows.len();
    assert_eq!(params.len(), n);
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    let logits = storage_f32(gpu, &flat);
    let mut padded = params.to_vec();
    padded.push(RowSampling::random(1.0, None, None, None, 0));
    let pbuf = gpu.storage_buffer_init("test rows", bytemuck::cast_slice(&padded));
    let ids = storage_u32(gpu, &vec![0xDEAD_BEEF; n + 1]);
    let step = step_uniform(gpu, StepInfo { num_logits: n as u32, ..Default::default() });
    let argmax = ArgmaxOp::new(gpu, &t.kernels, &step, &logits, &ids, vocab as u32);
    let sample = SampleOp::new(gpu, &t.kernels, &step, &logits, &pbuf, &ids, vocab as u32);
    let shape = StepShape { argmax_rows: n as u32, sample_rows: n as u32, ..Default::default() };
    run(gpu, |pass| {
        argmax.record(pass, &shape);
        sample.record(pass, &shape);
    });
    let got = gpu.read_u32(&ids, 0, n + 1).unwrap();
    assert_eq!(got[n], 0xDEAD_BEEF, "vocab {vocab}: a row past the step's was written");
    got[..n].to_vec()
}

/// Every filter and their combinations, token for token against `reference_sample`: rows of
/// random logits at vocabularies 1, 7, 300 (not a multiple of the workgroup), 1000 and Gemma
/// 3's 262,144; a maximum tied at three ids and the k-th logit tied (the id passes of the
/// select); NaN and −inf (never drawn), +inf (its argmax), a row of NaN (0), a temperature so
/// small the scaled maximum overflows (the argmax), temperature 0 (the argmax stays), top-k
/// past the vocabulary, top-p that keeps one token; draws at 0, just below 1 and random.
#[test]
fn sampling_matches_its_reference_token_for_token() {
    let Some(t) = gpu() else { return };
    let configs = [
        RowSampling::random(1.0, None, None, None, 0),
        RowSampling::random(0.7, Some(5), None, None, 0),
        RowSampling::random(1.3, None, Some(0.9), None, 0),
        RowSampling::random(0.8, None, None, Some(0.05), 0),
        RowSampling::random(0.6, Some(40), Some(0.5), Some(0.01), 0),
        RowSampling::random(2.5, Some(1), None, None, 0),
        RowSampling::random(1.0, Some(100_000_000), Some(1e-6), None, 0),
        RowSampling::random(1e-40, None, None, None, 0),
        RowSampling::GREEDY,
    ];
    for (i, vocab) in [1usize, 7, 300, 1000, 262_144].into_iter().enumerate() {
        let mut r = rng(900 + i as u64);
        let mut bases: Vec<Vec<f32>> = (0..4).map(|_| uniform(&mut r, vocab, 6.0)).collect();
        if vocab >= 300 {
            // a maximum at three ids; many ties at the fifth logit; NaN, ±inf
            let top = vocab - 3;
            for j in [5, top, vocab - 1] {
                bases[1][j] = 9.0;
            }
            for j in (0..vocab).step_by(3) {
                bases[2][j] = bases[2][j].min(3.0);
            }
            for j in [10, 20, 30, 40, 50, 60] {
                bases[2][j] = 4.5;
            }
            bases[2][11] = 5.0;
            bases[3][0] = f32::NAN;
            bases[3][top] = f32::NAN;
            bases[3][7] = f32::NEG_INFINITY;
            let mut inf = bases[3].clone();
            inf[vocab / 2] = f32::INFINITY;
            bases.push(inf);
            bases.push(vec![f32::NAN; vocab]);
        }
        let mut rows = Vec::new();
        let mut params = Vec::new();
        for base in &bases {
            for config in &configs {
                for draw in [0u32, u32::MAX, r.random(), r.random()] {
                    rows.push(base.clone());
                    params.push(RowSampling { draw, ..*config });
                }
            }
        }
        let got = sample_on_gpu(t, &rows, &params);
        for (j, ((row, s), &token)) in rows.iter().zip(&params).zip(&got).enumerate() {
            let want = reference_sample(row, s);
            assert_eq!(token, want, "vocab {vocab}, row {j}: {s:?}");
            let drawn = row[token as usize];
            if !row.iter().all(|x| x.is_nan()) {
                assert!(!drawn.is_nan() && drawn != f32::NEG_INFINITY, "vocab {vocab}, row {j}");
            }
        }
    }
}

/// The CPU sampler's distribution of one row, in f64 by its rules (sample::sampler: top-k,
/// softmax, min-p, top-p in descending order, ties to the lower id).
fn sampler_distribution(
    logits: &[f32],
    temperature: f32,
    top_k: Option<usize>,
    top_p: Option<f32>,
    min_p: Option<f32>,
) -> Vec<f64> {
    let mut order: Vec<(f64, usize)> =
        logits.iter().enumerate().map(|(i, &l)| (f64::from(l / temperature), i)).collect();
    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    if let Some(k) = top_k {
        order.truncate(k);
    }
    let max = order[0].0;
    let mut kept: Vec<(f64, usize)> = order.iter().map(|&(v, i)| ((v - max).exp(), i)).collect();
    if let Some(m) = min_p {
        kept.retain(|&(w, _)| w >= f64::from(m));
    }
    let total: f64 = kept.iter().map(|e| e.0).sum();
    if let Some(p) = top_p {
        let mut sum = 0.0;
        let mut len = 0;
        while len < kept.len() && (len == 0 || sum < f64::from(p) * total) {
            sum += kept[len].0;
            len += 1;
        }
        kept.truncate(len);
    }
    let total: f64 = kept.iter().map(|e| e.0).sum();
    let mut want = vec![0.0; logits.len()];
    for (w, i) in kept {
        want[i] = w / total;
    }
    want
}

/// Pearson's chi-square of `counts` against `want`, tokens expected fewer than 5 times pooled
/// into one cell; asserts no token of probability 0 was drawn. Returns (chi², degrees of
/// freedom).
fn chi_square(counts: &[usize], want: &[f64]) -> (f64, usize) {
    let n: usize = counts.iter().sum();
    let (mut chi2, mut cells) = (0.0, 0usize);
    let (mut pooled_count, mut pooled_want) = (0usize, 0.0f64);
    for (token, (&c, &p)) in counts.iter().zip(want).enumerate() {
        if p == 0.0 {
            assert_eq!(c, 0, "drew token {token}, of probability 0");
        } else if p * n as f64 >= 5.0 {
            chi2 += (c as f64 - p * n as f64).powi(2) / (p * n as f64);
            cells += 1;
        } else {
            pooled_count += c;
            pooled_want += p;
        }
    }
    if pooled_want > 0.0 {
        let e = pooled_want * n as f64;
        chi2 += (pooled_count as f64 - e).powi(2) / e;
        cells += 1;
    }
    (chi2, cells.saturating_sub(1))
}

/// The chi-square bound at p = 0.001 (Wilson–Hilferty).
fn chi_square_bound(df: usize) -> f64 {
    let d = df.max(1) as f64;
    let z = 3.090_232;
    d * (1.0 - 2.0 / (9.0 * d) + z * (2.0 / (9.0 * d)).sqrt()).powi(3)
}

/// 10,000 draws of one row at a time (as many rows, each with its own draw from a seeded RNG)
/// follow the CPU sampler's distribution: plain temperature, top-k, top-p, min-p and all
/// together over 64 random logits; top-p and all together over 1,000 flatter ones (a nucleus
/// of hundreds).
#[test]
fn sampling_follows_the_cpu_samplers_distribution() {
    let Some(t) = gpu() else { return };
    const DRAWS: usize = 10_000;
    type Case = (f32, Option<usize>, Option<f32>, Option<f32>);
    let cases: [Case; 5] = [
        (1.0, None, None, None),
        (0.7, Some(10), None, None),
        (1.0, None, Some(0.8), None),
        (1.2, None, None, Some(0.1)),
        (0.9, Some(30), Some(0.9), Some(0.02)),
    ];
    let flat = [cases[2], cases[4]];
    for (v, (vocab, scale, cases)) in
        [(64usize, 3.0f32, &cases[..]), (1000, 1.0, &flat[..])].into_iter().enumerate()
    {
        let mut r = rng(950 + v as u64);
        let logits = uniform(&mut r, vocab, scale);
        for (c, &(temperature, top_k, top_p, min_p)) in cases.iter().enumerate() {
            let rows = vec![logits.clone(); DRAWS];
            let params: Vec<RowSampling> = (0..DRAWS)
                .map(|_| RowSampling::random(temperature, top_k, top_p, min_p, r.random()))
                .collect();
            let got = sample_on_gpu(t, &rows, &params);
            let mut counts = vec![0usize; vocab];
            for &token in &got {
                counts[token as usize] += 1;
            }
            let want = sampler_distribution(&logits, temperature, top_k, top_p, min_p);
            let (chi2, df) = chi_square(&counts, &want);
            let bound = chi_square_bound(df);
            assert!(
                chi2 < bound,
                "vocab {vocab}, case {c}: chi² {chi2:.1} ≥ {bound:.1} (df {df}, p = 0.001)"
            );
        }
    }
}

/// The logit edits (`kernels::logit_edit`, the samplers' bias and penalties) write the bits
/// `reference_edit` computes: every combination of the four operations on positive, negative
/// and ±0 logits, ids at both ends of a row, rows of 7, 1000 and Gemma 3's 262,144 logits, more
/// edits than one workgroup's, and rows no edit names left as they were.
#[test]
fn logit_edits_match_their_reference_bit_for_bit() {
    use kvrun::kernels::logit_edit::{reference_edit, LogitEdit, LogitEditOp};
    use rand::seq::index::sample;
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    for (i, (vocab, rows, per_row)) in
        [(7usize, 3usize, 7usize), (1000, 4, 300), (262_144, 3, 150)].into_iter().enumerate()
    {
        let mut r = rng(950 + i as u64);
        let mut logits = uniform(&mut r, rows * vocab, 6.0);
        for row in 0..rows {
            logits[row * vocab] = 0.0;
            logits[row * vocab + 1] = -0.0;
        }
        let mut edits = Vec::new();
        // the last row has no edits
        for row in 0..rows - 1 {
            let mut ids = sample(&mut r, vocab, per_row.min(vocab)).into_vec();
            ids.extend([0, 1, vocab - 1]);
            ids.sort_unstable();
            ids.dedup();
            for (j, id) in ids.into_iter().enumerate() {
                let repetition = [0.7f32, 1.3, 2.0][j % 3];
                edits.push(LogitEdit {
                    row: row as u32,
                    id: id as u32,
                    flags: (j % 16) as u32,
                    bias: r.random_range(-3.0..3.0),
                    penalty: r.random_range(-1.0..2.0),
                    repetition,
                    inv_repetition: 1.0 / repetition,
                    _pad: 0,
                });
            }
        }
        let buf = storage_f32(gpu, &logits);
        let ebuf = gpu.storage_buffer_init("test edits", bytemuck::cast_slice(&edits));
        let n = edits.len() as u32;
        let info = StepInfo { num_logits: rows as u32, num_logit_edits: n, ..Default::default() };
        let step = step_uniform(gpu, info);
        let op = LogitEditOp::new(gpu, &t.kernels, &step, &buf, &ebuf, vocab as u32);
        let shape = StepShape { num_logits: rows as u32, logit_edits: n, ..Default::default() };
        run(gpu, |pass| {
            assert_eq!(op.record(pass, &shape), 1);
        });
        let got = gpu.read_f32(&buf, 0, rows * vocab).unwrap();
        let mut want = logits.clone();
        reference_edit(&mut want, vocab, &edits);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "vocab {vocab}: {n} edits");
        assert_ne!(bits(&got), bits(&logits), "vocab {vocab}: the edits changed nothing");
    }
}
