//! A GPU-free step loop for tests: the real [`Scheduler`] and [`crate::kv::KvManager`], a fake
//! model, and a check of every invariant after every step.
//!
//! The fake model keeps a "KV pool" of one `u64` per slot. The KV of position `p` is a hash of
//! the tokens `0..=p`, computed from the KV of `p − 1` *read through the block table* — so a
//! wrong block table, a cache hit on the wrong block or an overwritten shared block changes every
//! later token. The next token is a function of the last position's KV, never a stop token unless
//! a test puts one in the vocabulary. [`reference_output`] computes the same tokens with no
//! scheduler at all: every run, whatever its pool, budget or preemptions, must match it.
//!
//! The sim plays the engine's part in stopping: after each step it ends a request whose new
//! token is one of its stop tokens or reaches its `max_tokens` ([`Scheduler::finish`]), as the
//! engine's output stage does; the scheduler itself ends only sequences whose context is full.

use std::collections::{HashMap, HashSet};

use crate::kv::{GroupKind, KvGroups, KvLayout, KvManager};

use super::{
    FinishReason, Request, RequestId, Scheduler, SchedulerConfig, StepPlan, TokenEvent, Usage,
};

const SEED: u64 = 0x243F_6A88_85A3_08D3;

/// SplitMix64 finalizer: a cheap, well-mixed 64-bit hash step.
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// KV of a position from the KV before it and its token.
fn kv_of(prev: u64, token: u32) -> u64 {
    splitmix(prev ^ u64::from(token).wrapping_mul(0x0100_0000_01B3))
}

fn next_token(kv: u64, vocab: u32) -> u32 {
    (kv >> 32) as u32 % vocab
}

/// A request as a test states it: what the scheduler gets, plus the stopping rules the engine
/// applies (stop tokens, `max_tokens`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimRequest {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub stop_token_ids: Vec<u32>,
    pub namespace: crate::kv::Namespace,
    /// Ask for prompt logits from this position on.
    pub prompt_logits_from: Option<usize>,
}

impl SimRequest {
    pub fn sched(&self) -> Request {
        Request {
            id: self.id,
            prompt: self.prompt.clone(),
            namespace: self.namespace,
            prompt_logits_from: self.prompt_logits_from,
        }
    }
}

/// The tokens the fake model generates for a request, computed directly (no scheduler, no KV
/// cache), with `max_tokens` clipped to what the context leaves, as the engine does.
pub fn reference_output(request: &SimRequest, vocab: u32, max_model_len: usize) -> Vec<u32> {
    let max_tokens = request.max_tokens.min(max_model_len - request.prompt.len());
    let mut kv = request.prompt.iter().fold(SEED, |h, &t| kv_of(h, t));
    let mut out = Vec::new();
    loop {
        let token = next_token(kv, vocab);
        out.push(token);
        if request.stop_token_ids.contains(&token) || out.len() == max_tokens {
            return out;
        }
        kv = kv_of(kv, token);
    }
}

/// The fake model: slot contents and the vocabulary size.
struct FakeModel {
    /// [num_blocks × block_size] KV of each slot; `None` = never written.
    slots: Vec<Option<u64>>,
    block_size: usize,
    vocab: u32,
}

impl FakeModel {
    /// Runs `plan`: checks that every earlier position of each sequence holds the KV of its
    /// prefix of `known` (its tokens so far), writes the chunk's KV (only into blocks the
    /// sequence alone holds) and samples where asked.
    fn forward(
        &mut self,
        kv: &KvManager,
        plan: &StepPlan,
        known: &HashMap<RequestId, Vec<u32>>,
    ) -> Vec<(RequestId, u32)> {
        let bs = self.block_size;
        let slot = |table: &[u32], pos: usize| table[pos / bs] as usize * bs + pos % bs;
        let mut sampled = Vec::new();
        for s in &plan.seqs {
            let tokens = &known[&s.id];
            // The KV of every position: a hash chain over the tokens.
            let mut chain = vec![SEED];
            for &token in &tokens[..s.positions().end] {
                chain.push(kv_of(*chain.last().expect("non-empty"), token));
            }
            for (g, table) in s.block_tables.iter().enumerate() {
                // Each group reads what its first query sees (a window: only the last keys).
                let first = kv.groups().kind(g).first_visible(s.start_pos);
                for pos in first..s.start_pos {
                    let got = self.slots[slot(table, pos)];
                    assert_eq!(
                        got,
                        Some(chain[pos + 1]),
                        "request {} reads wrong KV at position {pos} in group {g}",
                        s.id
                    );
                }
                for (i, pos) in s.positions().enumerate() {
                    let block = table[pos / bs];
                    assert_eq!(kv.pool().ref_count(block), 1, "write into shared block {block}");
                    let cached = kv.prefix_cache().is_some_and(|c| c.contains(block));
                    assert!(!cached, "write into cached block {block}");
                    assert_eq!(s.slot_mapping[g][i] as usize, slot(table, pos), "slot mapping");
                    self.slots[slot(table, pos)] = Some(chain[pos + 1]);
                }
            }
            if s.sample {
                let last = *chain.last().expect("non-empty");
                sampled.push((s.id, next_token(last, self.vocab)));
            }
        }
        sampled
    }
}

