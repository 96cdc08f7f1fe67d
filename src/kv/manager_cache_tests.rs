//! [`KvManager`] with the prefix cache: unit tests on tiny pools, and a property test of random
//! begin / compute / release / fork / clear sequences that tracks what each block "holds" (the
//! tokens whose KV was written into it) and checks that every cache hit hands out a block
//! holding exactly the hit tokens, that no shared block is ever written, and `check_integrity()`
//! after every operation.

use std::collections::HashMap;

use proptest::prelude::*;

use super::NULL_BLOCK;
use super::{BlockId, GroupKind, KvError, KvGroups, KvLayout, KvManager, Namespace, SeqId};

/// `num_blocks` blocks of 4 tokens, prefix cache on.
fn cached(num_blocks: usize) -> KvManager {
    let layout = KvLayout::f16(2, 1, 2, 4).unwrap();
    KvManager::with_prefix_cache(layout, num_blocks, true).unwrap()
}

/// Begins `seq`, computes all of `tokens` (reserve + cache after), returns the cached tokens.
fn run(kv: &mut KvManager, seq: SeqId, ns: Namespace, tokens: &[u32]) -> usize {
    let num_cached = kv.begin_sequence(seq, ns, tokens).unwrap();
    kv.reserve(seq, tokens.len() - num_cached).unwrap();
    kv.cache_full_blocks(seq, tokens).unwrap();
    kv.check_integrity().unwrap();
    num_cached
}

#[test]
fn a_released_sequence_feeds_the_next_one() {
    let mut kv = cached(8);
    let prompt: Vec<u32> = (0..10).collect();
    assert_eq!(run(&mut kv, 1, None, &prompt), 0);
    assert_eq!(kv.table(1).unwrap().as_slice(), &[0, 1, 2]);
    assert_eq!(kv.stats().num_cached_blocks, 2); // eagerly: the two full blocks
    kv.release_sequence(1, &prompt).unwrap();
    let stats = kv.stats();
    assert_eq!((stats.num_free_blocks, stats.num_evictable_blocks), (6, 2));
    assert_eq!(kv.usage(), 0.0); // evictable blocks count as free

    let longer: Vec<u32> = (0..13).collect();
    assert_eq!(kv.num_cached_tokens(None, &longer), 8);
    assert_eq!(run(&mut kv, 2, None, &longer), 8);
    assert_eq!(&kv.table(2).unwrap().as_slice()[..2], &[0, 1]);
    assert_eq!(kv.prefix_cache().unwrap().lock_count(1), Some(1));
    assert_eq!(kv.stats().num_cached_blocks, 3);
    let stats = kv.stats();
    assert_eq!((stats.prefix_query_tokens, stats.prefix_hit_tokens), (23, 8));
    kv.release_sequence(2, &longer).unwrap();
    assert_eq!(kv.clear_prefix_cache(), 3);
    assert_eq!(kv.num_free_blocks(), 8);
    kv.check_integrity().unwrap();
}

#[test]
fn a_full_prompt_hit_still_computes_the_last_token() {
    let mut kv = cached(8);
    let prompt: Vec<u32> = (0..8).collect();
    run(&mut kv, 1, None, &prompt);
    kv.release_sequence(1, &prompt).unwrap();
    assert_eq!(kv.num_cached_tokens(None, &prompt), 4); // not 8: ≤ len − 1
    assert_eq!(kv.num_cached_tokens(None, &prompt[..5]), 4);
    assert_eq!(kv.num_cached_tokens(None, &prompt[..4]), 0);
    assert_eq!(kv.num_cached_tokens(None, &[]), 0);
    assert_eq!(kv.begin_sequence(2, None, &prompt), Ok(4));
    kv.reserve(2, 4).unwrap();
    // Its second block recomputes block 1's tokens into a copy, which caching then merges.
    assert_eq!(kv.table(2).unwrap().as_slice(), &[0, 2]);
    kv.cache_full_blocks(2, &prompt).unwrap();
    assert_eq!(kv.table(2).unwrap().as_slice(), &[0, 1]);
    kv.release_sequence(2, &prompt).unwrap();
    assert_eq!(kv.stats().num_cached_blocks, 2);
    assert_eq!(kv.num_free_blocks(), 6);
    kv.check_integrity().unwrap();
}

