//! Quantized KV writes on the GPU against the CPU oracle in `quant/`, bit for bit:
//! - the WGSL codecs (`shaders/common/kv_codec.wgsl` + format snippets): FP8 e4m3/e5m2 decode of
//!   all 256 codes and encode of the committed ml_dtypes fixtures, f32 → f16 rounding, the
//!   correctly rounded division (exact ties included), each format's encode and raw decode;
//! - `kv_quantize` vs `quant::quantize_head_block` for every format × granularity, exact words:
//!   blocks partly from staging and partly from the step, shuffled block tables, several
//!   sequences and completed blocks in one step, block sizes 1, 16 and 64, head_dim 16/64/128,
//!   sentinels in every head block that must stay untouched;
//! - `kv_stage`: the rows of partial last blocks land in their staging slots, nothing else moves.
//!
//! No test here allows a one-code difference: `div_rn` makes every division correctly rounded.

mod common;

use common::*;
use half::f16;
use kvrun::kernels::kv_quantize::{
    run_codec_test, stage_words, KvCodeFormat, KvQuantizeIo, KvQuantizeOp, KvStageOp,
};
use kvrun::kernels::rope::QkvLayout;
use kvrun::kernels::{KvQuantLayout, StepShape};
use kvrun::model::{ForwardBatch, LogitsWanted, SeqChunk};
use kvrun::quant::{
    fp8_e4m3_decode, fp8_e4m3_encode, fp8_e5m2_decode, fp8_e5m2_encode, head_block_words,
    quantize_head_block, KvCacheSpec, KvFormat, KvQuant, ScaleGranularity,
};
use rand::seq::SliceRandom;
use rand::Rng;
use std::path::PathBuf;

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/fixtures/fp8").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn same_f32(got: f32, want: f32) -> bool {
    if want.is_nan() {
        got.is_nan()
    } else {
        got.to_bits() == want.to_bits()
    }
}

/// Runs the codec kernel with a = `a`, everything else benign.
fn codec(format: KvCodeFormat, a: &[f32], b: &[f32], m: &[f32], words: &[u32]) -> Vec<[u32; 8]> {
    let t = gpu().expect("checked by the caller");
    let out = run_codec_test(&t.gpu, &t.kernels, format, a, b, m, words).unwrap();
    out.codes.chunks_exact(8).map(|c| c.try_into().unwrap()).collect()
}

#[test]
fn fp8_codec_matches_cpu_on_all_codes_and_the_ml_dtypes_fixtures() {
    if gpu().is_none() {
        return;
    }
    let inputs = f32s(&fixture("encode_input.f32"));
    let n = inputs.len().max(256);
    let mut a = inputs.clone();
    a.resize(n, 0.0);
    let out = codec(KvCodeFormat::Int8, &a, &vec![1.0; n], &vec![0.0; n], &vec![0; n + 1]);
    let want_e4m3 = fixture("encode_e4m3.u8");
    let want_e5m2 = fixture("encode_e5m2.u8");
    for (i, x) in inputs.iter().enumerate() {
        let (e4, e5) = (out[i][0], out[i][1]);
        assert_eq!(e4, u32::from(want_e4m3[i]), "e4m3 encode of input #{i} {x:e}");
        assert_eq!(e5, u32::from(want_e5m2[i]), "e5m2 encode of input #{i} {x:e}");
        assert_eq!(e4, u32::from(fp8_e4m3_encode(*x)), "e4m3 vs CPU, #{i}");
        assert_eq!(e5, u32::from(fp8_e5m2_encode(*x)), "e5m2 vs CPU, #{i}");
    }
    let dec_e4m3 = f32s(&fixture("decode_e4m3.f32"));
    let dec_e5m2 = f32s(&fixture("decode_e5m2.f32"));
    for code in 0..256usize {
        let (g4, g5) = (f32::from_bits(out[code][2]), f32::from_bits(out[code][3]));
        assert!(same_f32(g4, dec_e4m3[code]), "e4m3 decode {code:#04x}: {g4:e}");
        assert!(same_f32(g5, dec_e5m2[code]), "e5m2 decode {code:#04x}: {g5:e}");
        assert!(same_f32(g4, fp8_e4m3_decode(code as u8)), "e4m3 vs CPU {code:#04x}");
        assert!(same_f32(g5, fp8_e5m2_decode(code as u8)), "e5m2 vs CPU {code:#04x}");
    }
}

