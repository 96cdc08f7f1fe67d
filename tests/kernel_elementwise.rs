//! RMSNorm (plain, gathering, accumulating, and per head past 65,535 workgroups; both variants,
//! the same bits), RoPE (interleaved and NEOX pairs), both GLU activations (SiLU, tanh-GELU)
//! and the sigmoid output gate vs the CPU reference, with odd sizes and sentinels around the
//! outputs.

mod common;

use common::*;
use kvrun::kernels::glu::GluOp;
use kvrun::kernels::reference;
use kvrun::kernels::rms_norm::{HeadRows, NormIo, NormRows, RmsNormOp};
use kvrun::kernels::rope::{rope_table, QkvLayout, RopeHeads, RopeOp, RopePairs};
use kvrun::kernels::{StepInfo, StepShape};
use kvrun::loader::Activation;
use kvrun::loader::{Rope, RopeScaling};

/// Every RMSNorm variant's outputs, the same bits (the lane variant sums in the workgroup
/// variant's order): `outputs` holds each variant's (name, values) of one case.
fn assert_same_bits(what: &str, outputs: &[(&str, Vec<f32>)]) {
    let (first, want) = &outputs[0];
    for (name, got) in &outputs[1..] {
        let same = got.len() == want.len()
            && got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{what}: the {name} variant's bits differ from the {first} variant's");
    }
}

#[test]
fn rms_norm_matches_reference_plain_and_gathered() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let variants = norm_variants(t);
    for (i, dim) in [64usize, 576, 1000, 7].into_iter().enumerate() {
        let mut outputs = Vec::new();
        for (variant, k) in &variants {
            let mut r = rng(i as u64);
            let tokens = 7;
            let x = uniform(&mut r, tokens * dim, 3.0);
            let w = uniform(&mut r, dim, 1.5);
            let rows: Vec<u32> = vec![6, 0, 3];
            let info = StepInfo {
                num_tokens: tokens as u32,
                num_logits: rows.len() as u32,
                ..Default::default()
            };
            let step = step_uniform(gpu, info);
            let (xb, wb, rb) =
                (storage_f32(gpu, &x), storage_f32(gpu, &w), storage_u32(gpu, &rows));
            let out = storage_f32(gpu, &vec![SENTINEL; (tokens + 1) * dim]);
            let out_g = storage_f32(gpu, &vec![SENTINEL; (rows.len() + 1) * dim]);
            // accumulate: out = old + norm, the residual add after Gemma's post-norms
            let old = uniform(&mut r, tokens * dim, 2.0);
            let mut old_padded = old.clone();
            old_padded.extend(vec![SENTINEL; dim]);
            let out_acc = storage_f32(gpu, &old_padded);
            // scaled: out = old · s + norm (Gemma 4's layer scalar)
            let out_scaled = storage_f32(gpu, &old_padded);
            let s = 0.625f32;
            let scaled_norm = |out: &wgpu::Buffer, rows: NormRows<'_>, accumulate, s| {
                let io = NormIo { step: &step, x: &xb, weight: &wb, out, rows, accumulate };
                RmsNormOp::scaled(gpu, k, "norm", dim as u32, 1e-5, io, s)
            };
            let norm = |out, rows, accumulate| scaled_norm(out, rows, accumulate, 1.0);
            let plain = norm(&out, NormRows::Step, false);
            let gather = norm(&out_g, NormRows::Gather(&rb), false);
            let acc = norm(&out_acc, NormRows::Step, true);
            let scaled = scaled_norm(&out_scaled, NormRows::Step, true, s);
            let shape = StepShape {
                num_tokens: tokens as u32,
                num_logits: rows.len() as u32,
                ..Default::default()
            };
            run(gpu, |pass| {
                plain.record(pass, &shape);
                gather.record(pass, &shape);
                acc.record(pass, &shape);
                scaled.record(pass, &shape);
            });
            let want = reference::rms_norm(&x, &w, 1e-5);
            let what = |case: &str| format!("rms_norm {case} dim {dim}, {variant} variant");
            let got_acc = gpu.read_f32(&out_acc, 0, (tokens + 1) * dim).unwrap();
            let want_acc: Vec<f32> = want.iter().zip(&old).map(|(n, o)| n + o).collect();
            assert_close(&what("accumulate"), &got_acc[..tokens * dim], &want_acc, 1e-6, 2e-6);
            assert_sentinels(&what("accumulate"), &got_acc[tokens * dim..]);
            let got_scaled = gpu.read_f32(&out_scaled, 0, (tokens + 1) * dim).unwrap();
            let want_scaled: Vec<f32> = want.iter().zip(&old).map(|(n, o)| o * s + n).collect();
            assert_close(&what("scaled"), &got_scaled[..tokens * dim], &want_scaled, 1e-6, 2e-6);
            assert_sentinels(&what("scaled"), &got_scaled[tokens * dim..]);
            let got_plain = gpu.read_f32(&out, 0, (tokens + 1) * dim).unwrap();
            assert_close(&what("plain"), &got_plain[..tokens * dim], &want, 1e-6, 2e-6);
            assert_sentinels(&what("plain"), &got_plain[tokens * dim..]);
            let got_gather = gpu.read_f32(&out_g, 0, (rows.len() + 1) * dim).unwrap();
            let want_g: Vec<f32> = rows
                .iter()
                .flat_map(|&r| want[r as usize * dim..(r as usize + 1) * dim].to_vec())
                .collect();
            assert_close(&what("gather"), &got_gather[..rows.len() * dim], &want_g, 1e-6, 2e-6);
            assert_sentinels(&what("gather"), &got_gather[rows.len() * dim..]);
            outputs.push((*variant, [got_plain, got_gather, got_acc, got_scaled].concat()));
        }
        assert_same_bits(&format!("rms_norm dim {dim}"), &outputs);
    }
}

