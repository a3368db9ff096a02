//! What the dataset layer puts in the pool's intent log, and its replay.
//!
//! # Theory
//!
//! Every change the POSIX layer makes goes through a [`crate::Txn`] as a
//! handful of tree operations on one dataset: put a plain value, delete a
//! key, delete a key range, store a data block. A successful write
//! transaction appends those operations, in order, to its dataset's
//! *pending* list; the txg sync commits them anyway and clears the list.
//! A synchronous request (`fsync`, `sync=always`) *commits* the pending
//! list: one record per dataset, handed to the pool's intent log, durable
//! when the pool says so. The pending list is per dataset, so an `fsync` on
//! one dataset never pays for another's writes.
//!
//! **Replay is redo from the committed txg.** The records of open txg
//! `T + 1` were produced by operations that ran, in this order, on the
//! state of committed txg `T` plus earlier operations of `T + 1`. After a
//! crash the pool imports `T`; replaying the records in order runs the same
//! operations on the same state, so the result is the state right after
//! the last logged transaction: a prefix of what the user did, never a
//! mix. Operations on a dataset whose tree was replaced in the open txg
//! (rollback, a new clone, promote, destroy) would not find the state they
//! ran on, so such datasets are *unlogged* until the next sync: their
//! synchronous requests commit the txg instead.
//!
//! **Within one commit only the end state matters** (the pool replays a
//! commit whole or not at all), so a block write or patch that a later
//! operation of the same commit replaces whole on the same key is dropped:
//! rewriting a record many times logs it once.
//!
//! **A write into part of a record logs only its bytes** (a *patch*: key,
//! offset, bytes, and the length the block is extended to first). Replay
//! applies it to the block the earlier operations left under the key, as
//! the write did, so a 4 KiB write into a 1 MiB record costs the log 4 KiB.
//! A write that gives every byte of a new block (a small file written at
//! once) is logged as a whole block instead, so a large one is written in
//! place, as below, rather than copied into the log and written again.
//! A patch is never dropped for an earlier write of its key: it needs it.
//! So replaying a patch reads the block it patches, and a block damaged
//! beyond repair after the write fails the replay like a damaged block a
//! record references (below).
//!
//! **The syncing txg's data is not copied twice.** Pending operations of
//! the txg being synced are logged (the sync may still fail, and the
//! commit cannot know how far it got), but when they hold at least
//! [`WAIT_SYNC_BYTES`] of data and there is no log device, copying them
//! would write that data a second time on the same disks while the sync
//! writes it: the commit returns [`Commit::WaitForSync`] instead, the
//! caller waits for that sync holding nothing, and commits once more
//! (without waiting again, so a steady writer cannot keep an `fsync`
//! chasing txgs), which logs only what the open txg holds. Replay is
//! still redo from the committed txg: the second commit's records belong
//! to the txg after the one that was waited for.
//!
//! **Large blocks are written in place.** A block of at least
//! [`IMMEDIATE_BYTES`] is written now into the room its transaction already
//! holds and the record carries only its pointer; the sync then uses that
//! block as is instead of writing it again. So is every whole block of a
//! record whose whole blocks add up to at least [`IMMEDIATE_RECORD_BYTES`],
//! however small each is: a large write into a volume's 16K blocks (or
//! into files of a small `recordsize`) copied into the log would reach the
//! disks twice, and written in place it reaches them once, in the few
//! large writes its neighbouring rooms merge into. Small records stay
//! copied: one log write is quicker than many scattered block writes.
//! The blocks of one record are written together, prepared (compressed,
//! sealed, checksummed) on the sync's workers at once, so an `fsync`
//! after a large write waits for their preparation divided among the
//! workers rather than for each in turn. Their slots stay locked until
//! all of them are written: a transaction replacing one of them meanwhile
//! waits for that (while it holds the dataset's lock). Replay reads such
//! a block back through its checksum before using it, so a damaged block
//! fails replay loudly rather than turning into wrong file contents.
//!
//! **Encrypted datasets.** A record of an encrypted dataset is *sealed*
//! with the dataset's key as a whole: what stays readable is the dataset
//! id and the pointers of the blocks it references (written in place,
//! sealed like every block of the dataset), which import must claim
//! without a key. Replay needs the key, and at import no key is loaded: a
//! sealed record is *parked* instead, in the same sync that retires the
//! chain (its bytes as data blocks, its referenced blocks kept, all named
//! under `P` + dataset id in the meta tree, so scrub and the leak check
//! see them). Loading the key replays the parked records in order, as one
//! exclusive operation that also deletes them: a block a parked record
//! references is read with the key and staged again as a new block (its
//! birth must be the replaying txg, or a snapshot taken meanwhile would
//! seem to hold it), and the old one is freed. Until then the dataset is
//! locked, so nothing can have changed it except a rollback or a destroy,
//! which drop its parked records, as a rollback drops what an intent log
//! holds for the state it throws away.
//!
//! **Replay never refuses what was acknowledged**: it skips quota and
//! read-only checks (the operations passed them when they ran). A replay
//! that fails anyway (a damaged referenced block, no room) faults the pool
//! with the reason: nothing half-replayed commits, and the log stays for
//! the next import. Imported with `--discard-log`, it keeps the records
//! replayed so far instead (still a prefix of what was acknowledged) and
//! lists what it dropped in the pool's damage list.

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;

use tarn_block::{BlockPtr, BLOCK_PTR_SIZE};
use tarn_pool::{BlockOpts, Cx, LogCommit, Pool, PoolError, Reservation, SyncCx};

use crate::dsl::Dsl;
use crate::overlay::StagedBlock;
use crate::DsError;

/// Data blocks at least this large are written in place and referenced
/// from the log instead of copied into it.
pub const IMMEDIATE_BYTES: usize = 32 << 10;

/// A record whose whole-block writes add up to at least this many bytes
/// has all of them written in place, however small each block is (a
/// volume's 16K blocks, files of a small `recordsize`): copied, they would
/// reach the disks twice, once in the log and once at the sync.
pub const IMMEDIATE_RECORD_BYTES: usize = 1 << 20;

/// One tree operation of a committed transaction.
#[derive(Clone, Debug)]
pub(crate) enum LogOp {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    DeleteRange(Bound<Vec<u8>>, Bound<Vec<u8>>),
    Block(Vec<u8>, Arc<Vec<u8>>),
    BlockRef(Vec<u8>, BlockPtr),
    /// Bytes written into part of a data block (see [`crate::Txn::patch_block`]).
    Patch {
        key: Vec<u8>,
        /// Length the block is extended to (with zeros) first.
        len: u32,
        off: u32,
        bytes: Vec<u8>,
    },
}

