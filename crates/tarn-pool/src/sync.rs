//! The txg sync: how a quiesced txg becomes the committed one.
//!
//! [`Pool::sync_body`] runs the steps in the order the crate docs justify
//! (data, trees bottom-up, space maps, flush, uberblocks, flush), one
//! function per step, holding the `sync` lock (and the pool state lock only
//! for allocations and bookkeeping, never across device I/O: see `pool`).
//! Open context goes on meanwhile in the next txg (see `txg`). Nothing
//! written before the second flush is referenced by a valid uberblock, so a
//! crash at any point lands on the previous txg; frees are deferred so that
//! txg stays intact.

use tarn_block::pipeline::{self, Missed, Prepared};
use tarn_block::{BlockPtr, BlockType, CompressAlg, BLOCK_PTR_SIZE};
use tarn_space::{SpaceMap, DEFER_TXGS};

use tarn_vdev::{FlushMark, LeafState};

use crate::pool::{now_unix, Pool, State, SyncState, K_STATE};
use crate::store::TxStore;
use crate::uberblock::Uberblock;
use crate::PoolError;

/// Magic of the space-root block.
const SPACE_ROOT_MAGIC: &[u8; 4] = b"TSPR";

/// The space root's encoding as one block (version 1 of the root).
const SPACE_ROOT_VERSION: u32 = 1;

/// The space root as an index of chunks holding that encoding (version 2).
const SPACE_INDEX_VERSION: u32 = 2;

/// Largest block an encoding of the space maps is written in. A block holds
/// at most 16 MiB, and the maps of a large, fragmented pool (16 bytes per
/// allocated extent, 24 per deferred free: a delete of 100 GiB of 128 KiB
/// records defers 800,000) need more: such an encoding is cut into chunks
/// of this size, listed by a small index block (see docs/format.md).
pub const SPACE_CHUNK_MAX: usize = 8 << 20;

/// The blocks the committed space maps are written in: the root the
/// uberblock points at, and the chunks it lists (none when the root holds
/// the maps itself).
#[derive(Clone, Debug, Default)]
pub(crate) struct SpaceBlocks {
    pub root: BlockPtr,
    pub chunks: Vec<BlockPtr>,
}

impl SpaceBlocks {
    /// Every block, the root first.
    pub(crate) fn all(&self) -> impl Iterator<Item = &BlockPtr> {
        std::iter::once(&self.root).chain(&self.chunks)
    }
}

/// Reads the space root `root` (one block, or an index of chunks) and
/// returns the maps' encoding with the chunks it was read from; every
/// length is checked.
pub(crate) fn read_space_root(
    tops: &[std::sync::Arc<tarn_vdev::TopVdev>],
    root: &BlockPtr,
) -> Result<(Vec<u8>, Vec<BlockPtr>), PoolError> {
    let b = pipeline::read_block(tops, root, None)?;
    let version = b
        .get(4..8)
        .map(|v| u32::from_le_bytes([v[0], v[1], v[2], v[3]]));
    if b.get(..4) != Some(&SPACE_ROOT_MAGIC[..]) || version != Some(SPACE_INDEX_VERSION) {
        return Ok((b, Vec::new()));
    }
    let bad = |w: &str| PoolError::Corrupt(format!("space root index: {w}"));
    let head = b.get(8..20).ok_or_else(|| bad("truncated"))?;
    let n = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let total = u64::from_le_bytes(head[4..12].try_into().map_err(|_| bad("truncated"))?);
    let ptrs = b
        .get(20..20 + n.saturating_mul(BLOCK_PTR_SIZE))
        .ok_or_else(|| bad(&format!("{n} chunks do not fit the block")))?;
    if n == 0 || total > (n as u64).saturating_mul(tarn_block::bp::MAX_LSIZE as u64) {
        return Err(bad(&format!("{n} chunks for {total} bytes")));
    }
    let chunks = ptrs
        .chunks_exact(BLOCK_PTR_SIZE)
        .map(BlockPtr::decode)
        .collect::<Result<Vec<_>, _>>()?;
    let stored: u64 = chunks.iter().map(|c| u64::from(c.lsize)).sum();
    let mut body = Vec::with_capacity(total.min(stored) as usize);
    for c in &chunks {
        body.extend_from_slice(&pipeline::read_block(tops, c, None)?);
    }
    if (body.len() as u64) < total {
        return Err(bad(&format!("{} bytes in chunks for {total}", body.len())));
    }
    body.truncate(total as usize);
    Ok((body, chunks))
}

