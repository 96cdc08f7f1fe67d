//! Property tests of [`PrefixCache`]: random insert / match / lock / unlock / evict against a
//! naive model, with `check_integrity()` and a full comparison after every operation.
//!
//! The model is a map from `(namespace, cached token prefix)` to `(block, lock count, last
//! access)`: one entry per cached whole-block prefix, no tree. Match is "the longest prefix in
//! the map", a lock covers every prefix of the locked one, and eviction removes the oldest
//! unlocked entry that no other entry extends. Block ids come from a real [`BlockPool`], so the
//! model predicts the exact blocks returned and evicted, and the pool's free count.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::{BlockId, BlockPool, Namespace, PrefixCache};

const BLOCK_SIZE: usize = 2;
const NUM_BLOCKS: usize = 12;
/// Candidate token sequences per case: few, over a 2-letter alphabet, so prefixes collide.
const NUM_SEQS: usize = 4;
const MAX_SEQ_BLOCKS: usize = 4;

#[derive(Clone, Debug)]
enum Op {
    /// Allocate `blocks` fresh blocks, insert sequence `seq`'s first `blocks` blocks, drop the
    /// caller's references (a finished sequence donating).
    Insert {
        ns: Namespace,
        seq: usize,
        blocks: usize,
    },
    Match {
        ns: Namespace,
        seq: usize,
        tokens: usize,
    },
    /// Lock sequence `seq`'s cached prefix of `blocks` blocks, if it is cached.
    Lock {
        ns: Namespace,
        seq: usize,
        blocks: usize,
    },
    /// Unlock the `idx % held`-th lock taken so far.
    Unlock {
        idx: usize,
    },
    Evict {
        blocks: usize,
    },
}

fn namespace() -> impl Strategy<Value = Namespace> {
    prop_oneof![Just(None), Just(Some(1)), Just(Some(2))]
}

fn op() -> impl Strategy<Value = Op> {
    let seq = 0..NUM_SEQS;
    let blocks = 1..=MAX_SEQ_BLOCKS;
    prop_oneof![
        4 => (namespace(), seq.clone(), blocks.clone())
            .prop_map(|(ns, seq, blocks)| Op::Insert { ns, seq, blocks }),
        3 => (namespace(), seq.clone(), 0..=MAX_SEQ_BLOCKS * BLOCK_SIZE)
            .prop_map(|(ns, seq, tokens)| Op::Match { ns, seq, tokens }),
        2 => (namespace(), seq, blocks).prop_map(|(ns, seq, blocks)| Op::Lock { ns, seq, blocks }),
        2 => any::<usize>().prop_map(|idx| Op::Unlock { idx }),
        2 => (0..6usize).prop_map(|blocks| Op::Evict { blocks }),
    ]
}

type Key = (Namespace, Vec<u32>);

/// `(block, lock count, last access)` of every cached prefix.
#[derive(Default)]
struct Model {
    clock: u64,
    entries: BTreeMap<Key, (BlockId, u32, u64)>,
}

impl Model {
    /// Keys of the cached prefixes of `tokens`, shortest first, stopping at the first gap.
    fn cached_prefixes(&self, ns: Namespace, tokens: &[u32]) -> Vec<Key> {
        (1..=tokens.len() / BLOCK_SIZE)
            .map(|k| (ns, tokens[..k * BLOCK_SIZE].to_vec()))
            .take_while(|key| self.entries.contains_key(key))
            .collect()
    }

    fn stamp(&mut self, keys: &[Key]) {
        for key in keys {
            self.entries.get_mut(key).unwrap().2 = self.clock;
        }
    }

    fn match_prefix(&mut self, ns: Namespace, tokens: &[u32]) -> Vec<BlockId> {
        self.clock += 1;
        let keys = self.cached_prefixes(ns, tokens);
        self.stamp(&keys);
        keys.iter().map(|key| self.entries[key].0).collect()
    }

    fn insert(&mut self, ns: Namespace, tokens: &[u32], blocks: &[BlockId]) -> Option<BlockId> {
        self.clock += 1;
        let keys: Vec<Key> =
            (1..=blocks.len()).map(|k| (ns, tokens[..k * BLOCK_SIZE].to_vec())).collect();
        for (key, &block) in keys.iter().zip(blocks) {
            self.entries.entry(key.clone()).or_insert((block, 0, self.clock));
        }
        self.stamp(&keys);
        keys.last().map(|key| self.entries[key].0)
    }

