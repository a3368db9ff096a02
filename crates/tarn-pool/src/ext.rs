//! The seam through which a higher layer (datasets) keeps state in the pool.
//!
//! # Theory
//!
//! The pool knows nothing of datasets, yet dataset changes must commit in the
//! same txg as everything else, under the same lock, in the sync order of
//! docs/design.md. So the dataset layer installs one [`Extension`]: an object that
//! lives *inside* the pool state, under the pool mutex. Open-context code
//! reaches it through [`Pool::with_ext`] together with a [`Cx`] (meta-tree
//! entries in the extension's namespace, verified block reads, space charges
//! for the write throttle and ENOSPC, frees). At the start of every sync the
//! pool calls [`Extension::sync`] with a [`SyncCx`] that writes data blocks
//! and tree nodes of the txg being synced; everything it writes is then
//! covered by the meta tree commit, the space maps and the uberblock that
//! follow. One lock means no lock order to get wrong: the price is that
//! extension work waits while a txg syncs (a known limit).
//!
//! The pool must still be able to *scan* what the extension references
//! without understanding it, from its own thread and without the lock. The
//! extension therefore also registers a pure [`ScanFn`]: given a meta entry
//! of its namespace (tree kind 0) or an entry of one of its own trees, it
//! names the block pointers and sub-trees inside. Scrub, resilver and the
//! leak check walk those.

use std::any::Any;
use std::ops::Bound;

use tarn_block::pipeline::{self, Missed, Prepared};
use tarn_block::{BlockPtr, BlockType, ChecksumAlg, Compression, Dva};
use tarn_tree::NodeStore;

use crate::pool::{Pool, State};
use crate::store::Allocator;
use crate::sync::parallel_map;
use crate::PoolError;

/// A key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// Meta-tree prefix of the extension's namespace.
pub(crate) const P_EXT: u8 = 0x40;

/// Pool state owned by a higher layer, synced with every txg.
pub trait Extension: Send {
    /// True when the open txg holds changes of this extension.
    fn has_changes(&self) -> bool;
    /// Writes this extension's part of the txg being synced. Called first in
    /// the sync, before the meta tree commits. An error faults the pool.
    fn sync(&mut self, cx: &mut SyncCx<'_, '_>) -> Result<(), PoolError>;
    /// Called once the txg has committed (to evict caches).
    fn committed(&mut self, _txg: u64) {}
    /// For [`Pool::with_ext`]'s downcast.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// Something an extension entry references, for scans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// [`Cx::write_block_now`]), or that import claimed for it.
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

/// How a data block is stored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockOpts {
    /// Compression.
    pub compression: Compression,
    /// Checksum algorithm.
    pub checksum: ChecksumAlg,
    /// Copies (1..=3), on top of vdev redundancy.
    pub copies: u8,
}

fn ext_key(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(P_EXT);
    k.extend_from_slice(key);
    k
}

/// Open-context access for the extension, under the pool lock.
pub struct Cx<'p, 's> {
    pub(crate) pool: &'p Pool,
    pub(crate) st: &'s mut State,
}

impl Cx<'_, '_> {
    /// The txg that changes made now will commit in.
    pub fn txg(&self) -> u64 {
        self.st.txg + 1
    }

    /// The last committed txg.
    pub fn committed_txg(&self) -> u64 {
        self.st.txg
    }

    /// Pool properties (defaults for datasets).
    pub fn props(&self) -> crate::PoolProps {
        self.st.props.clone()
    }

