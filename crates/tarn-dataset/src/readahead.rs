//! Read-ahead: sequential readers are detected per file (or per volume),
//! and the blocks they will ask for next are read into the block cache
//! before they ask. Shared by the POSIX layer (`tarn-fs`, per file) and
//! block volumes (`tarn-vol`, one stream table per volume).
//!
//! # Theory
//!
//! A reader streaming a file (a copy, a video, a backup) asks for one
//! piece after the other; each piece that misses the cache costs a disk
//! read and a checksum while the reader waits. Reading the next records
//! ahead, on other threads, overlaps that work with the reader's own and
//! keeps several disk reads in flight.
//!
//! **Detection.** Each file keeps up to [`STREAMS_PER_FILE`] streams: where
//! a reader is expected next, how far ahead it has been read, and how far
//! to read ahead (the window). A read near a stream's next offset (within
//! four times the read's length: FUSE and NFS clients keep
//! several reads of one file in flight and they may arrive out of order;
//! but a stream's second read must follow its first exactly, so random
//! reads rarely pass for a stream) continues it: the window doubles, up to [`max_window`], and the range
//! between what was read ahead and the new target is returned for
//! read-ahead. A read that continues no stream starts one and reads
//! nothing ahead, so random reads never cause read-ahead; only the second
//! read in sequence does. At most [`MAX_FILES`] files are tracked; the
//! least recently read is forgotten first.
//!
//! **What runs where.** The caller turns the range into block references
//! inside the reader's transaction ([`crate::BlockRef::prefetch`] in a
//! [`Prefetch`] job; `tarn-fs`'s `file::prefetch_plan`), each holding its txg
//! so the block's space cannot be reused, and the reads run on a few
//! worker threads of the process through a bounded queue. When the queue
//! is full, read-ahead is dropped: it is advice, never owed. A block read
//! ahead enters the cache marked as such (no credit, see
//! `tarn_block::cache`), so read-ahead a reader never uses costs only
//! memory, and a failed or damaged read ahead is left for the reader's own
//! read to repair or report: read-ahead never reports anything.
//!
//! **Correctness.** Read-ahead only fills the cache, whose keys name a
//! block's exact contents; a reader still looks every block up in its own
//! transaction. So whatever happens to the file meanwhile (a write, a
//! truncate, a rollback), read-ahead cannot make a reader see stale bytes.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};

use std::sync::MutexGuard;

/// A read of a block into the block cache ahead of its reader, found
/// inside a transaction and run after it on a read-ahead worker.
pub type Prefetch = Box<dyn FnOnce() + Send>;

/// Locks `m`, taking the data of a poisoned lock as it is: the tables
/// here are advice, always consistent between statements.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Streams kept per file (several readers of one file, or one reader
/// going back and forth).
pub const STREAMS_PER_FILE: usize = 4;
/// Files whose streams are kept.
pub const MAX_FILES: usize = 256;
/// Smallest window: what the second sequential read reads ahead.
const MIN_WINDOW: u64 = 256 << 10;
/// Read-ahead jobs waiting for a worker; more are dropped.
const QUEUE: usize = 64;
/// Worker threads reading ahead for the whole process.
const WORKERS: usize = 4;

/// The largest window for records of `record` bytes: 8 MiB or eight
/// records, at most 64 MiB.
pub fn max_window(record: u64) -> u64 {
    (8u64 << 20).max(record.saturating_mul(8)).min(64 << 20)
}

#[derive(Clone, Copy, Debug)]
struct Stream {
    /// Where the reader is expected next.
    next: u64,
    /// Everything below this was read ahead (or read).
    ahead: u64,
    /// How far beyond `next` to read ahead.
    window: u64,
    /// Clock of the last read that continued or started it.
    used: u64,
    /// Reads that continued it.
    hits: u64,
}

#[derive(Default)]
struct Files {
    by_file: HashMap<(u64, u64), Vec<Stream>>,
    clock: u64,
}

