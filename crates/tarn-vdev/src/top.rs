//! Top-level vdevs: the redundant address space the allocator hands out.
//!
//! A [`TopVdev`] owns its children and their state. Each child is either
//! usable (present, not offline, not faulted) or not; I/O goes only to usable
//! children, and each operation pins the child's leaf (`Arc`) for its duration,
//! so state changes (offline, replace, fault) are safe while I/O is in flight:
//! the old leaf finishes what it was given and the next operation sees the new
//! state.
//!
//! Fault policy: a child that fails `FAULT_AFTER_ERRORS` reads in a row (no
//! successful read in between) or as many writes in a row, or fails a flush, is marked faulted and no
//! longer used — unless that would leave fewer healthy children than the data
//! needs, in which case it keeps being tried (a flaky device beats none).
//! Checksum errors are counted but never fault a device by themselves.
//!
//! The block-level algorithms live in `mirror.rs` (single and mirror) and
//! `raidz.rs`; this module holds state, bounds checks and counting.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::label::{data_end, TopConfig, VdevKind, DATA_START, MIN_LEAF_SIZE};
use crate::leaf::Leaf;
use crate::parity::CodecCache;
use crate::raidz::{self, Layout};
use crate::{check_ashift, sector, VdevError, MAX_BLOCK_SIZE};

/// Consecutive read (or write) errors after which a child is faulted (if redundancy allows).
pub const FAULT_AFTER_ERRORS: u32 = 10;

/// Most column combinations a raidz read tries before giving up on a block.
/// It covers every combination for raidz1/2 at any width and raidz3 up to
/// about 70 columns; it bounds the work one damaged block can cause.
pub const MAX_COMBINATIONS: usize = 1 << 16;

/// Per-child I/O statistics (a snapshot).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Reads that failed at the device.
    pub read_errors: u64,
    /// Writes (and flushes) that failed at the device.
    pub write_errors: u64,
    /// Reads that succeeded but returned bytes that were wrong.
    pub cksum_errors: u64,
    /// Successful reads.
    pub read_ops: u64,
    /// Successful writes.
    pub write_ops: u64,
    /// Bytes successfully read.
    pub read_bytes: u64,
    /// Bytes successfully written.
    pub write_bytes: u64,
}

#[derive(Default)]
struct AtomicCounters {
    /// How long successful reads took at the device.
    read_latency: tarn_stats::Histogram,
    /// How long successful writes took at the device.
    write_latency: tarn_stats::Histogram,
    read_errors: AtomicU64,
    write_errors: AtomicU64,
    cksum_errors: AtomicU64,
    read_ops: AtomicU64,
    write_ops: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
}

impl AtomicCounters {
    fn all(&self) -> [&AtomicU64; 7] {
        [
            &self.read_errors,
            &self.write_errors,
            &self.cksum_errors,
            &self.read_ops,
            &self.write_ops,
            &self.read_bytes,
            &self.write_bytes,
        ]
    }

    fn snapshot(&self) -> Counters {
        let [re, we, ce, ro, wo, rb, wb] = self.all().map(|a| a.load(Ordering::Relaxed));
        Counters {
            read_errors: re,
            write_errors: we,
            cksum_errors: ce,
            read_ops: ro,
            write_ops: wo,
            read_bytes: rb,
            write_bytes: wb,
        }
    }

    fn clear(&self) {
        for a in self.all() {
            a.store(0, Ordering::Relaxed);
        }
        self.read_latency.clear();
        self.write_latency.clear();
    }
}

fn bump(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

/// State of one child as seen by the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeafState {
    /// In use.
    Online,
    /// Taken offline by the administrator.
    Offline,
    /// Could not be opened.
    Missing,
    /// I/O errors made us stop using it.
    Faulted,
}

/// Overall state of a top-level vdev.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TopHealth {
    /// Every child usable and complete.
    Online,
    /// Some redundancy lost (or a child resilvering); all data still readable.
    Degraded,
    /// More children unusable than the redundancy covers.
    Faulted,
}

/// What the pool reports about one child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafInfo {
    /// Device guid.
    pub guid: u64,
    /// Current path.
    pub path: PathBuf,
    /// Current state.
    pub state: LeafState,
    /// Statistics snapshot.
    pub counters: Counters,
    /// Still being filled in after a replace or a return.
    pub resilvering: bool,
}

