//! [`KvManager`] with state snapshots (recurrent models): unit tests of where snapshots are
//! taken, kept and restored, and a property test of random begin / step / release / clear
//! sequences that tracks what each snapshot slot "holds" (the tokens whose states were written
//! into it) and checks that every hit restores a slot holding exactly the hit tokens' states,
//! with `check_integrity()` (slots free, owned or written by one sequence, no tenant over its
//! quota with states counted) after every operation.

use std::collections::HashMap;

use proptest::prelude::*;

use super::{KvError, KvLayout, KvManager, SeqId};

/// `num_blocks` blocks of 4 tokens, prefix cache on, `slots` snapshot slots.
fn hybrid(num_blocks: usize, slots: u32) -> KvManager {
    let layout = KvLayout::f16(1, 1, 2, 4).unwrap();
    KvManager::with_prefix_cache(layout, num_blocks, true).unwrap().with_state_snapshots(slots)
}

/// One step of `seq` over `tokens[start..end]`: reserve, take its snapshot target, commit.
/// Returns the target `(slot, position)`.
fn step(
    kv: &mut KvManager,
    seq: SeqId,
    tokens: &[u32],
    start: usize,
    end: usize,
    prompt_end: usize,
) -> Option<(u32, usize)> {
    kv.reserve(seq, end - start).unwrap();
    let target = kv.snapshot_target(seq, &tokens[..end], start, end, prompt_end).unwrap();
    kv.check_integrity().unwrap();
    kv.cache_full_blocks(seq, &tokens[..end]).unwrap();
    kv.check_integrity().unwrap();
    target.map(|t| (t.slot, t.pos))
}

#[test]
fn a_prefix_is_usable_where_a_snapshot_ends_it() {
    let mut kv = hybrid(16, 4);
    let prompt: Vec<u32> = (0..10).collect();
    assert_eq!(kv.begin_sequence(1, None, &prompt).unwrap(), 0);
    assert_eq!(kv.snapshot_restore(1), None);
    // one step over the prompt: a snapshot at its last boundary, 8
    assert_eq!(step(&mut kv, 1, &prompt, 0, 10, 8), Some((0, 8)));
    // decoding: 10 → 13 crosses 12 (a decode snapshot), 13 → 14 crosses nothing
    let mut tokens = prompt.clone();
    tokens.extend([50, 51, 52, 53]);
    assert_eq!(step(&mut kv, 1, &tokens, 10, 13, 8), Some((1, 12)));
    assert_eq!(step(&mut kv, 1, &tokens, 13, 14, 8), None);
    kv.release_sequence(1, &tokens[..14]).unwrap();
    assert_eq!(kv.stats().num_snapshots, 2);

    // blocks at 4 and 8 and 12 are cached; only 8 and 12 end at a snapshot
    let mut next = tokens[..14].to_vec();
    next.extend([60, 61, 62]);
    assert_eq!(kv.num_cached_tokens(None, &next), 12);
    assert_eq!(kv.begin_sequence(2, None, &next).unwrap(), 12);
    assert_eq!(kv.snapshot_restore(2), Some(1));
    kv.release_sequence(2, &[]).unwrap();
    // a prompt that leaves the tree at 8 gets the prompt's snapshot
    let regenerate: Vec<u32> = prompt.iter().copied().chain([70, 71, 72]).collect();
    assert_eq!(kv.begin_sequence(3, None, &regenerate).unwrap(), 8);
    assert_eq!(kv.snapshot_restore(3), Some(0));
    kv.release_sequence(3, &[]).unwrap();
    // a prompt sharing only the first block: no snapshot at 4, computed from the start; its
    // step snapshots the branch point 4 (before its last boundary, 8)
    let other: Vec<u32> = (0..4).chain([90, 91, 92, 93, 94]).collect();
    assert_eq!(kv.begin_sequence(4, None, &other).unwrap(), 0);
    assert_eq!(step(&mut kv, 4, &other, 0, 9, 8), Some((2, 4)));
    kv.release_sequence(4, &other).unwrap();
    let third: Vec<u32> = (0..4).chain([80, 81, 82]).collect();
    assert_eq!(kv.num_cached_tokens(None, &third), 4);
    kv.check_integrity().unwrap();
}

