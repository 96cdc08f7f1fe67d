//! [`PrefixCache`]: a radix tree over full KV blocks, keyed by exact token ids, so that sequences
//! that start with the same tokens share the blocks of that start instead of recomputing them.
//!
//! One node per block. A node's key is its block's `block_size` token ids; its parent is the
//! block before it. The path from a namespace's root to a node spells the token prefix whose KV
//! the node's block holds, so a block is reusable exactly by a sequence that begins with the same
//! tokens in the same namespace (a prompt that differs by one token shares nothing after it;
//! tenants in different namespaces share nothing). Only full blocks enter the tree: the partial
//! last block of a sequence is always private.
//!
//! ## KV-cache groups
//!
//! With several groups ([`PrefixCache::with_groups`]) nodes are keyed by the block of the
//! *anchor* group (the first full-attention one) and carry one *companion* per other group: the
//! block of that group at the same index. A full group's companion is always there, locked and
//! evicted with its node. A sliding group's companion may be missing (dropped out of a window
//! before it was cached, or evicted): a cached prefix of `k` blocks is *usable*
//! ([`PrefixCache::usable_len`]) only when, for each sliding group, the nodes the next query's
//! window sees have their companion. A sliding companion of a locked node that only the tree
//! holds (pool ref count 1: every sequence has slid past it) is *loose*: evictable although its
//! node is locked.
//!
//! ## State snapshots
//!
//! A model with recurrent layers ([`PrefixCache::with_state_snapshots`]) keeps a state per
//! sequence that cannot be cut back to a shorter prefix, so a node may also own a *snapshot
//! slot*: the states after its block's last token. A cached prefix is then usable only up to a
//! node holding one; snapshots add no block reference and no lock, are freed with their node,
//! and are evicted on their own, least recently used, when a slot is wanted
//! (`prefix_cache_snapshots.rs`).
//!
//! ## Contract
//!
//! - **References.** The tree holds one pool reference on each cached block (anchors and
//!   companions): [`PrefixCache::insert`] takes it (`incref`), [`PrefixCache::evict`] drops it
//!   (`decref`). Cached blocks are full and never written again; whoever reads one holds its own
//!   reference as well. Whoever changes the ref count of a cached sliding companion tells the
//!   cache ([`PrefixCache::refresh`]).
//! - **Locks.** A running sequence that uses cached blocks locks the path to the deepest one
//!   ([`PrefixCache::lock`]: +1 on that node and every ancestor) and unlocks it when done. Locked
//!   nodes are never evicted (their loose companions may be). Because locks always cover whole
//!   paths, a node's lock count is at least the sum of its children's, so the unlocked nodes are
//!   closed downward: every one of them can be evicted, leaves first, and
//!   [`PrefixCache::num_evictable_blocks`] counts exactly their blocks plus the loose companions.
//! - **LRU.** A logical clock ticks once per [`PrefixCache::match_prefix`] and
//!   [`PrefixCache::insert`], which stamp every node on the path they walk; a parent is therefore
//!   never older than its children. [`PrefixCache::evict`] takes the older of the oldest unlocked
//!   leaf and the oldest loose companion (stamped with its node's last access; ties: lowest
//!   block id); removing a leaf may make its parent an evictable leaf.
//! - **Complexity.** `B` = blocks in the walked prefix, `b` = `block_size`, `g` = groups: match
//!   and insert O(B·(b + g)) + O(B·g·log n) for the LRU indexes; lock and unlock
//!   O(depth · g · log n); evicting `k` blocks O(k log n); [`PrefixCache::check_integrity`]
//!   O(n·(b + g)).
//!
//! The cache never allocates blocks and never decides when to evict: [`super::KvManager`] calls
//! [`PrefixCache::evict`] only when an allocation would otherwise fail.

use std::collections::{BTreeSet, HashMap};

use super::block_pool::{BlockId, BlockPool};
use super::block_table::NULL_BLOCK;
use super::groups::GroupKind;
use super::host_tier::{chain_key, root_key, BlockKey};

