//! Number formats: GGUF weight blocks ([`GgmlType`]) and their CPU (de)quantizers.
//!
//! The CPU code here is the oracle for the GPU kernels: [`dequantize_row`] and [`quantize_row`]
//! match ggml (and llama.cpp's gguf-py) bit for bit; `tests/quant_fixtures.rs` checks that against
//! committed gguf-py output in `assets/fixtures/quant/`.

mod dequant;
mod ggml;
mod quantize;

pub use dequant::dequantize_row;
pub use ggml::{ggml_code_name, GgmlType, QuantError, QK, QK_K};
pub use quantize::quantize_row;