#[test]
fn only_the_newest_unkept_snapshot_of_a_sequence_stays() {
    let mut kv = hybrid(16, 8);
    let tokens: Vec<u32> = (0..30).collect();
    kv.begin_sequence(1, None, &tokens[..5]).unwrap();
    // prompt of 5 tokens (prompt end 4), then decode to 29: snapshots at 4 (kept), then at 8,
    // 12, ..., 28 (each replacing the one before)
    assert_eq!(step(&mut kv, 1, &tokens, 0, 5, 4), Some((0, 4)));
    for end in 6..30 {
        step(&mut kv, 1, &tokens, end - 1, end, 4);
    }
    kv.release_sequence(1, &tokens[..29]).unwrap();
    assert_eq!(kv.stats().num_snapshots, 2, "the prompt's and the newest decode one");
    assert_eq!(kv.num_cached_tokens(None, &tokens), 28);
    assert_eq!(kv.num_cached_tokens(None, &[0, 1, 2, 3, 4, 5, 9, 9, 9]), 4);
    kv.check_integrity().unwrap();
}

#[test]
fn snapshots_are_evicted_least_recently_used_first_and_pending_ones_never() {
    let mut kv = hybrid(32, 2);
    let a: Vec<u32> = (0..9).collect();
    let b: Vec<u32> = (100..109).collect();
    let c: Vec<u32> = (200..209).collect();
    for (seq, p) in [(1, &a), (2, &b)] {
        kv.begin_sequence(seq, None, p).unwrap();
        step(&mut kv, seq, p, 0, 9, 8);
        kv.release_sequence(seq, p).unwrap();
    }
    assert_eq!(kv.stats().num_snapshots, 2);
    // a is used again (its snapshot restored): b's is the least recently used
    kv.begin_sequence(3, None, &a).unwrap();
    assert_eq!(kv.snapshot_restore(3), Some(0));
    kv.begin_sequence(4, None, &c).unwrap();
    assert_eq!(step(&mut kv, 4, &c, 0, 9, 8), Some((1, 8)), "b's slot");
    assert_eq!(kv.num_cached_tokens(None, &b), 0);
    assert_eq!(kv.num_cached_tokens(None, &a), 8);
    // both slots are owned; a step that takes one while another sequence's write is pending
    kv.begin_sequence(5, None, &b).unwrap();
    kv.reserve(5, 9).unwrap();
    let t = kv.snapshot_target(5, &b, 0, 9, 8).unwrap().unwrap();
    assert_eq!(kv.stats().num_evicted_snapshots, 2);
    kv.begin_sequence(6, None, &[7, 7, 7, 7, 7, 7, 7, 7, 7]).unwrap();
    kv.reserve(6, 9).unwrap();
    let u = kv.snapshot_target(6, &[7; 9], 0, 9, 8).unwrap().unwrap();
    assert_ne!(t.slot, u.slot, "a pending slot is not taken");
    kv.reserve(3, 1).unwrap();
    assert_eq!(kv.snapshot_target(3, &a, 8, 9, 8).unwrap(), None, "every slot is pending");
    kv.check_integrity().unwrap();
    // a sequence released before its step is committed gives its slot back
    kv.release_sequence(5, &[]).unwrap();
    kv.check_integrity().unwrap();
    assert_eq!(kv.stats().num_snapshots, 0);
}

const A: u64 = 1;
const B: u64 = 2;

/// Begins `seq` of tenant `ns` on `tokens` as the scheduler admits it (can_begin, begin,
/// restore, then the first step over the rest of the prompt); returns the hit and the step's
/// snapshot target.
fn admit(
    kv: &mut KvManager,
    seq: SeqId,
    ns: u64,
    tokens: &[u32],
) -> Option<(usize, Option<(u32, usize)>)> {
    let hit = kv.num_cached_tokens(Some(ns), tokens);
    if !kv.can_begin(Some(ns), tokens, tokens.len() - hit) {
        return None;
    }
    assert_eq!(kv.begin_sequence(seq, Some(ns), tokens).unwrap(), hit);
    let prompt_end = tokens.len() / 4 * 4;
    Some((hit, step(kv, seq, tokens, hit, tokens.len(), prompt_end)))
}

