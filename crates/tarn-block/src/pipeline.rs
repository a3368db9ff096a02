//! The block pipeline: bytes in, a verified block pointer out, and back.
//!
//! Writing is split in three steps so the pool can run the CPU-heavy part on
//! several threads and keep allocation (which needs the space maps) in one
//! place: [`prepare`] compresses and checksums, the caller allocates device
//! addresses for `stored.len()` bytes, and [`write_copies`] writes every copy.
//! [`make_ptr`] builds the pointer that the parent will hold.
//!
//! Reading tries each copy in turn and hands the vdev a verification closure,
//! so mirrors and raidz reconstruct and self-heal against the checksum in the
//! pointer; unverified bytes never leave this module. Decompression runs only
//! on bytes whose checksum matched, yet is still bounds-checked: a checksum
//! proves the bytes are the ones written, not that the writer was sane.

use std::borrow::Cow;
use std::sync::Arc;

use tarn_vdev::{TopVdev, VdevError};

use crate::bp::{BlockPtr, BlockType, ChecksumAlg, CompressAlg, Dva, FLAG_ENCRYPTED, MAX_COPIES};
use crate::checksum::checksum;
use crate::compress::{decompress, Compression};
use crate::crypt::{KeySet, Seal};
use crate::BlockError;

/// A block after compression and checksumming, ready to be allocated and
/// written. Its bytes are the caller's, borrowed, only when neither
/// compressed nor sealed; owned bytes may come from the spare buffers:
/// [`Prepared::recycle`] once written.
#[derive(Clone, Debug)]
pub struct Prepared<'a> {
    /// The bytes to store (psize of them).
    pub stored: Cow<'a, [u8]>,
    /// Logical size.
    pub lsize: u32,
    /// How `stored` is compressed.
    pub compress: CompressAlg,
    /// Checksum algorithm.
    pub checksum_alg: ChecksumAlg,
    /// Checksum of `stored`.
    pub checksum: [u8; 32],
    /// Salt, nonce and tag when `stored` is sealed (see `crypt`).
    pub seal: Option<Seal>,
}

/// Compresses (when it saves ≥ 1/8) and checksums one block.
pub fn prepare(
    data: &[u8],
    compression: Compression,
    alg: ChecksumAlg,
) -> Result<Prepared<'_>, BlockError> {
    prepare_sealed(data, compression, alg, None, BlockType::Data)
}

/// Compresses, seals with `key` when there is one (a block of an
/// encrypted dataset, which will be a pointer of type `btype`), and
/// checksums the stored bytes: compress → encrypt → checksum, so the
/// checksum covers exactly what a device holds.
pub fn prepare_sealed<'a>(
    data: &'a [u8],
    compression: Compression,
    alg: ChecksumAlg,
    key: Option<&KeySet>,
    btype: BlockType,
) -> Result<Prepared<'a>, BlockError> {
    if data.is_empty() || data.len() > u32::MAX as usize {
        return Err(BlockError::Format(format!(
            "cannot store a block of {} bytes",
            data.len()
        )));
    }
    let lsize = data.len() as u32;
    let (compress, mut stored) = compression.compress_with(data, key.is_none());
    let seal = match key {
        Some(k) => {
            if let Cow::Borrowed(b) = stored {
                // Sealed in a copy: the caller's bytes stay plaintext.
                let mut v = crate::spare::take(b.len());
                v.extend_from_slice(b);
                stored = Cow::Owned(v);
            }
            Some(k.seal_block(btype, compress, lsize, stored.to_mut())?)
        }
        None => None,
    };
    let sum = checksum(alg, &stored);
    Ok(Prepared {
        stored,
        lsize,
        compress,
        checksum_alg: alg,
        checksum: sum,
        seal,
    })
}

impl Prepared<'_> {
    /// Hands the block's own stored bytes (compressed or sealed) back to
    /// the spare buffers once they are on the devices (see `spare`).
    pub fn recycle(self) {
        if let Cow::Owned(v) = self.stored {
            crate::spare::give(v);
        }
    }
}

/// Builds the pointer for a prepared block written at `dvas` in txg `birth`.
pub fn make_ptr(
    p: &Prepared<'_>,
    dvas: &[Dva],
    birth: u64,
    btype: BlockType,
    level: u8,
) -> BlockPtr {
    let mut all = [Dva::default(); MAX_COPIES];
    for (slot, d) in all.iter_mut().zip(dvas) {
        *slot = *d;
    }
    let mut bp = BlockPtr {
        dvas: all,
        lsize: p.lsize,
        psize: p.stored.len() as u32,
        birth,
        btype,
        level,
        checksum_alg: p.checksum_alg,
        compress: p.compress,
        flags: 0,
        fill: 1,
        checksum: p.checksum,
        ..Default::default()
    };
    if let Some(s) = &p.seal {
        bp.flags |= FLAG_ENCRYPTED;
        bp.salt = s.salt;
        bp.iv = s.iv;
        bp.mac = s.mac;
    }
    bp
}

