//! The imported pool: its state, its locks and its background threads.
//!
//! # Locking
//!
//! The theory of who runs when is in `txg` (open → quiescing → syncing).
//! The locks, outermost first (a thread holding one may take only those
//! below it):
//!
//! | lock | guards | held |
//! |---|---|---|
//! | `sync` ([`SyncState`]) | the meta tree being built, the frees of the txg, label txg | by the syncer for a whole sync; by exclusive operations (configuration, dataset administration) for their whole length |
//! | `gate` | the open txg's boundary | shared by every open-context operation for its length; exclusively by the quiesce step (an instant) and by exclusive operations |
//! | the extension's own locks | the dataset layer (its directory, each dataset) | see `tarn-dataset` |
//! | `zil` ([`crate::zil::ZilState`]) | the intent log chain | by one log commit (its writes and flush) or the sync's log step |
//! | `st` ([`State`]) | space maps, the pool state record, committed roots, log vdevs | briefly, never across device I/O |
//! | leaf locks | one field each: `fault`, `syncer`, `scanner`, `scan_ops`, `locks`, `ext_scan`, `ext`, the block cache's shards, the holds | briefly; `scan_ops` is taken before `st` |
//!
//! Device I/O happens under `sync` (the syncer's own writes), under `zil`
//! (a log commit), or under no pool lock at all (data reads, scans). The
//! write throttle waits on `cv` with `st` released; so do callers waiting
//! for a txg to commit.
//! Every lock of the process, with its scope and order: docs/design.md.
//!
//! # Threads
//!
//! The syncer (`start_syncer`) commits a txg every `sync_interval`, when the
//! open txg reaches `dirty_sync_bytes`, or when asked; the scanner runs
//! scrubs and resilvers (`scan`). [`Pool::export`] and [`Pool::abandon`]
//! stop both before the pool is released.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tarn_block::BlockPtr;
use tarn_space::SpaceMap;
use tarn_tree::Tree;
use tarn_vdev::{PoolState, TopVdev};

use crate::config::{PoolOptions, PoolProps, VdevSpec};
use crate::scan::ScanRecord;
use crate::store::{Holds, ReadStore};
use crate::vdevs::{check_pool_name, open_new_top};
use crate::PoolError;

/// Meta-tree key of the pool properties.
pub(crate) const K_PROPS: &[u8] = b"\x01props";
/// Meta-tree key of the pool's own state record.
pub(crate) const K_STATE: &[u8] = b"\x01state";
/// Label format version written by this tarn.
pub(crate) const LABEL_VERSION: u32 = 1;

/// Pool state kept in the meta tree (JSON): what must survive export.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct MetaState {
    /// Unix seconds at creation.
    pub created_unix: u64,
    /// Bumped on every vdev configuration change so labels carry a new txg.
    pub config_gen: u64,
    /// Missed txg range [first, last] per leaf GUID (dirty time log).
    pub dtl: BTreeMap<u64, (u64, u64)>,
    /// The current or last scan.
    pub scan: Option<ScanRecord>,
    /// Damaged objects and metadata, as shown by `status`.
    pub damaged: BTreeSet<String>,
    /// Start of the intent log chain of the next txg (see `zil`).
    #[serde(default)]
    pub log: Option<crate::zil::LogHeader>,
}

