//! Paged attention (decode split-K + reduce, prefill) and kv_write vs the CPU reference:
//! block sizes 1, 16 and 64, shuffled (non-contiguous) block tables, partially filled last
//! blocks, GQA ratios 1, 3, 4 and MQA, several sequences of different lengths in one step,
//! prefill chunks that start after a cached prefix, sentinels around the outputs, and
//! bit-identity between a token computed by prefill and by decode. Sliding windows smaller
//! than, equal to and larger than the context, not multiples of the block size, with the
//! table entries of blocks wholly before a sequence's window pointing at a NaN block (as the KV
//! manager frees them), so any read of one shows as NaN.

mod common;

use common::*;
use kvrun::kernels::attention::{partials_bytes, partitions, AttentionIo, AttentionOp};
use kvrun::kernels::kv_write::KvWriteOp;
use kvrun::kernels::rope::{rope_table, QkvLayout, RopePairs};
use kvrun::kernels::rope_kv_write::{self, RopeKvIo, RopeKvWriteOp};
use kvrun::kernels::{attention, reference, Kernels, SeqInfo, StepInfo, StepShape};
use kvrun::loader::{Rope, RopeScaling};
use rand::seq::SliceRandom;
use std::num::NonZeroU32;

/// One sequence of a test step: `ctx_len` keys in the cache, the last `q_len` are queries.
#[derive(Clone, Copy)]
struct Seq {
    ctx_len: usize,
    q_len: usize,
}

struct Shape {
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    /// KV heads a pool block has room for (≥ num_kv_heads: a layer narrower than its pool
    /// slot's widest, Gemma 4; `QkvLayout::pool_heads`).
    pool_heads: usize,
    /// The first of them that are the layer's (layers packed into one slot).
    pool_head_base: usize,
    /// The head size whose family and prefill tile the kernels take (≥ head_dim: a layer
    /// beside wider ones, `AttentionOp::for_heads_of`).
    family_head_dim: usize,
}

/// Pool word for (block, head, offset, word) in [blocks, pool_heads, block_size, head_dim/2].
fn word_index(s: &Shape, block: usize, h: usize, off: usize, w: usize) -> usize {
    ((block * s.pool_heads + s.pool_head_base + h) * s.block_size + off) * (s.head_dim / 2) + w
}

/// `tokens` distinct slots of a pool with room for them plus 4 spare blocks, shuffled; and the
/// pool's block count.
fn shuffled_slots(r: &mut rand::rngs::StdRng, tokens: usize, bs: usize) -> (Vec<u32>, usize) {
    let num_blocks = tokens.div_ceil(bs) + 4;
    let mut slots: Vec<u32> = (0..(num_blocks * bs) as u32).collect();
    slots.shuffle(r);
    slots.truncate(tokens);
    (slots, num_blocks)
}

/// The K and V pool words after writing token t's K heads from `k_rows` and V heads from
/// `v_rows` (both [tokens, layout.stride()]) at `slots[t]`, `sentinel` everywhere else.
fn expected_pools(
    s: &Shape,
    layout: QkvLayout,
    slots: &[u32],
    (k_rows, v_rows): (&[f32], &[f32]),
    (words, sentinel): (usize, u32),
) -> (Vec<u32>, Vec<u32>) {
    let (stride, hd, bs) = (layout.stride() as usize, s.head_dim, s.block_size);
    let (mut want_k, mut want_v) = (vec![sentinel; words], vec![sentinel; words]);
    for (ti, &slot) in slots.iter().enumerate() {
        let (block, off) = (slot as usize / bs, slot as usize % bs);
        for h in 0..s.num_kv_heads {
            for w in 0..hd / 2 {
                let k = ti * stride + layout.k_offset() as usize + h * hd + 2 * w;
                let v = ti * stride + layout.v_offset() as usize + h * hd + 2 * w;
                want_k[word_index(s, block, h, off, w)] = pack_f16(k_rows[k], k_rows[k + 1]);
                want_v[word_index(s, block, h, off, w)] = pack_f16(v_rows[v], v_rows[v + 1]);
            }
        }
    }
    (want_k, want_v)
}

struct Data {
    /// per sequence: [ctx, kv_heads, head_dim] (f16-rounded)
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// per sequence: [q_len, heads, head_dim]
    q: Vec<Vec<f32>>,
    tables: Vec<Vec<u32>>,
    num_blocks: usize,
    /// a spare block no sequence writes: all NaN in the pools
    nan_block: u32,
    /// per query head: its attention sink logit (gpt-oss), if the test has sinks
    sinks: Option<Vec<f32>>,
}

fn make_data(s: &Shape, seqs: &[Seq], seed: u64) -> Data {
    let mut rng = rng(seed);
    let kv = s.num_kv_heads * s.head_dim;
    let k: Vec<Vec<f32>> = seqs
        .iter()
        .map(|q| reference::round_f16(&uniform(&mut rng, q.ctx_len * kv, 1.0)))
        .collect();
    let v: Vec<Vec<f32>> = seqs
        .iter()
        .map(|q| reference::round_f16(&uniform(&mut rng, q.ctx_len * kv, 1.0)))
        .collect();
    let q: Vec<Vec<f32>> =
        seqs.iter().map(|q| uniform(&mut rng, q.q_len * s.num_heads * s.head_dim, 1.0)).collect();
    let needed: usize = seqs.iter().map(|q| q.ctx_len.div_ceil(s.block_size)).sum();
    let num_blocks = needed + 3;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(&mut rng);
    let mut tables = Vec::new();
    let mut next = 0;
    for q in seqs {
        let n = q.ctx_len.div_ceil(s.block_size);
        tables.push(ids[next..next + n].to_vec());
        next += n;
    }
    Data { k, v, q, tables, num_blocks, nan_block: ids[needed], sinks: None }
}

