//! The dataset layer's state inside the pool, and how it is shared.
//!
//! # Locking
//!
//! The pool calls the dataset layer from open context (transactions and
//! intent log commits, many threads at once), from the syncer, and from
//! exclusive operations (see `tarn_pool`'s `txg`). Its state is therefore
//! split, each part under its own lock, taken in this order:
//!
//! | lock | guards | held by |
//! |---|---|---|
//! | `LiveDs::commit` | one dataset's intent log commits | an `fsync` of that dataset, across its log I/O |
//! | `Dsl::lives` | the map of open datasets | briefly, to find or add one; never while locking a dataset |
//! | `LiveDs::st` ([`LiveState`]) | one dataset: its committed tree handle, the overlays of the txgs not committed yet, its pending log operations | a transaction of that dataset for its length; the syncer and the commit briefly |
//! | `Dsl::dir` ([`Dir`]) | records, names, properties, ids, accounting | briefly, by anyone; never while locking a dataset |
//! | `Dsl::sync_trees` | the trees the sync applies overlays to | the syncer and exclusive operations only |
//!
//! Two transactions of one dataset run one after the other; transactions of
//! different datasets, the sync, and intent log commits of other datasets
//! run in parallel. A transaction never waits for a sync: it reads the
//! overlay of the txg being synced and the committed tree beneath, which
//! the sync does not touch (it applies overlays to its own handle of the
//! tree, in `sync_trees`, and the committed handle is replaced only when
//! the txg has committed).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

use tarn_block::BlockPtr;
use tarn_pool::{Cx, Pool, SyncCx};
use tarn_tree::{Tree, TreeError};

use crate::overlay::Overlay;
use crate::record::{
    encode_ptr_hex, hex, new_guid, now_unix, scan_refs, DatasetInfo, DatasetKind, DsRec, Sums,
    DEFLATE_BLOCK, K_NEXT, P_DS, TAG_BLOCK,
};
use crate::txn::DatasetHandle;
use crate::zil::LogOp;
use crate::DsError;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The lock if it is free now (poisoned counts as free, as for `lock`).
fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// One dataset whose tree is open.
pub(crate) struct LiveDs {
    pub id: u64,
    /// Serializes this dataset's intent log commits (see `zil`).
    pub commit: Mutex<()>,
    pub st: Mutex<LiveState>,
    /// Allocated bytes the staged blocks of this dataset's uncommitted
    /// overlays hold, for quota checks of other datasets (see `Dir`).
    pub pending: Arc<AtomicU64>,
}

impl LiveDs {
    /// The dataset's state, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, LiveState> {
        lock(&self.st)
    }

    /// The state if no transaction holds it now.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, LiveState>> {
        try_lock(&self.st)
    }
}

/// A dataset's state between its committed tree and open context.
pub(crate) struct LiveState {
    /// A handle on the committed tree, for readers (it caches the nodes it
    /// reads). Replaced when a txg that changed the tree commits.
    pub tree: Tree,
    /// The txg `tree` was committed in: what a reader holds while it reads
    /// a block the tree names outside this lock.
    pub tree_txg: u64,
    /// The overlay of the txg being synced, if it changed this dataset.
    pub syncing: Option<(u64, Arc<Overlay>)>,
    /// The open txg's changes (see `overlay`).
    pub open: Overlay,
    /// Operations not yet in the intent log nor committed, each with its
    /// txg and a sequence number (see `zil`).
    pub log: Vec<(u64, u64, LogOp)>,
    /// The next operation's sequence number.
    pub log_seq: u64,
}

impl LiveState {
    /// What readers see: the uncommitted overlays, newest first, over the
    /// committed tree.
    pub(crate) fn view(&mut self) -> crate::overlay::View<'_> {
        let mut layers = vec![&self.open];
        if let Some((_, s)) = self.syncing.as_ref() {
            layers.push(&**s);
        }
        crate::overlay::View {
            layers,
            tree: &mut self.tree,
        }
    }

    /// Allocated bytes the staged blocks of the uncommitted overlays hold.
    pub(crate) fn staged_asize(&self) -> u64 {
        self.open.staged_asize() + self.syncing.as_ref().map_or(0, |(_, s)| s.staged_asize())
    }
}

