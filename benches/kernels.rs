//! Kernel benches: `cargo bench --bench kernels` (add `-- linear` etc. to filter). Each kernel
//! family at SmolLM2-135M and Llama-3-8B shapes (and each fused dispatch against the pair it
//! replaces), one decode token (the bandwidth-bound case),
//! with the variants this adapter selects (`auto`) and the discrete-GPU variants forced (`gpu`).
//!
//! Time is GPU time from timestamp queries, through criterion's `iter_custom`: every iteration
//! is its own timed compute pass, so submission and host overhead are not counted. Throughput is
//! the bytes a dispatch must read (weights, or the KV history), so criterion's "thrpt" is the
//! achieved bandwidth: compare it with `kvrun bench bandwidth` on the same adapter. An adapter
//! without timestamp queries skips the benches with a message.

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvrun::gpu::{Gpu, GpuOptions, GpuTimer};
use kvrun::kernels::attention::{partials_bytes, partitions, AttentionIo, AttentionOp, KvQuantIo};
use kvrun::kernels::glu::GluOp;
use kvrun::kernels::kv_write::KvWriteOp;
use kvrun::kernels::linear::{LinearIo, LinearOp, TokenRows};
use kvrun::kernels::rms_norm::{NormIo, NormRows, RmsNormOp};
use kvrun::kernels::rope::{rope_table, QkvLayout, RopeOp, RopePairs};
use kvrun::kernels::rope_kv_write::{RopeKvIo, RopeKvWriteOp};
use kvrun::kernels::{
    GpuWeight, KernelConfig, KernelFamily, Kernels, KvQuantLayout, SeqInfo, StepInfo, StepShape,
    WeightFormat,
};
use kvrun::loader::{Activation, Rope, RopeScaling};
use kvrun::quant::{quantize_row, GgmlType, KvCacheSpec, KvFormat};

/// Timed passes per submission.
const PASSES: u64 = 64;

struct Bench {
    gpu: Arc<Gpu>,
    families: Vec<(&'static str, Kernels)>,
}

fn open() -> Option<Bench> {
    let gpu = match Gpu::open(&GpuOptions::default()) {
        Ok(g) if g.caps.timestamps => Arc::new(g),
        Ok(g) => {
            eprintln!("{} has no timestamp queries: kernel benches skipped", g.info.name);
            return None;
        }
        Err(e) => {
            eprintln!("no GPU ({e}): kernel benches skipped");
            return None;
        }
    };
    eprintln!("kernel benches on {} ({:?})", gpu.info.name, gpu.info.backend);
    let families = [("auto", KernelFamily::Auto), ("gpu", KernelFamily::Gpu)]
        .map(|(name, f)| (name, Kernels::with_config(KernelConfig::choose_family(&gpu.caps, f))))
        .into();
    Some(Bench { gpu, families })
}

/// GPU time of `iters` runs of `record`, each its own timed pass.
fn gpu_time(gpu: &Gpu, iters: u64, record: &dyn Fn(&mut wgpu::ComputePass<'_>)) -> Duration {
    let mut timer = GpuTimer::new(gpu, PASSES as u32).expect("timestamps checked at open");
    let mut total_ms = 0.0;
    let mut left = iters;
    while left > 0 {
        let n = left.min(PASSES);
        timer.reset();
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        for _ in 0..n {
            let timestamp_writes = timer.next_pass();
            let mut pass = encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes });
            record(&mut pass);
        }
        timer.resolve(&mut encoder);
        gpu.queue.submit([encoder.finish()]);
        total_ms += timer.read_ms(gpu).expect("timestamps").iter().sum::<f64>();
        left -= n;
    }
    Duration::from_secs_f64(total_ms / 1e3)
}

