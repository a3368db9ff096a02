//! Leaf devices: the byte-addressed things a vdev is built from.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::VdevError;

/// One physical device (or a stand-in for one). Implementations must be safe
/// to use from many threads at once; every call is positioned, so there is no
/// shared cursor to race on.
pub trait Leaf: Send + Sync + std::fmt::Debug {
    /// Reads exactly `buf.len()` bytes at `offset`; a short read is an
    /// `UnexpectedEof` error, never a partial success.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`; writing past `size()` is an error.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable (fdatasync).
    fn flush(&self) -> io::Result<()>;
    /// Size of the device in bytes, fixed at open.
    fn size(&self) -> u64;
    /// Where the device was opened from, for messages and configs.
    fn path(&self) -> &Path;
}

/// A regular file or block device opened read-write, accessed with
/// pread/pwrite. It keeps no statistics: the vdev counts I/O per child.
#[derive(Debug)]
pub struct FileLeaf {
    file: File,
    path: PathBuf,
    size: u64,
}

impl FileLeaf {
    /// Opens `path` read-write and takes its size by seeking to the end, which
    /// works for block devices as well as files.
    pub fn open(path: &Path) -> Result<FileLeaf, VdevError> {
        let io_err = |op, source| VdevError::Io {
            path: path.to_path_buf(),
            op,
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io_err("open", e))?;
        let size = (&file)
            .seek(SeekFrom::End(0))
            .map_err(|e| io_err("size", e))?;
        Ok(FileLeaf {
            file,
            path: path.to_path_buf(),
            size,
        })
    }
}

/// Checks that `[offset, offset + len)` lies within a device of `size` bytes.
pub(crate) fn check_range(offset: u64, len: usize, size: u64) -> io::Result<()> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("range {offset:#x}+{len:#x} beyond device end {size:#x}"),
        )),
    }
}

impl Leaf for FileLeaf {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len(), self.size)?;
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        // Refuse to grow a regular file: the size is part of the geometry.
        check_range(offset, buf.len(), self.size)?;
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_leaf_roundtrip_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d0");
        File::create(&p).unwrap().set_len(1 << 20).unwrap();
        let leaf = FileLeaf::open(&p).unwrap();
        assert_eq!(leaf.size(), 1 << 20);
        assert_eq!(leaf.path(), p.as_path());
        leaf.write_at(b"hello", 4096).unwrap();
        leaf.flush().unwrap();
        let mut b = [0u8; 5];
        leaf.read_at(&mut b, 4096).unwrap();
        assert_eq!(&b, b"hello");
        // Past the end: errors, and the file does not grow.
        assert!(leaf.write_at(b"x", 1 << 20).is_err());
        let mut b = [0u8; 8];
        let e = leaf.read_at(&mut b, (1 << 20) - 4).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(leaf.read_at(&mut b, u64::MAX - 2).is_err());
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 1 << 20);
    }

    #[test]
    fn file_leaf_open_missing_is_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = FileLeaf::open(&dir.path().join("nope")).unwrap_err();
        assert!(matches!(e, VdevError::Io { op: "open", .. }), "{e}");
    }
}