/// A child device that did not receive a write, so the pool can remember
/// that it missed this txg and resilver it later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Missed {
    /// Top-level vdev index.
    pub vdev: u32,
    /// Child index within it.
    pub child: usize,
}

fn top<'a>(tops: &'a [Arc<TopVdev>], dva: &Dva) -> Result<&'a Arc<TopVdev>, BlockError> {
    tops.get(dva.vdev as usize).ok_or_else(|| {
        BlockError::Format(format!(
            "block address names vdev {} of {}",
            dva.vdev,
            tops.len()
        ))
    })
}

/// Writes `stored` at every address. Fails if any copy could not be written
/// recoverably: a block is acknowledged only when every copy the pointer
/// promises can be read back.
pub fn write_copies(
    tops: &[Arc<TopVdev>],
    dvas: &[Dva],
    stored: &[u8],
) -> Result<Vec<Missed>, BlockError> {
    let mut missed = Vec::new();
    for d in dvas {
        let t = top(tops, d)?;
        let out = t.write(d.offset, stored).map_err(|e| io_error(d, e))?;
        missed.extend(out.missed.into_iter().map(|child| Missed {
            vdev: d.vdev,
            child,
        }));
    }
    Ok(missed)
}

/// Writes every copy of many blocks, `(dvas, stored bytes)` each: on each
/// top-level vdev at once, so pieces of neighbouring blocks that touch on
/// a child become one write (`TopVdev::write_many`). The same bytes and
/// the same per-block outcome as [`write_copies`] for each; returns the
/// children that missed any of them, or the first block that could not be
/// written.
pub fn write_many_copies(
    tops: &[Arc<TopVdev>],
    blocks: &[(&[Dva], &[u8])],
    threads: usize,
) -> Result<Vec<Missed>, BlockError> {
    let mut by_vdev: std::collections::BTreeMap<u32, Vec<(&Dva, &[u8])>> = Default::default();
    for (dvas, stored) in blocks {
        for d in dvas.iter() {
            by_vdev.entry(d.vdev).or_default().push((d, stored));
        }
    }
    let mut missed = Vec::new();
    for (vdev, list) in by_vdev {
        let t = top(tops, list[0].0)?;
        let writes: Vec<(u64, &[u8])> = list.iter().map(|(d, b)| (d.offset, *b)).collect();
        for ((d, _), out) in list.iter().zip(t.write_many(&writes, threads)) {
            let out = out.map_err(|e| io_error(d, e))?;
            missed.extend(out.missed.into_iter().map(|child| Missed { vdev, child }));
        }
    }
    missed.sort_unstable_by_key(|m| (m.vdev, m.child));
    missed.dedup_by_key(|m| (m.vdev, m.child));
    Ok(missed)
}

/// Formats an address the way errors and `status` show it.
pub fn fmt_dva(d: &Dva) -> String {
    format!("{}:{:#x}:{:#x}", d.vdev, d.offset, d.asize)
}

/// Reads the stored bytes of a block, verified against its checksum, trying
/// each copy. The vdev layer reconstructs and self-heals within a copy.
pub fn read_stored(tops: &[Arc<TopVdev>], bp: &BlockPtr) -> Result<Vec<u8>, BlockError> {
    if bp.is_hole() {
        return Err(BlockError::Format("read of a hole pointer".into()));
    }
    copies_from(tops, bp, 0, None)
}

/// The first copy of a block (callers checked it has one).
fn first(bp: &BlockPtr) -> &Dva {
    bp.used_dvas().next().unwrap_or(&bp.dvas[0])
}

/// [`read_stored`] after the first copy failed with `first_err`: the
/// other copies.
fn read_other_copies(
    tops: &[Arc<TopVdev>],
    bp: &BlockPtr,
    first_err: BlockError,
) -> Result<Vec<u8>, BlockError> {
    copies_from(tops, bp, 1, Some(first_err))
}

