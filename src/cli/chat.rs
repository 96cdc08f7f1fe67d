//! `kvrun chat`: an interactive multi-turn chat on stdin/stdout. Each turn renders the whole
//! conversation with the model's chat template and submits it; the earlier turns are prefix-cache
//! hits, so only the new message (and the tail of the previous reply) is computed. Replies go to
//! stdout; prompts and per-turn figures to stderr. An empty line or end of input ends the chat.

use std::io::{BufRead, IsTerminal, Write};

use super::args::{KvArgs, ModelArgs, SamplingArgs};
use super::GlobalArgs;
use crate::engine::{Engine, GenerateOutput, Prompt, PromptRequest};
use crate::tokenizer::ChatMessage;

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System message that opens the conversation.
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub kv: KvArgs,
}

/// The per-turn line printed after each reply.
pub fn turn_summary(turn: usize, out: &GenerateOutput) -> String {
    let (prompt, cached) = (out.usage.prompt_tokens, out.usage.cached_tokens);
    format!(
        "[turn {turn}: {prompt} prompt tokens, {cached} cached, {} computed; TTFT {:.0} ms; {:.1} tok/s]",
        prompt - cached,
        out.timing.ttft_s * 1e3,
        out.decode_tokens_per_s()
    )
}

pub fn run(args: &ChatArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let cfg = args.kv.engine_config(args.model.path()?, global.gpu_options(), 1)?;
    let mut engine = Engine::load(&cfg)?;
    if engine.chat_template().is_none() {
        anyhow::bail!("the model has no chat template; use kvrun generate --raw instead");
    }
    let interactive = std::io::stdin().is_terminal();
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system.as_str()));
    }
    let mut stdout = std::io::stdout();
    let mut lines = std::io::stdin().lock().lines();
    for turn in 1.. {
        if interactive {
            eprint!("> ");
            std::io::stderr().flush()?;
        }
        let Some(line) = lines.next().transpose()? else { break };
        let line = line.trim_end_matches(['\r', '\n']);
        if line.trim().is_empty() {
            break;
        }
        messages.push(ChatMessage::new("user", line));
        let req = engine.frontend().request(PromptRequest {
            prompt: Prompt::Chat(messages.clone().into()),
            params: args.sampling.params(),
            stop: Vec::new(),
            namespace: None,
            logit_bias: Vec::new(),
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            constraint: None,
            constraint_after: None,
            skip_special_tokens: true,
            prompt_logprobs: None,
        })?;
        let out = engine.generate(&req, |piece| {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        })?;
        writeln!(stdout)?;
        stdout.flush()?;
        eprintln!("{}", turn_summary(turn, &out));
        messages.push(ChatMessage::new("assistant", out.text));
    }
    Ok(())
}
