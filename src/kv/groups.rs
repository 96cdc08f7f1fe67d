//! [`KvGroups`]: which layers share a block table. Layers are grouped by attention kind
//! ([`GroupKind`]): every group holds the same number of layer *slots*, so every pool block has
//! the same bytes whichever group owns it, and one block pool serves them all (vLLM's hybrid KV
//! cache manager does the same). Each sequence holds one block table per group.
//!
//! ```text
//! pool block b, group g  =  KV of layers group[g].layers[0..slots], tokens of table_g's block b
//! layer ℓ  →  (group g, slot j): its K/V live in pool buffer j, at the blocks of table g
//! ```
//!
//! ## Choosing the slots per block (s)
//!
//! A group of a kind with `n` layers takes `ceil(n / s)` groups of `s` slots; slots without a
//! layer are padding (allocated, never used). Fewer groups mean fewer block tables per sequence
//! and per step; less padding means fewer wasted pool bytes. A padding slot costs what its
//! group holds: in a full-attention group the whole context's blocks, in a sliding group only
//! the window's. So padding is weighed in bytes at the planned context ([`PlannedContext`]:
//! `-c`, block size, step tokens), and [`KvGroups::from_packed_layers_at`] takes the largest `s`
//! whose padding is at most 1 % of the bytes the layers need ([`MAX_PADDING_DIVISOR`]); padding
//! lands in the sliding groups, where it is cheap. At `-c 32768`, 16-token blocks, 512-token
//! steps:
//!
//! | model | layers (full + sliding) | s | groups | padding slots | padding bytes |
//! |---|---|---|---|---|---|
//! | Llama / SmolLM2 / Qwen2 | 30 + 0 (SmolLM2) | 30 | 1 full | 0 | 0 |
//! | Mistral 7B v0.1 (window 4096) | 0 + 32 | 32 | 1 sliding | 0 | 0 |
//! | Gemma 3 270M (window 512) | 3 + 15 | 3 | 1 full + 5 sliding | 0 | 0 |
//! | Gemma 3 4B (window 1024) | 5 + 29 | 5 | 1 full + 6 sliding | 1 sliding | 0.7 % |
//! | Gemma 3 27B (window 1024) | 10 + 52 | 2 | 5 full + 26 sliding | 0 | 0 |
//!
//! The 27B's next candidates pad more than 1 %: s = 10 (1 full + 6 sliding) leaves 8 sliding
//! slots empty, 3.0 %; s = 5, 3 slots, 1.1 %. More groups cost block tables (one per group and
//! sequence, uploaded each step), not pool bytes. Weighed by slots instead (every slot alike:
//! [`KvGroups::from_packed_layers`], when no context is planned), s = 13 would put 3 padding
//! slots in the full group: 24 % more bytes than its layers need at that context.
//!
//! ## The fewest slots a pool of its bytes can bind
//!
//! Each slot of the pool is one K and one V buffer of every block, and one buffer binds at most
//! the adapter's `max_storage_buffer_binding_size`: a pool binds at most `s` × that limit per K
//! and V. Fewer slots per block mean a smaller largest pool, so the engine, once it knows the
//! adapter and the pool's bytes, asks for at least the slots that pool needs (`min_slots`,
//! `engine::slots_for_pool`); among those, the 1 % rule, else the least padding.

/// How the layers of a group attend to the past.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum GroupKind {
    /// Every earlier position: the table covers the whole sequence.
    Full,
    /// A query at position `p` sees keys at positions `(p − window, p]`: blocks that fall wholly
    /// before the window of the next query go back to the pool.
    Sliding { window: usize },
}

impl GroupKind {
    /// The first key position a query at `pos` reads.
    pub fn first_visible(self, pos: usize) -> usize {
        match self {
            GroupKind::Full => 0,
            GroupKind::Sliding { window } => (pos + 1).saturating_sub(window),
        }
    }

    /// Window in tokens, 0 for full attention (what the attention kernels take).
    pub fn window(self) -> usize {
        match self {
            GroupKind::Full => 0,
            GroupKind::Sliding { window } => window,
        }
    }