/// The dataset directory: everything about datasets except their trees.
#[derive(Default)]
pub(crate) struct Dir {
    pub loaded: bool,
    pub pool_name: String,
    pub recs: BTreeMap<u64, DsRec>,
    /// The pool's properties: defaults where no dataset sets a value.
    pub pool_props: tarn_pool::PoolProps,
    pub names: BTreeMap<String, u64>,
    pub next_id: u64,
    pub dirty_recs: BTreeSet<u64>,
    pub deleted: BTreeSet<u64>,
    /// Records whose deadlist summary is stored apart, with its piece
    /// count (see `stored`).
    pub summary_pieces: HashMap<u64, u16>,
    /// Snapshots the next sync takes: (head, snapshot).
    pub pending_snaps: Vec<(u64, u64)>,
    pub next_dirty: bool,
    /// Allocated bytes of one 128 KiB block on this pool's vdevs.
    pub alloc_per_block: u64,
    /// Each open dataset's uncommitted staged bytes (see `LiveDs::pending`).
    pub pending: HashMap<u64, Arc<AtomicU64>>,
    /// Of those, what the txg being synced staged and its sync has already
    /// added to the records (`used` counts it from then on); taken off
    /// `pending` until the txg commits, so no block counts twice.
    pub applied: HashMap<u64, u64>,
    /// Datasets an exclusive operation removed or whose tree it replaced:
    /// their open state is forgotten when it ends.
    pub forgotten: Vec<u64>,
    /// The configuration records (users, shares), by meta key; kept here so
    /// readers need not reach the meta tree, written through by
    /// `config_put` and `config_delete`.
    pub config: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Key records by id (see `crypt`).
    pub keys: BTreeMap<u64, crate::crypt::KeyRec>,
    /// Loaded keys by key record id: in memory only.
    pub unlocked: HashMap<u64, Arc<tarn_block::KeySet>>,
    /// Key records the next sync writes, and those it deletes.
    pub dirty_keys: BTreeSet<u64>,
    pub deleted_keys: BTreeSet<u64>,
    /// Intent log records of locked datasets found at import, each with
    /// the txg it was taken in: the sync of that txg parks them (`zil`).
    pub parked_new: Vec<crate::zil::Parked>,
    /// Parked records replayed or dropped: the sync deletes their entries.
    pub parked_gone: Vec<Vec<u8>>,
    /// Space figures computed from the records, kept while nobody changes
    /// the directory (see [`DirGuard`]).
    pub memo: crate::accounting::SpaceMemo,
}

/// The directory, locked. It notes whether its holder changed the
/// directory (took it mutably), and then drops the space figures computed
/// from it ([`crate::accounting::SpaceMemo`]) and keeps new ones from being
/// kept until it is released: every change to the directory goes through
/// one of these, so no kept figure outlives the state it was computed
/// from.
pub(crate) struct DirGuard<'a> {
    dir: MutexGuard<'a, Dir>,
    changed: bool,
}

impl std::ops::Deref for DirGuard<'_> {
    type Target = Dir;

    fn deref(&self) -> &Dir {
        &self.dir
    }
}

impl std::ops::DerefMut for DirGuard<'_> {
    fn deref_mut(&mut self) -> &mut Dir {
        if !self.changed {
            self.changed = true;
            self.dir.memo.suspend();
        }
        &mut self.dir
    }
}

impl Drop for DirGuard<'_> {
    fn drop(&mut self) {
        if self.changed {
            self.dir.memo.resume();
        }
    }
}

/// The dataset layer's state inside the pool (see the module docs).
#[derive(Default)]
pub(crate) struct Dsl {
    dir: Mutex<Dir>,
    pub lives: Mutex<HashMap<u64, Arc<LiveDs>>>,
    pub sync_trees: Mutex<HashMap<u64, Tree>>,
}

