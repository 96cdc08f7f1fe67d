//! Linear and embedding kernels vs the CPU reference, for every weight format, odd row counts,
//! token counts that leave partial tiles, weights split into several parts, bias, residual
//! accumulation, strided/offset inputs and outputs, and sentinels around every output.

mod common;

use common::weights::random_weight;
use common::*;
use kvrun::kernels::embedding::EmbeddingOp;
use kvrun::kernels::linear::{norms_on_load, InputNorm, LinearIo, LinearOp, TokenRows};
use kvrun::kernels::rms_norm::{HeadRows, NormIo, NormRows, RmsNormOp};
use kvrun::kernels::{reference, GpuWeight, StepInfo, StepShape, WeightFormat};
use kvrun::loader::Activation;

/// Where the tests' linear ops read and write: x and out rows strided, their data from float
/// 4 of each row (the floats around it are sentinels or unused input).
fn strided_io<'a>(
    step: &'a wgpu::Buffer,
    (x, x_stride): (&'a wgpu::Buffer, usize),
    (out, out_stride): (&'a wgpu::Buffer, usize),
) -> LinearIo<'a> {
    LinearIo {
        step,
        x,
        x_stride: x_stride as u32,
        x_offset: 4,
        out,
        out_stride: out_stride as u32,
        out_offset: 4,
        bias: None,
        accumulate: false,
        rows: TokenRows::Step,
        glu: None,
        norm: None,
    }
}

/// The `cols` outputs of each of `tokens` rows of `out_stride` floats starting at float 4, and
/// everything else (the sentinels around them and in the rows below).
fn outputs_and_sentinels(
    full: &[f32],
    tokens: usize,
    out_stride: usize,
    cols: usize,
) -> (Vec<f32>, Vec<f32>) {
    let (mut got, mut sentinels) = (Vec::new(), Vec::new());
    for (ti, row) in full.chunks(out_stride).enumerate() {
        if ti < tokens {
            got.extend(&row[4..4 + cols]);
            sentinels.extend(row[..4].iter().chain(&row[4 + cols..]));
        } else {
            sentinels.extend(row);
        }
    }
    (got, sentinels)
}

struct Case {
    format: WeightFormat,
    rows: usize,
    cols: usize,
    tokens: usize,
    /// Forces this many rows per part (splitting the weight) when set.
    rows_per_part: Option<usize>,
    bias: bool,
    accumulate: bool,
}

fn run_case(c: &Case, seed: u64) {
    let Some(t) = gpu() else { return };
    for (variant, kernels) in linear_variants(t) {
        run_variant(c, seed, &kernels, &format!("{variant:?}"));
    }
}

