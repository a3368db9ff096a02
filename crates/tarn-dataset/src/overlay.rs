//! Changes of a txg to a dataset, kept beside its committed tree until the
//! sync applies them.
//!
//! # Theory
//!
//! A dataset's committed tree is never changed in open context. Each
//! transaction writes into the dataset's *open overlay*: an ordered map
//! from key to the change (a plain value, a staged data block, or a
//! deletion) plus a list of deleted key ranges. The sync of the txg
//! applies the overlay to the tree (range deletions first, then every
//! entry in key order), reads the old values it replaces to apply the
//! birth-time rule, and commits the tree. So the committed tree is always
//! exactly one txg, readers of it need nothing but the pointers it holds,
//! and no placeholder for a data block ever reaches a tree.
//!
//! **What a reader sees** is a stack of layers: the overlays of the txgs not
//! yet committed, newest first, over the committed tree. For a key, the
//! first layer with an entry for it decides; a layer whose deleted ranges
//! cover the key hides every layer below it. [`View::range`] merges the
//! layers' entries with pages of the tree in key order under the same
//! rule, so paging with `Excluded(last key)` works exactly as on a tree.
//!
//! **Why ranges are kept whole.** Deleting a large file removes every key
//! of its data records. As a range, the deletion costs one entry however
//! big the file; the sync walks the committed keys in the range once, page
//! by page, to free their blocks. A range deletion removes the overlay's
//! own entries inside it (they are superseded), and an entry written after
//! it wins over it, because entries are looked up before ranges.
//!
//! **Staged blocks** are shared (`Arc`) between the overlay, the intent log
//! commit that may write one early, and the sync that writes it: its slot
//! (room and, once written, the pointer) is under its own mutex, so the
//! block is written exactly once and whoever comes second uses the pointer.
//!
//! **A staged block changes in place only while nobody else can see it.**
//! Readers outside a transaction, an intent log commit and the logged
//! write that staged it all hold its bytes by `Arc`, and rely on them never
//! changing; the sync holds the overlay only once the txg stopped being
//! open. So a write into part of a record patches the open overlay's block
//! in place only when the overlay holds the sole reference (checked by the
//! reference count, under the dataset lock the transaction holds) and the
//! block was not written early; otherwise it stages a patched copy, and
//! whoever held the old bytes keeps reading them unchanged.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use tarn_block::BlockPtr;
use tarn_pool::Reservation;
use tarn_tree::{NodeStore, Tree};

use crate::record::{TAG_BLOCK, TAG_PLAIN, TAG_SEALED};
use crate::DsError;

mod cover;
use cover::{Added, Cover};

/// An overlay's key, held inside the map's nodes when it is short (every
/// data block's key is): a lookup or insertion compares keys on its way
/// down, and keys behind a pointer each cost a cache miss there (a txg of
/// random writes holds hundreds of thousands of keys).
pub(crate) type Key = smallvec::SmallVec<[u8; 24]>;

/// A data block of a txg not yet committed, and the room allocated for it.
#[derive(Debug)]
pub(crate) struct StagedBlock {
    /// The logical bytes.
    pub data: Arc<Vec<u8>>,
    /// Allocated bytes the block was charged when it was staged (its room
    /// may shrink later, when it is written: the overlay's count does not).
    charged: u64,
    slot: Mutex<StagedSlot>,
}

/// Where a staged block will live, or lives once written early.
#[derive(Clone, Debug)]
pub(crate) struct StagedSlot {
    /// Room allocated when the block was accepted (what remains of it).
    pub res: Reservation,
    /// Already written at this pointer (for the intent log, or by the
    /// sync): whoever comes next uses it as is.
    pub written: Option<BlockPtr>,
    /// Replaced before its txg synced, and its room given back (or its
    /// early copy queued for freeing): nobody may write it any more. An
    /// intent log commit that found it before the replacement logs its
    /// bytes instead.
    pub released: bool,
}

impl StagedBlock {
    /// A block not yet written, holding the room `res`.
    pub(crate) fn new(data: Arc<Vec<u8>>, res: Reservation, written: Option<BlockPtr>) -> Self {
        StagedBlock {
            data,
            charged: res.asize(),
            slot: Mutex::new(StagedSlot {
                res,
                written,
                released: false,
            }),
        }
    }

