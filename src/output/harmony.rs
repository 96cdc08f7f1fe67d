//! [`HarmonyParser`]: gpt-oss's answers in OpenAI's harmony format, split into reasoning,
//! content and tool calls. An answer is a run of messages, each a header and a body:
//! `<|channel|>analysis<|message|>…<|end|>` (reasoning), `<|start|>assistant<|channel|>final
//! <|message|>…<|return|>` (content), `<|channel|>commentary to=functions.NAME <|constrain|>json
//! <|message|>{…}<|call|>` (a call; the recipient may also stand before the channel). The
//! markers are special tokens, kept in the text for this parser. Bodies stream as they come; a
//! call's body is held until it ends. Text outside any message, and a call whose arguments do
//! not parse, stay content.

use serde_json::Value;

use super::reasoning::Split;
use super::tool_calls::ToolCall;

pub const START: &str = "<|start|>";
pub const END: &str = "<|end|>";
pub const MESSAGE: &str = "<|message|>";
pub const CHANNEL: &str = "<|channel|>";
pub const CONSTRAIN: &str = "<|constrain|>";
pub const CALL: &str = "<|call|>";
pub const RETURN: &str = "<|return|>";

/// The markers (all special tokens of gpt-oss's vocabulary).
pub const MARKERS: [&str; 7] = [START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN];

/// Where a message's body goes.
#[derive(Clone, Debug, PartialEq)]
enum Body {
    Reasoning,
    Content,
    /// A call of this function; its arguments so far.
    Call(String, String),
}

#[derive(Clone, Debug, PartialEq)]
enum State {
    /// In a header (its text so far), or before the first one.
    Header(String),
    Body(Body),
}

/// The incremental splitter; see the module docs.
#[derive(Clone, Debug)]
pub struct HarmonyParser {
    state: State,
    /// Text that may begin a marker, not yet placed.
    held: String,
    calls: Vec<ToolCall>,
}

impl Default for HarmonyParser {
    fn default() -> Self {
        HarmonyParser {
            state: State::Header(String::new()),
            held: String::new(),
            calls: Vec::new(),
        }
    }
}

impl HarmonyParser {
    pub fn new() -> Self {
        HarmonyParser::default()
    }

    /// Splits the next piece of the answer.
    pub fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        let mut rest = std::mem::take(&mut self.held) + text;
        loop {
            match &mut self.state {
                State::Header(header) => {
                    header.push_str(&rest);
                    let Some(i) = header.find(MESSAGE) else { return out };
                    let body = body_of(&header[..i]);
                    rest = header[i + MESSAGE.len()..].to_string();
                    self.state = State::Body(body);
                }
                State::Body(body) => {
                    let end = [END, CALL, RETURN, START]
                        .iter()
                        .filter_map(|m| rest.find(m).map(|i| (i, m.len())))
                        .min();
                    let (text_end, next) = match end {
                        Some((i, len)) => (i, Some(i + len)),
                        None => (rest.len() - marker_prefix(&rest), None),
                    };
                    match body {
                        Body::Reasoning => out.reasoning.push_str(&rest[..text_end]),
                        Body::Content => out.content.push_str(&rest[..text_end]),
                        Body::Call(_, args) => args.push_str(&rest[..text_end]),
                    }
                    let Some(next) = next else {
                        self.held = rest[text_end..].to_string();
                        return out;
                    };
                    self.close_body(&mut out);
                    rest.drain(..next);
                }
            }
        }
    }

    /// The end of the answer: what was held, and the calls made.
    pub fn finish(&mut self) -> (Split, Vec<ToolCall>) {
        let mut out = Split::default();
        let held = std::mem::take(&mut self.held);
        match &mut self.state {
            // text that never opened a message is content (a header cut short is dropped)
            State::Header(h) if !h.contains(CHANNEL) => out.content.push_str(&(h.clone() + &held)),
            State::Header(_) => {}
            State::Body(Body::Reasoning) => out.reasoning.push_str(&held),
            State::Body(Body::Content) => out.content.push_str(&held),
            State::Body(Body::Call(_, args)) => args.push_str(&held),
        }
        self.close_body(&mut out);
        (out, std::mem::take(&mut self.calls))
    }

    /// Ends the current body (a call's arguments are parsed; ones that do not parse are
    /// content) and waits for the next header.
    fn close_body(&mut self, out: &mut Split) {
        if let State::Body(Body::Call(name, args)) = &self.state {
            match serde_json::from_str::<Value>(args.trim()) {
                Ok(arguments) if arguments.is_object() => {
                    self.calls.push(ToolCall { name: name.clone(), arguments })
                }
                _ => out.content.push_str(args),
            }
        }
        self.state = State::Header(String::new());
    }
}