fn run_variant(c: &Case, seed: u64, kernels: &kvrun::kernels::Kernels, variant: &str) {
    let t = gpu().expect("checked by run_case");
    let gpu = &t.gpu;
    let mut rng = rng(seed);
    let (bytes, w) = random_weight(&mut rng, c.format, c.rows, c.cols);
    let max_binding = match c.rows_per_part {
        Some(r) => r as u64 * (c.cols / 32 * c.format.words_per_block() * 4) as u64,
        None => u64::MAX,
    };
    let weight =
        GpuWeight::upload(gpu, "w", c.format, c.rows, c.cols, &bytes, max_binding).unwrap();
    if let Some(r) = c.rows_per_part {
        assert_eq!(weight.parts.len(), c.rows.div_ceil(r));
    }
    // x rows have 8 extra floats; the input starts at float 4 of each row.
    let x_stride = c.cols + 8;
    let x_full = uniform(&mut rng, c.tokens * x_stride, 1.0);
    let x: Vec<f32> = (0..c.tokens)
        .flat_map(|ti| x_full[ti * x_stride + 4..ti * x_stride + 4 + c.cols].to_vec())
        .collect();
    // out rows have 8 extra floats (sentinels) and 2 extra rows of sentinels below.
    let out_stride = c.rows + 8;
    let mut out_init = vec![SENTINEL; (c.tokens + 2) * out_stride];
    let old = uniform(&mut rng, c.tokens * c.rows, 1.0);
    for ti in 0..c.tokens {
        for n in 0..c.rows {
            out_init[ti * out_stride + 4 + n] =
                if c.accumulate { old[ti * c.rows + n] } else { 0.0 };
        }
    }
    let bias = uniform(&mut rng, c.rows, 0.5);
    let step = step_uniform(gpu, StepInfo { num_tokens: c.tokens as u32, ..Default::default() });
    let xb = storage_f32(gpu, &x_full);
    let ob = storage_f32(gpu, &out_init);
    let bb = storage_f32(gpu, &bias);
    let op = LinearOp::new(
        gpu,
        kernels,
        "test linear",
        &weight,
        LinearIo {
            bias: c.bias.then_some(&bb),
            accumulate: c.accumulate,
            ..strided_io(&step, (&xb, x_stride), (&ob, out_stride))
        },
    );
    let shape = StepShape { num_tokens: c.tokens as u32, ..Default::default() };
    run(gpu, |pass| {
        op.record(pass, &shape);
    });
    let got_full = gpu.read_f32(&ob, 0, out_init.len()).unwrap();

    let mut want = reference::linear(&w, &x, c.rows, c.cols, c.bias.then_some(&bias[..]));
    let abs_sum = reference::linear(
        &w.iter().map(|v| v.abs()).collect::<Vec<_>>(),
        &x.iter().map(|v| v.abs()).collect::<Vec<_>>(),
        c.rows,
        c.cols,
        None,
    );
    if c.accumulate {
        for (wv, o) in want.iter_mut().zip(&old) {
            *wv += o;
        }
    }
    let (got, sentinels) = outputs_and_sentinels(&got_full, c.tokens, out_stride, c.rows);
    // f32 sums of at most 256 terms per chunk: rounding error well under 1e-5 of Σ|w·x|.
    let bound: Vec<f32> = abs_sum.iter().map(|s| 1e-5 * s + 1e-6).collect();
    let name = format!("linear {variant} {:?} {}x{} T={}", c.format, c.rows, c.cols, c.tokens);
    assert_within(&name, &got, &want, &bound);
    assert_sentinels(&name, &sentinels);
}

/// Odd and even row counts (the subgroup variant loads even ones two rows at a time), counts
/// that are not a multiple of its 4 rows per lane, and decode- and prefill-sized tiles. The
/// last shape's words (and, for one-side-word formats, side words) fill more than one row of
/// the subgroup variant's weight textures (`kernels::weight_textures::TEX_WIDTH` texels) and
/// end in a partial row.
#[test]
fn linear_every_format_matches_reference() {
    let shapes = [
        (37, 96usize, 1),
        (70, 64, 3),
        (33, 288, 9),
        (129, 576, 17),
        (70, 96, 2),
        (128, 64, 1),
        (258, 1024, 2),
        // 4k rows with a partial last tile of one quad: the subgroup variant's quad loads
        (196, 64, 2),
        // the subgroup variant's 16-token tile: whole, and with a last tile of one token
        (70, 64, 16),
        (37, 96, 65),
        // the GPU variant's split-K (short steps): 10 chunks over 8 groups (two rounds, the
        // last chunk partial), one token and three 4-token tiles
        (40, 2336, 1),
        (40, 2336, 9),
        // the GPU variant's tiled GEMM (steps past 16 tokens): three row tiles, the last of one
        // row, and two token tiles, the last of one token
        (129, 96, 33),
    ];
    for (i, format) in WeightFormat::ALL.into_iter().enumerate() {
        for (j, &(rows, cols, tokens)) in shapes.iter().enumerate() {
            let case = Case {
                format,
                rows,
                cols: cols.next_multiple_of(format.column_multiple()),
                tokens,
                rows_per_part: None,
                bias: false,
                accumulate: false,
            };
            run_case(&case, (i * 10 + j) as u64);
        }
    }
}

