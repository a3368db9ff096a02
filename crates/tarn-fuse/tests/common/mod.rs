//! Shared helpers of the integration tests: skip without root or
//! `/dev/fuse`, and mount a memory-backed filesystem on a temporary
//! directory.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tarn_fs::testing::MemBackend;
use tarn_fs::Fs;
use tarn_fuse::{Mount, MountOptions};

/// Why FUSE tests cannot run here, if they cannot.
pub fn skip_reason() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".into());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Some(format!("not root (euid {euid}); mounting needs root"));
    }
    None
}

/// Returns true (after printing why) when the calling test must skip.
pub fn skip(test: &str) -> bool {
    match skip_reason() {
        Some(r) => {
            eprintln!("SKIPPED {test}: {r}");
            true
        }
        None => false,
    }
}

/// A mounted memory filesystem; fields drop in order (mount first).
pub struct Fixture {
    pub mount: Mount,
    pub fs: Arc<Fs<MemBackend>>,
    pub backend: Arc<MemBackend>,
    pub dir: tempfile::TempDir,
}

impl Fixture {
    /// The mountpoint.
    pub fn root(&self) -> PathBuf {
        self.mount.mountpoint().to_path_buf()
    }
    /// A path inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }
}

/// Mounts `backend` (a fresh `Fs` on it) with `opts`.
pub fn mount_backend(backend: Arc<MemBackend>, opts: &MountOptions) -> Fixture {
    let fs = Arc::new(Fs::mount(backend.clone()).expect("Fs::mount"));
    let dir = tempfile::tempdir().expect("tempdir");
    let mount = tarn_fuse::mount(fs.clone(), dir.path(), opts).expect("mount");
    Fixture {
        mount,
        fs,
        backend,
        dir,
    }
}

/// Mounts a fresh memory filesystem with `opts`.
pub fn mount_with(opts: &MountOptions) -> Fixture {
    mount_backend(MemBackend::new(), opts)
}

/// Mounts a fresh memory filesystem with default options.
pub fn mount_default() -> Fixture {
    mount_with(&MountOptions::default())
}

/// True if `path` appears as a mountpoint in /proc/self/mountinfo.
pub fn in_mountinfo(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = path.to_string_lossy().into_owned();
    info.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|mp| mp == want))
}

/// Deterministic test data.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tarn_fs::{Backend, FsError, SpaceInfo, Store, StoreError, StoreInfo, Val};

/// A [`MemBackend`] wrapper for tests: counts write transactions, can make
/// transactions that read one inode's data slow (the sleep happens after
/// the transaction, outside the memory backend's lock, like a slow disk
/// read that does not block other work), and can run on the real clock.
pub struct TestBackend {
    pub inner: Arc<MemBackend>,
    pub write_txns: AtomicU64,
    /// Calls of `sync` (what fsync and synchronous writes ask for).
    pub syncs: AtomicU64,
    /// Local inode number whose data reads are slow (0: none).
    pub slow_ino: AtomicU64,
    /// How slow, in milliseconds.
    pub slow_ms: AtomicU64,
    /// Use the wall clock instead of the memory backend's fixed clock.
    pub real_clock: AtomicBool,
}

impl TestBackend {
    pub fn wrap(inner: Arc<MemBackend>) -> Arc<TestBackend> {
        Arc::new(TestBackend {
            inner,
            write_txns: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            slow_ino: AtomicU64::new(0),
            slow_ms: AtomicU64::new(0),
            real_clock: AtomicBool::new(false),
        })
    }
}

struct WrapStore<'a> {
    s: &'a mut dyn Store,
    slow_ino: u64,
    touched: bool,
    real_clock: bool,
}

impl WrapStore<'_> {
    fn note(&mut self, key: &[u8]) {
        if self.slow_ino != 0 && key.len() >= 8 && key[..8] == self.slow_ino.to_be_bytes() {
            self.touched = true;
        }
    }
}

impl Store for WrapStore<'_> {
    fn info(&self) -> StoreInfo {
        self.s.info()
    }
    fn space(&mut self) -> SpaceInfo {
        self.s.space()
    }
    fn get(&mut self, key: &[u8]) -> Result<Option<Val>, StoreError> {
        self.s.get(key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.s.put(key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<bool, StoreError> {
        self.s.delete(key)
    }
    fn range(
        &mut self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Val)>, StoreError> {
        self.s.range(start, end, limit)
    }
    fn delete_range(&mut self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<(), StoreError> {
        self.s.delete_range(start, end)
    }
    fn write_block(&mut self, key: &[u8], data: Vec<u8>) -> Result<(), StoreError> {
        self.s.write_block(key, data)
    }
    fn read_block(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.note(key);
        self.s.read_block(key)
    }
    fn now(&self) -> (i64, u32) {
        if self.real_clock {
            let d = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            (d.as_secs() as i64, d.subsec_nanos())
        } else {
            self.s.now()
        }
    }
}

impl Backend for TestBackend {
    fn txn<R>(
        &self,
        write: bool,
        f: &mut dyn FnMut(&mut dyn Store) -> Result<R, FsError>,
    ) -> Result<R, FsError> {
        if write {
            self.write_txns.fetch_add(1, Ordering::SeqCst);
        }
        let slow_ino = self.slow_ino.load(Ordering::SeqCst);
        let real_clock = self.real_clock.load(Ordering::SeqCst);
        let mut touched = false;
        let r = self.inner.txn(write, &mut |s| {
            let mut w = WrapStore {
                s,
                slow_ino,
                touched: false,
                real_clock,
            };
            let r = f(&mut w);
            touched |= w.touched;
            r
        });
        if touched {
            std::thread::sleep(Duration::from_millis(self.slow_ms.load(Ordering::SeqCst)));
        }
        r
    }
    fn sync(&self) -> Result<(), FsError> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        self.inner.sync()
    }
    fn snapshots(&self) -> Result<Vec<(String, Arc<Self>)>, FsError> {
        Ok(self
            .inner
            .snapshots()?
            .into_iter()
            .map(|(n, b)| {
                let w = TestBackend::wrap(b);
                w.real_clock
                    .store(self.real_clock.load(Ordering::SeqCst), Ordering::SeqCst);
                (n, w)
            })
            .collect())
    }
}

/// A mounted [`TestBackend`].
pub struct TestFixture {
    pub mount: Mount,
    pub fs: Arc<Fs<TestBackend>>,
    pub backend: Arc<TestBackend>,
    pub dir: tempfile::TempDir,
}

impl TestFixture {
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mount.mountpoint().join(rel)
    }
}

/// Mounts a fresh [`TestBackend`] with `opts`.
pub fn mount_test_backend(opts: &MountOptions, real_clock: bool) -> TestFixture {
    let backend = TestBackend::wrap(MemBackend::new());
    backend.real_clock.store(real_clock, Ordering::SeqCst);
    let fs = Arc::new(Fs::mount(backend.clone()).expect("Fs::mount"));
    let dir = tempfile::tempdir().expect("tempdir");
    let mount = tarn_fuse::mount(fs.clone(), dir.path(), opts).expect("mount");
    TestFixture {
        mount,
        fs,
        backend,
        dir,
    }
}