    /// Most blocks of `block_size` a sequence of this kind holds while computing `step_tokens`
    /// tokens at once, whatever its length: `None` for full attention (grows with the context),
    /// else `ceil((window − 1 + step_tokens) / block_size) + 1` (the keys of the step's first
    /// query, the step's own tokens, and one block of misalignment).
    pub fn max_live_blocks(self, block_size: usize, step_tokens: usize) -> Option<usize> {
        match self {
            GroupKind::Full => None,
            GroupKind::Sliding { window } => {
                Some((window - 1 + step_tokens.max(1)).div_ceil(block_size) + 1)
            }
        }
    }
}

/// One group: its kind and its layers, in slot order (at most `slots_per_block ×
/// layers_per_slot`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KvGroup {
    pub kind: GroupKind,
    /// Model layer indices, ascending; slot `j / layers_per_slot` holds `layers[j]`.
    pub layers: Vec<usize>,
    /// Layers one slot holds: 1, or more for layers whose heads fill a fraction of a block
    /// sized for a wider shape (Gemma 4's global layers: [`KvGroups::from_packed_layers`]).
    pub layers_per_slot: usize,
}

/// The groups of one model; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KvGroups {
    groups: Vec<KvGroup>,
    slots_per_block: usize,
    /// `[model layers]` (group, slot, place in the slot) of each layer with KV; `None` for a
    /// layer without (a recurrent layer: its memory is a state, `kernels::delta_net`).
    #[serde(skip)]
    layer_slot: Vec<Option<(usize, usize, usize)>>,
}

/// Most padding the slot choice accepts, as a fraction of what the layers need (bytes at a
/// planned context, else slots): 1/100.
pub const MAX_PADDING_DIVISOR: usize = 100;

/// The sequences a pool is planned for, which weigh a padding slot by the blocks its group
/// holds ([`KvGroups::from_packed_layers_at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedContext {
    /// `-c`: the longest sequence.
    pub max_model_len: usize,
    pub block_size: usize,
    /// Most tokens one step computes (`--max-num-batched-tokens`).
    pub step_tokens: usize,
}

impl PlannedContext {
    /// Blocks a sequence holds at most in a group of `kind`.
    pub fn blocks(&self, kind: GroupKind) -> usize {
        let all = self.max_model_len.div_ceil(self.block_size.max(1));
        let step = self.step_tokens.min(self.max_model_len);
        kind.max_live_blocks(self.block_size.max(1), step).map_or(all, |live| live.min(all))
    }
}

impl KvGroups {
    /// Every layer alike, full attention: one group of all layers (today's layout).
    pub fn uniform(num_layers: usize) -> KvGroups {
        KvGroups::from_layer_kinds(&vec![GroupKind::Full; num_layers])
    }

    /// Groups for layers of the given kinds (one entry per layer). Kinds keep their first
    /// appearance order; within a kind, layers ascend. Panics if `kinds` is empty or a sliding
    /// window is 0 (the loader refuses both).
    pub fn from_layer_kinds(kinds: &[GroupKind]) -> KvGroups {
        let kinds: Vec<Option<GroupKind>> = kinds.iter().copied().map(Some).collect();
        KvGroups::from_model_layers(&kinds)
    }

    /// Like [`KvGroups::from_layer_kinds`] for a model some of whose layers keep no KV
    /// (`None`: recurrent layers, whose memory is a fixed-size state): those layers take no
    /// slot, and the padding rule counts the KV layers only. Panics if no layer keeps KV.
    pub fn from_model_layers(kinds: &[Option<GroupKind>]) -> KvGroups {
        KvGroups::from_packed_layers(kinds, &vec![1; kinds.len()])
    }

    /// Like [`KvGroups::from_model_layers`] where a slot holds `layers_per_slot[l]` layers of
    /// layer `l`'s kind (the smallest of a kind's layers counts): layers whose KV heads fill a
    /// fraction of a pool block sized for a wider head shape share a slot, each at its own
    /// heads of the block (Gemma 4's 4 × 512 global layers, two to a block sized for 16 × 256:
    /// `model::layers_per_slot`), so they leave none of it unused. A kind of `n` layers takes
    /// `ceil(n / per_slot)` slots; the padding rule counts slots.
    pub fn from_packed_layers(kinds: &[Option<GroupKind>], layers_per_slot: &[usize]) -> KvGroups {
        KvGroups::from_packed_layers_at(kinds, layers_per_slot, None, 1)
    }