/// f16 scales of every magnitude the quantizer produces, and the fixed divisors.
fn divisors(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| match i % 8 {
            0 => 127.0,
            1 => 15.0,
            2 => 448.0,
            3 => 57344.0,
            4 => f16::from_bits(rng.random_range(0x0001..0x0400)).to_f32(), // f16 subnormal
            _ => f16::from_bits(rng.random_range(0x0400..0x7800)).to_f32(),
        })
        .collect()
}

#[test]
fn division_and_f16_rounding_are_exact_including_ties() {
    if gpu().is_none() {
        return;
    }
    let mut rng = rng(11);
    let n = 20_000;
    let b = divisors(&mut rng, n);
    let a: Vec<f32> = (0..n)
        .map(|i| {
            let s = b[i];
            match i % 5 {
                // exact ties of rne(a / b): (k + ½)·b, exactly representable
                0 => (rng.random_range(-127i32..127) as f32 + 0.5) * s,
                // a hair off a tie
                1 => f32::from_bits(((rng.random_range(0..16) as f32 + 0.5) * s).to_bits() + 1),
                // f16 data values and their differences
                2 => f16::from_bits(rng.random_range(0..0x7BFF)).to_f32(),
                3 => {
                    f16::from_bits(rng.random_range(0..0x7BFF)).to_f32()
                        - f16::from_bits(rng.random_range(0x8000..0xFBFF)).to_f32()
                }
                _ => rng.random_range(-1000.0f32..1000.0),
            }
        })
        .collect();
    let out = codec(KvCodeFormat::Int8, &a, &b, &vec![0.0; n], &vec![0; n + 1]);
    let mut ties = 0;
    for i in 0..n {
        let want = a[i] / b[i];
        let got = f32::from_bits(out[i][4]);
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "div_rn({:e}, {:e}): {got:e} vs {want:e}",
            a[i],
            b[i]
        );
        ties += usize::from(want.fract().abs() == 0.5);
        let h = f16::from_f32(a[i]).to_bits() as u32;
        assert_eq!(out[i][5], h, "f16_bits({:e})", a[i]);
    }
    assert!(ties > n / 10, "too few exact ties tested: {ties}");
    // f16 rounding edges: max, overflow to inf, subnormals, halfway cases
    let edges: Vec<f32> = [
        65504.0f32,
        65519.0,
        65520.0,
        1e6,
        6.0e-8,
        2.98e-8,
        2.99e-8,
        5.96e-8,
        1.0e-5,
        6.1e-5,
        1.0 + 1.0 / 2048.0, // halfway between two f16 values: ties to even
        1.0 + 3.0 / 2048.0,
        -2.5e-7,
        1e-40,
        0.0,
        -0.0,
    ]
    .into_iter()
    .collect();
    let m = edges.len();
    let out = codec(KvCodeFormat::Int8, &edges, &vec![1.0; m], &vec![0.0; m], &vec![0; m + 1]);
    for (x, o) in edges.iter().zip(&out) {
        assert_eq!(o[5], u32::from(f16::from_f32(*x).to_bits()), "f16_bits({x:e})");
    }
}

/// The CPU code of `x` with stored scale `s` and minimum `m` (quant/kv_block.rs `encode`).
fn cpu_encode(format: KvCodeFormat, x: f32, s: f32, m: f32) -> u32 {
    match format {
        KvCodeFormat::Fp8E4m3 => u32::from(fp8_e4m3_encode(x / s)),
        KvCodeFormat::Fp8E5m2 => u32::from(fp8_e5m2_encode(x / s)),
        KvCodeFormat::Int8 => ((x / s).round_ties_even().clamp(-127.0, 127.0) as i32 as u32) & 0xFF,
        KvCodeFormat::Int4 => ((x - m) / s).round_ties_even().clamp(0.0, 15.0) as u32,
    }
}

