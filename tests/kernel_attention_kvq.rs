//! Paged attention over a quantized KV pool (fused dequantization) vs the CPU reference on the
//! dequantized values: one step runs `kv_quantize` → attention → `kv_stage` exactly as the
//! model does. Blocks completed before the step hold `quant::quantize_head_block` words (the
//! CPU quantizer, itself checked against the GPU writer in kernel_kv_quant.rs); the rows of a
//! partial last block written earlier sit in their sequence's f16 staging slot.
//!
//! The CPU reference reads key position k for a query at position P as the kernels document
//! (shaders/common/kv_quant.wgsl): dequantized (`quant::dequantize_element`) when k's block
//! precedes P's block, else the f16 value. Every format × granularity, shuffled block tables,
//! GQA ratios 1, 3 and MQA, block sizes 1, 16 and 64, prefill chunks after a cached prefix, decodes
//! that complete a block, and both attention variants. Sliding windows (every format): the table
//! entries of blocks wholly before the window of a chunk's first query point at a block of all
//! ones (NaN codes or NaN scales in every format), as the KV manager frees them. Prefill and
//! decode of the same tokens agree to the bit, with and without a window.

mod common;

use common::*;
use kvrun::kernels::attention::KvQuantIo;
use kvrun::kernels::attention::{self, partials_bytes, partitions, AttentionIo, AttentionOp};
use kvrun::kernels::kv_quantize::{stage_words, KvQuantizeIo, KvQuantizeOp, KvStageOp};
use kvrun::kernels::rope::QkvLayout;
use kvrun::kernels::{reference, Kernels, KvQuantLayout};
use kvrun::model::{ForwardBatch, LogitsWanted, SeqChunk};
use kvrun::quant::{
    dequantize_element, quantize_head_block, KvCacheSpec, KvFormat, KvQuant, ScaleGranularity,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use std::num::NonZeroU32;

/// One sequence of the step: `start` positions already cached, `len` computed now.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    start: usize,
    len: usize,
}

#[derive(Clone, Copy, Debug)]
struct Shape {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    /// Head blocks a pool block has room for (≥ kv_heads: a layer narrower than its pool
    /// slot's widest, Gemma 4; `QkvLayout::pool_heads`).
    pool_heads: usize,
    /// The first of them that are the layer's (layers packed into one slot).
    pool_head_base: usize,
}

/// The rows of block `blk`, KV head `h` of `x` ([pos, kv_heads, head_dim]).
fn head_block_rows(x: &[f32], s: &Shape, blk: usize, h: usize) -> Vec<f32> {
    let (bs, hd, kvh) = (s.block_size, s.head_dim, s.kv_heads);
    (blk * bs..(blk + 1) * bs)
        .flat_map(|p| x[(p * kvh + h) * hd..(p * kvh + h + 1) * hd].to_vec())
        .collect()
}

fn check(spec: KvCacheSpec, s: Shape, chunks: &[Chunk], seed: u64) {
    check_window(spec, s, chunks, None, seed);
}

fn check_window(spec: KvCacheSpec, s: Shape, chunks: &[Chunk], window: Option<usize>, seed: u64) {
    let Some(t) = gpu() else { return };
    for (name, kernels) in attention_variants_kvq(t) {
        check_variant(spec, s, chunks, (window, false), seed, &kernels, name);
    }
}

/// Per chunk: k, v [start + len, kv_heads, head_dim] (positions 0..end), q [len, heads, head_dim];
/// the query heads' attention sinks (gpt-oss) where the case has them.
struct Inputs {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    q: Vec<Vec<f32>>,
    sinks: Option<Vec<f32>>,
}

/// Sinks for `heads` query heads: one that dominates (+12), one that vanishes (−30), the rest
/// among the scores.
fn some_sinks(heads: usize, seed: u64) -> Vec<f32> {
    let mut s = uniform(&mut rng(seed), heads, 3.0);
    s[0] = 12.0;
    if heads > 1 {
        s[1] = -30.0;
    }
    s
}

fn random_inputs(rng: &mut StdRng, s: Shape, chunks: &[Chunk]) -> Inputs {
    let (qd, kvd) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let k = chunks.iter().map(|c| kv_values(rng, kvd, c.start + c.len, 1.0, 6.0)).collect();
    let v = chunks.iter().map(|c| kv_values(rng, kvd, c.start + c.len, 1.0, 6.0)).collect();
    let q = chunks.iter().map(|c| uniform(rng, c.len * qd, 1.0)).collect();
    Inputs { k, v, q, sinks: None }
}