/// Pool contents on the CPU; unused slots hold f16 NaN so a wrong read poisons the result.
fn cpu_pools(s: &Shape, seqs: &[Seq], d: &Data) -> (Vec<u32>, Vec<u32>) {
    let words = d.num_blocks * s.pool_heads * s.block_size * s.head_dim / 2;
    let nan = 0x7E00_7E00u32;
    let (mut kp, mut vp) = (vec![nan; words], vec![nan; words]);
    for (si, q) in seqs.iter().enumerate() {
        for pos in 0..q.ctx_len {
            let block = d.tables[si][pos / s.block_size] as usize;
            for h in 0..s.num_kv_heads {
                for w in 0..s.head_dim / 2 {
                    let src = (pos * s.num_kv_heads + h) * s.head_dim + 2 * w;
                    let dst = word_index(s, block, h, pos % s.block_size, w);
                    kp[dst] = pack_f16(d.k[si][src], d.k[si][src + 1]);
                    vp[dst] = pack_f16(d.v[si][src], d.v[si][src + 1]);
                }
            }
        }
    }
    (kp, vp)
}

/// First key position a query at `pos` sees with sliding window `window`.
fn window_lo(pos: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

/// Runs one attention step (decode sequences must come first) and returns [tokens, heads·head_dim].
/// With a window, the table entries of blocks wholly before the window of a sequence's first
/// query point at the NaN block, as the KV manager frees them.
fn gpu_attention(
    s: &Shape,
    seqs: &[Seq],
    d: &Data,
    window: Option<usize>,
    kernels: &Kernels,
) -> Vec<f32> {
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    gpu_attention_with(s, seqs, d, window, kernels, false, scale)
}

/// [`gpu_attention`] with the softmax `scale`, and with `values_in_keys` (MLA's latent) the
/// V pool bound to the K pool (`d.v` is ignored: the values are the keys' first channels).
fn gpu_attention_with(
    s: &Shape,
    seqs: &[Seq],
    d: &Data,
    window: Option<usize>,
    kernels: &Kernels,
    values_in_keys: bool,
    scale: f32,
) -> Vec<f32> {
    let t = gpu().expect("GPU checked by the caller");
    let gpu = &t.gpu;
    let layout = QkvLayout {
        values_in_keys,
        ..QkvLayout::new(s.num_heads as u32, s.num_kv_heads as u32, s.head_dim as u32)
    }
    .with_pool_heads_from(s.pool_heads as u32, s.pool_head_base as u32);
    let stride = layout.stride() as usize;
    let num_tokens: usize = seqs.iter().map(|q| q.q_len).sum();
    let mut qkv = vec![0.5f32; num_tokens * stride];
    let mut infos = Vec::new();
    let mut tables = Vec::new();
    let mut tiles = Vec::new();
    let mut row = 0;
    let dims = [s.head_dim as u32, s.family_head_dim as u32];
    let qt = attention::model_query_tile(&kernels.config, &dims) as usize;
    let num_decode = seqs.iter().take_while(|q| q.q_len == 1).count();
    for (si, q) in seqs.iter().enumerate() {
        for i in 0..q.q_len {
            let src = &d.q[si][i * s.num_heads * s.head_dim..(i + 1) * s.num_heads * s.head_dim];
            qkv[(row + i) * stride..(row + i) * stride + src.len()].copy_from_slice(src);
        }
        infos.push(SeqInfo {
            q_start: row as u32,
            q_len: q.q_len as u32,
            ctx_len: q.ctx_len as u32,
            table_start: tables.len() as u32,
            ..Default::default()
        });
        let lo = window_lo(q.ctx_len - q.q_len, window);
        tables.extend(d.tables[si].iter().enumerate().map(|(b, &id)| {
            if (b + 1) * s.block_size <= lo {
                d.nan_block
            } else {
                id
            }
        }));
        if si >= num_decode {
            for q0 in (0..q.q_len).step_by(qt) {
                tiles.extend([si as u32, q0 as u32]);
            }
        }
        row += q.q_len;
    }
    let (kp, vp) = cpu_pools(s, seqs, d);
    let max_parts = seqs.iter().map(|q| partitions(q.ctx_len as u32)).max().unwrap() + 1;
    let decode_parts =
        seqs[..num_decode].iter().map(|q| partitions(q.ctx_len as u32)).max().unwrap_or(0);
    let info = StepInfo {
        num_tokens: num_tokens as u32,
        num_seqs: seqs.len() as u32,
        num_decode_seqs: num_decode as u32,
        num_prefill_tiles: (tiles.len() / 2) as u32,
        ..Default::default()
    };
    let out_stride = s.num_heads * s.head_dim;
    let step = step_uniform(gpu, info);
    let qkv_b = storage_f32(gpu, &qkv);
    let k_b = storage_u32(gpu, &kp);
    let v_b = if values_in_keys { k_b.clone() } else { storage_u32(gpu, &vp) };
    let seqs_b = gpu.storage_buffer_init("seqs", bytemuck::cast_slice(&infos));
    let tables_b = storage_u32(gpu, &tables);
    let tiles_b = storage_u32(gpu, &tiles);
    // NaN in every slot: a partition the reduce reads but the partials did not write (the two
    // disagreeing on the partition size) poisons its output
    let bytes =
        partials_bytes(num_decode.max(1) as u32, s.num_heads as u32, max_parts, s.head_dim as u32);
    let partials = storage_f32(gpu, &vec![f32::NAN; bytes as usize / 4]);
    let out_b = storage_f32(gpu, &vec![SENTINEL; (num_tokens + 1) * out_stride]);
    let window = window.map(|w| NonZeroU32::new(w as u32).unwrap());
    let op = AttentionOp::for_heads_of(
        gpu,
        kernels,
        layout,
        &[s.family_head_dim as u32],
        (s.block_size as u32, max_parts, window, scale),
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
            kv_quant: None,
            sinks: d.sinks.as_deref(),
        },
    );
    let shape = StepShape {
        num_tokens: num_tokens as u32,
        num_decode_seqs: num_decode as u32,
        max_decode_partitions: decode_parts,
        num_prefill_tiles: info.num_prefill_tiles,
        ..Default::default()
    };
    run(gpu, |pass| {
        op.record(pass, &shape);
    });
    let got = gpu.read_f32(&out_b, 0, (num_tokens + 1) * out_stride).unwrap();
    assert_sentinels("attention output row past the last token", &got[num_tokens * out_stride..]);
    got[..num_tokens * out_stride].to_vec()
}