/// Isolation key: cached blocks are shared only among sequences of the same namespace (e.g. a
/// tenant). `None` is the default namespace.
pub type Namespace = Option<u64>;

/// Children of a node (or of a namespace root), keyed by the child block's token ids.
type Children = HashMap<Box<[u32]>, BlockId>;

/// Where a node hangs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parent {
    /// Directly under the root of this namespace (the node is the first block of a sequence).
    Root(Namespace),
    /// Under the node of this block.
    Node(BlockId),
}

/// One cached block (of the anchor group) and its companions.
#[derive(Clone, Debug)]
struct Node {
    /// [block_size] the block's token ids: the node's key under its parent.
    tokens: Box<[u32]>,
    parent: Parent,
    children: Children,
    /// The namespace whose root the node hangs under (its tenant).
    namespace: Namespace,
    /// Locked paths through this node; 0 = evictable once its children are gone.
    lock_count: u32,
    /// Clock value of the last match or insert that walked through this node.
    last_access: u64,
    /// [groups] the block of each other group at this node's index; `None` for the anchor, and
    /// for a sliding group whose block is not cached. A full group's is always `Some`.
    companions: Box<[Option<BlockId>]>,
    /// The state snapshot slot after this block's last token (recurrent models,
    /// `prefix_cache_snapshots.rs`).
    snapshot: Option<u32>,
    /// The block's name in every tier: its namespace and tokens from the root
    /// ([`super::host_tier::chain_key`]).
    key: BlockKey,
}

impl Node {
    /// Blocks the node holds: its own and its companions.
    fn num_blocks(&self) -> usize {
        1 + self.companions.iter().flatten().count()
    }
}

/// The radix tree over full blocks; see the module docs for the contract. Nodes are keyed by
/// their block id (a block is in at most one node, as anchor or companion).
#[derive(Clone, Debug)]
pub struct PrefixCache {
    block_size: usize,
    /// [groups] attention kind of each group.
    kinds: Vec<GroupKind>,
    /// The group whose blocks key the nodes: the first full one.
    anchor: usize,
    /// The top-level children of each namespace's root; a namespace without blocks has no entry.
    roots: HashMap<Namespace, Children>,
    nodes: HashMap<BlockId, Node>,
    /// Companion block → (its node, its group).
    owners: HashMap<BlockId, (BlockId, usize)>,
    /// Unlocked leaves as `(last_access, block)`: the eviction order, oldest first.
    evictable_leaves: BTreeSet<(u64, BlockId)>,
    /// Loose companions as `(their node's last_access, block)`: sliding companions of locked
    /// nodes that only the tree holds.
    loose: BTreeSet<(u64, BlockId)>,
    /// Blocks (anchor + companions) of nodes with lock count 0 (all evictable, leaves first).
    num_unlocked: usize,
    /// Per namespace with blocks: (cached blocks, blocks of unlocked nodes). Tenant quotas count
    /// with it.
    per_namespace: HashMap<Namespace, NamespaceCount>,
    clock: u64,
    /// Recurrent models: the state snapshot slots (`prefix_cache_snapshots.rs`); `None` for
    /// models whose layers all attend.
    snapshots: Option<SnapshotSlots>,
    /// With a host tier: the nodes evicted since the manager last took them, as (block, key)
    /// in eviction order (the block is free now, unless a sequence still holds it).
    evicted_log: Option<Vec<(BlockId, BlockKey)>>,
}

/// Blocks of one namespace in the tree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct NamespaceCount {
    cached: usize,
    unlocked: usize,
}

impl PrefixCache {
    /// An empty cache for blocks of `block_size` tokens, one full-attention group. Panics if
    /// `block_size` is 0.
    pub fn new(block_size: usize) -> Self {
        PrefixCache::with_groups(block_size, &[GroupKind::Full])
    }

