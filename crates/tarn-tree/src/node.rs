//! Tree nodes in memory and their on-disk encoding (see the crate docs for the
//! byte layout).

use tarn_block::{BlockPtr, BlockType, BLOCK_PTR_SIZE};

use crate::leaf::Leaf;
use crate::{TreeError, MAX_KEY, NODE_MAX_BYTES};

/// The two magic bytes that open every node.
pub(crate) const MAGIC: [u8; 2] = *b"TN";
/// Version of the node encoding.
pub(crate) const VERSION: u8 = 1;
/// Magic, version, level and entry count.
pub(crate) const HEADER_BYTES: usize = 8;
/// Key length (u16) and child pointer of an internal entry.
const INTERNAL_ENTRY_OVERHEAD: usize = 2 + BLOCK_PTR_SIZE;

/// Encoded size of one internal entry.
fn internal_entry_size(key: &[u8]) -> usize {
    INTERNAL_ENTRY_OVERHEAD + key.len()
}

/// A short human name for a node, used in error messages.
pub(crate) fn node_name(ptr: &BlockPtr) -> String {
    match ptr.used_dvas().next() {
        Some(d) => format!(
            "{}:{:#x} (birth {}, level {})",
            d.vdev, d.offset, ptr.birth, ptr.level
        ),
        None if ptr.is_hole() => "<hole>".to_string(),
        None => format!("<no address> (birth {}, level {})", ptr.birth, ptr.level),
    }
}

/// A position in the tree: the committed pointer, plus the node itself once
/// it has been loaded (clean) or modified (dirty).
///
/// `ptr` is meaningful while the node is absent or clean. When the node
/// becomes dirty its pointer has been queued for freeing and `ptr` is a hole
/// until the node is written again.
#[derive(Default)]
pub(crate) struct Slot {
    pub ptr: BlockPtr,
    pub node: Option<Box<Node>>,
}

/// A child of an internal node with its separator. The separator is the
/// lower bound of the child's keys; the first child's separator is empty.
pub(crate) struct Kid {
    pub key: Vec<u8>,
    pub slot: Slot,
}

/// Contents of a node.
pub(crate) enum Body {
    /// Sorted, unique (key, value) pairs.
    Leaf(Leaf),
    /// Children in key order.
    Internal(Vec<Kid>),
}

/// A decoded node.
pub(crate) struct Node {
    pub level: u8,
    pub dirty: bool,
    /// Exact encoded size in bytes, kept current by every mutation.
    pub size: usize,
    pub body: Body,
}

impl Slot {
    /// A position holding the committed node `ptr` (or nothing for a hole).
    pub fn clean(ptr: BlockPtr) -> Slot {
        Slot { ptr, node: None }
    }

    /// A position holding a node that exists only in memory.
    pub fn fresh(node: Node) -> Slot {
        debug_assert!(node.dirty);
        Slot {
            ptr: BlockPtr::default(),
            node: Some(Box::new(node)),
        }
    }

    /// True when the position holds no node at all.
    pub fn is_vacant(&self) -> bool {
        self.node.is_none() && self.ptr.is_hole()
    }

    /// True when the position is vacant or holds a node without entries; such
    /// positions are removed from their parent.
    pub fn is_gone(&self) -> bool {
        match &self.node {
            Some(n) => n.len() == 0,
            None => self.ptr.is_hole(),
        }
    }

    pub fn is_dirty(&self) -> bool {
        self.node.as_ref().is_some_and(|n| n.dirty)
    }

    /// Returns the node, reading and decoding it first if needed.
    pub fn load(&mut self, store: &dyn crate::NodeStore) -> Result<&mut Node, TreeError> {
        let node = match self.node.take() {
            Some(n) => n,
            None => Box::new(read_node(store, &self.ptr)?),
        };
        Ok(self.node.insert(node))
    }

    /// Marks a loaded node as modified. The first time, its committed
    /// pointer joins the list of old-version nodes to report at commit.
    pub fn mark_dirty(&mut self, freed: &mut Vec<BlockPtr>) {
        if let Some(n) = self.node.as_deref_mut() {
            if !n.dirty {
                n.dirty = true;
                if !self.ptr.is_hole() {
                    freed.push(self.ptr);
                }
                self.ptr = BlockPtr::default();
            }
        }
    }
}

impl Node {
    /// A dirty node with the given body; its size is computed.
    pub fn new(level: u8, body: Body) -> Node {
        let mut n = Node {
            level,
            dirty: true,
            size: 0,
            body,
        };
        n.recompute_size();
        n
    }

    /// Number of entries (leaf) or children (internal).
    pub fn len(&self) -> usize {
        match &self.body {
            Body::Leaf(leaf) => leaf.len(),
            Body::Internal(kids) => kids.len(),
        }
    }

