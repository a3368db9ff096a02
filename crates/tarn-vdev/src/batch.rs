//! Writing blocks (one, or many at once with their neighbouring pieces
//! merged into one write per run), and reading many at once the same way.
//!
//! # Theory
//!
//! A block becomes a *plan*: the pieces that go to each child (mirror: the
//! whole block, padded to whole sectors, to every child; raidz: one
//! column per child, parity computed), each a range of the caller's bytes
//! followed by a range of a buffer of the plan's own (parity, padding
//! zeros), so a block's data is never copied into a stripe on its way to
//! the children (`raidz::parity_and_columns`). Writing a plan puts every piece on
//! its child; its *outcome* counts the pieces that failed: the block is
//! written if no more failed than its redundancy tolerates (raidz: parity
//! columns; mirror: all sides but one), and the children that missed it,
//! failed or unusable, are reported so the pool records them for resilver.
//!
//! A txg writes many blocks into space allocated one after the other, so
//! the pieces bound for one child often touch end to end: block A's column
//! on child 2 ends where block B's column on child 2 starts. Small blocks
//! (a volume's 16K, a small file) cost one write call per column, which is
//! what limits them; [`TopVdev::write_many`] sorts each child's pieces by
//! offset and writes each run of touching pieces (up to [`MERGE_MAX`]
//! bytes) as one vectored write, the children in parallel, as ZFS's I/O queue
//! aggregates. The outcome of every block is computed exactly as for a
//! single write: a merged write that fails marks every piece in it failed,
//! so a failure can only add children to a block's missed list, never hide
//! one. Bytes on disk are the same as writing the blocks one by one. A
//! merged write counts as one operation (and, failing, one error) in the
//! child's counters, as aggregated I/O does in ZFS; the fault policy counts
//! errors in a row, so a failing child is faulted after more blocks, and
//! until then each block with a piece on it lists the child as missed.
//!
//! Reads are the mirror image ([`TopVdev::read_many`]): the pieces a
//! healthy read needs (a raidz block's data columns, a mirror's first
//! side) are sorted per child and read in runs, through gaps of up to
//! [`READ_GAP`] (a neighbour's parity column), the children at once. Each
//! block is verified on its own; any block not read whole or not
//! verifying is read again alone, which reconstructs, repairs and reports
//! as a single read does. Merging only changes how many reads reach the
//! devices, never which bytes a caller gets. A run's buffer lives only
//! until its pieces are copied out; a few are kept for the next runs
//! (`run_buffer`), since a fresh one is memory the kernel must fault in
//! and clear page by page, a tenth of a cold streaming read's CPU. A kept
//! buffer's old bytes never reach a caller: a read that succeeds
//! overwrites all of them, and one that fails drops the run.
//!
//! The runs of children that hand out a descriptor for direct reads (file
//! leaves, while no fault is set on them) are submitted together from the
//! calling thread (`uring.rs`): every run of every child in flight at
//! once, one sleep for the caller. A run taken from there must have come
//! back whole; one that failed or came back short is read again the usual
//! way (a blocking read, the children on device-layer workers when the
//! batch is large), which decides what its failure means. That second
//! read may succeed where the first failed (a write-back error is reported
//! by the first read that meets it): its bytes are then the disk's, which
//! the block's checksum judges as always, and the error stays recorded
//! for the next flush. Where the kernel has no ring, every run is read the
//! usual way.

use std::collections::BTreeMap;

use crate::label::DATA_START;
use crate::raidz::Layout;
use crate::top::{Handle, TopVdev, WriteOutcome};
use crate::{VdevError, DIRECT_ALIGN};

/// Largest write a run of merged pieces becomes.
pub const MERGE_MAX: usize = 1 << 20;

/// Block bytes planned and written at a time: a txg holds up to the dirty
/// limit, and planning all of it before writing any would hold every
/// stripe in memory at once (cold by the time it is written); windows of
/// this size keep them few and in cache while still filling merged writes.
const WINDOW: usize = 4 << 20;

/// One piece of a plan: bytes `data` of the block's own bytes, then
/// bytes `own` of the plan's buffer (parity, or zeros padding a column
/// to whole sectors), go to `child` at `leaf_off`. Either range may be
/// empty.
struct Piece {
    child: usize,
    leaf_off: u64,
    data: std::ops::Range<usize>,
    own: std::ops::Range<usize>,
}

