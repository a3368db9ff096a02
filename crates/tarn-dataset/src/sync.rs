//! The dataset layer's part of a txg sync: staged data blocks, kills,
//! dataset trees bottom-up, snapshots of the txg, then records.

use std::collections::HashMap;
use std::ops::Bound;

use tarn_block::BlockPtr;
use tarn_pool::{BlockOpts, Extension, PoolError, Reservation, SyncCx};
use tarn_tree::{NodeStore, TreeError};

use crate::dsl::Dsl;
use crate::overlay::{Change, Overlay, StagedBlock};
use crate::record::{block_value, ds_key, encode_ptr_hex, Sums, K_NEXT, TAG_BLOCK, TAG_PLAIN};

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
            || self.live.values().any(|l| !l.open.is_empty())
    }

    fn sync(&mut self, cx: &mut SyncCx<'_, '_>) -> Result<(), PoolError> {
        let txg = cx.txg();
        let ids: Vec<u64> = self.live.keys().copied().collect();
        // The open txg's changes, now this sync's to apply.
        let mut overlays: Vec<(u64, Overlay)> = Vec::new();
        for id in &ids {
            if let Some(live) = self.live.get_mut(id) {
                if !live.open.is_empty() {
                    overlays.push((*id, std::mem::take(&mut live.open)));
                }
                // Everything pending for the intent log commits now.
                live.log.clear();
            }
        }
        self.unlogged.clear();
        // 1. Staged data blocks, written in one parallel batch (blocks the
        // intent log already wrote are used as they are).
        write_staged(self, cx, &overlays)?;
        // 2. Each overlay onto its tree: deleted ranges first, then every
        // entry in key order; what they replace is killed.
        let mut bounds = HashMap::new();
        for (id, o) in &overlays {
            self.apply_overlay(cx, *id, o, &mut bounds)?;
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

/// Sync step 1: writes every staged block of the overlays that is not
/// written yet, compressed and checksummed in parallel, into the room it
/// was given when it was accepted. Each block's slot then holds its pointer
/// (or none, for a block that turned out to be all zeros).
fn write_staged(
    dsl: &Dsl,
    cx: &mut SyncCx<'_, '_>,
    overlays: &[(u64, Overlay)],
) -> Result<(), PoolError> {
    let mut todo: Vec<(&StagedBlock, BlockOpts, Reservation)> = Vec::new();
    for (id, o) in overlays {
        let opts = dsl.block_opts(*id);
        for (_, b) in o.staged() {
            let slot = b.slot();
            if slot.written.is_none() {
                todo.push((b, opts, slot.res.clone()));
            }
        }
    }
    let blocks: Vec<(&[u8], BlockOpts, Option<Reservation>)> = todo
        .iter()
        .map(|(b, o, r)| (b.data.as_slice(), *o, Some(r.clone())))
        .collect();
    let written = cx.write_blocks(blocks)?;
    for ((b, _, _), bp) in todo.iter().zip(written) {
        let mut slot = b.slot();
        slot.written = bp;
        slot.res = bp.map(|bp| Reservation::of_block(&bp)).unwrap_or_default();
    }
    Ok(())
}

impl Dsl {
    /// Sync step 2 for one dataset: applies overlay `o` to its tree. Every
    /// value it replaces that names a block is killed (birth-time rule).
    fn apply_overlay(
        &mut self,
        cx: &mut SyncCx<'_, '_>,
        id: u64,
        o: &Overlay,
        bounds: &mut HashMap<u64, Vec<u64>>,
    ) -> Result<(), PoolError> {
        let mut killed: Vec<BlockPtr> = Vec::new();
        let mut added: Vec<BlockPtr> = Vec::new();
        {
            let Some(live) = self.live.get_mut(&id) else {
                return Err(PoolError::Internal(format!(
                    "changes of unknown dataset {id}"
                )));
            };
            let store = cx.store();
            for (lo, hi) in o.ranges() {
                let (lo, hi) = (
                    lo.as_ref().map(Vec::as_slice),
                    hi.as_ref().map(Vec::as_slice),
                );
                // The blocks in the range, a page at a time, then the range.
                let mut from = lo.map(<[u8]>::to_vec);
                loop {
                    let page =
                        live.tree
                            .range(&store, from.as_ref().map(Vec::as_slice), hi, 1024)?;
                    let Some((last, _)) = page.last() else { break };
                    from = Bound::Excluded(last.clone());
                    for (_, v) in &page {
                        if let Some(bp) = block_of(v)? {
                            killed.push(bp);
                        }
                    }
                }
                live.tree.delete_range(&store, lo, hi)?;
            }
            for (key, c) in o.entries() {
                let old = match c {
                    Change::Plain(v) => {
                        let mut raw = Vec::with_capacity(v.len() + 1);
                        raw.push(TAG_PLAIN);
                        raw.extend_from_slice(v);
                        live.tree.insert(&store, key, &raw)?
                    }
                    Change::Block(b) => match b.slot().written {
                        Some(bp) => {
                            added.push(bp);
                            live.tree.insert(&store, key, &block_value(&bp))?
                        }
                        None => live.tree.remove(&store, key)?,
                    },
                    Change::Delete => live.tree.remove(&store, key)?,
                };
                if let Some(bp) = old.as_deref().map(block_of).transpose()?.flatten() {
                    killed.push(bp);
                }
            }
        }
        let Some(rec) = self.recs.get_mut(&id) else {
            return Err(PoolError::Internal(format!(
                "changes of unknown dataset {id}"
            )));
        };
        for bp in &added {
            rec.referenced.add(Sums::of(bp));
            rec.unique.add(Sums::of(bp));
        }
        self.dirty_recs.insert(id);
        for bp in killed {
            self.kill(cx, id, &bp, bounds)?;
        }
        Ok(())
    }
}

/// The block a raw tree value names, if it names one.
fn block_of(raw: &[u8]) -> Result<Option<BlockPtr>, PoolError> {
    match raw.split_first() {
        Some((&TAG_BLOCK, rest)) => Ok(Some(BlockPtr::decode(rest)?)),
        _ => Ok(None),
    }
}
