//! Space policy (what ordinary writes may use, and the room every vdev
//! keeps for the metadata of the txgs to come) and cached data reads.

use std::sync::Arc;

use tarn_block::pipeline;
use tarn_block::{BlockKind, BlockPtr};

use crate::pool::{Pool, State};
use crate::store::METADATA_RESERVE_BYTES;
use crate::PoolError;

impl Pool {
    /// Reads, verifies and decompresses a data block through the block
    /// cache: a hit costs no I/O and no checksum. Only verified bytes are
    /// cached. The caller keeps `bp` from being freed and reused while it
    /// reads (the pool lock, or a hold on the txg it came from).
    pub(crate) fn read_data(&self, bp: &BlockPtr) -> Result<Arc<[u8]>, PoolError> {
        if let Some(d) = self.cache.get(self.guid, bp, BlockKind::Data) {
            return Ok(d);
        }
        let d: Arc<[u8]> = Arc::from(pipeline::read_block(&self.tops, bp)?);
        self.cache.insert(self.guid, bp, d.clone(), BlockKind::Data);
        Ok(d)
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