/// A block ready to be written: the caller's bytes, what the plan added
/// to them (parity, padding), its pieces, and how many pieces may fail
/// with the block still written. The data columns point into the
/// caller's bytes rather than a copy of them: copying every byte of a
/// large write into a stripe buffer was a twelfth of the sync's CPU.
pub(crate) struct Plan<'a> {
    data: &'a [u8],
    own: Vec<u8>,
    pieces: Vec<Piece>,
    tolerated: usize,
}

impl Plan<'_> {
    /// The bytes of piece `i`, in order (one or both may be empty).
    fn bytes(&self, i: usize) -> [&[u8]; 2] {
        let p = &self.pieces[i];
        [&self.data[p.data.clone()], &self.own[p.own.clone()]]
    }

    /// The length of piece `i`.
    fn len(&self, i: usize) -> usize {
        let p = &self.pieces[i];
        p.data.len() + p.own.len()
    }
}

impl TopVdev {
    /// The plan of writing `data` at `offset` (checked against the vdev).
    pub(crate) fn plan<'a>(&self, offset: u64, data: &'a [u8]) -> Result<Plan<'a>, VdevError> {
        self.check_block(offset, data.len() as u64)?;
        if self.parity > 0 {
            let lay: Layout = self.layout(offset, data.len() as u64);
            let codec = self.codec_for(&lay)?;
            let (own, cols) = crate::raidz::parity_and_columns(codec, &lay, data)?;
            let pieces = lay
                .cols
                .iter()
                .zip(cols)
                .map(|(col, (data, own))| Piece {
                    child: col.child,
                    leaf_off: col.leaf_off,
                    data,
                    own,
                })
                .collect();
            Ok(Plan {
                data,
                own,
                pieces,
                tolerated: lay.parity,
            })
        } else {
            let s = self.sector() as usize;
            let pad = data.len().div_ceil(s) * s - data.len();
            let pieces = (0..self.width())
                .map(|child| Piece {
                    child,
                    leaf_off: DATA_START + offset,
                    data: 0..data.len(),
                    own: 0..pad,
                })
                .collect();
            Ok(Plan {
                data,
                own: vec![0u8; pad],
                pieces,
                tolerated: self.width() - 1,
            })
        }
    }

    /// What writing `plan` achieved, given which of its pieces were
    /// written (`ok`, one per piece).
    pub(crate) fn outcome(&self, plan: &Plan<'_>, ok: &[bool]) -> Result<WriteOutcome, VdevError> {
        let failed: Vec<usize> = plan
            .pieces
            .iter()
            .zip(ok)
            .filter(|(_, ok)| !**ok)
            .map(|(p, _)| p.child)
            .collect();
        if failed.len() > plan.tolerated {
            return Err(VdevError::InsufficientReplicas {
                op: "write",
                failed: failed.len(),
                tolerated: plan.tolerated,
                devices: self.child_paths(&failed),
            });
        }
        // Unusable children that hold no piece of this block still miss
        // the txg.
        let mut missed = failed;
        for idx in 0..self.width() {
            if !missed.contains(&idx) && self.handle(idx).is_none() {
                missed.push(idx);
            }
        }
        missed.sort_unstable();
        missed.dedup();
        Ok(WriteOutcome { missed })
    }

    /// Writes one plan, piece by piece.
    pub(crate) fn write_plan(&self, plan: &Plan<'_>) -> Result<WriteOutcome, VdevError> {
        let ok: Vec<bool> = plan
            .pieces
            .iter()
            .enumerate()
            .map(|(i, p)| {
                self.handle(p.child)
                    .is_some_and(|h| self.child_write_vectored(&h, &plan.bytes(i), p.leaf_off))
            })
            .collect();
        self.outcome(plan, &ok)
    }

    /// Writes many blocks, `(offset, data)` each, with the same result per
    /// block as [`TopVdev::write`] and the same bytes on disk, but each
    /// child's pieces that touch end to end merged into one write (see the
    /// module docs). Plans are built on up to `threads` threads; the
    /// children are written in parallel.
    pub fn write_many(
        &self,
        blocks: &[(u64, &[u8])],
        threads: usize,
    ) -> Vec<Result<WriteOutcome, VdevError>> {
        let mut out = Vec::with_capacity(blocks.len());
        let mut start = 0;
        while start < blocks.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < blocks.len() && (end == start || bytes + blocks[end].1.len() <= WINDOW) {
                bytes += blocks[end].1.len();
                end += 1;
            }
            out.extend(self.write_window(&blocks[start..end], threads));
            start = end;
        }
        out
    }

    /// [`TopVdev::write_many`] of one window of blocks.
    fn write_window(
        &self,
        blocks: &[(u64, &[u8])],
        threads: usize,
    ) -> Vec<Result<WriteOutcome, VdevError>> {
        let plans = plan_all(self, blocks, threads.max(1));
        // Every piece of every plan, by child, in offset order.
        let mut by_child: BTreeMap<usize, Vec<(u64, usize, usize)>> = BTreeMap::new();
        for (b, plan) in plans.iter().enumerate() {
            if let Ok(plan) = plan {
                for (i, p) in plan.pieces.iter().enumerate() {
                    by_child
                        .entry(p.child)
                        .or_default()
                        .push((p.leaf_off, b, i));
                }
            }
        }
        let plans_ref = &plans;
        let jobs: Vec<ChildJob<'_, Vec<(usize, usize, bool)>>> = by_child
            .into_iter()
            .map(|(child, mut pieces)| {
                Box::new(move || {
                    pieces.sort_unstable_by_key(|&(off, _, _)| off);
                    self.write_runs(child, &pieces, plans_ref)
                }) as ChildJob<'_, _>
            })
            .collect();
        // A child whose thread panicked wrote nothing: its pieces count
        // as failed below.
        let results: Vec<Vec<(usize, usize, bool)>> = crate::workers::run_all(jobs)
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect();
        let mut ok: Vec<Vec<bool>> = plans
            .iter()
            .map(|p| {
                p.as_ref()
                    .map_or(Vec::new(), |p| vec![false; p.pieces.len()])
            })
            .collect();
        for (b, i, done) in results.into_iter().flatten() {
            ok[b][i] = done;
        }
        plans
            .into_iter()
            .zip(ok)
            .map(|(plan, ok)| plan.and_then(|p| self.outcome(&p, &ok)))
            .collect()
    }

    /// Writes one child's pieces (sorted by offset) in runs of touching
    /// pieces; returns (block, piece, written) for each.
    fn write_runs(
        &self,
        child: usize,
        pieces: &[(u64, usize, usize)],
        plans: &[Result<Plan<'_>, VdevError>],
    ) -> Vec<(usize, usize, bool)> {
        let len = |&(_, b, i): &(u64, usize, usize)| -> usize {
            plans[b].as_ref().map_or(0, |p| p.len(i))
        };
        let handle: Option<Handle> = self.handle(child);
        let mut out = Vec::with_capacity(pieces.len());
        let mut start = 0;
        while start < pieces.len() {
            // The run: pieces that each start where the previous ended.
            let mut end = start + 1;
            let mut run_len = len(&pieces[start]);
            while end < pieces.len() {
                let next = len(&pieces[end]);
                let touches = pieces[end - 1].0 + len(&pieces[end - 1]) as u64 == pieces[end].0;
                if !touches || run_len + next > MERGE_MAX {
                    break;
                }
                run_len += next;
                end += 1;
            }
            let run = &pieces[start..end];
            let done = match &handle {
                None => false,
                Some(h) => {
                    let bufs: Vec<&[u8]> = run
                        .iter()
                        .flat_map(|&(_, b, i)| match &plans[b] {
                            Ok(p) => p.bytes(i),
                            Err(_) => [&[][..], &[][..]],
                        })
                        .collect();
                    self.child_write_vectored(h, &bufs, run[0].0)
                }
            };
            out.extend(run.iter().map(|&(_, b, i)| (b, i, done)));
            start = end;
        }
        out
    }
}

