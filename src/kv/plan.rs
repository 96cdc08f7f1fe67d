//! The arithmetic behind `kvrun plan`: what a model's KV cache costs for a context length and a
//! concurrency, and what a byte budget holds, before anything is loaded.
//!
//! Per KV-cache group ([`KvGroups`]; one group for a model whose layers all attend fully):
//!
//! ```text
//! blocks_per_sequence(g) = blocks_for_tokens(max_model_len)                  full group
//!                        = min(that, ceil((window − 1 + chunk) / block_size) + 1)   sliding
//! kv_bytes_per_sequence  = Σ_g blocks_per_sequence(g) × bytes_per_block
//! kv_bytes_needed        = max_num_seqs × kv_bytes_per_sequence
//! kv_cache_memory        = --kv-cache-memory, or kv_bytes_needed when not given
//! kv_blocks_fit          = floor(kv_cache_memory / bytes_per_block)
//! kv_tokens_fit          = kv_blocks_fit × block_size / groups    (tokens in every group)
//! sequences_fit          = floor(kv_blocks_fit / Σ_g blocks_per_sequence(g))
//! staging_bytes_per_sequence = layers × one layer's f16 partial block (quantized KV only)
//! kv_staging_bytes_needed = max_num_seqs × staging_bytes_per_sequence   (outside the budget)
//! ```
//! `chunk` is the step token budget (`--max-num-batched-tokens`): a prefill chunk holds its own
//! tokens and the window before its first one.

use super::bytes::format_bytes;
use super::error::{KvError, PlanField};
use super::groups::{GroupKind, KvGroups};
use super::layout::KvLayout;

/// What `kvrun plan` is asked: a model's KV shape and the serving target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanInput {
    /// One pool block (`num_layers` = the groups' slots per block).
    pub layout: KvLayout,
    pub groups: KvGroups,
    /// `--max-num-batched-tokens`: tokens of one step (a prefill chunk), at least 1.
    pub max_num_batched_tokens: usize,
    /// `-c/--max-model-len`: tokens per sequence (prompt + output), at least 1.
    pub max_model_len: usize,
    /// `--max-num-seqs`: concurrent sequences, at least 1.
    pub max_num_seqs: usize,
    /// `--kv-cache-memory` in bytes; `None` = what `max_num_seqs` full-length sequences need.
    pub kv_cache_memory: Option<u64>,
    /// Bytes of the model weights as stored (reported, not part of the KV budget).
    pub weight_bytes: u64,
    /// Of those, the bytes one token reads (a mixture of experts: its chosen experts only).
    pub active_weight_bytes: u64,
    /// MLA: the KV bytes per token the same heads would cache as plain per-head K and V
    /// (`layers × heads × (qk_nope + qk_rope + v_head_dim) × element bytes`), for comparison;
    /// `None` for other attention.
    pub kv_bytes_per_token_expanded: Option<u64>,
    /// Recurrent layers (Gated DeltaNet): bytes of one sequence's state in one such layer
    /// (conv state + recurrent state, f32), whatever the context; 0 without them.
    pub state_bytes_per_layer: u64,
    /// Layers that keep a state instead of KV.
    pub state_layers: usize,
    /// State snapshot slots for prefix reuse (`--state-snapshots`; 0 without state layers).
    pub state_snapshots: usize,
    /// The layers' KV head shapes when there are several (Gemma 4's sliding and global
    /// heads); empty otherwise.
    pub head_shapes: Vec<PlanHeads>,
}

/// One KV head shape of a model whose layers have several (`ModelConfig::head_shapes`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PlanHeads {
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Layers with these heads.
    pub layers: usize,
    /// KV heads a pool block has room for in this shape's head blocks (`quant::pool_heads`:
    /// every block is sized for the widest shape).
    pub pool_heads: usize,
    /// Layers of this shape one slot holds (`KvGroups::from_packed_layers`).
    pub layers_per_slot: usize,
    /// KV bytes of one block in one such layer, its own heads only.
    pub kv_bytes_per_block_per_layer: u64,
}

/// One KV-cache group in a [`Plan`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PlanGroup {
    /// `"full"` or `"sliding"`.
    pub kind: &'static str,
    /// Sliding window in tokens; absent for full attention.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// Model layers of the group.
    pub layers: usize,
    /// KV bytes a token costs in this group while it is held (the group's layers and padding
    /// slots): `kv_bytes_per_block / block_size`.
    #[serde(serialize_with = "integer_when_whole")]
    pub kv_bytes_per_token: f64,
    /// Most blocks one `max_model_len` sequence holds in this group at once.
    pub blocks_per_sequence: u64,
    /// `blocks_per_sequence × kv_bytes_per_block`: flat past the window for a sliding group.
    pub kv_bytes_per_sequence: u64,
}