    pub fn recompute_size(&mut self) {
        self.size = HEADER_BYTES
            + match &self.body {
                Body::Leaf(leaf) => leaf.bytes().len(),
                Body::Internal(kids) => kids.iter().map(|k| internal_entry_size(&k.key)).sum(),
            };
    }

    fn entry_size(&self, i: usize) -> usize {
        match &self.body {
            Body::Leaf(leaf) if i < leaf.len() => leaf.entry_size(i),
            Body::Leaf(_) => 0,
            Body::Internal(kids) => kids.get(i).map_or(0, |k| internal_entry_size(&k.key)),
        }
    }

    /// True when the node is over `max` bytes and can be split. A leaf needs
    /// two entries; an internal node needs three children, so that splitting
    /// a root always yields a new root that fits and growth terminates even
    /// with tiny test node sizes.
    pub fn needs_split(&self, max: usize) -> bool {
        let min = match self.body {
            Body::Leaf(_) => 2,
            Body::Internal(_) => 3,
        };
        self.size > max && self.len() >= min
    }

    /// True when the node should be merged with or refilled from a sibling.
    pub fn is_underfull(&self, max: usize) -> bool {
        self.size < max / 4 || matches!(&self.body, Body::Internal(k) if k.len() < 2)
    }

    /// True when `key` falls into the node's last entry: a hint that keys
    /// arrive in ascending order, so a split should leave the left part full.
    pub fn ends_with(&self, key: &[u8]) -> bool {
        match &self.body {
            Body::Leaf(leaf) => leaf.last_key() == Some(key),
            Body::Internal(kids) => kids.len() > 1 && child_index(kids, key) == kids.len() - 1,
        }
    }

    /// Splits off a right part and returns it with its separator. With
    /// `append`, the left part keeps everything but the last entry when that
    /// fits; otherwise the bytes are halved. Needs two entries (leaf) or
    /// children (internal).
    fn split_once(&mut self, max: usize, append: bool) -> (Vec<u8>, Node) {
        let n = self.len();
        debug_assert!(n >= 2);
        let last = self.entry_size(n.saturating_sub(1));
        let at = if append && self.size - last <= max {
            n - 1
        } else {
            let half = self.size / 2;
            let mut acc = HEADER_BYTES;
            let mut at = n - 1;
            for i in 0..n {
                acc += self.entry_size(i);
                if acc >= half {
                    at = i + 1;
                    break;
                }
            }
            at.clamp(1, n - 1)
        };
        let (sep, body) = match &mut self.body {
            Body::Leaf(leaf) => {
                let right = leaf.split_off(at);
                let sep = match (leaf.last_key(), right.len()) {
                    (Some(a), 1..) => shortest_separator(a, right.key(0)),
                    _ => Vec::new(),
                };
                (sep, Body::Leaf(right))
            }
            Body::Internal(kids) => {
                let mut right = kids.split_off(at);
                let sep = right
                    .first_mut()
                    .map(|k| std::mem::take(&mut k.key))
                    .unwrap_or_default();
                (sep, Body::Internal(right))
            }
        };
        self.recompute_size();
        (sep, Node::new(self.level, body))
    }

    /// Appends `right` (the next sibling, separated by `sep`) to this node.
    /// Gives `right` back if the two are not the same kind of node.
    pub fn absorb(&mut self, sep: Vec<u8>, right: Node) -> Result<(), Node> {
        match (&mut self.body, right.body) {
            (Body::Leaf(a), Body::Leaf(b)) => a.append(b),
            (Body::Internal(a), Body::Internal(mut b)) => {
                if let Some(first) = b.first_mut() {
                    first.key = sep;
                }
                a.extend(b);
            }
            (_, body) => return Err(Node { body, ..right }),
        }
        self.recompute_size();
        Ok(())
    }

    /// Encodes the node. Every child must already carry its final pointer.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size);
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(self.level);
        out.extend_from_slice(&(self.len() as u32).to_le_bytes());
        match &self.body {
            Body::Leaf(leaf) => out.extend_from_slice(leaf.bytes()),
            Body::Internal(kids) => {
                for kid in kids {
                    debug_assert!(!kid.slot.is_dirty() && !kid.slot.ptr.is_hole());
                    out.extend_from_slice(&(kid.key.len() as u16).to_le_bytes());
                    out.extend_from_slice(&kid.key);
                    out.extend_from_slice(&kid.slot.ptr.encode());
                }
            }
        }
        debug_assert_eq!(out.len(), self.size);
        out
    }
}

/// Splits `node` until every piece fits `max` (or cannot be split further).
/// Returns the pieces in key order with their separators; the first
/// separator is empty.
pub(crate) fn split_to_fit(node: Node, max: usize, append: bool) -> Vec<(Vec<u8>, Node)> {
    let mut out = vec![(Vec::new(), node)];
    let mut append = append;
    let mut j = 0;
    while j < out.len() {
        if out[j].1.needs_split(max) {
            let last = j + 1 == out.len();
            let piece = out[j].1.split_once(max, append && last);
            append = false;
            out.insert(j + 1, piece);
        } else {
            j += 1;
        }
    }
    out
}

