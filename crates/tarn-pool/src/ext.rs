//! The seam through which a higher layer (datasets) keeps state in the pool.
//!
//! # Theory
//!
//! The pool knows nothing of datasets, yet dataset changes must commit in the
//! same txg as everything else, in the sync order of `docs/design.md`. So
//! the dataset layer installs one [`Extension`]: an object the pool calls at
//! each step of a txg's life (see `txg`). It keeps its own locks, so open
//! context, the syncer and exclusive operations reach it concurrently:
//!
//! * **Open context** ([`Pool::with_ext`]) holds the gate shared and gets a
//!   [`Cx`] for the open txg: room for data blocks (allocated at once:
//!   admission is allocation), verified block reads through the block
//!   cache, the write throttle's charges, damage reports, the intent log.
//! * **Quiesce** ([`Extension::quiesce`]): the open txg closes; the
//!   extension sets its changes aside. Nothing in open context runs then.
//! * **Sync** ([`Extension::sync`]) with a [`SyncCx`]: the extension writes
//!   the txg's data blocks and tree nodes and puts its records into its
//!   namespace of the meta tree, which commits after it. Open context goes
//!   on meanwhile.
//! * **Committed** ([`Extension::committed`]): the txg is durable; the
//!   extension publishes its trees to readers.
//! * **Exclusive operations** ([`Pool::with_ext_exclusive`]): with the pool
//!   quiet and everything pending committed, a [`SyncCx`] for the next txg,
//!   which commits before the call returns (dataset administration).
//!
//! The pool must still be able to *scan* what the extension references
//! without understanding it, from its own thread and without any lock. The
//! extension therefore also registers a pure [`ScanFn`]: given a meta entry
//! of its namespace (tree kind 0) or an entry of one of its own trees, it
//! names the block pointers and sub-trees inside. Scrub, resilver and the
//! leak check walk those.

use std::any::Any;
use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tarn_block::pipeline::{self, Missed, Prepared};
use tarn_block::{BlockPtr, BlockType, ChecksumAlg, Compression, Dva, KeySet};
use tarn_tree::NodeStore;

use crate::pool::{Pool, SyncState};
use crate::sync::parallel_map;
use crate::PoolError;

/// A key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// Meta-tree prefix of the extension's namespace.
pub(crate) const P_EXT: u8 = 0x40;

/// How many bytes of data blocks are prepared (compressed, sealed,
/// checksummed) before they are written, see [`Pool::write_data`]: enough
/// for every sync worker to have many blocks, and for neighbouring blocks
/// to merge into long device writes; the window written and the next,
/// prepared meanwhile, fit in the spare buffers together.
pub(crate) const WRITE_WINDOW: usize = 32 << 20;

/// The blocks of one window: bytes, how to store them, their room.
type Window<'a> = Vec<DataBlock<'a>>;

/// A data block to write: its logical bytes, how to store it, and the
/// room it already holds, if any.
type DataBlock<'a> = (&'a [u8], BlockOpts, Option<Reservation>);

/// A window's blocks as prepared: None for a hole.
type PreparedWindow<'a> = Vec<Option<Prepared<'a>>>;

/// Which rooms [`SyncCx::write_blocks`] writes its blocks into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rooms {
    /// Each block into the room it holds (or one allocated now): for
    /// blocks whose rooms something may already name (a log record).
    AsHeld,
    /// The rooms handed out again in the order of the blocks
    /// ([`rooms_in_block_order`]): only for a txg's staged blocks that
    /// nothing has written yet, so neighbouring keys lie side by side.
    InBlockOrder,
}