/// One step on the GPU: kv_quantize → attention → kv_stage, as the model runs them. Returns
/// each chunk's output rows, [len, heads · head_dim].
fn gpu_step(
    spec: KvCacheSpec,
    s: Shape,
    chunks: &[Chunk],
    inp: &Inputs,
    window: Option<usize>,
    rng: &mut StdRng,
    kernels: &Kernels,
) -> Vec<Vec<f32>> {
    let t = gpu().expect("checked by the caller");
    let gpu = &t.gpu;
    let (kvh, hd, bs) = (s.kv_heads, s.head_dim, s.block_size);
    let (room, base) = (s.pool_heads, s.pool_head_base);
    let layout = QkvLayout::new(s.heads as u32, kvh as u32, hd as u32)
        .with_pool_heads_from(room as u32, base as u32);
    let stride = layout.stride() as usize;
    let (qd, kvd) = (s.heads * hd, kvh * hd);
    let n = chunks.len();
    let Inputs { k, v, q, sinks } = inp;
    let needed: usize = chunks.iter().map(|c| (c.start + c.len).div_ceil(bs)).sum();
    let num_blocks = needed + 3;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(rng);
    let mut tables = Vec::new();
    let mut next = 0;
    for c in chunks {
        let m = (c.start + c.len).div_ceil(bs);
        tables.push(ids[next..next + m].to_vec());
        next += m;
    }
    let ql = KvQuantLayout::new(&spec, bs, hd, n).expect("a quantized spec");
    let (khb, vhb) = (ql.k_head_block_words as usize, ql.v_head_block_words as usize);
    // pool: blocks complete before the step quantized on the CPU; everything else NaN-ish
    // garbage so a wrong read poisons the output
    let garbage = 0x7E00_7E00u32;
    let mut k_pool = vec![garbage; num_blocks * room * khb];
    let mut v_pool = vec![garbage; num_blocks * room * vhb];
    // staging, slots in reverse order (slot ≠ sequence index): the rows of the chunk's first
    // block that precede the chunk
    let slots: Vec<u32> = (0..n as u32).rev().collect();
    let mut stage = vec![garbage; stage_words(n, kvh, bs, hd)];
    let stage_idx = |part: usize, slot: usize, h: usize, off: usize, w: usize| {
        (((part * n + slot) * kvh + h) * bs + off) * (hd / 2) + w
    };
    for (si, c) in chunks.iter().enumerate() {
        for (blk, &block) in tables[si].iter().enumerate().take(c.start / bs) {
            let block = block as usize;
            for h in 0..kvh {
                let kb = (block * room + base + h) * khb;
                let vb = (block * room + base + h) * vhb;
                k_pool[kb..kb + khb].copy_from_slice(&quantize_head_block(
                    spec.k,
                    bs,
                    hd,
                    &head_block_rows(&k[si], &s, blk, h),
                ));
                v_pool[vb..vb + vhb].copy_from_slice(&quantize_head_block(
                    spec.v,
                    bs,
                    hd,
                    &head_block_rows(&v[si], &s, blk, h),
                ));
            }
        }
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
    // blocks wholly before the window of a chunk's first query freed: their entries point at a
    // block of all ones
    let freed = ids[needed];
    k_pool[freed as usize * room * khb..(freed as usize + 1) * room * khb].fill(u32::MAX);
    v_pool[freed as usize * room * vhb..(freed as usize + 1) * room * vhb].fill(u32::MAX);
    let gpu_tables: Vec<Vec<u32>> = chunks
        .iter()
        .zip(&tables)
        .map(|(c, t)| {
            let lo = window.map_or(0, |w| (c.start + 1).saturating_sub(w));
            let live = |(b, &id): (usize, &u32)| if (b + 1) * bs <= lo { freed } else { id };
            t.iter().enumerate().map(live).collect()
        })
        .collect();
    // the step, laid out by ForwardBatch as the model does
    let tokens: Vec<Vec<u32>> = chunks.iter().map(|c| vec![1; c.len]).collect();
    let seq_chunks: Vec<SeqChunk<'_>> = chunks
        .iter()
        .enumerate()
        .map(|(si, c)| SeqChunk {
            tokens: &tokens[si],
            start_pos: c.start,
            block_tables: std::slice::from_ref(&gpu_tables[si]),
            slot_mapping: None,
            logits: LogitsWanted::None,
            stage_slot: slots[si],
            states: Default::default(),
        })
        .collect();
    let qt = attention::query_tile(kernels.config.attention(hd as u32), hd as u32) as usize;
    let batch = ForwardBatch::new(&seq_chunks, bs, qt);
    let num_tokens = batch.num_tokens();
    let mut qkv = vec![0.0f32; num_tokens * stride];
    // output row of each (chunk, i)
    let mut out_row = vec![Vec::new(); n];
    for sinfo in &batch.seqs {
        let ci = slots.iter().position(|&x| x == sinfo.stage_slot).unwrap();
        let c = chunks[ci];
        for i in 0..c.len {
            let row = sinfo.q_start as usize + i;
            out_row[ci].push(row);
            let kv_src = (c.start + i) * kvd..(c.start + i + 1) * kvd;
            let (ko, vo) = (layout.k_offset() as usize, layout.v_offset() as usize);
            qkv[row * stride..row * stride + qd].copy_from_slice(&q[ci][i * qd..(i + 1) * qd]);
            qkv[row * stride + ko..row * stride + ko + kvd].copy_from_slice(&k[ci][kv_src.clone()]);
            qkv[row * stride + vo..row * stride + vo + kvd].copy_from_slice(&v[ci][kv_src]);
        }
    }
    let info = batch.step_info();
    let shape = batch.shape();
    let step = step_uniform(gpu, info);
    let qkv_b = storage_f32(gpu, &qkv);
    let stage_b = storage_u32(gpu, &stage);
    let flat = |x: &[[u32; 4]]| x.iter().flatten().copied().collect::<Vec<u32>>();
    let completed_b = storage_u32(gpu, &flat(&batch.completed_blocks[0]));
    let rows: Vec<u32> = batch.stage_rows.iter().flatten().copied().collect();
    let rows_b = storage_u32(gpu, &rows);
    let k_b = storage_u32(gpu, &k_pool);
    let v_b = storage_u32(gpu, &v_pool);
    let seqs_b = gpu.storage_buffer_init("seqs", bytemuck::cast_slice(&batch.seqs));
    let tables_b = storage_u32(gpu, &batch.block_tables[0]);
    let tiles: Vec<u32> = batch.prefill_tiles.iter().flatten().copied().collect();
    let tiles_b = storage_u32(gpu, &tiles);
    let max_parts = chunks.iter().map(|c| partitions((c.start + c.len) as u32)).max().unwrap() + 1;
    let num_decode = info.num_decode_seqs.max(1);
    // NaN in every slot: a partition the reduce reads but the partials did not write poisons
    // its output
    let bytes = partials_bytes(num_decode, s.heads as u32, max_parts, hd as u32);
    let partials = gpu
        .storage_buffer_init("partials", bytemuck::cast_slice(&vec![f32::NAN; bytes as usize / 4]));
    let out_b = storage_f32(gpu, &vec![SENTINEL; (num_tokens + 1) * qd]);
    let quantize = KvQuantizeOp::new(
        gpu,
        kernels,
        layout,
        bs as u32,
        ql,
        KvQuantizeIo {
            step: &step,
            qkv: &qkv_b,
            stage: &stage_b,
            completed: &completed_b,
            k_pool: &k_b,
            v_pool: &v_b,
        },
    );
    let attn = AttentionOp::new(
        gpu,
        kernels,
        layout,
        bs as u32,
        max_parts,
        window.map(|w| NonZeroU32::new(w as u32).unwrap()),
        1.0 / (hd as f32).sqrt(),
        AttentionIo {
            step: &step,
            qkv: &qkv_b,
            k_pool: &k_b,
            v_pool: &v_b,
            seqs: &seqs_b,
            block_tables: &tables_b,
            prefill_tiles: &tiles_b,
            partials: &partials,
            out: &out_b,
            kv_quant: Some(KvQuantIo { layout: ql, stage: &stage_b }),
            sinks: sinks.as_deref(),
        },
    );
    let stage_op =
        KvStageOp::new(gpu, kernels, &step, &qkv_b, &rows_b, &stage_b, layout, bs as u32, n as u32);
    run(gpu, |pass| {
        quantize.record(pass, &shape);
        attn.record(pass, &shape);
        stage_op.record(pass, &shape);
    });
    let got = gpu.read_f32(&out_b, 0, (num_tokens + 1) * qd).unwrap();
    let what = format!("{spec} window {window:?} {s:?} chunks {chunks:?}: row past the last token");
    assert_sentinels(&what, &got[num_tokens * qd..]);
    out_row
        .iter()
        .map(|rows| rows.iter().flat_map(|&r| got[r * qd..(r + 1) * qd].to_vec()).collect())
        .collect()
}

/// `(window, sinks)`: the sliding window, and whether the query heads have attention sinks.
fn check_variant(
    spec: KvCacheSpec,
    s: Shape,
    chunks: &[Chunk],
    (window, sinks): (Option<usize>, bool),
    seed: u64,
    kernels: &Kernels,
    name: &str,
) {
    let (kvh, hd, bs) = (s.kv_heads, s.head_dim, s.block_size);
    let (qd, kvd) = (s.heads * hd, kvh * hd);
    let mut rng = rng(seed);
    let mut inp = random_inputs(&mut rng, s, chunks);
    if sinks {
        inp.sinks = Some(some_sinks(s.heads, seed + 1));
    }
    let what = format!(
        "{spec} ({name}) window {window:?} sinks {sinks} heads {}/{kvh} head_dim {hd} block {bs} \
         chunks {chunks:?}",
        s.heads
    );
    let got = gpu_step(spec, s, chunks, &inp, window, &mut rng, kernels);
    let Inputs { k, v, q, sinks } = inp;

    // CPU: the values each query reads, then plain attention
    let quantized = |x: &[f32], kq: KvQuant, blk: usize, h: usize| -> Vec<f32> {
        let words = quantize_head_block(kq, bs, hd, &head_block_rows(x, &s, blk, h));
        (0..bs * hd).map(|i| dequantize_element(kq, bs, hd, &words, i / hd, i % hd)).collect()
    };
    let mut want = Vec::new();
    for (si, c) in chunks.iter().enumerate() {
        let end = c.start + c.len;
        let blocks = end.div_ceil(bs);
        // dequantized copies of every block that is complete by the end of the step
        let deq = |x: &[f32], kq: KvQuant| -> Vec<Vec<Vec<f32>>> {
            (0..blocks)
                .map(|blk| {
                    (0..kvh)
                        .map(|h| {
                            if (blk + 1) * bs <= end {
                                quantized(x, kq, blk, h)
                            } else {
                                Vec::new()
                            }
                        })
                        .collect()
                })
                .collect()
        };
        let (kd, vd) = (deq(&k[si], spec.k), deq(&v[si], spec.v));
        for i in 0..c.len {
            let p = c.start + i;
            let read = |x: &[f32], dq: &Vec<Vec<Vec<f32>>>| -> Vec<f32> {
                let mut r = vec![0.0f32; (p + 1) * kvd];
                for pos in 0..=p {
                    for h in 0..kvh {
                        for ch in 0..hd {
                            let val = if pos / bs < p / bs {
                                dq[pos / bs][h][(pos % bs) * hd + ch]
                            } else {
                                x[(pos * kvh + h) * hd + ch]
                            };
                            r[(pos * kvh + h) * hd + ch] = val;
                        }
                    }
                }
                r
            };
            want.extend(reference::attention_with_sinks(
                &q[si][i * qd..(i + 1) * qd],
                &read(&k[si], &kd),
                &read(&v[si], &vd),
                (s.heads, kvh),
                window,
                sinks.as_deref(),
            ));
        }
    }
    // Outputs are convex combinations of values up to 6 (outlier channels) computed in f32
    // from the same dequantized f16 scales; only the reduction order differs: a few ulp of 6.
    assert_close(&what, &got.concat(), &want, 1e-4, 1e-4);
}

fn inp_sinks_note(sinks: bool) -> &'static str {
    if sinks {
        " with sinks"
    } else {
        ""
    }
}