fn cpu_attention(s: &Shape, seqs: &[Seq], d: &Data, window: Option<usize>) -> Vec<f32> {
    let kv = s.num_kv_heads * s.head_dim;
    let qd = s.num_heads * s.head_dim;
    let mut out = Vec::new();
    for (si, q) in seqs.iter().enumerate() {
        for i in 0..q.q_len {
            let ctx = q.ctx_len - q.q_len + i + 1;
            out.extend(reference::attention_with_sinks(
                &d.q[si][i * qd..(i + 1) * qd],
                &d.k[si][..ctx * kv],
                &d.v[si][..ctx * kv],
                (s.num_heads, s.num_kv_heads),
                window,
                d.sinks.as_deref(),
            ));
        }
    }
    out
}

fn check(s: &Shape, seqs: &[Seq], seed: u64) {
    check_window(s, seqs, None, seed);
}

fn check_window(s: &Shape, seqs: &[Seq], window: Option<usize>, seed: u64) {
    let Some(t) = gpu() else { return };
    for (name, kernels) in attention_variants(t) {
        check_variant(s, seqs, window, seed, &kernels, name);
    }
}

fn check_variant(
    s: &Shape,
    seqs: &[Seq],
    window: Option<usize>,
    seed: u64,
    kernels: &Kernels,
    name: &str,
) {
    check_data(s, seqs, window, &make_data(s, seqs, seed), kernels, name);
}

fn check_data(
    s: &Shape,
    seqs: &[Seq],
    window: Option<usize>,
    d: &Data,
    kernels: &Kernels,
    name: &str,
) {
    let got = gpu_attention(s, seqs, d, window, kernels);
    let want = cpu_attention(s, seqs, d, window);
    let what = format!(
        "attention ({name} as {:?}) window {window:?} sinks {} heads {}/{} head_dim {} block {} \
         seqs {:?}",
        kernels.config.attention(s.head_dim as u32),
        d.sinks.is_some(),
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
        s.block_size,
        seqs.iter().map(|q| (q.ctx_len, q.q_len)).collect::<Vec<_>>()
    );
    // Outputs are convex combinations of |v| ≤ 1 computed in f32: errors are a few ulp of 1.
    assert_close(&what, &got, &want, 2e-5, 1e-4);
}

const GQA: [(usize, usize); 4] = [(4, 4), (9, 3), (8, 2), (6, 1)];

#[test]
fn decode_matches_reference_for_block_sizes_and_gqa() {
    for (i, &(h, kvh)) in GQA.iter().enumerate() {
        for (j, bs) in [1, 16, 64].into_iter().enumerate() {
            let s = Shape {
                num_heads: h,
                num_kv_heads: kvh,
                head_dim: 64,
                block_size: bs,
                pool_heads: kvh,
                pool_head_base: 0,
                family_head_dim: 64,
            };
            let seqs = [
                Seq { ctx_len: 1, q_len: 1 },
                Seq { ctx_len: 37, q_len: 1 },
                Seq { ctx_len: 200, q_len: 1 },
            ];
            check(&s, &seqs, (i * 10 + j) as u64);
        }
    }
}

#[test]
fn prefill_matches_reference_including_cached_prefix() {
    for (i, &(h, kvh)) in GQA.iter().enumerate() {
        for (j, bs) in [1, 16, 64].into_iter().enumerate() {
            let s = Shape {
                num_heads: h,
                num_kv_heads: kvh,
                head_dim: 64,
                block_size: bs,
                pool_heads: kvh,
                pool_head_base: 0,
                family_head_dim: 64,
            };
            // whole prompt; chunk after a cached prefix; a chunk of several tiles past 2 partitions
            let seqs = [
                Seq { ctx_len: 19, q_len: 19 },
                Seq { ctx_len: 90, q_len: 23 },
                Seq { ctx_len: 170, q_len: 40 },
            ];
            check(&s, &seqs, (100 + i * 10 + j) as u64);
        }
    }
}

