//! `kvrun generate`: one prompt, streamed to stdout as it is produced.

use std::io::Write;

use super::args::{KvArgs, ModelArgs, SamplingArgs};
use super::GlobalArgs;
use crate::engine::{Engine, Prompt, PromptRequest};
use crate::tokenizer::ChatMessage;

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt.
    #[arg(short, long)]
    pub prompt: String,
    /// Use the prompt as is, without the model's chat template.
    #[arg(long)]
    pub raw: bool,
    /// System message (chat template only).
    #[arg(long)]
    pub system: Option<String>,
    /// Stop when the output contains this text (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Print a JSON object (text, token ids, timings) instead of streaming.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub kv: KvArgs,
}

/// What `--raw`, `--system` and `--prompt` ask for.
pub fn prompt(system: Option<&str>, user: &str, raw: bool) -> Prompt {
    if raw {
        return Prompt::Text(user.to_string());
    }
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(ChatMessage::new("system", s));
    }
    messages.push(ChatMessage::new("user", user));
    Prompt::Chat(messages.into())
}

pub fn run(args: &GenerateArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let cfg = args.kv.engine_config(args.model.path()?, global.gpu_options(), 1)?;
    let mut engine = Engine::load(&cfg)?;
    let req = engine.frontend().request(PromptRequest {
        prompt: prompt(args.system.as_deref(), &args.prompt, args.raw),
        params: args.sampling.params(),
        stop: args.stop.clone(),
        namespace: None,
        logit_bias: Vec::new(),
        ignore_eos: false,
        stop_token_ids: Vec::new(),
    })?;
    let mut stdout = std::io::stdout();
    let out = engine.generate(&req, |piece| {
        if !args.json {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens, {} generated ({:?}); TTFT {:.0} ms, decode {:.1} tok/s on {}]",
            out.usage.prompt_tokens,
            out.tokens.len(),
            out.finish_reason,
            out.timing.ttft_s * 1e3,
            out.decode_tokens_per_s(),
            engine.gpu().info.name
        );
    }
    Ok(())
}
