//! [`ToolCallParser`]: finds the tool calls in a model's answer, as the Hermes / Qwen chat
//! templates teach models to write them — `<tool_call>` blocks holding either a JSON object
//! (`{"name": …, "arguments": {…}}`: Hermes, Qwen2.5, Qwen3) or Qwen3.5's / Qwen3-Coder's XML
//! (`<function=NAME>` then `<parameter=P>` value `</parameter>` … `</function>`). Text before
//! the first block streams through as content; from a (possibly partial) `<tool_call>` on it is
//! held until the answer ends. A block that does not parse stays content, so nothing is lost.

use serde_json::{Map, Value};

/// What opens and closes a call (the grammar of `tool_choice` writes them too:
/// [`crate::constrain::Constraint::ToolCalls`]).
pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// One parsed call: the function's name and its arguments (a JSON object).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Value,
}

/// The incremental splitter; see the module docs.
#[derive(Clone, Debug, Default)]
pub struct ToolCallParser {
    /// Text from the first `<tool_call>` (or what may begin one) on: not yet said.
    held: String,
}

impl ToolCallParser {
    pub fn new() -> Self {
        ToolCallParser::default()
    }

    /// The content that can go out now of the next piece of the answer.
    pub fn push(&mut self, text: &str) -> String {
        if self.held.contains(OPEN) {
            self.held.push_str(text);
            return String::new();
        }
        let all = std::mem::take(&mut self.held) + text;
        if let Some(i) = all.find(OPEN) {
            self.held = all[i..].to_string();
            return all[..i].to_string();
        }
        // hold a suffix that may begin `<tool_call>`
        let keep = (1..OPEN.len()).rev().find(|&n| all.ends_with(&OPEN[..n])).unwrap_or(0);
        self.held = all[all.len() - keep..].to_string();
        all[..all.len() - keep].to_string()
    }

    /// The end of the answer: the calls found in what was held, and the content left (text
    /// between or after the blocks, and any block that does not parse).
    pub fn finish(&mut self) -> (String, Vec<ToolCall>) {
        let mut rest = std::mem::take(&mut self.held).as_str().to_string();
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
        if !calls.is_empty() {
            content = content.trim().to_string();
        }
        (content, calls)
    }
}

/// A block's call, in JSON or XML form; `None` if it is neither.
fn parse_call(body: &str) -> Option<ToolCall> {
    let body = body.trim();
    if body.starts_with('{') {
        let v: Value = serde_json::from_str(body).ok()?;
        let name = v.get("name")?.as_str()?.to_string();
        let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
            None | Some(Value::Null) => Value::Object(Map::new()),
            // some models write the arguments as a JSON string
            Some(Value::String(s)) => serde_json::from_str(s).ok()?,
            Some(a) => a.clone(),
        };
        return arguments.is_object().then_some(ToolCall { name, arguments });
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
        let mut p = ToolCallParser::new();
        let mut content = String::new();
        for piece in pieces {
            content += &p.push(piece);
        }
        let (rest, calls) = p.finish();
        (content + &rest, calls)
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
}