/// A token's outputs are the same bits whichever token tile computed them
/// (`TokenTile::for_count`: one token per invocation, 8 or 16 a tile on the subgroup variant,
/// 4 on the GPU one; full and partial tiles) and whether its rows were split-K
/// (`linear::split_groups`: the GPU variant's steps of up to 16 tokens where it splits): the
/// same weight and input rows run as steps of 65, 48, 40, 16, 9, 3 and 1 tokens, every
/// variant, formats of each block shape.
#[test]
fn linear_token_tiles_give_the_same_bits() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let counts = [65usize, 48, 40, 16, 9, 3, 1];
    let max = counts[0];
    for (i, format) in
        [WeightFormat::Q4_1, WeightFormat::Q8_0, WeightFormat::Q4_K, WeightFormat::F16]
            .into_iter()
            .enumerate()
    {
        // 73 blocks (80 for the K formats): 10 chunks, two rounds of the GPU variant's split-K
        // (steps of 16 tokens or fewer), compared with whole rows (the longer steps)
        let (rows, cols) = (68, 2336usize.next_multiple_of(format.column_multiple()));
        let mut rng = rng(900 + i as u64);
        let (bytes, _) = random_weight(&mut rng, format, rows, cols);
        let weight = GpuWeight::upload(gpu, "w", format, rows, cols, &bytes, u64::MAX).unwrap();
        let x_stride = cols + 8;
        let xb = storage_f32(gpu, &uniform(&mut rng, max * x_stride, 1.0));
        let out_stride = rows + 8;
        for (variant, kernels) in linear_variants(t) {
            let mut first: Option<Vec<f32>> = None;
            for count in counts {
                let step =
                    step_uniform(gpu, StepInfo { num_tokens: count as u32, ..Default::default() });
                let ob = storage_f32(gpu, &vec![SENTINEL; (max + 2) * out_stride]);
                let op = LinearOp::new(
                    gpu,
                    &kernels,
                    "tiles",
                    &weight,
                    strided_io(&step, (&xb, x_stride), (&ob, out_stride)),
                );
                let shape = StepShape { num_tokens: count as u32, ..Default::default() };
                run(gpu, |pass| {
                    op.record(pass, &shape);
                });
                let got = gpu.read_f32(&ob, 0, (max + 2) * out_stride).unwrap();
                let (got, sentinels) = outputs_and_sentinels(&got, count, out_stride, rows);
                let what = format!("{variant:?} {format:?} T={count}");
                assert_sentinels(&what, &sentinels);
                let all = first.get_or_insert_with(|| got.clone());
                let differ = got.iter().zip(all.iter()).filter(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(differ.count(), 0, "{what}: outputs differ from the 65-token step's");
            }
        }
    }
}

#[test]
fn linear_split_parts_bias_and_residual() {
    for (i, format) in [
        WeightFormat::Q4_1,
        WeightFormat::Q8_0,
        WeightFormat::F32,
        WeightFormat::Q4_K,
        WeightFormat::Q6_K,
    ]
    .into_iter()
    .enumerate()
    {
        let case = Case {
            format,
            rows: 100,
            cols: 320usize.next_multiple_of(format.column_multiple()),
            tokens: 5,
            rows_per_part: Some(33),
            bias: true,
            accumulate: true,
        };
        run_case(&case, 100 + i as u64);
        let case = Case {
            format,
            rows: 65,
            cols: 64usize.next_multiple_of(format.column_multiple()),
            tokens: 1,
            rows_per_part: Some(64),
            bias: true,
            accumulate: false,
        };
        run_case(&case, 200 + i as u64);
        // the subgroup variant's 16-token tile with bias, residual and split parts
        let case = Case { tokens: 30, rows_per_part: Some(32), accumulate: true, ..case };
        run_case(&case, 300 + i as u64);
    }
}