impl LogOp {
    /// The key whose whole value this operation sets, whatever it was
    /// before: a patch needs the value before it, so it is not one.
    fn replaces(&self) -> Option<&[u8]> {
        match self {
            LogOp::Put(k, _) | LogOp::Delete(k) | LogOp::Block(k, _) | LogOp::BlockRef(k, _) => {
                Some(k)
            }
            LogOp::DeleteRange(..) | LogOp::Patch { .. } => None,
        }
    }
}

/// Bytes a block may gain when sealed (nonce and tag, rounded up), added
/// to each block's size when the room for a replay is checked.
const SEAL_ROOM: u64 = 64;

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_RANGE: u8 = 3;
const OP_BLOCK: u8 = 4;
const OP_REF: u8 = 5;
const OP_PATCH: u8 = 6;

/// In place of the operation count: the record is sealed (see the module
/// docs and docs/format.md).
const SEALED: u32 = u32::MAX;

/// A sealed record found at import while its dataset's key was not
/// loaded, to be parked by the sync of txg `txg`.
#[derive(Clone, Debug)]
pub(crate) struct Parked {
    pub txg: u64,
    pub id: u64,
    pub record: Vec<u8>,
    pub refs: Vec<BlockPtr>,
}

/// Bytes of a parked record's data blocks.
const PARK_CHUNK: usize = 1 << 20;
/// Parts of a parked record's entries: its bytes, its referenced blocks.
const PART_BYTES: u8 = 0;
const PART_REFS: u8 = 1;

fn park_key(id: u64, seq: u64, part: u8, idx: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(22);
    k.push(crate::record::P_PARK);
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k.push(part);
    k.extend_from_slice(&idx.to_be_bytes());
    k
}

fn park_prefix(id: u64) -> (Vec<u8>, Vec<u8>) {
    let mut lo = vec![crate::record::P_PARK];
    lo.extend_from_slice(&id.to_be_bytes());
    let hi = crate::record::prefix_end(&lo);
    (lo, hi)
}

/// Seals the record of dataset `id`'s commit (`ops`, referencing `refs`)
/// with `key`: `id`, [`SEALED`], the referenced pointers, then the sealed
/// operations, bound to all of that.
pub(crate) fn seal_record(
    id: u64,
    refs: &[BlockPtr],
    ops: &[LogOp],
    key: &tarn_block::KeySet,
) -> Result<Vec<u8>, DsError> {
    let mut out = Vec::with_capacity(16 + refs.len() * BLOCK_PTR_SIZE);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&SEALED.to_le_bytes());
    out.extend_from_slice(&(refs.len() as u32).to_le_bytes());
    for r in refs {
        out.extend_from_slice(&r.encode());
    }
    let plain = zeroize::Zeroizing::new(encode_record(id, ops));
    let sealed = key.seal_record(&out, &plain[8..])?;
    out.extend_from_slice(&sealed);
    Ok(out)
}

/// A record as found in the log: plain, or sealed with the pointers of
/// the blocks it references and the length of its readable header.
enum Found {
    Plain,
    Sealed {
        id: u64,
        refs: Vec<BlockPtr>,
        header: usize,
    },
}

fn classify(b: &[u8]) -> Result<Found, DsError> {
    let mut r = Reader { b, pos: 0 };
    let id = u64::from_le_bytes(
        r.take(8)?
            .try_into()
            .map_err(|_| DsError::Corrupt("intent log: dataset id".into()))?,
    );
    if r.u32()? != SEALED as usize {
        return Ok(Found::Plain);
    }
    let n = r.u32()?;
    if n > b.len() / BLOCK_PTR_SIZE {
        return Err(DsError::Corrupt(format!(
            "intent log: a sealed record claims {n} referenced blocks"
        )));
    }
    let mut refs = Vec::with_capacity(n);
    for _ in 0..n {
        refs.push(
            BlockPtr::decode(r.take(BLOCK_PTR_SIZE)?)
                .map_err(|e| DsError::Corrupt(format!("intent log: block pointer: {e}")))?,
        );
    }
    Ok(Found::Sealed {
        id,
        refs,
        header: r.pos,
    })
}

/// Opens a sealed record with `key`: the dataset id and its operations.
fn open_sealed(
    b: &[u8],
    header: usize,
    key: &tarn_block::KeySet,
) -> Result<(u64, Vec<LogOp>), DsError> {
    let plain = key
        .open_record(&b[..header], &b[header..])
        .map_err(|e| DsError::Damaged(e.to_string()))?;
    let mut whole = zeroize::Zeroizing::new(Vec::with_capacity(8 + plain.len()));
    whole.extend_from_slice(&b[..8]);
    whole.extend_from_slice(&plain);
    decode_record(&whole)
}

fn put_key(out: &mut Vec<u8>, k: &[u8]) {
    out.extend_from_slice(&(k.len() as u16).to_le_bytes());
    out.extend_from_slice(k);
}

fn put_bound(out: &mut Vec<u8>, b: &Bound<Vec<u8>>) {
    match b {
        Bound::Unbounded => out.push(0),
        Bound::Included(k) => {
            out.push(1);
            put_key(out, k);
        }
        Bound::Excluded(k) => {
            out.push(2);
            put_key(out, k);
        }
    }
}

