//! A request's answer: its choices (`n`, one [`Generation`] each) collected into one JSON
//! object, or streamed as server-sent events. A [`Generation`] dropped before its request
//! finished (the client went away) cancels the request, so its KV blocks come back, and counts a
//! disconnect.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::error::ApiError;
use super::Admission;
use crate::engine::{EngineHandle, OutputEvent, RequestStream, StreamEvent};
use crate::output::{AnswerParser, Split, ToolCall};
use crate::sample::TokenLogprobs;
use crate::sched::{FinishReason, Usage};
use crate::tokenizer::Tokenizer;

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
    /// Chat answers: reasoning, content and tool calls in the model family's format (`None`:
    /// all content).
    parser: Option<AnswerParser>,
    /// Log-probabilities of tokens not yet sent (when the request asked for them).
    logprobs: Vec<TokenLogprobs>,
    /// Whether the request asked for log-probabilities (`logprobs` is then never `null`).
    wants_logprobs: bool,
    /// What the answer reports of its prompt.
    prompt: PromptReport,
    /// The prompt's token log-probabilities (with their ranks), once the engine sent them.
    prompt_logprobs: Option<Vec<(TokenLogprobs, u32)>>,
    /// The request's place in the in-flight count, shared by its choices.
    _admission: Arc<Admission>,
}

/// What an answer reports of its prompt, besides its usage.
#[derive(Clone, Debug, Default)]
pub struct PromptReport {
    /// Completions' `echo`: the prompt's ids, written before the answer's text (and, with
    /// `logprobs`, their log-probabilities before the answer's).
    pub echo: Option<Vec<u32>>,
    /// vLLM's `prompt_logprobs`: this many alternatives per prompt position.
    pub logprobs: Option<usize>,
    /// With `echo` and `logprobs`: the alternatives each echoed token shows.
    pub echo_top: usize,
}

/// How a request ended, as the API reports it.
pub(super) struct Ending {
    reason: FinishReason,
    pub usage: Usage,
    /// The answer holds tool calls: `finish_reason` is `"tool_calls"`.
    pub tool_calls: bool,
}

