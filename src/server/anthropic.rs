//! Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`), which
//! Claude-Code-style agents and the `anthropic` SDK speak, mapped onto the chat path: a body is
//! read into the [`ChatCompletionRequest`] it means (system, text, `tool_use` and `tool_result`
//! blocks, tools, `tool_choice`, `thinking`), runs as a chat request, and its answer is written
//! in Anthropic's shapes — a `message` object, or the `message_start` …
//! `content_block_delta` … `message_stop` event stream — with Anthropic's error bodies.

use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::openai::ChatCompletionRequest;
use super::stream::Generation;

/// An error in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl AnthropicError {
    fn body(&self) -> Value {
        let e = &self.0;
        let kind = match e.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        };
        let message = match &e.param {
            Some(p) => format!("{p}: {}", e.message),
            None => e.message.clone(),
        };
        json!({ "type": "error", "error": { "type": kind, "message": message } })
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let body = self.body();
        let mut resp = (self.0.status, axum::Json(body)).into_response();
        if let Some(secs) = self.0.retry_after {
            resp.headers_mut().insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        resp
    }
}

/// The chat request an Anthropic Messages body means (also for `count_tokens`, which has no
/// `max_tokens`: `need_max_tokens` false).
pub fn chat_request(
    body: &Value,
    need_max_tokens: bool,
) -> Result<ChatCompletionRequest, ApiError> {
    let obj =
        body.as_object().ok_or_else(|| ApiError::bad_request("the body is not a JSON object"))?;
    let mut chat = Map::new();
    let mut messages = Vec::new();
    match obj.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(Value::Array(blocks)) => {
            let text = text_of(blocks, "system")?;
            messages.push(json!({"role": "system", "content": text}));
        }
        Some(_) => {
            return Err(ApiError::bad_field("system", "system must be a string or text blocks"))
        }
    }
    let list = obj
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad_field("messages", "messages must be an array of messages"))?;
    for (i, m) in list.iter().enumerate() {
        let field = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        if role != "user" && role != "assistant" {
            return Err(ApiError::bad_field(
                &field,
                format!("{field}.role {role:?} is not \"user\" or \"assistant\""),
            ));
        }
        match m.get("content") {
            Some(Value::String(s)) => messages.push(json!({"role": role, "content": s})),
            Some(Value::Array(blocks)) => {
                messages.extend(blocks_to_messages(role, blocks, &field)?)
            }
            _ => {
                return Err(ApiError::bad_field(
                    &field,
                    format!("{field}.content must be a string or an array of content blocks"),
                ))
            }
        }
    }
    chat.insert("messages".into(), Value::Array(messages));
    match obj.get("max_tokens") {
        Some(n) if n.is_u64() => {
            chat.insert("max_tokens".into(), n.clone());
        }
        None if !need_max_tokens => {}
        _ => {
            return Err(ApiError::bad_field(
                "max_tokens",
                "max_tokens is required (a whole number ≥ 1), as Anthropic's API requires it",
            ))
        }
    }
    for key in ["model", "temperature", "top_p", "top_k", "stream"] {
        if let Some(v) = obj.get(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    if let Some(stops) = obj.get("stop_sequences") {
        chat.insert("stop".into(), stops.clone());
    }
    if let Some(tools) = obj.get("tools").filter(|t| !t.is_null()) {
        let tools = tools
            .as_array()
            .ok_or_else(|| ApiError::bad_field("tools", "tools must be an array"))?;
        let mut out = Vec::with_capacity(tools.len());
        for (i, t) in tools.iter().enumerate() {
            let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::bad_field(
                    "tools",
                    format!("tools[{i}] has no name (a client tool needs name and input_schema)"),
                )
            })?;
            let mut function = json!({"name": name});
            if let Some(d) = t.get("description") {
                function["description"] = d.clone();
            }
            if let Some(s) = t.get("input_schema") {
                function["parameters"] = s.clone();
            }
            out.push(json!({"type": "function", "function": function}));
        }
        chat.insert("tools".into(), Value::Array(out));
    }
    if let Some(choice) = obj.get("tool_choice").filter(|c| !c.is_null()) {
        let kind = choice.get("type").and_then(Value::as_str).unwrap_or_default();
        let openai = match kind {
            "auto" => json!("auto"),
            "any" => json!("required"),
            "none" => json!("none"),
            "tool" => match choice.get("name").and_then(Value::as_str) {
                Some(name) => json!({"type": "function", "function": {"name": name}}),
                None => {
                    return Err(ApiError::bad_field(
                        "tool_choice",
                        "tool_choice type tool needs a name",
                    ))
                }
            },
            other => {
                return Err(ApiError::bad_field(
                    "tool_choice",
                    format!("tool_choice type {other:?} is not auto, any, tool or none"),
                ))
            }
        };
        chat.insert("tool_choice".into(), openai);
        if choice.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
            chat.insert("parallel_tool_calls".into(), Value::Bool(false));
        }
    }
    if let Some(thinking) = obj.get("thinking").filter(|t| !t.is_null()) {
        let on = match thinking.get("type").and_then(Value::as_str) {
            Some("enabled") => true,
            Some("disabled") => false,
            _ => {
                return Err(ApiError::bad_field(
                    "thinking",
                    "thinking must be {\"type\": \"enabled\", …} or {\"type\": \"disabled\"}",
                ))
            }
        };
        chat.insert("chat_template_kwargs".into(), json!({"enable_thinking": on}));
    }
    serde_json::from_value(Value::Object(chat)).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// The text of text blocks (other kinds refused).
