//! [`ToolCallParser`]: finds the tool calls in a model's answer, in the format its family's chat
//! template teaches ([`ToolCallFormat`], vLLM's `--tool-call-parser` names):
//! - `hermes`: `<tool_call>` blocks holding either a JSON object (`{"name": …, "arguments":
//!   {…}}`: Hermes, Qwen2.5, Qwen3) or Qwen3.5's / Qwen3-Coder's XML (`<function=NAME>` then
//!   `<parameter=P>` value `</parameter>` … `</function>`);
//! - `llama3_json`: Llama 3.1–3.3's JSON object `{"name": …, "parameters": {…}}`, after
//!   `<|python_tag|>` or as the whole answer, several joined by `;`;
//! - `mistral`: `[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}` objects (v3
//!   tokenizers) or, per call, `NAME[ARGS]{…}` (v11 and later);
//! - `openai`: gpt-oss's harmony messages to `functions.NAME` (read by
//!   [`super::HarmonyParser`], which a chat answer goes through whole; here the calls, with
//!   every other message's text as content).
//!
//! Text before the first call streams through as content; from a (possibly partial) opening
//! marker on it is held until the answer ends. What does not parse stays content, so nothing is
//! lost.

use serde_json::{Map, Value};

/// What opens and closes a Hermes call (the grammar of `tool_choice` writes them too:
/// [`crate::constrain::CallSyntax`]).
pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";
/// Llama 3's marker before a call (a special token: kept in the text when tools are offered).
pub const PYTHON_TAG: &str = "<|python_tag|>";
/// Mistral's marker before the calls, and before each call's arguments in the v11 form
/// (special tokens: kept in the text when tools are offered).
pub const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
pub const MISTRAL_ARGS: &str = "[ARGS]";

/// How a model family writes tool calls; see the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ToolCallFormat {
    #[default]
    Hermes,
    Llama3Json,
    Mistral,
    Harmony,
}

impl ToolCallFormat {
    /// The format a chat template teaches, read off the markers it writes; Hermes (the most
    /// common, and what kvrun's tool-call grammar writes by default) when it names none.
    pub fn from_template(template: &str) -> Self {
        if super::template_is_harmony(template) {
            ToolCallFormat::Harmony
        } else if template.contains(MISTRAL_CALLS) {
            ToolCallFormat::Mistral
        } else if template.contains(OPEN) {
            ToolCallFormat::Hermes
        } else if template.contains(PYTHON_TAG) {
            ToolCallFormat::Llama3Json
        } else {
            ToolCallFormat::Hermes
        }
    }

    /// Markers of this format that a vocabulary may hold as special tokens (which decoding
    /// leaves out unless told to keep them).
    pub fn special_markers(self) -> &'static [&'static str] {
        match self {
            ToolCallFormat::Hermes => &[],
            ToolCallFormat::Llama3Json => &[PYTHON_TAG],
            ToolCallFormat::Mistral => &[MISTRAL_CALLS, MISTRAL_ARGS],
            ToolCallFormat::Harmony => &super::harmony::MARKERS,
        }
    }

    /// Where the calls begin in `text` (what has been said so far plus the new piece;
    /// `said_nothing`: no text but whitespace went out before it), if they do.
    fn start(self, text: &str, said_nothing: bool) -> Option<usize> {
        match self {
            ToolCallFormat::Hermes => text.find(OPEN),
            ToolCallFormat::Mistral => text.find(MISTRAL_CALLS),
            ToolCallFormat::Harmony => [super::harmony::CHANNEL, super::harmony::START]
                .iter()
                .filter_map(|m| text.find(m))
                .min(),
            ToolCallFormat::Llama3Json => text.find(PYTHON_TAG).or_else(|| {
                // a bare JSON object as the answer
                let lead = text.len() - text.trim_start().len();
                (said_nothing && text[lead..].starts_with('{')).then_some(lead)
            }),
        }
    }

    /// The markers whose beginning at the end of a piece must be held back.
    fn openers(self) -> &'static [&'static str] {
        match self {
            ToolCallFormat::Hermes => &[OPEN],
            ToolCallFormat::Llama3Json => &[PYTHON_TAG],
            ToolCallFormat::Mistral => &[MISTRAL_CALLS],
            ToolCallFormat::Harmony => &[super::harmony::CHANNEL, super::harmony::START],
        }
    }

    /// The calls of held text (from the start on) and the content left: what does not parse
    /// (a call cut short by the end of the answer, say) stays content.
    fn parse(self, held: &str) -> (String, Vec<ToolCall>) {
        match self {
            ToolCallFormat::Hermes => parse_hermes(held),
            ToolCallFormat::Llama3Json => {
                let lead = held.len() - held.trim_start().len();
                let body = held[lead..].strip_prefix(PYTHON_TAG).unwrap_or(&held[lead..]);
                let (values, rest) = json_values(body, &[';']);
                let calls: Vec<ToolCall> = values.iter().map_while(call_of).collect();
                if calls.len() < values.len() || calls.is_empty() {
                    return (held.to_string(), Vec::new()); // not calls, all of it
                }
                (rest.to_string(), calls)
            }
            ToolCallFormat::Mistral => {
                let (mut content, mut calls) = (String::new(), Vec::new());
                for piece in held.split(MISTRAL_CALLS).skip(1) {
                    match mistral_calls(piece) {
                        Some(mut c) => calls.append(&mut c),
                        None => content.push_str(&format!("{MISTRAL_CALLS}{piece}")),
                    }
                }
                (content, calls)
            }
            ToolCallFormat::Harmony => {
                let mut p = super::HarmonyParser::new();
                let s = p.push(held);
                let (rest, calls) = p.finish();
                (s.reasoning + &s.content + &rest.reasoning + &rest.content, calls)
            }
        }
    }
}

