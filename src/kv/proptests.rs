//! Property tests: random add / reserve / fork / free sequences against a naive model of the
//! cache, with `check_integrity()` after every operation.
//!
//! The model names each block it hands out with a fresh number and never reuses one; the real
//! manager must agree with it up to a renaming of block ids (a bijection between the model's
//! names and the live real ids). That single check covers: the same blocks are shared by the same
//! tables, nothing is shared without a fork, and free counts add up.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::{BlockTable, KvError, KvLayout, KvManager, SeqId};

/// Sequence ids the operations use: few, so that they collide often.
const NUM_SEQ_IDS: SeqId = 5;

#[derive(Clone, Debug)]
enum Op {
    Add(SeqId),
    Reserve(SeqId, usize),
    Free(SeqId),
    Fork { parent: SeqId, child: SeqId },
}

fn op() -> impl Strategy<Value = Op> {
    let seq = 0..NUM_SEQ_IDS;
    prop_oneof![
        2 => seq.clone().prop_map(Op::Add),
        5 => (seq.clone(), prop_oneof![0..4usize, 0..24usize]).prop_map(|(s, n)| Op::Reserve(s, n)),
        2 => seq.clone().prop_map(Op::Free),
        2 => (seq.clone(), seq).prop_map(|(parent, child)| Op::Fork { parent, child }),
    ]
}

/// The naive model: per sequence, its token count and the names of its blocks.
#[derive(Default)]
struct Model {
    num_blocks: usize,
    block_size: usize,
    next_name: u64,
    seqs: BTreeMap<SeqId, (usize, Vec<u64>)>,
}

impl Model {
    fn num_live_blocks(&self) -> usize {
        let mut names: Vec<u64> = self.seqs.values().flat_map(|(_, b)| b.clone()).collect();
        names.sort_unstable();
        names.dedup();
        names.len()
    }

    /// Applies `op`; returns the error the real manager must give, if any.
    fn apply(&mut self, op: &Op) -> Result<(), KvError> {
        match *op {
            Op::Add(s) if self.seqs.contains_key(&s) => Err(KvError::SequenceExists(s)),
            Op::Add(s) => {
                self.seqs.insert(s, (0, Vec::new()));
                Ok(())
            }
            Op::Reserve(s, n) => {
                let free = self.num_blocks - self.num_live_blocks();
                let (tokens, blocks) = self.seqs.get_mut(&s).ok_or(KvError::UnknownSequence(s))?;
                let needed = (*tokens + n).div_ceil(self.block_size) - blocks.len();
                if needed > free {
                    return Err(KvError::OutOfBlocks { needed, free });
                }
                for _ in 0..needed {
                    blocks.push(self.next_name);
                    self.next_name += 1;
                }
                *tokens += n;
                Ok(())
            }
            Op::Free(s) => self.seqs.remove(&s).map(drop).ok_or(KvError::UnknownSequence(s)),
            Op::Fork { child, .. } if self.seqs.contains_key(&child) => {
                Err(KvError::SequenceExists(child))
            }
            Op::Fork { parent, child } => {
                let (tokens, blocks) =
                    self.seqs.get(&parent).ok_or(KvError::UnknownSequence(parent))?;
                let full = tokens / self.block_size;
                let shared = blocks[..full].to_vec();
                self.seqs.insert(child, (full * self.block_size, shared));
                Ok(())
            }
        }
    }
}

/// Everything observable about the manager, to check that a failed operation changed nothing.
fn snapshot(kv: &KvManager) -> (Vec<(SeqId, BlockTable)>, Vec<u32>, usize) {
    let tables = (0..NUM_SEQ_IDS).filter_map(|s| kv.table(s).map(|t| (s, t.clone()))).collect();
    let refs = (0..kv.num_blocks() as u32).map(|id| kv.pool().ref_count(id)).collect();
    (tables, refs, kv.num_free_blocks())
}

/// The real tables equal the model's up to a bijective renaming of blocks.
fn check_against_model(kv: &KvManager, model: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(kv.num_sequences(), model.seqs.len());
    prop_assert_eq!(kv.num_free_blocks(), model.num_blocks - model.num_live_blocks());
    let mut to_real: HashMap<u64, u32> = HashMap::new();
    let mut to_name: HashMap<u32, u64> = HashMap::new();
    for (&seq, (tokens, names)) in &model.seqs {
        let table = kv.table(seq).ok_or_else(|| TestCaseError::fail("live sequence missing"))?;
        prop_assert_eq!(table.num_tokens(), *tokens);
        prop_assert_eq!(table.num_blocks(), names.len());
        for (&name, &id) in names.iter().zip(table.as_slice()) {
            prop_assert_eq!(*to_real.entry(name).or_insert(id), id, "block renamed twice");
            prop_assert_eq!(*to_name.entry(id).or_insert(name), name, "two blocks in one id");
        }
    }
    Ok(())
}

/// Reserved slots are unique within a sequence; a slot in two sequences is in a shared block at
/// the same position of both.
fn check_slots(kv: &KvManager) -> Result<(), TestCaseError> {
    let mut owner: HashMap<u32, (SeqId, usize)> = HashMap::new();
    for seq in 0..NUM_SEQ_IDS {
        let Some(table) = kv.table(seq) else { continue };
        let slots = table.slot_mapping(0..table.num_tokens());
        for (pos, slot) in slots.into_iter().enumerate() {
            let block = slot / table.block_size() as u32;
            prop_assert_eq!(block, table.as_slice()[pos / table.block_size()]);
            if let Some(&(other, other_pos)) = owner.get(&slot) {
                prop_assert!(other != seq, "slot {} twice in sequence {}", slot, seq);
                prop_assert_eq!(other_pos, pos, "shared slot at different positions");
                prop_assert!(kv.pool().ref_count(block) > 1, "slot {} shared unshared", slot);
            }
            owner.insert(slot, (seq, pos));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_operations_match_the_model(
        num_blocks in 0..10usize,
        block_size in 1..5usize,
        ops in prop::collection::vec(op(), 1..64),
    ) {
        let layout = KvLayout::f16(2, 1, 4, block_size).unwrap();
        let mut kv = KvManager::new(layout, num_blocks).unwrap();
        let mut model = Model { num_blocks, block_size, ..Model::default() };
        for op in &ops {
            let before = snapshot(&kv);
            let old_tokens = match op {
                Op::Reserve(s, _) => kv.table(*s).map(BlockTable::num_tokens),
                _ => None,
            };
            let want = model.apply(op);
            let got = match *op {
                Op::Add(s) => kv.add_sequence(s),
                Op::Reserve(s, n) => kv.reserve(s, n).map(|slots| {
                    let start = old_tokens.unwrap();
                    assert_eq!(slots[0], kv.table(s).unwrap().slot_mapping(start..start + n));
                }),
                Op::Free(s) => kv.free_sequence(s),
                Op::Fork { parent, child } => kv.fork_sequence(parent, child),
            };
            prop_assert_eq!(&got, &want, "{:?}", op);
            if got.is_err() {
                prop_assert_eq!(snapshot(&kv), before, "failed {:?} changed state", op);
            }
            kv.check_integrity().map_err(TestCaseError::fail)?;
            check_against_model(&kv, &model)?;
            check_slots(&kv)?;
        }
        for seq in 0..NUM_SEQ_IDS {
            if kv.table(seq).is_some() {
                kv.free_sequence(seq).unwrap();
            }
        }
        prop_assert_eq!(kv.num_free_blocks(), num_blocks);
        kv.check_integrity().map_err(TestCaseError::fail)?;
    }
}
