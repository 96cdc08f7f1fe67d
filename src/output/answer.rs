//! [`AnswerParser`]: a chat answer's text as reasoning, content and tool calls, in its model
//! family's format — `<think>` blocks and tagged calls ([`ReasoningParser`] then
//! [`ToolCallParser`]), or gpt-oss's harmony channels ([`HarmonyParser`]). The server reads
//! every chat answer through one of these.

use super::harmony::HarmonyParser;
use super::reasoning::{ReasoningParser, Split};
use super::tool_calls::{ToolCall, ToolCallParser};

/// See the module docs. `parallel`: keep every call (`parallel_tool_calls`), else the first.
#[derive(Clone, Debug)]
pub enum AnswerParser {
    /// Reasoning split off when the template reasons, calls parsed when tools are offered.
    Tagged {
        reasoning: Option<ReasoningParser>,
        tools: Option<ToolCallParser>,
        parallel: bool,
    },
    Harmony {
        parser: HarmonyParser,
        parallel: bool,
    },
}

impl AnswerParser {
    /// Whether the answer reports `reasoning_content` (`null` when there was none).
    pub fn reports_reasoning(&self) -> bool {
        match self {
            AnswerParser::Tagged { reasoning, .. } => reasoning.is_some(),
            AnswerParser::Harmony { .. } => true,
        }
    }

    /// The next piece of the answer as reasoning and content; at the `end`, also what was held
    /// back and the calls found.
    pub fn push(&mut self, text: &str, end: bool) -> (Split, Vec<ToolCall>) {
        let (split, mut calls, parallel) = match self {
            AnswerParser::Tagged { reasoning, tools, parallel } => {
                let mut split = match reasoning.as_mut() {
                    Some(r) => r.push(text),
                    None => Split { reasoning: String::new(), content: text.to_string() },
                };
                if end {
                    if let Some(r) = reasoning.as_mut() {
                        let rest = r.finish();
                        split.reasoning.push_str(&rest.reasoning);
                        split.content.push_str(&rest.content);
                    }
                }
                let Some(tools) = tools.as_mut() else { return (split, Vec::new()) };
                split.content = tools.push(&split.content);
                if !end {
                    return (split, Vec::new());
                }
                let (rest, calls) = tools.finish();
                split.content.push_str(&rest);
                (split, calls, *parallel)
            }
            AnswerParser::Harmony { parser, parallel } => {
                let mut split = parser.push(text);
                if !end {
                    return (split, Vec::new());
                }
                let (rest, calls) = parser.finish();
                split.reasoning.push_str(&rest.reasoning);
                split.content.push_str(&rest.content);
                (split, calls, *parallel)
            }
        };
        if !parallel {
            calls.truncate(1);
        }
        (split, calls)
    }
}