/// Per-head RMSNorm (Gemma 3's Q/K norms): `heads` slices of `dim` from `x_offset` of each
/// strided token row, into another strided buffer, heads from `split` on with the weight's
/// second row (Q and K heads in one dispatch); the floats around the heads and the rows past
/// the step stay sentinels. `tokens × heads` of 66,000 passes lavapipe's 65,535 workgroups per
/// dimension, which the 2-D grid must cover.
#[test]
fn rms_norm_per_head_strided_and_past_the_grid_limit() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let variants = norm_variants(t);
    for (i, (tokens, heads, dim, split)) in
        [(9usize, 5usize, 256usize, 3usize), (3, 1, 40, 1), (16_500, 4, 8, 1), (7, 6, 16, 4)]
            .into_iter()
            .enumerate()
    {
        let mut r = rng(40 + i as u64);
        let (x_offset, x_stride) = (3 * dim + 4, 3 * dim + 4 + heads * dim + 8);
        let (out_offset, out_stride) = (5, 5 + heads * dim + 3);
        let x = uniform(&mut r, (tokens + 1) * x_stride, 3.0);
        let w = uniform(&mut r, 2 * dim, 1.5);
        let step = step_uniform(gpu, StepInfo { num_tokens: tokens as u32, ..Default::default() });
        let (xb, wb) = (storage_f32(gpu, &x), storage_f32(gpu, &w));
        let rows = HeadRows {
            heads: heads as u32,
            x_stride: x_stride as u32,
            x_offset: x_offset as u32,
            out_stride: out_stride as u32,
            out_offset: out_offset as u32,
            split: split as u32,
        };
        let w_rows = [&w[..dim], &w[dim..]];
        let want: Vec<f32> = x
            .chunks(x_stride)
            .take(tokens)
            .flat_map(|row| {
                (0..heads).flat_map(move |h| {
                    let head = &row[x_offset + h * dim..x_offset + (h + 1) * dim];
                    reference::rms_norm(head, w_rows[usize::from(h >= split)], 1e-6)
                })
            })
            .collect();
        let case = format!(
            "rms_norm per head: {tokens} tokens × {heads} heads of {dim}, second weight from {split}"
        );
        let mut outputs = Vec::new();
        for (variant, kernels) in &variants {
            let out = storage_f32(gpu, &vec![SENTINEL; (tokens + 1) * out_stride]);
            let io = NormIo {
                step: &step,
                x: &xb,
                weight: &wb,
                out: &out,
                rows: NormRows::Heads(rows),
                accumulate: false,
            };
            let op = RmsNormOp::new(gpu, kernels, "qk norm", dim as u32, 1e-6, io);
            run(gpu, |pass| {
                op.record(pass, &StepShape { num_tokens: tokens as u32, ..Default::default() });
            });
            let got = gpu.read_f32(&out, 0, (tokens + 1) * out_stride).unwrap();
            let what = format!("{case}, {variant} variant");
            for (ti, row) in got.chunks(out_stride).enumerate().take(tokens) {
                let normed = &row[out_offset..out_offset + heads * dim];
                let want = &want[ti * heads * dim..(ti + 1) * heads * dim];
                assert_close(&what, normed, want, 1e-6, 2e-6);
                assert_sentinels(&what, &row[..out_offset]);
                assert_sentinels(&what, &row[out_offset + heads * dim..]);
            }
            assert_sentinels(&what, &got[tokens * out_stride..]);
            outputs.push((*variant, got));
        }
        assert_same_bits(&case, &outputs);
    }
}