    /// The slot, locked: written at most once, by whoever holds it.
    pub(crate) fn slot(&self) -> MutexGuard<'_, StagedSlot> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocated bytes the block was charged when it was staged.
    pub(crate) fn asize(&self) -> u64 {
        self.charged
    }

    /// The block's bytes and room, to change in place: only while nobody
    /// else holds its bytes (a reader, an intent log commit, a logged
    /// write of the whole block) and nothing wrote it early.
    fn in_place(&mut self) -> Option<InPlace<'_>> {
        let slot = self.slot.get_mut().unwrap_or_else(|e| e.into_inner());
        if slot.written.is_some() || slot.released {
            return None;
        }
        Some(InPlace {
            data: Arc::get_mut(&mut self.data)?,
            res: &mut slot.res,
            charged: &mut self.charged,
        })
    }
}

/// A staged block that nobody else holds, open for change (see
/// [`Overlay::in_place`]).
pub(crate) struct InPlace<'a> {
    /// The logical bytes.
    pub data: &'a mut Vec<u8>,
    /// Its room: a grown block needs one to match.
    pub res: &'a mut Reservation,
    /// What the overlay counts for it: kept equal to the room.
    pub charged: &'a mut u64,
}

/// One change to one key.
#[derive(Clone, Debug)]
pub(crate) enum Change {
    /// A plain value (without the tree's tag byte).
    Plain(Vec<u8>),
    /// A data block.
    Block(Arc<StagedBlock>),
    /// The key is gone.
    Delete,
}

/// A key range as the tree and the intent log spell it.
pub(crate) type KeyRange = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// True when `r` holds `key`: the plain answer the cover must agree with.
#[cfg(test)]
fn in_range(r: &KeyRange, key: &[u8]) -> bool {
    let lo = match &r.0 {
        Bound::Included(a) => key >= a.as_slice(),
        Bound::Excluded(a) => key > a.as_slice(),
        Bound::Unbounded => true,
    };
    let hi = match &r.1 {
        Bound::Included(b) => key <= b.as_slice(),
        Bound::Excluded(b) => key < b.as_slice(),
        Bound::Unbounded => true,
    };
    lo && hi
}

fn owned(b: Bound<&[u8]>) -> Bound<Vec<u8>> {
    b.map(<[u8]>::to_vec)
}

/// The changes of one txg to one dataset (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Overlay {
    entries: BTreeMap<Key, Change>,
    ranges: Vec<KeyRange>,
    /// The union of `ranges`, to ask whether one covers a key.
    cover: Cover,
    /// Allocated bytes the staged blocks hold.
    staged_asize: u64,
    /// Bytes of plain values and keys, for the write throttle.
    plain_bytes: u64,
}

/// What an overlay says about a key.
pub(crate) enum Seen<'a> {
    /// This layer has an entry for it.
    Entry(&'a Change),
    /// A deleted range of this layer covers it.
    Hidden,
    /// Ask the layer below.
    Below,
}