    /// A node store for reading committed trees (through the node cache).
    pub fn store(&self) -> impl NodeStore + '_ {
        self.pool.read_store()
    }

    /// The value of an entry in the extension's meta namespace.
    pub fn meta_get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, PoolError> {
        let rs = self.pool.read_store();
        Ok(self.st.meta.get(&rs, &ext_key(key))?)
    }

    /// Stores an entry in the extension's meta namespace.
    pub fn meta_put(&mut self, key: &[u8], value: &[u8]) -> Result<(), PoolError> {
        let rs = self.pool.read_store();
        self.st.meta.insert(&rs, &ext_key(key), value)?;
        Ok(())
    }

    /// Removes an entry of the extension's meta namespace.
    pub fn meta_delete(&mut self, key: &[u8]) -> Result<bool, PoolError> {
        let rs = self.pool.read_store();
        Ok(self.st.meta.remove(&rs, &ext_key(key))?.is_some())
    }

    /// Up to `limit` entries of the namespace inside `start..end` (keys
    /// without the pool's prefix).
    pub fn meta_range(
        &mut self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, PoolError> {
        let rs = self.pool.read_store();
        let map = |b: Bound<&[u8]>, unbounded: Bound<Vec<u8>>| match b {
            Bound::Included(k) => Bound::Included(ext_key(k)),
            Bound::Excluded(k) => Bound::Excluded(ext_key(k)),
            Bound::Unbounded => unbounded,
        };
        let lo = map(start, Bound::Included(vec![P_EXT]));
        let hi = map(end, Bound::Excluded(vec![P_EXT + 1]));
        let page = self.st.meta.range(
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

    /// Reads and verifies a data block. A failure is reported by the caller
    /// (it knows which file it was).
    pub fn read_block(&self, bp: &BlockPtr) -> Result<Vec<u8>, PoolError> {
        Ok(self.pool.read_data(bp)?.to_vec())
    }

    /// Checks every copy and column of a block, repairs what differs, then
    /// reads it. For blocks whose writes may have missed a device with no
    /// record of it anywhere: written early for the intent log, the miss
    /// was only in memory when the process died.
    pub fn read_block_repairing(&self, bp: &BlockPtr) -> Result<Vec<u8>, PoolError> {
        let s = pipeline::scrub_block(&self.pool.tops, bp);
        if s.unrecoverable {
            return Err(PoolError::Damaged(format!(
                "{} has no copy that verifies",
                pipeline::describe(bp)
            )));
        }
        self.read_block(bp)
    }

    /// Records damage for `status` (e.g. "tank/photos: file 7 at offset 0").
    pub fn report_damage(&mut self, what: String) {
        if self.st.ms.damaged.insert(what) {
            self.st.ms_dirty = true;
        }
    }

    /// Releases a block no longer referenced; it becomes reusable once the
    /// txg that freed it is safely in the past.
    pub fn free(&mut self, bp: BlockPtr) {
        if !bp.is_hole() {
            self.st.frees.push(bp);
        }
    }

    /// Worst-case bytes allocated for a block of `lsize` bytes with `copies`.
    pub fn alloc_cost(&self, lsize: u64, copies: u8) -> u64 {
        self.pool.record_alloc_size(lsize) * copies.max(1) as u64
    }

    /// Bytes ordinary writes may still use (after slop and the metadata
    /// reserve; what the open txg holds is allocated already), counting
    /// whole blocks of `lsize`.
    pub fn writable(&self, lsize: u64) -> u64 {
        self.pool.writable_bytes(self.st, lsize)
    }

    /// Counts `dirty` bytes against the write throttle until the next sync
    /// writes them (their room is a [`Reservation`] already).
    pub fn charge(&mut self, dirty: u64) {
        self.st.dirty_bytes += dirty;
        if self.st.dirty_bytes >= self.pool.opts.dirty_sync_bytes {
            self.pool.cv.notify_all();
        }
    }

    /// Takes back a [`Cx::charge`] (an undone transaction).
    pub fn uncharge(&mut self, dirty: u64) {
        self.st.dirty_bytes = self.st.dirty_bytes.saturating_sub(dirty);
    }

    /// Pool size, allocated and free bytes.
    pub fn space(&self) -> (u64, u64, u64) {
        let size: u64 = self.st.space.iter().map(|m| m.asize()).sum();
        let alloc: u64 = self.st.space.iter().map(|m| m.allocated()).sum();
        (size, alloc, size.saturating_sub(alloc))
    }

    /// Allocates room for a data block of `lsize` bytes with `copies`
    /// copies, keeping each vdev's metadata reserve. Fails with `NoSpace`
    /// (and allocates nothing) when it does not fit.
    pub fn reserve_block(&mut self, lsize: u64, copies: u8) -> Result<Reservation, PoolError> {
        self.pool.reserve_data(self.st, lsize, copies)
    }

    /// Gives back a reservation that will not be written.
    pub fn release_block(&mut self, r: Reservation) {
        free_dvas(&mut self.st.space, &r.dvas);
    }

    /// Stops the pool: an operation failed after it had changed state that
    /// must not commit half-done. Nothing of the open txg reaches disk.
    pub fn fault(&mut self, why: String) {
        self.pool.set_fault(why);
        self.pool.cv.notify_all();
    }

    /// A running scan (scrub or resilver) that has already passed extension
    /// tree `id` walks it again: its pruning point moved down (a snapshot
    /// before it was destroyed), so blocks it skipped are no longer
    /// reachable from a tree the scan has still to visit.
    pub fn rescan_tree(&mut self, id: u64) {
        let Some(scan) = self.st.ms.scan.as_mut() else {
            return;
        };
        if !scan.is_running() && scan.state != crate::status::ScanState::Paused {
            return;
        }
        let done = crate::scan::bookmark_id(&scan.bookmark);
        if scan.phase == crate::scan::PHASE_TREES && done.is_some_and(|d| d >= id) {
            scan.bookmark = crate::scan::id_bookmark(id.checked_sub(1));
            self.st.ms_dirty = true;
        }
    }

    /// Asks the syncer to commit soon.
    pub fn request_sync(&mut self) {
        self.st.sync_requested = true;
        self.pool.cv.notify_all();
    }

    /// Makes `records` (opaque to the pool) durable in the intent log,
    /// together with the data blocks `refs` written in place for them
    /// (see [`Cx::write_block_now`]). On [`crate::LogCommit::Unavailable`]
    /// nothing is promised: commit a txg instead.
    pub fn log_commit(
        &mut self,
        records: &[Vec<u8>],
        refs: &[BlockPtr],
    ) -> Result<crate::LogCommit, PoolError> {
        self.pool.log_commit(self.st, records, refs)
    }

    /// Takes the records of the intent log found at import, to replay them
    /// in the open txg (once; `None` when there is nothing to replay).
    pub fn log_take_replay(&mut self) -> Option<Vec<Vec<u8>>> {
        self.st.zil.replay.take()
    }

    /// Writes a data block of the open txg now, into the room `res` holds
    /// for it, so the intent log can reference it instead of copying it.
    /// The block belongs to the open txg (its birth); hand it back with
    /// [`Cx::log_free`] if the open txg stops referencing it.
    pub fn write_block_now(
        &mut self,
        data: &[u8],
        opts: BlockOpts,
        res: Reservation,
    ) -> Result<Option<BlockPtr>, PoolError> {
        let mut missed = Vec::new();
        let out = self
            .pool
            .write_data(self.st, &mut missed, vec![(data, opts, Some(res))])?;
        self.st.zil.missed.append(&mut missed);
        Ok(out.into_iter().next().flatten())
    }

    /// Frees a block of the open txg that only the intent log references
    /// (written early, then replaced before its txg committed): it stays
    /// allocated until that txg commits, since replay may still need it.
    pub fn log_free(&mut self, bp: BlockPtr) {
        self.st.zil.frees.push(bp);
    }

    /// True when the pool has a usable separate log device: copying data
    /// into the log is then cheaper than writing it in place.
    pub fn log_device(&self) -> bool {
        Pool::has_log_device(self.st)
    }

    /// True when the pool was imported with `discard_log`: a replay that
    /// cannot go on keeps what it replayed instead of stopping the pool.
    pub fn log_discard(&self) -> bool {
        self.pool.opts.discard_log
    }
}

fn free_dvas(space: &mut [tarn_space::SpaceMap], dvas: &[Dva]) {
    for d in dvas {
        if let Some(m) = space.get_mut(d.vdev as usize) {
            // Allocated in this txg and never referenced: free at once.
            let _ = m.free_now(d.offset, d.asize as u64);
        }
    }
}

/// Syncing-context access: everything of [`Cx`], plus writing blocks of the
/// txg being synced.
pub struct SyncCx<'p, 's> {
    pub(crate) cx: Cx<'p, 's>,
    pub(crate) missed: &'s mut Vec<Missed>,
}

impl<'p, 's> std::ops::Deref for SyncCx<'p, 's> {
    type Target = Cx<'p, 's>;
    fn deref(&self) -> &Self::Target {
        &self.cx
    }
}

impl std::ops::DerefMut for SyncCx<'_, '_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.cx
    }
}