#[test]
fn a_short_pool_evicts_least_recently_used_blocks() {
    let mut kv = cached(4);
    let a: Vec<u32> = vec![1; 8];
    let b: Vec<u32> = vec![2; 8];
    run(&mut kv, 1, None, &a);
    kv.release_sequence(1, &a).unwrap(); // blocks 0, 1 cached
    run(&mut kv, 2, None, &b);
    kv.release_sequence(2, &b).unwrap(); // blocks 2, 3 cached
    assert_eq!(kv.num_free_blocks(), 0);
    assert_eq!(kv.num_free_or_evictable_blocks(), 4);
    kv.add_sequence(3).unwrap();
    assert!(kv.can_allocate(3, 12));
    assert_eq!(kv.num_reservable_tokens(3), 16);
    assert_eq!(kv.num_reservable_tokens(4), 0); // unknown
    kv.reserve(3, 5).unwrap(); // evicts a's blocks (older): leaf 1, then 0
    assert_eq!(kv.table(3).unwrap().as_slice(), &[1, 0]);
    assert_eq!(kv.stats().num_evicted_blocks, 2);
    assert_eq!(kv.num_reservable_tokens(3), 3 + 8); // room in block 0, then blocks 2 and 3
    assert_eq!(kv.num_cached_tokens(None, &[2; 9]), 8);
    let err = kv.reserve(3, 12).unwrap_err(); // needs 3, only 2 evictable: nothing evicted
    assert_eq!(err, KvError::OutOfBlocks { needed: 3, free: 2 });
    assert_eq!(kv.stats().num_cached_blocks, 2);
    kv.check_integrity().unwrap();
}

#[test]
fn admission_does_not_count_matched_blocks_twice() {
    let mut kv = cached(3);
    let a: Vec<u32> = vec![1; 9];
    run(&mut kv, 1, None, &a);
    kv.release_sequence(1, &a).unwrap(); // blocks 0, 1 cached; 2 free
    assert_eq!(kv.num_free_or_evictable_blocks(), 3);
    // 8 cached tokens, then 5 more need 2 blocks: 1 free + 0 evictable once 0, 1 are locked.
    assert!(!kv.can_begin(None, &[1; 13], 5));
    assert!(kv.can_begin(None, &[1; 12], 4));
    assert!(kv.can_begin(None, &[3; 12], 12)); // no hit: all 3 blocks, by evicting both
    assert!(!kv.can_begin(None, &[3; 13], 13));
}

#[test]
fn namespaces_do_not_share() {
    let mut kv = cached(8);
    let prompt = vec![5; 9];
    run(&mut kv, 1, Some(1), &prompt);
    assert_eq!(kv.num_cached_tokens(Some(1), &prompt), 8);
    assert_eq!(kv.num_cached_tokens(None, &prompt), 0);
    assert_eq!(run(&mut kv, 2, Some(2), &prompt), 0);
    assert_eq!(kv.stats().num_cached_blocks, 4);
}

#[test]
fn concurrent_copies_of_one_block_merge_into_the_first() {
    let mut kv = cached(8);
    let prompt = vec![7; 6];
    for seq in [1, 2] {
        kv.begin_sequence(seq, None, &prompt).unwrap();
        kv.reserve(seq, 6).unwrap();
    }
    assert_eq!(kv.table(2).unwrap().as_slice(), &[2, 3]);
    kv.cache_full_blocks(1, &prompt).unwrap(); // block 0 cached
    kv.cache_full_blocks(2, &prompt).unwrap(); // block 2 duplicates it: swapped for 0, freed
    assert_eq!(kv.table(2).unwrap().as_slice(), &[0, 3]);
    assert_eq!(kv.prefix_cache().unwrap().lock_count(0), Some(2));
    assert_eq!(kv.pool().ref_count(0), 3);
    assert_eq!(kv.num_free_blocks(), 5);
    kv.check_integrity().unwrap();
    kv.release_sequence(1, &prompt).unwrap();
    kv.release_sequence(2, &prompt).unwrap();
    assert_eq!(kv.num_free_blocks(), 7);
    kv.check_integrity().unwrap();
}

