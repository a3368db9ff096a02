//! Free-space accounting for one top-level vdev.
//!
//! # Theory
//!
//! A [`SpaceMap`] covers a vdev's allocatable address space `[0, asize)` in
//! units of `align` bytes (the sector size, or `(parity + 1)` sectors for
//! raidz, so `align` need not be a power of two). In memory it keeps the free
//! extents, merged with their neighbours, indexed both by offset and by size.
//!
//! **What is persisted.** The allocated extents (the complement of the free
//! extents, merged), every deferred free with the txg that freed it, and the
//! next-fit cursor. Free space is derived on load. The encoding carries no
//! checksum of its own: the pool stores it in a checksummed block.
//!
//! **Why frees are deferred.** A block freed in txg `T` is no longer
//! referenced by uberblock `T`, but it still is by uberblock `T - 1` and older
//! ones, and import falls back to an older uberblock when the newest is torn
//! or does not verify. While txg `S` is being written, the last
//! `DEFER_TXGS` durable uberblocks (`S - 1`, `S - 2`) must stay intact, so
//! space freed in `T` may be reused by `S` only when `S >= T + DEFER_TXGS`.
//! [`SpaceMap::free_deferred`] therefore keeps the range allocated (it counts
//! in both [`SpaceMap::allocated`] and [`SpaceMap::deferred`]) until
//! [`SpaceMap::release_deferred`] is called with such an `S`; the pool calls
//! it with the txg it is about to sync, before allocating anything for it. A block born in the
//! txg still being built was never referenced by a durable uberblock and goes
//! back at once through [`SpaceMap::free_now`].
//!
//! **Persisting the map in the txg that changes it.** The map's own blocks are
//! allocated from the space it describes, so the sync step runs in this order:
//! (1) `free_deferred` the blocks holding the previous encoding; (2) ask
//! [`SpaceMap::encoded_len_bound`] for the size after `k` more allocations
//! (one allocation can add at most one extent; typically `k = 1`); (3)
//! allocate the blocks; (4) `encode`. The encoding then records its own blocks
//! as allocated and the old copy as deferred, and fits in what was reserved.
//! Nothing may be allocated or freed on this vdev for the txg after step (4):
//! such a change would be missing from the copy on disk.
//!
//! **ENOSPC and slop.** [`SpaceMap::alloc`] never splits a request: it fails
//! with [`SpaceError::NoSpace`] when no single free extent can hold it, even if
//! the total free space could. Deferred bytes count as allocated, so
//! [`SpaceMap::free`] never promises space that cannot be reused yet. The map
//! knows nothing of reservations: the pool refuses ordinary writes that would
//! dip into [`slop_bytes`] of the pool, and lets deletes and its own metadata
//! use that reserve, because copy-on-write needs new space to release old.
//!
//! # Encoding (version 1, little-endian)
//!
//! | field | type |
//! |---|---|
//! | magic `b"TSPM"` | `[u8; 4]` |
//! | version (1) | `u32` |
//! | asize (multiple of align) | `u64` |
//! | align (nonzero multiple of 512) | `u64` |
//! | cursor (multiple of align, `<= asize`) | `u64` |
//! | allocated-extent count `n` | `u64` |
//! | `n` × (offset, len), ascending, merged (never touching) | `u64, u64` |
//! | deferred-entry count `m` | `u64` |
//! | `m` × (txg, offset, len), ascending by offset, non-overlapping, each inside one allocated extent | `u64, u64, u64` |
//!
//! Every offset and length is a multiple of align, every length nonzero, and
//! nothing may follow the last entry. The encoding is canonical: a map decodes
//! to exactly one state and encodes back to the same bytes.

#![warn(missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound::{Excluded, Unbounded};

/// How many txgs a deferred free waits before its space can be reused, so
/// that this many older uberblocks stay usable for import.
pub const DEFER_TXGS: u64 = 2;

