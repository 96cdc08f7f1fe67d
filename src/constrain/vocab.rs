//! kvrun's vocabulary as llguidance sees it: every token id's bytes (a trie over them) and a
//! byte tokenizer, built from the model's own `tokenizers` tokenizer — a GGUF vocabulary's or an
//! HF `tokenizer.json`'s alike.
//!
//! A token's bytes come from how its decoder writes it: byte-level BPE (GPT-2's byte → char
//! table: SmolLM2, Llama 3, Qwen) maps each char back to its byte; SentencePiece with byte
//! fallback (Gemma, Llama 2, Mistral) turns `<0xXX>` into that byte and the space marker (`▁`)
//! into a space. Special tokens are written as llguidance's marker byte then their text, so no
//! grammar can emit them as text.

use std::collections::HashMap;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::metaspace::PrependScheme;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// How the tokenizer's decoder writes bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ByteForm {
    /// GPT-2's byte-level alphabet.
    ByteLevel,
    /// Token text as is, `<0xXX>` byte tokens, `space` standing for ' '.
    Fallback { space: char },
}

/// GPT-2's table: the char byte-level BPE writes for each byte.
fn byte_level_chars() -> HashMap<char, u8> {
    let self_mapped =
        |c: char| matches!(c, '!'..='~' | '\u{00A1}'..='\u{00AC}' | '\u{00AE}'..='\u{00FF}');
    let mut next = 0x100u32;
    let mut map = HashMap::with_capacity(256);
    for byte in 0..=255u8 {
        let c = byte as char;
        if self_mapped(c) {
            map.insert(c, byte);
        } else {
            map.insert(char::from_u32(next).expect("below the surrogates"), byte);
            next += 1;
        }
    }
    map
}

fn byte_form(decoder: Option<&DecoderWrapper>) -> Option<ByteForm> {
    fn walk(d: &DecoderWrapper, byte_level: &mut bool, fallback: &mut bool, space: &mut char) {
        match d {
            DecoderWrapper::ByteLevel(_) => *byte_level = true,
            DecoderWrapper::ByteFallback(_) => *fallback = true,
            DecoderWrapper::Metaspace(m) => {
                *fallback = true;
                *space = m.get_replacement();
            }
            DecoderWrapper::Replace(r) if r.content == " " => {
                // the pattern is private; its serialized form names it
                if let Ok(v) = serde_json::to_value(r) {
                    let mut chars = v["pattern"]["String"].as_str().unwrap_or("").chars();
                    if let (Some(c), None) = (chars.next(), chars.next()) {
                        *space = c;
                    }
                }
            }
            DecoderWrapper::Sequence(seq) => {
                for d in seq.get_decoders() {
                    walk(d, byte_level, fallback, space);
                }
            }
            _ => {}
        }
    }
    let (mut byte_level, mut fallback, mut space) = (false, false, '\u{2581}');
    walk(decoder?, &mut byte_level, &mut fallback, &mut space);
    if byte_level {
        Some(ByteForm::ByteLevel)
    } else if fallback {
        Some(ByteForm::Fallback { space })
    } else {
        None
    }
}

