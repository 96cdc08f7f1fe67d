//! Structured outputs: a request's [`Constraint`] (a JSON schema, any JSON object, a regex, a
//! choice of strings, a Lark grammar) compiled by llguidance against the model's own vocabulary
//! ([`vocab::Vocab`]) into a [`GrammarMatcher`], which says before each sampled token which
//! tokens may come next (a bitmask over the logit row) and follows the tokens chosen.
//!
//! [`Grammars`] is built once per model, on the first constrained request (token bytes, trie
//! and llguidance's slices over them); each request then compiles its own grammar on the
//! caller's thread ([`crate::engine::Frontend::request`]). The engine computes the masks on a
//! CPU thread while the GPU runs the step, and applies them before sampling.
//!
//! The end: the trie's end tokens are the tokenizer's ([`crate::tokenizer::Tokenizer::eos_ids`]);
//! the mask allows them only where the grammar is complete (`a+` may end or go on). Once the
//! grammar can take nothing more ([`GrammarMatcher::is_finished`]) the output ends on that
//! token, as vLLM ends it, without a step to sample end-of-sequence.

pub mod vocab;

use std::fmt;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use toktrie::{SimpleVob, TokEnv};

/// What a request's output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid under this JSON schema (draft 2020-12, as llguidance supports it).
    JsonSchema(Value),
    /// Text matching this regular expression as a whole (Rust `regex` syntax).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect (`start: …`).
    Lark(String),
    /// An answer that is tool calls and nothing else, written in `syntax` (the format of the
    /// model family, which [`crate::output::ToolCallParser`] reads back): one call, or one or
    /// more with `parallel`. `tools`: (name, JSON schema of its arguments).
    ToolCalls { tools: Vec<(String, Value)>, parallel: bool, syntax: CallSyntax },
}

/// How [`Constraint::ToolCalls`] writes calls ([`crate::output::ToolCallFormat`]). Markers are
/// written as Lark writes them: a quoted literal, or a special token's `<[id]>`.
#[derive(Clone, Debug, PartialEq)]
pub enum CallSyntax {
    /// Hermes / Qwen: each call `open`, a newline, `{"name": …, "arguments": {…}}`, a newline,
    /// `close`; calls newline-separated.
    Tagged { open: String, close: String },
    /// Llama 3: each call `{"name": …, "parameters": {…}}`; calls joined by `; `.
    Json,
    /// Mistral (v3 tokenizers): `open`, a space, then a JSON array of `{"name": …,
    /// "arguments": {…}}`.
    Array { open: String },
    /// Mistral (v11 and later): each call `open`, its name, `args`, its arguments as JSON.
    Named { open: String, args: String },
    /// gpt-oss's harmony: one message `channel` `commentary to=functions.NAME ` `constrain`
    /// `json` `message` then its arguments as JSON (one call: each would be its own message).
    Harmony { channel: String, constrain: String, message: String },
}

impl CallSyntax {
    /// The Lark grammar of calls of `tools`.
    fn lark(&self, tools: &[(String, Value)], parallel: bool) -> String {
        // one call's JSON: {"name": <one of the tools>, <key>: <its arguments>}
        let call_json = |key: &str| {
            let calls: Vec<Value> = tools
                .iter()
                .map(|(name, params)| {
                    serde_json::json!({
                        "type": "object",
                        "properties": {"name": {"const": name}, key: params},
                        "required": ["name", key],
                        "additionalProperties": false,
                    })
                })
                .collect();
            let mut schema = match calls.as_slice() {
                [one] => one.clone(),
                _ => serde_json::json!({ "anyOf": calls }),
            };
            with_json_options(&mut schema);
            format!("body: %json {schema}\n")
        };
        let calls = |sep: &str| {
            if parallel {
                format!("start: call ({sep} call)*\n")
            } else {
                "start: call\n".to_string()
            }
        };
        match self {
            CallSyntax::Tagged { open, close } => format!(
                "{}call: {open} \"\\n\" body \"\\n\" {close}\n{}",
                calls("\"\\n\""),
                call_json("arguments")
            ),
            CallSyntax::Json => {
                format!("{}call: body\n{}", calls("\"; \""), call_json("parameters"))
            }
            CallSyntax::Array { open } => {
                let more = if parallel { " (\", \" body)*" } else { "" };
                format!("start: {open} \" [\" body{more} \"]\"\n{}", call_json("arguments"))
            }
            CallSyntax::Named { open, args } => {
                let mut g = calls("");
                let names: Vec<String> = (0..tools.len()).map(|i| format!("call{i}")).collect();
                g.push_str(&format!("call: {}\n", names.join(" | ")));
                for (i, (name, params)) in tools.iter().enumerate() {
                    let mut schema = params.clone();
                    with_json_options(&mut schema);
                    let name = serde_json::to_string(name).expect("strings serialize");
                    g.push_str(&format!(
                        "call{i}: {open} {name} {args} args{i}\nargs{i}: %json {schema}\n"
                    ));
                }
                g
            }
            CallSyntax::Harmony { channel, constrain, message } => {
                let mut g = String::from("start: call\n");
                let names: Vec<String> = (0..tools.len()).map(|i| format!("call{i}")).collect();
                g.push_str(&format!("call: {}\n", names.join(" | ")));
                for (i, (name, params)) in tools.iter().enumerate() {
                    let mut schema = params.clone();
                    with_json_options(&mut schema);
                    let to = serde_json::to_string(&format!("commentary to=functions.{name} "))
                        .expect("strings serialize");
                    g.push_str(&format!(
                        "call{i}: {channel} {to} {constrain} \"json\" {message} args{i}\n\
                         args{i}: %json {schema}\n"
                    ));
                }
                g
            }
        }
    }
}