/// The GLU epilogue: gate and up rows interleaved as `model::weights::gate_up` lays them out,
/// out[t, i] = act(gate_i · x_t) · (up_i · x_t), for both activations and every linear variant;
/// odd FFN widths, partial token tiles, and parts forced to an odd row count (which the upload
/// rounds to an even one, so no part splits a pair). Sentinels around every output.
#[test]
fn linear_glu_epilogue_matches_reference() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let cases = [
        (WeightFormat::Q4_1, 37, 96, 1, None, Activation::Silu),
        (WeightFormat::Q8_0, 70, 64, 9, Some(33), Activation::Silu),
        (WeightFormat::F32, 33, 64, 3, None, Activation::GeluTanh),
        (WeightFormat::Q4_K, 64, 256, 2, Some(65), Activation::GeluTanh),
        (WeightFormat::Q6_K, 19, 256, 17, None, Activation::Silu),
        (WeightFormat::F16, 96, 64, 8, Some(40), Activation::GeluTanh),
        // the GPU variant's split-K (8 groups of 8 rows, two rounds), whole and in parts
        (WeightFormat::Q4_0, 40, 2336, 1, None, Activation::Silu),
        (WeightFormat::Q8_0, 29, 1056, 6, Some(24), Activation::GeluTanh),
        // gpt-oss's clamped SwiGLU (sums past ±7 clamp)
        (WeightFormat::MXFP4, 40, 2336, 3, Some(24), Activation::SwigluOai),
        (WeightFormat::F32, 33, 64, 2, None, Activation::SwigluOai),
        // the GPU variant's tiled GEMM: 140 rows in parts of 66 (row tiles of 64, 2 and 64, 6),
        // token tiles of 32 and 1
        (WeightFormat::Q8_0, 70, 64, 33, Some(66), Activation::Silu),
    ];
    for (i, &(format, ffn, cols, tokens, rows_per_part, activation)) in cases.iter().enumerate() {
        let mut rng = rng(700 + i as u64);
        let (gate_bytes, gate) = random_weight(&mut rng, format, ffn, cols);
        let (up_bytes, up) = random_weight(&mut rng, format, ffn, cols);
        let row_bytes = format.file_row_bytes(cols);
        let bytes: Vec<u8> = gate_bytes
            .chunks(row_bytes)
            .zip(up_bytes.chunks(row_bytes))
            .flat_map(|(g, u)| g.iter().chain(u).copied())
            .collect();
        let max_binding = match rows_per_part {
            Some(r) => r as u64 * (cols / 32 * format.words_per_block() * 4) as u64,
            None => u64::MAX,
        };
        let weight =
            GpuWeight::upload(gpu, "gate_up", format, 2 * ffn, cols, &bytes, max_binding).unwrap();
        if let Some(r) = rows_per_part {
            assert_eq!(weight.parts.len(), (2 * ffn).div_ceil(r & !1), "parts of {r} rows");
        }
        let x_stride = cols + 8;
        let x_full = uniform(&mut rng, tokens * x_stride, 1.0);
        let x: Vec<f32> = (0..tokens)
            .flat_map(|ti| x_full[ti * x_stride + 4..ti * x_stride + 4 + cols].to_vec())
            .collect();
        let g = reference::linear(&gate, &x, ffn, cols, None);
        let u = reference::linear(&up, &x, ffn, cols, None);
        let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
        let g_err: Vec<f32> = reference::linear(&abs(&gate), &abs(&x), ffn, cols, None)
            .iter()
            .map(|s| 1e-5 * s + 1e-6)
            .collect();
        let u_err: Vec<f32> = reference::linear(&abs(&up), &abs(&x), ffn, cols, None)
            .iter()
            .map(|s| 1e-5 * s + 1e-6)
            .collect();
        let want = reference::glu_mul(activation, &g, &u);
        // the activation alone: act(g) · 1, for SwigluOai act(g) · (0 + 1)
        let ones = vec![if activation == Activation::SwigluOai { 0.0 } else { 1.0 }; g.len()];
        let act_g = reference::glu_mul(activation, &g, &ones);
        // the sums' rounding carried through: |act'| < 1.2 for every activation, times the up
        // factor (u, or u + 1 for SwigluOai), plus the activation's own f32 rounding
        let up_factor =
            |u: f32| if activation == Activation::SwigluOai { u.abs() + 1.0 } else { u.abs() };
        let bound: Vec<f32> = (0..want.len())
            .map(|j| {
                1.2 * up_factor(u[j]) * g_err[j] + act_g[j].abs() * u_err[j] + 1e-5 * want[j].abs()
            })
            .collect();

        let step = step_uniform(gpu, StepInfo { num_tokens: tokens as u32, ..Default::default() });
        let xb = storage_f32(gpu, &x_full);
        let out_stride = ffn + 8;
        let out_len = (tokens + 2) * out_stride;
        for (variant, kernels) in linear_variants(t) {
            let ob = storage_f32(gpu, &vec![SENTINEL; out_len]);
            let io = LinearIo {
                glu: Some(activation),
                ..strided_io(&step, (&xb, x_stride), (&ob, out_stride))
            };
            let op = LinearOp::new(gpu, &kernels, "gate_up", &weight, io);
            let shape = StepShape { num_tokens: tokens as u32, ..Default::default() };
            run(gpu, |pass| {
                op.record(pass, &shape);
            });
            let got_full = gpu.read_f32(&ob, 0, out_len).unwrap();
            let (got, sentinels) = outputs_and_sentinels(&got_full, tokens, out_stride, ffn);
            let what =
                format!("GLU {activation:?} {variant:?} {format:?} ffn {ffn} x {cols} T={tokens}");
            assert_within(&what, &got, &want, &bound);
            assert_sentinels(&what, &sentinels);
        }
    }
}