#[test]
fn rope_matches_reference_for_both_pair_layouts() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    for (i, pairs) in [RopePairs::Interleaved, RopePairs::Neox].into_iter().enumerate() {
        let layout = QkvLayout::new(5, 3, 32);
        let stride = layout.stride() as usize;
        let mut r = rng(10 + i as u64);
        let positions: Vec<u32> = vec![0, 1, 17, 250, 4095];
        let tokens = positions.len();
        let qkv = uniform(&mut r, tokens * stride, 2.0);
        let theta = 10000.0;
        let table = rope_table(32, &Rope { theta, scaling: RopeScaling::None }, 4096);
        let step = step_uniform(gpu, StepInfo { num_tokens: tokens as u32, ..Default::default() });
        let qkv_b = storage_f32(gpu, &qkv);
        let pos_b = storage_u32(gpu, &positions);
        let table_b = gpu.storage_buffer_init("rope table", bytemuck::cast_slice(&table));
        let op =
            RopeOp::new(gpu, &t.kernels, &step, &qkv_b, &pos_b, &table_b, layout.into(), pairs);
        run(gpu, |pass| {
            op.record(pass, &StepShape { num_tokens: tokens as u32, ..Default::default() });
        });
        let got = gpu.read_f32(&qkv_b, 0, tokens * stride).unwrap();
        let mut want = qkv.clone();
        for (ti, &pos) in positions.iter().enumerate() {
            for h in 0..8 {
                let base = ti * stride + h * 32;
                reference::rope_head(&mut want[base..base + 32], pos as usize, theta, pairs);
            }
        }
        // V heads (the last 3 of each row) must be untouched: the exact comparison covers them.
        assert_close(&format!("rope {pairs:?}"), &got, &want, 2e-6, 2e-6);
    }
}

/// MLA's RoPE: only the last `rot_dim` channels of each Q head and of the latent K head
/// (`RopeHeads::tail`), adjacent pairs; every other channel untouched.
#[test]
fn rope_rotates_only_the_tail_of_latent_heads() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let (width, rot) = (48usize, 16usize);
    let layout = QkvLayout { values_in_keys: true, ..QkvLayout::new(3, 1, width as u32) };
    let stride = layout.stride() as usize;
    assert_eq!(stride, 4 * width);
    let mut r = rng(12);
    let positions: Vec<u32> = vec![0, 5, 300];
    let tokens = positions.len();
    let qkv = uniform(&mut r, tokens * stride, 2.0);
    let theta = 10000.0;
    let table = rope_table(rot, &Rope { theta, scaling: RopeScaling::None }, 512);
    let step = step_uniform(gpu, StepInfo { num_tokens: tokens as u32, ..Default::default() });
    let qkv_b = storage_f32(gpu, &qkv);
    let pos_b = storage_u32(gpu, &positions);
    let table_b = gpu.storage_buffer_init("rope table", bytemuck::cast_slice(&table));
    let heads = RopeHeads::tail(layout, rot as u32);
    let pairs = RopePairs::Interleaved;
    let op = RopeOp::new(gpu, &t.kernels, &step, &qkv_b, &pos_b, &table_b, heads, pairs);
    run(gpu, |pass| {
        op.record(pass, &StepShape { num_tokens: tokens as u32, ..Default::default() });
    });
    let got = gpu.read_f32(&qkv_b, 0, tokens * stride).unwrap();
    let mut want = qkv.clone();
    for (ti, &pos) in positions.iter().enumerate() {
        for h in 0..4 {
            let base = ti * stride + h * width + width - rot;
            reference::rope_head(&mut want[base..base + rot], pos as usize, theta, pairs);
        }
    }
    assert_close("rope tail", &got, &want, 2e-6, 2e-6);
}

