//! WGSL sources, embedded in the binary, and their assembly: the host prepends the shared
//! snippets a kernel needs, selected by the typed key (no free-form templating).

use super::{attention, embedding, kv_write, linear, rms_norm, rope, silu_mul, PipelineKey};
use super::{AttentionVariant, LinearVariant, TokenTile, WeightFormat};
use crate::gpu::PipelineSpec;

pub const STEP: &str = include_str!("../../shaders/common/step.wgsl");
pub const WEIGHTS: &str = include_str!("../../shaders/common/weights.wgsl");
pub const ATTENTION: &str = include_str!("../../shaders/common/attention.wgsl");
pub const ATTENTION_LANES: &str = include_str!("../../shaders/common/attention_lanes.wgsl");

/// The snippet that decodes one weight format (defines `w_load`, `w_decode`, `w_combine`).
pub fn weight_snippet(format: WeightFormat) -> &'static str {
    match format {
        WeightFormat::F32 => include_str!("../../shaders/common/weights_f32.wgsl"),
        WeightFormat::F16 => include_str!("../../shaders/common/weights_f16.wgsl"),
        WeightFormat::Bf16 => include_str!("../../shaders/common/weights_bf16.wgsl"),
        WeightFormat::Q8_0 => include_str!("../../shaders/common/weights_q8_0.wgsl"),
        WeightFormat::Q4_0 => include_str!("../../shaders/common/weights_q4_0.wgsl"),
        WeightFormat::Q4_1 => include_str!("../../shaders/common/weights_q4_1.wgsl"),
    }
}

/// Complete WGSL of a kernel variant (snippets first, kernel last).
pub fn wgsl(key: PipelineKey) -> String {
    let parts: Vec<&str> = match key {
        PipelineKey::Linear { format, variant, .. } => {
            let kernel = match variant {
                LinearVariant::Gpu => include_str!("../../shaders/linear/linear.wgsl"),
                LinearVariant::Subgroup => {
                    include_str!("../../shaders/linear/linear_subgroup.wgsl")
                }
            };
            vec![STEP, WEIGHTS, weight_snippet(format), kernel]
        }
        PipelineKey::Embedding { format } => vec![
            STEP,
            WEIGHTS,
            weight_snippet(format),
            include_str!("../../shaders/embedding/embedding.wgsl"),
        ],
        PipelineKey::RmsNorm => vec![STEP, include_str!("../../shaders/norm/rms_norm.wgsl")],
        PipelineKey::Rope => vec![STEP, include_str!("../../shaders/rope/rope.wgsl")],
        PipelineKey::KvWrite => vec![STEP, include_str!("../../shaders/kv_write/kv_write.wgsl")],
        PipelineKey::SiluMul => {
            vec![STEP, include_str!("../../shaders/elementwise/silu_mul.wgsl")]
        }
        PipelineKey::AttnDecodePartials { variant: AttentionVariant::Workgroup, .. } => {
            vec![STEP, ATTENTION, include_str!("../../shaders/attention/decode_partials.wgsl")]
        }
        PipelineKey::AttnDecodePartials { variant: AttentionVariant::Lanes, .. } => vec![
            STEP,
            ATTENTION,
            ATTENTION_LANES,
            include_str!("../../shaders/attention/decode_partials_lanes.wgsl"),
        ],
        PipelineKey::AttnDecodeReduce { .. } => {
            vec![STEP, ATTENTION, include_str!("../../shaders/attention/decode_reduce.wgsl")]
        }
        PipelineKey::AttnPrefill { variant: AttentionVariant::Workgroup, .. } => {
            vec![STEP, ATTENTION, include_str!("../../shaders/attention/prefill.wgsl")]
        }
        PipelineKey::AttnPrefill { variant: AttentionVariant::Lanes, .. } => vec![
            STEP,
            ATTENTION,
            ATTENTION_LANES,
            include_str!("../../shaders/attention/prefill_lanes.wgsl"),
        ],
    };
    parts.join("\n")
}

/// Values of the `override` constants of a kernel variant.
pub fn constants(key: PipelineKey) -> Vec<(&'static str, f64)> {
    match key {
        PipelineKey::Linear { tile, variant, .. } => vec![("TT", f64::from(tile.tokens(variant)))],
        PipelineKey::AttnDecodePartials { head_dim, .. }
        | PipelineKey::AttnDecodeReduce { head_dim }
        | PipelineKey::AttnPrefill { head_dim, variant: AttentionVariant::Lanes, .. } => {
            vec![("HEAD_DIM", f64::from(head_dim))]
        }
        PipelineKey::AttnPrefill { head_dim, query_tile, variant: AttentionVariant::Workgroup } => {
            vec![("HEAD_DIM", f64::from(head_dim)), ("QT", f64::from(query_tile))]
        }
        _ => Vec::new(),
    }
}

/// Everything the pipeline cache needs to build `key`.
pub fn spec(key: PipelineKey) -> PipelineSpec {
    let bindings = match key {
        PipelineKey::Linear { .. } => linear::BINDINGS.to_vec(),
        PipelineKey::Embedding { .. } => embedding::BINDINGS.to_vec(),
        PipelineKey::RmsNorm => rms_norm::BINDINGS.to_vec(),
        PipelineKey::Rope => rope::BINDINGS.to_vec(),
        PipelineKey::KvWrite => kv_write::BINDINGS.to_vec(),
        PipelineKey::SiluMul => silu_mul::BINDINGS.to_vec(),
        PipelineKey::AttnDecodePartials { .. } => attention::DECODE_PARTIALS_BINDINGS.to_vec(),
        PipelineKey::AttnDecodeReduce { .. } => attention::DECODE_REDUCE_BINDINGS.to_vec(),
        PipelineKey::AttnPrefill { .. } => attention::PREFILL_BINDINGS.to_vec(),
    };
    PipelineSpec {
        label: format!("{key:?}"),
        source: wgsl(key),
        bindings,
        constants: constants(key),
    }
}

/// Every key a test should compile: all formats, tiles and a spread of head sizes.
pub fn all_keys() -> Vec<PipelineKey> {
    let mut keys = Vec::new();
    for format in WeightFormat::ALL {
        for variant in [LinearVariant::Gpu, LinearVariant::Subgroup] {
            for tile in [TokenTile::One, TokenTile::Many] {
                keys.push(PipelineKey::Linear { format, variant, tile });
            }
        }
        keys.push(PipelineKey::Embedding { format });
    }
    keys.extend([
        PipelineKey::RmsNorm,
        PipelineKey::Rope,
        PipelineKey::KvWrite,
        PipelineKey::SiluMul,
    ]);
    for head_dim in [16, 64, 128, 256] {
        keys.push(PipelineKey::AttnDecodeReduce { head_dim });
        for variant in [AttentionVariant::Workgroup, AttentionVariant::Lanes] {
            if variant == AttentionVariant::Lanes && !matches!(head_dim, 64 | 128) {
                continue;
            }
            keys.push(PipelineKey::AttnDecodePartials { head_dim, variant });
            let query_tile = attention::query_tile(variant, head_dim);
            keys.push(PipelineKey::AttnPrefill { head_dim, query_tile, variant });
        }
    }
    keys
}