#[test]
fn fork_shares_only_the_cached_prefix() {
    let mut kv = cached(8);
    let prompt: Vec<u32> = (0..10).collect();
    kv.begin_sequence(1, None, &prompt).unwrap();
    kv.reserve(1, 10).unwrap();
    kv.cache_full_blocks(1, &prompt[..5]).unwrap(); // block 0 cached; block 1 full, not cached
    kv.fork_sequence(1, 2).unwrap();
    assert_eq!(kv.table(2).unwrap().as_slice(), &[0]);
    assert_eq!(kv.prefix_cache().unwrap().lock_count(0), Some(2));
    kv.check_integrity().unwrap();
    kv.free_sequence(1).unwrap();
    kv.free_sequence(2).unwrap();
    assert_eq!(kv.num_free_or_evictable_blocks(), 8);
    kv.check_integrity().unwrap();
}

#[test]
fn disabled_cache_behaves_as_before() {
    let layout = KvLayout::f16(2, 1, 2, 4).unwrap();
    let mut kv = KvManager::with_prefix_cache(layout, 8, false).unwrap();
    let prompt: Vec<u32> = (0..10).collect();
    assert_eq!(run(&mut kv, 1, None, &prompt), 0);
    kv.release_sequence(1, &prompt).unwrap();
    assert_eq!(kv.num_cached_tokens(None, &prompt), 0);
    assert_eq!(run(&mut kv, 2, None, &prompt), 0);
    kv.release_sequence(2, &prompt).unwrap();
    assert_eq!(kv.num_free_blocks(), 8);
    assert_eq!(kv.stats().prefix_query_tokens, 0);
    assert!(kv.prefix_cache().is_none());
    assert_eq!(kv.clear_prefix_cache(), 0);
}

// ---- Property test ----

const BLOCK_SIZE: usize = 2;
const NUM_BLOCKS: usize = 10;
const NUM_SEQS: SeqId = 4;
/// Token lists per case (each sequence runs one of them), over 2 letters so prefixes collide.
const NUM_LISTS: usize = 3;
const LIST_LEN: usize = 8;

#[derive(Clone, Debug)]
enum Op {
    /// Begin `seq` on list `list`, with a prompt of `prompt_len` tokens, and compute its first
    /// uncached chunk of up to `chunk` tokens.
    Begin {
        seq: SeqId,
        ns: Namespace,
        list: usize,
        prompt_len: usize,
        chunk: usize,
    },
    /// Compute `n` more tokens of `seq` (reserve, write, cache full blocks).
    Compute {
        seq: SeqId,
        n: usize,
    },
    Release {
        seq: SeqId,
    },
    Free {
        seq: SeqId,
    },
    Fork {
        parent: SeqId,
        child: SeqId,
    },
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    let seq = 0..NUM_SEQS;
    let ns = prop_oneof![Just(None), Just(Some(9))];
    prop_oneof![
        4 => (seq.clone(), ns, 0..NUM_LISTS, 1..=LIST_LEN, 1..=LIST_LEN).prop_map(
            |(seq, ns, list, prompt_len, chunk)| Op::Begin { seq, ns, list, prompt_len, chunk }),
        5 => (seq.clone(), 1..5usize).prop_map(|(seq, n)| Op::Compute { seq, n }),
        2 => seq.clone().prop_map(|seq| Op::Release { seq }),
        1 => seq.clone().prop_map(|seq| Op::Free { seq }),
        1 => (seq.clone(), seq).prop_map(|(parent, child)| Op::Fork { parent, child }),
        1 => Just(Op::Clear),
    ]
}