    /// An empty cache for a model whose groups have the attention `kinds` (one per group, in
    /// table order). Panics if `block_size` is 0 or no group is full (the manager refuses that
    /// with [`super::KvError::PrefixCacheWithSlidingWindow`]).
    pub fn with_groups(block_size: usize, kinds: &[GroupKind]) -> Self {
        assert!(block_size > 0, "block_size must be at least 1");
        let anchor = kinds
            .iter()
            .position(|&k| k == GroupKind::Full)
            .expect("the prefix cache needs a full-attention group");
        PrefixCache {
            block_size,
            kinds: kinds.to_vec(),
            anchor,
            roots: HashMap::new(),
            nodes: HashMap::new(),
            owners: HashMap::new(),
            evictable_leaves: BTreeSet::new(),
            loose: BTreeSet::new(),
            num_unlocked: 0,
            per_namespace: HashMap::new(),
            clock: 0,
            snapshots: None,
            evicted_log: None,
        }
    }

    /// Tokens per block (the length of every key).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Every node's block and key.
    pub(super) fn block_keys(&self) -> Vec<(BlockId, BlockKey)> {
        self.nodes.iter().map(|(&id, n)| (id, n.key)).collect()
    }

    /// Starts logging the nodes evicted, for a host tier.
    pub(super) fn log_evictions(&mut self) {
        self.evicted_log.get_or_insert_with(Vec::new);
    }