impl Dsl {
    /// The directory, locked.
    pub(crate) fn dir(&self) -> DirGuard<'_> {
        DirGuard {
            dir: lock(&self.dir),
            changed: false,
        }
    }

    /// The dataset directory if no one holds it (see
    /// [`crate::DatasetHandle::try_block_refs`]).
    pub(crate) fn try_dir(&self) -> Option<DirGuard<'_>> {
        Some(DirGuard {
            dir: try_lock(&self.dir)?,
            changed: false,
        })
    }

    /// The open dataset `id` if it is open and its table is free; never
    /// opens a tree (that reads from the devices).
    pub(crate) fn try_live(&self, id: u64) -> Option<Arc<LiveDs>> {
        try_lock(&self.lives)?.get(&id).cloned()
    }

    /// The open dataset `id`, opening its tree on first use.
    pub(crate) fn live(&self, id: u64) -> Result<Arc<LiveDs>, DsError> {
        let mut lives = lock(&self.lives);
        if let Some(l) = lives.get(&id) {
            return Ok(l.clone());
        }
        let mut dir = self.dir();
        let rec = dir.rec(id)?;
        let root = rec.root_ptr()?;
        // A committed txg that holds this root: the root's own birth.
        let tree_txg = root.birth;
        let l = Arc::new(LiveDs {
            id,
            commit: Mutex::new(()),
            st: Mutex::new(LiveState {
                tree: Tree::open(root),
                tree_txg,
                syncing: None,
                open: Overlay::default(),
                log: Vec::new(),
                log_seq: 0,
            }),
            pending: Arc::new(AtomicU64::new(0)),
        });
        dir.pending.insert(id, l.pending.clone());
        lives.insert(id, l.clone());
        Ok(l)
    }

    /// Every open dataset.
    pub(crate) fn all_lives(&self) -> Vec<Arc<LiveDs>> {
        lock(&self.lives).values().cloned().collect()
    }

    /// Forgets dataset `id`'s open state (exclusive operations that replace
    /// or remove its tree): the next user opens it afresh from its record.
    pub(crate) fn forget(&self, id: u64) {
        lock(&self.lives).remove(&id);
        lock(&self.sync_trees).remove(&id);
        self.dir().pending.remove(&id);
    }
}

impl Dir {
    pub(crate) fn alloc_id(&mut self) -> u64 {
        let id = self.next_id.max(1);
        self.next_id = id + 1;
        self.next_dirty = true;
        id
    }

    pub(crate) fn rec(&self, id: u64) -> Result<&DsRec, DsError> {
        self.recs
            .get(&id)
            .ok_or_else(|| DsError::NotFound(format!("dataset #{id} no longer exists")))
    }

    pub(crate) fn id_of(&self, name: &str) -> Result<u64, DsError> {
        self.names
            .get(name)
            .copied()
            .ok_or_else(|| DsError::NotFound(format!("dataset '{name}' does not exist")))
    }

    /// Reads every record from the meta tree.
    pub(crate) fn load(&mut self, cx: &mut SyncCx<'_>, pool_name: &str) -> Result<(), DsError> {
        self.pool_props = cx.props();
        self.pool_name = pool_name.to_string();
        self.alloc_per_block = cx.alloc_cost(DEFLATE_BLOCK, 1);
        if let Some(v) = cx.meta_get(K_NEXT)? {
            let b: [u8; 8] = v
                .as_slice()
                .try_into()
                .map_err(|_| DsError::Corrupt("next dataset id".into()))?;
            self.next_id = u64::from_le_bytes(b);
        }
        let lo = vec![P_DS];
        let hi = vec![P_DS + 1];
        let mut start = Bound::Included(lo);
        loop {
            let page =
                cx.meta_range(start.as_ref().map(Vec::as_slice), Bound::Excluded(&hi), 256)?;
            let Some(last) = page.last().map(|(k, _)| k.clone()) else {
                break;
            };
            for (k, v) in page {
                let rec: DsRec = serde_json::from_slice(&v)
                    .map_err(|e| DsError::Corrupt(format!("dataset record {}: {e}", hex(&k))))?;
                rec.root_ptr()?;
                self.next_id = self.next_id.max(rec.id + 1).max(rec.deadlist + 1);
                self.names.insert(rec.name.clone(), rec.id);
                self.recs.insert(rec.id, rec);
            }
            start = Bound::Excluded(last);
        }
        self.summary_pieces = crate::stored::load_summaries(cx, &mut self.recs)?;
        let lo = vec![crate::config::P_CONFIG];
        let hi = vec![crate::config::P_CONFIG + 1];
        let mut start = Bound::Included(lo);
        loop {
            let page =
                cx.meta_range(start.as_ref().map(Vec::as_slice), Bound::Excluded(&hi), 256)?;
            let Some(last) = page.last().map(|(k, _)| k.clone()) else {
                break;
            };
            self.config.extend(page);
            start = Bound::Excluded(last);
        }
        crate::crypt::load_records(self, cx)?;
        if self.recs.is_empty() {
            let root = self.new_fs(pool_name, None, cx.txg());
            self.recs.insert(root.id, root);
        }
        // A pool imported under a new name renames its datasets with it.
        let old_root = self
            .recs
            .values()
            .find(|r| r.parent.is_none() && !r.is_snapshot())
            .map(|r| r.name.clone());
        if let Some(old) = old_root.filter(|o| o != pool_name) {
            self.names.clear();
            for r in self.recs.values_mut() {
                if let Some(rest) = r.name.strip_prefix(&old) {
                    if rest.is_empty() || rest.starts_with('/') || rest.starts_with('@') {
                        r.name = format!("{pool_name}{rest}");
                        self.dirty_recs.insert(r.id);
                    }
                }
                self.names.insert(r.name.clone(), r.id);
            }
        }
        self.loaded = true;
        Ok(())
    }