/// Magic at the start of an encoded space map, to reject foreign blocks early.
pub const MAGIC: [u8; 4] = *b"TSPM";

/// Encoding version written by [`SpaceMap::encode`]; others are refused.
pub const VERSION: u32 = 1;

/// Bytes before the first allocated extent: magic, version, asize, align,
/// cursor and the extent count.
const HEADER_LEN: usize = 4 + 4 + 8 + 8 + 8 + 8;
const EXTENT_LEN: usize = 16;
const DEFERRED_LEN: usize = 24;
const SECTOR: u64 = 512;
/// Extents visited by next-fit/first-fit before falling back to best-fit, so a
/// badly fragmented map cannot make every allocation a linear scan.
const SCAN_LIMIT: usize = 1024;

/// Why a space operation was refused; the map is unchanged after any error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpaceError {
    /// No single free extent can hold the request.
    #[error("out of space: need {need} bytes, largest free extent is {largest} bytes")]
    NoSpace {
        /// Requested size after rounding up to align.
        need: u64,
        /// Largest free extent at the time of the request.
        largest: u64,
    },
    /// A free named space that is not live-allocated: double free, never
    /// allocated, already deferred, out of range or misaligned.
    #[error("bad free of [{offset:#x}, +{len:#x}): {why}")]
    BadFree {
        /// Offset passed by the caller.
        offset: u64,
        /// Length passed by the caller.
        len: u64,
        /// What was wrong with the range.
        why: String,
    },
    /// A claim named space that is not entirely free, or an invalid range.
    #[error("bad claim of [{offset:#x}, +{len:#x}): {why}")]
    BadClaim {
        /// Offset passed by the caller.
        offset: u64,
        /// Length passed by the caller.
        len: u64,
        /// What was wrong with the range.
        why: String,
    },
    /// An encoded map failed validation; it must not be trusted.
    #[error("space map record damaged: {0}")]
    Corrupt(String),
}

/// Free-space state of one top-level vdev's address space `[0, asize)`, in
/// allocation units of `align` bytes (any nonzero multiple of 512).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpaceMap {
    asize: u64,
    align: u64,
    /// End of the last allocation: where next-fit starts looking.
    cursor: u64,
    /// Free extents, offset → len, merged with their neighbours.
    free: BTreeMap<u64, u64>,
    /// The same extents as (len, offset), for best-fit and `largest_free`.
    by_size: BTreeSet<(u64, u64)>,
    free_bytes: u64,
    /// Deferred frees, offset → (len, txg); they never overlap each other.
    deferred: BTreeMap<u64, (u64, u64)>,
    /// The same entries as (txg, offset), so release takes a prefix.
    by_txg: BTreeSet<(u64, u64)>,
    deferred_bytes: u64,
}

impl SpaceMap {
    /// Creates a map with everything free; `asize` is rounded down to `align`.
    ///
    /// # Panics
    /// If `align` is not a nonzero multiple of 512: that is a configuration
    /// bug, never a disk condition ([`SpaceMap::decode`] validates it).
    pub fn new(asize: u64, align: u64) -> SpaceMap {
        assert!(
            align != 0 && align.is_multiple_of(SECTOR),
            "space map align {align} is not a nonzero multiple of {SECTOR}"
        );
        let mut map = SpaceMap::blank(asize - asize % align, align);
        if map.asize > 0 {
            map.push_free(0, map.asize);
        }
        map
    }

    /// A map with no free space and no deferred frees.
    fn blank(asize: u64, align: u64) -> SpaceMap {
        SpaceMap {
            asize,
            align,
            cursor: 0,
            free: BTreeMap::new(),
            by_size: BTreeSet::new(),
            free_bytes: 0,
            deferred: BTreeMap::new(),
            by_txg: BTreeSet::new(),
            deferred_bytes: 0,
        }
    }

    /// Size of the managed address space, a multiple of [`SpaceMap::align`].
    pub fn asize(&self) -> u64 {
        self.asize
    }