/// The raw value of a code (before × s + m).
fn cpu_raw(format: KvCodeFormat, code: u32) -> f32 {
    match format {
        KvCodeFormat::Fp8E4m3 => fp8_e4m3_decode(code as u8),
        KvCodeFormat::Fp8E5m2 => fp8_e5m2_decode(code as u8),
        KvCodeFormat::Int8 => f32::from(code as u8 as i8),
        KvCodeFormat::Int4 => code as f32,
    }
}

#[test]
fn every_format_encodes_and_decodes_like_the_cpu() {
    let Some(t) = gpu() else { return };
    for format in KvCodeFormat::ALL {
        let mut rng = rng(20 + format as u64);
        let n = 8192;
        let s = divisors(&mut rng, n)
            .iter()
            .map(|d| if *d > 1000.0 { f16::from_f32(0.37).to_f32() } else { *d })
            .collect::<Vec<_>>();
        let m: Vec<f32> =
            (0..n).map(|_| f16::from_f32(rng.random_range(-3.0..0.0)).to_f32()).collect();
        let a: Vec<f32> = (0..n)
            .map(|i| match i % 3 {
                0 => {
                    (rng.random_range(-130i32..130) as f32 + 0.5) * s[i]
                        + m[i] * f32::from(u8::from(format == KvCodeFormat::Int4))
                }
                1 => f16::from_f32(rng.random_range(-20.0f32..20.0) * s[i]).to_f32(),
                _ => f16::from_f32((rng.random_range(-500.0f32..500.0) * s[i]).clamp(-6e4, 6e4))
                    .to_f32(),
            })
            .collect();
        // words covering every byte (and nibble) value in every position
        let words: Vec<u32> =
            (0..=n as u32).map(|i| if i < 256 { i * 0x0101_0101 } else { rng.random() }).collect();
        let out = run_codec_test(&t.gpu, &t.kernels, format, &a, &s, &m, &words).unwrap();
        let bits = if format == KvCodeFormat::Int4 { 4 } else { 8 };
        let code = |w: u32, j: u32| (w >> (j * bits)) & ((1 << bits) - 1);
        for i in 0..n {
            let want = cpu_encode(format, a[i], s[i], m[i]);
            assert_eq!(
                out.codes[i * 8 + 6],
                want,
                "{format:?} encode({:e}, s {:e}, m {:e})",
                a[i],
                s[i],
                m[i]
            );
            let raw = &out.raw[i * 16..(i + 1) * 16];
            for j in 0..8u32 {
                let (w, k) =
                    if bits == 8 && j >= 4 { (words[i + 1], j - 4) } else { (words[i], j) };
                let want = cpu_raw(format, code(w, k));
                assert!(
                    same_f32(raw[j as usize], want),
                    "{format:?} raw8 word {i} code {j}: {} vs {want}",
                    raw[j as usize]
                );
            }
            for k in 0..(16 / bits) {
                for half in 0..2 {
                    let want = cpu_raw(format, code(words[i], 2 * k + half));
                    let got = raw[(8 + 2 * k + half) as usize];
                    assert!(
                        same_f32(got, want),
                        "{format:?} raw2 word {i} pair {k}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// One sequence of a quantize test step: positions `start..start + len` computed now.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    start: usize,
    len: usize,
}

struct QuantCase {
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    chunks: Vec<Chunk>,
}

/// Quantizes one step of `case` with `spec` on the GPU and checks the pool words and the
/// staging buffer against the CPU.
fn check_quantize(spec: KvCacheSpec, case: &QuantCase, seed: u64) {
    let t = gpu().expect("checked by the caller");
    let gpu = &t.gpu;
    let (kvh, hd, bs) = (case.kv_heads, case.head_dim, case.block_size);
    let layout = QkvLayout::new(2 * kvh as u32, kvh as u32, hd as u32);
    let stride = layout.stride() as usize;
    let mut rng = rng(seed);
    let seqs = case.chunks.len();
    let k: Vec<Vec<f32>> = case
        .chunks
        .iter()
        .map(|c| kv_values(&mut rng, case.kv_heads * case.head_dim, c.start + c.len, 2.0, 8.0))
        .collect();
    let v: Vec<Vec<f32>> = case
        .chunks
        .iter()
        .map(|c| kv_values(&mut rng, case.kv_heads * case.head_dim, c.start + c.len, 2.0, 8.0))
        .collect();
    // shuffled block tables over a pool with spare blocks
    let needed: usize = case.chunks.iter().map(|c| (c.start + c.len).div_ceil(bs)).sum();
    let num_blocks = needed + 3;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(&mut rng);
    let mut tables = Vec::new();
    let mut next = 0;
    for c in &case.chunks {
        let n = (c.start + c.len).div_ceil(bs);
        tables.push(ids[next..next + n].to_vec());
        next += n;
    }
    // staging slots in reverse order (slot ≠ sequence index), holding the rows before each
    // chunk in the chunk's first block; everything else a sentinel
    let slots: Vec<u32> = (0..seqs as u32).rev().collect();
    let sentinel = 0xDEAD_BEEFu32;
    let words = stage_words(seqs, kvh, bs, hd);
    let mut stage = vec![sentinel; words];
    let stage_idx = |part: usize, slot: usize, h: usize, off: usize, w: usize| {
        (((part * seqs + slot) * kvh + h) * bs + off) * (hd / 2) + w
    };
    for (si, c) in case.chunks.iter().enumerate() {
        for pos in c.start / bs * bs..c.start {
            for h in 0..kvh {
                for w in 0..hd / 2 {
                    let e = (pos * kvh + h) * hd + 2 * w;
                    let slot = slots[si] as usize;
                    stage[stage_idx(0, slot, h, pos % bs, w)] = pack_f16(k[si][e], k[si][e + 1]);
                    stage[stage_idx(1, slot, h, pos % bs, w)] = pack_f16(v[si][e], v[si][e + 1]);
                }
            }
        }
    }
    // the step: qkv rows of every chunk (Q garbage), batch lists from ForwardBatch
    let tokens: Vec<Vec<u32>> = case.chunks.iter().map(|c| vec![1; c.len]).collect();
    let chunks: Vec<SeqChunk<'_>> = case
        .chunks
        .iter()
        .enumerate()
        .map(|(si, c)| SeqChunk {
            tokens: &tokens[si],
            start_pos: c.start,
            block_tables: std::slice::from_ref(&tables[si]),
            slot_mapping: None,
            logits: LogitsWanted::None,
            stage_slot: slots[si],
            states: Default::default(),
        })
        .collect();
    let batch = ForwardBatch::new(&chunks, bs, 8);
    let num_tokens = batch.num_tokens();
    let mut qkv = vec![7.25f32; num_tokens * stride];
    for (si, s) in batch.seqs.iter().enumerate() {
        // batch.seqs is reordered (decodes first): find the chunk by its stage slot
        let ci = slots.iter().position(|&x| x == s.stage_slot).unwrap();
        let c = case.chunks[ci];
        assert_eq!(s.q_len as usize, c.len, "sequence {si}");
        for i in 0..c.len {
            let row = s.q_start as usize + i;
            let src = (c.start + i) * kvh * hd..(c.start + i + 1) * kvh * hd;
            let ko = layout.k_offset() as usize;
            let vo = layout.v_offset() as usize;
            qkv[row * stride + ko..row * stride + ko + kvh * hd]
                .copy_from_slice(&k[ci][src.clone()]);
            qkv[row * stride + vo..row * stride + vo + kvh * hd].copy_from_slice(&v[ci][src]);
        }
    }
    let q = KvQuantLayout::new(&spec, bs, hd, seqs).unwrap();
    let (khb, vhb) = (q.k_head_block_words as usize, q.v_head_block_words as usize);
    let k_pool_init = vec![sentinel; num_blocks * kvh * khb];
    let v_pool_init = vec![sentinel; num_blocks * kvh * vhb];
    let step = step_uniform(gpu, batch.step_info());
    let qkv_b = storage_f32(gpu, &qkv);
    let stage_b = storage_u32(gpu, &stage);
    let completed: Vec<u32> = batch.completed_blocks[0].iter().flatten().copied().collect();
    let completed_b = storage_u32(gpu, &completed);
    let rows: Vec<u32> = batch.stage_rows.iter().flatten().copied().collect();
    let rows_b = storage_u32(gpu, &rows);
    let k_b = storage_u32(gpu, &k_pool_init);
    let v_b = storage_u32(gpu, &v_pool_init);
    let io = KvQuantizeIo {
        step: &step,
        qkv: &qkv_b,
        stage: &stage_b,
        completed: &completed_b,
        k_pool: &k_b,
        v_pool: &v_b,
    };
    let quantize = KvQuantizeOp::new(gpu, &t.kernels, layout, bs as u32, q, io);
    let stage_op = KvStageOp::new(
        gpu,
        &t.kernels,
        &step,
        &qkv_b,
        &rows_b,
        &stage_b,
        layout,
        bs as u32,
        seqs as u32,
    );
    let shape: StepShape = batch.shape();
    run(gpu, |pass| {
        quantize.record(pass, &shape);
        stage_op.record(pass, &shape);
    });
    let got_k = gpu.read_u32(&k_b, 0, k_pool_init.len()).unwrap();
    let got_v = gpu.read_u32(&v_b, 0, v_pool_init.len()).unwrap();
    let got_stage = gpu.read_u32(&stage_b, 0, words).unwrap();

    // expected: every block whose last position this step computed, quantized on the CPU
    let (mut want_k, mut want_v) = (k_pool_init.clone(), v_pool_init.clone());
    let mut want_stage = stage.clone();
    let mut completed_count = 0;
    let written =
        |q: KvQuant| head_block_words(q, bs, hd).data_words + q.scale_values(bs, hd).div_ceil(2);
    for (si, c) in case.chunks.iter().enumerate() {
        let end = c.start + c.len;
        for (blk, &block) in tables[si].iter().enumerate().take(end / bs).skip(c.start / bs) {
            completed_count += 1;
            let block = block as usize;
            for h in 0..kvh {
                let rows = |x: &[f32]| -> Vec<f32> {
                    (blk * bs..(blk + 1) * bs)
                        .flat_map(|pos| x[(pos * kvh + h) * hd..(pos * kvh + h + 1) * hd].to_vec())
                        .collect()
                };
                let kw = quantize_head_block(spec.k, bs, hd, &rows(&k[si]));
                let vw = quantize_head_block(spec.v, bs, hd, &rows(&v[si]));
                let (kb, vb) = ((block * kvh + h) * khb, (block * kvh + h) * vhb);
                // the words after the scales pad the block to whole u64s: never written
                let (kn, vn) = (written(spec.k), written(spec.v));
                want_k[kb..kb + kn].copy_from_slice(&kw[..kn]);
                want_v[vb..vb + vn].copy_from_slice(&vw[..vn]);
            }
        }
        if end % bs != 0 {
            for pos in (end / bs * bs).max(c.start)..end {
                for h in 0..kvh {
                    for w in 0..hd / 2 {
                        let e = (pos * kvh + h) * hd + 2 * w;
                        let slot = slots[si] as usize;
                        want_stage[stage_idx(0, slot, h, pos % bs, w)] =
                            pack_f16(k[si][e], k[si][e + 1]);
                        want_stage[stage_idx(1, slot, h, pos % bs, w)] =
                            pack_f16(v[si][e], v[si][e + 1]);
                    }
                }
            }
        }
    }
    assert_eq!(completed_count, batch.num_completed_blocks(), "ForwardBatch's completed blocks");
    let what = format!("{spec} kv_heads {kvh} head_dim {hd} block {bs} chunks {:?}", case.chunks);
    for (name, got, want, hbw) in [("K", &got_k, &want_k, khb), ("V", &got_v, &want_v, vhb)] {
        if let Some(i) = got.iter().zip(want.iter()).position(|(g, w)| g != w) {
            let (hb, w) = (i / hbw, i % hbw);
            panic!(
                "{what}: {name} pool differs first at word {i} (block {}, KV head {}, word {w} of \
                 {hbw}): got {:#010x}, want {:#010x}",
                hb / kvh,
                hb % kvh,
                got[i],
                want[i]
            );
        }
    }
    if let Some(i) = got_stage.iter().zip(&want_stage).position(|(g, w)| g != w) {
        panic!(
            "{what}: staging differs first at word {i}: {:#010x} vs {:#010x}",
            got_stage[i], want_stage[i]
        );
    }
    assert!(completed_count > 0, "{what}: the case completes no block");
}

/// Several sequences: a fresh prefill spanning blocks, a chunk that starts inside a block
/// (staged rows) and completes it, a decode that completes a block, a decode that does not.
fn cases(bs: usize, hd: usize, kvh: usize) -> QuantCase {
    let chunks = vec![
        Chunk { start: 0, len: 2 * bs + bs / 2 + 1 },
        Chunk { start: bs + (bs / 3).min(bs - 1), len: bs + 2 },
        Chunk { start: 3 * bs - 1, len: 1 },
        Chunk { start: 2 * bs + bs / 2, len: 1 },
    ];
    QuantCase { kv_heads: kvh, head_dim: hd, block_size: bs, chunks }
}

fn specs_for(format: KvFormat) -> Vec<KvCacheSpec> {
    let valid = |g| KvQuant { format, granularity: g }.is_valid();
    let grans: Vec<ScaleGranularity> =
        ScaleGranularity::ALL.into_iter().filter(|&g| valid(g)).collect();
    // every granularity as K and as V (paired with a different one for the other half)
    grans
        .iter()
        .enumerate()
        .map(|(i, &g)| {
            let other = grans[(i + 1) % grans.len()];
            KvCacheSpec::new(format, Some(g), Some(other), false).unwrap()
        })
        .chain(grans.iter().map(|&g| KvCacheSpec::new(format, Some(g), Some(g), false).unwrap()))
        .collect()
}

#[test]
fn kv_quantize_matches_quantize_head_block_for_every_format_and_granularity() {
    if gpu().is_none() {
        return;
    }
    for (fi, format) in [KvFormat::Fp8E4m3, KvFormat::Fp8E5m2, KvFormat::Int8, KvFormat::Int4]
        .into_iter()
        .enumerate()
    {
        for (si, spec) in specs_for(format).into_iter().enumerate() {
            check_quantize(spec, &cases(16, 64, 3), (fi * 100 + si) as u64);
        }
    }
}

#[test]
fn kv_quantize_block_sizes_and_head_dims() {
    if gpu().is_none() {
        return;
    }
    let default = |f| KvCacheSpec::new(f, None, None, false).unwrap();
    for (i, (bs, hd, kvh)) in
        [(1usize, 64usize, 2usize), (64, 64, 1), (16, 128, 2), (16, 16, 2), (5, 32, 1)]
            .into_iter()
            .enumerate()
    {
        for (j, format) in
            [KvFormat::Int8, KvFormat::Int4, KvFormat::Fp8E4m3].into_iter().enumerate()
        {
            check_quantize(default(format), &cases(bs, hd, kvh), (1000 + i * 10 + j) as u64);
        }
        let per_head = KvCacheSpec::new(
            KvFormat::Int4,
            Some(ScaleGranularity::PerHead),
            Some(ScaleGranularity::PerHead),
            false,
        )
        .unwrap();
        check_quantize(per_head, &cases(bs, hd, kvh), 2000 + i as u64);
    }
}

/// A head block's bytes as the pool allocates them equal the plan's (head_block_words).
#[test]
fn quant_layout_matches_head_block_words() {
    for format in [KvFormat::Fp8E4m3, KvFormat::Int8, KvFormat::Int4] {
        for spec in specs_for(format) {
            let q = KvQuantLayout::new(&spec, 16, 64, 4).unwrap();
            let k = head_block_words(spec.k, 16, 64);
            assert_eq!(q.k_head_block_words as usize, k.total_words);
            assert_eq!(q.k_data_words as usize, k.data_words);
            assert_eq!(q.v_head_block_words as usize, head_block_words(spec.v, 16, 64).total_words);
        }
    }
    assert!(KvQuantLayout::new(&KvCacheSpec::default(), 16, 64, 4).is_none());
}
