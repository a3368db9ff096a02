//! The intent log: synchronous operations made durable between txgs.
//!
//! # Theory
//!
//! A txg commit writes every dirty block, the trees above them, the space
//! maps and an uberblock on every leaf, with two flushes: far too much to
//! pay for each `fsync`. The intent log lets a synchronous operation be
//! acknowledged after one small write and one flush instead: the dataset
//! layer hands the pool opaque *records* (what it must redo), the pool
//! appends them to a chain of log blocks and flushes; at import the pool
//! hands the records of complete commits back for replay. The pool never
//! interprets a record.
//!
//! **One chain, commits tagged with their txg.** The committed pool state
//! (`MetaState::log`) names the chain's *header*: its guid, the sequence
//! number of the first block that may still matter, and that block's
//! address. Every commit (one `fsync`) writes blocks `seq, seq + 1, ...`
//! starting at the chain's current *next* address; each block names the
//! address of the one after it, allocated before the block is written, so
//! the chain grows without ever touching committed state. A commit holds
//! the operations of one txg and says which: an `fsync` while txg T syncs
//! and T + 1 is open may write two commits, T's pending operations first.
//! The sync of T makes every commit of txgs up to T obsolete: it drops the
//! blocks at the front of the chain that hold only such commits (freed,
//! deferred so they stay intact until T is safely behind; a block the
//! open txg allocated, for a commit written while T synced, is freed by
//! the open txg's sync instead: T's space map never showed it, and until
//! T commits the committed header's chain runs through it) and commits a
//! header naming the first block that may hold a later txg's commit (or
//! the next block to be written). Commits of T that lie beyond that block
//! stay in the chain, and import skips them. After a crash, import finds
//! the header of the committed txg C and replays, in chain order, the
//! complete commits of txgs after C.
//!
//! **The end of the chain is unambiguous.** Each block carries the pool
//! guid, the chain guid, its sequence number and a BLAKE3 checksum of
//! itself. A block is accepted only if all of them match what its
//! predecessor (or the header) promised. The address after the last block
//! holds whatever was there before: stale data, an old log block (another
//! chain guid or sequence), or a torn write; none of them verifies, so the
//! walk stops there. Nothing is ever rewritten in place inside a chain.
//!
//! **Commits are atomic at replay.** One commit (one `fsync`) may span
//! several blocks; the last carries an end flag. Import replays only the
//! records of complete commits. A commit is acknowledged after all its
//! blocks are written and the devices flushed, so every acknowledged commit
//! is complete on disk, and a torn tail is a commit nobody was told about.
//!
//! **Referenced blocks.** Large writes are not copied into the log: the
//! dataset layer writes the data block in place (into room it already
//! holds) and logs its pointer; the commit lists those pointers so import
//! can *claim* them before anything else allocates. Chain blocks and
//! referenced blocks are allocated only in memory (the committed space map
//! of `T` does not know them), so import claims them too; the header's first
//! block is the one exception, allocated by a sync and committed with it.
//! Claiming accepts space that is already allocated only when it is the
//! header's block or was claimed before (a crash between import and replay).
//! A commit's log blocks and its in-place blocks share one flush, and a
//! device may keep the one and lose the other; since every commit is
//! flushed before the next starts, only the *last* complete commit can be
//! in that state, and then it was never acknowledged: import drops it when
//! a block it references does not verify.
//!
//! **Failure never costs durability.** If a log write or flush fails, the
//! chain is marked broken and the caller falls back to a txg commit, which
//! is durable on its own; the next sync starts a new chain.
//!
//! **Replay** happens when the dataset layer attaches: it takes the records,
//! redoes them in the open txg, and the sync of that txg commits the
//! result and retires the whole imported chain (a new one starts); taking
//! the records tags the chain with that txg, so the sync of an earlier txg
//! that was already closing keeps it. Until the records
//! are taken the chain is kept as it is (a sync in between must not retire
//! it), and no commits are accepted on the imported chain. Replaying twice
//! is harmless: the records redo operations on top of the committed txg
//! they were logged against, which is still the one on disk until the
//! replay commits.
//!
//! **The txg a replay is compared with.** Commits are tagged with txg
//! numbers, and after a crash the open txg starts again at the committed
//! one plus one, reusing the numbers of the txgs the crash lost. So once a
//! txg commits after an import but before the replay does (the syncer, an
//! exclusive operation, or a replay that failed and left the pool
//! running), "commits of txgs after the committed one" no longer names
//! the commits to replay: a second crash would skip those tagged with the
//! reused numbers. Import therefore remembers the txg committed when it
//! found the chain, and every sync that keeps that chain writes it into
//! the header (`replay_after`); the next import compares with it instead.
//! The sync that commits the replay retires the chain, and the new one
//! has none.
//!
//! **A rewind.** When import loads an older txg than the newest committed
//! one (whose metadata no longer verifies), the commits of the txg right
//! after the loaded one still replay correctly (each is a prefix of its
//! dataset's operations after the loaded state), but commits of later
//! txgs were made on top of what the lost txg committed without logging:
//! they are dropped, and the pool's damage list says so (`log_claim`).
//!
//! **Versions.** Blocks of version 1 hold commits without a txg (written
//! when one chain lived for exactly one txg): import reads them as commits
//! of the txg after the committed one.

use serde::{Deserialize, Serialize};
use tarn_block::pipeline::{self, Missed};
use tarn_block::{BlockPtr, Dva, BLOCK_PTR_SIZE};

use crate::pool::{new_guid, Pool, State, SyncState};
use crate::PoolError;

/// Magic at the start of every log block.
const MAGIC: &[u8; 4] = b"TZIL";
/// Log block format version written now (commits carry their txg).
const VERSION: u32 = 2;
/// The version before it (commits without a txg), still read at import.
const VERSION_UNTAGGED: u32 = 1;
/// Bytes of the block header before the payload.
const HEADER: usize = 128;
/// Offset of the checksum inside the header.
const SUM_AT: usize = 64;
/// Flag: the last block of a commit.
const FLAG_END: u32 = 1;
/// Smallest log block.
const MIN_BLOCK: u32 = 8 << 10;
/// Largest log block.
const MAX_BLOCK: u32 = 1 << 20;
/// Refuse absurd commits from a damaged stream.
const MAX_COMMIT: usize = 1 << 30;

