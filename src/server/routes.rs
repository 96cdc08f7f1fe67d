//! The HTTP routes: parse and check a body, hand it to the engine through its handle, answer.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::anthropic::{self, AnthropicError};
use super::error::ApiError;
use super::openai::{self, ChatCompletionRequest, CommonFields, CompletionRequest};
use super::stream::{self, Generation, Kind, PromptReport};
use super::{status, AppState};
use super::{GenerationConfig, ReasoningParserMode};
use crate::constrain::{CallSyntax, Constraint};
use crate::engine::SamplingDefaults;
use crate::engine::{tenant_namespace, FrontendError, Prompt};
use crate::output::{
    prompt_closes_reasoning, prompt_opens_reasoning, template_reasons, AnswerParser, HarmonyParser,
    ReasoningParser, ToolCallFormat, ToolCallParser, HARMONY_CHANNEL, HARMONY_CONSTRAIN,
    HARMONY_MESSAGE, MISTRAL_ARGS, MISTRAL_CALLS, THINK_END, TOOL_CALL_CLOSE, TOOL_CALL_OPEN,
};
use crate::tokenizer::ChatMessage;

/// Largest request body accepted (bigger ones get a 413).
pub const MAX_BODY_BYTES: usize = 4 << 20;

pub fn router(state: Arc<AppState>) -> Router {
    let authed = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    Router::new()
        .merge(authed)
        .route("/", get(chat_page))
        .route("/health", get(health))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// The chat page (`GET /`): one HTML file in the binary, no build step and nothing fetched from
/// elsewhere; it streams chat over `/v1/chat/completions` and draws its KV panel from
/// `/metrics`.
const CHAT_PAGE: &str = include_str!("chat.html");

async fn chat_page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], CHAT_PAGE).into_response()
}

/// The tenant a request's API key belongs to (`--api-keys`).
#[derive(Clone, Debug)]
struct KeyTenant(String);

/// `Authorization: Bearer KEY` when the server has keys; a key from `--api-keys` also names the
/// request's tenant.
async fn authorize(State(state): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let opts = &state.opts;
    if opts.api_key.is_some() || !opts.api_keys.is_empty() {
        // OpenAI clients send `Authorization: Bearer KEY`, Anthropic's `x-api-key: KEY`
        let headers = req.headers();
        let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let given = bearer
            .and_then(|v| v.strip_prefix("Bearer "))
            .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
        let tenant = given.and_then(|k| opts.api_keys.get(k)).cloned();
        if let Some(tenant) = tenant {
            req.extensions_mut().insert(KeyTenant(tenant));
        } else if given.is_none() || given != opts.api_key.as_deref() {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing or wrong API key; send the server's --api-key (or a key of --api-keys) \
                 as `Authorization: Bearer KEY` (or `x-api-key: KEY`)",
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// A JSON body, or the OpenAI-shaped error that says what is wrong with it.
fn parse<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|e| {
        let status = e.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!("the request body is larger than {MAX_BODY_BYTES} bytes")
        } else {
            format!("cannot read the request body: {e}")
        };
        ApiError::new(status, message)
    })?;
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let message =
            format!("the request body is not valid JSON for this endpoint: {}", e.inner());
        match path.as_str() {
            "." | "?" => ApiError::bad_request(message),
            field => ApiError::bad_field(field, format!("{field}: {message}")),
        }
    })
}

/// A model name the server does not serve is a 404 (as vLLM and OpenAI answer).
fn check_model(state: &AppState, common: &CommonFields) -> Result<(), ApiError> {
    match &common.model {
        Some(m) if *m != state.opts.served_model_name => Err(ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "the model `{m}` does not exist; this server serves `{}` (GET /v1/models)",
                    state.opts.served_model_name
                ),
            )
        }),
        _ => Ok(()),
    }
}

/// The prefix-cache namespace of the request's tenant: the one its API key names, else the
/// one its tenant header (`--tenant-header`) names, else none (the shared namespace).
fn namespace(
    state: &AppState,
    headers: &HeaderMap,
    key_tenant: Option<&KeyTenant>,
) -> Result<Option<u64>, ApiError> {
    if let Some(KeyTenant(tenant)) = key_tenant {
        return Ok(Some(tenant_namespace(tenant)));
    }
    let Some(value) = headers.get(state.opts.tenant_header.as_str()) else { return Ok(None) };
    let tenant = value.to_str().map_err(|_| {
        ApiError::bad_request(format!(
            "the {} header is not visible ASCII",
            state.opts.tenant_header
        ))
    })?;
    Ok(Some(tenant_namespace(tenant)))
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    key_tenant: Option<Extension<KeyTenant>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = parse(body)?;
    chat(state, headers, key_tenant, req, Shape::OpenAi).await
}