/// Sizes of a simulated engine.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Attention kind of each layer: one entry per layer (its KV-cache groups follow).
    pub layers: Vec<GroupKind>,
    pub block_size: usize,
    pub num_blocks: usize,
    pub prefix_cache: bool,
    pub sched: SchedulerConfig,
    pub vocab: u32,
}

/// What happened to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub tokens: Vec<u32>,
    pub finished: Option<(FinishReason, Usage)>,
}

/// The step loop with its checks and observations.
pub struct Sim {
    pub sched: Scheduler,
    model: FakeModel,
    /// Every request's tokens so far: prompt, then generated.
    known: HashMap<RequestId, Vec<u32>>,
    prompt_lens: HashMap<RequestId, usize>,
    /// The engine's stopping rules per unfinished request: (clipped max_tokens, stop tokens).
    stops: HashMap<RequestId, (usize, Vec<u32>)>,
    pub outcomes: HashMap<RequestId, Outcome>,
    /// Prompt positions each request got logits for, in order of delivery.
    pub prompt_logits: HashMap<RequestId, Vec<usize>>,
    pub steps: usize,
    /// Some step computed a prefill chunk that did not end the prompt.
    pub saw_chunked_prefill: bool,
    /// Some step held a decode and a prefill chunk together.
    pub saw_mixed_step: bool,
}

impl Sim {
    pub fn new(config: SimConfig) -> Self {
        let groups = KvGroups::from_layer_kinds(&config.layers);
        let layout = KvLayout::f16(groups.slots_per_block(), 1, 1, config.block_size).unwrap();
        let kv =
            KvManager::with_groups(layout, groups, config.num_blocks, config.prefix_cache).unwrap();
        Sim {
            sched: Scheduler::new(config.sched, kv).unwrap(),
            model: FakeModel {
                slots: vec![None; config.num_blocks * config.block_size],
                block_size: config.block_size,
                vocab: config.vocab,
            },
            known: HashMap::new(),
            prompt_lens: HashMap::new(),
            stops: HashMap::new(),
            outcomes: HashMap::new(),
            prompt_logits: HashMap::new(),
            steps: 0,
            saw_chunked_prefill: false,
            saw_mixed_step: false,
        }
    }

    pub fn add(&mut self, request: SimRequest) {
        assert!(request.max_tokens > 0, "the engine refuses max_tokens 0");
        self.known.insert(request.id, request.prompt.clone());
        self.prompt_lens.insert(request.id, request.prompt.len());
        self.outcomes.insert(request.id, Outcome { tokens: Vec::new(), finished: None });
        let max_model_len = self.sched.config().max_model_len;
        let max_tokens = request.max_tokens.min(max_model_len.saturating_sub(request.prompt.len()));
        self.stops.insert(request.id, (max_tokens, request.stop_token_ids.clone()));
        self.sched.add_request(request.sched()).unwrap();
    }

    pub fn cancel(&mut self, id: RequestId) -> bool {
        let cancelled = self.sched.cancel(id);
        self.sched.kv().check_integrity().unwrap();
        cancelled
    }

    /// One step: schedule, check the plan, fake forward, commit, end the requests the engine
    /// would end, record the events. Returns the scheduler's events, then a `Finished` for each
    /// request the sim ended (what the engine would report).
    pub fn step(&mut self) -> Vec<TokenEvent> {
        let plan = self.sched.schedule();
        self.check_plan(&plan);
        self.sched.kv().check_integrity().unwrap_or_else(|e| panic!("after schedule: {e}"));
        let sampled = self.model.forward(self.sched.kv(), &plan, &self.known);
        for s in &plan.seqs {
            let rows = s.prompt_logits.clone();
            let got = self.prompt_logits.entry(s.id).or_default();
            got.extend(rows.map(|r| s.start_pos + r));
        }
        let events = self.sched.commit(&plan, &sampled);
        self.sched.kv().check_integrity().unwrap_or_else(|e| panic!("after commit: {e}"));
        let mut decided = HashMap::new();
        let mut ended = Vec::new();
        for event in &events {
            match *event {
                TokenEvent::Token { id, token } => {
                    self.known.get_mut(&id).unwrap().push(token);
                    let outcome = self.outcomes.get_mut(&id).unwrap();
                    outcome.tokens.push(token);
                    let (max_tokens, stop_ids) = &self.stops[&id];
                    let reason = if stop_ids.contains(&token) {
                        Some(FinishReason::Stop)
                    } else {
                        (outcome.tokens.len() >= *max_tokens).then_some(FinishReason::Length)
                    };
                    let Some(reason) = reason else { continue };
                    decided.insert(id, reason);
                    if let Some(usage) = self.sched.finish(id, reason) {
                        self.record_end(id, reason, usage);
                        ended.push(TokenEvent::Finished { id, reason, usage });
                    }
                }
                TokenEvent::Finished { id, reason, usage } => {
                    self.record_end(id, decided.get(&id).copied().unwrap_or(reason), usage);
                }
            }
        }
        self.sched.kv().check_integrity().unwrap_or_else(|e| panic!("after finish: {e}"));
        self.steps += 1;
        events.into_iter().chain(ended).collect()
    }