    /// The nodes evicted since the last call, in order (empty without
    /// [`Self::log_evictions`]).
    pub(super) fn take_evicted(&mut self) -> Vec<(BlockId, BlockKey)> {
        self.evicted_log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The group whose blocks key the nodes (the first full-attention group).
    pub fn anchor(&self) -> usize {
        self.anchor
    }

    /// Blocks in the tree: nodes and their companions. O(1).
    pub fn num_cached_blocks(&self) -> usize {
        self.nodes.len() + self.owners.len()
    }

    /// Blocks that [`PrefixCache::evict`] could remove now: those of unlocked nodes and the
    /// loose companions. O(1).
    pub fn num_evictable_blocks(&self) -> usize {
        self.num_unlocked + self.loose.len()
    }

    /// Blocks in the tree under `namespace`'s root. O(1).
    pub fn num_cached_blocks_in(&self, namespace: Namespace) -> usize {
        self.per_namespace.get(&namespace).map_or(0, |c| c.cached)
    }

    /// Blocks of `namespace` that [`PrefixCache::evict_in`] could remove now (those of its
    /// unlocked nodes). O(1).
    pub fn num_evictable_blocks_in(&self, namespace: Namespace) -> usize {
        self.per_namespace.get(&namespace).map_or(0, |c| c.unlocked)
    }

    /// Whether `block` keys a node (an anchor block).
    pub fn contains(&self, block: BlockId) -> bool {
        self.nodes.contains_key(&block)
    }

    /// Whether the tree holds `block`, as a node's block or as a companion. O(1).
    pub fn holds(&self, block: BlockId) -> bool {
        self.contains(block) || self.owners.contains_key(&block)
    }

    /// Locked paths through `block`'s node, or `None` if it is not cached.
    pub fn lock_count(&self, block: BlockId) -> Option<u32> {
        self.nodes.get(&block).map(|node| node.lock_count)
    }

    /// The cached blocks that hold the longest prefix of `tokens`, in whole blocks (a trailing
    /// partial block of `tokens` is ignored), without touching anything. O(B·b). With sliding
    /// groups the usable part may be shorter ([`PrefixCache::usable_len`]).
    pub fn peek(&self, namespace: Namespace, tokens: &[u32]) -> Vec<BlockId> {
        let mut blocks = Vec::new();
        let mut children = self.roots.get(&namespace);
        for key in tokens.chunks_exact(self.block_size) {
            let Some(&id) = children.and_then(|c| c.get(key)) else { break };
            blocks.push(id);
            children = Some(&self.nodes[&id].children);
        }
        blocks
    }

    /// Like [`PrefixCache::peek`] cut to its usable length ([`PrefixCache::usable_len`]), and
    /// stamps that path as most recently used (the clock ticks even when nothing matches). The
    /// caller takes its own references on the returned blocks (and the companions it reads) and
    /// locks the last one before anything can evict them.
    pub fn match_prefix(&mut self, namespace: Namespace, tokens: &[u32]) -> Vec<BlockId> {
        let mut blocks = self.peek(namespace, tokens);
        blocks.truncate(self.usable_len(&blocks));
        self.clock += 1;
        if let Some(&last) = blocks.last() {
            self.touch_path(last);
        }
        blocks
    }

    /// Caches the full blocks of a sequence of a one-group cache: `blocks[i]` holds the KV of
    /// `tokens[i·b..(i+1)·b]` (after the tokens before it); see [`PrefixCache::insert_groups`].
    ///
    /// Panics if the cache has several groups, and like [`PrefixCache::insert_groups`].
    pub fn insert(
        &mut self,
        pool: &mut BlockPool,
        namespace: Namespace,
        tokens: &[u32],
        blocks: &[BlockId],
    ) -> Option<BlockId> {
        assert_eq!(self.kinds.len(), 1, "a cache of several groups inserts with insert_groups");
        self.insert_groups(pool, namespace, tokens, &[blocks])
    }

    /// Caches the full blocks of a sequence: `tables[g][i]` is group `g`'s block holding the KV
    /// of `tokens[i·b..(i+1)·b]` ([`NULL_BLOCK`] where a sliding table dropped it), for `i` below
    /// the anchor table's length. Walks the path of `tokens` from the namespace root; where a
    /// node already exists it is kept (if it holds other blocks, the caller's stay private to
    /// the caller, who should switch to the cached ones), except that a missing sliding
    /// companion is taken from the caller's live block (the tree takes a reference); else a
    /// node is made for the anchor block with the other groups' blocks as companions, and the
    /// tree takes a reference on each. Stamps the whole path as most recently used. Returns the
    /// block of the path's last node (what the caller locks), `None` if no block is given.
    ///
    /// Panics if `tokens` is shorter than the anchor's blocks, if a table is shorter than the
    /// anchor's, if a full group's block is [`NULL_BLOCK`], if a new block is free in `pool` (the
    /// caller must hold it), or if it is already cached elsewhere.
    pub fn insert_groups(
        &mut self,
        pool: &mut BlockPool,
        namespace: Namespace,
        tokens: &[u32],
        tables: &[&[BlockId]],
    ) -> Option<BlockId> {
        let b = self.block_size;
        assert_eq!(tables.len(), self.kinds.len(), "one table per group");
        let blocks = tables[self.anchor];
        assert!(
            tokens.len() >= blocks.len() * b,
            "insert of {} blocks needs {} tokens, got {}",
            blocks.len(),
            blocks.len() * b,
            tokens.len()
        );
        assert!(tables.iter().all(|t| t.len() >= blocks.len()), "a table shorter than the anchor");
        self.clock += 1;
        let mut parent = Parent::Root(namespace);
        for (i, (&block, key)) in blocks.iter().zip(tokens.chunks_exact(b)).enumerate() {
            let existing = match parent {
                Parent::Root(ns) => self.roots.get(&ns).and_then(|c| c.get(key)),
                Parent::Node(p) => self.nodes[&p].children.get(key),
            };
            let id = match existing {
                Some(&id) => {
                    for (g, table) in tables.iter().enumerate() {
                        let live = table[i];
                        if g != self.anchor
                            && live != NULL_BLOCK
                            && self.nodes[&id].companions[g].is_none()
                        {
                            self.add_companion(pool, id, g, live);
                        }
                    }
                    id
                }
                None => {
                    let companions: Vec<Option<BlockId>> = (0..self.kinds.len())
                        .map(|g| {
                            let live = tables[g][i];
                            assert!(
                                live != NULL_BLOCK || self.kinds[g] != GroupKind::Full,
                                "group {g} is full but its block {i} is dropped"
                            );
                            (g != self.anchor && live != NULL_BLOCK).then_some(live)
                        })
                        .collect();
                    self.add_node(pool, parent, key, block, &companions);
                    block
                }
            };
            parent = Parent::Node(id);
        }
        let Parent::Node(last) = parent else { return None };
        self.touch_path(last);
        Some(last)
    }

    /// Locks the path from the root to `block`'s node (+1 on each node): none of them can be
    /// evicted until a matching [`PrefixCache::unlock`]. O(depth · log n).
    ///
    /// Panics if `block` is not cached (take the lock right after match or insert), or if the
    /// cache has sliding groups (use [`PrefixCache::lock_in`]).
    #[track_caller]
    pub fn lock(&mut self, block: BlockId) {
        assert!(
            self.kinds.iter().all(|&k| k == GroupKind::Full),
            "a cache with sliding groups locks with lock_in"
        );
        self.lock_path(None, block);
    }

    /// Like [`PrefixCache::lock`], for any groups: a node that becomes locked moves its sliding
    /// companions that only the tree holds (ref count 1 in `pool`) to the loose set.
    /// O(depth · g · log n). Panics if `block` is not cached.
    #[track_caller]
    pub fn lock_in(&mut self, pool: &BlockPool, block: BlockId) {
        self.lock_path(Some(pool), block);
    }

    #[track_caller]
    fn lock_path(&mut self, pool: Option<&BlockPool>, block: BlockId) {
        assert!(self.contains(block), "lock of block {block}, which is not cached");
        for id in self.path(block) {
            self.unindex(id);
            let node = self.nodes.get_mut(&id).expect("path node");
            node.lock_count += 1;
            if node.lock_count == 1 {
                let (ns, blocks, last_access) =
                    (node.namespace, node.num_blocks(), node.last_access);
                self.num_unlocked -= blocks;
                self.count_mut(ns).unlocked -= blocks;
                for c in self.sliding_companions(id) {
                    let pool = pool.expect("sliding companions need the pool");
                    if pool.ref_count(c) == 1 {
                        self.loose.insert((last_access, c));
                    }
                }
            }
        }
    }

    /// Undoes one [`PrefixCache::lock`] of the path to `block`. Nodes whose count drops to 0
    /// become evictable (leaves first), with all their companions. O(depth · g · log n).
    ///
    /// Panics if `block` is not cached or a node on its path is not locked (unbalanced unlock).
    #[track_caller]
    pub fn unlock(&mut self, block: BlockId) {
        assert!(self.contains(block), "unlock of block {block}, which is not cached");
        for id in self.path(block) {
            let node = self.nodes.get_mut(&id).expect("path node");
            assert!(node.lock_count > 0, "unlock of block {id}, which is not locked");
            node.lock_count -= 1;
            if node.lock_count == 0 {
                let (ns, blocks, last_access) =
                    (node.namespace, node.num_blocks(), node.last_access);
                self.num_unlocked += blocks;
                self.count_mut(ns).unlocked += blocks;
                for c in self.sliding_companions(id) {
                    self.loose.remove(&(last_access, c));
                }
                self.index(id);
            }
        }
    }

    /// Evicts at least `num_blocks` blocks if it can, least recently used first: each time the
    /// older of the oldest loose companion (dropped from its node) and the oldest unlocked leaf
    /// (removed with all its companions; a parent whose last child goes becomes a leaf in
    /// turn), dropping the tree's reference on each. Returns the evicted blocks in order; fewer
    /// than asked when nothing evictable is left, possibly more (a node's companions go with
    /// it). A block returns to the free list unless someone else still holds it. O(k log n).
    pub fn evict(&mut self, pool: &mut BlockPool, num_blocks: usize) -> Vec<BlockId> {
        let mut evicted = Vec::new();
        while evicted.len() < num_blocks {
            let leaf = self.evictable_leaves.first().copied();
            let loose = self.loose.first().copied();
            match (leaf, loose) {
                (None, None) => break,
                (Some(leaf), Some(loose)) if loose < leaf => {
                    self.evict_loose(pool, loose, &mut evicted)
                }
                (None, Some(loose)) => self.evict_loose(pool, loose, &mut evicted),
                (Some((_, id)), _) => self.remove_leaf(pool, id, &mut evicted),
            }
        }
        evicted
    }

    /// Like [`PrefixCache::evict`], restricted to the unlocked leaves of `namespace` (a tenant
    /// over its KV quota gives up its own cached blocks first; loose companions are not taken).
    /// O(k × n) in the worst case: each eviction scans the LRU index for the namespace's oldest
    /// leaf.
    pub fn evict_in(
        &mut self,
        pool: &mut BlockPool,
        namespace: Namespace,
        num_blocks: usize,
    ) -> Vec<BlockId> {
        let mut evicted = Vec::new();
        while evicted.len() < num_blocks {
            let oldest = self
                .evictable_leaves
                .iter()
                .map(|&(_, id)| id)
                .find(|id| self.nodes[id].namespace == namespace);
            let Some(id) = oldest else { break };
            self.remove_leaf(pool, id, &mut evicted);
        }
        evicted
    }

    /// The blocks from the namespace root down to `block`, in token order (its cached prefix).
    /// Panics if `block` is not cached. O(depth).
    pub fn path(&self, block: BlockId) -> Vec<BlockId> {
        let mut path = vec![block];
        while let Parent::Node(parent) = self.nodes[path.last().expect("non-empty")].parent {
            path.push(parent);
        }
        path.reverse();
        path
    }

    /// Checks every invariant: keys have `block_size` tokens; parent and child links agree and
    /// every node is reachable from a root exactly once (so no cycles, no block in two nodes);
    /// the pool counts the tree's reference on each block; a node's lock count is at least the
    /// sum of its children's; a parent is never older than its children and no stamp is in the
    /// future; the LRU index holds exactly the unlocked leaves and `num_unlocked` is right;
    /// companions: one slot per group, none for the anchor, always one for a full group, each
    /// block in one place only and in the reverse map, and the loose set exactly the sliding
    /// companions of locked nodes with pool ref count 1. O(n·(b + g)). The message names the
    /// first violation.
    pub fn check_integrity(&self, pool: &BlockPool) -> Result<(), String> {
        let mut reached = 0;
        let mut stack: Vec<(Parent, &Children)> = Vec::new();
        for (ns, children) in &self.roots {
            if children.is_empty() {
                return Err(format!("namespace {ns:?} has an empty root"));
            }
            stack.push((Parent::Root(*ns), children));
        }
        while let Some((parent, children)) = stack.pop() {
            for (key, &id) in children {
                let node = self.nodes.get(&id).ok_or(format!("child {id} has no node"))?;
                if node.parent != parent || node.tokens != *key {
                    return Err(format!(
                        "block {id}: parent link or key disagrees with its parent"
                    ));
                }
                reached += 1;
                if reached > self.nodes.len() {
                    return Err("a block is reachable twice (cycle or shared child)".into());
                }
                stack.push((Parent::Node(id), &node.children));
            }
        }
        if reached != self.nodes.len() {
            return Err(format!("{} nodes, {reached} reachable from a root", self.nodes.len()));
        }
        for (&id, node) in &self.nodes {
            self.check_node(pool, id, node)?;
            self.check_companions(pool, id, node)?;
        }
        let unlocked: usize =
            self.nodes.values().filter(|n| n.lock_count == 0).map(Node::num_blocks).sum();
        if unlocked != self.num_unlocked {
            return Err(format!(
                "{unlocked} blocks of unlocked nodes, counted {}",
                self.num_unlocked
            ));
        }
        let mut per_namespace: HashMap<Namespace, NamespaceCount> = HashMap::new();
        for node in self.nodes.values() {
            let count = per_namespace.entry(node.namespace).or_default();
            count.cached += node.num_blocks();
            if node.lock_count == 0 {
                count.unlocked += node.num_blocks();
            }
        }
        if per_namespace != self.per_namespace {
            return Err(format!(
                "per-namespace counts {:?}, counted {:?}",
                per_namespace, self.per_namespace
            ));
        }
        let leaves: BTreeSet<(u64, BlockId)> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.lock_count == 0 && n.children.is_empty())
            .map(|(&id, n)| (n.last_access, id))
            .collect();
        if leaves != self.evictable_leaves {
            return Err("the LRU index is not the set of unlocked leaves".into());
        }
        self.check_companion_index(pool)?;
        self.check_snapshots()?;
        Ok(())
    }