/// Sequential-read detection for one filesystem or volume (see the
/// module docs).
#[derive(Default)]
pub struct ReadAhead {
    files: Mutex<Files>,
}

impl ReadAhead {
    /// Notes a read of `len` bytes at `off` of `file` (a snapshot slot and
    /// an inode) with records of `record` bytes, and returns the range to
    /// read ahead now, if any.
    pub fn on_read(&self, file: (u64, u64), off: u64, len: u64, record: u64) -> Option<Range<u64>> {
        if len == 0 {
            return None;
        }
        let end = off.saturating_add(len);
        let mut f = lock(&self.files);
        f.clock += 1;
        let now = f.clock;
        if !f.by_file.contains_key(&file) && f.by_file.len() >= MAX_FILES {
            let oldest = f
                .by_file
                .iter()
                .min_by_key(|(_, s)| s.iter().map(|s| s.used).max().unwrap_or(0))
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                f.by_file.remove(&k);
            }
        }
        let streams = f.by_file.entry(file).or_default();
        // A new stream continues only with the read right after its first
        // one; an established one also with reads a little out of order.
        let near = |s: &Stream| {
            if s.hits == 0 {
                return off == s.next;
            }
            let slack = len.saturating_mul(4);
            off <= s.next.saturating_add(slack) && end.saturating_add(slack) >= s.next
        };
        match streams.iter_mut().find(|s| near(s)) {
            Some(s) => {
                s.used = now;
                s.hits += 1;
                s.next = s.next.max(end);
                s.window = s.window.saturating_mul(2).min(max_window(record));
                let from = s.ahead.max(s.next);
                let to = s.next.saturating_add(s.window);
                if to <= from {
                    return None;
                }
                s.ahead = to;
                Some(from..to)
            }
            None => {
                if streams.len() >= STREAMS_PER_FILE {
                    if let Some(i) = (0..streams.len()).min_by_key(|&i| streams[i].used) {
                        streams.swap_remove(i);
                    }
                }
                streams.push(Stream {
                    next: end,
                    ahead: end,
                    window: MIN_WINDOW.max(record).min(max_window(record)),
                    used: now,
                    hits: 0,
                });
                None
            }
        }
    }

    /// Forgets what was learned of `file` (removed, or its blocks changed
    /// wholesale).
    pub fn forget(&self, file: (u64, u64)) {
        lock(&self.files).by_file.remove(&file);
    }

    /// Files tracked now (for tests of the bound).
    #[cfg(test)]
    fn files(&self) -> usize {
        lock(&self.files).by_file.len()
    }
}

/// The process's read-ahead workers: a bounded queue and [`WORKERS`]
/// threads, started on first use. `None` if no thread could be started.
fn workers() -> Option<&'static SyncSender<Prefetch>> {
    static W: OnceLock<Option<SyncSender<Prefetch>>> = OnceLock::new();
    W.get_or_init(|| {
        let (tx, rx) = sync_channel::<Prefetch>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for i in 0..WORKERS {
            let rx = rx.clone();
            let ok = std::thread::Builder::new()
                .name(format!("tarn-readahead-{i}"))
                .spawn(move || work(&rx))
                .is_ok();
            started += usize::from(ok);
        }
        (started > 0).then_some(tx)
    })
    .as_ref()
}

