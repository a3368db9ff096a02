//! A volume: one sparse block device on a dataset's tree.
//!
//! # Theory
//!
//! **Layout.** The device is cut into blocks of `volblocksize` bytes;
//! block `b` is the data block under the 8-byte big-endian key `b`, and
//! the tree holds nothing else. A block that was never written, was
//! trimmed, or was written with zeros has no key (the dataset stores an
//! all-zero block as a hole), so it reads as zeros and takes no space. The
//! geometry (size, block size) lives in the dataset's record, not in the
//! tree, so it is created, snapshotted, cloned and rolled back with the
//! record, in the same exclusive operation as the tree it describes.
//!
//! **One request, one transaction.** A read, a write, a trim of any length
//! is one dataset transaction: a write that covers some blocks whole and
//! some in part lands entirely in one txg or not at all, and it is one
//! record in the intent log when made durable. A whole block is written as
//! is (no read); part of a block is a patch, which costs the intent log
//! only the bytes written. The old block a patch needs is read into the
//! block cache just before the transaction (`warm`), so the transaction,
//! which holds the dataset's lock, copies it from memory instead of
//! holding every other request up for a disk read. Reads take references to the blocks inside the
//! transaction and read them after it, so a slow disk read never holds up
//! the dataset's writers.
//!
//! **Reads.** Every block a volume reads from the disks, a lone one
//! included (a guest's 4k random read, the old block a patch needs), is
//! read as a batch ([`BlockRef::read_many`]): its pieces go out together,
//! past the member files' page cache where the file system allows it, and
//! the verified block is kept in the block cache. A guest keeps its hot
//! data in its own page cache, and the block cache keeps recent blocks;
//! the host's page cache held a third copy of the same bytes, and filling
//! it (with the kernel's read-ahead of the member files) cost more CPU than
//! the block read itself (measured in docs/performance.md, "A volume's
//! lone blocks past the page cache"). A working set larger than the block
//! cache is read from the disks again, not from the host's spare memory:
//! such a host gives the block cache more (`--cache-mib`).
//!
//! **Read-ahead.** A guest streaming its disk (a backup, a copy, a boot)
//! reads one range after the other. Each volume keeps the stream table of
//! [`tarn_dataset::readahead`] (one "file"); a read that continues a
//! stream also takes references to the blocks of the range to read ahead,
//! in its own transaction, and hands them to the read-ahead workers in
//! jobs of [`AHEAD_JOB`] bytes, which put them in the block cache. Random
//! reads start no stream and read nothing ahead. Read-ahead only fills the
//! cache, whose keys name a block's exact contents, so a write or a trim
//! racing it can never make a read return stale bytes.
//!
//! **Durability.** A write returns when its transaction is in the open
//! txg. `flush` (and a FUA write, and every write under `sync=always`)
//! commits the dataset's intent log, which holds every transaction that
//! has returned on any connection: what an initiator's cache flush means.
//! `sync=disabled` makes them return at once (documented as unsafe).
//!
//! **No block past the end.** Every request is checked against the size
//! under a read lock that a resize takes for writing; a shrink deletes
//! every key past the new end in one transaction *before* the record gets
//! the new size. So no block ever exists past the size, and growing a
//! volume exposes zeros, never old data. A crash between the two steps of
//! a shrink leaves the old size with zeros past the new end: the data the
//! owner asked to discard, discarded. A grow deletes past the old end too
//! (it costs nothing when there is nothing), so a key left there by any
//! path can never become visible.
//!
//! **Resizes are serialized process-wide** ([`resize_lock`]): a resize
//! reads the record's size, deletes past the smaller size and sets the new
//! one only if the record still says what it read. Two objects of one
//! volume (a stale one survives a rollback that raced with the daemon
//! closing it), or a rollback or rename between the read and the delete,
//! could otherwise delete data of a size the resize never saw. The daemon
//! holds the same lock around the operations that replace or move a
//! volume's tree.

use std::ops::Bound;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use tarn_dataset::readahead::{self, Prefetch, ReadAhead};
use tarn_dataset::{BlockData, BlockRef, DatasetHandle, DsError, Txn, VolSpec};

use crate::{check_range, Device, Extent, ReadData, VolError};

