//! Named byte arrays in a pool, for the pool's own tests: they need data to
//! damage, scrub, resilver and read back, and a way to find the blocks that
//! hold it. Kept as keys of the pool's root dataset (records of the pool's
//! `recordsize` under `R ‖ name ‖ 0 ‖ index`, the size under `S ‖ name`),
//! through the real dataset layer.

use std::ops::Bound;
use std::sync::Arc;

use tarn_block::BlockPtr;
use tarn_dataset::{DatasetHandle, DsError, Txn, Value};
use tarn_pool::{Pool, PoolError};

fn size_key(name: &str) -> Vec<u8> {
    let mut k = vec![b'S'];
    k.extend_from_slice(name.as_bytes());
    k
}

fn prefix(name: &str) -> Vec<u8> {
    let mut k = vec![b'R'];
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k
}

/// The dataset key of record `index` of blob `name` (tests look for it in
/// the damage list).
pub fn record_key(name: &str, index: u64) -> Vec<u8> {
    let mut k = prefix(name);
    k.extend_from_slice(&index.to_be_bytes());
    k
}

/// How the dataset layer names that record in `status` when it is damaged.
pub fn damage_name(pool: &Pool, name: &str, index: u64) -> String {
    format!(
        "dataset {}: block at key {:02x?}",
        pool.name(),
        record_key(name, index)
    )
}

fn pool_error(e: DsError) -> PoolError {
    match e {
        DsError::Pool(p) => p,
        DsError::NoSpace(m) | DsError::Quota(m) => PoolError::NoSpace(m),
        DsError::NotFound(m) => PoolError::NotFound(m),
        DsError::Damaged(m) => PoolError::Damaged(m),
        DsError::Invalid(m)
        | DsError::ReadOnly(m)
        | DsError::Exists(m)
        | DsError::Busy(m)
        | DsError::Locked(m)
        | DsError::WrongKey(m) => PoolError::Invalid(m),
        DsError::Corrupt(m) => PoolError::Corrupt(m),
    }
}

fn root(pool: &Arc<Pool>) -> Result<DatasetHandle, PoolError> {
    if !pool.has_extension() {
        tarn_dataset::attach(pool).map_err(pool_error)?;
    }
    tarn_dataset::open(pool, pool.name()).map_err(pool_error)
}

fn size_of(t: &mut Txn<'_, '_>, name: &str) -> Result<Option<u64>, DsError> {
    Ok(match t.get(&size_key(name))? {
        Some(Value::Plain(v)) => {
            Some(u64::from_le_bytes(v.try_into().map_err(|_| {
                DsError::Corrupt(format!("size of blob {name}"))
            })?))
        }
        _ => None,
    })
}

/// Named byte arrays in a pool (see the module docs).
pub trait Blobs {
    /// Writes `data` at `offset` of blob `name`, creating it; with `sync`,
    /// returns once a txg holding the write has committed.
    fn object_write(
        &self,
        name: &str,
        offset: u64,
        data: &[u8],
        sync: bool,
    ) -> Result<(), PoolError>;
    /// Up to `len` bytes at `offset` of blob `name`.
    fn object_read(&self, name: &str, offset: u64, len: usize) -> Result<Vec<u8>, PoolError>;
    /// Deletes blob `name`.
    fn object_delete(&self, name: &str) -> Result<(), PoolError>;
    /// The committed block pointers of blob `name`, by record index.
    fn object_blocks(&self, name: &str) -> Result<Vec<(u64, BlockPtr)>, PoolError>;
}

impl Blobs for Arc<Pool> {
    fn object_write(
        &self,
        name: &str,
        offset: u64,
        data: &[u8],
        sync: bool,
    ) -> Result<(), PoolError> {
        let rs = self.props().recordsize as u64;
        let h = root(self)?;
        h.txn(true, |t| {
            let mut pos = offset;
            let mut src = data;
            while !src.is_empty() {
                let idx = pos / rs;
                let at = (pos % rs) as usize;
                let n = (rs as usize - at).min(src.len());
                let key = record_key(name, idx);
                let mut rec = if at == 0 && n as u64 == rs {
                    Vec::new()
                } else {
                    t.read_block(&key)?.unwrap_or_default()
                };
                if rec.len() < at + n {
                    rec.resize(at + n, 0);
                }
                rec[at..at + n].copy_from_slice(&src[..n]);
                t.write_block(&key, rec)?;
                pos += n as u64;
                src = &src[n..];
            }
            let size = size_of(t, name)?
                .unwrap_or(0)
                .max(offset + data.len() as u64);
            t.put(&size_key(name), &size.to_le_bytes())
        })
        .map_err(pool_error)?;
        if sync {
            self.sync()?;
        }
        Ok(())
    }

    fn object_read(&self, name: &str, offset: u64, len: usize) -> Result<Vec<u8>, PoolError> {
        let rs = self.props().recordsize as u64;
        let h = root(self)?;
        h.txn(false, |t| {
            let size =
                size_of(t, name)?.ok_or_else(|| DsError::NotFound(format!("no blob '{name}'")))?;
            if offset >= size {
                return Ok(Vec::new());
            }
            let len = (len as u64).min(size - offset) as usize;
            let mut out = vec![0u8; len];
            let mut done = 0usize;
            while done < len {
                let pos = offset + done as u64;
                let idx = pos / rs;
                let at = (pos % rs) as usize;
                let n = (rs as usize - at).min(len - done);
                let rec = t.read_block(&record_key(name, idx)).map_err(|e| match e {
                    DsError::Damaged(m) => {
                        DsError::Damaged(format!("blob {name} at offset {}: {m}", idx * rs))
                    }
                    other => other,
                })?;
                if let Some(rec) = rec {
                    let have = rec.len().saturating_sub(at).min(n);
                    out[done..done + have].copy_from_slice(&rec[at..at + have]);
                }
                done += n;
            }
            Ok(out)
        })
        .map_err(pool_error)
    }

    fn object_delete(&self, name: &str) -> Result<(), PoolError> {
        let h = root(self)?;
        h.txn(true, |t| {
            if !t.delete(&size_key(name))? {
                return Err(DsError::NotFound(format!("no blob '{name}'")));
            }
            let lo = prefix(name);
            let mut hi = lo.clone();
            hi.push(0xff);
            t.delete_range(Bound::Included(&lo), Bound::Excluded(&hi))
        })
        .map_err(pool_error)
    }

    fn object_blocks(&self, name: &str) -> Result<Vec<(u64, BlockPtr)>, PoolError> {
        let h = root(self)?;
        let lo = prefix(name);
        let mut hi = lo.clone();
        hi.push(0xff);
        let blocks = h.committed_blocks(&lo, &hi).map_err(pool_error)?;
        blocks
            .into_iter()
            .map(|(k, bp)| {
                let idx = k
                    .get(lo.len()..)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
                    .ok_or_else(|| PoolError::Corrupt(format!("blob key {k:02x?}")))?;
                Ok((idx, bp))
            })
            .collect()
    }
}
