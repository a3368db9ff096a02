//! The birth-time rule and deadlists: what happens to a block a dataset no
//! longer references, and how snapshot destruction finds what it may free.
//!
//! # Theory
//!
//! **Birth-time rule.** A killed block born after the dataset's newest
//! snapshot (`prev_snap_txg`) is referenced by nobody else and is freed at
//! once. An older one is still referenced by that snapshot: it goes on the
//! dataset's *deadlist*. A snapshot taken in txg T captures the tree as
//! committed at the end of T and takes over the head's deadlist; the head
//! starts a new one. Destroying snapshot S frees, from the deadlist of the
//! dataset after it ("next"), exactly the blocks born after S's own previous
//! snapshot (nobody else references them), and moves S's deadlist into
//! next's. Deadlist entries are bucketed by the snapshot interval of their
//! birth, so these questions are range sums over small per-bucket
//! summaries, which also make every snapshot's `used` exact.

use std::collections::HashMap;
use std::ops::Bound;

use tarn_block::BlockPtr;
use tarn_pool::{PoolError, SyncCx};
use tarn_tree::TreeError;

use crate::dsl::Dir;
use crate::record::{dead_key, dead_prefix, prefix_end, Sums, TAG_BLOCK};
use crate::DsError;

impl Dir {
    /// Applies the birth-time rule to a block dataset `id` no longer references.
    pub(crate) fn kill(
        &mut self,
        cx: &mut SyncCx<'_>,
        id: u64,
        bp: &BlockPtr,
        bounds: &mut HashMap<u64, Vec<u64>>,
    ) -> Result<(), PoolError> {
        if bp.is_hole() {
            return Ok(());
        }
        let boundaries = match bounds.get(&id) {
            Some(b) => b.clone(),
            None => {
                let b = self.boundaries(id);
                bounds.insert(id, b.clone());
                b
            }
        };
        let Some(rec) = self.recs.get_mut(&id) else {
            return Err(PoolError::Internal(format!("kill in unknown dataset {id}")));
        };
        let s = Sums::of(bp);
        rec.referenced.sub(s);
        self.dirty_recs.insert(id);
        if bp.birth > rec.prev_snap_txg {
            rec.unique.sub(s);
            cx.free(*bp);
        } else {
            let bucket = bucket_of(&boundaries, bp.birth);
            rec.dead.entry(bucket).or_default().add(s);
            cx.meta_put(&dead_key(rec.deadlist, bucket, bp), &bp.encode())?;
        }
        Ok(())
    }

    /// Snapshot-interval boundaries of a head's deadlist buckets: 0, its
    /// origin's txg if it is a clone, and its snapshots' txgs.
    pub(crate) fn boundaries(&self, head: u64) -> Vec<u64> {
        let mut b = vec![0];
        if let Some(o) = self.recs.get(&head).and_then(|r| r.origin) {
            if let Some(orec) = self.recs.get(&o) {
                b.push(orec.created_txg);
            }
        }
        for r in self.recs.values() {
            if r.head == Some(head) && !self.pending_snaps.iter().any(|(_, s)| *s == r.id) {
                b.push(r.created_txg);
            }
        }
        b.sort_unstable();
        b
    }

    /// The chain successor of snapshot `snap`: the next snapshot of the
    /// same filesystem, or the filesystem itself.
    pub(crate) fn next_of(&self, snap: u64) -> Option<u64> {
        let head = self.recs.get(&snap)?.head?;
        self.recs
            .values()
            .find(|r| {
                r.prev_snap == Some(snap)
                    && (r.id == head || (r.is_snapshot() && r.head == Some(head)))
            })
            .map(|r| r.id)
    }

    pub(crate) fn origin_txg(&self, head: u64) -> u64 {
        self.recs
            .get(&head)
            .and_then(|r| r.origin)
            .and_then(|o| self.recs.get(&o))
            .map_or(0, |o| o.created_txg)
    }

    pub(crate) fn dead_from(&self, id: u64, from: u64) -> Sums {
        self.recs.get(&id).map_or(Sums::default(), |r| {
            r.dead
                .range(from..)
                .fold(Sums::default(), |a, (_, s)| a.plus(*s))
        })
    }

    /// Space only snapshot `snap` holds: what destroying it frees.
    pub(crate) fn snap_used(&self, snap: u64) -> Sums {
        let Some(r) = self.recs.get(&snap) else {
            return Sums::default();
        };
        match self.next_of(snap) {
            Some(next) => self.dead_from(next, r.prev_snap_txg),
            None => Sums::default(),
        }
    }

    /// Frees every block of `root`'s tree born after `after` (nodes and data).
    pub(crate) fn free_tree(
        &self,
        cx: &mut SyncCx<'_>,
        root: &BlockPtr,
        after: u64,
    ) -> Result<(), DsError> {
        let doomed = std::cell::RefCell::new(Vec::new());
        {
            let store = cx.store();
            tarn_tree::walk(
                &store,
                root,
                after,
                &mut |bp| {
                    doomed.borrow_mut().push(*bp);
                    Ok(())
                },
                &mut |_, v| {
                    if v.first() == Some(&TAG_BLOCK) {
                        let bp =
                            BlockPtr::decode(&v[1..]).map_err(|e| TreeError::Store(Box::new(e)))?;
                        if bp.birth > after {
                            doomed.borrow_mut().push(bp);
                        }
                    }
                    Ok(())
                },
            )?;
        }
        for bp in doomed.into_inner() {
            cx.free(bp);
        }
        Ok(())
    }

    /// Deletes a deadlist's entries from `from_bucket` on; with `free`,
    /// frees their blocks, otherwise moves them to deadlist `to` (if any).
    pub(crate) fn drain_deadlist(
        &mut self,
        cx: &mut SyncCx<'_>,
        dl: u64,
        from_bucket: u64,
        free: bool,
        to: Option<u64>,
    ) -> Result<(), DsError> {
        let lo = dead_prefix(dl, Some(from_bucket));
        let hi = prefix_end(&dead_prefix(dl, None));
        loop {
            let page = cx.meta_range(Bound::Included(&lo), Bound::Excluded(&hi), 512)?;
            if page.is_empty() {
                return Ok(());
            }
            for (k, v) in page {
                let bp = BlockPtr::decode(&v)?;
                cx.meta_delete(&k)?;
                if free {
                    cx.free(bp);
                } else if let Some(to) = to {
                    let bucket = k
                        .get(9..17)
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map(u64::from_be_bytes)
                        .unwrap_or(0);
                    cx.meta_put(&dead_key(to, bucket, &bp), &v)?;
                }
            }
        }
    }
}

/// The deadlist bucket of a block born at `birth`, given the snapshot
/// boundaries of its chain: the last boundary before the birth (0 if none).
pub(crate) fn bucket_of(boundaries: &[u64], birth: u64) -> u64 {
    boundaries
        .iter()
        .copied()
        .filter(|t| *t < birth)
        .max()
        .unwrap_or(0)
}
