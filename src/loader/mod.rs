//! Model files → [`ModelConfig`] + tensors as byte slices of memory maps.
//!
//! [`ModelFile::open`] takes a `.gguf` file or an HF directory and presents both the same way:
//! tensors under **GGUF's canonical names** (`token_embd.weight`, `blk.N.attn_q.weight` …; HF
//! names are mapped at open), shapes outermost first, data straight from the map. Nothing is
//! converted or copied; the one format difference left is [`ModelConfig::rope_style`] (GGUF
//! Llama Q/K rows are permuted, HF's are not; see [`RopeStyle`]).

mod check;
mod config;
mod config_gguf;
mod config_hf;
mod error;
mod gguf;
mod gguf_value;
mod gguf_vocab;
mod gguf_writer;
mod hf;
mod mmap;

pub use config::{
    Activation, Architecture, AttentionKind, DeltaNet, GlobalLayers, HfConfigExtras, LayerSpec,
    Mla, ModelConfig, Moe, MoeScoring, Rope, RopeScaling, RopeStyle, MAX_SINK_HEADS,
};
pub use error::LoadError;

pub use gguf::{GgufFile, GgufTensorInfo, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use gguf_value::{GgufArray, GgufValue, GgufValueType};
pub use gguf_vocab::gguf_vocab;
pub use gguf_writer::GgufWriter;
pub use hf::{canonical_name, canonical_name_for, HfModel};

use crate::quant::{dequantize_row, GgmlType};
use crate::tokenizer::{Tokenizer, TokenizerSource};
use std::path::{Path, PathBuf};

enum PathKind {
    File,
    Dir,
}

/// What `path` is, following symlinks, with the operating system's own reason when it cannot
/// be read (not found, not a directory, permission denied) and the kind of thing it is when it
/// is neither a file nor a directory (a FIFO would block a reader forever).
fn path_kind(path: &Path) -> Result<PathKind, LoadError> {
    let meta = std::fs::metadata(path).map_err(|error| {
        let dangling = error.kind() == std::io::ErrorKind::NotFound
            && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        let error = if dangling {
            std::io::Error::new(error.kind(), "a symbolic link whose target does not exist")
        } else {
            error
        };
        LoadError::Io { path: path.to_path_buf(), error }
    })?;
    let ft = meta.file_type();
    if ft.is_dir() {
        return Ok(PathKind::Dir);
    }
    if ft.is_file() {
        return Ok(PathKind::File);
    }
    Err(LoadError::NotRegular { path: path.to_path_buf(), kind: special_kind(&ft) })
}

#[cfg(unix)]
fn special_kind(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special_kind(_: &std::fs::FileType) -> &'static str {
    "a special file"
}

/// Which kind of file a [`ModelFile`] was opened from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SourceFormat {
    Gguf,
    HfSafetensors,
}

/// One tensor, borrowed from the model's memory map.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorView<'a> {
    /// Canonical (GGUF) name.
    pub name: String,
    pub dtype: GgmlType,
    /// Outermost first: `[rows, cols]` for a matrix (GGUF dims reversed); rows of a Linear
    /// weight are output features, quant blocks run along `cols`.
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

impl TensorView<'_> {
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The whole tensor dequantized to f32, row-major in `shape` order (for CPU references and
    /// tests; GPU uploads take [`TensorView::data`] as it is).
    pub fn to_f32(&self) -> Result<Vec<f32>, LoadError> {
        let cols = self.shape.last().copied().unwrap_or(1);
        let mut out = vec![0f32; self.n_elements()];
        if cols == 0 {
            return Ok(out);
        }
        let bad_row = |source| LoadError::BadRow { name: self.name.clone(), source };
        let row_bytes = self.dtype.row_bytes(cols).map_err(bad_row)?;
        for (src, dst) in self.data.chunks_exact(row_bytes).zip(out.chunks_exact_mut(cols)) {
            dequantize_row(self.dtype, src, dst).map_err(bad_row)?;
        }
        Ok(out)
    }
}

enum Source {
    Gguf(GgufFile),
    Hf(Box<HfModel>),
}

