//! For test backends that wrap a real one (a dataset, the memory
//! backend): a [`Store`] seen through a tap, where every call passes
//! through except that the clock may be replaced and reads of blocks can be
//! watched, and the wrapped backend's snapshots, wrapped alike.

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use tarn_fs::{Backend, FsError, SpaceInfo, Store, StoreError, StoreInfo, Val};

/// What [`Tap::on_read`] calls with the key of each block read.
pub type ReadWatch<'a> = &'a mut dyn FnMut(&[u8]);

/// A store that passes every call to `inner`, except [`Store::now`] when a
/// clock is set, and that tells `on_read` the key of each block read
/// before reading it.
pub struct Tap<'a> {
    inner: &'a mut dyn Store,
    clock: Option<&'a dyn Fn() -> (i64, u32)>,
    on_read: Option<ReadWatch<'a>>,
}

impl<'a> Tap<'a> {
    /// A tap that changes nothing yet.
    pub fn new(inner: &'a mut dyn Store) -> Self {
        Tap {
            inner,
            clock: None,
            on_read: None,
        }
    }

    /// Reads the time from `clock` instead of `inner`.
    pub fn clock(mut self, clock: &'a dyn Fn() -> (i64, u32)) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Tells `f` the key of every block read.
    pub fn on_read(mut self, f: ReadWatch<'a>) -> Self {
        self.on_read = Some(f);
        self
    }
}

/// The system's clock, as [`Store::now`] gives it.
pub fn wall_clock() -> (i64, u32) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos())
}

/// A clock kept in nanoseconds in `ns` that moves `step` nanoseconds each
/// time it is read: the same times on every run.
pub fn tick(ns: &AtomicU64, step: u64) -> (i64, u32) {
    let t = ns.fetch_add(step, Ordering::AcqRel);
    ((t / 1_000_000_000) as i64, (t % 1_000_000_000) as u32)
}

/// The snapshots of a test backend that wraps `inner`: `inner`'s, each
/// wrapped by `wrap`.
pub fn snapshots_wrapped<B: Backend, W>(
    inner: &B,
    wrap: impl Fn(Arc<B>) -> Arc<W>,
) -> Result<Vec<(String, Arc<W>)>, FsError> {
    Ok(inner
        .snapshots()?
        .into_iter()
        .map(|(name, b)| (name, wrap(b)))
        .collect())
}

impl Store for Tap<'_> {
    fn info(&self) -> StoreInfo {
        self.inner.info()
    }
    fn space(&mut self) -> SpaceInfo {
        self.inner.space()
    }
    fn get(&mut self, key: &[u8]) -> Result<Option<Val>, StoreError> {
        self.inner.get(key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.inner.put(key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<bool, StoreError> {
        self.inner.delete(key)
    }
    fn range(
        &mut self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Val)>, StoreError> {
        self.inner.range(start, end, limit)
    }
    fn delete_range(&mut self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<(), StoreError> {
        self.inner.delete_range(start, end)
    }
    fn write_block(&mut self, key: &[u8], data: Vec<u8>) -> Result<(), StoreError> {
        self.inner.write_block(key, data)
    }
    fn patch_block(
        &mut self,
        key: &[u8],
        len: usize,
        off: usize,
        bytes: Vec<u8>,
    ) -> Result<(usize, usize), StoreError> {
        // The patch may read the block it changes.
        if let Some(f) = &mut self.on_read {
            f(key);
        }
        self.inner.patch_block(key, len, off, bytes)
    }
    fn read_block(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(f) = &mut self.on_read {
            f(key);
        }
        self.inner.read_block(key)
    }
    fn now(&self) -> (i64, u32) {
        match self.clock {
            Some(clock) => clock(),
            None => self.inner.now(),
        }
    }
}