/// A live sequence in the test: its namespace, token list and computed count.
#[derive(Clone)]
struct Live {
    ns: Namespace,
    tokens: Vec<u32>,
    num_computed: usize,
}

/// What each block holds: the namespace and every token up to the block's last written one.
type Contents = HashMap<BlockId, (Namespace, Vec<u32>)>;

/// Writes positions `from..to` of `live` through each of `seq`'s tables: each written block
/// must be private (one holder, not cached); records its contents.
fn write(kv: &KvManager, seq: SeqId, live: &Live, to: usize, contents: &mut Contents) {
    for table in kv.tables(seq).unwrap() {
        for pos in live.num_computed..to {
            let block = table.as_slice()[pos / BLOCK_SIZE];
            assert_eq!(kv.pool().ref_count(block), 1, "write into shared block {block}");
            assert!(!kv.prefix_cache().unwrap().holds(block), "write into cached block {block}");
            contents.insert(block, (live.ns, live.tokens[..=pos].to_vec()));
        }
    }
}

/// Every live block of `seq`'s tables below `live.num_computed` holds exactly its prefix (in
/// a sliding table, at least the window of its next query is live: `check_integrity`).
fn check_contents(kv: &KvManager, seq: SeqId, live: &Live, contents: &Contents) {
    for (g, table) in kv.tables(seq).unwrap().iter().enumerate() {
        let first = kv.groups().kind(g).first_visible(live.num_computed);
        for (idx, &block) in table.as_slice().iter().enumerate() {
            let end = ((idx + 1) * BLOCK_SIZE).min(live.num_computed);
            if block == NULL_BLOCK {
                assert!(end <= first, "sequence {seq}, group {g}: block {idx} dropped too early");
                continue;
            }
            if end > idx * BLOCK_SIZE {
                let want = (live.ns, live.tokens[..end].to_vec());
                assert_eq!(contents.get(&block), Some(&want), "block {block} of sequence {seq}");
            }
        }
    }
}

/// Reserves and computes `n` more tokens of `seq` if the pool allows; a refusal must change
/// nothing.
fn compute(kv: &mut KvManager, seq: SeqId, live: &mut Live, n: usize, contents: &mut Contents) {
    let n = n.min(live.tokens.len() - live.num_computed);
    let before = (kv.stats(), kv.tables(seq).map(<[_]>::to_vec));
    match kv.reserve(seq, n) {
        Ok(_) => {
            write(kv, seq, live, live.num_computed + n, contents);
            live.num_computed += n;
            kv.cache_full_blocks(seq, &live.tokens[..live.num_computed]).unwrap();
            kv.slide_windows(seq, live.num_computed).unwrap();
        }
        Err(KvError::OutOfBlocks { .. }) => {
            let after = (kv.stats(), kv.tables(seq).map(<[_]>::to_vec));
            assert_eq!(after, before, "refusal changed state");
        }
        Err(e) => panic!("{e}"),
    }
}

