//! File data as records: record `i` of a file covers bytes
//! `[i·rs, (i+1)·rs)` and is the block value `ino ‖ DATA ‖ i`. A file no
//! larger than its record size is one block of just its length. A block may
//! be shorter than its record (the missing tail reads as zeros) and a
//! missing block is a hole.

use std::ops::Bound;

use crate::codec::{self, K_DATA};
use crate::inode::{Inode, Tx};
use crate::store::{BlockReader, StoreError, Val};
use crate::{FsError, Result};
use tarn_dataset::read_data::ReadData;

/// Largest file size (`off_t` limit).
pub(crate) const MAX_FILE_SIZE: u64 = i64::MAX as u64;

fn data_key(ino: u64, idx: u64) -> Vec<u8> {
    codec::key3(ino, K_DATA, idx)
}

/// A file's record size: the size of its data blocks.
pub(crate) fn rs(inode: &Inode) -> u64 {
    u64::from(inode.recordsize.max(512))
}

/// Existing blocks with record index in `first..=last`: (index, length).
fn blocks_in(tx: &mut Tx, ino: u64, first: u64, last: u64) -> Result<Vec<(u64, u64)>> {
    let hi = data_key(ino, last);
    let mut lo = data_key(ino, first);
    let mut incl = true;
    let mut out = Vec::new();
    loop {
        let b = if incl {
            Bound::Included(lo.as_slice())
        } else {
            Bound::Excluded(lo.as_slice())
        };
        let page = tx.s.range(b, Bound::Included(hi.as_slice()), 1024)?;
        let n = page.len();
        for (k, v) in &page {
            let idx = codec::key3_suffix(k, ino, K_DATA)?;
            match v {
                Val::Block { len } => out.push((idx, u64::from(*len))),
                Val::Plain(_) => {
                    return Err(FsError::io(format!(
                        "inode {ino}: data record {idx} is a plain value"
                    )))
                }
            }
        }
        match page.into_iter().last() {
            Some((k, _)) if n == 1024 => {
                lo = k;
                incl = false;
            }
            _ => break,
        }
    }
    Ok(out)
}

/// Writes record `idx` (a hole if all zeros) and keeps `alloc` right.
fn put_record(tx: &mut Tx, inode: &mut Inode, idx: u64, buf: Vec<u8>) -> Result<()> {
    let key = data_key(inode.ino, idx);
    let old = match tx.s.get(&key)? {
        Some(Val::Block { len }) => u64::from(len),
        None => 0,
        Some(Val::Plain(_)) => {
            return Err(FsError::io(format!(
                "inode {}: data record {idx} is a plain value",
                inode.ino
            )))
        }
    };
    let new = if buf.iter().all(|&b| b == 0) {
        0
    } else {
        buf.len() as u64
    };
    tx.s.write_block(&key, buf)?;
    inode.alloc = inode.alloc.saturating_sub(old).saturating_add(new);
    Ok(())
}

fn get_record(tx: &mut Tx, ino: u64, idx: u64) -> Result<Vec<u8>> {
    tx.s.read_block(&data_key(ino, idx))
        .map(Option::unwrap_or_default)
        .map_err(|e| record_error(ino, idx, e))
}

/// Damage is reported with the file it hit, for the daemon's log.
fn record_error(ino: u64, idx: u64, e: StoreError) -> FsError {
    let e = FsError::from(e);
    if e.errno() == libc::EIO {
        FsError::io(format!("inode {ino}, record {idx}: {}", e.message()))
    } else {
        e
    }
}

/// A read found inside a transaction and done after it (see
/// [`read_plan`]): the blocks it needs, each with its reader.
pub(crate) struct ReadPlan {
    ino: u64,
    off: u64,
    len: usize,
    /// (record index, byte offset of the record in the file, reader).
    parts: Vec<(u64, u64, BlockReader)>,
}

