//! Host-side KV cache bookkeeping (no GPU types).

mod block_pool;
mod block_table;
mod bytes;
mod error;
mod layout;
mod manager;
mod plan;
#[cfg(test)]
mod proptests;

pub use block_pool::{BlockId, BlockPool};
pub use block_table::BlockTable;
pub use bytes::{format_bytes, parse_bytes};
pub use error::{ByteSizeProblem, KvError, LayoutDim, PlanField, SupportedDtypes};
pub use layout::{KvDtype, KvLayout, MAX_BLOCK_SIZE};
pub use manager::{KvManager, SeqId};
pub use plan::{plan, Plan, PlanInput};