/// Where a log block lives: like a [`Dva`], plus the stored size the
/// vdev layout depends on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LogAddr {
    pub vdev: u32,
    pub offset: u64,
    pub psize: u32,
    pub asize: u32,
}

impl LogAddr {
    fn dva(&self) -> Dva {
        Dva {
            vdev: self.vdev,
            asize: self.asize,
            offset: self.offset,
        }
    }
}

/// The committed start of the current chain (in the pool state record).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LogHeader {
    /// Random per chain: blocks of older chains never verify.
    pub guid: u64,
    /// Sequence number of the first block.
    pub seq: u64,
    /// The first block, allocated by the sync that wrote this header.
    pub first: LogAddr,
    /// An imported chain waiting for its replay: the txg that was committed
    /// when its commits were written, which import compares their txgs
    /// with. Set by a sync that commits before the replay does: txgs after
    /// an import reuse the numbers of the txgs the crash lost, so the
    /// newly committed txg says nothing about which commits are done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_after: Option<u64>,
}

/// One block of the chain in memory: where, its sequence number, and the
/// txg of the commit it holds (0: allocated, not written yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChainBlock {
    pub addr: LogAddr,
    pub seq: u64,
    pub txg: u64,
}

/// Txg tag of blocks found at import: obsolete once the replay commits.
const IMPORTED: u64 = 1;

/// In-memory state of the intent log (under its own lock, see `pool`).
#[derive(Default)]
pub(crate) struct ZilState {
    /// Guid of the chain.
    pub chain: Option<u64>,
    /// The chain from the committed header's block on, in order; the last
    /// block is the next one to write (not written yet).
    pub blocks: std::collections::VecDeque<ChainBlock>,
    /// A write failed: no more commits until a sync starts a new chain.
    pub broken: bool,
    /// A commit found no chain: the next sync creates one.
    pub wanted: bool,
    /// Records found at import, until the dataset layer takes them.
    pub replay: Option<Vec<Vec<u8>>>,
    /// The imported chain (its guid) and the txg its commits are to be
    /// compared with ([`LogHeader::replay_after`]), until a sync retires
    /// that chain.
    pub replay_base: Option<(u64, u64)>,
    /// Data blocks claimed at import for the records (until replay commits).
    pub claimed: Vec<Dva>,
    /// Blocks written early (in place) and superseded before their txg
    /// committed, with that txg: only the log references them; freed by
    /// the sync of that txg.
    pub frees: Vec<(u64, BlockPtr)>,
    /// Leaves that missed an early write, with the txg of the block, for
    /// that txg's dirty time log.
    pub missed: Vec<(u64, Missed)>,
    /// Of those, the leaves whose flush failed in a commit (not a write):
    /// they may have dropped blocks of that txg that other leaves missed,
    /// which the txg's sync must count as trouble (see `flush_all`).
    pub lost: Vec<(u64, Missed)>,
    /// Blocks a sync no longer needed that a later txg allocated (a commit
    /// written while an earlier txg synced), with that later txg: freed by
    /// its sync, not at once (see `Pool::free_log_block`).
    pub postponed: Vec<(u64, Dva)>,
    /// Size of the block the next commit starts with.
    pub size_hint: u32,
    /// Allocate no log blocks on log devices (one is being removed).
    pub no_log_dev: bool,
    /// Per vdev (by guid), its children's failed flushes as of the last
    /// commit's flush there: a failure since then (met by a sync's flush,
    /// say) may have dropped this commit's blocks, written since, though
    /// this commit's own flush succeeds (see `TopVdev::flush_since`).
    pub flush_marks: std::collections::BTreeMap<u64, tarn_vdev::FlushMark>,
}

/// What a commit did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogCommit {
    /// Durable in the log.
    Logged,
    /// No usable chain now (none yet, a failed write, replay pending, no
    /// room): the caller must commit a txg instead.
    Unavailable,
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn block_sum(block: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&block[..SUM_AT]);
    h.update(&[0u8; 32]);
    h.update(&block[SUM_AT + 32..]);
    *h.finalize().as_bytes()
}

/// One parsed log block.
struct Parsed {
    version: u32,
    next: LogAddr,
    end: bool,
    payload: Vec<u8>,
}

/// Builds a log block of `psize` bytes.
fn encode_block(
    pool_guid: u64,
    chain: u64,
    seq: u64,
    next: &LogAddr,
    end: bool,
    payload: &[u8],
    psize: u32,
) -> Vec<u8> {
    let mut b = vec![0u8; psize as usize];
    b[..4].copy_from_slice(MAGIC);
    put_u32(&mut b, 4, VERSION);
    put_u64(&mut b, 8, pool_guid);
    put_u64(&mut b, 16, chain);
    put_u64(&mut b, 24, seq);
    put_u32(&mut b, 32, next.vdev);
    put_u32(&mut b, 36, next.psize);
    put_u64(&mut b, 40, next.offset);
    put_u32(&mut b, 48, next.asize);
    put_u32(&mut b, 52, if end { FLAG_END } else { 0 });
    put_u32(&mut b, 56, payload.len() as u32);
    b[HEADER..HEADER + payload.len()].copy_from_slice(payload);
    let sum = block_sum(&b);
    b[SUM_AT..SUM_AT + 32].copy_from_slice(&sum);
    b
}

