//! WGSL sources, embedded in the binary, and their assembly: the host prepends the shared
//! snippets a kernel needs, selected by the typed key (no free-form templating).

use super::bandwidth::{self, BandwidthLoads, BandwidthProbe};
use super::linear::RowLoad;
use super::rotate;
use super::{attention, embedding, kv_quantize, kv_write, linear, rms_norm, rope, rope_kv_write};
use super::{glu, PipelineKey};
use super::{AttentionVariant, KvCodeFormat, KvQuantKey, LaneLoads, LinearVariant, NormVariant};
use super::{RotateVariant, TokenTile, WeightFormat};
use crate::gpu::PipelineSpec;
use crate::loader::Activation;
use crate::quant::{KvQuant, ScaleGranularity};

pub const STEP: &str = include_str!("../../shaders/common/step.wgsl");
pub const WEIGHTS: &str = include_str!("../../shaders/common/weights.wgsl");
pub const ATTENTION: &str = include_str!("../../shaders/common/attention.wgsl");
pub const ATTENTION_LANES: &str = include_str!("../../shaders/common/attention_lanes.wgsl");
pub const ATTENTION_LANES_F16: &str = include_str!("../../shaders/common/attention_lanes_f16.wgsl");
pub const DECODE_LANES: &str = include_str!("../../shaders/common/decode_lanes.wgsl");
pub const PREFILL_LANES: &str = include_str!("../../shaders/common/prefill_lanes.wgsl");
pub const PREFILL_TILE: &str = include_str!("../../shaders/common/prefill_tile.wgsl");
pub const ROPE_PAIR: &str = include_str!("../../shaders/common/rope_pair.wgsl");
pub const ROTATE_IO: &str = include_str!("../../shaders/rotate/rotate_io.wgsl");
pub const KV_POOL: &str = include_str!("../../shaders/common/kv_pool.wgsl");
pub const GLU: &str = include_str!("../../shaders/common/glu.wgsl");
pub const RMS: &str = include_str!("../../shaders/common/rms.wgsl");
pub const KV_CODEC: &str = include_str!("../../shaders/common/kv_codec.wgsl");
pub const KV_QUANT: &str = include_str!("../../shaders/common/kv_quant.wgsl");
pub const KV_QUANT_LANES: &str = include_str!("../../shaders/common/kv_quant_lanes.wgsl");
pub const KV_POOL_LANES_U32: &str = include_str!("../../shaders/common/kv_pool_lanes_u32.wgsl");
pub const KV_POOL_LANES_U64: &str = include_str!("../../shaders/common/kv_pool_lanes_u64.wgsl");
pub const KV_QUANT_U32: &str = include_str!("../../shaders/common/kv_quant_u32.wgsl");
pub const U64: &str = include_str!("../../shaders/common/u64.wgsl");

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

/// The attention kernel files: (decode partials, prefill) of a variant, f16 or quantized pool.
fn attention_kernels(variant: AttentionVariant, quantized: bool) -> (&'static str, &'static str) {
    match (variant, quantized) {
        (AttentionVariant::Workgroup, false) => (
            include_str!("../../shaders/attention/decode_partials.wgsl"),
            include_str!("../../shaders/attention/prefill.wgsl"),
        ),
        (AttentionVariant::Lanes, false) => (
            include_str!("../../shaders/attention/decode_partials_lanes.wgsl"),
            include_str!("../../shaders/attention/prefill_lanes.wgsl"),
        ),
        (AttentionVariant::Workgroup, true) => (
            include_str!("../../shaders/attention/decode_partials_kvq.wgsl"),
            include_str!("../../shaders/attention/prefill_kvq.wgsl"),
        ),
        (AttentionVariant::Lanes, true) => (
            include_str!("../../shaders/attention/decode_partials_lanes_kvq.wgsl"),
            include_str!("../../shaders/attention/prefill_lanes_kvq.wgsl"),
        ),
    }
}