/// Runs `ops` on `kv` (prefix cache on, blocks of `BLOCK_SIZE`), checking the
/// contents of every block a live sequence reads and `check_integrity()` after every operation,
/// and that nothing leaks at the end.
fn run_ops(mut kv: KvManager, lists: &[Vec<u32>], ops: &[Op]) -> Result<(), TestCaseError> {
    let mut live: HashMap<SeqId, Live> = HashMap::new();
    let mut contents = Contents::new();
    for op in ops {
        match *op {
            Op::Begin { seq, ns, list, prompt_len, chunk } => {
                let tokens = lists[list].clone();
                let prompt = &tokens[..prompt_len];
                if live.contains_key(&seq) {
                    prop_assert_eq!(
                        kv.begin_sequence(seq, ns, prompt),
                        Err(KvError::SequenceExists(seq))
                    );
                    continue;
                }
                let num_cached = kv.num_cached_tokens(ns, prompt);
                let chunk = chunk.min(prompt_len - num_cached);
                let fits = kv.can_begin(ns, prompt, chunk);
                prop_assert_eq!(kv.begin_sequence(seq, ns, prompt), Ok(num_cached));
                let mut new = Live { ns, tokens, num_computed: num_cached };
                check_contents(&kv, seq, &new, &contents);
                prop_assert_eq!(kv.can_allocate(seq, chunk), fits, "can_begin inexact");
                compute(&mut kv, seq, &mut new, chunk, &mut contents);
                live.insert(seq, new);
            }
            Op::Compute { seq, n } => {
                let Some(l) = live.get_mut(&seq) else { continue };
                compute(&mut kv, seq, l, n, &mut contents);
            }
            Op::Release { seq } => {
                let Some(l) = live.remove(&seq) else {
                    prop_assert_eq!(
                        kv.release_sequence(seq, &[]),
                        Err(KvError::UnknownSequence(seq))
                    );
                    continue;
                };
                kv.release_sequence(seq, &l.tokens[..l.num_computed]).unwrap();
            }
            Op::Free { seq } => {
                if live.remove(&seq).is_some() {
                    kv.free_sequence(seq).unwrap();
                }
            }
            Op::Fork { parent, child } => {
                if !live.contains_key(&parent) || live.contains_key(&child) {
                    prop_assert!(kv.fork_sequence(parent, child).is_err());
                    continue;
                }
                kv.fork_sequence(parent, child).unwrap();
                let mut l = live[&parent].clone();
                l.num_computed = kv.table(child).unwrap().num_tokens();
                live.insert(child, l);
            }
            Op::Clear => {
                kv.clear_prefix_cache();
            }
        }
        kv.check_integrity().map_err(TestCaseError::fail)?;
        for (&seq, l) in &live {
            check_contents(&kv, seq, l, &contents);
        }
    }
    for (seq, l) in live.drain() {
        kv.release_sequence(seq, &l.tokens[..l.num_computed]).unwrap();
    }
    kv.clear_prefix_cache();
    prop_assert_eq!(kv.num_free_blocks(), kv.num_blocks());
    kv.check_integrity().map_err(TestCaseError::fail)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_sequences_get_correct_blocks(
        lists in prop::collection::vec(prop::collection::vec(0..2u32, LIST_LEN), NUM_LISTS),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let layout = KvLayout::f16(1, 1, 2, BLOCK_SIZE).unwrap();
        run_ops(KvManager::with_prefix_cache(layout, NUM_BLOCKS, true).unwrap(), &lists, &ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// The same on hybrid models: a sliding group (window 1..=6) and a full one in either
    /// order, two full groups (a full companion), or two sliding groups of different windows;
    /// sliding tables drop, reuse cached companions and lose loose ones to eviction.
    #[test]
    fn random_hybrid_sequences_get_correct_blocks(
        lists in prop::collection::vec(prop::collection::vec(0..2u32, LIST_LEN), NUM_LISTS),
        ops in prop::collection::vec(op(), 1..60),
        window in 1..=6usize,
        other_window in 1..=6usize,
        shape in 0..4usize,
    ) {
        let (s, f) = (GroupKind::Sliding { window }, GroupKind::Full);
        let kinds = match shape {
            0 => vec![s, f],
            1 => vec![f, s],
            2 => vec![s, f, f],
            _ => vec![s, GroupKind::Sliding { window: other_window + 6 }, f],
        };
        let groups = KvGroups::from_layer_kinds(&kinds);
        let num_blocks = NUM_BLOCKS * groups.len() / 2;
        let layout = KvLayout::f16(groups.slots_per_block(), 1, 2, BLOCK_SIZE).unwrap();
        let kv = KvManager::with_groups(layout, groups, num_blocks, true).unwrap();
        run_ops(kv, &lists, &ops)?;
    }
}
