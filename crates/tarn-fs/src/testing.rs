//! An in-memory [`Backend`] for tests (this crate's and the front ends'):
//! a `BTreeMap` behind a mutex, with undo of failed transactions, holes,
//! snapshots as frozen copies, a byte budget that simulates ENOSPC or
//! EDQUOT, and a controllable clock.
//!
//! Built for this crate's unit tests and with the feature `testing`, which
//! other crates enable in their `[dev-dependencies]` (and `tarn-nfs`'s
//! `fuzzing` feature): production builds do not carry it.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::store::{
    Backend, SpaceInfo, Store, StoreError, StoreInfo, Val, MAX_BLOCK, MAX_KEY, MAX_VALUE,
};
use crate::{FsError, Result};

/// A stored value as the memory backend keeps it (exposed by
/// [`MemBackend::dump`] so tests can compare whole states).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemValue {
    /// A plain value.
    Plain(Vec<u8>),
    /// A data block, never all zeros.
    Block(Vec<u8>),
}

impl MemValue {
    fn cost(&self) -> u64 {
        match self {
            MemValue::Plain(v) | MemValue::Block(v) => v.len() as u64,
        }
    }
}

#[derive(Clone, Debug)]
struct Config {
    recordsize: u32,
    atime: bool,
    readonly: bool,
    budget: Option<u64>,
    quota: bool,
    encrypted: bool,
    created_unix: u64,
}

struct State {
    map: BTreeMap<Vec<u8>, MemValue>,
    used: u64,
    cfg: Config,
}

static NEXT_GUID: AtomicU64 = AtomicU64::new(0x7a11_0000_0000_0001);

/// The in-memory dataset. Transactions are serialized by one mutex, which
/// also makes them trivially serializable, as [`Backend`] requires.
pub struct MemBackend {
    state: Mutex<State>,
    snaps: Mutex<Vec<(String, Arc<MemBackend>)>>,
    clock: Arc<Mutex<(i64, u32)>>,
    guid: u64,
    frozen: bool,
    syncs: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemBackend {
    /// An empty dataset: recordsize 128 KiB, atime on, no space limit,
    /// clock at 2023-11-14 22:13:20 UTC.
    pub fn new() -> Arc<MemBackend> {
        Arc::new(MemBackend {
            state: Mutex::new(State {
                map: BTreeMap::new(),
                used: 0,
                cfg: Config {
                    recordsize: 128 * 1024,
                    atime: true,
                    readonly: false,
                    budget: None,
                    quota: false,
                    encrypted: false,
                    created_unix: 1_700_000_000,
                },
            }),
            snaps: Mutex::new(Vec::new()),
            clock: Arc::new(Mutex::new((1_700_000_000, 0))),
            guid: NEXT_GUID.fetch_add(1, Ordering::Relaxed),
            frozen: false,
            syncs: AtomicU64::new(0),
        })
    }

    /// Sets the `recordsize` new files take.
    pub fn set_recordsize(&self, rs: u32) {
        lock(&self.state).cfg.recordsize = rs;
    }
    /// Sets the `atime` property.
    pub fn set_atime(&self, on: bool) {
        lock(&self.state).cfg.atime = on;
    }
    /// Says the dataset is encrypted, so a filesystem made on it keys its
    /// name hashes (the values themselves stay in memory as they are).
    pub fn set_encrypted(&self, on: bool) {
        lock(&self.state).cfg.encrypted = on;
    }
    /// Makes the dataset read-only (like `readonly=on`).
    pub fn set_readonly(&self, on: bool) {
        lock(&self.state).cfg.readonly = on;
    }
    /// Limits stored bytes (keys + values); growing past it fails with
    /// `NoSpace`, or `Quota` when `quota` is true. `None` removes the limit.
    pub fn set_budget(&self, bytes: Option<u64>, quota: bool) {
        let mut st = lock(&self.state);
        st.cfg.budget = bytes;
        st.cfg.quota = quota;
    }
    /// Bytes stored now (keys + values), as the budget counts them.
    pub fn used(&self) -> u64 {
        lock(&self.state).used
    }
    /// Sets the clock.
    pub fn set_time(&self, sec: i64, nsec: u32) {
        *lock(&self.clock) = (sec, nsec);
    }
    /// Moves the clock forward.
    pub fn advance(&self, nanos: u64) {
        let mut c = lock(&self.clock);
        let total = i128::from(c.0) * 1_000_000_000 + i128::from(c.1) + i128::from(nanos);
        *c = (
            (total.div_euclid(1_000_000_000)) as i64,
            total.rem_euclid(1_000_000_000) as u32,
        );
    }
    /// Every key and value, for comparing whole states in tests.
    pub fn dump(&self) -> BTreeMap<Vec<u8>, MemValue> {
        lock(&self.state).map.clone()
    }
    /// How many times `sync` was called.
    pub fn sync_count(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }
    /// Takes a snapshot: a frozen, read-only copy named `name`.
    pub fn snapshot(&self, name: &str) -> Result<()> {
        if self.frozen {
            return Err(FsError::new(libc::EROFS, "cannot snapshot a snapshot"));
        }
        let st = lock(&self.state);
        let mut snaps = lock(&self.snaps);
        if snaps.iter().any(|(n, _)| n == name) {
            return Err(FsError::new(libc::EEXIST, "snapshot exists"));
        }
        let mut cfg = st.cfg.clone();
        cfg.readonly = true;
        cfg.created_unix = u64::try_from(lock(&self.clock).0).unwrap_or(0);
        let copy = MemBackend {
            state: Mutex::new(State {
                map: st.map.clone(),
                used: st.used,
                cfg,
            }),
            snaps: Mutex::new(Vec::new()),
            clock: self.clock.clone(),
            guid: NEXT_GUID.fetch_add(1, Ordering::Relaxed),
            frozen: true,
            syncs: AtomicU64::new(0),
        };
        snaps.push((name.to_string(), Arc::new(copy)));
        Ok(())
    }
    /// Returns the live state to snapshot `name` and destroys the newer
    /// snapshots (like `rollback -r`). A mounted [`crate::Fs`] must be
    /// mounted again afterwards, as after a restart.
    pub fn rollback(&self, name: &str) -> Result<()> {
        let mut st = lock(&self.state);
        let mut snaps = lock(&self.snaps);
        let Some(pos) = snaps.iter().position(|(n, _)| n == name) else {
            return Err(FsError::new(libc::ENOENT, "no such snapshot"));
        };
        {
            let snap = lock(&snaps[pos].1.state);
            st.map = snap.map.clone();
            st.used = snap.used;
        }
        snaps.truncate(pos + 1);
        Ok(())
    }
    /// Destroys snapshot `name`; false if there is none.
    pub fn destroy_snapshot(&self, name: &str) -> bool {
        let mut snaps = lock(&self.snaps);
        let before = snaps.len();
        snaps.retain(|(n, _)| n != name);
        snaps.len() != before
    }
}

/// One transaction on the map: remembers old values to undo on error.
struct MemTxn<'a> {
    st: &'a mut State,
    undo: Vec<(Vec<u8>, Option<MemValue>)>,
    used_before: u64,
    write: bool,
    info: StoreInfo,
    now: (i64, u32),
}

