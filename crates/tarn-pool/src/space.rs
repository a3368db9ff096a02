//! Allocation and freeing on the data vdevs, space policy (what ordinary
//! writes may use, and the room every vdev keeps for the metadata of the
//! txgs to come), and cached data reads.
//!
//! # Theory
//!
//! **Allocations of a txg that is not the one syncing.** Open context
//! allocates while an earlier txg syncs: room for the data blocks it
//! accepts, intent log blocks. Those allocations belong to the open txg;
//! the syncing txg's space maps must not show them, or a crash after it
//! commits would leave them allocated with nothing referencing them. So
//! every open-context allocation is recorded in `State::uncommitted` with
//! its txg, a free of such a range takes it out again, the sync of txg T
//! writes its space maps with the ranges of later txgs left out
//! (`SpaceMap::encode_excluding`), and the commit of T forgets the ranges
//! of txgs up to T (T's maps hold them now). Import claims what the intent
//! log of a later txg still needs, as before.
//!
//! **A bad free is an accounting bug**, whoever meets it: freeing space that
//! is not allocated (or twice) means some structure and the space maps
//! disagree, and handing that space out again could overwrite live data.
//! Every free goes through [`Pool::free_now`] or the sync's deferred frees,
//! both of which return the error; open context faults the pool with it,
//! the sync fails (and faults the pool) with it.

use std::sync::Arc;

use tarn_block::pipeline;
use tarn_block::{BlockId, BlockKind, BlockPtr, Dva, KeySet};

use crate::flight::Joined;
use crate::pool::{Pool, State};
use crate::store::{Allocator, METADATA_RESERVE_BYTES};
use crate::PoolError;

/// Why a data block may not be read with `key`, whatever the cache holds
/// (it holds logical bytes): an encrypted block without its key loaded,
/// or a block that is not sealed read for an encrypted dataset (a pointer
/// changed on disk, or a tampered stream, would have it taken as the
/// file's bytes unauthenticated). A read from the devices refuses both
/// (`pipeline`); so must a cache hit, the bytes cached by another reader.
fn refusal(bp: &BlockPtr, key: Option<&KeySet>) -> Option<PoolError> {
    match (bp.is_encrypted(), key) {
        (true, k) if k.is_none_or(KeySet::is_revoked) => {
            Some(tarn_block::BlockError::KeyUnavailable(pipeline::describe(bp)).into())
        }
        (false, Some(_)) => Some(
            tarn_block::BlockError::Crypto(format!(
                "{} belongs to an encrypted dataset but is not sealed",
                pipeline::describe(bp)
            ))
            .into(),
        ),
        _ => None,
    }
}

/// Takes `[off, off + len)` out of the uncommitted ranges of one vdev.
fn untrack(map: &mut std::collections::BTreeMap<u64, (u64, u64)>, off: u64, len: u64) {
    let end = off + len;
    let hit: Vec<(u64, u64, u64)> = map
        .range(..end)
        .rev()
        .take_while(|(o, (l, _))| **o + *l > off)
        .map(|(o, (l, t))| (*o, *l, *t))
        .collect();
    for (o, l, t) in hit {
        map.remove(&o);
        if o < off {
            map.insert(o, (off - o, t));
        }
        if o + l > end {
            map.insert(end, (o + l - end, t));
        }
    }
}

impl Pool {
    /// Allocates `copies` addresses for `psize` stored bytes on the data
    /// vdevs. `reserve`: leave each vdev its metadata reserve (data and log
    /// blocks do; metadata may use it). `open`: the open txg this allocation
    /// belongs to, when it is not the txg being synced (see the module docs).
    pub(crate) fn allocate(
        &self,
        st: &mut State,
        psize: u64,
        copies: usize,
        reserve: bool,
        open: Option<u64>,
    ) -> Result<Vec<Dva>, PoolError> {
        let keep: Vec<u64> = if reserve {
            (0..self.tops.len())
                .map(|v| self.metadata_reserve(st, v))
                .collect()
        } else {
            Vec::new()
        };
        let State {
            space,
            rotor,
            uncommitted,
            ..
        } = st;
        let dvas = Allocator {
            tops: &self.tops,
            space,
            rotor,
            keep_contiguous: &keep,
        }
        .alloc(psize, copies)?;
        if let Some(txg) = open {
            for d in &dvas {
                if let Some(m) = uncommitted.get_mut(d.vdev as usize) {
                    m.insert(d.offset, (d.asize as u64, txg));
                }
            }
        }
        Ok(dvas)
    }