fn work(rx: &Mutex<Receiver<Prefetch>>) {
    loop {
        // The lock is held only to take one job, never while it runs.
        let job = lock(rx).recv();
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

/// Hands read-ahead jobs to the workers; those that do not fit in the
/// queue are dropped (with the holds they carry). Returns how many were
/// queued.
pub fn submit(jobs: Vec<Prefetch>) -> usize {
    let Some(tx) = workers() else { return 0 };
    let mut queued = 0;
    for job in jobs {
        match tx.try_send(job) {
            Ok(()) => queued += 1,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => break,
        }
    }
    queued
}

#[cfg(test)]
mod tests {
    use super::*;

    const REC: u64 = 128 << 10;

    #[test]
    fn a_second_sequential_read_reads_ahead_and_the_window_grows() {
        let ra = ReadAhead::default();
        let f = (0, 7);
        assert_eq!(ra.on_read(f, 0, REC, REC), None, "one read is no stream");
        let r = ra
            .on_read(f, REC, REC, REC)
            .expect("second read in sequence");
        assert_eq!(r, 2 * REC..2 * REC + 2 * MIN_WINDOW);
        // Each next read extends what was read ahead, never re-reads it.
        let mut ahead = r.end;
        let mut widest = 0;
        for i in 2..200u64 {
            if let Some(r) = ra.on_read(f, i * REC, REC, REC) {
                assert_eq!(r.start, ahead, "read {i}");
                assert!(r.end > r.start);
                ahead = r.end;
            }
            widest = widest.max(ahead - (i + 1) * REC);
        }
        assert_eq!(widest, max_window(REC));
    }

    #[test]
    fn random_reads_never_read_ahead() {
        let ra = ReadAhead::default();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // 4 KiB reads anywhere in a 64 GiB file.
            let off = (x % (64 << 30)) & !4095;
            assert_eq!(ra.on_read((0, 1), off, 4096, REC), None, "at {off}");
        }
    }

    #[test]
    fn interleaved_readers_of_one_file_each_keep_their_stream() {
        let ra = ReadAhead::default();
        let f = (0, 3);
        let (a, b) = (0u64, 10u64 << 30);
        let mut got = (0, 0);
        for i in 0..32 {
            got.0 += ra
                .on_read(f, a + i * REC, REC, REC)
                .map_or(0, |r| r.end - r.start);
            got.1 += ra
                .on_read(f, b + i * REC, REC, REC)
                .map_or(0, |r| r.end - r.start);
        }
        assert!(got.0 >= 31 * REC && got.1 >= 31 * REC, "{got:?}");
    }

    #[test]
    fn reads_out_of_order_within_the_window_continue_the_stream() {
        let ra = ReadAhead::default();
        let f = (0, 9);
        let order = [0u64, 2, 1, 3, 5, 4, 6, 8, 7, 9];
        let mut ahead = 0;
        for i in order {
            if let Some(r) = ra.on_read(f, i * REC, REC, REC) {
                ahead = r.end;
            }
        }
        assert!(ahead >= 10 * REC + MIN_WINDOW, "read ahead to {ahead}");
    }

    #[test]
    fn the_tables_are_bounded() {
        let ra = ReadAhead::default();
        for ino in 0..(MAX_FILES as u64 * 3) {
            ra.on_read((0, ino), 0, REC, REC);
        }
        assert_eq!(ra.files(), MAX_FILES);
        // The most recent file is kept, and one more stream per file than
        // allowed forgets the oldest.
        let f = (0, MAX_FILES as u64 * 3 - 1);
        for s in 0..=STREAMS_PER_FILE as u64 {
            ra.on_read(f, s << 30, REC, REC);
        }
        assert_eq!(ra.on_read(f, REC, REC, REC), None, "stream 0 was forgotten");
        ra.forget(f);
        assert_eq!(ra.files(), MAX_FILES - 1);
    }

    #[test]
    fn submitted_jobs_run_on_the_workers() {
        let (tx, rx) = std::sync::mpsc::channel();
        let jobs: Vec<Prefetch> = (0..8)
            .map(|i| {
                let tx = tx.clone();
                Box::new(move || {
                    let _ = tx.send((i, std::thread::current().name().map(String::from)));
                }) as Prefetch
            })
            .collect();
        let queued = submit(jobs);
        assert!(queued > 0);
        for _ in 0..queued {
            let (_, name) = rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .expect("a queued job ran");
            assert!(name.unwrap_or_default().starts_with("tarn-readahead-"));
        }
    }
}