/// `POST /v1/messages`: Anthropic's Messages API on the chat path, answered in its shapes.
async fn messages(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    key_tenant: Option<Extension<KeyTenant>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let body: serde_json::Value = parse(body)?;
    let req = anthropic::chat_request(&body, true)?;
    Ok(chat(state, headers, key_tenant, req, Shape::Anthropic).await?)
}

/// `POST /v1/messages/count_tokens`: the prompt tokens a Messages body would take.
async fn count_tokens(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let body: serde_json::Value = parse(body)?;
    let req = anthropic::chat_request(&body, false)?;
    check_model(&state, &req.common)?;
    let prompt = Prompt::Chat(req.conversation()?);
    let frontend = state.engine()?.frontend().clone();
    let ids = tokio::task::spawn_blocking(move || frontend.tokens(&prompt))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(ApiError::from)?;
    Ok(Json(json!({ "input_tokens": ids.len() })).into_response())
}

/// How an answer is written: OpenAI's chat shapes, or Anthropic's messages.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    OpenAi,
    Anthropic,
}

/// A chat request, answered in `shape`.
async fn chat(
    state: Arc<AppState>,
    headers: HeaderMap,
    key_tenant: Option<Extension<KeyTenant>>,
    req: ChatCompletionRequest,
    shape: Shape,
) -> Result<Response, ApiError> {
    check_model(&state, &req.common)?;
    let prompt = Prompt::Chat(req.conversation()?);
    let frontend = state.engine()?.frontend().clone();
    // with tools offered, the answer's tool calls are parsed (only the first unless parallel),
    // in the format of the model's family
    let template = frontend.tokenizer().chat_template_source();
    let format = state.opts.tool_call_parser.format(template);
    let tool_calls = req
        .tools_offered()?
        .map(|_| ToolCalls { format, parallel: req.parallel_tool_calls.unwrap_or(true) });
    // a required or named tool_choice is a grammar, as response_format is: one of them
    let syntax = call_syntax(&frontend, format, template);
    let constraint = match (req.tool_constraint(syntax)?, req.common.constraint()?) {
        (Some(_), Some((_, field))) => {
            return Err(ApiError::bad_field(
                field,
                format!(
                    "tool_choice (required or a named function) and {field} both constrain the \
                     answer; send one"
                ),
            ))
        }
        (Some(tools), None) => Some((tools, "tool_choice")),
        (None, other) => other,
    };
    let namespace = namespace(&state, &headers, key_tenant.as_deref())?;
    let harmony = format == ToolCallFormat::Harmony;
    let job = Job { kind: Kind::Chat, tool_calls, constraint, shape, echo: false, harmony };
    generate(state, namespace, prompt, &req.common, job).await
}

/// A tool-call marker as the grammar writes it: the special token (`<[id]>`) where the
/// vocabulary has one of that text, else the quoted text.
fn tag(frontend: &crate::engine::Frontend, text: &str) -> String {
    match frontend.tokenizer().special_token_id(text) {
        Some(id) => format!("<[{id}]>"),
        None => serde_json::to_string(text).expect("strings serialize"),
    }
}

/// How a required or named `tool_choice` writes calls in `format`; Mistral's v11 form
/// (`NAME[ARGS]{…}`) where the template writes `[ARGS]`, else its JSON array.
fn call_syntax(
    frontend: &crate::engine::Frontend,
    format: ToolCallFormat,
    template: Option<&str>,
) -> CallSyntax {
    match format {
        ToolCallFormat::Hermes => CallSyntax::Tagged {
            open: tag(frontend, TOOL_CALL_OPEN),
            close: tag(frontend, TOOL_CALL_CLOSE),
        },
        ToolCallFormat::Llama3Json => CallSyntax::Json,
        ToolCallFormat::Mistral if template.is_some_and(|t| t.contains(MISTRAL_ARGS)) => {
            CallSyntax::Named {
                open: tag(frontend, MISTRAL_CALLS),
                args: tag(frontend, MISTRAL_ARGS),
            }
        }
        ToolCallFormat::Mistral => CallSyntax::Array { open: tag(frontend, MISTRAL_CALLS) },
        ToolCallFormat::Harmony => CallSyntax::Harmony {
            channel: tag(frontend, HARMONY_CHANNEL),
            constrain: tag(frontend, HARMONY_CONSTRAIN),
            message: tag(frontend, HARMONY_MESSAGE),
        },
    }
}

/// A chat with tools offered: the format its calls are read in, and whether all of them are
/// kept (`parallel_tool_calls`) or the first.
#[derive(Clone, Copy, Debug)]
struct ToolCalls {
    format: ToolCallFormat,
    parallel: bool,
}