/// Head sizes 16 to 576: 512 is Gemma 4's global head, 576 DeepSeek's MLA latent (their
/// workgroups hold 4 and 3 heads of a group of 4: slices of 4, and of 3 + 1).
#[test]
fn mixed_step_and_other_head_sizes() {
    for (i, hd) in [16usize, 128, 256, 512, 576].into_iter().enumerate() {
        let s = Shape {
            num_heads: 8,
            num_kv_heads: 2,
            head_dim: hd,
            block_size: 16,
            pool_heads: 2,
            pool_head_base: 0,
            family_head_dim: hd,
        };
        let seqs = [
            Seq { ctx_len: 65, q_len: 1 },
            Seq { ctx_len: 129, q_len: 1 },
            Seq { ctx_len: 50, q_len: 21 },
        ];
        check(&s, &seqs, 200 + i as u64);
    }
    // Two query heads a KV head: the lanes decode kernel built for slices of two
    // (attention::slice_heads; GQA above covers 1, 3, 4 and 4 + 2).
    let s = Shape {
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 64,
        block_size: 16,
        pool_heads: 2,
        pool_head_base: 0,
        family_head_dim: 64,
    };
    check(&s, &[Seq { ctx_len: 150, q_len: 1 }, Seq { ctx_len: 40, q_len: 12 }], 250);
    // MQA with more query heads than one decode workgroup holds (slices of 16).
    let s = Shape {
        num_heads: 20,
        num_kv_heads: 1,
        head_dim: 32,
        block_size: 16,
        pool_heads: 1,
        pool_head_base: 0,
        family_head_dim: 32,
    };
    check(&s, &[Seq { ctx_len: 70, q_len: 1 }, Seq { ctx_len: 33, q_len: 9 }], 300);
}

/// A layer narrower than its pool slot's widest (Gemma 4's 256-channel sliding heads beside
/// 512-channel global ones): pool blocks with room for more KV heads than the layer has (the
/// heads after its own NaN: a read of them poisons the output), in its own family and in the
/// family and prefill tile of a wider head (`AttentionOp::for_heads_of`).
#[test]
fn narrower_layer_in_wider_pool_blocks() {
    // (32, 64): a family (lanes) that serves the wider head but not the layer's: both take
    // the workgroup family then (KernelConfig::attention_for)
    // base > 0: a layer packed into a slot after others of its shape (Gemma 4's global
    // layers, two to a block sized for wider heads)
    let cases = [
        (1, 3, 0, 64, 64),
        (2, 4, 0, 32, 512),
        (1, 2, 1, 256, 512),
        (2, 8, 6, 64, 576),
        (2, 4, 2, 32, 64),
    ];
    for (i, (kvh, room, base, hd, family)) in cases.into_iter().enumerate() {
        let s = Shape {
            num_heads: 4,
            num_kv_heads: kvh,
            head_dim: hd,
            block_size: 16,
            pool_heads: room,
            pool_head_base: base,
            family_head_dim: family,
        };
        let seqs = [Seq { ctx_len: 70, q_len: 1 }, Seq { ctx_len: 40, q_len: 13 }];
        check(&s, &seqs, 700 + i as u64);
    }
}

/// The same query tokens computed as one prefill chunk and as separate decode sequences give
/// bit-identical outputs (the kernels share their arithmetic; see common/attention.wgsl).
#[test]
fn prefill_and_decode_are_bit_identical() {
    let Some(t) = gpu() else { return };
    for (name, kernels) in attention_variants(t) {
        for (i, (bs, hd)) in
            [(1usize, 64usize), (16, 64), (16, 128), (16, 256), (16, 512), (16, 576)]
                .into_iter()
                .enumerate()
        {
            bit_identity(bs, hd, (None, false), 400 + i as u64, &kernels, name);
        }
    }
}

/// `count` decode sequences over sequence 0's cache of `d`, sequence j with its query j.
fn one_query_each(s: &Shape, d: &Data, count: usize) -> Data {
    let qd = s.num_heads * s.head_dim;
    Data {
        k: vec![d.k[0].clone(); count],
        v: vec![d.v[0].clone(); count],
        q: (0..count).map(|j| d.q[0][j * qd..(j + 1) * qd].to_vec()).collect(),
        tables: vec![d.tables[0].clone(); count],
        num_blocks: d.num_blocks,
        nan_block: d.nan_block,
        sinks: d.sinks.clone(),
    }
}

