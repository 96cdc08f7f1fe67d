//! Chat templates rendered by minijinja against Python jinja2's output (as HF transformers sets
//! it up), from fixtures made by `assets/fixtures/chat/make_chat_fixtures.py`.

mod common;

use kvrun::loader::ModelFile;
use kvrun::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use std::path::PathBuf;

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/fixtures/chat").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn check_cases(template: &ChatTemplate, cases_file: &str) {
    let cases: serde_json::Value = serde_json::from_str(&fixture(cases_file)).unwrap();
    for (i, case) in cases.as_array().unwrap().iter().enumerate() {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let add = case["add_generation_prompt"].as_bool().unwrap();
        let vars = case.get("vars").and_then(|v| v.as_object()).cloned().unwrap_or_default();
        let got = dated(&template.render_with(&messages, add, &vars).unwrap());
        assert_eq!(got, case["expected"].as_str().unwrap(), "{cases_file} case {i}");
    }
}

/// `text` with the date after "Current date: " (gpt-oss's `strftime_now("%Y-%m-%d")`, which
/// the fixtures hold as `<DATE>`) checked to be today's shape and replaced by `<DATE>`.
fn dated(text: &str) -> String {
    const AT: &str = "Current date: ";
    let Some(i) = text.find(AT).map(|i| i + AT.len()) else { return text.to_string() };
    let date = &text[i..i + 10];
    let shape = date.bytes().enumerate().all(|(j, b)| match j {
        4 | 7 => b == b'-',
        _ => b.is_ascii_digit(),
    });
    assert!(shape && date.starts_with("20"), "not a YYYY-MM-DD date: {date}");
    format!("{}<DATE>{}", &text[..i], &text[i + 10..])
}

#[test]
fn smollm2_template_matches_jinja2() {
    let t = ChatTemplate::new(&fixture("smollm2.jinja"), "<|im_start|>", "<|im_end|>").unwrap();
    check_cases(&t, "smollm2_cases.json");
}

#[test]
fn block_layout_template_matches_jinja2() {
    let t = ChatTemplate::new(&fixture("layout.jinja"), "<|begin_of_text|>", "<|eot_id|>").unwrap();
    check_cases(&t, "layout_cases.json");
    let err = t.render(&[ChatMessage::new("tool", "x")], false).unwrap_err().to_string();
    assert!(err.contains("unknown role tool"), "{err}");
}

/// Qwen3's template (reversed slices, str methods, the `<think>` block kept for the last turn
/// and dropped from earlier ones) renders as jinja2 renders it.
#[test]
fn qwen3_template_matches_jinja2() {
    let t = ChatTemplate::new(&fixture("qwen3.jinja"), "", "<|im_end|>").unwrap();
    check_cases(&t, "qwen3_cases.json");
}

/// Qwen3.5's template (macros, `is string` tests, the `<think>` block opened for the answer,
/// earlier answers' reasoning dropped, the last one's kept; tools offered, a call's arguments
/// iterated as items, a tool result) renders as jinja2 renders it.
#[test]
fn qwen35_template_matches_jinja2() {
    let t = ChatTemplate::new(&fixture("qwen35.jinja"), "", "<|im_end|>").unwrap();
    check_cases(&t, "qwen35_cases.json");
}

/// gpt-oss's harmony template (llama.cpp's copy of it): the system message with the date,
/// reasoning effort and model identity as variables, a system message rendered as the developer
/// message, final channels (`<|return|>` closing a last assistant turn), a tool namespace in
/// TypeScript and a call on the commentary channel with its result, as jinja2 renders them.
#[test]
fn gpt_oss_harmony_template_matches_jinja2() {
    let t = ChatTemplate::new(&fixture("gpt_oss.jinja"), "<|startoftext|>", "<|return|>").unwrap();
    check_cases(&t, "gpt_oss_cases.json");
}

#[test]
fn real_model_template_is_the_fixture() {
    let Some(path) = common::real_model("real_model_template_is_the_fixture") else {
        return;
    };
    let tok = Tokenizer::from_source(ModelFile::open(&path).unwrap().tokenizer_source().unwrap())
        .unwrap();
    assert_eq!(tok.chat_template_source(), Some(fixture("smollm2.jinja").as_str()));
    let t = tok.chat_template().unwrap().unwrap();
    check_cases(&t, "smollm2_cases.json");
}
