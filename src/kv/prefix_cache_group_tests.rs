//! [`PrefixCache`] with KV-cache groups: companions, the usable length across a window, loose
//! companions, eviction order, integrity, and a property test of random operations on a hybrid
//! cache with `check_integrity()` after each and no leaked block at the end.

use proptest::prelude::*;

use super::*;

const W: GroupKind = GroupKind::Sliding { window: 3 };

/// A pool of `n` blocks and a cache of 2-token blocks over `[Sliding { window: 3 }, Full]`.
fn setup(n: usize) -> (BlockPool, PrefixCache) {
    (BlockPool::new(n), PrefixCache::with_groups(2, &[W, GroupKind::Full]))
}

/// Allocates a sliding and a full block per 2 tokens of `tokens`, drops the sliding ones whose
/// index is in `dropped` (NULL), inserts, then drops the caller's references. Returns
/// (sliding, full) blocks.
fn donate(
    pool: &mut BlockPool,
    cache: &mut PrefixCache,
    tokens: &[u32],
    dropped: &[usize],
) -> (Vec<BlockId>, Vec<BlockId>) {
    let n = tokens.len() / 2;
    let mut sliding = pool.allocate_n(n).unwrap();
    let full = pool.allocate_n(n).unwrap();
    for &i in dropped {
        pool.decref(std::mem::replace(&mut sliding[i], NULL_BLOCK));
    }
    cache.insert_groups(pool, None, tokens, &[&sliding, &full]);
    for &id in sliding.iter().chain(&full).filter(|&&id| id != NULL_BLOCK) {
        pool.decref(id);
    }
    cache.check_integrity(pool).unwrap();
    (sliding, full)
}

#[test]
fn nodes_carry_companions_and_the_window_decides_what_is_usable() {
    let (mut pool, mut cache) = setup(16);
    assert_eq!(cache.anchor(), 1);
    let tokens: Vec<u32> = (0..8).collect();
    let (sliding, full) = donate(&mut pool, &mut cache, &tokens, &[0, 1]);
    assert_eq!(cache.num_cached_blocks(), 4 + 2);
    assert_eq!(cache.num_evictable_blocks(), 6);
    assert_eq!(cache.peek(None, &tokens), full);
    assert_eq!(cache.block_of(full[2], 0), Some(sliding[2]));
    assert_eq!(cache.block_of(full[0], 0), None);
    // A query at 8 sees 6..=8 (node 3), at 6 sees 4..=6 (node 2), at 4 sees 2..=4 (node 1).
    assert_eq!(cache.usable_len(&full), 4);
    assert_eq!(cache.usable_len(&full[..3]), 3);
    assert_eq!(cache.usable_len(&full[..2]), 0);
    assert_eq!(cache.match_prefix(None, &tokens[..5]), Vec::<BlockId>::new());
    assert_eq!(cache.match_prefix(None, &tokens), full);
    // A later sequence donates the missing companion of node 1.
    let mine = pool.allocate_n(2).unwrap();
    cache.insert_groups(
        &mut pool,
        None,
        &tokens[..4],
        &[&[NULL_BLOCK, mine[0]], &[mine[1], full[1]][..]],
    );
    assert_eq!(cache.block_of(full[1], 0), Some(mine[0]));
    assert!(!cache.holds(mine[1]), "node 0 keeps its block");
    assert_eq!(cache.usable_len(&full[..2]), 2);
    cache.check_integrity(&pool).unwrap();
}

