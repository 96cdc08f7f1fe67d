//! [`KvManager`] with the prefix cache on a hybrid model (a sliding group next to a full one):
//! hits across the window, a shared system prompt, eviction order of loose companions, exact
//! admission, and integrity violations caught.

use super::{BlockId, GroupKind, KvGroups, KvLayout, KvManager, Namespace, SeqId, NULL_BLOCK};

/// `[Sliding { window }, Full]`, blocks of 4 tokens, prefix cache on: group 0 slides, group 1
/// (the anchor) keys the tree.
fn hybrid(window: usize, num_blocks: usize) -> KvManager {
    let groups = KvGroups::from_layer_kinds(&[GroupKind::Sliding { window }, GroupKind::Full]);
    let layout = KvLayout::f16(groups.slots_per_block(), 1, 2, 4).unwrap();
    KvManager::with_groups(layout, groups, num_blocks, true).unwrap()
}

/// Begins `seq` and computes `tokens` in steps of `step` as the scheduler does (reserve, cache
/// full blocks, slide), checking integrity each step. Returns the cached tokens.
fn run(kv: &mut KvManager, seq: SeqId, ns: Namespace, tokens: &[u32], step: usize) -> usize {
    let cached = kv.begin_sequence(seq, ns, tokens).unwrap();
    kv.check_integrity().unwrap();
    let mut done = cached;
    while done < tokens.len() {
        let n = step.min(tokens.len() - done);
        kv.reserve(seq, n).unwrap();
        done += n;
        kv.cache_full_blocks(seq, &tokens[..done]).unwrap();
        kv.slide_windows(seq, done).unwrap();
        kv.check_integrity().unwrap();
    }
    cached
}

/// The cached path of `tokens` (anchor blocks) and each node's sliding companion.
fn path_and_companions(kv: &KvManager, tokens: &[u32]) -> (Vec<BlockId>, Vec<Option<BlockId>>) {
    let cache = kv.prefix_cache().unwrap();
    let path = cache.peek(None, tokens);
    let companions = path.iter().map(|&node| cache.block_of(node, 0)).collect();
    (path, companions)
}

#[test]
fn an_all_sliding_model_still_refuses_the_cache() {
    let groups = KvGroups::from_layer_kinds(&[GroupKind::Sliding { window: 6 }]);
    let layout = KvLayout::f16(1, 1, 2, 4).unwrap();
    let err = KvManager::with_groups(layout, groups, 8, true).unwrap_err();
    assert!(err.to_string().contains("--no-prefix-cache"), "{err}");
}

#[test]
fn a_system_prompt_is_reused_across_the_window() {
    let mut kv = hybrid(6, 32);
    let system: Vec<u32> = (0..8).collect();
    let a: Vec<u32> = system.iter().copied().chain(100..112).collect(); // 20 tokens
    let b: Vec<u32> = system.iter().copied().chain(200..209).collect(); // 17 tokens
    assert_eq!(run(&mut kv, 1, None, &a, 4), 0);
    // 5 nodes, each with its sliding companion (cached before the slide dropped it).
    let (path, companions) = path_and_companions(&kv, &a);
    assert_eq!(path, kv.tables(1).unwrap()[1].as_slice());
    assert!(companions.iter().all(Option::is_some));
    let stats = kv.stats();
    assert_eq!((stats.num_cached_blocks, stats.num_evictable_blocks), (10, 3));
    let cache = kv.prefix_cache().unwrap();
    assert!((0..3).all(|i| cache.is_loose(companions[i].unwrap())), "slid past: tree only");
    assert!(!cache.is_loose(companions[3].unwrap()), "still in sequence 1's window");

    // The system prompt's 2 blocks: the query at 8 sees 3..=8, blocks 0 and 1 (cached).
    assert_eq!(kv.num_cached_tokens(None, &b), 8);
    assert_eq!(kv.begin_sequence(2, None, &b), Ok(8));
    let tables = kv.tables(2).unwrap();
    assert_eq!(tables[1].as_slice(), &path[..2]);
    assert_eq!(tables[0].as_slice(), &[companions[0].unwrap(), companions[1].unwrap()]);
    assert_eq!(kv.stats().num_evictable_blocks, 1, "the window took two loose companions");
    kv.check_integrity().unwrap();
    kv.free_sequence(2).unwrap();
    assert_eq!(run(&mut kv, 2, None, &b, 3), 8);
    kv.release_sequence(2, &b).unwrap();
    kv.release_sequence(1, &a).unwrap();
    kv.check_integrity().unwrap();
    let stats = kv.stats();
    assert_eq!(stats.num_evictable_blocks, stats.num_cached_blocks);
    assert_eq!(stats.prefix_hit_tokens, 16);
    kv.clear_prefix_cache();
    assert_eq!(kv.num_free_blocks(), 32);
    kv.check_integrity().unwrap();
}