/// Partial RoPE: only the first `rot_dim` channels of each Q and K head (`RopeHeads::head`),
/// in both pair layouts within those channels (NEOX pairs (j, j + rot/2), as transformers'
/// partial_rotary_factor and llama.cpp's n_rot below head_dim rotate them); the rest of each
/// head and the V heads untouched.
#[test]
fn rope_rotates_only_the_head_of_partial_heads() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let (head_dim, rot) = (32usize, 8usize);
    let layout = QkvLayout::new(4, 2, head_dim as u32);
    let stride = layout.stride() as usize;
    for (i, pairs) in [RopePairs::Interleaved, RopePairs::Neox].into_iter().enumerate() {
        let mut r = rng(30 + i as u64);
        let positions: Vec<u32> = vec![0, 7, 1000];
        let tokens = positions.len();
        let qkv = uniform(&mut r, tokens * stride, 2.0);
        let theta = 10000.0;
        let table = rope_table(rot, &Rope { theta, scaling: RopeScaling::None }, 1024);
        let step = step_uniform(gpu, StepInfo { num_tokens: tokens as u32, ..Default::default() });
        let qkv_b = storage_f32(gpu, &qkv);
        let pos_b = storage_u32(gpu, &positions);
        let table_b = gpu.storage_buffer_init("rope table", bytemuck::cast_slice(&table));
        let heads = RopeHeads::head(layout, rot as u32);
        let op = RopeOp::new(gpu, &t.kernels, &step, &qkv_b, &pos_b, &table_b, heads, pairs);
        run(gpu, |pass| {
            op.record(pass, &StepShape { num_tokens: tokens as u32, ..Default::default() });
        });
        let got = gpu.read_f32(&qkv_b, 0, tokens * stride).unwrap();
        let mut want = qkv.clone();
        for (ti, &pos) in positions.iter().enumerate() {
            for h in 0..6 {
                let base = ti * stride + h * head_dim;
                reference::rope_head(&mut want[base..base + rot], pos as usize, theta, pairs);
            }
        }
        assert_close(&format!("partial rope {pairs:?}"), &got, &want, 2e-6, 2e-6);
    }
}

/// Both GLU activations vs their references: SiLU (Llama) and tanh-GELU (Gemma), the gate
/// spread over ±12 so the tails (where a naive tanh overflows) are covered.
#[test]
fn glu_matches_reference_for_every_activation() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let (tokens, ffn) = (5usize, 100usize);
    for activation in Activation::ALL {
        let mut r = rng(20);
        let mut gate_up = uniform(&mut r, tokens * 2 * ffn, 6.0);
        gate_up[0] = 12.0;
        gate_up[1] = -12.0;
        let step = step_uniform(gpu, StepInfo { num_tokens: tokens as u32, ..Default::default() });
        let gb = storage_f32(gpu, &gate_up);
        let out = storage_f32(gpu, &vec![SENTINEL; (tokens + 1) * ffn]);
        let op = GluOp::new(gpu, &t.kernels, activation, &step, &gb, &out, ffn as u32);
        run(gpu, |pass| {
            op.record(pass, &StepShape { num_tokens: tokens as u32, ..Default::default() });
        });
        let got = gpu.read_f32(&out, 0, (tokens + 1) * ffn).unwrap();
        let mut want = Vec::new();
        for row in gate_up.chunks(2 * ffn) {
            want.extend(reference::glu_mul(activation, &row[..ffn], &row[ffn..]));
        }
        let what = format!("glu {activation:?}");
        assert_close(&what, &got[..tokens * ffn], &want, 1e-6, 1e-5);
        assert_sentinels(&what, &got[tokens * ffn..]);
    }
}