/// Where a message with this header goes: a call when its recipient is `functions.NAME`,
/// reasoning on the analysis channel, else content (final, and commentary preambles).
fn body_of(header: &str) -> Body {
    let word_after = |key: &str| {
        let i = header.find(key)? + key.len();
        let rest = &header[i..];
        let end = rest.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(rest.len());
        Some(&rest[..end])
    };
    if let Some(name) = word_after("to=").and_then(|r| r.strip_prefix("functions.")) {
        return Body::Call(name.to_string(), String::new());
    }
    match word_after(CHANNEL) {
        Some("analysis") => Body::Reasoning,
        _ => Body::Content,
    }
}

/// Bytes at the end of `text` that may begin a marker.
fn marker_prefix(text: &str) -> usize {
    MARKERS
        .iter()
        .filter_map(|m| (1..m.len()).rev().find(|&n| text.ends_with(&m[..n])))
        .max()
        .unwrap_or(0)
}

/// Whether a chat template writes harmony messages (gpt-oss's).
pub fn template_is_harmony(template: &str) -> bool {
    template.contains(CHANNEL) && template.contains(MESSAGE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(pieces: &[&str]) -> (String, String, Vec<ToolCall>) {
        let mut p = HarmonyParser::new();
        let (mut r, mut c) = (String::new(), String::new());
        for piece in pieces {
            let s = p.push(piece);
            r += &s.reasoning;
            c += &s.content;
        }
        let (s, calls) = p.finish();
        (r + &s.reasoning, c + &s.content, calls)
    }

    #[test]
    fn analysis_final_and_calls_at_every_cut() {
        let answer = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant\
                      <|channel|>final<|message|>It is sunny.";
        let call = "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant<|channel|>\
                    commentary to=functions.get_weather <|constrain|>json<|message|>\
                    {\"city\": \"Paris\"}";
        let before = "<|start|>assistant to=functions.now<|channel|>commentary json\
                      <|message|>{}<|call|>";
        let w = ToolCall { name: "get_weather".into(), arguments: json!({"city": "Paris"}) };
        let now = ToolCall { name: "now".into(), arguments: json!({}) };
        let cases = [
            (answer, ("Need the weather.", "It is sunny."), vec![]),
            (call, ("Call it.", ""), vec![w]),
            (before, ("", ""), vec![now]),
        ];
        for (text, (reasoning, content), calls) in cases {
            for i in 0..=text.len() {
                let got = run(&[&text[..i], &text[i..]]);
                assert_eq!(got, (reasoning.into(), content.into(), calls.clone()), "cut at {i}");
            }
        }
        // the content streams before the answer ends
        let mut p = HarmonyParser::new();
        let s = p.push("<|channel|>final<|message|>Hello <|");
        assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("", "Hello "));
    }

    #[test]
    fn text_outside_messages_and_bad_calls_stay_content() {
        assert_eq!(run(&["no markers at all"]), ("".into(), "no markers at all".into(), vec![]));
        let bad = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{oops";
        assert_eq!(run(&[bad]), ("".into(), "{oops".into(), vec![]));
        assert!(template_is_harmony("{{ '<|channel|>final<|message|>' }}"));
        assert!(!template_is_harmony("<|im_start|>"));
    }
}
