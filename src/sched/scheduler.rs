//! [`Scheduler`]: continuous batching over a [`KvManager`] — waiting and running queues, a
//! token budget per step with chunked prefill, admission by free (or evictable) blocks,
//! cache-aware deferral, preemption by recompute. See the module docs of [`super`] for the
//! policy.

use std::collections::{HashMap, VecDeque};

use crate::kv::{KvManager, KvMoves, TenantKvStats};

use super::plan::{ScheduledSeq, StepPlan};
use super::request::{
    ConfigField, FinishReason, Request, RequestId, SchedError, TokenEvent, Usage,
};
use super::sequence::{Phase, Sequence};

/// Limits of the scheduler, resolved once (prefix caching is the [`KvManager`]'s setting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences running at once (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Most tokens computed in one step, prefill chunks and decodes together. Keep it ≥
    /// `max_num_seqs`, or some running sequences will skip steps (decodes go in admission order).
    pub max_num_batched_tokens: usize,
    /// Longest sequence, prompt + generated (`-c/--max-model-len`).
    pub max_model_len: usize,
    /// Most logit rows one step may have (the model's logits buffer; at least `max_num_seqs`):
    /// one for each sequence that samples, and the prompt positions whose logits a scoring
    /// request wants. Those get what one row per other sequence leaves,
    /// `max_logit_rows − (max_num_seqs − 1)`, and a chunk that would need more rows is cut
    /// short (the next step goes on). Taken as `max_num_seqs` where smaller.
    pub max_logit_rows: usize,
}

/// Gauges and counters (counters count since [`Scheduler::new`]), for metrics and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SchedulerStats {
    pub num_running: usize,
    pub num_waiting: usize,
    /// Sequences preempted (recompute), ever.
    pub num_preemptions: u64,
    /// Tokens looked up in the prefix cache at admissions (re-admissions count again).
    pub prefix_query_tokens: u64,
    /// Of those, tokens served from the cache.
    pub prefix_hit_tokens: u64,
    /// Tokens computed in prefill chunks (recomputation after preemption included).
    pub computed_prefill_tokens: u64,
    /// Tokens computed by decodes.
    pub computed_decode_tokens: u64,
    /// Prompt tokens of admitted requests (once per request).
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generation_tokens: u64,
    /// Cached blocks evicted to make room.
    pub num_evicted_blocks: u64,
    /// Of the prefix hit tokens, those brought back from the host tier.
    pub host_hit_tokens: u64,
    /// The host tier (`--kv-offloading-size`): slots, use, blocks moved (all 0 without).
    pub host: crate::kv::HostTierStats,
    /// Fraction of KV blocks held by live sequences (evictable cached blocks count as free).
    pub kv_usage: f32,
    /// Recurrent models: state snapshot slots, those holding a cached prefix's snapshot, and
    /// snapshots evicted to make room, ever (`KvStats`; 0 for attention-only models).
    pub num_snapshot_slots: u32,
    pub num_snapshots: usize,
    pub num_evicted_snapshots: u64,
    /// Requests ended, by reason (`request_success_total{finished_reason}` in vLLM).
    pub num_finished: FinishedCounts,
}

/// One tenant's numbers ([`Scheduler::tenant_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantStats {
    pub kv: TenantKvStats,
    pub num_running: usize,
    pub num_waiting: usize,
}

/// Requests ended, by [`FinishReason`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FinishedCounts {
    pub stop: u64,
    pub length: u64,
    pub cancelled: u64,
}

impl FinishedCounts {
    fn count(&mut self, reason: FinishReason) {
        match reason {
            FinishReason::Stop => self.stop += 1,
            FinishReason::Length => self.length += 1,
            FinishReason::Cancelled => self.cancelled += 1,
        }
    }
}

/// The budget and choices of the step being planned.
struct Step {
    budget_left: usize,
    /// Logit rows left for prompt positions ([`SchedulerConfig::max_logit_rows`]).
    prompt_rows_left: usize,
    /// (sequence, tokens to compute, their slots `[group][token]` as reserved, prompt-logit
    /// rows), in scheduling order.
    chunks: Vec<(RequestId, usize, Vec<Vec<u32>>, usize)>,
    /// Recurrent models: sequences admitted on a cached prefix → the snapshot slot they
    /// restore their states from.
    restores: HashMap<RequestId, u32>,
    /// Recurrent models: sequence → (snapshot slot, tokens of its chunk before the snapshot).
    snapshots: HashMap<RequestId, (u32, usize)>,
}

