//! Unit tests of [`PrefixCache`]: matching, branching, LRU eviction, locks, namespaces.

use super::*;

/// A pool of `n` blocks and a cache of 2-token blocks.
fn setup(n: usize) -> (BlockPool, PrefixCache) {
    (BlockPool::new(n), PrefixCache::new(2))
}

/// Allocates `n` blocks, inserts them for `tokens`, then drops the caller's references (a
/// finished sequence donating its blocks). Returns the path's last block.
fn donate(pool: &mut BlockPool, cache: &mut PrefixCache, ns: Namespace, tokens: &[u32]) {
    let n = tokens.len() / cache.block_size();
    let blocks = pool.allocate_n(n).expect("room in the pool");
    cache.insert(pool, ns, tokens, &blocks);
    for id in blocks {
        pool.decref(id);
    }
    cache.check_integrity(pool).unwrap();
}

#[test]
fn match_finds_the_longest_cached_prefix_in_whole_blocks() {
    let (mut pool, mut cache) = setup(8);
    donate(&mut pool, &mut cache, None, &[1, 2, 3, 4, 5, 6]);
    assert_eq!(cache.num_cached_blocks(), 3);
    assert_eq!(pool.num_free(), 5); // the tree's references keep blocks 0..3
    assert_eq!(cache.match_prefix(None, &[1, 2, 3, 4, 5, 6, 7]), vec![0, 1, 2]);
    assert_eq!(cache.match_prefix(None, &[1, 2, 3, 9, 5, 6]), vec![0]);
    assert_eq!(cache.match_prefix(None, &[1, 2, 3]), vec![0]); // partial block ignored
    assert_eq!(cache.match_prefix(None, &[2, 1]), Vec::<BlockId>::new());
    cache.check_integrity(&pool).unwrap();
}

#[test]
fn insert_keeps_existing_nodes_and_branches() {
    let (mut pool, mut cache) = setup(8);
    let a = pool.allocate_n(2).unwrap(); // [0, 1]
    assert_eq!(cache.insert(&mut pool, None, &[1, 2, 3, 4], &a), Some(1));
    let b = pool.allocate_n(3).unwrap(); // [2, 3, 4]: same first block, then a branch
    assert_eq!(cache.insert(&mut pool, None, &[1, 2, 7, 7, 8, 8], &b), Some(4));
    assert!(!cache.contains(2)); // block 2 duplicates block 0: stays private
    assert_eq!(cache.path(4), vec![0, 3, 4]);
    assert_eq!(cache.insert(&mut pool, None, &[], &[]), None);
    for id in a.into_iter().chain(b) {
        pool.decref(id);
    }
    assert_eq!(cache.num_cached_blocks(), 4);
    assert_eq!(pool.num_free(), 4); // blocks 2, 5, 6, 7
    cache.check_integrity(&pool).unwrap();
}

#[test]
fn evicts_least_recently_used_leaves_first() {
    let (mut pool, mut cache) = setup(8);
    donate(&mut pool, &mut cache, None, &[1, 1, 2, 2]); // blocks 0 ← 1
    donate(&mut pool, &mut cache, None, &[3, 3]); // block 2
    cache.match_prefix(None, &[1, 1, 2, 2]); // 0 and 1 are now newer than 2
    assert_eq!(cache.num_evictable_blocks(), 3);
    assert_eq!(cache.evict(&mut pool, 1), vec![2]);
    assert_eq!(cache.evict(&mut pool, 5), vec![1, 0]); // the leaf, then its parent
    assert_eq!(pool.num_free(), 8);
    assert_eq!(cache.num_cached_blocks(), 0);
    assert!(cache.roots.is_empty());
    cache.check_integrity(&pool).unwrap();
}