/// Snippets and kernel of an attention pipeline (decode partials or prefill).
fn attention_parts(
    variant: AttentionVariant,
    kv: Option<KvQuantKey>,
    loads: LaneLoads,
    prefill: bool,
) -> Vec<&'static str> {
    let (decode, pre) = attention_kernels(variant, kv.is_some());
    let mut parts = vec![STEP, ATTENTION];
    if variant == AttentionVariant::Lanes {
        parts.push(ATTENTION_LANES);
    }
    match kv {
        None if variant == AttentionVariant::Lanes => parts.push(ATTENTION_LANES_F16),
        None => {}
        Some(kv) => {
            parts.extend([KV_CODEC, kv_snippet(kv.format), KV_QUANT]);
            if variant == AttentionVariant::Lanes {
                match loads {
                    LaneLoads::Words32 => parts.push(KV_POOL_LANES_U32),
                    LaneLoads::Words64 => parts.extend([U64, KV_POOL_LANES_U64]),
                }
                parts.push(KV_QUANT_LANES);
            } else {
                parts.push(KV_QUANT_U32);
            }
        }
    }
    match (variant, prefill) {
        (AttentionVariant::Lanes, false) => parts.push(DECODE_LANES),
        (AttentionVariant::Lanes, true) => parts.push(PREFILL_LANES),
        (AttentionVariant::Workgroup, true) => parts.push(PREFILL_TILE),
        (AttentionVariant::Workgroup, false) => {}
    }
    parts.push(if prefill { pre } else { decode });
    parts
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
    }
}

/// The subgroup linear kernel's two-row loader (`w_load_pair`) for a format's block shape: its
/// vec4 of words and side words per 32-element block (the format's `WRaw` fields, in order).
fn pair_snippet(format: WeightFormat) -> &'static str {
    match format {
        WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
            include_str!("../../shaders/linear/pairs/vec4_1word.wgsl")
        }
        WeightFormat::Q4_K | WeightFormat::Q5_0 => {
            include_str!("../../shaders/linear/pairs/vec4_2words.wgsl")
        }
        WeightFormat::Q5_K | WeightFormat::Q6_K => {
            include_str!("../../shaders/linear/pairs/vec4_3words.wgsl")
        }
        WeightFormat::Q8_0 => include_str!("../../shaders/linear/pairs/vec4x2_1word.wgsl"),
        WeightFormat::F16 | WeightFormat::Bf16 => {
            include_str!("../../shaders/linear/pairs/vec4x4.wgsl")
        }
        WeightFormat::F32 => include_str!("../../shaders/linear/pairs/vec4x8.wgsl"),
    }
}