/// Hands the rooms of `blocks` out again so that, among blocks whose
/// rooms have the same shape (the same devices and sizes, copy by copy),
/// the first block gets the lowest room, the next the next one, and so
/// on; blocks without a room, and rooms of other shapes, are left alone.
///
/// Why it is safe: it runs only in a txg's sync, on blocks not written yet
/// ([`SyncCx::write_blocks`] with [`Rooms::InBlockOrder`]), whose rooms were all
/// allocated for that txg (admission is allocation) and are named by
/// nothing else. The intent log writes early only blocks of the open txg,
/// under their slots, and a txg being synced is no longer open, so none of
/// these rooms is written, or named by a log record, before the sync
/// writes it. Every block gets a room exactly as large as
/// the one it had, so the txg's space, and each dataset's, is unchanged;
/// the pointers the sync returns name the rooms the blocks went to.
fn rooms_in_block_order(blocks: &mut [DataBlock<'_>]) {
    type Shape = Vec<(u32, u32)>;
    let mut groups: std::collections::HashMap<Shape, Vec<usize>> = std::collections::HashMap::new();
    for (i, (_, _, res)) in blocks.iter().enumerate() {
        if let Some(r) = res.as_ref().filter(|r| !r.dvas.is_empty()) {
            let shape = r.dvas.iter().map(|d| (d.vdev, d.asize)).collect();
            groups.entry(shape).or_default().push(i);
        }
    }
    for members in groups.into_values() {
        let mut rooms: Vec<Reservation> =
            members.iter().filter_map(|&i| blocks[i].2.take()).collect();
        rooms.sort_by_cached_key(|r| {
            r.dvas
                .iter()
                .map(|d| (d.vdev, d.offset))
                .collect::<Vec<_>>()
        });
        for (&i, room) in members.iter().zip(rooms) {
            blocks[i].2 = Some(room);
        }
    }
}

/// The guard of a lock taken without waiting, if it was free (a poisoned
/// lock counts as free, as everywhere in this crate).
fn free_now<G>(r: std::sync::TryLockResult<G>) -> Option<G> {
    match r {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Pool state owned by a higher layer, called at each step of a txg (see
/// the module docs). Implementations keep their own locks.
pub trait Extension: Send + Sync {
    /// True when a sync would find changes of this extension.
    fn has_changes(&self) -> bool;
    /// Open txg `txg` closes: set its changes aside for the sync. Called
    /// while no open-context operation runs.
    fn quiesce(&self, _txg: u64) {}
    /// Writes this extension's part of the txg being synced (`cx.txg()`).
    /// Called first in the sync, before the meta tree commits. An error
    /// faults the pool.
    fn sync(&self, cx: &mut SyncCx<'_>) -> Result<(), PoolError>;
    /// Txg `txg` is durable: publish it.
    fn committed(&self, _txg: u64) {}
    /// For the downcasts of [`Pool::with_ext`] and
    /// [`Pool::with_ext_exclusive`].
    fn as_any(&self) -> &dyn Any;
}

/// Something an extension entry references, for scans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtRef {
    /// A block to verify.
    Block(BlockPtr),
    /// A tree to walk. `id` orders trees and bookmarks a resumed scan;
    /// blocks born at or before `min_birth` are reachable elsewhere (an
    /// older snapshot) and are skipped; `kind` is passed back to the
    /// [`ScanFn`] for the tree's entries.
    Tree {
        /// Stable identity, never reused.
        id: u64,
        /// Root of the committed tree.
        root: BlockPtr,
        /// Prune blocks born at or before this txg.
        min_birth: u64,
        /// Passed to the scan function for entries of this tree.
        kind: u8,
    },
    /// An entry the scan function could not decode, and so cannot say what
    /// it references: what it is. A scrub counts it as an error and lists
    /// it as damage (it cannot verify what lies beneath), and the leak
    /// check is not clean, rather than either passing over it in silence.
    Undecodable(String),
}

/// Names what an entry references: `kind` 0 for the extension's meta-tree
/// entries (key without the pool's prefix), otherwise the `kind` of the
/// [`ExtRef::Tree`] the entry belongs to. Pure, so scans can call it
/// without the pool lock.
pub type ScanFn = fn(kind: u8, key: &[u8], value: &[u8], out: &mut Vec<ExtRef>);

/// Space allocated for one data block of the open txg when it was
/// accepted, so the sync that writes it cannot run out of room: admission
/// is allocation. The sync trims what compression saved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reservation {
    dvas: Vec<Dva>,
}

impl Reservation {
    /// The room a block written early already occupies (see
    /// [`Cx::write_blocks_now`]), or that import claimed for it.
    pub fn of_block(bp: &BlockPtr) -> Reservation {
        Reservation {
            dvas: bp.used_dvas().copied().collect(),
        }
    }

    /// Bytes allocated, over all copies.
    pub fn asize(&self) -> u64 {
        self.dvas.iter().map(|d| d.asize as u64).sum()
    }
}

/// A block as another pool stored it (a raw receive).
#[derive(Clone, Copy, Debug)]
pub struct RawStored<'a> {
    /// The stored (compressed, sealed) bytes.
    pub stored: &'a [u8],
    /// Logical size.
    pub lsize: u32,
    /// Compression of `stored`.
    pub compress: tarn_block::CompressAlg,
    /// Salt, nonce and tag, when sealed.
    pub seal: Option<tarn_block::crypt::Seal>,
}

/// How a data block is stored.
#[derive(Clone, Debug)]
pub struct BlockOpts {
    /// Compression.
    pub compression: Compression,
    /// Checksum algorithm.
    pub checksum: ChecksumAlg,
    /// Copies (1..=3), on top of vdev redundancy.
    pub copies: u8,
    /// The key of an encrypted dataset: its blocks are sealed with it
    /// between compression and checksum (`tarn_block::crypt`).
    pub key: Option<Arc<KeySet>>,
}

fn ext_key(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(P_EXT);
    k.extend_from_slice(key);
    k
}

/// Open-context access for the extension: one operation of txg `txg()`,
/// holding the gate shared (see `txg`).
pub struct Cx<'p> {
    pub(crate) pool: &'p Pool,
    pub(crate) txg: u64,
}

impl Cx<'_> {
    /// The txg that changes made now will commit in.
    pub fn txg(&self) -> u64 {
        self.txg
    }

    /// The last committed txg.
    pub fn committed_txg(&self) -> u64 {
        self.pool.lock().txg
    }

    /// Pool properties (defaults for datasets).
    pub fn props(&self) -> crate::PoolProps {
        self.pool.lock().props.clone()
    }

    /// A node store for reading committed trees (through the block cache).
    pub fn store(&self) -> impl NodeStore + '_ {
        self.pool.read_store()
    }

    /// A store of committed tree nodes that reads only the block cache:
    /// a node not cached fails the lookup and is recorded
    /// ([`crate::store::CachedStore::missed`]), for a reader that must
    /// not wait for a device.
    pub fn cached_store(&self) -> crate::store::CachedStore<'_> {
        crate::store::CachedStore {
            cache: &self.pool.cache,
            pool: self.pool.guid,
            missed: std::cell::Cell::new(false),
        }
    }

    /// Takes a hold on committed txg `txg`: until it is dropped, no block
    /// that txg's trees reference is freed for reuse, so a reader may look
    /// a pointer up and read the block later without any lock.
    pub fn hold(&self, txg: u64) -> crate::store::OwnedHold {
        self.pool.holds.hold_owned(txg)
    }

    /// Reads and verifies a data block (through the block cache),
    /// decrypting it with `key` when it is sealed. A failure is reported
    /// by the caller (it knows which file it was).
    pub fn read_block(&self, bp: &BlockPtr, key: Option<&KeySet>) -> Result<Vec<u8>, PoolError> {
        Ok(self.pool.read_data(bp, key)?.to_vec())
    }

    /// Checks every copy and column of a block, repairs what differs, then
    /// reads it. For blocks whose writes may have missed a device with no
    /// record of it anywhere: written early for the intent log, the miss
    /// was only in memory when the process died.
    pub fn read_block_repairing(
        &self,
        bp: &BlockPtr,
        key: Option<&KeySet>,
    ) -> Result<Vec<u8>, PoolError> {
        self.repair_block(bp)?;
        self.read_block(bp, key)
    }

    /// Checks every copy and column of a block and repairs what differs
    /// (see [`Cx::read_block_repairing`]), without reading it for a caller:
    /// what needs no key.
    pub fn repair_block(&self, bp: &BlockPtr) -> Result<(), PoolError> {
        let s = pipeline::scrub_block(&self.pool.tops, bp);
        if s.unrecoverable {
            return Err(PoolError::Damaged(format!(
                "{} has no copy that verifies",
                pipeline::describe(bp)
            )));
        }
        Ok(())
    }

    /// Records damage for `status` (e.g. "tank/photos: file 7 at offset 0").
    pub fn report_damage(&self, what: String) {
        self.pool.report_damage(what);
    }

    /// True when `res` is room for a block of `lsize` bytes with `copies`
    /// copies, as [`Cx::reserve_block`] would give it: so a block that
    /// grows in place may keep the room it has, and the sync need not look
    /// for other space.
    pub fn room_fits(&self, res: &Reservation, lsize: u64, copies: u8) -> bool {
        res.dvas.len() == copies.clamp(1, 3) as usize && self.pool.room_holds(res, lsize.max(1))
    }

    /// Worst-case bytes allocated for a block of `lsize` bytes with `copies`.
    pub fn alloc_cost(&self, lsize: u64, copies: u8) -> u64 {
        self.pool.record_alloc_size(lsize) * copies.max(1) as u64
    }

    /// Bytes ordinary writes may still use (after slop and the metadata
    /// reserve; what the open txgs hold is allocated already), counting
    /// whole blocks of `lsize`.
    pub fn writable(&self, lsize: u64) -> u64 {
        self.pool.writable_bytes(&self.pool.lock(), lsize)
    }

    /// Counts `dirty` bytes against the write throttle until the sync of
    /// this txg writes them (their room is a [`Reservation`] already).
    pub fn charge(&self, dirty: u64) {
        let before = self.pool.dirty.fetch_add(dirty, Ordering::Relaxed);
        let sync_at = self.pool.opts.dirty_sync_bytes;
        if before < sync_at && before + dirty >= sync_at {
            // Under the lock the syncer checks the counter with, so the
            // wake-up cannot fall between its check and its wait.
            let _st = self.pool.lock();
            self.pool.cv.notify_all();
        }
    }

    /// Takes back a [`Cx::charge`] (an undone transaction).
    pub fn uncharge(&self, dirty: u64) {
        let _ = self
            .pool
            .dirty
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
                Some(d.saturating_sub(dirty))
            });
    }

    /// Pool size, allocated and free bytes.
    pub fn space(&self) -> (u64, u64, u64) {
        let st = self.pool.lock();
        let size: u64 = st.space.iter().map(|m| m.asize()).sum();
        let alloc: u64 = st.space.iter().map(|m| m.allocated()).sum();
        (size, alloc, size.saturating_sub(alloc))
    }

    /// Allocates room for a data block of `lsize` bytes with `copies`
    /// copies, keeping each vdev's metadata reserve. Fails with `NoSpace`
    /// (and allocates nothing) when it does not fit.
    pub fn reserve_block(&mut self, lsize: u64, copies: u8) -> Result<Reservation, PoolError> {
        let mut st = self.pool.lock();
        let dvas = self.pool.allocate(
            &mut st,
            lsize.max(1),
            copies.clamp(1, 3) as usize,
            true,
            Some(self.txg),
        );
        drop(st);
        match dvas {
            Ok(dvas) => Ok(Reservation { dvas }),
            // Wrong accounting stops the pool, here as in the sync.
            Err(PoolError::Internal(e)) => {
                self.fault(format!(
                    "{e}; the pool stopped so that no space in use is handed out"
                ));
                Err(PoolError::Internal(e))
            }
            Err(e) => Err(e),
        }
    }

    /// Gives back a reservation that will not be written. A failure means
    /// the accounting is wrong: the pool stops (see `space`).
    pub fn release_block(&mut self, r: Reservation) {
        let e = self.pool.free_now(&mut self.pool.lock(), &r.dvas).err();
        if let Some(e) = e {
            self.fault(format!(
                "{e}; the pool stopped so that no space in use is handed out"
            ));
        }
    }

    /// Stops the pool: an operation failed after it had changed state that
    /// must not commit half-done. Nothing more reaches disk.
    pub fn fault(&self, why: String) {
        self.pool.fault_and_wake(why);
    }

    /// Asks the syncer to commit soon.
    pub fn request_sync(&self) {
        let mut st = self.pool.lock();
        st.sync_requested = true;
        self.pool.cv.notify_all();
    }

    /// Makes `records` (opaque to the pool) of txg `txg` (this txg, or the
    /// one syncing) durable in the intent log, together with the data
    /// blocks `refs` written in place for them (see
    /// [`Cx::write_blocks_now`]). On [`crate::LogCommit::Unavailable`]
    /// nothing is promised: commit a txg instead.
    pub fn log_commit(
        &self,
        txg: u64,
        records: &[Vec<u8>],
        refs: &[BlockPtr],
    ) -> Result<crate::LogCommit, PoolError> {
        self.pool.log_commit(txg, records, refs)
    }

    /// Takes the records of the intent log found at import, to replay them
    /// in the open txg (once; `None` when there is nothing to replay).
    pub fn log_take_replay(&self) -> Option<Vec<Vec<u8>>> {
        self.pool.log_take_replay(self.txg)
    }

    /// Writes data blocks now, into the rooms their reservations hold, so
    /// the intent log can reference them instead of copying them. They are
    /// born in txg `birth` (the txg whose change they are: this one or the
    /// one syncing); hand one back with [`Cx::log_free`] if that txg stops
    /// referencing it. Compressed, sealed and checksummed in parallel on
    /// up to `sync_threads` workers and written together, as the txg sync
    /// writes its blocks, so an `fsync` that logs many large blocks waits
    /// for their preparation shared among the workers rather than for each
    /// in turn. In the order given; None for a block that needed no room
    /// (all zeros: its room given back).
    pub fn write_blocks_now(
        &self,
        blocks: Vec<(&[u8], BlockOpts, Reservation)>,
        birth: u64,
    ) -> Result<Vec<Option<BlockPtr>>, PoolError> {
        let mut missed = Vec::new();
        let out = self.pool.write_data(
            blocks
                .into_iter()
                .map(|(d, o, r)| (d, o, Some(r)))
                .collect(),
            birth,
            Some(self.txg),
            Rooms::AsHeld,
            &mut missed,
        )?;
        if !missed.is_empty() {
            let mut z = self.pool.zil_state();
            z.missed.extend(missed.into_iter().map(|m| (birth, m)));
        }
        Ok(out)
    }

    /// Writes blocks as they were stored elsewhere (a raw receive: bytes
    /// compressed and sealed by the sender, with what their pointer said
    /// of them) into the rooms `res` hold, born in this open txg; their
    /// checksum is computed here with `alg`. Returns their pointers.
    pub fn write_raw_now(
        &self,
        blocks: Vec<(RawStored<'_>, Reservation)>,
        alg: ChecksumAlg,
        copies: u8,
    ) -> Result<Vec<BlockPtr>, PoolError> {
        let mut placed = Vec::with_capacity(blocks.len());
        for (b, res) in blocks {
            if b.stored.is_empty()
                || b.stored.len() > b.lsize as usize
                || b.lsize as usize > tarn_block::bp::MAX_LSIZE as usize
            {
                return Err(PoolError::Invalid(format!(
                    "a raw block of {} stored bytes for {} logical bytes",
                    b.stored.len(),
                    b.lsize
                )));
            }
            if b.compress == tarn_block::CompressAlg::Off && b.stored.len() != b.lsize as usize {
                return Err(PoolError::Invalid(
                    "an uncompressed raw block whose sizes differ".into(),
                ));
            }
            let p = Prepared {
                stored: std::borrow::Cow::Borrowed(b.stored),
                lsize: b.lsize,
                compress: b.compress,
                checksum_alg: alg,
                checksum: tarn_block::checksum(alg, b.stored),
                seal: b.seal,
            };
            placed.push((Some(p), copies, Some(res)));
        }
        let mut missed = Vec::new();
        let out = self
            .pool
            .write_prepared(placed, self.txg, Some(self.txg), &mut missed)?;
        if !missed.is_empty() {
            let mut z = self.pool.zil_state();
            z.missed.extend(missed.into_iter().map(|m| (self.txg, m)));
        }
        out.into_iter()
            .map(|b| b.ok_or_else(|| PoolError::Internal("a raw block was not written".into())))
            .collect()
    }

    /// Frees a block of txg `txg` that only the intent log references
    /// (written early, then replaced before its txg committed): it stays
    /// allocated until that txg commits, since replay may still need it.
    pub fn log_free(&self, txg: u64, bp: BlockPtr) {
        self.pool.zil_state().frees.push((txg, bp));
    }

    /// True when the pool has a usable separate log device: copying data
    /// into the log is then cheaper than writing it in place.
    pub fn log_device(&self) -> bool {
        Pool::has_log_device(&self.pool.lock())
    }

    /// True when the pool was imported with `discard_log`: a replay that
    /// cannot go on keeps what it replayed instead of stopping the pool.
    pub fn log_discard(&self) -> bool {
        self.pool.opts.discard_log
    }
}

