//! The crate's one `unsafe` operation: memory-mapping a weight file.

use super::error::LoadError;
use std::path::Path;

/// Map `path` read-only.
pub(super) fn map_file(path: &Path) -> Result<memmap2::Mmap, LoadError> {
    let io = |error| LoadError::Io { path: path.to_path_buf(), error };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: `Mmap::map` is unsafe because the returned `&[u8]` is only sound while no one
    // modifies or truncates the file (a write would change "immutable" bytes under us; a
    // truncation raises SIGBUS on access). kvrun maps model files read-only and never writes
    // them; like llama.cpp, candle and safetensors we require that nothing else rewrites a model
    // file while it is loaded. The bytes themselves are untrusted and every access is
    // bounds-checked by the GGUF and safetensors parsers.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(map)
}