/// The pool state every thread may need briefly (see the module docs:
/// never held across device I/O).
pub(crate) struct State {
    /// Last committed txg.
    pub txg: u64,
    pub space: Vec<SpaceMap>,
    /// Allocations made by open txgs and not yet committed, per top-level
    /// vdev: offset → (length, txg). The sync of txg T leaves those of
    /// later txgs out of the space maps it writes (see `space`).
    pub uncommitted: Vec<BTreeMap<u64, (u64, u64)>>,
    /// The blocks of the committed space maps (the uberblock's root).
    pub space_root: crate::sync::SpaceBlocks,
    /// Root of the committed meta tree (what scans walk).
    pub meta_root: BlockPtr,
    pub props: PoolProps,
    pub ms: MetaState,
    pub ms_dirty: bool,
    /// `props` changed (a feature was enabled): the next sync writes them.
    pub props_dirty: bool,
    pub rotor: usize,
    pub sync_requested: bool,
    pub closed: bool,
    pub last_sync_unix: u64,
    /// Separate log devices (see `logdev`).
    pub logs: Vec<crate::logdev::LogVdev>,
    /// The damage reports of `ms` when the running scrub started in this
    /// process: a clean end clears those (the scrub read their blocks and
    /// found them whole, or they are gone), never a report made while it
    /// ran, whose block it may have walked past before the damage. None
    /// for a scrub resumed after an import: its end clears nothing.
    pub damaged_at_scrub_start: Option<std::collections::BTreeSet<String>>,
}

/// What only whoever syncs touches (the syncer, or an exclusive operation).
pub(crate) struct SyncState {
    /// The meta tree: the committed one plus the changes the next sync
    /// commits.
    pub meta: Tree,
    /// Blocks whose last reference was dropped by the txg being built.
    pub frees: Vec<BlockPtr>,
    /// Last txg that freed blocks other than the space map's own.
    pub last_free_txg: u64,
    /// Config txg of the last label write.
    pub label_txg: u64,
}

/// Control word for the scan thread.
pub(crate) const SCAN_RUN: u8 = 0;
pub(crate) const SCAN_PAUSE: u8 = 1;
pub(crate) const SCAN_CANCEL: u8 = 2;

/// An imported pool.
pub struct Pool {
    pub(crate) name: String,
    pub(crate) guid: u64,
    pub(crate) ashift: u8,
    pub(crate) tops: Vec<Arc<TopVdev>>,
    pub(crate) opts: PoolOptions,
    pub(crate) st: Mutex<State>,
    pub(crate) cv: Condvar,
    pub(crate) sync: Mutex<SyncState>,
    pub(crate) gate: RwLock<()>,
    /// The txg open-context changes go into now.
    pub(crate) open_txg: AtomicU64,
    /// Bytes the open txg holds for its sync (the write throttle).
    pub(crate) dirty: AtomicU64,
    pub(crate) zil: Mutex<crate::zil::ZilState>,
    /// The dataset layer (see `ext`).
    pub(crate) ext: RwLock<Option<Arc<dyn crate::ext::Extension>>>,
    pub(crate) holds: Arc<Holds>,
    pub(crate) cache: Arc<tarn_block::BlockCache>,
    /// Data-block reads in progress (see `flight`).
    pub(crate) flights: crate::flight::Flights,
    pub(crate) fault: Mutex<Option<String>>,
    pub(crate) stop: AtomicBool,
    pub(crate) scan_ctl: AtomicU8,
    pub(crate) syncer: Mutex<Option<JoinHandle<()>>>,
    pub(crate) scanner: Mutex<Option<JoinHandle<()>>>,
    /// Serializes starting, pausing and cancelling scans.
    pub(crate) scan_ops: Mutex<()>,
    pub(crate) locks: Mutex<Vec<File>>,
    /// How scans find the blocks the extension references.
    pub(crate) ext_scan: Mutex<Option<crate::ext::ScanFn>>,
    /// How long each txg sync took (quiesce to uberblock), for metrics.
    pub(crate) sync_times: tarn_stats::Histogram,
}

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A random 64-bit GUID (never 0).
pub(crate) fn new_guid() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    let ok = File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok();
    if !ok {
        let seed = format!(
            "{:?}{}{:?}",
            SystemTime::now(),
            std::process::id(),
            std::thread::current().id()
        );
        b.copy_from_slice(&blake3::hash(seed.as_bytes()).as_bytes()[..8]);
    }
    u64::from_le_bytes(b).max(1)
}