/// Encodes the record of one dataset's commit.
pub(crate) fn encode_record(id: u64, ops: &[LogOp]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        match op {
            LogOp::Put(k, v) => {
                out.push(OP_PUT);
                put_key(&mut out, k);
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(v);
            }
            LogOp::Delete(k) => {
                out.push(OP_DELETE);
                put_key(&mut out, k);
            }
            LogOp::DeleteRange(a, b) => {
                out.push(OP_RANGE);
                put_bound(&mut out, a);
                put_bound(&mut out, b);
            }
            LogOp::Block(k, d) => {
                out.push(OP_BLOCK);
                put_key(&mut out, k);
                out.extend_from_slice(&(d.len() as u32).to_le_bytes());
                out.extend_from_slice(d);
            }
            LogOp::BlockRef(k, bp) => {
                out.push(OP_REF);
                put_key(&mut out, k);
                out.extend_from_slice(&bp.encode());
            }
            LogOp::Patch {
                key,
                len,
                off,
                bytes,
            } => {
                out.push(OP_PATCH);
                put_key(&mut out, key);
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&off.to_le_bytes());
                out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                out.extend_from_slice(bytes);
            }
        }
    }
    out
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DsError> {
        let s = self
            .b
            .get(self.pos..self.pos.saturating_add(n))
            .ok_or_else(|| {
                DsError::Corrupt(format!("intent log record truncated at byte {}", self.pos))
            })?;
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, DsError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<usize, DsError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]) as usize)
    }

    fn u32(&mut self) -> Result<usize, DsError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize)
    }

    fn key(&mut self) -> Result<Vec<u8>, DsError> {
        let n = self.u16()?;
        Ok(self.take(n)?.to_vec())
    }

    fn bound(&mut self) -> Result<Bound<Vec<u8>>, DsError> {
        match self.u8()? {
            0 => Ok(Bound::Unbounded),
            1 => Ok(Bound::Included(self.key()?)),
            2 => Ok(Bound::Excluded(self.key()?)),
            t => Err(DsError::Corrupt(format!("intent log: bound tag {t}"))),
        }
    }
}

/// Decodes a record: the dataset id and its operations.
pub(crate) fn decode_record(b: &[u8]) -> Result<(u64, Vec<LogOp>), DsError> {
    let mut r = Reader { b, pos: 0 };
    let id = u64::from_le_bytes(
        r.take(8)?
            .try_into()
            .map_err(|_| DsError::Corrupt("intent log: dataset id".into()))?,
    );
    let n = r.u32()?;
    let mut ops = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let op = match r.u8()? {
            OP_PUT => {
                let k = r.key()?;
                let len = r.u32()?;
                LogOp::Put(k, r.take(len)?.to_vec())
            }
            OP_DELETE => LogOp::Delete(r.key()?),
            OP_RANGE => {
                let a = r.bound()?;
                LogOp::DeleteRange(a, r.bound()?)
            }
            OP_BLOCK => {
                let k = r.key()?;
                let len = r.u32()?;
                LogOp::Block(k, Arc::new(r.take(len)?.to_vec()))
            }
            OP_REF => {
                let k = r.key()?;
                let bp = BlockPtr::decode(r.take(BLOCK_PTR_SIZE)?)
                    .map_err(|e| DsError::Corrupt(format!("intent log: block pointer: {e}")))?;
                LogOp::BlockRef(k, bp)
            }
            OP_PATCH => {
                let key = r.key()?;
                let len = r.u32()? as u32;
                let off = r.u32()? as u32;
                let n = r.u32()?;
                LogOp::Patch {
                    key,
                    len,
                    off,
                    bytes: r.take(n)?.to_vec(),
                }
            }
            t => return Err(DsError::Corrupt(format!("intent log: operation tag {t}"))),
        };
        ops.push(op);
    }
    if r.pos != b.len() {
        return Err(DsError::Corrupt(format!(
            "intent log record: {} bytes after its operations",
            b.len() - r.pos
        )));
    }
    Ok((id, ops))
}

/// Drops block writes and patches that a later operation of the same
/// commit replaces whole on the same key (see the module docs): whatever
/// they left there, that operation sets the value without reading it.
fn collapse(ops: Vec<LogOp>) -> Vec<LogOp> {
    let mut last: HashMap<Vec<u8>, usize> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        if let Some(k) = op.replaces() {
            last.insert(k.to_vec(), i);
        }
    }
    let superseded = |k: &Vec<u8>, i: usize| last.get(k.as_slice()).is_some_and(|&l| l > i);
    ops.into_iter()
        .enumerate()
        .filter(|(i, op)| match op {
            LogOp::Block(k, _) | LogOp::Patch { key: k, .. } => !superseded(k, *i),
            _ => true,
        })
        .map(|(_, op)| op)
        .collect()
}

/// Unlogged bytes of the txg being synced from which an intent log commit
/// (with no log device) waits for that sync rather than copying them into
/// the log: the sync is writing them already, and the log would write
/// them a second time on the same disks, sealing them again when the
/// dataset is encrypted.
pub const WAIT_SYNC_BYTES: usize = 8 << 20;

/// What [`commit`] did.
#[derive(Debug)]
pub(crate) enum Commit {
    /// The pending operations are durable (or `sync=disabled`).
    Durable,
    /// The log could not take them: commit the txg instead (what could
    /// not be logged stays pending for that sync).
    Unlogged,
    /// Most of them belong to the txg being synced (at least
    /// [`WAIT_SYNC_BYTES`] of data): wait for that sync, then commit again
    /// without waiting, for what is left (the open txg's).
    WaitForSync,
}