static RESIZES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Serializes every volume resize in this process; held also by whoever
/// replaces or moves a volume's tree (rollback, rename, destroy), so a
/// resize's read of the size, its delete and its change of the record see
/// one state (see the module docs).
pub fn resize_lock() -> std::sync::MutexGuard<'static, ()> {
    RESIZES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Bytes of blocks one read-ahead job reads.
const AHEAD_JOB: u64 = 256 << 10;

/// Reads the blocks `refs` name (None: a hole), in order, as one batch: a
/// 1 MiB read of 16K blocks is 64 blocks, each a few small pieces on
/// each device; read together, the pieces of neighbouring blocks are
/// merged into a few reads per device, the devices read at once
/// ([`BlockRef::read_many`]). A lone block (a small random read) is a
/// batch too: its pieces go out together, past the member files' page
/// cache (see the module docs, "Reads").
fn read_blocks(
    refs: Vec<Option<BlockRef>>,
    handle: &DatasetHandle,
) -> Vec<Option<Result<BlockData, DsError>>> {
    let present: Vec<usize> = (0..refs.len()).filter(|&i| refs[i].is_some()).collect();
    let mut out: Vec<Option<Result<BlockData, DsError>>> = (0..refs.len()).map(|_| None).collect();
    if present.is_empty() {
        return out;
    }
    let read = BlockRef::read_many(refs.into_iter().flatten().collect(), handle.pool());
    for (i, r) in present.into_iter().zip(read) {
        out[i] = Some(r);
    }
    out
}

/// The largest read answered from memory on a front end's network thread
/// ([`Device::read_cached`]): its lookups are the thread's work.
const CACHED_MAX: u64 = 1 << 20;

/// The committed blocks among `blocks` (what read-ahead reads: staged
/// ones are in memory already).
fn committed_refs(
    t: &mut Txn<'_, '_>,
    blocks: std::ops::Range<u64>,
) -> Result<Vec<BlockRef>, DsError> {
    let mut later = Vec::new();
    for b in blocks {
        later.extend(t.block_ref(&key(b))?.filter(BlockRef::is_committed));
    }
    Ok(later)
}

/// Read-ahead jobs for `later`, one per [`AHEAD_JOB`] bytes of blocks: the
/// queue holds jobs, not blocks, and a job per small block would fill it
/// at once.
fn prefetch_jobs(mut later: Vec<BlockRef>, bs: u64, handle: &DatasetHandle) -> Vec<Prefetch> {
    let per = (AHEAD_JOB / bs).max(1) as usize;
    let mut jobs: Vec<Prefetch> = Vec::new();
    while !later.is_empty() {
        let rest = later.split_off(later.len().min(per));
        let group = std::mem::replace(&mut later, rest);
        let handle = handle.clone();
        jobs.push(Box::new(move || {
            BlockRef::prefetch_many(group, handle.pool())
        }));
    }
    jobs
}

/// Keys per page when listing which blocks exist.
const PAGE: usize = 4096;

fn key(block: u64) -> [u8; 8] {
    block.to_be_bytes()
}

fn block_of(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

fn vol_err(e: DsError) -> VolError {
    match e {
        DsError::NoSpace(m) => VolError::NoSpace(m),
        DsError::Quota(m) => VolError::Quota(m),
        DsError::ReadOnly(m) => VolError::ReadOnly(m),
        DsError::Damaged(m) => VolError::Damaged(m),
        DsError::Invalid(m) => VolError::Invalid(m),
        other => VolError::Other(other.to_string()),
    }
}

impl From<DsError> for VolError {
    fn from(e: DsError) -> Self {
        vol_err(e)
    }
}

/// A volume (or a snapshot of one, read-only) as a block [`Device`].
/// Open one per dataset and share it: the size lock is per object.
pub struct Volume {
    handle: DatasetHandle,
    /// The geometry, or None once closed (see [`Volume::close`]).
    spec: RwLock<Option<VolSpec>>,
    /// Sequential readers of the device (see the module docs).
    readahead: ReadAhead,
}

impl std::fmt::Debug for Volume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Volume({})", self.handle.name())
    }
}