#[test]
fn a_quota_counts_running_states_and_snapshots() {
    // States of 3 blocks' worth; 2 running slots and 4 snapshot slots: the capacity quotas
    // divide is 40 + 3 × 6 blocks.
    let mut kv = hybrid(40, 4).with_sequence_states(3, 2);
    assert_eq!(kv.quota_capacity(), 58);
    let e = kv.set_tenant(A, Some(5), 3).unwrap_err();
    assert!(matches!(e, KvError::BadQuota { min_blocks: 6, num_blocks: 58, .. }), "{e}");
    assert!(kv.set_tenant(A, Some(59), 3).is_err());
    kv.set_tenant(A, Some(12), 3).unwrap();
    kv.set_tenant(B, None, 3).unwrap();

    // 10 tokens: 3 blocks, its running state, and the snapshot its step takes at 8.
    let first: Vec<u32> = (0..10).collect();
    assert_eq!(admit(&mut kv, 1, A, &first), Some((0, Some((0, 8)))));
    kv.check_integrity().unwrap();
    let a = |kv: &KvManager| (kv.num_held_blocks(Some(A)), kv.num_held_states(Some(A)));
    assert_eq!(a(&kv), (3 + 3 + 3, 2));
    kv.release_sequence(1, &first).unwrap();
    assert_eq!(a(&kv), (2 + 3, 1), "two cached blocks and the snapshot at 8");

    // 16 new tokens: 4 blocks and a state fit (12 − 5 held + 5 its own to give up); the
    // snapshot its step takes at 16 needs the room of the old one, which goes.
    let second: Vec<u32> = (100..116).collect();
    assert_eq!(admit(&mut kv, 2, A, &second), Some((0, Some((0, 16)))), "the freed slot");
    kv.check_integrity().unwrap();
    assert_eq!(kv.num_cached_tokens(Some(A), &first), 0, "its snapshot was given up");
    assert_eq!(kv.stats().num_evicted_snapshots, 1);
    assert_eq!(a(&kv), (12, 2));
    // A is at its quota: a third sequence (4 blocks + a state) waits; B is not held up.
    let third: Vec<u32> = (200..216).collect();
    assert!(kv.is_quota_bound_ns(Some(A)));
    assert_eq!(admit(&mut kv, 3, A, &third), None);
    assert!(admit(&mut kv, 4, B, &third).is_some());
    kv.check_integrity().unwrap();
    let stats = kv.tenant_stats();
    assert_eq!((stats[0].num_held_blocks, stats[0].num_held_states), (12, 2));
    assert_eq!(stats[1].num_held_states, 2, "B: its running state and its snapshot at 16");
}

#[test]
fn a_snapshot_without_room_under_the_quota_is_skipped() {
    // Quota: one 12-token sequence (3 blocks) and its state, nothing for a snapshot.
    let mut kv = hybrid(40, 4).with_sequence_states(2, 2);
    kv.set_tenant(A, Some(5), 3).unwrap();
    let tokens: Vec<u32> = (0..12).collect();
    assert_eq!(admit(&mut kv, 1, A, &tokens), Some((0, None)));
    assert_eq!(kv.num_held_blocks(Some(A)), 5);
    kv.release_sequence(1, &tokens).unwrap();
    assert_eq!(kv.num_cached_tokens(Some(A), &tokens), 0, "no snapshot, no usable prefix");
    // without a quota the same sequence snapshots at 12
    kv.set_tenant(A, None, 3).unwrap();
    assert_eq!(admit(&mut kv, 2, A, &tokens), Some((0, Some((0, 12)))));
    kv.check_integrity().unwrap();
}

#[test]
fn with_every_slot_owned_a_quota_tenant_reuses_its_own_oldest_snapshot() {
    let mut kv = hybrid(40, 2).with_sequence_states(1, 2);
    kv.set_tenant(A, Some(30), 3).unwrap();
    kv.set_tenant(B, None, 3).unwrap();
    // B's snapshot is the oldest, A's next; then A takes a slot again.
    let (b, a1, a2): (Vec<u32>, Vec<u32>, Vec<u32>) =
        ((0..9).collect(), (100..109).collect(), (200..209).collect());
    for (seq, ns, tokens) in [(1, B, &b), (2, A, &a1)] {
        assert_eq!(admit(&mut kv, seq, ns, tokens).unwrap().1.map(|t| t.1), Some(8));
        kv.release_sequence(seq, tokens).unwrap();
    }
    assert_eq!(admit(&mut kv, 3, A, &a2).unwrap().1, Some((1, 8)), "A's own slot");
    kv.release_sequence(3, &a2).unwrap();
    assert_eq!(kv.num_cached_tokens(Some(B), &b), 8, "B's snapshot stays");
    assert_eq!(kv.num_cached_tokens(Some(A), &a1), 0);
    // a tenant without a quota takes the least recently used: B's
    kv.set_tenant(A, None, 3).unwrap();
    assert_eq!(admit(&mut kv, 4, A, &a1).unwrap().1, Some((0, 8)), "B's slot");
    assert_eq!(kv.num_cached_tokens(Some(B), &b), 0);
    kv.check_integrity().unwrap();
}

#[derive(Clone, Debug)]
enum Op {
    /// Begin sequence `seq` on prompt `prompt` (of a few that share starts), computing up to
    /// `n` tokens after its hit.
    Begin {
        seq: SeqId,
        prompt: usize,
        n: usize,
    },
    /// Compute `n` more tokens of `seq` (prompt first, then generated ones).
    Step {
        seq: SeqId,
        n: usize,
    },
    Release(SeqId),
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..4u64, 0..4usize, 1..20usize)
            .prop_map(|(seq, prompt, n)| Op::Begin { seq, prompt, n }),
        6 => (0..4u64, 1..12usize).prop_map(|(seq, n)| Op::Step { seq, n }),
        2 => (0..4u64).prop_map(Op::Release),
        1 => Just(Op::Clear),
    ]
}

