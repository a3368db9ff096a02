//! Leaf devices: the byte-addressed things a vdev is built from.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock, Weak};

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
    /// Like [`Leaf::read_at`], for bytes the caller reads once and keeps
    /// itself (a merged run, whose blocks go to the block cache): the leaf
    /// may read them past the kernel's page cache when the memory of
    /// `buf`, its length and `offset` are all multiples of
    /// [`DIRECT_ALIGN`]. It sees every completed write, flushed or not.
    /// The default is [`Leaf::read_at`].
    fn read_direct_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_at(buf, offset)
    }
    /// How many reads went past the page cache (none by default): for
    /// tests, through any wrapper.
    fn direct_reads(&self) -> u64 {
        0
    }
    /// The descriptor that reads past the page cache may be submitted on
    /// by the caller itself, many at once (`io_uring`), with the same
    /// alignment as [`Leaf::read_direct_at`] wants; `None` (the default)
    /// where every read must go through the leaf's own code. A caller whose
    /// read on it fails or comes back short reads again with
    /// [`Leaf::read_direct_at`], which decides what the failure means.
    fn direct_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// Counts `n` reads a caller made on [`Leaf::direct_fd`] (the count
    /// [`Leaf::direct_reads`] reports).
    fn note_direct_reads(&self, n: u64) {
        let _ = n;
    }
    /// Writes `bufs` one after the other from `offset`, as one write of
    /// their concatenation (what merged writes use). The default copies
    /// them into one buffer for [`Leaf::write_at`]; a file leaf hands the
    /// pieces to the kernel as they are.
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        self.write_at(&bufs.concat(), offset)
    }
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
    /// The file, shared with the writeback thread ([`KICK_BYTES`]).
    shared: Arc<Shared>,
    path: PathBuf,
    size: u64,
    /// The same file opened again for reads past the page cache
    /// (`O_DIRECT`), where the file system allows it; see [`DIRECT_ALIGN`].
    direct: Option<File>,
    /// Cleared for good when a direct read is refused (EINVAL, EOPNOTSUPP)
    /// where the same read through the page cache works (a file system that
    /// wants more than [`DIRECT_ALIGN`], or takes `O_DIRECT` at open but not
    /// in reads); a device's error leaves it set.
    direct_ok: AtomicBool,
    /// Reads that went past the page cache, for tests.
    direct_reads: AtomicU64,
    /// Bytes written since writeback was last asked for.
    unkicked: AtomicU64,
}

/// What the writeback thread needs of a leaf.
#[derive(Debug)]
struct Shared {
    file: File,
    /// Set while a start of its writeback waits in the thread's queue, so
    /// a leaf is queued at most once however fast it is written.
    queued: AtomicBool,
    /// How many times writeback was started, for tests.
    kicks: AtomicU64,
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
            // After the read-write open, so that both name the same file
            // (checked), and an overlay file system has copied it up first.
            direct: open_direct(path, &file),
            direct_ok: AtomicBool::new(true),
            direct_reads: AtomicU64::new(0),
            shared: Arc::new(Shared {
                file,
                queued: AtomicBool::new(false),
                kicks: AtomicU64::new(0),
            }),
            path: path.to_path_buf(),
            size,
            unkicked: AtomicU64::new(0),
        })
    }

    fn file(&self) -> &File {
        &self.shared.file
    }

    /// Whether reads may go past the page cache: the file system took
    /// `O_DIRECT` at open and no direct read has failed since.
    pub fn reads_direct(&self) -> bool {
        self.direct.is_some() && self.direct_ok.load(Ordering::Relaxed)
    }

    /// Counts `n` bytes written and, once [`KICK_BYTES`] have gathered
    /// since the last time, has the writeback thread start the kernel's
    /// writeback of the file.
    fn written(&self, n: usize) {
        let before = self.unkicked.fetch_add(n as u64, Ordering::Relaxed);
        // Only the writer that crosses the mark asks, and starts the count
        // again (what another writer adds in between is not counted: this
        // only times a hint).
        if before < KICK_BYTES && before + n as u64 >= KICK_BYTES {
            self.unkicked.store(0, Ordering::Relaxed);
            if !self.shared.queued.swap(true, Ordering::AcqRel) {
                kick(&self.shared);
            }
        }
    }
}