impl Step {
    fn push(&mut self, id: RequestId, num_tokens: usize, slots: Vec<Vec<u32>>, rows: usize) {
        self.budget_left -= num_tokens;
        self.prompt_rows_left -= rows;
        self.chunks.push((id, num_tokens, slots, rows));
    }

    /// Drops `id`'s chunk, if any, and gives its tokens and rows back.
    fn remove(&mut self, id: RequestId) {
        if let Some(idx) = self.chunks.iter().position(|c| c.0 == id) {
            let (_, tokens, _, rows) = self.chunks.remove(idx);
            self.budget_left += tokens;
            self.prompt_rows_left += rows;
        }
    }
}

/// Continuous-batching scheduler. Owns every unfinished request's state and the
/// [`KvManager`]. Each [`Scheduler::schedule`] must be followed by [`Scheduler::commit`] of its
/// plan before the next one.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvManager,
    seqs: HashMap<RequestId, Sequence>,
    /// Not running, in admission order (preempted sequences go to the front).
    waiting: VecDeque<RequestId>,
    /// Running (live in `kv`), in admission order: the last one is preempted first.
    running: Vec<RequestId>,
    num_preemptions: u64,
    computed_prefill_tokens: u64,
    computed_decode_tokens: u64,
    prompt_tokens: u64,
    generation_tokens: u64,
    num_finished: FinishedCounts,
}

impl Scheduler {
    /// A scheduler over `kv` (fresh: no live sequences). Refuses zero limits, and a pool that
    /// cannot hold one sequence of `max_model_len` tokens: with that guarantee a sequence
    /// running alone always gets its blocks, so preemption always makes progress.
    pub fn new(config: SchedulerConfig, kv: KvManager) -> Result<Self, SchedError> {
        for (value, field) in [
            (config.max_num_seqs, ConfigField::MaxNumSeqs),
            (config.max_num_batched_tokens, ConfigField::MaxNumBatchedTokens),
            (config.max_model_len, ConfigField::MaxModelLen),
        ] {
            if value == 0 {
                return Err(SchedError::ZeroLimit(field));
            }
        }
        let needed =
            kv.blocks_for_lone_sequence(config.max_model_len, config.max_num_batched_tokens);
        if kv.num_blocks() < needed {
            return Err(SchedError::PoolTooSmall {
                num_blocks: kv.num_blocks(),
                block_size: kv.layout().block_size,
                needed,
                max_model_len: config.max_model_len,
            });
        }
        assert_eq!(kv.num_sequences(), 0, "the scheduler needs a KvManager without sequences");
        Ok(Scheduler {
            config,
            kv,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_preemptions: 0,
            computed_prefill_tokens: 0,
            computed_decode_tokens: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            num_finished: FinishedCounts::default(),
        })
    }

    /// The limits in force.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Queues `request` at the back of the waiting queue. Refuses an empty prompt, a prompt of
    /// `max_model_len` tokens or more and an id in use. O(1).
    pub fn add_request(&mut self, request: Request) -> Result<(), SchedError> {
        let (id, prompt_len, max_model_len) =
            (request.id, request.prompt.len(), self.config.max_model_len);
        if prompt_len == 0 {
            return Err(SchedError::EmptyPrompt { id });
        }
        // A prompt needs room for one generated token, except a scoring request (prompt
        // logits): its one sampled token ends it on the full context and is never computed.
        let room = usize::from(request.prompt_logits_from.is_none());
        if prompt_len + room > max_model_len {
            return Err(SchedError::PromptTooLong { id, prompt_len, max_model_len });
        }
        if self.seqs.contains_key(&id) {
            return Err(SchedError::DuplicateId(id));
        }
        self.seqs.insert(id, Sequence::new(request));
        self.waiting.push_back(id);
        Ok(())
    }