    /// Like [`KvGroups::from_packed_layers`], weighing each padding slot by the blocks its
    /// group holds at `planned` (see the module docs): padding goes where it costs least.
    /// `None` weighs every slot alike. Blocks hold at least `min_slots` slots (capped at the
    /// most any kind needs): the largest such `s` whose padding is at most 1 % of what the
    /// layers need, else the one with the least padding (the larger on a tie).
    pub fn from_packed_layers_at(
        kinds: &[Option<GroupKind>],
        layers_per_slot: &[usize],
        planned: Option<PlannedContext>,
        min_slots: usize,
    ) -> KvGroups {
        let kv_layers = kinds.iter().flatten().count();
        assert!(kv_layers > 0, "a model has at least one layer with KV");
        assert!(
            kinds.iter().flatten().all(|k| k.window() > 0 || *k == GroupKind::Full),
            "a sliding window of 0 tokens"
        );
        let by_kind = Self::by_kind(kinds, layers_per_slot);
        let units = |(_, l, per): &(GroupKind, Vec<usize>, usize)| l.len().div_ceil(*per);
        // what a slot of a kind costs: its blocks at the planned context, or 1
        let weight = |(kind, ..): &(GroupKind, Vec<usize>, usize)| {
            planned.map_or(1, |p| p.blocks(*kind).max(1))
        };
        let largest = by_kind.iter().map(units).max().expect("non-empty");
        let padding = |s: usize| -> usize {
            by_kind.iter().map(|k| (units(k).div_ceil(s) * s - units(k)) * weight(k)).sum()
        };
        let needed = match planned {
            Some(_) => by_kind.iter().map(|k| units(k) * weight(k)).sum(),
            None => kv_layers,
        };
        let lowest = min_slots.clamp(1, largest);
        let within = (lowest..=largest).rev().find(|&s| padding(s) * MAX_PADDING_DIVISOR <= needed);
        let least = || (lowest..=largest).rev().min_by_key(|&s| padding(s)).unwrap_or(largest);
        let slots_per_block = within.unwrap_or_else(least);
        KvGroups::with_slots_packed(kinds, layers_per_slot, slots_per_block)
    }

    /// The KV layers of each kind and the layers a slot holds of it, kinds in first
    /// appearance order.
    fn by_kind(
        kinds: &[Option<GroupKind>],
        layers_per_slot: &[usize],
    ) -> Vec<(GroupKind, Vec<usize>, usize)> {
        assert_eq!(kinds.len(), layers_per_slot.len(), "one packing a layer");
        let mut by_kind: Vec<(GroupKind, Vec<usize>, usize)> = Vec::new();
        for (layer, kind) in kinds.iter().enumerate() {
            let Some(kind) = *kind else { continue };
            let per = layers_per_slot[layer].max(1);
            match by_kind.iter_mut().find(|(k, _, _)| *k == kind) {
                Some((_, layers, p)) => {
                    layers.push(layer);
                    *p = (*p).min(per);
                }
                None => by_kind.push((kind, vec![layer], per)),
            }
        }
        by_kind
    }

    /// Like [`KvGroups::from_layer_kinds`] with `slots_per_block` chosen by the caller (tests
    /// of other groupings). Panics if it is 0.
    pub fn with_slots(kinds: &[GroupKind], slots_per_block: usize) -> KvGroups {
        let kinds: Vec<Option<GroupKind>> = kinds.iter().copied().map(Some).collect();
        KvGroups::with_slots_of(&kinds, slots_per_block)
    }

    fn with_slots_of(kinds: &[Option<GroupKind>], slots_per_block: usize) -> KvGroups {
        KvGroups::with_slots_packed(kinds, &vec![1; kinds.len()], slots_per_block)
    }

    fn with_slots_packed(
        kinds: &[Option<GroupKind>],
        layers_per_slot: &[usize],
        slots_per_block: usize,
    ) -> KvGroups {
        assert!(slots_per_block > 0, "a block holds at least one layer slot");
        let mut groups = Vec::new();
        for (kind, layers, per) in Self::by_kind(kinds, layers_per_slot) {
            for chunk in layers.chunks(slots_per_block * per) {
                groups.push(KvGroup { kind, layers: chunk.to_vec(), layers_per_slot: per });
            }
        }
        let mut layer_slot = vec![None; kinds.len()];
        for (g, group) in groups.iter().enumerate() {
            let per = group.layers_per_slot;
            for (j, &layer) in group.layers.iter().enumerate() {
                layer_slot[layer] = Some((g, j / per, j % per));
            }
        }
        KvGroups { groups, slots_per_block, layer_slot }
    }

