//! The imported pool: its state, the txg sync, and raw objects.
//!
//! See the crate documentation for the theory of the sync order. Locking is
//! deliberately simple: one mutex over all mutable pool state, held for the
//! whole of a sync. Readers and writers of the open txg take it briefly;
//! scans hold a txg (see `store::Holds`) and do their I/O without it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tarn_block::pipeline::{self, Missed, Prepared};
use tarn_block::{BlockPtr, BlockType, CompressAlg};
use tarn_space::{SpaceMap, DEFER_TXGS};
use tarn_tree::Tree;
use tarn_vdev::{LabelConfig, Leaf, LeafState, PoolState, TopHealth, TopVdev, VdevKind};

use crate::config::{PoolOptions, PoolProps, VdevSpec};
use crate::scan::ScanRecord;
use crate::status::{Counters, Health, PoolListEntry, PoolStatus, VdevStatus};
use crate::store::{
    Allocator, HoldGuard, Holds, NodeCache, ReadStore, TxStore, METADATA_RESERVE_BYTES,
};
use crate::uberblock::Uberblock;
use crate::PoolError;

/// Meta-tree key of the pool properties.
pub(crate) const K_PROPS: &[u8] = b"\x01props";
/// Meta-tree key of the pool's own state record.
pub(crate) const K_STATE: &[u8] = b"\x01state";
/// Prefix of raw-object directory entries: prefix + name.
pub(crate) const P_OBJDIR: u8 = 0x10;
/// Prefix of raw-object records: prefix + object id (BE) + record index (BE).
pub(crate) const P_RECORD: u8 = 0x20;
/// Magic of the space-root block.
const SPACE_ROOT_MAGIC: &[u8; 4] = b"TSPR";
/// Label format version written by this tarn.
const LABEL_VERSION: u32 = 1;

/// Pool state kept in the meta tree (JSON): what must survive export.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct MetaState {
    /// Next raw-object id; ids are never reused.
    pub next_object: u64,
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

/// A raw object's directory entry (JSON in the meta tree).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ObjEntry {
    pub id: u64,
    pub size: u64,
    pub recordsize: u32,
    pub mtime_unix: u64,
}

/// What the API reports about a raw object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectInfo {
    /// Object name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// The txg that holds this state (the open txg when not yet synced).
    pub txg: u64,
}

/// All mutable pool state, under one mutex.
pub(crate) struct State {
    /// Last committed txg.
    pub txg: u64,
    pub meta: Tree,
    pub space: Vec<SpaceMap>,
    pub space_root: BlockPtr,
    pub props: PoolProps,
    pub ms: MetaState,
    pub ms_dirty: bool,
    /// Dirty records of the open txg, keyed by (object id, record index),
    /// with the room allocated for each when it became dirty.
    pub dirty: BTreeMap<(u64, u64), Vec<u8>>,
    pub dirty_res: BTreeMap<(u64, u64), crate::ext::Reservation>,
    pub dirty_bytes: u64,
    /// Blocks whose last reference was dropped in the open txg.
    pub frees: Vec<BlockPtr>,
    pub rotor: usize,
    pub sync_requested: bool,
    /// Last txg that freed blocks other than the space map's own.
    pub last_free_txg: u64,
    /// Config txg of the last label write.
    pub label_txg: u64,
    pub closed: bool,
    pub last_sync_unix: u64,
    /// The dataset layer's state (see `ext`).
    pub ext: Option<Box<dyn crate::ext::Extension>>,
    /// The intent log (see `zil`).
    pub zil: crate::zil::ZilState,
    /// Separate log devices (see `logdev`).
    pub logs: Vec<crate::logdev::LogVdev>,
}

/// Control word for the scan thread.
pub(crate) const SCAN_RUN: u8 = 0;
pub(crate) const SCAN_PAUSE: u8 = 1;
pub(crate) const SCAN_CANCEL: u8 = 2;

/// A visitor of meta-tree entries (key, value); false stops the walk.
pub(crate) type EntryFn<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool, PoolError> + 'a;