/// The geometry of an open volume, with its lock held for one request.
struct SpecGuard<'a> {
    spec: VolSpec,
    _g: RwLockReadGuard<'a, Option<VolSpec>>,
}

impl std::ops::Deref for SpecGuard<'_> {
    type Target = VolSpec;
    fn deref(&self) -> &VolSpec {
        &self.spec
    }
}

/// The part of one block a request touches.
struct Piece {
    block: u64,
    /// Offset inside the block.
    start: usize,
    len: usize,
}

impl Piece {
    /// Appends this piece of a read to `out`: its range of `data` (the
    /// block; None for a hole), zeros for a hole and past the end of a
    /// block shorter than the piece (never written so by this layer).
    fn push_to(&self, out: &mut ReadData, data: Option<BlockData>) {
        let Some(data) = data else {
            out.push_zeros(self.len);
            return;
        };
        let have = data.len().saturating_sub(self.start).min(self.len);
        if have > 0 {
            out.push_block(Box::new(data), self.start, self.start + have);
        }
        out.push_zeros(self.len - have);
    }
}

impl Volume {
    /// Opens the volume behind `handle`; fails if it is a filesystem.
    pub fn open(handle: DatasetHandle) -> Result<Arc<Volume>, VolError> {
        let spec = handle
            .volume()?
            .ok_or_else(|| VolError::Invalid(format!("'{}' is not a volume", handle.name())))?;
        Ok(Arc::new(Volume {
            handle,
            spec: RwLock::new(Some(spec)),
            readahead: ReadAhead::default(),
        }))
    }

    /// The dataset handle.
    pub fn handle(&self) -> &DatasetHandle {
        &self.handle
    }

    /// The geometry now (None once closed).
    pub fn spec(&self) -> Option<VolSpec> {
        *self.spec.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The geometry's lock if it can be had without waiting (None while
    /// a resize holds it).
    fn try_spec(&self) -> Option<std::sync::RwLockReadGuard<'_, Option<VolSpec>>> {
        match self.spec.try_read() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The geometry, held for the length of one request, or an error once
    /// the volume is closed.
    fn read_spec(&self) -> Result<SpecGuard<'_>, VolError> {
        let g = self.spec.read().unwrap_or_else(|p| p.into_inner());
        match *g {
            Some(spec) => Ok(SpecGuard { spec, _g: g }),
            None => Err(self.closed()),
        }
    }

    fn closed(&self) -> VolError {
        VolError::Other(format!(
            "volume '{}' was rolled back, renamed or destroyed since this connection opened \
             it: reconnect",
            self.handle.name()
        ))
    }