    /// Allocation unit: every offset and length the map hands out is a multiple.
    pub fn align(&self) -> u64 {
        self.align
    }

    /// Allocates `size` bytes rounded up to align (a zero size takes one unit).
    /// Next-fit from the end of the last allocation, so a stream of writes
    /// lands sequentially on disk, then first-fit from 0, then best-fit once
    /// the search has visited many too-small extents.
    pub fn alloc(&mut self, size: u64) -> Result<u64, SpaceError> {
        let largest = self.largest_free();
        let need = size.max(1).div_ceil(self.align).saturating_mul(self.align);
        if need > largest {
            return Err(SpaceError::NoSpace { need, largest });
        }
        let (start, len, offset) = self.find(need);
        self.carve(start, len, offset, need);
        self.cursor = offset + need;
        self.debug_audit();
        Ok(offset)
    }

    /// Allocates like [`SpaceMap::alloc`], but never leaves the largest free
    /// extent smaller than `keep` bytes (or than it was, if already smaller):
    /// the pool keeps that room for the metadata every txg must write. When
    /// the usual choice would cut into it, the smallest other extent that
    /// fits is used instead.
    pub fn alloc_keeping(&mut self, size: u64, keep: u64) -> Result<u64, SpaceError> {
        let need = size.max(1).div_ceil(self.align).saturating_mul(self.align);
        let Some(&(big_len, big_off)) = self.by_size.last() else {
            return Err(SpaceError::NoSpace { need, largest: 0 });
        };
        if need <= big_len {
            let (start, len, offset) = self.find(need);
            let left = offset - start;
            let right = start + len - offset - need;
            let cuts_reserve =
                (start, len) == (big_off, big_len) && left.max(right) < keep.min(big_len);
            if !cuts_reserve {
                self.carve(start, len, offset, need);
                self.cursor = offset + need;
                self.debug_audit();
                return Ok(offset);
            }
        }
        let other = self
            .by_size
            .range((need, 0)..)
            .find(|&&(l, s)| (l, s) != (big_len, big_off))
            .copied();
        match other {
            Some((len, start)) => {
                self.carve(start, len, start, need);
                self.cursor = start + need;
                self.debug_audit();
                Ok(start)
            }
            None => {
                // What data could still get: the largest extent's share
                // above the reserve, or the next largest extent.
                let second = self.by_size.iter().rev().nth(1).map_or(0, |&(l, _)| l);
                Err(SpaceError::NoSpace {
                    need,
                    largest: second.max(big_len.saturating_sub(keep)),
                })
            }
        }
    }

    /// Picks the extent `(start, len)` and the offset inside it for `need`
    /// bytes; the caller guarantees `need <= largest_free()`.
    fn find(&self, need: u64) -> (u64, u64, u64) {
        let cursor = self.cursor;
        if let Some((&s, &l)) = self.free.range(..=cursor).next_back() {
            if s + l > cursor && s + l - cursor >= need {
                return (s, l, cursor);
            }
        }
        let after = self.free.range((Excluded(cursor), Unbounded));
        let wrapped = self.free.range(..=cursor);
        for (&s, &l) in after.chain(wrapped).take(SCAN_LIMIT) {
            if l >= need {
                return (s, l, s);
            }
        }
        match self.by_size.range((need, 0)..).next() {
            Some(&(l, s)) => (s, l, s),
            None => {
                debug_assert!(false, "no extent of {need} bytes despite largest_free");
                (0, 0, 0)
            }
        }
    }

    /// Returns space at once; only for blocks born in the txg being built,
    /// which no durable uberblock can reference.
    pub fn free_now(&mut self, offset: u64, len: u64) -> Result<(), SpaceError> {
        let (off, end) = self.check_live(offset, len)?;
        self.insert_free(off, end - off);
        self.debug_audit();
        Ok(())
    }

