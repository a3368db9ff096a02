//! The dataset directory: the dataset layer's state inside the pool
//! (`Dsl`), the in-memory state of open datasets (`Live`), attaching to a
//! pool, and looking datasets up. See the crate documentation for the theory.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use tarn_block::BlockPtr;
use tarn_pool::{Cx, Pool};
use tarn_tree::{Tree, TreeError};

use crate::overlay::Overlay;
use crate::record::{
    encode_ptr_hex, hex, new_guid, now_unix, scan_refs, DatasetInfo, DatasetKind, DsRec, Sums,
    DEFLATE_BLOCK, K_NEXT, P_DS, TAG_BLOCK,
};
use crate::txn::DatasetHandle;
use crate::DsError;

/// In-memory state of a dataset whose tree is open.
pub(crate) struct Live {
    /// The committed tree. Open context only reads it (through `open`);
    /// the sync applies `open` to it and commits.
    pub tree: Tree,
    /// The open txg's changes (see `overlay`).
    pub open: Overlay,
    /// Operations of the open txg not yet in the intent log (see `zil`).
    pub log: Vec<crate::zil::LogOp>,
}

/// The dataset layer's state inside the pool.
#[derive(Default)]
pub(crate) struct Dsl {
    pub loaded: bool,
    pub pool_name: String,
    pub recs: BTreeMap<u64, DsRec>,
    /// The pool's properties: defaults where no dataset sets a value.
    pub pool_props: tarn_pool::PoolProps,
    pub names: BTreeMap<String, u64>,
    pub next_id: u64,
    pub live: HashMap<u64, Live>,
    pub dirty_recs: BTreeSet<u64>,
    pub deleted: BTreeSet<u64>,
    /// Snapshots created in the open txg: (head, snapshot).
    pub pending_snaps: Vec<(u64, u64)>,
    pub next_dirty: bool,
    /// Allocated bytes of one 128 KiB block on this pool's vdevs.
    pub alloc_per_block: u64,
    /// Datasets whose tree was replaced or created in the open txg: their
    /// operations cannot be redone from the committed txg, so synchronous
    /// requests commit the txg instead (see `zil`).
    pub unlogged: BTreeSet<u64>,
}

impl Dsl {
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
    pub(crate) fn load(&mut self, cx: &mut Cx<'_, '_>, pool_name: &str) -> Result<(), DsError> {
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
        self.unlogged.insert(id);
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
        }
    }

    /// The live state of a dataset, opening its tree on first use.
    pub(crate) fn live(&mut self, id: u64) -> Result<&mut Live, DsError> {
        if !self.live.contains_key(&id) {
            let root = self.rec(id)?.root_ptr()?;
            self.live.insert(
                id,
                Live {
                    tree: Tree::open(root),
                    open: Overlay::default(),
                    log: Vec::new(),
                },
            );
        }
        self.live
            .get_mut(&id)
            .ok_or_else(|| DsError::NotFound(format!("dataset #{id}")))
    }
}

/// Runs `f` on the pool's dataset layer.
pub(crate) fn with<R>(
    pool: &Pool,
    write: bool,
    synced: bool,
    f: impl FnOnce(&mut Dsl, &mut Cx<'_, '_>) -> Result<R, DsError>,
) -> Result<R, DsError> {
    pool.with_ext::<Dsl, Result<R, DsError>>(write, synced, |dsl, cx| {
        if !dsl.loaded {
            return Ok(Err(DsError::Invalid("datasets are not loaded".into())));
        }
        Ok(f(dsl, cx))
    })?
}

pub(crate) fn with_dsl<R>(
    pool: &Pool,
    write: bool,
    f: impl FnOnce(&mut Dsl, &mut Cx<'_, '_>) -> Result<R, DsError>,
) -> Result<R, DsError> {
    with(pool, write, false, f)
}

/// Installs the dataset layer in an imported pool (once) and loads its
/// records; a pool without datasets gets its root dataset.
pub fn attach(pool: &Arc<Pool>) -> Result<(), DsError> {
    if pool.has_extension() {
        return Ok(());
    }
    pool.set_extension(Box::<Dsl>::default(), scan_refs);
    let name = pool.name().to_string();
    pool.with_ext::<Dsl, Result<(), DsError>>(false, false, |dsl, cx| Ok(dsl.load(cx, &name)))??;
    // Synchronous writes the last txg did not commit.
    crate::zil::replay(pool)?;
    Ok(())
}

/// A handle to run transactions on a dataset or snapshot.
pub fn open(pool: &Arc<Pool>, name: &str) -> Result<DatasetHandle, DsError> {
    let pending = with(pool, false, false, |dsl, _| {
        let id = dsl.id_of(name)?;
        Ok(dsl.pending_snaps.iter().any(|(_, s)| *s == id))
    })?;
    if pending {
        pool.sync()?;
    }
    with(pool, false, false, |dsl, _| {
        let id = dsl.id_of(name)?;
        let r = dsl.rec(id)?;
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
    with(pool, false, false, |dsl, cx| {
        let mut out: Vec<DatasetInfo> = dsl
            .names
            .values()
            .filter_map(|id| dsl.info(cx, *id))
            .filter(|i| snapshots || i.kind == DatasetKind::Filesystem)
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    })
}

/// Every block a dataset's committed tree reaches (its nodes and the data
/// blocks its entries name), for checks and tests. Commits pending work
/// first.
pub fn blocks(pool: &Pool, name: &str) -> Result<Vec<BlockPtr>, DsError> {
    with(pool, false, true, |dsl, cx| {
        let id = dsl.id_of(name)?;
        let root = dsl.rec(id)?.root_ptr()?;
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
    with(pool, false, false, |dsl, _| Ok(dsl.deflate(raw)))
}

/// Names and ids of a filesystem's snapshots, oldest first.
pub(crate) fn snapshot_ids(dsl: &Dsl, head: u64) -> Vec<(String, u64)> {
    dsl.snapshots_of(head)
        .into_iter()
        .filter(|s| !dsl.pending_snaps.iter().any(|(_, p)| p == s))
        .filter_map(|s| dsl.recs.get(&s).map(|r| (r.name.clone(), s)))
        .collect()
}

pub(crate) fn rec_root(dsl: &Dsl, id: u64) -> Result<BlockPtr, DsError> {
    dsl.rec(id)?.root_ptr()
}

pub(crate) fn rec_name(dsl: &Dsl, id: u64) -> Result<String, DsError> {
    Ok(dsl.rec(id)?.name.clone())
}

pub(crate) fn rec_guid(dsl: &Dsl, id: u64) -> Result<u64, DsError> {
    Ok(dsl.rec(id)?.guid)
}