impl Overlay {
    /// True when the overlay holds no change.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.ranges.is_empty()
    }

    /// Allocated bytes of its staged blocks.
    pub(crate) fn staged_asize(&self) -> u64 {
        self.staged_asize
    }

    /// Bytes of plain values and keys it holds.
    pub(crate) fn plain_bytes(&self) -> u64 {
        self.plain_bytes
    }

    /// What this layer says about `key`.
    pub(crate) fn seen(&self, key: &[u8]) -> Seen<'_> {
        if let Some(c) = self.entries.get(key) {
            return Seen::Entry(c);
        }
        if self.hides(key) {
            return Seen::Hidden;
        }
        Seen::Below
    }

    /// True when a deleted range of this layer covers `key`.
    pub(crate) fn hides(&self, key: &[u8]) -> bool {
        self.cover.covers(key)
    }

    fn account(&mut self, key: &[u8], c: &Change, add: bool) {
        let (staged, plain) = match c {
            Change::Block(b) => (b.asize(), key.len() as u64),
            Change::Plain(v) => (0, (key.len() + v.len()) as u64),
            Change::Delete => (0, key.len() as u64),
        };
        if add {
            self.staged_asize += staged;
            self.plain_bytes += plain;
        } else {
            self.staged_asize = self.staged_asize.saturating_sub(staged);
            self.plain_bytes = self.plain_bytes.saturating_sub(plain);
        }
    }

    /// Sets the change for `key`; returns this layer's previous entry.
    pub(crate) fn set(&mut self, key: &[u8], c: Change) -> Option<Change> {
        self.account(key, &c, true);
        let old = self.entries.insert(Key::from_slice(key), c);
        if let Some(o) = &old {
            self.account(key, o, false);
        }
        old
    }

    /// Puts back the entry `set` replaced (undo): `None` removes it.
    pub(crate) fn restore(&mut self, key: &[u8], prev: Option<Change>) {
        let old = match prev {
            Some(p) => {
                self.account(key, &p, true);
                self.entries.insert(Key::from_slice(key), p)
            }
            None => self.entries.remove(key),
        };
        if let Some(o) = &old {
            self.account(key, o, false);
        }
    }

    /// Deletes every key in `start..end`: this layer's own entries there go
    /// (they are returned, for undo and to release their blocks) and the
    /// range hides the layers below.
    pub(crate) fn delete_range(&mut self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> RangeUndo {
        let r: KeyRange = (owned(start), owned(end));
        let keys: Vec<Key> = self
            .entries
            .range::<[u8], _>((start, end))
            .map(|(k, _)| k.clone())
            .collect();
        let mut removed = Vec::with_capacity(keys.len());
        for k in keys {
            if let Some(c) = self.entries.remove(&k) {
                self.account(&k, &c, false);
                removed.push((k, c));
            }
        }
        self.plain_bytes += range_bytes(&r);
        let covered = self.cover.add(&r.0, &r.1);
        self.ranges.push(r);
        RangeUndo { removed, covered }
    }

    /// Undoes the last `delete_range` not yet undone, given what it
    /// returned.
    pub(crate) fn undo_delete_range(&mut self, u: RangeUndo) {
        if let Some(r) = self.ranges.pop() {
            self.plain_bytes = self.plain_bytes.saturating_sub(range_bytes(&r));
            self.cover.undo(u.covered);
        }
        for (k, c) in u.removed {
            self.account(&k, &c, true);
            self.entries.insert(k, c);
        }
    }

    /// The deleted ranges, in the order they were deleted.
    pub(crate) fn ranges(&self) -> &[KeyRange] {
        &self.ranges
    }

    /// Every entry, in key order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&[u8], &Change)> {
        self.entries.iter().map(|(k, c)| (k.as_slice(), c))
    }

    /// Every staged block.
    pub(crate) fn staged(&self) -> impl Iterator<Item = (&[u8], &Arc<StagedBlock>)> {
        self.entries.iter().filter_map(|(k, c)| match c {
            Change::Block(b) => Some((k.as_slice(), b)),
            _ => None,
        })
    }

    /// Runs `f` on the staged block under `key`, changing it in place,
    /// when this layer has one that nobody else holds (see
    /// [`StagedBlock`]); the count of staged bytes follows its room.
    /// `None` when there is none, or it is shared: the caller stages a new
    /// block instead, leaving the bytes others hold unchanged.
    pub(crate) fn in_place<R>(
        &mut self,
        key: &[u8],
        f: impl FnOnce(InPlace<'_>) -> R,
    ) -> Option<R> {
        let Some(Change::Block(b)) = self.entries.get_mut(key) else {
            return None;
        };
        let sb = Arc::get_mut(b)?;
        let before = sb.charged;
        let r = f(sb.in_place()?);
        let after = sb.charged;
        self.staged_asize = self.staged_asize.saturating_sub(before) + after;
        Some(r)
    }

    /// The staged block now under `key`, if any.
    pub(crate) fn staged_at(&self, key: &[u8]) -> Option<&Arc<StagedBlock>> {
        match self.entries.get(key) {
            Some(Change::Block(b)) => Some(b),
            _ => None,
        }
    }

    fn entries_in<'a>(
        &'a self,
        start: Bound<&'a [u8]>,
        end: Bound<&'a [u8]>,
    ) -> std::collections::btree_map::Range<'a, Key, Change> {
        self.entries.range::<[u8], _>((start, end))
    }
}

