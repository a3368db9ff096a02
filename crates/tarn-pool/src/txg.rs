//! Transaction groups: open, quiescing, syncing.
//!
//! # Theory
//!
//! At any instant there is one *open* txg, which every change joins, and
//! at most one *syncing* txg, being written. An open-context operation (a
//! dataset transaction, an intent log commit, a read) holds the `gate`
//! shared for its length: the txg it joined cannot close under it, so all
//! its changes land in one txg.
//!
//! **Quiescing** is the instant the open txg T closes: the syncer takes the
//! gate exclusively (waiting for the operations in flight, which are short:
//! they never wait for a sync while holding the gate), makes T + 1 the open
//! txg, hands T's dirty-byte count to the sync, and tells the extension,
//! which sets T's changes aside (see `tarn-dataset`'s overlays). Then it
//! lets go of the gate.
//!
//! **Syncing** T runs with the gate free: data blocks, trees bottom-up,
//! space maps, flush, uberblocks, flush (`sync`). Operations go on joining
//! T + 1 meanwhile; they read T's changes where the extension set them
//! aside, and the committed trees of T - 1 beneath. Only the `sync` lock is
//! held, which nobody in open context takes. Space the open txg allocates
//! meanwhile is kept out of T's space maps (`space`), so T's on-disk state
//! never mentions a block of T + 1.
//!
//! **Committing** T: once its uberblocks are flushed, T is the committed
//! txg; the extension publishes T's trees to readers and drops what it set
//! aside; deferred frees that are old enough come back; waiters wake.
//!
//! **The write throttle.** A writer waits (before taking the gate, so it
//! never holds up a quiesce) while the open txg holds `dirty_max_bytes`:
//! with one txg syncing and one open, the open one is the only place new
//! data can go, so a full open txg waits for the syncing one to finish and
//! for its own turn to quiesce. The syncer starts early when the open txg
//! reaches `dirty_sync_bytes`.
//!
//! **Exclusive operations** (configuration changes, dataset
//! administration, export) take the `sync` lock and the gate exclusively
//! for their whole length, commit what is pending first, and commit their
//! own changes before they return: they see a quiet pool and are durable
//! on return. They are rare; front ends wait for them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tarn_space::DEFER_TXGS;

use crate::pool::{Pool, SyncState};
use crate::PoolError;

impl Pool {
    /// Bytes the open txg holds now.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty.load(Ordering::Relaxed)
    }

    /// Waits while the open txg is at its dirty limit (the write throttle).
    /// Bounded waits: it asks for a sync again rather than trust one
    /// wake-up.
    pub(crate) fn throttle(&self) -> Result<(), PoolError> {
        if self.dirty_bytes() < self.opts.dirty_max_bytes {
            return Ok(());
        }
        let mut st = self.lock();
        while self.dirty_bytes() >= self.opts.dirty_max_bytes {
            self.check_usable(&st)?;
            // Only the writer that asks first wakes anyone: the syncer reads
            // the flag under this lock before it waits, so it cannot miss
            // it, and waking every other waiter from each waiter kept them
            // all waking one another (a fifth of the CPU of a large copy).
            if !st.sync_requested {
                st.sync_requested = true;
                self.cv.notify_all();
            }
            st = self
                .cv
                .wait_timeout(st, Duration::from_millis(200))
                .map(|r| r.0)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        self.check_usable(&st)
    }

    /// True when a sync would write anything.
    pub(crate) fn has_changes(&self, sync: &SyncState) -> bool {
        let st = self.lock();
        // Deferred frees only come back after more txgs commit: keep syncing
        // for DEFER_TXGS txgs after real frees (not for the space map's own
        // block, which every sync replaces: an idle pool must stay idle).
        let pool = sync.meta.is_dirty()
            || st.ms_dirty
            || st.props_dirty
            || !sync.frees.is_empty()
            || st.txg < sync.last_free_txg + DEFER_TXGS;
        drop(st);
        pool || self.zil_has_changes() || self.ext_has_changes()
    }

    /// Commits every change made before this call: waits for a sync in
    /// progress, then syncs the open txg (if anything changed). Returns the
    /// last committed txg.
    pub fn sync(&self) -> Result<u64, PoolError> {
        self.check_usable(&self.lock())?;
        let mut sync = self.sync_state();
        self.check_usable(&self.lock())?;
        if self.has_changes(&sync) {
            if let Err(e) = self.sync_txg(&mut sync, false) {
                self.fault_and_wake(format!("txg sync failed: {e}"));
                return Err(e);
            }
        }
        self.cv.notify_all();
        Ok(self.lock().txg)
    }

    /// Waits until the txg sync in progress, if any, has finished
    /// (committed, or failed and faulted the pool). An intent log commit
    /// that finds most of what it would log in the txg being synced waits
    /// for it rather than writing that data a second time.
    pub fn wait_for_sync(&self) {
        drop(self.sync_state());
    }

    /// Quiesces the open txg and syncs it; with `gate_held`, the caller holds
    /// the gate exclusively already (an exclusive operation). Returns the txg
    /// committed.
    pub(crate) fn sync_txg(&self, sync: &mut SyncState, gate_held: bool) -> Result<u64, PoolError> {
        let start = std::time::Instant::now();
        let txg = {
            let _gate = (!gate_held).then(|| self.gate_exclusive());
            self.quiesce()
        };
        let done = self.sync_body(sync, txg);
        if done.is_ok() {
            self.sync_times.since(start);
        }
        done
    }

    /// Closes the open txg (the gate is held exclusively): the next one opens,
    /// the extension sets the closed one's changes aside.
    fn quiesce(&self) -> u64 {
        let txg = self.open_txg.fetch_add(1, Ordering::AcqRel);
        self.dirty.store(0, Ordering::Relaxed);
        if let Some(ext) = self.extension() {
            ext.quiesce(txg);
        }
        // Writers waiting for room may go on now (under the lock they check
        // the counter with, so the wake-up cannot be missed).
        let _st = self.lock();
        self.cv.notify_all();
        txg
    }

    /// Runs `f` as an exclusive operation (see the module docs): the pool
    /// is quiet, everything pending is committed first, and whatever `f`
    /// changed is committed before this returns.
    pub(crate) fn exclusive<R>(
        &self,
        f: impl FnOnce(&mut SyncState) -> Result<R, PoolError>,
    ) -> Result<R, PoolError> {
        self.check_usable(&self.lock())?;
        let mut sync = self.sync_state();
        let _gate = self.gate_exclusive();
        self.check_usable(&self.lock())?;
        let fail = |e: PoolError| {
            self.fault_and_wake(format!("txg sync failed: {e}"));
            e
        };
        if self.has_changes(&sync) {
            self.sync_txg(&mut sync, true).map_err(fail)?;
        }
        let r = f(&mut sync);
        // Whatever `f` changed, even when it failed part way (a failure
        // after a change has faulted the pool already).
        if self.fault.lock().map(|f| f.is_none()).unwrap_or(false) && self.has_changes(&sync) {
            self.sync_txg(&mut sync, true).map_err(fail)?;
        }
        self.cv.notify_all();
        r
    }
}
