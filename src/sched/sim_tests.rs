//! Scheduler tests on the simulated engine of `sim.rs`: refusals, chunked prefill, preemption,
//! stops, cancellation, shared prompts, the multi-turn chat benchmark, and random workloads.

use std::collections::HashSet;

use proptest::prelude::*;

use super::sim::{splitmix, Sim, SimConfig, SimRequest as Request};
use super::{ConfigField, FinishReason, RequestId, SchedError, Scheduler};
use super::{SchedulerConfig, TokenEvent, Usage};
use crate::kv::{GroupKind, KvLayout, KvManager};

const VOCAB: u32 = 32_000;

fn config(block_size: usize, num_blocks: usize, prefix_cache: bool) -> SimConfig {
    SimConfig {
        layers: vec![GroupKind::Full],
        block_size,
        num_blocks,
        prefix_cache,
        sched: SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 32,
            max_model_len: 64,
            max_logit_rows: 32,
        },
        vocab: VOCAB,
    }
}

/// `len` pseudo-random tokens from `seed`.
fn tokens(seed: u64, len: usize) -> Vec<u32> {
    (0..len as u64).map(|i| (splitmix(seed * 1_000_003 + i) % u64::from(VOCAB)) as u32).collect()
}

fn request(id: RequestId, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        id,
        prompt,
        max_tokens,
        stop_token_ids: Vec::new(),
        namespace: None,
        prompt_logits_from: None,
    }
}

/// Adds `requests`, runs them to the end and checks the outcome.
fn run(config: SimConfig, requests: &[Request]) -> Sim {
    let mut sim = Sim::new(config);
    for r in requests {
        sim.add(r.clone());
    }
    sim.run_to_end(10_000);
    sim.check_end(requests, &HashSet::new());
    sim
}

#[test]
fn bad_requests_and_configs_are_refused_with_the_fix() {
    let layout = KvLayout::f16(1, 1, 1, 4).unwrap();
    let limits = SchedulerConfig {
        max_num_seqs: 2,
        max_num_batched_tokens: 8,
        max_model_len: 16,
        max_logit_rows: 2,
    };
    let err = Scheduler::new(limits, KvManager::new(layout, 3).unwrap()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the KV cache holds 3 blocks of 4 tokens, fewer than the 4 blocks one sequence of \
         -c/--max-model-len 16 needs; raise --kv-cache-memory or lower -c"
    );
    let zero = SchedulerConfig { max_num_batched_tokens: 0, ..limits };
    let err = Scheduler::new(zero, KvManager::new(layout, 4).unwrap()).unwrap_err();
    assert_eq!(err, SchedError::ZeroLimit(ConfigField::MaxNumBatchedTokens));
    assert_eq!(err.to_string(), "--max-num-batched-tokens must be at least 1 (got 0)");

    let mut sched = Scheduler::new(limits, KvManager::new(layout, 4).unwrap()).unwrap();
    let err = sched.add_request(request(1, vec![], 4).sched()).unwrap_err();
    assert_eq!(err, SchedError::EmptyPrompt { id: 1 });
    let err = sched.add_request(request(1, vec![7; 16], 4).sched()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "request 1: the prompt has 16 tokens, but -c/--max-model-len is 16 and the prompt must \
         be shorter to leave room for a generated token; shorten the prompt or raise -c above 16"
    );
    sched.add_request(request(1, vec![7; 15], 100).sched()).unwrap(); // room for 1 token
    let dup = sched.add_request(request(1, vec![7], 1).sched());
    assert_eq!(dup, Err(SchedError::DuplicateId(1)));
    assert!(sched.has_unfinished());
}