/// Checks a block read from disk against what its predecessor promised.
fn verify_block(b: &[u8], pool_guid: u64, chain: u64, seq: u64) -> bool {
    b.len() >= HEADER
        && &b[..4] == MAGIC
        && (get_u32(b, 4) == VERSION || get_u32(b, 4) == VERSION_UNTAGGED)
        && get_u64(b, 8) == pool_guid
        && get_u64(b, 16) == chain
        && get_u64(b, 24) == seq
        && (get_u32(b, 56) as usize) <= b.len() - HEADER
        && b[SUM_AT..SUM_AT + 32] == block_sum(b)
}

fn parse_block(b: &[u8]) -> Parsed {
    let len = get_u32(b, 56) as usize;
    Parsed {
        version: get_u32(b, 4),
        next: LogAddr {
            vdev: get_u32(b, 32),
            psize: get_u32(b, 36),
            offset: get_u64(b, 40),
            asize: get_u32(b, 48),
        },
        end: get_u32(b, 52) & FLAG_END != 0,
        payload: b[HEADER..HEADER + len].to_vec(),
    }
}

/// Bytes [`encode_commit`] writes for these.
fn commit_len(records: &[Vec<u8>], refs: &[BlockPtr]) -> usize {
    16 + refs.len() * BLOCK_PTR_SIZE + records.iter().map(|r| r.len() + 4).sum::<usize>()
}

/// Serializes one commit: its txg, the blocks it references, then its
/// records.
fn encode_commit(txg: u64, records: &[Vec<u8>], refs: &[BlockPtr]) -> Vec<u8> {
    let mut out = Vec::with_capacity(commit_len(records, refs));
    out.extend_from_slice(&txg.to_le_bytes());
    out.extend_from_slice(&(refs.len() as u32).to_le_bytes());
    for bp in refs {
        out.extend_from_slice(&bp.encode());
    }
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for r in records {
        out.extend_from_slice(&(r.len() as u32).to_le_bytes());
        out.extend_from_slice(r);
    }
    out
}

/// A commit read back: its txg (none for version 1), the blocks it
/// references and its records.
struct Commit {
    txg: Option<u64>,
    refs: Vec<BlockPtr>,
    records: Vec<Vec<u8>>,
}

fn decode_commit(version: u32, b: &[u8]) -> Result<Commit, String> {
    let mut pos = 0usize;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let s = b
            .get(pos..pos + n)
            .ok_or_else(|| format!("commit truncated at byte {pos}"))?;
        pos += n;
        Ok(s)
    };
    let txg = if version == VERSION_UNTAGGED {
        None
    } else {
        Some(u64::from_le_bytes(take(8)?.try_into().map_err(|_| "txg")?))
    };
    let n = u32::from_le_bytes(take(4)?.try_into().map_err(|_| "count")?) as usize;
    let mut refs = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        let bp = BlockPtr::decode(take(BLOCK_PTR_SIZE)?)
            .map_err(|e| format!("referenced block pointer: {e}"))?;
        refs.push(bp);
    }
    let m = u32::from_le_bytes(take(4)?.try_into().map_err(|_| "count")?) as usize;
    let mut records = Vec::with_capacity(m.min(4096));
    for _ in 0..m {
        let len = u32::from_le_bytes(take(4)?.try_into().map_err(|_| "length")?) as usize;
        records.push(take(len)?.to_vec());
    }
    if pos != b.len() {
        return Err(format!("{} bytes after the commit", b.len() - pos));
    }
    Ok(Commit { txg, refs, records })
}

fn block_size_for(bytes: usize) -> u32 {
    ((bytes + HEADER) as u32)
        .next_power_of_two()
        .clamp(MIN_BLOCK, MAX_BLOCK)
}

impl Pool {
    /// Allocates one log block of `psize` bytes: on a log device when the
    /// pool has a usable one, else on the data vdevs keeping each vdev's
    /// metadata reserve (log blocks are short-lived, but the next txg's
    /// metadata must always fit). `open`: the open txg allocating it (see
    /// `space`), none in syncing context.
    fn log_alloc(
        &self,
        st: &mut State,
        no_log_dev: bool,
        psize: u32,
        open: Option<u64>,
    ) -> Result<LogAddr, PoolError> {
        if !no_log_dev {
            if let Some((vdev, offset, asize)) = self.log_dev_alloc(st, psize) {
                return Ok(LogAddr {
                    vdev,
                    offset,
                    psize,
                    asize,
                });
            }
        }
        let dvas = self.allocate(st, psize as u64, 1, true, open)?;
        let d = dvas
            .first()
            .ok_or_else(|| PoolError::Internal("allocator returned no address".into()))?;
        Ok(LogAddr {
            vdev: d.vdev,
            offset: d.offset,
            psize,
            asize: d.asize,
        })
    }