/// Alignment (of memory, length and offset) a read needs to go past the
/// kernel's page cache: the largest logical sector in common use, which
/// every Linux file system and block device that takes `O_DIRECT` accepts.
///
/// Why reads go past it at all: a merged read (a run of neighbouring blocks
/// on one device, [`crate::TopVdev::read_many`]) feeds a sequential reader
/// or read-ahead, and its blocks are verified and kept in tarn's own block
/// cache. Read through the page cache, the kernel first reads the disk into
/// its pages and then copies them into tarn's buffer: the copy was the
/// largest single cost of a cold 1 MiB stream (a sixth of the daemon's CPU),
/// and the same bytes sat in memory twice. A read of one block alone
/// ([`crate::TopVdev::read`]: a random read of one block of a file, a
/// reconstruction) stays buffered, so the page cache still backs tarn's
/// cache for those; a volume reads even a lone block as a batch (the guest
/// caches its own hot data).
///
/// Why it is safe: writes stay buffered, and the kernel writes back any
/// dirty pages in a direct read's range before reading it, so a direct read
/// returns what the last completed write put there, flushed or not (a test
/// in `tests/files.rs` checks it). Every block of a merged read is verified
/// against its checksum, and one that does not verify is read again alone,
/// buffered. A write-back error met by a direct read fails it; the kernel
/// keeps such errors per file with a cursor per open descriptor (since Linux
/// 4.14), so the write descriptor's next flush still reports it. On older
/// kernels a direct read could take that report away from the flush, so
/// they get no direct reads at all. Where the file system refuses
/// `O_DIRECT` (tmpfs before Linux 6.6), or refuses a direct read (EINVAL,
/// EOPNOTSUPP) that the page cache then serves, the leaf reads through the
/// page cache from then on; a device's error (EIO) fails the direct read
/// and leaves direct reads on.
pub const DIRECT_ALIGN: usize = 4096;

/// Whether a direct read failed because the file system refuses it (an
/// alignment, or direct reads at all), rather than because the device
/// failed: only then is the same read tried through the page cache and
/// direct reads turned off for the leaf.
fn refuses_direct(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP))
}

/// Opens `path` again, read-only, for reads past the page cache: none where
/// the platform, the kernel (see [`DIRECT_ALIGN`]) or the file system has no
/// such reads, or where `path` no longer names the file `file` has open.
#[cfg(target_os = "linux")]
fn open_direct(path: &Path, file: &File) -> Option<File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    // The kernel is asked once per process, not once per device.
    static KERNEL_OK: OnceLock<bool> = OnceLock::new();
    let kernel_ok = *KERNEL_OK.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .is_ok_and(|r| kernel_keeps_writeback_errors(&r))
    });
    if !kernel_ok {
        return None;
    }
    let direct = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()?;
    let (a, b) = (file.metadata().ok()?, direct.metadata().ok()?);
    (a.dev() == b.dev() && a.ino() == b.ino()).then_some(direct)
}

/// Elsewhere every read goes through the page cache.
#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path, _file: &File) -> Option<File> {
    None
}

/// Whether a Linux kernel of this release (`uname -r`) keeps write-back
/// errors for every open descriptor of a file (errseq, 4.14 and later), so
/// that a direct read cannot take one away from a later flush.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn kernel_keeps_writeback_errors(release: &str) -> bool {
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= (4, 14),
        _ => false,
    }
}

/// Bytes written to a file leaf between two starts of its writeback.
///
/// A txg writes its data with buffered writes and then flushes each leaf
/// (fdatasync). Left alone, the kernel holds the written pages in memory
/// until that flush, so the disk idles while the sync copies and hashes
/// and the sync then idles while the disk writes: a large sync took the
/// sum of the two. Starting writeback every `KICK_BYTES` (`sync_file_range`
/// with `SYNC_FILE_RANGE_WRITE`: it queues the dirty pages and does not
/// wait for them) overlaps the two, and the flush finds less left.
/// Durability does not change: nothing is called durable before the flush.
///
/// The call is made by one thread of its own (`tarn-writeback`), not by
/// the writer: queueing the pages is work (the file system allocates
/// their blocks and builds the I/O), and a writer that paid for a whole
/// sync's pages was, once in so many, an intent log commit (its blocks
/// written in place) whose `fsync` then waited for it. Made by the
/// writers, every 8 MiB, it raised the fsync p99 of 64k writes on a pool
/// with a log device by a sixth. Why 32 MiB and not 8: large syncs gain
/// a little more at 8, but the small syncs that run beside a stream of
/// `fsync`s then start it too, and the p99 of 4k writes with a log
/// device was a little higher; at 32 MiB they rarely reach it
/// (docs/performance.md).
const KICK_BYTES: u64 = 32 << 20;