/// Attention sinks (gpt-oss) over every quantized format with its default scales, in
/// prefill and decode chunks, full and through a sliding window of 128 (gpt-oss's), against the
/// reference on the dequantized values.
#[test]
fn attention_sinks_every_format() {
    let Some(t) = gpu() else { return };
    let s = Shape {
        heads: 16,
        kv_heads: 2,
        head_dim: 64,
        block_size: 16,
        pool_heads: 2,
        pool_head_base: 0,
    };
    let mut cs = chunks(16);
    cs.extend([Chunk { start: 150, len: 1 }, Chunk { start: 140, len: 30 }]);
    for (i, format) in [KvFormat::Fp8E4m3, KvFormat::Fp8E5m2, KvFormat::Int8, KvFormat::Int4]
        .into_iter()
        .enumerate()
    {
        let spec = KvCacheSpec::new(format, None, None, false).unwrap();
        for (name, kernels) in attention_variants_kvq(t) {
            for (j, window) in [None, Some(128)].into_iter().enumerate() {
                let seed = (1500 + i * 10 + j) as u64;
                check_variant(spec, s, &cs, (window, true), seed, &kernels, name);
            }
        }
    }
}

/// A prefill from empty spanning blocks, a chunk after a cached prefix that starts inside a
/// block, a decode that completes a block, a decode that does not.
fn chunks(bs: usize) -> Vec<Chunk> {
    vec![
        Chunk { start: 2 * bs + bs / 2, len: 1 },
        Chunk { start: 3 * bs - 1, len: 1 },
        Chunk { start: 0, len: 2 * bs + bs / 2 + 1 },
        Chunk { start: bs + (bs / 3).min(bs - 1), len: bs + 2 },
    ]
}

