//! The model's input and output for one step, as plain data.

use crate::kernels::attention::partitions;
use crate::kernels::logit_edit::LogitEdit;
use crate::kernels::sampling::RowSampling;
use crate::kernels::{SeqInfo, StepInfo, StepShape};

/// Which of a sequence chunk's tokens get logits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    /// None (a prefill chunk that is not the prompt's last).
    None,
    /// The last token only (sampling the next token).
    Last,
    /// Tokens `range` of the chunk (perplexity scoring).
    Range(std::ops::Range<usize>),
}

/// One sequence's share of a step: the tokens it computes now, and where they go.
#[derive(Clone, Debug)]
pub struct SeqChunk<'a> {
    /// Token ids computed in this step. [q_len]
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; earlier positions are already in the KV cache.
    pub start_pos: usize,
    /// The sequence's block table per KV-cache group (`[groups][blocks]`), each covering at
    /// least `start_pos + tokens.len()` positions.
    pub block_tables: &'a [Vec<u32>],
    /// The slots of `tokens` per group (`[groups][q_len]`), as the KV manager reserved them;
    /// `None` for hand-built chunks (tests), which take them from the tables.
    pub slot_mapping: Option<&'a [Vec<u32>]>,
    pub logits: LogitsWanted,
    /// Quantized KV: the sequence's f16 staging slot (`0..max_num_seqs`), the same in every
    /// step while it runs; it holds the sequence's partial last block. Unused with f16 KV.
    pub stage_slot: u32,
    /// Recurrent layers: state snapshot work beyond the sequence's own states.
    pub states: StateWork,
}

/// A sequence chunk's state snapshot work (recurrent layers, prefix reuse): slots are the state
/// buffers' (`StatePool`: running slots, then snapshot slots, [`super::Model::snapshot_slot`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateWork {
    /// Copy this slot's states into the sequence's own (`stage_slot`) before the step: its
    /// cached prefix ends where that snapshot was taken.
    pub restore_from: Option<u32>,
    /// `(slot, n)`: also write the states after the chunk's first `n` tokens into `slot`.
    pub snapshot: Option<(u32, usize)>,
}

impl SeqChunk<'_> {
    /// Positions of `tokens`.
    pub fn positions(&self) -> std::ops::Range<usize> {
        self.start_pos..self.start_pos + self.tokens.len()
    }
}

/// Slot of position `pos` through `table`: `table[pos / block_size] × block_size + offset`.
pub fn slot_of(table: &[u32], block_size: usize, pos: usize) -> u32 {
    table[pos / block_size] * block_size as u32 + (pos % block_size) as u32
}

