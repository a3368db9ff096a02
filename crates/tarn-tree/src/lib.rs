//! tarn-tree: one generic copy-on-write B+tree over checksummed blocks, with
//! byte-string keys and values. Every structured thing tarn keeps (the meta
//! tree, datasets, directories, extents) is one of these trees.
//!
//! # Node format
//!
//! A node is one block of type `TreeNode`, little-endian, with no padding, at
//! most [`NODE_MAX_BYTES`] long:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | magic `b"TN"` |
//! | 2 | 1 | version, currently 1 |
//! | 3 | 1 | level: 0 for a leaf, a parent is one above its children |
//! | 4 | 4 | count (u32, at least 1): entries of a leaf, children of an internal node |
//! | 8 | … | `count` entries |
//!
//! A leaf entry is `key_len: u16, value_len: u32, key, value`; keys are
//! strictly ascending, at most [`MAX_KEY`] bytes, values at most
//! [`MAX_VALUE`] bytes.
//!
//! An internal entry is `key_len: u16, separator, child: BlockPtr (160 bytes)`.
//! The first entry's separator is empty; the separator of entry `i > 0` is a
//! lower bound of child `i`'s keys and is greater than every key of child
//! `i - 1`; separators are strictly ascending. A separator need not be a
//! stored key: a split stores the shortest prefix of the right half's first
//! key that still sorts after the left half's last key. Every child pointer
//! has type `TreeNode`, the level below its parent, a birth no later than the
//! parent's, and in `fill` the number of entries in its subtree. The root
//! pointer's `fill` is thus the tree's entry count. An empty tree is a hole
//! pointer, never an empty node.
//!
//! # Copy-on-write
//!
//! A committed node is never changed. A handle ([`Tree`]) loads nodes on demand
//! and caches them clean; to modify an entry it copies the whole path from the
//! root to the leaf into memory and marks it dirty (a dirty node always has a
//! dirty parent). Subtrees off that path keep their pointers and are shared
//! with the previous version. Nodes split above [`NODE_MAX_BYTES`] and merge
//! with or borrow from a sibling below a quarter of it. A split leaves the
//! left half full when the new key landed at the end of the node, so
//! ascending inserts (object id ‖ offset) pack nodes instead of half-filling
//! them. Merging is best effort: a sibling that cannot be read is left alone,
//! so occupancy is a goal, not an invariant. A cached leaf keeps its entries
//! in their encoded form, so it costs about its size on disk and decoding is
//! validation plus one copy; [`Tree::evict_clean`] bounds the cache.
//!
//! # Commit order
//!
//! [`Tree::commit`] writes dirty nodes children first, parents after: a
//! parent's pointer to a child holds the child's checksum and birth, which are
//! only known once the child is written. The uberblock's pointer to the root
//! is written last by the pool, so the whole tree is a Merkle tree and the
//! on-disk state is always one complete version.
//!
//! # Birth txgs and pruning
//!
//! A node written in txg `T` has birth `T`, and copy-on-write rewrites every
//! ancestor of a changed node in the same txg, so a child is never newer than
//! its parent. A subtree whose pointer has birth `<= T` is therefore wholly
//! unchanged since `T`: a resilver of a device that missed txgs after `T`,
//! and the scan of a dataset tree whose blocks up to `T` belong to an older
//! snapshot's tree, skip it without reading it ([`walk`]). Incremental
//! send compares two versions and skips what they share ([`diff`]).
//!
//! # Freed nodes
//!
//! Every node of the previous committed version that is not part of the new
//! one is reported to [`NodeStore::free`] exactly once, at commit: a node's
//! pointer is queued the first time the node is dirtied (a second change does
//! not queue it again), and a node created and dropped between two commits
//! never had a pointer to queue. A subtree that a range delete drops whole is
//! queued by its root pointer without being read; commit walks it then,
//! reading only its internal nodes (leaf pointers are in their parents), and
//! reports every node. The store applies the birth-time rule (free now, defer,
//! or put on a deadlist); the tree only reports.
//!
//! # Errors
//!
//! Node bytes come from disk and are validated when decoded: malformed bytes
//! are [`TreeError::Corrupt`], never a panic. Reads happen before any change
//! to the handle, so a failed operation leaves the handle as it was; only
//! rebalancing, which is an optimization, may skip a sibling it cannot read.

#![warn(missing_docs)]

mod diff;
mod leaf;
mod node;
mod scan;
#[cfg(test)]
mod tests;

use std::ops::Bound;