    /// Ends this object's life: every request after it fails (waiting for
    /// those running). The daemon closes a volume before a rollback,
    /// rename or destroy replaces or removes its tree, so a connection that
    /// still holds the object cannot write into the new tree with the old
    /// size.
    pub fn close(&self) {
        *self.spec.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Changes the size to `size` bytes (a multiple of the block size).
    /// Shrinking discards the data past the new end, so it is refused
    /// unless `force`. Requests wait while it runs.
    pub fn resize(&self, size: u64, force: bool) -> Result<(), VolError> {
        let _one = resize_lock();
        let mut guard = self.spec.write().unwrap_or_else(|p| p.into_inner());
        let Some(spec) = guard.as_mut() else {
            return Err(self.closed());
        };
        if self.handle.is_snapshot() {
            return Err(VolError::ReadOnly("a snapshot cannot be resized".into()));
        }
        // The record is the truth: this object may be older than a
        // rollback that changed the size under it.
        let now = self.handle.volume()?.ok_or_else(|| {
            VolError::Invalid(format!("'{}' is no longer a volume", self.handle.name()))
        })?;
        if now != *spec {
            return Err(self.closed());
        }
        tarn_dataset::check_volspec(VolSpec { size, ..now })?;
        if size < now.size && !force {
            return Err(VolError::Invalid(format!(
                "shrinking '{}' from {} to {size} bytes discards the data past the new end; \
                 `tarn volume resize --force` does it",
                self.handle.name(),
                now.size
            )));
        }
        // No key may stay past the smaller size: a shrink discards what
        // lies past the new end, and a grow must expose zeros even if a
        // key was left past the old end (by anything: deleting costs the
        // same whatever the range holds).
        let from = key(size.min(now.size) / now.block as u64);
        self.handle.txn(true, |t| {
            t.delete_range(Bound::Included(&from[..]), Bound::Unbounded)
        })?;
        self.handle.set_volsize(now.size, size)?;
        spec.size = size;
        Ok(())
    }

    /// True while this object still describes its dataset: open, the
    /// name still names the same dataset, and the record's geometry is the
    /// one this object checks requests against. The daemon opens a fresh
    /// object (and closes this one) when it is not.
    pub fn is_current(&self) -> bool {
        let Some(spec) = self.spec() else {
            return false;
        };
        match tarn_dataset::open(self.handle.pool(), self.handle.name()) {
            Ok(h) => {
                h.guid() == self.handle.guid() && matches!(h.volume(), Ok(Some(v)) if v == spec)
            }
            Err(_) => false,
        }
    }

    /// Splits `off..off + len` into the blocks it touches.
    fn pieces(spec: &VolSpec, off: u64, len: u64) -> impl Iterator<Item = Piece> {
        let bs = spec.block as u64;
        let end = off + len;
        let mut at = off;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let block = at / bs;
            let start = at - block * bs;
            let n = (bs - start).min(end - at);
            at += n;
            Some(Piece {
                block,
                start: start as usize,
                len: n as usize,
            })
        })
    }

    /// Blocks to read ahead after a read of `len` bytes at `off`: a range
    /// the stream table hands out, cut to the device and to the blocks the
    /// read does not read itself.
    fn ahead(&self, spec: &VolSpec, off: u64, len: u32) -> std::ops::Range<u64> {
        let bs = spec.block as u64;
        self.readahead
            .on_read((0, 0), off, len as u64, bs)
            .map(|r| {
                let first = (r.start / bs).max((off + len as u64).div_ceil(bs));
                let last = r.end.min(spec.size).div_ceil(bs);
                first..last.max(first)
            })
            .unwrap_or(0..0)
    }

    /// Runs a write transaction; a write that found the pool full runs
    /// once more after the space of earlier deletes is back (see
    /// [`DatasetHandle::reclaim_space`]). Then makes it durable if `fua`
    /// or the dataset says `sync=always`.
    fn write_txn(
        &self,
        fua: bool,
        mut f: impl FnMut(&mut tarn_dataset::Txn<'_, '_>) -> Result<(), DsError>,
    ) -> Result<(), VolError> {
        let mut always = false;
        let mut once = || {
            self.handle.txn(true, |t| {
                always = t.prop("sync") == "always";
                f(t)
            })
        };
        match once() {
            Err(DsError::NoSpace(_) | DsError::Quota(_)) if self.handle.reclaim_space() => once(),
            r => r,
        }?;
        if fua || always {
            self.handle.sync()?;
        }
        Ok(())
    }

    /// Reads the committed blocks a write will patch into the block cache,
    /// before its transaction: a patch of a block that is not in the open
    /// txg reads the old block, and inside the transaction that read would
    /// hold the dataset's lock (every other request of the volume) for a
    /// disk read. Read here, the requests' reads run at once and the patch
    /// finds the block cached. They are read as one batch, as every read
    /// of a volume is (see "Reads" in the module docs). Nothing is decided
    /// from what is read: a block that changed since, or a failed read, is
    /// read again (and its error reported) by the transaction.
    fn warm(&self, keys: impl Iterator<Item = [u8; 8]>) {
        let keys: Vec<[u8; 8]> = keys.collect();
        if keys.is_empty() {
            return;
        }
        let refs = self.handle.txn(false, |t| {
            let mut refs = Vec::with_capacity(keys.len());
            for k in &keys {
                refs.extend(t.block_ref(k)?.filter(BlockRef::is_committed));
            }
            Ok::<_, DsError>(refs)
        });
        let _ = BlockRef::read_many(refs.unwrap_or_default(), self.handle.pool());
    }

    /// Zeros `off..off + len`: whole blocks are deleted (one range),
    /// blocks touched in part get zeros patched in where they exist.
    fn zero(&self, off: u64, len: u64, fua: bool) -> Result<(), VolError> {
        let spec = self.read_spec()?;
        check_range(spec.size, off, len)?;
        if len == 0 {
            return Ok(());
        }
        let bs = spec.block as u64;
        let first_whole = off.div_ceil(bs);
        let end_whole = (off + len) / bs;
        // At most two blocks are touched in part: the head and the tail
        // (a trim of a whole disk must not walk its every block).
        let end = off + len;
        let partial: Vec<Piece> = if first_whole > end_whole {
            Self::pieces(&spec, off, len).collect()
        } else {
            let head = off..(first_whole * bs).min(end);
            let tail = (end_whole * bs).max(off)..end;
            [head, tail]
                .into_iter()
                .filter(|r| !r.is_empty())
                .flat_map(|r| Self::pieces(&spec, r.start, r.end - r.start))
                .collect()
        };
        self.warm(partial.iter().map(|p| key(p.block)));
        self.write_txn(fua, |t| {
            if first_whole < end_whole {
                let (a, b) = (key(first_whole), key(end_whole));
                t.delete_range(Bound::Included(&a[..]), Bound::Excluded(&b[..]))?;
            }
            for p in &partial {
                let k = key(p.block);
                if t.get(&k)?.is_some() {
                    t.patch_block(&k, spec.block as usize, p.start, vec![0; p.len])?;
                }
            }
            Ok(())
        })
    }
}

