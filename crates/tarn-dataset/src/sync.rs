//! The dataset layer's part of a txg sync: staged data blocks, kills,
//! dataset trees bottom-up, snapshots of the txg, then records.

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;

use tarn_block::BlockPtr;
use tarn_pool::{BlockOpts, Extension, PoolError, Reservation, SyncCx};
use tarn_tree::{NodeStore, Tree, TreeError};

use crate::dsl::Dsl;
use crate::overlay::{Change, Overlay, StagedBlock};
use crate::record::{block_value, encode_ptr_hex, Sums, K_NEXT, TAG_BLOCK, TAG_PLAIN, TAG_SEALED};

/// The node store of a dataset tree while it commits: records what it
/// writes and frees so the accounting and the birth-time rule see nodes.
pub(crate) struct SyncNodes<'a, 'p> {
    cx: &'a mut SyncCx<'p>,
    written: Vec<BlockPtr>,
    freed: Vec<BlockPtr>,
}

impl NodeStore for SyncNodes<'_, '_> {
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
        let dir_changed = {
            let d = self.dir();
            !d.pending_snaps.is_empty()
                || !d.dirty_recs.is_empty()
                || !d.deleted.is_empty()
                || d.next_dirty
                || !d.dirty_keys.is_empty()
                || !d.deleted_keys.is_empty()
                || !d.parked_new.is_empty()
                || !d.parked_gone.is_empty()
        };
        dir_changed
            || lock_trees(self).values().any(|t| t.is_dirty())
            || self.all_lives().iter().any(|l| {
                let st = l.lock();
                !st.open.is_empty() || st.syncing.is_some()
            })
    }

    fn quiesce(&self, txg: u64) {
        for l in self.all_lives() {
            let mut st = l.lock();
            if !st.open.is_empty() {
                let o = std::mem::take(&mut st.open);
                st.syncing = Some((txg, Arc::new(o)));
            }
        }
    }

    fn sync(&self, cx: &mut SyncCx<'_>) -> Result<(), PoolError> {
        let txg = cx.txg();
        // The changes the quiesce of this txg set aside.
        let mut overlays: Vec<(u64, Arc<Overlay>)> = Vec::new();
        for l in self.all_lives() {
            let st = l.lock();
            if let Some((t, o)) = &st.syncing {
                if *t == txg {
                    overlays.push((l.id, o.clone()));
                }
            }
        }
        overlays.sort_by_key(|(id, _)| *id);
        // 1. Staged data blocks, written in one parallel batch (blocks the
        // intent log already wrote are used as they are).
        write_staged(self, cx, &overlays)?;
        // 2. Each overlay onto the sync's own handle of its tree: deleted
        // ranges first, then every entry in key order; what they replace is
        // killed.
        let mut bounds = HashMap::new();
        for (id, o) in &overlays {
            self.apply_overlay(cx, *id, o, &mut bounds)?;
        }
        // 3. Dataset trees, bottom-up; their replaced nodes are kills too.
        let ids: Vec<u64> = lock_trees(self).keys().copied().collect();
        for id in ids {
            let Some(mut tree) = lock_trees(self).remove(&id) else {
                continue;
            };
            if !tree.is_dirty() {
                lock_trees(self).insert(id, tree);
                continue;
            }
            let mut ns = SyncNodes {
                cx: &mut *cx,
                written: Vec::new(),
                freed: Vec::new(),
            };
            let r = tree.commit(&mut ns);
            let (written, freed) = (ns.written, ns.freed);
            let root = r?;
            tree.evict_clean();
            lock_trees(self).insert(id, tree);
            let mut dir = self.dir();
            let Some(rec) = dir.recs.get_mut(&id) else {
                continue;
            };
            rec.root = encode_ptr_hex(&root);
            for bp in &written {
                rec.referenced.add(Sums::of(bp));
                rec.unique.add(Sums::of(bp));
            }
            dir.dirty_recs.insert(id);
            for bp in freed {
                dir.kill(cx, id, &bp, &mut bounds)?;
            }
        }
        // Intent log records of locked datasets, parked (see `zil`).
        crate::zil::park_records(self, cx)?;
        let mut dir = self.dir();
        let dir = &mut *dir;
        // 4. Snapshots of this txg capture the trees as just committed.
        for (head, snap) in std::mem::take(&mut dir.pending_snaps) {
            let Some(h) = dir.recs.get(&head).cloned() else {
                continue;
            };
            let new_dl = dir.alloc_id();
            if let Some(s) = dir.recs.get_mut(&snap) {
                s.root = h.root.clone();
                s.created_txg = txg;
                s.referenced = h.referenced;
                s.unique = h.unique;
                s.deadlist = h.deadlist;
                s.dead = h.dead.clone();
                s.prev_snap = h.prev_snap;
                s.prev_snap_txg = h.prev_snap_txg;
            }
            if let Some(h) = dir.recs.get_mut(&head) {
                h.deadlist = new_dl;
                h.dead.clear();
                h.prev_snap = Some(snap);
                h.prev_snap_txg = txg;
                h.unique = Sums::default();
            }
            dir.dirty_recs.insert(head);
            dir.dirty_recs.insert(snap);
        }
        // 5. Records.
        for id in std::mem::take(&mut dir.deleted) {
            let had = dir.summary_pieces.remove(&id).unwrap_or(0);
            crate::stored::delete_record(cx, id, had)?;
            dir.dirty_recs.remove(&id);
        }
        for id in std::mem::take(&mut dir.dirty_recs) {
            if let Some(rec) = dir.recs.get(&id) {
                let had = dir.summary_pieces.get(&id).copied().unwrap_or(0);
                match crate::stored::put_record(cx, rec, had)? {
                    0 => dir.summary_pieces.remove(&id),
                    n => dir.summary_pieces.insert(id, n),
                };
            }
        }
        if std::mem::take(&mut dir.next_dirty) {
            cx.meta_put(K_NEXT, &dir.next_id.to_le_bytes())?;
        }
        crate::crypt::sync_records(dir, cx)?;
        Ok(())
    }

    fn committed(&self, txg: u64) {
        // Readers move to the trees of this txg, and its overlays go.
        let roots: HashMap<u64, BlockPtr> = lock_trees(self)
            .iter()
            .map(|(id, t)| (*id, t.root()))
            .collect();
        for l in self.all_lives() {
            let mut st = l.lock();
            if st.syncing.as_ref().is_some_and(|(t, _)| *t <= txg) {
                st.syncing = None;
            }
            if let Some(root) = roots.get(&l.id) {
                if st.tree.root() != *root {
                    st.tree = Tree::open(*root);
                    st.tree_txg = txg;
                }
            }
            st.log.retain(|(t, _, _)| *t > txg);
            l.pending
                .store(st.staged_asize(), std::sync::atomic::Ordering::Relaxed);
            // With the syncing overlay gone from `pending`, nothing of it is
            // to be taken off any more (the dataset's lock, then the
            // directory's: a transaction's order).
            self.dir().applied.remove(&l.id);
        }
        self.dir().applied.clear();
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn lock_trees(dsl: &Dsl) -> std::sync::MutexGuard<'_, HashMap<u64, Tree>> {
    dsl.sync_trees.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sync step 1: writes every staged block of the overlays that is not
/// written yet, compressed and checksummed in parallel, into the rooms the
/// txg's blocks were given when they were accepted, handed out again in
/// block order (by dataset, then key; see [`SyncCx::write_blocks`]).
/// Blocks the intent log wrote early are skipped here, so they keep the
/// rooms their log records name. Each block's slot then holds its pointer
/// (or none, for a block that turned out to be all zeros).
fn write_staged(
    dsl: &Dsl,
    cx: &mut SyncCx<'_>,
    overlays: &[(u64, Arc<Overlay>)],
) -> Result<(), PoolError> {
    let mut todo: Vec<(&StagedBlock, BlockOpts, Reservation)> = Vec::new();
    for (id, o) in overlays {
        let mut opts: Option<BlockOpts> = None;
        for (_, b) in o.staged() {
            let slot = b.slot();
            if slot.written.is_some() {
                continue;
            }
            // A locked dataset's blocks are never written in the clear:
            // its options fail, and the sync with them (the pool stops).
            // (A raw receive writes its blocks as they come: none waits.)
            let opts = match &opts {
                Some(o) => o.clone(),
                None => {
                    let o = dsl.dir().block_opts(*id).map_err(|e| {
                        PoolError::Internal(format!("writing the blocks of dataset {id}: {e}"))
                    })?;
                    opts = Some(o.clone());
                    o
                }
            };
            todo.push((b, opts, slot.res.clone()));
        }
    }
    let blocks: Vec<(&[u8], BlockOpts, Option<Reservation>)> = todo
        .iter()
        .map(|(b, o, r)| (b.data.as_slice(), o.clone(), Some(r.clone())))
        .collect();
    let written = cx.write_blocks(blocks, tarn_pool::Rooms::InBlockOrder)?;
    for ((b, _, _), bp) in todo.iter().zip(written) {
        let mut slot = b.slot();
        slot.written = bp;
        slot.res = bp.map(|bp| Reservation::of_block(&bp)).unwrap_or_default();
    }
    Ok(())
}

impl Dsl {
    /// Sync step 2 for one dataset: applies overlay `o` to the sync's own
    /// handle of its tree (opened at the committed root on first use).
    /// Every value it replaces that names a block is killed (birth-time
    /// rule).
    fn apply_overlay(
        &self,
        cx: &mut SyncCx<'_>,
        id: u64,
        o: &Overlay,
        bounds: &mut HashMap<u64, Vec<u64>>,
    ) -> Result<(), PoolError> {
        let mut killed: Vec<BlockPtr> = Vec::new();
        let mut added: Vec<BlockPtr> = Vec::new();
        let existing = lock_trees(self).remove(&id);
        let mut tree = match existing {
            Some(t) => t,
            None => {
                let root =
                    self.dir().rec(id).and_then(|r| r.root_ptr()).map_err(|e| {
                        PoolError::Internal(format!("changes of dataset {id}: {e}"))
                    })?;
                Tree::open(root)
            }
        };
        let tag = if self.dir().is_encrypted(id) {
            TAG_SEALED
        } else {
            TAG_PLAIN
        };
        let r = apply_to_tree(&mut tree, cx, o, tag, &mut killed, &mut added);
        lock_trees(self).insert(id, tree);
        r?;
        let mut dir = self.dir();
        let Some(rec) = dir.recs.get_mut(&id) else {
            return Err(PoolError::Internal(format!(
                "changes of unknown dataset {id}"
            )));
        };
        for bp in &added {
            // A block this txg adds was born in it (written by this sync, or
            // early by an intent log commit while the txg was open), or
            // before it for a block the intent log's replay brought back.
            debug_assert!(
                bp.birth <= cx.txg(),
                "dataset {id}: added a block born in txg {} to txg {}",
                bp.birth,
                cx.txg()
            );
            rec.referenced.add(Sums::of(bp));
            rec.unique.add(Sums::of(bp));
        }
        // The records count this txg's blocks now: its staged bytes leave
        // the dataset's pending figure (until `committed` drops them).
        *dir.applied.entry(id).or_insert(0) += o.staged_asize();
        dir.dirty_recs.insert(id);
        for bp in killed {
            dir.kill(cx, id, &bp, bounds)?;
        }
        Ok(())
    }
}

/// Applies overlay `o` to `tree`: deleted ranges first (their blocks are
/// collected a page at a time, then the range goes), then every entry in
/// key order.
fn apply_to_tree(
    tree: &mut Tree,
    cx: &mut SyncCx<'_>,
    o: &Overlay,
    plain_tag: u8,
    killed: &mut Vec<BlockPtr>,
    added: &mut Vec<BlockPtr>,
) -> Result<(), PoolError> {
    let store = cx.store();
    for (lo, hi) in o.ranges() {
        let (lo, hi) = (
            lo.as_ref().map(Vec::as_slice),
            hi.as_ref().map(Vec::as_slice),
        );
        let mut from = lo.map(<[u8]>::to_vec);
        loop {
            let page = tree.range(&store, from.as_ref().map(Vec::as_slice), hi, 1024)?;
            let Some((last, _)) = page.last() else { break };
            from = Bound::Excluded(last.clone());
            for (_, v) in &page {
                if let Some(bp) = block_of(v)? {
                    killed.push(bp);
                }
            }
        }
        tree.delete_range(&store, lo, hi)?;
    }
    for (key, c) in o.entries() {
        let old = match c {
            Change::Plain(v) => {
                let mut raw = Vec::with_capacity(v.len() + 1);
                raw.push(plain_tag);
                raw.extend_from_slice(v);
                tree.insert(&store, key, &raw)?
            }
            Change::Block(b) => match b.slot().written {
                Some(bp) => {
                    added.push(bp);
                    tree.insert(&store, key, &block_value(&bp))?
                }
                None => tree.remove(&store, key)?,
            },
            Change::Delete => tree.remove(&store, key)?,
        };
        if let Some(bp) = old.as_deref().map(block_of).transpose()?.flatten() {
            killed.push(bp);
        }
    }
    Ok(())
}

/// The block a raw tree value names, if it names one.
fn block_of(raw: &[u8]) -> Result<Option<BlockPtr>, PoolError> {
    match raw.split_first() {
        Some((&TAG_BLOCK, rest)) => Ok(Some(BlockPtr::decode(rest)?)),
        _ => Ok(None),
    }
}