impl Ending {
    pub fn finish_reason(&self) -> &'static str {
        if self.tool_calls {
            "tool_calls"
        } else {
            finish_reason(self.reason)
        }
    }
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
        admission: Arc<Admission>,
        parser: Option<AnswerParser>,
        wants_logprobs: bool,
        prompt: PromptReport,
    ) -> Self {
        Generation {
            engine,
            events,
            finished: false,
            parser,
            logprobs: Vec::new(),
            wants_logprobs,
            prompt,
            prompt_logprobs: None,
            _admission: admission,
        }
    }

    /// What goes before the answer's first piece, taken once: completions' echoed prompt text
    /// with its log-probabilities in the endpoint's shape (`null` unless asked), and vLLM's
    /// `prompt_logprobs` (`None` unless asked).
    fn take_prompt(&mut self, kind: Kind) -> (Option<String>, Value, Option<Value>) {
        let tok = self.engine.frontend().tokenizer();
        let lps = self.prompt_logprobs.take().unwrap_or_default();
        let field = self.prompt.logprobs.take().map(|k| prompt_logprobs_json(tok, &lps, k));
        let Some(ids) = self.prompt.echo.take() else { return (None, Value::Null, field) };
        let text = tok.decode(&ids, false).unwrap_or_default();
        let logprobs = match (self.wants_logprobs, kind) {
            (true, Kind::Completion) => echo_logprobs_json(tok, &ids, &lps, self.prompt.echo_top),
            _ => Value::Null,
        };
        (Some(text), logprobs, field)
    }

    /// The log-probabilities gathered since the last call, in the endpoint's shape; `null`
    /// when the request asked for none. `offset`: the answer's length before them
    /// (completions' `text_offset`).
    fn take_logprobs(&mut self, kind: Kind, offset: usize) -> Value {
        if !self.wants_logprobs {
            return Value::Null;
        }
        let lps = std::mem::take(&mut self.logprobs);
        logprobs_json(self.engine.frontend().tokenizer(), kind, &lps, offset)
    }

    /// A piece of the answer as reasoning and content (all content without a parser); at the
    /// `end`, also what the parser held back and the tool calls found.
    pub(super) fn parse(&mut self, text: &str, end: bool) -> (Split, Vec<ToolCall>) {
        match self.parser.as_mut() {
            Some(p) => p.push(text, end),
            None => (Split { reasoning: String::new(), content: text.to_string() }, Vec::new()),
        }
    }

    /// The next piece of text (with its token's log-probabilities, when asked), or how the
    /// request ended (with its last text).
    pub(super) async fn next(&mut self) -> Result<(String, Option<Ending>), ApiError> {
        loop {
            return match self.events.next().await {
                Some(StreamEvent::Output(OutputEvent::PromptLogprobs { logprobs, .. })) => {
                    // before the first token: kept for the answer's prompt report
                    self.prompt_logprobs = Some(logprobs);
                    continue;
                }
                Some(StreamEvent::Output(OutputEvent::Delta { text, logprobs, .. })) => {
                    self.logprobs.extend(logprobs.map(|lp| *lp));
                    Ok((text, None))
                }
                Some(StreamEvent::Output(OutputEvent::Finished {
                    reason, usage, text, ..
                })) => {
                    self.finished = true;
                    Ok((text, Some(Ending { reason, usage, tool_calls: false })))
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
            };
        }
    }

    /// Waits for this choice's whole answer: its entry of `choices` (at `index`) and how it
    /// ended.
    async fn collect_choice(
        mut self,
        kind: Kind,
        index: usize,
    ) -> Result<(Value, Ending), ApiError> {
        let (mut text, mut reasoning) = (String::new(), String::new());
        let mut logprobs: Vec<TokenLogprobs> = Vec::new();
        loop {
            let (piece, ending) = self.next().await?;
            logprobs.append(&mut self.logprobs);
            let (split, calls) = self.parse(&piece, ending.is_some());
            text.push_str(&split.content);
            reasoning.push_str(&split.reasoning);
            if let Some(mut end) = ending {
                let reports = self.parser.as_ref().is_some_and(AnswerParser::reports_reasoning);
                let reasoning = reports.then_some(reasoning);
                let message = chat_message(&text, reasoning, &calls);
                end.tool_calls = !calls.is_empty();
                let (echo, echo_logprobs, prompt_logprobs) = self.take_prompt(kind);
                let echo = echo.unwrap_or_default();
                self.logprobs = logprobs;
                let logprobs = join_logprobs(echo_logprobs, self.take_logprobs(kind, echo.len()));
                let mut choice = match kind {
                    Kind::Chat => json!({
                        "index": index,
                        "message": message,
                        "logprobs": logprobs,
                        "finish_reason": end.finish_reason(),
                    }),
                    Kind::Completion => json!({
                        "index": index,
                        "text": echo + &text,
                        "logprobs": logprobs,
                        "finish_reason": end.finish_reason(),
                    }),
                };
                if let Some(p) = prompt_logprobs {
                    choice["prompt_logprobs"] = p;
                }
                return Ok((choice, end));
            }
        }
    }

    /// Streams this choice's answer into `tx`: a chunk per piece of text, a last chunk with
    /// the finish reason. An error midway is sent as an `{"error": …}` event.
    async fn stream_choice(
        mut self,
        chunks: &Chunks,
        index: usize,
        tx: &tokio::sync::mpsc::Sender<Event>,
    ) -> ChoiceEnd {
        let kind = chunks.kind;
        let mut sent = 0; // bytes of answer text sent (completions' text_offset)
        if kind == Kind::Chat {
            let first = chunks.chunk(index, json!({ "role": "assistant", "content": "" }), None);
            if tx.send(first).await.is_err() {
                return ChoiceEnd::Left;
            }
        }
        loop {
            let next = tokio::select! {
                next = self.next() => next,
                _ = tx.closed() => return ChoiceEnd::Left, // dropping `self` cancels
            };
            if next.is_ok() {
                // the prompt's report comes first (completions' echo, vLLM's prompt_logprobs)
                let (echo, logprobs, prompt_logprobs) = self.take_prompt(kind);
                if echo.is_some() || prompt_logprobs.is_some() {
                    let echo = echo.unwrap_or_default();
                    sent += echo.len();
                    let split = Split { reasoning: String::new(), content: echo };
                    let first = chunks.first_piece(index, &split, logprobs, prompt_logprobs);
                    if tx.send(first).await.is_err() {
                        return ChoiceEnd::Left;
                    }
                }
            }
            let (events, end) = match next {
                Ok((text, None)) if text.is_empty() => continue,
                Ok((text, None)) => {
                    let (split, _) = self.parse(&text, false);
                    if split.reasoning.is_empty() && split.content.is_empty() {
                        continue; // held back (a tag may be starting)
                    }
                    let logprobs = self.take_logprobs(kind, sent);
                    sent += split.content.len();
                    (vec![chunks.pieces(index, &split, logprobs)], None)
                }
                Ok((text, Some(mut end))) => {
                    let mut out = Vec::new();
                    let (split, calls) = self.parse(&text, true);
                    let logprobs = self.take_logprobs(kind, sent);
                    let empty = split.reasoning.is_empty() && split.content.is_empty();
                    if !empty || !logprobs.is_null() {
                        out.push(chunks.pieces(index, &split, logprobs));
                    }
                    if !calls.is_empty() {
                        let delta = json!({ "tool_calls": tool_calls_json(&calls, true) });
                        out.push(chunks.chunk(index, delta, None));
                        end.tool_calls = true;
                    }
                    out.push(chunks.text(index, "", Some(end.finish_reason())));
                    (out, Some(ChoiceEnd::Done(end.usage)))
                }
                Err(e) => {
                    (vec![Event::default().data(e.body().to_string())], Some(ChoiceEnd::Failed))
                }
            };
            for event in events {
                if tx.send(event).await.is_err() {
                    return ChoiceEnd::Left;
                }
            }
            if let Some(end) = end {
                return end;
            }
        }
    }
}