/// Syncing-context access (the syncer, or an exclusive operation):
/// everything of [`Cx`], plus the meta tree, frees, and writing blocks of
/// the txg `txg()` being built.
pub struct SyncCx<'p> {
    pub(crate) cx: Cx<'p>,
    pub(crate) sync: &'p mut SyncState,
    pub(crate) missed: Vec<Missed>,
}

impl<'p> std::ops::Deref for SyncCx<'p> {
    type Target = Cx<'p>;
    fn deref(&self) -> &Self::Target {
        &self.cx
    }
}

impl std::ops::DerefMut for SyncCx<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.cx
    }
}

impl SyncCx<'_> {
    /// The value of an entry in the extension's meta namespace.
    pub fn meta_get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, PoolError> {
        let rs = self.cx.pool.read_store();
        Ok(self.sync.meta.get(&rs, &ext_key(key))?)
    }

    /// Stores an entry in the extension's meta namespace.
    pub fn meta_put(&mut self, key: &[u8], value: &[u8]) -> Result<(), PoolError> {
        let rs = self.cx.pool.read_store();
        self.sync.meta.insert(&rs, &ext_key(key), value)?;
        Ok(())
    }

    /// Removes an entry of the extension's meta namespace.
    pub fn meta_delete(&mut self, key: &[u8]) -> Result<bool, PoolError> {
        let rs = self.cx.pool.read_store();
        Ok(self.sync.meta.remove(&rs, &ext_key(key))?.is_some())
    }

    /// Up to `limit` entries of the namespace inside `start..end` (keys
    /// without the pool's prefix).
    pub fn meta_range(
        &mut self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, PoolError> {
        let rs = self.cx.pool.read_store();
        let map = |b: Bound<&[u8]>, unbounded: Bound<Vec<u8>>| match b {
            Bound::Included(k) => Bound::Included(ext_key(k)),
            Bound::Excluded(k) => Bound::Excluded(ext_key(k)),
            Bound::Unbounded => unbounded,
        };
        let lo = map(start, Bound::Included(vec![P_EXT]));
        let hi = map(end, Bound::Excluded(vec![P_EXT + 1]));
        let page = self.sync.meta.range(
            &rs,
            lo.as_ref().map(Vec::as_slice),
            hi.as_ref().map(Vec::as_slice),
            limit,
        )?;
        Ok(page
            .into_iter()
            .filter(|(k, _)| k.first() == Some(&P_EXT))
            .map(|(mut k, v)| {
                k.remove(0);
                (k, v)
            })
            .collect())
    }

    /// Marks the pool as using format feature `name` (committed with this
    /// txg), so a tarn that does not know it refuses to import the pool
    /// rather than misread it (see [`crate::PoolProps::features`]).
    pub fn enable_feature(&mut self, name: &str) {
        let mut st = self.cx.pool.lock();
        if !st.props.features.iter().any(|f| f == name) {
            st.props.features.push(name.to_string());
            st.props_dirty = true;
        }
    }

    /// Releases a block no longer referenced; it becomes reusable once the
    /// txg that freed it is safely in the past.
    pub fn free(&mut self, bp: BlockPtr) {
        if !bp.is_hole() {
            self.sync.frees.push(bp);
        }
    }

    /// A running scan (scrub or resilver) that has already passed extension
    /// tree `id` walks it again: its pruning point moved down (a snapshot
    /// before it was destroyed), so blocks it skipped are no longer
    /// reachable from a tree the scan has still to visit.
    pub fn rescan_tree(&mut self, id: u64) {
        let mut st = self.cx.pool.lock();
        let Some(scan) = st.ms.scan.as_mut() else {
            return;
        };
        if !scan.is_running() && scan.state != crate::status::ScanState::Paused {
            return;
        }
        let done = crate::scan::bookmark_id(&scan.bookmark);
        if scan.phase == crate::scan::PHASE_TREES && done.is_some_and(|d| d >= id) {
            scan.bookmark = crate::scan::id_bookmark(id.checked_sub(1));
            st.ms_dirty = true;
        } else {
            // Not finished: perhaps being walked with the old pruning
            // point right now (trees are walked in id order, so a head
            // comes before the snapshots taken of it).
            scan.moved = Some(scan.moved.map_or(id, |m| m.min(id)));
        }
    }

    /// Compresses, checksums and writes data blocks of this txg (in
    /// parallel) and returns their pointers; an all-zero block is a hole and
    /// gets `None`. A block with a [`Reservation`] is written into one (the
    /// unused tail, what compression saved, is freed); one without is
    /// allocated now.
    ///
    /// With [`Rooms::InBlockOrder`] the rooms are first handed out again in the
    /// order of the blocks ([`rooms_in_block_order`]), so that blocks given
    /// in key order lie in key order on the devices; otherwise each block
    /// goes into its own. Only for the staged blocks of the txg being
    /// synced: every room must be one allocated for this txg and written by
    /// nothing yet (not by the intent log, not by an import's replay, not
    /// by a raw receive), since a room that holds a block, or that a log
    /// record names, must keep its block.
    pub fn write_blocks(
        &mut self,
        blocks: Vec<(&[u8], BlockOpts, Option<Reservation>)>,
        rooms: Rooms,
    ) -> Result<Vec<Option<BlockPtr>>, PoolError> {
        let txg = self.cx.txg;
        self.cx
            .pool
            .write_data(blocks, txg, None, rooms, &mut self.missed)
    }

    /// Writes one tree node of this txg (metadata copies, lz4) and caches it.
    pub fn write_node(&mut self, data: &[u8], level: u8) -> Result<BlockPtr, PoolError> {
        let pool = self.cx.pool;
        let (alg, copies) = {
            let st = pool.lock();
            (st.props.checksum_alg(), st.props.metadata_copies())
        };
        let p = pipeline::prepare(data, Compression::Lz4, alg)?;
        let dvas = pool.allocate(&mut pool.lock(), p.stored.len() as u64, copies, false, None)?;
        match pipeline::write_copies(&pool.tops, &dvas, &p.stored) {
            Ok(m) => self.missed.extend(m),
            Err(e) => {
                pool.free_now(&mut pool.lock(), &dvas)?;
                return Err(e.into());
            }
        }
        let bp = pipeline::make_ptr(&p, &dvas, self.cx.txg, BlockType::TreeNode, level);
        pool.cache
            .insert(pool.guid, &bp, Arc::from(data), tarn_block::BlockKind::Meta);
        Ok(bp)
    }

    /// Reads a tree node (through the block cache).
    pub fn read_node(&self, bp: &BlockPtr) -> Result<Vec<u8>, PoolError> {
        Ok(self.cx.pool.read_store().read(bp)?)
    }
}

