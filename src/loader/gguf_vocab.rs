//! The `tokenizer.ggml.*` keys of a GGUF file → [`GgufVocab`] for the tokenizer room.

use super::error::LoadError;
use super::gguf::GgufFile;
use crate::tokenizer::{gguf_default_add_bos, GgufVocab};

/// The tokenizer described by a GGUF file's `tokenizer.ggml.*` keys (also for vocab-only files
/// that have no model config).
pub fn gguf_vocab(file: &GgufFile) -> Result<GgufVocab, LoadError> {
    let missing = |key: &str| {
        LoadError::config(format!(
            "GGUF key {key} is missing or malformed, so the file has no usable tokenizer; use a \
             GGUF converted with its tokenizer, or the model's HF directory"
        ))
    };
    let model = file
        .get_str("tokenizer.ggml.model")
        .ok_or_else(|| missing("tokenizer.ggml.model"))?
        .to_string();
    let pre = file.get_str("tokenizer.ggml.pre").map(str::to_string);
    let tokens: Vec<String> = file
        .get_str_array("tokenizer.ggml.tokens")
        .ok_or_else(|| missing("tokenizer.ggml.tokens"))?
        .into_iter()
        .map(str::to_string)
        .collect();
    let token_types = match file.get("tokenizer.ggml.token_type") {
        None => vec![1; tokens.len()],
        Some(_) => file
            .get_i32_array("tokenizer.ggml.token_type")
            .filter(|t| t.len() == tokens.len())
            .ok_or_else(|| missing("tokenizer.ggml.token_type"))?,
    };
    let merges = match file.get("tokenizer.ggml.merges") {
        None => Vec::new(),
        Some(_) => file
            .get_str_array("tokenizer.ggml.merges")
            .ok_or_else(|| missing("tokenizer.ggml.merges"))?
            .into_iter()
            .map(str::to_string)
            .collect(),
    };
    let scores = file.get_f32_array("tokenizer.ggml.scores").unwrap_or_default();
    let bos_token_id = token_id(file, "tokenizer.ggml.bos_token_id", tokens.len())?;
    let eos_token_id = token_id(file, "tokenizer.ggml.eos_token_id", tokens.len())?;
    // llama.cpp overrides a Gemma 4 file's add_bos_token = false to true
    let add_bos = model == "gemma4"
        || file
            .get_bool("tokenizer.ggml.add_bos_token")
            .unwrap_or_else(|| gguf_default_add_bos(&model, pre.as_deref()));
    let add_eos = file.get_bool("tokenizer.ggml.add_eos_token").unwrap_or(false);
    let add_space_prefix =
        file.get_bool("tokenizer.ggml.add_space_prefix").unwrap_or(model == "llama");
    Ok(GgufVocab {
        model,
        pre,
        tokens,
        token_types,
        merges,
        scores,
        bos_token_id,
        eos_token_id,
        add_bos,
        add_eos,
        add_space_prefix,
        chat_template: file.get_str("tokenizer.chat_template").map(str::to_string),
    })
}

/// An optional token-id key, checked against the vocabulary size.
fn token_id(file: &GgufFile, key: &str, n_tokens: usize) -> Result<Option<u32>, LoadError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u32() {
            Some(id) if (id as usize) < n_tokens => Ok(Some(id)),
            _ => Err(LoadError::config(format!(
                "GGUF key {key} = {v:?} is not a token id below the vocabulary size \
                 {n_tokens}; the file is corrupt, re-convert it"
            ))),
        },
    }
}
