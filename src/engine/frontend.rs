//! The front end: what a caller means by a prompt ([`Prompt`]: chat messages, text or token ids)
//! turned into what the engine runs ([`CompletionRequest`]: token ids, sampling, stop strings).
//! One place renders the chat template, tokenizes and checks a request against the context, for
//! the CLI, the server and embedding applications alike. [`Frontend`] is immutable and shared
//! (`Arc`) so callers tokenize on their own threads, never on the engine's.

use std::sync::OnceLock;

use crate::constrain::{Constraint, GrammarMatcher, Grammars};
use crate::loader::SamplingDefaults;
use crate::sample::SamplingParams;
use crate::tokenizer::{ChatMessage, ChatTemplate, TemplateVars, Tokenizer, TokenizerError};

use super::CompletionRequest;

/// What to generate from.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// A conversation, rendered with the model's chat template (ending with the assistant's turn).
    Chat(Conversation),
    /// Text used as is (BOS added when the tokenizer wants one).
    Text(String),
    /// Token ids used as is.
    Tokens(Vec<u32>),
}

/// A conversation and the variables its template gets beside it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    /// `chat_template_kwargs` (e.g. `enable_thinking: false`).
    pub vars: TemplateVars,
}

impl From<Vec<ChatMessage>> for Conversation {
    fn from(messages: Vec<ChatMessage>) -> Self {
        Conversation { messages, vars: TemplateVars::new() }
    }
}

/// A request as a caller states it; [`Frontend::request`] turns it into a [`CompletionRequest`].
#[derive(Clone, Debug)]
pub struct PromptRequest {
    pub prompt: Prompt,
    pub params: SamplingParams,
    /// Stop when the output contains one of these (the output is cut before it).
    pub stop: Vec<String>,
    /// Prefix-cache isolation key (a tenant): requests share cached blocks only within one.
    pub namespace: Option<u64>,
    /// (token id, added to its logit) for every sampled token (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    /// Keep generating past end-of-sequence tokens (benchmarks; vLLM's `ignore_eos`).
    pub ignore_eos: bool,
    /// Token ids that end the output as end-of-sequence does (vLLM's `stop_token_ids`).
    pub stop_token_ids: Vec<u32>,
    /// What the output must match (structured outputs), compiled by [`Frontend::request`].
    pub constraint: Option<Constraint>,
    /// The constraint applies only after the output has written this text (a reasoning
    /// model's `</think>` where the prompt opened its reasoning); `None`: from the start.
    pub constraint_after: Option<String>,
    /// Leave special tokens out of the output's text (the default; vLLM's
    /// `skip_special_tokens`). Off where they carry meaning, e.g. Mistral's `[TOOL_CALLS]`.
    pub skip_special_tokens: bool,
    /// Report the prompt's token log-probabilities with this many alternatives
    /// ([`CompletionRequest::prompt_logprobs`]).
    pub prompt_logprobs: Option<usize>,
}

impl PromptRequest {
    /// Greedy, `max_tokens` tokens, no stop strings, the shared namespace.
    pub fn new(prompt: Prompt, max_tokens: usize) -> Self {
        PromptRequest {
            prompt,
            params: SamplingParams { max_tokens, ..SamplingParams::default() },
            stop: Vec::new(),
            namespace: None,
            logit_bias: Vec::new(),
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            constraint: None,
            constraint_after: None,
            skip_special_tokens: true,
            prompt_logprobs: None,
        }
    }
}

/// Why a request cannot run; each message names the fix. [`FrontendError::field`] names the
/// request field at fault (for HTTP error bodies).
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error("the model has no chat template; send a plain text prompt (kvrun generate --raw, or /v1/completions)")]
    NoChatTemplate,
    #[error("the prompt is empty; send at least one token of text")]
    EmptyPrompt,
    #[error(
        "the prompt has {prompt_len} tokens but the context is {max_model_len} tokens \
         (-c/--max-model-len), which leaves no room to generate; shorten the prompt or raise -c \
         (this model supports up to {model_max_len})"
    )]
    PromptTooLong { prompt_len: usize, max_model_len: usize, model_max_len: usize },
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfVocab { id: u32, vocab_size: usize },
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error(transparent)]
    Sampling(#[from] crate::sample::SampleError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// A structured-output constraint that does not compile, or asks for what it cannot do.
    #[error("{0}")]
    Constraint(String),
}

impl FrontendError {
    /// The request field at fault, in OpenAI's names.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            FrontendError::NoChatTemplate => Some("messages"),
            FrontendError::EmptyPrompt
            | FrontendError::PromptTooLong { .. }
            | FrontendError::TokenOutOfVocab { .. } => Some("prompt"),
            FrontendError::ZeroMaxTokens => Some("max_tokens"),
            FrontendError::Sampling(e) => Some(match e {
                crate::sample::SampleError::Temperature(_) => "temperature",
                crate::sample::SampleError::TopK => "top_k",
                crate::sample::SampleError::TopP(_) => "top_p",
                crate::sample::SampleError::MinP(_) => "min_p",
                crate::sample::SampleError::Penalty(name, _) => name,
                crate::sample::SampleError::RepetitionPenalty(_) => "repetition_penalty",
                crate::sample::SampleError::TopLogprobs(_) => "top_logprobs",
                crate::sample::SampleError::MinTokens(..) => "min_tokens",
            }),
            FrontendError::Tokenizer(_) => None,
            FrontendError::Constraint(_) => Some("response_format"),
        }
    }
}