    /// The groups, in table order.
    pub fn groups(&self) -> &[KvGroup] {
        &self.groups
    }

    /// Number of groups (block tables per sequence).
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Never true (a model has a layer); for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Layer slots one pool block holds (padding included): the `num_layers` of the pool's
    /// [`super::KvLayout`].
    pub fn slots_per_block(&self) -> usize {
        self.slots_per_block
    }

    /// Layers of the model, with KV or not.
    pub fn num_layers(&self) -> usize {
        self.layer_slot.len()
    }

    /// Layers that keep KV (in a group).
    pub fn num_kv_layers(&self) -> usize {
        self.layer_slot.iter().flatten().count()
    }

    /// Blocks' worth of padding slots one sequence holds at `planned`: each group's padding
    /// slots × the blocks it holds (a slot's bytes per block × this = the padding's bytes).
    pub fn padding_slot_blocks(&self, planned: PlannedContext) -> usize {
        let used = |g: &KvGroup| g.layers.len().div_ceil(g.layers_per_slot);
        let pad = |g: &KvGroup| (self.slots_per_block - used(g)) * planned.blocks(g.kind);
        self.groups.iter().map(pad).sum()
    }

    /// Slots without a layer, over all groups (allocated, never used).
    pub fn num_padding_slots(&self) -> usize {
        let used = |g: &KvGroup| g.layers.len().div_ceil(g.layers_per_slot);
        self.groups.iter().map(|g| self.slots_per_block - used(g)).sum()
    }

    /// (group, slot) of `layer`. Panics if out of range or the layer keeps no KV.
    pub fn layer_slot(&self, layer: usize) -> (usize, usize) {
        let (g, slot, _) = self.layer_slot[layer].expect("a layer with KV");
        (g, slot)
    }

    /// `layer`'s place among the layers its slot holds (0 unless the group packs several
    /// into a slot: [`KvGroup::layers_per_slot`]); its KV heads start at this × its KV heads
    /// in the slot's blocks. Panics if out of range or the layer keeps no KV.
    pub fn layer_place(&self, layer: usize) -> usize {
        self.layer_slot[layer].expect("a layer with KV").2
    }

    /// Whether `layer` keeps KV (is in a group). Panics if out of range.
    pub fn has_kv(&self, layer: usize) -> bool {
        self.layer_slot[layer].is_some()
    }

    /// `layer`'s index among the layers that keep KV (per-layer KV buffers such as quantized
    /// staging are allocated for those only). Panics if the layer keeps none.
    pub fn kv_index(&self, layer: usize) -> usize {
        assert!(self.has_kv(layer), "layer {layer} keeps no KV");
        self.layer_slot[..layer].iter().flatten().count()
    }

    /// Kind of group `g`.
    pub fn kind(&self, g: usize) -> GroupKind {
        self.groups[g].kind
    }

    /// Most blocks of `block_size` one sequence of up to `max_len` tokens, computed
    /// `step_tokens` at a time, holds at once over all groups: `ceil(max_len / block_size)` per
    /// full group, at most [`GroupKind::max_live_blocks`] per sliding one. A pool smaller than
    /// this cannot finish a lone sequence. O(groups).
    pub fn blocks_for_lone_sequence(
        &self,
        block_size: usize,
        max_len: usize,
        step_tokens: usize,
    ) -> usize {
        let all = max_len.div_ceil(block_size);
        let step = step_tokens.min(max_len);
        let per_group =
            |g: &KvGroup| g.kind.max_live_blocks(block_size, step).map_or(all, |l| l.min(all));
        self.groups.iter().map(per_group).sum()
    }