    /// Appends one commit of `records` of txg `txg` (opaque to the pool),
    /// referencing the data blocks `refs` written in place for them, to the
    /// chain and flushes. [`LogCommit::Logged`] means durable.
    pub(crate) fn log_commit(
        &self,
        txg: u64,
        records: &[Vec<u8>],
        refs: &[BlockPtr],
    ) -> Result<LogCommit, PoolError> {
        let mut z = self.zil_state();
        if z.replay.is_some() || z.broken {
            return Ok(LogCommit::Unavailable);
        }
        let Some(chain) = z.chain else {
            z.wanted = true;
            return Ok(LogCommit::Unavailable);
        };
        let Some(first) = z.blocks.back().copied().filter(|b| b.txg == 0) else {
            z.broken = true;
            return Ok(LogCommit::Unavailable);
        };
        // A commit import would not read back (larger than it takes, or
        // with a record whose length does not fit its field) is not
        // written: the caller commits a txg instead, durable on its own.
        let too_big = records.iter().any(|r| u32::try_from(r.len()).is_err())
            || u32::try_from(records.len()).is_err()
            || u32::try_from(refs.len()).is_err()
            || commit_len(records, refs) > MAX_COMMIT;
        if too_big {
            return Ok(LogCommit::Unavailable);
        }
        let open = self.open_txg.load(std::sync::atomic::Ordering::Acquire);
        let stream = encode_commit(txg, records, refs);
        let mut writes: Vec<(LogAddr, Vec<u8>)> = Vec::new();
        let mut added: Vec<ChainBlock> = Vec::new();
        let (mut cur, mut seq) = (first.addr, first.seq);
        let mut pos = 0usize;
        loop {
            let cap = cur.psize as usize - HEADER;
            let chunk = (stream.len() - pos).min(cap);
            let rest = stream.len() - pos - chunk;
            let end = rest == 0;
            // The next block: more of this commit, or the start of the
            // following one (sized like this commit).
            let want = if end {
                block_size_for(stream.len())
            } else {
                block_size_for(rest)
            };
            let next = {
                let mut st = self.lock();
                self.log_alloc(&mut st, z.no_log_dev, want, Some(open))
            };
            let next = match next {
                Ok(a) => a,
                Err(_) => {
                    z.broken = true;
                    // What this commit allocated goes with the chain.
                    z.blocks.extend(added);
                    return Ok(LogCommit::Unavailable);
                }
            };
            added.push(ChainBlock {
                addr: next,
                seq: seq + 1,
                txg: 0,
            });
            let block = encode_block(
                self.guid,
                chain,
                seq,
                &next,
                end,
                &stream[pos..pos + chunk],
                cur.psize,
            );
            writes.push((cur, block));
            pos += chunk;
            cur = next;
            seq += 1;
            if end {
                break;
            }
        }
        // The blocks written now hold a commit of `txg`; the last one added
        // is the next to write. Once anything is written the chain has
        // moved on, whatever happens below.
        if let Some(b) = z.blocks.back_mut() {
            b.txg = txg;
        }
        let n = added.len();
        for (i, mut b) in added.into_iter().enumerate() {
            if i + 1 < n {
                b.txg = txg;
            }
            z.blocks.push_back(b);
        }
        // Blocks written in place for this commit are flushed with it (see
        // `log_claim` for why one flush is enough).
        let mut touched: Vec<u32> = Vec::new();
        for d in refs.iter().flat_map(|bp| bp.used_dvas()) {
            if !touched.contains(&d.vdev) {
                touched.push(d.vdev);
            }
        }
        let mut failed = false;
        let mut missed = Vec::new();
        for (a, b) in &writes {
            let Some(top) = self.log_top(&self.lock(), a.vdev) else {
                failed = true;
                break;
            };
            match top.write(a.offset, b) {
                Ok(out) => {
                    for child in out.missed {
                        missed.push((
                            txg,
                            Missed {
                                vdev: a.vdev,
                                child,
                            },
                        ));
                    }
                }
                Err(_) => {
                    failed = true;
                    break;
                }
            }
            if !touched.contains(&a.vdev) {
                touched.push(a.vdev);
            }
        }
        let missed_now: Vec<Missed> = missed.iter().map(|(_, m)| *m).collect();
        z.missed.append(&mut missed);
        if !failed {
            for v in &touched {
                let Some(top) = self.log_top(&self.lock(), *v) else {
                    failed = true;
                    continue;
                };
                // Marks go by the vdev's guid: a log device removed or
                // added renumbers the others. Without one (the first
                // commit on it since import), every failure since it was
                // opened counts: at worst one commit falls back to a sync.
                let mark = z.flush_marks.get(&top.guid()).cloned().unwrap_or_default();
                let flushed = top.flush_since(&mark);
                let troubled = top.troubled_since(&mark);
                z.flush_marks.insert(top.guid(), top.flush_mark());
                match flushed {
                    // A leaf whose flush failed may have lost this commit's
                    // blocks written in place: it missed them (for the
                    // dirty time log of their txg), as a leaf that missed
                    // the write itself. One in trouble since the mark, with
                    // the leaves that missed this commit's writes, must
                    // stay within what the vdev tolerates, or a block may
                    // be on none of them.
                    Ok(lost) => {
                        // This commit's writes and every early write of
                        // its txg (the blocks it references were written
                        // in place before it): on the safe side.
                        let missed_here = missed_now
                            .iter()
                            .chain(z.missed.iter().filter(|(t, _)| *t == txg).map(|(_, m)| m))
                            .filter(|m| m.vdev == *v)
                            .map(|m| m.child);
                        if crate::sync::beyond_redundancy(&top, missed_here, &troubled).is_some() {
                            failed = true;
                        }
                        let lost: Vec<(u64, Missed)> = lost
                            .into_iter()
                            .map(|child| (txg, Missed { vdev: *v, child }))
                            .collect();
                        z.missed.extend(lost.iter().copied());
                        z.lost.extend(lost);
                    }
                    Err(_) => failed = true,
                }
            }
        }
        if failed {
            z.broken = true;
            return Ok(LogCommit::Unavailable);
        }
        z.size_hint = block_size_for(stream.len());
        Ok(LogCommit::Logged)
    }

    /// Frees one block the chain no longer needs, in the sync of `txg`,
    /// deferred like any free. A block a later txg allocated (a commit
    /// written while `txg` synced: its chain block, or a block written in
    /// place for it) cannot be freed in `txg`'s space map, which never
    /// showed it allocated; nor can it be freed at once: until `txg`
    /// commits, the committed header's chain still runs through it, and
    /// the commit it holds is what import replays if `txg` never commits.
    /// Such a block is returned with the txg that allocated it, whose sync
    /// frees it (`txg` has committed by then).
    fn free_log_block(
        &self,
        st: &mut State,
        d: &Dva,
        txg: u64,
    ) -> Result<Option<(u64, Dva)>, PoolError> {
        if d.vdev >= crate::logdev::LOG_VDEV_BASE {
            let Some(m) = self.log_space(st, d.vdev) else {
                return Ok(None);
            };
            // A log device's space is rebuilt at import: a block there that
            // import could not claim (the device was missing) is not held.
            if !m.is_allocated(d.offset, d.asize as u64) {
                return Ok(None);
            }
            return m
                .free_deferred(d.offset, d.asize as u64, txg)
                .map(|()| None)
                .map_err(|e| PoolError::Internal(format!("intent log space: {e}")));
        }
        let later = st
            .uncommitted
            .get(d.vdev as usize)
            .and_then(|m| m.range(..=d.offset).next_back())
            .filter(|(o, (l, t))| **o + *l > d.offset && *t > txg)
            .map(|(_, (_, t))| *t);
        if let Some(t) = later {
            return Ok(Some((t, *d)));
        }
        let m = st
            .space
            .get_mut(d.vdev as usize)
            .ok_or_else(|| PoolError::Internal(format!("intent log names vdev {}", d.vdev)))?;
        m.free_deferred(d.offset, d.asize as u64, txg)
            .map(|()| None)
            .map_err(|e| PoolError::Internal(format!("intent log space: {e}")))
    }