/// The plans of `blocks`, built on up to `threads` threads (parity is the
/// costly part), in order.
fn plan_all<'a>(
    top: &TopVdev,
    blocks: &[(u64, &'a [u8])],
    threads: usize,
) -> Vec<Result<Plan<'a>, VdevError>> {
    if threads <= 1 || blocks.len() < 2 {
        return blocks.iter().map(|&(o, d)| top.plan(o, d)).collect();
    }
    let per = blocks.len().div_ceil(threads);
    let chunks: Vec<&[(u64, &'a [u8])]> = blocks.chunks(per).collect();
    let jobs: Vec<ChildJob<'_, Vec<Result<Plan<'a>, VdevError>>>> = chunks
        .iter()
        .map(|&chunk| {
            Box::new(move || chunk.iter().map(|&(o, d)| top.plan(o, d)).collect())
                as ChildJob<'_, _>
        })
        .collect();
    crate::workers::run_all(jobs)
        .into_iter()
        .zip(&chunks)
        .flat_map(|(got, chunk)| {
            got.unwrap_or_else(|| {
                (0..chunk.len())
                    .map(|_| {
                        Err(VdevError::InvalidArgument(
                            "a planning thread panicked".into(),
                        ))
                    })
                    .collect()
            })
        })
        .collect()
}

/// The runs one child read in a merged read: their indexes, and the bytes
/// of each (none if its read failed).
type ChildRuns = (Vec<usize>, Vec<Option<RunBuf>>);

/// A job of [`crate::workers::run_all`] that borrows the batch it works on.
type ChildJob<'a, T> = Box<dyn FnOnce() -> T + Send + 'a>;

/// One block of a [`TopVdev::read_many`]: where its bytes go, and whether
/// the merged reads brought them all.
struct Want {
    /// Allocated once, where the block's bytes are gathered and then
    /// handed out (usually as they are, to the block cache). Not zeroed
    /// first (clearing memory that the gather overwrites cost a twentieth
    /// of a cold streaming read): its pieces cover it exactly, so it is
    /// all written when every piece was, which `ok` records.
    buf: std::sync::Arc<[std::mem::MaybeUninit<u8>]>,
    /// Bytes of `buf` written so far (its pieces never overlap).
    filled: usize,
    psize: usize,
    /// Read through the merged path (false: read alone from the start).
    merged: bool,
    ok: bool,
}

/// A run of pieces on one child, near enough to be one read.
struct Run {
    child: usize,
    at: u64,
    len: usize,
    /// Bytes of it that pieces want (the rest is gaps).
    useful: usize,
    /// (block, range in the block's buffer, where it starts in the run).
    parts: Vec<(usize, std::ops::Range<usize>, usize)>,
}

/// Bytes between two pieces on a child that a merged read reads through
/// and drops (ZFS's read gap limit): a raidz block's parity column sits
/// between its neighbours' data columns on the same child, and reading it
/// costs less than another read.
pub const READ_GAP: u64 = 32 << 10;

/// The largest gap a run wanting less than this reads through.
const GAP_FLOOR: u64 = 16 << 10;

/// Merged runs at least this large in all are read with a thread per
/// child; smaller batches are not worth the threads.
const PARALLEL_READ_FROM: usize = 256 << 10;

/// Most run buffers of each size kept for the next merged reads (see
/// [`run_buffer`]): a few large ones, which a streaming read's long runs
/// take, and many small ones, which the short runs of a fragmented volume
/// take (about forty per 1 MiB request, several requests at once). At
/// most 8 MiB and 17 MiB of memory.
const SPARE_RUNS_MAX: usize = 8;
const SPARE_SMALL_MAX: usize = 256;

/// Capacity of a kept large run buffer: any run, wherever its aligned
/// start falls.
const RUN_CAPACITY: usize = MERGE_MAX + DIRECT_ALIGN;

/// Runs up to this long take a small buffer.
const SMALL_RUN: usize = 64 << 10;

/// Capacity of a kept small run buffer: any run up to [`SMALL_RUN`].
const SMALL_CAPACITY: usize = SMALL_RUN + DIRECT_ALIGN;

/// Run buffers merged reads are done with, kept for the next ones, by
/// size: a fresh buffer is memory the kernel must fault in and clear
/// page by page, which a streaming reader would pay on every read for
/// bytes it copies out and drops at once; and a fresh one for each short
/// run of a fragmented volume made the allocator (one lock for the
/// process, `tarn-daemon/src/heap.rs`) a quarter of such a read's CPU.
static SPARE_RUNS: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());
static SPARE_SMALL: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());