fn bounds_empty(start: Bound<&[u8]>, end: Bound<&[u8]>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s), Bound::Excluded(e))
        | (Bound::Excluded(s), Bound::Included(e))
        | (Bound::Excluded(s), Bound::Excluded(e)) => s >= e,
        _ => false,
    }
}

impl MemTxn<'_> {
    fn check_write(&self, key: &[u8]) -> Result<(), StoreError> {
        if self.info.readonly {
            return Err(StoreError::ReadOnly("dataset is read-only".into()));
        }
        if !self.write {
            return Err(StoreError::Invalid(
                "write in a read-only transaction".into(),
            ));
        }
        if key.len() > MAX_KEY {
            return Err(StoreError::Invalid(format!("key of {} bytes", key.len())));
        }
        Ok(())
    }

    fn set(&mut self, key: &[u8], val: Option<MemValue>) -> Result<Option<MemValue>, StoreError> {
        let old_cost = self
            .st
            .map
            .get(key)
            .map(|v| v.cost() + key.len() as u64)
            .unwrap_or(0);
        let new_cost = val
            .as_ref()
            .map(|v| v.cost() + key.len() as u64)
            .unwrap_or(0);
        let used = self.st.used - old_cost + new_cost;
        if new_cost > old_cost {
            if let Some(b) = self.st.cfg.budget {
                if used > b {
                    let msg = format!("{used} bytes over a budget of {b}");
                    return Err(if self.st.cfg.quota {
                        StoreError::Quota(msg)
                    } else {
                        StoreError::NoSpace(msg)
                    });
                }
            }
        }
        self.st.used = used;
        let old = match val {
            Some(v) => self.st.map.insert(key.to_vec(), v),
            None => self.st.map.remove(key),
        };
        self.undo.push((key.to_vec(), old.clone()));
        Ok(old)
    }

    fn rollback(&mut self) {
        while let Some((k, v)) = self.undo.pop() {
            match v {
                Some(v) => self.st.map.insert(k, v),
                None => self.st.map.remove(&k),
            };
        }
        self.st.used = self.used_before;
    }
}