/// For each block of `inode` that overlaps bytes `[off, end)` (`end`
/// clipped to the file size), what `get` makes of its key, with the
/// block's index; holes and blocks `get` has nothing for are left out.
fn for_blocks<T>(
    tx: &mut Tx,
    inode: &Inode,
    off: u64,
    end: u64,
    get: impl Fn(&mut Tx, &[u8]) -> std::result::Result<Option<T>, crate::StoreError>,
) -> Result<Vec<(u64, T)>> {
    let end = end.min(inode.size);
    if off >= end {
        return Ok(Vec::new());
    }
    let rs = rs(inode);
    let mut out = Vec::new();
    for (idx, _) in blocks_in(tx, inode.ino, off / rs, (end - 1) / rs)? {
        match get(tx, &data_key(inode.ino, idx)) {
            Ok(Some(v)) => out.push((idx, v)),
            Ok(None) => {}
            Err(e) => return Err(record_error(inode.ino, idx, e)),
        }
    }
    Ok(out)
}

/// Plans a read of bytes `[off, off+len)` clipped to the file size: finds
/// the blocks under the transaction, so they can be fetched after it ends
/// without holding the dataset ([`ReadPlan::run`]).
pub(crate) fn read_plan(tx: &mut Tx, inode: &Inode, off: u64, len: u64) -> Result<ReadPlan> {
    let end = inode.size.min(off.saturating_add(len));
    let rs = rs(inode);
    let parts = for_blocks(tx, inode, off, end, |tx, key| tx.s.block_reader(key))?;
    Ok(ReadPlan {
        ino: inode.ino,
        off,
        len: end.saturating_sub(off) as usize,
        parts: parts
            .into_iter()
            .map(|(idx, r)| (idx, idx * rs, r))
            .collect(),
    })
}

/// Read-ahead of the records of `inode` that overlap `range` (clipped to
/// the file): one job per block on disk; holes and blocks still in memory
/// need none. Found inside the transaction, run after it.
pub(crate) fn prefetch_plan(
    tx: &mut Tx,
    inode: &Inode,
    range: std::ops::Range<u64>,
) -> Result<Vec<crate::store::Prefetch>> {
    let jobs = for_blocks(tx, inode, range.start, range.end, |tx, key| {
        tx.s.block_prefetcher(key)
    })?;
    Ok(jobs.into_iter().map(|(_, j)| j).collect())
}

impl ReadPlan {
    /// Fetches the blocks and returns the bytes as ranges of them, without
    /// copying; holes and the parts of records past a block's end read as
    /// zeros.
    pub(crate) fn run(self) -> Result<ReadData> {
        let mut out = ReadData::default();
        let end = self.off + self.len as u64;
        // Bytes before `pos` are in `out` already.
        let mut pos = self.off;
        for (idx, rec, reader) in self.parts {
            let data = reader().map_err(|e| record_error(self.ino, idx, e))?;
            let blen = (*data).as_ref().len() as u64;
            // Blocks come in record order and lie inside their records;
            // `max(pos)` keeps a block longer than its record from
            // repeating bytes.
            let a = self.off.max(rec).max(pos);
            let b = end.min(rec.saturating_add(blen));
            if a < b {
                out.push_zeros((a - pos) as usize);
                out.push_block(data, (a - rec) as usize, (b - rec) as usize);
                pos = b;
            }
        }
        out.push_zeros((end - pos) as usize);
        Ok(out)
    }
}

/// Readers of the blocks on disk that a write of `len` bytes at `off`
/// would patch: the records it covers in part (at most the first and the
/// last; the whole block of a file of one block). Found inside a read
/// transaction and run before the write's, so the old record is read from
/// the disks without the dataset's lock and the write's patch finds it in
/// the block cache (see [`crate::Fs::write_iov`]).
pub(crate) fn patch_readers(
    tx: &mut Tx,
    inode: &Inode,
    off: u64,
    len: u64,
) -> Result<Vec<BlockReader>> {
    if len == 0 || inode.size == 0 {
        return Ok(Vec::new());
    }
    // A write past the largest file size reads nothing first: it fails
    // (EFBIG), and the sums below stay far from overflowing.
    let Some(end) = off.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE) else {
        return Ok(Vec::new());
    };
    let rs = rs(inode);
    // The start of the record that holds the file's last byte: records
    // from there on hold nothing old to patch.
    let last = (inode.size - 1) - (inode.size - 1) % rs;
    let mut at: Vec<u64> = Vec::with_capacity(2);
    if inode.size.max(end) <= rs {
        // A file of one block, written and still one block.
        at.push(0);
    } else {
        let head = off - off % rs;
        if off != head || end < head + rs {
            at.push(head);
        }
        let tail = (end - 1) - (end - 1) % rs;
        if tail != head && end < tail + rs {
            at.push(tail);
        }
        // Appends and writes past the end patch at most the last record.
        at.retain(|&a| a <= last);
    }
    let mut out = Vec::new();
    for a in at {
        for (_, r) in for_blocks(tx, inode, a, a + 1, |tx, key| tx.s.block_reader(key))? {
            out.push(r);
        }
    }
    Ok(out)
}

