//! One generation's answer: collected into one JSON object, or streamed as server-sent events.
//! A [`Generation`] dropped before its request finished (the client went away) cancels the
//! request, so its KV blocks come back, and counts a disconnect.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::error::ApiError;
use super::Admission;
use crate::engine::{EngineHandle, OutputEvent, RequestStream, StreamEvent};
use crate::output::{ReasoningParser, Split};
use crate::sched::{FinishReason, Usage};

/// Which endpoint the answer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

impl Kind {
    fn id_prefix(self) -> &'static str {
        match self {
            Kind::Chat => "chatcmpl-",
            Kind::Completion => "cmpl-",
        }
    }
}

/// A submitted request and its events; cancels the request if dropped unfinished.
pub struct Generation {
    engine: EngineHandle,
    events: RequestStream,
    finished: bool,
    /// Chat answers of reasoning models: splits `reasoning_content` from `content`.
    reasoning: Option<ReasoningParser>,
    _admission: Admission,
}

/// How a request ended, as the API reports it.
struct Ending {
    reason: FinishReason,
    usage: Usage,
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.finished {
            self.engine.cancel(self.events.id);
            self.engine.metrics().inc_disconnects();
        }
    }
}

impl Generation {
    pub(super) fn new(
        engine: EngineHandle,
        events: RequestStream,
        admission: Admission,
        reasoning: Option<ReasoningParser>,
    ) -> Self {
        Generation { engine, events, finished: false, reasoning, _admission: admission }
    }

    /// A piece of the answer as reasoning and content (all content without a parser); the
    /// last piece (`end`) also flushes what the parser held back.
    fn split(&mut self, text: &str, end: bool) -> Split {
        let Some(parser) = self.reasoning.as_mut() else {
            return Split { reasoning: String::new(), content: text.to_string() };
        };
        let mut split = parser.push(text);
        if end {
            let rest = parser.finish();
            split.reasoning.push_str(&rest.reasoning);
            split.content.push_str(&rest.content);
        }
        split
    }

    /// The next piece of text, or how the request ended (with its last text).
    async fn next(&mut self) -> Result<(String, Option<Ending>), ApiError> {
        let event = self.events.next().await;
        match event {
            Some(StreamEvent::Output(OutputEvent::Delta { text, .. })) => Ok((text, None)),
            Some(StreamEvent::Output(OutputEvent::Finished { reason, usage, text, .. })) => {
                self.finished = true;
                Ok((text, Some(Ending { reason, usage })))
            }
            Some(StreamEvent::Error(message)) => {
                self.finished = true;
                Err(ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, message))
            }
            None => {
                self.finished = true;
                Err(ApiError::new(
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "the engine stopped before the request finished",
                ))
            }
        }
    }

    /// Waits for the whole answer: one `chat.completion` or `text_completion` object.
    pub async fn collect(mut self, kind: Kind, model: &str) -> Result<Value, ApiError> {
        let (mut text, mut reasoning) = (String::new(), String::new());
        loop {
            let (piece, ending) = self.next().await?;
            let split = self.split(&piece, ending.is_some());
            text.push_str(&split.content);
            reasoning.push_str(&split.reasoning);
            if let Some(end) = ending {
                let mut message = json!({ "role": "assistant", "content": text });
                if self.reasoning.is_some() {
                    message["reasoning_content"] =
                        if reasoning.is_empty() { Value::Null } else { Value::String(reasoning) };
                }
                let choice = match kind {
                    Kind::Chat => json!({
                        "index": 0,
                        "message": message,
                        "logprobs": null,
                        "finish_reason": finish_reason(end.reason),
                    }),
                    Kind::Completion => json!({
                        "index": 0,
                        "text": text,
                        "logprobs": null,
                        "finish_reason": finish_reason(end.reason),
                    }),
                };
                return Ok(json!({
                    "id": response_id(kind),
                    "object": match kind { Kind::Chat => "chat.completion", Kind::Completion => "text_completion" },
                    "created": now(),
                    "model": model,
                    "choices": [choice],
                    "usage": usage_json(&end.usage),
                }));
            }
        }
    }

    /// Streams the answer as SSE: a chunk per piece of text, a last chunk with the finish
    /// reason, a usage chunk when asked, then `[DONE]`. An error midway is sent as an
    /// `{"error": …}` event before `[DONE]`.
    pub fn sse(self, kind: Kind, model: String, include_usage: bool) -> Response {
        let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
        tokio::spawn(async move {
            let chunks =
                Chunks { kind, id: response_id(kind), created: now(), model, include_usage };
            let mut gen = self;
            if kind == Kind::Chat {
                let first = chunks.chunk(json!({ "role": "assistant", "content": "" }), None);
                if tx.send(first).await.is_err() {
                    return;
                }
            }
            loop {
                let next = tokio::select! {
                    next = gen.next() => next,
                    _ = tx.closed() => return, // the client left: dropping `gen` cancels
                };
                let events = match next {
                    Ok((text, None)) if text.is_empty() => continue,
                    Ok((text, None)) => {
                        let split = gen.split(&text, false);
                        match chunks.pieces(&split) {
                            Some(event) => vec![event],
                            None => continue, // held back (a tag may be starting)
                        }
                    }
                    Ok((text, Some(end))) => {
                        let mut out = Vec::new();
                        let split = gen.split(&text, true);
                        out.extend(chunks.pieces(&split));
                        out.push(chunks.text("", Some(end.reason)));
                        if include_usage {
                            out.push(chunks.usage(&end.usage));
                        }
                        out.push(Event::default().data("[DONE]"));
                        out
                    }
                    Err(e) => vec![
                        Event::default().data(e.body().to_string()),
                        Event::default().data("[DONE]"),
                    ],
                };
                let last = gen.finished;
                for event in events {
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
                if last {
                    return;
                }
            }
        });
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
        });
        Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
    }
}

