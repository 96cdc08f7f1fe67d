//! `scripts/synth-gguf.py`, which `scripts/gpu-check.sh` uses on a GPU box that cannot be sent
//! the model files, the way that box uses it: SmolLM2's tokenizer alone (`--vocab-only`), then a
//! random-weight model of SmolLM2-135M's shape in Q4_1 from it. kvrun must load it, read the
//! weight bytes that shape and format imply in each decode step, and score text with finite
//! values (the random scales keep activations finite; near-uniform predictions, so a perplexity
//! near the vocabulary size).
//!
//! Needs python3 with `gguf` and `numpy` (scripts/setup.sh) and the real SmolLM2 GGUF (its
//! tokenizer); skips without them unless KVRUN_NO_SKIP is set.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python(args: &[&Path]) {
    let out = Command::new("python3").args(args).output().expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python3 {args:?} failed:\n{stderr}");
}

/// `kvrun ARGS` → its JSON on stdout (the test fails on a non-zero exit).
fn kvrun_json(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kvrun")).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kvrun {args:?} failed:\n{stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("kvrun {args:?}: {e}"))
}

#[test]
fn synthetic_smollm2_shape_loads_reads_its_bytes_and_scores_finite() {
    let test = "synth_gguf";
    if !common::python_with_gguf(test) {
        return;
    }
    let Some(real) = common::real_model(test) else { return };
    if common::gpu().is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kvrun-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (vocab, model) = (dir.join("vocab.gguf"), dir.join("synth.gguf"));
    let script = repo().join("scripts/synth-gguf.py");
    python(&[&script, Path::new("--vocab-only"), Path::new("--vocab"), &real, &vocab]);
    let args: [&Path; 7] = [
        &script,
        Path::new("--shape"),
        Path::new("smollm2-135m"),
        Path::new("--type"),
        Path::new("q4_1"),
        Path::new("--vocab"),
        &vocab,
    ];
    python(&[&args[..], &[model.as_path()]].concat());
    let m = model.to_string_lossy().into_owned();

    let bench = kvrun_json(&[
        "bench",
        "decode",
        "-m",
        &m,
        "--context-lengths",
        "16",
        "--decode-tokens",
        "4",
        "--no-bandwidth",
        "--json",
    ]);
    // SmolLM2-135M: hidden 576, 9 query / 3 KV heads of 64, FFN 1536, 30 layers, 49,152 tokens,
    // the LM head tied to the embedding; Q4_1 is 20 bytes a block of 32 weights.
    let (hidden, kv, ffn, layers, vocab_size) = (576u64, 192u64, 1536u64, 30u64, 49_152u64);
    let per_layer = 2 * hidden * hidden + 2 * kv * hidden + 3 * ffn * hidden;
    let weights = (layers * per_layer + vocab_size * hidden) / 32 * 20;
    let point = &bench["points"][0];
    assert_eq!(point["step_bytes"]["weights"].as_u64(), Some(weights), "{point}");

    let text = repo().join("assets/text/alice-ch1-9.txt");
    let ppl = kvrun_json(&[
        "perplexity",
        "-m",
        &m,
        "-f",
        &text.to_string_lossy(),
        "-c",
        "64",
        "--chunks",
        "1",
        "--json",
    ]);
    let ppl = ppl["ppl"].as_f64().expect("ppl");
    assert!(
        ppl.is_finite() && ppl > vocab_size as f64 / 4.0 && ppl < vocab_size as f64 * 4.0,
        "random weights should predict near-uniformly over {vocab_size} tokens: ppl {ppl}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
