//! The POSIX layer on a real dataset: [`Store`] for a dataset transaction
//! and [`Backend`] for a dataset handle. Thin by design: the dataset layer
//! already gives atomic, journaled transactions and typed errors; this
//! module only translates them.

use std::ops::Bound;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tarn_dataset::{DatasetHandle, DsError, Txn, Value};

use crate::{
    Backend, BlockReader, Bytes, FsError, Prefetch, SpaceInfo, Store, StoreError, StoreInfo, Val,
};

pub(crate) fn store_err(e: DsError) -> StoreError {
    match e {
        DsError::NoSpace(m) => StoreError::NoSpace(m),
        DsError::Quota(m) => StoreError::Quota(m),
        DsError::ReadOnly(m) => StoreError::ReadOnly(m),
        DsError::Damaged(m) => StoreError::Damaged(m),
        DsError::Invalid(m) => StoreError::Invalid(m),
        DsError::Locked(m) => StoreError::Locked(m),
        DsError::NotFound(m) => StoreError::Gone(m),
        other => StoreError::Other(other.to_string()),
    }
}

impl From<DsError> for FsError {
    fn from(e: DsError) -> Self {
        FsError::from(store_err(e))
    }
}

fn val(v: Value) -> Val {
    match v {
        Value::Plain(b) => Val::Plain(b),
        Value::Block { len } => Val::Block { len },
    }
}

/// One dataset transaction seen as a [`Store`].
struct TxnStore<'t, 'a, 'p> {
    t: &'t mut Txn<'a, 'p>,
    info: StoreInfo,
    handle: &'t DatasetHandle,
}

impl Store for TxnStore<'_, '_, '_> {
    fn info(&self) -> StoreInfo {
        self.info.clone()
    }

    fn space(&mut self) -> SpaceInfo {
        let (available, used) = self.t.space();
        SpaceInfo {
            total: used.saturating_add(available),
            available,
        }
    }

    fn get(&mut self, key: &[u8]) -> Result<Option<Val>, StoreError> {
        self.t.get(key).map(|o| o.map(val)).map_err(store_err)
    }

    fn get_many(&mut self, keys: &[&[u8]]) -> Result<Vec<Option<Val>>, StoreError> {
        let found = self.t.get_many(keys).map_err(store_err)?;
        Ok(found.into_iter().map(|o| o.map(val)).collect())
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.t.put(key, value).map_err(store_err)
    }

    fn delete(&mut self, key: &[u8]) -> Result<bool, StoreError> {
        self.t.delete(key).map_err(store_err)
    }

    fn range(
        &mut self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Val)>, StoreError> {
        self.t
            .range(start, end, limit)
            .map(|v| v.into_iter().map(|(k, x)| (k, val(x))).collect())
            .map_err(store_err)
    }

    fn delete_range(&mut self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<(), StoreError> {
        self.t.delete_range(start, end).map_err(store_err)
    }

    fn write_block(&mut self, key: &[u8], data: Vec<u8>) -> Result<(), StoreError> {
        self.t.write_block(key, data).map_err(store_err)
    }

    fn patch_block(
        &mut self,
        key: &[u8],
        len: usize,
        off: usize,
        bytes: Vec<u8>,
    ) -> Result<(usize, usize), StoreError> {
        self.t.patch_block(key, len, off, bytes).map_err(store_err)
    }

    fn read_block(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.t.read_block(key).map_err(store_err)
    }

    fn block_reader(&mut self, key: &[u8]) -> Result<Option<BlockReader>, StoreError> {
        let Some(r) = self.t.block_ref(key).map_err(store_err)? else {
            return Ok(None);
        };
        let pool = self.handle.pool().clone();
        Ok(Some(Box::new(move || {
            r.read(&pool)
                .map(|d| Box::new(d) as Bytes)
                .map_err(store_err)
        })))
    }

    fn block_prefetcher(&mut self, key: &[u8]) -> Result<Option<Prefetch>, StoreError> {
        let Some(r) = self.t.block_ref(key).map_err(store_err)? else {
            return Ok(None);
        };
        if !r.is_committed() {
            return Ok(None);
        }
        let pool = self.handle.pool().clone();
        Ok(Some(Box::new(move || r.prefetch(&pool))))
    }

    fn now(&self) -> (i64, u32) {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        (d.as_secs() as i64, d.subsec_nanos())
    }
}

/// A filesystem dataset (or snapshot) as the POSIX layer's backend.
#[derive(Clone, Debug)]
pub struct DatasetBackend {
    handle: DatasetHandle,
}

impl DatasetBackend {
    /// Wraps an open dataset handle.
    pub fn new(handle: DatasetHandle) -> Self {
        DatasetBackend { handle }
    }

    /// The dataset handle.
    pub fn handle(&self) -> &DatasetHandle {
        &self.handle
    }
}

impl DatasetBackend {
    /// One attempt of [`Backend::txn`].
    fn txn_once<R>(
        &self,
        write: bool,
        f: &mut dyn FnMut(&mut dyn Store) -> Result<R, FsError>,
    ) -> Result<R, FsError> {
        let mut always = false;
        let r = self.handle.txn(write, |t| {
            let info = StoreInfo {
                recordsize: t.prop("recordsize").parse().unwrap_or(128 * 1024),
                readonly: t.is_readonly(),
                atime: t.prop("atime") == "on",
                guid: t.guid(),
                encrypted: t.is_encrypted(),
                created_unix: t.created_unix(),
            };
            always = write && t.prop("sync") == "always";
            let mut s = TxnStore {
                t,
                info,
                handle: &self.handle,
            };
            f(&mut s)
        })?;
        // sync=always: every change is durable (in the intent log) before
        // it is acknowledged.
        if always {
            self.handle.sync()?;
        }
        Ok(r)
    }
}

impl Backend for DatasetBackend {
    fn txn<R>(
        &self,
        write: bool,
        f: &mut dyn FnMut(&mut dyn Store) -> Result<R, FsError>,
    ) -> Result<R, FsError> {
        match self.txn_once(write, f) {
            // The failed transaction changed nothing; once the space of
            // earlier deletes is back, it runs again (once).
            Err(e)
                if write
                    && (e.errno() == libc::ENOSPC || e.errno() == libc::EDQUOT)
                    && self.handle.reclaim_space() =>
            {
                self.txn_once(write, f)
            }
            r => r,
        }
    }

    fn sync(&self) -> Result<(), FsError> {
        // sync=disabled is decided by the dataset layer in the same call.
        self.handle.sync().map_err(FsError::from)
    }

    fn snapshots(&self) -> Result<Vec<(String, Arc<Self>)>, FsError> {
        Ok(self
            .handle
            .snapshots()?
            .into_iter()
            .map(|(name, h)| (name, Arc::new(DatasetBackend::new(h))))
            .collect())
    }

    fn generation(&self) -> Option<u64> {
        Some(self.handle.pool().open_txg())
    }
}