#[test]
fn loose_companions_follow_locks_and_references() {
    let (mut pool, mut cache) = setup(16);
    let tokens: Vec<u32> = (0..6).collect();
    let (sliding, full) = donate(&mut pool, &mut cache, &tokens, &[]);
    pool.incref(sliding[2]); // a sequence reads the window's companion
    cache.lock_in(&pool, full[2]);
    assert_eq!(cache.num_evictable_blocks(), 2, "the companions of nodes 0 and 1");
    assert!(cache.is_loose(sliding[0]) && !cache.is_loose(sliding[2]));
    cache.check_integrity(&pool).unwrap();
    pool.decref(sliding[2]); // it slides past
    cache.check_integrity(&pool).unwrap_err(); // not told yet
    cache.refresh(&pool, sliding[2]);
    assert_eq!(cache.num_evictable_blocks(), 3);
    cache.check_integrity(&pool).unwrap();
    // Evicting loose companions leaves the locked nodes, and the usable length shrinks.
    assert_eq!(cache.evict(&mut pool, 1), vec![sliding[0]]);
    assert_eq!(cache.usable_len(&full), 3, "a query at 6 sees 4..=6 only");
    assert_eq!(cache.evict(&mut pool, 2), vec![sliding[1], sliding[2]]);
    assert_eq!(cache.usable_len(&full), 0);
    assert_eq!(cache.evict(&mut pool, 1), Vec::<BlockId>::new());
    cache.unlock(full[2]);
    assert_eq!(cache.num_evictable_blocks(), 3);
    assert_eq!(cache.evict(&mut pool, 9), vec![full[2], full[1], full[0]]);
    assert_eq!(pool.num_free(), 16);
    cache.check_integrity(&pool).unwrap();
}

#[test]
fn an_older_unlocked_leaf_goes_before_a_newer_loose_companion() {
    let (mut pool, mut cache) = setup(16);
    let (old_s, old_f) = donate(&mut pool, &mut cache, &[9, 9], &[]);
    let (new_s, new_f) = donate(&mut pool, &mut cache, &[1, 1, 2, 2], &[]);
    cache.lock_in(&pool, new_f[1]); // both companions loose, stamped after the old leaf
    assert_eq!(cache.evict(&mut pool, 1), vec![old_s[0], old_f[0]]);
    assert_eq!(cache.evict(&mut pool, 1), vec![new_s[0].min(new_s[1])]);
    cache.check_integrity(&pool).unwrap();
}

#[test]
fn integrity_names_companion_violations() {
    let (mut pool, mut cache) = setup(16);
    let (sliding, full) = donate(&mut pool, &mut cache, &[1, 1, 2, 2], &[]);
    cache.lock_in(&pool, full[1]);
    cache.check_integrity(&pool).unwrap();

    let mut broken = cache.clone();
    broken.loose.clear();
    let err = broken.check_integrity(&pool).unwrap_err();
    assert!(err.contains("loose set"), "{err}");

    let mut broken = cache.clone();
    broken.owners.insert(sliding[0], (full[1], 0));
    let err = broken.check_integrity(&pool).unwrap_err();
    assert!(err.contains("reverse map"), "{err}");

    let mut broken = cache.clone();
    broken.nodes.get_mut(&full[0]).unwrap().companions[0] = Some(full[1]);
    let err = broken.check_integrity(&pool).unwrap_err();
    assert!(err.contains("also a node") || err.contains("reverse map"), "{err}");

    let (mut pool2, mut full_cache) =
        (BlockPool::new(8), PrefixCache::with_groups(2, &[GroupKind::Full, GroupKind::Full]));
    let blocks = pool2.allocate_n(2).unwrap();
    full_cache.insert_groups(&mut pool2, None, &[1, 1], &[&blocks[..1], &blocks[1..]]);
    full_cache.check_integrity(&pool2).unwrap();
    let mut broken = full_cache.clone();
    let node = broken.nodes.get_mut(&blocks[0]).unwrap();
    node.companions[1] = None;
    let err = broken.check_integrity(&pool2).unwrap_err();
    assert!(err.contains("no companion in full group 1"), "{err}");
}

// ---- Property test ----