/// Query heads 9 on 3 KV heads of `hd`, 20 queries at 250..269 as one prefill chunk and as 20
/// decode sequences: the same bits. `(window, sinks)`: the sliding window, and whether the heads
/// have attention sinks.
fn bit_identity(
    bs: usize,
    hd: usize,
    (window, sinks): (Option<usize>, bool),
    seed: u64,
    kernels: &Kernels,
    name: &str,
) {
    {
        let s = Shape {
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: hd,
            block_size: bs,
            pool_heads: 3,
            pool_head_base: 0,
            family_head_dim: hd,
        };
        // queries 250..269: across a partition boundary of both families (64 and 256 keys)
        let (ctx, n) = (270usize, 20usize);
        let prefill = [Seq { ctx_len: ctx, q_len: n }];
        let mut d = make_data(&s, &prefill, seed);
        if sinks {
            d.sinks = Some(uniform(&mut rng(seed + 1), s.num_heads, 4.0));
        }
        let got_prefill = gpu_attention(&s, &prefill, &d, window, kernels);
        // n decode sequences sharing the same cache, each one query at a later position
        let decode: Vec<Seq> = (0..n).map(|j| Seq { ctx_len: ctx - n + j + 1, q_len: 1 }).collect();
        let dd = one_query_each(&s, &d, n);
        let got_decode = gpu_attention(&s, &decode, &dd, window, kernels);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let first = bits(&got_prefill).iter().zip(bits(&got_decode)).position(|(a, b)| *a != b);
        assert!(
            first.is_none(),
            "{name}, block {bs}, head_dim {hd}, window {window:?}, sinks {sinks}: prefill and \
             decode differ first at element {first:?}"
        );
    }
}

/// One-pass decode (every window of the step in one partition: one dispatch, no reduce) against
/// the CPU reference and against the split-K path's bits: 20 decode sequences of 41..60 keys
/// (one partition of both families) alone, then beside a 270-key one (more partitions: partials
/// + reduce for all); their outputs are the same bits, with and without a window and sinks.
#[test]
fn one_pass_decode_is_the_split_decode_bits() {
    let Some(t) = gpu() else { return };
    for (name, kernels) in attention_variants(t) {
        for (i, (hd, window, sinks)) in
            [(64usize, None, false), (128, Some(24usize), true), (256, Some(50), false)]
                .into_iter()
                .enumerate()
        {
            let s = Shape {
                num_heads: 9,
                num_kv_heads: 3,
                head_dim: hd,
                block_size: 16,
                pool_heads: 3,
                pool_head_base: 0,
                family_head_dim: hd,
            };
            let (long, n) = (270usize, 20usize);
            let seed = 700 + i as u64;
            let mut d = make_data(&s, &[Seq { ctx_len: long, q_len: n + 1 }], seed);
            if sinks {
                d.sinks = Some(uniform(&mut rng(seed + 1), s.num_heads, 4.0));
            }
            let seqs = |with_long: bool| {
                let mut v: Vec<Seq> = (0..n).map(|j| Seq { ctx_len: 41 + j, q_len: 1 }).collect();
                if with_long {
                    v.push(Seq { ctx_len: long, q_len: 1 });
                }
                v
            };
            let data = |count: usize| one_query_each(&s, &d, count);
            let what = format!("{name}, head_dim {hd}, window {window:?}, sinks {sinks}");
            let one_pass = gpu_attention(&s, &seqs(false), &data(n), window, &kernels);
            let want = cpu_attention(&s, &seqs(false), &data(n), window);
            assert_close(&format!("one-pass decode ({what})"), &one_pass, &want, 2e-5, 1e-4);
            let split = gpu_attention(&s, &seqs(true), &data(n + 1), window, &kernels);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let differ = bits(&one_pass).iter().zip(bits(&split)).position(|(a, b)| *a != b);
            assert!(differ.is_none(), "{what}: one-pass and split differ first at {differ:?}");
        }
    }
}

/// Decode and prefill in one step under sliding windows of 1 key, under a block, not a multiple
/// of the block size, a whole partition, across partition boundaries, equal to one context and
/// longer than every context; blocks before each sequence's window are freed (NaN block).
#[test]
fn sliding_window_matches_reference() {
    let seqs = [
        Seq { ctx_len: 1, q_len: 1 },
        Seq { ctx_len: 37, q_len: 1 },
        Seq { ctx_len: 200, q_len: 1 },
        Seq { ctx_len: 19, q_len: 19 },
        Seq { ctx_len: 90, q_len: 23 },
        Seq { ctx_len: 170, q_len: 40 },
        Seq { ctx_len: 300, q_len: 100 },
    ];
    let windows = [1usize, 7, 37, 64, 70, 130, 1000];
    for (i, &(h, kvh)) in GQA.iter().enumerate() {
        for (j, bs) in [1usize, 16, 64].into_iter().enumerate() {
            let s = Shape {
                num_heads: h,
                num_kv_heads: kvh,
                head_dim: 64,
                block_size: bs,
                pool_heads: kvh,
                pool_head_base: 0,
                family_head_dim: 64,
            };
            // a different window for each (GQA, block size) pair; all of them for one
            let ws: &[usize] =
                if (i, j) == (1, 1) { &windows } else { &windows[(i * 3 + j) % 7..][..1] };
            for (k, &w) in ws.iter().enumerate() {
                check_window(&s, &seqs, Some(w), (600 + i * 100 + j * 10 + k) as u64);
            }
        }
    }
    for (i, hd) in [16usize, 128, 256].into_iter().enumerate() {
        let s = Shape {
            num_heads: 8,
            num_kv_heads: 2,
            head_dim: hd,
            block_size: 16,
            pool_heads: 2,
            pool_head_base: 0,
            family_head_dim: hd,
        };
        let seqs = [Seq { ctx_len: 129, q_len: 1 }, Seq { ctx_len: 150, q_len: 33 }];
        check_window(&s, &seqs, Some(50 + i), 1000 + i as u64);
    }
    // Gemma 3 270M's shape far into a long context: 4 query heads on 1 KV head of 256, window
    // 512 and full (its global layers), a 128-token chunk (32 for full attention: four query
    // tiles over every key already take lavapipe a quarter of a minute) and a decode at 2048,
    // and a prefill
    // tile over 8192 keys (128 partitions: within llvmpipe's 65,535 loop iterations per
    // invocation only because the workgroup prefill's inner loops step 8 at a time (one at a
    // time it failed past ~1,850 keys) and the lane prefill's per-query steps are written out,
    // not looped (a loop of 8 a key failed past 8,191 keys).
    let s = Shape {
        num_heads: 4,
        num_kv_heads: 1,
        head_dim: 256,
        block_size: 16,
        pool_heads: 1,
        pool_head_base: 0,
        family_head_dim: 256,
    };
    let seqs = [Seq { ctx_len: 2048, q_len: 1 }, Seq { ctx_len: 2048, q_len: 128 }];
    check_window(&s, &seqs, Some(512), 1010);
    let full = [Seq { ctx_len: 2048, q_len: 1 }, Seq { ctx_len: 2048, q_len: 32 }];
    check_window(&s, &full, None, 1011);
    check_window(&s, &[Seq { ctx_len: 8192, q_len: 8 }], None, 1012);
    let s = Shape {
        num_heads: 4,
        num_kv_heads: 1,
        head_dim: 128,
        block_size: 16,
        pool_heads: 1,
        pool_head_base: 0,
        family_head_dim: 128,
    };
    check_window(&s, &[Seq { ctx_len: 8192, q_len: 16 }], None, 1013);
}