    /// The intent log's part of the sync of `txg`: drops the blocks that
    /// hold only commits of txgs up to `txg`, frees the early-written
    /// blocks of those txgs, starts a new chain when there is none (or it
    /// broke and nothing in it matters any more), and sets the header the
    /// txg commits (see the module docs). Called before the pool state is
    /// written into the meta tree.
    pub(crate) fn log_sync(&self, sync: &mut SyncState, txg: u64) -> Result<(), PoolError> {
        let mut z = self.zil_state();
        if z.replay.is_some() {
            // The chain stays as it is until the replay takes its records;
            // the header says what its commits are to be compared with.
            let mut st = self.lock();
            let base = z.replay_base.map(|(_, b)| b);
            if let Some(h) = st.ms.log.as_mut().filter(|h| h.replay_after != base) {
                h.replay_after = base;
                st.ms_dirty = true;
            }
            return Ok(());
        }
        // Claimed data blocks now belong to the trees the replay put them
        // in (or were handed back through `frees`).
        z.claimed.clear();
        let mut free: Vec<Dva> = Vec::new();
        z.frees.retain(|(t, bp)| {
            if *t <= txg {
                free.extend(bp.used_dvas().copied());
                false
            } else {
                true
            }
        });
        // Blocks an earlier sync left to this one (see `free_log_block`).
        z.postponed.retain(|(t, d)| {
            if *t <= txg {
                free.push(*d);
                false
            } else {
                true
            }
        });
        let mut dropped: Vec<Dva> = Vec::new();
        while let Some(b) = z.blocks.front().copied() {
            if b.txg == 0 || b.txg > txg {
                break;
            }
            dropped.push(b.addr.dva());
            z.blocks.pop_front();
        }
        let stale = z.blocks.iter().all(|b| b.txg == 0 || b.txg <= txg);
        let restart = match z.chain {
            None => z.wanted,
            Some(_) => z.broken && stale,
        };
        if restart {
            dropped.extend(z.blocks.drain(..).map(|b| b.addr.dva()));
        }
        let mut st = self.lock();
        for d in dropped.iter().chain(&free) {
            if let Some(later) = self.free_log_block(&mut st, d, txg)? {
                z.postponed.push(later);
            }
        }
        if !free.is_empty() || !dropped.is_empty() {
            sync.last_free_txg = txg;
        }
        if restart {
            let size = z.size_hint.max(MIN_BLOCK);
            match self.log_alloc(&mut st, z.no_log_dev, size, None) {
                Ok(first) => {
                    z.chain = Some(new_guid());
                    z.blocks.push_back(ChainBlock {
                        addr: first,
                        seq: 1,
                        txg: 0,
                    });
                    z.broken = false;
                }
                // No room for a log block: synchronous writes commit txgs.
                Err(_) => z.chain = None,
            }
            z.wanted = false;
        }
        // The imported chain, replayed but not yet committed, keeps the txg
        // its commits are compared with; a new chain has none.
        if z.replay_base.is_some_and(|(g, _)| z.chain != Some(g)) {
            z.replay_base = None;
        }
        let replay_after = z.replay_base.map(|(_, b)| b);
        let header = match (z.chain, z.blocks.front()) {
            (Some(guid), Some(b)) => Some(LogHeader {
                guid,
                seq: b.seq,
                first: b.addr,
                replay_after,
            }),
            _ => None,
        };
        if st.ms.log != header {
            st.ms.log = header;
            st.ms_dirty = true;
        }
        Ok(())
    }

    /// Takes the records found at import for a replay into txg `txg` (the
    /// open one). The imported chain then holds commits of `txg`: it is
    /// retired by the sync that commits the replay, not by the sync of an
    /// earlier txg that quiesced before the replay began (which would
    /// commit a header without the chain while the replayed operations
    /// are not yet committed).
    pub(crate) fn log_take_replay(&self, txg: u64) -> Option<Vec<Vec<u8>>> {
        let mut z = self.zil_state();
        let records = z.replay.take()?;
        for b in z.blocks.iter_mut().filter(|b| b.txg == IMPORTED) {
            b.txg = txg;
        }
        Some(records)
    }

    /// The leaves that missed early writes of blocks of txgs up to `txg`,
    /// and of those the ones whose flush failed in a commit.
    pub(crate) fn take_missed(&self, txg: u64) -> (Vec<Missed>, Vec<Missed>) {
        let take = |v: &mut Vec<(u64, Missed)>| {
            let mut out = Vec::new();
            v.retain(|(t, m)| {
                if *t <= txg {
                    out.push(*m);
                    false
                } else {
                    true
                }
            });
            out
        };
        let mut z = self.zil_state();
        let missed = take(&mut z.missed);
        let lost = take(&mut z.lost);
        (missed, lost)
    }

    /// True when a sync has intent log work to do.
    pub(crate) fn zil_has_changes(&self) -> bool {
        let z = self.zil_state();
        z.wanted
            || z.broken
            || !z.frees.is_empty()
            || !z.claimed.is_empty()
            || !z.missed.is_empty()
            || !z.postponed.is_empty()
            || z.blocks.iter().any(|b| b.txg != 0)
    }