    /// The per-node part of [`PrefixCache::check_integrity`].
    fn check_node(&self, pool: &BlockPool, id: BlockId, node: &Node) -> Result<(), String> {
        if node.tokens.len() != self.block_size {
            return Err(format!("block {id}: key of {} tokens", node.tokens.len()));
        }
        if (id as usize) >= pool.num_blocks() || pool.ref_count(id) == 0 {
            return Err(format!("cached block {id} is out of range or free in the pool"));
        }
        let parent_ns = match node.parent {
            Parent::Root(ns) => ns,
            Parent::Node(p) => self.nodes[&p].namespace,
        };
        if node.namespace != parent_ns {
            return Err(format!(
                "block {id} is in namespace {:?}, its parent in {parent_ns:?}",
                node.namespace
            ));
        }
        if node.last_access > self.clock {
            return Err(format!("block {id}: stamp {} after the clock", node.last_access));
        }
        let mut child_locks = 0;
        for &child in node.children.values() {
            let child = &self.nodes[&child];
            child_locks += child.lock_count;
            if child.last_access > node.last_access {
                return Err(format!("block {id} is older than one of its children"));
            }
        }
        if node.lock_count < child_locks {
            let count = node.lock_count;
            return Err(format!("block {id}: lock count {count} < its children's {child_locks}"));
        }
        Ok(())
    }