/// Result of a successful write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Children that did not get this write: failed, or unusable and skipped.
    pub missed: Vec<usize>,
}

/// Result of scrubbing one block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubOutcome {
    /// Bytes rewritten to repair children.
    pub repaired_bytes: u64,
    /// Children whose copy or column was wrong or unreadable (repaired or not).
    pub bad_children: Vec<usize>,
}

/// Where one piece of a block lives on a child (for I/O sorting and tools).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildExtent {
    /// Child index.
    pub child: usize,
    /// Byte offset on the leaf.
    pub leaf_offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// True for raidz parity columns.
    pub parity: bool,
}

struct Slot {
    leaf: Option<Arc<dyn Leaf>>,
    guid: u64,
    path: PathBuf,
    offline: bool,
    faulted: bool,
    resilvering: bool,
}

impl Slot {
    fn usable(&self) -> bool {
        self.leaf.is_some() && !self.offline && !self.faulted
    }

    fn state(&self) -> LeafState {
        if self.offline {
            LeafState::Offline
        } else if self.leaf.is_none() {
            LeafState::Missing
        } else if self.faulted {
            LeafState::Faulted
        } else {
            LeafState::Online
        }
    }
}

/// How many flushes of each child of a vdev had failed when it was taken,
/// and which children were in service then ([`TopVdev::flush_mark`]). The
/// default mark (none taken) counts every failure since the vdev opened.
#[derive(Clone, Debug, Default)]
pub struct FlushMark {
    failures: Vec<u64>,
    usable: Vec<bool>,
}

struct Child {
    slot: Mutex<Slot>,
    counters: AtomicCounters,
    /// Failed reads and failed writes since the last success of the same
    /// kind: a disk that cannot read is useless even if repairs write fine.
    streaks: [AtomicU32; 2],
    /// Flushes of this child that failed, ever (see [`FlushMark`]).
    flush_failures: AtomicU64,
}

const READ: usize = 0;
const WRITE: usize = 1;

impl Child {
    fn reset_streaks(&self) {
        for s in &self.streaks {
            s.store(0, Ordering::Relaxed);
        }
    }
}

/// A usable child pinned for the duration of one I/O.
#[derive(Clone)]
pub(crate) struct Handle {
    pub(crate) idx: usize,
    pub(crate) leaf: Arc<dyn Leaf>,
    pub(crate) resilvering: bool,
}

/// One top-level vdev: a single leaf, a mirror, or a raidz group. All methods
/// take `&self` and may be called from many threads at once.
pub struct TopVdev {
    kind: VdevKind,
    guid: u64,
    ashift: u8,
    pub(crate) parity: usize,
    /// Data bytes every child must offer (the smallest present at open, or
    /// what `pin_asize` requires).
    child_capacity: AtomicU64,
    asize: AtomicU64,
    children: Vec<Child>,
    /// Serialises state changes so redundancy checks see a stable picture.
    state_lock: Mutex<()>,
    codecs: Option<CodecCache>,
    /// When false, reads still reconstruct but write nothing back.
    heal_enabled: AtomicBool,
}

impl std::fmt::Debug for TopVdev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopVdev")
            .field("kind", &self.kind)
            .field("guid", &self.guid)
            .field("ashift", &self.ashift)
            .field("asize", &self.asize())
            .field("leaves", &self.leaves())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn round_down(x: u64, unit: u64) -> u64 {
    x - x % unit
}