/// A live sequence: its tokens (prompt, then generated), computed count, prompt end.
struct Live {
    tokens: Vec<u32>,
    computed: usize,
    prompt_end: usize,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Snapshot slots hold what the bookkeeping says: a hit of `P` tokens restores a slot
    /// whose states were written after exactly those `P` tokens; slots are never leaked.
    #[test]
    /// Sequences belong to two tenants (by the parity of their id); tenant 0 may have a
    /// quota, and states count toward it as `state_blocks` blocks each.
    #[test]
    fn restores_read_the_states_of_the_hit_tokens(
        slots in 0..4u32,
        state_blocks in 0..4usize,
        quota in prop::option::of(6..=30usize),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut kv = hybrid(40, slots).with_sequence_states(state_blocks, 4);
        kv.set_tenant(0, quota.map(|q| q + state_blocks), 6).unwrap();
        kv.set_tenant(1, None, 6).unwrap();
        let base: Vec<u32> = (0..24).collect();
        let prompts: Vec<Vec<u32>> = vec![
            base[..10].to_vec(),
            base[..18].to_vec(),
            base[..6].iter().copied().chain(50..60).collect(),
            (100..107).collect(),
        ];
        // slot → the tokens whose states it holds
        let mut holds: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut live: HashMap<SeqId, Live> = HashMap::new();
        let mut gen = 1000u32;
        for op in &ops {
            match *op {
                Op::Begin { seq, prompt, n } => {
                    if live.contains_key(&seq) {
                        continue;
                    }
                    // admitted as the scheduler does: with room for its first chunk, computed
                    // at once (begin and reserve together: the new state counts from begin)
                    let tokens = prompts[prompt].clone();
                    let ns = Some(seq % 2);
                    let cached = kv.num_cached_tokens(ns, &tokens);
                    let end = (cached + n).min(tokens.len());
                    if !kv.can_begin(ns, &tokens, end - cached) {
                        continue;
                    }
                    let hit = kv.begin_sequence(seq, ns, &tokens).unwrap();
                    prop_assert_eq!(hit, cached);
                    match kv.snapshot_restore(seq) {
                        Some(slot) => prop_assert_eq!(&holds[&slot][..], &tokens[..hit]),
                        None => prop_assert_eq!(hit, 0),
                    }
                    let prompt_end = tokens.len() / 4 * 4;
                    kv.reserve(seq, end - hit).unwrap();
                    let target = kv.snapshot_target(seq, &tokens[..end], hit, end, prompt_end);
                    if let Some(t) = target.unwrap() {
                        holds.insert(t.slot, tokens[..t.pos].to_vec());
                    }
                    kv.cache_full_blocks(seq, &tokens[..end]).unwrap();
                    live.insert(seq, Live { tokens, computed: end, prompt_end });
                }
                Op::Step { seq, n } => {
                    let Some(s) = live.get_mut(&seq) else { continue };
                    while s.tokens.len() < s.computed + n {
                        s.tokens.push(gen);
                        gen += 1;
                    }
                    if !kv.can_allocate(seq, n) {
                        continue;
                    }
                    let (start, end) = (s.computed, s.computed + n);
                    kv.reserve(seq, n).unwrap();
                    let target =
                        kv.snapshot_target(seq, &s.tokens[..end], start, end, s.prompt_end);
                    if let Some(t) = target.unwrap() {
                        prop_assert!(t.pos > start && t.pos <= end && t.pos % 4 == 0);
                        // the step's kernels write it
                        holds.insert(t.slot, s.tokens[..t.pos].to_vec());
                    }
                    s.computed = end;
                    kv.cache_full_blocks(seq, &s.tokens[..end]).unwrap();
                }
                Op::Release(seq) => {
                    let Some(s) = live.remove(&seq) else { continue };
                    kv.release_sequence(seq, &s.tokens[..s.computed]).unwrap();
                }
                Op::Clear => {
                    kv.clear_prefix_cache();
                }
            }
            kv.check_integrity().map_err(TestCaseError::fail)?;
        }
        for (seq, s) in live {
            kv.release_sequence(seq, &s.tokens[..s.computed]).unwrap();
        }
        kv.clear_prefix_cache();
        kv.check_integrity().map_err(TestCaseError::fail)?;
        prop_assert_eq!(kv.stats().num_snapshots, 0);
        prop_assert_eq!(kv.num_free_blocks(), 40);
        // every slot can be taken again: none leaked
        let mut cache = kv.prefix_cache().unwrap().clone();
        for _ in 0..slots {
            prop_assert!(cache.take_snapshot_slot().is_some());
        }
    }
}