impl Pool {
    /// Creates a pool on `specs`, writing labels and the first txg.
    pub fn create(
        name: &str,
        specs: &[VdevSpec],
        ashift: u8,
        props: &BTreeMap<String, String>,
        force: bool,
        opts: PoolOptions,
    ) -> Result<Arc<Pool>, PoolError> {
        check_pool_name(name)?;
        if ![9, 12, 13].contains(&ashift) {
            return Err(PoolError::Invalid(format!(
                "ashift={ashift}: expected 9, 12 or 13"
            )));
        }
        if specs.is_empty() {
            return Err(PoolError::Invalid("a pool needs at least one vdev".into()));
        }
        let mut pprops = PoolProps::default();
        pprops.apply(props)?;
        let mut seen = BTreeSet::new();
        for s in specs {
            for d in &s.devices {
                let canon = std::fs::canonicalize(d).unwrap_or_else(|_| d.clone());
                if !seen.insert(canon) {
                    return Err(PoolError::Invalid(format!(
                        "device {} is listed twice",
                        d.display()
                    )));
                }
            }
        }
        let mut locks = Vec::new();
        let mut tops = Vec::new();
        let mut tree_cfg = Vec::new();
        for s in specs {
            let (top, cfg) = open_new_top(s, ashift, force, &mut locks)?;
            tops.push(top);
            tree_cfg.push(cfg);
        }
        let space = tops
            .iter()
            .map(|t| SpaceMap::new(t.asize(), t.alloc_align()))
            .collect();
        let ms = MetaState {
            created_unix: now_unix(),
            ..Default::default()
        };
        let pool = Arc::new(Pool::assemble(
            name,
            new_guid(),
            ashift,
            tops,
            opts,
            0,
            Tree::new(),
            space,
            crate::sync::SpaceBlocks::default(),
            pprops,
            ms,
            locks,
        ));
        {
            let mut sync = pool.sync_state();
            let props_json = serde_json::to_vec(&pool.lock().props)
                .map_err(|e| PoolError::Internal(e.to_string()))?;
            sync.meta.insert(&pool.read_store(), K_PROPS, &props_json)?;
            let _gate = pool.gate_exclusive();
            pool.lock().ms_dirty = true;
            // Labels first, so the devices are recognisable; then txg 1,
            // which also starts the intent log's chain.
            pool.zil_state().wanted = true;
            pool.write_labels(&mut sync, PoolState::Active)?;
            pool.sync_txg(&mut sync, true)?;
            pool.write_labels(&mut sync, PoolState::Active)?;
        }
        pool.start_syncer();
        Ok(pool)
    }