/// Commits dataset `id`'s pending operations to the intent log, one
/// commit per txg they belong to (the syncing txg's first, then the open
/// one's); see [`Commit`] for the answers. With `may_wait`, a commit that
/// would copy at least [`WAIT_SYNC_BYTES`] of the syncing txg's data into
/// the log asks to wait for that sync instead.
///
/// One commit of a dataset runs at a time (`LiveDs::commit`): a second
/// `fsync` waits, then finds what the first logged gone from the pending
/// list. The dataset's lock is held only to take the pending operations
/// and the staged blocks they name, so transactions of the dataset go on
/// during the log's writes, except one that replaces a block this commit
/// is writing in place: it waits for the commit's block writes (the
/// block's slot).
pub(crate) fn commit(
    dsl: &Dsl,
    cx: &mut Cx<'_>,
    id: u64,
    may_wait: bool,
) -> Result<Commit, DsError> {
    let (disabled, opts) = {
        let dir = dsl.dir();
        (dir.prop(id, "sync").0 == "disabled", dir.block_opts(id)?)
    };
    if disabled {
        return Ok(Commit::Durable);
    }
    // With a separate log device, copying into the log beats writing in
    // place on the data vdevs.
    let immediate = if cx.log_device() {
        usize::MAX
    } else {
        IMMEDIATE_BYTES
    };
    let live = dsl.live(id)?;
    let _one_at_a_time = live.commit.lock().unwrap_or_else(|e| e.into_inner());
    // The pending operations by txg, in order, with the staged blocks of
    // the large block writes among them.
    let mut groups: Vec<(u64, u64, Vec<LogOp>)> = Vec::new();
    let mut staged: HashMap<(u64, Vec<u8>), Arc<StagedBlock>> = HashMap::new();
    {
        let st = live.lock();
        if st.log.is_empty() {
            return Ok(Commit::Durable);
        }
        // A log device takes copies faster than the data disks write
        // the txg: only without one is waiting the better deal.
        let syncing = st.syncing.as_ref().map(|(t, _)| *t);
        if may_wait && !cx.log_device() && syncing.is_some() {
            let carried: usize = st
                .log
                .iter()
                .filter(|(t, _, _)| Some(*t) == syncing)
                .map(|(_, _, op)| match op {
                    LogOp::Block(_, d) => d.len(),
                    LogOp::Patch { bytes, .. } => bytes.len(),
                    _ => 0,
                })
                .sum();
            if carried >= WAIT_SYNC_BYTES {
                return Ok(Commit::WaitForSync);
            }
        }
        for (txg, seq, op) in &st.log {
            match groups.last_mut() {
                Some((t, last, ops)) if t == txg => {
                    *last = *seq;
                    ops.push(op.clone());
                }
                _ => groups.push((*txg, *seq, vec![op.clone()])),
            }
        }
        for (txg, _, ops) in &groups {
            let overlay = if Some(*txg) == st.syncing.as_ref().map(|(t, _)| *t) {
                st.syncing.as_ref().map(|(_, o)| o.as_ref())
            } else {
                Some(&st.open)
            };
            let Some(o) = overlay else { continue };
            for op in ops {
                if let LogOp::Block(k, data) = op {
                    if let Some(b) = o.staged_at(k) {
                        // The newest write of this key is the staged block.
                        if Arc::ptr_eq(&b.data, data) {
                            staged.insert((*txg, k.clone()), b.clone());
                        }
                    }
                }
            }
        }
    }
    let mut durable_upto: Option<u64> = None;
    let mut all = true;
    for (txg, last_seq, ops) in groups {
        let mut ops = collapse(ops);
        // Small blocks are copied into the record unless it carries enough
        // of them that copying would write a large amount of data twice.
        let whole: usize = ops
            .iter()
            .filter_map(|op| match op {
                LogOp::Block(_, d) => Some(d.len()),
                _ => None,
            })
            .sum();
        let min = if immediate != usize::MAX && whole >= IMMEDIATE_RECORD_BYTES {
            0
        } else {
            immediate
        };
        // The pointer each large block write of the record will carry:
        // written already (by an earlier commit, or by the sync), or
        // written now, all of them at once. Each block's slot stays locked
        // from the decision to write it until its pointer is in the slot,
        // so a transaction replacing the block meanwhile either sees it
        // written (and frees it after the sync) or gives its room back
        // before the decision (and the record carries the data instead).
        let mut bps: Vec<Option<BlockPtr>> = vec![None; ops.len()];
        let mut now = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let LogOp::Block(k, data) = op else { continue };
            if data.len() < min {
                continue;
            }
            let Some(sb) = staged.get(&(txg, k.clone())) else {
                continue;
            };
            let slot = sb.slot();
            match slot.written {
                // Written by an earlier commit, or by the sync already.
                Some(bp) => bps[i] = Some(bp),
                // A block of a txg that is no longer open belongs to its
                // sync, which may be writing it right now into the same
                // room; a block replaced since it was found here has given
                // its room back: the record carries the data instead. Only
                // the open txg's live blocks (open context holds the txg
                // open during this commit) are written early, accounted to
                // that txg.
                None if txg != cx.txg() || slot.released => {}
                None => now.push((i, sb, slot)),
            }
        }
        if !now.is_empty() {
            let blocks = now
                .iter()
                .map(|(_, sb, slot)| (sb.data.as_slice(), opts.clone(), slot.res.clone()))
                .collect();
            match cx.write_blocks_now(blocks, txg) {
                Ok(written) => {
                    for ((i, _, slot), bp) in now.iter_mut().zip(written) {
                        if let Some(bp) = bp {
                            slot.res = Reservation::of_block(&bp);
                            slot.written = Some(bp);
                            bps[*i] = Some(bp);
                        }
                    }
                }
                Err(e) => {
                    // The blocks' room may be half given back: nothing of
                    // this txg may commit with them.
                    cx.fault(format!(
                        "writing a block for the intent log failed ({e}); the pool stopped \
                         so that nothing half-written is committed"
                    ));
                    return Err(e.into());
                }
            }
        }
        drop(now);
        let mut refs = Vec::new();
        for (op, bp) in ops.iter_mut().zip(bps) {
            if let (Some(bp), LogOp::Block(k, _)) = (bp, &mut *op) {
                refs.push(bp);
                *op = LogOp::BlockRef(std::mem::take(k), bp);
            }
        }
        let rec = match &opts.key {
            Some(k) => seal_record(id, &refs, &ops, k)?,
            None => encode_record(id, &ops),
        };
        match cx.log_commit(txg, &[rec], &refs)? {
            LogCommit::Logged => durable_upto = Some(last_seq),
            LogCommit::Unavailable => {
                all = false;
                break;
            }
        }
    }
    // What the log holds now is durable: no later commit needs it.
    if let Some(upto) = durable_upto {
        let mut st = live.lock();
        st.log.retain(|(_, seq, _)| *seq > upto);
        let asize = st.staged_asize();
        live.pending
            .store(asize, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(if all {
        Commit::Durable
    } else {
        Commit::Unlogged
    })
}

/// Replays the records the pool found in its intent log at import, in the
/// open txg. Any failure faults the pool (see the module docs).
pub(crate) fn replay(pool: &Pool) -> Result<usize, DsError> {
    let r = crate::dsl::with_dsl(pool, false, |dsl, cx| {
        let Some(records) = cx.log_take_replay() else {
            return Ok(0);
        };
        let n = records.len();
        for (i, rec) in records.iter().enumerate() {
            let r = match classify(rec) {
                Ok(Found::Plain) => decode_record(rec),
                Ok(Found::Sealed { id, refs, header }) => {
                    let key = {
                        let dir = dsl.dir();
                        dir.rec(id)?;
                        dir.rec(id)?.key.and_then(|k| dir.unlocked.get(&k).cloned())
                    };
                    match key {
                        Some(k) => open_sealed(rec, header, &k),
                        None => {
                            // No key at import: parked for when it is
                            // loaded (see the module docs).
                            dsl.dir().parked_new.push(Parked {
                                txg: cx.txg(),
                                id,
                                record: rec.clone(),
                                refs,
                            });
                            continue;
                        }
                    }
                }
                Err(e) => Err(e),
            };
            let r = r.and_then(|(id, ops)| {
                crate::txn::run(dsl, cx, id, true, false, |t| {
                    for op in &ops {
                        t.redo(op)?;
                    }
                    Ok::<(), DsError>(())
                })?
            });
            let Err(e) = r else { continue };
            if cx.log_discard() {
                // What was replayed is a prefix of what was acknowledged;
                // keep it, say what was lost.
                cx.report_damage(format!(
                    "intent log: replay stopped at record {} of {n} ({e}); the rest was \
                     discarded on request (--discard-log)",
                    i + 1
                ));
                return Ok(n);
            }
            cx.fault(format!(
                "replaying the intent log failed at record {} of {n} ({e}); the pool stopped \
                 so that nothing half-replayed is committed, and the log is kept. Fix the \
                 devices and import again, or import with --discard-log to keep only the \
                 records before it",
                i + 1
            ));
            return Err(e);
        }
        Ok(n)
    })?;
    if r > 0 {
        pool.sync()?;
    }
    Ok(r)
}

/// Writes the records found at import for locked datasets into the meta
/// tree (the sync of the txg they were found in; see the module docs):
/// their bytes as data blocks, their referenced blocks named beside them.
pub(crate) fn park_records(dsl: &Dsl, cx: &mut SyncCx<'_>) -> Result<(), PoolError> {
    let txg = cx.txg();
    let todo: Vec<(Parked, BlockOpts)> = {
        let mut dir = dsl.dir();
        let (now, later): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut dir.parked_new)
            .into_iter()
            .partition(|p| p.txg <= txg);
        dir.parked_new = later;
        now.into_iter()
            .map(|p| {
                // The record is sealed already: stored as it is.
                let opts = BlockOpts {
                    compression: tarn_block::Compression::Off,
                    checksum: tarn_block::ChecksumAlg::parse(&dir.prop(p.id, "checksum").0)
                        .unwrap_or_default(),
                    copies: dir.copies(p.id),
                    key: None,
                };
                (p, opts)
            })
            .collect()
    };
    for (i, (p, opts)) in todo.into_iter().enumerate() {
        let seq = (txg << 24) | i as u64;
        let chunks: Vec<&[u8]> = p.record.chunks(PARK_CHUNK).collect();
        let written = cx.write_blocks(
            chunks.iter().map(|c| (*c, opts.clone(), None)).collect(),
            tarn_pool::Rooms::AsHeld,
        )?;
        for (idx, (c, bp)) in chunks.iter().zip(written).enumerate() {
            let v = match bp {
                Some(bp) => crate::record::block_value(&bp),
                // All zeros: no block, its length instead.
                None => {
                    let mut v = vec![crate::record::TAG_PLAIN];
                    v.extend_from_slice(&(c.len() as u32).to_le_bytes());
                    v
                }
            };
            cx.meta_put(&park_key(p.id, seq, PART_BYTES, idx as u32), &v)?;
        }
        for (idx, r) in p.refs.iter().enumerate() {
            cx.meta_put(
                &park_key(p.id, seq, PART_REFS, idx as u32),
                &crate::record::block_value(r),
            )?;
        }
    }
    for k in std::mem::take(&mut dsl.dir().parked_gone) {
        cx.meta_delete(&k)?;
    }
    Ok(())
}

