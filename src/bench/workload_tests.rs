//! GPU-free tests of the workload generator and the prefill arithmetic, on the tiny test model's
//! byte-level tokenizer (and SmolLM2's when `scripts/fetch-models.sh` has run).

use std::path::{Path, PathBuf};

use super::workload::*;
use crate::loader::ModelFile;
use crate::tokenizer::{ChatMessage, Tokenizer};

fn tokenizer(rel: &str) -> Option<Tokenizer> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    if !Path::new(&path).exists() {
        println!("skipping: {} not found (run scripts/fetch-models.sh)", path.display());
        return None;
    }
    let file = ModelFile::open(&path).unwrap();
    Some(Tokenizer::from_source(file.tokenizer_source().unwrap()).unwrap())
}

fn tiny() -> Tokenizer {
    tokenizer("assets/tiny-llama/hf").expect("the tiny model ships with the repository")
}

fn spec(framing: Framing) -> MultiturnSpec {
    MultiturnSpec {
        users: 3,
        system_tokens: 100,
        turns: 4,
        user_tokens_min: 40,
        user_tokens_max: 70,
        reply_tokens: 9,
        seed: 7,
        framing,
    }
}

#[test]
fn split_mix_is_fixed_and_streams_differ() {
    // First outputs of SplitMix64 seeded with 0 (Vigna's reference implementation).
    let mut g = SplitMix64::new(0);
    assert_eq!(g.next_u64(), 0xe220_a839_7b1d_cdaf);
    assert_eq!(g.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    let a = SplitMix64::derive(1, &[0, 1]).next_u64();
    assert_ne!(a, SplitMix64::derive(1, &[1, 0]).next_u64());
    assert_ne!(a, SplitMix64::derive(2, &[0, 1]).next_u64());
    assert_eq!(a, SplitMix64::derive(1, &[0, 1]).next_u64());
}

#[test]
fn exact_tokens_are_seeded_and_exactly_long() {
    let tok = tiny();
    for n in [1, 2, 17, 100, 333] {
        let a = exact_tokens(&tok, &mut SplitMix64::new(5), n).unwrap();
        let b = exact_tokens(&tok, &mut SplitMix64::new(5), n).unwrap();
        assert_eq!(a.len(), n);
        assert_eq!(a, b, "same seed, same tokens");
        assert_ne!(a, exact_tokens(&tok, &mut SplitMix64::new(6), n).unwrap());
    }
    let text = english_text(&mut SplitMix64::new(1), 40);
    assert!(text.ends_with('.') && text.chars().next().unwrap().is_ascii_uppercase(), "{text}");
}

#[test]
fn raw_workload_has_exact_lengths_and_is_deterministic() {
    let tok = tiny();
    let s = spec(Framing::Raw);
    let w = MultiturnWorkload::generate(&s, &tok, None).unwrap();
    assert_eq!(w.system.len(), 100);
    assert_eq!(w.messages.len(), 3);
    let mut lens = Vec::new();
    for user in &w.messages {
        assert_eq!(user.len(), 4);
        for m in user {
            assert!((40..=70).contains(&m.len()), "{}", m.len());
            lens.push(m.len());
        }
    }
    lens.sort_unstable();
    lens.dedup();
    assert!(lens.len() > 3, "lengths vary: {lens:?}");
    let again = MultiturnWorkload::generate(&s, &tok, None).unwrap();
    assert_eq!((&w.system, &w.messages), (&again.system, &again.messages));
    let other = MultiturnWorkload::generate(&MultiturnSpec { seed: 8, ..s }, &tok, None).unwrap();
    assert_ne!(w.messages, other.messages);
    assert_ne!(w.messages[0], w.messages[1], "users differ");
    // Prompt lengths: S + Σ messages + earlier replies; the longest conversation adds a reply.
    for user in 0..3 {
        let mut history = w.system.len();
        for turn in 0..4 {
            history += w.messages[user][turn].len();
            assert_eq!(w.prompt_len(user, turn), history);
            history += 9;
        }
    }
    let longest = (0..3).map(|u| w.prompt_len(u, 3)).max().unwrap() + 9;
    assert_eq!(w.longest_conversation(), longest);
}

/// The token-level conversation decodes to exactly what the chat template renders for the
/// same texts: frames are the template's, and each prompt extends the previous one.
#[test]
fn chat_template_framing_matches_the_rendered_conversation() {
    let tok = tiny();
    let template = tok.chat_template().unwrap().expect("tiny model has a ChatML template");
    // Byte-level tokens: the ChatML headers alone take 61 tokens of a message.
    let s =
        MultiturnSpec { user_tokens_min: 80, user_tokens_max: 110, ..spec(Framing::ChatTemplate) };
    let w = MultiturnWorkload::generate(&s, &tok, Some(&template)).unwrap();
    let frames = SegmentFrames::new(&tok, Some(&template), Framing::ChatTemplate).unwrap();
    let decode = |ids: &[u32]| tok.decode(ids, false).unwrap();
    assert_eq!(decode(&frames.system_open), "<|im_start|>system\n");
    assert_eq!(decode(&frames.system_close), "<|im_end|>\n<|im_start|>user\n");
    assert_eq!(decode(&frames.user_open), "<|im_end|>\n<|im_start|>user\n");
    assert_eq!(decode(&frames.user_close), "<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(w.system.len(), 100);
    let inner = |seg: &[u32], open: &[u32], close: &[u32]| {
        assert!(seg.starts_with(open) && seg.ends_with(close));
        decode(&seg[open.len()..seg.len() - close.len()])
    };
    let reply: Vec<u32> = tok.encode(" A reply.", false).unwrap();
    let user = 1;
    let mut messages = vec![ChatMessage::new(
        "system",
        inner(&w.system, &frames.system_open, &frames.system_close),
    )];
    let mut ids = w.system.clone();
    for turn in 0..4 {
        let open: &[u32] = if turn == 0 { &[] } else { &frames.user_open };
        let m = &w.messages[user][turn];
        messages.push(ChatMessage::new("user", inner(m, open, &frames.user_close)));
        ids.extend_from_slice(m);
        assert_eq!(ids.len(), w.prompt_len(user, turn) - turn * 9 + turn * reply.len());
        assert_eq!(decode(&ids), template.render(&messages, true).unwrap(), "turn {turn}");
        ids.extend_from_slice(&reply);
        messages.push(ChatMessage::new("assistant", decode(&reply)));
    }
}

#[test]
fn frames_too_long_for_the_system_prompt_name_the_fix() {
    let tok = tiny();
    let template = tok.chat_template().unwrap().unwrap();
    let s = MultiturnSpec { system_tokens: 20, ..spec(Framing::ChatTemplate) };
    let err = MultiturnWorkload::generate(&s, &tok, Some(&template)).unwrap_err();
    assert!(err.contains("--system-tokens") && err.contains("--raw"), "{err}");
    let err = MultiturnWorkload::generate(&spec(Framing::ChatTemplate), &tok, None).unwrap_err();
    assert!(err.contains("no chat template"), "{err}");
    let bad = MultiturnSpec { user_tokens_max: 10, ..spec(Framing::Raw) };
    assert!(MultiturnWorkload::generate(&bad, &tok, None).unwrap_err().contains("--user-tokens"));
    let zero = MultiturnSpec { turns: 0, ..spec(Framing::Raw) };
    assert!(MultiturnWorkload::generate(&zero, &tok, None).unwrap_err().contains("--turns"));
}

/// SmolLM2's ChatML headers are special tokens: three tokens open the system prompt.
#[test]
fn smollm2_framing_uses_special_tokens() {
    let Some(tok) = tokenizer("assets/models/SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let template = tok.chat_template().unwrap().unwrap();
    let frames = SegmentFrames::new(&tok, Some(&template), Framing::ChatTemplate).unwrap();
    assert_eq!(frames.system_open[0], tok.token_to_id("<|im_start|>").unwrap());
    assert!(frames.system_open.len() <= 4, "{:?}", frames.system_open);
    let s = MultiturnSpec { system_tokens: 1024, ..spec(Framing::ChatTemplate) };
    let w = MultiturnWorkload::generate(&s, &tok, Some(&template)).unwrap();
    assert_eq!(w.system.len(), 1024);
    assert!(w.messages.iter().flatten().all(|m| (40..=70).contains(&m.len())));
}

#[test]
fn design_example_prefill_arithmetic() {
    // 1024-token system prompt, 8 turns of 100 new tokens: Σ(1024 + 100k) without reuse,
    // 1124 + 7 × 100 with it (DESIGN.md).
    let prompts: Vec<usize> = (1..=8).map(|k| 1024 + 100 * k).collect();
    assert_eq!(one_conversation_prefill(&prompts), (11_792, 1_824));
    assert_eq!(one_conversation_prefill(&[]), (0, 0));
}

#[test]
fn workload_arithmetic_by_hand() {
    // S = 20, B = 16, R = 5; user 0 messages 10 and 12, user 1 messages 11 and 13.
    let seg = |n: usize| vec![1u32; n];
    let w = MultiturnWorkload {
        spec: MultiturnSpec {
            users: 2,
            system_tokens: 20,
            turns: 2,
            user_tokens_min: 10,
            user_tokens_max: 13,
            reply_tokens: 5,
            seed: 0,
            framing: Framing::Raw,
        },
        system: seg(20),
        messages: vec![vec![seg(10), seg(12)], vec![seg(11), seg(13)]],
    };
    // Prompts: user 0: 30, 47; user 1: 31, 49.
    assert_eq!([w.prompt_len(0, 0), w.prompt_len(0, 1)], [30, 47]);
    assert_eq!([w.prompt_len(1, 0), w.prompt_len(1, 1)], [31, 49]);
    assert_eq!(w.longest_conversation(), 54);
    let a = w.arithmetic(16);
    assert_eq!(a.no_reuse_prefill_tokens, 30 + 47 + 31 + 49);
    // System once, every message once, the last token of each user's first reply.
    assert_eq!(a.ideal_prefill_tokens, 20 + 46 + 2);
    // Whole blocks: 30; 47 − 32 (34 computed before); 31 − 16 (the system's full block);
    // 49 − 32 (35 computed before).
    assert_eq!(a.ideal_block_prefill_tokens, 30 + 15 + 15 + 17);
    assert_eq!(a.one_block_per_turn_tokens, 2 * 2 * 16);
    // Only the system prompt's full block is reused: by every request but the first.
    assert_eq!(a.system_only_prefill_tokens, 30 + (47 - 16) + (31 - 16) + (49 - 16));
    assert!(a.ideal_block_prefill_tokens <= a.ideal_prefill_tokens + 2 * 2 * 15);
}