use tarn_block::BlockPtr;

pub use diff::{diff, Change, DiffStats};
use leaf::Leaf;
use node::{child_index, read_node, split_to_fit, Body, Kid, Node, Slot, HEADER_BYTES};
pub use scan::{check, walk, EntryVisitor, NodeVisitor, TreeStats};

/// Largest encoded node; nodes above it are split. 32 KiB keeps a node one
/// compressible I/O while still fitting two entries of the largest size.
pub const NODE_MAX_BYTES: usize = 32 * 1024;

/// Smallest node size [`Tree::with_node_max`] accepts: room for three
/// children with short separators, so trees stay balanced in tests.
pub const NODE_MIN_BYTES: usize = 512;

/// Largest key in bytes; bounded so a separator always fits in a node.
pub const MAX_KEY: usize = 1024;

/// Largest value in bytes; two maximal entries fit in one node, so a split
/// always makes progress. Larger payloads belong in data blocks.
pub const MAX_VALUE: usize = 8192;

/// One key and its value, as [`Tree::range`] returns them.
pub type Entry = (Vec<u8>, Vec<u8>);

/// Where nodes live. The pool implements this over its block pipeline
/// (checksum, copies, allocation); tests implement it in memory.
pub trait NodeStore {
    /// Reads the node block `ptr` references and returns its logical bytes,
    /// verified against the pointer's checksum.
    fn read(&self, ptr: &BlockPtr) -> Result<Vec<u8>, TreeError>;

    /// Writes a node block in the current txg and returns its pointer (birth
    /// is the current txg, type `TreeNode`, `level` as given). The tree sets
    /// `fill` on the returned pointer itself.
    fn write(&mut self, data: Vec<u8>, level: u8) -> Result<BlockPtr, TreeError>;

    /// Reports that `ptr`, a node of the previously committed version, is not
    /// part of the new version. The store frees it now or defers it.
    fn free(&mut self, ptr: &BlockPtr);
}

/// Errors of tree operations.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// A node's bytes or structure are invalid: which node, and what is wrong.
    #[error("tree node {0}: {1}")]
    Corrupt(String, String),
    /// The key is longer than [`MAX_KEY`].
    #[error("key of {0} bytes exceeds the maximum of {MAX_KEY}")]
    KeyTooLarge(usize),
    /// The value is longer than [`MAX_VALUE`].
    #[error("value of {0} bytes exceeds the maximum of {MAX_VALUE}")]
    ValueTooLarge(usize),
    /// The store's own error, kept whole so the caller can downcast it.
    #[error(transparent)]
    Store(Box<dyn std::error::Error + Send + Sync>),
}

/// Bookkeeping shared by the recursive operations of one handle.
struct Ctx {
    node_max: usize,
    /// Old-version nodes replaced or removed since the last commit.
    freed: Vec<BlockPtr>,
    /// Old-version subtrees dropped whole; walked at commit.
    dropped: Vec<BlockPtr>,
}

/// What a parent should check after changing one of its children.
#[derive(Clone, Copy)]
enum Fix<'a> {
    /// Entries were added: split if over size; the key hints at appends.
    Grow(&'a [u8]),
    /// Entries were removed: drop if empty, merge or refill if small, split
    /// if a longer separator made it too big.
    Shrink,
}

/// A handle over a committed tree plus the changes made since: loaded nodes
/// are cached, modified ones are held dirty until [`Tree::commit`].
pub struct Tree {
    root: Slot,
    committed: BlockPtr,
    len: u64,
    ctx: Ctx,
}

impl Default for Tree {
    fn default() -> Self {
        Tree::new()
    }
}

impl std::fmt::Debug for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tree")
            .field("committed", &node::node_name(&self.committed))
            .field("len", &self.len)
            .field("dirty", &self.is_dirty())
            .field("node_max", &self.ctx.node_max)
            .finish()
    }
}

impl Tree {
    /// An empty tree that has never been committed.
    pub fn new() -> Tree {
        Tree::open(BlockPtr::default())
    }

    /// A handle over the committed tree at `root`; a hole is an empty tree.
    /// Nothing is read until an operation needs it.
    pub fn open(root: BlockPtr) -> Tree {
        Tree {
            root: Slot::clean(root),
            committed: root,
            len: if root.is_hole() { 0 } else { root.fill },
            ctx: Ctx {
                node_max: NODE_MAX_BYTES,
                freed: Vec::new(),
                dropped: Vec::new(),
            },
        }
    }

