//! How a desktop application embeds kvrun: load a model on its own thread, stream a chat reply
//! into the UI, let the user stop a reply midway, and read what each reply cost.
//!
//! ```sh
//! cargo run --release --example chat_app                 # the default model
//! cargo run --release --example chat_app -- model.gguf   # any supported model
//! ```

use std::io::Write;
use std::path::PathBuf;

use kvrun::engine::{
    default_model_path, EngineConfig, EngineHandle, OutputEvent, Prompt, PromptRequest, StreamEvent,
};
use kvrun::tokenizer::ChatMessage;

fn main() -> anyhow::Result<()> {
    let model = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(default_model_path);
    let mut cfg = EngineConfig::new(model);
    cfg.max_model_len = Some(2048);
    cfg.max_num_seqs = 2;
    // The engine runs on its own thread; the handle is cheap to clone into UI callbacks.
    let engine = EngineHandle::spawn(cfg)?;

    // 1. A reply streamed piece by piece, as a chat window shows it.
    let mut conversation = vec![ChatMessage::new("user", "What is the capital of France?")];
    let request = PromptRequest::new(Prompt::Chat(conversation.clone().into()), 64);
    let mut reply = String::new();
    let mut stream = engine.submit_prompt(request)?;
    while let Some(event) = stream.next_blocking() {
        match event {
            StreamEvent::Output(OutputEvent::Delta { text, .. }) => {
                print!("{text}");
                std::io::stdout().flush()?;
                reply.push_str(&text);
            }
            StreamEvent::Output(OutputEvent::Finished { reason, usage, text, timing, .. }) => {
                reply.push_str(&text);
                println!("{text}");
                println!(
                    "[{reason:?}: {} prompt tokens ({} from the prefix cache), {} generated, \
                     first token after {:.0} ms]",
                    usage.prompt_tokens,
                    usage.cached_tokens,
                    usage.completion_tokens,
                    timing.ttft_s * 1e3
                );
            }
            StreamEvent::Error(e) => anyhow::bail!("the request failed: {e}"),
            _ => {} // events this request did not ask for (prompt log-probabilities, …)
        }
    }

    // 2. The user asks a follow-up, then presses "stop" after a few words: cancel the request.
    // Its KV blocks come back; the conversation so far stays in the prefix cache.
    conversation.push(ChatMessage::new("assistant", reply));
    conversation.push(ChatMessage::new("user", "Tell me a long story about Paris."));
    let mut stream =
        engine.submit_prompt(PromptRequest::new(Prompt::Chat(conversation.into()), 200))?;
    let mut pieces = 0;
    while let Some(event) = stream.next_blocking() {
        match event {
            StreamEvent::Output(OutputEvent::Delta { text, .. }) => {
                print!("{text}");
                std::io::stdout().flush()?;
                pieces += 1;
                if pieces == 8 {
                    engine.cancel(stream.id); // the "stop" button
                }
            }
            StreamEvent::Output(OutputEvent::Finished { reason, usage, .. }) => {
                println!(
                    "\n[{reason:?} after {} tokens; {} of {} prompt tokens came from the cache]",
                    usage.completion_tokens, usage.cached_tokens, usage.prompt_tokens
                );
            }
            StreamEvent::Error(e) => anyhow::bail!("the request failed: {e}"),
            _ => {}
        }
    }
    engine.shutdown();
    Ok(())
}
