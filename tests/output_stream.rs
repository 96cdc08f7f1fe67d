//! Streaming detokenization and stop conditions, on a byte-level tokenizer where every byte is
//! its own token (so every multi-byte character is split across tokens) and on the real model.

mod common;

use kvrun::loader::ModelFile;
use kvrun::output::{Detokenizer, FinishReason, OutputStream, StopCondition};
use kvrun::tokenizer::{GgufVocab, Tokenizer, TokenizerSource};
use proptest::prelude::*;

/// GPT-2's byte → printable-unicode table.
fn byte_to_unicode() -> Vec<char> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap()
            }
        })
        .collect()
}

/// 256 byte tokens, no merges, plus `<|im_end|>` (id 256, control).
fn byte_tokenizer() -> Tokenizer {
    let mut tokens: Vec<String> = byte_to_unicode().into_iter().map(String::from).collect();
    tokens.push("<|im_end|>".into());
    let mut token_types = vec![1; 256];
    token_types.push(3);
    Tokenizer::from_source(TokenizerSource::Gguf(GgufVocab {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens,
        token_types,
        eos_token_id: Some(256),
        ..Default::default()
    }))
    .unwrap()
}

fn stream_all(tok: &Tokenizer, ids: &[u32], stop: StopCondition) -> (Vec<String>, OutputStream) {
    let mut out = OutputStream::new(stop, Detokenizer::new(true));
    let mut deltas = Vec::new();
    for &id in ids {
        let d = out.push(tok, id).unwrap();
        deltas.push(d.text);
        if d.finish.is_some() {
            break;
        }
    }
    (deltas, out)
}

fn stop(max_tokens: usize, stop_strings: &[&str]) -> StopCondition {
    StopCondition {
        max_tokens,
        eos_ids: vec![256],
        stop_strings: stop_strings.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn byte_tokenizer_splits_characters() {
    let tok = byte_tokenizer();
    assert_eq!(tok.encode("é🦀", false).unwrap().len(), 6);
    assert_eq!(tok.eos_ids(), &[256]);
}

#[test]
fn split_characters_are_held_until_complete() {
    let tok = byte_tokenizer();
    let ids = tok.encode("aé🦀", false).unwrap();
    let (deltas, out) = stream_all(&tok, &ids, stop(100, &[]));
    // Never half a character: deltas are empty until a character completes.
    assert_eq!(deltas, ["a", "", "é", "", "", "", "🦀"]);
    assert_eq!(out.text(), "aé🦀");
    assert_eq!(out.finish_reason(), None);
}

#[test]
fn eos_stops_without_text() {
    let tok = byte_tokenizer();
    let mut ids = tok.encode("hi", false).unwrap();
    ids.extend([256, 104]);
    let (_, out) = stream_all(&tok, &ids, stop(100, &[]));
    assert_eq!(
        (out.text(), out.finish_reason(), out.num_tokens()),
        ("hi", Some(FinishReason::Stop), 3)
    );
}

#[test]
fn max_tokens_gives_length_and_flushes() {
    let tok = byte_tokenizer();
    let ids = tok.encode("ab🦀cd", false).unwrap();
    let (_, out) = stream_all(&tok, &ids, stop(4, &[]));
    // Four tokens end inside the crab: the partial character is flushed as U+FFFD, like decode.
    assert_eq!(out.finish_reason(), Some(FinishReason::Length));
    assert_eq!(out.text(), tok.decode(&ids[..4], true).unwrap());
    let (_, out) = stream_all(&tok, &ids, stop(3, &["b"]));
    assert_eq!((out.text(), out.finish_reason()), ("a", Some(FinishReason::Stop)));
}

#[test]
fn stop_string_split_across_tokens_is_cut() {
    let tok = byte_tokenizer();
    let ids = tok.encode("Hello END world", false).unwrap();
    let (deltas, out) = stream_all(&tok, &ids, stop(100, &["END", "xyz"]));
    assert_eq!((out.text(), out.finish_reason()), ("Hello ", Some(FinishReason::Stop)));
    assert!(deltas.iter().all(|d| !d.contains('E')), "{deltas:?}");
    // A held prefix that does not complete is released.
    let ids = tok.encode("EN ENDx", false).unwrap();
    let (_, out) = stream_all(&tok, &ids, stop(100, &["END"]));
    assert_eq!(out.text(), "EN ");
    let ids = tok.encode("abEN", false).unwrap();
    let (_, out) = stream_all(&tok, &ids, stop(100, &["END"]));
    assert_eq!(out.text(), "ab"); // "EN" still held: it may become "END"
    let mut ids = tok.encode("abEN", false).unwrap();
    ids.push(256);
    let (_, out) = stream_all(&tok, &ids, stop(100, &["END"]));
    assert_eq!((out.text(), out.finish_reason()), ("abEN", Some(FinishReason::Stop)));
    // Multi-byte stop string, split inside its characters.
    let ids = tok.encode("ok — done", false).unwrap();
    let (_, out) = stream_all(&tok, &ids, stop(100, &["— "]));
    assert_eq!(out.text(), "ok ");
}

#[test]
fn pushes_after_finish_are_ignored() {
    let tok = byte_tokenizer();
    let mut out = OutputStream::new(stop(1, &[]), Detokenizer::new(true));
    assert_eq!(out.push(&tok, 97).unwrap().finish, Some(FinishReason::Length));
    let again = out.push(&tok, 98).unwrap();
    assert_eq!((again.text.as_str(), again.finish), ("", Some(FinishReason::Length)));
    assert_eq!(out.text(), "a");
}

proptest! {
    #[test]
    fn deltas_concatenate_to_decode(s in "\\PC{0,40}") {
        let tok = byte_tokenizer();
        let ids = tok.encode(&s, false).unwrap();
        let mut d = Detokenizer::new(true);
        let mut text = String::new();
        for &id in &ids {
            let delta = d.step(&tok, id).unwrap();
            // Never half a character (unless the input itself holds U+FFFD).
            if !s.contains(char::REPLACEMENT_CHARACTER) {
                prop_assert!(!delta.contains(char::REPLACEMENT_CHARACTER));
            }
            text.push_str(&delta);
        }
        text.push_str(&d.flush(&tok).unwrap());
        prop_assert_eq!(&text, &s);
    }
}

#[test]
fn real_tokenizer_streams_emoji_and_accents() {
    let Some(path) = common::real_model("real_tokenizer_streams_emoji_and_accents") else {
        return;
    };
    let tok = Tokenizer::from_source(ModelFile::open(&path).unwrap().tokenizer_source().unwrap())
        .unwrap();
    let s = "Crabs 🦀🦀 say naïve “déjà vu” — 日本語 ok<|im_end|> tail";
    let ids = tok.encode(s, false).unwrap();
    let (deltas, out) = stream_all(
        &tok,
        &ids,
        StopCondition { max_tokens: 1000, eos_ids: tok.eos_ids().to_vec(), stop_strings: vec![] },
    );
    assert!(deltas.iter().any(|d| d.is_empty()), "expected some held-back steps");
    assert_eq!(out.text(), "Crabs 🦀🦀 say naïve “déjà vu” — 日本語 ok");
    assert_eq!(out.finish_reason(), Some(FinishReason::Stop));
}
