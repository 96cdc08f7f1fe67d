//! Replays the fuzz inputs committed under `fuzz/` through the fuzz targets' own entry points
//! (`fuzz/entries.rs`), on stable and without libFuzzer: every seed (`fuzz/corpus/<target>/
//! seed-*`) and every input a fuzzer once crashed on (`fuzz/regressions/<target>/*`) must return
//! without panicking. How to fuzz: `scripts/fuzz-smoke.sh`.

#[path = "../fuzz/entries.rs"]
mod entries;

use std::path::{Path, PathBuf};

/// The committed inputs of one target: seeds and past crashes.
fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for dir in [root.join("corpus").join(target), root.join("regressions").join(target)] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            let is_seed = path.file_name().unwrap().to_string_lossy().starts_with("seed-");
            if path.is_file() && (is_seed || dir.ends_with(Path::new("regressions").join(target))) {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn replay(target: &str, entry: fn(&[u8])) {
    let files = inputs(target);
    assert!(!files.is_empty(), "no committed inputs for fuzz target {target}");
    for path in files {
        let data = std::fs::read(&path).unwrap();
        eprintln!("{target}: {}", path.display());
        entry(&data);
    }
}

#[test]
fn gguf_inputs() {
    replay("gguf", entries::gguf);
}

#[test]
fn hf_dir_inputs() {
    replay("hf_dir", entries::hf_dir);
}

#[test]
fn gguf_tokenizer_inputs() {
    replay("gguf_tokenizer", entries::gguf_tokenizer);
}

#[test]
fn chat_template_inputs() {
    replay("chat_template", entries::chat_template);
}