/// An imported pool.
pub struct Pool {
    pub(crate) name: String,
    pub(crate) guid: u64,
    pub(crate) ashift: u8,
    pub(crate) tops: Vec<Arc<TopVdev>>,
    pub(crate) opts: PoolOptions,
    pub(crate) st: Mutex<State>,
    pub(crate) cv: Condvar,
    pub(crate) holds: Holds,
    pub(crate) cache: NodeCache,
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

/// Takes an exclusive advisory lock on a device so no second process (and
/// no second pool in this one) opens it while this pool holds it.
pub(crate) fn lock_device(path: &Path) -> Result<File, PoolError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let is_block = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    if is_block {
        // Linux refuses O_EXCL on a block device that is mounted or held
        // by another program (a filesystem, md, device-mapper).
        opts.custom_flags(libc::O_EXCL);
    }
    let f = opts.open(path).map_err(|e| {
        if is_block && e.raw_os_error() == Some(libc::EBUSY) {
            PoolError::InUse(format!(
                "device {} is in use (mounted, or held by another program)",
                path.display()
            ))
        } else {
            PoolError::NotFound(format!("cannot open {}: {e}", path.display()))
        }
    })?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(PoolError::InUse(format!(
            "device {} is in use by another pool or another tarn process",
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(PoolError::InUse(format!(
            "cannot lock device {}: {e}",
            path.display()
        ))),
    }
}

/// Validates a pool name the way users expect from ZFS.
/// Opens the devices of a new top-level vdev (refusing devices of another
/// live pool unless `force`), locks them and gives each a new guid.
pub(crate) fn open_new_top(
    s: &VdevSpec,
    ashift: u8,
    force: bool,
    locks: &mut Vec<File>,
) -> Result<(Arc<TopVdev>, tarn_vdev::TopConfig), PoolError> {
    let mut leaves: Vec<Option<Arc<dyn Leaf>>> = Vec::new();
    let mut children = Vec::new();
    for d in &s.devices {
        let leaf = tarn_vdev::open_device(d)
            .map_err(|e| PoolError::Invalid(format!("device {}: {e}", d.display())))?;
        if leaf.size() < tarn_vdev::MIN_LEAF_SIZE {
            return Err(PoolError::Invalid(format!(
                "device {} is too small: {} bytes, at least {} MiB needed",
                d.display(),
                leaf.size(),
                tarn_vdev::MIN_LEAF_SIZE >> 20
            )));
        }
        if let Ok(l) = tarn_vdev::read_label(leaf.as_ref()) {
            if l.config.state != PoolState::Destroyed && !force {
                return Err(PoolError::InUse(format!(
                    "device {} belongs to pool '{}' ({:?}); use -f to overwrite it",
                    d.display(),
                    l.config.pool_name,
                    l.config.state
                )));
            }
        }
        locks.push(lock_device(d)?);
        children.push(tarn_vdev::LeafConfig {
            guid: new_guid(),
            path: std::fs::canonicalize(d).unwrap_or_else(|_| d.clone()),
            offline: false,
        });
        leaves.push(Some(leaf as Arc<dyn Leaf>));
    }
    let cfg = tarn_vdev::TopConfig {
        kind: s.kind,
        guid: new_guid(),
        children,
    };
    let top = Arc::new(TopVdev::open(&cfg, ashift, leaves)?);
    Ok((top, cfg))
}

pub(crate) fn check_pool_name(name: &str) -> Result<(), PoolError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
    if ok {
        Ok(())
    } else {
        Err(PoolError::Invalid(format!(
            "invalid pool name '{name}': use 1-64 letters, digits, '-', '_', '.', ':' starting with a letter"
        )))
    }
}

pub(crate) fn record_key(id: u64, blk: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = P_RECORD;
    k[1..9].copy_from_slice(&id.to_be_bytes());
    k[9..17].copy_from_slice(&blk.to_be_bytes());
    k
}

pub(crate) fn objdir_key(name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + name.len());
    k.push(P_OBJDIR);
    k.extend_from_slice(name.as_bytes());
    k
}

fn check_object_name(name: &str) -> Result<(), PoolError> {
    if name.is_empty() || name.len() > 255 || name.contains('\0') {
        return Err(PoolError::Invalid(format!(
            "invalid object name {name:?}: 1-255 bytes, no NUL"
        )));
    }
    Ok(())
}

/// Encodes every space map into one block (see docs/format.md).
fn encode_space_root(space: &[SpaceMap], len: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(SPACE_ROOT_MAGIC);
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&(space.len() as u32).to_le_bytes());
    for m in space {
        let e = m.encode();
        b.extend_from_slice(&(e.len() as u32).to_le_bytes());
        b.extend_from_slice(&e);
    }
    debug_assert!(b.len() <= len);
    b.resize(len.max(b.len()), 0);
    b
}

/// Decodes the space-root block; every length is checked.
pub(crate) fn decode_space_root(b: &[u8], tops: usize) -> Result<Vec<SpaceMap>, PoolError> {
    let bad = |w: &str| PoolError::Corrupt(format!("space root: {w}"));
    if b.len() < 12 || &b[..4] != SPACE_ROOT_MAGIC {
        return Err(bad("no magic"));
    }
    let n = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
    if n != tops {
        return Err(bad(&format!("{n} space maps for {tops} top-level vdevs")));
    }
    let mut off = 12;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len_bytes = b.get(off..off + 4).ok_or_else(|| bad("truncated"))?;
        let len =
            u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
        off += 4;
        let body = b.get(off..off + len).ok_or_else(|| bad("truncated map"))?;
        out.push(SpaceMap::decode(body)?);
        off += len;
    }
    Ok(out)
}