async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    key_tenant: Option<Extension<KeyTenant>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse(body)?;
    check_model(&state, &req.common)?;
    let prompt = req.prompt()?;
    let constraint = req.common.constraint()?;
    let namespace = namespace(&state, &headers, key_tenant.as_deref())?;
    let echo = req.echo.unwrap_or(false);
    let job = Job {
        kind: Kind::Completion,
        tool_calls: None,
        constraint,
        shape: Shape::OpenAi,
        echo,
        harmony: false,
    };
    generate(state, namespace, prompt, &req.common, job).await
}

/// What a generation endpoint asks of [`generate`] beside the prompt and common fields.
struct Job {
    kind: Kind,
    /// Parse the answer's tool calls.
    tool_calls: Option<ToolCalls>,
    /// The structured output asked for, with the field that asked.
    constraint: Option<(Constraint, &'static str)>,
    shape: Shape,
    /// Completions' `echo`: the prompt is written before the answer.
    echo: bool,
    /// A chat whose template writes gpt-oss's harmony messages: the answer is read by channel.
    harmony: bool,
}

/// Every generation endpoint: admit, tokenize, submit, then stream or collect the answer.
async fn generate(
    state: Arc<AppState>,
    namespace: Option<u64>,
    prompt: Prompt,
    common: &CommonFields,
    job: Job,
) -> Result<Response, ApiError> {
    let Job { kind, tool_calls, constraint, shape, echo, harmony } = job;
    let admission = Arc::new(state.admit()?);
    let engine = state.engine()?.clone();
    let n = common.choices(engine.config().max_num_seqs)?;
    let frontend = engine.frontend().clone();
    // a chat answer of a reasoning model is split: does its template write <think> blocks
    let reasons = match state.opts.reasoning_parser {
        ReasoningParserMode::None => false,
        ReasoningParserMode::Think => true,
        ReasoningParserMode::Auto => {
            frontend.tokenizer().chat_template_source().is_some_and(template_reasons)
        }
    };
    // how the prompt leaves the reasoning: (opened for the model, closed before the answer)
    let (ids, (opens_reasoning, closes_reasoning)) =
        tokio::task::spawn_blocking(move || match &prompt {
            Prompt::Chat(conversation) => {
                let text = frontend.chat_text(conversation)?;
                let how = (prompt_opens_reasoning(&text), prompt_closes_reasoning(&text));
                Ok::<_, FrontendError>((frontend.tokens(&Prompt::Text(text))?, how))
            }
            other => Ok((frontend.tokens(other)?, (false, false))),
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let context_left = engine.config().max_model_len.saturating_sub(ids.len());
    let vocab_size = engine.frontend().tokenizer().vocab_size();
    let defaults = match state.opts.generation_config {
        GenerationConfig::Auto => *engine.frontend().sampling_defaults(),
        GenerationConfig::Vllm => SamplingDefaults::default(),
    };
    let echo = echo.then(|| ids.clone());
    let req = openai::prompt_request(
        Prompt::Tokens(ids),
        common,
        context_left,
        namespace,
        vocab_size,
        &defaults,
        constraint.as_ref().map(|(c, _)| c.clone()),
    )?;
    let mut req = req;
    // markers that are special tokens in this vocabulary must reach the parser
    let markers = match (harmony, tool_calls) {
        (true, _) => ToolCallFormat::Harmony.special_markers(),
        (false, Some(t)) => t.format.special_markers(),
        (false, None) => &[],
    };
    let tok = engine.frontend().tokenizer();
    if markers.iter().any(|m| tok.special_token_id(m).is_some()) {
        req.skip_special_tokens = false;
    }
    let reasoning = kind == Kind::Chat && reasons && !harmony;
    if reasoning && !closes_reasoning {
        // the reasoning is free text, the answer after it constrained: where the prompt opened
        // the block, and (as vLLM's reasoning parsers decide) where it leaves the model to open
        // one itself (Qwen3 with thinking on); only a prompt that closed it is answered at once
        req.constraint_after = Some(THINK_END.to_string());
    }
    let wants_logprobs = req.params.logprobs.is_some();
    // an echoed prompt with log-probabilities needs its own, with as many alternatives
    let prompt = PromptReport {
        echo,
        logprobs: req.prompt_logprobs,
        echo_top: req.params.logprobs.unwrap_or(0),
    };
    if prompt.echo.is_some() && wants_logprobs {
        req.prompt_logprobs = Some(req.prompt_logprobs.unwrap_or(0).max(prompt.echo_top));
    }
    // compiling a grammar is CPU work (the first one builds the vocabulary's trie): off the
    // runtime's threads, as tokenizing is; its errors name the field that asked for it
    let field = constraint.map(|(_, field)| field);
    let frontend = engine.frontend().clone();
    // one request per choice, each its own sampler stream: with a seed, choice i samples with
    // seed + i (as vLLM's children do), so the choices differ and a rerun repeats them all
    let choices = tokio::task::spawn_blocking(move || {
        (0..n as u64)
            .map(|i| {
                let mut choice = req.clone();
                choice.params.seed = req.params.seed.wrapping_add(i);
                frontend.request(choice)
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(|e| {
        let is_grammar = matches!(e, FrontendError::Constraint(_));
        let mut api = ApiError::from(e);
        if is_grammar {
            api.param = field.map(str::to_string).or(api.param);
        }
        api
    })?;
    let mut generations = Vec::with_capacity(n);
    for req in choices {
        // a submit that fails drops the choices before it, which cancels them
        let events = engine.submit(req)?;
        let parallel = tool_calls.is_none_or(|t| t.parallel);
        let parser = match (kind, harmony) {
            (Kind::Completion, _) => None,
            (Kind::Chat, true) => {
                Some(AnswerParser::Harmony { parser: HarmonyParser::new(), parallel })
            }
            (Kind::Chat, false) => Some(AnswerParser::Tagged {
                reasoning: reasoning.then(|| ReasoningParser::new(opens_reasoning)),
                tools: tool_calls.map(|t| ToolCallParser::with_format(t.format)),
                parallel,
            }),
        };
        let admission = admission.clone();
        generations.push(Generation::new(
            engine.clone(),
            events,
            admission,
            parser,
            wants_logprobs,
            prompt.clone(),
        ));
    }
    let model = state.opts.served_model_name.clone();
    Ok(match (shape, common.stream()) {
        (Shape::OpenAi, true) => stream::sse(generations, kind, model, common.include_usage()),
        (Shape::OpenAi, false) => {
            Json(stream::collect(generations, kind, &model).await?).into_response()
        }
        (Shape::Anthropic, true) => {
            let one = generations.pop().expect("Anthropic's requests have no n: one choice");
            anthropic::sse(one, model)
        }
        (Shape::Anthropic, false) => {
            let chat = stream::collect(generations, kind, &model).await?;
            Json(anthropic::message(&chat, &model)).into_response()
        }
    })
}

async fn models(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let name = &state.opts.served_model_name;
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": name,
            "object": "model",
            "created": state.started,
            "owned_by": "kvrun",
            "root": name,
            "max_model_len": engine.config().max_model_len,
        }]
    }))
    .into_response())
}

/// `POST /tokenize` (vLLM's shape): `prompt` (+ `add_special_tokens`) or chat `messages`.
#[derive(Deserialize)]
struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    #[serde(default = "yes")]
    add_special_tokens: bool,
}