    /// Frees space at the end of `txg`: it stays allocated until
    /// `release_deferred(txg + DEFER_TXGS)` or later, so older uberblocks
    /// remain importable in the meantime.
    pub fn free_deferred(&mut self, offset: u64, len: u64, txg: u64) -> Result<(), SpaceError> {
        let (off, end) = self.check_live(offset, len)?;
        self.deferred.insert(off, (end - off, txg));
        self.by_txg.insert((txg, off));
        self.deferred_bytes += end - off;
        self.debug_audit();
        Ok(())
    }

    /// Makes reusable every deferred free whose txg is at most
    /// `txg - DEFER_TXGS`; call it with the txg about to be synced.
    pub fn release_deferred(&mut self, txg: u64) {
        let Some(limit) = txg.checked_sub(DEFER_TXGS) else {
            return;
        };
        let keep = match limit.checked_add(1) {
            Some(next) => self.by_txg.split_off(&(next, 0)),
            None => BTreeSet::new(),
        };
        let due = std::mem::replace(&mut self.by_txg, keep);
        for (_, off) in due {
            match self.deferred.remove(&off) {
                Some((len, _)) => {
                    self.deferred_bytes -= len;
                    self.insert_free(off, len);
                }
                None => debug_assert!(false, "txg index names missing entry {off:#x}"),
            }
        }
        self.debug_audit();
    }

    /// Bytes allocated, including those waiting in deferred frees.
    pub fn allocated(&self) -> u64 {
        self.asize - self.free_bytes
    }

    /// Bytes freed but not yet reusable (see [`SpaceMap::release_deferred`]).
    pub fn deferred(&self) -> u64 {
        self.deferred_bytes
    }

    /// Bytes that can be allocated now: `asize - allocated`.
    pub fn free(&self) -> u64 {
        self.free_bytes
    }

    /// Size of the largest free extent: the biggest request `alloc` can meet.
    pub fn largest_free(&self) -> u64 {
        self.by_size.last().map_or(0, |&(len, _)| len)
    }

    /// Whether all of `[offset, offset + len)` is allocated (deferred counts);
    /// false for an empty or out-of-range span.
    pub fn is_allocated(&self, offset: u64, len: u64) -> bool {
        match offset.checked_add(len) {
            Some(end) if len > 0 && end <= self.asize => !self.overlaps_free(offset, end),
            _ => false,
        }
    }

    /// Marks a free range allocated, for import-time leak repair and tests;
    /// refused if any part is already allocated or deferred.
    pub fn claim(&mut self, offset: u64, len: u64) -> Result<(), SpaceError> {
        let bad = |why: &str| SpaceError::BadClaim {
            offset,
            len,
            why: why.to_string(),
        };
        let (off, end) = self.check_range(offset, len).map_err(bad)?;
        let Some((&s, &l)) = self.free.range(..=off).next_back() else {
            return Err(bad("range is already allocated"));
        };
        if s + l < end {
            return Err(bad("range is already allocated"));
        }
        self.carve(s, l, off, end - off);
        self.debug_audit();
        Ok(())
    }

    /// Allocated extents, merged and ascending, to compare against what the
    /// trees reference when looking for leaks.
    pub fn allocated_extents(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::with_capacity(self.free.len() + 1);
        let mut pos = 0;
        for (&s, &l) in &self.free {
            if s > pos {
                out.push((pos, s - pos));
            }
            pos = s + l;
        }
        if pos < self.asize {
            out.push((pos, self.asize - pos));
        }
        out
    }