#[test]
fn locked_paths_are_never_evicted() {
    let (mut pool, mut cache) = setup(8);
    donate(&mut pool, &mut cache, None, &[1, 1, 2, 2, 3, 3]); // 0 ← 1 ← 2
    donate(&mut pool, &mut cache, None, &[1, 1, 4, 4]); // 0 ← 4 (block 3 duplicated 0)
    cache.lock(1); // path 0, 1
    assert_eq!((cache.lock_count(0), cache.lock_count(1)), (Some(1), Some(1)));
    assert_eq!(cache.num_evictable_blocks(), 2); // blocks 2 and 4
    assert_eq!(cache.evict(&mut pool, 8), vec![2, 4]);
    assert_eq!(cache.num_evictable_blocks(), 0);
    assert_eq!(cache.evict(&mut pool, 8), Vec::<BlockId>::new());
    cache.lock(1);
    cache.unlock(1);
    assert_eq!(cache.evict(&mut pool, 8), Vec::<BlockId>::new()); // still locked once
    cache.unlock(1);
    assert_eq!(cache.evict(&mut pool, 8), vec![1, 0]);
    cache.check_integrity(&pool).unwrap();
}

#[test]
fn namespaces_share_nothing() {
    let (mut pool, mut cache) = setup(8);
    donate(&mut pool, &mut cache, Some(7), &[1, 1, 2, 2]);
    assert!(cache.match_prefix(None, &[1, 1, 2, 2]).is_empty());
    assert!(cache.match_prefix(Some(8), &[1, 1, 2, 2]).is_empty());
    assert_eq!(cache.match_prefix(Some(7), &[1, 1, 2, 2]), vec![0, 1]);
    donate(&mut pool, &mut cache, None, &[1, 1]);
    assert_eq!(cache.peek(None, &[1, 1, 2, 2]), vec![2]);
    assert_eq!(cache.num_cached_blocks(), 3);
    cache.check_integrity(&pool).unwrap();
}

#[test]
fn eviction_keeps_blocks_others_still_hold() {
    let (mut pool, mut cache) = setup(4);
    let blocks = pool.allocate_n(1).unwrap();
    cache.insert(&mut pool, None, &[5, 5], &blocks);
    assert_eq!(pool.ref_count(0), 2);
    assert_eq!(cache.evict(&mut pool, 1), vec![0]);
    assert_eq!(pool.ref_count(0), 1); // the caller's reference remains
    pool.decref(0);
    cache.check_integrity(&pool).unwrap();
}

#[test]
#[should_panic(expected = "unlock of block 0, which is not locked")]
fn unbalanced_unlock_panics() {
    let (mut pool, mut cache) = setup(4);
    donate(&mut pool, &mut cache, None, &[1, 1]);
    cache.unlock(0);
}

#[test]
#[should_panic(expected = "already cached under another prefix")]
fn a_block_lives_in_one_node() {
    let (mut pool, mut cache) = setup(4);
    let blocks = pool.allocate_n(1).unwrap();
    cache.insert(&mut pool, None, &[1, 1], &blocks);
    cache.insert(&mut pool, None, &[2, 2], &blocks);
}

#[test]
fn integrity_names_the_violation() {
    let (mut pool, mut cache) = setup(4);
    donate(&mut pool, &mut cache, None, &[1, 1, 2, 2]);
    let mut broken = cache.clone();
    broken.nodes.get_mut(&1).unwrap().lock_count = 1; // child locked, parent not
    broken.num_unlocked -= 1;
    broken.evictable_leaves.clear();
    let err = broken.check_integrity(&pool).unwrap_err();
    assert!(err.contains("lock count 0 < its children's 1"), "{err}");

    let mut broken = cache.clone();
    broken.nodes.get_mut(&1).unwrap().last_access += 1;
    let err = broken.check_integrity(&pool).unwrap_err();
    assert!(err.contains("after the clock") || err.contains("older"), "{err}");

    pool.decref(1); // the tree's reference lost
    let err = cache.check_integrity(&pool).unwrap_err();
    assert_eq!(err, "cached block 1 is out of range or free in the pool");
}