/// The kept buffers of `capacity` and how many of them may be kept, if
/// buffers of that capacity are kept at all.
fn spares_of(capacity: usize) -> Option<(&'static std::sync::Mutex<Vec<Vec<u8>>>, usize)> {
    match capacity {
        RUN_CAPACITY => Some((&SPARE_RUNS, SPARE_RUNS_MAX)),
        SMALL_CAPACITY => Some((&SPARE_SMALL, SPARE_SMALL_MAX)),
        _ => None,
    }
}

/// The buffer of one merged read: `len` bytes from `start` of `bytes`,
/// where `start` puts them on a [`DIRECT_ALIGN`] boundary, so the leaf
/// can read them past the page cache ([`crate::Leaf::read_direct_at`]).
pub(crate) struct RunBuf {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
}

impl RunBuf {
    /// A new buffer of `len` bytes on a [`DIRECT_ALIGN`] boundary (or at
    /// the start of its allocation, were that ever not computable: the
    /// run is then read through the page cache).
    pub(crate) fn aligned(len: usize) -> RunBuf {
        Self::place(Vec::with_capacity(len + DIRECT_ALIGN), len)
    }

    /// `len` bytes of `bytes` from its first aligned offset. The capacity
    /// is allocated and never moves while it suffices, so an offset into
    /// it is aligned for good.
    fn place(mut bytes: Vec<u8>, len: usize) -> RunBuf {
        let start = match bytes.as_ptr().align_offset(DIRECT_ALIGN) {
            s if s < DIRECT_ALIGN => s,
            _ => 0,
        };
        bytes.resize(start + len, 0);
        RunBuf { bytes, start, len }
    }