/// Encodes every space map into one block (see docs/format.md), leaving
/// out each vdev's `later` allocations (see `space`).
fn encode_space_root(space: &[SpaceMap], later: &[Vec<(u64, u64)>], len: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(SPACE_ROOT_MAGIC);
    b.extend_from_slice(&SPACE_ROOT_VERSION.to_le_bytes());
    b.extend_from_slice(&(space.len() as u32).to_le_bytes());
    for (i, m) in space.iter().enumerate() {
        let e = m.encode_excluding(later.get(i).map_or(&[][..], Vec::as_slice));
        b.extend_from_slice(&(e.len() as u32).to_le_bytes());
        b.extend_from_slice(&e);
    }
    debug_assert!(b.len() <= len);
    b.resize(len.max(b.len()), 0);
    b
}

/// Decodes the space-root block; every length is checked.
pub(crate) fn decode_space_root(b: &[u8], tops: usize) -> Result<Vec<SpaceMap>, PoolError> {
    let bad = |w: &str| PoolError::Corrupt(format!("space root: {w}"));
    if b.len() < 12 || &b[..4] != SPACE_ROOT_MAGIC {
        return Err(bad("no magic"));
    }
    let n = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
    if n != tops {
        return Err(bad(&format!("{n} space maps for {tops} top-level vdevs")));
    }
    let mut off = 12;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len_bytes = b.get(off..off + 4).ok_or_else(|| bad("truncated"))?;
        let len =
            u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
        off += 4;
        let body = b.get(off..off + len).ok_or_else(|| bad("truncated map"))?;
        out.push(SpaceMap::decode(body)?);
        off += len;
    }
    Ok(out)
}

/// The children of `t` a block of a txg may be missing from, when that
/// is more than `t` tolerates: those that missed writes (`missed`) with
/// those in trouble since the writers' mark (a failed flush, out of
/// service), counted over the whole txg on the safe side. `None` without
/// trouble: each block's own misses were within the redundancy when it
/// was written. Used by the sync (`flush_all`) and the intent log.
pub(crate) fn beyond_redundancy(
    t: &tarn_vdev::TopVdev,
    missed: impl IntoIterator<Item = usize>,
    troubled: &[usize],
) -> Option<Vec<usize>> {
    if troubled.is_empty() {
        return None;
    }
    let mut gone: Vec<usize> = missed.into_iter().chain(troubled.iter().copied()).collect();
    gone.sort_unstable();
    gone.dedup();
    (gone.len() > t.redundancy()).then_some(gone)
}

/// Runs `f` over `items` on up to `threads` scoped threads, keeping order.
pub(crate) fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Result<Vec<R>, PoolError> {
    let threads = threads.clamp(1, items.len().max(1));
    if threads == 1 {
        return Ok(items.iter().map(&f).collect());
    }
    let chunk = items.len().div_ceil(threads);
    let f = &f;
    let jobs: Vec<Box<dyn FnOnce() -> Vec<R> + Send + '_>> = items
        .chunks(chunk)
        .map(|c| Box::new(move || c.iter().map(f).collect::<Vec<R>>()) as Box<_>)
        .collect();
    let mut out = Vec::with_capacity(items.len());
    for got in tarn_vdev::workers::run_all(jobs) {
        match got {
            Some(v) => out.extend(v),
            None => return Err(PoolError::Internal("a sync worker thread panicked".into())),
        }
    }
    Ok(out)
}