/// How a streamed choice ended.
enum ChoiceEnd {
    Done(Usage),
    /// An error, sent in the stream.
    Failed,
    /// The client went away.
    Left,
}

/// Waits for every choice's whole answer: one `chat.completion` or `text_completion` object,
/// `choices` in index order.
pub async fn collect(choices: Vec<Generation>, kind: Kind, model: &str) -> Result<Value, ApiError> {
    let answers = choices.into_iter().enumerate().map(|(i, g)| g.collect_choice(kind, i));
    let mut entries = Vec::new();
    let mut usages = Vec::new();
    for answer in futures_util::future::join_all(answers).await {
        let (choice, end) = answer?;
        entries.push(choice);
        usages.push(end.usage);
    }
    let mut answer = json!({
        "id": response_id(kind),
        "object": match kind { Kind::Chat => "chat.completion", Kind::Completion => "text_completion" },
        "created": now(),
        "model": model,
        "choices": entries,
        "usage": usage_json(&request_usage(&usages)),
    });
    if kind == Kind::Chat {
        // vLLM writes a chat's prompt_logprobs beside its choices (one prompt for them all)
        let choices = answer["choices"].as_array_mut().expect("an array");
        let found: Vec<Value> = choices
            .iter_mut()
            .filter_map(|c| c.as_object_mut()?.remove("prompt_logprobs"))
            .collect();
        if let Some(p) = found.into_iter().next() {
            answer["prompt_logprobs"] = p;
        }
    }
    Ok(answer)
}

/// Streams every choice as SSE, their chunks interleaved as they come (each names its choice's
/// `index`): chunks of text, a last chunk with each finish reason, a usage chunk when asked,
/// then `[DONE]`.
pub fn sse(choices: Vec<Generation>, kind: Kind, model: String, include_usage: bool) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let chunks = Chunks { kind, id: response_id(kind), created: now(), model, include_usage };
        let streams =
            choices.into_iter().enumerate().map(|(i, g)| g.stream_choice(&chunks, i, &tx));
        let mut usages = Vec::new();
        for end in futures_util::future::join_all(streams).await {
            match end {
                ChoiceEnd::Done(usage) => usages.push(usage),
                ChoiceEnd::Failed => {}
                ChoiceEnd::Left => return,
            }
        }
        if include_usage && !usages.is_empty() {
            let _ = tx.send(chunks.usage(&request_usage(&usages))).await;
        }
        let _ = tx.send(Event::default().data("[DONE]")).await;
    });
    sse_response(rx)
}

/// A request's usage from its choices' (in index order): the prompt counted once, as OpenAI
/// bills it (its tokens and cache hit as the first choice saw them), completion tokens added up.
fn request_usage(choices: &[Usage]) -> Usage {
    let mut usage = choices.first().copied().unwrap_or_default();
    for u in choices.iter().skip(1) {
        usage.completion_tokens += u.completion_tokens;
        usage.computed_prefill_tokens += u.computed_prefill_tokens;
        usage.num_preemptions += u.num_preemptions;
    }
    usage
}

