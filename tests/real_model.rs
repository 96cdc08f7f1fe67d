//! End to end on the real SmolLM2-135M-Instruct Q4_1 GGUF (skipped without it or without a GPU):
//! greedy determinism, agreement with llama.cpp's greedy tokens and perplexity
//! (`assets/reference/llama-cpp-smollm2.json`), and the CLI's answers to bad input.
//!
//! One engine is shared by the tests of this file (loading it takes seconds on lavapipe); it is
//! sized for perplexity at -c 512, which every other test here fits in.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock};

use common::llama_cpp::Tolerance;
use kvrun::engine::{Engine, EngineConfig, GenerateRequest, PerplexityOptions};
use kvrun::kernels::KernelFamily;
use serde_json::Value;

/// The context the shared engine is loaded with: llama.cpp's `-c 512` perplexity setting.
const CTX: usize = 512;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The shared engine (kernels this adapter selects), or `None` (with a printed reason) without
/// the model or a GPU.
fn engine(test: &str) -> Option<MutexGuard<'static, Engine>> {
    static ENGINE: OnceLock<Option<Mutex<Engine>>> = OnceLock::new();
    shared_engine(test, &ENGINE, KernelFamily::Auto)
}

/// The same with the discrete-GPU kernel variants forced (workgroup attention, tiled linear),
/// so that they run end to end on a CPU adapter too.
fn engine_gpu_kernels(test: &str) -> Option<MutexGuard<'static, Engine>> {
    static ENGINE: OnceLock<Option<Mutex<Engine>>> = OnceLock::new();
    shared_engine(test, &ENGINE, KernelFamily::Gpu)
}

fn shared_engine(
    test: &str,
    cell: &'static OnceLock<Option<Mutex<Engine>>>,
    family: KernelFamily,
) -> Option<MutexGuard<'static, Engine>> {
    let model = common::real_model(test)?;
    let engine = cell.get_or_init(|| {
        let mut cfg = EngineConfig::new(model);
        cfg.kernel_family = family;
        cfg.max_model_len = Some(CTX);
        cfg.max_num_batched_tokens = CTX;
        cfg.max_logit_rows = Some(CTX);
        match Engine::load(&cfg) {
            Ok(engine) => {
                eprintln!("real model on {}", engine.gpu().info.name);
                Some(Mutex::new(engine))
            }
            // Only a missing GPU is a reason to skip; anything else is a failure.
            Err(kvrun::engine::EngineError::Gpu(e)) => {
                assert!(!common::no_skip(), "no GPU ({e}) and KVRUN_NO_SKIP is set");
                eprintln!("SKIPPING real-model GPU tests: {e}");
                None
            }
            Err(e) => panic!("loading the real model failed: {e}"),
        }
    });
    let engine = engine.as_ref()?;
    // A failed test poisons the lock; the engine itself is still usable.
    Some(engine.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
}