    /// Serializes the map in the canonical format described in the crate docs.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_excluding(&[])
    }

    /// Serializes the map as if the ranges in `exclude` (live allocations,
    /// sorted by offset, none overlapping a deferred entry) were free: what
    /// a txg writes while a later one already allocates. Ranges outside
    /// the allocated space are ignored.
    pub fn encode_excluding(&self, exclude: &[(u64, u64)]) -> Vec<u8> {
        let mut extents = self.allocated_extents();
        if !exclude.is_empty() {
            let mut out = Vec::with_capacity(extents.len() + exclude.len());
            let mut ex = exclude.iter().peekable();
            for (off, len) in extents {
                let end = off + len;
                let mut pos = off;
                // Skip exclusions wholly before this extent.
                while ex.peek().is_some_and(|(o, l)| o + l <= pos) {
                    ex.next();
                }
                let mut it = ex.clone();
                while let Some(&&(o, l)) = it.peek() {
                    if o >= end {
                        break;
                    }
                    let (a, b) = (o.max(pos), (o + l).min(end));
                    if a > pos {
                        out.push((pos, a - pos));
                    }
                    pos = pos.max(b);
                    it.next();
                }
                if pos < end {
                    out.push((pos, end - pos));
                }
            }
            extents = out;
        }
        let mut out = Vec::with_capacity(self.encoded_len_bound(exclude.len()));
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        for v in [self.asize, self.align, self.cursor, extents.len() as u64] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for (off, len) in extents {
            out.extend_from_slice(&off.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
        out.extend_from_slice(&(self.deferred.len() as u64).to_le_bytes());
        for (&off, &(len, txg)) in &self.deferred {
            for v in [txg, off, len] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    /// Parses an encoding with full validation; any inconsistency is
    /// [`SpaceError::Corrupt`], never a panic, since the bytes come from disk.
    pub fn decode(bytes: &[u8]) -> Result<SpaceMap, SpaceError> {
        let mut r = Reader { bytes, pos: 0 };
        if r.take(4)? != MAGIC {
            return Err(corrupt("bad magic"));
        }
        let version = r.u32()?;
        if version != VERSION {
            return Err(SpaceError::Corrupt(format!(
                "unsupported version {version}"
            )));
        }
        let (asize, align, cursor) = (r.u64()?, r.u64()?, r.u64()?);
        if align == 0 || !align.is_multiple_of(SECTOR) {
            return Err(SpaceError::Corrupt(format!("bad align {align}")));
        }
        if !asize.is_multiple_of(align) || !cursor.is_multiple_of(align) || cursor > asize {
            return Err(corrupt("asize or cursor not consistent with align"));
        }
        let mut map = SpaceMap::blank(asize, align);
        map.cursor = cursor;
        let extent = |off: u64, len: u64| -> Result<u64, SpaceError> {
            let end = off.checked_add(len).filter(|&e| e <= asize);
            match end {
                Some(end) if len > 0 && off.is_multiple_of(align) && len.is_multiple_of(align) => {
                    Ok(end)
                }
                _ => Err(SpaceError::Corrupt(format!(
                    "bad extent [{off:#x}, +{len:#x})"
                ))),
            }
        };
        let mut pos = 0;
        for i in 0..r.count(EXTENT_LEN)? {
            let (off, len) = (r.u64()?, r.u64()?);
            let end = extent(off, len)?;
            if i > 0 && off <= pos {
                return Err(corrupt(
                    "allocated extents unsorted, overlapping or unmerged",
                ));
            }
            if off > pos {
                map.push_free(pos, off - pos);
            }
            pos = end;
        }
        if pos < asize {
            map.push_free(pos, asize - pos);
        }
        let mut pos = 0;
        for _ in 0..r.count(DEFERRED_LEN)? {
            let (txg, off, len) = (r.u64()?, r.u64()?, r.u64()?);
            let end = extent(off, len)?;
            if off < pos {
                return Err(corrupt("deferred entries unsorted or overlapping"));
            }
            if map.overlaps_free(off, end) {
                return Err(corrupt("deferred entry covers free space"));
            }
            map.deferred.insert(off, (len, txg));
            map.by_txg.insert((txg, off));
            map.deferred_bytes += len;
            pos = end;
        }
        if r.pos != bytes.len() {
            return Err(corrupt("trailing bytes"));
        }
        map.audit().map_err(SpaceError::Corrupt)?;
        Ok(map)
    }

    /// Upper bound of `encode().len()` after `extra_allocs` more allocations
    /// (each adds at most one extent), so the pool can allocate the map's own
    /// blocks before serializing it.
    pub fn encoded_len_bound(&self, extra_allocs: usize) -> usize {
        let extents = self.allocated_extent_count().saturating_add(extra_allocs);
        HEADER_LEN
            .saturating_add(extents.saturating_mul(EXTENT_LEN))
            .saturating_add(8)
            .saturating_add(self.deferred.len().saturating_mul(DEFERRED_LEN))
    }

    /// Number of merged allocated extents, in O(log n).
    fn allocated_extent_count(&self) -> usize {
        let (Some((&first, _)), Some((&last, &last_len))) =
            (self.free.first_key_value(), self.free.last_key_value())
        else {
            return usize::from(self.asize > 0);
        };
        self.free.len() + 1 - usize::from(first == 0) - usize::from(last + last_len == self.asize)
    }

    /// Validates a caller's range: offset aligned, length nonzero and rounded
    /// up to align, end within asize. Returns `(offset, end)`.
    fn check_range(&self, offset: u64, len: u64) -> Result<(u64, u64), &'static str> {
        if len == 0 {
            return Err("empty range");
        }
        if !offset.is_multiple_of(self.align) {
            return Err("offset is not a multiple of align");
        }
        len.div_ceil(self.align)
            .checked_mul(self.align)
            .and_then(|l| offset.checked_add(l))
            .filter(|&end| end <= self.asize)
            .map(|end| (offset, end))
            .ok_or("range extends past asize")
    }

    /// Checks that a range to be freed is allocated and not already deferred.
    fn check_live(&self, offset: u64, len: u64) -> Result<(u64, u64), SpaceError> {
        let bad = |why: &str| SpaceError::BadFree {
            offset,
            len,
            why: why.to_string(),
        };
        let (off, end) = self.check_range(offset, len).map_err(bad)?;
        if self.overlaps_free(off, end) {
            return Err(bad(
                "part of the range is free (double free or never allocated)",
            ));
        }
        let deferred = self.deferred.range(..end).next_back();
        if deferred.is_some_and(|(&s, &(l, _))| s + l > off) {
            return Err(bad("part of the range is already freed (deferred)"));
        }
        Ok((off, end))
    }

    /// Whether any free extent intersects `[off, end)`: only the last extent
    /// starting before `end` can, as extents are sorted and disjoint.
    fn overlaps_free(&self, off: u64, end: u64) -> bool {
        self.free
            .range(..end)
            .next_back()
            .is_some_and(|(&s, &l)| s + l > off)
    }

    /// Adds an extent known not to touch any other free extent.
    fn push_free(&mut self, off: u64, len: u64) {
        self.free.insert(off, len);
        self.by_size.insert((len, off));
        self.free_bytes += len;
    }

    /// Removes a free extent from both indexes.
    fn pop_free(&mut self, off: u64, len: u64) {
        self.free.remove(&off);
        self.by_size.remove(&(len, off));
        self.free_bytes -= len;
    }

    /// Returns an allocated range to free space, merging with its neighbours.
    fn insert_free(&mut self, off: u64, len: u64) {
        let (mut start, mut end) = (off, off + len);
        if let Some((&ps, &pl)) = self.free.range(..off).next_back() {
            debug_assert!(ps + pl <= off, "freed range overlaps free extent {ps:#x}");
            if ps + pl == off {
                self.pop_free(ps, pl);
                start = ps;
            }
        }
        if let Some((&ns, &nl)) = self.free.range(off..).next() {
            debug_assert!(ns >= end, "freed range overlaps free extent {ns:#x}");
            if ns == end {
                self.pop_free(ns, nl);
                end = ns + nl;
            }
        }
        debug_assert!(end <= self.asize, "free extent beyond asize");
        self.push_free(start, end - start);
    }

    /// Takes `[off, off + len)` out of the free extent `(start, ext_len)`
    /// that contains it, keeping what is left on either side.
    fn carve(&mut self, start: u64, ext_len: u64, off: u64, len: u64) {
        debug_assert!(start <= off && off + len <= start + ext_len);
        self.pop_free(start, ext_len);
        if off > start {
            self.push_free(start, off - start);
        }
        if off + len < start + ext_len {
            self.push_free(off + len, start + ext_len - off - len);
        }
    }

    /// Runs [`SpaceMap::audit`] after a change in debug builds, while the map
    /// is small enough for a full check to be cheap.
    fn debug_audit(&self) {
        if cfg!(debug_assertions) && self.free.len() + self.deferred.len() <= 64 {
            if let Err(why) = self.audit() {
                debug_assert!(false, "space map invariant broken: {why}");
            }
        }
    }

    /// Checks every invariant: free extents disjoint, merged, aligned and in
    /// bounds; both indexes agree; deferred entries disjoint and allocated;
    /// byte counters match, so allocated + free == asize holds with deferred
    /// bytes inside allocated.
    fn audit(&self) -> Result<(), String> {
        let (mut pos, mut sum) = (None::<u64>, 0u64);
        for (&s, &l) in &self.free {
            if l == 0 || !s.is_multiple_of(self.align) || !l.is_multiple_of(self.align) {
                return Err(format!("free extent {s:#x}+{l:#x} empty or misaligned"));
            }
            if pos.is_some_and(|p| s <= p) {
                return Err(format!(
                    "free extent {s:#x} overlaps or touches its predecessor"
                ));
            }
            let end = s.checked_add(l).filter(|&e| e <= self.asize);
            pos = Some(end.ok_or(format!("free extent {s:#x} beyond asize"))?);
            if !self.by_size.contains(&(l, s)) {
                return Err(format!("size index lacks free extent {s:#x}"));
            }
            sum += l;
        }
        if sum != self.free_bytes || self.by_size.len() != self.free.len() {
            return Err("free byte count or size index disagrees with extents".into());
        }
        let (mut pos, mut sum) = (0u64, 0u64);
        for (&s, &(l, txg)) in &self.deferred {
            if s < pos || self.overlaps_free(s, s + l) || !self.by_txg.contains(&(txg, s)) {
                return Err(format!("deferred entry {s:#x} overlaps or is unindexed"));
            }
            pos = s + l;
            sum += l;
        }
        if sum != self.deferred_bytes || self.by_txg.len() != self.deferred.len() {
            return Err("deferred byte count or txg index disagrees with entries".into());
        }
        if self.deferred_bytes > self.allocated() || self.cursor > self.asize {
            return Err("deferred bytes exceed allocated, or cursor beyond asize".into());
        }
        Ok(())
    }
}

fn corrupt(why: &str) -> SpaceError {
    SpaceError::Corrupt(why.to_string())
}

/// Bounds-checked little-endian reader over an encoded map.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SpaceError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| corrupt("truncated"))?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, SpaceError> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64, SpaceError> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    /// Reads a count of `record`-byte entries and checks they fit in what is
    /// left, so a damaged count cannot drive a huge loop.
    fn count(&mut self, record: usize) -> Result<u64, SpaceError> {
        let n = self.u64()?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n.checked_mul(record as u64).is_none_or(|need| need > left) {
            return Err(SpaceError::Corrupt(format!("count {n} exceeds the record")));
        }
        Ok(n)
    }
}

/// Space held back from ordinary writes so deletes, which need copy-on-write
/// space, still work on a full pool: 1/32 of the pool, at least 16 MiB, but
/// never more than half the pool.
pub fn slop_bytes(pool_size: u64) -> u64 {
    (pool_size / 32).max(16 << 20).min(pool_size / 2)
}

#[cfg(test)]
mod tests;
