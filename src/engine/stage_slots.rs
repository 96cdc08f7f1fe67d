//! Which running request owns which f16 staging slot of a quantized KV pool. A slot holds its
//! sequence's partial last block between steps, so a sequence keeps its slot while it runs;
//! slots of requests that stopped running (finished, cancelled, preempted) are reclaimed before
//! new ones are handed out. A preempted sequence that comes back gets any free slot: it
//! restarts at a block boundary (prefix hits are whole blocks), so it recomputes its partial
//! block before reading it.

use crate::sched::{RequestId, StepPlan};

/// Slot owners; `max_num_seqs` slots, so every running sequence has one.
#[derive(Debug)]
pub(super) struct StageSlots {
    owner: Vec<Option<RequestId>>,
}

impl StageSlots {
    pub fn new(num_slots: usize) -> Self {
        StageSlots { owner: vec![None; num_slots] }
    }

    /// The slot of every sequence of `plan`, in plan order: kept from earlier steps, or the
    /// lowest free one. `is_running` tells which current owners still run. O(slots × plan).
    /// Panics if the plan runs more sequences than there are slots (a scheduler bug).
    pub fn assign(&mut self, plan: &StepPlan, is_running: impl Fn(RequestId) -> bool) -> Vec<u32> {
        for o in &mut self.owner {
            if o.is_some_and(|id| !is_running(id)) {
                *o = None;
            }
        }
        plan.seqs
            .iter()
            .map(|s| {
                let slot = match self.owner.iter().position(|&o| o == Some(s.id)) {
                    Some(slot) => slot,
                    None => {
                        let free = self.owner.iter().position(Option::is_none);
                        let slot = free.expect("more running sequences than staging slots");
                        self.owner[slot] = Some(s.id);
                        slot
                    }
                };
                slot as u32
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::ScheduledSeq;

    fn plan(ids: &[RequestId]) -> StepPlan {
        let seq = |&id| ScheduledSeq {
            id,
            start_pos: 0,
            tokens: vec![1],
            block_tables: vec![vec![0]],
            slot_mapping: vec![vec![0]],
            prompt_logits: 0..0,
            sample: true,
            num_cached_tokens: 0,
            restore_state: None,
            snapshot: None,
        };
        StepPlan { seqs: ids.iter().map(seq).collect(), ..StepPlan::default() }
    }

    #[test]
    fn slots_are_kept_while_running_and_reclaimed_after() {
        let mut slots = StageSlots::new(3);
        assert_eq!(slots.assign(&plan(&[7, 8]), |_| true), [0, 1]);
        assert_eq!(slots.assign(&plan(&[8, 7, 9]), |_| true), [1, 0, 2]);
        // 7 finished: its slot goes to the newcomer, the others keep theirs
        assert_eq!(slots.assign(&plan(&[9, 10, 8]), |id| id != 7), [2, 0, 1]);
        // 8 preempted and back later: any free slot
        assert_eq!(slots.assign(&plan(&[9, 10]), |id| id != 8 && id != 7), [2, 0]);
        assert_eq!(slots.assign(&plan(&[8, 9]), |id| id != 10), [0, 2]);
    }

    #[test]
    #[should_panic(expected = "more running sequences than staging slots")]
    fn too_many_sequences_is_a_bug() {
        StageSlots::new(1).assign(&plan(&[1, 2]), |_| true);
    }
}
