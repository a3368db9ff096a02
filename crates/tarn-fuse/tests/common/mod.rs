//! Shared helpers of the integration tests: mount a memory-backed
//! filesystem on a temporary directory, or one that counts, slows and
//! clocks what it does (root and /dev/fuse are checked with
//! `tarn_testkit::require::fuse`).

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tarn_fs::testing::MemBackend;
use tarn_fs::{Backend, Fs, FsError, Store};
use tarn_fuse::{Mount, MountOptions};
use tarn_testkit::stores::{snapshots_wrapped, wall_clock, Tap};

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

/// A [`MemBackend`] wrapper for tests: counts write transactions, can make
/// transactions that read one inode's data slow (the sleep happens after
/// the transaction, outside the memory backend's lock, like a slow disk
/// read that does not block other work), and can run on the real clock.
pub struct TestBackend {
    pub inner: Arc<MemBackend>,
    pub write_txns: AtomicU64,
    /// Read-only transactions (a FUSE read is one).
    pub read_txns: AtomicU64,
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
            read_txns: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            slow_ino: AtomicU64::new(0),
            slow_ms: AtomicU64::new(0),
            real_clock: AtomicBool::new(false),
        })
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
        } else {
            self.read_txns.fetch_add(1, Ordering::SeqCst);
        }
        let slow_ino = self.slow_ino.load(Ordering::SeqCst);
        let real_clock = self.real_clock.load(Ordering::SeqCst);
        let mut touched = false;
        let r = self.inner.txn(write, &mut |s| {
            // Data keys start with the inode number.
            let mut note = |key: &[u8]| {
                if slow_ino != 0 && key.len() >= 8 && key[..8] == slow_ino.to_be_bytes() {
                    touched = true;
                }
            };
            let tap = Tap::new(s).on_read(&mut note);
            let mut tap = if real_clock {
                tap.clock(&wall_clock)
            } else {
                tap
            };
            f(&mut tap)
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
        snapshots_wrapped(self.inner.as_ref(), |b| {
            let w = TestBackend::wrap(b);
            w.real_clock
                .store(self.real_clock.load(Ordering::SeqCst), Ordering::SeqCst);
            w
        })
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
