//! The fuzz entry points, one per target: each takes arbitrary bytes and must return without
//! panicking (errors are fine). Shared by the libFuzzer targets (`fuzz/fuzz_targets/*.rs`) and
//! by the stable regression test `tests/fuzz_regressions.rs`, which replays the committed seeds
//! and crash inputs through the same functions.

use std::path::{Path, PathBuf};

use kvrun::loader::{gguf_vocab, GgufFile, ModelConfig, ModelFile, TensorView};
use kvrun::tokenizer::{ChatMessage, ChatTemplate, GgufVocab, Tokenizer, TokenizerSource};

/// Tensors larger than this are not dequantized (the point is the parser, not the memory).
const MAX_DEQUANT_ELEMENTS: usize = 1 << 20;

/// GGUF reader on arbitrary bytes: header, metadata, tensor infos, then everything a loaded
/// file is asked for (model config, tensor bytes and dequantization, the embedded tokenizer).
pub fn gguf(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else { return };
    let _ = ModelConfig::from_gguf(&file);
    for info in file.tensors() {
        let view = TensorView {
            name: info.name.clone(),
            dtype: info.ggml_type,
            shape: info.dims.iter().rev().copied().collect(),
            data: file.tensor_data(info),
        };
        dequantize_if_small(&view);
    }
    if let Ok(vocab) = gguf_vocab(&file) {
        tokenizer_round_trip(vocab, "Hello world! 123 <s>");
    }
}

/// Dequantizes `view` when its element count (checked for overflow) is at most
/// `MAX_DEQUANT_ELEMENTS`, so a fuzzed shape cannot ask for gigabytes.
fn dequantize_if_small(view: &TensorView) {
    let elements = view.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if elements.is_some_and(|n| n <= MAX_DEQUANT_ELEMENTS) {
        let _ = view.to_f32();
    }
}

/// An HF model directory: `[config_len: u16 LE][config.json][model.safetensors]` written into a
/// per-process temporary directory, then `ModelFile::open` and every tensor read back.
pub fn hf_dir(data: &[u8]) {
    let (config, weights) = match data {
        [a, b, rest @ ..] => {
            let n = (u16::from_le_bytes([*a, *b]) as usize).min(rest.len());
            rest.split_at(n)
        }
        _ => (data, &[][..]),
    };
    let dir = scratch_dir("hf");
    std::fs::write(dir.join("config.json"), config).unwrap();
    std::fs::write(dir.join("model.safetensors"), weights).unwrap();
    let Ok(model) = ModelFile::open(&dir) else { return };
    let _ = model.weight_bytes();
    for name in model.tensor_names() {
        if let Ok(view) = model.tensor(name) {
            dequantize_if_small(&view);
        }
    }
    let _ = model.tokenizer_source();
}

/// The tokenizer built from GGUF vocabulary metadata, without a GGUF around it:
/// `[model][pre][flags][bos][eos]` then sections separated by `\x01`: tokens (`\n`-separated),
/// merges (`\n`-separated), token types (one byte each, mod 8), text to encode.
pub fn gguf_tokenizer(data: &[u8]) {
    let [model, pre, flags, bos, eos, rest @ ..] = data else { return };
    let model = ["gpt2", "llama", "bert"][*model as usize % 3].to_string();
    let pre = [None, Some("smollm"), Some("llama-bpe"), Some("qwen2"), Some("gpt-2"), Some("x")]
        [*pre as usize % 6]
        .map(str::to_string);
    let rest = String::from_utf8_lossy(rest);
    let mut parts = rest.split('\x01');
    let tokens: Vec<String> = parts.next().unwrap_or("").split('\n').map(str::to_string).collect();
    let merges: Vec<String> = match parts.next() {
        Some(m) if !m.is_empty() => m.split('\n').map(str::to_string).collect(),
        _ => Vec::new(),
    };
    let types = parts.next().unwrap_or("").as_bytes();
    let token_types =
        (0..tokens.len()).map(|i| types.get(i).map_or(1, |t| i32::from(*t % 8))).collect();
    let text = parts.next().unwrap_or("Hello world! 123");
    let scores = (0..tokens.len()).map(|i| -(i as f32)).collect();
    let vocab = GgufVocab {
        model,
        pre,
        tokens,
        token_types,
        merges,
        scores,
        bos_token_id: (flags & 1 != 0).then_some(u32::from(*bos)),
        eos_token_id: (flags & 2 != 0).then_some(u32::from(*eos)),
        add_bos: flags & 4 != 0,
        add_eos: flags & 8 != 0,
        add_space_prefix: flags & 16 != 0,
        chat_template: None,
    };
    tokenizer_round_trip(vocab, text);
}

/// A chat template: the template source up to the first `\0`, then messages separated by
/// `\0`, each `role\x1fcontent` (or just content, roles alternating user/assistant).
pub fn chat_template(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let source = parts.next().unwrap_or("");
    let Ok(template) = ChatTemplate::new(source, "<s>", "</s>") else { return };
    let messages: Vec<ChatMessage> = parts
        .enumerate()
        .map(|(i, m)| match m.split_once('\x1f') {
            Some((role, content)) => ChatMessage::new(role, content),
            None => ChatMessage::new(["user", "assistant"][i % 2], m),
        })
        .collect();
    let _ = template.render(&messages, data.len().is_multiple_of(2));
}

fn tokenizer_round_trip(vocab: GgufVocab, text: &str) {
    let Ok(tok) = Tokenizer::from_source(TokenizerSource::Gguf(vocab)) else { return };
    if let Ok(ids) = tok.encode(text, true) {
        let _ = tok.decode(&ids, false);
        let _ = tok.decode(&ids, true);
    }
    let n = tok.vocab_size() as u32;
    let _ = tok.decode(&[0, n.saturating_sub(1), n, n + 7], false);
    let _ = tok.chat_template();
}

/// A directory private to this process (fuzzers run one input at a time per process); for the
/// regression test (`tests/fuzz_regressions.rs`, built by cargo test) cargo's temp folder inside
/// `target/`, so test runs leave nothing in the system's temp dir.
fn scratch_dir(kind: &str) -> PathBuf {
    let dir = match option_env!("CARGO_TARGET_TMPDIR") {
        Some(tmp) => Path::new(tmp).join(format!("fuzz-{kind}")),
        None => std::env::temp_dir().join(format!("kvrun-fuzz-{kind}-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