#[test]
fn long_prompts_are_chunked_and_mixed_with_decodes() {
    for prefix_cache in [false, true] {
        let mut sim = Sim::new(config(4, 64, prefix_cache));
        let short: Vec<Request> = (0..3).map(|i| request(i, tokens(i, 5), 40)).collect();
        for r in &short {
            sim.add(r.clone());
        }
        sim.step(); // the short ones are admitted and prefilled together
        let long = request(9, tokens(9, 60), 3);
        sim.add(long.clone());
        sim.run_to_end(1_000);
        assert!(sim.saw_chunked_prefill, "a 60-token prompt in a 32-token budget is chunked");
        assert!(sim.saw_mixed_step, "its chunks share steps with the decodes");
        let all: Vec<Request> = short.into_iter().chain([long]).collect();
        sim.check_end(&all, &HashSet::new());
        assert_eq!(sim.sched.stats().num_preemptions, 0);
    }
}

/// Eight requests that together need far more than the 16 blocks of a tiny pool.
fn crowd() -> Vec<Request> {
    (0..8).map(|i| request(i, tokens(100 + i, 10 + 3 * i as usize), 12 + 2 * i as usize)).collect()
}

#[test]
fn a_tiny_pool_preempts_and_reproduces_the_outputs_of_a_huge_one() {
    for prefix_cache in [false, true] {
        let huge = run(config(4, 1024, prefix_cache), &crowd());
        assert_eq!(huge.sched.stats().num_preemptions, 0);
        let tiny = run(config(4, 16, prefix_cache), &crowd());
        let stats = tiny.sched.stats();
        assert!(stats.num_preemptions > 0, "16 blocks of 4 tokens must preempt");
        let tokens_and_reasons = |sim: &Sim| -> std::collections::BTreeMap<_, _> {
            let finished = |o: &super::sim::Outcome| o.finished.map(|(r, u)| (r, u.prompt_tokens));
            sim.outcomes.iter().map(|(id, o)| (*id, (o.tokens.clone(), finished(o)))).collect()
        };
        assert_eq!(tokens_and_reasons(&tiny), tokens_and_reasons(&huge));
        for sim in [&tiny, &huge] {
            // Per-request counters add up to the scheduler's.
            let usages: Vec<Usage> = sim.outcomes.values().map(|o| o.finished.unwrap().1).collect();
            let prefill: usize = usages.iter().map(|u| u.computed_prefill_tokens).sum();
            let preempted: usize = usages.iter().map(|u| u.num_preemptions).sum();
            assert_eq!(prefill as u64, sim.sched.stats().computed_prefill_tokens);
            assert_eq!(preempted as u64, sim.sched.stats().num_preemptions);
        }
        assert_eq!(stats.num_finished.length, 8);
        assert!(stats.computed_prefill_tokens > huge.sched.stats().computed_prefill_tokens);
        if prefix_cache {
            assert!(stats.prefix_hit_tokens > 0, "recomputes hit the prefix cache");
        }
    }
}

#[test]
fn stop_tokens_and_max_model_len_end_requests() {
    let mut cfg = config(4, 64, true);
    cfg.vocab = 8; // frequent stop tokens
    let mut requests: Vec<Request> = (0..6)
        .map(|i| Request { stop_token_ids: vec![3], ..request(i, tokens(i, 6), 30) })
        .collect();
    requests.push(request(6, tokens(6, 60), 30)); // 64 − 60: at most 4 tokens
    let sim = run(cfg, &requests);
    let stats = sim.sched.stats();
    assert!(stats.num_finished.stop > 0);
    assert_eq!(sim.outcomes[&6].tokens.len(), 4);
    assert_eq!(sim.outcomes[&6].finished.unwrap().0, FinishReason::Length);
}

#[test]
fn cancelled_and_engine_finished_requests_give_their_blocks_back() {
    let mut sim = Sim::new(config(4, 16, true));
    let requests = crowd();
    for r in &requests {
        sim.add(r.clone());
    }
    sim.step();
    sim.step();
    let used = sim.sched.kv().num_free_or_evictable_blocks();
    assert!(sim.cancel(0)); // running
    assert!(sim.sched.kv().num_free_or_evictable_blocks() > used);
    assert!(sim.cancel(7)); // waiting
    assert!(!sim.cancel(7));
    let usage = sim.sched.finish(1, FinishReason::Stop).unwrap(); // a stop string, say
    assert_eq!(usage.prompt_tokens, 13);
    assert_eq!(usage.completion_tokens, sim.outcomes[&1].tokens.len());
    assert_eq!(sim.sched.finish(1, FinishReason::Stop), None);
    let events = sim.step();
    assert!(events.iter().all(|e| !matches!(e, TokenEvent::Token { id: 0 | 1 | 7, .. })));
    sim.run_to_end(1_000);
    let cancelled: HashSet<RequestId> = [0, 1, 7].into();
    sim.check_end(&requests, &cancelled);
    let finished = sim.sched.stats().num_finished;
    assert_eq!((finished.cancelled, finished.stop, finished.length), (2, 1, 5));
}