/// The answer: every figure of the KV budget. Serialized as the `plan --json` object; the keys
/// are stable (DESIGN.md, "Machine-readable output").
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Plan {
    /// KV bytes one token costs in every layer (all groups, padding slots included):
    /// `groups × kv_bytes_per_block / block_size`. A JSON integer when whole (always for f16),
    /// else a fraction (a per-head-block scale spread over the block's tokens).
    #[serde(serialize_with = "integer_when_whole")]
    pub kv_bytes_per_token: f64,
    /// Bytes of one pool block (one group's block: its layer slots × KV heads × K and V).
    pub kv_bytes_per_block: u64,
    /// KV one `max_model_len` sequence holds at most, in whole blocks, over all groups.
    pub kv_bytes_per_sequence: u64,
    /// The same sequence if every layer attended fully (no window): the saving of the windows.
    pub kv_bytes_per_sequence_full_attention: u64,
    /// Layer slots of one block that hold no layer (equal-sized groups), over all groups.
    pub kv_padding_slots: usize,
    /// Of `kv_bytes_per_sequence`, the bytes of those padding slots (each costs the blocks its
    /// group holds: a full group's the whole context's, a sliding group's its window's).
    pub kv_padding_bytes_per_sequence: u64,
    /// The groups, in block-table order.
    pub kv_groups: Vec<PlanGroup>,
    /// The layers' KV head shapes when there are several (empty otherwise): a narrower
    /// shape's layers use `kv_heads / pool_heads` of their slot's block.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kv_head_shapes: Vec<PlanHeads>,
    /// Tokens the budget holds in every group, whole blocks only.
    pub kv_tokens_fit: u64,
    /// Blocks the budget holds: the size of the block pool.
    pub kv_blocks_fit: u64,
    /// Whole `max_model_len` sequences the budget holds.
    pub sequences_fit: u64,
    pub weight_bytes: u64,
    /// The weights one token reads (= `weight_bytes` but for a mixture of experts).
    pub active_weight_bytes: u64,
    pub block_size: usize,
    /// The `--kv-cache-dtype` name (`"f16"`, `"int8"` …).
    pub kv_cache_dtype: &'static str,
    /// K's scale granularity (`"per-channel"` …; `"none"` for f16).
    pub kv_k_scale: &'static str,
    /// V's scale granularity (`"per-token"` …; `"none"` for f16).
    pub kv_v_scale: &'static str,
    /// f16 staging one running sequence needs for its partial last block of K and V (every
    /// quantized format stages it; see `engine::kv_storage`); 0 for f16 KV.
    pub kv_staging_bytes_per_sequence: u64,
    /// Staging of `max_num_seqs` running sequences. Not part of `kv_cache_memory`.
    pub kv_staging_bytes_needed: u64,
    /// The budget in bytes (given, or `kv_bytes_needed` when not).
    pub kv_cache_memory: u64,
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    /// KV of `max_num_seqs` full-length sequences.
    pub kv_bytes_needed: u64,
    /// MLA only: what the same heads would cache per token as per-head K and V.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_bytes_per_token_expanded: Option<u64>,
    /// Layers whose memory is a fixed-size state per sequence instead of KV (Qwen3.5's Gated
    /// DeltaNet); 0 for attention-only models.
    pub state_layers: usize,
    /// One running sequence's states over those layers, whatever its length.
    pub state_bytes_per_sequence: u64,
    /// The states of `max_num_seqs` running sequences (one slot each). Not part of
    /// `kv_cache_memory`.
    pub state_bytes_needed: u64,
    /// Prefix-cache state snapshot slots (one sequence's states each), and their bytes: a
    /// cached prefix of a hybrid is usable where a snapshot ends it. Not part of
    /// `kv_cache_memory`.
    pub state_snapshots: usize,
    pub state_snapshot_bytes: u64,
}

