//! Shared test helpers: one GPU per test process, seeded inputs, sentinels, comparisons.
#![allow(dead_code)]

pub mod llama_cpp;
pub mod weights;

use std::sync::OnceLock;

use kvrun::gpu::{Gpu, GpuOptions};
use kvrun::kernels::{Kernels, StepInfo};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Value written around every output region; a kernel that writes out of bounds changes it.
pub const SENTINEL: f32 = -12345.5;

pub struct TestGpu {
    pub gpu: std::sync::Arc<Gpu>,
    pub kernels: Kernels,
}

/// The shared GPU of this test process, or `None` (the test then returns early, saying why).
pub fn gpu() -> Option<&'static TestGpu> {
    static GPU: OnceLock<Option<TestGpu>> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::open(&GpuOptions::default()) {
        Ok(gpu) => {
            let kernels = Kernels::new(&gpu);
            let sub = gpu.caps.subgroup_min_size;
            eprintln!("testing on {} ({:?}), subgroups of {sub}", gpu.info.name, gpu.info.backend);
            check_vector_width(&gpu.info.name, sub);
            Some(TestGpu { gpu: std::sync::Arc::new(gpu), kernels })
        }
        Err(e) => {
            assert!(!no_skip(), "no GPU ({e}) and KVRUN_NO_SKIP is set");
            eprintln!("SKIPPING GPU test: {e}");
            None
        }
    })
    .as_ref()
}

/// `.ci/run` reruns the kernel and tiny-model tests with `LP_NATIVE_VECTOR_WIDTH` 512 and 128:
/// on lavapipe that makes subgroups of 16 and 4 lanes (the default 256 makes 8), so the variant
/// choice and the subgroup kernels are tested at more than one subgroup size. A run that asked
/// for a width must get it.
fn check_vector_width(adapter: &str, subgroup: u32) {
    let Some(bits) =
        std::env::var("LP_NATIVE_VECTOR_WIDTH").ok().and_then(|v| v.parse::<u32>().ok())
    else {
        return;
    };
    if adapter.contains("llvmpipe") {
        assert_eq!(subgroup, bits / 32, "LP_NATIVE_VECTOR_WIDTH={bits} on {adapter}");
    }
}