/// Attention sinks (gpt-oss: a learned logit per query head in the softmax's denominator)
/// against the reference, every variant: gpt-oss's shape (64 channels, 8 query heads a KV
/// head, full and a sliding window of 128) and a GQA of 3, decode and prefill in one step;
/// sinks that dominate (+12: most of the weight goes to no value), vanish (−30), and sit among
/// the scores; prefill and decode of the same tokens the same bits with sinks, full and
/// windowed. (Without sinks the kernels' outputs are the bits they were: the other tests.)
#[test]
fn attention_sinks_match_reference_and_prefill_equals_decode() {
    let Some(t) = gpu() else { return };
    for (name, kernels) in attention_variants(t) {
        for (i, (heads, kv_heads, bs)) in
            [(16usize, 2usize, 16usize), (9, 3, 1)].into_iter().enumerate()
        {
            let s = Shape {
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim: 64,
                block_size: bs,
                pool_heads: kv_heads,
                pool_head_base: 0,
                family_head_dim: 64,
            };
            let seqs = [
                Seq { ctx_len: 1, q_len: 1 },
                Seq { ctx_len: 300, q_len: 1 },
                Seq { ctx_len: 40, q_len: 40 },
                Seq { ctx_len: 270, q_len: 30 },
            ];
            for (j, window) in [None, Some(128)].into_iter().enumerate() {
                let seed = 1300 + (i * 10 + j) as u64;
                let mut d = make_data(&s, &seqs, seed);
                let mut sinks = uniform(&mut rng(seed + 1), heads, 3.0);
                sinks[0] = 12.0;
                sinks[1] = -30.0;
                d.sinks = Some(sinks);
                check_data(&s, &seqs, window, &d, &kernels, name);
            }
        }
        for (j, window) in [None, Some(80)].into_iter().enumerate() {
            bit_identity(16, 64, (window, true), 1350 + j as u64, &kernels, name);
        }
    }
}

/// Prefill and decode of the same tokens agree to the bit under a sliding window: windows whose
/// first key crosses a partition boundary within the chunk (80, 7) and one of a single key.
#[test]
fn prefill_and_decode_are_bit_identical_with_a_window() {
    let Some(t) = gpu() else { return };
    for (name, kernels) in attention_variants(t) {
        for (i, (bs, hd)) in
            [(1usize, 64usize), (16, 64), (16, 128), (16, 256)].into_iter().enumerate()
        {
            for (j, w) in [80usize, 7, 1].into_iter().enumerate() {
                let seed = 1100 + (i * 10 + j) as u64;
                bit_identity(bs, hd, (Some(w), false), seed, &kernels, name);
            }
        }
    }
}

#[test]
fn kv_write_scatters_through_slot_mapping() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    // room 3 and 5: pool blocks with KV heads besides the layer's (Gemma 4's narrower layers;
    // from head 3: packed after another layer)
    let cases = [(1usize, 2usize, 0usize), (16, 2, 0), (64, 2, 0), (16, 3, 0), (16, 5, 3)];
    for (i, (bs, room, base)) in cases.into_iter().enumerate() {
        let s = Shape {
            num_heads: 6,
            num_kv_heads: 2,
            head_dim: 32,
            block_size: bs,
            pool_heads: room,
            pool_head_base: base,
            family_head_dim: 32,
        };
        let layout = QkvLayout::new(6, 2, 32).with_pool_heads_from(room as u32, base as u32);
        let stride = layout.stride() as usize;
        let mut r = rng(500 + i as u64);
        let tokens: usize = 37;
        let (slots, num_blocks) = shuffled_slots(&mut r, tokens, bs);
        let qkv = uniform(&mut r, tokens * stride, 2.0);
        let words = num_blocks * room * bs * 16;
        let sentinel = 0xDEAD_BEEFu32;
        let k_b = storage_u32(gpu, &vec![sentinel; words]);
        let v_b = storage_u32(gpu, &vec![sentinel; words]);
        let step = step_uniform(gpu, StepInfo { num_tokens: tokens as u32, ..Default::default() });
        let qkv_b = storage_f32(gpu, &qkv);
        let slots_b = storage_u32(gpu, &slots);
        let op =
            KvWriteOp::new(gpu, &t.kernels, &step, &qkv_b, &slots_b, &k_b, &v_b, layout, bs as u32);
        run(gpu, |pass| {
            op.record(pass, &StepShape { num_tokens: tokens as u32, ..Default::default() });
        });
        let (want_k, want_v) = expected_pools(&s, layout, &slots, (&qkv, &qkv), (words, sentinel));
        let what = format!("block size {bs}, room for {room} KV heads");
        assert_eq!(gpu.read_u32(&k_b, 0, words).unwrap(), want_k, "K pool, {what}");
        assert_eq!(gpu.read_u32(&v_b, 0, words).unwrap(), want_v, "V pool, {what}");
    }
}