    /// Records the end of request `id` (once).
    fn record_end(&mut self, id: RequestId, reason: FinishReason, usage: Usage) {
        let outcome = self.outcomes.get_mut(&id).unwrap();
        assert!(outcome.finished.is_none(), "request {id} finished twice");
        assert_eq!(usage.completion_tokens, outcome.tokens.len());
        assert_eq!(usage.prompt_tokens, self.prompt_lens[&id]);
        outcome.finished = Some((reason, usage));
        self.stops.remove(&id);
    }

    /// Steps until every request has ended. Panics after `max_steps`.
    pub fn run_to_end(&mut self, max_steps: usize) {
        while self.sched.has_unfinished() {
            assert!(self.steps < max_steps, "no end after {max_steps} steps");
            self.step();
        }
    }

    /// Every invariant of a plan (see the module docs of [`super`]).
    fn check_plan(&mut self, plan: &StepPlan) {
        let config = *self.sched.config();
        let bs = self.model.block_size;
        assert!(plan.seqs.len() <= config.max_num_seqs, "{} sequences", plan.seqs.len());
        assert!(plan.num_tokens() <= config.max_num_batched_tokens, "{} tokens", plan.num_tokens());
        // the engine's logit rows (engine::logit_rows): the prompt positions that want logits,
        // through the last one when the chunk samples, else the sampled row alone
        let rows: usize = plan
            .seqs
            .iter()
            .map(|s| match (s.sample, s.prompt_logits.is_empty()) {
                (false, _) => s.prompt_logits.len(),
                (true, true) => 1,
                (true, false) => s.tokens.len() - s.prompt_logits.start,
            })
            .sum();
        assert!(rows <= config.max_logit_rows.max(config.max_num_seqs), "{rows} logit rows");
        assert!(self.sched.stats().num_running <= config.max_num_seqs);
        assert!(
            !plan.is_empty() || !self.sched.has_unfinished(),
            "empty plan with requests left: stalled"
        );
        let mut ids = HashSet::new();
        let (mut decodes, mut chunks) = (0, 0);
        for s in &plan.seqs {
            assert!(ids.insert(s.id), "request {} twice in a plan", s.id);
            let known = &self.known[&s.id];
            assert!(!s.tokens.is_empty());
            assert_eq!(s.tokens, known[s.positions()], "request {}: wrong tokens", s.id);
            assert_eq!(s.sample, s.positions().end == known.len());
            let tables = self.sched.kv().tables(s.id).unwrap();
            assert_eq!(s.block_tables.len(), tables.len());
            for (table, live) in s.block_tables.iter().zip(tables) {
                assert_eq!(table.len(), s.positions().end.div_ceil(bs));
                assert_eq!(table, live.as_slice());
            }
            if s.tokens.len() == 1 && s.start_pos >= self.prompt_lens[&s.id] {
                decodes += 1;
            } else {
                chunks += 1;
                self.saw_chunked_prefill |= !s.sample;
            }
        }
        self.saw_mixed_step |= decodes > 0 && chunks > 0;
    }

    /// After the run: every non-cancelled request ended exactly once with the reference output,
    /// and the pool is whole again once the prefix cache is emptied.
    pub fn check_end(&mut self, requests: &[SimRequest], cancelled: &HashSet<RequestId>) {
        let max_model_len = self.sched.config().max_model_len;
        for r in requests {
            let outcome = &self.outcomes[&r.id];
            let want = reference_output(r, self.model.vocab, max_model_len);
            if cancelled.contains(&r.id) {
                assert!(want.starts_with(&outcome.tokens), "request {} diverged", r.id);
                continue;
            }
            assert_eq!(outcome.tokens, want, "request {}", r.id);
            // Prompt logits: every wanted position exactly once, in order (none came from the
            // cache, none twice after a preemption).
            let wanted: Vec<usize> = r
                .prompt_logits_from
                .map_or(0..0, |from| from.min(r.prompt.len())..r.prompt.len())
                .collect();
            let got = self.prompt_logits.get(&r.id).cloned().unwrap_or_default();
            assert_eq!(got, wanted, "request {}: prompt logit positions", r.id);
            let (reason, _) = outcome.finished.expect("every request finishes");
            let stopped = r.stop_token_ids.contains(want.last().unwrap());
            assert_eq!(reason, if stopped { FinishReason::Stop } else { FinishReason::Length });
        }
        let kv = self.sched.kv();
        assert_eq!(kv.num_sequences(), 0);
        assert_eq!(kv.num_free_or_evictable_blocks(), kv.num_blocks());
        self.sched.reset_prefix_cache();
        assert_eq!(self.sched.kv().num_free_blocks(), self.sched.kv().num_blocks());
        self.sched.kv().check_integrity().unwrap();
    }
}