/// Complete WGSL of a kernel variant (snippets first, kernel last).
pub fn wgsl(key: PipelineKey) -> String {
    let parts: Vec<&str> = match key {
        PipelineKey::Linear { format, variant: LinearVariant::Gpu, .. } => vec![
            STEP,
            GLU,
            WEIGHTS,
            weight_snippet(format),
            RMS,
            include_str!("../../shaders/linear/linear.wgsl"),
        ],
        PipelineKey::Linear { format, variant: LinearVariant::Subgroup, .. } => vec![
            STEP,
            GLU,
            WEIGHTS,
            weight_snippet(format),
            U64,
            include_str!("../../shaders/linear/pairs/common.wgsl"),
            pair_snippet(format),
            include_str!("../../shaders/linear/linear_subgroup.wgsl"),
        ],
        PipelineKey::Embedding { format } => vec![
            STEP,
            WEIGHTS,
            weight_snippet(format),
            include_str!("../../shaders/embedding/embedding.wgsl"),
        ],
        PipelineKey::RmsNorm { variant } => vec![
            STEP,
            RMS,
            include_str!("../../shaders/norm/rms_norm_io.wgsl"),
            match variant {
                NormVariant::Workgroup => include_str!("../../shaders/norm/rms_norm.wgsl"),
                NormVariant::Lanes => include_str!("../../shaders/norm/rms_norm_lanes.wgsl"),
            },
        ],
        PipelineKey::Rope => vec![STEP, ROPE_PAIR, include_str!("../../shaders/rope/rope.wgsl")],
        PipelineKey::KvWrite => {
            vec![STEP, KV_POOL, include_str!("../../shaders/kv_write/kv_write.wgsl")]
        }
        PipelineKey::RopeKvWrite => {
            vec![STEP, ROPE_PAIR, KV_POOL, include_str!("../../shaders/rope/rope_kv_write.wgsl")]
        }
        PipelineKey::KvQuantize { kv } => vec![
            STEP,
            KV_CODEC,
            kv_snippet(kv.format),
            include_str!("../../shaders/kv_quantize/kv_quantize.wgsl"),
        ],
        PipelineKey::KvStage => {
            vec![STEP, include_str!("../../shaders/kv_quantize/kv_stage.wgsl")]
        }
        PipelineKey::KvCodecTest { format } => vec![
            KV_CODEC,
            kv_snippet(format),
            include_str!("../../shaders/kv_quantize/codec_test.wgsl"),
        ],
        PipelineKey::Rotate { variant: RotateVariant::Invocation, .. } => {
            vec![STEP, ROTATE_IO, include_str!("../../shaders/rotate/hadamard.wgsl")]
        }
        PipelineKey::Rotate { variant: RotateVariant::Lanes, .. } => {
            vec![STEP, ROTATE_IO, include_str!("../../shaders/rotate/hadamard_lanes.wgsl")]
        }
        PipelineKey::Glu { .. } => vec![STEP, GLU, include_str!("../../shaders/glu/glu.wgsl")],
        PipelineKey::Bandwidth { probe, loads } => vec![
            loads.wgsl_alias(),
            include_str!("../../shaders/bandwidth/params.wgsl"),
            match probe {
                BandwidthProbe::Read => include_str!("../../shaders/bandwidth/read.wgsl"),
                BandwidthProbe::Copy => include_str!("../../shaders/bandwidth/copy.wgsl"),
            },
        ],
        PipelineKey::AttnDecodePartials { variant, kv, loads, .. } => {
            attention_parts(variant, kv, loads, false)
        }
        PipelineKey::AttnDecodeReduce { .. } => {
            vec![STEP, ATTENTION, include_str!("../../shaders/attention/decode_reduce.wgsl")]
        }
        PipelineKey::AttnPrefill { variant, kv, loads, .. } => {
            attention_parts(variant, kv, loads, true)
        }
    };
    parts.join("\n")
}

/// Values of the `override` constants of a kernel variant.
pub fn constants(key: PipelineKey) -> Vec<(&'static str, f64)> {
    let quant = |kv: Option<KvQuantKey>| kv.map(KvQuantKey::constants).into_iter().flatten();
    match key {
        PipelineKey::Linear { tile, variant: LinearVariant::Gpu, split, .. } => {
            vec![("TT", f64::from(tile.tokens(LinearVariant::Gpu))), ("SPLIT", f64::from(split))]
        }
        PipelineKey::Linear { tile, variant: LinearVariant::Subgroup, load, loads, .. } => vec![
            ("TT", f64::from(tile.tokens(LinearVariant::Subgroup))),
            ("ROW_LOAD", f64::from(load.rows())),
            ("LANE_LOAD_BITS", f64::from(loads.bits())),
        ],
        PipelineKey::AttnDecodePartials { head_dim, kv, .. }
        | PipelineKey::AttnPrefill { head_dim, variant: AttentionVariant::Lanes, kv, .. } => {
            let mut c = vec![("HEAD_DIM", f64::from(head_dim))];
            if let PipelineKey::AttnDecodePartials { part, .. }
            | PipelineKey::AttnPrefill { part, .. } = key
            {
                c.push(("PART", f64::from(part)));
            }
            if let PipelineKey::AttnDecodePartials {
                variant: AttentionVariant::Lanes,
                slice_heads,
                ..
            } = key
            {
                c.push(("SLICE_HEADS", f64::from(slice_heads)));
            }
            c.extend(quant(kv));
            c
        }
        PipelineKey::AttnDecodeReduce { head_dim, part } => {
            vec![("HEAD_DIM", f64::from(head_dim)), ("PART", f64::from(part))]
        }
        PipelineKey::Rotate { head_dim, .. } => vec![("HEAD_DIM", f64::from(head_dim))],
        PipelineKey::AttnPrefill {
            head_dim,
            query_tile,
            variant: AttentionVariant::Workgroup,
            kv,
            part,
            ..
        } => {
            let mut c = vec![
                ("HEAD_DIM", f64::from(head_dim)),
                ("QT", f64::from(query_tile)),
                ("PART", f64::from(part)),
            ];
            c.extend(quant(kv));
            c
        }
        PipelineKey::KvQuantize { kv } => kv.constants().to_vec(),
        PipelineKey::Glu { activation } => vec![("GLU", f64::from(glu::kind(activation)))],
        _ => Vec::new(),
    }
}