/// Writes `data` at `off`, growing the file as needed.
pub(crate) fn write(tx: &mut Tx, inode: &mut Inode, off: u64, data: &[&[u8]]) -> Result<()> {
    tx.contents_changed(inode.ino);
    let len: usize = data.iter().map(|d| d.len()).sum();
    let end = off
        .checked_add(len as u64)
        .filter(|&e| e <= MAX_FILE_SIZE)
        .ok_or_else(|| FsError::new(libc::EFBIG, "write beyond the largest file size"))?;
    if len == 0 {
        return Ok(());
    }
    let rs = rs(inode);
    let new_size = inode.size.max(end);
    let mut cur = Cursor::new(data);
    if new_size <= rs {
        // The file is one block of just its length.
        let bytes = cur.gather(len);
        patch_record(tx, inode, 0, new_size, off, bytes)?;
    } else {
        for idx in off / rs..=(end - 1) / rs {
            let rec = idx * rs;
            let a = off.max(rec);
            let b = end.min(rec + rs);
            if a == rec && b == rec + rs {
                put_record(tx, inode, idx, cur.gather(rs as usize))?;
            } else {
                // Part of a record: only these bytes are written (the rest
                // of the record, or zeros, stays), see `Store::patch_block`.
                let bytes = cur.gather((b - a) as usize);
                patch_record(tx, inode, idx, rs, a - rec, bytes)?;
            }
        }
    }
    inode.size = new_size;
    Ok(())
}

/// Writes `bytes` at `off` into record `idx`, extended to `len` first, and
/// keeps `alloc` right.
fn patch_record(
    tx: &mut Tx,
    inode: &mut Inode,
    idx: u64,
    len: u64,
    off: u64,
    bytes: Vec<u8>,
) -> Result<()> {
    let (old, new) =
        tx.s.patch_block(&data_key(inode.ino, idx), len as usize, off as usize, bytes)
            .map_err(|e| record_error(inode.ino, idx, e))?;
    inode.alloc = inode
        .alloc
        .saturating_sub(old as u64)
        .saturating_add(new as u64);
    Ok(())
}

/// The slices of a vectored write taken as one run of bytes, read front
/// to back once (records are filled in order), so a payload in many small
/// pieces costs its length, not records × pieces.
struct Cursor<'a> {
    iov: &'a [&'a [u8]],
    idx: usize,
    off: usize,
}

impl<'a> Cursor<'a> {
    fn new(iov: &'a [&'a [u8]]) -> Self {
        Cursor {
            iov,
            idx: 0,
            off: 0,
        }
    }

    /// Hands the next `n` bytes to `f` as subslices in order (fewer if the
    /// slices end first; the caller counted them).
    fn take(&mut self, mut n: usize, mut f: impl FnMut(&'a [u8])) {
        while n > 0 && self.idx < self.iov.len() {
            let s = self.iov[self.idx];
            let k = (s.len() - self.off).min(n);
            if k > 0 {
                f(&s[self.off..self.off + k]);
            }
            self.off += k;
            n -= k;
            if self.off == s.len() {
                self.idx += 1;
                self.off = 0;
            }
        }
    }

    /// The next `n` bytes, in one buffer.
    fn gather(&mut self, n: usize) -> Vec<u8> {
        let mut buf = Vec::with_capacity(n);
        self.take(n, |piece| buf.extend_from_slice(piece));
        debug_assert_eq!(buf.len(), n, "the slices hold the bytes to gather");
        buf
    }
}

