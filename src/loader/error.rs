//! [`LoadError`]: everything that can go wrong opening a model. Every message names the problem
//! and what to do about it; files are untrusted input, so none of these is ever a panic.

use crate::quant::QuantError;
use std::path::PathBuf;

/// The fix for a file that is damaged in a way no converter produces.
const REDOWNLOAD: &str = "the file is corrupt or incomplete; re-download or re-convert the model";

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The reason is printed, not chained as a `source`: `{e:#}` would print it twice.
    #[error("cannot read {path}: {error}; check the path and its permissions")]
    Io { path: PathBuf, error: std::io::Error },
    #[error(
        "cannot read {path}: it is {kind}, not a regular file; pass a .gguf file or an HF model \
         directory"
    )]
    NotRegular { path: PathBuf, kind: &'static str },
    /// An error about the contents of a model file, prefixed with the file (see
    /// [`LoadError::in_file`]).
    #[error("{path}: {error}")]
    InFile { path: PathBuf, error: Box<LoadError> },
    #[error(
        "the config says {config} but the tensors say {tensors}; the file is inconsistent, \
         re-download or re-convert the model"
    )]
    ConfigMismatch { config: String, tensors: String },
    #[error(
        "{path} is neither a .gguf file nor a directory; pass a GGUF file or an HF model directory \
         (config.json + *.safetensors + tokenizer.json)"
    )]
    UnknownSource { path: PathBuf },
    #[error(
        "not a GGUF file: it starts with bytes {found:02x?} instead of \"GGUF\"; pass a .gguf \
         file, or an HF directory for safetensors models"
    )]
    BadMagic { found: Vec<u8> },
    #[error(
        "this GGUF file is big-endian (version {version} read byte-swapped); kvrun reads \
         little-endian GGUF only; re-convert without --bigendian"
    )]
    BigEndian { version: u32 },
    #[error(
        "GGUF version {0} is not supported (kvrun reads versions 2 and 3); re-convert the model \
         with a current llama.cpp (convert_hf_to_gguf.py)"
    )]
    UnsupportedVersion(u32),
    #[error("file is truncated: {what} needs bytes {start}..{end} but the file has {file_len}; {REDOWNLOAD}")]
    Truncated { what: String, start: u64, end: u64, file_len: u64 },
    #[error(
        "{what} claims {count} entries but only {remaining} bytes remain in the file; {REDOWNLOAD}"
    )]
    CountTooLarge { what: String, count: u64, remaining: u64 },
    #[error("{what} has unknown GGUF value type {code}; {REDOWNLOAD}")]
    BadValueType { what: String, code: u32 },
    #[error("metadata key '{key}' nests arrays deeper than {max_depth} levels; {REDOWNLOAD}")]
    ArrayTooDeep { key: String, max_depth: usize },
    #[error("{what} is not valid UTF-8; {REDOWNLOAD}")]
    BadUtf8 { what: String },
    #[error("metadata key '{0}' appears twice; {REDOWNLOAD}")]
    DuplicateKey(String),
    #[error(
        "general.alignment is {0}, but it must be an integer that is a non-zero power of two \
         (llama.cpp's rule); {REDOWNLOAD}"
    )]
    BadAlignment(String),
    #[error("tensor '{name}' has {n_dims} dimensions but GGUF allows at most 4; {REDOWNLOAD}")]
    TooManyDims { name: String, n_dims: u32 },
    #[error(
        "tensor '{name}' has ggml type code {code} ({type_name}), which kvrun cannot read; use a \
         GGUF quantized to F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 or Q2_K..Q6_K \
         (e.g. Q4_K_M or Q8_0)"
    )]
    UnsupportedTensorType { name: String, code: u32, type_name: &'static str },
    #[error("tensor '{name}' has dims {dims:?} whose size overflows 64-bit/usize arithmetic; {REDOWNLOAD}")]
    ShapeOverflow { name: String, dims: Vec<u64> },
    #[error("tensor '{name}': {source}")]
    BadRow { name: String, source: QuantError },
    #[error("tensor '{name}' needs {expected} bytes for its type and shape but has {got}")]
    TensorByteLen { name: String, expected: usize, got: usize },
    #[error("tensor '{0}' appears twice; {REDOWNLOAD}")]
    DuplicateTensor(String),
    #[error(
        "tensor '{name}' starts at data offset {offset}, which is not a multiple of the file's \
         alignment {alignment}; {REDOWNLOAD}"
    )]
    Misaligned { name: String, offset: u64, alignment: u64 },
    #[error(
        "tensors '{first}' (data bytes {}..{}) and '{second}' (from byte {second_start}) \
         overlap; {REDOWNLOAD}",
        first_range.0,
        first_range.1
    )]
    OverlappingTensors { first: String, first_range: (u64, u64), second: String, second_start: u64 },
    #[error("tensor '{name}' is not in the model{hint}; the file does not match the architecture kvrun expects")]
    MissingTensor { name: String, hint: String },
    #[error(
        "the tokenizer produces token ids up to {max_id} but the model's embedding has only \
         {vocab_size} rows (vocab_size); the tokenizer does not belong to this model, use the \
         model's own tokenizer"
    )]
    TokenizerTooLarge { max_id: u32, vocab_size: usize },
    /// Printed, not chained, like `Io`.
    #[error("{0}")]
    Tokenizer(crate::tokenizer::TokenizerError),
    #[error("model config: {0}")]
    Config(String),
    #[error(
        "architecture '{found}' is not supported; kvrun runs {supported} (GGUF \
         general.architecture llama/qwen2/qwen3/gemma3/deepseek2; HF LlamaForCausalLM/\
         MistralForCausalLM/Qwen2ForCausalLM/Qwen3ForCausalLM/Gemma3ForCausalLM/\
         Gemma3ForConditionalGeneration/DeepseekV2ForCausalLM/DeepseekV3ForCausalLM)"
    )]
    UnsupportedArchitecture { found: String, supported: &'static str },
    #[error("{path}: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Safetensors { path: PathBuf, message: String },
}

impl LoadError {
    pub(crate) fn config(message: impl Into<String>) -> Self {
        LoadError::Config(message.into())
    }

    /// The error, naming `path` unless its message already names a file.
    pub fn in_file(self, path: &std::path::Path) -> Self {
        match self {
            LoadError::Io { .. }
            | LoadError::NotRegular { .. }
            | LoadError::InFile { .. }
            | LoadError::UnknownSource { .. }
            | LoadError::Json { .. }
            | LoadError::Safetensors { .. }
            | LoadError::MissingTensor { .. } => self,
            other => LoadError::InFile { path: path.to_path_buf(), error: Box::new(other) },
        }
    }

    /// The error without its [`LoadError::InFile`] wrapper (for matching on the kind).
    pub fn kind(&self) -> &LoadError {
        match self {
            LoadError::InFile { error, .. } => error.kind(),
            other => other,
        }
    }
}