    /// At import, before anything allocates: walks the chain the committed
    /// header names, claims its blocks and the data blocks its complete
    /// commits of txgs after `committed` reference, and keeps their records
    /// for replay.
    ///
    /// `rewound`: the import loaded `committed` although later txgs were
    /// committed (their metadata did not verify). A dataset's commits are
    /// the prefix of its operations that an fsync wrote, the rest went to
    /// the txg; so commits of the txg after `committed` redo a prefix of
    /// what followed it, but commits of later txgs were logged on top of
    /// that txg's unlogged tail, which is lost: replayed, they would apply
    /// to a state they were never made against. They are dropped, and a
    /// line in the pool's damage list says so. Returns how many.
    pub(crate) fn log_claim(
        &self,
        st: &mut State,
        committed: u64,
        rewound: bool,
    ) -> Result<usize, PoolError> {
        let Some(h) = st.ms.log else {
            return Ok(0);
        };
        // A chain an earlier import found and did not replay yet holds
        // commits made before that import only (none go on an imported
        // chain), so the rewind takes nothing from it.
        let rewound = rewound && h.replay_after.is_none();
        // A sync after an earlier import, before its replay committed: the
        // commits are of txgs after the one committed then, not now.
        let loaded = committed;
        let committed = h.replay_after.unwrap_or(committed);
        let mut z = self.zil_state();
        z.chain = Some(h.guid);
        z.replay_base = Some((h.guid, committed));
        // Whatever happens, no commit goes on this chain: the first sync
        // after the replay starts a new one; until then synchronous writes
        // commit txgs.
        z.broken = true;
        let readable = self
            .log_top(st, h.first.vdev)
            .is_some_and(|t| !matches!(t.health(), tarn_vdev::TopHealth::Faulted));
        if !readable {
            // Only an import told to discard a missing log device gets here.
            return Ok(0);
        }
        let mut chain = Vec::new();
        let mut stream = Vec::new();
        let mut stream_version = VERSION;
        let mut commits: Vec<Commit> = Vec::new();
        let (mut at, mut seq) = (h.first, h.seq);
        // The block after the last one holds anything: reading it must
        // neither "repair" it nor blame a device for it.
        let all: Vec<_> = self
            .tops
            .iter()
            .cloned()
            .chain(st.logs.iter().map(|l| l.top.clone()))
            .collect();
        for t in &all {
            t.set_self_heal(false);
        }
        while let Some(top) = self.log_top(st, at.vdev) {
            let ok = |b: &[u8]| verify_block(b, self.guid, h.guid, seq);
            let errors = |t: &tarn_vdev::TopVdev| -> Vec<u64> {
                t.leaves().iter().map(|l| l.counters.read_errors).collect()
            };
            let before = errors(&top);
            // Bytes that do not verify are the end of the chain (see the
            // module docs). But if more devices failed to read (or are
            // gone) than the vdev's redundancy covers, the next block may
            // be there unseen: that is not an end, and guessing would drop
            // acknowledged writes.
            let Ok(b) = top.read(at.offset, at.psize as usize, &ok) else {
                let after = errors(&top);
                let unseen = top
                    .leaves()
                    .iter()
                    .enumerate()
                    .filter(|(i, l)| {
                        !matches!(l.state, tarn_vdev::LeafState::Online)
                            || after.get(*i) > before.get(*i)
                    })
                    .count();
                if unseen > top.redundancy() && !self.opts.discard_log {
                    for t in &all {
                        t.set_self_heal(true);
                    }
                    return Err(PoolError::Faulted(format!(
                        "cannot import '{}': block {seq} of its intent log could not be read \
                         (device errors); it may hold acknowledged synchronous writes. Fix the \
                         device, or import with --discard-log to keep only what precedes it",
                        self.name
                    )));
                }
                break;
            };
            let p = parse_block(&b);
            if stream.is_empty() {
                stream_version = p.version;
            }
            stream.extend_from_slice(&p.payload);
            if stream.len() > MAX_COMMIT {
                if self.opts.discard_log {
                    break;
                }
                // Verified blocks (checksums, guids, sequence) that go on
                // past what any commit is written as: not the end of the
                // chain, and no commit to guess at.
                for t in &all {
                    t.set_self_heal(true);
                }
                return Err(PoolError::Corrupt(format!(
                    "intent log block {seq} of pool '{}' carries a commit larger than {} MiB;                      import with --discard-log to keep only what precedes it",
                    self.name,
                    MAX_COMMIT >> 20
                )));
            }
            if p.end {
                let c = decode_commit(stream_version, &stream).map_err(|e| {
                    PoolError::Corrupt(format!(
                        "intent log block {seq} of pool '{}' verifies but does not parse: {e}",
                        self.name
                    ))
                })?;
                commits.push(c);
                stream.clear();
            }
            chain.push(ChainBlock {
                addr: at,
                seq,
                txg: IMPORTED,
            });
            at = p.next;
            seq += 1;
        }
        for t in &all {
            t.set_self_heal(true);
        }
        // The header's block is the chain's even when nothing was written
        // to it: it was allocated for it.
        if chain.is_empty() {
            chain.push(ChainBlock {
                addr: h.first,
                seq: h.seq,
                txg: IMPORTED,
            });
        }
        for b in &chain {
            self.claim_dva(st, &b.addr.dva())?;
        }
        z.blocks = chain.into_iter().collect();
        // Commits of txgs the loaded txg contains are done; the rest are
        // replayed in chain order (a commit without a txg is of the txg
        // after the committed one).
        // The last complete commit may never have been acknowledged: its
        // blocks and the blocks written in place for it share one flush,
        // and a device may have kept the log block but not the data. If a
        // block it references is not there, it is not a commit anyone was
        // told about. (Every earlier commit was flushed whole before the
        // next began: a missing block there is damage, and replay says so.)
        // The last in the chain, that is, before the commits of committed
        // txgs are left out: chain order is not txg order, and the last
        // one kept may be an earlier, acknowledged commit.
        let last_whole = commits.last().is_none_or(|c| {
            c.refs
                .iter()
                .all(|bp| !pipeline::scrub_block(&self.tops, bp).unrecoverable)
        });
        if !last_whole {
            commits.pop();
        }
        commits.retain(|c| c.txg.is_none_or(|t| t > committed));
        let before = commits.len();
        if rewound {
            commits.retain(|c| c.txg.is_none_or(|t| t <= loaded + 1));
        }
        let dropped = before - commits.len();
        let mut records = Vec::new();
        for c in commits {
            for d in c.refs.iter().flat_map(|bp| bp.used_dvas()) {
                self.claim_dva(st, d)?;
                z.claimed.push(*d);
            }
            records.extend(c.records);
        }
        if !records.is_empty() {
            z.replay = Some(records);
        }
        Ok(dropped)
    }