/// Runs `prepare` and then `write` on each of `windows`, in order, with
/// the next window prepared on another thread while one is written (so
/// the CPU work of preparing fills the write's wait for the disk): what
/// the sync does with its data blocks (see [`Pool::write_data`]). Returns
/// every window's results in order. Stops at the first error of either
/// step: no window after a failed one is written, and none after the
/// window being prepared when it failed is prepared; the one being
/// prepared is finished and dropped first.
pub(crate) fn pipelined<W: Sync, P: Send, T>(
    windows: &[W],
    prepare: impl Fn(&W) -> Result<P, PoolError> + Sync,
    mut write: impl FnMut(&W, P) -> Result<Vec<T>, PoolError>,
) -> Result<Vec<T>, PoolError> {
    let mut out = Vec::new();
    let Some(first) = windows.first() else {
        return Ok(out);
    };
    let prepare = &prepare;
    let mut prepared = prepare(first)?;
    for (i, w) in windows.iter().enumerate() {
        // The next window is prepared on a kept thread while this one
        // is written; both have finished when `run_beside` returns, and
        // what was prepared is dropped on an error.
        let (written, next) = match windows.get(i + 1) {
            Some(n) => {
                let (written, next) =
                    tarn_vdev::workers::run_beside(|| write(w, prepared), move || prepare(n));
                let next = next.unwrap_or_else(|| {
                    Err(PoolError::Internal("a sync worker thread panicked".into()))
                });
                (written, Some(next))
            }
            None => (write(w, prepared), None),
        };
        out.extend(written?);
        match next {
            Some(n) => prepared = n?,
            None => break,
        }
    }
    Ok(out)
}

impl Pool {
    /// The sync of quiesced txg `txg`, step by step (see the module docs).
    pub(crate) fn sync_body(&self, sync: &mut SyncState, txg: u64) -> Result<u64, PoolError> {
        // Leaves that missed writes made early for the intent log, for
        // blocks of this txg or before.
        // Leaves whose flush failed in an intent log commit of this txg
        // (or before) may have dropped some of those early blocks: trouble
        // for this txg's sync however its own flushes go (`flush_all`).
        let (mut missed, lost) = self.take_missed(txg);
        // Before any write of the txg: a flush failure from now on, met by
        // whichever flush (an intent log commit's), may have dropped them.
        let marks: Vec<FlushMark> = self.tops.iter().map(|t| t.flush_mark()).collect();
        // 1. The dataset layer: its data blocks and tree nodes, and its
        // entries of the meta tree, which commits below.
        self.sync_ext(sync, txg, &mut missed)?;
        // 2. The intent log chain this txg makes obsolete, the header of the
        // next one, then the pool state record.
        self.log_sync(sync, txg)?;
        self.sync_pool_state(sync)?;
        // 3. The meta tree, bottom-up; then every block this txg stopped
        // referencing is freed (now, or deferred).
        let meta_root = self.sync_meta_tree(sync, txg, &mut missed)?;
        // 4. The space maps, which must include their own new block and
        // leave out what later txgs allocated.
        let space_root = self.sync_space_maps(txg, &mut missed)?;
        let space_root_ptr = space_root.root;
        // 5. Flush, the uberblock on every leaf that has the whole txg, flush.
        self.write_uberblocks(txg, meta_root, space_root_ptr, (&marks, &lost), &mut missed)?;
        // 6. Committed: only now may anything rely on txg `txg`.
        self.sync_done(sync, txg, meta_root, space_root, missed);
        Ok(txg)
    }

    /// Step 2b: the pool's own state record into the meta tree.
    fn sync_pool_state(&self, sync: &mut SyncState) -> Result<(), PoolError> {
        let props = {
            let mut st = self.lock();
            if st.props_dirty {
                st.props_dirty = false;
                Some(
                    serde_json::to_vec(&st.props)
                        .map_err(|e| PoolError::Internal(e.to_string()))?,
                )
            } else {
                None
            }
        };
        if let Some(p) = props {
            sync.meta
                .insert(&self.read_store(), crate::pool::K_PROPS, &p)?;
        }
        let json = {
            let mut st = self.lock();
            if !st.ms_dirty {
                return Ok(());
            }
            st.ms_dirty = false;
            serde_json::to_vec(&st.ms).map_err(|e| PoolError::Internal(e.to_string()))?
        };
        sync.meta.insert(&self.read_store(), K_STATE, &json)?;
        Ok(())
    }