/// The model's tokenizer and chat template with the engine's context length: everything needed
/// to turn a [`PromptRequest`] into token ids, without the GPU.
pub struct Frontend {
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    /// Context length per sequence (`-c`).
    max_model_len: usize,
    /// The model's own context length (what `-c` may be raised to).
    model_max_len: usize,
    /// The vocabulary compiled for structured outputs, built on the first constrained request.
    grammars: OnceLock<Result<Grammars, String>>,
    /// The sampling settings the model file recommends (servers use them for fields a request
    /// leaves out).
    sampling_defaults: SamplingDefaults,
}

impl Frontend {
    /// Compiles the tokenizer's chat template, if it has one (an error if it does not compile).
    pub fn new(
        tokenizer: Tokenizer,
        max_model_len: usize,
        model_max_len: usize,
    ) -> Result<Self, TokenizerError> {
        let chat_template = tokenizer.chat_template()?;
        Ok(Frontend {
            tokenizer,
            chat_template,
            max_model_len,
            model_max_len,
            grammars: OnceLock::new(),
            sampling_defaults: SamplingDefaults::default(),
        })
    }

    /// With the model's recommended sampling settings ([`crate::loader::ModelFile::sampling_defaults`]).
    pub fn with_sampling_defaults(mut self, defaults: SamplingDefaults) -> Self {
        self.sampling_defaults = defaults;
        self
    }

    pub fn sampling_defaults(&self) -> &SamplingDefaults {
        &self.sampling_defaults
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// A conversation's prompt text: the chat template rendered, ending with the assistant's
    /// turn (what [`Frontend::tokens`] tokenizes, as `Prompt::Text` would).
    pub fn chat_text(&self, conversation: &Conversation) -> Result<String, FrontendError> {
        let template = self.chat_template.as_ref().ok_or(FrontendError::NoChatTemplate)?;
        Ok(template.render_with(&conversation.messages, true, &conversation.vars)?)
    }

    /// The prompt's token ids (chat template rendered, BOS as the tokenizer wants).
    pub fn tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, FrontendError> {
        let ids = match prompt {
            Prompt::Chat(conversation) => {
                self.tokenizer.encode(&self.chat_text(conversation)?, true)?
            }
            Prompt::Text(text) => self.tokenizer.encode(text, true)?,
            Prompt::Tokens(ids) => {
                let vocab_size = self.tokenizer.vocab_size();
                if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
                    return Err(FrontendError::TokenOutOfVocab { id, vocab_size });
                }
                ids.clone()
            }
        };
        if ids.is_empty() {
            return Err(FrontendError::EmptyPrompt);
        }
        Ok(ids)
    }

    /// `constraint` compiled against the model's vocabulary (its token trie is built once, on
    /// the first call).
    pub fn compile(&self, constraint: &Constraint) -> Result<GrammarMatcher, FrontendError> {
        let grammars = self.grammars.get_or_init(|| {
            let tok = &self.tokenizer;
            let n_vocab = tok.max_token_id().map_or(0, |m| m as usize + 1);
            Grammars::new(tok.inner(), n_vocab, tok.eos_ids())
        });
        let grammars = grammars.as_ref().map_err(|e| FrontendError::Constraint(e.clone()))?;
        grammars.compile(constraint).map_err(|e| {
            FrontendError::Constraint(format!("the {} does not compile: {e}", constraint.kind()))
        })
    }

    /// Renders and tokenizes `req` and checks it against the context and the sampling ranges:
    /// what passes here is accepted by the engine.
    pub fn request(&self, req: PromptRequest) -> Result<CompletionRequest, FrontendError> {
        let prompt = self.tokens(&req.prompt)?;
        if prompt.len() >= self.max_model_len {
            return Err(FrontendError::PromptTooLong {
                prompt_len: prompt.len(),
                max_model_len: self.max_model_len,
                model_max_len: self.model_max_len,
            });
        }
        let request = CompletionRequest {
            prompt,
            params: req.params,
            stop: req.stop,
            ignore_eos: req.ignore_eos,
            namespace: req.namespace,
            prompt_logits_from: None,
            prompt_logprobs_only: false,
            prompt_logprobs: req.prompt_logprobs,
            logit_bias: req.logit_bias,
            stop_token_ids: req.stop_token_ids,
            skip_special_tokens: req.skip_special_tokens,
            grammar: match (&req.constraint, req.constraint_after) {
                (Some(c), Some(after)) => Some(self.compile(c)?.starting_after(after)),
                (Some(c), None) => Some(self.compile(c)?),
                (None, _) => None,
            },
        };
        request.validate()?;
        Ok(request)
    }
}
