//! The GGUF tokenizer of the real SmolLM2-135M-Instruct against llama.cpp (skipped when the
//! model file is absent). Expected ids: `llama-tokenize -m MODEL -f TEXT --ids --no-bos
//! --no-escape` of llama.cpp commit 0c1e570 (build 1), on the exact bytes of each string.

mod common;

use kvrun::loader::ModelFile;
use kvrun::tokenizer::Tokenizer;
use proptest::prelude::*;
use std::sync::OnceLock;

/// The real tokenizer, built once per test binary; `None` when the model is absent.
fn smollm2(test: &str) -> Option<&'static Tokenizer> {
    static TOK: OnceLock<Option<Tokenizer>> = OnceLock::new();
    let tok = TOK.get_or_init(|| {
        let path = common::real_model(test)?;
        let src = ModelFile::open(&path).unwrap().tokenizer_source().unwrap();
        Some(Tokenizer::from_source(src).unwrap())
    });
    if tok.is_none() {
        println!("skipping {test}");
    }
    tok.as_ref()
}

const CASES: [(&str, &[u32]); 6] = [
    ("Hello world", &[19556, 905]),
    (
        "<|im_start|>user\nHi there!<|im_end|>\n",
        &[1, 4093, 198, 26843, 665, 17, 2, 198],
    ),
    (
        "  leading spaces and 12345 numbers\n\ttabs",
        &[216, 2899, 5600, 284, 216, 33, 34, 35, 36, 37, 2966, 198, 197, 100, 7366],
    ),
    (
        "naïve café — “quotes”",
        &[3546, 46494, 37366, 1841, 619, 385, 2346, 573],
    ),
    (
        "Mixed: 3.14159, $100, émojis 🦀🔥, CJK 日本語, <|im_end|>x, \u{a0}nbsp\r\n  \n\n\ttrail   ",
        &[
            61, 13609, 42, 216, 35, 30, 33, 36, 33, 37, 41, 28, 1885, 33, 32, 32, 28, 26411, 15771,
            90, 271, 15107, 116, 218, 10813, 238, 115, 28, 37845, 59, 17097, 241, 115, 40993, 179,
            120, 248, 28, 216, 2, 104, 28, 216, 15442, 94, 32093, 2738, 256, 1116, 197, 4861, 301,
            333,
        ],
    ),
    (
        "                            CHAPTER I\n\n                      Down the Rabbit-Hole\n\n\n  \
         Alice was beginning to get very tired of sitting by her sister\non the bank, and of \
         having nothing to do:  once or twice she had\npeeped into the book her sister was \
         reading, but it had no\npictures or conversations i",
        &[
            1703, 16964, 10424, 41958, 339, 198, 14446, 8899, 260, 33950, 29, 56, 1747, 1116, 3805,
            8590, 436, 3616, 288, 820, 1035, 12364, 282, 8001, 411, 874, 10243, 198, 258, 260,
            5461, 28, 284, 282, 1953, 3878, 288, 536, 42, 216, 2268, 355, 6757, 1041, 761, 198,
            432, 534, 277, 618, 260, 1863, 874, 10243, 436, 2539, 28, 564, 357, 761, 787, 198,
            36514, 756, 355, 7581, 2056,
        ],
    ),
];

#[test]
fn ids_match_llama_cpp() {
    let Some(tok) = smollm2("ids_match_llama_cpp") else {
        return;
    };
    for (text, expected) in CASES {
        assert_eq!(tok.encode(text, false).unwrap(), expected, "{text:?}");
        // SmolLM2 does not add BOS (add_bos_token = false), so add_special changes nothing.
        assert_eq!(tok.encode(text, true).unwrap(), expected, "{text:?}");
        assert_eq!(tok.decode(expected, false).unwrap(), text);
    }
}

#[test]
fn special_ids_and_eos_set() {
    let Some(tok) = smollm2("special_ids_and_eos_set") else {
        return;
    };
    assert_eq!((tok.bos_id(), tok.add_bos(), tok.vocab_size()), (Some(1), false, 49152));
    // eos = <|im_end|> (2); <|endoftext|> (0) is a turn ender too.
    assert_eq!(tok.eos_ids(), &[2, 0]);
    let ids = tok.encode("<|im_start|>a<|im_end|>", false).unwrap();
    assert_eq!(tok.decode(&ids, true).unwrap(), "a");
}

#[test]
fn long_text_matches_llama_cpp_when_given() {
    // Optional: a long text (KVRUN_TEST_TOK_TEXT) and llama.cpp's ids for it as a JSON list
    // (KVRUN_TEST_TOK_IDS, from `llama-tokenize -f TEXT --ids --no-bos --no-escape`).
    let read = |var| std::env::var(var).ok().and_then(|p| std::fs::read_to_string(p).ok());
    let (Some(text), Some(ids)) = (read("KVRUN_TEST_TOK_TEXT"), read("KVRUN_TEST_TOK_IDS")) else {
        println!("skipping long_text_matches_llama_cpp_when_given: KVRUN_TEST_TOK_TEXT/IDS unset");
        return;
    };
    let Some(tok) = smollm2("long_text_matches_llama_cpp_when_given") else {
        return;
    };
    let expected: Vec<u32> = serde_json::from_str(&ids).unwrap();
    let got = tok.encode(&text, false).unwrap();
    if let Some(i) = (0..got.len().min(expected.len())).find(|&i| got[i] != expected[i]) {
        panic!(
            "first mismatch at token {i}: ours {:?}, llama.cpp {:?}",
            &got[i..i + 5],
            &expected[i..i + 5]
        );
    }
    assert_eq!(got.len(), expected.len());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn decode_encode_round_trips(s in "\\PC{0,60}|[ \\t\\n\\r]{0,10}[a-z0-9 ]{0,20}") {
        if let Some(tok) = smollm2("decode_encode_round_trips") {
            let ids = tok.encode(&s, false).unwrap();
            prop_assert_eq!(tok.decode(&ids, false).unwrap(), s);
        }
    }
}
