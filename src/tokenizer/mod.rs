//! Text ↔ token ids: a wrapper around the `tokenizers` crate that builds from an HF
//! `tokenizer.json` or from a GGUF vocabulary, plus chat templates.
//!
//! This room takes plain data ([`TokenizerSource`]) and never imports the loader or wgpu.

mod chat;
mod gguf_bpe;
mod gguf_spm;
mod source;

pub use chat::{
    check_template_vars, ChatMessage, ChatTemplate, TemplateVars, RESERVED_TEMPLATE_VARS,
};
pub use source::{gguf_default_add_bos, GgufVocab, HfTokenizerConfig, TokenizerSource};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {message}; check that the model directory is complete")]
    Io { path: PathBuf, message: String },
    #[error("tokenizer: {0}")]
    Config(String),
    #[error(
        "GGUF tokenizer model '{0}' is not supported (kvrun builds 'gpt2' byte-level BPE and \
         'llama' SentencePiece vocabularies); use the model's HF directory with tokenizer.json \
         instead"
    )]
    UnsupportedModel(String),
    #[error("building the tokenizer failed: {0}")]
    Build(String),
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error("decoding failed: {0}")]
    Decode(String),
    #[error("{0}")]
    Template(String),
}

/// Texts of end-of-turn tokens that chat templates emit; when the vocabulary has one as a
/// special token, generation stops on it like on EOS (llama.cpp's end-of-generation set).
const TURN_ENDERS: [&str; 8] = [
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|end|>",
    "<EOT>",
];

/// A ready tokenizer: encode, decode, special ids, chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    add_bos: bool,
    /// GGUF vocabularies have no post-processor: the wrapper adds BOS/EOS itself. HF
    /// `tokenizer.json` post-processors add them inside `inner`.
    manual_specials: bool,
    add_eos: Option<u32>,
    eos_ids: Vec<u32>,
    bos_token: String,
    eos_token: String,
    chat_template: Option<String>,
    /// Where the chat template came from, for its errors (see [`Tokenizer::with_template_origin`]).
    template_origin: Option<String>,
}

impl Tokenizer {
    /// Names where the chat template came from (a file and key) in its errors.
    /// Replaces the model's chat template with `source` (`--chat-template-file`), naming
    /// `origin` in its errors.
    pub fn with_chat_template(mut self, source: String, origin: impl Into<String>) -> Self {
        self.chat_template = Some(source);
        self.template_origin = Some(origin.into());
        self
    }

    pub fn with_template_origin(mut self, origin: impl Into<String>) -> Self {
        self.template_origin = Some(origin.into());
        self
    }

    pub fn from_source(src: TokenizerSource) -> Result<Self, TokenizerError> {
        match src {
            TokenizerSource::Gguf(vocab) => Self::from_gguf(vocab),
            TokenizerSource::HfJson { tokenizer_json, config } => {
                Self::from_hf(tokenizer_json, config.unwrap_or_default())
            }
        }
    }

