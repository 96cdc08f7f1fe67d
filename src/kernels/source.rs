//! WGSL sources, embedded in the binary, and their assembly: the snippets of `shaders/common/`
//! that several kernel families share, and the join of what a key's [`super::Kernel`]
//! implementation names (no free-form templating). A family's own snippets live in its module.

use super::{KvCodeFormat, PipelineKey, WeightFormat};
use crate::gpu::PipelineSpec;

pub const STEP: &str = include_str!("../../shaders/common/step.wgsl");
pub const WEIGHTS: &str = include_str!("../../shaders/common/weights.wgsl");
/// `w_q`, `w_s`, `w_s4` of `WEIGHTS` from the kernel's storage buffers `wq`, `ws`.
pub const WEIGHTS_STORAGE: &str = include_str!("../../shaders/common/weights_storage.wgsl");
pub const ROPE_PAIR: &str = include_str!("../../shaders/common/rope_pair.wgsl");
pub const KV_POOL: &str = include_str!("../../shaders/common/kv_pool.wgsl");
pub const GLU: &str = include_str!("../../shaders/common/glu.wgsl");
pub const RMS: &str = include_str!("../../shaders/common/rms.wgsl");
pub const KV_CODEC: &str = include_str!("../../shaders/common/kv_codec.wgsl");
pub const U64: &str = include_str!("../../shaders/common/u64.wgsl");
/// `VocabParams` and `logit_key` (an f32 as an integer key that orders as the value does; NaN
/// has none): what the kernels that run one workgroup a logit row share.
pub const LOGIT_ROWS: &str = include_str!("../../shaders/common/logit_rows.wgsl");

/// The snippet of one KV code format (defines `KVQ_*`, `kvq_group_scale`, `kvq_encode`,
/// `kvq_raw8`, `kvq_raw2`).
pub fn kv_snippet(format: KvCodeFormat) -> &'static str {
    match format {
        KvCodeFormat::Fp8E4m3 => include_str!("../../shaders/common/kv_fp8_e4m3.wgsl"),
        KvCodeFormat::Fp8E5m2 => include_str!("../../shaders/common/kv_fp8_e5m2.wgsl"),
        KvCodeFormat::Int8 => include_str!("../../shaders/common/kv_int8.wgsl"),
        KvCodeFormat::Int4 => include_str!("../../shaders/common/kv_int4.wgsl"),
    }
}

/// The snippet that decodes one weight format (defines `w_load`, `w_decode`, `w_combine`).
pub fn weight_snippet(format: WeightFormat) -> &'static str {
    match format {
        WeightFormat::F32 => include_str!("../../shaders/common/weights_f32.wgsl"),
        WeightFormat::F16 => include_str!("../../shaders/common/weights_f16.wgsl"),
        WeightFormat::Bf16 => include_str!("../../shaders/common/weights_bf16.wgsl"),
        WeightFormat::Q8_0 => include_str!("../../shaders/common/weights_q8_0.wgsl"),
        WeightFormat::Q4_0 => include_str!("../../shaders/common/weights_q4_0.wgsl"),
        WeightFormat::Q4_1 => include_str!("../../shaders/common/weights_q4_1.wgsl"),
        WeightFormat::Q5_0 => include_str!("../../shaders/common/weights_q5_0.wgsl"),
        WeightFormat::Q4_K => include_str!("../../shaders/common/weights_q4_k.wgsl"),
        WeightFormat::Q5_K => include_str!("../../shaders/common/weights_q5_k.wgsl"),
        WeightFormat::Q6_K => include_str!("../../shaders/common/weights_q6_k.wgsl"),
        WeightFormat::MXFP4 => include_str!("../../shaders/common/weights_mxfp4.wgsl"),
    }
}

/// Complete WGSL of a kernel variant (snippets first, kernel last).
pub fn wgsl(key: PipelineKey) -> String {
    key.parts().join("\n")
}

/// Values of the `override` constants of a kernel variant.
pub fn constants(key: PipelineKey) -> Vec<(&'static str, f64)> {
    key.constants()
}

/// Everything the pipeline cache needs to build `key`.
pub fn spec(key: PipelineKey) -> PipelineSpec {
    PipelineSpec {
        label: format!("{key:?}"),
        source: wgsl(key),
        bindings: key.bindings(),
        constants: key.constants(),
    }
}

/// Every key a test should compile: each family's every variant ([`PipelineKey::all`]).
pub fn all_keys() -> Vec<PipelineKey> {
    PipelineKey::all()
}