    /// Frees ranges at once: space allocated in a txg that has not
    /// committed (and so no durable uberblock references). An error means
    /// the accounting is wrong (see the module docs).
    pub(crate) fn free_now(&self, st: &mut State, dvas: &[Dva]) -> Result<(), PoolError> {
        for d in dvas {
            self.free_range_now(st, d.vdev, d.offset, d.asize as u64)?;
        }
        Ok(())
    }

    /// [`Pool::free_now`] of part of an allocation.
    pub(crate) fn free_range_now(
        &self,
        st: &mut State,
        vdev: u32,
        offset: u64,
        len: u64,
    ) -> Result<(), PoolError> {
        if len == 0 {
            return Ok(());
        }
        let m = st.space.get_mut(vdev as usize).ok_or_else(|| {
            PoolError::Internal(format!(
                "space accounting: free on vdev {vdev}, which does not exist"
            ))
        })?;
        m.free_now(offset, len)
            .map_err(|e| PoolError::Internal(format!("space accounting: vdev {vdev}: {e}")))?;
        if let Some(u) = st.uncommitted.get_mut(vdev as usize) {
            untrack(u, offset, len);
        }
        Ok(())
    }

    /// The ranges of vdev `v` allocated by txgs after `txg`, sorted: what
    /// the space map written by `txg` leaves out.
    pub(crate) fn later_allocations(st: &State, v: usize, txg: u64) -> Vec<(u64, u64)> {
        st.uncommitted
            .get(v)
            .map(|m| {
                m.iter()
                    .filter(|(_, (_, t))| *t > txg)
                    .map(|(o, (l, _))| (*o, *l))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Txg `txg` committed: its own allocations are in its space maps now.
    pub(crate) fn forget_committed_allocations(st: &mut State, txg: u64) {
        for m in &mut st.uncommitted {
            m.retain(|_, (_, t)| *t > txg);
        }
    }

    /// Reads, verifies and decompresses a data block through the block
    /// cache: a hit costs no I/O and no checksum. Only verified bytes are
    /// cached. The caller keeps `bp` from being freed and reused while it
    /// reads (the pool lock, or a hold on the txg it came from).
    pub(crate) fn read_data(
        &self,
        bp: &BlockPtr,
        key: Option<&KeySet>,
    ) -> Result<Arc<[u8]>, PoolError> {
        // An encrypted block is read only by someone holding its key, even
        // when its plaintext is cached (the cache holds logical bytes).
        if let Some(e) = refusal(bp, key) {
            return Err(e);
        }
        if let Some(d) = self.cache.get(self.guid, bp, BlockKind::Data) {
            return Ok(d);
        }
        // One read per block however many ask at once (see `flight`); a
        // reader whose leader failed reads (and repairs or reports) itself.
        let lead = match BlockId::of(self.guid, bp).map(|k| self.flights.join(k)) {
            None => None,
            Some(Joined::Lead(l)) => Some(l),
            Some(Joined::Wait(w)) => match w.wait() {
                Some(d) => {
                    if let Some(e) = refusal(bp, key) {
                        return Err(e);
                    }
                    self.cache.used(self.guid, bp);
                    return Ok(d);
                }
                None => None,
            },
        };
        let d: Arc<[u8]> = Arc::from(pipeline::read_block(&self.tops, bp, key)?);
        // A key unloaded meanwhile: its plaintext does not enter the cache.
        if !self
            .cache
            .insert_unless_revoked(self.guid, bp, d.clone(), BlockKind::Data, key, false)
        {
            return Err(tarn_block::BlockError::KeyUnavailable(pipeline::describe(bp)).into());
        }
        if let Some(l) = lead {
            l.finish(Some(d.clone()));
        }
        Ok(d)
    }

    /// [`Pool::read_data`] of many blocks at once, in order. The cache
    /// answers what it holds; the rest is read as one batch
    /// ([`pipeline::read_blocks`]: the pieces of neighbouring blocks merged
    /// into few reads per device), and each block read is verified, cached
    /// and handed to readers waiting for it, as `read_data` does. Blocks
    /// another reader is already fetching are waited for only after this
    /// batch's own are done, so two batches never wait on each other.
    pub(crate) fn read_data_many(
        &self,
        bps: &[&BlockPtr],
        key: Option<&KeySet>,
    ) -> Vec<Result<Arc<[u8]>, PoolError>> {
        let no_key = |bp: &BlockPtr| -> PoolError {
            tarn_block::BlockError::KeyUnavailable(pipeline::describe(bp)).into()
        };
        let mut out: Vec<Option<Result<Arc<[u8]>, PoolError>>> =
            (0..bps.len()).map(|_| None).collect();
        let mut mine = Vec::new();
        let mut waits = Vec::new();
        for (i, bp) in bps.iter().enumerate() {
            if let Some(e) = refusal(bp, key) {
                out[i] = Some(Err(e));
                continue;
            }
            if let Some(d) = self.cache.get(self.guid, bp, BlockKind::Data) {
                out[i] = Some(Ok(d));
                continue;
            }
            match BlockId::of(self.guid, bp).map(|k| self.flights.join(k)) {
                None => mine.push((i, None)),
                Some(Joined::Lead(l)) => mine.push((i, Some(l))),
                Some(Joined::Wait(w)) => waits.push((i, w)),
            }
        }
        let batch: Vec<&BlockPtr> = mine.iter().map(|(i, _)| bps[*i]).collect();
        let read = pipeline::read_blocks(&self.tops, &batch, key);
        for ((i, lead), r) in mine.into_iter().zip(read) {
            out[i] = Some(match r {
                Ok(v) => {
                    let d: Arc<[u8]> = v;
                    // A key unloaded meanwhile: its plaintext does not
                    // enter the cache (and the waiters read for themselves).
                    if self.cache.insert_unless_revoked(
                        self.guid,
                        bps[i],
                        d.clone(),
                        BlockKind::Data,
                        key,
                        false,
                    ) {
                        if let Some(l) = lead {
                            l.finish(Some(d.clone()));
                        }
                        Ok(d)
                    } else {
                        Err(no_key(bps[i]))
                    }
                }
                Err(e) => Err(e.into()),
            });
        }
        for (i, w) in waits {
            // Judged after the wait: plaintext read before a key was
            // unloaded is not handed out after it.
            out[i] = Some(match (w.wait(), refusal(bps[i], key)) {
                (Some(_), Some(e)) => Err(e),
                (Some(d), None) => {
                    self.cache.used(self.guid, bps[i]);
                    Ok(d)
                }
                (None, _) => self.read_data(bps[i], key),
            });
        }
        out.into_iter()
            .zip(bps)
            .map(|(r, bp)| r.unwrap_or_else(|| self.read_data(bp, key)))
            .collect()
    }

    /// [`Pool::read_held`] of many blocks at once (see
    /// [`Pool::read_data_many`]), each kept from reuse by its hold.
    pub fn read_held_many(
        &self,
        bps: &[&BlockPtr],
        key: Option<&KeySet>,
        _holds: &[&crate::OwnedHold],
    ) -> Vec<Result<Arc<[u8]>, PoolError>> {
        let usable = self.check_usable(&self.lock());
        if let Err(e) = usable {
            // The same refusal for each block (the kind is what callers
            // act on: a faulted pool, or one that is gone).
            return bps
                .iter()
                .map(|_| {
                    Err(match &e {
                        PoolError::NotFound(m) => PoolError::NotFound(m.clone()),
                        PoolError::Faulted(m) => PoolError::Faulted(m.clone()),
                        other => PoolError::Faulted(other.to_string()),
                    })
                })
                .collect();
        }
        self.read_data_many(bps, key)
    }

    /// The stored bytes of a block, verified against its checksum but not
    /// decrypted or decompressed (a raw send streams them as they are);
    /// not cached. `_hold` keeps its space from reuse, as for
    /// [`Pool::read_held`].
    pub fn read_stored_held(
        &self,
        bp: &BlockPtr,
        _hold: &crate::OwnedHold,
    ) -> Result<Vec<u8>, PoolError> {
        self.check_usable(&self.lock())?;
        Ok(pipeline::read_stored(&self.tops, bp)?)
    }

    /// A reader of committed tree nodes outside any lock (through the
    /// block cache), for walks that hold a committed txg (see
    /// [`crate::Cx::hold`]) so nothing they read is reused meanwhile.
    pub fn committed_store(&self) -> crate::store::ReadStore<'_> {
        self.read_store()
    }

    /// Drops this pool's blocks from the block cache (a key was unloaded:
    /// the plaintext the cache holds of its blocks must go).
    pub fn evict_cache(&self) {
        self.cache.evict_pool(self.guid);
    }

    /// Reads a data block outside any transaction, so reads of one dataset
    /// run in parallel. `_hold`, taken while the pointer was looked up (see
    /// [`crate::Cx::hold`]), is the proof that its space is not reused
    /// meanwhile: without it a reader could get another block's bytes,
    /// which would fail the checksum and pass for damage.
    pub fn read_held(
        &self,
        bp: &BlockPtr,
        key: Option<&KeySet>,
        _hold: &crate::OwnedHold,
    ) -> Result<Arc<[u8]>, PoolError> {
        self.check_usable(&self.lock())?;
        self.read_data(bp, key)
    }

    /// [`Pool::read_held`] from the block cache only: the block's bytes if
    /// they are cached and may be read (an encrypted block needs its key
    /// loaded), None otherwise, without waiting for a device. A miss is
    /// not counted: the caller reads the block the usual way next.
    pub fn read_held_cached(
        &self,
        bp: &BlockPtr,
        key: Option<&KeySet>,
        _hold: &crate::OwnedHold,
    ) -> Option<Arc<[u8]>> {
        if refusal(bp, key).is_some() {
            return None;
        }
        self.cache.try_get(self.guid, bp, BlockKind::Data)
    }

    /// Whether [`Pool::read_held_cached`] would answer now (no use, hit
    /// or miss is counted): a reader of many blocks checks them all before
    /// it reads any, so a read that falls back is not counted twice.
    pub fn is_cached(&self, bp: &BlockPtr, key: Option<&KeySet>) -> bool {
        refusal(bp, key).is_none() && self.cache.contains(self.guid, bp)
    }

    /// Reads a data block into the block cache ahead of its reader
    /// (read-ahead), unless it is there already. Advisory: a block that
    /// fails to read or verify is left alone here, for the reader's own
    /// read to repair or report. `_hold` keeps its space from reuse, as
    /// for [`Pool::read_held`].
    pub fn prefetch_held(&self, bp: &BlockPtr, key: Option<&KeySet>, hold: &crate::OwnedHold) {
        self.prefetch_held_many(&[bp], key, &[hold]);
    }

    /// [`Pool::prefetch_held`] of many blocks, read as one batch (the
    /// pieces of neighbouring blocks merged, see
    /// [`pipeline::read_blocks`]); equally advisory.
    pub fn prefetch_held_many(
        &self,
        bps: &[&BlockPtr],
        key: Option<&KeySet>,
        _holds: &[&crate::OwnedHold],
    ) {
        if self.check_usable(&self.lock()).is_err() {
            return;
        }
        let mut leads = Vec::new();
        let mut batch = Vec::new();
        for bp in bps {
            if refusal(bp, key).is_some()
                || !self.cache.would_keep(bp.lsize as usize)
                || self.cache.contains(self.guid, bp)
            {
                continue;
            }
            if let Some(lead) = BlockId::of(self.guid, bp).and_then(|k| self.flights.lead(k)) {
                leads.push(lead);
                batch.push(*bp);
            }
        }
        // A job of one block (a file's read-ahead goes a block at a time)
        // reads it alone, through the page cache, as a file's lone reads
        // do; a batch goes past it (see `pipeline::read_blocks`).
        let read = match batch.as_slice() {
            [one] => vec![pipeline::read_block(&self.tops, one, key).map(Arc::from)],
            _ => pipeline::read_blocks(&self.tops, &batch, key),
        };
        for ((bp, lead), r) in batch.iter().zip(leads).zip(read) {
            match r {
                Ok(d) => {
                    let d: Arc<[u8]> = d;
                    if self.cache.insert_unless_revoked(
                        self.guid,
                        bp,
                        d.clone(),
                        BlockKind::Data,
                        key,
                        true,
                    ) {
                        lead.finish(Some(d));
                    } else {
                        lead.finish(None);
                    }
                }
                Err(_) => lead.finish(None),
            }
        }
    }

    /// Space that ordinary writes may still use: on each vdev, whole records
    /// above its metadata reserve (which is at least its slop; a record
    /// cannot straddle vdevs). The open txg's records hold their room as
    /// reservations, so it is already taken from the free space.
    pub(crate) fn writable_bytes(&self, st: &State, record_len: u64) -> u64 {
        let per = self.record_alloc_size(record_len).max(1);
        let mut writable = 0u64;
        for (v, m) in st.space.iter().enumerate() {
            let spare = m.free().saturating_sub(self.metadata_reserve(st, v));
            writable += spare / per * per;
        }
        writable
    }

    /// Contiguous room data must leave on vdev `v`: its slop (so deletes on
    /// a full pool can commit), at least `METADATA_RESERVE_BYTES`, and
    /// twice what the space-root block needs per metadata copy.
    pub(crate) fn metadata_reserve(&self, st: &State, v: usize) -> u64 {
        let maps: u64 = st.space.iter().map(|m| m.encoded_len_bound(4) as u64).sum();
        let asize = st.space.get(v).map_or(0, |m| m.asize());
        tarn_space::slop_bytes(asize)
            .max(METADATA_RESERVE_BYTES)
            .max(2 * maps * st.props.metadata_copies() as u64)
    }

    /// Largest allocation one copy of a `len`-byte record takes on any vdev.
    pub(crate) fn record_alloc_size(&self, len: u64) -> u64 {
        self.tops
            .iter()
            .map(|t| t.alloc_size(len))
            .max()
            .unwrap_or(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PoolOptions, VdevSpec};
    use tarn_block::{BlockCache, BlockType, Cipher};

    /// A block another reader cached is still judged by its pointer: one
    /// that is not sealed, read for an encrypted dataset (a key given),
    /// is refused as a read from the devices would refuse it; an
    /// encrypted one needs a key that is loaded.
    #[test]
    fn a_cache_hit_is_refused_what_a_device_read_would_be() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("d0");
        std::fs::File::create(&dev)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let opts = PoolOptions {
            cache: Some(Arc::new(BlockCache::new(16 << 20))),
            sync_interval: std::time::Duration::from_secs(3600),
            ..Default::default()
        };
        let spec = VdevSpec {
            kind: tarn_vdev::VdevKind::Single,
            devices: vec![dev],
        };
        let pool = Pool::create("tank", &[spec], 12, &Default::default(), false, opts).unwrap();
        let key = KeySet::generate(Cipher::default()).unwrap();
        let mut plain = BlockPtr {
            lsize: 4096,
            psize: 4096,
            birth: 3,
            btype: BlockType::Data,
            fill: 1,
            ..Default::default()
        };
        plain.dvas[0] = Dva {
            vdev: 0,
            asize: 4096,
            offset: 1 << 20,
        };
        let mut sealed = plain;
        sealed.dvas[0].offset = 2 << 20;
        sealed.flags = tarn_block::bp::FLAG_ENCRYPTED;
        let bytes: Arc<[u8]> = Arc::from(vec![7u8; 4096]);
        for bp in [&plain, &sealed] {
            pool.cache
                .insert(pool.guid, bp, bytes.clone(), BlockKind::Data);
        }
        // Cached: an unencrypted reader gets the plain block.
        assert_eq!(pool.read_data(&plain, None).unwrap(), bytes);
        assert!(matches!(
            pool.read_data(&plain, Some(&key)),
            Err(PoolError::Block(tarn_block::BlockError::Crypto(_)))
        ));
        assert!(pool.read_data_many(&[&plain], Some(&key))[0].is_err());
        assert!(!pool.is_cached(&plain, Some(&key)));
        assert!(pool.read_data(&sealed, None).is_err());
        assert_eq!(pool.read_data(&sealed, Some(&key)).unwrap(), bytes);
        key.revoke();
        assert!(pool.read_data(&sealed, Some(&key)).is_err());
        pool.abandon();
    }
}
