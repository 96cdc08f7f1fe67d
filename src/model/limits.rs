//! [`check_buffer_sizes`]: every buffer `Model::load` allocates, sized with checked arithmetic
//! and compared with the adapter's largest binding **before** anything is created, so an
//! oversized flag is an error naming the flag and the largest value that fits, never a wgpu
//! validation panic or an allocation the size of the flag.

use super::{ModelError, ModelOptions};
use crate::kernels::attention::PARTITION;
use crate::kernels::SeqInfo;
use crate::loader::ModelConfig;

/// One buffer family: its name, the bytes one unit of the flag costs, and the flag.
struct Scaled {
    buffer: &'static str,
    /// What `count` counts.
    unit: &'static str,
    /// Bytes per unit of `count` (a row); `None` when that alone overflows.
    unit_bytes: Option<u64>,
    count: usize,
    flag: &'static str,
}

/// Checks the activation, step and logit buffers against `max_binding` bytes (the KV pool has
/// its own check, `ModelError::KvPoolTooLarge`).
pub(super) fn check_buffer_sizes(
    c: &ModelConfig,
    o: &ModelOptions,
    max_binding: u64,
) -> Result<(), ModelError> {
    let n = |v: usize| v as u64;
    let f32_row = |cols: Option<u64>| cols.and_then(|c| c.checked_mul(4));
    // the widest head shape's rows (Gemma 4: two shapes; the loader bounds every size)
    let q = n(c.num_heads).checked_mul(n(c.max_head_dim()));
    let qkv = c.head_shapes().into_iter().try_fold(0u64, |m, (kvh, hd)| {
        let row = n(kvh).checked_mul(2)?.checked_add(n(c.num_heads))?.checked_mul(n(hd))?;
        Some(m.max(row))
    });
    // Gated DeltaNet: the stacked input projections (q|k|v, z, b, a) are its widest row
    let delta_row = c.delta_net.map_or(Some(0), |d| {
        let conv = n(d.key_heads).checked_mul(n(d.key_head_dim))?.checked_mul(2)?;
        let value = n(d.value_heads).checked_mul(n(d.value_head_dim))?;
        conv.checked_add(value.checked_mul(2)?)?.checked_add(n(d.value_heads) * 2)
    });
    // mixture of experts: the router's logits, each token's experts' hidden rows and (prefill
    // grouped by expert) their down rows (the tile plan, ~9 words a pair and 3 an expert, is
    // far smaller)
    let moe_row = c.moe.map_or(Some(0), |m| {
        let h = n(m.experts_used).checked_mul(n(m.expert_ffn))?;
        let down = n(m.experts_used).checked_mul(n(c.hidden_size))?;
        Some(h.max(down).max(n(m.experts)))
    });
    let widest_token_row =
        [Some(n(c.hidden_size)), qkv, q, n(c.dense_ffn_width()).checked_mul(2), delta_row, moe_row]
            .into_iter()
            .try_fold(0u64, |m, v| v.map(|v| m.max(v)));
    // per sequence and recurrent layer: the larger of its conv state and recurrent state
    let state_row = c.delta_net.map_or(Some(0), |d| {
        let keys = n(d.key_heads).checked_mul(n(d.key_head_dim))?.checked_mul(2)?;
        let channels = keys.checked_add(n(d.value_heads).checked_mul(n(d.value_head_dim))?)?;
        let conv = n(d.conv_taps - 1).checked_mul(channels)?;
        let rec =
            n(d.value_heads).checked_mul(n(d.key_head_dim))?.checked_mul(n(d.value_head_dim))?;
        conv.max(rec).checked_mul(4)
    });
    // per sequence: [heads, partitions, head_dim + 2] f32 decode partials
    let partitions = n(o.max_model_len.div_ceil(PARTITION as usize));
    let partials_row = n(c.num_heads)
        .checked_mul(partitions)
        .and_then(|x| x.checked_mul(n(c.max_head_dim()) + 2)?.checked_mul(4));
    let block_table_row = n(o.max_model_len.div_ceil(o.block_size)).checked_mul(4);
    let checks = [
        Scaled {
            buffer: "activations (hidden, qkv, gate_up)",
            unit: "tokens",
            unit_bytes: f32_row(widest_token_row),
            count: o.max_num_batched_tokens,
            flag: "--max-num-batched-tokens",
        },
        Scaled {
            buffer: "logits",
            unit: "logit rows",
            unit_bytes: f32_row(Some(n(c.vocab_size))),
            count: o.max_logit_rows.max(1),
            // one row a sampling sequence; scoring requests take what fits
            // (engine::ResolvedConfig::fit_logit_rows), so only sequences can overflow it
            flag: "--max-num-seqs",
        },
        Scaled {
            buffer: "decode partials",
            unit: "sequences",
            unit_bytes: partials_row,
            count: o.max_num_seqs,
            flag: "--max-num-seqs",
        },
        Scaled {
            buffer: "block tables",
            unit: "sequences",
            unit_bytes: block_table_row,
            count: o.max_num_seqs,
            flag: "--max-num-seqs",
        },
        Scaled {
            buffer: "logit edits",
            unit: "sequences",
            unit_bytes: Some(
                (crate::kernels::logit_edit::EDITS_PER_SEQ
                    * std::mem::size_of::<crate::kernels::logit_edit::LogitEdit>())
                    as u64,
            ),
            count: o.max_num_seqs,
            flag: "--max-num-seqs",
        },
        Scaled {
            buffer: "sequence records",
            unit: "sequences",
            unit_bytes: Some(std::mem::size_of::<SeqInfo>() as u64),
            count: o.max_num_seqs,
            flag: "--max-num-seqs",
        },
        Scaled {
            buffer: "recurrent state (one layer)",
            unit: "sequences and state snapshots",
            unit_bytes: state_row,
            count: o.max_num_seqs + o.state_snapshots,
            flag: "--max-num-seqs or --state-snapshots",
        },
        Scaled {
            buffer: "rope table",
            unit: "positions",
            unit_bytes: f32_row(Some(n(c.max_head_dim()))),
            count: o.max_model_len,
            flag: "-c",
        },
    ];
    for s in checks {
        let bytes = s.unit_bytes.and_then(|u| u.checked_mul(n(s.count)));
        if bytes.is_some_and(|b| b <= max_binding) {
            continue;
        }
        let largest = s.unit_bytes.map_or(0, |u| max_binding / u.max(1));
        return Err(ModelError::BufferTooLarge {
            buffer: s.buffer,
            unit: s.unit,
            bytes,
            limit: max_binding,
            flag: s.flag,
            value: s.count,
            largest,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::{
        Activation, Architecture, AttentionKind, LayerSpec, Rope, RopeScaling, RopeStyle,
    };
    use crate::quant::KvCacheSpec;

    fn smollm2() -> ModelConfig {
        ModelConfig {
            arch: Architecture::Llama,
            hidden_size: 576,
            intermediate_size: 1536,
            num_layers: 30,
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            vocab_size: 49152,
            rms_norm_eps: 1e-5,
            layers: vec![
                LayerSpec {
                    attention: AttentionKind::Full,
                    rope: Rope { theta: 1e5, scaling: RopeScaling::None }
                };
                30
            ],
            rope_style: RopeStyle::Interleaved,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
            attention_bias: false,
            qk_norm: false,
            activation: Activation::Silu,
            embedding_scale: None,
            post_norms: false,
            attention_scale: 0.125,
            norm_weight_offset: 0.0,
            rope_freq_factors: None,
            mla: None,
            rotary_dims: None,
            moe_layers: 0,
            moe: None,
            delta_net: None,
            attn_output_gate: false,
            global_layers: None,
            final_logit_softcap: None,
        }
    }

    fn options(tokens: usize, seqs: usize, logit_rows: usize) -> ModelOptions {
        ModelOptions {
            max_num_batched_tokens: tokens,
            max_num_seqs: seqs,
            max_logit_rows: logit_rows,
            max_model_len: 2048,
            block_size: 16,
            num_blocks: 64,
            kv_cache: KvCacheSpec::default(),
            kv_groups: crate::kv::KvGroups::uniform(30),
            state_snapshots: 0,
        }
    }

    const LAVAPIPE: u64 = 128 << 20;

    #[test]
    fn defaults_fit_and_each_flag_is_named_with_the_largest_value() {
        let c = smollm2();
        check_buffer_sizes(&c, &options(512, 8, 8), LAVAPIPE).unwrap();
        // logits: 49152 × 4 = 196,608 B a row; 128 MiB holds 682 rows (one a sequence:
        // serve --max-num-seqs 683 and more is refused; scoring steps are fitted to 682)
        let err = check_buffer_sizes(&c, &options(1024, 1, 1024), LAVAPIPE).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("logits") && msg.contains("682"), "{msg}");
        check_buffer_sizes(&c, &options(1024, 1, 682), LAVAPIPE).unwrap();
        // widest token row: gate_up 2 × 1536 × 4 = 12,288 B; 128 MiB holds 10,922 tokens
        let err = check_buffer_sizes(&c, &options(100_000_000, 1, 1), LAVAPIPE).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("--max-num-batched-tokens") && msg.contains("10922"), "{msg}");
        check_buffer_sizes(&c, &options(10_922, 1, 1), LAVAPIPE).unwrap();
        let err = check_buffer_sizes(&c, &options(512, 100_000, 8), LAVAPIPE).unwrap_err();
        assert!(err.to_string().contains("--max-num-seqs"), "{err}");
    }

    #[test]
    fn overflowing_sizes_are_errors_not_wraps() {
        let mut c = smollm2();
        c.vocab_size = usize::MAX / 2;
        let err = check_buffer_sizes(&c, &options(512, 8, 8), LAVAPIPE).unwrap_err();
        assert!(err.to_string().contains("logits"), "{err}");
        let err = check_buffer_sizes(&smollm2(), &options(usize::MAX, 8, 8), LAVAPIPE);
        assert!(err.unwrap_err().to_string().contains("--max-num-batched-tokens"));
    }
}
