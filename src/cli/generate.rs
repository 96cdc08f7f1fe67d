//! `kvrun generate`: one prompt, streamed to stdout as it is produced.

use std::io::Write;

use super::args::{KvArgs, ModelArgs, SamplingArgs};
use super::GlobalArgs;
use crate::constrain::Constraint;
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
    pub constraint: ConstraintArgs,
    #[command(flatten)]
    pub kv: KvArgs,
}

/// Structured output: at most one of these (llama.cpp's `--json-schema`, `--json-schema-file`,
/// `--grammar-file`; the grammar is llguidance's Lark, not GBNF).
#[derive(clap::Args, Debug, Default)]
#[group(multiple = false)]
pub struct ConstraintArgs {
    /// The output is JSON valid under this JSON schema (`{}` = any JSON object).
    #[arg(short = 'j', long)]
    pub json_schema: Option<String>,
    /// --json-schema read from a file.
    #[arg(long, value_name = "FILE")]
    pub json_schema_file: Option<std::path::PathBuf>,
    /// The output matches this regular expression as a whole.
    #[arg(long, value_name = "REGEX")]
    pub regex: Option<String>,
    /// The output follows this Lark grammar (llguidance's dialect: `start: …`).
    #[arg(long, value_name = "FILE")]
    pub grammar_file: Option<std::path::PathBuf>,
}

impl ConstraintArgs {
    /// The constraint asked for, read and parsed (errors name the flag).
    pub fn constraint(&self) -> anyhow::Result<Option<Constraint>> {
        let read = |flag: &str, path: &std::path::Path| {
            std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("{flag} {}: cannot read it: {e}", path.display()))
        };
        let schema = |flag: &str, text: &str| -> anyhow::Result<Constraint> {
            let v: serde_json::Value = serde_json::from_str(text)
                .map_err(|e| anyhow::anyhow!("{flag} is not JSON: {e}"))?;
            Ok(match v {
                serde_json::Value::Object(m) if m.is_empty() => Constraint::JsonObject,
                v => Constraint::JsonSchema(v),
            })
        };
        Ok(match self {
            ConstraintArgs { json_schema: Some(s), .. } => Some(schema("--json-schema", s)?),
            ConstraintArgs { json_schema_file: Some(p), .. } => {
                Some(schema("--json-schema-file", &read("--json-schema-file", p)?)?)
            }
            ConstraintArgs { regex: Some(r), .. } => Some(Constraint::Regex(r.clone())),
            ConstraintArgs { grammar_file: Some(p), .. } => {
                Some(Constraint::Lark(read("--grammar-file", p)?))
            }
            _ => None,
        })
    }
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
        constraint: args.constraint.constraint()?,
        constraint_after: None,
        skip_special_tokens: true,
        prompt_logprobs: None,
    })?;
    let mut stdout = std::io::stdout();
    let out = engine.generate(&req, |piece| {
        if !args.json {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
    })?;
    if args.json {
        // the output, and the KV cache it ran with (sized by flag, by default or from the
        // device's memory with --gpu-memory-utilization)
        let mut v = serde_json::to_value(&out)?;
        let r = engine.config();
        v["kv_cache"] = serde_json::json!({
            "kv_cache_memory": r.kv_cache_memory,
            "num_blocks": r.num_blocks,
            "block_size": r.block_size,
            "max_model_len": r.max_model_len,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
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
