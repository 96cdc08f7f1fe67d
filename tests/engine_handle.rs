//! The embeddable API: an engine on its own thread, requests submitted from several threads
//! and from async code, each getting its own event stream; cancellation ends a stream (the
//! scheduler tests check its blocks come back); a refused request gets an error event.
//! Outputs equal the same requests run one at a time.

mod common;

use std::path::PathBuf;

use kvrun::engine::{
    CompletionRequest, Engine, EngineConfig, EngineHandle, OutputEvent, StreamEvent,
};
use kvrun::sched::FinishReason;

fn config() -> EngineConfig {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny-llama/tiny-llama-q.gguf");
    let mut cfg = EngineConfig::new(path);
    cfg.max_model_len = Some(128);
    cfg.max_num_seqs = 4;
    cfg.kv_cache_memory = Some(64 * 16 * 256);
    cfg
}

fn request(seed: u32, n: usize) -> CompletionRequest {
    let prompt: Vec<u32> = (0..20 + seed).map(|i| 3 + (i * 37 + seed * 11) % 250).collect();
    let mut r = CompletionRequest::new(prompt, n);
    r.ignore_eos = true;
    r
}

/// Drains a stream: (tokens, finish reason).
fn collect(stream: &mut kvrun::engine::RequestStream) -> (Vec<u32>, FinishReason) {
    let mut tokens = Vec::new();
    loop {
        match stream.next_blocking().expect("stream ended without Finished") {
            StreamEvent::Output(OutputEvent::Delta { token, .. }) => tokens.push(token),
            StreamEvent::Output(OutputEvent::Finished { reason, .. }) => return (tokens, reason),
            StreamEvent::Output(other) => panic!("not asked for: {other:?}"),
            StreamEvent::Error(e) => panic!("request failed: {e}"),
        }
    }
}

#[test]
fn threads_and_async_callers_share_one_engine() {
    if common::gpu().is_none() {
        return;
    }
    let mut alone = Engine::load(&config()).unwrap();
    let want: Vec<Vec<u32>> =
        (0..3).map(|i| alone.generate(&request(i, 10), |_| {}).unwrap().tokens).collect();
    drop(alone);

    let handle = EngineHandle::spawn(config()).unwrap();
    let threads: Vec<_> = (0..2)
        .map(|i| {
            let h = handle.clone();
            std::thread::spawn(move || collect(&mut h.submit(request(i, 10)).unwrap()))
        })
        .collect();
    // the third request from async code, polled by a minimal executor
    let mut stream = handle.submit(request(2, 10)).unwrap();
    let async_tokens = pollster::block_on(async {
        let mut tokens = Vec::new();
        while let Some(event) = stream.next().await {
            match event {
                StreamEvent::Output(OutputEvent::Delta { token, .. }) => tokens.push(token),
                StreamEvent::Output(OutputEvent::Finished { .. }) => break,
                StreamEvent::Output(other) => panic!("not asked for: {other:?}"),
                StreamEvent::Error(e) => panic!("{e}"),
            }
        }
        tokens
    });
    for (i, t) in threads.into_iter().enumerate() {
        let (tokens, reason) = t.join().unwrap();
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(tokens, want[i], "request {i} via a thread differs from running it alone");
    }
    assert_eq!(async_tokens, want[2], "the async request differs from running it alone");
    handle.shutdown();
}

#[test]
fn cancel_ends_the_stream_and_refusals_are_errors() {
    if common::gpu().is_none() {
        return;
    }
    let handle = EngineHandle::spawn(config()).unwrap();
    let mut stream = handle.submit(request(5, 100)).unwrap();
    // wait for the first token, then cancel
    match stream.next_blocking().unwrap() {
        StreamEvent::Output(OutputEvent::Delta { .. }) => {}
        other => panic!("expected a token first, got {other:?}"),
    }
    handle.cancel(stream.id);
    let (_, reason) = collect(&mut stream);
    assert_eq!(reason, FinishReason::Cancelled);
    // a refused request reports an error instead of hanging
    let mut bad = handle.submit(CompletionRequest::new(vec![1; 500], 4)).unwrap();
    match bad.next_blocking() {
        Some(StreamEvent::Error(e)) => assert!(e.contains("-c"), "error should name -c: {e}"),
        other => panic!("expected an error, got {other:?}"),
    }
    handle.shutdown();
}