/// The parked records of dataset `id`, in order: (sequence, its entries'
/// keys and values).
type ParkedEntries = Vec<(u64, Vec<(Vec<u8>, Vec<u8>)>)>;

fn parked_of(cx: &mut SyncCx<'_>, id: u64) -> Result<ParkedEntries, DsError> {
    let (lo, hi) = park_prefix(id);
    let mut out: ParkedEntries = Vec::new();
    let mut start = Bound::Included(lo);
    loop {
        let page = cx.meta_range(start.as_ref().map(Vec::as_slice), Bound::Excluded(&hi), 256)?;
        let Some(last) = page.last().map(|(k, _)| k.clone()) else {
            return Ok(out);
        };
        for (k, v) in page {
            if k.len() != 22 {
                return Err(DsError::Corrupt(format!("parked log entry {k:02x?}")));
            }
            let seq = u64::from_be_bytes(k[9..17].try_into().unwrap_or_default());
            match out.last_mut() {
                Some((s, e)) if *s == seq => e.push((k, v)),
                _ => out.push((seq, vec![(k, v)])),
            }
        }
        start = Bound::Excluded(last);
    }
}

/// True when dataset `id` has intent log records parked (waiting for its
/// key): changes made after its tree, which a load of the key replays.
pub(crate) fn has_parked(
    dir: &crate::dsl::Dir,
    cx: &mut SyncCx<'_>,
    id: u64,
) -> Result<bool, DsError> {
    if dir.parked_new.iter().any(|p| p.id == id) {
        return Ok(true);
    }
    let (lo, hi) = park_prefix(id);
    Ok(!cx
        .meta_range(Bound::Included(&lo[..]), Bound::Excluded(&hi[..]), 1)?
        .is_empty())
}

/// Drops dataset `id`'s parked records (its tree is replaced or gone):
/// their blocks are freed.
pub(crate) fn drop_parked(
    dir: &mut crate::dsl::Dir,
    cx: &mut SyncCx<'_>,
    id: u64,
) -> Result<(), DsError> {
    dir.parked_new.retain(|p| p.id != id);
    for (_, entries) in parked_of(cx, id)? {
        for (k, v) in entries {
            if let Some((&crate::record::TAG_BLOCK, rest)) = v.split_first() {
                cx.free(BlockPtr::decode(rest)?);
            }
            cx.meta_delete(&k)?;
        }
    }
    Ok(())
}

