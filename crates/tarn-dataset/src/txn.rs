//! Transactions on one dataset: the open-context API the POSIX layer uses.
//!
//! A [`Txn`] journals every change it makes to the dataset's tree and
//! staged blocks. When the closure given to [`DatasetHandle::txn`] fails,
//! the journal is replayed backwards, the space charge returned and the
//! queued kills dropped, so a failed operation leaves no trace in the open
//! txg. Reads of data blocks happen under the pool lock (a known limit).

use std::ops::Bound;
use std::sync::Arc;

use tarn_block::BlockPtr;
use tarn_pool::{Cx, Pool};

use crate::dsl::{with_dsl, Dsl, StagedBlock};
use crate::record::{TAG_BLOCK, TAG_PLAIN, TAG_STAGED};
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
    /// Key and its previous raw tree value.
    Tree(Vec<u8>, Option<Vec<u8>>),
    /// Key and its previous staged block.
    Staged(Vec<u8>, Option<StagedBlock>),
}

/// One dataset inside one transaction (see the module docs).
pub struct Txn<'a, 'p, 's> {
    dsl: &'a mut Dsl,
    cx: &'a mut Cx<'p, 's>,
    id: u64,
    readonly: bool,
    undo: Vec<Undo>,
    kills: Vec<BlockPtr>,
    /// Dirty bytes charged to the write throttle.
    charged_dirty: u64,
    /// Room allocated by this transaction: given back if it fails.
    reserved: Vec<Reservation>,
    /// Staged blocks this transaction replaced or removed: their room is
    /// given back if it succeeds.
    released: Vec<StagedBlock>,
    /// The operations that succeeded, for the intent log.
    ops: Vec<LogOp>,
    /// Redoing the intent log: skip the checks the operations passed when
    /// they first ran (quota, read-only), and log nothing.
    replay: bool,
}

fn decode(raw: &[u8], what: &[u8]) -> Result<Value, DsError> {
    match raw.split_first() {
        Some((&TAG_PLAIN, rest)) => Ok(Value::Plain(rest.to_vec())),
        Some((&TAG_BLOCK, rest)) => {
            let bp = BlockPtr::decode(rest)
                .map_err(|e| DsError::Corrupt(format!("block pointer at key {what:02x?}: {e}")))?;
            Ok(Value::Block { len: bp.lsize })
        }
        Some((&TAG_STAGED, rest)) => {
            let len = rest
                .get(..4)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map(u32::from_le_bytes)
                .unwrap_or(0);
            Ok(Value::Block { len })
        }
        _ => Err(DsError::Corrupt(format!("value tag at key {what:02x?}"))),
    }
}