    fn from_gguf(v: GgufVocab) -> Result<Self, TokenizerError> {
        let inner = match v.model.as_str() {
            "gpt2" => gguf_bpe::build_bpe(&v)?,
            "llama" => gguf_spm::build_spm(&v)?,
            "gemma4" => gguf_spm::build_gemma4(&v)?,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let text_of = |id: Option<u32>| id.and_then(|i| v.tokens.get(i as usize).cloned());
        let (bos_token, eos_token) = (text_of(v.bos_token_id), text_of(v.eos_token_id));
        let mut tok = Tokenizer {
            bos_id: v.bos_token_id,
            add_bos: v.add_bos && v.bos_token_id.is_some(),
            manual_specials: true,
            add_eos: v.eos_token_id.filter(|_| v.add_eos),
            eos_ids: v.eos_token_id.into_iter().collect(),
            bos_token: bos_token.unwrap_or_default(),
            eos_token: eos_token.unwrap_or_default(),
            chat_template: v.chat_template,
            template_origin: None,
            inner,
        };
        tok.add_turn_enders();
        Ok(tok)
    }

    fn from_hf(path: PathBuf, config: HfTokenizerConfig) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| TokenizerError::Io { path: path.clone(), message: e.to_string() })?;
        let bos_id = config.bos_token.as_deref().and_then(|t| inner.token_to_id(t));
        let eos_id = config.eos_token.as_deref().and_then(|t| inner.token_to_id(t));
        // Whether the post-processor adds BOS: ask it.
        let with = inner.encode_fast("a", true).map_err(encode_err)?;
        let add_bos = bos_id.is_some() && with.get_ids().first().copied() == bos_id;
        let mut eos_ids: Vec<u32> = eos_id.into_iter().collect();
        for id in config.extra_eos_ids {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let mut tok = Tokenizer {
            inner,
            bos_id,
            add_bos,
            manual_specials: false,
            add_eos: None,
            eos_ids,
            bos_token: config.bos_token.unwrap_or_default(),
            eos_token: config.eos_token.unwrap_or_default(),
            chat_template: config.chat_template,
            template_origin: None,
        };
        tok.add_turn_enders();
        Ok(tok)
    }

    /// Adds the [`TURN_ENDERS`] that are special tokens of this vocabulary to the EOS set.
    fn add_turn_enders(&mut self) {
        for text in TURN_ENDERS {
            if let Some(id) = self.special_token_id(text) {
                if !self.eos_ids.contains(&id) {
                    self.eos_ids.push(id);
                }
            }
        }
    }

    /// The id of the special token whose text is `text` (`<|im_end|>`), if the vocabulary has
    /// one (a plain token of that text does not count).
    pub fn special_token_id(&self, text: &str) -> Option<u32> {
        let specials = self.inner.get_added_tokens_decoder();
        specials.iter().find(|(_, t)| t.special && t.content == text).map(|(&id, _)| id)
    }

    /// Token ids of `text`. With `add_special`, BOS is prepended iff the model adds one (and EOS
    /// appended iff it adds one). Special tokens written in the text (`<|im_start|>`) always
    /// become their ids.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let inner_special = add_special && !self.manual_specials;
        let enc = self.inner.encode_fast(text, inner_special).map_err(encode_err)?;
        let mut ids = Vec::with_capacity(enc.len() + 2);
        if add_special && self.manual_specials && self.add_bos {
            ids.extend(self.bos_id);
        }
        ids.extend_from_slice(enc.get_ids());
        if add_special && self.manual_specials {
            ids.extend(self.add_eos);
        }
        Ok(ids)
    }

    /// Text of `ids`; with `skip_special`, special tokens (BOS, `<|im_end|>` …) are left out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.inner.decode(ids, skip_special).map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Whether `encode(text, true)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Token ids that end generation: the EOS token, `generation_config.json`'s ids, and
    /// end-of-turn specials present in the vocabulary (`<|im_end|>`, `<|eot_id|>` …).
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Vocabulary size including added tokens.
    /// The largest token id the tokenizer can produce (added tokens included).
    pub fn max_token_id(&self) -> Option<u32> {
        self.inner.get_vocab(true).into_values().max()
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The wrapped `tokenizers` tokenizer. For GGUF vocabularies it has no post-processor:
    /// `inner().encode(text, true)` does not add BOS; [`Tokenizer::encode`] does.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The model's chat template source, if it ships one.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The model's chat template, compiled with its BOS/EOS texts; `None` if it has none.
    pub fn chat_template(&self) -> Result<Option<ChatTemplate>, TokenizerError> {
        self.chat_template
            .as_deref()
            .map(|src| {
                let origin = self.template_origin.as_deref();
                ChatTemplate::with_origin(src, &self.bos_token, &self.eos_token, origin)
            })
            .transpose()
    }
}

fn encode_err(e: tokenizers::Error) -> TokenizerError {
    TokenizerError::Encode(e.to_string())
}