/// Works out the plan. O(1). Byte products saturate at `u64::MAX` (16 EiB) rather than wrap.
///
/// Errors: `max_model_len` or `max_num_seqs` of 0 ([`KvError::ZeroPlanInput`]); a budget below
/// one block ([`KvError::BudgetTooSmall`]). A budget that holds blocks but fewer than
/// `max_num_seqs` full sequences is a valid plan (`sequences_fit < max_num_seqs`).
pub fn plan(input: &PlanInput) -> Result<Plan, KvError> {
    let layout = &input.layout;
    if input.max_model_len == 0 {
        return Err(KvError::ZeroPlanInput { what: PlanField::MaxModelLen });
    }
    if input.max_num_seqs == 0 {
        return Err(KvError::ZeroPlanInput { what: PlanField::MaxNumSeqs });
    }
    if input.max_num_batched_tokens == 0 {
        return Err(KvError::ZeroPlanInput { what: PlanField::MaxNumBatchedTokens });
    }
    let groups = &input.groups;
    let num_groups = groups.len() as u64;
    let staging = staging_bytes_per_sequence(layout, groups);
    let state = input.state_bytes_per_layer.saturating_mul(input.state_layers as u64);
    let bytes_per_block = layout.bytes_per_block();
    let all_blocks = layout.blocks_for_tokens(input.max_model_len) as u64;
    let step = input.max_num_batched_tokens.min(input.max_model_len);
    let kv_groups: Vec<PlanGroup> = groups
        .groups()
        .iter()
        .map(|g| {
            let blocks = g
                .kind
                .max_live_blocks(layout.block_size, step)
                .map_or(all_blocks, |live| (live as u64).min(all_blocks));
            let (kind, window) = match g.kind {
                GroupKind::Full => ("full", None),
                GroupKind::Sliding { window } => ("sliding", Some(window)),
            };
            PlanGroup {
                kind,
                window,
                layers: g.layers.len(),
                kv_bytes_per_token: layout.bytes_per_token(),
                blocks_per_sequence: blocks,
                kv_bytes_per_sequence: blocks.saturating_mul(bytes_per_block),
            }
        })
        .collect();
    let blocks_per_sequence: u64 = kv_groups.iter().map(|g| g.blocks_per_sequence).sum();
    let kv_bytes_per_sequence = blocks_per_sequence.saturating_mul(bytes_per_block);
    let kv_bytes_needed = kv_bytes_per_sequence.saturating_mul(input.max_num_seqs as u64);
    let kv_cache_memory = input.kv_cache_memory.unwrap_or(kv_bytes_needed);
    layout.require_blocks_for_budget(kv_cache_memory)?;
    let kv_blocks_fit = kv_cache_memory / bytes_per_block;
    Ok(Plan {
        kv_bytes_per_token: layout.bytes_per_token() * num_groups as f64,
        kv_bytes_per_block: bytes_per_block,
        kv_bytes_per_sequence,
        kv_bytes_per_sequence_full_attention: (all_blocks * num_groups)
            .saturating_mul(bytes_per_block),
        kv_padding_slots: groups.num_padding_slots(),
        kv_padding_bytes_per_sequence: {
            let planned = super::PlannedContext {
                max_model_len: input.max_model_len,
                block_size: layout.block_size,
                step_tokens: step,
            };
            let slot_bytes = bytes_per_block / groups.slots_per_block().max(1) as u64;
            (groups.padding_slot_blocks(planned) as u64).saturating_mul(slot_bytes)
        },
        kv_groups,
        kv_head_shapes: input.head_shapes.clone(),
        kv_tokens_fit: kv_blocks_fit / num_groups * layout.block_size as u64,
        kv_blocks_fit,
        sequences_fit: kv_blocks_fit / blocks_per_sequence,
        weight_bytes: input.weight_bytes,
        active_weight_bytes: input.active_weight_bytes,
        block_size: layout.block_size,
        kv_cache_dtype: layout.storage.dtype_name,
        kv_k_scale: layout.storage.k.scale_name,
        kv_v_scale: layout.storage.v.scale_name,
        kv_staging_bytes_per_sequence: staging,
        kv_staging_bytes_needed: staging.saturating_mul(input.max_num_seqs as u64),
        kv_cache_memory,
        max_model_len: input.max_model_len,
        max_num_seqs: input.max_num_seqs,
        kv_bytes_needed,
        kv_bytes_per_token_expanded: input.kv_bytes_per_token_expanded,
        state_layers: input.state_layers,
        state_bytes_per_sequence: state,
        state_bytes_needed: state.saturating_mul(input.max_num_seqs as u64),
        state_snapshots: input.state_snapshots,
        state_snapshot_bytes: state.saturating_mul(input.state_snapshots as u64),
    })
}