/// The calls after one `[TOOL_CALLS]`: a JSON array of them, or `NAME[ARGS]{…}`; `None` if
/// the piece is neither (or has more after it).
fn mistral_calls(piece: &str) -> Option<Vec<ToolCall>> {
    let piece = piece.trim();
    if piece.starts_with('[') {
        let (values, rest) = json_values(piece, &[]);
        let [Value::Array(calls)] = values.as_slice() else { return None };
        return rest.is_empty().then(|| calls.iter().map(call_of).collect()).flatten();
    }
    let (name, args) = piece.split_once(MISTRAL_ARGS)?;
    // `NAME[CALL_ID]id[ARGS]` in some v11 templates
    let name = name.split("[CALL_ID]").next().unwrap_or(name).trim();
    let (values, rest) = json_values(args, &[]);
    let [arguments] = values.as_slice() else { return None };
    let arguments = arguments_of(Some(arguments))?;
    (rest.is_empty() && !name.is_empty())
        .then(|| vec![ToolCall { name: name.to_string(), arguments }])
}

/// One parsed call: the function's name and its arguments (a JSON object).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Value,
}

/// The incremental splitter; see the module docs.
#[derive(Clone, Debug, Default)]
pub struct ToolCallParser {
    format: ToolCallFormat,
    /// Text from the first call's start (or what may begin one) on: not yet said.
    held: String,
    /// Whether `held` starts with a call (else it may begin a marker).
    holding: bool,
    /// Whether any text but whitespace was said.
    said: bool,
}

impl ToolCallParser {
    /// A parser of the Hermes format.
    pub fn new() -> Self {
        ToolCallParser::default()
    }

    /// A parser of `format`.
    pub fn with_format(format: ToolCallFormat) -> Self {
        ToolCallParser { format, ..Default::default() }
    }

    /// The content that can go out now of the next piece of the answer.
    pub fn push(&mut self, text: &str) -> String {
        if self.holding {
            self.held.push_str(text);
            return String::new();
        }
        let all = std::mem::take(&mut self.held) + text;
        if let Some(i) = self.format.start(&all, !self.said) {
            self.held = all[i..].to_string();
            self.holding = true;
            return all[..i].to_string();
        }
        // hold a suffix that may begin a marker, and (a bare JSON answer may come) leading
        // whitespace
        let mut keep = self
            .format
            .openers()
            .iter()
            .filter_map(|m| (1..m.len()).rev().find(|&n| all.ends_with(&m[..n])))
            .max()
            .unwrap_or(0);
        if self.format == ToolCallFormat::Llama3Json && !self.said && all.trim().is_empty() {
            keep = all.len();
        }
        self.held = all[all.len() - keep..].to_string();
        let out = all[..all.len() - keep].to_string();
        self.said |= !out.trim().is_empty();
        out
    }

    /// The end of the answer: the calls found in what was held, and the content left (text
    /// between or after the calls, and whatever does not parse).
    pub fn finish(&mut self) -> (String, Vec<ToolCall>) {
        let held = std::mem::take(&mut self.held);
        if !std::mem::take(&mut self.holding) {
            return (held, Vec::new());
        }
        let (content, calls) = self.format.parse(&held);
        if calls.is_empty() {
            return (held, calls);
        }
        (content.trim().to_string(), calls)
    }
}