/// What [`Overlay::delete_range`] changed, to undo it.
#[derive(Debug)]
pub(crate) struct RangeUndo {
    /// The layer's own entries the range removed.
    pub removed: Vec<(Key, Change)>,
    covered: Added,
}

fn range_bytes(r: &KeyRange) -> u64 {
    let len = |b: &Bound<Vec<u8>>| match b {
        Bound::Included(k) | Bound::Excluded(k) => k.len() as u64,
        Bound::Unbounded => 0,
    };
    len(&r.0) + len(&r.1)
}

/// A value as a reader of the stacked view sees it.
#[derive(Clone, Debug)]
pub(crate) enum Found {
    /// A plain value (of an encrypted dataset's open txg: sealed).
    Plain(Vec<u8>),
    /// A sealed value of the committed tree (encrypted datasets).
    Sealed(Vec<u8>),
    /// A data block not yet committed.
    Staged(Arc<StagedBlock>),
    /// A committed data block.
    Block(BlockPtr),
}

/// Decodes a raw tree value; a plain value keeps the tree's copy (less its
/// tag) rather than being copied again.
pub(crate) fn decode_tree_value(mut raw: Vec<u8>, key: &[u8]) -> Result<Found, DsError> {
    match raw.first() {
        Some(&TAG_PLAIN) => {
            raw.remove(0);
            Ok(Found::Plain(raw))
        }
        Some(&TAG_SEALED) => {
            raw.remove(0);
            Ok(Found::Sealed(raw))
        }
        _ => decode_tree_slice(&raw, key),
    }
}

/// [`decode_tree_value`] of a value borrowed from its tree node: the
/// value is copied once, without its tag.
pub(crate) fn decode_tree_slice(raw: &[u8], key: &[u8]) -> Result<Found, DsError> {
    match raw.split_first() {
        Some((&TAG_PLAIN, v)) => Ok(Found::Plain(v.to_vec())),
        Some((&TAG_SEALED, v)) => Ok(Found::Sealed(v.to_vec())),
        Some((&TAG_BLOCK, v)) => BlockPtr::decode(v)
            .map(Found::Block)
            .map_err(|e| DsError::Corrupt(format!("block pointer at key {key:02x?}: {e}"))),
        _ => Err(DsError::Corrupt(format!("value tag at key {key:02x?}"))),
    }
}

fn from_change(c: &Change) -> Option<Found> {
    match c {
        Change::Plain(v) => Some(Found::Plain(v.clone())),
        Change::Block(b) => Some(Found::Staged(b.clone())),
        Change::Delete => None,
    }
}

/// Overlays, newest first, over a committed tree: what a reader sees.
pub(crate) struct View<'a> {
    /// The layers, newest first.
    pub layers: Vec<&'a Overlay>,
    /// The committed tree below them.
    pub tree: &'a mut Tree,
}

/// Entries fetched from the tree per page while merging.
const TREE_PAGE: usize = 256;