    fn add_lock(&mut self, ns: Namespace, tokens: &[u32], delta: i32) {
        for key in self.cached_prefixes(ns, tokens) {
            let lock = &mut self.entries.get_mut(&key).unwrap().1;
            *lock = lock.checked_add_signed(delta).unwrap();
        }
    }

    fn evict(&mut self, n: usize) -> Vec<BlockId> {
        let mut evicted = Vec::new();
        while evicted.len() < n {
            let is_leaf = |(ns, tokens): &Key| {
                !self.entries.keys().any(|(ns2, t2)| {
                    ns2 == ns && t2.len() == tokens.len() + BLOCK_SIZE && t2.starts_with(tokens)
                })
            };
            let victim = self
                .entries
                .iter()
                .filter(|(key, &(_, lock, _))| lock == 0 && is_leaf(key))
                .min_by_key(|(_, &(block, _, last))| (last, block))
                .map(|(key, &(block, _, _))| (key.clone(), block));
            let Some((key, block)) = victim else { break };
            self.entries.remove(&key);
            evicted.push(block);
        }
        evicted
    }
}

fn seqs() -> impl Strategy<Value = Vec<Vec<u32>>> {
    prop::collection::vec(prop::collection::vec(0..2u32, MAX_SEQ_BLOCKS * BLOCK_SIZE), NUM_SEQS)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_operations_match_the_model(seqs in seqs(), ops in prop::collection::vec(op(), 1..80)) {
        let mut pool = BlockPool::new(NUM_BLOCKS);
        let mut cache = PrefixCache::new(BLOCK_SIZE);
        let mut model = Model::default();
        // Locks taken and not yet released: (namespace, locked prefix, its block).
        let mut held: Vec<(Namespace, Vec<u32>, BlockId)> = Vec::new();
        for op in &ops {
            match *op {
                Op::Insert { ns, seq, blocks } => {
                    let tokens = &seqs[seq][..blocks * BLOCK_SIZE];
                    let Some(ids) = pool.allocate_n(blocks) else { continue };
                    let want = model.insert(ns, tokens, &ids);
                    prop_assert_eq!(cache.insert(&mut pool, ns, tokens, &ids), want);
                    for id in ids {
                        pool.decref(id);
                    }
                }
                Op::Match { ns, seq, tokens } => {
                    let tokens = &seqs[seq][..tokens];
                    prop_assert_eq!(cache.peek(ns, tokens), model.cached_prefixes(ns, tokens)
                        .iter().map(|key| model.entries[key].0).collect::<Vec<_>>());
                    let want = model.match_prefix(ns, tokens);
                    prop_assert_eq!(cache.match_prefix(ns, tokens), want);
                }
                Op::Lock { ns, seq, blocks } => {
                    let tokens = seqs[seq][..blocks * BLOCK_SIZE].to_vec();
                    let Some(&(block, _, _)) = model.entries.get(&(ns, tokens.clone())) else {
                        continue;
                    };
                    model.add_lock(ns, &tokens, 1);
                    cache.lock(block);
                    held.push((ns, tokens, block));
                }
                Op::Unlock { idx } => {
                    if held.is_empty() {
                        continue;
                    }
                    let (ns, tokens, block) = held.swap_remove(idx % held.len());
                    model.add_lock(ns, &tokens, -1);
                    cache.unlock(block);
                }
                Op::Evict { blocks } => {
                    let want = model.evict(blocks);
                    prop_assert_eq!(cache.evict(&mut pool, blocks), want);
                }
            }
            cache.check_integrity(&pool).map_err(TestCaseError::fail)?;
            prop_assert_eq!(cache.entries(), model.entries.clone(), "after {:?}", op);
            prop_assert_eq!(pool.num_free(), NUM_BLOCKS - model.entries.len());
            let unlocked = model.entries.values().filter(|e| e.1 == 0).count();
            prop_assert_eq!(cache.num_evictable_blocks(), unlocked);
            for (ns, tokens, block) in &held {
                prop_assert!(cache.contains(*block), "locked block {} was evicted", block);
                prop_assert_eq!(cache.path(*block).len() * BLOCK_SIZE, tokens.len());
                prop_assert_eq!(model.entries[&(*ns, tokens.clone())].0, *block);
            }
        }
        // Unlock everything: the whole tree is evictable and the pool comes back full.
        for (_, _, block) in held.drain(..) {
            cache.unlock(block);
        }
        prop_assert_eq!(cache.evict(&mut pool, NUM_BLOCKS).len(), model.entries.len());
        prop_assert_eq!(pool.num_free(), NUM_BLOCKS);
        cache.check_integrity(&pool).map_err(TestCaseError::fail)?;
    }
}