    /// Makes a node for `block` under `parent` with key `key` and `companions` (one per group),
    /// taking the tree's reference on each block.
    fn add_node(
        &mut self,
        pool: &mut BlockPool,
        parent: Parent,
        key: &[u32],
        block: BlockId,
        companions: &[Option<BlockId>],
    ) {
        assert!(!self.holds(block), "block {block} is already cached under another prefix");
        pool.incref(block);
        let (children, namespace) = match parent {
            Parent::Root(ns) => (self.roots.entry(ns).or_default(), ns),
            Parent::Node(p) => {
                self.unindex(p); // no longer a leaf
                let parent = self.nodes.get_mut(&p).expect("parent node");
                (&mut parent.children, parent.namespace)
            }
        };
        children.insert(key.into(), block);
        let chain = match parent {
            Parent::Root(ns) => chain_key(&root_key(ns), key),
            Parent::Node(p) => chain_key(&self.nodes[&p].key, key),
        };
        let node = Node {
            tokens: key.into(),
            parent,
            namespace,
            children: HashMap::new(),
            lock_count: 0,
            last_access: self.clock,
            companions: vec![None; self.kinds.len()].into(),
            snapshot: None,
            key: chain,
        };
        self.nodes.insert(block, node);
        self.num_unlocked += 1;
        let count = self.count_mut(namespace);
        count.cached += 1;
        count.unlocked += 1;
        self.index(block);
        for (g, c) in companions.iter().enumerate() {
            if let Some(c) = *c {
                self.add_companion(pool, block, g, c);
            }
        }
    }

