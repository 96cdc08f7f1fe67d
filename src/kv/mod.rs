//! Host-side KV cache bookkeeping (no GPU types).

mod bytes;
mod error;
mod layout;

pub use bytes::{format_bytes, parse_bytes};
pub use error::{ByteSizeProblem, KvError, LayoutDim, PlanField, SupportedDtypes};
pub use layout::{KvDtype, KvLayout, MAX_BLOCK_SIZE};

/// Identifies a sequence (a request's running state) in the KV cache.
pub type SeqId = u64;