fn text_of(blocks: &[Value], field: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for b in blocks {
        match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(t)) => text.push_str(t),
            _ => {
                return Err(ApiError::bad_field(
                    field,
                    format!("{field} holds a block kvrun cannot read here ({b}); send text blocks"),
                ))
            }
        }
    }
    Ok(text)
}

/// A message's content blocks as chat messages: text, an assistant's `tool_use` blocks as its
/// `tool_calls`, a user's `tool_result` blocks as `tool` messages (before the user's text);
/// `thinking` blocks of earlier turns are dropped (templates drop old reasoning).
fn blocks_to_messages(role: &str, blocks: &[Value], field: &str) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    let (mut text, mut calls) = (String::new(), Vec::new());
    for b in blocks {
        match b.get("type").and_then(Value::as_str).unwrap_or_default() {
            "text" => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or_default()),
            "thinking" | "redacted_thinking" => {}
            "tool_use" if role == "assistant" => {
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({
                    "id": b.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {"name": b.get("name").cloned().unwrap_or(Value::Null),
                                 "arguments": input.to_string()},
                }));
            }
            "tool_result" if role == "user" => {
                let content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => text_of(parts, field)?,
                    Some(other) => other.to_string(),
                };
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                    "content": content,
                }));
            }
            other => {
                return Err(ApiError::bad_field(
                    field,
                    format!(
                        "{field} holds a {other:?} block, which kvrun does not read ({role} \
                         messages may hold text{}); images and documents are not supported",
                        if role == "user" { " and tool_result" } else { ", thinking and tool_use" }
                    ),
                ))
            }
        }
    }
    if !text.is_empty() || !calls.is_empty() || out.is_empty() {
        let mut m = json!({"role": role, "content": text});
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        out.push(m);
    }
    Ok(out)
}

/// Anthropic's `stop_reason` for an OpenAI `finish_reason`.
fn stop_reason(finish: &str) -> &'static str {
    match finish {
        "length" => "max_tokens",
        "tool_calls" => "tool_use",
        _ => "end_turn",
    }
}

fn usage(u: &Value) -> Value {
    json!({
        "input_tokens": u["prompt_tokens"],
        "output_tokens": u["completion_tokens"],
        "cache_read_input_tokens": u["prompt_tokens_details"]["cached_tokens"],
        "cache_creation_input_tokens": 0,
    })
}

fn tool_use(call: &Value) -> Value {
    let args = call["function"]["arguments"].as_str().unwrap_or("{}");
    json!({
        "type": "tool_use",
        "id": format!("toolu_{:016x}", rand::random::<u64>()),
        "name": call["function"]["name"],
        "input": serde_json::from_str::<Value>(args).unwrap_or_else(|_| json!({})),
    })
}

fn message_id() -> String {
    format!("msg_{:016x}{:08x}", rand::random::<u64>(), rand::random::<u32>())
}

