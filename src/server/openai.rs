//! The OpenAI request bodies kvrun accepts, and their translation into a [`PromptRequest`].
//! Fields kvrun does not implement are refused with a 400 when they ask for something (a
//! non-default value), and ignored when they carry their default (clients often send them).

use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use crate::constrain::{CallSyntax, Constraint};
use crate::engine::SamplingDefaults;
use crate::engine::{Conversation, Prompt, PromptRequest};
use crate::sample::SamplingParams;
use crate::tokenizer::{check_template_vars, ChatMessage, TemplateVars};

/// Most alternatives a log-probability entry may show (OpenAI's and vLLM's bound).
pub const MAX_LOGPROBS: usize = 20;

/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 16;

/// Fields of both endpoints.
#[derive(Debug, Default, Deserialize)]
pub struct CommonFields {
    pub model: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<u64>,
    /// Chat: `true` (with `top_logprobs` alternatives); completions: the number of
    /// alternatives.
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<u64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// vLLM's extension (HF's repetition penalty; 1 = off).
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string) → bias added to its logit, in [-100, 100].
    pub logit_bias: Option<std::collections::HashMap<String, f32>>,
    /// vLLM's: end-of-sequence cannot come before this many tokens.
    pub min_tokens: Option<u64>,
    /// vLLM's: generate past end-of-sequence tokens (benchmarks).
    pub ignore_eos: Option<bool>,
    /// vLLM's: token ids that end the output like end-of-sequence (their text left out; also
    /// with `ignore_eos`; held back by `min_tokens`).
    pub stop_token_ids: Option<Vec<i64>>,
    /// vLLM's: leave special tokens out of the text (default true).
    pub skip_special_tokens: Option<bool>,
    /// vLLM's: each prompt position's token log-probability with this many alternatives.
    pub prompt_logprobs: Option<i64>,
    /// OpenAI's: `{"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": …}}`.
    pub response_format: Option<Value>,
    /// vLLM's: exactly one of `json`, `regex`, `choice`, `grammar` (Lark), `json_object`.
    pub structured_outputs: Option<Value>,
    /// vLLM's older names of `structured_outputs`' members.
    pub guided_json: Option<Value>,
    pub guided_regex: Option<Value>,
    pub guided_choice: Option<Value>,
    pub guided_grammar: Option<Value>,
    /// Every other field; see [`CommonFields::check_unsupported`].
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub messages: Vec<Message>,
    /// More variables for the chat template (vLLM's and llama-server's field), e.g.
    /// `{"enable_thinking": false}` for Qwen3.
    #[serde(default)]
    pub chat_template_kwargs: Option<TemplateVars>,
    /// Passed to the template as `reasoning_effort` (gpt-oss's reads it).
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// Functions the model may call (`[{"type": "function", "function": {name, …}}]`), given
    /// to the chat template as `tools`.
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// `"auto"` (with tools: the default), `"none"`, `"required"` or a named function (the
    /// last two enforced by a grammar: [`ChatCompletionRequest::tool_constraint`]).
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(flatten)]
    pub common: CommonFields,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An earlier assistant turn's reasoning, as this server returned it.
    #[serde(default)]
    pub reasoning_content: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// A message's content: a string, or parts of which kvrun reads the text ones.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Value,
    /// Write the prompt before the answer (and, with `logprobs`, its tokens' log-probabilities
    /// before the answer's): OpenAI's legacy field, which evaluation harnesses use to score
    /// a text.
    #[serde(default)]
    pub echo: Option<bool>,
    #[serde(flatten)]
    pub common: CommonFields,
}

/// What `tool_choice` asks for.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ToolChoice<'a> {
    Auto,
    None,
    Required,
    Named(&'a str),
}

/// The message roles OpenAI's API defines (`developer` is rendered as `system`, which chat
/// templates know).
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// Fields kvrun does not implement, each with the values that ask for nothing.
const UNSUPPORTED: [(&str, &[&str]); 4] = [
    ("functions", &["null", "[]"]),
    ("best_of", &["null", "1"]),
    ("echo", &["null", "false"]),
    ("suffix", &["null", "\"\""]),
];