impl TopVdev {
    /// Opens a top-level vdev from its config. `leaves[i]` is `None` when
    /// child i could not be opened (missing). Errors if the geometry is
    /// invalid (raidz needs parity 1..=3 and >= parity+2 children, mirror >= 2,
    /// single == 1, width <= 255) or a present leaf is smaller than
    /// `MIN_LEAF_SIZE`.
    ///
    /// The address space is sized from the smallest *present* child: if the
    /// smallest child is missing, `asize` can come out larger than when the
    /// pool was created. A pool that keeps its own record of `asize` should
    /// hand it to [`TopVdev::pin_asize`] after opening.
    pub fn open(
        config: &TopConfig,
        ashift: u8,
        leaves: Vec<Option<Arc<dyn Leaf>>>,
    ) -> Result<TopVdev, VdevError> {
        check_ashift(ashift).map_err(VdevError::Geometry)?;
        let n = config.children.len();
        if leaves.len() != n {
            return Err(VdevError::Geometry(format!(
                "{} leaves given for {n} children",
                leaves.len()
            )));
        }
        if n > 255 {
            return Err(VdevError::Geometry(format!("{n} children (at most 255)")));
        }
        let parity = match config.kind {
            VdevKind::Single if n != 1 => {
                return Err(VdevError::Geometry(format!(
                    "single vdev with {n} children"
                )))
            }
            VdevKind::Mirror if n < 2 => {
                return Err(VdevError::Geometry(format!("mirror with {n} children")))
            }
            VdevKind::Raidz { parity } if !(1..=3).contains(&parity) => {
                return Err(VdevError::Geometry(format!("raidz parity {parity}")))
            }
            VdevKind::Raidz { parity } if n < usize::from(parity) + 2 => {
                return Err(VdevError::Geometry(format!(
                    "raidz{parity} with {n} children (needs at least {})",
                    parity + 2
                )))
            }
            VdevKind::Raidz { parity } => usize::from(parity),
            VdevKind::Single | VdevKind::Mirror => 0,
        };
        let mut capacity: Option<u64> = None;
        for leaf in leaves.iter().flatten() {
            let size = leaf.size();
            if size < MIN_LEAF_SIZE {
                return Err(VdevError::TooSmall {
                    path: leaf.path().to_path_buf(),
                    size,
                    min: MIN_LEAF_SIZE,
                });
            }
            let c = data_end(size, ashift).saturating_sub(DATA_START);
            capacity = Some(capacity.map_or(c, |m| m.min(c)));
        }
        let child_capacity = capacity.unwrap_or(0);
        let s = sector(ashift);
        let asize = match config.kind {
            VdevKind::Raidz { .. } => round_down(
                child_capacity.saturating_mul(n as u64),
                (parity as u64 + 1) * s,
            ),
            _ => round_down(child_capacity, s),
        };
        let children = config
            .children
            .iter()
            .zip(leaves)
            .map(|(lc, leaf)| Child {
                slot: Mutex::new(Slot {
                    path: leaf
                        .as_ref()
                        .map_or(lc.path.clone(), |l| l.path().to_path_buf()),
                    leaf,
                    guid: lc.guid,
                    offline: lc.offline,
                    faulted: false,
                    resilvering: false,
                }),
                counters: AtomicCounters::default(),
                streaks: Default::default(),
                flush_failures: AtomicU64::new(0),
            })
            .collect();
        Ok(TopVdev {
            kind: config.kind,
            guid: config.guid,
            ashift,
            parity,
            child_capacity: AtomicU64::new(child_capacity),
            asize: AtomicU64::new(asize),
            children,
            state_lock: Mutex::new(()),
            codecs: (parity > 0).then(|| CodecCache::new(parity, n - parity)),
            heal_enabled: AtomicBool::new(true),
        })
    }

    /// Redundancy scheme.
    pub fn kind(&self) -> VdevKind {
        self.kind
    }

    /// Guid of this top-level vdev.
    pub fn guid(&self) -> u64 {
        self.guid
    }

    /// Number of children.
    pub fn width(&self) -> usize {
        self.children.len()
    }

    /// Sector shift.
    pub fn ashift(&self) -> u8 {
        self.ashift
    }

    /// Size of the allocatable address space in bytes: per-child data capacity
    /// (smallest present child) for single/mirror, width times that for raidz,
    /// rounded down to the allocation alignment.
    pub fn asize(&self) -> u64 {
        self.asize.load(Ordering::Relaxed)
    }

    /// Adopts the `asize` the pool recorded at creation, so the address space
    /// does not depend on which children happen to be present. Errs if the
    /// present children cannot hold it (a device was truncated or replaced by
    /// a smaller one) or if it is not a multiple of the allocation alignment.
    pub fn pin_asize(&self, recorded: u64) -> Result<(), VdevError> {
        let _g = lock(&self.state_lock);
        let current = self.asize();
        if recorded > current || !recorded.is_multiple_of(self.alloc_align()) {
            return Err(VdevError::Geometry(format!(
                "recorded vdev size {recorded:#x} does not fit the present children \
                 ({current:#x} available, unit {:#x})",
                self.alloc_align()
            )));
        }
        let s = self.sector();
        let per_child = if self.parity > 0 {
            (recorded / s).div_ceil(self.width() as u64) * s
        } else {
            recorded
        };
        self.asize.store(recorded, Ordering::Relaxed);
        self.child_capacity.fetch_min(per_child, Ordering::Relaxed);
        Ok(())
    }

