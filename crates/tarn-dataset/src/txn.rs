//! Transactions on one dataset: the open-context API the POSIX layer uses.
//!
//! A [`Txn`] reads the dataset as the open txg's changes over its committed
//! tree (see `overlay`) and writes only into the open overlay, journaling
//! every change. When the closure given to [`DatasetHandle::txn`] fails,
//! the journal is replayed backwards and the space charge and room
//! returned, so a failed operation leaves no trace in the open txg.
//!
//! **Reads outside the transaction.** A transaction holds its dataset's
//! lock, so a data block read inside one (a cache miss is a disk read)
//! would make every other operation on the dataset wait. [`Txn::block_ref`]
//! instead resolves a key to a [`BlockRef`] and the caller reads it after
//! the transaction: the bytes of an uncommitted block are shared with the
//! overlay (they never change once shared: a write patches a staged block
//! in place only while the overlay holds its sole reference, see
//! `overlay`, and stages a patched copy otherwise),
//! and a committed pointer comes with a hold on the txg of the tree it was
//! found in, taken under the dataset lock, so its space cannot be freed and
//! reused before the read (frees are deferred past every hold, see
//! `tarn_pool`'s `store`). The read then sees the dataset as it was when
//! the transaction ran: a later write never changes bytes already staged
//! or committed, it stages a new block.

use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tarn_block::{BlockPtr, KeySet};
use tarn_pool::{Cx, Pool, PoolError};

use crate::dsl::{with_dsl, Dsl, LiveDs, LiveState};
use crate::overlay::{decode_tree_value, Change, Found, RangeUndo, StagedBlock};
use crate::zil::LogOp;
use crate::DsError;
use tarn_pool::Reservation;

/// A value as the POSIX layer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// Inline bytes.
    Plain(Vec<u8>),
    /// A data block of `len` logical bytes.
    Block {
        /// Logical length.
        len: u32,
    },
}

/// Largest plain value (the tree's limit less the tag byte).
pub const MAX_PLAIN: usize = tarn_tree::MAX_VALUE - 1;
/// Largest data block.
pub const MAX_BLOCK: usize = 1 << 20;

enum Undo {
    /// Key and the open overlay's previous entry for it.
    Entry(Vec<u8>, Option<Change>),
    /// A range deletion and the overlay entries it removed.
    Range(RangeUndo),
    /// A staged block patched in place: its length and the bytes at `at`
    /// before, and its room and charge if the patch gave it a larger one.
    Patch {
        key: Vec<u8>,
        len: usize,
        at: usize,
        old: Vec<u8>,
        room: Option<(Reservation, u64)>,
    },
}

/// Where a patch of `n` bytes at `off` into a block extended to `len`
/// ends; refused past the largest block.
fn patch_end(len: usize, off: usize, n: usize) -> Result<usize, DsError> {
    off.checked_add(n)
        .filter(|&e| e <= MAX_BLOCK && len <= MAX_BLOCK)
        .ok_or_else(|| {
            DsError::Invalid(format!(
                "{n} bytes at {off} of a block of {len}: blocks end at {MAX_BLOCK}"
            ))
        })
}

/// What a patch does to a block's bytes (see [`Txn::patch_block`]): the
/// block extended with zeros to `len` and to the patch's end, `bytes` at
/// `off`. The one definition of it: for a block patched in place, a
/// patched copy, replay, and stores that rewrite whole blocks.
pub fn apply_patch(
    data: &mut Vec<u8>,
    len: usize,
    off: usize,
    bytes: &[u8],
) -> Result<(), DsError> {
    let end = patch_end(len, off, bytes.len())?;
    patch_checked(data, len.max(end), off, bytes);
    Ok(())
}

/// [`apply_patch`] once [`patch_end`] passed: `need` is the length the
/// block grows to at least.
fn patch_checked(data: &mut Vec<u8>, need: usize, off: usize, bytes: &[u8]) {
    if data.len() < need {
        data.resize(need, 0);
    }
    data[off..off + bytes.len()].copy_from_slice(bytes);
}

/// Refuses a key the tree cannot hold: accepted here, it would fail the
/// txg's sync (and, logged, every replay of it), not the caller.
fn check_key(key: &[u8]) -> Result<(), DsError> {
    if key.len() > tarn_tree::MAX_KEY {
        return Err(DsError::Invalid(format!(
            "key of {} bytes exceeds {}",
            key.len(),
            tarn_tree::MAX_KEY
        )));
    }
    Ok(())
}

/// Room for a block of `len` bytes in dataset `id`, after its quota and
/// reservation allow it (`held`: what the block's old room already
/// counts, when it grows; `unpublished`: room this transaction took
/// before, which the dataset's pending figure does not count until the
/// transaction ends; not checked when replaying the log).
fn reserve(
    dsl: &Dsl,
    cx: &mut Cx<'_>,
    id: u64,
    replay: bool,
    len: u64,
    held: u64,
    unpublished: u64,
) -> Result<Reservation, DsError> {
    let copies = {
        let dir = dsl.dir();
        let copies = dir.copies(id);
        if !replay {
            let cost = cx.alloc_cost(len, copies);
            dir.check_room(cx, id, cost.saturating_sub(held), unpublished)?;
        }
        copies
    };
    cx.reserve_block(len, copies).map_err(|e| match e {
        PoolError::NoSpace(m) => DsError::NoSpace(m),
        other => DsError::Pool(other),
    })
}

/// How a transaction runs: as a front end's change, redoing the intent
/// log, or applying a received stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Checks everything, logs for the intent log, needs the key of an
    /// encrypted dataset.
    Normal,
    /// Redoes the intent log: skips the checks the operations passed when
    /// they ran (quota, read-only) and logs nothing.
    Replay,
    /// Applies a received stream: quotas hold, `readonly` does not (a
    /// backup target is often read-only), nothing is logged (the receive
    /// commits its txgs).
    Receive,
    /// Applies a raw stream: as `Receive`, without the key: values are
    /// stored as given (sealed) and blocks as the sender stored them.
    ReceiveRaw,
}

/// What [`Txn::stage`] did with a block.
enum Staged {
    /// Staged these shared bytes.
    Block(Arc<Vec<u8>>),
    /// All zeros: deleted the key.
    Deleted,
    /// All zeros, and the key was absent.
    Nothing,
}