/// Runs `f` over `items` on up to `threads` scoped threads, keeping order.
pub(crate) fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Result<Vec<R>, PoolError> {
    let threads = threads.clamp(1, items.len().max(1));
    if threads == 1 {
        return Ok(items.iter().map(&f).collect());
    }
    let chunk = items.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|c| s.spawn(|| c.iter().map(&f).collect::<Vec<R>>()))
            .collect();
        let mut out = Vec::with_capacity(items.len());
        for h in handles {
            match h.join() {
                Ok(v) => out.extend(v),
                Err(_) => return Err(PoolError::Internal("a sync worker thread panicked".into())),
            }
        }
        Ok(out)
    })
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
            next_object: 1,
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
            BlockPtr::default(),
            pprops,
            ms,
            locks,
        ));
        {
            let mut st = pool.lock();
            st.ms_dirty = true;
            let props_json =
                serde_json::to_vec(&st.props).map_err(|e| PoolError::Internal(e.to_string()))?;
            let State { meta, .. } = &mut *st;
            meta.insert(
                &ReadStore {
                    tops: &pool.tops,
                    cache: &pool.cache,
                },
                K_PROPS,
                &props_json,
            )?;
            // Labels first, so the devices are recognisable; then txg 1,
            // which also starts the intent log's chain.
            st.zil.wanted = true;
            pool.write_labels(&mut st, PoolState::Active)?;
            pool.sync_locked(&mut st)?;
            pool.write_labels(&mut st, PoolState::Active)?;
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
        space_root: BlockPtr,
        props: PoolProps,
        ms: MetaState,
        locks: Vec<File>,
    ) -> Pool {
        let cache = NodeCache::new(opts.node_cache_bytes);
        Pool {
            name: name.to_string(),
            guid,
            ashift,
            tops,
            opts,
            st: Mutex::new(State {
                txg,
                meta,
                space,
                space_root,
                props,
                ms,
                ms_dirty: false,
                dirty: BTreeMap::new(),
                dirty_res: BTreeMap::new(),
                dirty_bytes: 0,
                frees: Vec::new(),
                rotor: 0,
                sync_requested: false,
                last_free_txg: 0,
                label_txg: 0,
                closed: false,
                last_sync_unix: now_unix(),
                ext: None,
                zil: Default::default(),
                logs: Vec::new(),
            }),
            cv: Condvar::new(),
            holds: Holds::default(),
            cache,
            fault: Mutex::new(None),
            stop: AtomicBool::new(false),
            scan_ctl: AtomicU8::new(SCAN_RUN),
            syncer: Mutex::new(None),
            scanner: Mutex::new(None),
            scan_ops: Mutex::new(()),
            locks: Mutex::new(locks),
            ext_scan: Mutex::new(None),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Writes the current configuration into the labels of every usable leaf
    /// (even labels, flush, odd labels, flush).
    /// Each label write carries a txg above every earlier one (labels on a
    /// device absent at the write keep the older txg and lose to these).
    pub(crate) fn write_labels(&self, st: &mut State, state: PoolState) -> Result<(), PoolError> {
        let txg = st.txg.max(st.label_txg + 1);
        self.write_labels_at(st, state, txg)
    }

    /// Writes the labels with an explicit config txg.
    pub(crate) fn write_labels_at(
        &self,
        st: &mut State,
        state: PoolState,
        txg: u64,
    ) -> Result<(), PoolError> {
        st.label_txg = st.label_txg.max(txg);
        let tree: Vec<_> = self.tops.iter().map(|t| t.config()).collect();
        let logs: Vec<_> = st.logs.iter().map(|l| l.top.config()).collect();
        let mut written = 0;
        let mut last_err = None;
        let all = self
            .tops
            .iter()
            .enumerate()
            .map(|(i, t)| (i as u32, t))
            .chain(
                st.logs
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (tarn_vdev::LOG_TOP_BASE + i as u32, &l.top)),
            );
        for (ti, t) in all {
            for (ci, info) in t.leaves().into_iter().enumerate() {
                if !matches!(info.state, LeafState::Online) {
                    continue;
                }
                let Some(leaf) = t.leaf(ci) else { continue };
                let cfg = LabelConfig {
                    version: LABEL_VERSION,
                    pool_name: self.name.clone(),
                    pool_guid: self.guid,
                    state: state.clone(),
                    txg,
                    device_guid: info.guid,
                    top_index: ti,
                    ashift: self.ashift,
                    owner: Some(self.opts.owner.clone()),
                    tree: tree.clone(),
                    logs: logs.clone(),
                };
                match tarn_vdev::write_label_config_all(leaf.as_ref(), &cfg) {
                    Ok(()) => written += 1,
                    Err(e) => last_err = Some(e),
                }
            }
        }
        match (written, last_err) {
            (0, Some(e)) => Err(e.into()),
            _ => Ok(()),
        }
    }

    pub(crate) fn has_changes(st: &State) -> bool {
        // Deferred frees only come back after more txgs commit: keep syncing
        // for DEFER_TXGS txgs after real frees (not for the space map's own
        // block, which every sync replaces: an idle pool must stay idle).
        !st.dirty.is_empty()
            || Self::ext_has_changes(st)
            || st.meta.is_dirty()
            || st.ms_dirty
            || !st.frees.is_empty()
            || !st.zil.frees.is_empty()
            || st.zil.wanted
            || st.txg < st.last_free_txg + DEFER_TXGS
    }

    /// Commits the open txg now (if anything changed) and returns the last
    /// committed txg.
    pub fn sync(&self) -> Result<u64, PoolError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        if Self::has_changes(&st) {
            if let Err(e) = self.sync_locked(&mut st) {
                self.set_fault(format!("txg sync failed: {e}"));
                self.cv.notify_all();
                return Err(e);
            }
        }
        self.cv.notify_all();
        Ok(st.txg)
    }

    /// The txg sync (crate docs, "Sync of txg T").
    pub(crate) fn sync_locked(&self, st: &mut State) -> Result<u64, PoolError> {
        let txg = st.txg + 1;
        let alg = st.props.checksum_alg();
        let compression = st.props.compression();
        let data_copies = st.props.copies as usize;
        let meta_copies = st.props.metadata_copies();
        // Leaves that missed writes made early for the intent log.
        let mut missed: Vec<Missed> = std::mem::take(&mut st.zil.missed);

        // 0. The dataset layer: its data blocks and tree nodes, and its
        // entries of the meta tree, which commits below.
        self.sync_ext(st, &mut missed)?;

        // 1. Data blocks: prepare in parallel, written into the room each
        // record was given when it became dirty.
        let items: Vec<((u64, u64), Vec<u8>)> = std::mem::take(&mut st.dirty).into_iter().collect();
        let mut res = std::mem::take(&mut st.dirty_res);
        st.dirty_bytes = 0;
        let opts = crate::ext::BlockOpts {
            compression,
            checksum: alg,
            copies: data_copies as u8,
        };
        let blocks: Vec<(
            &[u8],
            crate::ext::BlockOpts,
            Option<crate::ext::Reservation>,
        )> = items
            .iter()
            .map(|(k, d)| (d.as_slice(), opts, res.remove(k)))
            .collect();
        let written = self.write_data(st, &mut missed, blocks)?;
        let new_ptrs: BTreeMap<usize, BlockPtr> = written
            .into_iter()
            .enumerate()
            .filter_map(|(i, p)| p.map(|p| (i, p)))
            .collect();
        {
            let State { meta, frees, .. } = &mut *st;
            let rs = ReadStore {
                tops: &self.tops,
                cache: &self.cache,
            };
            for (i, ((id, blk), _)) in items.iter().enumerate() {
                let key = record_key(*id, *blk);
                let old = match new_ptrs.get(&i) {
                    Some(bp) => meta.insert(&rs, &key, &bp.encode())?,
                    None => meta.remove(&rs, &key)?,
                };
                if let Some(old) = old {
                    frees.push(BlockPtr::decode(&old)?);
                }
            }
        }

        // 2. The intent log chain this txg makes obsolete, and the header of
        // the next one; then the pool state into the meta tree.
        self.log_sync(st, txg)?;
        if st.ms_dirty {
            let json =
                serde_json::to_vec(&st.ms).map_err(|e| PoolError::Internal(e.to_string()))?;
            let State { meta, .. } = &mut *st;
            meta.insert(
                &ReadStore {
                    tops: &self.tops,
                    cache: &self.cache,
                },
                K_STATE,
                &json,
            )?;
            st.ms_dirty = false;
        }

        // 3. Meta tree, bottom-up.
        let State {
            meta,
            space,
            rotor,
            frees,
            ..
        } = &mut *st;
        let mut tx = TxStore {
            alloc: Allocator {
                tops: &self.tops,
                space,
                rotor,
                keep_contiguous: &[],
            },
            cache: &self.cache,
            txg,
            checksum: alg,
            copies: meta_copies,
            freed: Vec::new(),
            missed: Vec::new(),
        };
        let meta_root = meta.commit(&mut tx)?;
        missed.append(&mut tx.missed);
        let mut all_frees = std::mem::take(frees);
        all_frees.append(&mut tx.freed);
        if !all_frees.is_empty() {
            st.last_free_txg = txg;
        }
        if !st.space_root.is_hole() {
            all_frees.push(st.space_root);
        }
        for bp in &all_frees {
            for d in bp.used_dvas() {
                let Some(m) = st.space.get_mut(d.vdev as usize) else {
                    continue;
                };
                let r = if bp.birth >= txg {
                    m.free_now(d.offset, d.asize as u64)
                } else {
                    m.free_deferred(d.offset, d.asize as u64, txg)
                };
                // A bad free means the accounting is wrong: stop rather than
                // risk handing out space that is still in use.
                r.map_err(|e| {
                    PoolError::Internal(format!(
                        "space accounting: {}: {e}",
                        pipeline::describe(bp)
                    ))
                })?;
            }
        }

        // 4. Space maps: allocate their block first, then encode (so the
        // encoding includes its own allocation), then write.
        let bound = 12
            + st.space
                .iter()
                .map(|m| 4 + m.encoded_len_bound(meta_copies + 1))
                .sum::<usize>();
        let bound = bound.next_multiple_of(512);
        let dvas = Allocator {
            tops: &self.tops,
            space: &mut st.space,
            rotor: &mut st.rotor,
            keep_contiguous: &[],
        }
        .alloc(bound as u64, meta_copies)?;
        let body = encode_space_root(&st.space, bound);
        let p = Prepared {
            checksum: tarn_block::checksum(alg, &body),
            lsize: body.len() as u32,
            compress: CompressAlg::Off,
            checksum_alg: alg,
            stored: body,
        };
        missed.extend(pipeline::write_copies(&self.tops, &dvas, &p.stored)?);
        let space_root = pipeline::make_ptr(&p, &dvas, txg, BlockType::SpaceMap, 0);

        // 5. Flush, uberblock everywhere, flush.
        for t in &self.tops {
            t.flush()?;
        }
        // Every leaf that missed a write is named in the uberblock too, for
        // the case where it gets the uberblock anyway (below).
        let mut missed_guids: Vec<u64> = missed
            .iter()
            .filter_map(|m| {
                self.tops
                    .get(m.vdev as usize)
                    .and_then(|t| t.leaves().into_iter().nth(m.child))
                    .map(|l| l.guid)
            })
            .collect();
        missed_guids.sort_unstable();
        missed_guids.dedup();
        let ub = Uberblock {
            txg,
            pool_guid: self.guid,
            timestamp: now_unix(),
            meta_root,
            space_root,
            missed_overflow: missed_guids.len() > crate::uberblock::MISSED_LISTED_MAX,
            missed: missed_guids,
        }
        .encode();
        let slot = (txg % tarn_vdev::uberblock_slots(self.ashift) as u64) as usize;
        // A leaf's newest uberblock says "I hold everything up to here": a
        // leaf that missed a write of this txg does not get this one, so
        // import can tell what it missed even if the dirty time log of this
        // txg never reaches disk.
        let mut ub_written = 0;
        for (ti, t) in self.tops.iter().enumerate() {
            let leaves = t.leaves();
            let missed_here = |ci: usize| {
                missed
                    .iter()
                    .any(|m| m.vdev as usize == ti && m.child == ci)
            };
            // Hold the uberblock back only while another leaf of this vdev
            // got everything; otherwise the dirty time log committed with
            // the next txg is what records the misses.
            let some_complete = leaves
                .iter()
                .enumerate()
                .any(|(ci, l)| matches!(l.state, LeafState::Online) && !missed_here(ci));
            for (ci, info) in leaves.into_iter().enumerate() {
                if !matches!(info.state, LeafState::Online) || (some_complete && missed_here(ci)) {
                    continue;
                }
                if let Some(leaf) = t.leaf(ci) {
                    if tarn_vdev::write_uberblock(leaf.as_ref(), self.ashift, slot, &ub).is_ok() {
                        ub_written += 1;
                    }
                }
            }
        }
        if ub_written == 0 {
            return Err(PoolError::Faulted(format!(
                "txg {txg}: no device accepted the uberblock"
            )));
        }
        for t in &self.tops {
            t.flush()?;
        }

        // 6. Committed.
        st.txg = txg;
        st.space_root = space_root;
        st.last_sync_unix = now_unix();
        self.release_frees(st);
        for m in missed {
            if let Some(info) = self
                .tops
                .get(m.vdev as usize)
                .and_then(|t| t.leaves().into_iter().nth(m.child))
            {
                let e = st.ms.dtl.entry(info.guid).or_insert((txg, txg));
                e.0 = e.0.min(txg);
                e.1 = e.1.max(txg);
                st.ms_dirty = true;
            }
        }
        st.meta.evict_clean();
        self.ext_committed(st);
        Ok(txg)
    }

    /// Returns deferred frees to the allocator once `DEFER_TXGS` newer txgs
    /// are durable and no reader holds a txg that still references them.
    pub(crate) fn release_frees(&self, st: &mut State) {
        // release_deferred(S) returns frees of txgs <= S - DEFER_TXGS; a hold
        // on txg H allows releasing frees of txgs <= H only.
        let mut upto = st.txg;
        if let Some(h) = self.holds.oldest() {
            upto = upto.min(h + DEFER_TXGS);
        }
        for m in &mut st.space {
            m.release_deferred(upto);
        }
        for l in &mut st.logs {
            l.space.release_deferred(upto);
        }
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
                let mut st = pool.lock();
                let deadline = Instant::now() + interval;
                loop {
                    if pool.stop.load(Ordering::Acquire) || st.closed {
                        return;
                    }
                    if st.sync_requested || st.dirty_bytes >= pool.opts.dirty_sync_bytes {
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
                let faulted = pool.fault.lock().map(|f| f.is_some()).unwrap_or(true);
                if !faulted && Self::has_changes(&st) {
                    if let Err(e) = pool.sync_locked(&mut st) {
                        pool.set_fault(format!("txg sync failed: {e}"));
                    }
                }
                pool.cv.notify_all();
                let resilver = pool.resilver_pending(&st);
                drop(st);
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
        let mut st = self.lock();
        st.closed = true;
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).clear();
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
        let mut st = self.lock();
        if st.closed {
            return Ok(());
        }
        let faulted = self.fault.lock().map(|f| f.is_some()).unwrap_or(true);
        let mut result = Ok(());
        if !faulted {
            if let Some(scan) = st.ms.scan.as_mut() {
                if scan.is_running() {
                    // Resume after the next import.
                    st.ms_dirty = true;
                }
            }
            if Self::has_changes(&st) {
                result = self.sync_locked(&mut st).map(|_| ());
            }
            if result.is_ok() {
                let state = if destroy {
                    PoolState::Destroyed
                } else {
                    PoolState::Exported
                };
                result = self.write_labels(&mut st, state);
            }
        }
        st.closed = true;
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).clear();
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

    /// Space that ordinary writes may still use: on each vdev, whole records
    /// above its metadata reserve (which is at least its slop; a record
    /// cannot straddle vdevs). The open txg's records hold their room as
    /// reservations, so it is already taken from the free space.
    pub(crate) fn writable_bytes(&self, st: &State, record_len: u64) -> u64 {
        let per = self.record_alloc_size(record_len).max(1);
        let mut writable = 0u64;
        for (v, m) in st.space.iter().enumerate() {
            let spare = m.free().saturating_sub(self.metadata_reserve(st, v));
            writable += spare / per * per;
        }
        writable
    }

    /// Contiguous room data must leave on vdev `v`: its slop (so deletes on
    /// a full pool can commit), at least `METADATA_RESERVE_BYTES`, and
    /// twice what the space-root block needs per metadata copy.
    pub(crate) fn metadata_reserve(&self, st: &State, v: usize) -> u64 {
        let maps: u64 = st.space.iter().map(|m| m.encoded_len_bound(4) as u64).sum();
        let asize = st.space.get(v).map_or(0, |m| m.asize());
        tarn_space::slop_bytes(asize)
            .max(METADATA_RESERVE_BYTES)
            .max(2 * maps * st.props.metadata_copies() as u64)
    }

    /// Largest allocation one copy of a `len`-byte record takes on any vdev.
    pub(crate) fn record_alloc_size(&self, len: u64) -> u64 {
        self.tops
            .iter()
            .map(|t| t.alloc_size(len))
            .max()
            .unwrap_or(len)
    }

    fn lookup_object(&self, st: &mut State, name: &str) -> Result<Option<ObjEntry>, PoolError> {
        let State { meta, .. } = st;
        let v = meta.get(
            &ReadStore {
                tops: &self.tops,
                cache: &self.cache,
            },
            &objdir_key(name),
        )?;
        match v {
            None => Ok(None),
            Some(v) => {
                let e: ObjEntry = serde_json::from_slice(&v).map_err(|e| {
                    PoolError::Corrupt(format!("directory entry of object '{name}': {e}"))
                })?;
                if !e.recordsize.is_power_of_two() || e.recordsize < 512 {
                    return Err(PoolError::Corrupt(format!(
                        "directory entry of object '{name}': record size {}",
                        e.recordsize
                    )));
                }
                Ok(Some(e))
            }
        }
    }

    fn store_object(&self, st: &mut State, name: &str, e: &ObjEntry) -> Result<(), PoolError> {
        let json = serde_json::to_vec(e).map_err(|e| PoolError::Internal(e.to_string()))?;
        let State { meta, .. } = st;
        meta.insert(
            &ReadStore {
                tops: &self.tops,
                cache: &self.cache,
            },
            &objdir_key(name),
            &json,
        )?;
        Ok(())
    }

    /// Reads one record's current bytes (dirty or on disk); `None` for a hole.
    fn load_record(
        &self,
        st: &mut State,
        obj: &str,
        id: u64,
        blk: u64,
        rs: u64,
    ) -> Result<Option<Vec<u8>>, PoolError> {
        if let Some(d) = st.dirty.get(&(id, blk)) {
            return Ok(Some(d.clone()));
        }
        let State { meta, .. } = st;
        let v = meta.get(
            &ReadStore {
                tops: &self.tops,
                cache: &self.cache,
            },
            &record_key(id, blk),
        )?;
        let Some(v) = v else { return Ok(None) };
        let bp = BlockPtr::decode(&v)?;
        match pipeline::read_block(&self.tops, &bp) {
            Ok(d) => Ok(Some(d)),
            Err(e) => {
                let what = format!("object {obj} at offset {}", blk * rs);
                st.ms.damaged.insert(what.clone());
                st.ms_dirty = true;
                Err(PoolError::Damaged(format!("{what}: {e}")))
            }
        }
    }

    /// Writes `data` at `offset` of raw object `name`, creating it. With
    /// `sync`, returns only after the txg holding the write has committed.
    pub fn object_write(
        &self,
        name: &str,
        offset: u64,
        data: &[u8],
        sync: bool,
    ) -> Result<ObjectInfo, PoolError> {
        check_object_name(name)?;
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|e| *e <= 1 << 50)
            .ok_or_else(|| {
                PoolError::Invalid(format!(
                    "write beyond the maximum object size at offset {offset}"
                ))
            })?;
        let st = self.lock();
        self.check_usable(&st)?;
        // Throttle once, before anything is looked up: the whole write then
        // happens under the lock, so the directory entry cannot go stale and
        // the write lands in one txg. One call may overshoot the dirty limit
        // by its own size, which its caller bounds.
        let mut st = self.throttle(st)?;
        let existing = self.lookup_object(&mut st, name)?;
        let is_new = existing.is_none();
        let mut entry = match existing {
            Some(e) => e,
            None => {
                let id = st.ms.next_object;
                st.ms.next_object += 1;
                st.ms_dirty = true;
                ObjEntry {
                    id,
                    size: 0,
                    recordsize: st.props.recordsize,
                    mtime_unix: now_unix(),
                }
            }
        };
        let rs = entry.recordsize as u64;
        let mut pos = offset;
        let mut src = data;
        let mut failure = None;
        while !src.is_empty() {
            let blk = pos / rs;
            let in_rec = (pos % rs) as usize;
            let n = (rs as usize - in_rec).min(src.len());
            let key = (entry.id, blk);
            if !st.dirty.contains_key(&key) {
                // The record's room is allocated now, so the sync that
                // writes it cannot run out of space.
                let copies = st.props.copies;
                let reservation = match self.reserve_data(&mut st, rs, copies) {
                    Ok(r) => r,
                    Err(_) => {
                        // What was already accepted stays; report the shortfall.
                        st.sync_requested = true;
                        self.cv.notify_all();
                        failure = Some(PoolError::NoSpace(format!(
                            "pool '{}' has no room for object {name} at offset {pos}",
                            self.name
                        )));
                        break;
                    }
                };
                let base = if in_rec == 0 && n as u64 == rs {
                    Vec::new()
                } else {
                    match self.load_record(&mut st, name, entry.id, blk, rs) {
                        Ok(b) => b.unwrap_or_default(),
                        Err(e) => {
                            self.release_data(&mut st, reservation);
                            failure = Some(e);
                            break;
                        }
                    }
                };
                st.dirty_bytes += rs;
                st.dirty.insert(key, base);
                st.dirty_res.insert(key, reservation);
            }
            let Some(buf) = st.dirty.get_mut(&key) else {
                return Err(PoolError::Internal("dirty record vanished".into()));
            };
            if buf.len() < in_rec + n {
                buf.resize(in_rec + n, 0);
            }
            buf[in_rec..in_rec + n].copy_from_slice(&src[..n]);
            pos += n as u64;
            src = &src[n..];
        }
        // Record what was accepted even when the write stopped part-way, so
        // no record is ever left without its directory entry.
        if failure.is_some() && is_new && pos == offset {
            // Nothing of a new object was accepted: it does not come to be.
            return Err(failure.unwrap_or_else(|| PoolError::Internal("lost error".into())));
        }
        entry.size = entry.size.max(if failure.is_some() { pos } else { end });
        entry.mtime_unix = now_unix();
        if let Err(e) = self.store_object(&mut st, name, &entry) {
            // Records without their directory entry must not commit.
            self.set_fault(format!(
                "object {name}: cannot store its directory entry: {e}"
            ));
            self.cv.notify_all();
            return Err(e);
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if st.dirty_bytes >= self.opts.dirty_sync_bytes {
            self.cv.notify_all();
        }
        let info = ObjectInfo {
            name: name.to_string(),
            size: entry.size,
            txg: st.txg + 1,
        };
        if sync {
            if let Err(e) = self.sync_locked(&mut st) {
                self.set_fault(format!("txg sync failed: {e}"));
                self.cv.notify_all();
                return Err(e);
            }
            self.cv.notify_all();
            return Ok(ObjectInfo {
                txg: st.txg,
                ..info
            });
        }
        Ok(info)
    }

    /// Reads up to `len` bytes at `offset` of raw object `name`.
    pub fn object_read(&self, name: &str, offset: u64, len: usize) -> Result<Vec<u8>, PoolError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        let entry = self.lookup_object(&mut st, name)?.ok_or_else(|| {
            PoolError::NotFound(format!("no object '{name}' in pool '{}'", self.name))
        })?;
        if offset >= entry.size {
            return Ok(Vec::new());
        }
        let len = (len as u64).min(entry.size - offset) as usize;
        let rs = entry.recordsize as u64;
        let mut out = vec![0u8; len];
        let mut done = 0usize;
        // Pointers are looked up under the lock, blocks read without it,
        // under a hold on the committed txg.
        let mut to_read: Vec<(usize, usize, usize, BlockPtr, u64)> = Vec::new();
        while done < len {
            let pos = offset + done as u64;
            let blk = pos / rs;
            let in_rec = (pos % rs) as usize;
            let n = (rs as usize - in_rec).min(len - done);
            if let Some(d) = st.dirty.get(&(entry.id, blk)) {
                let have = d.len().saturating_sub(in_rec).min(n);
                if have > 0 {
                    out[done..done + have].copy_from_slice(&d[in_rec..in_rec + have]);
                }
            } else {
                let State { meta, .. } = &mut *st;
                let v = meta.get(
                    &ReadStore {
                        tops: &self.tops,
                        cache: &self.cache,
                    },
                    &record_key(entry.id, blk),
                )?;
                if let Some(v) = v {
                    to_read.push((done, in_rec, n, BlockPtr::decode(&v)?, blk));
                }
            }
            done += n;
        }
        let hold: HoldGuard<'_> = self.holds.hold(st.txg);
        drop(st);
        let mut damaged = Vec::new();
        // Records are independent: read them on the worker threads.
        let blocks = parallel_map(&to_read, self.opts.sync_threads, |(_, _, _, bp, _)| {
            pipeline::read_block(&self.tops, bp)
        })?;
        for ((at, in_rec, n, _, blk), r) in to_read.into_iter().zip(blocks) {
            match r {
                Ok(d) => {
                    let have = d.len().saturating_sub(in_rec).min(n);
                    if have > 0 {
                        out[at..at + have].copy_from_slice(&d[in_rec..in_rec + have]);
                    }
                }
                Err(e) => damaged.push((format!("object {name} at offset {}", blk * rs), e)),
            }
        }
        drop(hold);
        if let Some((what, e)) = damaged.first() {
            let mut st = self.lock();
            for (w, _) in &damaged {
                st.ms.damaged.insert(w.clone());
            }
            st.ms_dirty = true;
            return Err(PoolError::Damaged(format!("{what}: {e}")));
        }
        Ok(out)
    }

    /// Size of a raw object.
    pub fn object_info(&self, name: &str) -> Result<ObjectInfo, PoolError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        let e = self.lookup_object(&mut st, name)?.ok_or_else(|| {
            PoolError::NotFound(format!("no object '{name}' in pool '{}'", self.name))
        })?;
        Ok(ObjectInfo {
            name: name.to_string(),
            size: e.size,
            txg: st.txg,
        })
    }

    /// Visits the meta-tree entries from `lo` (inclusive) up to `hi`, in key
    /// order, a page at a time so memory stays bounded; `f` returns false to
    /// stop early.
    pub(crate) fn for_each_entry(
        &self,
        st: &mut State,
        lo: &[u8],
        hi: Bound<&[u8]>,
        f: &mut EntryFn<'_>,
    ) -> Result<(), PoolError> {
        let rs = ReadStore {
            tops: &self.tops,
            cache: &self.cache,
        };
        let State { meta, .. } = st;
        let mut start = lo.to_vec();
        let mut incl = true;
        loop {
            let b = if incl {
                Bound::Included(&start[..])
            } else {
                Bound::Excluded(&start[..])
            };
            let page = meta.range(&rs, b, hi, 1024)?;
            let Some(last) = page.last().map(|(k, _)| k.clone()) else {
                return Ok(());
            };
            for (k, v) in &page {
                if !f(k, v)? {
                    return Ok(());
                }
            }
            start = last;
            incl = false;
        }
    }

    /// Every raw object, by name.
    pub fn object_list(&self) -> Result<Vec<ObjectInfo>, PoolError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        let txg = st.txg;
        let mut out = Vec::new();
        self.for_each_entry(
            &mut st,
            &[P_OBJDIR],
            Bound::Excluded(&[P_OBJDIR + 1][..]),
            &mut |k, v| {
                let e: ObjEntry = serde_json::from_slice(v)
                    .map_err(|e| PoolError::Corrupt(format!("object directory: {e}")))?;
                out.push(ObjectInfo {
                    name: String::from_utf8_lossy(&k[1..]).into_owned(),
                    size: e.size,
                    txg,
                });
                Ok(true)
            },
        )?;
        Ok(out)
    }

    /// Deletes a raw object; its blocks are freed when the txg commits.
    pub fn object_delete(&self, name: &str) -> Result<(), PoolError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        let e = self.lookup_object(&mut st, name)?.ok_or_else(|| {
            PoolError::NotFound(format!("no object '{name}' in pool '{}'", self.name))
        })?;
        let dropped: Vec<(u64, u64)> = st
            .dirty
            .range((e.id, 0)..=(e.id, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in dropped {
            st.dirty.remove(&k);
            st.dirty_bytes = st.dirty_bytes.saturating_sub(e.recordsize as u64);
            if let Some(r) = st.dirty_res.remove(&k) {
                self.release_data(&mut st, r);
            }
        }
        let rs = ReadStore {
            tops: &self.tops,
            cache: &self.cache,
        };
        let State { meta, frees, .. } = &mut *st;
        let lo = record_key(e.id, 0);
        let hi = record_key(e.id, u64::MAX);
        loop {
            let page = meta.range(
                &rs,
                Bound::Included(&lo[..]),
                Bound::Included(&hi[..]),
                4096,
            )?;
            if page.is_empty() {
                break;
            }
            for (k, v) in page {
                frees.push(BlockPtr::decode(&v)?);
                meta.remove(&rs, &k)?;
            }
        }
        meta.remove(&rs, &objdir_key(name))?;
        let prefix = format!("object {name} at offset ");
        let before = st.ms.damaged.len();
        st.ms.damaged.retain(|d| !d.starts_with(&prefix));
        if st.ms.damaged.len() != before {
            st.ms_dirty = true;
        }
        Ok(())
    }

    /// The committed block pointers of a raw object, by record index: a
    /// diagnostic view (like `zdb`) for drills and tests.
    pub fn object_blocks(&self, name: &str) -> Result<Vec<(u64, BlockPtr)>, PoolError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        let e = self.lookup_object(&mut st, name)?.ok_or_else(|| {
            PoolError::NotFound(format!("no object '{name}' in pool '{}'", self.name))
        })?;
        let hi = record_key(e.id, u64::MAX);
        let mut out = Vec::new();
        self.for_each_entry(
            &mut st,
            &record_key(e.id, 0),
            Bound::Included(&hi[..]),
            &mut |k, v| {
                let mut blk = [0u8; 8];
                blk.copy_from_slice(
                    k.get(9..17)
                        .ok_or_else(|| PoolError::Corrupt("short record key".into()))?,
                );
                out.push((u64::from_be_bytes(blk), BlockPtr::decode(v)?));
                Ok(true)
            },
        )?;
        Ok(out)
    }

    /// Pool-wide space: (size, allocated, free) in allocator bytes.
    pub fn space(&self) -> (u64, u64, u64) {
        let st = self.lock();
        let size = st.space.iter().map(|m| m.asize()).sum();
        let alloc = st.space.iter().map(|m| m.allocated()).sum();
        let free = st.space.iter().map(|m| m.free()).sum();
        (size, alloc, free)
    }

    /// Overall health.
    pub fn health(&self) -> Health {
        if self.fault.lock().map(|f| f.is_some()).unwrap_or(true) {
            return Health::Faulted;
        }
        let mut h = Health::Online;
        for t in &self.tops {
            match t.health() {
                TopHealth::Faulted => return Health::Faulted,
                TopHealth::Degraded => h = Health::Degraded,
                TopHealth::Online => {}
            }
        }
        h
    }

    /// One row of `list`.
    pub fn list_entry(&self) -> PoolListEntry {
        let (size, allocated, free) = self.space();
        PoolListEntry {
            name: self.name.clone(),
            size,
            allocated,
            free,
            health: self.health(),
            guid: format!("{:016x}", self.guid),
        }
    }

    /// Name of a top-level vdev as `status` shows it.
    pub(crate) fn top_name(&self, i: usize) -> String {
        match self.tops[i].kind() {
            VdevKind::Single => self.tops[i]
                .leaves()
                .first()
                .map(|l| l.path.display().to_string())
                .unwrap_or_default(),
            VdevKind::Mirror => format!("mirror-{i}"),
            VdevKind::Raidz { parity } => format!("raidz{parity}-{i}"),
        }
    }

    /// The vdev tree with health and counters.
    pub(crate) fn vdev_status(&self) -> Vec<VdevStatus> {
        let st = self.lock();
        let dtl = st.ms.dtl.clone();
        drop(st);
        self.tops
            .iter()
            .enumerate()
            .map(|(i, t)| top_status(&self.top_name(i), t, &dtl))
            .collect()
    }

    /// The separate log vdevs, as `status` shows them.
    pub(crate) fn log_status(&self) -> Vec<VdevStatus> {
        let st = self.lock();
        st.logs
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let name = match l.top.kind() {
                    VdevKind::Mirror => format!("mirror-log-{i}"),
                    _ => format!("log-{i}"),
                };
                top_status(&name, &l.top, &st.ms.dtl)
            })
            .collect()
    }

    /// Everything `status` shows.
    pub fn status(&self) -> PoolStatus {
        let health = self.health();
        let vdevs = self.vdev_status();
        let logs = self.log_status();
        let st = self.lock();
        let fault = self.fault.lock().map(|f| f.clone()).unwrap_or(None);
        let (message, action) = if let Some(f) = fault {
            (
                Some(format!("The pool stopped accepting changes: {f}")),
                Some("Fix or reattach the devices, then export and import the pool.".to_string()),
            )
        } else if health == Health::Degraded {
            (
                Some("One or more devices are unavailable or offline; the pool runs without full redundancy.".to_string()),
                Some("Bring the device back with `tarn pool online`, or replace it with `tarn pool replace`.".to_string()),
            )
        } else if !st.ms.damaged.is_empty() {
            (
                Some("Some data could not be repaired and is damaged.".to_string()),
                Some("Restore the listed objects from a backup, then run `tarn pool clear` and a scrub.".to_string()),
            )
        } else {
            (None, None)
        };
        PoolStatus {
            name: self.name.clone(),
            guid: format!("{:016x}", self.guid),
            health,
            message,
            action,
            txg: st.txg,
            scan: st.ms.scan.as_ref().map(|s| s.to_status()),
            vdevs,
            logs,
            damaged: st.ms.damaged.iter().cloned().collect(),
        }
    }
}