fn yes() -> bool {
    true
}

async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: TokenizeRequest = parse(body)?;
    check_model(&state, &CommonFields { model: req.model.clone(), ..CommonFields::default() })?;
    let engine = state.engine()?;
    let frontend = engine.frontend().clone();
    let tokens = tokio::task::spawn_blocking(move || match (req.prompt, req.messages) {
        (Some(text), None) => frontend
            .tokenizer()
            .encode(&text, req.add_special_tokens)
            .map_err(|e| ApiError::bad_request(e.to_string())),
        (None, Some(messages)) => {
            frontend.tokens(&Prompt::Chat(messages.into())).map_err(ApiError::from)
        }
        _ => Err(ApiError::bad_request("send exactly one of `prompt` and `messages`")),
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    Ok(Json(json!({
        "count": tokens.len(),
        "max_model_len": engine.config().max_model_len,
        "tokens": tokens,
    }))
    .into_response())
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = parse(body)?;
    check_model(&state, &CommonFields { model: req.model.clone(), ..CommonFields::default() })?;
    let engine = state.engine()?;
    let tokenizer_len = engine.frontend().tokenizer().vocab_size();
    if let Some(id) = req.tokens.iter().find(|&&id| id as usize >= tokenizer_len) {
        return Err(ApiError::bad_field(
            "tokens",
            format!("token id {id} is outside the vocabulary of {tokenizer_len} tokens"),
        ));
    }
    let text = engine
        .frontend()
        .tokenizer()
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(Json(json!({ "prompt": text })).into_response())
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.engine() {
        Ok(_) => status(StatusCode::OK),
        Err(e) => e.into_response(),
    }
}

async fn version() -> Response {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") })).into_response()
}

/// Prometheus exposition (OpenMetrics text); with `--metrics-vllm-names` every series twice.
async fn metrics(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let mut text = engine.metrics().encode();
    if state.opts.metrics_vllm_names {
        let body = text.strip_suffix("# EOF\n").unwrap_or(&text).to_string();
        text = format!("{body}{}", text.replace("kvrun:", "vllm:"));
    }
    Ok((
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        text,
    )
        .into_response())
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no such route; see GET /v1/models, POST /v1/chat/completions, POST /v1/completions",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "this route does not take that method")
}