impl SyncCx<'_, '_> {
    /// Compresses, checksums and writes data blocks of this txg (in
    /// parallel) and returns their pointers; an all-zero block is a hole and
    /// gets `None`. A block with a [`Reservation`] is written into it (the
    /// unused tail, what compression saved, is freed); one without is
    /// allocated now.
    pub fn write_blocks(
        &mut self,
        blocks: Vec<(&[u8], BlockOpts, Option<Reservation>)>,
    ) -> Result<Vec<Option<BlockPtr>>, PoolError> {
        self.cx.pool.write_data(self.cx.st, self.missed, blocks)
    }

    /// Writes one tree node of this txg (metadata copies, lz4) and caches it.
    pub fn write_node(&mut self, data: &[u8], level: u8) -> Result<BlockPtr, PoolError> {
        let pool = self.cx.pool;
        let st = &mut *self.cx.st;
        let alg = st.props.checksum_alg();
        let copies = st.props.metadata_copies();
        let p = pipeline::prepare(data, Compression::Lz4, alg)?;
        let dvas = Allocator {
            tops: &pool.tops,
            space: &mut st.space,
            rotor: &mut st.rotor,
            keep_contiguous: &[],
        }
        .alloc(p.stored.len() as u64, copies)?;
        match pipeline::write_copies(&pool.tops, &dvas, &p.stored) {
            Ok(m) => self.missed.extend(m),
            Err(e) => {
                for d in &dvas {
                    if let Some(m) = st.space.get_mut(d.vdev as usize) {
                        let _ = m.free_now(d.offset, d.asize as u64);
                    }
                }
                return Err(e.into());
            }
        }
        let bp = pipeline::make_ptr(&p, &dvas, st.txg + 1, BlockType::TreeNode, level);
        pool.cache.insert(
            pool.guid,
            &bp,
            std::sync::Arc::from(data),
            tarn_block::BlockKind::Meta,
        );
        Ok(bp)
    }