/// RMSNorm on load (the GPU linear variant; `linear::norms_on_load`): a projection reading the
/// un-normed rows gives the same bits as the rms_norm kernel followed by the plain linear (it
/// repeats that kernel's sums in its order), for k that are and are not multiples of its 64
/// partial sums, one- and four-token tiles with partial ones, split parts, bias + residual and
/// the GLU epilogue; and the CPU reference (rms_norm then linear) within the linear's bound.
#[test]
fn linear_norm_on_load_is_rms_norm_then_linear() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let cases = [
        (WeightFormat::Q4_1, 37, 96, 1, None, false, None),
        (WeightFormat::Q8_0, 70, 576, 5, Some(33), true, None),
        (WeightFormat::F32, 34, 64, 3, None, false, Some(Activation::Silu)),
        (WeightFormat::Q4_K, 64, 256, 17, Some(40), false, Some(Activation::GeluTanh)),
        (WeightFormat::F16, 96, 160, 8, None, true, None),
        // the GPU variant's split-K: two rounds of 8 groups; 5 chunks on 8 groups, in parts
        (WeightFormat::Q4_0, 37, 2336, 1, None, true, None),
        (WeightFormat::Q8_0, 34, 1056, 2, Some(16), false, Some(Activation::Silu)),
        // the GPU variant's tiled GEMM: a partial row tile in parts, three token tiles (the
        // last of one token); with the GLU epilogue over two tiles of 32 and one of 1
        (WeightFormat::Q6_K, 129, 256, 65, Some(66), true, None),
        (WeightFormat::Q5_0, 70, 96, 65, None, false, Some(Activation::GeluTanh)),
    ];
    let mut tested = 0;
    for (variant, kernels) in linear_variants(t) {
        if !norms_on_load(variant.variant) {
            continue;
        }
        tested += 1;
        for (i, &(format, rows, cols, tokens, rows_per_part, residual, glu)) in
            cases.iter().enumerate()
        {
            let mut rng = rng(900 + i as u64);
            let (bytes, w) = random_weight(&mut rng, format, rows, cols);
            let max_binding = match rows_per_part {
                Some(r) => r as u64 * (cols / 32 * format.words_per_block() * 4) as u64,
                None => u64::MAX,
            };
            let weight =
                GpuWeight::upload(gpu, "w", format, rows, cols, &bytes, max_binding).unwrap();
            let x_stride = cols + 8;
            let x_full = uniform(&mut rng, tokens * x_stride, 2.0);
            let x: Vec<f32> = (0..tokens)
                .flat_map(|ti| x_full[ti * x_stride + 4..ti * x_stride + 4 + cols].to_vec())
                .collect();
            let gamma: Vec<f32> = uniform(&mut rng, cols, 0.5).iter().map(|g| 1.0 + g).collect();
            let eps = 1e-5;
            let out_cols = if glu.is_some() { rows / 2 } else { rows };
            let out_stride = out_cols + 8;
            let out_len = (tokens + 2) * out_stride;
            let mut out_init = vec![SENTINEL; out_len];
            let old = uniform(&mut rng, tokens * out_cols, 1.0);
            for ti in 0..tokens {
                for n in 0..out_cols {
                    out_init[ti * out_stride + 4 + n] =
                        if residual { old[ti * out_cols + n] } else { 0.0 };
                }
            }
            let bias = uniform(&mut rng, rows, 0.5);
            let step =
                step_uniform(gpu, StepInfo { num_tokens: tokens as u32, ..Default::default() });
            let (xb, gb, bb) =
                (storage_f32(gpu, &x_full), storage_f32(gpu, &gamma), storage_f32(gpu, &bias));
            let normed = storage_f32(gpu, &vec![0.0; x_full.len()]);
            let io = |x, out, norm| LinearIo {
                bias: (residual && glu.is_none()).then_some(&bb),
                accumulate: residual && glu.is_none(),
                glu,
                norm,
                ..strided_io(&step, (x, x_stride), (out, out_stride))
            };
            let shape = StepShape { num_tokens: tokens as u32, ..Default::default() };

            // rms_norm (the norm's rows at the same strided places) then the plain linear
            let rows_at = HeadRows {
                heads: 1,
                x_stride: x_stride as u32,
                x_offset: 4,
                out_stride: x_stride as u32,
                out_offset: 4,
                split: 1,
            };
            let norm_io = NormIo {
                step: &step,
                x: &xb,
                weight: &gb,
                out: &normed,
                rows: NormRows::Heads(rows_at),
                accumulate: false,
            };
            let norm = RmsNormOp::new(gpu, &kernels, "norm", cols as u32, eps, norm_io);
            let two = storage_f32(gpu, &out_init);
            let plain = LinearOp::new(gpu, &kernels, "plain", &weight, io(&normed, &two, None));
            run(gpu, |pass| {
                norm.record(pass, &shape);
                plain.record(pass, &shape);
            });
            let want_bits = gpu.read_f32(&two, 0, out_len).unwrap();

            let one = storage_f32(gpu, &out_init);
            let on_load = InputNorm { weight: &gb, eps };
            let fused =
                LinearOp::new(gpu, &kernels, "fused", &weight, io(&xb, &one, Some(on_load)));
            run(gpu, |pass| {
                fused.record(pass, &shape);
            });
            let got_full = gpu.read_f32(&one, 0, out_len).unwrap();
            let what = format!("norm on load {variant:?} {format:?} {rows}x{cols} T={tokens}");
            let differ =
                got_full.iter().zip(&want_bits).filter(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(differ.count(), 0, "{what}: not the bits of rms_norm then linear");

            let (got, sentinels) = outputs_and_sentinels(&got_full, tokens, out_stride, out_cols);
            assert_sentinels(&what, &sentinels);
            let xn = reference::rms_norm(&x, &gamma, eps);
            let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
            let sums = reference::linear(&w, &xn, rows, cols, None);
            let err: Vec<f32> = reference::linear(&abs(&w), &abs(&xn), rows, cols, None)
                .iter()
                .map(|s| 1e-5 * s + 1e-6)
                .collect();
            let (want, bound): (Vec<f32>, Vec<f32>) = match glu {
                None => {
                    let mut want = sums.clone();
                    if residual {
                        for (j, v) in want.iter_mut().enumerate() {
                            *v += bias[j % rows] + old[j];
                        }
                    }
                    let bound = err.iter().zip(&want).map(|(e, v)| e + 1e-6 * v.abs()).collect();
                    (want, bound)
                }
                Some(activation) => {
                    // rows 2i, 2i + 1 are gate and up row i
                    let pick = |v: &[f32], odd: usize| -> Vec<f32> {
                        v.chunks(rows)
                            .flat_map(|r| r.iter().skip(odd).step_by(2).copied())
                            .collect()
                    };
                    let (g, u) = (pick(&sums, 0), pick(&sums, 1));
                    let (g_err, u_err) = (pick(&err, 0), pick(&err, 1));
                    let want = reference::glu_mul(activation, &g, &u);
                    let act_g = reference::glu_mul(activation, &g, &vec![1.0; g.len()]);
                    assert_ne!(activation, Activation::SwigluOai, "bound written for u · act(g)");
                    let bound = (0..want.len())
                        .map(|j| {
                            1.2 * u[j].abs() * g_err[j]
                                + act_g[j].abs() * u_err[j]
                                + 1e-5 * want[j].abs()
                        })
                        .collect();
                    (want, bound)
                }
            };
            assert_within(&what, &got, &want, &bound);
        }
    }
    assert_eq!(tested, 2, "the GPU linear variant (whole rows and split-K) runs on every adapter");
}