    /// Bytes to allocate for a block of `psize` stored bytes: sector-rounded,
    /// plus parity and padding to a multiple of parity+1 sectors on raidz.
    pub fn alloc_size(&self, psize: u64) -> u64 {
        if self.parity > 0 {
            raidz::alloc_size(psize, self.width(), self.parity, self.ashift)
        } else {
            psize.div_ceil(self.sector()).saturating_mul(self.sector())
        }
    }

    /// Allocation alignment in bytes: one sector, or parity+1 sectors on raidz.
    pub fn alloc_align(&self) -> u64 {
        self.sector() * (self.parity as u64 + 1)
    }

    /// How many children may be lost without losing data: 0, n-1 or parity.
    pub fn redundancy(&self) -> usize {
        match self.kind {
            VdevKind::Single => 0,
            VdevKind::Mirror => self.width() - 1,
            VdevKind::Raidz { .. } => self.parity,
        }
    }

    pub(crate) fn sector(&self) -> u64 {
        sector(self.ashift)
    }

    pub(crate) fn layout(&self, offset: u64, psize: u64) -> Layout {
        Layout::new(offset, psize, self.width(), self.parity, self.ashift)
    }

    pub(crate) fn codecs(&self) -> Result<&CodecCache, VdevError> {
        self.codecs
            .as_ref()
            .ok_or_else(|| VdevError::Geometry("not a raidz vdev".into()))
    }

    /// Validates a block request against alignment and the address space;
    /// offsets come from block pointers read from disk, so nothing is assumed.
    pub(crate) fn check_block(&self, offset: u64, psize: u64) -> Result<(), VdevError> {
        if psize == 0 || psize > MAX_BLOCK_SIZE as u64 {
            return Err(VdevError::InvalidArgument(format!(
                "block size {psize} outside 1..={MAX_BLOCK_SIZE}"
            )));
        }
        if !offset.is_multiple_of(self.sector()) {
            return Err(VdevError::InvalidArgument(format!(
                "offset {offset:#x} not aligned to {} bytes",
                self.sector()
            )));
        }
        let len = self.alloc_size(psize);
        let limit = self.asize();
        match offset.checked_add(len) {
            Some(end) if end <= limit => Ok(()),
            _ => Err(VdevError::OutOfRange { offset, len, limit }),
        }
    }

