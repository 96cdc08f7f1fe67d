//! The host tier's bytes: one run of `kv_block_bytes` per host slot (the KV manager decides
//! which slot holds what, `kv::HostTier`), and the step's [`KvMoves`] carried out through the
//! model's block transfers before the step runs.

use crate::kv::{format_bytes, HostSlot, KvMoves};
use crate::model::Model;

use super::kv_disk::DiskKvStore;
use super::EngineError;

/// Host memory of the tier, filled as blocks arrive (a slot never written costs nothing).
#[derive(Debug)]
pub(super) struct HostKvStore {
    block_bytes: usize,
    slots: Vec<Vec<u8>>,
}

impl HostKvStore {
    /// Slots of `block_bytes` within `size` bytes (`--kv-offloading-size`), checked against
    /// the host's available memory when it is known.
    pub(super) fn new(
        size: u64,
        block_bytes: u64,
        host_available: Option<u64>,
    ) -> Result<(Self, usize), EngineError> {
        if let Some(avail) = host_available.filter(|&a| size > a) {
            return Err(EngineError::Config(format!(
                "--kv-offloading-size {} is more than the host's available memory ({}); give \
                 at most that",
                format_bytes(size),
                format_bytes(avail)
            )));
        }
        let num_slots = usize::try_from(size / block_bytes.max(1)).unwrap_or(usize::MAX);
        if num_slots == 0 {
            return Err(EngineError::Config(format!(
                "--kv-offloading-size {} holds no KV block of this model ({} each); give at \
                 least that",
                format_bytes(size),
                format_bytes(block_bytes)
            )));
        }
        let num_slots = num_slots.min(u32::MAX as usize);
        let store =
            HostKvStore { block_bytes: block_bytes as usize, slots: vec![Vec::new(); num_slots] };
        Ok((store, num_slots))
    }

    /// Slot `slot`'s bytes, if it was ever written.
    pub(super) fn bytes(&self, slot: HostSlot) -> Option<&[u8]> {
        let s = &self.slots[slot as usize];
        (s.len() == self.block_bytes).then_some(s.as_slice())
    }

    /// Fills slot `slot` with a block's bytes (read from the disk tier).
    pub(super) fn fill(&mut self, slot: HostSlot, bytes: &[u8]) {
        let s = &mut self.slots[slot as usize];
        s.clear();
        s.extend_from_slice(bytes);
    }

    /// Runs `moves`: every spill (to `disk`), every offload (the pool's blocks read back in
    /// one transfer), then every load (written in one).
    pub(super) fn apply(
        &mut self,
        model: &Model,
        moves: &KvMoves,
        mut disk: Option<&mut DiskKvStore>,
    ) -> Result<(), EngineError> {
        for &(slot, key) in &moves.spill {
            if let (Some(disk), Some(bytes)) = (disk.as_deref_mut(), self.bytes(slot)) {
                disk.write(key, bytes);
            }
        }
        let bb = self.block_bytes;
        if !moves.offload.is_empty() {
            let blocks: Vec<u32> = moves.offload.iter().map(|&(b, _)| b).collect();
            let bytes = model.read_kv_blocks(&blocks)?;
            for (&(_, slot), data) in moves.offload.iter().zip(bytes.chunks_exact(bb)) {
                let s = &mut self.slots[slot as usize];
                s.clear();
                s.extend_from_slice(data);
            }
        }
        if !moves.load.is_empty() {
            let mut data = Vec::with_capacity(moves.load.len() * bb);
            for &(slot, _) in &moves.load {
                let s = &self.slots[slot as usize];
                assert_eq!(s.len(), bb, "host slot {slot} is loaded before it was written");
                data.extend_from_slice(s);
            }
            let blocks: Vec<u32> = moves.load.iter().map(|&(_, b)| b).collect();
            model.write_kv_blocks(&blocks, &data)?;
        }
        Ok(())
    }
}