/// Whitespace JSON may hold between two of its tokens: one space, or a newline and up to 20
/// spaces or tabs of indent (llama.cpp's JSON grammars' `space`). llguidance's default (any
/// amount) lets a small model write whitespace until `max_tokens`. A schema's own
/// `x-guidance` options replace this.
const JSON_WHITESPACE: &str = r"\x20|\x0A[\x20\x09]{0,20}";

/// kvrun's JSON options ([`JSON_WHITESPACE`]) on a schema that has none of its own.
fn with_json_options(schema: &mut Value) {
    if let Value::Object(map) = schema {
        map.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({ "whitespace_pattern": JSON_WHITESPACE }));
    }
}

impl Constraint {
    fn grammar(&self) -> Result<TopLevelGrammar, String> {
        let json = |mut schema: Value| {
            with_json_options(&mut schema);
            TopLevelGrammar::from_json_schema(schema)
        };
        Ok(match self {
            Constraint::JsonObject => json(serde_json::json!({ "type": "object" })),
            Constraint::JsonSchema(schema) => {
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(format!("a JSON schema is an object or a boolean, not {schema}"));
                }
                json(schema.clone())
            }
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::Choice(options) => {
                if options.is_empty() {
                    return Err("the choice list is empty; give at least one string".into());
                }
                let quoted: Vec<String> = options
                    .iter()
                    .map(|o| serde_json::to_string(o).expect("strings serialize"))
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", quoted.join(" | ")))
            }
            Constraint::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            Constraint::ToolCalls { tools, parallel, syntax } => {
                if tools.is_empty() {
                    return Err("no tools to call".into());
                }
                TopLevelGrammar::from_lark(syntax.lark(tools, *parallel))
            }
        })
    }

    /// What it is called in messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonObject => "JSON object",
            Constraint::JsonSchema(_) => "JSON schema",
            Constraint::Regex(_) => "regex",
            Constraint::Choice(_) => "choice",
            Constraint::Lark(_) => "grammar",
            Constraint::ToolCalls { .. } => "tool-call grammar",
        }
    }
}

/// The model's vocabulary compiled for llguidance: compiles requests' constraints.
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// From the model's tokenizer, its end-of-sequence ids and the number of token ids its
    /// logit rows hold.
    pub fn new(tok: &tokenizers::Tokenizer, n_vocab: usize, eos: &[u32]) -> Result<Self, String> {
        let env: TokEnv = Arc::new(vocab::Vocab::new(tok, n_vocab, eos)?);
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// A matcher at the start of the output, or the grammar's error (a bad schema, regex or
    /// grammar, or one past llguidance's size limits).
    pub fn compile(&self, constraint: &Constraint) -> Result<GrammarMatcher, String> {
        let parser =
            self.factory.create_parser(constraint.grammar()?).map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(GrammarMatcher { matcher, mask: None, error: None, waiting: None })
    }
}