    /// Step 3: commits the meta tree (children before parents) and frees
    /// everything the txg stopped referencing, including the previous
    /// space-root block. Returns the new root.
    fn sync_meta_tree(
        &self,
        sync: &mut SyncState,
        txg: u64,
        missed: &mut Vec<Missed>,
    ) -> Result<BlockPtr, PoolError> {
        let (alg, meta_copies) = {
            let st = self.lock();
            (st.props.checksum_alg(), st.props.metadata_copies())
        };
        let mut tx = TxStore {
            pool: self,
            txg,
            checksum: alg,
            copies: meta_copies,
            freed: Vec::new(),
            missed: Vec::new(),
        };
        let meta_root = sync.meta.commit(&mut tx)?;
        missed.append(&mut tx.missed);
        let mut all_frees = std::mem::take(&mut sync.frees);
        all_frees.append(&mut tx.freed);
        if !all_frees.is_empty() {
            sync.last_free_txg = txg;
        }
        // A freed block is never asked for again: its cached copy goes now,
        // so overwrites do not fill the cache with the versions they
        // replaced (see `BlockCache::forget`).
        for bp in &all_frees {
            self.cache.forget(self.guid, bp);
        }
        let mut st = self.lock();
        if !st.space_root.root.is_hole() {
            all_frees.extend(st.space_root.all().copied());
        }
        for bp in &all_frees {
            if bp.birth >= txg {
                self.free_now(&mut st, &bp.used_dvas().copied().collect::<Vec<_>>())
                    .map_err(|e| PoolError::Internal(format!("{}: {e}", pipeline::describe(bp))))?;
                continue;
            }
            for d in bp.used_dvas() {
                // A bad free means the accounting is wrong: stop rather than
                // risk handing out space that is still in use. A vdev that
                // does not exist is one too, as in `Pool::free_now`.
                let m = st.space.get_mut(d.vdev as usize).ok_or_else(|| {
                    PoolError::Internal(format!(
                        "space accounting: {}: free on vdev {}, which does not exist",
                        pipeline::describe(bp),
                        d.vdev
                    ))
                })?;
                m.free_deferred(d.offset, d.asize as u64, txg)
                    .map_err(|e| {
                        PoolError::Internal(format!(
                            "space accounting: {}: {e}",
                            pipeline::describe(bp)
                        ))
                    })?;
            }
        }
        Ok(meta_root)
    }

    /// Step 4: allocates the space-root block first (or, for a large
    /// encoding, its chunks and their index), then encodes every map (so
    /// the encoding includes its own allocations, and leaves out the
    /// allocations of later txgs: see `space`), then writes it.
    fn sync_space_maps(
        &self,
        txg: u64,
        missed: &mut Vec<Missed>,
    ) -> Result<SpaceBlocks, PoolError> {
        let (alg, body, chunk, chunk_dvas, index_dvas) = {
            let mut st = self.lock();
            let alg = st.props.checksum_alg();
            let meta_copies = st.props.metadata_copies();
            let later: Vec<Vec<(u64, u64)>> = (0..st.space.len())
                .map(|v| Self::later_allocations(&st, v, txg))
                .collect();
            // The size after `allocs` more allocations of `meta_copies`
            // copies each (one allocation adds at most one extent).
            let bound_for = |allocs: usize| {
                let extra = meta_copies * allocs + 1;
                let b = 12
                    + st.space
                        .iter()
                        .zip(&later)
                        .map(|(m, l)| 4 + m.encoded_len_bound(extra + l.len()))
                        .sum::<usize>();
                b.next_multiple_of(512)
            };
            // One block, or as many chunks as the bound needs plus their
            // index, which are allocations the bound must count too.
            let chunk = (self.opts.space_chunk_bytes.clamp(4096, SPACE_CHUNK_MAX) / 512) * 512;
            let mut chunks = 1usize;
            let bound = loop {
                let b = bound_for(if chunks == 1 { 1 } else { chunks + 1 });
                let need = b.div_ceil(chunk).max(1);
                if need <= chunks {
                    break b;
                }
                chunks = need;
            };
            let mut chunk_dvas = Vec::with_capacity(chunks);
            for i in 0..chunks {
                let len = (bound - i * chunk).min(chunk);
                chunk_dvas.push(self.allocate(&mut st, len as u64, meta_copies, false, None)?);
            }
            let index_dvas = if chunks > 1 {
                let len = (20 + chunks * BLOCK_PTR_SIZE).next_multiple_of(512);
                Some(self.allocate(&mut st, len as u64, meta_copies, false, None)?)
            } else {
                None
            };
            let body = encode_space_root(&st.space, &later, bound);
            (alg, body, chunk, chunk_dvas, index_dvas)
        };
        let write = |bytes: Vec<u8>, dvas: &[tarn_block::Dva], missed: &mut Vec<Missed>| {
            let p = Prepared {
                checksum: tarn_block::checksum(alg, &bytes),
                lsize: bytes.len() as u32,
                compress: CompressAlg::Off,
                checksum_alg: alg,
                stored: bytes.into(),
                seal: None,
            };
            missed.extend(pipeline::write_copies(&self.tops, dvas, &p.stored)?);
            Ok::<_, PoolError>(pipeline::make_ptr(&p, dvas, txg, BlockType::SpaceMap, 0))
        };
        let Some(index_dvas) = index_dvas else {
            let root = write(body, &chunk_dvas[0], missed)?;
            return Ok(SpaceBlocks {
                root,
                chunks: Vec::new(),
            });
        };
        let mut chunks = Vec::with_capacity(chunk_dvas.len());
        for (piece, dvas) in body.chunks(chunk).zip(&chunk_dvas) {
            chunks.push(write(piece.to_vec(), dvas, missed)?);
        }
        let mut index = Vec::with_capacity(20 + chunks.len() * BLOCK_PTR_SIZE);
        index.extend_from_slice(SPACE_ROOT_MAGIC);
        index.extend_from_slice(&SPACE_INDEX_VERSION.to_le_bytes());
        index.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
        index.extend_from_slice(&(body.len() as u64).to_le_bytes());
        for c in &chunks {
            index.extend_from_slice(&c.encode());
        }
        index.resize(index.len().next_multiple_of(512), 0);
        let root = write(index, &index_dvas, missed)?;
        Ok(SpaceBlocks { root, chunks })
    }