/// The SSE response that sends what arrives on `rx` (with keep-alives) until it closes.
pub(super) fn sse_response(rx: tokio::sync::mpsc::Receiver<Event>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
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

    fn chunk(&self, index: usize, delta: Value, reason: Option<&'static str>) -> Event {
        let choice =
            json!({ "index": index, "delta": delta, "logprobs": null, "finish_reason": reason });
        self.envelope(json!([choice]), Value::Null)
    }

    fn text(&self, index: usize, text: &str, reason: Option<&'static str>) -> Event {
        match self.kind {
            Kind::Chat => {
                let delta = if reason.is_some() { json!({}) } else { json!({ "content": text }) };
                self.chunk(index, delta, reason)
            }
            Kind::Completion => {
                let choice = json!({
                    "index": index, "text": text, "logprobs": null, "finish_reason": reason,
                });
                self.envelope(json!([choice]), Value::Null)
            }
        }
    }

    /// The chunk of a split piece of text (`reasoning_content` and/or `content` in a chat
    /// delta) with its tokens' `logprobs` (`null` when not asked).
    /// [`Chunks::pieces`] with the prompt's `prompt_logprobs` (vLLM's field) in its choice.
    fn first_piece(
        &self,
        index: usize,
        split: &Split,
        logprobs: Value,
        prompt_logprobs: Option<Value>,
    ) -> Event {
        let mut choice = self.piece_choice(index, split, logprobs);
        if let Some(p) = prompt_logprobs {
            choice["prompt_logprobs"] = p;
        }
        self.envelope(json!([choice]), Value::Null)
    }

    fn pieces(&self, index: usize, split: &Split, logprobs: Value) -> Event {
        let choice = self.piece_choice(index, split, logprobs);
        self.envelope(json!([choice]), Value::Null)
    }

    fn piece_choice(&self, index: usize, split: &Split, logprobs: Value) -> Value {
        match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if !split.reasoning.is_empty() {
                    delta.insert("reasoning_content".into(), json!(split.reasoning));
                }
                if !split.content.is_empty() || split.reasoning.is_empty() {
                    delta.insert("content".into(), json!(split.content));
                }
                json!({
                    "index": index, "delta": delta, "logprobs": logprobs, "finish_reason": null,
                })
            }
            Kind::Completion => json!({
                "index": index, "text": split.content, "logprobs": logprobs, "finish_reason": null,
            }),
        }
    }

    fn usage(&self, usage: &Usage) -> Event {
        self.envelope(json!([]), usage_json(usage))
    }
}

/// A chat answer's `message`: its content (`null` beside tool calls when only whitespace is
/// left), `reasoning_content` when a reasoning parser ran (`null` if there was none), and
/// `tool_calls` when the answer made some.
fn chat_message(text: &str, reasoning: Option<String>, calls: &[ToolCall]) -> Value {
    let mut message = json!({ "role": "assistant", "content": text });
    if let Some(r) = reasoning {
        message["reasoning_content"] = if r.is_empty() { Value::Null } else { Value::String(r) };
    }
    if !calls.is_empty() {
        let text = text.trim();
        message["content"] = if text.is_empty() { Value::Null } else { json!(text) };
        message["tool_calls"] = tool_calls_json(calls, false);
    }
    message
}

/// OpenAI's `tool_calls`: `[{id, type, function: {name, arguments (a JSON string)}}]`, with
/// each call's `index` in a stream delta.
fn tool_calls_json(calls: &[ToolCall], indexed: bool) -> Value {
    let calls = calls.iter().enumerate().map(|(i, c)| {
        let mut v = json!({
            "id": format!("call_{:016x}", rand::random::<u64>()),
            "type": "function",
            "function": { "name": c.name, "arguments": c.arguments.to_string() },
        });
        if indexed {
            v["index"] = json!(i);
        }
        v
    });
    Value::Array(calls.collect())
}

/// A token's text as the log-probability entries show it (lossy where a token holds part of a
/// character).
fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// OpenAI's floor for a log-probability (JSON has no −∞).
fn finite(logprob: f32) -> f32 {
    if logprob.is_finite() {
        logprob
    } else {
        -9999.0
    }
}

/// Log-probabilities in the endpoint's shape: chat `{"content": [{token, logprob, bytes,
/// top_logprobs}]}`, completions `{tokens, token_logprobs, top_logprobs, text_offset}`
/// (`offset`: the answer's length before the first token; offsets advance by each token's
/// text).
fn logprobs_json(tok: &Tokenizer, kind: Kind, lps: &[TokenLogprobs], offset: usize) -> Value {
    match kind {
        Kind::Chat => {
            let entry = |id: u32, logprob: f32| {
                let text = token_text(tok, id);
                json!({ "token": text, "logprob": finite(logprob), "bytes": text.as_bytes() })
            };
            let content: Vec<Value> = lps
                .iter()
                .map(|lp| {
                    let mut e = entry(lp.token, lp.logprob);
                    e["top_logprobs"] =
                        lp.top.iter().map(|&(id, l)| entry(id, l)).collect::<Vec<_>>().into();
                    e
                })
                .collect();
            json!({ "content": content })
        }
        Kind::Completion => {
            let mut offsets = Vec::with_capacity(lps.len());
            let mut at = offset;
            let tokens: Vec<String> = lps
                .iter()
                .map(|lp| {
                    let text = token_text(tok, lp.token);
                    offsets.push(at);
                    at += text.len();
                    text
                })
                .collect();
            let top: Vec<Value> = lps
                .iter()
                .map(|lp| {
                    let map: serde_json::Map<String, Value> = lp
                        .top
                        .iter()
                        .map(|&(id, l)| (token_text(tok, id), json!(finite(l))))
                        .collect();
                    Value::Object(map)
                })
                .collect();
            json!({
                "tokens": tokens,
                "token_logprobs": lps.iter().map(|lp| finite(lp.logprob)).collect::<Vec<_>>(),
                "top_logprobs": top,
                "text_offset": offsets,
            })
        }
    }
}

