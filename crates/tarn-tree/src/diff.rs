//! The difference between two committed versions of a tree, in key order,
//! reading only what changed: what incremental send streams.
//!
//! # Theory
//!
//! Two versions of a copy-on-write tree share every node neither changed:
//! the same pointer (addresses, birth, checksum) means the same bytes, so
//! the same entries. [`diff`] keeps, for each version, a *frontier*: the
//! entries and subtrees not yet compared, in key order, the next one in
//! front. While the two fronts are the same subtree, both are skipped
//! unread. Otherwise a front subtree is expanded (read and replaced by its
//! children or entries): the one of the higher level, or both at the same
//! level, or the subtree facing an entry. Two front entries are compared
//! by key, which gives an addition, a removal or a change. So what is read
//! is the changed leaves and the paths above them; a node is expanded at
//! most once, and unchanged subtrees between changes are skipped as soon as
//! both frontiers reach them at the same level, which a split or merge
//! delays only until the next level down.
//!
//! Each subtree carries the upper bound of its keys (the next separator),
//! so a diff that resumes *after* a key skips every subtree that lies
//! wholly before it without reading it.

use std::cmp::Ordering;

use tarn_block::BlockPtr;

use crate::node::{read_node, Body};
use crate::{NodeStore, TreeError};

/// One difference between two versions of a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A key only the newer version holds, with its value.
    Added(Vec<u8>, Vec<u8>),
    /// A key both hold with different values: the older, then the newer.
    Changed(Vec<u8>, Vec<u8>, Vec<u8>),
    /// A key only the older version holds, with its value.
    Removed(Vec<u8>, Vec<u8>),
}

impl Change {
    /// The key that changed.
    pub fn key(&self) -> &[u8] {
        match self {
            Change::Added(k, _) | Change::Changed(k, _, _) | Change::Removed(k, _) => k,
        }
    }
}

/// Counts of what a [`diff`] read and skipped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiffStats {
    /// Nodes read (of both versions).
    pub nodes_read: u64,
    /// Subtrees skipped because both versions share them.
    pub shared_skipped: u64,
}

/// A subtree or an entry of one version, not compared yet.
enum Item {
    Sub {
        ptr: BlockPtr,
        /// Keys of the subtree are below `hi` (`None`: unbounded).
        hi: Option<Vec<u8>>,
    },
    Entry(Vec<u8>, Vec<u8>),
}

/// One version's frontier: the last element is the front.
struct Frontier {
    items: Vec<Item>,
}

impl Frontier {
    fn new(root: &BlockPtr) -> Frontier {
        let items = if root.is_hole() {
            Vec::new()
        } else {
            vec![Item::Sub {
                ptr: *root,
                hi: None,
            }]
        };
        Frontier { items }
    }

    /// Replaces the front subtree by its children or entries, dropping
    /// whatever lies wholly at or before `after`.
    fn expand(
        &mut self,
        store: &dyn NodeStore,
        after: Option<&[u8]>,
        stats: &mut DiffStats,
    ) -> Result<(), TreeError> {
        let Some(Item::Sub { ptr, hi, .. }) = self.items.pop() else {
            return Ok(());
        };
        stats.nodes_read += 1;
        let node = read_node(store, &ptr)?;
        let mut next: Vec<Item> = Vec::new();
        match node.body {
            Body::Leaf(leaf) => {
                for (k, v) in leaf.iter() {
                    if after.is_some_and(|a| k <= a) {
                        continue;
                    }
                    next.push(Item::Entry(k.to_vec(), v.to_vec()));
                }
            }
            Body::Internal(kids) => {
                for (i, kid) in kids.iter().enumerate() {
                    let kid_hi = kids
                        .get(i + 1)
                        .map(|n| n.key.clone())
                        .or_else(|| hi.clone());
                    // Every key of the child is below `kid_hi`: wholly
                    // before the resume point.
                    if let (Some(a), Some(h)) = (after, kid_hi.as_deref()) {
                        if h <= a {
                            continue;
                        }
                    }
                    next.push(Item::Sub {
                        ptr: kid.slot.ptr,
                        hi: kid_hi,
                    });
                }
            }
        }
        self.items.extend(next.into_iter().rev());
        Ok(())
    }

    fn front(&self) -> Option<&Item> {
        self.items.last()
    }

    fn pop_entry(&mut self) -> Option<(Vec<u8>, Vec<u8>)> {
        match self.items.pop() {
            Some(Item::Entry(k, v)) => Some((k, v)),
            _ => None,
        }
    }
}

/// Calls `visit` with every difference from the version of the tree at
/// `from` to the one at `to` (either may be a hole: an empty tree), in key
/// order, after the key `after` when it is given (a diff resumed there).
/// `visit` returns false to stop early. Reads only what the two versions
/// do not share (see the module docs).
pub fn diff(
    store: &dyn NodeStore,
    from: &BlockPtr,
    to: &BlockPtr,
    after: Option<&[u8]>,
    visit: &mut dyn FnMut(Change) -> Result<bool, TreeError>,
) -> Result<DiffStats, TreeError> {
    let mut stats = DiffStats::default();
    let mut a = Frontier::new(from);
    let mut b = Frontier::new(to);
    // A bound on the work, so a damaged tree that points in a loop ends.
    let mut steps: u64 = 0;
    loop {
        steps += 1;
        if steps > 1 << 40 {
            return Err(TreeError::Corrupt(
                "<diff>".into(),
                "the trees do not end".into(),
            ));
        }
        let change = match (a.front(), b.front()) {
            (None, None) => return Ok(stats),
            // The same block holds the same entries, wherever its
            // separators put it.
            (Some(Item::Sub { ptr: pa, .. }), Some(Item::Sub { ptr: pb, .. })) if pa == pb => {
                a.items.pop();
                b.items.pop();
                stats.shared_skipped += 1;
                continue;
            }
            (Some(Item::Sub { ptr: pa, .. }), Some(Item::Sub { ptr: pb, .. })) => {
                match pa.level.cmp(&pb.level) {
                    Ordering::Greater => a.expand(store, after, &mut stats)?,
                    Ordering::Less => b.expand(store, after, &mut stats)?,
                    Ordering::Equal => {
                        a.expand(store, after, &mut stats)?;
                        b.expand(store, after, &mut stats)?;
                    }
                }
                continue;
            }
            (Some(Item::Sub { .. }), _) => {
                a.expand(store, after, &mut stats)?;
                continue;
            }
            (_, Some(Item::Sub { .. })) => {
                b.expand(store, after, &mut stats)?;
                continue;
            }
            (Some(Item::Entry(ka, _)), Some(Item::Entry(kb, _))) => match ka.cmp(kb) {
                Ordering::Less => a.pop_entry().map(|(k, v)| Change::Removed(k, v)),
                Ordering::Greater => b.pop_entry().map(|(k, v)| Change::Added(k, v)),
                Ordering::Equal => {
                    let (k, old) = a.pop_entry().unwrap_or_default();
                    let (_, new) = b.pop_entry().unwrap_or_default();
                    (old != new).then_some(Change::Changed(k, old, new))
                }
            },
            (Some(Item::Entry(..)), None) => a.pop_entry().map(|(k, v)| Change::Removed(k, v)),
            (None, Some(Item::Entry(..))) => b.pop_entry().map(|(k, v)| Change::Added(k, v)),
        };
        if let Some(c) = change {
            if !visit(c)? {
                return Ok(stats);
            }
        }
    }
}