    /// Builds the in-memory pool around opened vdevs and loaded state.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn assemble(
        name: &str,
        guid: u64,
        ashift: u8,
        tops: Vec<Arc<TopVdev>>,
        opts: PoolOptions,
        txg: u64,
        meta: Tree,
        space: Vec<SpaceMap>,
        space_root: crate::sync::SpaceBlocks,
        props: PoolProps,
        ms: MetaState,
        locks: Vec<File>,
    ) -> Pool {
        let cache = opts.block_cache();
        let meta_root = meta.root();
        let uncommitted = vec![BTreeMap::new(); tops.len()];
        Pool {
            name: name.to_string(),
            guid,
            ashift,
            tops,
            opts,
            st: Mutex::new(State {
                txg,
                space,
                uncommitted,
                space_root,
                meta_root,
                props,
                ms,
                ms_dirty: false,
                props_dirty: false,
                rotor: 0,
                sync_requested: false,
                closed: false,
                last_sync_unix: now_unix(),
                logs: Vec::new(),
                damaged_at_scrub_start: None,
            }),
            cv: Condvar::new(),
            sync: Mutex::new(SyncState {
                meta,
                frees: Vec::new(),
                last_free_txg: 0,
                label_txg: 0,
            }),
            gate: RwLock::new(()),
            open_txg: AtomicU64::new(txg + 1),
            dirty: AtomicU64::new(0),
            zil: Mutex::new(Default::default()),
            ext: RwLock::new(None),
            holds: Arc::new(Holds::default()),
            cache,
            flights: Default::default(),
            fault: Mutex::new(None),
            stop: AtomicBool::new(false),
            scan_ctl: AtomicU8::new(SCAN_RUN),
            syncer: Mutex::new(None),
            scanner: Mutex::new(None),
            scan_ops: Mutex::new(()),
            locks: Mutex::new(locks),
            ext_scan: Mutex::new(None),
            sync_times: tarn_stats::Histogram::new(tarn_stats::SYNC_US),
        }
    }

    /// Size and counters of the block cache this pool reads through (shared
    /// with the other pools that use the same cache).
    pub fn cache_stats(&self) -> tarn_block::CacheStats {
        self.cache.stats()
    }

    /// A store for reading committed trees through the block cache.
    pub(crate) fn read_store(&self) -> ReadStore<'_> {
        ReadStore {
            tops: &self.tops,
            cache: &self.cache,
            pool: self.guid,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sync lock (see the module docs).
    pub(crate) fn sync_state(&self) -> MutexGuard<'_, SyncState> {
        self.sync.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The intent log's lock.
    pub(crate) fn zil_state(&self) -> MutexGuard<'_, crate::zil::ZilState> {
        self.zil.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The gate, shared: what an open-context operation holds.
    pub(crate) fn gate_shared(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The gate, exclusive: no open-context operation runs meanwhile.
    pub(crate) fn gate_exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Pool name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Pool GUID.
    pub fn guid(&self) -> u64 {
        self.guid
    }

    /// Last committed txg.
    pub fn txg(&self) -> u64 {
        self.lock().txg
    }

    /// The txg that changes join now (it may close as soon as this
    /// returns: a hint, never a promise).
    pub fn open_txg(&self) -> u64 {
        self.open_txg.load(Ordering::Acquire)
    }

    /// The pool's properties.
    pub fn props(&self) -> PoolProps {
        self.lock().props.clone()
    }

    /// Paths of every device the pool uses now.
    pub fn device_paths(&self) -> Vec<PathBuf> {
        self.tops
            .iter()
            .flat_map(|t| t.leaves().into_iter().map(|l| l.path))
            .collect()
    }

    pub(crate) fn check_usable(&self, st: &State) -> Result<(), PoolError> {
        if let Some(f) = self
            .fault
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            return Err(PoolError::Faulted(f.clone()));
        }
        if st.closed {
            return Err(PoolError::NotFound(format!(
                "pool '{}' is exported",
                self.name
            )));
        }
        Ok(())
    }

    pub(crate) fn set_fault(&self, why: String) {
        let mut f = self.fault.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            *f = Some(why);
        }
    }

    /// [`Pool::set_fault`], then wakes every waiter on `cv` under the state
    /// lock they check the fault with, so none misses it between its check
    /// and its wait. Not to be called with the state lock held.
    pub(crate) fn fault_and_wake(&self, why: String) {
        self.set_fault(why);
        let _st = self.lock();
        self.cv.notify_all();
    }

    /// Starts the background thread that syncs every `sync_interval` or when
    /// enough data is dirty.
    pub(crate) fn start_syncer(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let interval = self.opts.sync_interval;
        let h = std::thread::Builder::new()
            .name(format!("txg-sync-{}", self.name))
            .spawn(move || loop {
                let Some(pool) = weak.upgrade() else { return };
                {
                    let mut st = pool.lock();
                    let deadline = Instant::now() + interval;
                    loop {
                        if pool.stop.load(Ordering::Acquire) || st.closed {
                            return;
                        }
                        if st.sync_requested || pool.dirty_bytes() >= pool.opts.dirty_sync_bytes {
                            break;
                        }
                        let now = Instant::now();
                        if now >= deadline {
                            break;
                        }
                        st = pool
                            .cv
                            .wait_timeout(st, (deadline - now).min(interval))
                            .map(|r| r.0)
                            .unwrap_or_else(|e| e.into_inner().0);
                    }
                    st.sync_requested = false;
                }
                let faulted = pool.fault.lock().map(|f| f.is_some()).unwrap_or(true);
                if !faulted {
                    let mut sync = pool.sync_state();
                    if pool.has_changes(&sync) {
                        if let Err(e) = pool.sync_txg(&mut sync, false) {
                            pool.set_fault(format!("txg sync failed: {e}"));
                        }
                    }
                }
                {
                    let _st = pool.lock();
                    pool.cv.notify_all();
                }
                let resilver = pool.resilver_pending(&pool.lock());
                if resilver {
                    pool.start_resilver_if_needed();
                }
                drop(pool);
            });
        match h {
            Ok(h) => *self.syncer.lock().unwrap_or_else(|e| e.into_inner()) = Some(h),
            // Without its syncer nothing would ever commit: say so.
            Err(e) => self.set_fault(format!("cannot start the txg sync thread: {e}")),
        }
    }

    /// Stops every background thread and releases the devices without
    /// writing anything more, as if the process died at this instant: what
    /// no txg committed and no intent log holds is lost, exactly as in a
    /// crash. For crash tests and simulations; the pool cannot be used
    /// afterwards, and importing it again replays its intent log.
    pub fn abandon(&self) {
        self.stop_threads();
        // No sync may be half way through when the devices are let go.
        let _sync = self.sync_state();
        let mut st = self.lock();
        st.closed = true;
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).clear();
        // A crash takes the process's memory with it.
        self.cache.evict_pool(self.guid);
        self.cv.notify_all();
    }

    /// Stops the syncer and the scanner and waits for them.
    fn stop_threads(&self) {
        self.request_stop();
        // The syncer first: it may start a resilver until it sees the flag.
        if let Some(h) = self.syncer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
        if let Some(h) = self
            .scanner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = h.join();
        }
    }

    /// Stops background threads, commits what is dirty, and marks the labels
    /// exported (or destroyed). The pool cannot be used afterwards.
    pub fn export(&self, destroy: bool) -> Result<(), PoolError> {
        self.stop_threads();
        let mut sync = self.sync_state();
        let _gate = self.gate_exclusive();
        if self.lock().closed {
            return Ok(());
        }
        let faulted = self.fault.lock().map(|f| f.is_some()).unwrap_or(true);
        let mut result = Ok(());
        if !faulted {
            {
                let mut st = self.lock();
                if st.ms.scan.as_ref().is_some_and(|s| s.is_running()) {
                    // Resume after the next import.
                    st.ms_dirty = true;
                }
            }
            if self.has_changes(&sync) {
                result = self.sync_txg(&mut sync, true).map(|_| ());
            }
            if result.is_ok() {
                let state = if destroy {
                    PoolState::Destroyed
                } else {
                    PoolState::Exported
                };
                result = self.write_labels(&mut sync, state);
            }
        }
        self.lock().closed = true;
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).clear();
        // The devices may be imported elsewhere, or rewritten, before the
        // pool comes back: nothing of it stays cached.
        self.cache.evict_pool(self.guid);
        self.cv.notify_all();
        result
    }

    /// Tells the background threads to stop. The flag is set under the pool
    /// lock: the syncer checks it under that lock before it waits, so the
    /// wake-up cannot fall between its check and its wait.
    fn request_stop(&self) {
        let _st = self.lock();
        self.stop.store(true, Ordering::Release);
        self.cv.notify_all();
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.name)
            .field("guid", &format_args!("{:016x}", self.guid))
            .finish()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.cv.notify_all();
    }
}