impl Store for MemTxn<'_> {
    fn info(&self) -> StoreInfo {
        self.info.clone()
    }
    fn space(&mut self) -> SpaceInfo {
        let total = self.st.cfg.budget.unwrap_or(1 << 40);
        SpaceInfo {
            total,
            available: total.saturating_sub(self.st.used),
        }
    }
    fn get(&mut self, key: &[u8]) -> Result<Option<Val>, StoreError> {
        Ok(self.st.map.get(key).map(|v| match v {
            MemValue::Plain(p) => Val::Plain(p.clone()),
            MemValue::Block(b) => Val::Block {
                len: b.len() as u32,
            },
        }))
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.check_write(key)?;
        if value.len() > MAX_VALUE {
            return Err(StoreError::Invalid(format!(
                "plain value of {} bytes",
                value.len()
            )));
        }
        self.set(key, Some(MemValue::Plain(value.to_vec())))?;
        Ok(())
    }
    fn delete(&mut self, key: &[u8]) -> Result<bool, StoreError> {
        self.check_write(key)?;
        Ok(self.set(key, None)?.is_some())
    }
    fn range(
        &mut self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Val)>, StoreError> {
        if bounds_empty(start, end) {
            return Ok(Vec::new());
        }
        Ok(self
            .st
            .map
            .range::<[u8], _>((start, end))
            .take(limit)
            .map(|(k, v)| {
                let v = match v {
                    MemValue::Plain(p) => Val::Plain(p.clone()),
                    MemValue::Block(b) => Val::Block {
                        len: b.len() as u32,
                    },
                };
                (k.clone(), v)
            })
            .collect())
    }
    fn delete_range(&mut self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<(), StoreError> {
        self.check_write(&[])?;
        if bounds_empty(start, end) {
            return Ok(());
        }
        let keys: Vec<Vec<u8>> = self
            .st
            .map
            .range::<[u8], _>((start, end))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &keys {
            self.set(k, None)?;
        }
        Ok(())
    }
    fn write_block(&mut self, key: &[u8], data: Vec<u8>) -> Result<(), StoreError> {
        self.check_write(key)?;
        if data.len() > MAX_BLOCK {
            return Err(StoreError::Invalid(format!(
                "block of {} bytes",
                data.len()
            )));
        }
        if data.iter().all(|&b| b == 0) {
            self.set(key, None)?;
        } else {
            self.set(key, Some(MemValue::Block(data)))?;
        }
        Ok(())
    }
    fn patch_block(
        &mut self,
        key: &[u8],
        len: usize,
        off: usize,
        bytes: Vec<u8>,
    ) -> Result<(usize, usize), StoreError> {
        crate::store::patch_by_rewrite(self, key, len, off, bytes)
    }
    fn read_block(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.st.map.get(key) {
            None => Ok(None),
            Some(MemValue::Block(b)) => Ok(Some(b.clone())),
            Some(MemValue::Plain(_)) => {
                Err(StoreError::Invalid("read_block of a plain value".into()))
            }
        }
    }
    fn now(&self) -> (i64, u32) {
        self.now
    }
}

impl Backend for MemBackend {
    fn txn<R>(
        &self,
        write: bool,
        f: &mut dyn FnMut(&mut dyn Store) -> Result<R, FsError>,
    ) -> Result<R, FsError> {
        let now = *lock(&self.clock);
        let mut st = lock(&self.state);
        let info = StoreInfo {
            recordsize: st.cfg.recordsize,
            readonly: st.cfg.readonly,
            atime: st.cfg.atime,
            guid: self.guid,
            encrypted: st.cfg.encrypted,
            created_unix: st.cfg.created_unix,
        };
        let used_before = st.used;
        let mut t = MemTxn {
            st: &mut st,
            undo: Vec::new(),
            used_before,
            write,
            info,
            now,
        };
        let r = f(&mut t);
        if r.is_err() {
            t.rollback();
        }
        r
    }
    fn sync(&self) -> Result<(), FsError> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn snapshots(&self) -> Result<Vec<(String, Arc<Self>)>, FsError> {
        Ok(lock(&self.snaps).clone())
    }
}
