//! Our GGUF tokenizers against llama.cpp's own tokenizer tests: the vocab-only GGUFs in
//! llama.cpp's `models/` folder with their `.inp` (inputs separated by
//! `\n__ggml_vocab_test__\n`) and `.out` (expected ids, one line per input, no BOS) files, as
//! `tests/test-tokenizer-0.cpp` reads them. Also: decode gives the input back, and streaming
//! detokenization gives what decode gives. The folder: `$KVRUN_LLAMA_CPP_VOCABS`, else
//! `assets/models/llama-cpp-vocabs/` (`scripts/fetch-llama-cpp-vocabs.sh`, run by `setup.sh`);
//! without it the test skips, or fails under `KVRUN_NO_SKIP=1`.

use kvrun::loader::{gguf_vocab, GgufFile};
use kvrun::output::Detokenizer;
use kvrun::tokenizer::{Tokenizer, TokenizerSource};
use std::path::{Path, PathBuf};

/// The vocabularies whose model and pre-tokenizer kvrun supports.
const VOCABS: [&str; 10] = [
    "gpt-2",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "starcoder",
    "refact",
    "mpt",
    "command-r",
    "llama-spm",
    "phi-3",
];

fn cases(dir: &Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    let mut inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    if inputs.last() == Some(&"") {
        inputs.pop();
    }
    let outputs: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert_eq!(inputs.len(), outputs.len(), "{name}: .inp/.out counts differ");
    inputs.into_iter().map(String::from).zip(outputs).collect()
}

#[test]
fn llama_cpp_tokenizer_tests() {
    // $KVRUN_LLAMA_CPP_VOCABS, else where scripts/fetch-llama-cpp-vocabs.sh (run by setup.sh)
    // puts them.
    let dir = std::env::var_os("KVRUN_LLAMA_CPP_VOCABS").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/models/llama-cpp-vocabs")
    });
    if !dir.join("ggml-vocab-llama-bpe.gguf.out").exists() {
        let no_skip = std::env::var_os("KVRUN_NO_SKIP").is_some_and(|v| !v.is_empty() && v != "0");
        assert!(
            !no_skip,
            "llama.cpp's tokenizer test data is not in {} and KVRUN_NO_SKIP is set; run \
             scripts/fetch-llama-cpp-vocabs.sh",
            dir.display()
        );
        println!("SKIPPING llama_cpp_tokenizer_tests: no test data in {}", dir.display());
        return;
    }
    let mut failures = Vec::new();
    for name in VOCABS {
        let file = GgufFile::open(&dir.join(format!("ggml-vocab-{name}.gguf"))).unwrap();
        let vocab = gguf_vocab(&file).unwrap();
        let tok = Tokenizer::from_source(TokenizerSource::Gguf(vocab)).unwrap();
        let cases = cases(&dir, name);
        let before = failures.len();
        for (text, ids) in &cases {
            check_case(name, &tok, text, ids, &mut failures);
        }
        println!("{name}: {} inputs, {} failures", cases.len(), failures.len() - before);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Ids equal llama.cpp's; decode gives the text back; streaming gives what decode gives.
fn check_case(name: &str, tok: &Tokenizer, text: &str, ids: &[u32], failures: &mut Vec<String>) {
    let ours = tok.encode(text, false).unwrap();
    if ours != ids {
        failures.push(format!("{name} {text:?}: ours {ours:?}, llama.cpp {ids:?}"));
    }
    let back = tok.decode(ids, false).unwrap();
    if back != text {
        failures.push(format!("{name}: decode of {text:?} gives {back:?}"));
    }
    let mut detok = Detokenizer::new(false);
    let mut streamed = String::new();
    for &id in ids {
        streamed.push_str(&detok.step(tok, id).unwrap());
    }
    streamed.push_str(&detok.flush(tok).unwrap());
    if streamed != back {
        failures.push(format!("{name}: streaming {text:?} gives {streamed:?}"));
    }
}