/// Everything one forward step uploads: token ids, positions, slot mapping, sequence records,
/// block tables, the prefill tile list and the rows that get logits. Built once per step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForwardBatch {
    /// [num_tokens]
    pub token_ids: Vec<u32>,
    /// [num_tokens]
    pub positions: Vec<u32>,
    /// [groups][num_tokens] slot = block_id × block_size + offset, in each KV-cache group
    pub slot_mapping: Vec<Vec<u32>>,
    /// [num_seqs] decode sequences (one query token) first
    pub seqs: Vec<SeqInfo>,
    /// [groups][Σ table lengths] concatenated block tables of `seqs` per group (the same
    /// lengths in every group, so `SeqInfo::table_start` serves them all)
    pub block_tables: Vec<Vec<u32>>,
    /// [num_prefill_tiles] (sequence index, first query index of the tile)
    pub prefill_tiles: Vec<[u32; 2]>,
    /// [num_logits] token rows whose logits are computed, in chunk order
    pub logit_rows: Vec<u32>,
    /// [num_logits] index (into the `chunks` given to `new`) of the chunk each logit row is from
    pub logit_chunks: Vec<usize>,
    /// Quantized KV: [num_stage_rows] (token row, stage_slot × block_size + offset) of every row
    /// that lands in its sequence's partial last block (`kv_stage` copies them to staging)
    pub stage_rows: Vec<[u32; 2]>,
    /// Quantized KV: [groups][num_completed_blocks] (block id in the group, stage slot, row of
    /// the first position computed in this step, positions before the chunk = taken from
    /// staging) of every block whose last position is computed in this step (`kv_quantize`
    /// quantizes them). Groups share the block size, so every group completes the same blocks
    /// of a sequence (the same entries but for the block id); the block is live in a sliding
    /// group too, as it holds the step's own positions.
    pub completed_blocks: Vec<Vec<[u32; 4]>>,
    /// What the step reads back of its logit rows (the caller sets it; rows by default).
    pub readback: LogitReadback,
    /// With [`LogitReadback::TargetLogprobs`]: [num_logits] the token whose log-probability
    /// each row gets (`kernels::logprob::NO_TARGET`: none); set by the caller.
    pub logit_targets: Vec<u32>,
    /// Recurrent layers: [num_restores] (from slot, to slot) state copies made before the step.
    pub state_restores: Vec<[u32; 2]>,
    /// [num_logits] how the GPU samples each logit row (`kernels::sampling`), or empty: none
    /// sampled at random. When set, [`Logits::token_ids`] come back whatever the readback
    /// (rows at temperature 0 keep their argmax); set by the caller.
    pub logit_sampling: Vec<RowSampling>,
    /// The samplers' logit shaping for rows the GPU picks (`kernels::logit_edit`: each
    /// (row, token) once), applied before the argmax and the draw; set by the caller. When
    /// set, [`Logits::token_ids`] come back whatever the readback.
    pub logit_edits: Vec<LogitEdit>,
}

/// What a step reads back of its logit rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogitReadback {
    /// Every row whole: `rows × vocab × 4` bytes ([`Logits::data`]).
    #[default]
    Rows,
    /// Only each row's argmax, computed on the GPU exactly as the CPU sampler's greedy choice
    /// (`kernels::argmax`): 4 bytes a row ([`Logits::token_ids`]). For steps whose every logit
    /// row is a greedy sample.
    Argmax,
    /// Each row's argmax and its log-probability of the row's target token
    /// ([`ForwardBatch::logit_targets`]), reduced on the GPU (`kernels::logprob`): 8 bytes a row
    /// ([`Logits::token_ids`], [`Logits::target_logprobs`]). For steps whose logit rows are
    /// greedy samples or prompt positions that want only the next token's log-probability.
    TargetLogprobs,
}