/// One parked record read back and opened: its operations, with every
/// block it references read (with the key) and staged again as a new
/// block, and the blocks to free once it is replayed.
fn unpark(
    cx: &mut SyncCx<'_>,
    key: &tarn_block::KeySet,
    id: u64,
    entries: &[(Vec<u8>, Vec<u8>)],
) -> Result<(Vec<LogOp>, Vec<BlockPtr>), DsError> {
    let mut bytes = Vec::new();
    let mut free = Vec::new();
    for (k, v) in entries {
        let part = k[17];
        match (part, v.split_first()) {
            (PART_BYTES, Some((&crate::record::TAG_BLOCK, rest))) => {
                let bp = BlockPtr::decode(rest)?;
                bytes.extend_from_slice(&cx.read_block_repairing(&bp, None)?);
                free.push(bp);
            }
            (PART_BYTES, Some((&crate::record::TAG_PLAIN, rest))) if rest.len() == 4 => {
                let n = u32::from_le_bytes(rest.try_into().unwrap_or_default()) as usize;
                bytes.resize(bytes.len() + n.min(PARK_CHUNK), 0);
            }
            (PART_REFS, Some((&crate::record::TAG_BLOCK, rest))) => {
                free.push(BlockPtr::decode(rest)?);
            }
            _ => return Err(DsError::Corrupt(format!("parked log entry {k:02x?}"))),
        }
    }
    let Found::Sealed { header, .. } = classify(&bytes)? else {
        return Err(DsError::Corrupt(
            "a parked log record that is not sealed".into(),
        ));
    };
    let (rid, ops) = open_sealed(&bytes, header, key)?;
    if rid != id {
        return Err(DsError::Corrupt(format!(
            "a parked log record of dataset {rid} filed under {id}"
        )));
    }
    // The blocks the readable header names, which will be freed, are
    // exactly those the sealed operations reference: a record whose two
    // lists differ is refused rather than free a block still in use.
    let mut named: Vec<[u8; BLOCK_PTR_SIZE]> = entries
        .iter()
        .filter(|(k, _)| k[17] == PART_REFS)
        .filter_map(|(_, v)| v.get(1..).and_then(|b| b.try_into().ok()))
        .collect();
    let mut used: Vec<[u8; BLOCK_PTR_SIZE]> = ops
        .iter()
        .filter_map(|op| match op {
            LogOp::BlockRef(_, bp) => Some(bp.encode()),
            _ => None,
        })
        .collect();
    named.sort_unstable();
    used.sort_unstable();
    if named != used {
        return Err(DsError::Corrupt(
            "a parked log record whose referenced blocks differ from its header's".into(),
        ));
    }
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        out.push(match op {
            LogOp::BlockRef(k, bp) => {
                let data = cx.read_block_repairing(&bp, Some(key)).map_err(|e| {
                    DsError::Damaged(format!(
                        "parked intent log: the block written for key {k:02x?} does not read \
                         back: {e}"
                    ))
                })?;
                LogOp::Block(k, Arc::new(data))
            }
            other => other,
        });
    }
    Ok((out, free))
}

/// Replays the parked records of every dataset of key `kid`, just loaded
/// (see the module docs), in this exclusive operation: first every record
/// is read back and opened, changing nothing, so a record that cannot be
/// read fails the load with the records kept (as a failed replay at
/// import keeps the log); with `discard`, that record and the ones after
/// it in its dataset are dropped instead and reported as damage (what was
/// before it is still a prefix of what was acknowledged). Then room for
/// the blocks they write is checked, so a pool filled meanwhile fails the
/// load with nothing changed. Then they are applied and deleted; a
/// failure there faults the pool, so nothing half-replayed commits.
/// Returns how many records were replayed.
pub(crate) fn replay_parked(
    dsl: &Dsl,
    cx: &mut SyncCx<'_>,
    kid: u64,
    discard: bool,
) -> Result<usize, DsError> {
    let (key, ids) = {
        let dir = dsl.dir();
        let Some(key) = dir.unlocked.get(&kid).cloned() else {
            return Ok(0);
        };
        let ids: Vec<u64> = dir
            .recs
            .values()
            .filter(|r| r.key == Some(kid) && !r.is_snapshot())
            .map(|r| r.id)
            .collect();
        (key, ids)
    };
    // 1. Everything read and opened; nothing changed yet.
    struct Plan {
        id: u64,
        ops: Vec<LogOp>,
        free: Vec<BlockPtr>,
        keys: Vec<Vec<u8>>,
    }
    let mut plans: Vec<Plan> = Vec::new();
    let mut dropped: Vec<(Vec<Vec<u8>>, Vec<BlockPtr>)> = Vec::new();
    let mut damage: Vec<String> = Vec::new();
    for id in ids {
        let records = parked_of(cx, id)?;
        let n = records.len();
        let name = crate::dsl::rec_name(&dsl.dir(), id).unwrap_or_default();
        let mut failed = false;
        for (i, (_, entries)) in records.iter().enumerate() {
            let keys: Vec<Vec<u8>> = entries.iter().map(|(k, _)| k.clone()).collect();
            if failed {
                let blocks = entries
                    .iter()
                    .filter_map(|(_, v)| match v.split_first() {
                        Some((&crate::record::TAG_BLOCK, rest)) => BlockPtr::decode(rest).ok(),
                        _ => None,
                    })
                    .collect();
                dropped.push((keys, blocks));
                continue;
            }
            match unpark(cx, &key, id, entries) {
                Ok((ops, free)) => plans.push(Plan {
                    id,
                    ops,
                    free,
                    keys,
                }),
                Err(e) if discard => {
                    damage.push(format!(
                        "{name}: the intent log parked at import could not be replayed from \
                         record {} of {n} ({e}); that record and the ones after it were \
                         dropped on request (--discard-log)",
                        i + 1
                    ));
                    failed = true;
                    let blocks = entries
                        .iter()
                        .filter_map(|(_, v)| match v.split_first() {
                            Some((&crate::record::TAG_BLOCK, rest)) => BlockPtr::decode(rest).ok(),
                            _ => None,
                        })
                        .collect();
                    dropped.push((keys, blocks));
                }
                Err(e) => {
                    return Err(DsError::Damaged(format!(
                        "{name}: the intent log parked at import cannot be replayed (record {} \
                         of {n}: {e}); nothing was changed and the key stays unloaded. Repair \
                         the devices and load the key again, or load it with --discard-log to \
                         keep only the records before it",
                        i + 1
                    )));
                }
            }
        }
    }
    // 2. Room for every block the replay writes (see `room_for_replay`).
    room_for_replay(dsl, cx, plans.iter().map(|p| (p.id, p.ops.as_slice())))?;
    // 3. Applied and deleted, in order.
    let replayed = plans.len();
    for p in plans {
        let r = crate::txn::run(dsl, cx, p.id, true, false, |t| {
            for op in &p.ops {
                t.redo(op)?;
            }
            Ok::<(), DsError>(())
        });
        crate::ops::applied(cx, "replaying a parked intent log", r.and_then(|x| x))?;
        for bp in p.free {
            cx.free(bp);
        }
        dsl.dir().parked_gone.extend(p.keys);
    }
    for (keys, blocks) in dropped {
        for bp in blocks {
            cx.free(bp);
        }
        dsl.dir().parked_gone.extend(keys);
    }
    for d in damage {
        cx.report_damage(d);
    }
    Ok(replayed)
}