#[derive(Clone, Debug)]
enum Op {
    /// Insert list `seq`'s first `blocks` blocks with fresh blocks in every group; sliding
    /// blocks before `dropped` are NULL; the caller keeps its references until `Drop`.
    Insert {
        seq: usize,
        blocks: usize,
        dropped: usize,
    },
    /// Lock the cached path of list `seq` up to `blocks` blocks, if cached.
    Lock {
        seq: usize,
        blocks: usize,
    },
    /// Release the `idx % held`-th lock.
    Unlock {
        idx: usize,
    },
    /// The caller drops the references of its `idx % n`-th insert (telling the cache).
    Drop {
        idx: usize,
    },
    Evict {
        blocks: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, 1..=4usize, 0..=4usize)
            .prop_map(|(seq, blocks, dropped)| Op::Insert { seq, blocks, dropped }),
        2 => (0..3usize, 1..=4usize).prop_map(|(seq, blocks)| Op::Lock { seq, blocks }),
        2 => any::<usize>().prop_map(|idx| Op::Unlock { idx }),
        2 => any::<usize>().prop_map(|idx| Op::Drop { idx }),
        2 => (0..6usize).prop_map(|blocks| Op::Evict { blocks }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_hybrid_operations_keep_every_invariant(
        lists in prop::collection::vec(prop::collection::vec(0..2u32, 8), 3),
        full_first in any::<bool>(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        const NUM_BLOCKS: usize = 24;
        let kinds = if full_first { [GroupKind::Full, W] } else { [W, GroupKind::Full] };
        let anchor = usize::from(!full_first);
        let mut pool = BlockPool::new(NUM_BLOCKS);
        let mut cache = PrefixCache::with_groups(2, &kinds);
        let mut held_refs: Vec<Vec<BlockId>> = Vec::new();
        let mut locks: Vec<BlockId> = Vec::new();
        for op in &ops {
            match *op {
                Op::Insert { seq, blocks, dropped } => {
                    let Some(mut rows) = pool.allocate_n(2 * blocks) else { continue };
                    let mut other = rows.split_off(blocks);
                    for slot in other.iter_mut().take(dropped) {
                        pool.decref(std::mem::replace(slot, NULL_BLOCK));
                    }
                    let tables: [&[BlockId]; 2] =
                        if anchor == 0 { [&rows, &other] } else { [&other, &rows] };
                    let tokens = &lists[seq][..blocks * 2];
                    cache.insert_groups(&mut pool, None, tokens, &tables);
                    held_refs.push(rows.into_iter().chain(other).filter(|&b| b != NULL_BLOCK).collect());
                }
                Op::Lock { seq, blocks } => {
                    let path = cache.peek(None, &lists[seq][..blocks * 2]);
                    let Some(&last) = path.last() else { continue };
                    cache.lock_in(&pool, last);
                    locks.push(last);
                }
                Op::Unlock { idx } => {
                    if locks.is_empty() {
                        continue;
                    }
                    cache.unlock(locks.swap_remove(idx % locks.len()));
                }
                Op::Drop { idx } => {
                    if held_refs.is_empty() {
                        continue;
                    }
                    for block in held_refs.swap_remove(idx % held_refs.len()) {
                        pool.decref(block);
                        cache.refresh(&pool, block);
                    }
                }
                Op::Evict { blocks } => {
                    let before = cache.num_evictable_blocks();
                    let evicted = cache.evict(&mut pool, blocks);
                    prop_assert!(evicted.len() >= blocks.min(before));
                    prop_assert_eq!(cache.num_evictable_blocks(), before - evicted.len());
                }
            }
            cache.check_integrity(&pool).map_err(TestCaseError::fail)?;
            for &last in &locks {
                prop_assert!(cache.contains(last), "locked block {} was evicted", last);
            }
        }
        for last in locks.drain(..) {
            cache.unlock(last);
        }
        for refs in held_refs.drain(..) {
            for block in refs {
                pool.decref(block);
                cache.refresh(&pool, block);
            }
        }
        prop_assert_eq!(cache.num_evictable_blocks(), cache.num_cached_blocks());
        cache.evict(&mut pool, NUM_BLOCKS);
        prop_assert_eq!(pool.num_free(), NUM_BLOCKS);
        cache.check_integrity(&pool).map_err(TestCaseError::fail)?;
    }
}