    /// Removes an unlocked leaf and its companions from the tree, dropping the tree's reference
    /// on each (companions first); appends them to `out`.
    fn remove_leaf(&mut self, pool: &mut BlockPool, id: BlockId, out: &mut Vec<BlockId>) {
        self.unindex(id);
        let node = self.nodes.remove(&id).expect("leaf node");
        debug_assert!(node.children.is_empty() && node.lock_count == 0);
        let blocks = node.num_blocks();
        self.num_unlocked -= blocks;
        let count = self.count_mut(node.namespace);
        count.cached -= blocks;
        count.unlocked -= blocks;
        if count.cached == 0 {
            self.per_namespace.remove(&node.namespace);
        }
        match node.parent {
            Parent::Root(ns) => {
                let children = self.roots.get_mut(&ns).expect("root");
                children.remove(&node.tokens);
                if children.is_empty() {
                    self.roots.remove(&ns);
                }
            }
            Parent::Node(p) => {
                self.nodes.get_mut(&p).expect("parent node").children.remove(&node.tokens);
                self.index(p); // may have become a leaf
            }
        }
        for &c in node.companions.iter().flatten() {
            self.owners.remove(&c);
            pool.decref(c);
            out.push(c);
        }
        self.free_snapshot_of_removed(node.snapshot);
        if let Some(log) = &mut self.evicted_log {
            log.push((id, node.key));
        }
        pool.decref(id);
        out.push(id);
    }