impl ForwardBatch {
    /// Lays out a step; `query_tile` is the attention kernel's ([`super::Model::query_tile`]).
    /// Chunks are reordered so decode chunks (one token) come first, as the
    /// attention kernels expect; `logit_chunks` maps each logit row back to its chunk.
    #[track_caller]
    pub fn new(chunks: &[SeqChunk<'_>], block_size: usize, query_tile: usize) -> Self {
        let qt = query_tile;
        let mut order: Vec<usize> = (0..chunks.len()).collect();
        order.sort_by_key(|&i| chunks[i].tokens.len() != 1);
        let num_groups = chunks.first().map_or(1, |c| c.block_tables.len());
        let mut b = ForwardBatch {
            slot_mapping: vec![Vec::new(); num_groups],
            block_tables: vec![Vec::new(); num_groups],
            completed_blocks: vec![Vec::new(); num_groups],
            ..ForwardBatch::default()
        };
        for (si, &ci) in order.iter().enumerate() {
            let c = &chunks[ci];
            let q_len = c.tokens.len();
            assert!(q_len > 0, "a sequence chunk needs at least one token");
            assert_eq!(c.block_tables.len(), num_groups, "one block table per group");
            let end = c.start_pos + q_len;
            let table_len = end.div_ceil(block_size);
            for table in c.block_tables {
                assert!(table.len() >= table_len, "block table too short for {end} tokens");
            }
            let q_start = b.token_ids.len();
            b.seqs.push(SeqInfo {
                q_start: q_start as u32,
                q_len: q_len as u32,
                ctx_len: end as u32,
                table_start: b.block_tables[0].len() as u32,
                stage_slot: c.stage_slot,
                // a running sequence's staging slot is its state slot too (recurrent layers)
                state_slot: c.stage_slot,
                snapshot_slot: c.states.snapshot.map_or(0, |(slot, _)| slot),
                snapshot_len: c.states.snapshot.map_or(0, |(_, n)| {
                    assert!(n >= 1 && n <= q_len, "a snapshot after 1..=q_len tokens");
                    n as u32
                }),
            });
            if let Some(from) = c.states.restore_from {
                b.state_restores.push([from, c.stage_slot]);
            }
            b.add_quantized_kv_work(c, q_start, block_size);
            for (g, table) in c.block_tables.iter().enumerate() {
                b.block_tables[g].extend_from_slice(&table[..table_len]);
                match c.slot_mapping {
                    Some(slots) => {
                        assert_eq!(slots[g].len(), q_len, "one slot per token");
                        b.slot_mapping[g].extend_from_slice(&slots[g]);
                    }
                    None => b.slot_mapping[g]
                        .extend(c.positions().map(|pos| slot_of(table, block_size, pos))),
                }
            }
            for (i, &tok) in c.tokens.iter().enumerate() {
                b.token_ids.push(tok);
                b.positions.push((c.start_pos + i) as u32);
            }
            if q_len > 1 {
                for q0 in (0..q_len).step_by(qt) {
                    b.prefill_tiles.push([si as u32, q0 as u32]);
                }
            }
        }
        // logit rows in the caller's chunk order
        for (ci, c) in chunks.iter().enumerate() {
            let si = order.iter().position(|&o| o == ci).expect("chunk in order");
            let q_start = b.seqs[si].q_start as usize;
            let range = match &c.logits {
                LogitsWanted::None => 0..0,
                LogitsWanted::Last => c.tokens.len() - 1..c.tokens.len(),
                LogitsWanted::Range(r) => r.clone(),
            };
            for i in range {
                b.logit_rows.push((q_start + i) as u32);
                b.logit_chunks.push(ci);
            }
        }
        b
    }

    /// The blocks `c` completes and the rows it stages (see the fields). O(q_len).
    fn add_quantized_kv_work(&mut self, c: &SeqChunk<'_>, q_start: usize, block_size: usize) {
        let (start, end) = (c.start_pos, c.start_pos + c.tokens.len());
        let row = |pos: usize| (q_start + pos - start) as u32;
        // blocks whose last position lies in start..end
        for blk in start / block_size..end / block_size {
            let first = blk * block_size;
            let staged = start.saturating_sub(first);
            for (completed, table) in self.completed_blocks.iter_mut().zip(c.block_tables) {
                completed.push([table[blk], c.stage_slot, row(first.max(start)), staged as u32]);
            }
        }
        if end % block_size != 0 {
            for pos in (end / block_size * block_size).max(start)..end {
                let slot = c.stage_slot * block_size as u32 + (pos % block_size) as u32;
                self.stage_rows.push([row(pos), slot]);
            }
        }
    }

    /// Blocks completed in this step (in each group).
    pub fn num_completed_blocks(&self) -> usize {
        self.completed_blocks.first().map_or(0, Vec::len)
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    pub fn num_decode_seqs(&self) -> usize {
        self.seqs.iter().take_while(|s| s.q_len == 1).count()
    }

    /// The counts every kernel reads from the step uniform.
    pub fn step_info(&self) -> StepInfo {
        StepInfo {
            num_tokens: self.token_ids.len() as u32,
            num_logits: self.logit_rows.len() as u32,
            num_seqs: self.seqs.len() as u32,
            num_decode_seqs: self.num_decode_seqs() as u32,
            num_prefill_tiles: self.prefill_tiles.len() as u32,
            num_stage_rows: self.stage_rows.len() as u32,
            num_completed_blocks: self.num_completed_blocks() as u32,
            num_logit_edits: self.logit_edits.len() as u32,
        }
    }

    /// The host-side numbers the dispatch sizes come from.
    pub fn shape(&self) -> StepShape {
        let decode = &self.seqs[..self.num_decode_seqs()];
        StepShape {
            num_tokens: self.token_ids.len() as u32,
            num_logits: self.logit_rows.len() as u32,
            num_decode_seqs: decode.len() as u32,
            max_decode_partitions: decode.iter().map(|s| partitions(s.ctx_len)).max().unwrap_or(0),
            num_prefill_tiles: self.prefill_tiles.len() as u32,
            num_stage_rows: self.stage_rows.len() as u32,
            num_completed_blocks: self.num_completed_blocks() as u32,
            num_seqs: self.seqs.len() as u32,
            max_seq_tokens: self.seqs.iter().map(|s| s.q_len).max().unwrap_or(0),
            argmax_rows: if self.returns_token_ids() { self.logit_rows.len() as u32 } else { 0 },
            logprob_rows: match self.readback {
                LogitReadback::TargetLogprobs => self.logit_rows.len() as u32,
                _ => 0,
            },
            sample_rows: if self.logit_sampling.is_empty() {
                0
            } else {
                self.logit_rows.len() as u32
            },
            logit_edits: self.logit_edits.len() as u32,
        }
    }

    /// Whether the step reads back a token id a logit row: the argmax readbacks, and any step
    /// that samples or shapes logits on the GPU.
    pub fn returns_token_ids(&self) -> bool {
        self.readback != LogitReadback::Rows
            || !self.logit_sampling.is_empty()
            || !self.logit_edits.is_empty()
    }
}

/// Logits of one step: [num_logits, vocab], or with [`LogitReadback::Argmax`] only each row's
/// argmax.
#[derive(Clone, Debug, Default)]
pub struct Logits {
    pub vocab: usize,
    /// [num_logits, vocab]; empty when the step read back argmaxes.
    pub data: Vec<f32>,
    /// [num_logits] each row's argmax, when the step asked for it ([`LogitReadback::Argmax`]).
    pub token_ids: Option<Vec<u32>>,
    /// [num_logits] each row's log-probability of its target ([`LogitReadback::TargetLogprobs`];
    /// NaN for a row without one).
    pub target_logprobs: Option<Vec<f32>>,
    /// Chunk index (as given to [`ForwardBatch::new`]) of each row.
    pub chunks: Vec<usize>,
    /// GPU time of the step, when it was measured.
    pub timing: Option<StepTiming>,
}

impl Logits {
    /// Row `i`. [vocab]
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    pub fn num_rows(&self) -> usize {
        self.chunks.len()
    }
}

/// GPU time of one step from timestamp queries, in milliseconds, and the host's time recording
/// and submitting it.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct StepTiming {
    pub attention_ms: f64,
    pub total_ms: f64,
    /// Milliseconds by kernel kind (`Timing::PerOp` only).
    pub by_kind: std::collections::BTreeMap<&'static str, f64>,
    /// Compute dispatches recorded (summed over the steps added).
    pub dispatches: u64,
    /// Host milliseconds spent recording the step's commands and submitting them: wall clock
    /// from the command encoder's creation to `queue.submit` returning (wgpu's encoding,
    /// validation and the driver's submission; not the input upload nor the logits readback).
    /// Where it nears `total_ms` the step is bound by the host, not the GPU.
    pub host_ms: f64,
    /// Bytes of logits read back to the host: rows × vocab × 4, or 4 a row when the GPU
    /// sampled greedily ([`LogitReadback::Argmax`]).
    pub readback_bytes: u64,
}

impl StepTiming {
    /// Adds `other` into `self` (summing steps).
    pub fn add(&mut self, other: &StepTiming) {
        self.attention_ms += other.attention_ms;
        self.total_ms += other.total_ms;
        self.dispatches += other.dispatches;
        self.host_ms += other.host_ms;
        self.readback_bytes += other.readback_bytes;
        for (k, v) in &other.by_kind {
            *self.by_kind.entry(k).or_default() += v;
        }
    }
}