#[test]
fn requests_arriving_together_compute_a_shared_prompt_once() {
    let system = tokens(7, 64);
    let requests: Vec<Request> =
        (0..4).map(|i| request(i, [system.clone(), tokens(50 + i, 10)].concat(), 4)).collect();
    let mut cfg = config(4, 256, true);
    cfg.sched.max_model_len = 128;
    cfg.sched.max_num_batched_tokens = 512; // room to admit all four in the first step
    let sim = run(cfg.clone(), &requests);
    let stats = sim.sched.stats();
    assert_eq!(stats.computed_prefill_tokens, 64 + 4 * 10);
    assert_eq!(stats.prefix_hit_tokens, 3 * 64);
    let cached: Vec<usize> =
        (0..4).map(|i| sim.outcomes[&i].finished.unwrap().1.cached_tokens).collect();
    assert_eq!(cached, [0, 64, 64, 64]);

    cfg.prefix_cache = false;
    let sim = run(cfg, &requests);
    assert_eq!(sim.sched.stats().computed_prefill_tokens, 4 * 74);
}

/// Figures of one multi-turn chat run.
#[derive(Debug)]
struct ChatRun {
    computed_prefill_tokens: u64,
    /// Σ prompt lengths over every request (what a run without reuse prefills).
    sum_prompt_tokens: u64,
    /// System prompt once + every user message once.
    ideal: u64,
    replies: Vec<Vec<u32>>,
    preemptions: u64,
    steps: usize,
}

/// `users` users share a `system_len`-token system prompt; each sends `turns` messages of
/// 100–200 tokens, each answered in ≤ 64 tokens, and sends the next message (history + reply +
/// message) as soon as the reply ends. Users run concurrently.
fn multi_turn_chat(users: u64, turns: u64, system_len: usize, prefix_cache: bool) -> ChatRun {
    let mut cfg = config(16, 1024, prefix_cache);
    // A budget of 2048 tokens could admit two first turns (1124–1224 tokens) in one step: only
    // cache-aware deferral keeps the system prompt from being computed twice.
    cfg.sched = SchedulerConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 2048,
        max_model_len: 4096,
        max_logit_rows: 8,
    };
    let mut sim = Sim::new(cfg);
    let system = tokens(1, system_len);
    let message = |user: u64, turn: u64| {
        let seed = 1000 + user * 100 + turn;
        tokens(seed, 100 + (splitmix(seed) % 101) as usize)
    };
    let max_tokens = |user: u64, turn: u64| 16 + (splitmix(user * 7 + turn) % 49) as usize;
    let mut histories: Vec<Vec<u32>> = vec![system.clone(); users as usize];
    let mut run = ChatRun {
        computed_prefill_tokens: 0,
        sum_prompt_tokens: 0,
        ideal: system_len as u64,
        replies: Vec::new(),
        preemptions: 0,
        steps: 0,
    };
    let send = |sim: &mut Sim, user: u64, history: &mut Vec<u32>, turn: u64, run: &mut ChatRun| {
        let msg = message(user, turn);
        run.ideal += msg.len() as u64;
        history.extend(&msg);
        run.sum_prompt_tokens += history.len() as u64;
        sim.add(request(user * 100 + turn, history.clone(), max_tokens(user, turn)));
    };
    for user in 0..users {
        send(&mut sim, user, &mut histories[user as usize], 0, &mut run);
    }
    while sim.sched.has_unfinished() {
        for event in sim.step() {
            let TokenEvent::Finished { id, .. } = event else { continue };
            let (user, t) = (id / 100, id % 100);
            let reply = sim.outcomes[&id].tokens.clone();
            histories[user as usize].extend(&reply);
            run.replies.push(reply);
            if t + 1 < turns {
                send(&mut sim, user, &mut histories[user as usize], t + 1, &mut run);
            }
        }
    }
    let stats = sim.sched.stats();
    run.computed_prefill_tokens = stats.computed_prefill_tokens;
    run.preemptions = stats.num_preemptions;
    run.steps = sim.steps;
    run
}

