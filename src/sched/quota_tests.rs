//! Tenant KV quotas on the simulated engine (`sim.rs`): a tenant never holds more than its
//! quota (checked after every step by `KvManager::check_integrity`), outputs stay the
//! reference's, a tenant at its quota waits without blocking or preempting others, and a noisy
//! tenant does not evict a quiet tenant's cached prefix.

use std::collections::HashSet;

use proptest::prelude::*;

use super::sim::{splitmix, Sim, SimConfig, SimRequest as Request};
use super::{RequestId, SchedulerConfig};

const VOCAB: u32 = 32_000;
const QUIET: u64 = 7;
const NOISY: u64 = 9;

fn tokens(seed: u64, len: usize) -> Vec<u32> {
    (0..len as u64).map(|i| (splitmix(seed * 1_000_003 + i) % u64::from(VOCAB)) as u32).collect()
}

fn request(id: RequestId, prompt: Vec<u32>, max_tokens: usize, ns: u64) -> Request {
    Request {
        id,
        prompt,
        max_tokens,
        stop_token_ids: Vec::new(),
        namespace: Some(ns),
        prompt_logits_from: None,
    }
}

/// Block size 4, context 32 (8 blocks a sequence), `num_blocks` in the pool, prefix cache on.
fn sim(num_blocks: usize, max_num_seqs: usize) -> Sim {
    Sim::new(SimConfig {
        layers: vec![crate::kv::GroupKind::Full],
        block_size: 4,
        num_blocks,
        prefix_cache: true,
        sched: SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: 64,
            max_model_len: 32,
            max_logit_rows: max_num_seqs,
        },
        vocab: VOCAB,
    })
}

#[test]
fn a_quota_below_one_sequence_or_above_the_pool_is_refused() {
    let mut s = sim(40, 4);
    let e = s.sched.set_tenant(NOISY, Some(7)).unwrap_err().to_string();
    assert!(e.contains("8 blocks") && e.contains("--tenant-kv-quota"), "{e}");
    assert!(s.sched.set_tenant(NOISY, Some(41)).is_err());
    s.sched.set_tenant(NOISY, Some(8)).unwrap();
    s.sched.set_tenant(QUIET, None).unwrap();
}

#[test]
fn a_noisy_tenant_does_not_evict_a_quiet_tenants_cached_prefix() {
    // Pool of 24 blocks: the quiet tenant's cached conversation (6 blocks) and the noisy
    // tenant's quota (12) fit together.
    let mut s = sim(24, 4);
    s.sched.set_tenant(NOISY, Some(12)).unwrap();
    s.sched.set_tenant(QUIET, None).unwrap();
    let quiet_prompt = tokens(1, 24);
    s.add(request(0, quiet_prompt.clone(), 1, QUIET));
    s.run_to_end(1_000);
    let cached = s.sched.kv().prefix_cache().unwrap().num_cached_blocks_in(Some(QUIET));
    assert_eq!(cached, 6);
    // The noisy tenant sends many different long prompts: it churns through its own quota.
    let noisy: Vec<Request> =
        (1..=20).map(|i| request(i, tokens(100 + i, 20 + (i as usize % 8)), 4, NOISY)).collect();
    for r in &noisy {
        s.add(r.clone());
    }
    let mut peak = 0;
    while s.sched.has_unfinished() {
        assert!(s.steps < 10_000);
        s.step();
        let held = s.sched.kv().num_held_blocks(Some(NOISY));
        assert!(held <= 12, "noisy tenant holds {held} blocks, over its quota of 12");
        peak = peak.max(held);
    }
    assert!(peak >= 10, "the test should push the noisy tenant to its quota (peak {peak})");
    let kv = s.sched.kv();
    assert_eq!(kv.prefix_cache().unwrap().num_cached_blocks_in(Some(QUIET)), 6, "quiet kept");
    assert_eq!(kv.num_cached_tokens(Some(QUIET), &quiet_prompt), 20, "still a hit");
    assert_eq!(kv.num_cached_tokens(Some(NOISY), &quiet_prompt), 0, "namespaces share nothing");
    let done: HashSet<RequestId> = HashSet::new();
    s.check_end(&noisy, &done);
}

#[test]
fn a_tenant_at_its_quota_waits_while_others_run() {
    // Tenant NOISY may hold 8 blocks: one full sequence. Two of its long requests cannot run
    // together; a QUIET request behind them is admitted at once and never preempted.
    let mut s = sim(40, 4);
    s.sched.set_tenant(NOISY, Some(8)).unwrap();
    s.sched.set_tenant(QUIET, None).unwrap();
    s.add(request(0, tokens(1, 20), 12, NOISY));
    s.add(request(1, tokens(2, 20), 12, NOISY));
    s.add(request(2, tokens(3, 8), 4, QUIET));
    s.step();
    assert!(s.sched.is_running(0));
    assert!(!s.sched.is_running(1), "over its tenant's quota: waits");
    assert!(s.sched.is_running(2), "another tenant is not held up");
    let stats = s.sched.tenant_stats();
    let noisy = stats.iter().find(|t| t.kv.namespace == NOISY).unwrap();
    assert_eq!((noisy.num_running, noisy.num_waiting), (1, 1));
    assert_eq!(noisy.kv.quota_blocks, Some(8));
    s.run_to_end(1_000);
    let quiet_usage = s.outcomes[&2].finished.unwrap().1;
    assert_eq!(quiet_usage.num_preemptions, 0);
    let requests: Vec<Request> = vec![
        request(0, tokens(1, 20), 12, NOISY),
        request(1, tokens(2, 20), 12, NOISY),
        request(2, tokens(3, 8), 4, QUIET),
    ];
    s.check_end(&requests, &HashSet::new());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random multi-tenant loads with random quotas: every step keeps every tenant within its
    /// quota (`check_integrity` runs after each step), every request ends with the reference
    /// output, the pool comes back whole.
    #[test]
    fn quotas_hold_at_every_step(
        extra in 0..24usize,
        quotas in prop::collection::vec(prop::option::of(8..=20usize), 3),
        reqs in prop::collection::vec((0..3u64, 0..3u64, 1..31usize, 1..=8usize), 1..=12),
        max_num_seqs in 1..=4usize,
    ) {
        let num_blocks = 20 + extra;
        let mut s = sim(num_blocks, max_num_seqs);
        for (ns, q) in quotas.iter().enumerate() {
            s.sched.set_tenant(ns as u64, q.map(|q| q.min(num_blocks))).unwrap();
        }
        let bases: Vec<Vec<u32>> = (0..3).map(|b| tokens(50 + b, 31)).collect();
        let requests: Vec<Request> = reqs
            .iter()
            .enumerate()
            .map(|(i, &(ns, base, len, max_tokens))| {
                request(i as RequestId, bases[base as usize][..len].to_vec(), max_tokens, ns)
            })
            .collect();
        for r in &requests {
            s.add(r.clone());
        }
        s.run_to_end(5_000);
        s.check_end(&requests, &HashSet::new());
    }
}