#[test]
fn a_prefix_whose_old_sliding_blocks_were_evicted_is_still_usable() {
    let mut kv = hybrid(6, 13);
    let a: Vec<u32> = (0..20).collect();
    run(&mut kv, 1, None, &a, 4); // 10 blocks: 5 nodes + 5 companions, 3 of them loose
    assert_eq!((kv.num_free_blocks(), kv.stats().num_evictable_blocks), (3, 3));
    kv.add_sequence(2).unwrap();
    kv.reserve(2, 12).unwrap(); // 6 blocks: 3 free, then the 3 loose companions
    assert_eq!(kv.stats().num_evicted_blocks, 3);
    let (_, companions) = path_and_companions(&kv, &a);
    assert_eq!(
        companions.iter().map(Option::is_some).collect::<Vec<_>>(),
        [false, false, false, true, true]
    );
    kv.free_sequence(2).unwrap();
    kv.release_sequence(1, &a).unwrap();
    kv.check_integrity().unwrap();

    // 21 tokens: the query at 20 sees 15..=20, blocks 3 and 4, both cached: all 20 usable.
    let longer: Vec<u32> = (0..21).collect();
    assert_eq!(kv.num_cached_tokens(None, &longer), 20);
    // 13 tokens: a query at 12, 8 or 4 needs block 1 or 0 of the sliding group: nothing.
    assert_eq!(kv.num_cached_tokens(None, &longer[..13]), 0);
    assert!(kv.can_begin(None, &longer, 1));
    assert_eq!(run(&mut kv, 3, None, &longer, 4), 20);
    let sliding = kv.tables(3).unwrap()[0].as_slice().to_vec();
    assert_eq!(sliding[..4], [NULL_BLOCK; 4]); // slid to 21 after its one token
    kv.release_sequence(3, &longer).unwrap();
    assert_eq!(run(&mut kv, 4, None, &longer[..13], 4), 0);
    kv.release_sequence(4, &longer[..13]).unwrap();
    kv.check_integrity().unwrap();
}

#[test]
fn loose_companions_and_unlocked_leaves_are_evicted_oldest_first() {
    let mut kv = hybrid(2, 16);
    let y: Vec<u32> = (0..12).collect();
    let x: Vec<u32> = (100..108).collect();
    run(&mut kv, 2, None, &y, 4); // live: its companions of nodes 0 and 1 are loose
    run(&mut kv, 1, None, &x, 4);
    kv.release_sequence(1, &x).unwrap(); // newer than y's path, unlocked
    let (_, cy) = path_and_companions(&kv, &y);
    let (px, cx) = path_and_companions(&kv, &x);
    assert_eq!(kv.stats().num_evictable_blocks, 2 + 4);
    let mut evict = |n| {
        let cache = kv.cache.as_mut().unwrap();
        let evicted = cache.evict(&mut kv.pool, n);
        kv.check_integrity().unwrap();
        evicted
    };
    assert_eq!(evict(1), vec![cy[0].unwrap().min(cy[1].unwrap())]); // same stamp: lower id
    assert_eq!(evict(1), vec![cy[0].unwrap().max(cy[1].unwrap())]);
    assert_eq!(evict(1), vec![cx[1].unwrap(), px[1]]); // a leaf goes with its companion
    assert_eq!(evict(5), vec![cx[0].unwrap(), px[0]]); // then its parent; y is locked
    assert_eq!(kv.stats().num_evictable_blocks, 0);
    assert_eq!(kv.num_cached_tokens(None, &[y.clone(), vec![9]].concat()), 12);
    kv.release_sequence(2, &y).unwrap();
    kv.check_integrity().unwrap();
}

#[test]
fn admission_is_exact_with_loose_and_newly_locked_companions() {
    let mut kv = hybrid(6, 10);
    let a: Vec<u32> = (0..20).collect();
    run(&mut kv, 1, None, &a, 4);
    kv.release_sequence(1, &a).unwrap();
    assert_eq!((kv.num_free_blocks(), kv.stats().num_evictable_blocks), (0, 10));
    // A hit of 5 nodes locks 10 blocks, less 3 companions before the window that stay loose:
    // 7 taken, 3 left for new blocks (2 per block of tokens).
    let c: Vec<u32> = (0..21).collect();
    assert!(kv.can_begin(None, &c, 4)); // blocks 5 of both groups: 2
    assert!(!kv.can_begin(None, &c, 5)); // blocks 5 and 6: 4
    kv.begin_sequence(3, None, &c).unwrap();
    assert_eq!(kv.stats().num_evictable_blocks, 3);
    assert!(kv.can_allocate(3, 4));
    assert!(!kv.can_allocate(3, 5));
    kv.reserve(3, 4).unwrap(); // evicts two loose companions
    assert_eq!(kv.stats().num_evictable_blocks, 1);
    kv.check_integrity().unwrap();
    kv.release_sequence(3, &c[..20]).unwrap();
    kv.check_integrity().unwrap();
}

#[test]
fn integrity_catches_hybrid_violations() {
    let mut kv = hybrid(6, 32);
    let a: Vec<u32> = (0..12).collect();
    run(&mut kv, 1, None, &a, 4);
    kv.begin_sequence(2, None, &[a.clone(), vec![5]].concat()).unwrap(); // 12 cached
    kv.check_integrity().unwrap();
    let (path, companions) = path_and_companions(&kv, &a);

    // A sliding table reads another block than its node's companion.
    let mut broken = kv.clone();
    let s = broken.seqs.get_mut(&2).unwrap();
    assert_eq!(s.tables[0].as_slice()[2], companions[2].unwrap());
    s.tables[0].swap_block(&mut broken.pool, 2, path[0]);
    let err = broken.check_integrity().unwrap_err();
    assert!(err.contains("group 0: block 2"), "{err}");

    // A reference on a companion that two tables read leaked.
    let mut broken = kv.clone();
    broken.pool.incref(companions[2].unwrap());
    let err = broken.check_integrity().unwrap_err();
    assert!(err.contains("ref count"), "{err}");

    // The sequence's count of cached blocks disagrees with its locked path.
    let mut broken = kv.clone();
    broken.seqs.get_mut(&2).unwrap().num_cached_blocks = 2;
    let err = broken.check_integrity().unwrap_err();
    assert!(err.contains("cached blocks"), "{err}");
}