/// The `message` object of a collected chat answer (its OpenAI `chat.completion` object).
pub fn message(chat: &Value, model: &str) -> Value {
    let choice = &chat["choices"][0];
    let m = &choice["message"];
    let mut content = Vec::new();
    if let Some(r) = m["reasoning_content"].as_str().filter(|r| !r.is_empty()) {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if let Some(t) = m["content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": t}));
    }
    for call in m["tool_calls"].as_array().into_iter().flatten() {
        content.push(tool_use(call));
    }
    json!({
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice["finish_reason"].as_str().unwrap_or("stop")),
        "stop_sequence": null,
        "usage": usage(&chat["usage"]),
    })
}

fn event(kind: &str, data: Value) -> Event {
    Event::default().event(kind).data(data.to_string())
}

/// The answer as Anthropic's event stream: `message_start`, a `thinking` then a `text` block as
/// their deltas come (`thinking_delta`, `text_delta`), a `tool_use` block per call at the end
/// (its `input_json_delta`), `message_delta` with the stop reason and usage, `message_stop`.
pub fn sse(mut gen: Generation, model: String) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let start = json!({"type": "message_start", "message": {
            "id": message_id(), "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }});
        if tx.send(event("message_start", start)).await.is_err() {
            return;
        }
        // the open block: its index and kind ("thinking" or "text")
        let mut open: Option<(usize, &'static str)> = None;
        let mut next_index = 0;
        loop {
            let next = tokio::select! {
                next = gen.next() => next,
                _ = tx.closed() => return, // the client left: dropping `gen` cancels
            };
            let mut out = Vec::new();
            let (text, ending) = match next {
                Ok(piece) => piece,
                Err(e) => {
                    let _ = tx.send(event("error", AnthropicError(e).body())).await;
                    return;
                }
            };
            let end = ending.is_some();
            let (split, calls) = gen.parse(&text, end);
            for (kind, piece) in [("thinking", &split.reasoning), ("text", &split.content)] {
                if piece.is_empty() {
                    continue;
                }
                if open.map(|(_, k)| k) != Some(kind) {
                    if let Some((i, _)) = open.take() {
                        out.push(event(
                            "content_block_stop",
                            json!({"type": "content_block_stop", "index": i}),
                        ));
                    }
                    let block = if kind == "thinking" {
                        json!({"type": "thinking", "thinking": "", "signature": ""})
                    } else {
                        json!({"type": "text", "text": ""})
                    };
                    out.push(event("content_block_start", json!({
                        "type": "content_block_start", "index": next_index, "content_block": block,
                    })));
                    open = Some((next_index, kind));
                    next_index += 1;
                }
                let delta = if kind == "thinking" {
                    json!({"type": "thinking_delta", "thinking": piece})
                } else {
                    json!({"type": "text_delta", "text": piece})
                };
                let index = open.map_or(0, |(i, _)| i);
                out.push(event(
                    "content_block_delta",
                    json!({
                        "type": "content_block_delta", "index": index, "delta": delta,
                    }),
                ));
            }
            if let Some(mut ending) = ending {
                if let Some((i, _)) = open.take() {
                    out.push(event(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": i}),
                    ));
                }
                for call in &calls {
                    let mut block = json!({
                        "type": "tool_use", "id": format!("toolu_{:016x}", rand::random::<u64>()),
                        "name": call.name, "input": {},
                    });
                    out.push(event("content_block_start", json!({
                        "type": "content_block_start", "index": next_index, "content_block": block.take(),
                    })));
                    out.push(event("content_block_delta", json!({
                        "type": "content_block_delta", "index": next_index,
                        "delta": {"type": "input_json_delta", "partial_json": call.arguments.to_string()},
                    })));
                    out.push(event(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": next_index}),
                    ));
                    next_index += 1;
                }
                ending.tool_calls = !calls.is_empty();
                let u = super::stream::usage_json(&ending.usage);
                out.push(event("message_delta", json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason(ending.finish_reason()), "stop_sequence": null},
                    "usage": usage(&u),
                })));
                out.push(event("message_stop", json!({"type": "message_stop"})));
            }
            for e in out {
                if tx.send(e).await.is_err() {
                    return;
                }
            }
            if end {
                return;
            }
        }
    });
    super::stream::sse_response(rx)
}