/// The shortest key `s` with `a < s <= b`, given `a < b`: keeps internal
/// nodes small when keys share long prefixes.
fn shortest_separator(a: &[u8], b: &[u8]) -> Vec<u8> {
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    b.get(..=common).unwrap_or(b).to_vec()
}

/// Index of the child whose key range holds `key`.
pub(crate) fn child_index(kids: &[Kid], key: &[u8]) -> usize {
    kids.get(1..).map_or(0, |seps| {
        seps.partition_point(|k| crate::leaf::cmp_keys(&k.key, key).is_le())
    })
}

/// Reads and decodes the node `ptr` references.
pub(crate) fn read_node(store: &dyn crate::NodeStore, ptr: &BlockPtr) -> Result<Node, TreeError> {
    if ptr.is_hole() {
        return Err(TreeError::Corrupt(
            node_name(ptr),
            "reference to a hole".into(),
        ));
    }
    if ptr.btype != BlockType::TreeNode {
        return Err(TreeError::Corrupt(
            node_name(ptr),
            format!("block type {:?} is not a tree node", ptr.btype),
        ));
    }
    let data = store.read(ptr)?;
    decode(ptr, &data)
}

/// A bounds-checked reader over node bytes.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
}

/// Decodes node bytes read through `ptr`, validating everything a later
/// operation relies on: magic, version, level, sizes, key order, and the
/// type and level of every child pointer.
pub(crate) fn decode(ptr: &BlockPtr, data: &[u8]) -> Result<Node, TreeError> {
    let bad = |what: String| TreeError::Corrupt(node_name(ptr), what);
    if data.len() < HEADER_BYTES {
        return Err(bad(format!(
            "{} bytes is shorter than a node header",
            data.len()
        )));
    }
    if data.len() > NODE_MAX_BYTES {
        return Err(bad(format!(
            "{} bytes exceeds the node maximum of {NODE_MAX_BYTES}",
            data.len()
        )));
    }
    if data[0..2] != MAGIC {
        return Err(bad(format!("bad magic {:02x}{:02x}", data[0], data[1])));
    }
    if data[2] != VERSION {
        return Err(bad(format!("unsupported node version {}", data[2])));
    }
    let level = data[3];
    if level != ptr.level {
        return Err(bad(format!(
            "node level {level} but its pointer says {}",
            ptr.level
        )));
    }
    let count = u32::from_le_bytes([data[4], data[5], data[6], data[7]]) as usize;
    if count == 0 {
        return Err(bad("node without entries".into()));
    }
    let entries = &data[HEADER_BYTES..];
    let body = if level == 0 {
        Body::Leaf(Leaf::parse(entries, count).map_err(bad)?)
    } else {
        let mut r = Reader { buf: entries };
        let truncated = |i: usize| bad(format!("entry {i} of {count} is truncated"));
        let mut kids: Vec<Kid> =
            Vec::with_capacity(count.min(data.len() / INTERNAL_ENTRY_OVERHEAD));
        for i in 0..count {
            let klen = r.u16().ok_or_else(|| truncated(i))? as usize;
            if klen > MAX_KEY {
                return Err(bad(format!("separator {i} has {klen} bytes")));
            }
            if i == 0 && klen != 0 {
                return Err(bad("first child has a separator".into()));
            }
            let key = r.take(klen).ok_or_else(|| truncated(i))?;
            let raw = r.take(BLOCK_PTR_SIZE).ok_or_else(|| truncated(i))?;
            let child = BlockPtr::decode(raw).map_err(|e| bad(format!("child {i}: {e}")))?;
            if child.is_hole() {
                return Err(bad(format!("child {i} is a hole")));
            }
            if child.btype != BlockType::TreeNode {
                return Err(bad(format!("child {i} has block type {:?}", child.btype)));
            }
            if child.level != level - 1 {
                return Err(bad(format!(
                    "child {i} has level {} under level {level}",
                    child.level
                )));
            }
            if let Some(prev) = kids.last() {
                if prev.key.as_slice() >= key {
                    return Err(bad(format!("separator {i} is out of key order")));
                }
            }
            kids.push(Kid {
                key: key.to_vec(),
                slot: Slot::clean(child),
            });
        }
        if !r.buf.is_empty() {
            return Err(bad(format!("{} trailing bytes", r.buf.len())));
        }
        Body::Internal(kids)
    };
    // The format has no padding, so the byte count is the encoded size.
    Ok(Node {
        level,
        dirty: false,
        size: data.len(),
        body,
    })
}