/// Builds the chunks of one stream.
struct Chunks {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

impl Chunks {
    fn envelope(&self, choices: Value, usage: Value) -> Event {
        let mut obj = json!({
            "id": self.id,
            "object": match self.kind { Kind::Chat => "chat.completion.chunk", Kind::Completion => "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if self.include_usage {
            obj["usage"] = usage;
        }
        Event::default().data(obj.to_string())
    }

    fn chunk(&self, delta: Value, reason: Option<FinishReason>) -> Event {
        let choice = json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": reason.map(finish_reason) });
        self.envelope(json!([choice]), Value::Null)
    }

    fn text(&self, text: &str, reason: Option<FinishReason>) -> Event {
        match self.kind {
            Kind::Chat => {
                let delta = if reason.is_some() { json!({}) } else { json!({ "content": text }) };
                self.chunk(delta, reason)
            }
            Kind::Completion => {
                let choice = json!({ "index": 0, "text": text, "logprobs": null, "finish_reason": reason.map(finish_reason) });
                self.envelope(json!([choice]), Value::Null)
            }
        }
    }

    /// The chunk of a split piece of text (`reasoning_content` and/or `content` in a chat
    /// delta), or `None` when both parts are empty.
    fn pieces(&self, split: &Split) -> Option<Event> {
        if split.reasoning.is_empty() && split.content.is_empty() {
            return None;
        }
        match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if !split.reasoning.is_empty() {
                    delta.insert("reasoning_content".into(), json!(split.reasoning));
                }
                if !split.content.is_empty() {
                    delta.insert("content".into(), json!(split.content));
                }
                Some(self.chunk(Value::Object(delta), None))
            }
            Kind::Completion => Some(self.text(&split.content, None)),
        }
    }

    fn usage(&self, usage: &Usage) -> Event {
        self.envelope(json!([]), usage_json(usage))
    }
}

/// OpenAI's `finish_reason`.
fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "abort",
    }
}

/// OpenAI's `usage`, with `prompt_tokens_details.cached_tokens` always present.
fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": { "cached_tokens": u.cached_tokens },
    })
}

fn response_id(kind: Kind) -> String {
    format!("{}{:016x}", kind.id_prefix(), rand::random::<u64>())
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
