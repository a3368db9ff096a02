//! How the pool's trees reach blocks: a read-only store for lookups and a
//! transactional store used while a txg syncs, plus the txg holds that keep
//! freed blocks from being reused while someone may still read them.
//!
//! Why holds: a reader looks a pointer up under the pool lock, then reads the
//! block without it. If the block were freed and its space reused meanwhile,
//! the read would fail its checksum, and worse, self-heal would "repair" the
//! new owner's bytes with reconstructed old ones. A hold records the
//! committed txg the pointer came from; deferred frees of later txgs are not
//! returned to the allocator until every hold on an earlier txg is released.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tarn_block::pipeline::{self, Missed};
use tarn_block::{BlockCache, BlockKind, BlockPtr, BlockType, ChecksumAlg, Compression, Dva};
use tarn_space::SpaceMap;
use tarn_tree::{NodeStore, TreeError};
use tarn_vdev::TopVdev;

use crate::PoolError;

/// Committed txgs that readers still depend on.
#[derive(Default)]
pub struct Holds {
    held: Mutex<BTreeMap<u64, u32>>,
}

/// Releases its hold when dropped.
pub struct HoldGuard<'a> {
    holds: &'a Holds,
    txg: u64,
}

/// A hold that owns its reference to the holds, so a reader can keep it
/// while it reads with no lock and no borrow of the pool.
pub struct OwnedHold {
    holds: Arc<Holds>,
    txg: u64,
}

impl Drop for OwnedHold {
    fn drop(&mut self) {
        self.holds.release(self.txg);
    }
}

impl Holds {
    /// Registers a reader of pointers committed in `txg`.
    pub fn hold(&self, txg: u64) -> HoldGuard<'_> {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        *h.entry(txg).or_insert(0) += 1;
        HoldGuard { holds: self, txg }
    }

    /// Like [`Holds::hold`], owned.
    pub fn hold_owned(self: &Arc<Self>, txg: u64) -> OwnedHold {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        *h.entry(txg).or_insert(0) += 1;
        OwnedHold {
            holds: self.clone(),
            txg,
        }
    }

    fn release(&self, txg: u64) {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = h.get_mut(&txg) {
            *n -= 1;
            if *n == 0 {
                h.remove(&txg);
            }
        }
    }

    /// The oldest held txg, if any.
    pub fn oldest(&self) -> Option<u64> {
        let h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        h.keys().next().copied()
    }
}

impl Drop for HoldGuard<'_> {
    fn drop(&mut self) {
        self.holds.release(self.txg);
    }
}

/// Reads a tree node through the cache.
fn read_node(
    tops: &[Arc<TopVdev>],
    cache: &BlockCache,
    pool: u64,
    ptr: &BlockPtr,
) -> Result<Vec<u8>, TreeError> {
    if let Some(v) = cache.get(pool, ptr, BlockKind::Meta) {
        return Ok(v.to_vec());
    }
    let data = pipeline::read_block(tops, ptr, None).map_err(|e| TreeError::Store(Box::new(e)))?;
    cache.insert(pool, ptr, Arc::from(data.as_slice()), BlockKind::Meta);
    Ok(data)
}

/// The store for lookups between syncs: reads only.
pub struct ReadStore<'a> {
    /// The pool's top-level vdevs.
    pub tops: &'a [Arc<TopVdev>],
    /// The block cache.
    pub cache: &'a BlockCache,
    /// The pool's guid (part of every cache key).
    pub pool: u64,
}

impl NodeStore for ReadStore<'_> {
    fn read(&self, ptr: &BlockPtr) -> Result<Vec<u8>, TreeError> {
        read_node(self.tops, self.cache, self.pool, ptr)
    }

    fn write(&mut self, _data: Vec<u8>, _level: u8) -> Result<BlockPtr, TreeError> {
        Err(TreeError::Store(Box::new(PoolError::Internal(
            "tree write outside of txg sync".into(),
        ))))
    }

    fn free(&mut self, _ptr: &BlockPtr) {}
}

/// A store of committed tree nodes that answers from the block cache
/// only (see [`crate::Cx::cached_store`]).
pub struct CachedStore<'a> {
    pub(crate) cache: &'a BlockCache,
    pub(crate) pool: u64,
    pub(crate) missed: std::cell::Cell<bool>,
}

impl CachedStore<'_> {
    /// True once a lookup needed a node the cache does not hold (the
    /// lookup failed for that, not for damage).
    pub fn missed(&self) -> bool {
        self.missed.get()
    }
}

impl NodeStore for CachedStore<'_> {
    fn read(&self, ptr: &BlockPtr) -> Result<Vec<u8>, TreeError> {
        match self.cache.try_get(self.pool, ptr, BlockKind::Meta) {
            Some(v) => Ok(v.to_vec()),
            None => {
                self.missed.set(true);
                Err(TreeError::Store(Box::new(PoolError::Internal(
                    "tree node not cached (a lookup from memory only)".into(),
                ))))
            }
        }
    }

    fn write(&mut self, _data: Vec<u8>, _level: u8) -> Result<BlockPtr, TreeError> {
        Err(TreeError::Store(Box::new(PoolError::Internal(
            "tree write outside of txg sync".into(),
        ))))
    }

    fn free(&mut self, _ptr: &BlockPtr) {}
}

