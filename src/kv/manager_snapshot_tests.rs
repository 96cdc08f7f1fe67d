//! [`KvManager`] with state snapshots (recurrent models): unit tests of where snapshots are
//! taken, kept and restored, and a property test of random begin / step / release / clear
//! sequences that tracks what each snapshot slot "holds" (the tokens whose states were written
//! into it) and checks that every hit restores a slot holding exactly the hit tokens' states,
//! with `check_integrity()` (slots free, owned or written by one sequence) after every operation.

use std::collections::HashMap;

use proptest::prelude::*;

use super::{KvLayout, KvManager, SeqId};

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

#[derive(Clone, Debug)]
enum Op {
    /// Begin sequence `seq` on prompt `prompt` (of a few that share starts).
    Begin {
        seq: SeqId,
        prompt: usize,
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
        3 => (0..4u64, 0..4usize).prop_map(|(seq, prompt)| Op::Begin { seq, prompt }),
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
    fn restores_read_the_states_of_the_hit_tokens(
        slots in 0..4u32,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut kv = hybrid(40, slots);
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
                Op::Begin { seq, prompt } => {
                    if live.contains_key(&seq) {
                        continue;
                    }
                    let tokens = prompts[prompt].clone();
                    let hit = kv.begin_sequence(seq, None, &tokens).unwrap();
                    match kv.snapshot_restore(seq) {
                        Some(slot) => prop_assert_eq!(&holds[&slot][..], &tokens[..hit]),
                        None => prop_assert_eq!(hit, 0),
                    }
                    let prompt_end = tokens.len() / 4 * 4;
                    live.insert(seq, Live { tokens, computed: hit, prompt_end });
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
