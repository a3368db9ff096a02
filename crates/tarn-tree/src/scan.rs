//! Read-only traversals of a committed tree: the birth-pruned walk used by
//! scrub, resilver and incremental send, and the structural checker.

use tarn_block::BlockPtr;

use crate::node::{node_name, read_node, Body};
use crate::{kid_bounds, NodeStore, TreeError};

/// Shape of a committed tree, as measured by [`check`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Entries in all leaves.
    pub entries: u64,
    /// Nodes (blocks) in the tree.
    pub nodes: u64,
    /// Levels from root to leaves; 0 for an empty tree.
    pub depth: u8,
    /// Encoded size of the largest node, so tests can check their split size.
    pub max_node_bytes: usize,
}

/// Callback of [`walk`] for each node pointer it visits.
pub type NodeVisitor<'a> = dyn FnMut(&BlockPtr) -> Result<(), TreeError> + 'a;

/// Callback of [`walk`] for each entry (key, value) of the leaves it visits.
pub type EntryVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), TreeError> + 'a;

/// Walks the committed tree at `root`, independent of any handle. Calls
/// `node` for every node pointer born after `min_birth`, pruning subtrees
/// whose pointer is not (a child is never newer than its parent), and `entry`
/// for every entry of each leaf visited. Scrub passes 0; resilver and
/// incremental send pass the txg they already have.
pub fn walk(
    store: &dyn NodeStore,
    root: &BlockPtr,
    min_birth: u64,
    node: &mut NodeVisitor<'_>,
    entry: &mut EntryVisitor<'_>,
) -> Result<(), TreeError> {
    if root.is_hole() || root.birth <= min_birth {
        return Ok(());
    }
    node(root)?;
    match read_node(store, root)?.body {
        Body::Leaf(leaf) => {
            for (k, v) in leaf.iter() {
                entry(k, v)?;
            }
        }
        Body::Internal(kids) => {
            for kid in &kids {
                walk(store, &kid.slot.ptr, min_birth, node, entry)?;
            }
        }
    }
    Ok(())
}

/// Checks the structural invariants of the committed tree at `root`: node
/// encoding, key order within nodes and against separator bounds, levels
/// (hence uniform leaf depth), births no newer than parents, `fill` counts,
/// non-empty nodes and no single-child root. For tests and debugging; it
/// reads every node.
pub fn check(store: &dyn NodeStore, root: &BlockPtr) -> Result<TreeStats, TreeError> {
    let mut stats = TreeStats::default();
    if root.is_hole() {
        return Ok(stats);
    }
    stats.depth = root
        .level
        .checked_add(1)
        .ok_or_else(|| TreeError::Corrupt(node_name(root), "root level too high".into()))?;
    let entries = check_node(store, root, None, None, true, &mut stats)?;
    if root.fill != entries {
        return Err(TreeError::Corrupt(
            node_name(root),
            format!(
                "root fill {} but the tree holds {entries} entries",
                root.fill
            ),
        ));
    }
    stats.entries = entries;
    Ok(stats)
}

fn check_node(
    store: &dyn NodeStore,
    ptr: &BlockPtr,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
    is_root: bool,
    stats: &mut TreeStats,
) -> Result<u64, TreeError> {
    let bad = |what: String| TreeError::Corrupt(node_name(ptr), what);
    let node = read_node(store, ptr)?;
    stats.nodes += 1;
    stats.max_node_bytes = stats.max_node_bytes.max(node.size);
    let in_bounds = |k: &[u8]| lo.is_none_or(|lo| k >= lo) && hi.is_none_or(|hi| k < hi);
    match &node.body {
        Body::Leaf(leaf) => {
            // Keys are strictly ascending (checked by decoding), so the ends suffice.
            let first = (leaf.len() > 0).then(|| leaf.key(0));
            for k in first.into_iter().chain(leaf.last_key()) {
                if !in_bounds(k) {
                    return Err(bad(format!("key {k:02x?} outside its separator bounds")));
                }
            }
            Ok(leaf.len() as u64)
        }
        Body::Internal(kids) => {
            if is_root && kids.len() < 2 {
                return Err(bad("internal root with a single child".into()));
            }
            let mut total = 0u64;
            for (j, kid) in kids.iter().enumerate() {
                if j > 0 && !in_bounds(&kid.key) {
                    return Err(bad(format!("separator {j} outside the node's bounds")));
                }
                let child = &kid.slot.ptr;
                if child.birth > ptr.birth {
                    return Err(bad(format!(
                        "child {j} born in txg {} after its parent ({})",
                        child.birth, ptr.birth
                    )));
                }
                let (klo, khi) = kid_bounds(kids, j, lo, hi);
                let n = check_node(store, child, klo.as_deref(), khi.as_deref(), false, stats)?;
                if child.fill != n {
                    return Err(bad(format!(
                        "child {j} has fill {} but holds {n} entries",
                        child.fill
                    )));
                }
                total += n;
            }
            Ok(total)
        }
    }
}