    pub(crate) fn get(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }

    pub(crate) fn get_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}

/// A buffer of `len` bytes for one merged read: a spare one of its size
/// if there is one (its old bytes are all overwritten by the read, or the
/// read failed and they are dropped unread), else a new one with room for
/// any run of its size.
pub(crate) fn run_buffer(len: usize) -> RunBuf {
    let capacity = match len {
        // One large block's run: it would not be kept afterwards, so it
        // does not take a spare one either.
        _ if len > MERGE_MAX => return RunBuf::aligned(len),
        _ if len <= SMALL_RUN => SMALL_CAPACITY,
        _ => RUN_CAPACITY,
    };
    let spare = spares_of(capacity)
        .and_then(|(kept, _)| kept.lock().unwrap_or_else(|e| e.into_inner()).pop());
    RunBuf::place(spare.unwrap_or_else(|| Vec::with_capacity(capacity)), len)
}

/// Keeps `b` for [`run_buffer`], up to the bound of its size: only
/// buffers of [`RUN_CAPACITY`] or [`SMALL_CAPACITY`], which hold any run
/// of their size at its aligned start without growing (growing would
/// move them).
fn spare_run_buffer(b: RunBuf) {
    let Some((kept, max)) = spares_of(b.bytes.capacity()) else {
        return;
    };
    let mut spare = kept.lock().unwrap_or_else(|e| e.into_inner());
    if spare.len() < max {
        spare.push(b.bytes);
    }
}

impl TopVdev {
    /// Reads every run whose child hands out a descriptor for direct reads
    /// ([`crate::Leaf::direct_fd`]) at once, submitted together from this
    /// thread ([`crate::uring`]); the bytes of each run read whole, `None`
    /// for the others (not submitted, failed or short), which the caller
    /// reads the usual way: that read decides what a failure means (a file
    /// system refusing the alignment, a bad sector) exactly as when no run
    /// was submitted. A run read here counts as one read of its child.
    fn read_runs_submitted(
        &self,
        runs: &[Run],
        handles: &BTreeMap<usize, Handle>,
    ) -> Vec<Option<RunBuf>> {
        let mut out: Vec<Option<RunBuf>> = (0..runs.len()).map(|_| None).collect();
        if runs.len() < 2 || !crate::uring::available() {
            // One read gains nothing from a submission.
            return out;
        }
        // (run, descriptor, buffer) of each run submitted.
        let mut picked: Vec<(usize, std::os::fd::RawFd, RunBuf)> = Vec::new();
        for (k, r) in runs.iter().enumerate() {
            let Some(h) = handles.get(&r.child) else {
                continue;
            };
            let Some(fd) = h.leaf.direct_fd() else {
                continue;
            };
            let aligned =
                r.at.is_multiple_of(DIRECT_ALIGN as u64) && r.len.is_multiple_of(DIRECT_ALIGN);
            if !aligned || !self.in_data_region(&*h.leaf, r.at, r.len) {
                continue;
            }
            let buf = run_buffer(r.len);
            if (buf.get().as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) {
                picked.push((k, fd, buf));
            } else {
                spare_run_buffer(buf);
            }
        }
        if picked.len() < 2 {
            picked.into_iter().for_each(|(.., b)| spare_run_buffer(b));
            return out;
        }
        let mut reads: Vec<crate::uring::Read<'_>> = picked
            .iter_mut()
            .map(|(k, fd, buf)| crate::uring::Read {
                fd: *fd,
                off: runs[*k].at,
                buf,
                done: None,
            })
            .collect();
        let start = std::time::Instant::now();
        // Where there is no ring, nothing ran and every `done` is `None`.
        let _ = crate::uring::read_all(&mut reads);
        // When each run that came back whole was seen done.
        let whole: Vec<Option<std::time::Instant>> = reads
            .iter()
            .map(|r| match r.done {
                Some((Ok(n), at)) if n == r.buf.get().len() => Some(at),
                _ => None,
            })
            .collect();
        drop(reads);
        for ((k, _, buf), whole) in picked.into_iter().zip(whole) {
            match whole.and_then(|at| Some((handles.get(&runs[k].child)?, at))) {
                Some((h, at)) => {
                    self.count_read(h, runs[k].len, at - start);
                    h.leaf.note_direct_reads(1);
                    out[k] = Some(buf);
                }
                None => spare_run_buffer(buf),
            }
        }
        out
    }