    /// Reads a tree node (through the node cache).
    pub fn read_node(&self, bp: &BlockPtr) -> Result<Vec<u8>, PoolError> {
        let rs = self.cx.pool.read_store();
        Ok(rs.read(bp)?)
    }
}

impl Pool {
    /// Allocates room for a data block of the open txg (see
    /// [`Reservation`]), keeping each vdev's metadata reserve.
    pub(crate) fn reserve_data(
        &self,
        st: &mut State,
        lsize: u64,
        copies: u8,
    ) -> Result<Reservation, PoolError> {
        let keep: Vec<u64> = (0..self.tops.len())
            .map(|v| self.metadata_reserve(st, v))
            .collect();
        let dvas = Allocator {
            tops: &self.tops,
            space: &mut st.space,
            rotor: &mut st.rotor,
            keep_contiguous: &keep,
        }
        .alloc(lsize.max(1), copies.clamp(1, 3) as usize)?;
        Ok(Reservation { dvas })
    }

    /// Writes data blocks of the txg being synced (see
    /// [`SyncCx::write_blocks`]).
    pub(crate) fn write_data(
        &self,
        st: &mut State,
        missed: &mut Vec<Missed>,
        blocks: Vec<(&[u8], BlockOpts, Option<Reservation>)>,
    ) -> Result<Vec<Option<BlockPtr>>, PoolError> {
        let threads = self.opts.sync_threads;
        let prepared: Vec<Option<Result<Prepared, tarn_block::BlockError>>> =
            parallel_map(&blocks, threads, |(d, o, _)| {
                if d.iter().all(|&b| b == 0) {
                    None
                } else {
                    Some(pipeline::prepare(d, o.compression, o.checksum))
                }
            })?;
        let keep: Vec<u64> = (0..self.tops.len())
            .map(|v| self.metadata_reserve(st, v))
            .collect();
        let mut jobs = Vec::new();
        for (i, (p, (_, o, res))) in prepared.into_iter().zip(blocks.iter()).enumerate() {
            let Some(p) = p else {
                if let Some(r) = res {
                    free_dvas(&mut st.space, &r.dvas);
                }
                continue;
            };
            let p = p?;
            let psize = p.stored.len() as u64;
            let fits = res.as_ref().is_some_and(|r| {
                r.dvas.iter().all(|d| {
                    self.tops
                        .get(d.vdev as usize)
                        .is_some_and(|t| t.alloc_size(psize) <= d.asize as u64)
                })
            });
            let dvas = match res {
                Some(r) if fits => {
                    // Keep what the stored size needs; free the rest.
                    let mut dvas = r.dvas.clone();
                    for d in &mut dvas {
                        let need = self.tops[d.vdev as usize].alloc_size(psize);
                        let tail = d.asize as u64 - need;
                        if tail > 0 {
                            if let Some(m) = st.space.get_mut(d.vdev as usize) {
                                let _ = m.free_now(d.offset + need, tail);
                            }
                            d.asize = need as u32;
                        }
                    }
                    dvas
                }
                other => {
                    if let Some(r) = other {
                        free_dvas(&mut st.space, &r.dvas);
                    }
                    Allocator {
                        tops: &self.tops,
                        space: &mut st.space,
                        rotor: &mut st.rotor,
                        keep_contiguous: &keep,
                    }
                    .alloc(psize, o.copies.clamp(1, 3) as usize)?
                }
            };
            jobs.push((i, p, dvas));
        }
        let results = parallel_map(&jobs, threads, |(_, p, dvas)| {
            pipeline::write_copies(&self.tops, dvas, &p.stored)
        })?;
        let txg = st.txg + 1;
        let mut out = vec![None; blocks.len()];
        for ((i, p, dvas), r) in jobs.iter().zip(results) {
            missed.extend(r?);
            out[*i] = Some(pipeline::make_ptr(p, dvas, txg, BlockType::Data, 0));
        }
        Ok(out)
    }