/// One dataset inside one transaction (see the module docs).
pub struct Txn<'a, 'p> {
    dsl: &'a Dsl,
    live: &'a LiveDs,
    st: &'a mut LiveState,
    cx: &'a mut Cx<'p>,
    id: u64,
    readonly: bool,
    undo: Vec<Undo>,
    /// Dirty bytes charged to the write throttle.
    charged_dirty: u64,
    /// Room allocated by this transaction: given back if it fails.
    reserved: Vec<Reservation>,
    /// Staged blocks this transaction replaced or removed: their room is
    /// given back if it succeeds.
    released: Vec<Arc<StagedBlock>>,
    /// Rooms of blocks grown in place, replaced by larger ones: given back
    /// if it succeeds.
    outgrown: Vec<Reservation>,
    /// The operations that succeeded, for the intent log.
    ops: Vec<LogOp>,
    /// Redoing the intent log: skip the checks the operations passed when
    /// they first ran (quota, read-only), and log nothing.
    replay: bool,
    /// How it runs (see [`Mode`]).
    mode: Mode,
    /// The open overlay's plain bytes when the transaction began.
    plain_before: u64,
    /// The dataset's key, when it is encrypted: plain values are sealed
    /// with it, and blocks read through it.
    key: Option<Arc<KeySet>>,
}

/// The bytes of a data block, shared with the block cache or with the
/// open txg's overlay: reading them costs no copy.
#[derive(Clone, Debug)]
pub enum BlockData {
    /// A committed block, verified and decompressed (as cached).
    Committed(Arc<[u8]>),
    /// A block of a txg not committed yet.
    Staged(Arc<Vec<u8>>),
}

impl std::ops::Deref for BlockData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            BlockData::Committed(d) => d,
            BlockData::Staged(d) => d,
        }
    }
}

impl AsRef<[u8]> for BlockData {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// A data block found by a transaction, to read after it ends (see the
/// module docs).
pub struct BlockRef(RefInner);

/// A committed block of a batch read: its pointer, the hold keeping its
/// space, and the dataset and key that name it in a damage report.
type Held = (BlockPtr, tarn_pool::OwnedHold, u64, Vec<u8>);

/// Blocks of a batch read with one key (or none).
type KeyGroup<T> = (Option<Arc<KeySet>>, Vec<T>);

/// Whether two blocks are read with the same key (the same loaded key
/// set, or none).
fn same_key(a: &Option<Arc<KeySet>>, b: &Option<Arc<KeySet>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

/// What a read of a committed block gives its reader: the bytes, the
/// pool's refusal (faulted, gone), or damage, reported once, named after
/// the dataset and key like a read inside a transaction.
fn outcome(
    pool: &Pool,
    r: Result<Arc<[u8]>, PoolError>,
    hold: tarn_pool::OwnedHold,
    id: u64,
    key: &[u8],
) -> Result<BlockData, DsError> {
    match r {
        Ok(d) => Ok(BlockData::Committed(d)),
        Err(e @ (PoolError::Faulted(_) | PoolError::NotFound(_))) => Err(e.into()),
        Err(e) => {
            drop(hold);
            let name = crate::dsl::with_dir(pool, |dir, _| crate::dsl::rec_name(dir, id))
                .unwrap_or_default();
            let what = format!("dataset {name}: block at key {key:02x?}");
            pool.report_damage(what.clone());
            Err(DsError::Damaged(format!("{what}: {e}")))
        }
    }
}

enum RefInner {
    Staged(Arc<Vec<u8>>),
    Committed {
        bp: BlockPtr,
        hold: tarn_pool::OwnedHold,
        id: u64,
        key: Vec<u8>,
        crypt: Option<Arc<KeySet>>,
    },
}

impl BlockRef {
    /// Logical length of the block.
    pub fn len(&self) -> usize {
        match &self.0 {
            RefInner::Staged(d) => d.len(),
            RefInner::Committed { bp, .. } => bp.lsize as usize,
        }
    }

    /// True for a block of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when the block is on disk (not only in the memory of an open
    /// or syncing txg): what read-ahead can bring into the cache.
    pub fn is_committed(&self) -> bool {
        matches!(self.0, RefInner::Committed { .. })
    }

    /// Reads the block (through the block cache) without any dataset lock.
    /// A block that does not verify is reported as damage, named after the
    /// dataset and key, like a read inside a transaction.
    pub fn read(self, pool: &Pool) -> Result<BlockData, DsError> {
        match self.0 {
            RefInner::Staged(d) => Ok(BlockData::Staged(d)),
            RefInner::Committed {
                bp,
                hold,
                id,
                key,
                crypt,
            } => {
                let r = pool.read_held(&bp, crypt.as_deref(), &hold);
                outcome(pool, r, hold, id, &key)
            }
        }
    }

    /// Whether [`BlockRef::read_cached`] would answer now (nothing is
    /// counted or used: see [`Pool::is_cached`]).
    pub fn in_memory(&self, pool: &Pool) -> bool {
        match &self.0 {
            RefInner::Staged(_) => true,
            RefInner::Committed { bp, crypt, .. } => pool.is_cached(bp, crypt.as_deref()),
        }
    }

    /// The block's bytes if they are in memory (staged, or cached and
    /// readable with the key held), without waiting for a device; None
    /// otherwise (read it with [`BlockRef::read`]).
    pub fn read_cached(&self, pool: &Pool) -> Option<BlockData> {
        match &self.0 {
            RefInner::Staged(d) => Some(BlockData::Staged(d.clone())),
            RefInner::Committed {
                bp, hold, crypt, ..
            } => pool
                .read_held_cached(bp, crypt.as_deref(), hold)
                .map(BlockData::Committed),
        }
    }

    /// Reads many blocks as [`BlockRef::read`] reads one, in order: the
    /// committed ones in one batch per key ([`Pool::read_held_many`]: the
    /// pieces of neighbouring blocks merged into few reads per device).
    pub fn read_many(refs: Vec<BlockRef>, pool: &Pool) -> Vec<Result<BlockData, DsError>> {
        let n = refs.len();
        let mut out: Vec<Option<Result<BlockData, DsError>>> = (0..n).map(|_| None).collect();
        // Committed blocks grouped by the key they are read with.
        let mut groups: Vec<KeyGroup<usize>> = Vec::new();
        let mut held: Vec<Option<Held>> = (0..n).map(|_| None).collect();
        for (i, r) in refs.into_iter().enumerate() {
            match r.0 {
                RefInner::Staged(d) => out[i] = Some(Ok(BlockData::Staged(d))),
                RefInner::Committed {
                    bp,
                    hold,
                    id,
                    key,
                    crypt,
                } => {
                    match groups.iter_mut().find(|(k, _)| same_key(k, &crypt)) {
                        Some((_, g)) => g.push(i),
                        None => groups.push((crypt.clone(), vec![i])),
                    }
                    held[i] = Some((bp, hold, id, key));
                }
            }
        }
        for (crypt, idxs) in groups {
            let read = {
                let (bps, holds): (Vec<&BlockPtr>, Vec<&tarn_pool::OwnedHold>) = idxs
                    .iter()
                    .filter_map(|&i| held[i].as_ref().map(|(bp, h, ..)| (bp, h)))
                    .unzip();
                pool.read_held_many(&bps, crypt.as_deref(), &holds)
            };
            for (&i, r) in idxs.iter().zip(read) {
                let Some((_, hold, id, key)) = held[i].take() else {
                    continue;
                };
                out[i] = Some(outcome(pool, r, hold, id, &key));
            }
        }
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(DsError::Corrupt("a block was not read (a bug)".into())))
            })
            .collect()
    }

    /// [`BlockRef::prefetch`] of many blocks, read as one batch
    /// ([`Pool::prefetch_held_many`]).
    pub fn prefetch_many(refs: Vec<BlockRef>, pool: &Pool) {
        let mut groups: Vec<KeyGroup<(BlockPtr, tarn_pool::OwnedHold)>> = Vec::new();
        for r in refs {
            if let RefInner::Committed {
                bp, hold, crypt, ..
            } = r.0
            {
                match groups.iter_mut().find(|(k, _)| same_key(k, &crypt)) {
                    Some((_, g)) => g.push((bp, hold)),
                    None => groups.push((crypt, vec![(bp, hold)])),
                }
            }
        }
        for (crypt, list) in groups {
            let (bps, holds): (Vec<&BlockPtr>, Vec<&tarn_pool::OwnedHold>) =
                list.iter().map(|(b, h)| (b, h)).unzip();
            pool.prefetch_held_many(&bps, crypt.as_deref(), &holds);
        }
    }

    /// Reads the block into the block cache for a reader expected soon
    /// (read-ahead); nothing for a block still in memory. Errors are left
    /// for that reader's own read to report.
    pub fn prefetch(self, pool: &Pool) {
        if let RefInner::Committed {
            bp, hold, crypt, ..
        } = self.0
        {
            pool.prefetch_held(&bp, crypt.as_deref(), &hold);
        }
    }
}