/// Everything the pipeline cache needs to build `key`.
pub fn spec(key: PipelineKey) -> PipelineSpec {
    let bindings = match key {
        PipelineKey::Linear { variant, .. } => linear::bindings(variant),
        PipelineKey::Embedding { .. } => embedding::BINDINGS.to_vec(),
        PipelineKey::RmsNorm { .. } => rms_norm::BINDINGS.to_vec(),
        PipelineKey::Rope => rope::BINDINGS.to_vec(),
        PipelineKey::KvWrite => kv_write::BINDINGS.to_vec(),
        PipelineKey::RopeKvWrite => rope_kv_write::BINDINGS.to_vec(),
        PipelineKey::KvQuantize { .. } => kv_quantize::QUANTIZE_BINDINGS.to_vec(),
        PipelineKey::KvStage => kv_quantize::STAGE_BINDINGS.to_vec(),
        PipelineKey::KvCodecTest { .. } => kv_quantize::CODEC_TEST_BINDINGS.to_vec(),
        PipelineKey::Rotate { .. } => rotate::BINDINGS.to_vec(),
        PipelineKey::Glu { .. } => glu::BINDINGS.to_vec(),
        PipelineKey::Bandwidth { .. } => bandwidth::BINDINGS.to_vec(),
        PipelineKey::AttnDecodePartials { kv: None, .. } => {
            attention::DECODE_PARTIALS_BINDINGS.to_vec()
        }
        PipelineKey::AttnDecodePartials { kv: Some(_), .. } => {
            attention::DECODE_PARTIALS_KVQ_BINDINGS.to_vec()
        }
        PipelineKey::AttnDecodeReduce { .. } => attention::DECODE_REDUCE_BINDINGS.to_vec(),
        PipelineKey::AttnPrefill { kv: None, .. } => attention::PREFILL_BINDINGS.to_vec(),
        PipelineKey::AttnPrefill { kv: Some(_), .. } => attention::PREFILL_KVQ_BINDINGS.to_vec(),
    };
    PipelineSpec {
        label: format!("{key:?}"),
        source: wgsl(key),
        bindings,
        constants: constants(key),
    }
}

/// Every partition size an attention pipeline can get (`KernelConfig::partition_keys`): the
/// workgroup family's first, then every other `KernelConfig::lane_partition` picks for some host.
fn partition_sizes() -> Vec<u32> {
    let mut parts = vec![attention::PARTITION];
    for threads in 0..=64 {
        let part = super::KernelConfig::lane_partition(threads);
        if !parts.contains(&part) {
            parts.push(part);
        }
    }
    parts
}