    /// Installs the extension and its scan function (once, at attach).
    pub fn set_extension(&self, ext: Box<dyn Extension>, scan: ScanFn) {
        let mut st = self.lock();
        st.ext = Some(ext);
        *self.ext_scan.lock().unwrap_or_else(|e| e.into_inner()) = Some(scan);
    }

    /// True once an extension is installed.
    pub fn has_extension(&self) -> bool {
        self.lock().ext.is_some()
    }

    /// Runs `f` on the installed extension of type `T` under the pool lock.
    /// With `write`, waits first while the open txg is at its dirty limit
    /// (the write throttle); with `synced`, first commits whatever is dirty
    /// so `f` starts from a clean open txg (destroy, rollback).
    pub fn with_ext<T: Extension + 'static, R>(
        &self,
        write: bool,
        synced: bool,
        f: impl FnOnce(&mut T, &mut Cx<'_, '_>) -> Result<R, PoolError>,
    ) -> Result<R, PoolError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        if write {
            st = self.throttle(st)?;
        }
        if synced && Self::has_changes(&st) {
            if let Err(e) = self.sync_locked(&mut st) {
                self.set_fault(format!("txg sync failed: {e}"));
                self.cv.notify_all();
                return Err(e);
            }
            self.cv.notify_all();
        }
        let Some(mut ext) = st.ext.take() else {
            return Err(PoolError::Internal(format!(
                "pool '{}' has no dataset layer attached",
                self.name
            )));
        };
        // A panic in `f` (a bug) must not take the dataset layer with it,
        // nor let a half-done change commit: the extension goes back and
        // the pool faults.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            match ext.as_any_mut().downcast_mut::<T>() {
                Some(t) => f(
                    t,
                    &mut Cx {
                        pool: self,
                        st: &mut st,
                    },
                ),
                None => Err(PoolError::Internal("extension of another type".into())),
            }
        }));
        st.ext = Some(ext);
        match r {
            Ok(r) => r,
            Err(_) => {
                let why = "a dataset operation panicked; the pool stopped so that nothing \
                           half-done is committed (export and import it)";
                self.set_fault(why.to_string());
                self.cv.notify_all();
                Err(PoolError::Internal(why.to_string()))
            }
        }
    }

    /// Waits until the open txg is below its dirty limit (the write
    /// throttle). Bounded waits: it asks for a sync again rather than trust
    /// one wake-up.
    pub(crate) fn throttle<'a>(
        &'a self,
        mut st: std::sync::MutexGuard<'a, State>,
    ) -> Result<std::sync::MutexGuard<'a, State>, PoolError> {
        while st.dirty_bytes >= self.opts.dirty_max_bytes {
            st.sync_requested = true;
            self.cv.notify_all();
            st = self
                .cv
                .wait_timeout(st, std::time::Duration::from_secs(1))
                .map(|r| r.0)
                .unwrap_or_else(|e| e.into_inner().0);
            self.check_usable(&st)?;
        }
        Ok(st)
    }

    /// The extension's part of a sync (step 0 of `sync_locked`).
    pub(crate) fn sync_ext(
        &self,
        st: &mut State,
        missed: &mut Vec<Missed>,
    ) -> Result<(), PoolError> {
        let Some(mut ext) = st.ext.take() else {
            if self.scan_fn().is_some() {
                // Installed once, and now missing: its changes would be lost.
                return Err(PoolError::Internal(
                    "the dataset layer is missing from the pool state".into(),
                ));
            }
            return Ok(());
        };
        let r = if ext.has_changes() {
            ext.sync(&mut SyncCx {
                cx: Cx { pool: self, st },
                missed,
            })
        } else {
            Ok(())
        };
        st.ext = Some(ext);
        r
    }

    /// Tells the extension a txg committed.
    pub(crate) fn ext_committed(&self, st: &mut State) {
        let txg = st.txg;
        if let Some(ext) = st.ext.as_mut() {
            ext.committed(txg);
        }
    }

    pub(crate) fn ext_has_changes(st: &State) -> bool {
        st.ext.as_ref().is_some_and(|e| e.has_changes())
    }

    pub(crate) fn scan_fn(&self) -> Option<ScanFn> {
        *self.ext_scan.lock().unwrap_or_else(|e| e.into_inner())
    }
}
