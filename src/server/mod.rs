//! `kvrun serve`: an OpenAI-compatible HTTP server over an [`EngineHandle`] (axum on tokio).
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/chat/completions`, `POST /v1/completions` | generation; `stream: true` → SSE `data: {…}` chunks, then `data: [DONE]` |
//! | `GET /v1/models` | the served model |
//! | `POST /tokenize`, `POST /detokenize` | the model's tokenizer (vLLM's shapes) |
//! | `GET /health` | 200 when ready, 503 while the model loads |
//! | `GET /version` | kvrun's version |
//! | `GET /metrics` | Prometheus metrics (`kvrun:*`, and `vllm:*` with `--metrics-vllm-names`) |
//!
//! The server talks to the engine only through its handle: the front end renders and tokenizes
//! on the server's threads, the engine thread batches every request into its steps. A request
//! whose client goes away (a dropped stream or connection) is cancelled and its KV blocks come
//! back. Requests beyond `--max-num-seqs` + `--max-queued-requests` in flight get a 503 with
//! `Retry-After`. Errors have OpenAI's shape ([`error::ApiError`]).

mod anthropic;
mod error;
mod openai;
mod routes;
mod stream;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use axum::http::StatusCode;

use crate::engine::{EngineConfig, EngineHandle};
pub use error::ApiError;

/// How the server answers, apart from the engine's own configuration.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Requests to `/v1/*`, `/tokenize` and `/detokenize` must carry `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// More keys, each naming the tenant that uses it (`--api-keys FILE`); a request made with
    /// one of them belongs to that tenant, whatever its tenant header says.
    pub api_keys: std::collections::HashMap<String, String>,
    /// The model name clients send and `/v1/models` lists.
    pub served_model_name: String,
    /// Requests waiting beyond the running ones before new ones get a 503.
    pub max_queued_requests: usize,
    /// The header that names a request's tenant (its prefix-cache namespace).
    pub tenant_header: String,
    /// Also export every metric under vLLM's `vllm:` names (routers hard-code them).
    pub metrics_vllm_names: bool,
    /// Whether chat answers are split into `reasoning_content` and `content`.
    pub reasoning_parser: ReasoningParserMode,
    /// Whether requests take the model's recommended sampling settings for fields they omit.
    pub generation_config: GenerationConfig,
    /// The format tool calls are read (and, for `tool_choice`, written) in.
    pub tool_call_parser: ToolCallParserMode,
}

/// `--tool-call-parser` (vLLM's flag and names): the format a model writes tool calls in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolCallParserMode {
    /// The one the chat template teaches (harmony's `<|channel|>` → openai, `[TOOL_CALLS]` →
    /// mistral, `<tool_call>` → hermes, `<|python_tag|>` → llama3_json), else hermes.
    #[default]
    Auto,
    /// `<tool_call>` JSON or XML blocks (Hermes, Qwen2.5, Qwen3, Qwen3.5, Qwen3-Coder).
    #[value(alias = "qwen3_xml", alias = "qwen3_coder")]
    Hermes,
    /// Llama 3.1–3.3's `{"name", "parameters"}` objects.
    #[value(name = "llama3_json")]
    Llama3Json,
    /// Mistral's `[TOOL_CALLS]`.
    Mistral,
    /// gpt-oss's harmony messages (`to=functions.NAME`; the answer read by channel).
    #[value(alias = "harmony")]
    Openai,
}

impl ToolCallParserMode {
    /// The format for a model whose chat template is `template`.
    pub fn format(self, template: Option<&str>) -> crate::output::ToolCallFormat {
        use crate::output::ToolCallFormat;
        match self {
            ToolCallParserMode::Auto => {
                template.map(ToolCallFormat::from_template).unwrap_or_default()
            }
            ToolCallParserMode::Hermes => ToolCallFormat::Hermes,
            ToolCallParserMode::Llama3Json => ToolCallFormat::Llama3Json,
            ToolCallParserMode::Mistral => ToolCallFormat::Mistral,
            ToolCallParserMode::Openai => ToolCallFormat::Harmony,
        }
    }
}

/// `--generation-config` (vLLM's flag): where a request's omitted sampling fields come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GenerationConfig {
    /// The model's: HF `generation_config.json`, GGUF `general.sampling.*`.
    #[default]
    Auto,
    /// kvrun's own (temperature 1, no top-k/top-p/min-p, no penalty).
    Vllm,
}

/// `--reasoning-parser`: split `<think>…</think>` from chat answers into `reasoning_content`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningParserMode {
    /// When the model's chat template writes `</think>` (Qwen3, Qwen3.5, DeepSeek-R1).
    #[default]
    Auto,
    /// Always (`qwen3` and `deepseek_r1`, vLLM's names, mean this too).
    #[value(alias = "qwen3", alias = "deepseek_r1", alias = "deepseek-r1")]
    Think,
    /// Never: the reasoning stays in `content`.
    None,
}

/// What every handler shares.
pub struct AppState {
    pub opts: ServeOptions,
    /// Set once the model is loaded; `/health` is 503 until then.
    engine: OnceLock<EngineHandle>,
    /// Generation requests admitted and not yet answered (running + queued).
    in_flight: AtomicUsize,
    /// Unix seconds when the server started (`created` of the model object).
    pub started: u64,
}

impl AppState {
    pub fn new(opts: ServeOptions) -> Arc<Self> {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Arc::new(AppState {
            opts,
            engine: OnceLock::new(),
            in_flight: AtomicUsize::new(0),
            started,
        })
    }

    /// Makes the loaded engine available (the server turns ready).
    pub fn set_engine(&self, handle: EngineHandle) {
        let _ = self.engine.set(handle);
    }

    /// The engine, or a 503 while it loads.
    pub fn engine(&self) -> Result<&EngineHandle, ApiError> {
        self.engine.get().ok_or_else(|| ApiError::unavailable("the model is still loading", 5))
    }

    /// Requests admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Admits one generation request, or refuses it with a 503 when `--max-num-seqs` +
    /// `--max-queued-requests` are already in flight.
    fn admit(self: &Arc<Self>) -> Result<Admission, ApiError> {
        let engine = self.engine()?;
        let cap = engine.config().max_num_seqs + self.opts.max_queued_requests;
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= cap {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(ApiError::unavailable(
                format!(
                    "the server is at capacity ({cap} requests in flight: --max-num-seqs {} + \
                     --max-queued-requests {}); retry later",
                    engine.config().max_num_seqs,
                    self.opts.max_queued_requests
                ),
                1,
            ));
        }
        Ok(Admission { state: self.clone() })
    }
}

/// One admitted request's place in the in-flight count, given back when dropped.
struct Admission {
    state: Arc<AppState>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

pub use routes::MAX_BODY_BYTES;

/// The routes over `state` (tests serve this on their own listener).
pub fn router(state: Arc<AppState>) -> axum::Router {
    routes::router(state)
}

/// Binds `addr`, loads the engine on its own thread while `/health` answers 503, then serves
/// until Ctrl-C or SIGTERM (in-flight requests finish first). A model that fails to load ends
/// the server with that error.
pub fn run(addr: SocketAddr, engine_cfg: EngineConfig, opts: ServeOptions) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}; pick another --port"))?;
        let state = AppState::new(opts);
        let app = router(state.clone());
        eprintln!(
            "kvrun serve: listening on http://{} (loading the model)",
            listener.local_addr()?
        );
        let server = tokio::spawn(async move {
            axum::serve(listener, app).with_graceful_shutdown(shutdown_signal()).await
        });
        let loaded = tokio::task::spawn_blocking(move || EngineHandle::spawn(engine_cfg)).await?;
        let handle = match loaded {
            Ok(h) => h,
            Err(e) => {
                server.abort();
                return Err(anyhow::Error::new(e).context("cannot load the model"));
            }
        };
        let c = handle.config();
        let states = match c.state_pool_bytes() {
            0 => String::new(),
            bytes => format!(
                ", recurrent states {} ({} running + {} snapshot slots)",
                crate::kv::format_bytes(bytes),
                c.max_num_seqs,
                c.state_snapshots
            ),
        };
        eprintln!(
            "kvrun serve: ready: model {:?}, {} KV blocks of {} tokens ({}), context {}, {} \
             sequences{states}",
            state.opts.served_model_name,
            c.num_blocks,
            c.block_size,
            // the pool: whole blocks of the budget
            crate::kv::format_bytes(
                (c.num_blocks as f64 * c.block_size as f64 * c.kv_bytes_per_token) as u64
            ),
            c.max_model_len,
            c.max_num_seqs
        );
        state.set_engine(handle.clone());
        let served = server.await?;
        let shutdown = tokio::task::spawn_blocking(move || handle.shutdown()).await;
        served?;
        shutdown?;
        Ok(())
    })
}

/// Ctrl-C, or SIGTERM (how service managers and containers stop a server).
async fn shutdown_signal() {
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
    eprintln!("kvrun serve: shutting down");
}

/// A status-only answer (health checks).
fn status(code: StatusCode) -> axum::response::Response {
    axum::response::IntoResponse::into_response(code)
}