fn spec(format: KvFormat, k: ScaleGranularity, v: ScaleGranularity) -> KvCacheSpec {
    KvCacheSpec::new(format, Some(k), Some(v), false).unwrap()
}

#[test]
fn every_format_and_granularity_matches_the_reference_on_dequantized_values() {
    use ScaleGranularity::*;
    let s = Shape {
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        block_size: 16,
        pool_heads: 3,
        pool_head_base: 0,
    };
    let mut i = 0;
    for format in [KvFormat::Fp8E4m3, KvFormat::Fp8E5m2, KvFormat::Int8, KvFormat::Int4] {
        for g in [PerTensor, PerChannel, PerToken, PerHead] {
            if !(KvQuant { format, granularity: g }).is_valid() {
                continue;
            }
            // g for K with V per-token, and g for V with K per-channel
            check(spec(format, g, PerToken), s, &chunks(16), 10 + i);
            check(spec(format, PerChannel, g), s, &chunks(16), 50 + i);
            i += 1;
        }
    }
}

#[test]
fn block_sizes_gqa_ratios_and_head_dims() {
    let default = |f| KvCacheSpec::new(f, None, None, false).unwrap();
    let shapes = [
        Shape {
            heads: 4,
            kv_heads: 4,
            head_dim: 64,
            block_size: 1,
            pool_heads: 4,
            pool_head_base: 0,
        },
        Shape {
            heads: 6,
            kv_heads: 1,
            head_dim: 64,
            block_size: 64,
            pool_heads: 1,
            pool_head_base: 0,
        },
        Shape {
            heads: 8,
            kv_heads: 2,
            head_dim: 128,
            block_size: 16,
            pool_heads: 2,
            pool_head_base: 0,
        },
        Shape {
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            block_size: 5,
            pool_heads: 2,
            pool_head_base: 0,
        },
        Shape {
            heads: 4,
            kv_heads: 1,
            head_dim: 256,
            block_size: 16,
            pool_heads: 1,
            pool_head_base: 0,
        },
        // Gemma 4's global heads and DeepSeek's MLA latent width (workgroup family only)
        Shape {
            heads: 5,
            kv_heads: 1,
            head_dim: 512,
            block_size: 16,
            pool_heads: 1,
            pool_head_base: 0,
        },
        Shape {
            heads: 4,
            kv_heads: 2,
            head_dim: 576,
            block_size: 16,
            pool_heads: 2,
            pool_head_base: 0,
        },
        // a layer narrower than its pool slot's widest (Gemma 4): room for 3 heads, 1 used;
        // and packed after another layer, from head 2 of 4
        Shape {
            heads: 4,
            kv_heads: 1,
            head_dim: 64,
            block_size: 16,
            pool_heads: 3,
            pool_head_base: 0,
        },
        Shape {
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            block_size: 16,
            pool_heads: 4,
            pool_head_base: 2,
        },
    ];
    for (i, s) in shapes.into_iter().enumerate() {
        for (j, format) in [KvFormat::Int8, KvFormat::Int4].into_iter().enumerate() {
            check(default(format), s, &chunks(s.block_size), (100 + i * 10 + j) as u64);
        }
    }
}

