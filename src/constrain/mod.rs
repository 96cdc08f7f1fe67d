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
}

/// Whitespace JSON may hold between two of its tokens: at most 16 characters of it. llguidance's
/// default (any amount) lets a small model write newlines until `max_tokens`; llama.cpp's
/// JSON grammars bound it too. A schema's own `x-guidance` options replace this.
const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,16}";

impl Constraint {
    fn grammar(&self) -> Result<TopLevelGrammar, String> {
        let json = |mut schema: Value| {
            if let Value::Object(map) = &mut schema {
                map.entry("x-guidance").or_insert_with(
                    || serde_json::json!({ "whitespace_pattern": JSON_WHITESPACE }),
                );
            }
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
        Ok(GrammarMatcher { matcher, mask: None, error: None })
    }
}

/// One sequence's place in its grammar, with the mask of the token it samples next.
pub struct GrammarMatcher {
    matcher: Matcher,
    /// Computed by [`GrammarMatcher::compute_mask`] for the next token.
    mask: Option<SimpleVob>,
    /// The first error llguidance reported (the output then ends at the next token).
    error: Option<String>,
}

impl Clone for GrammarMatcher {
    fn clone(&self) -> Self {
        GrammarMatcher {
            matcher: self.matcher.deep_clone(),
            mask: self.mask.clone(),
            error: self.error.clone(),
        }
    }
}

impl fmt::Debug for GrammarMatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrammarMatcher")
            .field("has_mask", &self.mask.is_some())
            .field("error", &self.error)
            .finish()
    }
}

impl GrammarMatcher {
    /// Computes the next token's mask (the CPU work; the engine runs it beside the GPU's step).
    /// Once the grammar is complete and takes nothing more, only end-of-sequence is allowed; an
    /// error allows only end-of-sequence too.
    pub fn compute_mask(&mut self) {
        if self.mask.is_some() {
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
        self.error.is_some() || self.matcher.is_stopped()
    }

    /// The error that ended the output early, if any.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}