/// RoPE and the KV write in one dispatch vs the reference: Q and K heads of qkv rotated in place
/// (within 2e-6 of `reference::rope_head`, V untouched), every K word of the pool the f16 pair of
/// the rotated qkv bit for bit, every V word that of qkv's V, sentinels everywhere else; both
/// pair layouts, head sizes 12 (units that straddle words), 32 and 256, block sizes 1 and 16,
/// shuffled slots and positions.
#[test]
fn rope_kv_write_matches_rope_then_kv_write() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    // (heads, KV heads, head_dim, block size, KV heads a pool block has room for, the
    // layer's first of them)
    let cases = [(6, 2, 32, 16, 2, 0), (5, 1, 12, 1, 1, 0), (4, 1, 256, 16, 1, 0)];
    let cases =
        cases.into_iter().chain([(3, 3, 32, 1, 3, 0), (4, 1, 64, 16, 4, 0), (4, 1, 64, 16, 4, 3)]);
    for (i, (heads, kv_heads, hd, bs, room, base)) in cases.enumerate() {
        for pairs in [RopePairs::Interleaved, RopePairs::Neox] {
            let s = Shape {
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim: hd,
                block_size: bs,
                pool_heads: room,
                pool_head_base: base,
                family_head_dim: hd,
            };
            let layout = QkvLayout::new(heads as u32, kv_heads as u32, hd as u32)
                .with_pool_heads_from(room as u32, base as u32);
            assert!(rope_kv_write::fits(layout));
            let stride = layout.stride() as usize;
            let mut r = rng(900 + i as u64);
            let tokens: usize = 37;
            let (slots, num_blocks) = shuffled_slots(&mut r, tokens, bs);
            let mut positions: Vec<u32> = (0..4096).collect();
            positions.shuffle(&mut r);
            positions.truncate(tokens);
            let qkv = uniform(&mut r, tokens * stride, 2.0);
            let theta = 10000.0;
            let table = rope_table(hd, &Rope { theta, scaling: RopeScaling::None }, 4096);
            let words = num_blocks * room * bs * hd / 2;
            let sentinel = 0xDEAD_BEEFu32;
            let k_b = storage_u32(gpu, &vec![sentinel; words]);
            let v_b = storage_u32(gpu, &vec![sentinel; words]);
            let info = StepInfo { num_tokens: tokens as u32, ..Default::default() };
            let step = step_uniform(gpu, info);
            let qkv_b = storage_f32(gpu, &qkv);
            let (slots_b, pos_b) = (storage_u32(gpu, &slots), storage_u32(gpu, &positions));
            let table_b = gpu.storage_buffer_init("rope table", bytemuck::cast_slice(&table));
            let io = RopeKvIo {
                step: &step,
                qkv: &qkv_b,
                positions: &pos_b,
                table: &table_b,
                slot_mapping: &slots_b,
                k_pool: &k_b,
                v_pool: &v_b,
            };
            let op = RopeKvWriteOp::new(gpu, &t.kernels, layout, pairs, bs as u32, io);
            run(gpu, |pass| {
                op.record(pass, &StepShape { num_tokens: tokens as u32, ..Default::default() });
            });
            let what = format!(
                "rope_kv_write {pairs:?} {heads}/{kv_heads} heads of {hd}, bs {bs}, room {room}"
            );
            let got = gpu.read_f32(&qkv_b, 0, tokens * stride).unwrap();
            let mut want = qkv.clone();
            for (ti, &pos) in positions.iter().enumerate() {
                for h in 0..heads + kv_heads {
                    let base = ti * stride + h * hd;
                    reference::rope_head(&mut want[base..base + hd], pos as usize, theta, pairs);
                }
            }
            assert_close(&what, &got, &want, 2e-6, 2e-6);
            // K: the f16 pairs of the rotated qkv the kernel wrote; V: of the input
            let (want_k, want_v) =
                expected_pools(&s, layout, &slots, (&got, &qkv), (words, sentinel));
            assert_eq!(gpu.read_u32(&k_b, 0, words).unwrap(), want_k, "K pool: {what}");
            assert_eq!(gpu.read_u32(&v_b, 0, words).unwrap(), want_v, "V pool: {what}");
        }
    }
}