impl View<'_> {
    /// What the overlays say of `key`, newest first: `Some` when one of
    /// them decides it (its entry, or `None` for one deleted), `None` when
    /// the tree below does.
    fn in_layers(&self, key: &[u8]) -> Option<Option<Found>> {
        self.layers.iter().find_map(|l| match l.seen(key) {
            Seen::Entry(c) => Some(from_change(c)),
            Seen::Hidden => Some(None),
            Seen::Below => None,
        })
    }

    /// The value of `key`.
    pub(crate) fn get(
        &mut self,
        store: &dyn NodeStore,
        key: &[u8],
    ) -> Result<Option<Found>, DsError> {
        if let Some(decided) = self.in_layers(key) {
            return Ok(decided);
        }
        match self
            .tree
            .get_with(store, key, |raw| decode_tree_slice(raw, key))?
        {
            Some(found) => Ok(Some(found?)),
            None => Ok(None),
        }
    }

    /// [`View::get`] of many keys in ascending order: `f(i, found)` for
    /// each `keys[i]` present, not in order. The keys no overlay decides
    /// are looked up in the tree together ([`Tree::get_sorted_with`]).
    pub(crate) fn get_sorted(
        &mut self,
        store: &dyn NodeStore,
        keys: &[&[u8]],
        f: &mut dyn FnMut(usize, Found),
    ) -> Result<(), DsError> {
        let mut below = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            match self.in_layers(key) {
                Some(Some(found)) => f(i, found),
                Some(None) => {}
                None => below.push(i),
            }
        }
        let tree_keys: Vec<&[u8]> = below.iter().map(|&i| keys[i]).collect();
        let mut bad = None;
        self.tree
            .get_sorted_with(store, &tree_keys, &mut |j, raw| match decode_tree_slice(
                raw,
                tree_keys[j],
            ) {
                Ok(found) => f(below[j], found),
                Err(e) => {
                    bad.get_or_insert(e);
                }
            })?;
        bad.map_or(Ok(()), Err)
    }

    /// Up to `limit` entries inside `start..end`, in key order.
    pub(crate) fn range(
        &mut self,
        store: &dyn NodeStore,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Found)>, DsError> {
        let mut out: Vec<(Vec<u8>, Found)> = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let layers = &self.layers;
        let mut iters: Vec<_> = layers
            .iter()
            .map(|l| l.entries_in(start, end).peekable())
            .collect();
        // Tree entries are fetched a page at a time from `tree_from`.
        let mut tree_page: std::collections::VecDeque<(Vec<u8>, Vec<u8>)> = Default::default();
        let mut tree_from: Bound<Vec<u8>> = owned(start);
        let mut tree_done = false;
        loop {
            if tree_page.is_empty() && !tree_done {
                let page = self.tree.range(
                    store,
                    tree_from.as_ref().map(Vec::as_slice),
                    end,
                    TREE_PAGE,
                )?;
                match page.last() {
                    Some((k, _)) => tree_from = Bound::Excluded(k.clone()),
                    None => tree_done = true,
                }
                if page.len() < TREE_PAGE {
                    tree_done = true;
                }
                tree_page.extend(page);
            }
            // The smallest key any source offers.
            let mut next: Option<&[u8]> = tree_page.front().map(|(k, _)| k.as_slice());
            for it in iters.iter_mut() {
                if let Some((k, _)) = it.peek() {
                    if next.is_none_or(|n| k.as_slice() < n) {
                        next = Some(k.as_slice());
                    }
                }
            }
            // Taken from the tree's page when it offers it (no copy).
            let tree_first = tree_page
                .front()
                .is_some_and(|(k, _)| next == Some(k.as_slice()));
            let (key, tree_raw) = if tree_first {
                let (k, raw) = tree_page.pop_front().expect("peeked");
                (k, Some(raw))
            } else {
                match next {
                    Some(n) => (n.to_vec(), None),
                    None => break,
                }
            };
            // The newest layer with an entry for it decides; a range of a
            // newer layer hides older ones and the tree.
            let mut decided: Option<Option<Found>> = None;
            for (i, it) in iters.iter_mut().enumerate() {
                let here = it.peek().is_some_and(|(k, _)| k.as_slice() == key);
                if here {
                    let (_, c) = it.next().expect("peeked");
                    if decided.is_none() {
                        decided = Some(from_change(c));
                    }
                } else if decided.is_none() && layers[i].hides(&key) {
                    decided = Some(None);
                }
            }
            if let Some(raw) = tree_raw {
                if decided.is_none() {
                    decided = Some(Some(decode_tree_value(raw, &key)?));
                }
            }
            if let Some(Some(v)) = decided {
                out.push((key, v));
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap as Model;

    /// An in-memory node store for trees in tests.
    #[derive(Default)]
    struct Mem {
        blocks: std::cell::RefCell<Vec<Vec<u8>>>,
    }

    impl NodeStore for Mem {
        fn read(&self, ptr: &BlockPtr) -> Result<Vec<u8>, tarn_tree::TreeError> {
            Ok(self.blocks.borrow()[ptr.dvas[0].offset as usize].clone())
        }
        fn write(&mut self, data: Vec<u8>, level: u8) -> Result<BlockPtr, tarn_tree::TreeError> {
            let mut b = self.blocks.borrow_mut();
            let mut bp = BlockPtr {
                lsize: data.len() as u32,
                psize: data.len() as u32,
                birth: 1,
                level,
                btype: tarn_block::BlockType::TreeNode,
                ..Default::default()
            };
            bp.dvas[0] = tarn_block::Dva {
                vdev: 0,
                offset: b.len() as u64,
                asize: 512,
            };
            b.push(data);
            Ok(bp)
        }
        fn free(&mut self, _ptr: &BlockPtr) {}
    }

    /// Keys in the order of `n`; every third one too long to be held in
    /// the map's nodes, so both kinds of [`Key`] meet in one overlay.
    fn key(n: u8) -> Vec<u8> {
        let mut k = vec![b'k', n];
        if n.is_multiple_of(3) {
            k.extend_from_slice(&[n; 30]);
        }
        k
    }

    fn plain(v: &[u8]) -> Vec<u8> {
        let mut r = vec![TAG_PLAIN];
        r.extend_from_slice(v);
        r
    }

    #[derive(Clone, Debug)]
    enum Op {
        Put(u8, u8),
        Delete(u8),
        Range(u8, u8),
    }

    fn apply_model(m: &mut Model<Vec<u8>, u8>, op: &Op) {
        match *op {
            Op::Put(k, v) => {
                m.insert(key(k), v);
            }
            Op::Delete(k) => {
                m.remove(&key(k));
            }
            Op::Range(a, b) => {
                let (lo, hi) = (key(a.min(b)), key(a.max(b)));
                m.retain(|k, _| !(*k >= lo && *k < hi));
            }
        }
    }

    fn apply_overlay(o: &mut Overlay, op: &Op) {
        match *op {
            Op::Put(k, v) => {
                o.set(&key(k), Change::Plain(vec![v]));
            }
            Op::Delete(k) => {
                o.set(&key(k), Change::Delete);
            }
            Op::Range(a, b) => {
                let (lo, hi) = (key(a.min(b)), key(a.max(b)));
                o.delete_range(Bound::Included(&lo), Bound::Excluded(&hi));
            }
        }
    }

    /// What to undo: an entry's previous value, or a range's removals.
    type Undone = Result<(Vec<u8>, Option<Change>), RangeUndo>;

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..40, any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
            2 => (0u8..40).prop_map(Op::Delete),
            1 => (0u8..40, 0u8..40).prop_map(|(a, b)| Op::Range(a, b)),
        ]
    }

    /// Every entry of the view, paged `page` at a time with
    /// `Excluded(last key)` as a client would.
    fn page_all(
        view: &mut View<'_>,
        store: &Mem,
        page: usize,
        end: Bound<&[u8]>,
    ) -> Vec<(Vec<u8>, u8)> {
        let mut seen = Vec::new();
        let mut from: Bound<Vec<u8>> = Bound::Unbounded;
        loop {
            let p = view
                .range(store, from.as_ref().map(Vec::as_slice), end, page)
                .unwrap();
            assert!(p.len() <= page);
            let Some((last, _)) = p.last() else { break };
            from = Bound::Excluded(last.clone());
            seen.extend(p.into_iter().map(|(k, f)| match f {
                Found::Plain(v) => (k, v[0]),
                _ => unreachable!(),
            }));
        }
        seen
    }

    proptest! {
        /// A committed tree, an older and a newer overlay read as the model
        /// that applied all three in order: point lookups and paged ranges.
        #[test]
        fn stacked_view_reads_as_the_model(
            base in proptest::collection::vec((0u8..40, any::<u8>()), 0..40),
            older in proptest::collection::vec(op(), 0..30),
            newer in proptest::collection::vec(op(), 0..30),
            page in 1usize..7,
            end in 0u8..42,
            cut in (0u8..40, 0u8..40),
        ) {
            let mut model = Model::new();
            let mut store = Mem::default();
            let mut tree = Tree::new().with_node_max(512);
            for (k, v) in &base {
                tree.insert(&store, &key(*k), &plain(&[*v])).unwrap();
                model.insert(key(*k), *v);
            }
            let root = tree.commit(&mut store).unwrap();
            let mut tree = Tree::open(root).with_node_max(512);
            let (mut o1, mut o2) = (Overlay::default(), Overlay::default());
            for op in &older {
                apply_overlay(&mut o1, op);
                apply_model(&mut model, op);
            }
            for op in &newer {
                apply_overlay(&mut o2, op);
                apply_model(&mut model, op);
            }
            let mut view = View { layers: vec![&o2, &o1], tree: &mut tree };
            for k in 0u8..42 {
                let got = view.get(&store, &key(k)).unwrap().map(|f| match f {
                    Found::Plain(v) => v[0],
                    _ => unreachable!(),
                });
                prop_assert_eq!(got, model.get(&key(k)).copied(), "key {}", k);
            }
            // Paging from start to end returns exactly the model's entries,
            // and up to an end key those below it.
            let end = key(end);
            let want: Vec<(Vec<u8>, u8)> = model.into_iter().collect();
            prop_assert_eq!(page_all(&mut view, &store, page, Bound::Unbounded), want.clone());
            let below: Vec<_> = want.into_iter().filter(|(k, _)| *k < end).collect();
            prop_assert_eq!(page_all(&mut view, &store, page, Bound::Excluded(&end)), below);
            // Nothing uncommitted (no layer, or only empty ones) pages as the
            // base did; a layer holding only a deleted range hides it.
            let base: Model<Vec<u8>, u8> = base.iter().map(|(k, v)| (key(*k), *v)).collect();
            let empty = Overlay::default();
            let mut cut_only = Overlay::default();
            apply_overlay(&mut cut_only, &Op::Range(cut.0, cut.1));
            let mut cut_model = base.clone();
            apply_model(&mut cut_model, &Op::Range(cut.0, cut.1));
            for (layers, m) in [
                (Vec::new(), &base),
                (vec![&empty], &base),
                (vec![&cut_only, &empty], &cut_model),
            ] {
                let mut view = View { layers, tree: &mut tree };
                let want: Vec<(Vec<u8>, u8)> = m.clone().into_iter().collect();
                prop_assert_eq!(page_all(&mut view, &store, page, Bound::Unbounded), want.clone());
                let below: Vec<_> = want.into_iter().filter(|(k, _)| *k < end).collect();
                prop_assert_eq!(page_all(&mut view, &store, page, Bound::Excluded(&end)), below);
            }
        }

        /// Undoing overlay changes in reverse restores it exactly.
        #[test]
        fn undo_restores_the_overlay(ops in proptest::collection::vec(op(), 1..40), keep in 0usize..40) {
            let mut o = Overlay::default();
            let keep = keep.min(ops.len());
            for op in &ops[..keep] {
                apply_overlay(&mut o, op);
            }
            let before = format!("{:?}", (&o.entries, &o.ranges, o.plain_bytes));
            let mut undo: Vec<Undone> = Vec::new();
            for op in &ops[keep..] {
                match *op {
                    Op::Put(k, v) => undo.push(Ok((key(k), o.set(&key(k), Change::Plain(vec![v]))))),
                    Op::Delete(k) => undo.push(Ok((key(k), o.set(&key(k), Change::Delete)))),
                    Op::Range(a, b) => {
                        let (lo, hi) = (key(a.min(b)), key(a.max(b)));
                        undo.push(Err(o.delete_range(Bound::Included(&lo), Bound::Excluded(&hi))));
                    }
                }
            }
            while let Some(u) = undo.pop() {
                match u {
                    Ok((k, prev)) => o.restore(&k, prev),
                    Err(u) => o.undo_delete_range(u),
                }
            }
            prop_assert_eq!(format!("{:?}", (&o.entries, &o.ranges, o.plain_bytes)), before);
            // The union of the ranges was taken back with them.
            for n in 0..=u8::MAX {
                for k in [key(n), [key(n), vec![0]].concat()] {
                    let want = o.ranges.iter().any(|r| in_range(r, &k));
                    prop_assert_eq!(o.hides(&k), want, "key {:?}", k);
                }
            }
        }
    }
}