impl Txn<'_, '_, '_> {
    fn ro_check(&self) -> Result<(), DsError> {
        if self.readonly && !self.replay {
            let name = crate::dsl::rec_name(self.dsl, self.id).unwrap_or_default();
            return Err(DsError::ReadOnly(format!("dataset '{name}' is read-only")));
        }
        Ok(())
    }

    /// The dataset's resolved property value.
    pub fn prop(&self, name: &str) -> String {
        self.dsl.prop(self.id, name).0
    }

    /// Stable id of the dataset.
    pub fn guid(&self) -> u64 {
        crate::dsl::rec_guid(self.dsl, self.id).unwrap_or(0)
    }

    /// True when changes are refused (snapshot, `readonly=on`).
    pub fn is_readonly(&self) -> bool {
        self.readonly
    }

    /// Bytes the dataset may still write, and its used bytes (as `list`
    /// reports them).
    pub fn space(&self) -> (u64, u64) {
        (
            self.dsl.available(self.cx, self.id),
            self.dsl.deflate(self.dsl.used(self.id).asize),
        )
    }

    fn raw_get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, DsError> {
        let store = self.cx.store();
        let live = self.dsl.live(self.id)?;
        Ok(live.tree.get(&store, key)?)
    }

    /// Replaces the raw value under `key`, journaling the old one and
    /// queueing the kill of a block it referenced.
    fn raw_set(&mut self, key: &[u8], new: Option<Vec<u8>>) -> Result<Option<Vec<u8>>, DsError> {
        let store = self.cx.store();
        let live = self.dsl.live(self.id)?;
        let old = match &new {
            Some(v) => live.tree.insert(&store, key, v)?,
            None => live.tree.remove(&store, key)?,
        };
        self.undo.push(Undo::Tree(key.to_vec(), old.clone()));
        match old.as_deref().and_then(|o| o.split_first()) {
            Some((&TAG_BLOCK, rest)) => {
                let bp = BlockPtr::decode(rest)?;
                self.kills.push(bp);
            }
            Some((&TAG_STAGED, _)) => {
                let prev = live.unstage(key);
                if let Some(p) = &prev {
                    self.released.push(p.clone());
                }
                self.undo.push(Undo::Staged(key.to_vec(), prev));
            }
            _ => {}
        }
        Ok(old)
    }

    /// The value under `key`.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Value>, DsError> {
        match self.raw_get(key)? {
            Some(raw) => Ok(Some(decode(&raw, key)?)),
            None => Ok(None),
        }
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
        let mut v = Vec::with_capacity(value.len() + 1);
        v.push(TAG_PLAIN);
        v.extend_from_slice(value);
        self.raw_set(key, Some(v))?;
        self.logged(|| LogOp::Put(key.to_vec(), value.to_vec()));
        Ok(())
    }

    /// Notes a successful operation for the intent log.
    fn logged(&mut self, op: impl FnOnce() -> LogOp) {
        if !self.replay {
            self.ops.push(op());
        }
    }

    /// Removes `key` (freeing its block); false if it was absent.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool, DsError> {
        self.ro_check()?;
        if self.raw_get(key)?.is_none() {
            return Ok(false);
        }
        let had = self.raw_set(key, None)?.is_some();
        self.logged(|| LogOp::Delete(key.to_vec()));
        Ok(had)
    }

    /// Up to `limit` entries inside `start..end`.
    pub fn range(
        &mut self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Value)>, DsError> {
        let store = self.cx.store();
        let live = self.dsl.live(self.id)?;
        let page = live.tree.range(&store, start, end, limit)?;
        page.into_iter()
            .map(|(k, v)| {
                let val = decode(&v, &k)?;
                Ok((k, val))
            })
            .collect()
    }

    /// Removes every key inside `start..end`, freeing their blocks.
    pub fn delete_range(&mut self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<u64, DsError> {
        self.ro_check()?;
        let mut n = 0u64;
        loop {
            let page = self.range(start, end, 256)?;
            if page.is_empty() {
                if n > 0 {
                    let own = |b: Bound<&[u8]>| b.map(<[u8]>::to_vec);
                    self.logged(|| LogOp::DeleteRange(own(start), own(end)));
                }
                return Ok(n);
            }
            for (k, _) in page {
                self.raw_set(&k, None)?;
                n += 1;
            }
        }
    }

    /// Stages `data` as a data block under `key` for the next sync. All
    /// zeros deletes the key instead (a hole takes no space).
    pub fn write_block(&mut self, key: &[u8], data: Vec<u8>) -> Result<(), DsError> {
        self.ro_check()?;
        if data.len() > MAX_BLOCK {
            return Err(DsError::Invalid(format!(
                "block of {} bytes exceeds {MAX_BLOCK}",
                data.len()
            )));
        }
        if data.iter().all(|&b| b == 0) {
            if self.raw_get(key)?.is_some() {
                self.raw_set(key, None)?;
                self.logged(|| LogOp::Delete(key.to_vec()));
            }
            return Ok(());
        }
        let len = data.len() as u64;
        // Quotas and reservations first, then the room itself: allocated
        // now, so the sync that writes the block cannot run out of space.
        let copies = self.dsl.block_opts(self.id).copies;
        let cost = self.cx.alloc_cost(len, copies);
        if !self.replay {
            self.dsl.check_room(self.cx, self.id, cost)?;
        }
        let res = self.cx.reserve_block(len, copies).map_err(|e| match e {
            tarn_pool::PoolError::NoSpace(m) => DsError::NoSpace(m),
            other => DsError::Pool(other),
        })?;
        self.reserved.push(res.clone());
        self.cx.charge(len);
        self.charged_dirty += len;
        let data = Arc::new(data);
        self.stage_block(key, data.clone(), res, None)?;
        self.logged(|| LogOp::Block(key.to_vec(), data));
        Ok(())
    }

    /// Puts a staged block (and its placeholder) under `key`.
    fn stage_block(
        &mut self,
        key: &[u8],
        data: Arc<Vec<u8>>,
        res: Reservation,
        written: Option<BlockPtr>,
    ) -> Result<(), DsError> {
        let mut v = vec![TAG_STAGED];
        v.extend_from_slice(&(data.len() as u32).to_le_bytes());
        self.raw_set(key, Some(v))?;
        let live = self.dsl.live(self.id)?;
        let prev = live.stage(key.to_vec(), StagedBlock { data, res, written });
        self.undo.push(Undo::Staged(key.to_vec(), prev));
        Ok(())
    }

    /// Redoes one operation of the intent log (see `zil`).
    pub(crate) fn redo(&mut self, op: &LogOp) -> Result<(), DsError> {
        match op {
            LogOp::Put(k, v) => self.put(k, v),
            LogOp::Delete(k) => self.delete(k).map(|_| ()),
            LogOp::DeleteRange(a, b) => self
                .delete_range(a.as_ref().map(Vec::as_slice), b.as_ref().map(Vec::as_slice))
                .map(|_| ()),
            LogOp::Block(k, d) => self.write_block(k, d.as_ref().clone()),
            LogOp::BlockRef(k, bp) => {
                // Written before the crash into room import claimed; read
                // back through its checksum before anything refers to it,
                // and made whole (a device may have missed the write).
                let data = self.cx.read_block_repairing(bp).map_err(|e| {
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
                self.stage_block(k, Arc::new(data), Reservation::of_block(bp), Some(*bp))
            }
        }
    }

    /// The bytes of the data block under `key`.
    pub fn read_block(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, DsError> {
        let Some(raw) = self.raw_get(key)? else {
            return Ok(None);
        };
        match raw.split_first() {
            Some((&TAG_STAGED, _)) => {
                let live = self.dsl.live(self.id)?;
                Ok(Some(
                    live.staged
                        .get(key)
                        .map(|b| b.data.as_ref().clone())
                        .ok_or_else(|| {
                            DsError::Corrupt(format!("staged block at key {key:02x?} is missing"))
                        })?,
                ))
            }
            Some((&TAG_BLOCK, rest)) => {
                let bp = BlockPtr::decode(rest)?;
                match self.cx.read_block(&bp) {
                    Ok(d) => Ok(Some(d)),
                    Err(e) => {
                        let name = crate::dsl::rec_name(self.dsl, self.id).unwrap_or_default();
                        let what = format!("dataset {name}: block at key {key:02x?}");
                        self.cx.report_damage(what.clone());
                        Err(DsError::Damaged(format!("{what}: {e}")))
                    }
                }
            }
            _ => Err(DsError::Invalid(format!(
                "key {key:02x?} holds a plain value, not a block"
            ))),
        }
    }

    fn rollback(&mut self) {
        self.cx.uncharge(self.charged_dirty);
        self.kills.clear();
        for r in std::mem::take(&mut self.reserved) {
            self.cx.release_block(r);
        }
        self.released.clear();
        self.ops.clear();
        let store = self.cx.store();
        let Ok(live) = self.dsl.live(self.id) else {
            return;
        };
        let mut failed = None;
        while let Some(u) = self.undo.pop() {
            match u {
                Undo::Tree(k, Some(v)) => {
                    if let Err(e) = live.tree.insert(&store, &k, &v) {
                        failed = Some(e.to_string());
                    }
                }
                Undo::Tree(k, None) => {
                    if let Err(e) = live.tree.remove(&store, &k) {
                        failed = Some(e.to_string());
                    }
                }
                Undo::Staged(k, Some(b)) => {
                    live.stage(k, b);
                }
                Undo::Staged(k, None) => {
                    live.unstage(&k);
                }
            }
        }
        drop(store);
        if let Some(e) = failed {
            // The tree keeps part of the failed change: it must not commit.
            self.cx.fault(format!(
                "undoing a failed change could not restore the dataset ({e}); the pool \
                 stopped so that nothing half-done is committed: export and import it"
            ));
        }
    }

    fn finish(&mut self) -> Result<(), DsError> {
        let live = self.dsl.live(self.id)?;
        live.kills.append(&mut self.kills);
        live.log.append(&mut self.ops);
        self.reserved.clear();
        for b in std::mem::take(&mut self.released) {
            match b.written {
                // Only the intent log refers to it: freed after the sync.
                Some(bp) => self.cx.log_free(bp),
                None => self.cx.release_block(b.res),
            }
        }
        Ok(())
    }
}

/// Runs `f` as one transaction on dataset `id` (see the module docs);
/// the outer result is the dataset layer's, the inner one `f`'s.
pub(crate) fn run<R, E>(
    dsl: &mut Dsl,
    cx: &mut Cx<'_, '_>,
    id: u64,
    replay: bool,
    f: impl FnOnce(&mut Txn<'_, '_, '_>) -> Result<R, E>,
) -> Result<Result<R, E>, DsError> {
    dsl.live(id)?;
    let mut t = Txn {
        dsl,
        cx,
        id,
        readonly: false,
        undo: Vec::new(),
        kills: Vec::new(),
        charged_dirty: 0,
        reserved: Vec::new(),
        released: Vec::new(),
        ops: Vec::new(),
        replay,
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

    /// The pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Runs `f` as one atomic transaction (see the module docs). Errors of
    /// the dataset layer convert into the caller's error type.
    pub fn txn<R, E: From<DsError>>(
        &self,
        write: bool,
        f: impl FnOnce(&mut Txn<'_, '_, '_>) -> Result<R, E>,
    ) -> Result<R, E> {
        let id = self.id;
        let snapshot = self.snapshot;
        let r = with_dsl(&self.pool, write, |dsl, cx| {
            let readonly = snapshot || dsl.prop_bool(id, "readonly");
            run(dsl, cx, id, false, |t| {
                t.readonly = readonly;
                f(t)
            })
        });
        match r {
            Ok(inner) => inner,
            Err(e) => Err(E::from(e)),
        }
    }

    /// Makes every finished transaction of this dataset durable: through
    /// the intent log when it can, else by committing the txg. With
    /// `sync=disabled` it returns at once (documented as unsafe).
    pub fn sync(&self) -> Result<(), DsError> {
        if self.snapshot {
            return Ok(());
        }
        let id = self.id;
        // Whatever keeps the log from taking it, a txg commit is durable too.
        let logged = with_dsl(&self.pool, false, |dsl, cx| crate::zil::commit(dsl, cx, id));
        if !matches!(logged, Ok(true)) {
            self.pool.sync()?;
        }
        Ok(())
    }

    /// This filesystem's snapshots, oldest first, as handles.
    pub fn snapshots(&self) -> Result<Vec<(String, DatasetHandle)>, DsError> {
        if self.snapshot {
            return Ok(Vec::new());
        }
        let id = self.id;
        let pool = self.pool.clone();
        with_dsl(&self.pool, false, |dsl, _| {
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

    /// The committed root of this dataset's tree (for tests and tools).
    pub fn root(&self) -> Result<BlockPtr, DsError> {
        let id = self.id;
        with_dsl(&self.pool, false, |dsl, _| crate::dsl::rec_root(dsl, id))
    }
}
