//! The output side of generation: incremental detokenization ([`Detokenizer`]), stop
//! conditions and finish reasons ([`OutputStream`]). Imports the tokenizer only.

mod detokenizer;
mod stop;

pub use detokenizer::Detokenizer;
pub use stop::{FinishReason, OutputDelta, OutputStream, StopCondition};