impl Txn<'_, '_> {
    /// A value as the caller sees it: a plain value of an encrypted
    /// dataset opened with its key. A sealed value without a key, or a
    /// value of an encrypted dataset that does not open, is an error,
    /// never bytes.
    fn value_of(&mut self, key: &[u8], f: Found) -> Result<Value, DsError> {
        match (f, &self.key) {
            (Found::Plain(v), None) => Ok(Value::Plain(v)),
            (Found::Plain(v) | Found::Sealed(v), Some(k)) => match k.open_value(key, &v) {
                Ok(v) => Ok(Value::Plain(v)),
                Err(e) => {
                    let name = crate::dsl::rec_name(&self.dsl.dir(), self.id).unwrap_or_default();
                    let what = format!("dataset {name}: value at key {key:02x?}");
                    self.cx.report_damage(what.clone());
                    Err(DsError::Damaged(format!("{what}: {e}")))
                }
            },
            (Found::Sealed(_), None) => Err(DsError::Corrupt(format!(
                "a sealed value at key {key:02x?} of a dataset that is not encrypted"
            ))),
            (Found::Staged(b), _) => Ok(Value::Block {
                len: b.data.len() as u32,
            }),
            (Found::Block(bp), _) => Ok(Value::Block { len: bp.lsize }),
        }
    }

    fn ro_check(&self) -> Result<(), DsError> {
        if self.readonly && self.mode == Mode::Normal {
            let name = crate::dsl::rec_name(&self.dsl.dir(), self.id).unwrap_or_default();
            return Err(DsError::ReadOnly(format!("dataset '{name}' is read-only")));
        }
        Ok(())
    }

    /// The dataset's resolved property value.
    pub fn prop(&self, name: &str) -> String {
        self.dsl.dir().prop(self.id, name).0
    }

    /// Stable id of the dataset.
    pub fn guid(&self) -> u64 {
        crate::dsl::rec_guid(&self.dsl.dir(), self.id).unwrap_or(0)
    }

    /// When the dataset (or snapshot) was created, in seconds since the
    /// epoch: a snapshot's time, as SMB's "Previous Versions" shows it.
    pub fn created_unix(&self) -> u64 {
        self.dsl
            .dir()
            .rec(self.id)
            .map(|r| r.created_unix)
            .unwrap_or(0)
    }

    /// True when the dataset is encrypted (its values and blocks are sealed).
    pub fn is_encrypted(&self) -> bool {
        self.key.is_some()
    }

    /// True when changes are refused (snapshot, `readonly=on`).
    pub fn is_readonly(&self) -> bool {
        self.readonly
    }

    /// Bytes the dataset may still write, and its used bytes (as `list`
    /// reports them).
    pub fn space(&self) -> (u64, u64) {
        let dir = self.dsl.dir();
        (
            dir.available(self.cx, self.id),
            dir.deflate(dir.used(self.id).asize),
        )
    }

    /// What the dataset holds under `key`: the open txg's changes over the
    /// committed tree.
    fn found(&mut self, key: &[u8]) -> Result<Option<Found>, DsError> {
        let store = self.cx.store();
        self.st.view().get(&store, key)
    }

    /// Records a change of `key` in the open overlay, journaling the entry
    /// it replaces.
    fn set(&mut self, key: &[u8], c: Change) -> Result<(), DsError> {
        let prev = self.st.open.set(key, c);
        if let Some(Change::Block(b)) = &prev {
            self.released.push(b.clone());
        }
        self.undo.push(Undo::Entry(key.to_vec(), prev));
        Ok(())
    }