#[test]
fn embedding_gathers_rows_across_parts() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    for (i, format) in WeightFormat::ALL.into_iter().enumerate() {
        let mut rng = rng(300 + i as u64);
        let (vocab, hidden) = (301, 96usize.next_multiple_of(format.column_multiple()));
        let (bytes, w) = random_weight(&mut rng, format, vocab, hidden);
        let rows_per_part = 100u64;
        let weight = GpuWeight::upload(
            gpu,
            "emb",
            format,
            vocab,
            hidden,
            &bytes,
            rows_per_part * (hidden / 32 * format.words_per_block() * 4) as u64,
        )
        .unwrap();
        assert_eq!(weight.parts.len(), 4);
        let ids: Vec<u32> = vec![0, 300, 99, 100, 7, 255, 7];
        let step =
            step_uniform(gpu, StepInfo { num_tokens: ids.len() as u32, ..Default::default() });
        let idb = storage_u32(gpu, &ids);
        let out_stride = hidden + 4;
        let ob = storage_f32(gpu, &vec![SENTINEL; (ids.len() + 1) * out_stride]);
        let op =
            EmbeddingOp::new(gpu, &t.kernels, &weight, &step, &idb, &ob, out_stride as u32, 0.5);
        let shape = StepShape { num_tokens: ids.len() as u32, ..Default::default() };
        run(gpu, |pass| {
            op.record(pass, &shape);
        });
        let got = gpu.read_f32(&ob, 0, (ids.len() + 1) * out_stride).unwrap();
        for (ti, &id) in ids.iter().enumerate() {
            let want: Vec<f32> = w[id as usize * hidden..(id as usize + 1) * hidden]
                .iter()
                .map(|v| v * 0.5)
                .collect();
            let row = &got[ti * out_stride..(ti + 1) * out_stride];
            assert_close(
                &format!("embedding {format:?} token {id}"),
                &row[..hidden],
                &want,
                0.0,
                1e-6,
            );
            assert_sentinels("embedding row tail", &row[hidden..]);
        }
        assert_sentinels("embedding rows below", &got[ids.len() * out_stride..]);
    }
}

