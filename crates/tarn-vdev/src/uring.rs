//! Many reads at once from one thread: the runs of a merged read
//! ([`crate::TopVdev::read_many`]) submitted together through `io_uring`.
//!
//! # Why
//!
//! A merged read of a fragmented volume is a few dozen short direct reads
//! spread over the children. Read with a blocking `pread` each, a child's
//! runs follow one another (the device sees one of them at a time per
//! child), and every one puts its thread to sleep and wakes it again; the
//! children's reads also had to be handed to threads of their own to
//! overlap. Submitted together, every run of every child is in flight at
//! once, and the thread that asked sleeps once, until the last is done.
//!
//! # Soundness
//!
//! The kernel writes into a read's buffer until the read completes, so a
//! buffer must outlive its read. [`read_all`] holds a `&mut` to every
//! buffer it submits and does not return while any of them is in flight:
//! it waits for every completion of a chunk before the next chunk or the
//! return. If waiting ever fails for a reason that is not transient (which
//! a ring that was set up cannot do: interruptions and a busy kernel are
//! retried), the buffers still in flight are leaked (swapped for fresh
//! ones, which the caller then reads into the usual way) and so is the
//! ring, so the memory the kernel may still write stays allocated for
//! good; the process reads without a ring from then on. Each thread has a
//! ring of its own and waits only for its own reads, so no completion is
//! ever taken by another thread.
//!
//! # Where there is no ring
//!
//! A kernel without `io_uring`, or one that refuses it (seccomp, the
//! `io_uring_disabled` setting), fails the first ring's setup, and one
//! whose rings cannot read yet (before 5.6) fails its probe; the process
//! remembers and reads as before, a blocking read per run. A setup that
//! fails for now (no descriptor or locked memory left) leaves that batch
//! and the thread's next [`BACK_OFF`] to blocking reads before it tries
//! again: on kernels before 5.12 a ring's memory counts against the
//! locked-memory limit (64 KiB on many systems, about five rings), and the
//! threads past it would otherwise pay a failing setup on every batch.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use io_uring::{opcode, types, IoUring};

use crate::batch::{run_buffer, RunBuf};

/// Submissions a ring takes at once; larger batches go in chunks. A
/// merged 1 MiB read of a fragmented volume on raidz1 of four is about
/// forty runs.
const ENTRIES: u32 = 64;

/// Set when a ring could not be set up (or broke): from then on every
/// thread reads without one.
static UNAVAILABLE: AtomicBool = AtomicBool::new(false);

/// Batches a thread reads without a ring after its ring's setup failed
/// for now (see the module docs).
const BACK_OFF: u32 = 1024;

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
    /// Batches this thread still leaves to blocking reads before trying to
    /// set its ring up again.
    static SKIP: Cell<u32> = const { Cell::new(0) };
}

#[cfg(any(test, feature = "testing"))]
thread_local! {
    /// Makes this thread's ring setups fail for now, as out of locked
    /// memory (tests of the back-off).
    static FAIL_SETUP: Cell<bool> = const { Cell::new(false) };
    /// Ring setups this thread has tried.
    static SETUPS: Cell<u64> = const { Cell::new(0) };
}

#[cfg(any(test, feature = "testing"))]
thread_local! {
    /// Reads this thread's rings completed, for tests that must know the
    /// batched path ran (a merged read submits from the caller's thread).
    static COMPLETED: Cell<u64> = const { Cell::new(0) };
}

/// One read of [`read_all`]: `buf`'s bytes from `fd` at `off`. `done` is
/// what it returned (bytes read, or the error) and when it was seen to
/// complete, `None` if it was not run.
pub(crate) struct Read<'a> {
    pub fd: RawFd,
    pub off: u64,
    pub buf: &'a mut RunBuf,
    pub done: Option<(io::Result<usize>, Instant)>,
}

/// Whether rings can be used in this process (false once the kernel
/// refused one).
pub(crate) fn available() -> bool {
    !UNAVAILABLE.load(Ordering::Relaxed)
}

/// How many reads this thread's rings have completed.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn completed() -> u64 {
    COMPLETED.with(|c| c.get())
}

/// A ring that reads: set up, and the kernel knows `IORING_OP_READ`
/// (kernels 5.1 to 5.5 set rings up without it, and would fail every
/// read). `Err(true)` where the kernel has no such rings or refuses them
/// (for good), `Err(false)` where setting one up failed for now (out of
/// descriptors or locked memory).
fn new_ring() -> Result<IoUring, bool> {
    #[cfg(any(test, feature = "testing"))]
    {
        SETUPS.with(|n| n.set(n.get() + 1));
        if FAIL_SETUP.with(Cell::get) {
            return Err(false);
        }
    }
    let ring = IoUring::new(ENTRIES).map_err(|e| {
        matches!(
            e.raw_os_error(),
            Some(libc::ENOSYS | libc::EPERM | libc::EINVAL | libc::EOPNOTSUPP)
        )
    })?;
    let mut probe = io_uring::Probe::new();
    match ring.submitter().register_probe(&mut probe) {
        Ok(()) if probe.is_supported(opcode::Read::CODE) => Ok(ring),
        _ => Err(true),
    }
}