#[test]
fn rotate_matches_fwht_bit_for_bit() {
    // The Hadamard rotation of `--kv-rotate`, in place, on `heads` contiguous heads from
    // `offset` of each token row; the floats before `offset` and after the rotated heads (and
    // the rows past the step's tokens) must be untouched. The kernel promises the same bits as
    // `quant::fwht_inplace`, so the comparison is exact.
    use kvrun::kernels::rotate::{RotateOp, RotateRows};
    use kvrun::quant::fwht_inplace;
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let variants = rotate_variants(t);
    let cases = [(16usize, 3usize, 5usize), (32, 4, 3), (64, 2, 3), (128, 3, 2), (256, 1, 4)];
    for ((name, kernels), (head_dim, heads, tokens)) in
        variants.iter().flat_map(|v| cases.iter().map(move |c| (v, *c)))
    {
        let offset = 7; // a row starts with 7 other floats, then the heads, then 5 more
        let row_stride = offset + heads * head_dim + 5;
        let mut r = rng(head_dim as u64);
        let x = uniform(&mut r, (tokens + 1) * row_stride, 3.0);
        let step = step_uniform(gpu, StepInfo { num_tokens: tokens as u32, ..Default::default() });
        let buf = storage_f32(gpu, &x);
        let rows = RotateRows {
            heads: heads as u32,
            head_dim: head_dim as u32,
            row_stride: row_stride as u32,
            offset: offset as u32,
        };
        let op = RotateOp::new(gpu, kernels, "test rotate", &step, &buf, rows);
        run(gpu, |pass| {
            op.record(pass, &StepShape { num_tokens: tokens as u32, ..Default::default() });
        });
        let got = gpu.read_f32(&buf, 0, x.len()).unwrap();
        let mut want = x.clone();
        for row in want.chunks_mut(row_stride).take(tokens) {
            for head in row[offset..offset + heads * head_dim].chunks_mut(head_dim) {
                fwht_inplace(head);
            }
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{name} ({:?}), head_dim {head_dim}: float {i} (row {}, column {}): GPU {g}, CPU {w}",
                kernels.config.rotate(head_dim as u32),
                i / row_stride,
                i % row_stride
            );
        }
    }
}

/// Greedy sampling on the GPU (`kernels::argmax`) against the CPU sampler's greedy choice
/// (`sample::Sampler` at temperature 0), row by row: random rows; a maximum repeated at several
/// indices (the lowest wins); NaN at and around the maximum (never picked); a row of NaN (0);
/// +inf (wins, the first of two); −inf only; −0 and +0 as the maxima (equal: the lowest index);
/// vocabularies not a multiple of the workgroup (1, 257, 1000) and Gemma 3's 262,144. The rows
/// past the step's count keep their sentinel.
#[test]
fn argmax_matches_the_cpu_greedy_sampler() {
    use kvrun::kernels::argmax::ArgmaxOp;
    use kvrun::sample::{Sampler, SamplingParams};
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let greedy = || Sampler::new(&SamplingParams { temperature: 0.0, ..Default::default() });
    for (i, vocab) in [1usize, 257, 1000, 262_144].into_iter().enumerate() {
        let mut r = rng(700 + i as u64);
        let mut rows: Vec<Vec<f32>> = (0..4).map(|_| uniform(&mut r, vocab, 8.0)).collect();
        if vocab > 10 {
            let top = vocab - 3;
            for (j, row) in rows.iter_mut().enumerate().skip(1) {
                match j {
                    1 => {
                        // ties: the maximum at three places, the lowest index must win
                        row[top] = 100.0;
                        row[5] = 100.0;
                        row[vocab - 1] = 100.0;
                    }
                    2 => {
                        // NaN where the maximum would be, and a +inf twice
                        row[0] = f32::NAN;
                        row[top] = f32::NAN;
                        row[7] = f32::INFINITY;
                        row[top - 1] = f32::INFINITY;
                    }
                    _ => {
                        // −0 and +0 as the maxima
                        row.iter_mut().for_each(|x| *x = -x.abs() - 1.0);
                        row[top] = 0.0;
                        row[9] = -0.0;
                    }
                }
            }
            rows.push(vec![f32::NAN; vocab]);
            rows.push(vec![f32::NEG_INFINITY; vocab]);
        }
        let n = rows.len();
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let logits = storage_f32(gpu, &flat);
        let ids = storage_u32(gpu, &vec![0xDEAD_BEEF; n + 1]);
        let step = step_uniform(gpu, StepInfo { num_logits: n as u32, ..Default::default() });
        let op = ArgmaxOp::new(gpu, &t.kernels, &step, &logits, &ids, vocab as u32);
        run(gpu, |pass| {
            op.record(pass, &StepShape { argmax_rows: n as u32, ..Default::default() });
        });
        let got = gpu.read_u32(&ids, 0, n + 1).unwrap();
        for (j, row) in rows.iter().enumerate() {
            assert_eq!(got[j], greedy().sample(row), "vocab {vocab}, row {j}");
        }
        assert_eq!(got[n], 0xDEAD_BEEF, "vocab {vocab}: a row past the step's was written");
    }
}