/// Sliding windows over every format: of 1 key, under a block, not a multiple of the block
/// size, one partition, across a partition boundary, and longer than every context; chunks
/// long enough to span partitions. Freed blocks (all ones) poison any read before a window.
#[test]
fn sliding_window_every_format() {
    let default = |f| KvCacheSpec::new(f, None, None, false).unwrap();
    let per_tensor =
        spec(KvFormat::Fp8E4m3, ScaleGranularity::PerTensor, ScaleGranularity::PerTensor);
    let specs = [
        default(KvFormat::Fp8E4m3),
        default(KvFormat::Fp8E5m2),
        default(KvFormat::Int8),
        default(KvFormat::Int4),
        per_tensor,
    ];
    let shapes = [
        Shape {
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            block_size: 16,
            pool_heads: 3,
            pool_head_base: 0,
        },
        Shape {
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            block_size: 5,
            pool_heads: 2,
            pool_head_base: 0,
        },
        Shape {
            heads: 6,
            kv_heads: 1,
            head_dim: 128,
            block_size: 64,
            pool_heads: 1,
            pool_head_base: 0,
        },
    ];
    let windows = [1usize, 7, 20, 64, 70, 1000];
    for (i, s) in shapes.into_iter().enumerate() {
        let bs = s.block_size;
        let mut cs = chunks(bs);
        cs.extend([Chunk { start: 100, len: 1 }, Chunk { start: 90, len: 45 }]);
        for (j, spec) in specs.into_iter().enumerate() {
            // two windows per format for the first shape, every window covered across the
            // formats; one per format for the others
            let ws: &[usize] =
                if i == 0 { &windows[(2 * j) % 6..][..2] } else { &windows[(i + j) % 6..][..1] };
            for (k, &w) in ws.iter().enumerate() {
                check_window(spec, s, &cs, Some(w), (700 + i * 100 + j * 10 + k) as u64);
            }
        }
    }
}