/// The number of intent log records parked for dataset `name` (waiting
/// for its key).
pub fn parked_records(pool: &Pool, name: &str) -> Result<usize, DsError> {
    crate::dsl::with_excl(pool, |dsl, cx| {
        let id = dsl.dir().id_of(name)?;
        Ok(parked_of(cx, id)?.len())
    })
}

/// The blocks holding the bytes of the records parked for dataset `name`
/// (a diagnostic view, for drills and tests).
pub fn parked_blocks(pool: &Pool, name: &str) -> Result<Vec<BlockPtr>, DsError> {
    crate::dsl::with_excl(pool, |dsl, cx| {
        let id = dsl.dir().id_of(name)?;
        let mut out = Vec::new();
        for (_, entries) in parked_of(cx, id)? {
            for (k, v) in entries {
                if let (PART_BYTES, Some((&crate::record::TAG_BLOCK, rest))) =
                    (k[17], v.split_first())
                {
                    out.push(BlockPtr::decode(rest)?);
                }
            }
        }
        Ok(out)
    })
}

/// Room for every block a replay of parked records (`(dataset, ops)`,
/// one record each) writes, taken and given back before anything changes
/// (nothing else allocates during the exclusive operation): a pool filled
/// while the key was unloaded fails the load here, the records kept,
/// rather than fault the pool halfway through the replay. Each block is
/// counted at its logical size and a little more for what sealing adds,
/// so the estimate errs on the side of refusing. Per key of a dataset it
/// counts the most it holds at once ([`replay_rooms`]).
fn room_for_replay<'o>(
    dsl: &Dsl,
    cx: &mut SyncCx<'_>,
    records: impl Iterator<Item = (u64, &'o [LogOp])>,
) -> Result<(), DsError> {
    let blocks = replay_rooms(records);
    let mut held = Vec::new();
    let mut short = None;
    'rooms: for (&(id, _), rooms) in &blocks {
        let copies = dsl.dir().prop_u64(id, "copies").unwrap_or(1) as u8;
        for &len in rooms {
            match cx.reserve_block(len, copies) {
                Ok(r) => held.push(r),
                Err(e) => {
                    short = Some(e);
                    break 'rooms;
                }
            }
        }
    }
    for r in held {
        cx.release_block(r);
    }
    match short {
        None => Ok(()),
        Some(tarn_pool::PoolError::NoSpace(e)) => Err(DsError::NoSpace(format!(
            "the pool has no room to replay the intent log parked while the key was unloaded; \
             nothing was changed and the key stays unloaded: make room and load it again ({e})"
        ))),
        Some(e) => Err(e.into()),
    }
}