/// Target log-probabilities on the GPU (`kernels::logprob`) against log softmax in f64: random
/// rows, rows shifted by ±1000 (the max subtracted first), one peaked row whose target is far
/// below the maximum (a log-probability near −150), the target at the maximum, a row without a
/// target (its word untouched), vocabularies 1, 257, 1000 and Gemma 3's 262,144. The results
/// sit after the rows' argmax words (`num_logits + row`); the argmax words stay untouched.
/// Tolerance 3e-4: f32 sums of up to 1,024 terms an invocation, then a tree of 256.
#[test]
fn logprob_matches_log_softmax_in_f64() {
    use kvrun::kernels::logprob::{LogprobOp, NO_TARGET};
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    for (i, vocab) in [1usize, 257, 1000, 262_144].into_iter().enumerate() {
        let mut r = rng(900 + i as u64);
        let mut rows: Vec<Vec<f32>> = (0..3).map(|_| uniform(&mut r, vocab, 8.0)).collect();
        rows[1].iter_mut().for_each(|x| *x += 1000.0);
        rows[2].iter_mut().for_each(|x| *x -= 1000.0);
        let mut peaked = uniform(&mut r, vocab, 2.0);
        peaked[vocab / 2] = 150.0;
        rows.push(peaked);
        rows.push(uniform(&mut r, vocab, 8.0)); // no target
        let mut targets: Vec<u32> =
            (0..rows.len()).map(|_| rand::Rng::random_range(&mut r, 0..vocab as u32)).collect();
        targets[3] = if vocab > 1 { (vocab / 2 + 1) as u32 % vocab as u32 } else { 0 };
        targets[0] = argmax(&rows[0]) as u32;
        targets[4] = NO_TARGET;
        let n = rows.len();
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let logits = storage_f32(gpu, &flat);
        let targets_buf = storage_u32(gpu, &targets);
        let out = storage_u32(gpu, &vec![0xDEAD_BEEF; 2 * n + 1]);
        let step = step_uniform(gpu, StepInfo { num_logits: n as u32, ..Default::default() });
        let op = LogprobOp::new(gpu, &t.kernels, &step, &logits, &targets_buf, &out, vocab as u32);
        run(gpu, |pass| {
            op.record(pass, &StepShape { logprob_rows: n as u32, ..Default::default() });
        });
        let got = gpu.read_u32(&out, 0, 2 * n + 1).unwrap();
        assert!(got[..n].iter().all(|&w| w == 0xDEAD_BEEF), "vocab {vocab}: ids written");
        for (j, row) in rows.iter().enumerate() {
            let word = got[n + j];
            if targets[j] == NO_TARGET {
                assert_eq!(word, 0xDEAD_BEEF, "vocab {vocab}, row {j}: no target, written");
                continue;
            }
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
            let lse = max + row.iter().map(|&x| (f64::from(x) - max).exp()).sum::<f64>().ln();
            let want = f64::from(row[targets[j] as usize]) - lse;
            let lp = f64::from(f32::from_bits(word));
            assert!((lp - want).abs() < 3e-4, "vocab {vocab}, row {j}: {lp} vs {want}");
        }
        assert_eq!(got[2 * n], 0xDEAD_BEEF, "vocab {vocab}: past the step's rows");
    }
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |best, j| if row[j] > row[best] { j } else { best })
}