impl Pool {
    /// True when every copy's room in `res` holds `bytes` stored bytes on
    /// its vdev (so the block can be written there without new space).
    pub(crate) fn room_holds(&self, res: &Reservation, bytes: u64) -> bool {
        res.dvas.iter().all(|d| {
            self.tops
                .get(d.vdev as usize)
                .is_some_and(|t| t.alloc_size(bytes) <= d.asize as u64)
        })
    }

    /// Writes data blocks born in txg `birth` (see
    /// [`SyncCx::write_blocks`]): compressed and checksummed in parallel
    /// with no lock held, their room trimmed or found under `st`, written in
    /// parallel with no lock held. `open`: the open txg an early write
    /// belongs to (its allocations are tracked, see `space`).
    ///
    /// In windows of about [`WRITE_WINDOW`] bytes: a block that is
    /// compressed or sealed has bytes of its own until it is written, so a
    /// whole txg prepared at once would hold a second copy of its dirty
    /// data; a window's buffers are handed back before the window after
    /// next takes them (see `tarn_block::spare`). The next window is
    /// prepared while this one is written: writing into the devices' files
    /// waits for the disk when the kernel's dirty pages are at their limit,
    /// and the CPU work of the next window fills that wait instead of
    /// following it. An error in a later window leaves the earlier ones
    /// written and their rooms trimmed: a caller must stop the pool on an
    /// error (the sync and the intent log do).
    ///
    /// In the order of the rooms the blocks hold (the answers in the order
    /// asked): taken in room order, a window holds rooms that touch, and
    /// the device layer merges their pieces into a few large writes
    /// instead of one per column.
    ///
    /// With [`Rooms::InBlockOrder`] (a txg's sync of blocks nothing has
    /// written yet, see [`SyncCx::write_blocks`]) it first hands their rooms out again in
    /// the order of the blocks ([`rooms_in_block_order`]): a txg's blocks
    /// come in key order, but their rooms were allocated one after the
    /// other as the writes arrived, so random writes gave neighbouring keys
    /// rooms far apart, and a later sequential read of those keys would
    /// read them one by one. Early writes (the intent log's blocks written
    /// in place) keep their own rooms, which their log records name.
    pub(crate) fn write_data(
        &self,
        mut blocks: Vec<DataBlock<'_>>,
        birth: u64,
        open: Option<u64>,
        rooms: Rooms,
        missed: &mut Vec<Missed>,
    ) -> Result<Vec<Option<BlockPtr>>, PoolError> {
        if rooms == Rooms::InBlockOrder {
            rooms_in_block_order(&mut blocks);
        }
        let mut indexed: Vec<(usize, DataBlock<'_>)> = blocks.into_iter().enumerate().collect();
        indexed.sort_by_key(|(_, b)| {
            b.2.as_ref()
                .and_then(|r| r.dvas.first())
                .map(|d| (d.vdev, d.offset))
        });
        let (order, sorted): (Vec<usize>, Vec<DataBlock<'_>>) = indexed.into_iter().unzip();
        let written = self.write_data_in_order(sorted, birth, open, missed)?;
        debug_assert_eq!(written.len(), order.len(), "one answer per block");
        let mut out: Vec<Option<BlockPtr>> = vec![None; order.len()];
        for (&i, bp) in order.iter().zip(written) {
            out[i] = bp;
        }
        Ok(out)
    }

    /// [`Pool::write_data`] of blocks in the order given.
    fn write_data_in_order(
        &self,
        blocks: Vec<DataBlock<'_>>,
        birth: u64,
        open: Option<u64>,
        missed: &mut Vec<Missed>,
    ) -> Result<Vec<Option<BlockPtr>>, PoolError> {
        let mut windows: Vec<Window<'_>> = Vec::new();
        let mut rest = blocks.into_iter().peekable();
        while rest.peek().is_some() {
            let mut window = Vec::new();
            let mut bytes = 0usize;
            while bytes < WRITE_WINDOW {
                let Some(b) = rest.next() else { break };
                bytes += b.0.len();
                window.push(b);
            }
            windows.push(window);
        }
        crate::sync::pipelined(
            &windows,
            |w| self.prepare_window(w),
            |w, prepared| {
                let placed = prepared
                    .into_iter()
                    .zip(w)
                    .map(|(p, (_, o, res))| (p, o.copies, res.clone()))
                    .collect();
                self.write_prepared(placed, birth, open, missed)
            },
        )
    }

    /// Compresses, seals and checksums the blocks of one window on up to
    /// `sync_threads` workers; `None` for an all-zero block (a hole). The
    /// first block that cannot be prepared fails the window.
    fn prepare_window<'a>(
        &self,
        blocks: &[(&'a [u8], BlockOpts, Option<Reservation>)],
    ) -> Result<PreparedWindow<'a>, PoolError> {
        let prepared = parallel_map(blocks, self.opts.sync_threads, |(d, o, _)| {
            if d.iter().all(|&b| b == 0) {
                None
            } else {
                Some(pipeline::prepare_sealed(
                    d,
                    o.compression,
                    o.checksum,
                    o.key.as_deref(),
                    BlockType::Data,
                ))
            }
        })?;
        Ok(prepared
            .into_iter()
            .map(Option::transpose)
            .collect::<Result<_, _>>()?)
    }

    /// Writes blocks already prepared (or `None`: nothing to write, its
    /// room given back): each into its room when it still fits (the tail
    /// freed), else into new space of `copies` copies; all at once.
    fn write_prepared(
        &self,
        blocks: Vec<(Option<Prepared<'_>>, u8, Option<Reservation>)>,
        birth: u64,
        open: Option<u64>,
        missed: &mut Vec<Missed>,
    ) -> Result<Vec<Option<BlockPtr>>, PoolError> {
        let threads = self.opts.sync_threads;
        let n = blocks.len();
        let mut jobs = Vec::new();
        {
            let mut st = self.lock();
            for (i, (p, copies, res)) in blocks.into_iter().enumerate() {
                let Some(p) = p else {
                    if let Some(r) = res {
                        self.free_now(&mut st, &r.dvas)?;
                    }
                    continue;
                };
                let psize = p.stored.len() as u64;
                let fits = res.as_ref().is_some_and(|r| self.room_holds(r, psize));
                let dvas = match res {
                    Some(r) if fits => {
                        // Keep what the stored size needs; free the rest.
                        let mut dvas = r.dvas.clone();
                        for d in &mut dvas {
                            let need = self.tops[d.vdev as usize].alloc_size(psize);
                            let tail = d.asize as u64 - need;
                            if tail > 0 {
                                self.free_range_now(&mut st, d.vdev, d.offset + need, tail)?;
                                d.asize = need as u32;
                            }
                        }
                        dvas
                    }
                    other => {
                        if let Some(r) = other {
                            self.free_now(&mut st, &r.dvas)?;
                        }
                        self.allocate(&mut st, psize, copies.clamp(1, 3) as usize, true, open)?
                    }
                };
                jobs.push((i, p, dvas));
            }
        }
        // All at once: pieces of neighbouring blocks merge into one write
        // per child (small blocks would otherwise cost a write call each).
        let writes: Vec<(&[Dva], &[u8])> = jobs
            .iter()
            .map(|(_, p, dvas)| (&dvas[..], &p.stored[..]))
            .collect();
        missed.extend(pipeline::write_many_copies(&self.tops, &writes, threads)?);
        let mut out = vec![None; n];
        for (i, p, dvas) in jobs {
            out[i] = Some(pipeline::make_ptr(&p, &dvas, birth, BlockType::Data, 0));
            p.recycle();
        }
        Ok(out)
    }

    /// Installs the extension and its scan function (once, at attach).
    pub fn set_extension(&self, ext: Arc<dyn Extension>, scan: ScanFn) {
        *self.ext.write().unwrap_or_else(|e| e.into_inner()) = Some(ext);
        *self.ext_scan.lock().unwrap_or_else(|e| e.into_inner()) = Some(scan);
    }

    /// True once an extension is installed.
    pub fn has_extension(&self) -> bool {
        self.extension().is_some()
    }

    pub(crate) fn extension(&self) -> Option<Arc<dyn Extension>> {
        self.ext.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn downcast<T: Extension + 'static>(&self) -> Result<Arc<dyn Extension>, PoolError> {
        let ext = self.extension().ok_or_else(|| {
            PoolError::Internal(format!(
                "pool '{}' has no dataset layer attached",
                self.name
            ))
        })?;
        if ext.as_any().downcast_ref::<T>().is_none() {
            return Err(PoolError::Internal("extension of another type".into()));
        }
        Ok(ext)
    }

    /// Runs `f` contained: a panic in it (a bug) faults the pool rather than
    /// letting a half-done change commit.
    fn contained<R>(&self, f: impl FnOnce() -> Result<R, PoolError>) -> Result<R, PoolError> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(r) => r,
            Err(_) => {
                let why = "a dataset operation panicked; the pool stopped so that nothing \
                           half-done is committed (export and import it)";
                self.fault_and_wake(why.to_string());
                Err(PoolError::Internal(why.to_string()))
            }
        }
    }

    /// Records damage for `status`, from a reader outside any transaction
    /// (see [`Pool::read_held`]).
    pub fn report_damage(&self, what: String) {
        let mut st = self.lock();
        if st.ms.damaged.insert(what) {
            st.ms_dirty = true;
        }
    }

    /// Runs `f` in open context on the installed extension of type `T` (see
    /// the module docs). With `write`, waits first while the open txg is at
    /// its dirty limit (the write throttle).
    pub fn with_ext<T: Extension + 'static, R>(
        &self,
        write: bool,
        f: impl FnOnce(&T, &mut Cx<'_>) -> Result<R, PoolError>,
    ) -> Result<R, PoolError> {
        self.check_usable(&self.lock())?;
        if write {
            self.throttle()?;
        }
        let ext = self.downcast::<T>()?;
        let _gate = self.gate_shared();
        self.check_usable(&self.lock())?;
        let txg = self.open_txg.load(Ordering::Acquire);
        let mut cx = Cx { pool: self, txg };
        self.contained(|| match ext.as_any().downcast_ref::<T>() {
            Some(t) => f(t, &mut cx),
            None => Err(PoolError::Internal("extension of another type".into())),
        })
    }

    /// [`Pool::with_ext`] for a reader that must not wait (a front end
    /// answering a read from memory on its network thread): None, at
    /// once, where `with_ext` would wait for the gate (an exclusive
    /// operation), the pool's state or the extension; and None if `f`
    /// answers None (it found something it would have to wait for).
    /// Nothing is throttled: `f` only reads.
    pub fn try_with_ext<T: Extension + 'static, R>(
        &self,
        f: impl FnOnce(&T, &mut Cx<'_>) -> Option<R>,
    ) -> Option<Result<R, PoolError>> {
        let usable = |pool: &Pool| -> Option<Result<(), PoolError>> {
            let st = free_now(pool.st.try_lock())?;
            Some(pool.check_usable(&st))
        };
        if let Err(e) = usable(self)? {
            return Some(Err(e));
        }
        let ext = free_now(self.ext.try_read())?.clone()?;
        let _gate = free_now(self.gate.try_read())?;
        if let Err(e) = usable(self)? {
            return Some(Err(e));
        }
        let txg = self.open_txg.load(Ordering::Acquire);
        let mut cx = Cx { pool: self, txg };
        let t = ext.as_any().downcast_ref::<T>()?;
        self.contained(|| Ok(f(t, &mut cx))).transpose()
    }

    /// Runs `f` as an exclusive operation on the extension of type `T` (see
    /// `txg`): everything pending is committed first, and what `f` changes
    /// is committed before this returns.
    pub fn with_ext_exclusive<T: Extension + 'static, R>(
        &self,
        f: impl FnOnce(&T, &mut SyncCx<'_>) -> Result<R, PoolError>,
    ) -> Result<R, PoolError> {
        let ext = self.downcast::<T>()?;
        self.exclusive(|sync| {
            let txg = self.open_txg.load(Ordering::Acquire);
            let mut cx = SyncCx {
                cx: Cx { pool: self, txg },
                sync,
                missed: Vec::new(),
            };
            let r = self.contained(|| match ext.as_any().downcast_ref::<T>() {
                Some(t) => f(t, &mut cx),
                None => Err(PoolError::Internal("extension of another type".into())),
            });
            if !cx.missed.is_empty() {
                let mut z = self.zil_state();
                z.missed.extend(cx.missed.drain(..).map(|m| (txg, m)));
            }
            r
        })
    }

    /// The extension's part of the sync of `txg` (step 1 of the sync).
    pub(crate) fn sync_ext(
        &self,
        sync: &mut SyncState,
        txg: u64,
        missed: &mut Vec<Missed>,
    ) -> Result<(), PoolError> {
        let Some(ext) = self.extension() else {
            if self.scan_fn().is_some() {
                // Installed once, and now missing: its changes would be lost.
                return Err(PoolError::Internal(
                    "the dataset layer is missing from the pool".into(),
                ));
            }
            return Ok(());
        };
        // Always: what the quiesce set aside is not "changes" any more.
        let mut cx = SyncCx {
            cx: Cx { pool: self, txg },
            sync,
            missed: Vec::new(),
        };
        let r = self.contained(|| ext.sync(&mut cx));
        missed.append(&mut cx.missed);
        r
    }

    /// Tells the extension a txg committed.
    pub(crate) fn ext_committed(&self, txg: u64) {
        if let Some(ext) = self.extension() {
            ext.committed(txg);
        }
    }

    pub(crate) fn ext_has_changes(&self) -> bool {
        self.extension().is_some_and(|e| e.has_changes())
    }

    pub(crate) fn scan_fn(&self) -> Option<ScanFn> {
        *self.ext_scan.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn opts() -> BlockOpts {
        BlockOpts {
            compression: Compression::Off,
            checksum: ChecksumAlg::default(),
            copies: 1,
            key: None,
        }
    }

    fn room(copies: &[(u32, u32, u64)]) -> Reservation {
        Reservation {
            dvas: copies
                .iter()
                .map(|&(vdev, asize, offset)| Dva {
                    vdev,
                    asize,
                    offset,
                })
                .collect(),
        }
    }

    proptest! {
        /// Rooms of one shape go to the blocks in the order given, lowest
        /// first; every room is handed out exactly once, to a block whose
        /// old room had the same shape; blocks without a room keep none.
        #[test]
        fn rooms_follow_the_blocks_within_each_shape(
            spec in proptest::collection::vec(
                (0u32..2, prop_oneof![Just(8192u32), Just(24576u32)], any::<bool>(), any::<bool>()),
                0..64,
            ),
        ) {
            let data = [0u8; 1];
            let mut blocks: Vec<DataBlock<'_>> = Vec::new();
            for (i, &(vdev, asize, two, some)) in spec.iter().enumerate() {
                // Offsets distinct and in no particular order.
                let off = ((i as u64 * 7919) % 1009) * 65536;
                let res = some.then(|| {
                    if two {
                        room(&[(vdev, asize, off), (1 - vdev, asize, off + 4096)])
                    } else {
                        room(&[(vdev, asize, off)])
                    }
                });
                blocks.push((&data[..], opts(), res));
            }
            let before: Vec<Option<Reservation>> = blocks.iter().map(|b| b.2.clone()).collect();
            rooms_in_block_order(&mut blocks);
            let shape = |r: &Reservation| -> Vec<(u32, u32)> {
                r.dvas.iter().map(|d| (d.vdev, d.asize)).collect()
            };
            let place = |r: &Reservation| -> Vec<(u32, u64)> {
                r.dvas.iter().map(|d| (d.vdev, d.offset)).collect()
            };
            // The same rooms, each once.
            let mut old: Vec<Vec<(u32, u64)>> = before.iter().flatten().map(place).collect();
            let mut new: Vec<Vec<(u32, u64)>> = blocks.iter().filter_map(|b| b.2.as_ref()).map(place).collect();
            old.sort();
            new.sort();
            prop_assert_eq!(old, new);
            for (b, a) in before.iter().zip(&blocks) {
                match (b, &a.2) {
                    (None, None) => {}
                    (Some(b), Some(a)) => prop_assert_eq!(shape(b), shape(a)),
                    (b, a) => prop_assert!(false, "room {:?} became {:?}", b, a),
                }
            }
            // Within a shape, rooms rise with the block's position.
            for i in 0..blocks.len() {
                for j in i + 1..blocks.len() {
                    if let (Some(x), Some(y)) = (&blocks[i].2, &blocks[j].2) {
                        if shape(x) == shape(y) {
                            prop_assert!(place(x) < place(y), "block {} got {:?}, block {} got {:?}", i, place(x), j, place(y));
                        }
                    }
                }
            }
        }
    }
}
