//! Tests of the host tier under the manager. Property tests: random admissions, steps and releases
//! over a small pool, with the moves applied to a simulated memory (each GPU block and host
//! slot holds the [`BlockKey`] of the KV it was last given). After every operation: the
//! manager's integrity (the tier's slots whole, no block in both tiers), every cached node's
//! block and every host entry's slot hold their own block's KV, and every admitted sequence
//! reads, in each block it was given from the cache, exactly the KV of its own prefix.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::host_tier::chain_keys;
use super::{BlockKey, KvLayout, KvManager, SeqId};

const NUM_SEQ_IDS: SeqId = 4;

#[derive(Clone, Debug)]
enum Op {
    /// Admit `seq` with a prompt of these tokens (from a 2-letter alphabet: shared prefixes).
    Begin(SeqId, Vec<u32>),
    /// Run the planned step: apply the moves, compute what was reserved, cache full blocks.
    Step,
    Release(SeqId),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..NUM_SEQ_IDS, prop::collection::vec(0..2u32, 1..14)).prop_map(|(s, t)| Op::Begin(s, t)),
        3 => Just(Op::Step),
        2 => (0..NUM_SEQ_IDS).prop_map(Op::Release),
    ]
}

/// What each GPU block and host slot holds.
struct Memory {
    gpu: Vec<Option<BlockKey>>,
    host: Vec<Option<BlockKey>>,
}

struct Live {
    tokens: Vec<u32>,
    /// Tokens it took from the cache at admission.
    hit: usize,
    /// Computed (false until its first step ran).
    computed: bool,
}