/// Runs every read of `reads` at once on this thread's ring, filling in
/// `done` of each it ran; reads left with `done` of `None` are for the
/// caller to run another way. Returns false, having run none, where there
/// is no ring.
pub(crate) fn read_all(reads: &mut [Read<'_>]) -> bool {
    if !available() {
        return false;
    }
    RING.try_with(|cell| {
        // Never reentered (nothing below calls back); if it were, the
        // caller reads the usual way.
        let Ok(mut slot) = cell.try_borrow_mut() else {
            return false;
        };
        if slot.is_none() {
            let backing_off = SKIP.with(|s| {
                let n = s.get();
                s.set(n.saturating_sub(1));
                n > 0
            });
            if backing_off {
                return false;
            }
            match new_ring() {
                Ok(ring) => *slot = Some(ring),
                Err(for_good) => {
                    if for_good {
                        UNAVAILABLE.store(true, Ordering::Relaxed);
                    } else {
                        SKIP.with(|s| s.set(BACK_OFF));
                    }
                    return false;
                }
            }
        }
        let Some(ring) = slot.as_mut() else {
            return false;
        };
        for chunk in reads.chunks_mut(ENTRIES as usize) {
            if !run_chunk(ring, chunk) {
                // The ring broke with reads in flight: `run_chunk` leaked
                // their buffers; the ring goes too (closing it would not
                // wait for them), and with it every later ring.
                if let Some(ring) = slot.take() {
                    std::mem::forget(ring);
                }
                UNAVAILABLE.store(true, Ordering::Relaxed);
                break;
            }
        }
        true
    })
    // A thread being torn down has no ring left to use.
    .unwrap_or(false)
}

/// Ends the process if dropped while unwinding: a panic between a
/// submission and its completion would free buffers the kernel is still
/// writing into (nothing there can panic; this keeps it so).
struct NoUnwind;

impl Drop for NoUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("tarn: a panic while reads were in flight in the kernel; stopping");
            std::process::abort();
        }
    }
}