    /// Step 5: flush, uberblock `txg` into every leaf that received every
    /// write of the txg (see docs/format.md), flush. A leaf whose flush
    /// failed (within the redundancy) may have lost the txg's writes: it
    /// joins `missed`, so it gets no uberblock of `txg` and its dirty time
    /// log names `txg`.
    fn write_uberblocks(
        &self,
        txg: u64,
        meta_root: BlockPtr,
        space_root: BlockPtr,
        trouble: (&[FlushMark], &[Missed]),
        missed: &mut Vec<Missed>,
    ) -> Result<(), PoolError> {
        self.flush_all(trouble, missed)?;
        // Every leaf that missed a write is named in the uberblock too, for
        // the case where it gets the uberblock anyway (below).
        let mut missed_guids: Vec<u64> = missed
            .iter()
            .filter_map(|m| {
                self.tops
                    .get(m.vdev as usize)
                    .and_then(|t| t.leaves().into_iter().nth(m.child))
                    .map(|l| l.guid)
            })
            .collect();
        missed_guids.sort_unstable();
        missed_guids.dedup();
        let ub = Uberblock {
            txg,
            pool_guid: self.guid,
            timestamp: now_unix(),
            meta_root,
            space_root,
            missed_overflow: missed_guids.len() > crate::uberblock::MISSED_LISTED_MAX,
            missed: missed_guids,
        }
        .encode();
        let slot = (txg % tarn_vdev::uberblock_slots(self.ashift) as u64) as usize;
        // A leaf's newest uberblock says "I hold everything up to here": a
        // leaf that missed a write of this txg does not get this one, so
        // import can tell what it missed even if the dirty time log of this
        // txg never reaches disk.
        let mut ub_written = 0;
        for (ti, t) in self.tops.iter().enumerate() {
            let leaves = t.leaves();
            let missed_here = |ci: usize| {
                missed
                    .iter()
                    .any(|m| m.vdev as usize == ti && m.child == ci)
            };
            // Hold the uberblock back only while another leaf of this vdev
            // got everything; otherwise the dirty time log committed with
            // the next txg is what records the misses.
            let some_complete = leaves
                .iter()
                .enumerate()
                .any(|(ci, l)| matches!(l.state, LeafState::Online) && !missed_here(ci));
            for (ci, info) in leaves.into_iter().enumerate() {
                if !matches!(info.state, LeafState::Online) || (some_complete && missed_here(ci)) {
                    continue;
                }
                if let Some(leaf) = t.leaf(ci) {
                    if tarn_vdev::write_uberblock(leaf.as_ref(), self.ashift, slot, &ub).is_ok() {
                        ub_written += 1;
                    }
                }
            }
        }
        if ub_written == 0 {
            return Err(PoolError::Faulted(format!(
                "txg {txg}: no device accepted the uberblock"
            )));
        }
        // A leaf whose second flush fails has the txg's blocks (the first
        // one made them durable) but perhaps not its uberblock; its dirty
        // time log names the txg all the same (a resilver of it costs
        // little, and import's check of its newest uberblock agrees).
        self.flush_all(trouble, missed)?;
        Ok(())
    }