/// The f16 staging of one running sequence with quantized KV: per layer with KV (padding slots
/// and recurrent layers have none), one slot's share of
/// [`KvLayout::staging_bytes_per_sequence`]. 0 for f16.
pub fn staging_bytes_per_sequence(layout: &KvLayout, groups: &KvGroups) -> u64 {
    layout.staging_bytes_per_sequence() / layout.num_layers.max(1) as u64
        * groups.num_kv_layers() as u64
}

/// Serializes a byte figure as a JSON integer when it is whole, else as a float.
fn integer_when_whole<S: serde::Serializer>(bytes: &f64, s: S) -> Result<S::Ok, S::Error> {
    if bytes.fract() == 0.0 && *bytes >= 0.0 && *bytes < 2f64.powi(53) {
        s.serialize_u64(*bytes as u64)
    } else {
        s.serialize_f64(*bytes)
    }
}

/// A small human table; the last line warns when fewer than `max_num_seqs` full sequences fit.
impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let row = |f: &mut std::fmt::Formatter<'_>, name: &str, bytes: u64, note: String| {
            let line = format!("  {name:<14}{:>12}  {note}", format_bytes(bytes));
            writeln!(f, "{}", line.trim_end())
        };
        writeln!(
            f,
            "KV cache plan (kv_cache_dtype {}, K scale {}, V scale {}, block_size {})",
            self.kv_cache_dtype, self.kv_k_scale, self.kv_v_scale, self.block_size
        )?;
        let token_bytes = self.kv_bytes_per_token;
        let token_note = match token_bytes.fract() {
            0.0 => format!("{token_bytes} bytes"),
            _ => format!("{token_bytes:.2} bytes (block bytes / block_size)"),
        };
        row(f, "per token", token_bytes.round() as u64, token_note)?;
        if let Some(expanded) = self.kv_bytes_per_token_expanded {
            let note = format!(
                "per token if MLA's heads cached their own K and V ({:.1}× the latent)",
                expanded as f64 / token_bytes.max(1.0)
            );
            row(f, "  expanded", expanded, note)?;
        }
        row(f, "per block", self.kv_bytes_per_block, format!("{} tokens", self.block_size))?;
        let seq_note = format!("-c {} tokens", self.max_model_len);
        row(f, "per sequence", self.kv_bytes_per_sequence, seq_note)?;
        if self.kv_groups.len() > 1 || self.kv_groups.iter().any(|g| g.window.is_some()) {
            // a run of alike groups is one line (Gemma 3 27B at -c 32768 has 26 sliding ones)
            let mut first = 0;
            for run in self.kv_groups.chunk_by(|a, b| a == b) {
                let g = &run[0];
                let what = match g.window {
                    Some(w) => format!("sliding window {w}"),
                    None => "full attention".to_string(),
                };
                let (name, each) = match run.len() {
                    1 => (format!("  group {first}"), ""),
                    n => (format!("  groups {first}-{}", first + n - 1), " each"),
                };
                let note = format!(
                    "{what}, {} layers, {} blocks at most{each}",
                    g.layers, g.blocks_per_sequence
                );
                row(f, &name, g.kv_bytes_per_sequence, note)?;
                first += run.len();
            }
            let saved = format!(
                "without windows ({:.0} % of it held)",
                100.0 * self.kv_bytes_per_sequence as f64
                    / self.kv_bytes_per_sequence_full_attention.max(1) as f64,
            );
            row(f, "full attention", self.kv_bytes_per_sequence_full_attention, saved)?;
            let note = format!(
                "of the sequence's: {} layer slots without a layer ({:.1} %)",
                self.kv_padding_slots,
                100.0 * self.kv_padding_bytes_per_sequence as f64
                    / self.kv_bytes_per_sequence.max(1) as f64
            );
            row(f, "  padding", self.kv_padding_bytes_per_sequence, note)?;
        }
        for h in &self.kv_head_shapes {
            let note = format!(
                "per token, {} layers of {} KV heads × {}, {} a slot of {} such heads ({:.0} % \
                 used)",
                h.layers,
                h.kv_heads,
                h.head_dim,
                h.layers_per_slot,
                h.pool_heads,
                100.0 * (h.kv_heads * h.layers_per_slot) as f64 / h.pool_heads.max(1) as f64
            );
            let name = format!("  heads {}×{}", h.kv_heads, h.head_dim);
            let per_block = h.kv_bytes_per_block_per_layer.saturating_mul(h.layers as u64);
            let bytes = per_block / self.block_size.max(1) as u64;
            row(f, &name, bytes, note)?;
        }
        let needed_note = format!("--max-num-seqs {} full sequences", self.max_num_seqs);
        row(f, "needed", self.kv_bytes_needed, needed_note)?;
        let fit_note = format!(
            "{} tokens in {} blocks = {} full sequences",
            self.kv_tokens_fit, self.kv_blocks_fit, self.sequences_fit
        );
        row(f, "budget", self.kv_cache_memory, fit_note)?;
        row(f, "weights", self.weight_bytes, String::new())?;
        if self.active_weight_bytes != self.weight_bytes {
            let note = "a token's share: its chosen experts only".to_string();
            row(f, "weights/token", self.active_weight_bytes, note)?;
        }
        if self.kv_staging_bytes_per_sequence > 0 {
            let note = format!(
                "f16 partial blocks of {} running sequences ({} per sequence), outside the budget",
                self.max_num_seqs,
                format_bytes(self.kv_staging_bytes_per_sequence)
            );
            row(f, "staging", self.kv_staging_bytes_needed, note)?;
        }
        if self.state_layers > 0 {
            let note = format!(
                "recurrent states of {} running sequences ({} per sequence in {} layers, any \
                 length), outside the budget",
                self.max_num_seqs,
                format_bytes(self.state_bytes_per_sequence),
                self.state_layers
            );
            row(f, "states", self.state_bytes_needed, note)?;
            let note = format!(
                "{} state snapshots for prefix reuse (--state-snapshots), outside the budget",
                self.state_snapshots
            );
            row(f, "snapshots", self.state_snapshot_bytes, note)?;
        }
        if self.sequences_fit < self.max_num_seqs as u64 {
            writeln!(
                f,
                "warning: only {} of {} full-length sequences fit; raise --kv-cache-memory to {} \
                 or lower --max-num-seqs / -c",
                self.sequences_fit,
                self.max_num_seqs,
                format_bytes(self.kv_bytes_needed)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn input(layout: KvLayout, ctx: usize, seqs: usize, budget: Option<u64>) -> PlanInput {
        PlanInput {
            head_shapes: Vec::new(),
            state_bytes_per_layer: 0,
            state_layers: 0,
            state_snapshots: 0,
            groups: KvGroups::uniform(layout.num_layers),
            max_num_batched_tokens: 512,
            layout,
            max_model_len: ctx,
            max_num_seqs: seqs,
            kv_cache_memory: budget,
            weight_bytes: 13_476_839_424,
            active_weight_bytes: 13_476_839_424,
            kv_bytes_per_token_expanded: None,
        }
    }

    fn llama2_7b() -> KvLayout {
        KvLayout::f16(32, 32, 128, 16).unwrap()
    }

    #[test]
    fn llama2_7b_without_budget_needs_16_gib() {
        let p = plan(&input(llama2_7b(), 4096, 8, None)).unwrap();
        assert_eq!(p.kv_bytes_per_token, f64::from(512 << 10));
        assert_eq!(p.kv_bytes_per_block, 8 << 20);
        assert_eq!(p.kv_bytes_per_sequence, 2 * GIB);
        assert_eq!(p.kv_bytes_needed, 16 * GIB);
        assert_eq!(p.kv_cache_memory, 16 * GIB);
        assert_eq!(p.kv_tokens_fit, 8 * 4096);
        assert_eq!(p.kv_blocks_fit, 8 * 256);
        assert_eq!(p.sequences_fit, 8);
    }

    #[test]
    fn llama2_7b_in_6_gib() {
        let p = plan(&input(llama2_7b(), 4096, 8, Some(6 * GIB))).unwrap();
        assert_eq!(p.kv_tokens_fit, 12_288);
        assert_eq!(p.sequences_fit, 3);
        let text = p.to_string();
        assert!(text.contains("only 3 of 8 full-length sequences fit"), "{text}");
        assert!(text.contains("raise --kv-cache-memory to 16 GiB"), "{text}");
    }

    #[test]
    fn partial_blocks_round_up_per_sequence() {
        // SmolLM2-135M, -c 100: 7 blocks of 16 tokens = 112 tokens of KV per sequence.
        let smol = KvLayout::f16(30, 3, 64, 16).unwrap();
        let p = plan(&input(smol, 100, 4, None)).unwrap();
        assert_eq!(p.kv_bytes_per_token, 23_040.0);
        assert_eq!(p.kv_bytes_per_sequence, 7 * 16 * 23_040);
        assert_eq!(p.kv_blocks_fit, 28);
        assert_eq!(p.kv_tokens_fit, 448);
        assert_eq!(p.sequences_fit, 4);
        assert!(!p.to_string().contains("warning"));
        assert!(p.to_string().contains("22.5 KiB"));
    }

    #[test]
    fn json_keys_are_the_stable_ones() {
        let p = plan(&input(llama2_7b(), 4096, 8, None)).unwrap();
        let json = serde_json::to_value(p).unwrap();
        for key in [
            "kv_bytes_per_token",
            "kv_bytes_per_block",
            "kv_bytes_per_sequence",
            "kv_tokens_fit",
            "sequences_fit",
            "weight_bytes",
            "block_size",
            "kv_cache_dtype",
            "kv_k_scale",
            "kv_v_scale",
            "kv_staging_bytes_per_sequence",
        ] {
            assert!(json.get(key).is_some(), "missing {key}");
        }
        assert_eq!(json["kv_cache_dtype"], "f16");
        assert_eq!(json["kv_k_scale"], "none");
        assert_eq!(json["kv_staging_bytes_per_sequence"], 0);
        assert_eq!(json["kv_bytes_per_token"], 524_288);
    }

    /// SmolLM2-135M with int4 (K per-channel: 512 + 64·2·2 = 768 B a head block; V per-token:
    /// 512 + 16·2·2 = 576 B), -c 100 (7 blocks), 4 sequences.
    #[test]
    fn quantized_plan_reports_scales_and_staging() {
        use crate::kv::{HeadBlockStorage, KvStorage};
        let storage = KvStorage {
            dtype_name: "int4",
            k: HeadBlockStorage { bytes: 768, staged: true, scale_name: "per-channel" },
            v: HeadBlockStorage { bytes: 576, staged: false, scale_name: "per-token" },
        };
        let smol = KvLayout::new(30, 3, 64, 16, storage).unwrap();
        let p = plan(&input(smol, 100, 4, None)).unwrap();
        assert_eq!(p.kv_bytes_per_block, 120_960);
        assert_eq!(p.kv_bytes_per_token, 7_560.0);
        assert_eq!(p.kv_bytes_per_sequence, 7 * 120_960);
        assert_eq!(p.kv_staging_bytes_per_sequence, 184_320);
        assert_eq!(p.kv_staging_bytes_needed, 4 * 184_320);
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["kv_cache_dtype"], "int4");
        assert_eq!(json["kv_k_scale"], "per-channel");
        assert_eq!(json["kv_v_scale"], "per-token");
        assert_eq!(json["kv_bytes_per_token"], 7_560);
        let text = p.to_string();
        assert!(text.starts_with("KV cache plan (kv_cache_dtype int4, K scale per-channel, V scale per-token, block_size 16)"), "{text}");
        assert!(text.contains("staging") && text.contains("180 KiB per sequence"), "{text}");
        // A fractional figure stays a JSON float.
        let mut odd = storage;
        odd.k.bytes += 4;
        let odd = KvLayout::new(1, 1, 64, 16, odd).unwrap();
        let json = serde_json::to_value(plan(&input(odd, 16, 1, None)).unwrap()).unwrap();
        assert_eq!(json["kv_bytes_per_token"], 84.25); // (772 + 576) / 16
    }

    #[test]
    fn refuses_what_cannot_work() {
        let too_small = plan(&input(llama2_7b(), 4096, 8, Some(GIB / 1024))).unwrap_err();
        assert_eq!(
            too_small.to_string(),
            "--kv-cache-memory 1048576 holds no block of 8388608 bytes \
             (block_size × bytes_per_token); raise it to at least 8388608"
        );
        let zero_ctx = plan(&input(llama2_7b(), 0, 8, None)).unwrap_err();
        assert_eq!(zero_ctx, KvError::ZeroPlanInput { what: PlanField::MaxModelLen });
        let zero_seqs = plan(&input(llama2_7b(), 8, 0, None)).unwrap_err();
        assert!(zero_seqs.to_string().starts_with("--max-num-seqs must be"));
    }
}
