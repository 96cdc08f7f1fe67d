//! Number formats: GGUF weight blocks ([`GgmlType`]) and KV-cache formats ([`KvCacheSpec`]),
//! with their CPU (de)quantizers.
//!
//! The CPU code here is the oracle for the GPU kernels:
//! - [`dequantize_row`] and [`quantize_row`] match ggml (and llama.cpp's gguf-py) bit for bit;
//!   `tests/quant_fixtures.rs` checks that against committed gguf-py output in
//!   `assets/fixtures/quant/`.
//! - The KV formats (f16, fp8-e4m3, fp8-e5m2, int8, int4; per-tensor / per-channel / per-token /
//!   per-head scales) are specified in `kv.rs` (head-block layout, valid combinations) and
//!   `kv_block.rs` (scales, rounding, error bounds); the FP8 codec in `fp8.rs` matches ml_dtypes
//!   bit for bit except where it saturates on purpose (`tests/kv_quant_fp8.rs`,
//!   `assets/fixtures/fp8/`). The optional rotation is `hadamard.rs`.

mod dequant;
mod fp8;
mod ggml;
mod hadamard;
mod kv;
mod kv_block;
#[cfg(test)]
mod kv_roundtrip_tests;
#[cfg(test)]
mod kv_tests;
mod quantize;

pub use dequant::dequantize_row;
pub use fp8::{
    fp8_e4m3_decode, fp8_e4m3_encode, fp8_e5m2_decode, fp8_e5m2_encode, FP8_E4M3_MAX, FP8_E5M2_MAX,
};
pub use ggml::{ggml_code_name, GgmlType, QuantError, QK, QK_K};
pub use hadamard::{check_rotation_dim, fwht_inplace};
pub use kv::{
    head_block_words, needs_staging, pool_heads, HeadBlockLayout, KvCacheSpec, KvFormat, KvPart,
    KvQuant, KvQuantError, ScaleGranularity,
};
pub use kv_block::{
    dequantize_element, dequantize_head_block, quantize_head_block, quantize_token,
};
pub use quantize::quantize_row;