fn run_step(
    kv: &mut KvManager,
    mem: &mut Memory,
    live: &mut BTreeMap<SeqId, Live>,
    bs: usize,
) -> Result<(), TestCaseError> {
    let moves = kv.take_moves();
    for &(slot, key) in &moves.spill {
        // a dropped entry goes to disk with its own KV (not a block written this step)
        prop_assert_eq!(mem.host[slot as usize], Some(key), "host slot {} spills other KV", slot);
    }
    for &(block, slot) in &moves.offload {
        prop_assert!(
            mem.gpu[block as usize].is_some(),
            "offload of block {} that holds nothing",
            block
        );
        mem.host[slot as usize] = mem.gpu[block as usize];
    }
    for &(slot, block) in &moves.load {
        prop_assert!(
            mem.host[slot as usize].is_some(),
            "load of host slot {} that holds nothing",
            slot
        );
        mem.gpu[block as usize] = mem.host[slot as usize];
    }
    for (&seq, l) in live.iter_mut().filter(|(_, l)| !l.computed) {
        let keys = chain_keys(None, &l.tokens, bs);
        let table = kv.table(seq).expect("live").as_slice().to_vec();
        // what the step reads from the cache (GPU hit or host load) is its own prefix's KV
        for i in 0..l.hit / bs {
            prop_assert_eq!(
                mem.gpu[table[i] as usize],
                Some(keys[i]),
                "sequence {} reads block {} of another prefix",
                seq,
                i
            );
        }
        for (i, &block) in table.iter().enumerate() {
            mem.gpu[block as usize] = keys.get(i).copied(); // computed (or partial: no key)
        }
        l.computed = true;
        kv.cache_full_blocks(seq, &l.tokens).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    Ok(())
}

fn check_memory(kv: &KvManager, mem: &Memory, bs: usize) -> Result<(), TestCaseError> {
    kv.check_integrity().map_err(TestCaseError::fail)?;
    let cache = kv.prefix_cache().expect("on");
    for ((ns, tokens), (block, _, _)) in cache.entries() {
        let key = *chain_keys(ns, &tokens, bs).last().expect("a node has a block");
        prop_assert_eq!(
            mem.gpu[block as usize],
            Some(key),
            "cached block {} holds other KV",
            block
        );
    }
    for (key, slot) in kv.host_tier().expect("on").entries() {
        prop_assert_eq!(mem.host[slot as usize], Some(key), "host slot {} holds other KV", slot);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    #[test]
    fn moves_keep_every_tier_holding_its_own_kv(
        num_blocks in 3..10usize,
        host_slots in 0..8usize,
        ops in prop::collection::vec(op(), 1..48),
    ) {
        let bs = 2;
        let layout = KvLayout::f16(2, 1, 4, bs).unwrap();
        let mut kv = KvManager::with_prefix_cache(layout, num_blocks, true)
            .unwrap()
            .with_host_tier(host_slots)
            .unwrap();
        kv.spill_host_drops();
        let mut mem = Memory { gpu: vec![None; num_blocks], host: vec![None; host_slots] };
        let mut live: BTreeMap<SeqId, Live> = BTreeMap::new();
        for op in &ops {
            match op {
                Op::Begin(seq, tokens) => {
                    if live.contains_key(seq) {
                        continue;
                    }
                    let cached = kv.num_cached_tokens(None, tokens);
                    let new = tokens.len() - cached;
                    if !kv.can_begin(None, tokens, new) {
                        continue;
                    }
                    let hit = kv.begin_sequence(*seq, None, tokens).unwrap();
                    prop_assert_eq!(hit, cached);
                    kv.reserve(*seq, new).unwrap();
                    // several admissions may share a step: the moves run at the next Step
                    live.insert(*seq, Live { tokens: tokens.clone(), hit, computed: false });
                }
                Op::Step => run_step(&mut kv, &mut mem, &mut live, bs)?,
                Op::Release(seq) => {
                    // a planned step runs before anything else happens to the manager
                    if live.values().any(|l| !l.computed) {
                        run_step(&mut kv, &mut mem, &mut live, bs)?;
                    }
                    if let Some(l) = live.remove(seq) {
                        kv.release_sequence(*seq, &l.tokens).unwrap();
                    }
                }
            }
            match op {
                // its moves wait for the step: only the bookkeeping is whole now
                Op::Begin(..) => kv.check_integrity().map_err(TestCaseError::fail)?,
                _ => check_memory(&kv, &mem, bs)?,
            }
        }
        run_step(&mut kv, &mut mem, &mut live, bs)?;
        for (seq, l) in std::mem::take(&mut live) {
            kv.release_sequence(seq, &l.tokens).unwrap();
        }
        check_memory(&kv, &mem, bs)?;
        prop_assert_eq!(kv.num_free_or_evictable_blocks(), num_blocks, "no leak");
    }
}

/// A prefix the pool evicted comes back from the host tier: counted as a hit, loaded into fresh
/// blocks by the next moves, written back first.
#[test]
fn an_evicted_prefix_comes_back_from_host() {
    let bs = 2;
    let layout = KvLayout::f16(2, 1, 4, bs).unwrap();
    let mut kv = KvManager::with_prefix_cache(layout, 3, true).unwrap().with_host_tier(4).unwrap();
    let a = [1, 2, 3, 4, 5];
    assert_eq!(kv.begin_sequence(0, None, &a).unwrap(), 0);
    kv.reserve(0, a.len()).unwrap();
    kv.release_sequence(0, &a).unwrap(); // 2 full blocks cached
    assert!(kv.take_moves().is_empty());
    let b = [9, 9, 9, 9, 9, 9];
    assert!(kv.can_begin(None, &b, b.len()));
    kv.begin_sequence(1, None, &b).unwrap();
    kv.reserve(1, b.len()).unwrap(); // 3 blocks: a's two are evicted, written back
    let moves = kv.take_moves();
    assert_eq!(moves.offload.len(), 2);
    assert!(moves.load.is_empty());
    kv.release_sequence(1, &b).unwrap();
    assert_eq!(kv.num_cached_tokens(None, &a), 4, "a's prefix is in the host tier");
    assert!(kv.can_begin(None, &a, 1));
    assert_eq!(kv.begin_sequence(2, None, &a).unwrap(), 4);
    kv.reserve(2, 1).unwrap();
    let moves = kv.take_moves();
    assert_eq!(moves.load.len(), 2, "{moves:?}");
    let table = kv.table(2).unwrap().as_slice().to_vec();
    assert_eq!(moves.load.iter().map(|l| l.1).collect::<Vec<_>>(), table[..2]);
    let stats = kv.stats();
    // inclusive: a's blocks keep their host copies; b's three went down, one dropped for room
    assert_eq!((stats.host_hit_tokens, stats.host.num_loaded, stats.host.num_used), (4, 2, 4));
    assert_eq!(stats.host.num_dropped, 1);
    kv.release_sequence(2, &a).unwrap();
    kv.check_integrity().unwrap();
    // evicting a's blocks again copies nothing: the host has them
    let c = [7, 7, 7, 7, 7];
    kv.begin_sequence(3, None, &c).unwrap();
    kv.reserve(3, c.len()).unwrap();
    let evicted = kv.stats().num_evicted_blocks;
    assert!(kv.take_moves().is_empty(), "a's two blocks are evicted, and copy nothing");
    assert_eq!(evicted, 2 + 3 + 2, "a's two, b's three, a's two again");
    kv.check_integrity().unwrap();
}

/// The tier is refused, saying why, where its blocks would not be the tree's whole story.
#[test]
fn a_tier_needs_the_cache_and_one_full_group() {
    use super::{GroupKind, KvError, KvGroups};
    let layout = KvLayout::f16(2, 1, 4, 2).unwrap();
    let no_cache = KvManager::with_prefix_cache(layout, 4, false).unwrap().with_host_tier(4);
    assert!(matches!(no_cache, Err(KvError::HostTierUnsupported(w)) if w.contains("prefix cache")));
    let groups = KvGroups::from_layer_kinds(&[GroupKind::Sliding { window: 8 }, GroupKind::Full]);
    let layout = KvLayout::f16(groups.slots_per_block(), 1, 2, 4).unwrap();
    let hybrid = KvManager::with_groups(layout, groups, 8, true).unwrap().with_host_tier(4);
    let err = hybrid.unwrap_err().to_string();
    assert!(err.contains("--kv-offloading-size") && err.contains("sliding"), "{err}");
}