/// The sampling settings a model file recommends ([`ModelFile::sampling_defaults`]); `None`
/// where it says nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct SamplingDefaults {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

/// An opened model: a GGUF file or an HF directory, chosen by what the path is.
pub struct ModelFile {
    path: PathBuf,
    source: Source,
    config: ModelConfig,
}

impl ModelFile {
    /// Open a `.gguf` file or an HF model directory and [check its
    /// tensors](ModelFile::check_tensors) against its config. Every error names the file.
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let file = Self::open_partial(path)?;
        file.check_tensors()?;
        Ok(file)
    }

    /// [`ModelFile::open`] without [`ModelFile::check_tensors`]: for reading the tensors of a
    /// file that is not a whole model (tests, inspection). Nothing may be sized from its config.
    pub fn open_partial(path: &Path) -> Result<Self, LoadError> {
        Self::open_unnamed(path).map_err(|e| e.in_file(path))
    }

    fn open_unnamed(path: &Path) -> Result<Self, LoadError> {
        let source = match path_kind(path)? {
            PathKind::Dir => Source::Hf(Box::new(HfModel::open(path)?)),
            PathKind::File if path.file_name().is_some_and(|n| n == "config.json") => {
                return Err(LoadError::UnknownSource { path: path.to_path_buf() });
            }
            PathKind::File => Source::Gguf(GgufFile::open(path)?),
        };
        let config = match &source {
            Source::Gguf(f) => ModelConfig::from_gguf(f)?,
            Source::Hf(h) => h.config().clone(),
        };
        Ok(ModelFile { path: path.to_path_buf(), source, config })
    }

    /// Checks that the tensors are the ones [`ModelConfig`] describes: every layer's weights
    /// present with the shapes the config implies, and the embedding's rows = `vocab_size`.
    /// Run before anything is sized from the config (buffers, `plan`), so an absurd config
    /// meets an error, not an allocation.
    pub fn check_tensors(&self) -> Result<(), LoadError> {
        check::check_tensors(self).map_err(|e| e.in_file(&self.path))
    }

    /// The model's tokenizer, checked against the embedding ([`ModelFile::check_tokenizer`]),
    /// its chat template's errors naming this file.
    pub fn tokenizer(&self) -> Result<Tokenizer, LoadError> {
        let tokenizer = Tokenizer::from_source(self.tokenizer_source()?)
            .map_err(|e| LoadError::Tokenizer(e).in_file(&self.path))?;
        let origin = match &self.source {
            Source::Gguf(_) => format!("{}: tokenizer.chat_template", self.path.display()),
            Source::Hf(_) => format!(
                "{}: the chat template (chat_template.jinja or tokenizer_config.json)",
                self.path.display()
            ),
        };
        let tokenizer = tokenizer.with_template_origin(origin);
        self.check_tokenizer(&tokenizer)?;
        Ok(tokenizer)
    }

    /// Checks that every token id `tokenizer` can produce has a row in the embedding (a larger
    /// vocabulary would index past it).
    pub fn check_tokenizer(&self, tokenizer: &Tokenizer) -> Result<(), LoadError> {
        let vocab_size = self.config.vocab_size;
        match tokenizer.max_token_id() {
            Some(max_id) if max_id as usize >= vocab_size => {
                Err(LoadError::TokenizerTooLarge { max_id, vocab_size }.in_file(&self.path))
            }
            _ => Ok(()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn format(&self) -> SourceFormat {
        match self.source {
            Source::Gguf(_) => SourceFormat::Gguf,
            Source::Hf(_) => SourceFormat::HfSafetensors,
        }
    }

    /// The parsed GGUF file, for metadata beyond [`ModelConfig`].
    pub fn gguf(&self) -> Option<&GgufFile> {
        match &self.source {
            Source::Gguf(f) => Some(f),
            Source::Hf(_) => None,
        }
    }

    /// The sampling settings the model's authors recommend: HF `generation_config.json`
    /// (`temperature`, `top_k`, `top_p`, `min_p`, `repetition_penalty`) or GGUF
    /// `general.sampling.*` (`temp`, `top_k`, `top_p`, `min_p`, `penalty_repeat`). Unset where
    /// absent; a malformed `generation_config.json` gives none (the tokenizer's read of it names
    /// the error).
    pub fn sampling_defaults(&self) -> SamplingDefaults {
        match &self.source {
            Source::Gguf(f) => SamplingDefaults {
                temperature: f.get_f32("general.sampling.temp"),
                top_k: f.get_u32("general.sampling.top_k").map(|k| k as usize),
                top_p: f.get_f32("general.sampling.top_p"),
                min_p: f.get_f32("general.sampling.min_p"),
                repetition_penalty: f.get_f32("general.sampling.penalty_repeat"),
            },
            Source::Hf(h) => {
                let path = h.dir().join("generation_config.json");
                let Ok(text) = std::fs::read_to_string(path) else {
                    return SamplingDefaults::default();
                };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
                    return SamplingDefaults::default();
                };
                let f =
                    |key: &str| v.get(key).and_then(serde_json::Value::as_f64).map(|x| x as f32);
                SamplingDefaults {
                    temperature: f("temperature"),
                    top_k: v.get("top_k").and_then(serde_json::Value::as_u64).map(|k| k as usize),
                    top_p: f("top_p"),
                    min_p: f("min_p"),
                    repetition_penalty: f("repetition_penalty"),
                }
            }
        }
    }

    /// What `config.json` says beyond [`ModelConfig`] (HF directories only).
    pub fn hf_extras(&self) -> Option<&HfConfigExtras> {
        match &self.source {
            Source::Gguf(_) => None,
            Source::Hf(h) => Some(h.extras()),
        }
    }

    /// The tensor with this canonical name.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, LoadError> {
        let missing = || LoadError::MissingTensor {
            name: name.to_string(),
            hint: format!(" ({} holds {} tensors)", self.path.display(), self.num_tensors()),
        };
        match &self.source {
            Source::Gguf(f) => {
                let info = f.tensor_info(name).ok_or_else(missing)?;
                Ok(TensorView {
                    name: name.to_string(),
                    dtype: info.ggml_type,
                    shape: info.dims.iter().rev().copied().collect(),
                    data: f.tensor_data(info),
                })
            }
            Source::Hf(h) => {
                let t = h.tensors().get(name).ok_or_else(missing)?;
                Ok(TensorView {
                    name: name.to_string(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    data: h.tensor_bytes(t),
                })
            }
        }
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        match &self.source {
            Source::Gguf(f) => f.tensor_info(name).is_some(),
            Source::Hf(h) => h.tensors().contains_key(name),
        }
    }

    /// Canonical names of every tensor (GGUF: file order; HF: sorted).
    pub fn tensor_names(&self) -> Vec<&str> {
        match &self.source {
            Source::Gguf(f) => f.tensors().iter().map(|t| t.name.as_str()).collect(),
            Source::Hf(h) => h.tensors().keys().map(String::as_str).collect(),
        }
    }

    fn num_tensors(&self) -> usize {
        match &self.source {
            Source::Gguf(f) => f.tensors().len(),
            Source::Hf(h) => h.tensors().len(),
        }
    }

    /// Sum of all tensor data sizes in bytes.
    pub fn weight_bytes(&self) -> u64 {
        match &self.source {
            Source::Gguf(f) => f.tensors().iter().map(|t| t.n_bytes as u64).sum(),
            Source::Hf(h) => h.tensors().values().map(|t| (t.end - t.start) as u64).sum(),
        }
    }

    /// Where to build the tokenizer from: the HF `tokenizer.json` (authoritative when present)
    /// or the GGUF's embedded vocabulary.
    pub fn tokenizer_source(&self) -> Result<TokenizerSource, LoadError> {
        match &self.source {
            Source::Gguf(f) => Ok(TokenizerSource::Gguf(gguf_vocab::gguf_vocab(f)?)),
            Source::Hf(h) => h.tokenizer_source(),
        }
    }
}