/// The same query tokens computed as one prefill chunk and as one-token decode chunks give
/// bit-identical outputs over a quantized pool, with and without a sliding window (windows
/// whose first key crosses a block, a partition boundary within the chunk, or neither). Every
/// format with its default scales, and the other granularities (the lane kernels apply each
/// one's scales at a different point: per block, per score, at the partition's end). SmolLM2's
/// shape for all of them; Gemma 3's (head_dim 256, four lanes' words a key) for the defaults.
#[test]
fn prefill_and_decode_are_bit_identical_with_a_window() {
    let Some(t) = gpu() else { return };
    let smollm2 = Shape {
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        block_size: 16,
        pool_heads: 3,
        pool_head_base: 0,
    };
    let gemma3 = Shape {
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
        block_size: 16,
        pool_heads: 1,
        pool_head_base: 0,
    };
    // queries 240..263: across a partition boundary of both families (64 and 256 keys); window
    // 3's first key crosses 256, 50's 192, 80's the block at 176
    let (start, n) = (240usize, 24usize);
    let default = |f| KvCacheSpec::new(f, None, None, false).unwrap();
    use ScaleGranularity::*;
    let all_windows = [None, Some(3), Some(50), Some(80)];
    let mut cases: Vec<(KvCacheSpec, &[Option<usize>])> = Vec::new();
    for format in [KvFormat::Fp8E4m3, KvFormat::Fp8E5m2, KvFormat::Int8, KvFormat::Int4] {
        cases.push((default(format), &all_windows));
    }
    let defaults = cases.len();
    for (format, k, v) in [
        (KvFormat::Int4, PerToken, PerChannel),
        (KvFormat::Int8, PerToken, PerChannel),
        (KvFormat::Int4, PerHead, PerHead),
        (KvFormat::Fp8E4m3, PerTensor, PerTensor),
    ] {
        cases.push((spec(format, k, v), &all_windows[2..3]));
    }
    let shapes = [(smollm2, cases.len()), (gemma3, defaults)];
    for (name, kernels) in attention_variants_kvq(t) {
        for (si, &(s, n_cases)) in shapes.iter().enumerate() {
            let qd = s.heads * s.head_dim;
            for (i, &(spec, windows)) in cases[..n_cases].iter().enumerate() {
                for (j, &window) in windows.iter().enumerate() {
                    let sinks = inp_sinks_note((i + j) % 2 == 1);
                    let what =
                        format!("{spec} ({name}) head_dim {} window {window:?}{sinks}", s.head_dim);
                    let seed = (1300 + si * 1000 + i * 10 + j) as u64;
                    let mut r = rng(seed);
                    let prefill = [Chunk { start, len: n }];
                    let mut inp = random_inputs(&mut r, s, &prefill);
                    // every other case with attention sinks (gpt-oss)
                    if (i + j) % 2 == 1 {
                        inp.sinks = Some(some_sinks(s.heads, seed + 1));
                    }
                    let got_prefill = gpu_step(spec, s, &prefill, &inp, window, &mut r, &kernels);
                    let decode: Vec<Chunk> =
                        (0..n).map(|j| Chunk { start: start + j, len: 1 }).collect();
                    let per_token = Inputs {
                        k: vec![inp.k[0].clone(); n],
                        v: vec![inp.v[0].clone(); n],
                        q: (0..n).map(|j| inp.q[0][j * qd..(j + 1) * qd].to_vec()).collect(),
                        sinks: inp.sinks.clone(),
                    };
                    let got_decode =
                        gpu_step(spec, s, &decode, &per_token, window, &mut r, &kernels);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let (p, d) = (bits(&got_prefill[0]), bits(&got_decode.concat()));
                    let first = p.iter().zip(&d).position(|(a, b)| a != b);
                    assert!(
                        first.is_none(),
                        "{what}: prefill and decode differ first at {first:?}"
                    );
                }
            }
        }
    }
}

