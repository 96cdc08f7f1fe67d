//! Where a tokenizer comes from, as plain data: an HF `tokenizer.json` (+ `tokenizer_config.json`)
//! or the vocabulary embedded in a GGUF file. The loader fills these in; this room never reads
//! model files itself.

use super::TokenizerError;
use serde::Deserialize;
use std::path::PathBuf;

/// A tokenizer as a GGUF file describes it (`tokenizer.ggml.*` keys).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer profile (`smollm`, `llama-bpe`, `qwen2` …).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// Per token: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Vec<i32>,
    /// `"left right"` pairs, highest priority first.
    pub merges: Vec<String>,
    pub scores: Vec<f32>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    /// Resolved: the file's `tokenizer.ggml.add_bos_token`, else [`gguf_default_add_bos`].
    pub add_bos: bool,
    pub add_eos: bool,
    /// SentencePiece: prepend `▁` to the text (`tokenizer.ggml.add_space_prefix`, default true
    /// for `llama` vocabularies as in llama.cpp).
    pub add_space_prefix: bool,
    /// `tokenizer.chat_template`, if the file has one.
    pub chat_template: Option<String>,
}

/// llama.cpp's default for `add_bos` when a GGUF does not say (`llama-vocab.cpp`): SentencePiece
/// vocabularies add BOS, and so do a few BPE pre-tokenizer profiles (Llama 3 family, tekken,
/// chameleon); other BPE vocabularies do not.
pub fn gguf_default_add_bos(model: &str, pre: Option<&str>) -> bool {
    match model {
        "llama" | "gemma4" => true,
        "gpt2" => matches!(
            pre,
            Some(
                "llama3"
                    | "llama-v3"
                    | "llama-bpe"
                    | "falcon3"
                    | "falcon-h1"
                    | "pixtral"
                    | "midm-2.0"
                    | "lfm2"
                    | "tekken"
                    | "chameleon"
            )
        ),
        _ => false,
    }
}

/// What `tokenizer_config.json` (and friends) say beyond `tokenizer.json`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HfTokenizerConfig {
    /// The default chat template (from `chat_template`, a string or a list of
    /// `{name, template}`; or a separate `chat_template.jinja`).
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// Extra end-of-sequence ids (`generation_config.json` / `config.json` `eos_token_id`).
    pub extra_eos_ids: Vec<u32>,
}

/// A special-token field: a plain string or an `AddedToken` object with `content`.
#[derive(Deserialize)]
#[serde(untagged)]
enum TokenField {
    Text(String),
    Added { content: String },
}

/// `chat_template`: one template, or named ones.
#[derive(Deserialize)]
#[serde(untagged)]
enum TemplateField {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

#[derive(Deserialize)]
struct TokenizerConfigJson {
    chat_template: Option<TemplateField>,
    bos_token: Option<TokenField>,
    eos_token: Option<TokenField>,
}

impl TokenField {
    fn into_content(self) -> String {
        match self {
            TokenField::Text(s) | TokenField::Added { content: s } => s,
        }
    }
}

impl HfTokenizerConfig {
    /// Parse `tokenizer_config.json`. Of several named templates the one named `default` is
    /// used, else the first.
    pub fn from_json(json: &str) -> Result<Self, TokenizerError> {
        let c: TokenizerConfigJson = serde_json::from_str(json).map_err(|e| {
            TokenizerError::Config(format!(
                "tokenizer_config.json is not valid ({e}); re-download it with the model"
            ))
        })?;
        let chat_template = c.chat_template.and_then(|t| match t {
            TemplateField::One(s) => Some(s),
            TemplateField::Named(list) => {
                let pick = list.iter().position(|t| t.name == "default").unwrap_or(0);
                list.into_iter().nth(pick).map(|t| t.template)
            }
        });
        Ok(HfTokenizerConfig {
            chat_template,
            bos_token: c.bos_token.map(TokenField::into_content),
            eos_token: c.eos_token.map(TokenField::into_content),
            extra_eos_ids: Vec::new(),
        })
    }
}

/// Where to build a [`super::Tokenizer`] from.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenizerSource {
    /// An HF `tokenizer.json` (authoritative when present), with its config files.
    HfJson { tokenizer_json: PathBuf, config: Option<HfTokenizerConfig> },
    /// The vocabulary embedded in a GGUF file.
    Gguf(GgufVocab),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_config_variants() {
        let c = HfTokenizerConfig::from_json(
            r#"{"chat_template": "{{ x }}", "bos_token": "<s>",
                "eos_token": {"content": "</s>", "lstrip": false}, "other": 1}"#,
        )
        .unwrap();
        assert_eq!(c.chat_template.as_deref(), Some("{{ x }}"));
        assert_eq!(c.bos_token.as_deref(), Some("<s>"));
        assert_eq!(c.eos_token.as_deref(), Some("</s>"));

        let c = HfTokenizerConfig::from_json(
            r#"{"chat_template": [{"name": "tool_use", "template": "T"},
                                  {"name": "default", "template": "D"}], "bos_token": null}"#,
        )
        .unwrap();
        assert_eq!(c.chat_template.as_deref(), Some("D"));
        assert_eq!(c.bos_token, None);
        assert!(HfTokenizerConfig::from_json("[1]").is_err());
    }

    #[test]
    fn add_bos_defaults_follow_llama_cpp() {
        assert!(gguf_default_add_bos("llama", None));
        assert!(gguf_default_add_bos("gpt2", Some("llama-bpe")));
        assert!(!gguf_default_add_bos("gpt2", Some("smollm")));
        assert!(!gguf_default_add_bos("gpt2", Some("qwen2")));
    }
}
