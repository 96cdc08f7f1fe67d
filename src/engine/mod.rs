//! The engine: loads a model onto a GPU with its tokenizer and KV bookkeeping, and runs steps.
//!
//! One step reads left to right: plan the tokens of each sequence → lay them out as a
//! [`ForwardBatch`] → `Model::forward` → sample → append tokens / detokenize.

mod config;
mod generate;
pub mod metrics;
mod perplexity;

use std::path::Path;
use std::sync::Arc;

pub use config::{kv_storage, EngineConfig, ResolvedConfig, DEFAULT_MAX_MODEL_LEN_CAP};
pub use generate::{GenerateOutput, GenerateRequest};
pub use perplexity::{PerplexityOptions, PerplexityReport};

use crate::gpu::{Gpu, GpuError};
use crate::kernels::Kernels;
use crate::kv::{KvError, KvLayout, KvManager};
use crate::loader::{LoadError, ModelFile};
use crate::model::{ForwardBatch, Logits, Model, ModelError, ModelOptions, SeqChunk};
use crate::tokenizer::{ChatTemplate, Tokenizer, TokenizerError};

/// Errors of the engine, each naming what to do.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    KvQuant(#[from] crate::quant::KvQuantError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("{0}")]
    Config(String),
    #[error(
        "the prompt has {prompt} tokens but the context is {max} tokens (-c/--max-model-len); \
         shorten the prompt or raise -c (this model supports up to {model_max})"
    )]
    PromptTooLong { prompt: usize, max: usize, model_max: usize },
    #[error("the prompt is empty; give some text")]
    EmptyPrompt,
    #[error("{0}")]
    Sampling(#[from] crate::sample::SampleError),
}

/// A model on a GPU, ready to run.
pub struct Engine {
    gpu: Arc<Gpu>,
    model: Model,
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    kv: KvManager,
    resolved: ResolvedConfig,
    model_max_len: usize,
}

impl Engine {
    /// Opens the GPU, reads the model file, uploads the weights and allocates the KV pool.
    pub fn load(cfg: &EngineConfig) -> Result<Self, EngineError> {
        let file = ModelFile::open(&cfg.model)?;
        let (resolved, layout) = ResolvedConfig::resolve(cfg, file.config())?;
        let tokenizer = Tokenizer::from_source(file.tokenizer_source()?)?;
        let chat_template = tokenizer.chat_template()?;
        let gpu = Arc::new(Gpu::open(&cfg.gpu)?);
        let kernels = Kernels::new(&gpu);
        let model = Model::load(gpu.clone(), &kernels, &file, model_options(&resolved))?;
        let kv = KvManager::new(layout, resolved.num_blocks)?;
        let model_max_len = file.config().max_position_embeddings;
        Ok(Engine { gpu, model, tokenizer, chat_template, kv, resolved, model_max_len })
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    pub fn config(&self) -> &ResolvedConfig {
        &self.resolved
    }

    pub fn kv_layout(&self) -> &KvLayout {
        self.kv.layout()
    }

    pub fn kv(&self) -> &KvManager {
        &self.kv
    }

    /// Checks a prompt of `len` tokens fits the context with room for one generated token.
    fn check_prompt(&self, len: usize) -> Result<(), EngineError> {
        if len == 0 {
            return Err(EngineError::EmptyPrompt);
        }
        if len >= self.resolved.max_model_len {
            return Err(EngineError::PromptTooLong {
                prompt: len,
                max: self.resolved.max_model_len,
                model_max: self.model_max_len,
            });
        }
        Ok(())
    }

    /// Computes `tokens` of sequence `seq` (positions `start_pos..`) in chunks of at most the
    /// step token budget, reserving KV slots as it goes. Returns the logits the last chunk asks for.
    fn prefill(
        &mut self,
        seq: u64,
        tokens: &[u32],
        start_pos: usize,
        logits: impl Fn(std::ops::Range<usize>) -> crate::model::LogitsWanted,
    ) -> Result<Vec<Logits>, EngineError> {
        let chunk_len = self.resolved.max_num_batched_tokens;
        let mut out = Vec::new();
        let mut done = 0;
        while done < tokens.len() {
            let n = chunk_len.min(tokens.len() - done);
            self.kv.reserve(seq, n)?;
            let table = self.kv.table(seq).expect("sequence registered").as_slice().to_vec();
            let chunk = SeqChunk {
                tokens: &tokens[done..done + n],
                start_pos: start_pos + done,
                block_table: &table,
                logits: logits(done..done + n),
            };
            let batch =
                ForwardBatch::new(&[chunk], self.resolved.block_size, self.model.query_tile());
            out.push(self.model.forward(&batch)?);
            done += n;
        }
        Ok(out)
    }
}

/// Model buffer sizes for a resolved configuration.
fn model_options(r: &ResolvedConfig) -> ModelOptions {
    ModelOptions {
        max_num_batched_tokens: r.max_num_batched_tokens,
        max_num_seqs: r.max_num_seqs,
        max_logit_rows: r.max_logit_rows,
        max_model_len: r.max_model_len,
        block_size: r.block_size,
        num_blocks: r.num_blocks,
    }
}

/// The model path to use when none is given: `$KVRUN_MODEL`, else the one `scripts/` fetches.
pub fn default_model_path() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("KVRUN_MODEL") {
        return p.into();
    }
    let rel = Path::new("assets/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if rel.exists() {
        return rel.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}