    /// Plans the next step; never fails, may preempt. In order: (1) every running sequence in
    /// decode gets its one token; (2) running sequences in prefill continue with
    /// `min(remaining, budget left)` tokens, fewer if the pool holds fewer; (3) waiting
    /// sequences are admitted first come, first served, while `max_num_seqs`, the budget and
    /// the pool allow. A running sequence that cannot get one block even after evicting the
    /// prefix cache preempts the most recently admitted running sequence (itself, if that is
    /// it) and retries. Cost: O(running) plus, per waiting request examined, O(its length) for
    /// the prefix match and O(running × its prefix) for the deferral check.
    pub fn schedule(&mut self) -> StepPlan {
        let c = &self.config;
        let mut step = Step {
            budget_left: c.max_num_batched_tokens,
            prompt_rows_left: c.max_logit_rows.max(c.max_num_seqs) + 1 - c.max_num_seqs,
            chunks: Vec::new(),
            restores: HashMap::new(),
            snapshots: HashMap::new(),
        };
        for phase in [Phase::Decode, Phase::Prefill] {
            for id in self.running.clone() {
                if step.budget_left == 0 {
                    break;
                }
                let seq = &self.seqs[&id];
                if seq.phase != phase || self.kv.table(id).is_none() {
                    continue; // other phase, or preempted earlier in this loop
                }
                let start = seq.num_computed_tokens;
                let cap = seq.prompt_logit_cap(start, step.prompt_rows_left);
                let want = seq.num_remaining().min(step.budget_left).min(cap);
                if want == 0 {
                    continue; // its prompt logits wait for the next step's rows
                }
                self.schedule_running(id, want, &mut step);
            }
        }
        self.admit_waiting(&mut step);
        self.snapshot_targets(&mut step);
        let mut plan = self.build_plan(&step);
        plan.kv_moves = self.kv.take_moves();
        plan
    }

    /// Recurrent models: which of the step's chunks write a state snapshot, and where (the last
    /// block boundary each crosses, or a branch point; `kv/manager_snapshots.rs`).
    fn snapshot_targets(&mut self, step: &mut Step) {
        let b = self.kv.layout().block_size;
        for &(id, num_tokens, ..) in &step.chunks {
            let seq = &self.seqs[&id];
            let (start, end) = (seq.num_computed_tokens, seq.num_computed_tokens + num_tokens);
            let prompt_end = seq.num_prompt_tokens / b * b;
            let target = self.kv.snapshot_target(id, &seq.tokens[..end], start, end, prompt_end);
            if let Some(t) = target.expect("scheduled sequences are live") {
                step.snapshots.insert(id, (t.slot, t.pos - start));
            }
        }
    }

    /// Records what the engine computed for `plan` (the last one [`Scheduler::schedule`]
    /// returned) and the tokens it sampled (one per `sample` entry, `(id, token)` in any order):
    /// advances computed counts, caches newly full blocks, appends sampled tokens and ends the
    /// sequences whose context is full, releasing their blocks (the engine ends the others
    /// through [`Scheduler::finish`] after reading their tokens).
    /// Entries for requests finished or cancelled since the plan are skipped. Returns the events
    /// in plan order. O(plan tokens + cached blocks).
    ///
    /// Panics if a `sample` entry of a running sequence has no sampled token (an engine bug).
    pub fn commit(&mut self, plan: &StepPlan, sampled: &[(RequestId, u32)]) -> Vec<TokenEvent> {
        let sampled: HashMap<RequestId, u32> = sampled.iter().copied().collect();
        let mut events = Vec::new();
        for s in &plan.seqs {
            let Some(seq) = self.seqs.get_mut(&s.id) else { continue };
            if self.kv.table(s.id).is_none() || seq.num_computed_tokens != s.start_pos {
                continue; // no longer running this plan
            }
            seq.num_computed_tokens += s.tokens.len();
            if !s.prompt_logits.is_empty() {
                seq.prompt_logits.start = s.start_pos + s.prompt_logits.end;
            }
            match seq.phase {
                Phase::Prefill => {
                    self.computed_prefill_tokens += s.tokens.len() as u64;
                    seq.num_computed_prefill_tokens += s.tokens.len();
                }
                Phase::Decode => self.computed_decode_tokens += s.tokens.len() as u64,
            }
            self.kv.cache_full_blocks(s.id, seq.computed_tokens()).expect("running is live");
            self.kv.slide_windows(s.id, seq.num_computed_tokens).expect("running is live");
            if !s.sample {
                continue;
            }
            let token = *sampled
                .get(&s.id)
                .unwrap_or_else(|| panic!("no sampled token for request {} (sample = true)", s.id));
            seq.tokens.push(token);
            seq.phase = Phase::Decode;
            self.generation_tokens += 1;
            events.push(TokenEvent::Token { id: s.id, token });
            if let Some(reason) = seq.finish_reason(self.config.max_model_len) {
                let usage = self.remove(s.id, reason).expect("present");
                events.push(TokenEvent::Finished { id: s.id, reason, usage });
            }
        }
        events
    }

