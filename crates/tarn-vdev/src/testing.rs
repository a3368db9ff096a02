//! An in-memory leaf with fault injection, for this crate's tests and the
//! tests of the layers above. Built for this crate's unit tests and with the
//! feature `testing`, which tests enable through `[dev-dependencies]`:
//! production builds do not carry it.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::leaf::{check_range, Leaf};

const CHUNK: u64 = 64 * 1024;

/// A sparse in-memory device: untouched regions read as zeros and cost no
/// memory, so many 64 MiB leaves fit in a test. Reads, writes and flushes can
/// be made to fail, and bytes can be corrupted behind the vdev's back.
#[derive(Debug)]
pub struct MemLeaf {
    path: PathBuf,
    size: u64,
    chunks: Mutex<HashMap<u64, Box<[u8]>>>,
    fail_reads: AtomicBool,
    fail_writes: AtomicBool,
    fail_flush: AtomicBool,
    flushes: AtomicU64,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl MemLeaf {
    /// A zero-filled device of `size` bytes with a unique made-up path.
    pub fn new(size: u64) -> MemLeaf {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        MemLeaf::with_path(format!("mem:{id}"), size)
    }

    /// A zero-filled device of `size` bytes reporting `path`.
    pub fn with_path(path: impl Into<PathBuf>, size: u64) -> MemLeaf {
        MemLeaf {
            path: path.into(),
            size,
            chunks: Mutex::new(HashMap::new()),
            fail_reads: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
            fail_flush: AtomicBool::new(false),
            flushes: AtomicU64::new(0),
        }
    }

    /// Makes every following read fail with an I/O error (or stop failing).
    pub fn set_fail_reads(&self, fail: bool) {
        self.fail_reads.store(fail, Ordering::SeqCst);
    }

    /// Makes every following write fail with an I/O error (or stop failing).
    pub fn set_fail_writes(&self, fail: bool) {
        self.fail_writes.store(fail, Ordering::SeqCst);
    }

    /// Makes every following flush fail with an I/O error (or stop failing).
    pub fn set_fail_flush(&self, fail: bool) {
        self.fail_flush.store(fail, Ordering::SeqCst);
    }

    /// Number of successful flushes so far.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }

    /// Flips bits in `[offset, offset + len)` (clipped to the device), so every
    /// byte in the range is guaranteed to change. Ignores injected faults.
    pub fn corrupt(&self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return;
        }
        let mut bytes = self.raw_read(offset, (end - offset) as usize);
        for b in &mut bytes {
            *b ^= 0xA5;
        }
        self.raw_write(offset, &bytes);
    }

    /// Reads bytes directly, ignoring injected faults; out-of-range bytes read as zero.
    pub fn raw_read(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        let chunks = self.lock();
        self.each_chunk(offset, len, |key, within, pos, n| {
            if let Some(c) = chunks.get(&key) {
                out[pos..pos + n].copy_from_slice(&c[within..within + n]);
            }
        });
        out
    }

    /// Writes bytes directly, ignoring injected faults; bytes past the end are dropped.
    pub fn raw_write(&self, offset: u64, data: &[u8]) {
        let len = (self.size.saturating_sub(offset) as usize).min(data.len());
        let mut chunks = self.lock();
        self.each_chunk(offset, len, |key, within, pos, n| {
            let c = chunks
                .entry(key)
                .or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            c[within..within + n].copy_from_slice(&data[pos..pos + n]);
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Box<[u8]>>> {
        self.chunks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls `f(chunk key, offset within chunk, offset within the buffer, length)`
    /// for each chunk overlapping `[offset, offset + len)`.
    fn each_chunk(&self, offset: u64, len: usize, mut f: impl FnMut(u64, usize, usize, usize)) {
        let mut pos = 0usize;
        while pos < len {
            let at = offset + pos as u64;
            let key = at / CHUNK;
            let within = (at % CHUNK) as usize;
            let n = (CHUNK as usize - within).min(len - pos);
            f(key, within, pos, n);
            pos += n;
        }
    }
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("injected {what} error"))
}

impl Leaf for MemLeaf {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(injected("read"));
        }
        check_range(offset, buf.len(), self.size)?;
        let chunks = self.lock();
        self.each_chunk(offset, buf.len(), |key, within, pos, n| {
            match chunks.get(&key) {
                Some(c) => buf[pos..pos + n].copy_from_slice(&c[within..within + n]),
                None => buf[pos..pos + n].fill(0),
            }
        });
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(injected("write"));
        }
        check_range(offset, buf.len(), self.size)?;
        self.raw_write(offset, buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if self.fail_flush.load(Ordering::SeqCst) {
            return Err(injected("flush"));
        }
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// Reads run through a ring (the merged reads' batched path) so far in
/// this process: a test that wants that path checks it was taken.
pub fn ring_reads() -> u64 {
    crate::uring::completed()
}

/// Whether rings work in this process (false once setting one up failed):
/// where they do not, merged reads take one blocking read per run.
pub fn rings_available() -> bool {
    crate::uring::available()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_roundtrip_across_chunks() {
        let m = MemLeaf::new(1 << 20);
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        m.write_at(&data, 12345).unwrap();
        let mut back = vec![0u8; data.len()];
        m.read_at(&mut back, 12345).unwrap();
        assert_eq!(back, data);
        let mut z = [1u8; 10];
        m.read_at(&mut z, 900_000).unwrap();
        assert_eq!(z, [0; 10]);
        assert!(m.write_at(&[1], 1 << 20).is_err());
    }

    #[test]
    fn faults_and_corruption() {
        let m = MemLeaf::new(1 << 20);
        m.write_at(&[1, 2, 3], 10).unwrap();
        m.corrupt(10, 2);
        assert_eq!(m.raw_read(10, 3), vec![1 ^ 0xA5, 2 ^ 0xA5, 3]);
        m.set_fail_reads(true);
        assert!(m.read_at(&mut [0u8; 1], 0).is_err());
        m.set_fail_reads(false);
        m.set_fail_writes(true);
        assert!(m.write_at(&[0], 0).is_err());
        m.set_fail_flush(true);
        assert!(m.flush().is_err());
        m.set_fail_flush(false);
        m.flush().unwrap();
        assert_eq!(m.flush_count(), 1);
    }
}