/// Gated attention's output gate (`kernels::gate`, Qwen3.5) against `reference::sigmoid_gate`:
/// a width that is not a multiple of the workgroup, gates at an offset inside wider rows, large
/// gates of both signs (sigmoid saturating), and the columns past the width and the row past
/// the step left alone; and one gate a row (Qwen3.5-MoE's shared expert), at column 17 of rows
/// of 19 gates.
#[test]
fn sigmoid_gate_matches_reference() {
    sigmoid_gate_case(false, (5, 100, 103, 130, 17));
    sigmoid_gate_case(true, (5, 100, 103, 19, 17));
}

fn sigmoid_gate_case(
    per_row: bool,
    (tokens, width, x_stride, g_stride, g_offset): (usize, usize, usize, usize, usize),
) {
    use kvrun::kernels::gate::{GateDims, GateOp};
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let mut r = rng(77);
    let mut x = uniform(&mut r, (tokens + 1) * x_stride, 3.0);
    let mut g = uniform(&mut r, tokens * g_stride, 6.0);
    g[g_offset] = 95.0;
    g[g_offset + g_stride] = -95.0;
    let xb = storage_f32(gpu, &x);
    let gb = storage_f32(gpu, &g);
    let step = step_uniform(gpu, StepInfo { num_tokens: tokens as u32, ..Default::default() });
    let dims = GateDims {
        width: width as u32,
        x_stride: x_stride as u32,
        g_stride: g_stride as u32,
        g_offset: g_offset as u32,
        per_row,
    };
    let op = GateOp::new(gpu, &t.kernels, &step, &gb, &xb, dims);
    run(gpu, |pass| {
        op.record(pass, &StepShape { num_tokens: tokens as u32, ..Default::default() });
    });
    let got = gpu.read_f32(&xb, 0, x.len()).unwrap();
    for tok in 0..tokens {
        let row = &x[tok * x_stride..][..width];
        let gates = match per_row {
            true => vec![g[tok * g_stride + g_offset]; width],
            false => g[tok * g_stride + g_offset..][..width].to_vec(),
        };
        let want = reference::sigmoid_gate(row, &gates);
        let what = format!("sigmoid gate, token {tok}, one a row {per_row}");
        assert_close(&what, &got[tok * x_stride..][..width], &want, 1e-6, 2e-6);
        x[tok * x_stride..][..width].copy_from_slice(&want);
    }
    // untouched: the columns past the width and the row past the step
    for (i, (a, b)) in got.iter().zip(&x).enumerate() {
        if i % x_stride >= width || i >= tokens * x_stride {
            assert_eq!(a.to_bits(), b.to_bits(), "sigmoid gate wrote outside its rows at {i}");
        }
    }
}

/// The final logit soft-cap (Gemma 4) against `cap · tanh(x / cap)` in f64: logits far inside
/// and far past the cap (tanh's saturation), ±0 and ±inf, vocabularies of 1, 257 and 262,144
/// (Gemma's: 4,096 workgroups a row); the row after the step's logit rows is not touched.
#[test]
fn softcap_matches_reference() {
    use kvrun::kernels::softcap::SoftcapOp;
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    for (i, (vocab, cap)) in
        [(1usize, 30.0f32), (257, 5.0), (262_144, 30.0)].into_iter().enumerate()
    {
        let mut r = rng(800 + i as u64);
        let rows = 3;
        let mut x = uniform(&mut r, rows * vocab, 4.0 * cap);
        if vocab > 4 {
            x[..4].copy_from_slice(&[0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY]);
        }
        let mut padded = x.clone();
        padded.extend(vec![SENTINEL; vocab]);
        let logits = storage_f32(gpu, &padded);
        let step = step_uniform(gpu, StepInfo { num_logits: rows as u32, ..Default::default() });
        let op = SoftcapOp::new(gpu, &t.kernels, &step, &logits, vocab as u32, cap);
        run(gpu, |pass| {
            op.record(pass, &StepShape { num_logits: rows as u32, ..Default::default() });
        });
        let got = gpu.read_f32(&logits, 0, (rows + 1) * vocab).unwrap();
        let what = format!("softcap {cap} over {vocab} logits");
        // tanh's f32 error on GPUs is a few ulp of its result; scaled by the cap
        assert_close(&what, &got[..rows * vocab], &reference::softcap(&x, cap), 1e-5, 1e-5);
        assert_sentinels(&what, &got[rows * vocab..]);
    }
}