    /// The counts of `namespace` (created empty if it has none yet).
    fn count_mut(&mut self, namespace: Namespace) -> &mut NamespaceCount {
        self.per_namespace.entry(namespace).or_default()
    }

    /// Stamps `block` and its ancestors with the current clock (loose companions move along).
    fn touch_path(&mut self, block: BlockId) {
        for id in self.path(block) {
            self.unindex(id);
            let old = self.nodes[&id].last_access;
            let moved: Vec<BlockId> = self
                .sliding_companions(id)
                .into_iter()
                .filter(|&c| self.loose.remove(&(old, c)))
                .collect();
            self.nodes.get_mut(&id).expect("path node").last_access = self.clock;
            for c in moved {
                self.loose.insert((self.clock, c));
            }
            self.index(id);
        }
    }

    /// Takes `id` out of the LRU index (a no-op if it is not there).
    fn unindex(&mut self, id: BlockId) {
        let last_access = self.nodes[&id].last_access;
        self.evictable_leaves.remove(&(last_access, id));
    }

    /// Puts `id` in the LRU index if it is an unlocked leaf.
    fn index(&mut self, id: BlockId) {
        let node = &self.nodes[&id];
        if node.lock_count == 0 && node.children.is_empty() {
            self.evictable_leaves.insert((node.last_access, id));
        }
    }

    /// Every cached prefix: `(namespace, tokens from the root) → (block, lock count, last
    /// access)`. For the property tests' comparison with a naive model. O(n · depth · b).
    #[cfg(test)]
    pub(super) fn entries(
        &self,
    ) -> std::collections::BTreeMap<(Namespace, Vec<u32>), (BlockId, u32, u64)> {
        let mut out = std::collections::BTreeMap::new();
        for (&id, node) in &self.nodes {
            let path = self.path(id);
            let tokens: Vec<u32> =
                path.iter().flat_map(|p| self.nodes[p].tokens.iter().copied()).collect();
            let mut root = id;
            while let Parent::Node(p) = self.nodes[&root].parent {
                root = p;
            }
            let Parent::Root(ns) = self.nodes[&root].parent else { unreachable!() };
            out.insert((ns, tokens), (id, node.lock_count, node.last_access));
        }
        out
    }
}

#[path = "prefix_cache_companions.rs"]
mod companions;
#[path = "prefix_cache_snapshots.rs"]
mod snapshots;
use snapshots::SnapshotSlots;

#[cfg(test)]
#[path = "prefix_cache_group_tests.rs"]
mod group_tests;

#[cfg(test)]
#[path = "prefix_cache_tests.rs"]
mod tests;