/// Submits `chunk` (at most [`ENTRIES`]) and waits for all of it. False if
/// the ring failed with reads in flight, whose buffers it has leaked.
fn run_chunk(ring: &mut IoUring, chunk: &mut [Read<'_>]) -> bool {
    // The length of each entry in flight (taken before the kernel owns
    // its buffer), `None` for those not submitted.
    let mut waiting: Vec<Option<usize>> = vec![None; chunk.len()];
    let guard = NoUnwind;
    {
        let mut sq = ring.submission();
        for (i, r) in chunk.iter_mut().enumerate() {
            let b = r.buf.get_mut();
            let Ok(len) = u32::try_from(b.len()) else {
                continue;
            };
            let e = opcode::Read::new(types::Fd(r.fd), b.as_mut_ptr(), len)
                .offset(r.off)
                .build()
                .user_data(i as u64);
            // SAFETY: the entry points into `r.buf`, which the caller lends
            // us mutably until we return, and we return only after its read
            // completed (or after leaking the buffer, below; `NoUnwind`
            // stops the process rather than unwind in between); `r.fd` is
            // open for as long, the caller holding the leaf it belongs to.
            if unsafe { sq.push(&e) }.is_err() {
                // The queue is full (never: it is drained before every
                // chunk, and a chunk fits); the rest is left to the caller.
                break;
            }
            waiting[i] = Some(len as usize);
        }
    }
    let mut inflight = waiting.iter().flatten().count();
    while inflight > 0 {
        match ring.submit_and_wait(inflight) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => {
                // The kernel is short of something for now.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(_) => {
                for (w, r) in waiting.iter().zip(chunk.iter_mut()) {
                    if let Some(len) = *w {
                        std::mem::forget(std::mem::replace(r.buf, run_buffer(len)));
                    }
                }
                std::mem::forget(guard);
                return false;
            }
        }
        let now = Instant::now();
        for cqe in ring.completion() {
            let i = cqe.user_data() as usize;
            let Some(w) = waiting.get_mut(i).filter(|w| w.is_some()) else {
                continue;
            };
            *w = None;
            inflight -= 1;
            #[cfg(any(test, feature = "testing"))]
            COMPLETED.with(|c| c.set(c.get() + 1));
            let res = cqe.result();
            if let Some(r) = chunk.get_mut(i) {
                r.done = Some((
                    if res >= 0 {
                        Ok(res as usize)
                    } else {
                        Err(io::Error::from_raw_os_error(-res))
                    },
                    now,
                ));
            }
        }
    }
    std::mem::forget(guard);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;

    /// A file of `len` bytes whose every 8-byte word is its own offset, and a
    /// descriptor of it that reads past the page cache where the file
    /// system allows (else a plain one: the ring reads either).
    fn file(len: usize) -> (tempfile::NamedTempFile, std::fs::File) {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        let bytes: Vec<u8> = (0..len as u64 / 8)
            .flat_map(|w| (w * 8).to_le_bytes())
            .collect();
        f.write_all(&bytes).expect("written");
        f.flush().expect("flushed");
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(f.path())
            .or_else(|_| std::fs::File::open(f.path()))
            .expect("opened");
        (f, direct)
    }

    /// An aligned buffer of the tests' own: the kept run buffers are
    /// another test's to count.
    fn buffer(len: usize) -> RunBuf {
        RunBuf::aligned(len)
    }

    fn expected(off: u64, len: usize) -> Vec<u8> {
        (off / 8..(off + len as u64) / 8)
            .flat_map(|w| (w * 8).to_le_bytes())
            .collect()
    }

    /// More reads than a ring takes at once, of sizes and places that
    /// differ, each comes back whole and in its own buffer.
    #[test]
    fn every_read_comes_back_in_its_own_buffer() {
        use std::os::fd::AsRawFd;
        let (_keep, f) = file(8 << 20);
        let n = 2 * ENTRIES as usize + 7;
        let places: Vec<(u64, usize)> = (0..n as u64)
            .map(|i| {
                (
                    ((i * 7919) % 2000) * 4096,
                    4096 * (1 + (i as usize * 13) % 16),
                )
            })
            .collect();
        let mut bufs: Vec<RunBuf> = places.iter().map(|&(_, len)| buffer(len)).collect();
        let mut reads: Vec<Read<'_>> = places
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&(off, _), buf)| Read {
                fd: f.as_raw_fd(),
                off,
                buf,
                done: None,
            })
            .collect();
        let before = completed();
        if !read_all(&mut reads) {
            // No ring here (or none for now): nothing was run.
            assert!(reads.iter().all(|r| r.done.is_none()));
            return;
        }
        for (r, &(off, len)) in reads.iter().zip(&places) {
            assert!(
                matches!(r.done, Some((Ok(got), _)) if got == len),
                "{:?}",
                r.done
            );
            assert!(r.buf.get() == &expected(off, len)[..], "read at {off}");
        }
        assert!(completed() - before >= n as u64);
    }

    /// A thread whose ring could not be set up for now leaves its next
    /// [`BACK_OFF`] batches to blocking reads without trying again, then
    /// tries once more.
    #[test]
    fn a_setup_that_failed_for_now_is_not_tried_on_every_batch() {
        use std::os::fd::AsRawFd;
        let (_keep, f) = file(64 << 10);
        let fd = f.as_raw_fd();
        // A thread of its own: no ring yet, and the failure stays its own.
        std::thread::spawn(move || {
            let mut buf = buffer(4096);
            let batch = |buf: &mut RunBuf| {
                let mut reads = vec![Read {
                    fd,
                    off: 0,
                    buf,
                    done: None,
                }];
                let ran = read_all(&mut reads);
                assert_eq!(ran, reads[0].done.is_some());
                ran
            };
            let setups = || SETUPS.with(Cell::get);
            FAIL_SETUP.with(|f| f.set(true));
            let before = setups();
            assert!(!batch(&mut buf));
            if !available() {
                // No rings on this machine at all: nothing to back off from.
                return;
            }
            assert_eq!(setups(), before + 1);
            FAIL_SETUP.with(|f| f.set(false));
            for _ in 0..BACK_OFF {
                assert!(!batch(&mut buf));
            }
            assert_eq!(setups(), before + 1, "tried again while backing off");
            if !available() {
                // Another test met a ring that broke: no rings from now on.
                return;
            }
            batch(&mut buf);
            assert_eq!(setups(), before + 2, "never tried again");
        })
        .join()
        .expect("the test thread");
    }

    /// A read that runs past the end of the file comes back short, not
    /// whole: the caller must not take its buffer's tail as read.
    #[test]
    fn a_read_past_the_end_comes_back_short() {
        use std::os::fd::AsRawFd;
        let (_keep, f) = file(64 << 10);
        let (mut a, mut b) = (buffer(8192), buffer(8192));
        let mut reads = vec![
            Read {
                fd: f.as_raw_fd(),
                off: (64 << 10) - 4096,
                buf: &mut a,
                done: None,
            },
            Read {
                fd: f.as_raw_fd(),
                off: 0,
                buf: &mut b,
                done: None,
            },
        ];
        if !read_all(&mut reads) {
            assert!(reads.iter().all(|r| r.done.is_none()));
            return;
        }
        assert!(
            matches!(reads[0].done, Some((Ok(4096), _))),
            "{:?}",
            reads[0].done
        );
        assert!(
            matches!(reads[1].done, Some((Ok(8192), _))),
            "{:?}",
            reads[1].done
        );
        assert!(reads[1].buf.get() == &expected(0, 8192)[..]);
    }
}