    /// Flushes every top-level vdev; the leaves not durable since `marks`
    /// (within the redundancy) are added to `missed`. A leaf that got into
    /// trouble since (a failed flush, out of service), or whose flush
    /// failed in an intent log commit of the txg (`lost`), may have lost what
    /// the txg wrote to it: with the leaves that missed a write of the
    /// txg, it must stay within what the vdev tolerates, or a block that
    /// missed one side of a mirror while the other side's flush failed is
    /// on neither (counted over the whole txg, on the safe side). Without
    /// such trouble each block's own misses are within the redundancy
    /// already (its write said so), whatever the misses of others.
    fn flush_all(
        &self,
        (marks, lost): (&[FlushMark], &[Missed]),
        missed: &mut Vec<Missed>,
    ) -> Result<(), PoolError> {
        for (v, t) in self.tops.iter().enumerate() {
            let mark = marks.get(v).cloned().unwrap_or_default();
            for child in t.flush_since(&mark)? {
                let m = Missed {
                    vdev: v as u32,
                    child,
                };
                if !missed.contains(&m) {
                    missed.push(m);
                }
            }
            let mut troubled = t.troubled_since(&mark);
            troubled.extend(
                lost.iter()
                    .filter(|m| m.vdev as usize == v)
                    .map(|m| m.child),
            );
            let missed_here = missed
                .iter()
                .filter(|m| m.vdev as usize == v)
                .map(|m| m.child);
            if let Some(gone) = beyond_redundancy(t, missed_here, &troubled) {
                let leaves = t.leaves();
                return Err(tarn_vdev::VdevError::InsufficientReplicas {
                    op: "flush",
                    failed: gone.len(),
                    tolerated: t.redundancy(),
                    devices: gone
                        .iter()
                        .filter_map(|c| leaves.get(*c).map(|l| l.path.display().to_string()))
                        .collect(),
                }
                .into());
            }
        }
        Ok(())
    }

    /// Step 6: the txg is durable. The extension publishes it first, so a
    /// reader that sees the new committed txg reads its trees; then
    /// deferred frees that are old enough come back, leaves that missed
    /// writes get a dirty time log entry (committed with the next txg), the
    /// txg's own allocations leave the uncommitted set, caches drop clean
    /// nodes, and waiters wake.
    fn sync_done(
        &self,
        sync: &mut SyncState,
        txg: u64,
        meta_root: BlockPtr,
        space_root: SpaceBlocks,
        missed: Vec<Missed>,
    ) {
        self.ext_committed(txg);
        let mut st = self.lock();
        st.txg = txg;
        st.space_root = space_root;
        st.meta_root = meta_root;
        st.last_sync_unix = now_unix();
        Self::forget_committed_allocations(&mut st, txg);
        self.release_frees(&mut st);
        for m in missed {
            if let Some(info) = self
                .tops
                .get(m.vdev as usize)
                .and_then(|t| t.leaves().into_iter().nth(m.child))
            {
                let e = st.ms.dtl.entry(info.guid).or_insert((txg, txg));
                e.0 = e.0.min(txg);
                e.1 = e.1.max(txg);
                st.ms_dirty = true;
            }
        }
        drop(st);
        sync.meta.evict_clean();
        self.cv.notify_all();
    }