/// Hands `leaf` to the writeback thread (started on first use); where no
/// thread can be started, starts its writeback here. The queue holds the
/// leaf weakly: a leaf dropped meanwhile (an export, a removed device)
/// closes its file at once, whatever the thread is doing.
fn kick(leaf: &Arc<Shared>) {
    static QUEUE: OnceLock<Option<mpsc::Sender<Weak<Shared>>>> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Weak<Shared>>();
        std::thread::Builder::new()
            .name("tarn-writeback".into())
            .spawn(move || {
                for leaf in rx {
                    let Some(leaf) = leaf.upgrade() else { continue };
                    // Cleared first: writes from here on may queue it again.
                    leaf.queued.store(false, Ordering::Release);
                    writeback(&leaf);
                }
            })
            .ok()
            .map(|_| tx)
    });
    let sent = queue
        .as_ref()
        .is_some_and(|q| q.send(Arc::downgrade(leaf)).is_ok());
    if !sent {
        leaf.queued.store(false, Ordering::Release);
        writeback(leaf);
    }
}

/// Starts the writeback of one leaf's file and counts it.
fn writeback(leaf: &Shared) {
    // A hint: an error of the writeback it starts is recorded for the
    // file and reported by the next flush, which every txg and intent log
    // commit waits for. (Only because this call does not wait: with a
    // `SYNC_FILE_RANGE_WAIT_*` flag it would itself take that report,
    // shared by every descriptor of the open file, and the flush would
    // then succeed.)
    let _ = start_writeback(&leaf.file);
    leaf.kicks.fetch_add(1, Ordering::Release);
}

/// Queues the file's dirty pages for writing, without waiting for them.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a syscall on a descriptor `file` keeps open for the call; it
    // takes no pointers. Offset 0 and length 0 mean the whole file.
    let r = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Elsewhere the flush alone writes the pages.
#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File) -> io::Result<()> {
    Ok(())
}

/// Most buffers one `pwritev` takes (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// Writes every byte of `bufs`, in order, from `offset` with `pwritev`,
/// going on after short writes and interruptions.
fn write_vectored_all(file: &File, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut iov: Vec<libc::iovec> = bufs
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    let (mut first, mut at) = (0usize, offset);
    while first < iov.len() {
        let count = (iov.len() - first).min(IOV_MAX);
        let pos = libc::off_t::try_from(at)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        // SAFETY: `iov[first..first + count]` describes live byte slices
        // borrowed from `bufs` for the whole call (a partly written one is
        // advanced within its own slice below); pwritev only reads them,
        // and the fd stays open while `file` is borrowed.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov[first..].as_ptr(),
                count as libc::c_int,
                pos,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        at += n as u64;
        first = advance(&mut iov, first, n as usize);
    }
    Ok(())
}