    /// Sets the size above which nodes split, clamped to
    /// [`NODE_MIN_BYTES`]..=[`NODE_MAX_BYTES`]. Small nodes make deep trees
    /// from few entries, which tests need; the format does not record it.
    pub fn with_node_max(mut self, bytes: usize) -> Tree {
        self.ctx.node_max = bytes.clamp(NODE_MIN_BYTES, NODE_MAX_BYTES);
        self
    }

    /// The split threshold in bytes this handle uses.
    pub fn node_max(&self) -> usize {
        self.ctx.node_max
    }

    /// Returns the value stored under `key`.
    pub fn get(&mut self, store: &dyn NodeStore, key: &[u8]) -> Result<Option<Vec<u8>>, TreeError> {
        self.get_with(store, key, <[u8]>::to_vec)
    }

    /// Hands the value stored under `key` to `f` where it lies in its
    /// node, so a caller that decodes it needs no copy of its own.
    pub fn get_with<R>(
        &mut self,
        store: &dyn NodeStore,
        key: &[u8],
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>, TreeError> {
        if self.root.is_vacant() {
            return Ok(None);
        }
        let mut slot = &mut self.root;
        loop {
            let node = slot.load(store)?;
            match &mut node.body {
                Body::Leaf(leaf) => {
                    return Ok(leaf.search(key).ok().map(|i| f(leaf.entry(i).1)));
                }
                Body::Internal(kids) => {
                    let i = child_index(kids, key);
                    match kids.get_mut(i) {
                        Some(kid) => slot = &mut kid.slot,
                        None => return Ok(None),
                    }
                }
            }
        }
    }

    /// [`Tree::get_with`] for many keys, given in ascending order (repeats
    /// allowed; keys out of order are looked up one by one): calls
    /// `f(i, value)` for each `keys[i]` present, in order. A run of keys
    /// in one leaf descends to it once and searches it from where the
    /// previous key was found, where separate lookups would each walk
    /// from the root (a directory listing reads a page of inodes this way).
    pub fn get_sorted_with(
        &mut self,
        store: &dyn NodeStore,
        keys: &[&[u8]],
        f: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), TreeError> {
        if self.root.is_vacant() || keys.is_empty() {
            return Ok(());
        }
        if !keys.is_sorted_by(|a, b| leaf::cmp_keys(a, b).is_le()) {
            // Not what callers promise; answered right all the same.
            for (i, key) in keys.iter().enumerate() {
                self.get_with(store, key, |v| f(i, v))?;
            }
            return Ok(());
        }
        get_sorted_rec(store, &mut self.root, keys, 0, f)
    }

    /// Stores `value` under `key` and returns the value it replaces.
    pub fn insert(
        &mut self,
        store: &dyn NodeStore,
        key: &[u8],
        value: &[u8],
    ) -> Result<Option<Vec<u8>>, TreeError> {
        if key.len() > MAX_KEY {
            return Err(TreeError::KeyTooLarge(key.len()));
        }
        if value.len() > MAX_VALUE {
            return Err(TreeError::ValueTooLarge(value.len()));
        }
        if self.root.is_vacant() {
            let leaf = Node::new(0, Body::Leaf(Leaf::from_entries([(key, value)])));
            self.root = Slot::fresh(leaf);
            self.len = 1;
            return Ok(None);
        }
        let old = insert_rec(&mut self.ctx, store, &mut self.root, key, value)?;
        if old.is_none() {
            self.len = self.len.saturating_add(1);
        }
        self.fix_root(store, Some(key));
        Ok(old)
    }

    /// Removes `key` and returns its value.
    pub fn remove(
        &mut self,
        store: &dyn NodeStore,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, TreeError> {
        if self.root.is_vacant() {
            return Ok(None);
        }
        let old = remove_rec(&mut self.ctx, store, &mut self.root, key)?;
        if old.is_some() {
            self.len = self.len.saturating_sub(1);
            self.fix_root(store, None);
        }
        Ok(old)
    }

    /// Up to `limit` entries with keys inside `start`..`end`, in key order.
    /// It is a cursor: to page, call again with `Bound::Excluded(last key)`.
    pub fn range(
        &mut self,
        store: &dyn NodeStore,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, TreeError> {
        let mut out = Vec::new();
        if limit == 0 || range_is_empty(start, end) || self.root.is_vacant() {
            return Ok(out);
        }
        range_rec(store, &mut self.root, start, end, limit, &mut out)?;
        Ok(out)
    }

    /// Removes every key inside `start`..`end` and returns how many. Only the
    /// two boundary paths are read: subtrees wholly inside the range are
    /// dropped by pointer and their nodes reported at commit.
    pub fn delete_range(
        &mut self,
        store: &dyn NodeStore,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> Result<u64, TreeError> {
        if range_is_empty(start, end) || self.root.is_vacant() {
            return Ok(0);
        }
        if matches!((start, end), (Bound::Unbounded, Bound::Unbounded)) {
            let n = drop_subtree(&mut self.ctx, &mut self.root);
            self.len = 0;
            return Ok(n);
        }
        // Read everything the deletion touches first, so that a read error
        // cannot leave a half-applied deletion behind.
        preload(store, &mut self.root, start, end, None, None)?;
        let n = delete_rec(
            &mut self.ctx,
            store,
            &mut self.root,
            (start, end),
            None,
            None,
        );
        self.len = self.len.saturating_sub(n);
        self.fix_root(store, None);
        Ok(n)
    }

    /// Number of entries, from the committed root's `fill` plus the changes
    /// made since; exact unless the on-disk fill counts are wrong.
    pub fn len_hint(&self) -> u64 {
        self.len
    }

    /// True when there are changes that [`Tree::commit`] would write or report.
    pub fn is_dirty(&self) -> bool {
        self.root.is_dirty()
            || self.root.ptr != self.committed
            || !self.ctx.freed.is_empty()
            || !self.ctx.dropped.is_empty()
    }

    /// Writes dirty nodes bottom-up (children before parents, so a parent's
    /// pointer carries its child's final checksum and birth), reports every
    /// replaced node of the old version to `store.free` exactly once, and
    /// returns the new root (a hole when the tree is empty). If it fails the
    /// pending frees stay queued; retrying in the same txg is safe, otherwise
    /// reopen from the last committed root.
    pub fn commit(&mut self, store: &mut dyn NodeStore) -> Result<BlockPtr, TreeError> {
        write_dirty(store, &mut self.root)?;
        let mut dropped = Vec::new();
        for ptr in &self.ctx.dropped {
            collect_subtree(&*store, ptr, &mut dropped)?;
        }
        for ptr in self.ctx.freed.drain(..).chain(dropped) {
            store.free(&ptr);
        }
        self.ctx.dropped.clear();
        self.committed = self.root.ptr;
        debug_assert!(!self.is_dirty());
        Ok(self.committed)
    }

    /// The last committed root.
    pub fn root(&self) -> BlockPtr {
        self.committed
    }

    /// Drops cached clean nodes to bound memory; dirty nodes stay until
    /// commit. Called by the pool after commit or under memory pressure.
    pub fn evict_clean(&mut self) {
        evict(&mut self.root);
    }

    /// Restores the root invariants after a change: no empty root node, no
    /// internal root with a single child, no oversized root. Collapsing can
    /// surface an untouched subtree whose top is an internal node with one
    /// child (legal below the root), so clean roots are collapsed too, reading
    /// them when needed; a read error only leaves the tree one level taller.
    fn fix_root(&mut self, store: &dyn NodeStore, grow_key: Option<&[u8]>) {
        let max = self.ctx.node_max;
        loop {
            let unread = self.root.node.is_none() && !self.root.ptr.is_hole();
            if unread && self.root.ptr.level > 0 && self.root.load(store).is_err() {
                return;
            }
            let Some(node) = self.root.node.as_deref_mut() else {
                return;
            };
            if let Body::Internal(kids) = &mut node.body {
                if kids.len() == 1 {
                    if !node.dirty && !self.root.ptr.is_hole() {
                        self.ctx.freed.push(self.root.ptr);
                    }
                    if let Some(kid) = kids.pop() {
                        self.root = kid.slot;
                    }
                    continue;
                }
            }
            if !node.dirty {
                return;
            }
            if node.len() == 0 {
                self.root = Slot::default();
                return;
            }
            if !node.needs_split(max) || node.level == u8::MAX {
                return;
            }
            let append = grow_key.is_some_and(|k| node.ends_with(k));
            let level = node.level + 1;
            let Some(old) = self.root.node.take() else {
                return;
            };
            let kids = split_to_fit(*old, max, append)
                .into_iter()
                .map(|(key, n)| Kid {
                    key,
                    slot: Slot::fresh(n),
                })
                .collect();
            self.root = Slot::fresh(Node::new(level, Body::Internal(kids)));
        }
    }

    #[cfg(test)]
    fn loaded_nodes(&self) -> usize {
        fn count(slot: &Slot) -> usize {
            match &slot.node {
                None => 0,
                Some(n) => {
                    1 + match &n.body {
                        Body::Leaf(_) => 0,
                        Body::Internal(kids) => kids.iter().map(|k| count(&k.slot)).sum(),
                    }
                }
            }
        }
        count(&self.root)
    }
}

fn insert_rec(
    ctx: &mut Ctx,
    store: &dyn NodeStore,
    slot: &mut Slot,
    key: &[u8],
    value: &[u8],
) -> Result<Option<Vec<u8>>, TreeError> {
    let node = slot.load(store)?;
    let (old, changed) = match &mut node.body {
        Body::Leaf(leaf) => {
            let old = match leaf.search(key) {
                Ok(i) if leaf.entry(i).1 == value => return Ok(Some(value.to_vec())),
                Ok(i) => Some(leaf.replace_value(i, value)),
                Err(i) => {
                    leaf.insert(i, key, value);
                    None
                }
            };
            node.size = HEADER_BYTES + leaf.bytes().len();
            (old, true)
        }
        Body::Internal(kids) => {
            let i = child_index(kids, key);
            let Some(kid) = kids.get_mut(i) else {
                return Err(TreeError::Corrupt(
                    "<in memory>".into(),
                    "internal node without children".into(),
                ));
            };
            let old = insert_rec(ctx, store, &mut kid.slot, key, value)?;
            let changed = kid.slot.is_dirty();
            if fix_child(ctx, store, kids, i, Fix::Grow(key)) {
                node.recompute_size();
            }
            (old, changed)
        }
    };
    if changed {
        slot.mark_dirty(&mut ctx.freed);
    }
    Ok(old)
}

fn remove_rec(
    ctx: &mut Ctx,
    store: &dyn NodeStore,
    slot: &mut Slot,
    key: &[u8],
) -> Result<Option<Vec<u8>>, TreeError> {
    let node = slot.load(store)?;
    let old = match &mut node.body {
        Body::Leaf(leaf) => match leaf.search(key) {
            Ok(i) => {
                let v = leaf.remove(i);
                node.size = HEADER_BYTES + leaf.bytes().len();
                Some(v)
            }
            Err(_) => None,
        },
        Body::Internal(kids) => {
            let i = child_index(kids, key);
            let Some(kid) = kids.get_mut(i) else {
                return Ok(None);
            };
            let old = remove_rec(ctx, store, &mut kid.slot, key)?;
            if old.is_some() && fix_child(ctx, store, kids, i, Fix::Shrink) {
                node.recompute_size();
            }
            old
        }
    };
    if old.is_some() {
        slot.mark_dirty(&mut ctx.freed);
    }
    Ok(old)
}

/// Repairs child `i` of an internal node after it changed. Returns true when
/// the list of children (and so the parent's size) changed. Never fails: a
/// sibling that cannot be read just means no rebalancing this time.
fn fix_child(
    ctx: &mut Ctx,
    store: &dyn NodeStore,
    kids: &mut Vec<Kid>,
    i: usize,
    fix: Fix,
) -> bool {
    let max = ctx.node_max;
    let Some(node) = kids.get(i).and_then(|k| k.slot.node.as_deref()) else {
        return false;
    };
    if !node.dirty {
        return false;
    }
    if node.len() == 0 {
        remove_kid(kids, i);
        return true;
    }
    if node.needs_split(max) {
        let append = match fix {
            Fix::Grow(key) => node.ends_with(key),
            Fix::Shrink => false,
        };
        if let Some(old) = kids[i].slot.node.take() {
            let mut pieces = split_to_fit(*old, max, append).into_iter();
            if let Some((_, first)) = pieces.next() {
                kids[i].slot.node = Some(Box::new(first));
            }
            let rest = pieces.map(|(key, n)| Kid {
                key,
                slot: Slot::fresh(n),
            });
            kids.splice(i + 1..i + 1, rest);
        }
        return true;
    }
    if matches!(fix, Fix::Shrink) && node.is_underfull(max) {
        return rebalance(ctx, store, kids, i);
    }
    false
}

/// Removes child `i`; the new first child loses its separator.
fn remove_kid(kids: &mut Vec<Kid>, i: usize) {
    kids.remove(i);
    if let Some(first) = kids.first_mut() {
        first.key.clear();
    }
}

/// Merges the small child `i` with a neighbour, or evens the two out when
/// they do not fit in one node.
fn rebalance(ctx: &mut Ctx, store: &dyn NodeStore, kids: &mut Vec<Kid>, i: usize) -> bool {
    let max = ctx.node_max;
    let left = i.checked_sub(1);
    let right = (i + 1 < kids.len()).then_some(i + 1);
    let j = match (left, right) {
        (Some(l), Some(r)) if kids[l].slot.node.is_none() && kids[r].slot.node.is_some() => r,
        (Some(l), _) => l,
        (None, Some(r)) => r,
        (None, None) => return false,
    };
    if kids[j].slot.load(store).is_err() {
        return false;
    }
    let l = i.min(j);
    let same_kind = match (
        kids[l].slot.node.as_deref(),
        kids[l + 1].slot.node.as_deref(),
    ) {
        (Some(a), Some(b)) => a.level == b.level,
        _ => false,
    };
    if !same_kind {
        debug_assert!(false, "siblings not loaded or of different levels");
        return false;
    }
    kids[l].slot.mark_dirty(&mut ctx.freed);
    kids[l + 1].slot.mark_dirty(&mut ctx.freed);
    let right = kids.remove(l + 1);
    let (Some(mut merged), Some(right_node)) = (kids[l].slot.node.take(), right.slot.node) else {
        return true; // unreachable: both were checked loaded above
    };
    if let Err(back) = merged.absorb(right.key.clone(), *right_node) {
        debug_assert!(false, "siblings of different kinds");
        kids[l].slot.node = Some(merged);
        kids.insert(
            l + 1,
            Kid {
                key: right.key,
                slot: Slot::fresh(back),
            },
        );
        return true;
    }
    let mut pieces = split_to_fit(*merged, max, false).into_iter();
    if let Some((_, first)) = pieces.next() {
        kids[l].slot.node = Some(Box::new(first));
    }
    let rest = pieces.map(|(key, n)| Kid {
        key,
        slot: Slot::fresh(n),
    });
    kids.splice(l + 1..l + 1, rest);
    true
}

/// Whether no key can lie in `start..end` (start past the end, or both
/// bounds at one key with one excluded): such a range reads and deletes
/// nothing, where a `BTreeMap` range over it would panic.
pub fn range_is_empty(start: Bound<&[u8]>, end: Bound<&[u8]>) -> bool {
    use Bound::*;
    match (start, end) {
        (Included(s), Included(e)) => s > e,
        (Included(s) | Excluded(s), Included(e) | Excluded(e)) => s >= e,
        _ => false,
    }
}

/// True when `key` is below the range start.
fn before_start(key: &[u8], start: Bound<&[u8]>) -> bool {
    match start {
        Bound::Included(s) => key < s,
        Bound::Excluded(s) => key <= s,
        Bound::Unbounded => false,
    }
}

/// True when `key` is not beyond the range end.
fn within_end(key: &[u8], end: Bound<&[u8]>) -> bool {
    match end {
        Bound::Included(e) => key <= e,
        Bound::Excluded(e) => key < e,
        Bound::Unbounded => true,
    }
}

/// The children of an internal node that can hold keys of the range, as an
/// inclusive index pair.
fn span(kids: &[Kid], start: Bound<&[u8]>, end: Bound<&[u8]>) -> Option<(usize, usize)> {
    let seps = kids.get(1..)?;
    let first = match start {
        Bound::Included(s) | Bound::Excluded(s) => seps.partition_point(|k| k.key.as_slice() <= s),
        Bound::Unbounded => 0,
    };
    let last = match end {
        Bound::Included(e) => seps.partition_point(|k| k.key.as_slice() <= e),
        Bound::Excluded(e) => seps.partition_point(|k| k.key.as_slice() < e),
        Bound::Unbounded => seps.len(),
    };
    (first <= last).then_some((first, last))
}

/// Key bounds of child `j`: `[lo, hi)`, inherited from the parent at the edges.
fn kid_bounds(
    kids: &[Kid],
    j: usize,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let klo = if j == 0 {
        lo.map(<[u8]>::to_vec)
    } else {
        kids.get(j).map(|k| k.key.clone())
    };
    let khi = match kids.get(j + 1) {
        Some(k) => Some(k.key.clone()),
        None => hi.map(<[u8]>::to_vec),
    };
    (klo, khi)
}

/// True when every key a subtree bounded by `[lo, hi)` can hold lies inside
/// the range (conservatively: false when unsure).
fn contained(start: Bound<&[u8]>, end: Bound<&[u8]>, lo: Option<&[u8]>, hi: Option<&[u8]>) -> bool {
    let lo_ok = match start {
        Bound::Unbounded => true,
        Bound::Included(s) => lo.is_some_and(|lo| lo >= s),
        Bound::Excluded(s) => lo.is_some_and(|lo| lo > s),
    };
    let hi_ok = match end {
        Bound::Unbounded => true,
        Bound::Included(e) | Bound::Excluded(e) => hi.is_some_and(|hi| hi <= e),
    };
    lo_ok && hi_ok
}

/// [`Tree::get_sorted_with`] below `slot`: `keys` (ascending) are the ones
/// whose place is in this subtree, `base` the index of the first.
fn get_sorted_rec(
    store: &dyn NodeStore,
    slot: &mut Slot,
    keys: &[&[u8]],
    base: usize,
    f: &mut dyn FnMut(usize, &[u8]),
) -> Result<(), TreeError> {
    let node = slot.load(store)?;
    match &mut node.body {
        Body::Leaf(leaf) => {
            let mut lo = 0;
            for (i, key) in keys.iter().enumerate() {
                match leaf.search_from(lo, key) {
                    Ok(at) => {
                        f(base + i, leaf.entry(at).1);
                        // Not past it: the next key may be the same.
                        lo = at;
                    }
                    Err(at) => lo = at,
                }
            }
        }
        Body::Internal(kids) => {
            let mut from = 0;
            while let Some(first) = keys.get(from) {
                let ci = child_index(kids, first);
                // The keys below the next child's separator stay here.
                let run = match kids.get(ci + 1) {
                    Some(next) => {
                        keys[from..].partition_point(|k| leaf::cmp_keys(k, &next.key).is_lt())
                    }
                    None => keys.len() - from,
                };
                let Some(kid) = kids.get_mut(ci) else {
                    return Ok(());
                };
                get_sorted_rec(
                    store,
                    &mut kid.slot,
                    &keys[from..from + run],
                    base + from,
                    f,
                )?;
                from += run.max(1);
            }
        }
    }
    Ok(())
}

fn range_rec(
    store: &dyn NodeStore,
    slot: &mut Slot,
    start: Bound<&[u8]>,
    end: Bound<&[u8]>,
    limit: usize,
    out: &mut Vec<Entry>,
) -> Result<(), TreeError> {
    let node = slot.load(store)?;
    match &mut node.body {
        Body::Leaf(leaf) => {
            let from = leaf.partition_point(|k| before_start(k, start));
            for (k, v) in leaf.iter().skip(from) {
                if out.len() >= limit || !within_end(k, end) {
                    break;
                }
                out.push((k.to_vec(), v.to_vec()));
            }
        }
        Body::Internal(kids) => {
            let Some((first, last)) = span(kids, start, end) else {
                return Ok(());
            };
            for kid in &mut kids[first..=last] {
                if out.len() >= limit {
                    break;
                }
                range_rec(store, &mut kid.slot, start, end, limit, out)?;
            }
        }
    }
    Ok(())
}

/// Loads every node a range deletion will change: the (at most two) paths
/// to the range's edges, stopping where a subtree lies wholly inside.
fn preload(
    store: &dyn NodeStore,
    slot: &mut Slot,
    start: Bound<&[u8]>,
    end: Bound<&[u8]>,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
) -> Result<(), TreeError> {
    let node = slot.load(store)?;
    if let Body::Internal(kids) = &mut node.body {
        let Some((first, last)) = span(kids, start, end) else {
            return Ok(());
        };
        // Children strictly between the two edges lie wholly inside the range.
        for j in std::iter::once(first).chain((last != first).then_some(last)) {
            let (klo, khi) = kid_bounds(kids, j, lo, hi);
            if !contained(start, end, klo.as_deref(), khi.as_deref()) {
                preload(
                    store,
                    &mut kids[j].slot,
                    start,
                    end,
                    klo.as_deref(),
                    khi.as_deref(),
                )?;
            }
        }
    }
    Ok(())
}

/// Removes the range from a subtree [`preload`] has loaded; returns how many
/// entries went.
fn delete_rec(
    ctx: &mut Ctx,
    store: &dyn NodeStore,
    slot: &mut Slot,
    range: (Bound<&[u8]>, Bound<&[u8]>),
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
) -> u64 {
    let (start, end) = range;
    let Some(node) = slot.node.as_deref_mut() else {
        debug_assert!(false, "range deletion reached an unloaded node");
        return 0;
    };
    let mut count = 0u64;
    let mut changed = false;
    match &mut node.body {
        Body::Leaf(leaf) => {
            let a = leaf.partition_point(|k| before_start(k, start));
            let b = leaf.partition_point(|k| within_end(k, end));
            if a < b {
                leaf.remove_range(a, b);
                node.size = HEADER_BYTES + leaf.bytes().len();
                count = (b - a) as u64;
                changed = true;
            }
        }
        Body::Internal(kids) => {
            let Some((first, last)) = span(kids, start, end) else {
                return 0;
            };
            for j in first..=last {
                let (klo, khi) = kid_bounds(kids, j, lo, hi);
                if contained(start, end, klo.as_deref(), khi.as_deref()) {
                    count = count.saturating_add(drop_subtree(ctx, &mut kids[j].slot));
                    changed = true;
                } else if kids[j].slot.node.is_some() {
                    let n = delete_rec(
                        ctx,
                        store,
                        &mut kids[j].slot,
                        range,
                        klo.as_deref(),
                        khi.as_deref(),
                    );
                    count = count.saturating_add(n);
                    changed |= n > 0;
                }
            }
            if changed {
                let window: Vec<Kid> = kids
                    .drain(first..=last)
                    .filter(|k| !k.slot.is_gone())
                    .collect();
                let survivors = window.len();
                kids.splice(first..first, window);
                if let Some(k) = kids.first_mut() {
                    k.key.clear();
                }
                for idx in (first..first + survivors).rev() {
                    fix_child(ctx, store, kids, idx, Fix::Shrink);
                }
                node.recompute_size();
            }
        }
    }
    if changed {
        slot.mark_dirty(&mut ctx.freed);
    }
    count
}

/// Empties a position and returns how many entries its subtree held. Clean
/// subtrees are queued whole for commit; dirty nodes were queued when they
/// were dirtied, so only their clean descendants are queued here.
fn drop_subtree(ctx: &mut Ctx, slot: &mut Slot) -> u64 {
    let Slot { ptr, node } = std::mem::take(slot);
    match node {
        Some(n) if n.dirty => match n.body {
            Body::Leaf(leaf) => leaf.len() as u64,
            Body::Internal(kids) => kids.into_iter().fold(0u64, |n, mut k| {
                n.saturating_add(drop_subtree(ctx, &mut k.slot))
            }),
        },
        _ if ptr.is_hole() => 0,
        _ => {
            ctx.dropped.push(ptr);
            ptr.fill
        }
    }
}

/// Writes the dirty nodes under `slot`, children first, and sets each
/// written node's pointer (with its subtree's entry count in `fill`).
fn write_dirty(store: &mut dyn NodeStore, slot: &mut Slot) -> Result<(), TreeError> {
    let Some(node) = slot.node.as_deref_mut() else {
        return Ok(());
    };
    if !node.dirty {
        return Ok(());
    }
    let fill = match &mut node.body {
        Body::Leaf(leaf) => leaf.len() as u64,
        Body::Internal(kids) => {
            let mut fill = 0u64;
            for kid in kids.iter_mut() {
                write_dirty(store, &mut kid.slot)?;
                fill = fill.saturating_add(kid.slot.ptr.fill);
            }
            fill
        }
    };
    let mut ptr = store.write(node.encode(), node.level)?;
    debug_assert_eq!(ptr.level, node.level);
    ptr.fill = fill;
    node.dirty = false;
    slot.ptr = ptr;
    Ok(())
}

/// Appends every node pointer of the committed subtree at `ptr`; reads only
/// internal nodes.
fn collect_subtree(
    store: &dyn NodeStore,
    ptr: &BlockPtr,
    out: &mut Vec<BlockPtr>,
) -> Result<(), TreeError> {
    out.push(*ptr);
    if ptr.level == 0 {
        return Ok(());
    }
    if let Body::Internal(kids) = read_node(store, ptr)?.body {
        for kid in &kids {
            collect_subtree(store, &kid.slot.ptr, out)?;
        }
    }
    Ok(())
}

fn evict(slot: &mut Slot) {
    if slot.node.as_ref().is_some_and(|n| !n.dirty) {
        slot.node = None;
        return;
    }
    if let Some(n) = slot.node.as_deref_mut() {
        if let Body::Internal(kids) = &mut n.body {
            for kid in kids {
                evict(&mut kid.slot);
            }
        }
    }
}