/// One top-level vdev (and its leaves) as `status` shows it.
fn top_status(name: &str, t: &TopVdev, dtl: &BTreeMap<u64, (u64, u64)>) -> VdevStatus {
    let mut children = Vec::new();
    let mut sum = Counters::default();
    for l in t.leaves() {
        let c = conv_counters(&l.counters);
        add_counters(&mut sum, &c);
        let health = match l.state {
            LeafState::Online => Health::Online,
            LeafState::Offline => Health::Offline,
            LeafState::Missing => Health::Unavail,
            LeafState::Faulted => Health::Faulted,
        };
        let note = if l.resilvering {
            Some("resilvering".to_string())
        } else if matches!(l.state, LeafState::Missing) {
            Some("cannot open".to_string())
        } else if dtl.contains_key(&l.guid) && matches!(l.state, LeafState::Online) {
            Some("missed writes; needs resilver".to_string())
        } else {
            None
        };
        children.push(VdevStatus {
            name: l.path.display().to_string(),
            health,
            counters: c,
            note,
            children: Vec::new(),
        });
    }
    let health = match t.health() {
        TopHealth::Online => Health::Online,
        TopHealth::Degraded => Health::Degraded,
        TopHealth::Faulted => Health::Faulted,
    };
    if matches!(t.kind(), VdevKind::Single) {
        if let Some(mut c) = children.pop() {
            if health == Health::Faulted {
                c.health = Health::Faulted;
            }
            return c;
        }
    } else {
        return VdevStatus {
            name: name.to_string(),
            health,
            counters: sum,
            note: None,
            children,
        };
    }
    VdevStatus {
        name: name.to_string(),
        health: Health::Faulted,
        counters: Counters::default(),
        note: Some("no devices".to_string()),
        children: Vec::new(),
    }
}

pub(crate) fn conv_counters(c: &tarn_vdev::Counters) -> Counters {
    Counters {
        read_errors: c.read_errors,
        write_errors: c.write_errors,
        cksum_errors: c.cksum_errors,
        read_ops: c.read_ops,
        write_ops: c.write_ops,
        read_bytes: c.read_bytes,
        write_bytes: c.write_bytes,
    }
}

pub(crate) fn add_counters(sum: &mut Counters, c: &Counters) {
    sum.read_errors += c.read_errors;
    sum.write_errors += c.write_errors;
    sum.cksum_errors += c.cksum_errors;
    sum.read_ops += c.read_ops;
    sum.write_ops += c.write_ops;
    sum.read_bytes += c.read_bytes;
    sum.write_bytes += c.write_bytes;
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