    /// Whether every group attends fully (one group, as before groups existed).
    pub fn all_full(&self) -> bool {
        self.groups.iter().all(|g| g.kind == GroupKind::Full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemma3(num_layers: usize, window: usize) -> Vec<GroupKind> {
        (0..num_layers)
            .map(|l| if l % 6 == 5 { GroupKind::Full } else { GroupKind::Sliding { window } })
            .collect()
    }

    #[test]
    fn uniform_models_keep_one_group() {
        let g = KvGroups::uniform(30);
        assert_eq!((g.len(), g.slots_per_block(), g.num_padding_slots()), (1, 30, 0));
        assert_eq!(g.layer_slot(29), (0, 29));
        let mistral = KvGroups::from_layer_kinds(&[GroupKind::Sliding { window: 4096 }; 32]);
        assert_eq!((mistral.len(), mistral.slots_per_block()), (1, 32));
        assert!(!mistral.all_full());
    }

    /// Weighed by slots (no planned context), 1 % of 34 or 62 slots is no padding slot: the
    /// 4B's 29 sliding layers (a prime) take blocks of 1 slot, the 27B's 2.
    #[test]
    fn gemma3_groups() {
        for (layers, window, slots, groups, full) in
            [(18, 512, 3, 6, 1), (34, 1024, 1, 34, 5), (62, 1024, 2, 31, 5)]
        {
            let g = KvGroups::from_layer_kinds(&gemma3(layers, window));
            assert_eq!(
                (g.slots_per_block(), g.len(), g.num_padding_slots()),
                (slots, groups, 0),
                "{layers} layers"
            );
            assert_eq!(g.kind(0), GroupKind::Sliding { window });
            assert_eq!(g.groups().iter().filter(|x| x.kind == GroupKind::Full).count(), full);
            for layer in 0..layers {
                let (gi, j) = g.layer_slot(layer);
                assert_eq!(g.groups()[gi].layers[j], layer);
            }
        }
        let g = KvGroups::from_layer_kinds(&gemma3(18, 512));
        assert_eq!(g.groups()[5].layers, [5, 11, 17]);
        assert_eq!(g.groups()[0].layers, [0, 1, 2]);
    }

    /// Qwen3.5's 3-in-4 recurrent layers keep no KV: 8 full layers of 32 make one group of 8
    /// slots, no padding; the recurrent layers have no slot.
    #[test]
    fn recurrent_layers_take_no_slot() {
        let kinds: Vec<Option<GroupKind>> =
            (0..32).map(|l| (l % 4 == 3).then_some(GroupKind::Full)).collect();
        let g = KvGroups::from_model_layers(&kinds);
        assert_eq!((g.len(), g.slots_per_block(), g.num_padding_slots()), (1, 8, 0));
        assert_eq!((g.num_layers(), g.num_kv_layers()), (32, 8));
        assert_eq!(g.groups()[0].layers, [3, 7, 11, 15, 19, 23, 27, 31]);
        assert_eq!((g.layer_slot(7), g.kv_index(7), g.kv_index(31)), ((0, 1), 1, 7));
        assert!(!g.has_kv(0) && g.has_kv(3));
        assert_eq!(g.blocks_for_lone_sequence(16, 100, 512), 7);
    }

    /// Gemma 4's 31B shape: 50 sliding layers and 10 global ones whose 4 × 512 heads fill half
    /// a block sized for 16 × 256 — packed two to a slot, the global layers take 5 slots, so
    /// blocks of 5 slots: 10 sliding groups and 1 full group of 10 layers, no padding (10
    /// slots a block and half of the full group's unused without packing).
    #[test]
    fn packed_layers_share_slots() {
        let w = GroupKind::Sliding { window: 1024 };
        let kinds: Vec<Option<GroupKind>> =
            (0..60).map(|l| Some(if l % 6 == 5 { GroupKind::Full } else { w })).collect();
        let per: Vec<usize> = (0..60).map(|l| if l % 6 == 5 { 2 } else { 1 }).collect();
        let g = KvGroups::from_packed_layers(&kinds, &per);
        assert_eq!((g.slots_per_block(), g.len(), g.num_padding_slots()), (5, 11, 0));
        let full = g.groups().iter().position(|x| x.kind == GroupKind::Full).unwrap();
        assert_eq!(g.groups()[full].layers, [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]);
        assert_eq!(g.groups()[full].layers_per_slot, 2);
        assert_eq!((g.layer_slot(5), g.layer_place(5)), ((full, 0), 0));
        assert_eq!((g.layer_slot(11), g.layer_place(11)), ((full, 0), 1));
        assert_eq!((g.layer_slot(59), g.layer_place(59)), ((full, 4), 1));
        assert_eq!((g.layer_slot(0), g.layer_place(0)), ((0, 0), 0));
        let unpacked = KvGroups::from_model_layers(&kinds);
        assert_eq!((unpacked.slots_per_block(), unpacked.len()), (10, 6));
        // an odd count leaves a half slot: 3 global layers two to a slot, 1 sliding group
        let kinds =
            [Some(w), Some(w), Some(GroupKind::Full), Some(GroupKind::Full), Some(GroupKind::Full)];
        let g = KvGroups::from_packed_layers(&kinds, &[1, 1, 2, 2, 2]);
        assert_eq!((g.slots_per_block(), g.len(), g.num_padding_slots()), (2, 2, 0));
        assert_eq!((g.layer_slot(4), g.layer_place(4)), ((1, 1), 0));
    }

    #[test]
    fn window_arithmetic() {
        let s = GroupKind::Sliding { window: 4 };
        assert_eq!([0, 3, 4, 9].map(|p| s.first_visible(p)), [0, 0, 1, 6]);
        assert_eq!(GroupKind::Full.first_visible(9), 0);
        // window 512, blocks of 16: a decode needs 32 blocks + 1 of misalignment.
        let w = GroupKind::Sliding { window: 512 };
        assert_eq!(w.max_live_blocks(16, 1), Some(33));
        assert_eq!(w.max_live_blocks(16, 512), Some(65));
        assert_eq!(GroupKind::Full.max_live_blocks(16, 1), None);
        // Gemma 3 270M at 8192 tokens, chunks of 512: 1 full group of 512 blocks, 5 sliding
        // ones of 65 blocks at most.
        let g = KvGroups::from_layer_kinds(&gemma3(18, 512));
        assert_eq!(g.blocks_for_lone_sequence(16, 8192, 512), 512 + 5 * 65);
        assert_eq!(g.blocks_for_lone_sequence(16, 100, 512), 6 * 7);
    }
    /// Gemma 3 27B's layers (every sixth full, window 1024) at -c 32768: blocks of 2 slots pad
    /// nothing (the 1 % rule). Where the pool needs more slots to bind (`min_slots`), no `s`
    /// pads within 1 % and the least padding wins, in the sliding groups: from 3 slots, s = 5
    /// (3 padding slots of 97 blocks, 1.1 %); from 6, s = 10 (8 of 97, 3.0 %), never s = 13,
    /// whose 3 padding slots sit in the full group at 2048 blocks each (24 %).
    #[test]
    fn padding_weighed_in_bytes_goes_to_the_sliding_groups() {
        let kinds: Vec<Option<GroupKind>> = (0..62)
            .map(|l| {
                Some(if l % 6 == 5 { GroupKind::Full } else { GroupKind::Sliding { window: 1024 } })
            })
            .collect();
        let per = vec![1; 62];
        let planned = PlannedContext { max_model_len: 32768, block_size: 16, step_tokens: 512 };
        let at =
            |min_slots| KvGroups::from_packed_layers_at(&kinds, &per, Some(planned), min_slots);
        let shape = |g: &KvGroups| (g.slots_per_block(), g.len(), g.padding_slot_blocks(planned));
        assert_eq!(shape(&at(1)), (2, 31, 0));
        assert_eq!(shape(&at(3)), (5, 13, 3 * 97));
        assert_eq!(shape(&at(6)), (10, 7, 8 * 97));
        // past the most any kind needs (52 sliding slots), the most there is
        assert_eq!(at(1000).slots_per_block(), 52);
        // the bytes a sequence holds, in slot-blocks: 25,524 needed, 1 % is 255
        let held = |g: &KvGroups| {
            g.groups().iter().map(|x| planned.blocks(x.kind) * g.slots_per_block()).sum::<usize>()
        };
        assert_eq!(10 * 2048 + 52 * 97, 25_524);
        assert_eq!(
            (held(&at(1)), held(&at(3)), held(&at(6))),
            (25_524, 25_524 + 291, 25_524 + 776)
        );
        let s13 = KvGroups::with_slots(&kinds.iter().flatten().copied().collect::<Vec<_>>(), 13);
        assert_eq!(held(&s13), 25_524 + 3 * 2048);
    }
}