#[test]
fn multi_turn_chat_prefills_close_to_the_ideal() {
    let (users, turns) = (4, 8);
    let cached = multi_turn_chat(users, turns, 1024, true);
    let plain = multi_turn_chat(users, turns, 1024, false);
    println!(
        "multi-turn chat, {users} users × {turns} turns, 1024-token system prompt, block 16: \
         computed prefill tokens {} with the prefix cache, {} without (Σ prompts {}), \
         ideal {} (system prompt once + each message once); {} steps, {} preemptions",
        cached.computed_prefill_tokens,
        plain.computed_prefill_tokens,
        plain.sum_prompt_tokens,
        cached.ideal,
        cached.steps,
        cached.preemptions,
    );
    assert_eq!(cached.replies.len(), (users * turns) as usize);
    let mut a = cached.replies.clone();
    let mut b = plain.replies.clone();
    a.sort();
    b.sort();
    assert_eq!(a, b, "the cache changes no reply");
    assert_eq!(cached.preemptions, 0, "the pool holds every history");
    assert!(cached.computed_prefill_tokens >= cached.ideal);
    let slack = users * turns * 16; // one block per turn per user
    assert!(
        cached.computed_prefill_tokens <= cached.ideal + slack,
        "{} > ideal {} + {slack}",
        cached.computed_prefill_tokens,
        cached.ideal
    );
    assert_eq!(plain.computed_prefill_tokens, plain.sum_prompt_tokens);
}

/// A hybrid model (sliding window 12 next to full attention) with the prefix cache: requests
/// sharing a 32-token system prompt reuse it through the window's cached companions, and every
/// output matches the reference (the fake model checks each group's KV reads).
#[test]
fn a_hybrid_model_reuses_a_shared_system_prompt() {
    let mut cfg = config(4, 128, true);
    cfg.layers = vec![GroupKind::Sliding { window: 12 }, GroupKind::Full];
    let system = tokens(7, 32);
    let requests: Vec<Request> =
        (0..4).map(|i| request(i, [system.clone(), tokens(50 + i, 9)].concat(), 6)).collect();
    let mut sim = Sim::new(cfg);
    sim.add(requests[0].clone());
    sim.run_to_end(1_000); // the first one caches the system prompt
    for r in &requests[1..] {
        sim.add(r.clone());
    }
    sim.run_to_end(1_000);
    sim.check_end(&requests, &HashSet::new());
    assert_eq!(sim.sched.stats().prefix_hit_tokens, 3 * 32);
}

// ---- Random workloads ----

#[derive(Clone, Debug)]
struct Workload {
    block_size: usize,
    max_model_len: usize,
    extra_blocks: usize,
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    /// At least max_num_seqs: few enough that prompt-logit chunks get cut short.
    max_logit_rows: usize,
    prefix_cache: bool,
    /// A sliding-window group next to the full one (with the prefix cache as asked: hybrid
    /// caching).
    window: Option<usize>,
    requests: Vec<Request>,
    /// (step, request index): cancel that request at that step if it is unfinished.
    cancels: Vec<(usize, usize)>,
}