/// Hermes blocks: the calls, and the content left (blocks that do not parse stay in it).
fn parse_hermes(held: &str) -> (String, Vec<ToolCall>) {
    let mut rest = held.to_string();
    let (mut content, mut calls) = (String::new(), Vec::new());
    while let Some(i) = rest.find(OPEN) {
        content.push_str(&rest[..i]);
        let body_start = i + OPEN.len();
        let Some(len) = rest[body_start..].find(CLOSE) else {
            // an unclosed block (the answer was cut): parse it if it is whole otherwise
            match parse_call(&rest[body_start..]) {
                Some(call) => calls.push(call),
                None => content.push_str(&rest[i..]),
            }
            rest.clear();
            break;
        };
        let body = &rest[body_start..body_start + len];
        match parse_call(body) {
            Some(call) => calls.push(call),
            None => content.push_str(&rest[i..body_start + len + CLOSE.len()]),
        }
        rest = rest[body_start + len + CLOSE.len()..].to_string();
    }
    content.push_str(&rest);
    (content, calls)
}

/// The JSON values at the start of `text`, one after another (whitespace and the `separators`
/// between them), and what follows the last one that parses.
fn json_values<'a>(text: &'a str, separators: &[char]) -> (Vec<Value>, &'a str) {
    let mut values = Vec::new();
    let mut rest = text;
    loop {
        let next = rest.trim_start_matches(|c: char| c.is_whitespace() || separators.contains(&c));
        if next.is_empty() {
            return (values, next);
        }
        let mut stream = serde_json::Deserializer::from_str(next).into_iter::<Value>();
        match stream.next() {
            Some(Ok(v)) => values.push(v),
            _ => return (values, rest),
        }
        rest = &next[stream.byte_offset()..];
    }
}

/// A call written as a JSON object: `name`, and `arguments` (or Llama's `parameters`).
fn call_of(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = arguments_of(v.get("arguments").or_else(|| v.get("parameters")))?;
    Some(ToolCall { name, arguments })
}

/// A call's arguments: an object, or one written as a JSON string (some models do); none is
/// `{}`.
fn arguments_of(v: Option<&Value>) -> Option<Value> {
    let arguments = match v {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::String(s)) => serde_json::from_str(s).ok()?,
        Some(a) => a.clone(),
    };
    arguments.is_object().then_some(arguments)
}