/// `KVRUN_NO_SKIP=1` (set by `.ci/run`) turns "no GPU" and "no real model" from a skip into a
/// failure, so CI cannot pass by testing nothing.
pub fn no_skip() -> bool {
    std::env::var_os("KVRUN_NO_SKIP").is_some_and(|v| !v.is_empty() && v != "0")
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` uniform values in [-scale, scale].
/// Two values as one u32 word of f16 (low half first), as the KV pool and staging hold them.
pub fn pack_f16(a: f32, b: f32) -> u32 {
    use half::f16;
    u32::from(f16::from_f32(a).to_bits()) | (u32::from(f16::from_f32(b).to_bits()) << 16)
}

/// `len` rows of `width` f16-representable K or V values, uniform in ±`range`, with every
/// 13th channel (from channel 5) `outlier`× larger — K's reason for per-channel scales — and
/// no exact zeros (the sign of a zero minimum is unspecified).
pub fn kv_values(rng: &mut StdRng, width: usize, len: usize, range: f32, outlier: f32) -> Vec<f32> {
    (0..len * width)
        .map(|i| {
            let o = if (i % width) % 13 == 5 { outlier } else { 1.0 };
            let x = half::f16::from_f32(rng.random_range(-range..range) * o).to_f32();
            if x == 0.0 {
                0.001
            } else {
                x
            }
        })
        .collect()
}

pub fn uniform(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..=scale)).collect()
}

pub fn step_uniform(gpu: &Gpu, info: StepInfo) -> wgpu::Buffer {
    gpu.uniform_buffer_init("test step", bytemuck::bytes_of(&info))
}

pub fn storage_f32(gpu: &Gpu, data: &[f32]) -> wgpu::Buffer {
    gpu.storage_buffer_init("test f32", bytemuck::cast_slice(data))
}

pub fn storage_u32(gpu: &Gpu, data: &[u32]) -> wgpu::Buffer {
    gpu.storage_buffer_init("test u32", bytemuck::cast_slice(data))
}

/// A linear kernel set's name in test messages: the variant, for the GPU one whether its
/// one-token tile is split-K (`KernelConfig::split_k`), for the subgroup one its x loads
/// (`KernelConfig::lane_loads`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LinearKind {
    pub variant: kvrun::kernels::LinearVariant,
    pub split_k: bool,
    pub loads: kvrun::kernels::LaneLoads,
}

impl std::fmt::Debug for LinearKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let split = if self.split_k { " split-K" } else { "" };
        let wide = if self.loads == kvrun::kernels::LaneLoads::Words64 { " u64 x" } else { "" };
        write!(f, "{:?}{split}{wide}", self.variant)
    }
}

/// Kernel sets for every linear variant this adapter can run
/// (`linear::can_run_subgroup`), the GPU one both one invocation a row and
/// split-K (GPUs split, CPU adapters do not: both are tested on any adapter), the subgroup one
/// with both x load widths (chosen by host, `KernelConfig::lane_loads`: both tested on any).
pub fn linear_variants(t: &TestGpu) -> Vec<(LinearKind, Kernels)> {
    use kvrun::kernels::{LaneLoads, LinearVariant};
    let mut out = Vec::new();
    for (v, split_k, loads) in [
        (LinearVariant::Gpu, false, LaneLoads::Words32),
        (LinearVariant::Gpu, true, LaneLoads::Words32),
        (LinearVariant::Subgroup, false, LaneLoads::Words32),
        (LinearVariant::Subgroup, false, LaneLoads::Words64),
    ] {
        let caps = &t.gpu.caps;
        if v == LinearVariant::Subgroup && !kvrun::kernels::linear::can_run_subgroup(caps) {
            // Not a missing resource: such an adapter runs the Gpu variant in production too
            // (CI's subgroups-of-4 stage is one).
            eprintln!("adapter lacks subgroups of 8+ lanes or 64-bit integers: subgroup linear variant not tested");
            continue;
        }
        let config = kvrun::kernels::KernelConfig {
            linear: v,
            split_k,
            lane_loads: loads,
            ..t.kernels.config.clone()
        };
        out.push((LinearKind { variant: v, split_k, loads }, Kernels::with_config(config)));
    }
    out
}

/// Kernel sets for both attention variants where this adapter can run them
/// (`attention::can_run_lanes`).
pub fn attention_variants(t: &TestGpu) -> Vec<(&'static str, Kernels)> {
    let can_run = kvrun::kernels::attention::can_run_lanes(&t.gpu.caps);
    let mut out =
        with_lane_variant(t, "workgroup", can_run, |c, on| c.lanes_attention = on, "attention");
    if let Some(config) = lanes_other_partition(&out) {
        out.push(("lanes, other partition", Kernels::with_config(config)));
    }
    out
}

/// The "lanes" set's config with the lane partition this host does not pick
/// (`KernelConfig::lane_partition`: 256 keys on 1–2 threads, 128 on 3–4, 64 past that): the
/// workgroup family's 64 where the host picks more, else 256, so both ends are tested here.
fn lanes_other_partition(sets: &[(&'static str, Kernels)]) -> Option<kvrun::kernels::KernelConfig> {
    use kvrun::kernels::attention::PARTITION;
    let lanes = &sets.iter().find(|(name, _)| *name == "lanes")?.1.config;
    let other = if lanes.lane_partition > PARTITION { PARTITION } else { 4 * PARTITION };
    Some(kvrun::kernels::KernelConfig { lane_partition: other, ..lanes.clone() })
}

/// `attention_variants` for quantized pools: the lanes variant with both load widths (chosen
/// by host, `KernelConfig::lane_loads`; 64-bit where the adapter has 64-bit integers), the
/// 64-bit set with the other lane partition (`lanes_other_partition`: the two choices are
/// independent, and a set each keeps the test's time). An f16 pool is read one way
/// (`attention::pool_loads`).
pub fn attention_variants_kvq(t: &TestGpu) -> Vec<(&'static str, Kernels)> {
    use kvrun::kernels::LaneLoads;
    let mut out = attention_variants(t);
    let mut take = |name: &str| {
        let i = out.iter().position(|(n, _)| *n == name)?;
        Some(out.remove(i).1.config)
    };
    if let (Some(lanes), Some(other)) = (take("lanes"), take("lanes, other partition")) {
        let (name, wide) = if t.gpu.caps.shader_int64 {
            ("lanes u64, other partition", LaneLoads::Words64)
        } else {
            eprintln!("adapter lacks 64-bit integers: 64-bit lane loads not tested");
            ("lanes, other partition", LaneLoads::Words32)
        };
        for (name, loads, config) in [("lanes", LaneLoads::Words32, lanes), (name, wide, other)] {
            let config = kvrun::kernels::KernelConfig { lane_loads: loads, ..config };
            out.push((name, Kernels::with_config(config)));
        }
    }
    out
}

/// The kernel sets of a kernel with a lane variant: `base` (the adapter's config with `lanes`
/// false) and, where the adapter can run it (`can_run`), "lanes" (`lanes` true). An adapter
/// that cannot runs the other variant in production, so nothing goes untested there.
fn with_lane_variant(
    t: &TestGpu,
    base: &'static str,
    can_run: bool,
    lanes: impl Fn(&mut kvrun::kernels::KernelConfig, bool),
    what: &str,
) -> Vec<(&'static str, Kernels)> {
    let config = |on| {
        let mut c = t.kernels.config.clone();
        lanes(&mut c, on);
        Kernels::with_config(c)
    };
    let mut out = vec![(base, config(false))];
    if can_run {
        out.push(("lanes", config(true)));
    } else {
        eprintln!("adapter cannot run the lane {what} variant: not tested");
    }
    out
}

/// Kernel sets for both RMSNorm variants where this adapter can run them
/// (`rms_norm::can_run_lanes`: subgroups of exactly 8 lanes).
pub fn norm_variants(t: &TestGpu) -> Vec<(&'static str, Kernels)> {
    let can_run = kvrun::kernels::rms_norm::can_run_lanes(&t.gpu.caps);
    with_lane_variant(t, "workgroup", can_run, |c, on| c.lanes_norm = on, "RMSNorm")
}

/// The rotation variants this adapter can run (`--kv-rotate`): the one-invocation kernel always,
/// the lane kernel where subgroups have at least 8 lanes (`rotate::can_run_lanes`).
pub fn rotate_variants(t: &TestGpu) -> Vec<(&'static str, Kernels)> {
    let can_run = kvrun::kernels::rotate::can_run_lanes(&t.gpu.caps);
    with_lane_variant(t, "invocation", can_run, |c, on| c.lanes_rotate = on, "rotation")
}

/// Runs `record` in one compute pass and waits.
pub fn run(gpu: &Gpu, record: impl FnOnce(&mut wgpu::ComputePass<'_>)) {
    let mut enc =
        gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("test") });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("test"),
            timestamp_writes: None,
        });
        record(&mut pass);
    }
    gpu.queue.submit([enc.finish()]);
    gpu.wait_idle().expect("GPU error");
}

/// Asserts |got - want| <= bound[i] for every element; names the first bad index.
pub fn assert_within(what: &str, got: &[f32], want: &[f32], bound: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0.0f32);
    for i in 0..got.len() {
        let err = (got[i] - want[i]).abs();
        // NaN fails too: `err <= bound` is false for it
        if err.is_nan() || err > bound[i] {
            panic!(
                "{what}: first bad index {i}: got {} want {} (|err| {err} > bound {})",
                got[i], want[i], bound[i]
            );
        }
        if err > worst.1 {
            worst = (i, err);
        }
    }
    eprintln!("{what}: ok, max |err| {} at {}", worst.1, worst.0);
}

/// Asserts |got - want| <= abs + rel·|want| for every element.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], abs: f32, rel: f32) {
    let bound: Vec<f32> = want.iter().map(|w| abs + rel * w.abs()).collect();
    assert_within(what, got, want, &bound);
}

/// Asserts every value equals the sentinel.
pub fn assert_sentinels(what: &str, values: &[f32]) {
    if let Some(i) = values.iter().position(|v| *v != SENTINEL) {
        panic!("{what}: sentinel {i} overwritten with {}", values[i]);
    }
}

/// Whether python3 with `gguf` and `numpy` is there (scripts/setup.sh installs them); false
/// (a skip, printed) without, a failure under `KVRUN_NO_SKIP`.
pub fn python_with_gguf(test: &str) -> bool {
    let have = std::process::Command::new("python3")
        .args(["-c", "import gguf, numpy"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        assert!(
            !no_skip(),
            "{test}: python3 with gguf and numpy is missing and KVRUN_NO_SKIP is set \
             (run scripts/setup.sh)"
        );
        println!("skipping {test}: python3 with gguf and numpy not found (scripts/setup.sh)");
    }
    have
}

/// The real SmolLM2 GGUF (env `KVRUN_TEST_MODEL`, default
/// `assets/models/SmolLM2-135M-Instruct.Q4_1.gguf`), or `None` with a printed skip message.
pub fn real_model(test: &str) -> Option<std::path::PathBuf> {
    real_model_file(test, "KVRUN_TEST_MODEL", "SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The real Gemma 3 270M GGUF (env `KVRUN_TEST_GEMMA3_MODEL`, default
/// `assets/models/gemma-3-270m-q4_k_m.gguf`), or `None` with a printed skip message.
pub fn real_gemma3_model(test: &str) -> Option<std::path::PathBuf> {
    real_model_file(test, "KVRUN_TEST_GEMMA3_MODEL", "gemma-3-270m-q4_k_m.gguf")
}

/// `$env`, else `assets/models/<default>`; `None` (a failure under `KVRUN_NO_SKIP`) if absent.
fn real_model_file(test: &str, env: &str, default: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os(env).map(std::path::PathBuf::from).unwrap_or_else(|| {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/models").join(default)
    });
    if path.is_file() {
        Some(path)
    } else {
        assert!(
            !no_skip(),
            "{test}: real model {} not found and KVRUN_NO_SKIP is set (run scripts/fetch-models.sh)",
            path.display()
        );
        println!(
            "skipping {test}: real model {} not found (set {env} or run scripts/fetch-models.sh)",
            path.display()
        );
        None
    }
}

/// Logits of a float64 reference forward vs the GPU (f32 math, f16 KV cache), `[rows, vocab]`:
/// the tiny models' logits spread ~1–2; f16 rounding of K/V (rel 5e-4) and f32 sums keep errors
/// near 1e-3, so 1e-2 absolute plus 1e-2 relative flags any real bug (a wrong RoPE pair or base,
/// head mapping, missing norm moves logits by ~0.1–1) without tripping on rounding; each row's
/// argmax must agree unless the reference's top two are within 1e-2.
pub fn check_logits(what: &str, got: &[f32], want: &[f32], vocab: usize) {
    assert_close(what, got, want, 1e-2, 1e-2);
    for (i, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
        let am = |r: &[f32]| r.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
        let (ga, wa) = (am(g), am(w));
        assert!(
            ga == wa || (w[ga] - w[wa]).abs() < 1e-2,
            "{what}: position {i} argmax {ga} vs reference {wa}"
        );
    }
}

/// A tiny model's `golden.json`-style file (`assets/…`, relative to the crate): its token ids,
/// its vocabulary size (`logits_shape[1]`) and the whole document.
pub fn read_golden(rel: &str) -> (Vec<u32>, usize, serde_json::Value) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let tokens =
        v["token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    let vocab = v["logits_shape"][1].as_u64().unwrap() as usize;
    (tokens, vocab, v)
}

/// The logits of one forward (`variant`) of a golden document, row-major.
pub fn golden_logits(v: &serde_json::Value, variant: &str) -> Vec<f32> {
    v["logits"][variant]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32))
        .collect()
}

/// The perplexity check of a tiny model built with HF transformers as its reference
/// (`assets/hf-reference/tiny_hf.py`): [`check_perplexity`] for each of `files` (paths under
/// `dir`, with the variant of `dir/golden.json` whose forward they run).
pub fn check_tiny_perplexity(
    dir: &str,
    files: &[(&str, &str)],
    rel_tol_hf: f64,
    rel_tol_llama: f64,
) {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir);
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    for &(file, variant) in files {
        check_perplexity(&golden, &dir.join(file), variant, rel_tol_hf, rel_tol_llama);
    }
}

/// kvrun's `perplexity` of `model` on a golden's text (its `perplexity` entry: text, ctx and
/// chunks) against transformers' float64 forward of `variant` within `rel_tol_hf`, and, where
/// the golden has llama.cpp's llama-perplexity for a file of `model`'s name, against that
/// within `rel_tol_llama`; with the kernels this adapter selects and the discrete-GPU ones
/// forced. The GPU-reduced log-probabilities also match the host's f64 ones from the rows.
pub fn check_perplexity(
    golden: &serde_json::Value,
    model: &std::path::Path,
    variant: &str,
    rel_tol_hf: f64,
    rel_tol_llama: f64,
) {
    use kvrun::engine::{Engine, EngineConfig, PerplexityOptions};
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let ppl = &golden["perplexity"];
    let text = std::fs::read_to_string(root.join(ppl["text"].as_str().unwrap())).unwrap();
    let ctx = ppl["ctx"].as_u64().unwrap() as usize;
    let chunks = ppl["chunks"].as_u64().unwrap() as usize;
    if gpu().is_none() {
        return;
    }
    let file = model.file_name().unwrap().to_str().unwrap();
    for family in [kvrun::kernels::KernelFamily::Auto, kvrun::kernels::KernelFamily::Gpu] {
        let mut cfg = EngineConfig::new(model.to_path_buf());
        cfg.kernel_family = family;
        cfg.max_model_len = Some(ctx);
        cfg.max_num_batched_tokens = ctx;
        cfg.max_logit_rows = Some(ctx);
        let mut engine = Engine::load(&cfg).unwrap();
        let opts = PerplexityOptions { ctx, max_chunks: Some(chunks) };
        let got = engine.perplexity(&text, &opts, |_, _| {}).unwrap().ppl;
        let hf = ppl["transformers_f64"][variant].as_f64().unwrap();
        let what = format!("{} {family:?}: kvrun PPL {got}", model.display());
        eprintln!("{what}, transformers {hf}, llama.cpp {}", ppl["llama_cpp"][file]);
        assert!((got / hf - 1.0).abs() < rel_tol_hf, "{what} vs transformers {hf}");
        if let Some(llama) = ppl["llama_cpp"][file].as_f64() {
            assert!((got / llama - 1.0).abs() < rel_tol_llama, "{what} vs llama.cpp {llama}");
        }
        // `perplexity` reduces each position's log-probability on the GPU (f32); with a KLD
        // base the rows come back and the host computes it in f64: the same figure
        let mut base = Engine::load(&cfg).unwrap();
        let rows = engine.perplexity_vs(&text, &opts, Some(&mut base), |_, _| {}).unwrap().ppl;
        assert!((got / rows - 1.0).abs() < 1e-5, "{what}: {rows} from the rows on the host");
    }
}

/// The model with `groups` for contexts of `max_len` tokens in blocks of `bs` (one prefill of
/// up to `max_len` tokens a step), and one shuffled block table per group over disjoint blocks
/// (`seed`); `None` without a GPU.
pub fn load_grouped(
    f: &kvrun::loader::ModelFile,
    family: kvrun::kernels::KernelFamily,
    groups: &kvrun::kv::KvGroups,
    (max_len, bs): (usize, usize),
    seed: u64,
) -> Option<(kvrun::model::Model, Vec<Vec<u32>>)> {
    let t = gpu()?;
    let kernels =
        Kernels::with_config(kvrun::kernels::KernelConfig::choose_family(&t.gpu.caps, family));
    let per_table = max_len.div_ceil(bs);
    let num_blocks = groups.len() * per_table + 3;
    let options = kvrun::model::ModelOptions {
        max_num_batched_tokens: max_len,
        max_num_seqs: 1,
        max_logit_rows: max_len,
        max_model_len: max_len,
        block_size: bs,
        num_blocks,
        kv_cache: Default::default(),
        kv_groups: groups.clone(),
        state_snapshots: 0,
    };
    let model = kvrun::model::Model::load(t.gpu.clone(), &kernels, f, options).unwrap();
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    rand::seq::SliceRandom::shuffle(&mut ids[..], &mut rng(seed));
    let tables = ids.chunks(per_table).take(groups.len()).map(<[u32]>::to_vec).collect();
    Some((model, tables))
}

/// Runs `tokens` through the model in `chunks` (lengths), one block table per KV-cache group,
/// returning every position's logits.
pub fn run_grouped(
    model: &mut kvrun::model::Model,
    tokens: &[u32],
    chunks: &[usize],
    tables: &[Vec<u32>],
    bs: usize,
) -> Vec<f32> {
    let mut out = Vec::new();
    let mut pos = 0;
    for &len in chunks {
        let chunk = kvrun::model::SeqChunk {
            tokens: &tokens[pos..pos + len],
            start_pos: pos,
            block_tables: tables,
            slot_mapping: None,
            logits: kvrun::model::LogitsWanted::Range(0..len),
            stage_slot: 0,
            states: Default::default(),
        };
        let batch = kvrun::model::ForwardBatch::new(&[chunk], bs, model.query_tile());
        out.extend(model.forward(&batch).unwrap().data);
        pos += len;
    }
    assert_eq!(pos, tokens.len());
    out
}