    /// Marks a log-referenced range allocated. Space already wholly
    /// allocated is accepted: a chain block allocated by a txg the loaded
    /// one contains, or a claim that a sync committed before a second crash
    /// (the block verified, so nothing else was written there); partly
    /// allocated space means the log and the space maps disagree.
    fn claim_dva(&self, st: &mut State, d: &Dva) -> Result<(), PoolError> {
        let name = self.name.clone();
        let m = self.log_space(st, d.vdev).ok_or_else(|| {
            PoolError::Corrupt(format!(
                "intent log of pool '{name}' names vdev {} which does not exist",
                d.vdev
            ))
        })?;
        if m.is_allocated(d.offset, d.asize as u64) {
            return Ok(());
        }
        m.claim(d.offset, d.asize as u64).map_err(|e| {
            PoolError::Corrupt(format!(
                "intent log of pool '{name}' names space the pool uses otherwise ({e}); \
                 import refused so that nothing is overwritten"
            ))
        })
    }

    /// Every range of the data vdevs the intent log holds allocated, for
    /// the leak check (log devices have no persistent space map).
    pub(crate) fn log_allocated(&self) -> Vec<Dva> {
        let z = self.zil_state();
        let mut out: Vec<Dva> = z.blocks.iter().map(|b| b.addr.dva()).collect();
        out.extend(z.claimed.iter().copied());
        for (_, bp) in &z.frees {
            out.extend(bp.used_dvas().copied());
        }
        out.retain(|d| d.vdev < crate::logdev::LOG_VDEV_BASE);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_verify_only_where_promised() {
        let next = LogAddr {
            vdev: 0,
            offset: 8192,
            psize: 8192,
            asize: 8192,
        };
        let b = encode_block(7, 9, 3, &next, true, b"hello", 8192);
        assert!(verify_block(&b, 7, 9, 3));
        assert!(!verify_block(&b, 7, 9, 4), "another sequence number");
        assert!(!verify_block(&b, 7, 8, 3), "another chain");
        assert!(!verify_block(&b, 6, 9, 3), "another pool");
        let p = parse_block(&b);
        assert_eq!(p.payload, b"hello");
        assert!(p.end);
        assert_eq!(p.next, next);
        // Any flipped bit anywhere (header, payload or padding) is refused,
        // and so is a torn block (a prefix of new sectors over old bytes).
        for i in [0, 20, 60, 100, 130, 5000, 8191] {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(!verify_block(&c, 7, 9, 3), "flip at {i}");
        }
        let mut torn = vec![0xAAu8; 8192];
        torn[..4096].copy_from_slice(&b[..4096]);
        assert!(!verify_block(&torn, 7, 9, 3));
        assert!(!verify_block(&b[..64], 7, 9, 3), "short");
    }

    #[test]
    fn commits_round_trip_and_refuse_truncation() {
        let recs = vec![b"one".to_vec(), vec![], vec![5u8; 1000]];
        let mut dvas = [Dva::default(); 3];
        dvas[0] = Dva {
            vdev: 1,
            asize: 4096,
            offset: 1 << 20,
        };
        let bp = BlockPtr {
            dvas,
            lsize: 4096,
            psize: 4096,
            birth: 3,
            ..Default::default()
        };
        let s = encode_commit(77, &recs, &[bp]);
        let c = decode_commit(VERSION, &s).expect("decodes");
        assert_eq!(c.records, recs);
        assert_eq!(c.refs, vec![bp]);
        assert_eq!(c.txg, Some(77));
        for cut in 0..s.len() {
            assert!(
                decode_commit(VERSION, &s[..cut]).is_err(),
                "truncated at {cut}"
            );
        }
        // Version 1 commits have no txg: the same bytes without the first
        // eight read as one.
        let c = decode_commit(VERSION_UNTAGGED, &s[8..]).expect("decodes");
        assert_eq!((c.txg, c.records), (None, recs));
    }
}

#[cfg(test)]
mod during_sync {
    //! Commits written while a txg syncs, against a real pool.
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex, OnceLock, Weak};

    use crate::{Cx, Extension, LogCommit, Pool, PoolError, PoolOptions, SyncCx, VdevSpec};

    /// A chain block: (vdev, offset, asize), and whether a txg after the
    /// one it holds a commit of allocated it.
    type Held = ((u32, u64, u64), bool);

    /// An extension whose sync makes `commits` intent log commits of the
    /// txg being synced, from another thread (as an `fsync` does while a
    /// txg syncs), and notes the chain blocks that hold them.
    #[derive(Default)]
    struct Fsyncs {
        pool: OnceLock<Weak<Pool>>,
        commits: AtomicU32,
        held: Mutex<Vec<Held>>,
    }