    pub(crate) fn new_fs(&mut self, name: &str, parent: Option<u64>, txg: u64) -> DsRec {
        let id = self.alloc_id();
        let deadlist = self.alloc_id();
        self.names.insert(name.to_string(), id);
        self.dirty_recs.insert(id);
        DsRec {
            id,
            guid: new_guid(id),
            name: name.to_string(),
            kind: DatasetKind::Filesystem,
            parent,
            head: None,
            root: encode_ptr_hex(&BlockPtr::default()),
            created_txg: txg,
            created_unix: now_unix(),
            prev_snap: None,
            prev_snap_txg: 0,
            origin: None,
            clones: Vec::new(),
            props: BTreeMap::new(),
            referenced: Sums::default(),
            unique: Sums::default(),
            deadlist,
            dead: BTreeMap::new(),
            volume: None,
            key: None,
            recv: None,
            holds: Default::default(),
        }
    }
}

/// Runs `f` in open context on the pool's dataset layer (see the module
/// docs: `f` takes the locks it needs).
pub(crate) fn with_dsl<R>(
    pool: &Pool,
    write: bool,
    f: impl FnOnce(&Dsl, &mut Cx<'_>) -> Result<R, DsError>,
) -> Result<R, DsError> {
    pool.with_ext::<Dsl, Result<R, DsError>>(write, |dsl, cx| {
        if !dsl.dir().loaded {
            return Ok(Err(DsError::Invalid("datasets are not loaded".into())));
        }
        Ok(f(dsl, cx))
    })?
}

/// Runs `f` as an exclusive operation on the dataset layer: everything
/// pending is committed first and `f`'s changes before this returns.
pub(crate) fn with_excl<R>(
    pool: &Pool,
    f: impl FnOnce(&Dsl, &mut SyncCx<'_>) -> Result<R, DsError>,
) -> Result<R, DsError> {
    pool.with_ext_exclusive::<Dsl, Result<R, DsError>>(|dsl, cx| {
        if !dsl.dir().loaded {
            return Ok(Err(DsError::Invalid("datasets are not loaded".into())));
        }
        Ok(f(dsl, cx))
    })?
}

/// Runs `f` as an exclusive operation on the directory (see `with_excl`);
/// datasets it removes or rolls back are forgotten afterwards.
pub(crate) fn with_dir_excl<R>(
    pool: &Pool,
    f: impl FnOnce(&mut Dir, &mut SyncCx<'_>) -> Result<R, DsError>,
) -> Result<R, DsError> {
    with_excl(pool, |dsl, cx| {
        let (r, gone) = {
            let mut dir = dsl.dir();
            let r = f(&mut dir, cx);
            (r, std::mem::take(&mut dir.forgotten))
        };
        for id in gone {
            dsl.forget(id);
        }
        r
    })
}

/// Runs `f` on the directory in open context (reading).
pub(crate) fn with_dir<R>(
    pool: &Pool,
    f: impl FnOnce(&Dir, &mut Cx<'_>) -> Result<R, DsError>,
) -> Result<R, DsError> {
    with_dsl(pool, false, |dsl, cx| f(&dsl.dir(), cx))
}

/// Installs the dataset layer in an imported pool (once) and loads its
/// records; a pool without datasets gets its root dataset.
pub fn attach(pool: &Arc<Pool>) -> Result<(), DsError> {
    if pool.has_extension() {
        return Ok(());
    }
    pool.set_extension(Arc::new(Dsl::default()), scan_refs);
    let name = pool.name().to_string();
    pool.with_ext_exclusive::<Dsl, Result<(), DsError>>(|dsl, cx| Ok(dsl.dir().load(cx, &name)))??;
    // Synchronous writes the last txg did not commit.
    crate::zil::replay(pool)?;
    Ok(())
}

/// A handle to run transactions on a dataset or snapshot.
pub fn open(pool: &Arc<Pool>, name: &str) -> Result<DatasetHandle, DsError> {
    with_dsl(pool, false, |dsl, _| {
        let dir = dsl.dir();
        let id = dir.id_of(name)?;
        let r = dir.rec(id)?;
        Ok(DatasetHandle::new(
            pool.clone(),
            id,
            r.guid,
            r.name.clone(),
            r.is_snapshot(),
        ))
    })
}

/// Every dataset (and snapshot, with `snapshots`), sorted by name.
pub fn list(pool: &Pool, snapshots: bool) -> Result<Vec<DatasetInfo>, DsError> {
    with_dsl(pool, false, |dsl, cx| {
        let dir = dsl.dir();
        let mut out: Vec<DatasetInfo> = dir
            .names
            .values()
            .filter_map(|id| dir.info(cx, *id))
            .filter(|i| snapshots || i.kind != DatasetKind::Snapshot)
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    })
}

/// Every block a dataset's committed tree reaches (its nodes and the data
/// blocks its entries name), for checks and tests. Commits pending work
/// first.
pub fn blocks(pool: &Pool, name: &str) -> Result<Vec<BlockPtr>, DsError> {
    with_excl(pool, |dsl, cx| {
        let root = {
            let dir = dsl.dir();
            let id = dir.id_of(name)?;
            dir.rec(id)?.root_ptr()?
        };
        let out = std::cell::RefCell::new(Vec::new());
        let store = cx.store();
        tarn_tree::walk(
            &store,
            &root,
            0,
            &mut |bp| {
                out.borrow_mut().push(*bp);
                Ok(())
            },
            &mut |_, v| {
                if v.first() == Some(&TAG_BLOCK) {
                    let bp =
                        BlockPtr::decode(&v[1..]).map_err(|e| TreeError::Store(Box::new(e)))?;
                    out.borrow_mut().push(bp);
                }
                Ok(())
            },
        )?;
        Ok(out.into_inner())
    })
}

/// Converts allocated bytes into the user-facing bytes `list` reports
/// (raidz parity and padding taken out), for tools and tests.
pub fn deflated(pool: &Pool, raw: u64) -> Result<u64, DsError> {
    with_dsl(pool, false, |dsl, _| Ok(dsl.dir().deflate(raw)))
}

/// Names and ids of a filesystem's snapshots, oldest first.
pub(crate) fn snapshot_ids(dir: &Dir, head: u64) -> Vec<(String, u64)> {
    dir.snapshots_of(head)
        .into_iter()
        .filter(|s| !dir.pending_snaps.iter().any(|(_, p)| p == s))
        .filter_map(|s| dir.recs.get(&s).map(|r| (r.name.clone(), s)))
        .collect()
}

pub(crate) fn rec_root(dir: &Dir, id: u64) -> Result<BlockPtr, DsError> {
    dir.rec(id)?.root_ptr()
}

pub(crate) fn rec_name(dir: &Dir, id: u64) -> Result<String, DsError> {
    Ok(dir.rec(id)?.name.clone())
}

pub(crate) fn rec_guid(dir: &Dir, id: u64) -> Result<u64, DsError> {
    Ok(dir.rec(id)?.guid)
}