/// Tries the copies of a block from the `skip`th on.
fn copies_from(
    tops: &[Arc<TopVdev>],
    bp: &BlockPtr,
    skip: usize,
    mut last: Option<BlockError>,
) -> Result<Vec<u8>, BlockError> {
    let verify = |b: &[u8]| checksum(bp.checksum_alg, b) == bp.checksum;
    for d in bp.used_dvas().skip(skip) {
        let t = match top(tops, d) {
            Ok(t) => t,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        match t.read(d.offset, bp.psize as usize, &verify) {
            Ok(bytes) => return Ok(bytes),
            Err(e) => last = Some(BlockError::Io(fmt_dva(d), e)),
        }
    }
    Err(BlockError::Unrecoverable {
        block: describe(bp),
        cause: last
            .map(|e| e.to_string())
            .unwrap_or_else(|| "no copies".into()),
    })
}

/// Reads, verifies, decrypts (with `key`, for an encrypted block) and
/// decompresses a block into its logical bytes. An encrypted block read
/// without a key is an error, never its ciphertext taken for data.
pub fn read_block(
    tops: &[Arc<TopVdev>],
    bp: &BlockPtr,
    key: Option<&KeySet>,
) -> Result<Vec<u8>, BlockError> {
    let stored = read_stored(tops, bp)?;
    logical(bp, stored, key)
}

/// Reads many blocks as [`read_block`] reads one, in order. Blocks whose
/// first copy is on the same top-level vdev are read together through
/// [`TopVdev::read_many`] (the pieces of neighbouring blocks merged into
/// few reads per device), each verified against its own checksum; a block
/// that does not read or verify there is read again alone through every
/// copy ([`read_block`]), so each block's outcome is `read_block`'s.
/// One block is a batch too: its pieces are read together, past the page
/// cache where the devices allow (the caller chose a batch for that).
pub fn read_blocks(
    tops: &[Arc<TopVdev>],
    bps: &[&BlockPtr],
    key: Option<&KeySet>,
) -> Vec<Result<Arc<[u8]>, BlockError>> {
    let alone = |bp: &BlockPtr| read_block(tops, bp, key).map(Arc::from);
    if bps.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<Option<Result<Arc<[u8]>, BlockError>>> =
        (0..bps.len()).map(|_| None).collect();
    let mut by_top: std::collections::BTreeMap<u32, Vec<(usize, u64)>> = Default::default();
    for (i, bp) in bps.iter().enumerate() {
        match bp.used_dvas().next() {
            Some(d) if !bp.is_hole() && top(tops, d).is_ok() => {
                by_top.entry(d.vdev).or_default().push((i, d.offset));
            }
            _ => out[i] = Some(alone(bp)),
        }
    }
    for (vdev, list) in by_top {
        let Some(t) = tops.get(vdev as usize) else {
            continue;
        };
        let want: Vec<(u64, usize)> = list
            .iter()
            .map(|&(i, off)| (off, bps[i].psize as usize))
            .collect();
        let verify = |k: usize, b: &[u8]| {
            let bp = bps[list[k].0];
            checksum(bp.checksum_alg, b) == bp.checksum
        };
        for ((i, _), r) in list.iter().zip(t.read_many(&want, &verify)) {
            out[*i] = Some(match r {
                Ok(stored) => logical_shared(bps[*i], stored, key),
                // The first copy was read alone already (reconstructed,
                // repaired, counted): the other copies, as read_stored
                // would go on.
                Err(e) => {
                    read_other_copies(tops, bps[*i], BlockError::Io(fmt_dva(first(bps[*i])), e))
                        .and_then(|stored| logical(bps[*i], stored, key))
                        .map(Arc::from)
                }
            });
        }
    }
    out.into_iter()
        .zip(bps)
        .map(|(r, bp)| r.unwrap_or_else(|| alone(bp)))
        .collect()
}

/// [`logical`] for stored bytes read into a shared buffer, which holds
/// them first (it may be longer: see [`TopVdev::read_many`]): a block
/// stored as is (after opening it in place, if sealed) is that buffer,
/// with no copy when it is exactly the block; a compressed one is
/// decompressed from it into a new one.
fn logical_shared(
    bp: &BlockPtr,
    mut buf: Arc<[u8]>,
    key: Option<&KeySet>,
) -> Result<Arc<[u8]>, BlockError> {
    let psize = bp.psize as usize;
    if buf.len() < psize {
        return Err(BlockError::Io(
            describe(bp),
            VdevError::InvalidArgument(format!("{} bytes read for {psize}", buf.len())),
        ));
    }
    let Some(b) = Arc::get_mut(&mut buf) else {
        return logical(bp, buf[..psize].to_vec(), key).map(Arc::from);
    };
    match open_in_place(bp, &mut b[..psize], key)? {
        Some(d) => Ok(Arc::from(d)),
        None if buf.len() == psize => Ok(buf),
        None => Ok(Arc::from(&buf[..psize])),
    }
}

/// The logical bytes of a block's verified stored bytes: decrypted (with
/// `key`) and decompressed.
fn logical(
    bp: &BlockPtr,
    mut stored: Vec<u8>,
    key: Option<&KeySet>,
) -> Result<Vec<u8>, BlockError> {
    // Stored as is: the verified bytes are the block (no copy).
    Ok(open_in_place(bp, &mut stored, key)?.unwrap_or(stored))
}

/// Opens a block's verified stored bytes in place if they are sealed;
/// then None when they are its logical bytes as they are, or its bytes
/// decompressed. What [`logical`] and [`logical_shared`] share.
fn open_in_place(
    bp: &BlockPtr,
    stored: &mut [u8],
    key: Option<&KeySet>,
) -> Result<Option<Vec<u8>>, BlockError> {
    match (bp.is_encrypted(), key) {
        (true, Some(k)) => k.open_block(bp, stored)?,
        (true, None) => return Err(BlockError::KeyUnavailable(describe(bp))),
        // Every data block of an encrypted dataset is sealed: one whose
        // pointer says it is not (a pointer changed on disk, a tampered
        // raw stream) would be taken as the file's bytes unauthenticated.
        (false, Some(_)) => {
            return Err(BlockError::Crypto(format!(
                "{} belongs to an encrypted dataset but is not sealed",
                describe(bp)
            )))
        }
        (false, None) => {}
    }
    if bp.compress == CompressAlg::Off && stored.len() == bp.lsize as usize {
        return Ok(None);
    }
    decompress(bp.compress, stored, bp.lsize as usize)
        .map(Some)
        .map_err(|e| BlockError::Decompress(describe(bp), e))
}

/// What scrubbing one block found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockScrub {
    /// Bytes rewritten over all copies.
    pub repaired_bytes: u64,
    /// Copies that were damaged (repaired or not).
    pub bad_copies: u32,
    /// True when no copy could be verified: the block is lost.
    pub unrecoverable: bool,
}