/// The bytes of every token id below `n_vocab` (the model's logit rows: ids past the
/// tokenizer's vocabulary are special placeholders no grammar allows). Errors when the
/// tokenizer's decoder is neither byte-level nor byte-fallback (WordPiece, say).
pub fn token_bytes(tok: &tokenizers::Tokenizer, n_vocab: usize) -> Result<Vec<Vec<u8>>, String> {
    let form = byte_form(tok.get_decoder()).ok_or_else(|| {
        "this tokenizer's decoder is neither byte-level BPE nor SentencePiece with byte \
         fallback, so its tokens' bytes are unknown and structured outputs cannot constrain it"
            .to_string()
    })?;
    let chars = byte_level_chars();
    let added = tok.get_added_tokens_decoder();
    let special = |text: &str| {
        let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        b.extend_from_slice(text.as_bytes());
        b
    };
    let mut out = Vec::with_capacity(n_vocab);
    for id in 0..n_vocab as u32 {
        let bytes = match (added.get(&id), tok.id_to_token(id)) {
            (Some(a), _) if a.special => special(&a.content),
            (Some(a), _) => a.content.clone().into_bytes(),
            (None, Some(text)) => match form {
                ByteForm::ByteLevel => {
                    // a token the table cannot write (none in a well-formed vocabulary) is
                    // left empty: never allowed
                    text.chars()
                        .map(|c| chars.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()
                        .unwrap_or_default()
                }
                ByteForm::Fallback { space } => match fallback_byte(&text) {
                    Some(b) => vec![b],
                    None => text.replace(space, " ").into_bytes(),
                },
            },
            (None, None) => special(&format!("<[{id}]>")),
        };
        out.push(bytes);
    }
    Ok(out)
}

/// `<0xXX>`'s byte.
fn fallback_byte(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

/// The vocabulary llguidance compiles grammars against: the trie of token bytes and a tokenizer
/// for byte strings (the model's, with no space prepended to a piece).
pub struct Vocab {
    trie: TokTrie,
    encoder: tokenizers::Tokenizer,
}

impl Vocab {
    /// `eos`: the ids that end a sequence (the first is the trie's end-of-sequence token).
    pub fn new(tok: &tokenizers::Tokenizer, n_vocab: usize, eos: &[u32]) -> Result<Vocab, String> {
        let mut bytes = token_bytes(tok, n_vocab)?;
        let mut eos: Vec<TokenId> =
            eos.iter().copied().filter(|&e| (e as usize) < n_vocab).collect();
        if eos.is_empty() {
            // a vocabulary without end-of-sequence: a placeholder past the logit rows, which
            // the mask never lets the sampler pick (a complete grammar ends the output itself)
            let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            b.extend_from_slice(b"<[no eos]>");
            bytes.push(b);
            eos.push(n_vocab as u32);
        }
        let info = TokRxInfo::new(bytes.len() as u32, eos[0]);
        let mut trie = TokTrie::from(&info, &bytes);
        if eos.len() > 1 {
            trie = trie.with_eos_tokens(&eos);
        }
        Ok(Vocab { trie, encoder: without_prepended_space(tok.clone()) })
    }
}

/// The tokenizer with SentencePiece's leading space turned off, so that a piece of text
/// tokenizes as it would continue a sequence (llguidance tokenizes pieces).
fn without_prepended_space(mut tok: tokenizers::Tokenizer) -> tokenizers::Tokenizer {
    fn normalizer(n: NormalizerWrapper) -> Option<NormalizerWrapper> {
        match n {
            NormalizerWrapper::Prepend(_) => None,
            NormalizerWrapper::Sequence(seq) => {
                let kept: Vec<_> =
                    seq.as_ref().iter().filter_map(|n| normalizer(n.clone())).collect();
                (!kept.is_empty()).then(|| tokenizers::normalizers::Sequence::new(kept).into())
            }
            other => Some(other),
        }
    }
    fn pre_tokenizer(p: PreTokenizerWrapper) -> PreTokenizerWrapper {
        match p {
            PreTokenizerWrapper::Metaspace(mut m) => {
                m.set_prepend_scheme(PrependScheme::Never);
                PreTokenizerWrapper::Metaspace(m)
            }
            PreTokenizerWrapper::Sequence(seq) => {
                tokenizers::pre_tokenizers::sequence::Sequence::new(
                    seq.as_ref().iter().map(|p| pre_tokenizer(p.clone())).collect(),
                )
                .into()
            }
            other => other,
        }
    }
    if let Some(n) = tok.get_normalizer().cloned() {
        // dropping a normalizer cannot make it invalid; on an error the original stays
        let _ = tok.with_normalizer(normalizer(n));
    }
    if let Some(p) = tok.get_pre_tokenizer().cloned() {
        tok.with_pre_tokenizer(Some(pre_tokenizer(p)));
    }
    tok
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.encoder.encode_fast(text, false).map(|e| e.get_ids().to_vec()).unwrap_or_default()
        })
    }
}