/// A Hermes block's call, in JSON or XML form; `None` if it is neither.
fn parse_call(body: &str) -> Option<ToolCall> {
    let body = body.trim();
    if body.starts_with('{') {
        let v: Value = serde_json::from_str(body).ok()?;
        return call_of(&v);
    }
    let rest = body.strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let mut arguments = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.starts_with("</function>") || rest.is_empty() {
            break;
        }
        let after = rest.strip_prefix("<parameter=")?;
        let (param, after) = after.split_once('>')?;
        let (value, after) = after.split_once("</parameter>")?;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        // a value that reads as JSON (number, object, …) is that; else the string
        let parsed = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.into()));
        arguments.insert(param.trim().to_string(), parsed);
        rest = after;
    }
    Some(ToolCall { name: name.trim().to_string(), arguments: Value::Object(arguments) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(pieces: &[&str]) -> (String, Vec<ToolCall>) {
        run_as(ToolCallFormat::Hermes, pieces)
    }

    #[test]
    fn hermes_json_calls_at_every_cut() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
                    {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
        let want_call =
            ToolCall { name: "get_weather".into(), arguments: json!({"city": "Paris", "days": 2}) };
        for i in 0..=text.len() {
            let (content, calls) = run(&[&text[..i], &text[i..]]);
            // what streamed before the block is said (its newline too); the rest is trimmed
            assert_eq!(content.trim_end(), "Let me check.", "cut at {i}");
            assert_eq!(calls.len(), 1, "cut at {i}");
            assert_eq!(calls[0], want_call, "cut at {i}");
        }
        // content streams before the block; the block is held
        let mut p = ToolCallParser::new();
        assert_eq!(p.push("Let me <tool"), "Let me ");
        assert_eq!(p.push("_call>{\"name\""), "");
    }

    #[test]
    fn qwen35_xml_calls_and_parallel_calls() {
        let text = "<tool_call>\n<function=search>\n<parameter=query>\nrust wgpu\n</parameter>\n\
                    <parameter=limit>\n5\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n\
                    {\"name\": \"now\", \"arguments\": \"{}\"}\n</tool_call>";
        let (content, calls) = run(&[text]);
        assert_eq!(content, "");
        assert_eq!(
            calls[0],
            ToolCall {
                name: "search".into(),
                arguments: json!({"query": "rust wgpu", "limit": 5})
            }
        );
        assert_eq!(calls[1], ToolCall { name: "now".into(), arguments: json!({}) });
    }

    #[test]
    fn text_that_is_not_a_call_stays_content() {
        assert_eq!(run(&["plain answer"]), ("plain answer".into(), vec![]));
        assert_eq!(run(&["a <tool_c"]), ("a <tool_c".into(), vec![]));
        let broken = "x <tool_call>{not json}</tool_call> y";
        assert_eq!(run(&[broken]), (broken.into(), vec![]));
        // an unclosed but whole call (the answer stopped at </tool_call>) still counts
        let (content, calls) = run(&["<tool_call>{\"name\": \"f\", \"arguments\": {}}"]);
        assert_eq!((content.as_str(), calls.len()), ("", 1));
    }

    fn run_as(format: ToolCallFormat, pieces: &[&str]) -> (String, Vec<ToolCall>) {
        let mut p = ToolCallParser::with_format(format);
        let mut content = String::new();
        for piece in pieces {
            content += &p.push(piece);
        }
        let (rest, calls) = p.finish();
        (content + &rest, calls)
    }

    /// Every format's calls, cut at every byte: the calls and the content before them.
    #[test]
    fn every_format_at_every_cut() {
        let w =
            |city: &str| ToolCall { name: "get_weather".into(), arguments: json!({"city": city}) };
        let now = ToolCall { name: "now".into(), arguments: json!({}) };
        let cases: Vec<(ToolCallFormat, &str, &str, Vec<ToolCall>)> = vec![
            (
                ToolCallFormat::Llama3Json,
                "",
                " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
                vec![w("Paris")],
            ),
            (
                ToolCallFormat::Llama3Json,
                "Sure. ",
                "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; \
                 {\"name\": \"now\", \"parameters\": {}}",
                vec![w("Oslo"), now.clone()],
            ),
            (
                ToolCallFormat::Mistral,
                "",
                "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}, \
                 \"id\": \"abcdef123\"}, {\"name\": \"now\", \"arguments\": {}}]",
                vec![w("Rome"), now.clone()],
            ),
            (
                ToolCallFormat::Mistral,
                "One moment.",
                "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Lima\"}[TOOL_CALLS]now[ARGS]{}",
                vec![w("Lima"), now],
            ),
        ];
        for (format, before, calls_text, want) in cases {
            let text = format!("{before}{calls_text}");
            for i in 0..=text.len() {
                if !text.is_char_boundary(i) {
                    continue;
                }
                let (content, calls) = run_as(format, &[&text[..i], &text[i..]]);
                assert_eq!(content.trim(), before.trim(), "{format:?} cut at {i}: {text}");
                assert_eq!(calls, want, "{format:?} cut at {i}: {text}");
            }
        }
    }

    /// An answer cut short by max_tokens: the whole calls count, the cut one stays content.
    #[test]
    fn a_cut_call_stays_content_beside_whole_ones() {
        let text = "[TOOL_CALLS]now[ARGS]{}[TOOL_CALLS]now[ARGS]{\"a";
        let (content, calls) = run_as(ToolCallFormat::Mistral, &[text]);
        assert_eq!((content.as_str(), calls.len()), ("[TOOL_CALLS]now[ARGS]{\"a", 1));
        let text = "{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"now";
        let (content, calls) = run_as(ToolCallFormat::Llama3Json, &[text]);
        assert_eq!((content.as_str(), calls.len()), ("; {\"name\": \"now", 1));
    }

    /// Text that is not a call stays content, in every format; a Llama answer that merely
    /// starts with `{` is content once it does not parse as calls.
    #[test]
    fn non_calls_stay_content_in_every_format() {
        for format in [ToolCallFormat::Llama3Json, ToolCallFormat::Mistral] {
            for text in [
                "plain answer",
                "  {not json} at all",
                "[TOOL_CALLS] [oops",
                "<|python_tag|>{\"no_name\": 1}",
                "x [TOOL_CALLS]f[ARGS]{\"a\": 1} tail",
            ] {
                let (content, calls) = run_as(format, &[text]);
                assert!(calls.is_empty(), "{format:?}: {text}");
                assert_eq!(content, text, "{format:?}");
            }
        }
        // content streams in the Llama format until a call can start
        let mut p = ToolCallParser::with_format(ToolCallFormat::Llama3Json);
        assert_eq!(p.push("  "), "");
        assert_eq!(p.push("Hi {x}"), "  Hi {x}");
        assert_eq!(p.push(" then <|pyth"), " then ");
    }

    #[test]
    fn the_template_names_the_format() {
        let f = ToolCallFormat::from_template;
        assert_eq!(f("{{ '[TOOL_CALLS] [' }}"), ToolCallFormat::Mistral);
        assert_eq!(f("<tool_call>\n{{ tool_call | tojson }}"), ToolCallFormat::Hermes);
        assert_eq!(f("{{- '<|python_tag|>' + tool_call.name }}"), ToolCallFormat::Llama3Json);
        assert_eq!(f("{{ messages }}"), ToolCallFormat::Hermes);
    }
}