/// The rooms each block (dataset, key) of a replay of `records` holds at
/// its worst moment, for [`room_for_replay`]. A record is one
/// transaction: a block it writes or grows takes a new room each time and
/// gives the old ones back at the transaction's end, so within a record
/// its ops' rooms add up, and so does the room the block already had from
/// an earlier record of the same replay (all of it is one txg, and that
/// room too is given back only at the end of the record that replaces
/// it). Records one after the other reuse what they gave back, so across
/// them the worst record counts. What an earlier record left is counted
/// as its largest room, so the estimate never falls short.
fn replay_rooms<'o>(
    records: impl Iterator<Item = (u64, &'o [LogOp])>,
) -> std::collections::BTreeMap<(u64, &'o [u8]), Vec<u64>> {
    /// A block's largest room an earlier record left it, and the rooms
    /// of its worst moment so far.
    #[derive(Default)]
    struct Held {
        left: u64,
        worst: Vec<u64>,
    }
    let mut blocks: std::collections::BTreeMap<(u64, &[u8]), Held> = Default::default();
    for (id, ops) in records {
        let mut mine: std::collections::BTreeMap<&[u8], Vec<u64>> = Default::default();
        for op in ops {
            let (key, len) = match op {
                LogOp::Block(k, d) => (k, d.len() as u64),
                LogOp::Patch { key, len, .. } => (key, u64::from(*len)),
                _ => continue,
            };
            mine.entry(key.as_slice())
                .or_default()
                .push(len + SEAL_ROOM);
        }
        for (key, rooms) in mine {
            let h = blocks.entry((id, key)).or_default();
            let now: Vec<u64> = (h.left > 0)
                .then_some(h.left)
                .into_iter()
                .chain(rooms.iter().copied())
                .collect();
            if now.iter().sum::<u64>() > h.worst.iter().sum::<u64>() {
                h.worst = now;
            }
            h.left = rooms.into_iter().fold(h.left, u64::max);
        }
    }
    blocks.into_iter().map(|(k, h)| (k, h.worst)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block written by two records in turn holds both rooms while the
    /// second runs; one grown by patches within a record holds a room per
    /// growth; different blocks and datasets are counted apart.
    #[test]
    fn replay_rooms_count_what_is_held_at_once() {
        let block = |k: &[u8], n: usize| LogOp::Block(k.to_vec(), Arc::new(vec![7; n]));
        let patch = |k: &[u8], len: u32| LogOp::Patch {
            key: k.to_vec(),
            len,
            off: 0,
            bytes: vec![1; 16],
        };
        let r1 = [block(b"a", 4096), patch(b"b", 512), patch(b"b", 8192)];
        let r2 = [block(b"a", 4096), LogOp::Delete(b"c".to_vec())];
        let r3 = [block(b"a", 1024)];
        let records = [(1, &r1[..]), (1, &r2[..]), (1, &r3[..]), (2, &r3[..])];
        let rooms = replay_rooms(records.into_iter());
        let s = SEAL_ROOM;
        let want: std::collections::BTreeMap<(u64, &[u8]), Vec<u64>> = [
            ((1, &b"a"[..]), vec![4096 + s, 4096 + s]),
            ((1, &b"b"[..]), vec![512 + s, 8192 + s]),
            ((2, &b"a"[..]), vec![1024 + s]),
        ]
        .into_iter()
        .collect();
        assert_eq!(rooms, want);
    }

    #[test]
    fn records_round_trip_and_refuse_damage() {
        let mut dvas = [tarn_block::Dva::default(); 3];
        dvas[0] = tarn_block::Dva {
            vdev: 0,
            asize: 65536,
            offset: 1 << 20,
        };
        let bp = BlockPtr {
            lsize: 65536,
            psize: 65536,
            birth: 9,
            dvas,
            ..Default::default()
        };
        let ops = vec![
            LogOp::Put(b"k1".to_vec(), b"v".to_vec()),
            LogOp::Delete(b"k2".to_vec()),
            LogOp::DeleteRange(Bound::Included(b"a".to_vec()), Bound::Unbounded),
            LogOp::DeleteRange(Bound::Unbounded, Bound::Excluded(b"z".to_vec())),
            LogOp::Block(b"k3".to_vec(), Arc::new(vec![7u8; 300])),
            LogOp::BlockRef(b"k4".to_vec(), bp),
            LogOp::Patch {
                key: b"k5".to_vec(),
                len: 1 << 20,
                off: 4096,
                bytes: vec![9u8; 4096],
            },
        ];
        let b = encode_record(42, &ops);
        let (id, back) = decode_record(&b).expect("decodes");
        assert_eq!(id, 42);
        assert_eq!(format!("{back:?}"), format!("{ops:?}"));
        for cut in 0..b.len() {
            assert!(decode_record(&b[..cut]).is_err(), "truncated at {cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(decode_record(&long).is_err(), "trailing bytes");
        // Sealed (docs/format.md): id, the marker, the referenced
        // pointers in the clear, then the operations sealed.
        let key = tarn_block::KeySet::new(tarn_block::Cipher::Aes256Gcm, [5; 32]);
        let sealed = seal_record(42, &[bp], &ops, &key).expect("seals");
        assert_eq!(&sealed[..8], &42u64.to_le_bytes());
        assert_eq!(&sealed[8..12], &u32::MAX.to_le_bytes());
        assert_eq!(&sealed[12..16], &1u32.to_le_bytes());
        assert_eq!(&sealed[16..176], &bp.encode());
        assert!(
            !sealed
                .windows(4)
                .any(|w| w == b"k1\x01\x00" || w == [7u8; 4]),
            "no operation in the clear"
        );
        let Ok(Found::Sealed { id, refs, header }) = classify(&sealed) else {
            panic!("a sealed record");
        };
        assert_eq!((id, refs, header), (42, vec![bp], 176));
        let (id, back) = open_sealed(&sealed, header, &key).expect("opens");
        assert_eq!(id, 42);
        assert_eq!(format!("{back:?}"), format!("{ops:?}"));
        // Any changed byte, the readable header included, is refused.
        for at in [0, 9, 14, 20, 176, 190, sealed.len() - 1] {
            let mut bad = sealed.clone();
            bad[at] ^= 1;
            let r = classify(&bad).and_then(|f| match f {
                Found::Sealed { header, .. } => open_sealed(&bad, header, &key),
                Found::Plain => decode_record(&bad),
            });
            assert!(r.is_err(), "byte {at} changed and accepted");
        }
        let other = tarn_block::KeySet::new(tarn_block::Cipher::Aes256Gcm, [6; 32]);
        assert!(open_sealed(&sealed, header, &other).is_err());
        for cut in 0..sealed.len() {
            let r = classify(&sealed[..cut]).and_then(|f| match f {
                Found::Sealed { header, .. } => open_sealed(&sealed[..cut], header, &key),
                Found::Plain => decode_record(&sealed[..cut]),
            });
            assert!(r.is_err(), "truncated at {cut}");
        }
    }

    #[test]
    fn collapse_keeps_only_the_last_write_of_a_key() {
        let d = |n: u8| Arc::new(vec![n; 10]);
        let ops = vec![
            LogOp::Block(b"a".to_vec(), d(1)),
            LogOp::Put(b"i".to_vec(), b"1".to_vec()),
            LogOp::Block(b"a".to_vec(), d(2)),
            LogOp::Block(b"b".to_vec(), d(3)),
            LogOp::Delete(b"b".to_vec()),
            LogOp::Block(b"c".to_vec(), d(4)),
            LogOp::DeleteRange(Bound::Unbounded, Bound::Unbounded),
        ];
        // A range delete does not drop earlier block writes (it is kept
        // whole and replayed in order, which gives the same end state).
        assert_eq!(shown(&collapse(ops)), vec!["Pi", "Ba2", "Db", "Bc4", "R"]);
    }

    fn shown(ops: &[LogOp]) -> Vec<String> {
        ops.iter()
            .map(|o| match o {
                LogOp::Block(k, d) => format!("B{}{}", k[0] as char, d[0]),
                LogOp::Put(k, _) => format!("P{}", k[0] as char),
                LogOp::Delete(k) => format!("D{}", k[0] as char),
                LogOp::DeleteRange(..) => "R".into(),
                LogOp::BlockRef(..) => "X".into(),
                LogOp::Patch { key, bytes, .. } => format!("T{}{}", key[0] as char, bytes[0]),
            })
            .collect()
    }

    #[test]
    fn collapse_keeps_the_write_a_patch_needs() {
        let d = |n: u8| Arc::new(vec![n; 10]);
        let t = |k: &[u8], n: u8| LogOp::Patch {
            key: k.to_vec(),
            len: 10,
            off: 0,
            bytes: vec![n; 2],
        };
        let ops = vec![
            // A write and the patches after it: all needed.
            LogOp::Block(b"a".to_vec(), d(1)),
            t(b"a", 2),
            t(b"a", 3),
            // Patches and a write before a whole replacement: not needed.
            t(b"b", 4),
            LogOp::Block(b"b".to_vec(), d(5)),
            t(b"b", 6),
            LogOp::Block(b"b".to_vec(), d(7)),
            t(b"c", 8),
            LogOp::Delete(b"c".to_vec()),
            // A patch after a range delete builds on what it left.
            LogOp::Block(b"e".to_vec(), d(9)),
            LogOp::DeleteRange(Bound::Unbounded, Bound::Unbounded),
            t(b"e", 10),
        ];
        assert_eq!(
            shown(&collapse(ops)),
            vec!["Ba1", "Ta2", "Ta3", "Bb7", "Dc", "Be9", "R", "Te10"]
        );
    }
}
