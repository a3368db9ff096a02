//! Filesystem datasets: create one and mount the POSIX layer on it, or get
//! a pool on a temporary file with one filesystem ready.

use std::sync::Arc;

use tarn_dataset::DatasetInfo;
use tarn_fs::{DatasetBackend, Fs};
use tarn_pool::{Pool, PoolOptions};
use tarn_vdev::VdevKind;

/// The POSIX layer on a dataset.
pub type DsFs = Fs<DatasetBackend>;

/// Mounts the POSIX layer on the existing dataset `name`.
pub fn mount(pool: &Arc<Pool>, name: &str) -> DsFs {
    let h = tarn_dataset::open(pool, name).unwrap_or_else(|e| panic!("open {name}: {e}"));
    Fs::mount(Arc::new(DatasetBackend::new(h))).unwrap_or_else(|e| panic!("mount {name}: {e}"))
}

/// Creates dataset `name` with `props` and opens it for transactions (the
/// dataset layer's own tests, below the POSIX layer).
pub fn handle(pool: &Arc<Pool>, name: &str, props: &[(&str, &str)]) -> tarn_dataset::DatasetHandle {
    tarn_dataset::create(pool, name, &crate::pools::props(props), false)
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    tarn_dataset::open(pool, name).unwrap_or_else(|e| panic!("open {name}: {e}"))
}

/// Creates dataset `name` with `props` and mounts the POSIX layer on it.
pub fn filesystem(pool: &Arc<Pool>, name: &str, props: &[(&str, &str)]) -> DsFs {
    tarn_dataset::create(pool, name, &crate::pools::props(props), false)
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    mount(pool, name)
}

/// Creates the regular file `name` (mode 0644, root's) in the root
/// directory of `fs`, open for reading and writing (the caller releases
/// it); returns its inode.
pub fn new_file(fs: &DsFs, name: &str) -> u64 {
    let root = tarn_fs::Cred::root();
    fs.create(
        tarn_fs::ROOT_INO,
        name.as_bytes(),
        libc::S_IFREG | 0o644,
        0,
        libc::O_RDWR,
        &root,
    )
    .unwrap_or_else(|e| panic!("create {name}: {e}"))
    .ino
}

/// What the dataset layer reports of dataset (or snapshot) `name`.
pub fn info(pool: &Pool, name: &str) -> DatasetInfo {
    tarn_dataset::list(pool, true)
        .unwrap_or_else(|e| panic!("list datasets: {e}"))
        .into_iter()
        .find(|i| i.name == name)
        .unwrap_or_else(|| panic!("no dataset {name}"))
}

/// A pool `tank` on one temporary file with the filesystem `tank/fs`
/// mounted. Fields drop in order: the filesystem, the pool, the folder.
pub struct FsPool {
    /// The mounted filesystem `tank/fs`.
    pub fs: Arc<DsFs>,
    /// The pool.
    pub pool: Arc<Pool>,
    /// The folder that holds the member file.
    pub dir: tempfile::TempDir,
}

impl FsPool {
    /// A member file of `dev_size` bytes, the pool made with `opts`, and
    /// `tank/fs` with default properties.
    pub fn new(dev_size: u64, opts: PoolOptions) -> FsPool {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let pool = crate::pools::tank_with(dir.path(), VdevKind::Single, 1, dev_size, opts);
        let fs = Arc::new(filesystem(&pool, "tank/fs", &[]));
        FsPool { fs, pool, dir }
    }
}

/// Argon2id parameters cheap enough for tests (the code path is the one
/// of the defaults; only the cost differs).
pub const FAST_PBKDF: tarn_dataset::crypt::Pbkdf = tarn_dataset::crypt::Pbkdf {
    memory_kib: 64,
    iterations: 1,
    parallelism: 1,
};

/// A passphrase key given at the prompt, with [`FAST_PBKDF`].
pub fn passphrase(pass: &str) -> tarn_dataset::KeyInput {
    let mut k = tarn_dataset::KeyInput::new(
        tarn_dataset::KeyFormat::Passphrase,
        "prompt",
        pass.as_bytes().to_vec(),
    );
    k.pbkdf = FAST_PBKDF;
    k
}

/// Creates `name` as an encryption root (aes-256-gcm unless `props` says
/// otherwise) with passphrase `pass`; its key is loaded.
pub fn encrypted(pool: &Arc<Pool>, name: &str, pass: &str, props: &[(&str, &str)]) {
    let mut p = crate::pools::props(props);
    p.entry("encryption".into()).or_insert_with(|| "on".into());
    p.insert("keyformat".into(), "passphrase".into());
    tarn_dataset::create_with_key(pool, name, &p, false, Some(&passphrase(pass)))
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
}

/// Every occurrence of each needle in the member files `devs`: (needle
/// index, file, offset). Reads each file whole.
pub fn find_in_devices(
    devs: &[std::path::PathBuf],
    needles: &[Vec<u8>],
) -> Vec<(usize, usize, usize)> {
    let mut hits = Vec::new();
    for (f, d) in devs.iter().enumerate() {
        let bytes = std::fs::read(d).unwrap_or_else(|e| panic!("read {}: {e}", d.display()));
        for (i, n) in needles.iter().enumerate() {
            for off in memchr::memmem::find_iter(&bytes, n) {
                hits.push((i, f, off));
            }
        }
    }
    hits
}