/// Every key a test should compile: all formats, tiles and a spread of head sizes.
pub fn all_keys() -> Vec<PipelineKey> {
    let mut keys = Vec::new();
    for format in WeightFormat::ALL {
        for variant in [LinearVariant::Gpu, LinearVariant::Subgroup] {
            for &tile in TokenTile::of_variant(variant) {
                for load in RowLoad::ALL {
                    if load != RowLoad::One && variant == LinearVariant::Gpu {
                        continue;
                    }
                    for split in linear::SPLITS {
                        if split != 1 && variant != LinearVariant::Gpu {
                            continue;
                        }
                        // the subgroup variant with both x load widths
                        let widths: &[LaneLoads] = match variant {
                            LinearVariant::Gpu => &[LaneLoads::Words32],
                            LinearVariant::Subgroup => &[LaneLoads::Words32, LaneLoads::Words64],
                        };
                        for &loads in widths {
                            keys.push(PipelineKey::Linear {
                                format,
                                variant,
                                tile,
                                load,
                                split,
                                loads,
                            });
                        }
                    }
                }
            }
        }
        keys.push(PipelineKey::Embedding { format });
    }
    keys.extend([
        PipelineKey::RmsNorm { variant: NormVariant::Workgroup },
        PipelineKey::RmsNorm { variant: NormVariant::Lanes },
        PipelineKey::Rope,
        PipelineKey::KvWrite,
        PipelineKey::RopeKvWrite,
        PipelineKey::KvStage,
        PipelineKey::Glu { activation: Activation::Silu },
        PipelineKey::Glu { activation: Activation::GeluTanh },
    ]);
    for probe in BandwidthProbe::ALL {
        keys.extend(BandwidthLoads::ALL.map(|loads| PipelineKey::Bandwidth { probe, loads }));
    }
    let parts_all = partition_sizes();
    for head_dim in [16, 64, 128, 256] {
        for &part in &parts_all {
            keys.push(PipelineKey::AttnDecodeReduce { head_dim, part });
        }
        keys.push(PipelineKey::Rotate { head_dim, variant: RotateVariant::Invocation });
        if rotate::lanes_serve(head_dim) {
            keys.push(PipelineKey::Rotate { head_dim, variant: RotateVariant::Lanes });
        }
        for variant in [AttentionVariant::Workgroup, AttentionVariant::Lanes] {
            if variant == AttentionVariant::Lanes && !attention::lanes_serve(head_dim) {
                continue;
            }
            let query_tile = attention::query_tile(variant, head_dim);
            // quantized pools: every format with its default granularities at every head size,
            // every valid (K, V) granularity pair at head_dim 64
            let mut kvs: Vec<Option<KvQuantKey>> = vec![None];
            kvs.extend(
                all_kv_quant_keys()
                    .into_iter()
                    .filter(|kv| {
                        head_dim == 64
                            || (kv.k == ScaleGranularity::PerChannel
                                && kv.v == ScaleGranularity::PerToken)
                    })
                    .map(Some),
            );
            for kv in kvs {
                // the lanes decode kernels at every slice size they are built with
                let slices = match variant {
                    AttentionVariant::Workgroup => 0..=0,
                    AttentionVariant::Lanes => 1..=attention::LANE_HEADS,
                };
                // the lanes kernels over a quantized pool with both load widths
                let widths: &[LaneLoads] = match (variant, kv) {
                    (AttentionVariant::Lanes, Some(_)) => &[LaneLoads::Words32, LaneLoads::Words64],
                    _ => &[LaneLoads::Words32],
                };
                // the workgroup family's one partition size, the lanes family's every one
                let parts: &[u32] = match variant {
                    AttentionVariant::Workgroup => &parts_all[..1],
                    AttentionVariant::Lanes => &parts_all,
                };
                for (&loads, &part) in widths.iter().flat_map(|w| parts.iter().map(move |p| (w, p)))
                {
                    for slice_heads in slices.clone() {
                        keys.push(PipelineKey::AttnDecodePartials {
                            head_dim,
                            variant,
                            kv,
                            slice_heads,
                            loads,
                            part,
                        });
                    }
                    keys.push(PipelineKey::AttnPrefill {
                        head_dim,
                        query_tile,
                        variant,
                        kv,
                        loads,
                        part,
                    });
                }
            }
        }
    }
    for format in KvCodeFormat::ALL {
        keys.push(PipelineKey::KvCodecTest { format });
    }
    keys.extend(all_kv_quant_keys().into_iter().map(|kv| PipelineKey::KvQuantize { kv }));
    keys
}

/// Every (format, K granularity, V granularity) a quantized pool can have.
pub fn all_kv_quant_keys() -> Vec<KvQuantKey> {
    let mut keys = Vec::new();
    for format in KvCodeFormat::ALL {
        let valid = |g| KvQuant { format: format.format(), granularity: g }.is_valid();
        for k in ScaleGranularity::ALL.into_iter().filter(|&g| valid(g)) {
            for v in ScaleGranularity::ALL.into_iter().filter(|&g| valid(g)) {
                keys.push(KvQuantKey { format, k, v });
            }
        }
    }
    keys
}