    /// The value under `key`.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Value>, DsError> {
        match self.found(key)? {
            Some(f) => self.value_of(key, f).map(Some),
            None => Ok(None),
        }
    }

    /// [`Txn::get`] of many keys, given in ascending order (the order the
    /// tree stores them): one walk of the tree instead of one per key.
    pub fn get_many(&mut self, keys: &[&[u8]]) -> Result<Vec<Option<Value>>, DsError> {
        let mut found = Vec::with_capacity(keys.len());
        {
            let store = self.cx.store();
            self.st
                .view()
                .get_sorted(&store, keys, &mut |i, f| found.push((i, f)))?;
        }
        let mut out: Vec<Option<Value>> = (0..keys.len()).map(|_| None).collect();
        for (i, f) in found {
            out[i] = Some(self.value_of(keys[i], f)?);
        }
        Ok(out)
    }

    /// Stores a plain value.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), DsError> {
        self.ro_check()?;
        if value.len() > MAX_PLAIN {
            return Err(DsError::Invalid(format!(
                "value of {} bytes exceeds {MAX_PLAIN}",
                value.len()
            )));
        }
        check_key(key)?;
        let stored = match &self.key {
            // A raw receive stores sealed values as the sender had them.
            None if self.mode == Mode::ReceiveRaw => value.to_vec(),
            Some(k) => {
                let sealed = k.seal_value(key, value)?;
                if sealed.len() > MAX_PLAIN {
                    return Err(DsError::Invalid(format!(
                        "value of {} bytes exceeds {} in an encrypted dataset",
                        value.len(),
                        MAX_PLAIN - tarn_block::crypt::SEALED_OVERHEAD
                    )));
                }
                sealed
            }
            None => value.to_vec(),
        };
        self.set(key, Change::Plain(stored))?;
        self.logged(|| LogOp::Put(key.to_vec(), value.to_vec()));
        Ok(())
    }

    /// Notes a successful operation for the intent log.
    fn logged(&mut self, op: impl FnOnce() -> LogOp) {
        if self.mode == Mode::Normal {
            self.ops.push(op());
        }
    }

    /// Removes `key` (freeing its block); false if it was absent.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool, DsError> {
        self.ro_check()?;
        if self.found(key)?.is_none() {
            return Ok(false);
        }
        self.set(key, Change::Delete)?;
        self.logged(|| LogOp::Delete(key.to_vec()));
        Ok(true)
    }

    /// Up to `limit` entries inside `start..end`.
    pub fn range(
        &mut self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Value)>, DsError> {
        if tarn_tree::range_is_empty(start, end) {
            return Ok(Vec::new());
        }
        let page = {
            let store = self.cx.store();
            self.st.view().range(&store, start, end, limit)?
        };
        let mut out = Vec::with_capacity(page.len());
        for (k, f) in page {
            let v = self.value_of(&k, f)?;
            out.push((k, v));
        }
        Ok(out)
    }

    /// Removes every key inside `start..end`, freeing their blocks when the
    /// txg syncs. Costs the same whatever the range holds.
    pub fn delete_range(&mut self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<(), DsError> {
        self.ro_check()?;
        if tarn_tree::range_is_empty(start, end) {
            return Ok(());
        }
        for b in [start, end] {
            if let Bound::Included(k) | Bound::Excluded(k) = b {
                check_key(k)?;
            }
        }
        let removed = self.st.open.delete_range(start, end);
        for (_, c) in &removed.removed {
            if let Change::Block(b) = c {
                self.released.push(b.clone());
            }
        }
        self.undo.push(Undo::Range(removed));
        let own = |b: Bound<&[u8]>| b.map(<[u8]>::to_vec);
        self.logged(|| LogOp::DeleteRange(own(start), own(end)));
        Ok(())
    }

    /// Stages `data` as a data block under `key` for the next sync. All
    /// zeros deletes the key instead (a hole takes no space).
    pub fn write_block(&mut self, key: &[u8], data: Vec<u8>) -> Result<(), DsError> {
        self.ro_check()?;
        check_key(key)?;
        if data.len() > MAX_BLOCK {
            return Err(DsError::Invalid(format!(
                "block of {} bytes exceeds {MAX_BLOCK}",
                data.len()
            )));
        }
        match self.stage(key, data)? {
            Staged::Block(data) => self.logged(|| LogOp::Block(key.to_vec(), data)),
            Staged::Deleted => self.logged(|| LogOp::Delete(key.to_vec())),
            Staged::Nothing => {}
        }
        Ok(())
    }

    /// Stores blocks exactly as another pool stored them (a raw receive):
    /// written now into room taken here, born in this txg, and staged as
    /// written, so the sync adds them to the tree as they are. Only in a
    /// raw receive, whose dataset nobody reads until it is complete (the
    /// staged entries hold no logical bytes).
    pub(crate) fn write_raw_blocks(
        &mut self,
        blocks: &[(Vec<u8>, crate::send::RawBlock)],
    ) -> Result<(), DsError> {
        if self.mode != Mode::ReceiveRaw {
            return Err(DsError::Invalid("raw blocks outside a raw receive".into()));
        }
        // An encrypted dataset's blocks are all sealed: an unsealed one in
        // a raw stream is plaintext put there by someone without the key.
        let encrypted = self.dsl.dir().rec(self.id)?.key.is_some();
        if let Some((k, _)) = blocks.iter().find(|(_, b)| (b.seal.is_some()) != encrypted) {
            return Err(DsError::Invalid(format!(
                "the raw stream holds a{} block under key {k:02x?} in a{} dataset",
                if encrypted { "n unsealed" } else { " sealed" },
                if encrypted {
                    "n encrypted"
                } else {
                    "n unencrypted"
                }
            )));
        }
        let mut rooms = Vec::with_capacity(blocks.len());
        let mut unpublished = self.unpublished();
        for (_, b) in blocks {
            let res = reserve(
                self.dsl,
                self.cx,
                self.id,
                false,
                b.lsize as u64,
                0,
                unpublished,
            )?;
            unpublished += res.asize();
            self.reserved.push(res.clone());
            rooms.push(res);
        }
        let (alg, copies) = {
            let dir = self.dsl.dir();
            (
                tarn_block::ChecksumAlg::parse(&dir.prop(self.id, "checksum").0)
                    .unwrap_or_default(),
                dir.copies(self.id),
            )
        };
        let mut stored = Vec::with_capacity(blocks.len());
        for ((_, b), res) in blocks.iter().zip(&rooms) {
            let compress = tarn_block::CompressAlg::from_u8(b.compress)?;
            stored.push((
                tarn_pool::RawStored {
                    stored: &b.stored,
                    lsize: b.lsize,
                    compress,
                    seal: b.seal,
                },
                res.clone(),
            ));
        }
        let written = self.cx.write_raw_now(stored, alg, copies)?;
        // Writing trimmed the rooms to the blocks: what a failed
        // transaction gives back is what the blocks hold now.
        self.reserved.truncate(self.reserved.len() - rooms.len());
        self.reserved
            .extend(written.iter().map(Reservation::of_block));
        for ((key, _), bp) in blocks.iter().zip(written) {
            let dirty = bp.psize as u64;
            self.cx.charge(dirty);
            self.charged_dirty += dirty;
            let b = StagedBlock::new(Arc::new(Vec::new()), Reservation::of_block(&bp), Some(bp));
            self.set(key, Change::Block(Arc::new(b)))?;
        }
        Ok(())
    }

    /// Room this transaction's staged blocks took that the dataset's
    /// pending figure does not count yet (it is published when the
    /// transaction ends): the quota check of each further block counts
    /// it, so one large request cannot pass a quota whole.
    fn unpublished(&self) -> u64 {
        self.st
            .staged_asize()
            .saturating_sub(self.live.pending.load(Ordering::Relaxed))
    }

    /// Stages `data` under `key`; all zeros deletes the key instead.
    fn stage(&mut self, key: &[u8], data: Vec<u8>) -> Result<Staged, DsError> {
        if data.iter().all(|&b| b == 0) {
            if self.found(key)?.is_some() {
                self.set(key, Change::Delete)?;
                return Ok(Staged::Deleted);
            }
            return Ok(Staged::Nothing);
        }
        let len = data.len() as u64;
        // Quotas and reservations first, then the room itself: allocated
        // now, so the sync that writes the block cannot run out of space.
        let unpublished = self.unpublished();
        let res = reserve(self.dsl, self.cx, self.id, self.replay, len, 0, unpublished)?;
        self.reserved.push(res.clone());
        self.cx.charge(len);
        self.charged_dirty += len;
        let data = Arc::new(data);
        self.set(
            key,
            Change::Block(Arc::new(StagedBlock::new(data.clone(), res, None))),
        )?;
        Ok(Staged::Block(data))
    }

    /// Writes `bytes` at `off` into the data block under `key`, after
    /// extending it with zeros to at least `len` bytes (an absent key is an
    /// empty block); returns the block's length before and after, 0 for a
    /// hole. The open txg's own block is changed in place when nobody else
    /// holds it (see `overlay`), so a small write into a large record costs
    /// its own size in memory, in the write throttle and in the intent log;
    /// otherwise a patched copy is staged. A block left all zeros is
    /// deleted, as by [`Txn::write_block`].
    pub fn patch_block(
        &mut self,
        key: &[u8],
        len: usize,
        off: usize,
        bytes: Vec<u8>,
    ) -> Result<(usize, usize), DsError> {
        self.ro_check()?;
        check_key(key)?;
        let need = len.max(patch_end(len, off, bytes.len())?);
        let zeros = bytes.iter().all(|&b| b == 0);
        let lens = match self.patch_in_place(key, need, off, &bytes, zeros)? {
            Some(lens) => lens,
            None => {
                let mut data = self.read_block(key)?.unwrap_or_default();
                let before = data.len();
                if zeros && before == 0 {
                    // A hole stays a hole.
                    (0, 0)
                } else {
                    patch_checked(&mut data, need, off, &bytes);
                    let after = data.len();
                    match self.stage(key, data)? {
                        // The write gave every byte of the block (a small
                        // file written at once): logged as a whole block,
                        // so a large one is written in place by an fsync
                        // rather than copied into the log (see `zil`).
                        Staged::Block(data) if off == 0 && bytes.len() == after => {
                            self.logged(|| LogOp::Block(key.to_vec(), data));
                            return Ok((before, after));
                        }
                        Staged::Block(_) => (before, after),
                        Staged::Deleted | Staged::Nothing => (before, 0),
                    }
                }
            }
        };
        self.logged(|| LogOp::Patch {
            key: key.to_vec(),
            len: len as u32,
            off: off as u32,
            bytes,
        });
        Ok(lens)
    }

    /// [`Txn::patch_block`] on the open overlay's own block, when nobody
    /// else holds it; `None` (and nothing changed) otherwise. `need`: the
    /// length the block grows to at least (checked by the caller).
    fn patch_in_place(
        &mut self,
        key: &[u8],
        need: usize,
        off: usize,
        bytes: &[u8],
        zeros: bool,
    ) -> Result<Option<(usize, usize)>, DsError> {
        let (dsl, id, replay) = (self.dsl, self.id, self.replay);
        let copies = dsl.dir().copies(id);
        let unpublished = self.unpublished();
        let cx = &mut *self.cx;
        let Some(done) = self.st.open.in_place(key, |m| {
            let cur = m.data.len();
            let new_len = cur.max(need);
            // A grown block may need more room than it holds, and a block
            // written after `copies` changed needs room for as many
            // copies: taken before anything changes.
            let room = if cx.room_fits(m.res, new_len as u64, copies) {
                None
            } else {
                let res = reserve(
                    dsl,
                    cx,
                    id,
                    replay,
                    new_len as u64,
                    m.res.asize(),
                    unpublished,
                )?;
                let charged = std::mem::replace(m.charged, res.asize());
                Some((std::mem::replace(m.res, res), charged))
            };
            let at = off.min(cur);
            let old = m.data[at..(off + bytes.len()).min(cur)].to_vec();
            patch_checked(m.data, need, off, bytes);
            let hole = zeros && m.data.iter().all(|&b| b == 0);
            let undo = Undo::Patch {
                key: key.to_vec(),
                len: cur,
                at,
                old,
                room,
            };
            Ok::<_, DsError>((undo, cur, new_len, hole, m.res.clone()))
        }) else {
            return Ok(None);
        };
        let (undo, cur, new_len, hole, res) = done?;
        if let Undo::Patch {
            room: Some((old_room, _)),
            ..
        } = &undo
        {
            // The new room is the block's now: given back if the
            // transaction fails, the old one if it succeeds.
            self.reserved.push(res);
            self.outgrown.push(old_room.clone());
        }
        self.undo.push(undo);
        let dirty = (bytes.len() + (new_len - cur)) as u64;
        self.cx.charge(dirty);
        self.charged_dirty += dirty;
        if hole {
            self.set(key, Change::Delete)?;
            return Ok(Some((cur, 0)));
        }
        Ok(Some((cur, new_len)))
    }

    /// Redoes one operation of the intent log (see `zil`).
    pub(crate) fn redo(&mut self, op: &LogOp) -> Result<(), DsError> {
        match op {
            LogOp::Put(k, v) => self.put(k, v),
            LogOp::Delete(k) => self.delete(k).map(|_| ()),
            LogOp::DeleteRange(a, b) => {
                self.delete_range(a.as_ref().map(Vec::as_slice), b.as_ref().map(Vec::as_slice))
            }
            LogOp::Block(k, d) => self.write_block(k, d.as_ref().clone()),
            LogOp::Patch {
                key,
                len,
                off,
                bytes,
            } => self
                .patch_block(key, *len as usize, *off as usize, bytes.clone())
                .map(|_| ()),
            LogOp::BlockRef(k, bp) => {
                // Written before the crash into room import claimed; read
                // back through its checksum before anything refers to it,
                // and made whole (a device may have missed the write).
                let data = self
                    .cx
                    .read_block_repairing(bp, self.key.as_deref())
                    .map_err(|e| {
                        DsError::Damaged(format!(
                        "intent log: the block written for key {k:02x?} does not read back: {e}"
                    ))
                    })?;
                if data.len() != bp.lsize as usize {
                    return Err(DsError::Corrupt(format!(
                        "intent log: block for key {k:02x?} has {} bytes, its pointer says {}",
                        data.len(),
                        bp.lsize
                    )));
                }
                self.cx.charge(data.len() as u64);
                self.charged_dirty += data.len() as u64;
                let b = StagedBlock::new(Arc::new(data), Reservation::of_block(bp), Some(*bp));
                self.set(k, Change::Block(Arc::new(b)))
            }
        }
    }

    /// The bytes of the data block under `key`.
    pub fn read_block(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, DsError> {
        match self.found(key)? {
            None => Ok(None),
            Some(Found::Staged(b)) => Ok(Some(b.data.as_ref().clone())),
            Some(Found::Block(bp)) => match self.cx.read_block(&bp, self.key.as_deref()) {
                Ok(d) => Ok(Some(d)),
                Err(e) => {
                    let name = crate::dsl::rec_name(&self.dsl.dir(), self.id).unwrap_or_default();
                    let what = format!("dataset {name}: block at key {key:02x?}");
                    self.cx.report_damage(what.clone());
                    Err(DsError::Damaged(format!("{what}: {e}")))
                }
            },
            Some(Found::Plain(_) | Found::Sealed(_)) => Err(DsError::Invalid(format!(
                "key {key:02x?} holds a plain value, not a block"
            ))),
        }
    }

    /// The data block under `key`, to read after the transaction (see the
    /// module docs): None if absent, an error if the key holds a plain
    /// value.
    pub fn block_ref(&mut self, key: &[u8]) -> Result<Option<BlockRef>, DsError> {
        match self.found(key)? {
            None => Ok(None),
            Some(Found::Staged(b)) => Ok(Some(BlockRef(RefInner::Staged(b.data.clone())))),
            // Found in the committed tree of `tree_txg`: the hold keeps
            // every block it references from reuse until the read is done.
            Some(Found::Block(bp)) => Ok(Some(BlockRef(RefInner::Committed {
                bp,
                hold: self.cx.hold(self.st.tree_txg),
                id: self.id,
                key: key.to_vec(),
                crypt: self.key.clone(),
            }))),
            Some(Found::Plain(_) | Found::Sealed(_)) => Err(DsError::Invalid(format!(
                "key {key:02x?} holds a plain value, not a block"
            ))),
        }
    }

    fn rollback(&mut self) {
        self.cx.uncharge(self.charged_dirty);
        for r in std::mem::take(&mut self.reserved) {
            self.cx.release_block(r);
        }
        self.released.clear();
        self.outgrown.clear();
        self.ops.clear();
        while let Some(u) = self.undo.pop() {
            match u {
                Undo::Entry(k, prev) => self.st.open.restore(&k, prev),
                Undo::Range(u) => self.st.open.undo_delete_range(u),
                Undo::Patch {
                    key,
                    len,
                    at,
                    old,
                    room,
                } => self.unpatch(&key, len, at, &old, room),
            }
        }
        self.live
            .pending
            .store(self.st.staged_asize(), Ordering::Relaxed);
    }

    /// Undoes a patch in place (see [`Undo::Patch`]).
    fn unpatch(
        &mut self,
        key: &[u8],
        len: usize,
        at: usize,
        old: &[u8],
        room: Option<(Reservation, u64)>,
    ) {
        let mut room = room;
        let put_back = |data: &mut Vec<u8>| {
            data[at..at + old.len()].copy_from_slice(old);
            data.truncate(len);
        };
        let done = self.st.open.in_place(key, |m| {
            put_back(m.data);
            if let Some((res, charged)) = room.take() {
                *m.res = res;
                *m.charged = charged;
            }
        });
        if done.is_some() {
            return;
        }
        // The transaction itself took a share of the patched bytes (a
        // block reference): put a restored copy in their place.
        let Some(b) = self.st.open.staged_at(key).cloned() else {
            // Undo runs in reverse: the patched block is back in place by
            // now. If not, the open txg holds what a failed operation
            // wrote, and must not commit.
            self.cx.fault(format!(
                "undoing a write into the block at key {key:02x?}: the block is gone; the \
                 pool stopped so that the failed write is not committed"
            ));
            return;
        };
        let mut data = b.data.as_ref().clone();
        put_back(&mut data);
        let res = match room {
            Some((res, _)) => res,
            None => b.slot().res.clone(),
        };
        let restored = StagedBlock::new(Arc::new(data), res, None);
        self.st.open.set(key, Change::Block(Arc::new(restored)));
    }

    fn finish(&mut self) -> Result<(), DsError> {
        let txg = self.cx.txg();
        for op in std::mem::take(&mut self.ops) {
            let seq = self.st.log_seq;
            self.st.log_seq += 1;
            self.st.log.push((txg, seq, op));
        }
        // Keys and plain values held for the sync count against the write
        // throttle too, so a txg of metadata changes stays bounded.
        let plain = self.st.open.plain_bytes();
        if plain > self.plain_before {
            self.cx.charge(plain - self.plain_before);
        }
        self.reserved.clear();
        for r in std::mem::take(&mut self.outgrown) {
            self.cx.release_block(r);
        }
        for b in std::mem::take(&mut self.released) {
            let slot = {
                let mut s = b.slot();
                s.released = true;
                s.clone()
            };
            match slot.written {
                // Only the intent log refers to it: freed after the sync of
                // this txg.
                Some(bp) => {
                    // Only the open txg's blocks are written early, and a
                    // transaction replaces only blocks of its own txg; a
                    // replayed block was born in the txg of its record.
                    debug_assert!(
                        bp.birth == txg || (self.replay && bp.birth < txg),
                        "released a block born in txg {} in txg {txg}",
                        bp.birth
                    );
                    self.cx.log_free(txg, bp)
                }
                None => self.cx.release_block(slot.res),
            }
        }
        self.live
            .pending
            .store(self.st.staged_asize(), Ordering::Relaxed);
        Ok(())
    }
}

/// Runs `f` as one transaction on dataset `id` (see the module docs);
/// the outer result is the dataset layer's, the inner one `f`'s.
pub(crate) fn run<R, E>(
    dsl: &Dsl,
    cx: &mut Cx<'_>,
    id: u64,
    replay: bool,
    readonly: bool,
    f: impl FnOnce(&mut Txn<'_, '_>) -> Result<R, E>,
) -> Result<Result<R, E>, DsError> {
    let mode = if replay { Mode::Replay } else { Mode::Normal };
    run_mode(dsl, cx, id, mode, readonly, f)
}

/// [`run`] in any [`Mode`].
pub(crate) fn run_mode<R, E>(
    dsl: &Dsl,
    cx: &mut Cx<'_>,
    id: u64,
    mode: Mode,
    readonly: bool,
    f: impl FnOnce(&mut Txn<'_, '_>) -> Result<R, E>,
) -> Result<Result<R, E>, DsError> {
    let replay = mode == Mode::Replay;
    // Locked (encrypted, key not loaded): refused before anything is read,
    // except by a raw receive, which never needs the key.
    let key = {
        let dir = dsl.dir();
        // A dataset being received is the receive's alone: a handle
        // opened before its stream began (a volume its share had open)
        // must neither write into the stream nor read half of it.
        if mode == Mode::Normal {
            if let Some(r) = dir.recs.get(&id) {
                crate::ops::not_being_received(r)?;
            }
        }
        if mode == Mode::ReceiveRaw {
            None
        } else {
            dir.keyset(id)?
        }
    };
    let live = dsl.live(id)?;
    let mut st = live.lock();
    let plain_before = st.open.plain_bytes();
    let mut t = Txn {
        dsl,
        live: &live,
        st: &mut st,
        cx,
        id,
        readonly,
        undo: Vec::new(),
        charged_dirty: 0,
        reserved: Vec::new(),
        released: Vec::new(),
        outgrown: Vec::new(),
        ops: Vec::new(),
        replay,
        mode,
        plain_before,
        key,
    };
    match f(&mut t) {
        Ok(v) => {
            t.finish()?;
            Ok(Ok(v))
        }
        Err(e) => {
            t.rollback();
            Ok(Err(e))
        }
    }
}

/// A dataset or snapshot to run transactions on.
#[derive(Clone)]
pub struct DatasetHandle {
    pool: Arc<Pool>,
    id: u64,
    guid: u64,
    name: String,
    snapshot: bool,
}

impl std::fmt::Debug for DatasetHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DatasetHandle({})", self.name)
    }
}

