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
//! **Large blocks are written in place.** A block of at least
//! [`IMMEDIATE_BYTES`] is written now into the room its transaction already
//! holds and the record carries only its pointer; the sync then uses that
//! block as is instead of writing it again. Replay reads it back through
//! its checksum before using it, so a damaged block fails replay loudly
//! rather than turning into wrong file contents.
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
use tarn_pool::{Cx, LogCommit, Pool, Reservation};

use crate::dsl::Dsl;
use crate::overlay::StagedBlock;
use crate::DsError;

/// Data blocks at least this large are written in place and referenced
/// from the log instead of copied into it.
pub const IMMEDIATE_BYTES: usize = 32 << 10;

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

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_RANGE: u8 = 3;
const OP_BLOCK: u8 = 4;
const OP_REF: u8 = 5;
const OP_PATCH: u8 = 6;

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

/// Commits dataset `id`'s pending operations to the intent log, one
/// commit per txg they belong to (the syncing txg's first, then the open
/// one's). True when they are durable, or when the dataset's
/// `sync=disabled` says not to care; false when the caller must commit the
/// txg instead (what could not be logged stays pending for that sync).
///
/// One commit of a dataset runs at a time (`LiveDs::commit`): a second
/// `fsync` waits, then finds what the first logged gone from the pending
/// list. The dataset's lock is held only to take the pending operations
/// and the staged blocks they name, so transactions of the dataset go on
/// during the log's writes.
pub(crate) fn commit(dsl: &Dsl, cx: &mut Cx<'_>, id: u64) -> Result<bool, DsError> {
    let (disabled, opts) = {
        let dir = dsl.dir();
        (dir.prop(id, "sync").0 == "disabled", dir.block_opts(id))
    };
    if disabled {
        return Ok(true);
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
            return Ok(true);
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
        let mut refs = Vec::new();
        for op in &mut ops {
            let LogOp::Block(k, data) = op else { continue };
            if data.len() < immediate {
                continue;
            }
            let Some(sb) = staged.get(&(txg, k.clone())) else {
                continue;
            };
            let mut slot = sb.slot();
            let bp = match slot.written {
                // Written by an earlier commit, or by the sync already.
                Some(bp) => bp,
                // A block of a txg that is no longer open belongs to its
                // sync, which may be writing it right now into the same
                // room; a block replaced since it was found here has given
                // its room back: the record carries the data instead. Only
                // the open txg's live blocks (open context holds the txg
                // open during this commit) are written early, accounted to
                // that txg.
                None if txg != cx.txg() || slot.released => continue,
                None => match cx.write_block_now(&sb.data, opts, slot.res.clone(), txg) {
                    Ok(Some(bp)) => {
                        slot.res = Reservation::of_block(&bp);
                        slot.written = Some(bp);
                        bp
                    }
                    Ok(None) => continue,
                    Err(e) => {
                        // The block's room may be half given back: nothing
                        // of this txg may commit with it.
                        cx.fault(format!(
                            "writing a block for the intent log failed ({e}); the pool stopped \
                             so that nothing half-written is committed"
                        ));
                        return Err(e.into());
                    }
                },
            };
            refs.push(bp);
            *op = LogOp::BlockRef(std::mem::take(k), bp);
        }
        let rec = encode_record(id, &ops);
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
    Ok(all)
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
            let r = decode_record(rec).and_then(|(id, ops)| {
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

#[cfg(test)]
mod tests {
    use super::*;

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