/// MLA's absorbed attention vs the expanded form, on the CPU in f64: the cache holds one latent
/// row `[c ; k_pe]` (R + dr, f16) per token; head h's key is `[W_UK_h c ; k_pe]`, its value
/// `W_UV_h c`. The GPU gets the absorbed queries `[q_nope_h W_UK_h ; q_pe_h]` over the latent
/// pool with the V pool bound to the K pool, and its latent outputs go through `W_UV_h` on the
/// CPU. Latent widths 64, 128 and 256 (R 48/96/192 + dr 16/32/64), 1, 4 and 16 heads, block
/// sizes 1 and 16, decodes and prefill chunks after a prefix, shuffled tables, a scale that is
/// not 1/√(dn + dr), both variant families.
#[test]
fn mla_absorbed_attention_matches_the_expanded_form() {
    let Some(t) = gpu() else { return };
    let seqs = [
        Seq { ctx_len: 37, q_len: 1 },
        Seq { ctx_len: 100, q_len: 1 },
        Seq { ctx_len: 150, q_len: 33 },
        Seq { ctx_len: 70, q_len: 70 },
    ];
    // the last: DeepSeek-V2/V3's real latent, kv_lora_rank 512 + rope 64 = 576 channels
    let shapes =
        [(48usize, 16usize, 1usize, 1usize), (96, 32, 4, 16), (192, 64, 16, 16), (512, 64, 4, 16)];
    for (n, (rank, dr, heads, bs)) in shapes.into_iter().enumerate() {
        let (dn, dv) = (32usize, 24usize);
        let width = rank + dr;
        let s = Shape {
            num_heads: heads,
            num_kv_heads: 1,
            head_dim: width,
            block_size: bs,
            pool_heads: 1,
            pool_head_base: 0,
            family_head_dim: width,
        };
        let mut d = make_data(&s, &seqs, 1200 + n as u64);
        let mut r = rng(1300 + n as u64);
        let w_uk = uniform(&mut r, heads * dn * rank, 0.3); // [H, dn, R]
        let w_uv = uniform(&mut r, heads * dv * rank, 0.3); // [H, dv, R]
        let q_nope: Vec<Vec<f32>> =
            seqs.iter().map(|q| uniform(&mut r, q.q_len * heads * dn, 1.0)).collect();
        // absorbed queries: [q_nope_h · W_UK_h ; q_pe_h] (q_pe as make_data drew it)
        for (si, q) in seqs.iter().enumerate() {
            for i in 0..q.q_len {
                for h in 0..heads {
                    let row = &mut d.q[si][(i * heads + h) * width..][..width];
                    for j in 0..rank {
                        row[j] = (0..dn)
                            .map(|c| {
                                q_nope[si][(i * heads + h) * dn + c] * w_uk[(h * dn + c) * rank + j]
                            })
                            .sum();
                    }
                }
            }
        }
        let scale = 1.3 / ((dn + dr) as f32).sqrt();
        for (name, kernels) in attention_variants(t) {
            let got = gpu_attention_with(&s, &seqs, &d, None, &kernels, true, scale);
            let mut got_v = Vec::new();
            let mut want = Vec::new();
            let mut row = 0;
            for (si, q) in seqs.iter().enumerate() {
                let lat = &d.k[si]; // [ctx, width] f16-rounded latent rows
                for i in 0..q.q_len {
                    let ctx = q.ctx_len - q.q_len + i + 1;
                    for h in 0..heads {
                        let o = &got[((row + i) * heads + h) * width..][..rank];
                        got_v.extend((0..dv).map(|e| {
                            (0..rank).map(|j| w_uv[(h * dv + e) * rank + j] * o[j]).sum::<f32>()
                        }));
                        // expanded: per-head keys and values of every cached token
                        let key = |pos: usize, c: usize| -> f64 {
                            let l = &lat[pos * width..][..width];
                            if c < dn {
                                (0..rank)
                                    .map(|j| f64::from(w_uk[(h * dn + c) * rank + j] * l[j]))
                                    .sum()
                            } else {
                                f64::from(l[rank + c - dn])
                            }
                        };
                        let qrow = |c: usize| -> f64 {
                            if c < dn {
                                f64::from(q_nope[si][(i * heads + h) * dn + c])
                            } else {
                                f64::from(d.q[si][(i * heads + h) * width + rank + c - dn])
                            }
                        };
                        let scores: Vec<f64> = (0..ctx)
                            .map(|p| {
                                (0..dn + dr).map(|c| qrow(c) * key(p, c)).sum::<f64>()
                                    * f64::from(scale)
                            })
                            .collect();
                        let mx = scores.iter().cloned().fold(f64::MIN, f64::max);
                        let e: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
                        let sum: f64 = e.iter().sum();
                        want.extend((0..dv).map(|c| {
                            let v = |p: usize| -> f64 {
                                let l = &lat[p * width..][..rank];
                                (0..rank)
                                    .map(|j| f64::from(w_uv[(h * dv + c) * rank + j] * l[j]))
                                    .sum()
                            };
                            ((0..ctx).map(|p| e[p] * v(p)).sum::<f64>() / sum) as f32
                        }));
                    }
                }
                row += q.q_len;
            }
            let what = format!("MLA absorbed ({name}) R {rank} dr {dr} heads {heads} block {bs}");
            // f32 latent outputs (convex combinations of |c| ≤ 1) through W_UV_h (R terms of
            // 0.3): a few ulp of the output scale
            assert_close(&what, &got_v, &want, 1e-4, 1e-4);
        }
    }
}
