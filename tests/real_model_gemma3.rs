//! End to end on the real Gemma 3 270M Q4_K_M GGUF (skipped without it or without a GPU;
//! `KVRUN_TEST_GEMMA3_MODEL`, default `assets/models/gemma-3-270m-q4_k_m.gguf`), against
//! llama.cpp and gguf-py (`assets/reference/llama-cpp-gemma3-270m.json`): the config as read,
//! the tokenizer, greedy tokens, perplexity at -c 512, and `kvrun generate` / `kvrun chat`
//! (this GGUF is the base model: no chat template).
//!
//! At -c 512 (the sliding window) every layer is one full-attention KV group; past it (the
//! default -c) the sliding layers get their own groups.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};

use common::llama_cpp::Tolerance;
use kvrun::engine::{Engine, EngineConfig, PerplexityOptions};
use kvrun::loader::{Activation, Architecture, AttentionKind, ModelFile};
use serde_json::Value;

/// llama.cpp's `-c 512` perplexity setting, and the sliding window.
const CTX: usize = 512;
/// Tokens per step: 128 logit rows of the 262,144-token vocabulary are 128 MiB, lavapipe's
/// largest binding.
const STEP_TOKENS: usize = 128;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn reference() -> Value {
    let text = std::fs::read_to_string(repo("assets/reference/llama-cpp-gemma3-270m.json"));
    serde_json::from_str(&text.unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// The shared engine, or `None` (with a printed reason) without the model or a GPU.
fn engine(test: &str) -> Option<MutexGuard<'static, Engine>> {
    static ENGINE: OnceLock<Option<Mutex<Engine>>> = OnceLock::new();
    let model = common::real_gemma3_model(test)?;
    let engine = ENGINE.get_or_init(|| {
        let mut cfg = EngineConfig::new(model);
        cfg.max_model_len = Some(CTX);
        cfg.max_num_batched_tokens = STEP_TOKENS;
        cfg.max_logit_rows = Some(STEP_TOKENS);
        match Engine::load(&cfg) {
            Ok(engine) => Some(Mutex::new(engine)),
            Err(kvrun::engine::EngineError::Gpu(e)) => {
                assert!(!common::no_skip(), "no GPU ({e}) and KVRUN_NO_SKIP is set");
                eprintln!("SKIPPING real-model GPU tests: {e}");
                None
            }
            Err(e) => panic!("loading Gemma 3 270M failed: {e}"),
        }
    });
    let engine = engine.as_ref()?;
    Some(engine.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
}

#[test]
fn config_matches_gguf_py_and_llama_cpp() {
    let Some(path) = common::real_gemma3_model("config_matches_gguf_py_and_llama_cpp") else {
        return;
    };
    let r = &reference()["gguf_py"];
    let n = |k: &str| r[k].as_u64().unwrap() as usize;
    let c = ModelFile::open(&path).unwrap().config().clone();
    assert_eq!(c.arch, Architecture::Gemma3);
    assert_eq!(
        (c.hidden_size, c.num_layers, c.intermediate_size, c.num_heads, c.num_kv_heads),
        (
            n("embedding_length"),
            n("block_count"),
            n("feed_forward_length"),
            n("head_count"),
            n("head_count_kv")
        )
    );
    assert_eq!((c.head_dim, c.vocab_size), (n("key_length"), n("vocab_size")));
    assert_eq!(f64::from(c.rms_norm_eps), r["layer_norm_rms_epsilon"].as_f64().unwrap());
    assert!(c.tie_word_embeddings && !r["has_output_weight"].as_bool().unwrap());
    assert!(c.qk_norm && c.post_norms);
    assert_eq!(c.activation, Activation::GeluTanh);
    assert_eq!(c.embedding_scale, Some(640f32.sqrt()));
    assert_eq!(c.attention_scale, 1.0 / 16.0);
    assert_eq!(c.norm_weight_offset, 0.0, "the converter stored 1 + w already");
    let window = n("sliding_window");
    for (i, l) in c.layers.iter().enumerate() {
        // llama.cpp: no sliding_window_pattern key → pattern 6, local RoPE base 10,000
        let (kind, theta) = if i % 6 == 5 {
            (AttentionKind::Full, r["rope_freq_base"].as_f64().unwrap())
        } else {
            (AttentionKind::Sliding { window }, 10_000.0)
        };
        assert_eq!((l.attention, l.rope.theta), (kind, theta), "layer {i}");
    }
}

#[test]
fn tokenizer_matches_llama_cpp() {
    let Some(engine) = engine("tokenizer_matches_llama_cpp") else { return };
    let r = reference();
    let t = &r["tokenizer"];
    let text = std::fs::read_to_string(repo("assets/text/alice-ch1-9.txt")).unwrap();
    let got = engine.tokenizer().encode(&text, true).unwrap();
    assert_eq!(got.len(), t["count"].as_u64().unwrap() as usize, "alice token count");
    assert_eq!(got[..32], ids(&t["first_ids"])[..], "alice: first 32 ids (BOS first)");
    assert_eq!(got[got.len() - 32..], ids(&t["last_ids"])[..], "alice: last 32 ids");
    let joined = got.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let digest = sha256_hex(joined.as_bytes());
    assert_eq!(digest, t["sha256_of_ids"].as_str().unwrap(), "alice: every id");
    for case in r["greedy"]["prompts"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let got = engine.tokenizer().encode(prompt, true).unwrap();
        assert_eq!(got, ids(&case["prompt_ids"]), "{prompt:?}");
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// kvrun vs llama.cpp's CPU build on the same Q4_K_M weights, teacher-forced on llama.cpp's 16
/// tokens of each prompt (`common::llama_cpp`). Measured over the 8 × 16 steps: |Δlogit| at
/// most 0.91, |Δmargin| at most 0.86 (llama.cpp's CPU build rounds the activations to 8 bits
/// for its K-quant dot products; kvrun keeps f32). The bounds leave ~20 % of headroom; a real
/// bug (a wrong RoPE base, a window off by one, a missing norm) moves logits by several units.
/// A step whose margin in llama.cpp's run is below 1.0 is a near-tie.
const TOLERANCE: Tolerance = Tolerance { logit: 1.1, margin: 1.0 };

#[test]
fn greedy_tokens_match_llama_cpp() {
    let Some(mut engine) = engine("greedy_tokens_match_llama_cpp") else { return };
    for case in reference()["greedy"]["prompts"].as_array().unwrap() {
        let a = common::llama_cpp::check_greedy(&mut engine, case, &TOLERANCE);
        a.report(case["prompt"].as_str().unwrap());
    }
}

/// Chunks scored (of 59): about 42 s each on lavapipe with 2 vCPUs (166 s for 4).
const PPL_CHUNKS: usize = 4;

#[test]
fn perplexity_matches_llama_cpp() {
    let Some(mut engine) = engine("perplexity_matches_llama_cpp") else { return };
    let r = reference();
    let run = &r["perplexity"]["runs"]["chunks4"];
    let want: Vec<f64> =
        run["running_ppl"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    let text = std::fs::read_to_string(repo("assets/text/alice-ch1-9.txt")).unwrap();
    let opts = PerplexityOptions { ctx: CTX, max_chunks: Some(PPL_CHUNKS) };
    let report = engine.perplexity(&text, &opts, |_, _| {}).unwrap();
    eprintln!(
        "kvrun PPL {:.4} (running {:?}) vs llama.cpp running {want:?}, {:.1} s",
        report.ppl, report.running_ppl, report.seconds
    );
    assert_eq!(report.tokens_scored, PPL_CHUNKS * 255);
    // Same quantized weights on both sides: the difference is rounding (llama.cpp's 8-bit
    // activations in its K-quant dot products, flash attention): observed 17.7102 vs 17.7676
    // after 4 chunks (−0.32 %), per chunk within 0.6 %. 1 % after 4 chunks; a broken
    // piece (RoPE base, a missing norm) moves it by far more. 2 % per chunk: the early values
    // rest on 255 tokens each.
    for (i, (got, want)) in report.running_ppl.iter().zip(&want).enumerate() {
        let rel = (got - want).abs() / want;
        let bound = if i + 1 == PPL_CHUNKS { 0.01 } else { 0.02 };
        assert!(rel < bound, "running PPL after chunk {}: {got} vs llama.cpp {want}", i + 1);
    }
}

/// The GPU holds the file's weight bytes: a decode step's linear layers (every 2-D tensor,
/// the tied token embedding as the LM head) read within 1 % of what the GGUF's tensors take
/// (Q4_K, Q6_K, Q5_0 and Q8_0 blocks laid out at their file size; only region padding added).
#[test]
fn linear_weights_take_the_files_bytes() {
    let Some(engine) = engine("linear_weights_take_the_files_bytes") else { return };
    let model = common::real_gemma3_model("linear_weights_take_the_files_bytes").unwrap();
    let file = ModelFile::open(&model).unwrap();
    let tensors = file.gguf().unwrap().tensors();
    let matrices: u64 =
        tensors.iter().filter(|t| t.dims.len() == 2).map(|t| t.n_bytes as u64).sum();
    let gpu = engine.model().linear_weight_bytes();
    eprintln!("linear weights on the GPU {gpu} bytes, the GGUF's matrices {matrices}");
    assert!(gpu >= matrices && gpu as f64 <= matrices as f64 * 1.01, "{gpu} vs {matrices}");
}

/// `kvrun perplexity -c 2048` with its default flags: 512-token steps whose 1,023 scored rows
/// of logits (262,144 floats each) fit no 128 MiB binding, so the engine takes 128 logit rows
/// a step (`ResolvedConfig::fit_logit_rows`) and the scheduler cuts the chunk to them; past the
/// window the sliding layers slide. Against llama.cpp's first chunk at -c 2048 within 2 %, the
/// per-chunk bound above (observed 14.5077 against 14.6181, −0.76 %; 27 s on lavapipe).
#[test]
fn perplexity_at_2048_with_default_flags() {
    let Some(model) = common::real_gemma3_model("perplexity_at_2048_with_default_flags") else {
        return;
    };
    let want =
        reference()["perplexity"]["runs"]["c2048_chunks2"]["running_ppl"][0].as_f64().unwrap();
    let text = repo("assets/text/alice-ch1-9.txt");
    let args = ["perplexity", "-m", model.to_str().unwrap(), "-f", text.to_str().unwrap()];
    let out = kvrun(&[&args[..], &["-c", "2048", "--chunks", "1", "--json"]].concat(), "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "perplexity -c 2048 failed: {stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let got = report["ppl"].as_f64().unwrap();
    eprintln!("kvrun PPL at -c 2048 {got:.4} vs llama.cpp {want}");
    assert_eq!(report["tokens_scored"].as_u64(), Some(1023));
    assert!((got - want).abs() / want < 0.02, "PPL {got} vs llama.cpp {want}");
}

fn kvrun(args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvrun"))
        .args(args)
        .env_remove("KVRUN_MODEL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the kvrun binary");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// `kvrun generate --raw` (BOS added) answers a plain question; this GGUF is the base model and
/// carries no chat template, so `kvrun chat` and templated `generate` refuse it, naming `--raw`.
#[test]
fn generate_answers_and_chat_names_the_missing_template() {
    let Some(model) =
        common::real_gemma3_model("generate_answers_and_chat_names_the_missing_template")
    else {
        return;
    };
    if common::gpu().is_none() {
        return;
    }
    let m = model.to_str().unwrap();
    let q = "Question: What is the capital of France?\nAnswer:";
    let out = kvrun(&["generate", "-m", m, "-c", "512", "--raw", "-n", "8", "-p", q], "");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("Paris"), "generate: {text:?}");
    let out = kvrun(&["chat", "-m", m, "-c", "512", "-n", "8"], "What is the capital of France?\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--raw"), "chat: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // past the window (the default -c 8192): the sliding layers run in their own KV groups
    let out = kvrun(&["generate", "-m", m, "--raw", "-n", "8", "-p", q], "");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("Paris"), "generate at -c 8192: {text:?}");
}