/// Moves past `n` written bytes of `iov` from buffer `first` on: whole
/// buffers are skipped, a partly written one starts after what was
/// written. Returns the first buffer with bytes left.
fn advance(iov: &mut [libc::iovec], mut first: usize, n: usize) -> usize {
    let mut left = n;
    while left > 0 && first < iov.len() {
        let v = &mut iov[first];
        if left >= v.iov_len {
            left -= v.iov_len;
            first += 1;
        } else {
            // SAFETY: `left < iov_len`, so the advanced pointer stays
            // inside the same slice.
            v.iov_base = unsafe { (v.iov_base as *mut u8).add(left) } as *mut libc::c_void;
            v.iov_len -= left;
            left = 0;
        }
    }
    first
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
        self.file().read_exact_at(buf, offset)
    }

    fn read_direct_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len(), self.size)?;
        let aligned = (buf.as_ptr() as usize | buf.len()).is_multiple_of(DIRECT_ALIGN)
            && offset.is_multiple_of(DIRECT_ALIGN as u64);
        if let Some(f) = self
            .direct
            .as_ref()
            .filter(|_| aligned && self.reads_direct())
        {
            match f.read_exact_at(buf, offset) {
                Ok(()) => {
                    self.direct_reads.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                // The device's error, not a refusal of direct reads: the
                // caller's to handle (a merged read's blocks are read again
                // alone, and an error that read gets past is counted), and
                // direct reads stay on.
                Err(e) if !refuses_direct(&e) => return Err(e),
                Err(_) => {}
            }
            // The whole buffer again, through the page cache. If that
            // works, the direct path is what failed (an alignment this file
            // system refuses, a file system that takes `O_DIRECT` at open
            // but not in reads): read buffered from now on. If it fails
            // too, the device did, and that is the error.
            self.file().read_exact_at(buf, offset)?;
            self.direct_ok.store(false, Ordering::Relaxed);
            return Ok(());
        }
        self.file().read_exact_at(buf, offset)
    }

    fn direct_reads(&self) -> u64 {
        self.direct_reads.load(Ordering::Relaxed)
    }

    fn direct_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.direct
            .as_ref()
            .filter(|_| self.reads_direct())
            .map(|f| f.as_raw_fd())
    }

    fn note_direct_reads(&self, n: u64) {
        self.direct_reads.fetch_add(n, Ordering::Relaxed);
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        // Refuse to grow a regular file: the size is part of the geometry.
        check_range(offset, buf.len(), self.size)?;
        self.file().write_all_at(buf, offset)?;
        self.written(buf.len());
        Ok(())
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        check_range(offset, total, self.size)?;
        write_vectored_all(self.file(), bufs, offset)?;
        self.written(total);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.file().sync_data()
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
    fn kernel_releases_with_writeback_errors_per_descriptor() {
        for (release, ok) in [
            ("6.12.57+deb13-amd64\n", true),
            ("4.14.0", true),
            ("5.4.0-150-generic", true),
            ("4.13.16", false),
            ("3.10.0-1160.el7.x86_64", false),
            ("10.0", true),
            ("", false),
            ("garbage", false),
        ] {
            assert_eq!(kernel_keeps_writeback_errors(release), ok, "{release:?}");
        }
    }

    /// Only a refusal (an alignment, direct reads not taken) sends a
    /// direct read through the page cache and turns direct reads off; a
    /// device's error (EIO, a short read) is the caller's, and direct reads
    /// stay on: one moment of trouble must not slow the leaf for good, nor
    /// hide the error from its counters.
    #[test]
    fn only_a_refusal_turns_direct_reads_off() {
        let os = io::Error::from_raw_os_error;
        assert!(refuses_direct(&os(libc::EINVAL)));
        assert!(refuses_direct(&os(libc::EOPNOTSUPP)));
        assert!(!refuses_direct(&os(libc::EIO)));
        assert!(!refuses_direct(&os(libc::ENODATA)));
        assert!(!refuses_direct(&io::Error::from(
            io::ErrorKind::UnexpectedEof
        )));
    }

    /// Aligned reads go past the page cache (where the file system takes
    /// `O_DIRECT`); misaligned ones go through it; both return the bytes
    /// written, unflushed.
    #[test]
    fn direct_reads_only_when_aligned() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d0");
        File::create(&p).unwrap().set_len(1 << 20).unwrap();
        let leaf = FileLeaf::open(&p).unwrap();
        let data: Vec<u8> = (0..3 * DIRECT_ALIGN).map(|i| (i % 251) as u8).collect();
        leaf.write_at(&data, DIRECT_ALIGN as u64).unwrap();
        let mut mem = vec![0u8; 5 * DIRECT_ALIGN];
        let start = mem.as_ptr().align_offset(DIRECT_ALIGN);
        assert!(start < DIRECT_ALIGN);
        let direct = leaf.reads_direct();
        // Aligned memory, length and offset.
        let buf = &mut mem[start..start + 2 * DIRECT_ALIGN];
        leaf.read_direct_at(buf, DIRECT_ALIGN as u64).unwrap();
        assert_eq!(buf, &data[..2 * DIRECT_ALIGN]);
        assert_eq!(leaf.direct_reads(), u64::from(direct));
        // Misaligned memory, offset or length: buffered.
        for (at, skip, len) in [
            (start + 1, 0, DIRECT_ALIGN),
            (start, 512, DIRECT_ALIGN),
            (start, 0, DIRECT_ALIGN + 512),
        ] {
            let buf = &mut mem[at..at + len];
            leaf.read_direct_at(buf, (DIRECT_ALIGN + skip) as u64)
                .unwrap();
            assert_eq!(buf, &data[skip..skip + len]);
        }
        assert_eq!(leaf.direct_reads(), u64::from(direct));
        // Past the end: an error, whichever way.
        let buf = &mut mem[start..start + 2 * DIRECT_ALIGN];
        assert!(leaf
            .read_direct_at(buf, (1 << 20) - DIRECT_ALIGN as u64)
            .is_err());
    }

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
    fn vectored_writes_land_as_their_concatenation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d0");
        File::create(&p).unwrap().set_len(4 << 20).unwrap();
        let leaf = FileLeaf::open(&p).unwrap();
        // Pieces of many sizes, empty ones among them, and more pieces
        // than one pwritev takes.
        let pieces: Vec<Vec<u8>> = (0..3000usize)
            .map(|i| vec![(i % 251) as u8; [0, 1, 7, 4096, 33][i % 5]])
            .collect();
        let bufs: Vec<&[u8]> = pieces.iter().map(|p| &p[..]).collect();
        let whole = bufs.concat();
        leaf.write_vectored_at(&bufs, 12_345).unwrap();
        let mut back = vec![0u8; whole.len()];
        leaf.read_at(&mut back, 12_345).unwrap();
        assert!(
            back == whole,
            "the file holds other bytes than the pieces in order"
        );
        let mut before = [9u8; 1];
        leaf.read_at(&mut before, 12_344).unwrap();
        assert_eq!(before, [0], "a byte before the write changed");
        // Past the end: refused whole, nothing written.
        let tail = [&[1u8; 10][..], &[2u8; 10][..]];
        assert!(leaf.write_vectored_at(&tail, (4 << 20) - 15).is_err());
        let mut b = [9u8; 15];
        leaf.read_at(&mut b, (4 << 20) - 15).unwrap();
        assert_eq!(b, [0u8; 15]);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 4 << 20);
    }

    #[test]
    fn advancing_past_a_short_write_leaves_exactly_the_rest() {
        let pieces: [&[u8]; 4] = [b"abc", b"", b"defgh", b"ij"];
        let whole = pieces.concat();
        for n in 0..=whole.len() {
            let mut iov: Vec<libc::iovec> = pieces
                .iter()
                .map(|b| libc::iovec {
                    iov_base: b.as_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                })
                .collect();
            let first = advance(&mut iov, 0, n);
            let mut rest = Vec::new();
            for v in &iov[first..] {
                // SAFETY: each iovec still points inside one of `pieces`,
                // with its length left (what `advance` promises).
                rest.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
                });
            }
            assert_eq!(rest, &whole[n..], "after {n} bytes");
        }
    }

    #[test]
    fn writeback_starts_every_kick_bytes_and_changes_no_byte() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d0");
        File::create(&p).unwrap().set_len(4 * KICK_BYTES).unwrap();
        let leaf = FileLeaf::open(&p).unwrap();
        // The call itself succeeds on a regular file.
        start_writeback(leaf.file()).unwrap();
        let kicks = || leaf.shared.kicks.load(Ordering::Acquire);
        // Waits for the writeback thread to have started `n` in all.
        let wait_for = |n: u64| {
            let t0 = std::time::Instant::now();
            while kicks() < n && t0.elapsed() < std::time::Duration::from_secs(20) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(kicks(), n, "writeback starts");
        };
        let chunk = 1 << 20;
        let mut at = 0;
        let mut i = 0u8;
        let mut write = |len: usize| {
            let piece = vec![i; len];
            if i.is_multiple_of(2) {
                leaf.write_at(&piece, at as u64).unwrap();
            } else {
                let (a, b) = piece.split_at(piece.len() / 3);
                leaf.write_vectored_at(&[a, b], at as u64).unwrap();
            }
            at += len;
            i = i.wrapping_add(1);
        };
        for round in 1..=3u64 {
            // Short of the mark: nothing starts.
            for _ in 0..KICK_BYTES as usize / chunk - 1 {
                write(chunk);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert_eq!(kicks(), round - 1, "started before {KICK_BYTES} bytes");
            // The write that reaches it starts one.
            write(chunk);
            wait_for(round);
        }
        write(chunk / 2);
        assert_eq!(leaf.unkicked.load(Ordering::Relaxed), (chunk / 2) as u64);
        assert!(!leaf.shared.queued.load(Ordering::Acquire));
        leaf.flush().unwrap();
        let total = 3 * KICK_BYTES as usize + chunk / 2;
        let mut back = vec![0u8; total];
        leaf.read_at(&mut back, 0).unwrap();
        for (n, c) in back.chunks(chunk).enumerate() {
            assert!(c.iter().all(|&b| b == n as u8), "chunk {n} changed");
        }
    }

    #[test]
    fn file_leaf_open_missing_is_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = FileLeaf::open(&dir.path().join("nope")).unwrap_err();
        assert!(matches!(e, VdevError::Io { op: "open", .. }), "{e}");
    }
}