/// Sets the size: shrinking frees whole records past the end and cuts the
/// last one; growing only changes the size (the new bytes are a hole).
pub(crate) fn truncate(tx: &mut Tx, inode: &mut Inode, new_size: u64) -> Result<()> {
    tx.contents_changed(inode.ino);
    if new_size > MAX_FILE_SIZE {
        return Err(FsError::new(
            libc::EFBIG,
            "size beyond the largest file size",
        ));
    }
    if new_size >= inode.size {
        inode.size = new_size;
        return Ok(());
    }
    let ino = inode.ino;
    if new_size == 0 {
        let lo = codec::key2(ino, K_DATA);
        let hi = codec::key2(ino, K_DATA + 1);
        tx.s.delete_range(Bound::Included(&lo), Bound::Excluded(&hi))?;
        inode.alloc = 0;
        inode.size = 0;
        return Ok(());
    }
    let rs = rs(inode);
    let keep = new_size.div_ceil(rs);
    let past = blocks_in(tx, ino, keep, u64::MAX)?;
    if !past.is_empty() {
        let gone: u64 = past.iter().map(|&(_, l)| l).sum();
        let lo = data_key(ino, keep);
        let hi = codec::key2(ino, K_DATA + 1);
        tx.s.delete_range(Bound::Included(&lo), Bound::Excluded(&hi))?;
        inode.alloc = inode.alloc.saturating_sub(gone);
    }
    let last = keep - 1;
    let within = (new_size - last * rs) as usize;
    if let Some(mut buf) = tx.s.read_block(&data_key(ino, last))? {
        if new_size <= rs {
            if buf.len() > within {
                buf.truncate(within);
                put_record(tx, inode, last, buf)?;
            }
        } else if buf.len() > within && buf[within..].iter().any(|&b| b != 0) {
            buf[within..].fill(0);
            put_record(tx, inode, last, buf)?;
        }
    }
    inode.size = new_size;
    Ok(())
}

/// Frees `[off, off+len)` inside the file: records fully inside are
/// deleted, partial ones zeroed. The size does not change.
pub(crate) fn punch(tx: &mut Tx, inode: &mut Inode, off: u64, len: u64) -> Result<()> {
    tx.contents_changed(inode.ino);
    let end = inode.size.min(off.saturating_add(len));
    if off >= end {
        return Ok(());
    }
    let rs = rs(inode);
    for (idx, blen) in blocks_in(tx, inode.ino, off / rs, (end - 1) / rs)? {
        let rec = idx * rs;
        let a = off.max(rec);
        let b = end.min(rec + blen);
        if a >= b {
            continue;
        }
        if a == rec && b == rec + blen {
            tx.s.delete(&data_key(inode.ino, idx))?;
            inode.alloc = inode.alloc.saturating_sub(blen);
        } else {
            let mut buf = get_record(tx, inode.ino, idx)?;
            let hi = ((b - rec) as usize).min(buf.len());
            let lo = ((a - rec) as usize).min(hi);
            buf[lo..hi].fill(0);
            put_record(tx, inode, idx, buf)?;
        }
    }
    Ok(())
}

/// Stores a symlink target too long for the inode record.
pub(crate) fn put_long_target(tx: &mut Tx, ino: u64, target: &[u8]) -> Result<()> {
    let mut v = Vec::with_capacity(target.len() + 1);
    v.push(1u8);
    v.extend_from_slice(target);
    tx.s.write_block(&data_key(ino, 0), v)?;
    Ok(())
}

/// Reads a symlink target stored by [`put_long_target`].
pub(crate) fn get_long_target(tx: &mut Tx, ino: u64) -> Result<Vec<u8>> {
    match tx.s.read_block(&data_key(ino, 0))? {
        Some(v) if v.first() == Some(&1) => Ok(v[1..].to_vec()),
        _ => Err(FsError::io(format!(
            "symlink {ino}: target block missing or bad"
        ))),
    }
}
