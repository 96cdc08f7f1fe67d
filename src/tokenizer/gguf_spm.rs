//! A `tokenizers` BPE standing in for a GGUF SentencePiece vocabulary
//! (`tokenizer.ggml.model = llama`: Llama 1/2, Mistral v0.1, Phi-3 …).
//!
//! llama.cpp tokenizes these by repeatedly merging the adjacent pair whose concatenation is the
//! vocabulary token with the highest score, falling back to `<0xXX>` byte tokens. That is BPE
//! with merges ranked by the score of the merged token, which is how HF `transformers` converts
//! such vocabularies (`GGUFLlamaConverter`, `generate_merges`); we derive the merges the same
//! way. Spaces become `▁`, and with `add_space_prefix` a `▁` is prepended to every stretch of
//! text (the first, and each one after a special token — as llama.cpp does).

use super::source::GgufVocab;
use super::TokenizerError;
use std::collections::HashMap;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};

/// SentencePiece's visible space.
const SPACE: &str = "\u{2581}";
/// Token types (`tokenizer.ggml.token_type`).
const NORMAL: i32 = 1;
const BYTE: i32 = 6;

fn build_err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Build(e.to_string())
}

/// One way to build a vocabulary token from two others.
struct MergeCandidate {
    /// Score of the merged token.
    score: f32,
    merged: usize,
    left: usize,
    right: usize,
    /// Byte offset of the split in the merged token's text.
    split: usize,
}

/// BPE merges from token scores: every split of a normal token into two normal tokens is a
/// merge, ranked by the merged token's score (highest first; ties: longer left part, then
/// longer right part, then vocabulary order), as `transformers`' `generate_merges` ranks them.
fn merges_from_scores(v: &GgufVocab) -> Vec<(String, String)> {
    let normal = |id: usize| v.token_types.get(id).is_none_or(|&t| t == NORMAL);
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(v.tokens.len());
    for (id, t) in v.tokens.iter().enumerate() {
        if normal(id) {
            ids.entry(t.as_str()).or_insert(id);
        }
    }
    let mut candidates = Vec::new();
    for (merged, token) in v.tokens.iter().enumerate() {
        if !normal(merged) || ids.get(token.as_str()) != Some(&merged) {
            continue;
        }
        let score = v.scores.get(merged).copied().unwrap_or(0.0);
        for (split, _) in token.char_indices().skip(1) {
            let (l, r) = token.split_at(split);
            if let (Some(&left), Some(&right)) = (ids.get(l), ids.get(r)) {
                candidates.push(MergeCandidate { score, merged, left, right, split });
            }
        }
    }
    let len = |id: usize| v.tokens[id].len();
    candidates.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(len(b.left).cmp(&len(a.left)))
            .then(len(b.right).cmp(&len(a.right)))
            .then((a.merged, a.left, a.right).cmp(&(b.merged, b.left, b.right)))
    });
    candidates
        .into_iter()
        .map(|c| {
            let (l, r) = v.tokens[c.merged].split_at(c.split);
            (l.to_string(), r.to_string())
        })
        .collect()
}

/// Build the tokenizer of a `gemma4`-model GGUF vocabulary, as llama.cpp's
/// `LLAMA_VOCAB_PRE_TYPE_GEMMA4` tokenizes it: SentencePiece-style BPE (spaces are `▁`, no
/// space prefix, `<0xXX>` byte fallback) with the file's own merges, over runs of newlines and
/// of everything else (`[^\n]+|[\n]+`), raw UTF-8.
pub(super) fn build_gemma4(v: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::SplitDelimiterBehavior;
    let mut vocab = Vocab::default();
    for (id, token) in v.tokens.iter().enumerate() {
        vocab.entry(token.clone()).or_insert(id as u32);
    }
    let merges = super::gguf_bpe::checked_merges(v, &vocab)?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true)
        .build()
        .map_err(build_err)?;
    let mut tok = tokenizers::Tokenizer::new(bpe);
    let lines = Split::new(
        SplitPattern::Regex("[^\n]+|[\n]+".into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(build_err)?;
    tok.with_pre_tokenizer(Some(lines));
    tok.with_normalizer(Some(Replace::new(" ", SPACE).map_err(build_err)?)).map_err(build_err)?;
    let decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE, " ").map_err(build_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    tok.with_decoder(Some(DecoderSequence::new(decoders)));
    super::gguf_bpe::add_vocab_specials(&mut tok, v)?;
    Ok(tok)
}

/// Build the tokenizer of a `llama`-model (SentencePiece) GGUF vocabulary.
pub(super) fn build_spm(v: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    if !v.tokens.iter().zip(&v.token_types).any(|(_, &t)| t == BYTE) {
        return Err(TokenizerError::Config(
            "this SentencePiece vocabulary has no <0xXX> byte tokens, so text outside it cannot \
             be encoded; use the model's HF directory with tokenizer.json"
                .into(),
        ));
    }
    let mut vocab = Vocab::default();
    for (id, token) in v.tokens.iter().enumerate() {
        vocab.entry(token.clone()).or_insert(id as u32);
    }
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges_from_scores(v))
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = v.tokens.iter().zip(&v.token_types).find(|(_, &t)| t == 2) {
        builder = builder.unk_token(unk.0.clone());
    }
    let bpe = builder.build().map_err(build_err)?;

    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if v.add_space_prefix {
        normalizers.push(Prepend::new(SPACE.into()).into());
    }
    normalizers.push(Replace::new(" ", SPACE).map_err(build_err)?.into());
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE, " ").map_err(build_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if v.add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_normalizer(Some(NormalizerSequence::new(normalizers))).map_err(build_err)?;
    tok.with_decoder(Some(DecoderSequence::new(decoders)));
    super::gguf_bpe::add_vocab_specials(&mut tok, v)?;
    Ok(tok)
}