/// Scrubs every copy of a block: each copy is verified on its own (every
/// mirror side, every parity column) and repaired from itself or, when a
/// whole copy is lost, rewritten from a good copy.
pub fn scrub_block(tops: &[Arc<TopVdev>], bp: &BlockPtr) -> BlockScrub {
    let verify = |b: &[u8]| checksum(bp.checksum_alg, b) == bp.checksum;
    let mut out = BlockScrub::default();
    let mut healthy: Option<&Dva> = None;
    let mut lost: Vec<&Dva> = Vec::new();
    for d in bp.used_dvas() {
        let Ok(t) = top(tops, d) else {
            out.bad_copies += 1;
            continue;
        };
        match t.scrub(d.offset, bp.psize as usize, &verify) {
            Ok(s) => {
                out.repaired_bytes += s.repaired_bytes;
                if !s.bad_children.is_empty() {
                    out.bad_copies += 1;
                }
                healthy = healthy.or(Some(d));
            }
            Err(_) => {
                out.bad_copies += 1;
                lost.push(d);
            }
        }
    }
    let Some(good) = healthy else {
        out.unrecoverable = true;
        return out;
    };
    // Only a whole lost copy needs the bytes again, from a healthy one.
    if !lost.is_empty() {
        let bytes = top(tops, good).and_then(|t| {
            t.read(good.offset, bp.psize as usize, &verify)
                .map_err(|e| io_error(good, e))
        });
        match bytes {
            Ok(bytes) => {
                for d in lost {
                    if let Ok(t) = top(tops, d) {
                        if t.write(d.offset, &bytes).is_ok() {
                            out.repaired_bytes += bytes.len() as u64;
                        }
                    }
                }
            }
            Err(_) => out.unrecoverable = true,
        }
    }
    out
}

/// A short description of a block for error messages: type, birth, first address.
pub fn describe(bp: &BlockPtr) -> String {
    let d = bp.used_dvas().next().copied().unwrap_or_default();
    format!(
        "{:?} block born in txg {} at {}",
        bp.btype,
        bp.birth,
        fmt_dva(&d)
    )
}

/// Maps an I/O error text into a block error for a given address.
pub fn io_error(d: &Dva, e: VdevError) -> BlockError {
    BlockError::Io(fmt_dva(d), e)
}