    /// Returns deferred frees to the allocator once `DEFER_TXGS` newer txgs
    /// are durable and no reader holds a txg that still references them.
    pub(crate) fn release_frees(&self, st: &mut State) {
        // release_deferred(S) returns frees of txgs <= S - DEFER_TXGS; a hold
        // on txg H allows releasing frees of txgs <= H only.
        let mut upto = st.txg;
        if let Some(h) = self.holds.oldest() {
            upto = upto.min(h + DEFER_TXGS);
        }
        for m in &mut st.space {
            m.release_deferred(upto);
        }
        for l in &mut st.logs {
            l.space.release_deferred(upto);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    fn fail(m: &str) -> PoolError {
        PoolError::Internal(m.into())
    }

    fn is(r: &Result<Vec<u32>, PoolError>, m: &str) -> bool {
        matches!(r, Err(PoolError::Internal(x)) if x == m)
    }

    /// Every window is prepared and written once, in order, and the next
    /// window's preparation runs while one is being written (a write here
    /// waits until the next preparation has started: done one after the
    /// other, it would wait in vain).
    #[test]
    fn windows_are_written_in_order_while_the_next_is_prepared() {
        let windows: Vec<u32> = (0..6).collect();
        let (tx, rx) = mpsc::channel::<u32>();
        let tx = Mutex::new(tx);
        let out = pipelined(
            &windows,
            |w| {
                tx.lock().unwrap().send(*w).unwrap();
                Ok(w * 10)
            },
            |w, p| {
                assert_eq!(p, w * 10, "window {w} got what was prepared for it");
                if *w + 1 < 6 {
                    while rx
                        .recv_timeout(Duration::from_secs(10))
                        .expect("next prepared meanwhile")
                        != w + 1
                    {}
                }
                Ok(vec![(*w, p)])
            },
        )
        .unwrap();
        assert_eq!(out, (0..6).map(|w| (w, w * 10)).collect::<Vec<_>>());
        let none: Vec<u32> = Vec::new();
        let out = pipelined(
            &none,
            |_| -> Result<u32, PoolError> { panic!("nothing to prepare") },
            |_, _| Ok(vec![0u8]),
        );
        assert!(out.unwrap().is_empty());
    }

    /// Six windows, the write of `bad_write` or the preparation of
    /// `bad_prepare` failing: the outcome, the windows written, and the
    /// windows prepared (sorted).
    fn six_windows(
        bad_write: Option<u32>,
        bad_prepare: Option<u32>,
    ) -> (Result<Vec<u32>, PoolError>, Vec<u32>, Vec<u32>) {
        let windows: Vec<u32> = (0..6).collect();
        let prepared = Mutex::new(Vec::new());
        let mut written = Vec::new();
        let r = pipelined(
            &windows,
            |w| {
                prepared.lock().unwrap().push(*w);
                match bad_prepare == Some(*w) {
                    true => Err(fail("seal")),
                    false => Ok(*w),
                }
            },
            |w, _| {
                written.push(*w);
                match bad_write == Some(*w) {
                    true => Err(fail("disk")),
                    false => Ok(vec![*w]),
                }
            },
        );
        let mut p = prepared.into_inner().unwrap();
        p.sort();
        (r, written, p)
    }

    /// A failed write ends it: no later window is written, and only the
    /// one being prepared meanwhile was prepared.
    #[test]
    fn a_failed_write_stops_the_windows_after_it() {
        let (r, written, prepared) = six_windows(Some(2), None);
        assert!(is(&r, "disk"), "{r:?}");
        assert_eq!(written, [0, 1, 2]);
        assert_eq!(prepared, [0, 1, 2, 3]);
    }

    /// A window that cannot be prepared is not written, nor is any after
    /// it; the ones before it are.
    #[test]
    fn a_failed_preparation_stops_before_its_window() {
        let (r, written, prepared) = six_windows(None, Some(3));
        assert!(is(&r, "seal"), "{r:?}");
        assert_eq!(written, [0, 1, 2]);
        assert_eq!(prepared, [0, 1, 2, 3]);
    }

    /// A preparing thread that panics is an error, not a panic of the sync.
    #[test]
    fn a_panicking_preparation_is_an_error() {
        let windows: Vec<u32> = (0..3).collect();
        let mut written = Vec::new();
        let r = pipelined(
            &windows,
            |w| {
                if *w == 1 {
                    panic!("injected");
                }
                Ok(*w)
            },
            |w, _| {
                written.push(*w);
                Ok(vec![*w])
            },
        );
        assert!(is(&r, "a sync worker thread panicked"), "{r:?}");
        assert_eq!(written, [0]);
    }
}