    fn commit(pool: &Pool, txg: u64) -> LogCommit {
        pool.with_ext::<Fsyncs, _>(false, |_, cx: &mut Cx<'_>| {
            cx.log_commit(txg, &[vec![7u8; 100]], &[])
        })
        .expect("commit")
    }

    impl Extension for Fsyncs {
        fn has_changes(&self) -> bool {
            self.commits.load(Ordering::Relaxed) > 0
        }
        fn sync(&self, cx: &mut SyncCx<'_>) -> Result<(), PoolError> {
            let n = self.commits.swap(0, Ordering::Relaxed);
            let txg = cx.txg();
            let Some(pool) = self.pool.get().and_then(Weak::upgrade) else {
                return Ok(());
            };
            let p = pool.clone();
            let done: Vec<LogCommit> =
                std::thread::spawn(move || (0..n).map(|_| commit(&p, txg)).collect())
                    .join()
                    .unwrap_or_default();
            assert!(
                done.len() == n as usize && done.iter().all(|c| *c == LogCommit::Logged),
                "{done:?}"
            );
            let blocks: Vec<_> = pool
                .zil_state()
                .blocks
                .iter()
                .filter(|b| b.txg == txg)
                .map(|b| b.addr.dva())
                .collect();
            let st = pool.lock();
            let held = blocks.iter().map(|d| {
                let later = st
                    .uncommitted
                    .get(d.vdev as usize)
                    .and_then(|m| m.range(..=d.offset).next_back())
                    .is_some_and(|(o, (l, t))| o + l > d.offset && *t > txg);
                ((d.vdev, d.offset, d.asize as u64), later)
            });
            self.held.lock().expect("held").extend(held);
            Ok(())
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    fn no_scan(_: u8, _: &[u8], _: &[u8], _: &mut Vec<crate::ExtRef>) {}

    fn pool_in(dir: &std::path::Path) -> Arc<Pool> {
        let dev = dir.join("d0");
        std::fs::File::create(&dev)
            .and_then(|f| f.set_len(64 << 20))
            .expect("device");
        let spec = VdevSpec {
            kind: tarn_vdev::VdevKind::Single,
            devices: vec![dev],
        };
        let opts = PoolOptions {
            sync_interval: std::time::Duration::from_secs(3600),
            owner: "test".into(),
            ..Default::default()
        };
        Pool::create("tank", &[spec], 12, &Default::default(), false, opts).expect("pool")
    }

    /// The replay runs in the open txg X; the sync of X - 1 may come after
    /// it took the records (it was closing). That sync must keep the
    /// imported chain: its commit holds none of the replayed operations,
    /// and a crash after it would otherwise find no log to replay.
    #[test]
    fn the_imported_chain_outlives_syncs_of_txgs_before_the_replay() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pool = pool_in(dir.path());
        let header = |p: &Pool| p.lock().ms.log.map(|h| h.guid);
        // As import leaves it: the chain found, records to replay, no
        // commits on it.
        {
            let mut z = pool.zil_state();
            for b in z.blocks.iter_mut() {
                b.txg = super::IMPORTED;
            }
            z.replay = Some(vec![b"a record".to_vec()]);
            z.broken = true;
        }
        let before = header(&pool);
        assert!(before.is_some(), "a new pool has a chain");
        let open = pool.open_txg.load(Ordering::Acquire);
        assert!(pool.log_take_replay(open).is_some());
        {
            let mut sync = pool.sync_state();
            pool.log_sync(&mut sync, open - 1).expect("log sync");
        }
        assert_eq!(
            header(&pool),
            before,
            "the sync before the replay kept the chain"
        );
        // The sync of the replay's txg retires it.
        pool.sync().expect("sync");
        assert_ne!(header(&pool), before, "a new chain once the replay commits");
    }

    /// A commit larger than import reads back is not written (the caller
    /// commits a txg instead): written, it would be acknowledged and then
    /// taken at import for the end of the chain.
    #[test]
    fn a_commit_too_large_to_read_back_is_not_logged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pool = pool_in(dir.path());
        let open = pool.open_txg.load(Ordering::Acquire);
        // Pages of zeros the allocator maps lazily: nothing is touched.
        let huge = vec![vec![0u8; super::MAX_COMMIT]];
        assert_eq!(
            pool.log_commit(open, &huge, &[]).expect("log commit"),
            LogCommit::Unavailable
        );
        assert_eq!(
            pool.log_commit(open, &[b"small".to_vec()], &[])
                .expect("log commit"),
            LogCommit::Logged
        );
    }

    /// A commit written while txg T syncs goes into a block the open txg
    /// (T + 1) allocated. T's sync no longer needs it, but until T commits
    /// the committed header's chain runs through it (and the commit in it
    /// is what import replays if T never commits): its space must stay
    /// allocated through T's sync, which allocates blocks of its own, and
    /// is freed by T + 1's.
    #[test]
    fn blocks_of_commits_made_during_a_sync_outlive_that_sync() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pool = pool_in(dir.path());
        let ext = Arc::new(Fsyncs::default());
        let _ = ext.pool.set(Arc::downgrade(&pool));
        pool.set_extension(ext.clone(), no_scan);
        // A chain (a commit without one asks for one, a sync makes it).
        let open = pool.open_txg.load(Ordering::Acquire);
        if commit(&pool, open) == LogCommit::Unavailable {
            pool.sync().expect("sync");
        }
        // Three commits while a txg syncs: all but the first are written
        // into blocks the next txg allocated.
        ext.commits.store(3, Ordering::Relaxed);
        pool.sync().expect("sync");
        let held = ext.held.lock().expect("held").clone();
        assert!(
            held.iter().any(|(_, later)| *later),
            "no commit went into a later txg's block: {held:?}"
        );
        let still =
            |at: &(u32, u64, u64)| pool.lock().space[at.0 as usize].is_allocated(at.1, at.2);
        for (at, later) in &held {
            assert!(
                still(at),
                "block {at:?} (of a later txg: {later}) was freed while the committed \
                 chain still ran through it"
            );
        }
        // The next sync frees them, deferred like any free.
        assert!(!pool.zil_state().postponed.is_empty());
        pool.sync().expect("sync");
        assert!(pool.zil_state().postponed.is_empty());
        for (at, _) in &held {
            assert!(still(at), "deferred, not at once: {at:?}");
        }
    }
}