/// Gemma 3 270M's shape far into a long context over int8 and int4 pools: a prefill tile over
/// 2,048 and 8,192 keys, windowed (512) and full. llvmpipe stops a shader invocation's loops after
/// 65,535 iterations in total: one key (or one word) at a time, a workgroup-variant tile failed
/// past ~1,850 keys at head_dim 256, so its inner loops step 8 at a time; the lane variant
/// (which CPU adapters run here) writes its 8 queries' steps out, where a loop of 8 a key failed
/// past 8,191 keys (DESIGN.md, "Traps").
#[test]
fn long_context_prefill_tiles_at_head_dim_256() {
    let default = |f| KvCacheSpec::new(f, None, None, false).unwrap();
    let s = Shape {
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
        block_size: 16,
        pool_heads: 1,
        pool_head_base: 0,
    };
    let near = [Chunk { start: 2040, len: 16 }, Chunk { start: 2047, len: 1 }];
    check_window(default(KvFormat::Int8), s, &near, None, 1400);
    check_window(default(KvFormat::Int4), s, &near, Some(512), 1401);
    check(default(KvFormat::Int8), s, &[Chunk { start: 8184, len: 8 }], 1402);
}

/// The same at head_dim 128, which the lane kernels serve on CPU adapters: a 16-query chunk
/// (two prefill tiles) at the end of 8,192 keys, int8 and int4. The lanes prefill walks one key
/// at a time (one pass per partition) with the 8 queries' work written out; a loop that did not
/// unroll would count 8 iterations per key and stop past the cap.
#[test]
fn long_context_lane_prefill_at_head_dim_128() {
    let default = |f| KvCacheSpec::new(f, None, None, false).unwrap();
    let s = Shape {
        heads: 4,
        kv_heads: 1,
        head_dim: 128,
        block_size: 16,
        pool_heads: 1,
        pool_head_base: 0,
    };
    check(default(KvFormat::Int8), s, &[Chunk { start: 8176, len: 16 }], 1403);
    check(default(KvFormat::Int4), s, &[Chunk { start: 8176, len: 16 }], 1404);
}

/// A 128-token prefill from an empty cache (SmolLM2's shape): 16 tiles, each reading the
/// blocks before its own quantized and its own in f16, partitions mixing both (the lane
/// prefill's all-quantized block loop and its mixed one). Every format with its default
/// scales.
#[test]
fn prefill_from_empty_over_many_tiles() {
    let default = |f| KvCacheSpec::new(f, None, None, false).unwrap();
    let s = Shape {
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        block_size: 16,
        pool_heads: 3,
        pool_head_base: 0,
    };
    for (i, format) in [KvFormat::Fp8E4m3, KvFormat::Int8, KvFormat::Int4].into_iter().enumerate() {
        check(default(format), s, &[Chunk { start: 0, len: 128 }], 1500 + i as u64);
    }
}