/// One benchmark of `record`, timed on the GPU.
fn bench_gpu(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    id: BenchmarkId,
    gpu: &Gpu,
    record: &dyn Fn(&mut wgpu::ComputePass<'_>),
) {
    group.bench_function(id, |bench| bench.iter_custom(|iters| gpu_time(gpu, iters, record)));
}

fn f32_buffer(gpu: &Gpu, n: usize, seed: u32) -> wgpu::Buffer {
    let v: Vec<f32> = (0..n)
        .map(|i| ((i as u32 ^ seed).wrapping_mul(2_654_435_761) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    gpu.storage_buffer_init("bench f32", bytemuck::cast_slice(&v))
}

/// The step uniform of a step of `tokens` tokens (nothing else set).
fn step_buffer(gpu: &Gpu, tokens: usize) -> wgpu::Buffer {
    let info = StepInfo { num_tokens: tokens as u32, ..Default::default() };
    gpu.uniform_buffer_init("step", bytemuck::bytes_of(&info))
}

/// A `rows` × `cols` weight of `ty` on the GPU, every row the same quantized ramp.
fn bench_weight(gpu: &Gpu, label: &str, ty: GgmlType, rows: usize, cols: usize) -> GpuWeight {
    let format = match ty {
        GgmlType::Q4_1 => WeightFormat::Q4_1,
        GgmlType::Q8_0 => WeightFormat::Q8_0,
        GgmlType::Q5_0 => WeightFormat::Q5_0,
        other => unimplemented!("bench weights of {other:?}"),
    };
    let row: Vec<f32> = (0..cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
    let q = quantize_row(ty, &row).expect("quantizable row");
    let bytes: Vec<u8> = (0..rows).flat_map(|_| q.iter().copied()).collect();
    let max = gpu.limits.max_storage_buffer_binding_size;
    GpuWeight::upload(gpu, label, format, rows, cols, &bytes, max).expect("weight")
}

/// `out = x · wᵀ` over dense rows (`x`: [tokens, cols], `out`: [tokens, out_stride]).
fn dense_io<'a>(
    step: &'a wgpu::Buffer,
    x: &'a wgpu::Buffer,
    cols: usize,
    out: &'a wgpu::Buffer,
    out_stride: usize,
) -> LinearIo<'a> {
    LinearIo {
        step,
        x,
        x_stride: cols as u32,
        x_offset: 0,
        out,
        out_stride: out_stride as u32,
        out_offset: 0,
        bias: None,
        accumulate: false,
        rows: TokenRows::Step,
        glu: None,
        norm: None,
    }
}

/// Linear: out = W·x for one token; the weight is read once.
fn linear(c: &mut Criterion) {
    let Some(b) = open() else { return };
    let gpu = &b.gpu;
    let shapes = [
        ("smollm2 gate_up", 3072usize, 576usize),
        ("smollm2 lm_head", 49152, 576),
        ("gemma3 lm_head", 262144, 640),
        ("llama8b q", 4096, 4096),
        ("llama8b down", 4096, 14336),
    ];
    let mut group = c.benchmark_group("linear");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        for (shape, rows, cols) in shapes {
            let w = bench_weight(gpu, shape, ty, rows, cols);
            let weight_bytes: u64 = w.parts.iter().map(|p| p.words.size() + p.scales.size()).sum();
            let step = step_buffer(gpu, 1);
            let x = f32_buffer(gpu, cols, 1);
            let out = gpu.storage_buffer("out", (rows * 4) as u64);
            group.throughput(Throughput::Bytes(weight_bytes));
            for (family, kernels) in &b.families {
                let op =
                    LinearOp::new(gpu, kernels, shape, &w, dense_io(&step, &x, cols, &out, rows));
                let shape_1 = StepShape { num_tokens: 1, ..Default::default() };
                let id = BenchmarkId::new(format!("{ty:?} {shape} {rows}x{cols}"), family);
                bench_gpu(&mut group, id, gpu, &|pass| {
                    op.record(pass, &shape_1);
                });
            }
        }
    }
    // a decode batch of 8 sequences: still the weight bytes once (the 4- or 8-token tile; on
    // GPUs split-K, linear::split_groups)
    let (tokens, shape, rows, cols) = (8usize, "llama8b q", 4096usize, 4096usize);
    let w = bench_weight(gpu, shape, GgmlType::Q4_1, rows, cols);
    let weight_bytes: u64 = w.parts.iter().map(|p| p.words.size() + p.scales.size()).sum();
    let step = step_buffer(gpu, tokens);
    let x = f32_buffer(gpu, tokens * cols, 3);
    let out = gpu.storage_buffer("out", (tokens * rows * 4) as u64);
    group.throughput(Throughput::Bytes(weight_bytes));
    for (family, kernels) in &b.families {
        let op = LinearOp::new(gpu, kernels, shape, &w, dense_io(&step, &x, cols, &out, rows));
        let batch = StepShape { num_tokens: tokens as u32, ..Default::default() };
        let id = BenchmarkId::new(format!("Q4_1 {shape} {rows}x{cols} T={tokens}"), family);
        bench_gpu(&mut group, id, gpu, &|pass| {
            op.record(pass, &batch);
        });
    }
    group.finish();
}

/// Linear over a prefill chunk of 64 tokens (the token-tile path, compute-bound): Q4_1 at
/// SmolLM2's gate/up and Llama-8B's Q shapes. Throughput is the multiply-adds' elements
/// (rows × cols × tokens), so criterion's "thrpt" reads as multiply-adds per second.
fn linear_prefill(c: &mut Criterion) {
    let Some(b) = open() else { return };
    let gpu = &b.gpu;
    let tokens = 64usize;
    let mut group = c.benchmark_group("linear_prefill");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (ty, shape, rows, cols) in [
        (GgmlType::Q4_1, "smollm2 gate_up", 3072usize, 576usize),
        (GgmlType::Q4_1, "llama8b q", 4096, 4096),
        (GgmlType::Q8_0, "smollm2 gate_up", 3072, 576),
        (GgmlType::Q5_0, "gemma3 gate_up", 4096, 640),
    ] {
        let w = bench_weight(gpu, shape, ty, rows, cols);
        let step = step_buffer(gpu, tokens);
        let x = f32_buffer(gpu, tokens * cols, 2);
        let out = gpu.storage_buffer("out", (tokens * rows * 4) as u64);
        group.throughput(Throughput::Elements((rows * cols * tokens) as u64));
        for (family, kernels) in &b.families {
            let io = dense_io(&step, &x, cols, &out, rows);
            let op = LinearOp::new(gpu, kernels, shape, &w, io);
            let chunk = StepShape { num_tokens: tokens as u32, ..Default::default() };
            let id = BenchmarkId::new(format!("{ty:?} {shape} {rows}x{cols} T={tokens}"), family);
            bench_gpu(&mut group, id, gpu, &|pass| {
                op.record(pass, &chunk);
            });
        }
    }
    group.finish();
}

/// Decode attention (split-K partials + reduce) for one sequence over a paged KV history: f16,
/// and int8 / int4 with their default scales (K per channel, V per token), whose bytes read are
/// the codes and scales of the history.
fn attention_decode(c: &mut Criterion) {
    let Some(b) = open() else { return };
    let gpu = &b.gpu;
    let mut group = c.benchmark_group("attention_decode");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let shapes = [("smollm2", 9u32, 3u32, 64u32), ("llama8b", 32, 8, 128), ("gemma3", 4, 1, 256)];
    let formats = [("f16", KvFormat::F16), ("int8", KvFormat::Int8), ("int4", KvFormat::Int4)];
    for (shape, heads, kv_heads, hd) in shapes {
        for ctx in [512u32, 4096] {
            for (kv_name, format) in formats {
                let spec = KvCacheSpec::new(format, None, None, false).expect("default scales");
                let layout = QkvLayout::new(heads, kv_heads, hd);
                let bs = 16u32;
                let blocks = ctx.div_ceil(bs);
                let ql = KvQuantLayout::new(&spec, bs as usize, hd as usize, 1);
                // Words of one KV head block of K and of V (f16: the rows themselves).
                let (k_words, v_words) = ql.as_ref().map_or((bs * hd / 2, bs * hd / 2), |q| {
                    (q.k_head_block_words, q.v_head_block_words)
                });
                // Halves in [0.25, 1): finite f16 rows, and codes and f16 scales of the same
                // magnitude for the quantized pools.
                let words = |n: u32| -> Vec<u32> {
                    (0..n)
                        .map(|i| 0x3800_3400 ^ (i.wrapping_mul(2_654_435_761) & 0x03FF_03FF))
                        .collect()
                };
                let k = gpu.storage_buffer_init(
                    "k",
                    bytemuck::cast_slice(&words(blocks * kv_heads * k_words)),
                );
                let v = gpu.storage_buffer_init(
                    "v",
                    bytemuck::cast_slice(&words(blocks * kv_heads * v_words)),
                );
                let stage = gpu.storage_buffer_init(
                    "stage",
                    bytemuck::cast_slice(&words(2 * kv_heads * bs * hd / 2)),
                );
                let table: Vec<u32> = (0..blocks).rev().collect();
                let tables = gpu.storage_buffer_init("tables", bytemuck::cast_slice(&table));
                let seq = SeqInfo {
                    q_start: 0,
                    q_len: 1,
                    ctx_len: ctx,
                    table_start: 0,
                    ..Default::default()
                };
                let seqs = gpu.storage_buffer_init("seqs", bytemuck::bytes_of(&seq));
                let tiles = gpu.storage_buffer_init("tiles", bytemuck::cast_slice(&[0u32, 0]));
                let info = StepInfo {
                    num_tokens: 1,
                    num_seqs: 1,
                    num_decode_seqs: 1,
                    ..Default::default()
                };
                let step = gpu.uniform_buffer_init("step", bytemuck::bytes_of(&info));
                let qkv = f32_buffer(gpu, layout.stride() as usize, 2);
                let parts = partitions(ctx);
                let partials = gpu.storage_buffer("partials", partials_bytes(1, heads, parts, hd));
                let out = gpu.storage_buffer("out", u64::from(heads * hd * 4));
                let kv_bytes = u64::from(blocks * kv_heads * (k_words + v_words) * 4);
                group.throughput(Throughput::Bytes(kv_bytes));
                for (family, kernels) in &b.families {
                    let io = AttentionIo {
                        step: &step,
                        qkv: &qkv,
                        k_pool: &k,
                        v_pool: &v,
                        seqs: &seqs,
                        block_tables: &tables,
                        prefill_tiles: &tiles,
                        partials: &partials,
                        out: &out,
                        kv_quant: ql.map(|layout| KvQuantIo { layout, stage: &stage }),
                        sinks: None,
                    };
                    let scale = 1.0 / (hd as f32).sqrt();
                    let op = AttentionOp::new(gpu, kernels, layout, bs, parts, None, scale, io);
                    let shape_1 = StepShape {
                        num_tokens: 1,
                        num_decode_seqs: 1,
                        max_decode_partitions: parts,
                        ..Default::default()
                    };
                    let id = BenchmarkId::new(
                        format!("{shape} {heads}/{kv_heads}x{hd} ctx {ctx} {kv_name}"),
                        family,
                    );
                    bench_gpu(&mut group, id, gpu, &|pass| {
                        op.record(pass, &shape_1);
                    });
                }
            }
        }
    }
    group.finish();
}

/// RMSNorm of one hidden row.
fn rms_norm(c: &mut Criterion) {
    let Some(b) = open() else { return };
    let gpu = &b.gpu;
    let mut group = c.benchmark_group("rms_norm");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    for (shape, dim) in [("smollm2", 576u32), ("llama8b", 4096)] {
        let step = step_buffer(gpu, 1);
        let x = f32_buffer(gpu, dim as usize, 3);
        let w = f32_buffer(gpu, dim as usize, 4);
        let out = gpu.storage_buffer("out", u64::from(dim * 4));
        group.throughput(Throughput::Bytes(u64::from(3 * dim * 4)));
        let (family, kernels) = &b.families[0];
        let io = NormIo {
            step: &step,
            x: &x,
            weight: &w,
            out: &out,
            rows: NormRows::Step,
            accumulate: false,
        };
        let op = RmsNormOp::new(gpu, kernels, shape, dim, 1e-5, io);
        let shape_1 = StepShape { num_tokens: 1, ..Default::default() };
        let id = BenchmarkId::new(format!("{shape} {dim}"), family);
        bench_gpu(&mut group, id, gpu, &|pass| {
            op.record(pass, &shape_1);
        });
    }
    group.finish();
}

/// The fused dispatches against the pairs they replace, one decode token, `auto` kernels:
/// RoPE + KV write (`rope_kv_write` vs `rope` then `kv_write`) and the gate/up linear with its
/// GLU epilogue (vs the stacked gate/up linear then the SiLU·mul kernel), Q4_1 weights.
fn fusions(c: &mut Criterion) {
    let Some(b) = open() else { return };
    let gpu = &b.gpu;
    let (_, kernels) = &b.families[0];
    let mut group = c.benchmark_group("fusions");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    let step = step_buffer(gpu, 1);
    let shape_1 = StepShape { num_tokens: 1, ..Default::default() };
    for (shape, heads, kv_heads, head_dim) in
        [("smollm2", 9u32, 3u32, 64u32), ("llama8b", 32, 8, 128)]
    {
        let layout = QkvLayout::new(heads, kv_heads, head_dim);
        let bs = 16u32;
        let qkv = f32_buffer(gpu, layout.stride() as usize, 5);
        let positions = gpu.storage_buffer_init("positions", bytemuck::cast_slice(&[100u32]));
        let slots = gpu.storage_buffer_init("slots", bytemuck::cast_slice(&[37u32]));
        let rope = Rope { theta: 10000.0, scaling: RopeScaling::None };
        let table = rope_table(head_dim as usize, &rope, 128);
        let table = gpu.storage_buffer_init("rope table", bytemuck::cast_slice(&table));
        let pool_bytes = u64::from(4 * kv_heads * bs * head_dim * 2);
        let (kp, vp) = (gpu.storage_buffer("k", pool_bytes), gpu.storage_buffer("v", pool_bytes));
        let pairs = RopePairs::Interleaved;
        let io = RopeKvIo {
            step: &step,
            qkv: &qkv,
            positions: &positions,
            table: &table,
            slot_mapping: &slots,
            k_pool: &kp,
            v_pool: &vp,
        };
        let fused = RopeKvWriteOp::new(gpu, kernels, layout, pairs, bs, io);
        let rope = RopeOp::new(gpu, kernels, &step, &qkv, &positions, &table, layout.into(), pairs);
        let write = KvWriteOp::new(gpu, kernels, &step, &qkv, &slots, &kp, &vp, layout, bs);
        let id = BenchmarkId::new(format!("rope+kv_write {shape}"), "fused");
        bench_gpu(&mut group, id, gpu, &|pass| {
            fused.record(pass, &shape_1);
        });
        let id = BenchmarkId::new(format!("rope+kv_write {shape}"), "separate");
        bench_gpu(&mut group, id, gpu, &|pass| {
            rope.record(pass, &shape_1);
            write.record(pass, &shape_1);
        });
    }
    for (shape, ffn, hidden) in [("smollm2", 1536usize, 576usize), ("llama8b", 14336, 4096)] {
        let w = bench_weight(gpu, shape, GgmlType::Q4_1, 2 * ffn, hidden);
        let x = f32_buffer(gpu, hidden, 6);
        let gate_up = gpu.storage_buffer("gate_up", (2 * ffn * 4) as u64);
        let out = gpu.storage_buffer("ffn", (ffn * 4) as u64);
        let glu_io =
            LinearIo { glu: Some(Activation::Silu), ..dense_io(&step, &x, hidden, &out, ffn) };
        let fused = LinearOp::new(gpu, kernels, shape, &w, glu_io);
        let stacked_io = dense_io(&step, &x, hidden, &gate_up, 2 * ffn);
        let stacked = LinearOp::new(gpu, kernels, shape, &w, stacked_io);
        let silu = GluOp::new(gpu, kernels, Activation::Silu, &step, &gate_up, &out, ffn as u32);
        let id = BenchmarkId::new(format!("gate_up+silu {shape} Q4_1 {ffn}x{hidden}"), "fused");
        bench_gpu(&mut group, id, gpu, &|pass| {
            fused.record(pass, &shape_1);
        });
        let id = BenchmarkId::new(format!("gate_up+silu {shape} Q4_1 {ffn}x{hidden}"), "separate");
        bench_gpu(&mut group, id, gpu, &|pass| {
            stacked.record(pass, &shape_1);
            silu.record(pass, &shape_1);
        });
    }
    group.finish();
}

/// A Gated DeltaNet layer's kernels (`kernels::delta_net`) at Qwen3.5's linear-attention
/// shape (16 key heads and 32 value heads of 128 channels, a 4-tap conv over 8,192 channels),
/// one sequence: a decode token and a 512-token prompt. The scan's bytes are its recurrent
/// state read and written once (4 MiB: the decode cost), plus q, k, v and its outputs.
fn delta_net(c: &mut Criterion) {
    use kvrun::kernels::delta_net::*;
    let Some(b) = open() else { return };
    let gpu = &b.gpu;
    let (_, kernels) = &b.families[0];
    let mut group = c.benchmark_group("delta_net");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    let (k_heads, v_heads, dk, dv, taps) = (16u32, 32u32, 128u32, 128u32, 4u32);
    let channels = 2 * k_heads * dk + v_heads * dv;
    let vd = v_heads * dv;
    let state_bytes = u64::from(v_heads * dk * dv * 4);
    for tokens in [1u32, 512] {
        let t = tokens as usize;
        let info = StepInfo { num_tokens: tokens, num_seqs: 1, ..Default::default() };
        let step = gpu.uniform_buffer_init("step", bytemuck::bytes_of(&info));
        // a sequence continuing its state (position 1000), so the scan reads and writes it
        let seq = SeqInfo { q_len: tokens, ctx_len: 1000 + tokens, ..Default::default() };
        let seqs = gpu.storage_buffer_init("seqs", bytemuck::bytes_of(&seq));
        let shape = StepShape {
            num_tokens: tokens,
            num_seqs: 1,
            max_seq_tokens: tokens,
            ..Default::default()
        };
        let x = f32_buffer(gpu, t * channels as usize, 1);
        let w = f32_buffer(gpu, (channels * taps) as usize, 2);
        let conv_state = f32_buffer(gpu, ((taps - 1) * channels) as usize, 3);
        let qkv = gpu.storage_buffer("qkv", u64::from(tokens * channels * 4));
        let ab = f32_buffer(gpu, t * 2 * v_heads as usize, 4);
        let head_params = f32_buffer(gpu, 2 * v_heads as usize, 5);
        let rec_state = gpu.storage_buffer("state", state_bytes);
        let out = gpu.storage_buffer("out", u64::from(tokens * vd * 4));
        let z = f32_buffer(gpu, t * vd as usize, 6);
        let norm_w = f32_buffer(gpu, dv as usize, 7);
        let conv_io =
            ConvIo { step: &step, seqs: &seqs, x: &x, weight: &w, state: &conv_state, out: &qkv };
        let conv_dims =
            ConvDims { channels, taps, x_stride: channels, x_offset: 0, out_stride: channels };
        let conv = ConvOp::new(gpu, kernels, conv_io, conv_dims);
        let scan_io = ScanIo {
            step: &step,
            seqs: &seqs,
            qkv: &qkv,
            ab: &ab,
            head_params: &head_params,
            state: &rec_state,
            out: &out,
        };
        let scan_dims = ScanDims {
            k_heads,
            v_heads,
            dk,
            dv,
            qkv_stride: channels,
            q_offset: 0,
            k_offset: k_heads * dk,
            v_offset: 2 * k_heads * dk,
            ab_stride: 2 * v_heads,
            b_offset: 0,
            a_offset: v_heads,
            out_stride: vd,
            max_seq_tokens: tokens,
            k_tiled: false,
        };
        let scan = ScanOp::new(gpu, kernels, scan_io, scan_dims);
        let norm_io = GatedNormIo { step: &step, z: &z, weight: &norm_w, o: &out };
        let norm_dims =
            GatedNormDims { v_heads, dv, o_stride: vd, z_stride: vd, z_offset: 0, eps: 1e-6 };
        let norm = GatedNormOp::new(gpu, kernels, norm_io, norm_dims);
        let io_bytes = |per_token: u32| u64::from(tokens * per_token * 4);
        group.throughput(Throughput::Bytes(
            io_bytes(3 * channels) + 2 * u64::from((taps - 1) * channels * 4),
        ));
        bench_gpu(&mut group, BenchmarkId::new("conv", tokens), gpu, &|pass| {
            conv.record(pass, &shape);
        });
        group.throughput(Throughput::Bytes(2 * state_bytes + io_bytes(channels + vd)));
        bench_gpu(&mut group, BenchmarkId::new("scan", tokens), gpu, &|pass| {
            scan.record(pass, &shape);
        });
        group.throughput(Throughput::Bytes(io_bytes(3 * vd)));
        bench_gpu(&mut group, BenchmarkId::new("gated_norm", tokens), gpu, &|pass| {
            norm.record(pass, &shape);
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = linear, linear_prefill, attention_decode, rms_norm, fusions, delta_net
}
criterion_main!(benches);