impl Device for Volume {
    fn size(&self) -> u64 {
        self.spec().map_or(0, |s| s.size)
    }

    fn try_size(&self) -> Option<u64> {
        self.try_spec()?.map(|s| s.size)
    }

    fn identity(&self) -> Option<u64> {
        Some(self.handle.guid())
    }

    fn block_size(&self) -> u32 {
        self.spec().map_or(512, |s| s.block)
    }

    fn is_open(&self) -> bool {
        // Asked from the front ends' network threads: a resize holding the
        // geometry for its exclusive operation must not stall them, and
        // only `close` (final) makes a volume not open.
        match self.spec.try_read() {
            Ok(g) => g.is_some(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().is_some(),
            Err(std::sync::TryLockError::WouldBlock) => true,
        }
    }

    fn read_only(&self) -> bool {
        self.handle.is_snapshot()
            || self
                .handle
                .txn(false, |t| Ok::<bool, DsError>(t.is_readonly()))
                .unwrap_or(true)
    }

    fn read_data(&self, off: u64, len: u32) -> Result<ReadData, VolError> {
        let spec = self.read_spec()?;
        check_range(spec.size, off, len as u64)?;
        let pieces: Vec<Piece> = Self::pieces(&spec, off, len as u64).collect();
        let bs = spec.block as u64;
        let ahead = self.ahead(&spec, off, len);
        let (refs, jobs) = self.handle.txn(false, |t| {
            let refs = pieces
                .iter()
                .map(|p| t.block_ref(&key(p.block)))
                .collect::<Result<Vec<Option<BlockRef>>, DsError>>()?;
            let later = committed_refs(t, ahead.clone())?;
            Ok::<_, DsError>((refs, prefetch_jobs(later, bs, &self.handle)))
        })?;
        readahead::submit(jobs);
        let blocks = read_blocks(refs, &self.handle);
        let mut out = ReadData::default();
        for (p, r) in pieces.iter().zip(blocks) {
            p.push_to(&mut out, r.transpose()?);
        }
        Ok(out)
    }

    fn read_cached(&self, off: u64, len: u32) -> Option<Result<ReadData, VolError>> {
        // Held to the end, as `read_spec` holds it: no resize meanwhile.
        let guard = self.try_spec()?;
        let Some(spec) = *guard else {
            return Some(Err(self.closed()));
        };
        if let Err(e) = check_range(spec.size, off, len as u64) {
            return Some(Err(e));
        }
        // The network thread does a large read's lookups on a worker
        // instead (they hold the dataset meanwhile).
        if len as u64 > CACHED_MAX {
            return None;
        }
        let pieces: Vec<Piece> = Self::pieces(&spec, off, len as u64).collect();
        let keys: Vec<[u8; 8]> = pieces.iter().map(|p| key(p.block)).collect();
        let keys: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        let refs = self.handle.try_block_refs(&keys)?;
        let pool = self.handle.pool();
        // All or nothing: a read that falls back reads (and counts) its
        // blocks once, the usual way.
        if !refs.iter().flatten().all(|r| r.in_memory(pool)) {
            return None;
        }
        let mut out = ReadData::default();
        for (p, r) in pieces.iter().zip(refs) {
            let data = match r {
                Some(r) => Some(r.read_cached(pool)?),
                None => None,
            };
            p.push_to(&mut out, data);
        }
        // Answered: the read counts toward read-ahead like any other, and
        // what is to be read ahead is looked up on a read-ahead thread.
        let ahead = self.ahead(&spec, off, len);
        if !ahead.is_empty() {
            let handle = self.handle.clone();
            let bs = spec.block as u64;
            readahead::submit(vec![Box::new(move || {
                if let Ok(later) = handle.txn(false, |t| committed_refs(t, ahead)) {
                    readahead::submit(prefetch_jobs(later, bs, &handle));
                }
            })]);
        }
        Some(Ok(out))
    }

    fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), VolError> {
        let spec = self.read_spec()?;
        check_range(spec.size, off, data.len() as u64)?;
        let bs = spec.block as usize;
        let pieces: Vec<Piece> = Self::pieces(&spec, off, data.len() as u64).collect();
        self.warm(pieces.iter().filter(|p| p.len != bs).map(|p| key(p.block)));
        self.write_txn(fua, |t| {
            let mut at = 0;
            for p in &pieces {
                let bytes = &data[at..at + p.len];
                at += p.len;
                let k = key(p.block);
                if p.len == bs {
                    t.write_block(&k, bytes.to_vec())?;
                } else {
                    t.patch_block(&k, bs, p.start, bytes.to_vec())?;
                }
            }
            Ok(())
        })
    }