    /// Reads many blocks, each `(offset, psize)`, with the pieces of
    /// neighbouring blocks on one child merged into one read (up to
    /// [`MERGE_MAX`], reading through gaps of up to [`READ_GAP`]): the read
    /// side of [`TopVdev::write_many`], for a
    /// reader of many small blocks laid end to end (a volume's 16K blocks
    /// read 1 MiB at a time are 64 blocks and, on raidz1 of four, some 200
    /// reads of a few KiB each; merged they are a few reads per child).
    ///
    /// Only what a healthy read needs is merged: a raidz block's data
    /// columns, a mirror's first side. Every block is then verified on its
    /// own (`verify(i, bytes)` for block `i`); one that a merged read
    /// failed, that does not verify, or that has a piece on a child that is
    /// out of service or resilvering is read again alone with
    /// [`TopVdev::read`], which reconstructs, repairs and reports exactly
    /// as for any read. So each block's outcome is `read`'s, and no byte
    /// that did not verify is ever returned. A merged read counts as one
    /// operation in its child's counters; a merged read that fails counts
    /// nothing at first, the blocks in it being read again alone (and those
    /// reads counting what fails). What reading alone then got past is
    /// counted after, once per child: a run with no gap that failed as a
    /// read error, a piece that came back other than the block read alone
    /// as a checksum error (and the piece written again from the verified
    /// block: the device may hold what came back, under a good copy in the
    /// page cache that the read alone got), each only where the reads
    /// alone counted nothing of that kind on that child (they repair what
    /// they meet themselves; a read of another thread counting there at the
    /// same moment can hide one).
    ///
    /// Each block's bytes are the first `psize` of its buffer: a buffer
    /// gathered from whole sectors may be longer, and is handed over as
    /// gathered rather than copied to its exact length (a compressed
    /// block is decompressed from the slice anyway).
    pub fn read_many(
        &self,
        blocks: &[(u64, usize)],
        verify: &(dyn Fn(usize, &[u8]) -> bool + Sync),
    ) -> Vec<Result<std::sync::Arc<[u8]>, VdevError>> {
        let mut wants: Vec<Want> = Vec::with_capacity(blocks.len());
        // child → (leaf offset, block, range in its buffer)
        let mut by_child: BTreeMap<usize, Vec<(u64, usize, std::ops::Range<usize>)>> =
            BTreeMap::new();
        let mut handles: BTreeMap<usize, Handle> = BTreeMap::new();
        let mirror_first = if self.parity == 0 {
            self.read_order()
                .into_iter()
                .next()
                .filter(|h| !h.resilvering)
        } else {
            None
        };
        for (i, &(offset, psize)) in blocks.iter().enumerate() {
            let alone = Want {
                buf: std::sync::Arc::new_uninit_slice(0),
                filled: 0,
                psize,
                merged: false,
                ok: false,
            };
            if self.check_block(offset, psize as u64).is_err() {
                wants.push(alone);
                continue;
            }
            let mut pieces = Vec::new();
            let len = if self.parity > 0 {
                let lay = self.layout(offset, psize as u64);
                let mut pos = 0;
                let mut usable = true;
                for col in &lay.cols[lay.parity..] {
                    match self.handle(col.child) {
                        Some(h) if !h.resilvering => {
                            handles.entry(col.child).or_insert(h);
                        }
                        _ => usable = false,
                    }
                    pieces.push((col.child, col.leaf_off, pos..pos + col.len));
                    pos += col.len;
                }
                if !usable {
                    wants.push(alone);
                    continue;
                }
                lay.data_len
            } else {
                let Some(h) = &mirror_first else {
                    wants.push(alone);
                    continue;
                };
                let len = self.alloc_size(psize as u64) as usize;
                handles.entry(h.idx).or_insert_with(|| h.clone());
                pieces.push((h.idx, DATA_START + offset, 0..len));
                len
            };
            for (child, at, range) in pieces {
                by_child.entry(child).or_default().push((at, i, range));
            }
            wants.push(Want {
                // One allocation, filled in place below (no buffer to
                // copy into a shared one afterwards).
                buf: std::sync::Arc::new_uninit_slice(len),
                filled: 0,
                psize,
                merged: true,
                ok: true,
            });
        }
        // Runs of touching pieces per child.
        let mut runs: Vec<Run> = Vec::new();
        for (child, mut list) in by_child {
            list.sort_by_key(|(at, ..)| *at);
            for (at, block, range) in list {
                let n = range.len();
                match runs.last_mut() {
                    // A gap is read only when no larger than what the run
                    // already wants (or 16 KiB, a parity column of a small
                    // block): small blocks far apart are not read many
                    // times over.
                    Some(r)
                        if r.child == child
                            && at >= r.at + r.len as u64
                            && at - (r.at + r.len as u64)
                                <= READ_GAP.min((r.useful as u64).max(GAP_FLOOR))
                            && (at - r.at) as usize + n <= MERGE_MAX =>
                    {
                        let start = (at - r.at) as usize;
                        r.len = start + n;
                        r.useful += n;
                        r.parts.push((block, range, start));
                    }
                    _ => runs.push(Run {
                        child,
                        at,
                        len: n,
                        useful: n,
                        parts: vec![(block, range, 0)],
                    }),
                }
            }
        }
        let read_run = |r: &Run| -> Option<RunBuf> {
            let h = handles.get(&r.child)?;
            let mut buf = run_buffer(r.len);
            if self.child_read_merged(h, buf.get_mut(), r.at) {
                Some(buf)
            } else {
                spare_run_buffer(buf);
                None
            }
        };
        // Every run at once from this thread where the children allow it;
        // what that did not read is read below, a blocking read per run.
        let mut data: Vec<Option<RunBuf>> = self.read_runs_submitted(&runs, &handles);
        let todo: Vec<usize> = (0..runs.len()).filter(|&k| data[k].is_none()).collect();
        let total: usize = todo.iter().map(|&k| runs[k].len).sum();
        let children: std::collections::BTreeSet<usize> =
            todo.iter().map(|&k| runs[k].child).collect();
        if children.len() > 1 && total >= PARALLEL_READ_FROM {
            // The children at once, each reading its runs in order.
            let (runs_ref, read_run) = (&runs, &read_run);
            let jobs: Vec<ChildJob<'_, ChildRuns>> = children
                .iter()
                .map(|&c| {
                    let mine: Vec<usize> = todo
                        .iter()
                        .copied()
                        .filter(|&k| runs[k].child == c)
                        .collect();
                    Box::new(move || {
                        let got: Vec<Option<RunBuf>> =
                            mine.iter().map(|&k| read_run(&runs_ref[k])).collect();
                        (mine, got)
                    }) as ChildJob<'_, _>
                })
                .collect();
            // A reader that panicked read nothing: its blocks are read
            // again alone.
            for (mine, got) in crate::workers::run_all(jobs).into_iter().flatten() {
                for (k, d) in mine.into_iter().zip(got) {
                    data[k] = d;
                }
            }
        } else {
            for &k in &todo {
                data[k] = read_run(&runs[k]);
            }
        }
        // Children whose run failed with nothing in it but wanted pieces
        // (no gap): the failure was those blocks' own reads'.
        let mut failed_children = std::collections::BTreeSet::new();
        for (r, d) in runs.iter().zip(data) {
            if d.is_none() && r.useful == r.len {
                failed_children.insert(r.child);
            }
            match d {
                Some(run) => {
                    let bytes = run.get();
                    for (block, range, start) in &r.parts {
                        let n = range.len();
                        let w = &mut wants[*block];
                        // Nobody else holds it yet; if that ever failed,
                        // the block is read alone.
                        match std::sync::Arc::get_mut(&mut w.buf) {
                            Some(buf) => {
                                buf[range.clone()].write_copy_of_slice(&bytes[*start..*start + n]);
                                w.filled += n;
                            }
                            None => w.ok = false,
                        }
                    }
                    spare_run_buffer(run);
                }
                None => {
                    for (block, ..) in &r.parts {
                        wants[*block].ok = false;
                    }
                }
            }
        }
        // What the blocks read again alone count is what a read alone
        // counts. A failure of the merged read that reading alone got past
        // (a transient read error, bytes that came back wrong once) is
        // counted after, on the children it came from, where reading alone
        // counted nothing there: a flaky cable must show in the counters
        // whichever way a block was read.
        // Each child's error counts before the first read alone (taken
        // only then: most batches read nothing again).
        let mut before: Option<BTreeMap<usize, (u64, u64)>> = None;
        // Pieces that came back wrong where the block read alone verified:
        // (child, where on it, the verified bytes).
        let mut wrong_pieces: Vec<(usize, u64, Vec<u8>)> = Vec::new();
        let out: Vec<Result<std::sync::Arc<[u8]>, VdevError>> = wants
            .into_iter()
            .enumerate()
            .map(|(i, w)| {
                let mut merged = None;
                if w.merged && w.ok && w.filled == w.buf.len() {
                    // SAFETY: the block's pieces (its data columns, or the
                    // mirror's whole padded block) are disjoint ranges of
                    // its buffer, so `filled` bytes copied into them, as
                    // many as the buffer holds, wrote every byte of it.
                    let buf = unsafe { w.buf.assume_init() };
                    if verify(i, &buf[..w.psize]) {
                        return Ok(buf);
                    }
                    merged = Some(buf);
                }
                before.get_or_insert_with(|| {
                    handles.keys().map(|&c| (c, self.error_counts(c))).collect()
                });
                let (offset, psize) = blocks[i];
                let alone = self.read(offset, psize, &|b: &[u8]| verify(i, b));
                if let (Some(m), Ok(good)) = (&merged, &alone) {
                    for r in &runs {
                        for (_, range, at) in r.parts.iter().filter(|(b, ..)| *b == i) {
                            let end = range.end.min(good.len()).min(m.len());
                            let start = range.start.min(end);
                            if m[start..end] != good[start..end] {
                                wrong_pieces.push((
                                    r.child,
                                    r.at + *at as u64,
                                    good[start..end].to_vec(),
                                ));
                            }
                        }
                    }
                }
                alone.map(std::sync::Arc::from)
            })
            .collect();
        for (&c, &(read_errors, cksum_errors)) in before.iter().flatten() {
            let (r, k) = self.error_counts(c);
            if failed_children.contains(&c) && r == read_errors {
                self.count_passing_read_error(c);
            }
            if k != cksum_errors {
                // The reads alone met it too, counted it and repaired what
                // they could.
                continue;
            }
            let Some(h) = handles.get(&c) else {
                continue;
            };
            let mut counted = false;
            for (_, off, bytes) in wrong_pieces.iter().filter(|(child, ..)| *child == c) {
                if !counted {
                    self.note_cksum(h);
                    counted = true;
                }
                // What the device gave past the page cache may be what is on
                // it (the read alone may have had a good copy from the page
                // cache): written again from the verified block, as a read
                // alone repairs a column.
                self.heal(h, bytes, *off);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only this test takes and gives back run buffers in this test binary
    /// (the merged reads are tested from `tests/batch.rs`, another
    /// process), so what it gives back is what it takes next.
    #[test]
    fn run_buffers_are_reused_and_kept_bounded() {
        let aligned = |b: &RunBuf| (b.get().as_ptr() as usize).is_multiple_of(DIRECT_ALIGN);
        for (short, long) in [(10, SMALL_RUN), (SMALL_RUN + 1, MERGE_MAX)] {
            let b = run_buffer(short);
            assert_eq!(b.get().len(), short);
            assert!(aligned(&b));
            let first = b.get().as_ptr();
            spare_run_buffer(b);
            // The same memory again for a run of its size, at the length
            // asked (longer or shorter), still aligned.
            let c = run_buffer(long);
            assert_eq!((c.get().as_ptr(), c.get().len()), (first, long));
            spare_run_buffer(c);
            let d = run_buffer(short);
            assert_eq!((d.get().as_ptr(), d.get().len()), (first, short));
            spare_run_buffer(d);
        }
        // A run larger than any kept buffer is aligned too, and not kept.
        let big = run_buffer(MERGE_MAX + 8192);
        assert!(aligned(&big) && big.get().len() == MERGE_MAX + 8192);
        spare_run_buffer(big);
        // Never more than the bound kept, and only buffers of the sizes
        // that hold any run of theirs aligned.
        let other = |cap| RunBuf {
            bytes: Vec::with_capacity(cap),
            start: 0,
            len: 0,
        };
        spare_run_buffer(other(4096));
        spare_run_buffer(other(RUN_CAPACITY + 1));
        for (cap, max) in [
            (RUN_CAPACITY, SPARE_RUNS_MAX),
            (SMALL_CAPACITY, SPARE_SMALL_MAX),
        ] {
            for _ in 0..max + 4 {
                spare_run_buffer(other(cap));
            }
            let Some((kept, _)) = spares_of(cap) else {
                panic!("{cap} is a kept size");
            };
            let spare = kept.lock().unwrap_or_else(|e| e.into_inner());
            assert_eq!(spare.len(), max);
            assert!(spare.iter().all(|b| b.capacity() == cap));
        }
    }
}