    /// Ends request `id` now — the engine's output stage decided it (a stop token, `max_tokens`
    /// or a stop string), or the caller cancelled — and releases its blocks (its computed full blocks stay cached).
    /// Returns its usage, or `None` if `id` is not an unfinished request. No event is emitted
    /// (the caller reports the end); `reason` is counted in [`SchedulerStats::num_finished`].
    /// O(queue lengths + its blocks).
    pub fn finish(&mut self, id: RequestId, reason: FinishReason) -> Option<Usage> {
        self.remove(id, reason)
    }

    /// Cancels request `id`, waiting or running; its blocks come back (computed full blocks
    /// stay cached). Returns whether it was unfinished.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        self.finish(id, FinishReason::Cancelled).is_some()
    }

    /// Whether request `id` is running (admitted, holding KV blocks). O(running).
    pub fn is_running(&self, id: RequestId) -> bool {
        self.running.contains(&id)
    }

    /// Whether any request is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.seqs.is_empty()
    }

    /// The KV bookkeeping (block tables, prefix cache, integrity check).
    /// The waiting sequences' namespaces and cacheable tokens, in admission order (what a
    /// disk tier may fetch ahead of their admission).
    pub fn waiting_prompts(&self) -> Vec<(crate::kv::Namespace, &[u32])> {
        let seq = |id| &self.seqs[id];
        self.waiting.iter().map(|id| (seq(id).namespace, seq(id).cacheable_tokens())).collect()
    }

    /// Takes a block read from a disk tier into the host tier
    /// ([`KvManager::admit_to_host`]); run [`Scheduler::take_kv_moves`]' spills before filling
    /// its slot. Between steps only.
    pub fn admit_to_host(&mut self, key: crate::kv::BlockKey) -> Option<crate::kv::HostSlot> {
        self.kv.admit_to_host(key)
    }

    /// The KV copies pending outside a step's plan ([`KvManager::take_moves`]).
    pub fn take_kv_moves(&mut self) -> KvMoves {
        self.kv.take_moves()
    }

    pub fn kv(&self) -> &KvManager {
        &self.kv
    }

    /// Evicts every cached block no running sequence uses (e.g. after new weights are loaded,
    /// or to compare runs from a cold cache); returns how many.
    pub fn reset_prefix_cache(&mut self) -> usize {
        self.kv.clear_prefix_cache()
    }

    /// Gauges and counters now.
    pub fn stats(&self) -> SchedulerStats {
        let kv = self.kv.stats();
        SchedulerStats {
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            num_preemptions: self.num_preemptions,
            prefix_query_tokens: kv.prefix_query_tokens,
            prefix_hit_tokens: kv.prefix_hit_tokens,
            computed_prefill_tokens: self.computed_prefill_tokens,
            computed_decode_tokens: self.computed_decode_tokens,
            prompt_tokens: self.prompt_tokens,
            generation_tokens: self.generation_tokens,
            num_evicted_blocks: kv.num_evicted_blocks,
            host_hit_tokens: kv.host_hit_tokens,
            host: kv.host,
            kv_usage: kv.usage,
            num_snapshot_slots: kv.num_snapshot_slots,
            num_snapshots: kv.num_snapshots,
            num_evicted_snapshots: kv.num_evicted_snapshots,
            num_finished: self.num_finished,
        }
    }

    /// Tracks tenant `namespace` (per-tenant stats) and caps the KV blocks it may hold, running
    /// and cached, at `quota_blocks` (see `kv/quota.rs`). Refuses a cap that cannot hold one
    /// sequence of `max_model_len` tokens (it could never run) or exceeds the pool.
    pub fn set_tenant(
        &mut self,
        namespace: u64,
        quota_blocks: Option<usize>,
    ) -> Result<(), crate::kv::KvError> {
        let min_blocks = self.kv.layout().blocks_for_tokens(self.config.max_model_len);
        self.kv.set_tenant(namespace, quota_blocks, min_blocks)
    }

    /// Every tracked tenant's KV numbers with its running and waiting requests.
    /// O(tenants × sequences).
    pub fn tenant_stats(&self) -> Vec<TenantStats> {
        self.kv
            .tenant_stats()
            .into_iter()
            .map(|kv| {
                let ns = Some(kv.namespace);
                let count = |ids: &mut dyn Iterator<Item = &RequestId>| {
                    ids.filter(|id| self.seqs[id].namespace == ns).count()
                };
                TenantStats {
                    num_running: count(&mut self.running.iter()),
                    num_waiting: count(&mut self.waiting.iter()),
                    kv,
                }
            })
            .collect()
    }

    /// Gives running sequence `id` up to `want` tokens this step: as many as its table and the
    /// pool (free + evictable) can take; if that is none, preempts the most recently admitted
    /// running sequence and retries. Returns false if `id` itself was preempted.
    fn schedule_running(&mut self, id: RequestId, want: usize, step: &mut Step) -> bool {
        debug_assert_eq!(
            self.kv.table(id).map(|t| t.num_tokens()),
            Some(self.seqs[&id].num_computed_tokens),
            "a plan was not committed"
        );
        loop {
            let num_tokens = want.min(self.kv.num_reservable_tokens(id));
            if num_tokens > 0 {
                let slots = self.kv.reserve(id, num_tokens).expect("fits: num_reservable_tokens");
                let seq = &self.seqs[&id];
                let start = seq.num_computed_tokens;
                let rows = seq.prompt_logit_rows(start..start + num_tokens).len();
                step.push(id, num_tokens, slots, rows);
                return true;
            }
            let victim = self.preemption_victim(id);
            debug_assert!(
                victim != id || self.running.len() > 1,
                "a lone sequence always fits (pool ≥ one max_model_len sequence)"
            );
            self.preempt(victim, step);
            if victim == id {
                return false;
            }
        }
    }

    /// Whom to preempt when running sequence `id` cannot get a block: the most recently admitted
    /// running sequence — of `id`'s own tenant when its KV quota, not the pool, is what is short
    /// (other tenants are never preempted for a tenant over its quota).
    fn preemption_victim(&self, id: RequestId) -> RequestId {
        if self.kv.is_quota_bound(id) {
            let ns = self.seqs[&id].namespace;
            let own = self.running.iter().rev().find(|r| self.seqs[r].namespace == ns);
            return *own.expect("id is running");
        }
        *self.running.last().expect("id is running")
    }

    /// Preemption by recompute: releases `id`'s blocks (its computed full blocks go to the
    /// prefix cache, so the recompute is mostly a hit), keeps its generated tokens, puts it at
    /// the front of the waiting queue and drops its chunk from this step.
    fn preempt(&mut self, id: RequestId, step: &mut Step) {
        let seq = self.seqs.get_mut(&id).expect("running sequence");
        self.kv.release_sequence(id, seq.computed_tokens()).expect("running is live");
        seq.num_computed_tokens = 0;
        seq.phase = Phase::Prefill;
        seq.num_preemptions += 1;
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        self.num_preemptions += 1;
        step.remove(id);
    }

    /// Phase (3): admits waiting sequences in order while a sequence slot, budget and blocks
    /// (counting evictable cached ones) remain. A prefix hit is computed only from its end. A
    /// sequence is skipped this step, not admitted, when a running sequence is prefilling its
    /// first uncached block (it will be a cache hit shortly); with nothing running nothing is
    /// skipped. Stops at the first sequence whose chunk does not fit (first come, first served).
    fn admit_waiting(&mut self, step: &mut Step) {
        let mut idx = 0;
        while idx < self.waiting.len()
            && self.running.len() < self.config.max_num_seqs
            && step.budget_left > 0
        {
            let id = self.waiting[idx];
            let seq = &self.seqs[&id];
            let num_cached = self.kv.num_cached_tokens(seq.namespace, seq.cacheable_tokens());
            if self.is_being_prefilled(seq, num_cached) {
                idx += 1;
                continue;
            }
            let cap = seq.prompt_logit_cap(num_cached, step.prompt_rows_left);
            let num_tokens = (seq.tokens.len() - num_cached).min(step.budget_left).min(cap);
            if num_tokens == 0 {
                break; // no logit rows left for its prompt logits this step
            }
            if !self.kv.can_begin(seq.namespace, seq.cacheable_tokens(), num_tokens) {
                if self.kv.is_quota_bound_ns(seq.namespace) {
                    idx += 1; // its tenant is at its KV quota: it waits, others go ahead
                    continue;
                }
                break;
            }
            self.waiting.remove(idx);
            let seq = self.seqs.get_mut(&id).expect("waiting sequence");
            let hit = self
                .kv
                .begin_sequence(id, seq.namespace, seq.cacheable_tokens())
                .expect("not live");
            debug_assert_eq!(hit, num_cached);
            if let Some(slot) = self.kv.snapshot_restore(id) {
                step.restores.insert(id, slot);
            }
            let slots = self.kv.reserve(id, num_tokens).expect("fits: can_begin");
            seq.num_computed_tokens = hit;
            if seq.first_num_cached_tokens.is_none() {
                seq.first_num_cached_tokens = Some(hit);
                self.prompt_tokens += seq.num_prompt_tokens as u64;
            }
            self.running.push(id);
            let rows = seq.prompt_logit_rows(hit..hit + num_tokens).len();
            step.push(id, num_tokens, slots, rows);
        }
    }

    /// Whether a running sequence in the same namespace is computing, and will cache, the first
    /// full block `seq` would compute after its `num_cached` tokens (cache-aware deferral).
    /// O(running × prefix length).
    fn is_being_prefilled(&self, seq: &Sequence, num_cached: usize) -> bool {
        let Some(cache) = self.kv.prefix_cache() else { return false };
        let end = num_cached + cache.block_size();
        if end >= seq.tokens.len() {
            return false; // that block would not be taken from the cache anyway
        }
        self.running.iter().any(|r| {
            let r = &self.seqs[r];
            r.namespace == seq.namespace
                && r.num_computed_tokens < end
                && r.tokens.len() >= end
                && r.tokens[..end] == seq.tokens[..end]
        })
    }

    /// Turns the step's choices into the plan the engine runs.
    fn build_plan(&self, step: &Step) -> StepPlan {
        let seqs = step
            .chunks
            .iter()
            .map(|(id, num_tokens, slots, _)| {
                let (id, num_tokens) = (*id, *num_tokens);
                let seq = &self.seqs[&id];
                let start_pos = seq.num_computed_tokens;
                let end = start_pos + num_tokens;
                let tables = self.kv.tables(id).expect("running");
                ScheduledSeq {
                    id,
                    start_pos,
                    tokens: seq.tokens[start_pos..end].to_vec(),
                    block_tables: tables.iter().map(|t| t.as_slice().to_vec()).collect(),
                    slot_mapping: slots.clone(),
                    sample: end == seq.tokens.len(),
                    prompt_logits: seq.prompt_logit_rows(start_pos..end),
                    num_cached_tokens: seq.first_num_cached_tokens.unwrap_or(0),
                    restore_state: step.restores.get(&id).copied(),
                    snapshot: step.snapshots.get(&id).copied(),
                }
            })
            .collect();
        StepPlan { seqs, kv_moves: KvMoves::default() }
    }

    /// Removes unfinished request `id` from wherever it is, releasing its blocks if running.
    fn remove(&mut self, id: RequestId, reason: FinishReason) -> Option<Usage> {
        let seq = self.seqs.remove(&id)?;
        self.num_finished.count(reason);
        if let Some(idx) = self.running.iter().position(|&r| r == id) {
            self.running.remove(idx);
            self.kv.release_sequence(id, seq.computed_tokens()).expect("running is live");
        } else {
            self.waiting.retain(|&w| w != id);
        }
        Some(seq.usage())
    }
}