impl DatasetHandle {
    pub(crate) fn new(pool: Arc<Pool>, id: u64, guid: u64, name: String, snapshot: bool) -> Self {
        DatasetHandle {
            pool,
            id,
            guid,
            name,
            snapshot,
        }
    }

    /// The dataset's name when the handle was opened.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stable 64-bit id.
    pub fn guid(&self) -> u64 {
        self.guid
    }

    /// True for snapshots.
    pub fn is_snapshot(&self) -> bool {
        self.snapshot
    }

    /// The geometry of a volume (or a snapshot of one) now; None for a
    /// filesystem. A volume's size changes only by
    /// [`crate::set_volsize`] or a rollback.
    pub fn volume(&self) -> Result<Option<crate::VolSpec>, DsError> {
        let id = self.id;
        with_dsl(&self.pool, false, |dsl, _| {
            let dir = dsl.dir();
            let r = dir.rec(id)?;
            match (r.volume, r.kind) {
                (None, crate::DatasetKind::Volume) => Err(DsError::Corrupt(format!(
                    "volume '{}' has no geometry in its record",
                    r.name
                ))),
                (Some(v), _) => crate::check_volspec(v).map(|()| Some(v)).map_err(|e| {
                    DsError::Corrupt(format!("volume '{}': its record's geometry: {e}", r.name))
                }),
                (None, _) => Ok(None),
            }
        })
    }