/// Chooses top-level vdevs and allocates every copy of a block: copies go to
/// distinct vdevs when the pool has them, round-robin from a rotor so
/// consecutive blocks stripe over the vdevs.
pub struct Allocator<'a> {
    /// The pool's top-level vdevs.
    pub tops: &'a [Arc<TopVdev>],
    /// One space map per top-level vdev.
    pub space: &'a mut [SpaceMap],
    /// Round-robin position.
    pub rotor: &'a mut usize,
    /// Contiguous bytes each vdev (by index) must keep free after this
    /// allocation: data leaves room so that metadata (tree nodes, space
    /// maps), which every txg needs, can always be placed. Empty for
    /// metadata itself.
    pub keep_contiguous: &'a [u64],
}

/// Contiguous room data allocations leave on each top-level vdev for the
/// metadata of the following txgs.
pub const METADATA_RESERVE_BYTES: u64 = 4 << 20;

impl Allocator<'_> {
    /// Allocates `copies` addresses for `psize` stored bytes.
    pub fn alloc(&mut self, psize: u64, copies: usize) -> Result<Vec<Dva>, PoolError> {
        let n = self.tops.len();
        let mut out: Vec<Dva> = Vec::with_capacity(copies);
        let start = *self.rotor;
        *self.rotor = (*self.rotor + 1) % n.max(1);
        for _ in 0..copies {
            let mut done = false;
            // First pass: a vdev not yet used by this block; second: any.
            for pass in 0..2 {
                for k in 0..n {
                    let v = (start + out.len() + k) % n;
                    if pass == 0 && out.iter().any(|d| d.vdev as usize == v) {
                        continue;
                    }
                    let t = &self.tops[v];
                    if matches!(t.health(), tarn_vdev::TopHealth::Faulted) {
                        continue;
                    }
                    let asize = t.alloc_size(psize);
                    // Data may not cut into the room kept for metadata;
                    // small holes stay usable.
                    let r = match self.keep_contiguous.get(v) {
                        Some(&keep) if keep > 0 => self.space[v].alloc_keeping(asize, keep),
                        _ => self.space[v].alloc(asize),
                    };
                    if let Ok(off) = r {
                        out.push(Dva {
                            vdev: v as u32,
                            asize: asize as u32,
                            offset: off,
                        });
                        done = true;
                        break;
                    }
                }
                if done {
                    break;
                }
            }
            if !done {
                // Give back what this block took so a failed write leaks
                // nothing. That free cannot fail unless the accounting is
                // wrong, and then, as everywhere, nothing more is allocated.
                for d in &out {
                    self.space[d.vdev as usize]
                        .free_now(d.offset, d.asize as u64)
                        .map_err(|e| {
                            PoolError::Internal(format!(
                                "space accounting: giving back a partial allocation: {e}"
                            ))
                        })?;
                }
                return Err(PoolError::NoSpace(format!(
                    "no room for a block of {psize} bytes ({copies} copies)"
                )));
            }
        }
        Ok(out)
    }
}

/// The store used while txg `txg` syncs: writes allocate (holding the pool
/// state lock only for that) and land on disk, frees are deferred.
pub struct TxStore<'a> {
    /// The pool.
    pub pool: &'a crate::Pool,
    /// The txg being synced: birth of every block written.
    pub txg: u64,
    /// Checksum for metadata.
    pub checksum: ChecksumAlg,
    /// Copies of each metadata block.
    pub copies: usize,
    /// Frees reported by the tree, applied by the syncer.
    pub freed: Vec<BlockPtr>,
    /// Children that missed a write.
    pub missed: Vec<Missed>,
}

impl TxStore<'_> {
    /// Prepares, allocates and writes one block.
    pub fn write_block(
        &mut self,
        data: &[u8],
        compression: Compression,
        btype: BlockType,
        level: u8,
    ) -> Result<BlockPtr, PoolError> {
        let pool = self.pool;
        let p = pipeline::prepare(data, compression, self.checksum)?;
        let dvas = pool.allocate(
            &mut pool.lock(),
            p.stored.len() as u64,
            self.copies,
            false,
            None,
        )?;
        match pipeline::write_copies(&pool.tops, &dvas, &p.stored) {
            Ok(m) => self.missed.extend(m),
            Err(e) => {
                pool.free_now(&mut pool.lock(), &dvas)?;
                return Err(e.into());
            }
        }
        Ok(pipeline::make_ptr(&p, &dvas, self.txg, btype, level))
    }
}

impl NodeStore for TxStore<'_> {
    fn read(&self, ptr: &BlockPtr) -> Result<Vec<u8>, TreeError> {
        self.pool.read_store().read(ptr)
    }

    fn write(&mut self, data: Vec<u8>, level: u8) -> Result<BlockPtr, TreeError> {
        let bp = self
            .write_block(&data, Compression::Lz4, BlockType::TreeNode, level)
            .map_err(|e| TreeError::Store(Box::new(e)))?;
        self.pool
            .cache
            .insert(self.pool.guid, &bp, Arc::from(data), BlockKind::Meta);
        Ok(bp)
    }

    fn free(&mut self, ptr: &BlockPtr) {
        self.freed.push(*ptr);
    }
}