impl CommonFields {
    /// Refuses a field kvrun does not implement when it asks for something.
    fn check_unsupported(&self) -> Result<(), ApiError> {
        for (name, defaults) in UNSUPPORTED {
            if let Some(v) = self.extra.get(name) {
                let text = v.to_string();
                if !defaults.contains(&text.as_str()) {
                    return Err(ApiError::bad_field(
                        name,
                        format!(
                            "`{name}` = {text} is not supported by kvrun; remove it (supported: \
                             temperature, top_p, top_k, min_p, max_tokens, max_completion_tokens, \
                             stop, seed, n, stream, stream_options, logprobs, top_logprobs, \
                             presence_penalty, frequency_penalty, repetition_penalty, \
                             logit_bias, min_tokens, ignore_eos, stop_token_ids, \
                             response_format, structured_outputs)"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The alternatives to report log-probabilities with: chat's `logprobs: true` with
    /// `top_logprobs` (default 0), or completions' `logprobs: N`; `None` when not asked.
    fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        let top = self.top_logprobs.map(|k| usize::try_from(k).unwrap_or(usize::MAX));
        let asked = match &self.logprobs {
            None | Some(Value::Null) | Some(Value::Bool(false)) => None,
            Some(Value::Bool(true)) => Some(top.unwrap_or(0)),
            Some(Value::Number(n)) if n.as_u64().is_some() => {
                Some(usize::try_from(n.as_u64().unwrap_or(0)).unwrap_or(usize::MAX))
            }
            Some(other) => {
                return Err(ApiError::bad_field(
                    "logprobs",
                    format!(
                        "logprobs = {other} is invalid; use true (chat) or a count (completions)"
                    ),
                ))
            }
        };
        if asked.is_none() && top.is_some_and(|k| k > 0) {
            return Err(ApiError::bad_field("top_logprobs", "top_logprobs needs logprobs = true"));
        }
        Ok(asked)
    }

    /// vLLM's `prompt_logprobs`: the alternatives per prompt position (at most
    /// [`MAX_LOGPROBS`], as for `top_logprobs`), `None` when not asked.
    pub fn prompt_logprobs(&self) -> Result<Option<usize>, ApiError> {
        match self.prompt_logprobs {
            None => Ok(None),
            Some(k) if (0..=MAX_LOGPROBS as i64).contains(&k) => Ok(Some(k as usize)),
            Some(k) => Err(ApiError::bad_field(
                "prompt_logprobs",
                format!("prompt_logprobs = {k} is out of range; use 0 to {MAX_LOGPROBS}"),
            )),
        }
    }

    /// The structured output asked for, with the field that asked: `response_format`,
    /// `structured_outputs` or one of the `guided_*` fields (at most one of them).
    pub fn constraint(&self) -> Result<Option<(Constraint, &'static str)>, ApiError> {
        let mut found: Vec<(Constraint, &'static str)> = Vec::new();
        if let Some(rf) = self.response_format.as_ref().filter(|v| !v.is_null()) {
            found.extend(response_format(rf)?.map(|c| (c, "response_format")));
        }
        if let Some(so) = self.structured_outputs.as_ref().filter(|v| !v.is_null()) {
            let Value::Object(map) = so else {
                return Err(ApiError::bad_field(
                    "structured_outputs",
                    "structured_outputs must be an object with one of json, regex, choice, \
                     grammar, json_object",
                ));
            };
            let mut inner = Vec::new();
            for (key, value) in map {
                if value.is_null() || *value == Value::Bool(false) {
                    continue;
                }
                let field = match key.as_str() {
                    "json" => "structured_outputs.json",
                    "regex" => "structured_outputs.regex",
                    "choice" => "structured_outputs.choice",
                    "grammar" => "structured_outputs.grammar",
                    "json_object" => "structured_outputs.json_object",
                    other => {
                        return Err(ApiError::bad_field(
                            "structured_outputs",
                            format!(
                                "structured_outputs.{other} is not supported by kvrun; use one \
                                 of json, regex, choice, grammar (Lark), json_object"
                            ),
                        ))
                    }
                };
                inner.push((guided(key, value, field)?, field));
            }
            found.extend(inner);
        }
        for (key, value, field) in [
            ("json", &self.guided_json, "guided_json"),
            ("regex", &self.guided_regex, "guided_regex"),
            ("choice", &self.guided_choice, "guided_choice"),
            ("grammar", &self.guided_grammar, "guided_grammar"),
        ] {
            if let Some(v) = value.as_ref().filter(|v| !v.is_null()) {
                found.push((guided(key, v, field)?, field));
            }
        }
        if found.len() > 1 {
            let names: Vec<&str> = found.iter().map(|(_, f)| *f).collect();
            return Err(ApiError::bad_field(
                names[1],
                format!("{} each ask for a structured output; send one", names.join(" and ")),
            ));
        }
        Ok(found.pop())
    }

    /// `stop_token_ids`, checked against the vocabulary (at most 256).
    pub fn stop_token_ids(&self, vocab_size: usize) -> Result<Vec<u32>, ApiError> {
        let Some(ids) = &self.stop_token_ids else { return Ok(Vec::new()) };
        if ids.len() > 256 {
            return Err(ApiError::bad_field(
                "stop_token_ids",
                format!("stop_token_ids has {} ids; give at most 256", ids.len()),
            ));
        }
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            match u32::try_from(id).ok().filter(|&id| (id as usize) < vocab_size) {
                Some(id) => out.push(id),
                None => {
                    return Err(ApiError::bad_field(
                        "stop_token_ids",
                        format!(
                            "stop_token_ids entry {id} is not a token id of this model \
                             (0..{vocab_size})"
                        ),
                    ))
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// `logit_bias` as (token id, bias), checked against the vocabulary.
    pub fn logit_bias(&self, vocab_size: usize) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(map) = &self.logit_bias else { return Ok(Vec::new()) };
        let mut bias = Vec::with_capacity(map.len());
        for (key, &value) in map {
            let id = key.parse::<u32>().ok().filter(|&id| (id as usize) < vocab_size);
            let Some(id) = id else {
                return Err(ApiError::bad_field(
                    "logit_bias",
                    format!(
                        "logit_bias key {key:?} is not a token id of this model (0..{vocab_size})"
                    ),
                ));
            };
            if !(-100.0..=100.0).contains(&value) {
                return Err(ApiError::bad_field(
                    "logit_bias",
                    format!("logit_bias of token {id} is {value}; use a value in [-100, 100]"),
                ));
            }
            bias.push((id, value));
        }
        bias.sort_unstable_by_key(|&(id, _)| id);
        Ok(bias)
    }

    /// Sampling parameters and stop strings, checked. `max_tokens` defaults to the rest of the
    /// context (`context_left`, as vLLM does); more than that is refused; `temperature`, `top_k`,
    /// `top_p`, `min_p` and `repetition_penalty` left out take the model's `defaults` (vLLM's
    /// `--generation-config auto`), else 1, all, all, none, 1.
    pub fn sampling(
        &self,
        context_left: usize,
        defaults: &SamplingDefaults,
    ) -> Result<(SamplingParams, Vec<String>), ApiError> {
        self.check_unsupported()?;
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(0), _) | (None, Some(0)) => {
                return Err(ApiError::bad_field("max_tokens", "max_tokens must be at least 1"))
            }
            (Some(n), _) | (None, Some(n)) => usize::try_from(n).unwrap_or(usize::MAX),
            (None, None) => context_left,
        };
        if max_tokens > context_left && context_left > 0 {
            // as OpenAI and vLLM answer (a prompt that fills the context is the front end's)
            return Err(ApiError::bad_field(
                "max_tokens",
                format!(
                    "max_tokens {max_tokens} does not fit: the context (-c/--max-model-len) \
                     leaves {context_left} tokens after the prompt; ask for at most \
                     {context_left}, or leave max_tokens out to use them all"
                ),
            ));
        }
        let top_k = match self.top_k {
            None => defaults.top_k.filter(|&k| k > 0).map(|k| k as i64),
            other => other,
        };
        let top_k = match top_k {
            None | Some(-1) | Some(0) => None,
            Some(k) if k > 0 => Some(usize::try_from(k).unwrap_or(usize::MAX)),
            Some(k) => {
                return Err(ApiError::bad_field(
                    "top_k",
                    format!("top_k = {k} is invalid; use at least 1, or -1 to keep every token"),
                ))
            }
        };
        let seed = match self.seed {
            Some(s) => u64::try_from(s).map_err(|_| {
                ApiError::bad_field("seed", format!("seed = {s} is invalid; use an integer ≥ 0"))
            })?,
            None => rand::random(),
        };
        let params = SamplingParams {
            temperature: self.temperature.or(defaults.temperature).unwrap_or(1.0),
            top_k,
            top_p: self.top_p.or(defaults.top_p),
            seed,
            // At least 1: a prompt that fills the context is refused by the front end, naming both lengths.
            max_tokens: max_tokens.min(context_left).max(1),
            min_p: self.min_p.or(defaults.min_p),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            repetition_penalty: self
                .repetition_penalty
                .or(defaults.repetition_penalty)
                .unwrap_or(1.0),
            logprobs: self.logprobs()?,
            min_tokens: self.min_tokens.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOP_STRINGS {
            return Err(ApiError::bad_field(
                "stop",
                format!("{} stop strings given; at most {MAX_STOP_STRINGS}", stop.len()),
            ));
        }
        Ok((params, stop))
    }

    /// How many choices to answer (`n`, default 1): each is its own sequence, and with the
    /// prefix cache on they share the prompt's full KV blocks (the first computes them, the
    /// others wait for them and compute only the prompt's partial last block). At most
    /// `max_num_seqs` (`--max-num-seqs`), so that all of them run together.
    pub fn choices(&self, max_num_seqs: usize) -> Result<usize, ApiError> {
        match self.n {
            None => Ok(1),
            Some(0) => Err(ApiError::bad_field("n", "n = 0 asks for no answer; use n ≥ 1")),
            Some(n) if n > max_num_seqs as u64 => Err(ApiError::bad_field(
                "n",
                format!(
                    "n = {n} is more choices than this server runs at once (--max-num-seqs \
                     {max_num_seqs}); ask for at most {max_num_seqs}"
                ),
            )),
            Some(n) => Ok(n as usize),
        }
    }

    pub fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().is_some_and(|o| o.include_usage)
    }
}

impl ChatCompletionRequest {
    /// The conversation for the chat template: the messages, `chat_template_kwargs` and
    /// `reasoning_effort` (refused where they would replace what the request itself sets).
    pub fn conversation(&self) -> Result<Conversation, ApiError> {
        let mut vars = self.chat_template_kwargs.clone().unwrap_or_default();
        check_template_vars(&vars).map_err(|e| ApiError::bad_field("chat_template_kwargs", e))?;
        if let Some(effort) = &self.reasoning_effort {
            vars.insert("reasoning_effort".into(), Value::String(effort.clone()));
        }
        if let Some(tools) = self.tools_offered()? {
            vars.insert("tools".into(), Value::Array(tools.to_vec()));
        }
        Ok(Conversation { messages: self.messages()?, vars })
    }

    /// What `tool_choice` asks: `"auto"` (the default), `"none"`, `"required"`, or a named
    /// function (`{"type": "function", "function": {"name": …}}`).
    fn tool_choice(&self) -> Result<ToolChoice<'_>, ApiError> {
        let bad = |what: String| ApiError::bad_field("tool_choice", what);
        match &self.tool_choice {
            None | Some(Value::Null) => Ok(ToolChoice::Auto),
            Some(Value::String(s)) => match s.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                other => Err(bad(format!(
                    "tool_choice {other:?} is invalid; use \"auto\", \"none\", \"required\" or \
                     {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"
                ))),
            },
            Some(v) => match v["function"]["name"].as_str() {
                Some(name) if v["type"] == "function" => Ok(ToolChoice::Named(name)),
                _ => Err(bad(format!(
                    "tool_choice {v} is invalid; name a function as {{\"type\": \"function\", \
                     \"function\": {{\"name\": …}}}}"
                ))),
            },
        }
    }

    /// The tools the model is offered: `tools` unless `tool_choice` is `"none"`, each checked
    /// to be a named function; a required or named choice needs them (and the name among them).
    pub fn tools_offered(&self) -> Result<Option<&[Value]>, ApiError> {
        let choice = self.tool_choice()?;
        if choice == ToolChoice::None {
            return Ok(None);
        }
        let tools = self.tools.as_deref().filter(|t| !t.is_empty());
        for (i, tool) in tools.unwrap_or_default().iter().enumerate() {
            let named = tool["type"] == "function" && tool["function"]["name"].is_string();
            if !named {
                return Err(ApiError::bad_field(
                    "tools",
                    format!(
                        "tools[{i}] is not {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"
                    ),
                ));
            }
        }
        match (choice, tools) {
            (ToolChoice::Required | ToolChoice::Named(_), None) => Err(ApiError::bad_field(
                "tool_choice",
                "tool_choice asks for a tool call but the request offers no tools; send tools",
            )),
            (ToolChoice::Named(name), Some(tools))
                if !tools.iter().any(|t| t["function"]["name"] == name) =>
            {
                Err(ApiError::bad_field(
                    "tool_choice",
                    format!("tool_choice names the function {name:?}, which tools does not offer"),
                ))
            }
            _ => Ok(tools),
        }
    }

    /// The grammar `tool_choice` enforces: with `"required"` the answer is one or more calls
    /// (one unless `parallel_tool_calls`) of the tools, with a named function one call of it;
    /// `None` for `"auto"` and `"none"`. The calls are written in `syntax` (the model family's
    /// format, see [`Constraint::ToolCalls`]).
    pub fn tool_constraint(&self, syntax: CallSyntax) -> Result<Option<Constraint>, ApiError> {
        let Some(tools) = self.tools_offered()? else { return Ok(None) };
        let signature = |t: &Value| {
            let name = t["function"]["name"].as_str().unwrap_or_default().to_string();
            let params = t["function"].get("parameters").filter(|p| !p.is_null());
            // a function without `parameters` takes none (OpenAI's reading)
            let none = serde_json::json!({"type": "object", "properties": {}, "additionalProperties": false});
            (name, params.cloned().unwrap_or(none))
        };
        let (picked, parallel): (Vec<_>, bool) = match self.tool_choice()? {
            ToolChoice::Required => {
                (tools.iter().map(signature).collect(), self.parallel_tool_calls.unwrap_or(true))
            }
            ToolChoice::Named(name) => (
                tools.iter().filter(|t| t["function"]["name"] == name).map(signature).collect(),
                false,
            ),
            ToolChoice::Auto | ToolChoice::None => return Ok(None),
        };
        Ok(Some(Constraint::ToolCalls { tools: picked, parallel, syntax }))
    }

    /// The conversation as chat-template messages (text parts joined).
    pub fn messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::bad_field("messages", "messages is empty; send at least one"));
        }
        if let Some(m) = self.messages.iter().find(|m| !ROLES.contains(&m.role.as_str())) {
            return Err(ApiError::bad_field(
                "messages",
                format!(
                    "message role {:?} is not one of system, developer, user, assistant, tool",
                    m.role
                ),
            ));
        }
        self.messages
            .iter()
            .map(|m| {
                let content = match &m.content {
                    None => String::new(),
                    Some(Content::Text(t)) => t.clone(),
                    Some(Content::Parts(parts)) => {
                        let mut text = String::new();
                        for p in parts {
                            match (p.kind.as_str(), &p.text) {
                                ("text", Some(t)) => text.push_str(t),
                                (kind, _) => {
                                    return Err(ApiError::bad_field(
                                        "messages",
                                        format!(
                                            "content part of type {kind:?} is not supported; \
                                             kvrun reads text parts only"
                                        ),
                                    ))
                                }
                            }
                        }
                        text
                    }
                };
                Ok(ChatMessage {
                    reasoning_content: m.reasoning_content.clone(),
                    tool_calls: m.tool_calls.as_deref().map(template_tool_calls),
                    tool_call_id: m.tool_call_id.clone(),
                    name: m.name.clone(),
                    ..ChatMessage::new(
                        if m.role == "developer" { "system" } else { m.role.as_str() },
                        content,
                    )
                })
            })
            .collect()
    }
}

/// An assistant message's tool calls as chat templates read them: each call's
/// `function.arguments`, a JSON string on the wire, as the object it encodes (templates such as
/// Qwen3.5's iterate its items); a string that is not JSON stays a string.
fn template_tool_calls(calls: &[Value]) -> Value {
    let calls = calls.iter().map(|call| {
        let mut call = call.clone();
        if let Some(Value::String(args)) = call.pointer("/function/arguments") {
            if let Ok(parsed) = serde_json::from_str::<Value>(args) {
                call["function"]["arguments"] = parsed;
            }
        }
        call
    });
    Value::Array(calls.collect())
}

/// OpenAI's `response_format` (and llama-server's `json_object` with a `schema`).
fn response_format(rf: &Value) -> Result<Option<Constraint>, ApiError> {
    let bad = |m: String| ApiError::bad_field("response_format", m);
    let kind = rf.get("type").and_then(Value::as_str).ok_or_else(|| {
        bad("response_format needs a type: \"text\", \"json_object\" or \"json_schema\"".into())
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(match rf.get("schema") {
            Some(schema) if !schema.is_null() => Constraint::JsonSchema(schema.clone()),
            _ => Constraint::JsonObject,
        })),
        "json_schema" => {
            let schema = rf
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .filter(|s| !s.is_null())
                .ok_or_else(|| {
                    bad("response_format type json_schema needs json_schema.schema (the JSON \
                         schema the answer must follow)"
                        .into())
                })?;
            Ok(Some(Constraint::JsonSchema(schema.clone())))
        }
        other => Err(bad(format!(
            "response_format type {other:?} is not supported; use \"text\", \"json_object\" or \
             \"json_schema\""
        ))),
    }
}

/// One of vLLM's structured-output members: `json` (a schema, or its text), `regex`,
/// `choice`, `grammar` (Lark), `json_object`.
fn guided(key: &str, value: &Value, field: &'static str) -> Result<Constraint, ApiError> {
    let bad = |what: &str| ApiError::bad_field(field, format!("{field} must be {what}"));
    Ok(match key {
        "json" => match value {
            Value::String(text) => Constraint::JsonSchema(
                serde_json::from_str(text)
                    .map_err(|_| bad("a JSON schema (object or its text)"))?,
            ),
            other => Constraint::JsonSchema(other.clone()),
        },
        "regex" => Constraint::Regex(value.as_str().ok_or_else(|| bad("a string"))?.to_string()),
        "choice" => Constraint::Choice(
            value
                .as_array()
                .and_then(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect())
                .ok_or_else(|| bad("an array of strings"))?,
        ),
        "grammar" => Constraint::Lark(value.as_str().ok_or_else(|| bad("a string"))?.to_string()),
        _ => match value {
            Value::Bool(true) => Constraint::JsonObject,
            _ => return Err(bad("true")),
        },
    })
}

impl CompletionRequest {
    /// The prompt: a string, one string in an array, or token ids (one list).
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        let bad = || {
            ApiError::bad_field(
                "prompt",
                "prompt must be a string, an array of one string, or an array of token ids \
                 (one prompt per request)",
            )
        };
        let tokens = |v: &[Value]| -> Result<Vec<u32>, ApiError> {
            v.iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or_else(bad))
                .collect()
        };
        match &self.prompt {
            Value::String(s) => Ok(Prompt::Text(s.clone())),
            Value::Array(items) => match items.as_slice() {
                [Value::String(s)] => Ok(Prompt::Text(s.clone())),
                [Value::Array(ids)] => Ok(Prompt::Tokens(tokens(ids)?)),
                ids if !ids.is_empty() && ids.iter().all(Value::is_number) => {
                    Ok(Prompt::Tokens(tokens(ids)?))
                }
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

/// The [`PromptRequest`] for a prompt and its common fields; `context_left` is what the context
/// leaves after the prompt.
pub fn prompt_request(
    prompt: Prompt,
    common: &CommonFields,
    context_left: usize,
    namespace: Option<u64>,
    vocab_size: usize,
    defaults: &SamplingDefaults,
    constraint: Option<Constraint>,
) -> Result<PromptRequest, ApiError> {
    let (params, stop) = common.sampling(context_left, defaults)?;
    let logit_bias = common.logit_bias(vocab_size)?;
    Ok(PromptRequest {
        prompt,
        params,
        stop,
        namespace,
        logit_bias,
        ignore_eos: common.ignore_eos.unwrap_or(false),
        stop_token_ids: common.stop_token_ids(vocab_size)?,
        constraint,
        constraint_after: None,
        skip_special_tokens: common.skip_special_tokens.unwrap_or(true),
        prompt_logprobs: common.prompt_logprobs()?,
    })
}