fn workload() -> impl Strategy<Value = Workload> {
    let window = prop_oneof![Just(None), (1..=12usize).prop_map(Some)];
    let dims = (1..=4usize, 8..=40usize, 0..8usize, 1..=5usize, 1..=24usize, 0..6usize);
    (dims, any::<bool>(), window).prop_flat_map(
        |(
            (block_size, max_model_len, extra_blocks, max_num_seqs, budget, extra_rows),
            prefix_cache,
            window,
        )| {
            let bases = prop::collection::vec(prop::collection::vec(0..4u32, max_model_len), 2);
            let logits = prop_oneof![3 => Just(None), 1 => (0..40usize).prop_map(Some)];
            let request =
                (0..2usize, 1..max_model_len, 1..=12usize, any::<bool>(), 0..2u64, logits);
            let requests = prop::collection::vec(request, 1..=8);
            let cancels = prop::collection::vec((0..40usize, 0..8usize), 0..3);
            (bases, requests, cancels).prop_map(move |(bases, requests, cancels)| {
                let requests = requests
                    .into_iter()
                    .enumerate()
                    .map(|(i, (base, len, max_tokens, stops, ns, logits))| Request {
                        id: i as RequestId,
                        prompt: bases[base][..len].to_vec(),
                        max_tokens,
                        stop_token_ids: if stops { vec![2] } else { vec![] },
                        namespace: (ns == 1).then_some(1),
                        prompt_logits_from: logits,
                    })
                    .collect();
                Workload {
                    block_size,
                    max_model_len,
                    extra_blocks,
                    max_num_seqs,
                    max_num_batched_tokens: budget,
                    max_logit_rows: max_num_seqs + extra_rows,
                    prefix_cache,
                    window,
                    requests,
                    cancels,
                }
            })
        },
    )
}

/// Runs workload `w` to the end on the simulated engine, checking every step; returns the
/// prefix-hit tokens.
fn run_workload(w: &Workload) -> Result<u64, TestCaseError> {
    let all_blocks = w.max_model_len.div_ceil(w.block_size);
    let lone = match w.window {
        // The full group's blocks plus the sliding group's live bound.
        Some(window) => {
            let step = w.max_num_batched_tokens.min(w.max_model_len);
            all_blocks + ((window - 1 + step).div_ceil(w.block_size) + 1).min(all_blocks)
        }
        None => all_blocks,
    };
    let layers = match w.window {
        Some(window) => vec![GroupKind::Sliding { window }, GroupKind::Full],
        None => vec![GroupKind::Full],
    };
    let cfg = SimConfig {
        layers,
        block_size: w.block_size,
        num_blocks: lone + w.extra_blocks,
        prefix_cache: w.prefix_cache,
        sched: SchedulerConfig {
            max_num_seqs: w.max_num_seqs,
            max_num_batched_tokens: w.max_num_batched_tokens,
            max_model_len: w.max_model_len,
            max_logit_rows: w.max_logit_rows,
        },
        vocab: 8,
    };
    let mut sim = Sim::new(cfg);
    for r in &w.requests {
        sim.add(r.clone());
    }
    let mut cancelled = HashSet::new();
    while sim.sched.has_unfinished() {
        prop_assert!(sim.steps < 5_000, "no end");
        for &(step, idx) in &w.cancels {
            let Some(r) = w.requests.get(idx) else { continue };
            if step == sim.steps && sim.cancel(r.id) {
                cancelled.insert(r.id);
            }
        }
        if sim.sched.has_unfinished() {
            sim.step();
        }
    }
    sim.check_end(&w.requests, &cancelled);
    Ok(sim.sched.stats().prefix_hit_tokens)
}

/// Workloads of a hybrid model (a sliding group next to the full one) with the prefix cache on.
fn hybrid_workload() -> impl Strategy<Value = Workload> {
    (workload(), 1..=12usize).prop_map(|(w, window)| Workload {
        prefix_cache: true,
        window: Some(window),
        ..w
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn random_workloads_finish_with_the_reference_outputs(w in workload()) {
        run_workload(&w)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Hybrid prefix caching: hits through the window's cached companions, loose companions
    /// evicted under locks, exact admission; the fake model checks every KV read per group.
    #[test]
    fn random_hybrid_workloads_with_the_prefix_cache(w in hybrid_workload()) {
        run_workload(&w)?;
    }
}