/// vLLM's `prompt_logprobs`: `null` for the first position (it has no context), then per
/// position a map from token id (a string) to `{logprob, rank, decoded_token}`, holding the
/// prompt's token and the `k` most likely ones.
fn prompt_logprobs_json(tok: &Tokenizer, lps: &[(TokenLogprobs, u32)], k: usize) -> Value {
    let entry = |id: u32, logprob: f32, rank: u32| json!({ "logprob": finite(logprob), "rank": rank, "decoded_token": token_text(tok, id) });
    let mut out = vec![Value::Null];
    for (lp, rank) in lps {
        let mut map = serde_json::Map::new();
        for (i, &(id, l)) in (1u32..).zip(lp.top.iter().take(k)) {
            map.insert(id.to_string(), entry(id, l, i));
        }
        map.insert(lp.token.to_string(), entry(lp.token, lp.logprob, *rank));
        out.push(Value::Object(map));
    }
    Value::Array(out)
}

/// Completions' log-probabilities of an echoed prompt (`ids`; `lps` from its second token on):
/// the first token's are `null`, as OpenAI's legacy API wrote them; `k` alternatives each.
fn echo_logprobs_json(
    tok: &Tokenizer,
    ids: &[u32],
    lps: &[(TokenLogprobs, u32)],
    k: usize,
) -> Value {
    let mut offsets = Vec::with_capacity(ids.len());
    let mut at = 0;
    let tokens: Vec<String> = ids
        .iter()
        .map(|&id| {
            let text = token_text(tok, id);
            offsets.push(at);
            at += text.len();
            text
        })
        .collect();
    let mut token_logprobs = vec![Value::Null];
    let mut top = vec![Value::Null];
    for (lp, _) in lps {
        token_logprobs.push(json!(finite(lp.logprob)));
        let map: serde_json::Map<String, Value> =
            lp.top.iter().take(k).map(|&(id, l)| (token_text(tok, id), json!(finite(l)))).collect();
        top.push(Value::Object(map));
    }
    json!({ "tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
            "text_offset": offsets })
}

/// Two completions log-probability objects one after the other (`null` stands for none).
fn join_logprobs(first: Value, second: Value) -> Value {
    match (first, second) {
        (Value::Null, b) => b,
        (a, Value::Null) => a,
        (mut a, b) => {
            for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
                if let (Some(x), Some(y)) = (a[key].as_array_mut(), b[key].as_array()) {
                    x.extend(y.iter().cloned());
                }
            }
            a
        }
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
pub(super) fn usage_json(u: &Usage) -> Value {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::ToolCallParser;

    /// An answer with a call, through the parser: `content` null, `tool_calls` with the
    /// arguments as a JSON string (OpenAI's shape), each call its own id; stream deltas index
    /// the calls.
    #[test]
    fn tool_calls_take_openai_shape() {
        let mut p = ToolCallParser::new();
        let said = p.push("<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Paris\"}}\n");
        let (rest, calls) = p.finish();
        assert_eq!((said.as_str(), rest.as_str()), ("", ""));
        let m = chat_message(&rest, None, &calls);
        assert_eq!(m["content"], Value::Null);
        assert!(m.get("reasoning_content").is_none());
        let call = &m["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "w");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert!(call.get("index").is_none());
        let two = [calls[0].clone(), calls[0].clone()];
        let delta = tool_calls_json(&two, true);
        assert_eq!((delta[0]["index"].clone(), delta[1]["index"].clone()), (json!(0), json!(1)));
        assert_ne!(delta[0]["id"], delta[1]["id"]);
        // without calls the content stays as it is, reasoning null when there was none
        let m = chat_message(" hi ", Some(String::new()), &[]);
        assert_eq!(
            (m["content"].clone(), m["reasoning_content"].clone()),
            (json!(" hi "), Value::Null)
        );
    }
}
