//! The dataset layer's part of a txg sync: staged data blocks, kills,
//! dataset trees bottom-up, snapshots of the txg, then records.

use std::collections::HashMap;

use tarn_block::BlockPtr;
use tarn_pool::{BlockOpts, Extension, PoolError, Reservation, SyncCx};
use tarn_tree::{NodeStore, TreeError};

use crate::dsl::{Dsl, StagedBlock};
use crate::record::{block_value, ds_key, encode_ptr_hex, Sums, K_NEXT, TAG_STAGED};

/// The node store of a dataset tree while it commits: records what it
/// writes and frees so the accounting and the birth-time rule see nodes.
pub(crate) struct SyncNodes<'a, 'p, 's> {
    cx: &'a mut SyncCx<'p, 's>,
    written: Vec<BlockPtr>,
    freed: Vec<BlockPtr>,
}

impl NodeStore for SyncNodes<'_, '_, '_> {
    fn read(&self, ptr: &BlockPtr) -> Result<Vec<u8>, TreeError> {
        self.cx
            .read_node(ptr)
            .map_err(|e| TreeError::Store(Box::new(e)))
    }

    fn write(&mut self, data: Vec<u8>, level: u8) -> Result<BlockPtr, TreeError> {
        let bp = self
            .cx
            .write_node(&data, level)
            .map_err(|e| TreeError::Store(Box::new(e)))?;
        self.written.push(bp);
        Ok(bp)
    }

    fn free(&mut self, ptr: &BlockPtr) {
        self.freed.push(*ptr);
    }
}

impl Extension for Dsl {
    fn has_changes(&self) -> bool {
        !self.pending_snaps.is_empty()
            || !self.dirty_recs.is_empty()
            || !self.deleted.is_empty()
            || self.next_dirty
            || self
                .live
                .values()
                .any(|l| !l.staged.is_empty() || !l.kills.is_empty() || l.tree.is_dirty())
    }

    fn sync(&mut self, cx: &mut SyncCx<'_, '_>) -> Result<(), PoolError> {
        let txg = cx.txg();
        // 1. Staged data blocks, written in one parallel batch.
        let mut items: Vec<(u64, Vec<u8>, StagedBlock, BlockOpts)> = Vec::new();
        let ids: Vec<u64> = self.live.keys().copied().collect();
        for id in &ids {
            let opts = self.block_opts(*id);
            if let Some(live) = self.live.get_mut(id) {
                live.staged_asize = 0;
                for (k, b) in std::mem::take(&mut live.staged) {
                    items.push((*id, k, b, opts));
                }
            }
        }
        // Blocks the intent log already wrote are used as they are.
        let refs: Vec<(&[u8], BlockOpts, Option<Reservation>)> = items
            .iter()
            .filter(|(_, _, b, _)| b.written.is_none())
            .map(|(_, _, b, o)| (b.data.as_slice(), *o, Some(b.res.clone())))
            .collect();
        let mut fresh = cx.write_blocks(refs)?.into_iter();
        let ptrs: Vec<Option<BlockPtr>> = items
            .iter()
            .map(|(_, _, b, _)| match b.written {
                Some(bp) => Some(bp),
                None => fresh.next().flatten(),
            })
            .collect();
        for ((id, key, _, _), p) in items.iter().zip(ptrs) {
            let (Some(live), Some(rec)) = (self.live.get_mut(id), self.recs.get_mut(id)) else {
                return Err(PoolError::Internal(format!(
                    "staged block of unknown dataset {id}"
                )));
            };
            let store = cx.store();
            let old = match p {
                Some(bp) => {
                    rec.referenced.add(Sums::of(&bp));
                    rec.unique.add(Sums::of(&bp));
                    live.tree.insert(&store, key, &block_value(&bp))?
                }
                None => live.tree.remove(&store, key)?,
            };
            if old.as_deref().and_then(|v| v.first()) != Some(&TAG_STAGED) {
                return Err(PoolError::Internal(format!(
                    "dataset {}: staged block without its placeholder",
                    rec.name
                )));
            }
            self.dirty_recs.insert(*id);
        }
        // Everything pending for the intent log commits now.
        for live in self.live.values_mut() {
            live.log.clear();
        }
        self.unlogged.clear();
        // 2. Blocks the open txg stopped referencing.
        let mut bounds = HashMap::new();
        for id in &ids {
            let kills = self
                .live
                .get_mut(id)
                .map(|l| std::mem::take(&mut l.kills))
                .unwrap_or_default();
            for bp in kills {
                self.kill(cx, *id, &bp, &mut bounds)?;
            }
        }
        // 3. Dataset trees, bottom-up; their replaced nodes are kills too.
        for id in &ids {
            let Some(live) = self.live.get_mut(id) else {
                continue;
            };
            if !live.tree.is_dirty() {
                continue;
            }
            let mut ns = SyncNodes {
                cx: &mut *cx,
                written: Vec::new(),
                freed: Vec::new(),
            };
            let root = live.tree.commit(&mut ns)?;
            let (written, freed) = (ns.written, ns.freed);
            let Some(rec) = self.recs.get_mut(id) else {
                continue;
            };
            rec.root = encode_ptr_hex(&root);
            for bp in &written {
                rec.referenced.add(Sums::of(bp));
                rec.unique.add(Sums::of(bp));
            }
            self.dirty_recs.insert(*id);
            for bp in freed {
                self.kill(cx, *id, &bp, &mut bounds)?;
            }
        }
        // 4. Snapshots of this txg capture the trees as just committed.
        for (head, snap) in std::mem::take(&mut self.pending_snaps) {
            let Some(h) = self.recs.get(&head).cloned() else {
                continue;
            };
            let new_dl = self.alloc_id();
            if let Some(s) = self.recs.get_mut(&snap) {
                s.root = h.root.clone();
                s.created_txg = txg;
                s.referenced = h.referenced;
                s.unique = h.unique;
                s.deadlist = h.deadlist;
                s.dead = h.dead.clone();
                s.prev_snap = h.prev_snap;
                s.prev_snap_txg = h.prev_snap_txg;
            }
            if let Some(h) = self.recs.get_mut(&head) {
                h.deadlist = new_dl;
                h.dead.clear();
                h.prev_snap = Some(snap);
                h.prev_snap_txg = txg;
                h.unique = Sums::default();
            }
            self.dirty_recs.insert(head);
            self.dirty_recs.insert(snap);
        }
        // 5. Records.
        for id in std::mem::take(&mut self.deleted) {
            cx.meta_delete(&ds_key(id))?;
            self.dirty_recs.remove(&id);
        }
        for id in std::mem::take(&mut self.dirty_recs) {
            if let Some(rec) = self.recs.get(&id) {
                let json =
                    serde_json::to_vec(rec).map_err(|e| PoolError::Internal(e.to_string()))?;
                cx.meta_put(&ds_key(id), &json)?;
            }
        }
        if std::mem::take(&mut self.next_dirty) {
            cx.meta_put(K_NEXT, &self.next_id.to_le_bytes())?;
        }
        Ok(())
    }

    fn committed(&mut self, _txg: u64) {
        for l in self.live.values_mut() {
            l.tree.evict_clean();
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