    /// Writes `data` (any length >= 1, zero-padded to sectors) at `offset`
    /// to every usable child. Succeeds if the block is recoverable from what
    /// was written (mirror: one child; raidz: at most parity columns failed);
    /// the outcome lists children that did not get the write.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<WriteOutcome, VdevError> {
        self.write_plan(&self.plan(offset, data)?)
    }

    /// Reads `psize` bytes at `offset` and returns the first version that
    /// `verify` accepts, reconstructing from redundancy and rewriting the bad
    /// copies or columns in place. Never returns bytes `verify` rejected.
    /// `verify` runs once on a healthy block, and once per candidate while
    /// reconstructing (mirror side, or raidz column combination).
    pub fn read(
        &self,
        offset: u64,
        psize: usize,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Vec<u8>, VdevError> {
        self.check_block(offset, psize as u64)?;
        if self.parity > 0 {
            self.raidz_read(offset, psize, verify)
        } else {
            self.mirror_read(offset, psize, verify)
        }
    }

    /// Scrubs one block: checks every mirror side and every raidz column
    /// (parity recomputed from verified data), repairs every difference, and
    /// reports what it did. Errs like `read` when nothing verifies.
    pub fn scrub(
        &self,
        offset: u64,
        psize: usize,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<ScrubOutcome, VdevError> {
        self.check_block(offset, psize as u64)?;
        if self.parity > 0 {
            self.raidz_scrub(offset, psize, verify)
        } else {
            self.mirror_scrub(offset, psize, verify)
        }
    }

    /// Where the pieces of a block live on the children (mirror: one extent
    /// per child; raidz: one per column). Useful to sort scan I/O or to tell
    /// whether a block touches a given child.
    pub fn extents(&self, offset: u64, psize: u64) -> Result<Vec<ChildExtent>, VdevError> {
        self.check_block(offset, psize)?;
        if self.parity > 0 {
            let lay = self.layout(offset, psize);
            Ok(lay
                .cols
                .iter()
                .enumerate()
                .map(|(c, col)| ChildExtent {
                    child: col.child,
                    leaf_offset: col.leaf_off,
                    len: col.len as u64,
                    parity: c < self.parity,
                })
                .collect())
        } else {
            Ok((0..self.width())
                .map(|child| ChildExtent {
                    child,
                    leaf_offset: DATA_START + offset,
                    len: self.alloc_size(psize),
                    parity: false,
                })
                .collect())
        }
    }

    /// How many flushes of each child had failed until now: a caller takes
    /// it before it writes, and flushes with [`TopVdev::flush_since`].
    pub fn flush_mark(&self) -> FlushMark {
        FlushMark {
            failures: self
                .children
                .iter()
                .map(|c| c.flush_failures.load(Ordering::Acquire))
                .collect(),
            usable: (0..self.width())
                .map(|i| self.handle(i).is_some())
                .collect(),
        }
    }

    /// The children that got into trouble since `mark`: a flush of theirs
    /// failed, or they were in service then and are not now. What was
    /// written to them since may be gone although each write succeeded.
    pub fn troubled_since(&self, mark: &FlushMark) -> Vec<usize> {
        (0..self.width())
            .filter(|&i| {
                let failed = self.children[i].flush_failures.load(Ordering::Acquire)
                    > mark.failures.get(i).copied().unwrap_or(0);
                let left = mark.usable.get(i).copied().unwrap_or(false) && self.handle(i).is_none();
                failed || left
            })
            .collect()
    }

    /// [`TopVdev::flush_since`] a mark taken now: what this flush itself
    /// reports.
    pub fn flush(&self) -> Result<Vec<usize>, VdevError> {
        self.flush_since(&self.flush_mark())
    }

    /// Makes every usable child durable (in parallel). Failures are counted
    /// and fault the child; errs only if more children than the redundancy
    /// are now not durable. Returns the children not durable: those whose
    /// flush failed, since what they were written since their last flush
    /// may be lost (a device drops the pages whose write-back failed), and
    /// those out of service; the caller records them as having missed
    /// those writes.
    ///
    /// A child whose flush failed since `mark` counts as failed here too,
    /// even if its flush now succeeds: the kernel reports a failed
    /// write-back once, to the flush that meets it, and drops the pages,
    /// so a later flush of the same file returns success for writes that
    /// were lost (a sync's flush after an intent log commit's flush failed
    /// on the same disk, or the other way round). Each writer takes its
    /// mark before its writes, so it learns of every failure after them.
    pub fn flush_since(&self, mark: &FlushMark) -> Result<Vec<usize>, VdevError> {
        let handles: Vec<Handle> = (0..self.width()).filter_map(|i| self.handle(i)).collect();
        let results: Vec<bool> = if handles.len() <= 1 {
            handles.iter().map(|h| h.leaf.flush().is_ok()).collect()
        } else {
            let jobs: Vec<Box<dyn FnOnce() -> bool + Send + '_>> = handles
                .iter()
                .map(|h| Box::new(|| h.leaf.flush().is_ok()) as Box<_>)
                .collect();
            crate::workers::run_all(jobs)
                .into_iter()
                .map(|ok| ok.unwrap_or(false))
                .collect()
        };
        let mut durable = Vec::new();
        let mut failed_now = Vec::new();
        for (h, ok) in handles.iter().zip(results) {
            let child = &self.children[h.idx];
            if !ok {
                child.flush_failures.fetch_add(1, Ordering::AcqRel);
                bump(&child.counters.write_errors, 1);
                self.try_fault(h.idx);
            }
            let before = mark.failures.get(h.idx).copied().unwrap_or(0);
            if child.flush_failures.load(Ordering::Acquire) > before {
                failed_now.push(h.idx);
            } else {
                durable.push(h.idx);
            }
        }
        // A child taken out of service since it was written (faulted by
        // another caller's failed flush, or offlined) was not flushed by
        // this one: it is not known to hold the writes either.
        for i in 0..self.width() {
            if !durable.contains(&i) && !failed_now.contains(&i) {
                failed_now.push(i);
            }
        }
        let failed = self.width() - durable.len();
        if failed > self.redundancy() {
            let not_durable: Vec<usize> =
                (0..self.width()).filter(|i| !durable.contains(i)).collect();
            return Err(VdevError::InsufficientReplicas {
                op: "flush",
                failed,
                tolerated: self.redundancy(),
                devices: self.child_paths(&not_durable),
            });
        }
        Ok(failed_now)
    }

    /// State and statistics of every child, in order.
    pub fn leaves(&self) -> Vec<LeafInfo> {
        self.children
            .iter()
            .map(|c| {
                let s = lock(&c.slot);
                LeafInfo {
                    guid: s.guid,
                    path: s.path.clone(),
                    state: s.state(),
                    counters: c.counters.snapshot(),
                    resilvering: s.resilvering,
                }
            })
            .collect()
    }

    /// Read and write latency histograms of every child, in order, with
    /// its current path (successful I/O only; since the last clear).
    pub fn latencies(&self) -> Vec<(PathBuf, tarn_stats::Snapshot, tarn_stats::Snapshot)> {
        self.children
            .iter()
            .map(|c| {
                let path = lock(&c.slot).path.clone();
                (
                    path,
                    c.counters.read_latency.snapshot(),
                    c.counters.write_latency.snapshot(),
                )
            })
            .collect()
    }

    /// The leaf of child `idx`, if one is attached (whatever its state).
    pub fn leaf(&self, idx: usize) -> Option<Arc<dyn Leaf>> {
        self.children
            .get(idx)
            .and_then(|c| lock(&c.slot).leaf.clone())
    }

    /// A child's path and, when it is out of service, why ("offline",
    /// "missing", "faulted"): for error messages.
    pub(crate) fn child_word(&self, idx: usize) -> (String, Option<&'static str>) {
        let Some(c) = self.children.get(idx) else {
            return (format!("child {idx}"), None);
        };
        let s = lock(&c.slot);
        let why = match s.state() {
            LeafState::Online => None,
            LeafState::Offline => Some("offline"),
            LeafState::Missing => Some("missing"),
            LeafState::Faulted => Some("faulted"),
        };
        (s.path.display().to_string(), why)
    }

    /// The paths of children `idxs`, for error messages.
    pub(crate) fn child_paths(&self, idxs: &[usize]) -> Vec<String> {
        idxs.iter().map(|&i| self.child_word(i).0).collect()
    }

    fn child(&self, idx: usize) -> Result<&Child, VdevError> {
        self.children.get(idx).ok_or(VdevError::NoSuchChild {
            idx,
            count: self.width(),
        })
    }

    /// Children other than `except` that cannot be counted on for complete
    /// data: unusable or still resilvering.
    fn weak_children(&self, except: usize) -> usize {
        self.children
            .iter()
            .enumerate()
            .filter(|(i, c)| {
                let s = lock(&c.slot);
                *i != except && (!s.usable() || s.resilvering)
            })
            .count()
    }

    /// Takes a child offline or brings it back. Refuses to offline a child if
    /// the remaining complete children could no longer serve all data. Bringing
    /// a child back does not resilver it: the pool decides what it missed.
    pub fn set_offline(&self, idx: usize, offline: bool) -> Result<(), VdevError> {
        let child = self.child(idx)?;
        let _g = lock(&self.state_lock);
        if offline {
            let (strong, already) = {
                let s = lock(&child.slot);
                (s.usable() && !s.resilvering, s.offline)
            };
            if !already && strong && self.weak_children(idx) + 1 > self.redundancy() {
                return Err(VdevError::Refused(format!(
                    "taking child {idx} offline would leave data unreadable"
                )));
            }
        }
        lock(&child.slot).offline = offline;
        Ok(())
    }

    /// Puts a new device in place of child `idx` (online, resilvering, fresh
    /// counters). Refuses a device smaller than the vdev's per-child capacity.
    pub fn replace_leaf(
        &self,
        idx: usize,
        leaf: Arc<dyn Leaf>,
        guid: u64,
    ) -> Result<(), VdevError> {
        let child = self.child(idx)?;
        let size = leaf.size();
        let capacity = data_end(size, self.ashift).saturating_sub(DATA_START);
        let needed = self.child_capacity.load(Ordering::Relaxed);
        if size < MIN_LEAF_SIZE || capacity < needed {
            return Err(VdevError::TooSmall {
                path: leaf.path().to_path_buf(),
                size,
                min: (needed + DATA_START + 2 * crate::LABEL_SIZE).max(MIN_LEAF_SIZE),
            });
        }
        let _g = lock(&self.state_lock);
        *lock(&child.slot) = Slot {
            path: leaf.path().to_path_buf(),
            leaf: Some(leaf),
            guid,
            offline: false,
            faulted: false,
            resilvering: true,
        };
        child.counters.clear();
        child.reset_streaks();
        Ok(())
    }

    /// Marks child `idx` as resilvering (reads avoid it, its wrong bytes are
    /// expected and not counted) or done. Unknown indexes are ignored.
    pub fn set_resilvering(&self, idx: usize, on: bool) {
        if let Some(c) = self.children.get(idx) {
            lock(&c.slot).resilvering = on;
        }
    }

    /// Un-faults child `idx` so it is used again (like `zpool clear`); the pool
    /// should resilver it, since it missed writes while faulted.
    pub fn clear_fault(&self, idx: usize) -> Result<(), VdevError> {
        let child = self.child(idx)?;
        let _g = lock(&self.state_lock);
        lock(&child.slot).faulted = false;
        child.reset_streaks();
        Ok(())
    }

    /// Resets every child's statistics and error counts (not their states).
    pub fn clear_counters(&self) {
        for c in &self.children {
            c.counters.clear();
            c.reset_streaks();
        }
    }

    /// Online if every child is usable and complete, Faulted if more children
    /// are unusable than the redundancy covers, Degraded otherwise.
    pub fn health(&self) -> TopHealth {
        let mut unusable = 0;
        let mut resilvering = false;
        for c in &self.children {
            let s = lock(&c.slot);
            unusable += usize::from(!s.usable());
            resilvering |= s.resilvering;
        }
        if unusable > self.redundancy() {
            TopHealth::Faulted
        } else if unusable > 0 || resilvering {
            TopHealth::Degraded
        } else {
            TopHealth::Online
        }
    }

    /// The current config: kind, guid, and each child's guid, path and
    /// offline flag (replacements included).
    pub fn config(&self) -> TopConfig {
        TopConfig {
            kind: self.kind,
            guid: self.guid,
            children: self
                .children
                .iter()
                .map(|c| {
                    let s = lock(&c.slot);
                    crate::LeafConfig {
                        guid: s.guid,
                        path: s.path.clone(),
                        offline: s.offline,
                    }
                })
                .collect(),
        }
    }

    // ---- per-child I/O, shared by mirror and raidz ----

    /// Pins child `idx` for one I/O if it is usable.
    pub(crate) fn handle(&self, idx: usize) -> Option<Handle> {
        let s = lock(&self.children.get(idx)?.slot);
        if !s.usable() {
            return None;
        }
        Some(Handle {
            idx,
            leaf: s.leaf.clone()?,
            resilvering: s.resilvering,
        })
    }

    /// Whether `[off, off + len)` lies in the data region of a leaf.
    pub(crate) fn in_data_region(&self, leaf: &dyn Leaf, off: u64, len: usize) -> bool {
        let end = data_end(leaf.size(), self.ashift);
        off >= DATA_START && off.checked_add(len as u64).is_some_and(|e| e <= end)
    }

    /// Reads from a pinned child, counting the outcome; false on any error.
    pub(crate) fn child_read(&self, h: &Handle, buf: &mut [u8], off: u64) -> bool {
        let start = std::time::Instant::now();
        let ok = self.in_data_region(&*h.leaf, off, buf.len()) && h.leaf.read_at(buf, off).is_ok();
        if ok {
            self.count_read(h, buf.len(), start.elapsed());
        } else {
            bump(&self.children[h.idx].counters.read_errors, 1);
            self.note_error(h.idx, READ);
        }
        ok
    }

    /// A merged read (see `read_many`): counted like [`TopVdev::child_read`]
    /// when it succeeds; a failure is not counted here, because the blocks
    /// in it are read again alone and those reads count what fails (a bad
    /// sector in a gap between pieces fails no block at all); `read_many`
    /// counts a failure of a run with no gap that reading alone got past.
    /// It reads past the page cache where the leaf can
    /// ([`Leaf::read_direct_at`]).
    pub(crate) fn child_read_merged(&self, h: &Handle, buf: &mut [u8], off: u64) -> bool {
        let start = std::time::Instant::now();
        let ok = self.in_data_region(&*h.leaf, off, buf.len())
            && h.leaf.read_direct_at(buf, off).is_ok();
        if ok {
            self.count_read(h, buf.len(), start.elapsed());
        }
        ok
    }

    /// A child's read and checksum errors so far (see `read_many`, which
    /// counts what a merged read met only when reading alone did not).
    pub(crate) fn error_counts(&self, idx: usize) -> (u64, u64) {
        let c = &self.children[idx].counters;
        (
            c.read_errors.load(Ordering::Relaxed),
            c.cksum_errors.load(Ordering::Relaxed),
        )
    }

    /// Counts a read error that reading again got past (a merged read
    /// that failed where reading alone then worked): counted, as
    /// [`TopVdev::child_read`] counts it, but not as an error in a row for
    /// the fault policy, since the child read well right after.
    pub(crate) fn count_passing_read_error(&self, idx: usize) {
        bump(&self.children[idx].counters.read_errors, 1);
    }

    /// Counts a read of `len` bytes from a child that took `took` and
    /// succeeded (what a failure counts depends on the read: see
    /// [`TopVdev::child_read`] and [`TopVdev::child_read_merged`]).
    pub(crate) fn count_read(&self, h: &Handle, len: usize, took: std::time::Duration) {
        let c = &self.children[h.idx].counters;
        c.read_latency.observe(took);
        bump(&c.read_ops, 1);
        bump(&c.read_bytes, len as u64);
        self.note_ok(h.idx, READ);
    }

    /// Writes to a pinned child, counting the outcome; false on any error.
    pub(crate) fn child_write(&self, h: &Handle, buf: &[u8], off: u64) -> bool {
        self.child_write_vectored(h, &[buf], off)
    }

    /// Like [`TopVdev::child_write`] for the concatenation of `bufs`.
    pub(crate) fn child_write_vectored(&self, h: &Handle, bufs: &[&[u8]], off: u64) -> bool {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let start = std::time::Instant::now();
        let ok = self.in_data_region(&*h.leaf, off, len)
            && match bufs {
                [one] => h.leaf.write_at(one, off).is_ok(),
                _ => h.leaf.write_vectored_at(bufs, off).is_ok(),
            };
        let buf_len = len;
        let c = &self.children[h.idx].counters;
        if ok {
            c.write_latency.since(start);
            bump(&c.write_ops, 1);
            bump(&c.write_bytes, buf_len as u64);
            self.note_ok(h.idx, WRITE);
        } else {
            bump(&c.write_errors, 1);
            self.note_error(h.idx, WRITE);
        }
        ok
    }

    /// Turns self-heal on or off. Import turns it off while it tries older
    /// uberblocks: their blocks may have been reused since, and "repairing"
    /// them would overwrite newer data. While it is off, wrong bytes are
    /// not counted as checksum errors either: the reader is probing.
    pub fn set_self_heal(&self, on: bool) {
        self.heal_enabled.store(on, Ordering::Release);
    }

    /// Rewrites a bad copy or column; returns the bytes repaired (0 on failure
    /// or while self-heal is off).
    pub(crate) fn heal(&self, h: &Handle, buf: &[u8], off: u64) -> u64 {
        if !self.heal_enabled.load(Ordering::Acquire) {
            return 0;
        }
        if self.child_write(h, buf, off) {
            buf.len() as u64
        } else {
            0
        }
    }

    /// Records that a child returned wrong bytes. A resilvering child is
    /// expected to hold stale data, so it is not blamed.
    pub(crate) fn note_cksum(&self, h: &Handle) {
        // With self-heal off the reader is probing (import trying older
        // uberblocks, the intent log's end): wrong bytes are expected.
        if !h.resilvering && self.heal_enabled.load(Ordering::Acquire) {
            bump(&self.children[h.idx].counters.cksum_errors, 1);
        }
    }

    fn note_ok(&self, idx: usize, kind: usize) {
        let r = &self.children[idx].streaks[kind];
        if r.load(Ordering::Relaxed) != 0 {
            r.store(0, Ordering::Relaxed);
        }
    }

    fn note_error(&self, idx: usize, kind: usize) {
        let n = self.children[idx].streaks[kind].fetch_add(1, Ordering::Relaxed) + 1;
        if n >= FAULT_AFTER_ERRORS {
            self.try_fault(idx);
        }
    }

    /// Stops using child `idx` unless the others could not serve all data.
    fn try_fault(&self, idx: usize) {
        let _g = lock(&self.state_lock);
        let strong = {
            let s = lock(&self.children[idx].slot);
            s.usable() && !s.resilvering
        };
        if strong && self.weak_children(idx) + 1 > self.redundancy() {
            return;
        }
        lock(&self.children[idx].slot).faulted = true;
    }
}
