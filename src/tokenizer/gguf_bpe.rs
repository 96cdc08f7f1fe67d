//! A `tokenizers` BPE built from a GGUF vocabulary (`tokenizer.ggml.model = gpt2`).
//!
//! GGUF BPE tokens are already in GPT-2's byte-to-unicode form (`Ġ` for space), so vocab and
//! merges go into `BPE` as they are. What GGUF does not carry is the pre-tokenizer: only its
//! profile name (`tokenizer.ggml.pre`). Each profile maps to the regexes llama.cpp applies
//! (`llama-vocab.cpp`, `llm_tokenizer_bpe`), written here as HF `tokenizer.json` files spell them.
//! An unknown profile is refused rather than guessed: a wrong split gives plausible but wrong ids.

use super::source::GgufVocab;
use super::TokenizerError;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

/// GPT-2's split pattern (as in `tokenizers`' ByteLevel).
const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's split pattern (digits in runs of up to three).
const LLAMA3_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split pattern (single digits).
const QWEN2_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen3.5's split pattern: Qwen2's with combining marks (`\p{M}`) kept in letter runs.
const QWEN35_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a `tokenizer.ggml.pre` profile splits text before BPE.
struct PreProfile {
    /// Applied in order, each as an isolated split of every piece the previous one left.
    regexes: &'static [&'static str],
    /// Look a whole pre-token up in the vocabulary before merging (Llama 3).
    ignore_merges: bool,
}

/// The pre-tokenizer profile for a `tokenizer.ggml.pre` value.
fn pre_profile(pre: &str) -> Option<PreProfile> {
    let (regexes, ignore_merges): (&'static [&'static str], bool) = match pre {
        "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jais" => (&[GPT2_RE], false),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            (&[r"\p{N}", GPT2_RE], false)
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" => (&[LLAMA3_RE], true),
        "dbrx" | "smaug-bpe" => (&[LLAMA3_RE], false),
        "qwen2" | "stablelm2" | "deepseek-r1-qwen" => (&[QWEN2_RE], false),
        "qwen35" => (&[QWEN35_RE], false),
        _ => return None,
    };
    Some(PreProfile { regexes, ignore_merges })
}

/// The names accepted by [`pre_profile`], for error messages.
const KNOWN_PRE: &str = "gpt-2, phi-2, mpt, olmo, jais, smollm, starcoder, refact, command-r, \
                         codeshell, exaone, minerva, llama3, llama-v3, llama-bpe, falcon3, \
                         falcon-h1, pixtral, midm-2.0, lfm2, dbrx, smaug-bpe, qwen2, stablelm2, \
                         deepseek-r1-qwen, qwen35";

/// Token types that are matched in input text as whole tokens (everything but normal = 1 and
/// byte = 6). Control (3), unknown (2) and unused (5) are special (skipped by
/// `decode(skip_special)`); user-defined (4) are not.
fn added_token(text: &str, token_type: i32) -> Option<AddedToken> {
    match token_type {
        1 | 6 => None,
        4 => Some(AddedToken::from(text, false).normalized(false)),
        _ => Some(AddedToken::from(text, true)),
    }
}

/// Registers the vocabulary's non-normal tokens so they are matched whole in input text.
pub(super) fn add_vocab_specials(
    tok: &mut tokenizers::Tokenizer,
    v: &GgufVocab,
) -> Result<(), TokenizerError> {
    let (special, user): (Vec<_>, Vec<_>) = v
        .tokens
        .iter()
        .zip(&v.token_types)
        .filter_map(|(t, &ty)| added_token(t, ty))
        .partition(|t| t.special);
    tok.add_special_tokens(special).map_err(|e| TokenizerError::Build(e.to_string()))?;
    tok.add_tokens(user).map_err(|e| TokenizerError::Build(e.to_string()))?;
    Ok(())
}

/// Build the byte-level BPE tokenizer of a `gpt2`-model GGUF vocabulary.
pub(super) fn build_bpe(v: &GgufVocab) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let pre = v.pre.as_deref().ok_or_else(|| {
        TokenizerError::Config(
            "the GGUF has no tokenizer.ggml.pre, so its pre-tokenizer is unknown and token ids \
             would be wrong; re-convert the model with a current llama.cpp, or use the HF \
             directory with tokenizer.json"
                .into(),
        )
    })?;
    let profile = pre_profile(pre).ok_or_else(|| {
        TokenizerError::Config(format!(
            "tokenizer.ggml.pre = '{pre}' is not a pre-tokenizer kvrun knows ({KNOWN_PRE}); use \
             the model's HF directory with tokenizer.json instead"
        ))
    })?;
    // The first id wins if a token text appears twice (as llama.cpp's text-to-token map does).
    let mut vocab = Vocab::default();
    for (id, token) in v.tokens.iter().enumerate() {
        vocab.entry(token.clone()).or_insert(id as u32);
    }
    let merges = checked_merges(v, &vocab)?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(profile.ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Build(e.to_string()))?;

    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(pre_tokenizer(&profile)?));
    tok.with_decoder(Some(ByteLevel::default()));
    add_vocab_specials(&mut tok, v)?;
    Ok(tok)
}

/// The file's merges, each making a token of `vocab`. `tokenizers` panics (slice index out of
/// range) on a merge longer than every token instead of refusing it as out of vocabulary
/// (found by fuzz/ gguf_tokenizer), so such a merge is refused first.
pub(super) fn checked_merges(
    v: &GgufVocab,
    vocab: &Vocab,
) -> Result<Vec<(String, String)>, TokenizerError> {
    let merges = parse_merges(&v.merges)?;
    if let Some((a, b)) = merges.iter().find(|(a, b)| !vocab.contains_key(&format!("{a}{b}"))) {
        return Err(TokenizerError::Config(format!(
            "GGUF merge '{a} {b}' makes '{a}{b}', which is not in the vocabulary; the \
             vocabulary is corrupt, re-convert the model"
        )));
    }
    Ok(merges)
}

/// `"left right"` strings → pairs.
fn parse_merges(merges: &[String]) -> Result<Vec<(String, String)>, TokenizerError> {
    merges
        .iter()
        .map(|m| {
            m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).ok_or_else(|| {
                TokenizerError::Config(format!(
                    "GGUF merge '{m}' is not two tokens separated by a space; the \
                         vocabulary is corrupt, re-convert the model"
                ))
            })
        })
        .collect()
}

/// The profile's regex splits, then the byte-to-unicode mapping.
fn pre_tokenizer(profile: &PreProfile) -> Result<Sequence, TokenizerError> {
    let mut pieces: Vec<PreTokenizerWrapper> = Vec::new();
    for re in profile.regexes {
        let split = Split::new(
            SplitPattern::Regex((*re).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Build(e.to_string()))?;
        pieces.push(split.into());
    }
    pieces.push(ByteLevel::new(false, false, false).into());
    Ok(Sequence::new(pieces))
}