    /// Sets this volume's size from `expected` to `size` (see the volume
    /// layer's resize, which deletes the keys past the smaller size
    /// first): by id, and only if the size is still `expected`.
    pub fn set_volsize(&self, expected: u64, size: u64) -> Result<(), DsError> {
        if self.snapshot {
            return Err(DsError::ReadOnly(format!(
                "'{}' is a snapshot: its size is fixed",
                self.name
            )));
        }
        crate::ops::set_volsize(&self.pool, self.id, expected, size)
    }

    /// [`DsError::Locked`] (naming the key to load) when the dataset is
    /// encrypted and its key is not loaded: what front ends check before
    /// they open it.
    pub fn check_unlocked(&self) -> Result<(), DsError> {
        let id = self.id;
        with_dsl(&self.pool, false, |dsl, _| {
            let dir = dsl.dir();
            // A snapshot is being received when its dataset is.
            let head = dir.rec(id)?.head.unwrap_or(id);
            if dir.rec(head)?.recv.is_some() && head == id {
                return Err(DsError::Busy(format!(
                    "'{}' is being received: it can be used once the stream is complete",
                    self.name
                )));
            }
            dir.keyset(id).map(|_| ())
        })
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Runs `f` as one atomic transaction (see the module docs). Errors of
    /// the dataset layer convert into the caller's error type.
    pub fn txn<R, E: From<DsError>>(
        &self,
        write: bool,
        f: impl FnOnce(&mut Txn<'_, '_>) -> Result<R, E>,
    ) -> Result<R, E> {
        let id = self.id;
        let snapshot = self.snapshot;
        let r = with_dsl(&self.pool, write, |dsl, cx| {
            let readonly = snapshot || dsl.dir().prop_bool(id, "readonly");
            run(dsl, cx, id, false, readonly, f)
        });
        match r {
            Ok(inner) => inner,
            Err(e) => Err(E::from(e)),
        }
    }

    /// The blocks under `keys`, as [`Txn::block_ref`] finds them, looked up
    /// without waiting: None, at once, if that would wait for a lock (a
    /// transaction of this dataset, an exclusive operation) or for a tree
    /// node that is not cached, or if the lookup fails (the caller then
    /// looks up the usual way, which reports the failure). For a front
    /// end that answers a read from memory on its network thread and
    /// hands it to a blocking thread only when it must.
    pub fn try_block_refs(&self, keys: &[&[u8]]) -> Option<Vec<Option<BlockRef>>> {
        let id = self.id;
        let found = self.pool.try_with_ext::<Dsl, _>(|dsl, cx| {
            let crypt = {
                let dir = dsl.try_dir()?;
                // A dataset being received: the transaction path says why.
                if !dir.loaded || dir.recs.get(&id).is_none_or(|r| r.recv.is_some()) {
                    return None;
                }
                dir.keyset(id).ok()?
            };
            let live = dsl.try_live(id)?;
            let mut st = live.try_lock()?;
            let store = cx.cached_store();
            let mut out = Vec::with_capacity(keys.len());
            for &key in keys {
                let found = st.view().get(&store, key);
                if store.missed() {
                    return None;
                }
                out.push(match found.ok()? {
                    None => None,
                    Some(Found::Staged(b)) => Some(BlockRef(RefInner::Staged(b.data.clone()))),
                    Some(Found::Block(bp)) => Some(BlockRef(RefInner::Committed {
                        bp,
                        hold: cx.hold(st.tree_txg),
                        id,
                        key: key.to_vec(),
                        crypt: crypt.clone(),
                    })),
                    Some(Found::Plain(_) | Found::Sealed(_)) => return None,
                });
            }
            Some(out)
        })?;
        found.ok()
    }

    /// Makes every finished transaction of this dataset durable: through
    /// the intent log when it can, else by committing the txg. With
    /// `sync=disabled` it returns at once (documented as unsafe).
    pub fn sync(&self) -> Result<(), DsError> {
        if self.snapshot {
            return Ok(());
        }
        let id = self.id;
        let mut may_wait = true;
        loop {
            let r = with_dsl(&self.pool, false, |dsl, cx| {
                crate::zil::commit(dsl, cx, id, may_wait)
            });
            match r {
                Ok(crate::zil::Commit::Durable) => return Ok(()),
                // Once, so an fsync under a steady stream of writes cannot
                // chase txg after txg: the second commit logs what is left.
                Ok(crate::zil::Commit::WaitForSync) if may_wait => {
                    self.pool.wait_for_sync();
                    may_wait = false;
                }
                // Whatever keeps the log from taking it, a txg commit is
                // durable too.
                _ => {
                    self.pool.sync()?;
                    return Ok(());
                }
            }
        }
    }

    /// After a write found the pool full: commits txgs until the space
    /// of what was deleted before comes back (a fast writer that deletes
    /// as it goes can fill a pool within one txg: its deletes free space
    /// only when their txg syncs, and two txgs later). True when there is
    /// more free space than before (for a quota: less used by the
    /// dataset), so the failed write is worth one more try.
    pub fn reclaim_space(&self) -> bool {
        // The open txg's deletes become frees at its sync, and frees are
        // deferred by two more txgs.
        const RECLAIM_SYNCS: usize = 3;
        let used = || {
            self.txn(false, |t| Ok::<u64, DsError>(t.space().1))
                .unwrap_or(0)
        };
        let (free, mine) = (self.pool.list_entry().free, used());
        for _ in 0..RECLAIM_SYNCS {
            if self.pool.sync().is_err() {
                return false;
            }
        }
        self.pool.list_entry().free > free || used() < mine
    }

    /// This filesystem's snapshots, oldest first, as handles.
    pub fn snapshots(&self) -> Result<Vec<(String, DatasetHandle)>, DsError> {
        if self.snapshot {
            return Ok(Vec::new());
        }
        let id = self.id;
        let pool = self.pool.clone();
        with_dsl(&self.pool, false, |dsl, _| {
            let dsl = &*dsl.dir();
            Ok(crate::dsl::snapshot_ids(dsl, id)
                .into_iter()
                .filter_map(|(name, sid)| {
                    let guid = crate::dsl::rec_guid(dsl, sid).ok()?;
                    let short = name.split_once('@').map(|(_, s)| s.to_string())?;
                    Some((
                        short,
                        DatasetHandle::new(pool.clone(), sid, guid, name, true),
                    ))
                })
                .collect())
        })
    }

    /// The committed block pointers of the keys in `start..end`, in key
    /// order: a diagnostic view (like `zdb`) for drills and tests. Changes
    /// of the open txg are not included.
    pub fn committed_blocks(
        &self,
        start: &[u8],
        end: &[u8],
    ) -> Result<Vec<(Vec<u8>, BlockPtr)>, DsError> {
        let id = self.id;
        with_dsl(&self.pool, false, |dsl, cx| {
            let store = cx.store();
            let live = dsl.live(id)?;
            let live = &mut *live.lock();
            let mut out = Vec::new();
            let mut from = Bound::Included(start.to_vec());
            loop {
                let page = live.tree.range(
                    &store,
                    from.as_ref().map(Vec::as_slice),
                    Bound::Excluded(end),
                    1024,
                )?;
                let Some((last, _)) = page.last() else {
                    return Ok(out);
                };
                from = Bound::Excluded(last.clone());
                for (k, v) in page {
                    if let Found::Block(bp) = decode_tree_value(v, &k)? {
                        out.push((k, bp));
                    }
                }
            }
        })
    }

    /// The committed root of this dataset's tree (for tests and tools).
    pub fn root(&self) -> Result<BlockPtr, DsError> {
        let id = self.id;
        with_dsl(&self.pool, false, |dsl, _| {
            crate::dsl::rec_root(&dsl.dir(), id)
        })
    }
}