/// One sequence's place in its grammar, with the mask of the token it samples next.
pub struct GrammarMatcher {
    matcher: Matcher,
    /// Computed by [`GrammarMatcher::compute_mask`] for the next token.
    mask: Option<SimpleVob>,
    /// The first error llguidance reported (the output then ends at the next token).
    error: Option<String>,
    /// Free text comes first, up to and including this text ([`GrammarMatcher::starting_after`]),
    /// with the bytes of the tokens so far.
    waiting: Option<Box<(String, Vec<u8>)>>,
}

impl Clone for GrammarMatcher {
    fn clone(&self) -> Self {
        GrammarMatcher {
            matcher: self.matcher.deep_clone(),
            mask: self.mask.clone(),
            error: self.error.clone(),
            waiting: self.waiting.clone(),
        }
    }
}

impl fmt::Debug for GrammarMatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrammarMatcher")
            .field("has_mask", &self.mask.is_some())
            .field("error", &self.error)
            .field("waiting_for", &self.waiting.as_ref().map(|w| &w.0))
            .finish()
    }
}

impl GrammarMatcher {
    /// The grammar applies only after the output has written `text` (a reasoning model's
    /// `</think>`, when its prompt opened the reasoning): tokens up to there are free.
    pub fn starting_after(mut self, text: impl Into<String>) -> Self {
        self.waiting = Some(Box::new((text.into(), Vec::new())));
        self
    }

    /// Whether the grammar applies to the next token (not still waiting for its start).
    pub fn is_active(&self) -> bool {
        self.waiting.is_none()
    }

    /// Computes the next token's mask (the CPU work; the engine runs it beside the GPU's step).
    /// Once the grammar is complete and takes nothing more, only end-of-sequence is allowed; an
    /// error allows only end-of-sequence too.
    pub fn compute_mask(&mut self) {
        if self.mask.is_some() || self.waiting.is_some() {
            return;
        }
        let mask = match self.matcher.compute_mask_or_eos() {
            Ok(m) => m,
            Err(e) => {
                self.note_error(e.to_string());
                self.eos_only()
            }
        };
        self.mask = Some(mask);
    }

    fn eos_only(&self) -> SimpleVob {
        match self.matcher.tok_env() {
            Ok(env) => env.tok_trie().eos_token_set(),
            Err(_) => SimpleVob::new(),
        }
    }

    fn note_error(&mut self, e: String) {
        tracing::warn!("structured output: {e}; ending the output");
        self.error.get_or_insert(e);
    }

    /// Sets every logit the grammar does not allow next to −∞ (ids past the mask too).
    pub fn apply(&mut self, logits: &mut [f32]) {
        if self.waiting.is_some() {
            return;
        }
        self.compute_mask();
        let mask = self.mask.as_ref().expect("computed");
        for (id, logit) in logits.iter_mut().enumerate() {
            if id >= mask.len() || !mask.is_allowed(id as u32) {
                *logit = f32::NEG_INFINITY;
            }
        }
    }

    /// Follows the token sampled (from logits [`GrammarMatcher::apply`] masked).
    pub fn consume(&mut self, token: u32) {
        self.mask = None;
        if let Some(w) = &mut self.waiting {
            let Ok(env) = self.matcher.tok_env() else { return };
            let (start, seen) = &mut **w;
            seen.extend_from_slice(env.tok_trie().token(token));
            let Some(at) = seen.windows(start.len()).position(|b| b == start.as_bytes()) else {
                return;
            };
            // what the token wrote after the start is the grammar's first text
            let rest = seen[at + start.len()..].to_vec();
            self.waiting = None;
            if !rest.is_empty() {
                let tokens = env.tokenize_bytes(&rest);
                if let Err(e) = self.matcher.consume_tokens(&tokens) {
                    self.note_error(e.to_string());
                }
            }
            return;
        }
        if self.error.is_some() || self.matcher.is_stopped() {
            return;
        }
        if let Err(e) = self.matcher.consume_token(token) {
            self.note_error(e.to_string());
        }
    }

    /// Whether the output is complete: the grammar takes no more tokens (or failed). The output
    /// stage ends the sequence on the token that completed it.
    pub fn is_finished(&self) -> bool {
        self.waiting.is_none() && (self.error.is_some() || self.matcher.is_stopped())
    }

    /// The error that ended the output early, if any.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}
