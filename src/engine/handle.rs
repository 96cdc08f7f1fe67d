//! [`EngineHandle`]: an [`Engine`] on its own thread, for servers and applications that embed
//! kvrun. Submitting returns a [`RequestStream`] at once; the engine thread batches every
//! unfinished request into each step and sends each request its own events. A stream can be
//! read from a plain thread ([`RequestStream::next_blocking`]) or from async code
//! ([`RequestStream::next`]) without blocking the executor: the channel is runtime-agnostic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::mpsc as events;

use super::metrics::Metrics;
use super::{
    CompletionRequest, Engine, EngineConfig, EngineError, Frontend, OutputEvent, PromptRequest,
    ResolvedConfig,
};
use crate::sched::RequestId;

/// What a request's stream carries.
#[derive(Clone, Debug)]
pub enum StreamEvent {
    Output(OutputEvent),
    /// The request was refused or the engine failed; nothing follows.
    Error(String),
}

enum Command {
    Submit {
        id: RequestId,
        req: Box<CompletionRequest>,
        events: events::UnboundedSender<StreamEvent>,
    },
    Cancel(RequestId),
    Shutdown,
}

/// A cloneable handle to an engine running on its own thread.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    next_id: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
    frontend: Arc<Frontend>,
    config: Arc<ResolvedConfig>,
    thread: Arc<std::sync::Mutex<Option<JoinHandle<()>>>>,
}

/// The events of one request, in order; ends after `Finished` or `Error`.
pub struct RequestStream {
    pub id: RequestId,
    events: events::UnboundedReceiver<StreamEvent>,
}

impl RequestStream {
    /// The next event, waiting for it (do not call from inside an async runtime).
    pub fn next_blocking(&mut self) -> Option<StreamEvent> {
        self.events.blocking_recv()
    }

    /// The next event (async; works under any executor).
    pub async fn next(&mut self) -> Option<StreamEvent> {
        self.events.recv().await
    }
}

impl EngineHandle {
    /// Loads the engine on a new thread (the GPU is opened there); returns once it is ready.
    pub fn spawn(cfg: EngineConfig) -> Result<Self, EngineError> {
        let (commands, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("kvrun-engine".into())
            .spawn(move || match Engine::load(&cfg) {
                Ok(engine) => {
                    let ready = (
                        engine.metrics().clone(),
                        engine.frontend().clone(),
                        Arc::new(engine.config().clone()),
                    );
                    let _ = ready_tx.send(Ok(ready));
                    run(engine, rx);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|e| EngineError::Config(format!("cannot start the engine thread: {e}")))?;
        let (metrics, frontend, config) = ready_rx.recv().map_err(|_| EngineError::Stopped)??;
        Ok(EngineHandle {
            commands,
            next_id: Arc::new(AtomicU64::new(0)),
            metrics,
            frontend,
            config,
            thread: Arc::new(std::sync::Mutex::new(Some(thread))),
        })
    }

    /// Queues a request; its events arrive on the returned stream.
    pub fn submit(&self, req: CompletionRequest) -> Result<RequestStream, EngineError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = events::unbounded_channel();
        self.commands
            .send(Command::Submit { id, req: Box::new(req), events: tx })
            .map_err(|_| EngineError::Stopped)?;
        Ok(RequestStream { id, events: rx })
    }

    /// Queues a request stated as a prompt: rendered and tokenized on the caller's thread, then
    /// submitted. A bad request is refused here, before it reaches the engine.
    pub fn submit_prompt(&self, req: PromptRequest) -> Result<RequestStream, EngineError> {
        let req = self.frontend.request(req)?;
        self.submit(req)
    }

    /// Prompts to token ids (chat template, tokenizer, context length).
    pub fn frontend(&self) -> &Arc<Frontend> {
        &self.frontend
    }

    /// The engine's resolved configuration (block size, blocks, context, sequences).
    pub fn config(&self) -> &ResolvedConfig {
        &self.config
    }

    /// Cancels a request; its stream ends with a `Finished` event (reason `cancelled`) and its
    /// KV blocks come back.
    pub fn cancel(&self, id: RequestId) {
        let _ = self.commands.send(Command::Cancel(id));
    }

    /// The engine's Prometheus metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Stops the engine thread after the current step and waits for it.
    pub fn shutdown(&self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

/// The engine thread: take commands (wait for one when idle), run a step, route its events.
fn run(mut engine: Engine, commands: mpsc::Receiver<Command>) {
    let mut sinks: std::collections::HashMap<RequestId, events::UnboundedSender<StreamEvent>> =
        std::collections::HashMap::new();
    loop {
        let next = if engine.has_unfinished() {
            commands.try_recv().ok()
        } else {
            match commands.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        };
        if let Some(command) = next {
            match command {
                Command::Submit { id, req, events } => match engine.add_request_with_id(id, *req) {
                    Ok(()) => {
                        sinks.insert(id, events);
                    }
                    Err(e) => {
                        let _ = events.send(StreamEvent::Error(e.to_string()));
                    }
                },
                Command::Cancel(id) => {
                    if let (Some(event), Some(sink)) = (engine.cancel(id), sinks.remove(&id)) {
                        let _ = sink.send(StreamEvent::Output(event));
                    }
                }
                Command::Shutdown => return,
            }
            continue; // take every queued command before the next step
        }
        match engine.step() {
            Ok(events) => route(events, &mut sinks, &mut engine),
            Err(e) => {
                for (_, sink) in sinks.drain() {
                    let _ = sink.send(StreamEvent::Error(e.to_string()));
                }
                return;
            }
        }
    }
}

/// Sends each event to its request's stream; a stream whose reader is gone cancels its request.
fn route(
    events: Vec<OutputEvent>,
    sinks: &mut std::collections::HashMap<RequestId, events::UnboundedSender<StreamEvent>>,
    engine: &mut Engine,
) {
    for event in events {
        let id = event.id();
        let finished = matches!(event, OutputEvent::Finished { .. });
        let delivered = sinks.get(&id).is_some_and(|s| s.send(StreamEvent::Output(event)).is_ok());
        if finished || !delivered {
            sinks.remove(&id);
        }
        if !delivered && !finished {
            engine.cancel(id);
        }
    }
}
