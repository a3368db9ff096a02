//! Member files: sparse files in a folder, the cheapest real devices.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// `n` sparse files `{prefix}0..` of `size` bytes in `dir`.
pub fn make(dir: &Path, prefix: &str, n: usize, size: u64) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let p = dir.join(format!("{prefix}{i}"));
            let f = std::fs::File::create(&p).expect("create a member file");
            f.set_len(size).expect("size a member file");
            p
        })
        .collect()
}

/// Writes `bytes` at `off` of the file at `path` (to damage a member).
pub fn overwrite(path: &Path, off: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open a member file");
    f.write_at(bytes, off).expect("overwrite a member file");
}