/// Gemma 3's tied 262,144 × 640 Q8_0 embedding at the adapter's real binding limit: on lavapipe
/// (128 MiB) its 640-byte packed rows split into two parts at row 209,714 (parts hold even rows). The gather reads
/// ids on both sides of the split and the last row, scaled by sqrt(640) as Gemma's embedding;
/// the LM head (`TokenRows::Logits`) produces every one of the 262,144 logits of three rows,
/// with every linear variant, vs the reference.
#[test]
fn gemma_sized_tied_embedding_and_lm_head_across_parts() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let (vocab, hidden, format) = (262_144usize, 640usize, WeightFormat::Q8_0);
    let mut rng = rng(500);
    let (bytes, w) = random_weight(&mut rng, format, vocab, hidden);
    let max_binding = t.kernels.config.max_binding_bytes;
    let weight =
        GpuWeight::upload(gpu, "token_embd", format, vocab, hidden, &bytes, max_binding).unwrap();
    let row_bytes = (hidden / 32 * format.words_per_block() * 4) as u64;
    assert_eq!(weight.parts.len(), (vocab as u64 * row_bytes).div_ceil(max_binding) as usize);
    let split = weight.parts.get(1).map_or(vocab - 1, |p| p.row_offset) as u32;
    let ids: Vec<u32> = vec![0, split - 1, split, 262_143, 7];
    let scale = 640f32.sqrt();
    let info = StepInfo { num_tokens: ids.len() as u32, num_logits: 3, ..Default::default() };
    let step = step_uniform(gpu, info);
    let shape = StepShape { num_tokens: ids.len() as u32, num_logits: 3, ..Default::default() };
    let (idb, eb) = (storage_u32(gpu, &ids), storage_f32(gpu, &vec![SENTINEL; ids.len() * hidden]));
    let op = EmbeddingOp::new(gpu, &t.kernels, &weight, &step, &idb, &eb, hidden as u32, scale);
    run(gpu, |pass| {
        op.record(pass, &shape);
    });
    let got = gpu.read_f32(&eb, 0, ids.len() * hidden).unwrap();
    for (ti, &id) in ids.iter().enumerate() {
        let want: Vec<f32> =
            w[id as usize * hidden..(id as usize + 1) * hidden].iter().map(|v| v * scale).collect();
        let what = format!("embedding row {id}");
        assert_close(&what, &got[ti * hidden..(ti + 1) * hidden], &want, 0.0, 1e-6);
    }
    let x = uniform(&mut rng, 3 * hidden, 1.0);
    let want = reference::linear(&w, &x, vocab, hidden, None);
    let abs_w: Vec<f32> = w.iter().map(|v| v.abs()).collect();
    let abs_x: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    // f32 sums of 640 products: rounding within a few ulps of Σ|w·x|
    let bound: Vec<f32> = reference::linear(&abs_w, &abs_x, vocab, hidden, None)
        .iter()
        .map(|s| 1e-6 * s + 1e-6)
        .collect();
    let xb = storage_f32(gpu, &x);
    for (variant, kernels) in linear_variants(t) {
        let ob = storage_f32(gpu, &vec![SENTINEL; 4 * vocab]);
        let io = LinearIo {
            step: &step,
            x: &xb,
            x_stride: hidden as u32,
            x_offset: 0,
            out: &ob,
            out_stride: vocab as u32,
            out_offset: 0,
            bias: None,
            accumulate: false,
            rows: TokenRows::Logits,
            glu: None,
            norm: None,
        };
        let head = LinearOp::new(gpu, &kernels, "lm_head", &weight, io);
        run(gpu, |pass| {
            head.record(pass, &shape);
        });
        let got = gpu.read_f32(&ob, 0, 4 * vocab).unwrap();
        assert_within(&format!("lm head {variant:?}"), &got[..3 * vocab], &want, &bound);
        assert_sentinels(&format!("lm head {variant:?}: the 4th row"), &got[3 * vocab..]);
    }
}