fn reference() -> Value {
    let text = std::fs::read_to_string(repo("assets/reference/llama-cpp-smollm2.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Greedy tokens for a raw prompt (no chat template), EOS ignored so the count is exact.
fn greedy(engine: &mut Engine, prompt: &[u32], max_tokens: usize) -> (Vec<u32>, String) {
    let mut req = GenerateRequest::new(prompt.to_vec(), max_tokens);
    assert_eq!(req.params.temperature, 0.0, "GenerateRequest::new is greedy");
    req.ignore_eos = true;
    let out = engine.generate(&req, |_| {}).unwrap();
    (out.tokens, out.text)
}

#[test]
fn greedy_decoding_is_deterministic() {
    let Some(mut engine) = engine("greedy_decoding_is_deterministic") else {
        return;
    };
    let prompt = engine.tokenizer().encode("The capital of France is", true).unwrap();
    let (first, text) = greedy(&mut engine, &prompt, 8);
    let (second, _) = greedy(&mut engine, &prompt, 8);
    assert_eq!(first.len(), 8);
    assert_eq!(first, second, "two greedy runs of the same prompt differ");
    assert!(text.contains("Paris"), "{text:?}");
}

/// kvrun vs llama.cpp's CPU build on the same Q4_1 weights, teacher-forced on llama.cpp's 16
/// tokens of each prompt (`common::llama_cpp`). Measured over the 5 × 16 steps: |Δlogit| at
/// most 0.89, |Δmargin| at most 0.48 (both kernel families); llama.cpp's CPU build rounds the
/// activations to 8 bits for its Q4_1 dot products, kvrun keeps f32. The bounds leave ~20 % of
/// headroom; a real bug (a wrong RoPE pair, a missing norm, a bad block read) moves logits by
/// several units. A step whose margin in llama.cpp's run is below 0.6 is a near-tie.
const TOLERANCE: Tolerance = Tolerance { logit: 1.1, margin: 0.6 };

#[test]
fn greedy_tokens_match_llama_cpp() {
    let Some(mut engine) = engine("greedy_tokens_match_llama_cpp") else {
        return;
    };
    check_greedy(&mut engine);
}

#[test]
fn greedy_tokens_match_llama_cpp_with_gpu_kernels() {
    let Some(mut engine) = engine_gpu_kernels("greedy_tokens_match_llama_cpp_with_gpu_kernels")
    else {
        return;
    };
    check_greedy(&mut engine);
}

fn check_greedy(engine: &mut Engine) {
    let reference = reference();
    for case in reference["greedy"]["prompts"].as_array().unwrap() {
        // Raw prompt, no BOS: SmolLM2's GGUF says add_bos_token = false, as llama.cpp honours.
        let a = common::llama_cpp::check_greedy(engine, case, &TOLERANCE);
        a.report(case["prompt"].as_str().unwrap());
    }
}

/// llama-perplexity -c 512 --chunks 4 on the same text and model (f16 KV, flash attention).
const LLAMA_CPP_PPL_4_CHUNKS: f64 = 20.1899;

#[test]
fn perplexity_matches_llama_cpp() {
    let Some(mut engine) = engine("perplexity_matches_llama_cpp") else {
        return;
    };
    check_perplexity(&mut engine, 4);
}

/// The discrete-GPU kernels on one chunk only: on lavapipe they take 2.5 minutes a chunk (the
/// four chunks of the test above took 595 s), and the greedy-token test checks them closely;
/// one chunk still catches a broken kernel (hundreds of PPL) within the per-chunk 2 % bound.
#[test]
fn perplexity_matches_llama_cpp_with_gpu_kernels() {
    let Some(mut engine) = engine_gpu_kernels("perplexity_matches_llama_cpp_with_gpu_kernels")
    else {
        return;
    };
    check_perplexity(&mut engine, 1);
}

/// Perplexity over the first `chunks` chunks (1..=4) against llama.cpp's running values.
fn check_perplexity(engine: &mut Engine, chunks: usize) {
    let reference = reference();
    let run = &reference["perplexity"]["runs"]["chunks4"];
    assert_eq!(run["ppl"].as_f64().unwrap(), LLAMA_CPP_PPL_4_CHUNKS);
    let text = std::fs::read_to_string(repo("assets/text/alice-ch1-9.txt")).unwrap();
    let opts = PerplexityOptions { ctx: CTX, max_chunks: Some(chunks) };
    let report = engine.perplexity(&text, &opts, |_, _| {}).unwrap();
    eprintln!(
        "kvrun PPL {:.4} (running {:?}) vs llama.cpp {LLAMA_CPP_PPL_4_CHUNKS} ({}), {:.1} s",
        report.ppl, report.running_ppl, run["running_ppl"], report.seconds
    );
    assert_eq!((report.chunks, report.ctx), (chunks, CTX));
    assert_eq!(report.tokens_scored, chunks * 255); // positions 256..510 of each chunk
    assert_eq!(report.kv_cache_dtype, "f16");

    // Sanity: a model that reads English scores this text near 20; a broken one (wrong RoPE
    // pairs, a transposed weight, garbage KV) scores hundreds or more.
    assert!(
        report.ppl.is_finite() && report.ppl < 30.0,
        "PPL {} is not a working model",
        report.ppl
    );

    // Within 0.25 % of llama.cpp. Both read the same quantized weights, so the difference is
    // rounding only: observed +0.045 % (20.1989 vs 20.1899), about what llama.cpp's own
    // flash-attention on/off runs differ by (0.05 %). The bound leaves 5× that for another
    // adapter's summation order (workgroup kernels, other subgroup sizes), and stays under q8_0
    // KV's 0.3 % shift, so a precision regression of that size fails here; a real bug (one wrong
    // layer) moves it by far more than 1 %. (It was 1 %, the first acceptance criterion.)
    let rel = (report.ppl - LLAMA_CPP_PPL_4_CHUNKS).abs() / LLAMA_CPP_PPL_4_CHUNKS;
    assert!(
        chunks < 4 || rel < 0.0025,
        "PPL {} vs llama.cpp {LLAMA_CPP_PPL_4_CHUNKS}: {:.3} % off",
        report.ppl,
        rel * 100.0
    );
    // After each chunk too, with a looser 2 %: the first values rest on only 255 tokens, so
    // rounding differences average out less (observed up to 0.7 % after chunk 1).
    for (i, (got, want)) in report.running_ppl.iter().zip(ids_f64(&run["running_ppl"])).enumerate()
    {
        let rel = (got - want).abs() / want;
        assert!(rel < 0.02, "running PPL after chunk {}: {got} vs llama.cpp {want}", i + 1);
    }
}

fn ids_f64(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

// ---- the CLI's answers to bad input ------------------------------------------------------------

fn kvrun(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvrun"))
        .args(args)
        .env_remove("KVRUN_MODEL")
        .output()
        .expect("run the kvrun binary")
}

/// Runs `kvrun ARGS`, expects a clean failure, returns stderr.
fn fails(args: &[&str]) -> String {
    let out = kvrun(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "kvrun {args:?} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!stderr.contains("panicked"), "kvrun {args:?} panicked: {stderr}");
    assert!(stderr.contains("error: "), "kvrun {args:?}: {stderr}");
    stderr
}

#[test]
fn prompt_longer_than_the_context_names_c() {
    let Some(model) = common::real_model("prompt_longer_than_the_context_names_c") else {
        return;
    };
    if common::gpu().is_none() {
        return;
    }
    let prompt = "the cat sat on the mat and ".repeat(8);
    let err =
        fails(&["generate", "-m", model.to_str().unwrap(), "--raw", "-c", "16", "-p", &prompt]);
    assert!(err.contains("-c/--max-model-len") && err.contains("context is 16 tokens"), "{err}");
}

#[test]
fn kv_budget_below_one_block_is_refused() {
    let Some(model) = common::real_model("kv_budget_below_one_block_is_refused") else {
        return;
    };
    let model = model.to_str().unwrap();
    let err = fails(&["generate", "-m", model, "--kv-cache-memory", "1KiB", "-p", "Hi"]);
    assert!(err.contains("--kv-cache-memory") && err.contains("holds no block"), "{err}");
}

#[test]
fn missing_model_file_is_named() {
    let err = fails(&["generate", "-m", "/nonexistent.gguf", "-p", "Hi"]);
    assert!(err.contains("/nonexistent.gguf") && err.contains("check the path"), "{err}");
}

/// Cut copies of the GGUF: inside the header, inside the metadata, at 1 MB (inside the
/// tokenizer's merges array) and at 50 MB (inside the tensor data).
#[test]
fn truncated_gguf_says_so() {
    let Some(model) = common::real_model("truncated_gguf_says_so") else {
        return;
    };
    let bytes = std::fs::read(&model).unwrap();
    let path = std::env::temp_dir().join(format!("kvrun-truncated-{}.gguf", std::process::id()));
    for cut in [6, 1000, 1 << 20, 50_000_000] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let err = fails(&["generate", "-m", path.to_str().unwrap(), "-p", "Hi"]);
        // At 1 MB the merges array claims more entries than bytes remain, which the loader
        // reports as "corrupt or incomplete" rather than "truncated".
        assert!(err.contains("truncated") || err.contains("incomplete"), "cut at {cut}: {err}");
        assert!(err.contains("re-download"), "cut at {cut}: {err}");
        if cut == 50_000_000 {
            assert!(err.contains("file is truncated: tensor 'blk."), "cut at {cut}: {err}");
        }
    }
    std::fs::remove_file(&path).unwrap();
}

/// Quantized KV on the real model: perplexity over one 128-token chunk (prefill tiles reading
/// the blocks before theirs quantized) stays near f16's. Measured 2026-12-01: f16 37.92,
/// int8 38.00 (+0.2 %), int4 38.92 (+2.6 %); bounds +2 % and +8 %. A broken quantized kernel
/// gives hundreds or millions (a lane prefill that dropped int4's K scales and minimums from
/// its scores gave 6.4e7).
#[test]
fn quantized_kv_perplexity_stays_near_f16() {
    use kvrun::quant::{KvCacheSpec, KvFormat};
    let Some(model) = common::real_model("quantized_kv_perplexity_stays_near_f16") else {
        return;
    };
    let text = std::fs::read_to_string(repo("assets/text/alice-ch1-9.txt")).unwrap();
    let ppl = |format: KvFormat| -> f64 {
        let mut cfg = EngineConfig::new(model.clone());
        cfg.max_model_len = Some(128);
        cfg.max_num_batched_tokens = 128;
        cfg.max_logit_rows = Some(128);
        cfg.kv_cache = KvCacheSpec::new(format, None, None, false).unwrap();
        let mut engine = match Engine::load(&cfg) {
            Ok(engine) => engine,
            Err(kvrun::engine::EngineError::Gpu(e)) => {
                assert!(!common::no_skip(), "no GPU ({e}) and KVRUN_NO_SKIP is set");
                return f64::NAN;
            }
            Err(e) => panic!("loading the real model failed: {e}"),
        };
        let opts = PerplexityOptions { ctx: 128, max_chunks: Some(1) };
        engine.perplexity(&text, &opts, |_, _| {}).unwrap().ppl
    };
    let f16 = ppl(KvFormat::F16);
    if f16.is_nan() {
        eprintln!("SKIPPING: no GPU");
        return;
    }
    for (format, bound) in [(KvFormat::Int8, 1.02), (KvFormat::Int4, 1.08)] {
        let q = ppl(format);
        eprintln!("PPL f16 {f16:.4}, {format} {q:.4}");
        assert!(q.is_finite() && q < f16 * bound, "{format}: PPL {q} against f16 {f16}");
    }
}