    fn flush(&self) -> Result<(), VolError> {
        // A closed volume's writes may be gone (rolled back): a flush must
        // not say they are durable.
        let _spec = self.read_spec()?;
        Ok(self.handle.sync()?)
    }

    fn trim(&self, off: u64, len: u64) -> Result<(), VolError> {
        self.zero(off, len, false)
    }

    fn write_zeroes(&self, off: u64, len: u64, fua: bool) -> Result<(), VolError> {
        self.zero(off, len, fua)
    }

    fn extents(&self, off: u64, len: u64) -> Result<Vec<Extent>, VolError> {
        let spec = self.read_spec()?;
        check_range(spec.size, off, len)?;
        let mut out: Vec<Extent> = Vec::new();
        if len == 0 {
            return Ok(out);
        }
        let bs = spec.block as u64;
        let (first, end) = (off / bs, (off + len).div_ceil(bs));
        let mut push = |from: u64, to: u64, hole: bool| {
            let (from, to) = (from.max(off), to.min(off + len));
            if to <= from {
                return;
            }
            match out.last_mut() {
                Some(e) if e.hole == hole => e.len += to - from,
                _ => out.push(Extent {
                    len: to - from,
                    hole,
                }),
            }
        };
        // Blocks that exist, in order, one page of keys at a time.
        let (mut after, end_key) = (None::<[u8; 8]>, key(end));
        let mut at = first;
        loop {
            let start = after.unwrap_or_else(|| key(first));
            let page = self.handle.txn(false, |t| {
                let lo = match &after {
                    Some(_) => Bound::Excluded(&start[..]),
                    None => Bound::Included(&start[..]),
                };
                t.range(lo, Bound::Excluded(&end_key[..]), PAGE)
            })?;
            for (k, _) in &page {
                let Some(b) = block_of(k) else {
                    return Err(VolError::Other(format!(
                        "volume '{}' holds a key that names no block: {k:02x?}",
                        self.handle.name()
                    )));
                };
                push(at * bs, b * bs, true);
                push(b * bs, (b + 1) * bs, false);
                at = b + 1;
            }
            match page.last() {
                Some((k, _)) if page.len() == PAGE => {
                    after =
                        Some(k.as_slice().try_into().map_err(|_| {
                            VolError::Other("a volume key of the wrong length".into())
                        })?)
                }
                _ => break,
            }
        }
        push(at * bs, end * bs, true);
        Ok(out)
    }
}
