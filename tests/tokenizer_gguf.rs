//! Building tokenizers from GGUF vocabularies: merges, special and user-defined tokens,
//! BOS/EOS handling, and the refusals (unknown pre-tokenizer, unsupported model).

use kvrun::tokenizer::{GgufVocab, Tokenizer, TokenizerError, TokenizerSource};

/// A toy byte-level vocabulary: letters, `Ġ` (space), merges `a b` then `Ġ ab`, and specials.
fn vocab() -> GgufVocab {
    let tokens = ["<s>", "</s>", "a", "b", "Ġ", "ab", "Ġab", "<|eot_id|>", "<tool>", "c"];
    GgufVocab {
        model: "gpt2".into(),
        pre: Some("llama-bpe".into()),
        tokens: tokens.iter().map(|s| s.to_string()).collect(),
        token_types: vec![3, 3, 1, 1, 1, 1, 1, 3, 4, 1],
        merges: vec!["a b".into(), "Ġ ab".into()],
        bos_token_id: Some(0),
        eos_token_id: Some(1),
        add_bos: true,
        ..Default::default()
    }
}

fn build(v: GgufVocab) -> Result<Tokenizer, TokenizerError> {
    Tokenizer::from_source(TokenizerSource::Gguf(v))
}

#[test]
fn merges_specials_and_bos() {
    let tok = build(vocab()).unwrap();
    assert_eq!(tok.encode("ab ab", true).unwrap(), vec![0, 5, 6]);
    assert_eq!(tok.encode("ab ab", false).unwrap(), vec![5, 6]);
    assert_eq!(tok.encode("ab<|eot_id|>c<tool>", false).unwrap(), vec![5, 7, 9, 8]);
    assert!(tok.add_bos());
    // EOS plus the <|eot_id|> turn ender; the user-defined <tool> is not special.
    assert_eq!(tok.eos_ids(), &[1, 7]);
    assert_eq!(tok.decode(&[0, 5, 7, 8], true).unwrap(), "ab<tool>");
    assert_eq!(tok.decode(&[0, 5, 7, 8], false).unwrap(), "<s>ab<|eot_id|><tool>");

    let mut v = vocab();
    v.add_bos = false;
    v.add_eos = true;
    let tok = build(v).unwrap();
    assert_eq!(tok.encode("ab", true).unwrap(), vec![5, 1]);
}

#[test]
fn refusals_name_the_fix() {
    let mut v = vocab();
    v.pre = Some("gpt-5-shiny".into());
    let err = build(v).err().unwrap().to_string();
    assert!(
        err.contains("'gpt-5-shiny'") && err.contains("smollm") && err.contains("tokenizer.json"),
        "{err}"
    );
    let mut v = vocab();
    v.pre = None;
    let err = build(v).err().unwrap().to_string();
    assert!(err.contains("no tokenizer.ggml.pre"), "{err}");
    let mut v = vocab();
    v.model = "bert".into();
    let err = build(v).err().unwrap();
    assert!(matches!(err, TokenizerError::UnsupportedModel(ref m) if m == "bert"), "{err}");
    assert!(err.to_string().contains("tokenizer.json"));
    let mut v = vocab();
    v.merges.push("nospace".into());
    let err = build(v).err().unwrap().to_string();
    assert!(err.contains("'nospace'"), "{err}");
}

/// A toy SentencePiece vocabulary: merges come from scores, unknown characters fall back to
/// byte tokens, and a `▁` is prepended to the text.
#[test]
fn sentencepiece_vocabulary() {
    let tokens = ["<unk>", "<s>", "</s>", "<0xC3>", "<0xA9>", "▁", "h", "i", "▁h", "hi", "▁hi"];
    let v = GgufVocab {
        model: "llama".into(),
        tokens: tokens.iter().map(|s| s.to_string()).collect(),
        token_types: vec![2, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1],
        scores: vec![0.0, 0.0, 0.0, 0.0, 0.0, -5.0, -6.0, -7.0, -3.0, -2.0, -1.0],
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        add_bos: true,
        add_space_prefix: true,
        ..Default::default()
    };
    let tok = build(v).unwrap();
    // "▁hi▁hé": hi (-2) merges first, then ▁+hi (-1), then ▁+h (-3); é is two byte tokens.
    assert_eq!(tok.encode("hi hé", true).unwrap(), vec![1, 10, 8, 3, 4]);
    assert_eq!(tok.decode(&[1, 10, 8, 3, 4], true).unwrap(), "hi hé");
    // A special token splits the text; the stretch after it gets its own ▁.
    assert_eq!(tok.encode("hi</s>hi", false).unwrap(), vec![10, 2, 10]);
    assert_eq!(tok.eos_ids(), &[2]);
}
