//! The dataset directory: records, the sync of dataset trees, the
//! birth-time rule and deadlists, snapshots, clones, rollback, destroy.
//! See the crate documentation for the theory.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tarn_block::{BlockPtr, ChecksumAlg, Compression, BLOCK_PTR_SIZE};
use tarn_pool::{BlockOpts, Cx, ExtRef, Extension, Pool, PoolError, Reservation, SyncCx};
use tarn_tree::{NodeStore, Tree, TreeError};

use crate::props::{self, PropValue, Source};
use crate::txn::DatasetHandle;
use crate::DsError;

/// Value tags inside dataset trees.
pub(crate) const TAG_PLAIN: u8 = 0;
pub(crate) const TAG_BLOCK: u8 = 1;
/// In memory only: a data block staged in the open txg; followed by its
/// logical length (u32 LE).
pub(crate) const TAG_STAGED: u8 = 2;

const K_NEXT: &[u8] = b"N";
/// Block size whose allocation defines the deflate ratio.
const DEFLATE_BLOCK: u64 = 128 * 1024;
const P_DS: u8 = b'D';
const P_DEAD: u8 = b'L';

/// Byte totals of a set of blocks: allocated (with parity and copies),
/// physical (stored) and logical (uncompressed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sums {
    /// Allocated bytes.
    pub asize: u64,
    /// Stored bytes.
    pub psize: u64,
    /// Logical bytes.
    pub lsize: u64,
}

impl Sums {
    pub(crate) fn of(bp: &BlockPtr) -> Sums {
        Sums {
            asize: bp.allocated_bytes(),
            psize: bp.psize as u64,
            lsize: bp.lsize as u64,
        }
    }

    fn add(&mut self, o: Sums) {
        self.asize = self.asize.saturating_add(o.asize);
        self.psize = self.psize.saturating_add(o.psize);
        self.lsize = self.lsize.saturating_add(o.lsize);
    }

    fn sub(&mut self, o: Sums) {
        self.asize = self.asize.saturating_sub(o.asize);
        self.psize = self.psize.saturating_sub(o.psize);
        self.lsize = self.lsize.saturating_sub(o.lsize);
    }

    fn plus(mut self, o: Sums) -> Sums {
        self.add(o);
        self
    }
}

/// What a dataset is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetKind {
    /// A POSIX filesystem (a clone is one too).
    Filesystem,
    /// A read-only point-in-time copy of a filesystem.
    Snapshot,
}

/// A dataset's record in the meta tree.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct DsRec {
    pub id: u64,
    pub guid: u64,
    pub name: String,
    pub kind: DatasetKind,
    /// Filesystems: the parent filesystem (none for the pool's root).
    pub parent: Option<u64>,
    /// Snapshots: their filesystem.
    pub head: Option<u64>,
    /// Committed tree root (hex); for a pending snapshot, a hole until sync.
    pub root: String,
    pub created_txg: u64,
    pub created_unix: u64,
    /// Heads: newest snapshot (or the origin of a clone). Snapshots: the
    /// previous one.
    pub prev_snap: Option<u64>,
    pub prev_snap_txg: u64,
    /// Clones: the snapshot they came from.
    pub origin: Option<u64>,
    /// Snapshots: clones made from them.
    #[serde(default)]
    pub clones: Vec<u64>,
    #[serde(default)]
    pub props: BTreeMap<String, String>,
    pub referenced: Sums,
    /// Heads: blocks born after `prev_snap_txg`. Snapshots: the head's
    /// unique space when taken (`written`).
    pub unique: Sums,
    /// Deadlist id and its per-bucket summary.
    pub deadlist: u64,
    #[serde(default)]
    pub dead: BTreeMap<u64, Sums>,
}

impl DsRec {
    pub(crate) fn root_ptr(&self) -> Result<BlockPtr, DsError> {
        decode_ptr_hex(&self.root)
            .map_err(|e| DsError::Corrupt(format!("dataset {}: root pointer: {e}", self.name)))
    }

    fn is_snapshot(&self) -> bool {
        self.kind == DatasetKind::Snapshot
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn encode_ptr_hex(bp: &BlockPtr) -> String {
    hex(&bp.encode())
}

fn decode_ptr_hex(s: &str) -> Result<BlockPtr, String> {
    if s.len() != BLOCK_PTR_SIZE * 2 || !s.is_ascii() {
        return Err(format!("bad length {}", s.len()));
    }
    let mut b = Vec::with_capacity(BLOCK_PTR_SIZE);
    for i in (0..s.len()).step_by(2) {
        b.push(u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| e.to_string())?);
    }
    BlockPtr::decode(&b).map_err(|e| e.to_string())
}

fn ds_key(id: u64) -> Vec<u8> {
    let mut k = vec![P_DS];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn dead_key(dl: u64, bucket: u64, bp: &BlockPtr) -> Vec<u8> {
    let mut k = vec![P_DEAD];
    k.extend_from_slice(&dl.to_be_bytes());
    k.extend_from_slice(&bucket.to_be_bytes());
    let d = bp.dvas[0];
    k.extend_from_slice(&d.vdev.to_be_bytes());
    k.extend_from_slice(&d.offset.to_be_bytes());
    k
}

fn dead_prefix(dl: u64, bucket: Option<u64>) -> Vec<u8> {
    let mut k = vec![P_DEAD];
    k.extend_from_slice(&dl.to_be_bytes());
    if let Some(b) = bucket {
        k.extend_from_slice(&b.to_be_bytes());
    }
    k
}

fn prefix_end(p: &[u8]) -> Vec<u8> {
    let mut e = p.to_vec();
    while let Some(last) = e.pop() {
        if last < 0xff {
            e.push(last + 1);
            return e;
        }
    }
    vec![0xff; p.len() + 1]
}

/// Encodes a tree value holding a block pointer.
pub(crate) fn block_value(bp: &BlockPtr) -> Vec<u8> {
    let mut v = Vec::with_capacity(1 + BLOCK_PTR_SIZE);
    v.push(TAG_BLOCK);
    v.extend_from_slice(&bp.encode());
    v
}

/// The scan function registered with the pool (see `tarn_pool::ext`).
fn scan_refs(kind: u8, key: &[u8], value: &[u8], out: &mut Vec<ExtRef>) {
    match kind {
        0 if key.first() == Some(&P_DS) => {
            if let Ok(rec) = serde_json::from_slice::<DsRec>(value) {
                if let Ok(root) = rec.root_ptr() {
                    if !root.is_hole() {
                        out.push(ExtRef::Tree {
                            id: rec.id,
                            root,
                            min_birth: rec.prev_snap_txg,
                            kind: 1,
                        });
                    }
                }
            }
        }
        1 if value.first() == Some(&TAG_BLOCK) => {
            if let Ok(bp) = BlockPtr::decode(&value[1..]) {
                out.push(ExtRef::Block(bp));
            }
        }
        _ => {}
    }
}

/// In-memory state of a dataset whose tree is open.
pub(crate) struct Live {
    pub tree: Tree,
    /// Data blocks of the open txg, by key.
    pub staged: BTreeMap<Vec<u8>, StagedBlock>,
    /// Allocated bytes of the staged blocks' reservations.
    pub staged_asize: u64,
    /// Blocks the open txg stopped referencing.
    pub kills: Vec<BlockPtr>,
    /// Operations of the open txg not yet in the intent log (see `zil`).
    pub log: Vec<crate::zil::LogOp>,
}

/// A data block of the open txg and the room already allocated for it.
#[derive(Clone, Debug)]
pub(crate) struct StagedBlock {
    pub data: Arc<Vec<u8>>,
    pub res: Reservation,
    /// Already written (for the intent log) at this pointer: the sync uses
    /// it as is.
    pub written: Option<BlockPtr>,
}

impl Live {
    /// Stages a block, returning the one it replaces.
    pub(crate) fn stage(&mut self, key: Vec<u8>, b: StagedBlock) -> Option<StagedBlock> {
        self.staged_asize += b.res.asize();
        let old = self.staged.insert(key, b);
        if let Some(o) = &old {
            self.staged_asize = self.staged_asize.saturating_sub(o.res.asize());
        }
        old
    }

    /// Removes a staged block.
    pub(crate) fn unstage(&mut self, key: &[u8]) -> Option<StagedBlock> {
        let old = self.staged.remove(key);
        if let Some(o) = &old {
            self.staged_asize = self.staged_asize.saturating_sub(o.res.asize());
        }
        old
    }
}

/// The dataset layer's state inside the pool.
#[derive(Default)]
pub(crate) struct Dsl {
    pub loaded: bool,
    pub pool_name: String,
    pub recs: BTreeMap<u64, DsRec>,
    pub names: BTreeMap<String, u64>,
    pub next_id: u64,
    pub live: HashMap<u64, Live>,
    pub dirty_recs: BTreeSet<u64>,
    pub deleted: BTreeSet<u64>,
    /// Snapshots created in the open txg: (head, snapshot).
    pub pending_snaps: Vec<(u64, u64)>,
    pub next_dirty: bool,
    /// Allocated bytes of one 128 KiB block on this pool's vdevs.
    pub alloc_per_block: u64,
    /// Datasets whose tree was replaced or created in the open txg: their
    /// operations cannot be redone from the committed txg, so synchronous
    /// requests commit the txg instead (see `zil`).
    pub unlogged: BTreeSet<u64>,
}

/// The node store of a dataset tree while it commits: records what it
/// writes and frees so the accounting and the birth-time rule see nodes.
struct SyncNodes<'a, 'p, 's> {
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

impl Dsl {
    fn alloc_id(&mut self) -> u64 {
        let id = self.next_id.max(1);
        self.next_id = id + 1;
        self.next_dirty = true;
        id
    }

    fn rec(&self, id: u64) -> Result<&DsRec, DsError> {
        self.recs
            .get(&id)
            .ok_or_else(|| DsError::NotFound(format!("dataset #{id} no longer exists")))
    }

    pub(crate) fn id_of(&self, name: &str) -> Result<u64, DsError> {
        self.names
            .get(name)
            .copied()
            .ok_or_else(|| DsError::NotFound(format!("dataset '{name}' does not exist")))
    }

    /// Reads every record from the meta tree.
    fn load(&mut self, cx: &mut Cx<'_, '_>, pool_name: &str) -> Result<(), DsError> {
        self.pool_name = pool_name.to_string();
        self.alloc_per_block = cx.alloc_cost(DEFLATE_BLOCK, 1);
        if let Some(v) = cx.meta_get(K_NEXT)? {
            let b: [u8; 8] = v
                .as_slice()
                .try_into()
                .map_err(|_| DsError::Corrupt("next dataset id".into()))?;
            self.next_id = u64::from_le_bytes(b);
        }
        let lo = vec![P_DS];
        let hi = vec![P_DS + 1];
        let mut start = Bound::Included(lo);
        loop {
            let page =
                cx.meta_range(start.as_ref().map(Vec::as_slice), Bound::Excluded(&hi), 256)?;
            let Some(last) = page.last().map(|(k, _)| k.clone()) else {
                break;
            };
            for (k, v) in page {
                let rec: DsRec = serde_json::from_slice(&v)
                    .map_err(|e| DsError::Corrupt(format!("dataset record {}: {e}", hex(&k))))?;
                rec.root_ptr()?;
                self.next_id = self.next_id.max(rec.id + 1).max(rec.deadlist + 1);
                self.names.insert(rec.name.clone(), rec.id);
                self.recs.insert(rec.id, rec);
            }
            start = Bound::Excluded(last);
        }
        if self.recs.is_empty() {
            let root = self.new_fs(pool_name, None, cx.txg());
            self.recs.insert(root.id, root);
        }
        // A pool imported under a new name renames its datasets with it.
        let old_root = self
            .recs
            .values()
            .find(|r| r.parent.is_none() && !r.is_snapshot())
            .map(|r| r.name.clone());
        if let Some(old) = old_root.filter(|o| o != pool_name) {
            self.names.clear();
            for r in self.recs.values_mut() {
                if let Some(rest) = r.name.strip_prefix(&old) {
                    if rest.is_empty() || rest.starts_with('/') || rest.starts_with('@') {
                        r.name = format!("{pool_name}{rest}");
                        self.dirty_recs.insert(r.id);
                    }
                }
                self.names.insert(r.name.clone(), r.id);
            }
        }
        self.loaded = true;
        Ok(())
    }

    fn new_fs(&mut self, name: &str, parent: Option<u64>, txg: u64) -> DsRec {
        let id = self.alloc_id();
        let deadlist = self.alloc_id();
        self.unlogged.insert(id);
        self.names.insert(name.to_string(), id);
        self.dirty_recs.insert(id);
        DsRec {
            id,
            guid: new_guid(id),
            name: name.to_string(),
            kind: DatasetKind::Filesystem,
            parent,
            head: None,
            root: encode_ptr_hex(&BlockPtr::default()),
            created_txg: txg,
            created_unix: now_unix(),
            prev_snap: None,
            prev_snap_txg: 0,
            origin: None,
            clones: Vec::new(),
            props: BTreeMap::new(),
            referenced: Sums::default(),
            unique: Sums::default(),
            deadlist,
            dead: BTreeMap::new(),
        }
    }

    /// The live state of a dataset, opening its tree on first use.
    pub(crate) fn live(&mut self, id: u64) -> Result<&mut Live, DsError> {
        if !self.live.contains_key(&id) {
            let root = self.rec(id)?.root_ptr()?;
            self.live.insert(
                id,
                Live {
                    tree: Tree::open(root),
                    staged: BTreeMap::new(),
                    staged_asize: 0,
                    kills: Vec::new(),
                    log: Vec::new(),
                },
            );
        }
        self.live
            .get_mut(&id)
            .ok_or_else(|| DsError::NotFound(format!("dataset #{id}")))
    }

    /// Applies the birth-time rule to a block dataset `id` no longer references.
    fn kill(
        &mut self,
        cx: &mut Cx<'_, '_>,
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
            let bucket = boundaries
                .iter()
                .copied()
                .filter(|t| *t < bp.birth)
                .max()
                .unwrap_or(0);
            rec.dead.entry(bucket).or_default().add(s);
            cx.meta_put(&dead_key(rec.deadlist, bucket, bp), &bp.encode())?;
        }
        Ok(())
    }

    /// Snapshot-interval boundaries of a head's deadlist buckets: 0, its
    /// origin's txg if it is a clone, and its snapshots' txgs.
    fn boundaries(&self, head: u64) -> Vec<u64> {
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

    /// Resolved value and source of a settable property.
    pub(crate) fn prop(&self, id: u64, name: &str) -> (String, Source) {
        let mut cur = self.recs.get(&id);
        let mut first = true;
        while let Some(r) = cur {
            if let Some(v) = r.props.get(name) {
                let src = if first {
                    Source::Local
                } else {
                    Source::Inherited(r.name.clone())
                };
                if name == "mountpoint" && !first && v.starts_with('/') {
                    // An inherited mountpoint extends by the relative name.
                    let rel = self
                        .recs
                        .get(&id)
                        .map(|me| {
                            let base = me.name.split('@').next().unwrap_or(&me.name);
                            base.strip_prefix(&r.name).unwrap_or("").to_string()
                        })
                        .unwrap_or_default();
                    let v = format!("{}{}", v.trim_end_matches('/'), rel);
                    return (v, src);
                }
                return (v.clone(), src);
            }
            first = false;
            let up = if r.is_snapshot() { r.head } else { r.parent };
            cur = up.and_then(|p| self.recs.get(&p));
        }
        (
            props::default_of(name).unwrap_or("").to_string(),
            Source::Default,
        )
    }

    pub(crate) fn prop_bool(&self, id: u64, name: &str) -> bool {
        self.prop(id, name).0 == "on"
    }

    pub(crate) fn prop_u64(&self, id: u64, name: &str) -> Option<u64> {
        self.prop(id, name).0.parse().ok()
    }

    pub(crate) fn block_opts(&self, id: u64) -> BlockOpts {
        BlockOpts {
            compression: Compression::parse(&self.prop(id, "compression").0)
                .unwrap_or(Compression::Lz4),
            checksum: ChecksumAlg::parse(&self.prop(id, "checksum").0)
                .unwrap_or(ChecksumAlg::Blake3),
            copies: self.prop_u64(id, "copies").unwrap_or(1).clamp(1, 3) as u8,
        }
    }

    /// The chain successor of snapshot `snap`: the next snapshot of the
    /// same filesystem, or the filesystem itself.
    fn next_of(&self, snap: u64) -> Option<u64> {
        let head = self.recs.get(&snap)?.head?;
        self.recs
            .values()
            .find(|r| {
                r.prev_snap == Some(snap)
                    && (r.id == head || (r.is_snapshot() && r.head == Some(head)))
            })
            .map(|r| r.id)
    }

    fn origin_txg(&self, head: u64) -> u64 {
        self.recs
            .get(&head)
            .and_then(|r| r.origin)
            .and_then(|o| self.recs.get(&o))
            .map_or(0, |o| o.created_txg)
    }

    fn dead_from(&self, id: u64, from: u64) -> Sums {
        self.recs.get(&id).map_or(Sums::default(), |r| {
            r.dead
                .range(from..)
                .fold(Sums::default(), |a, (_, s)| a.plus(*s))
        })
    }

    /// Space only snapshot `snap` holds: what destroying it frees.
    fn snap_used(&self, snap: u64) -> Sums {
        let Some(r) = self.recs.get(&snap) else {
            return Sums::default();
        };
        match self.next_of(snap) {
            Some(next) => self.dead_from(next, r.prev_snap_txg),
            None => Sums::default(),
        }
    }

    fn snapshots_of(&self, head: u64) -> Vec<u64> {
        let mut v: Vec<&DsRec> = self
            .recs
            .values()
            .filter(|r| r.head == Some(head))
            .collect();
        v.sort_by_key(|r| (r.created_txg, r.id));
        v.into_iter().map(|r| r.id).collect()
    }

    fn children_of(&self, id: u64) -> Vec<u64> {
        self.recs
            .values()
            .filter(|r| r.parent == Some(id) && !r.is_snapshot())
            .map(|r| r.id)
            .collect()
    }

    /// (by dataset, by snapshots, by children) of a filesystem.
    fn used_parts(&self, id: u64) -> (Sums, Sums, Sums) {
        let Some(r) = self.recs.get(&id) else {
            return Default::default();
        };
        let from = self.origin_txg(id);
        let mut snaps = self.dead_from(id, from);
        for s in self.snapshots_of(id) {
            snaps.add(self.dead_from(s, from));
        }
        let mut children = Sums::default();
        for c in self.children_of(id) {
            let u = self.used(c);
            let res = self.inflate(self.prop_u64(c, "reservation").unwrap_or(0));
            children.add(Sums {
                asize: u.asize.max(res),
                ..u
            });
        }
        (r.unique, snaps, children)
    }

    pub(crate) fn used(&self, id: u64) -> Sums {
        match self.recs.get(&id) {
            Some(r) if r.is_snapshot() => self.snap_used(id),
            Some(_) => {
                let (a, b, c) = self.used_parts(id);
                a.plus(b).plus(c)
            }
            None => Sums::default(),
        }
    }

    fn ancestors_and_self(&self, id: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut cur = Some(id);
        while let Some(c) = cur {
            out.push(c);
            cur = self.recs.get(&c).and_then(|r| r.parent);
        }
        out
    }

    /// Bytes charged in the open txg to `id` and its descendants.
    fn pending(&self, id: u64) -> u64 {
        self.live
            .iter()
            .filter(|(l, _)| self.ancestors_and_self(**l).contains(&id))
            .map(|(_, l)| l.staged_asize)
            .sum()
    }

    /// Allocated bytes in the space a user counts: raidz parity and padding
    /// taken out at the ratio of a 128 KiB block, as `zfs list` does, so a
    /// 1 GiB file shows as about 1G used and quotas mean what they say.
    pub(crate) fn deflate(&self, raw: u64) -> u64 {
        let per = self.alloc_per_block.max(1);
        ((raw as u128 * DEFLATE_BLOCK as u128) / per as u128) as u64
    }

    /// The inverse of [`Dsl::deflate`], rounded up.
    fn inflate(&self, user: u64) -> u64 {
        let per = self.alloc_per_block.max(1);
        (user as u128 * per as u128).div_ceil(DEFLATE_BLOCK as u128) as u64
    }

    /// Unused part of a dataset's reservation, in user bytes.
    fn unused_reservation(&self, d: u64) -> u64 {
        self.prop_u64(d, "reservation")
            .unwrap_or(0)
            .saturating_sub(self.deflate(self.used(d).asize))
    }

    /// Room in the pool for `id` in user bytes: the pool's writable space
    /// less what other datasets hold reserved and have not used.
    fn pool_room(&self, cx: &Cx<'_, '_>, id: u64) -> u64 {
        let rs = self.prop_u64(id, "recordsize").unwrap_or(128 * 1024);
        let pool = self.deflate(cx.writable(rs));
        let all: u64 = self
            .recs
            .values()
            .filter(|r| !r.is_snapshot())
            .map(|r| self.unused_reservation(r.id))
            .sum();
        let own: u64 = self
            .ancestors_and_self(id)
            .iter()
            .map(|d| self.unused_reservation(*d))
            .sum();
        pool.saturating_sub(all.saturating_sub(own))
    }

    /// What `id` may still write (user bytes): its room in the pool, capped
    /// by every quota above it.
    pub(crate) fn available(&self, cx: &Cx<'_, '_>, id: u64) -> u64 {
        let mut avail = self.pool_room(cx, id);
        for a in self.ancestors_and_self(id) {
            if let Some(q) = self.prop_u64(a, "quota") {
                let used = self.deflate(self.used(a).asize + self.pending(a));
                avail = avail.min(q.saturating_sub(used));
            }
        }
        avail
    }

    /// Checks that `cost` more allocated bytes may be written to `id`.
    pub(crate) fn check_room(&self, cx: &Cx<'_, '_>, id: u64, cost: u64) -> Result<(), DsError> {
        let name = self
            .recs
            .get(&id)
            .map(|r| r.name.clone())
            .unwrap_or_default();
        let user_cost = self.deflate(cost).max(1);
        for a in self.ancestors_and_self(id) {
            if let Some(q) = self.prop_u64(a, "quota") {
                let used = self.deflate(self.used(a).asize + self.pending(a));
                if used.saturating_add(user_cost) > q {
                    let an = self
                        .recs
                        .get(&a)
                        .map(|r| r.name.clone())
                        .unwrap_or_default();
                    return Err(DsError::Quota(format!(
                        "dataset '{an}' is at its quota of {}",
                        props::human_bytes(q)
                    )));
                }
            }
        }
        if self.pool_room(cx, id) < user_cost {
            return Err(DsError::NoSpace(format!(
                "no room in pool '{}' for dataset '{name}'",
                self.pool_name
            )));
        }
        Ok(())
    }

    fn info(&self, cx: &Cx<'_, '_>, id: u64) -> Option<DatasetInfo> {
        let r = self.recs.get(&id)?;
        let snapshot = r.is_snapshot();
        let (by_ds, by_snaps, by_children) = if snapshot {
            (Sums::default(), Sums::default(), Sums::default())
        } else {
            self.used_parts(id)
        };
        let used = self.used(id);
        let mountpoint = if snapshot {
            None
        } else {
            Some(self.prop(id, "mountpoint").0)
        };
        Some(DatasetInfo {
            name: r.name.clone(),
            kind: r.kind,
            guid: r.guid,
            creation_unix: r.created_unix,
            used: self.deflate(used.asize),
            available: if snapshot {
                None
            } else {
                Some(self.available(cx, id))
            },
            referenced: self.deflate(r.referenced.asize),
            logicalused: if snapshot {
                used.lsize
            } else {
                by_ds.lsize + by_snaps.lsize + by_children.lsize
            },
            logicalreferenced: r.referenced.lsize,
            compressratio: if r.referenced.psize == 0 {
                1.0
            } else {
                ((r.referenced.lsize as f64 / r.referenced.psize as f64) * 100.0).round() / 100.0
            },
            usedbydataset: self.deflate(by_ds.asize),
            usedbysnapshots: self.deflate(by_snaps.asize),
            usedbychildren: self.deflate(by_children.asize),
            written: self.deflate(r.unique.asize),
            origin: r
                .origin
                .and_then(|o| self.recs.get(&o))
                .map(|o| o.name.clone()),
            mountpoint,
        })
    }

    /// Frees every block of `root`'s tree born after `after` (nodes and data).
    fn free_tree(&self, cx: &mut Cx<'_, '_>, root: &BlockPtr, after: u64) -> Result<(), DsError> {
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
    fn drain_deadlist(
        &mut self,
        cx: &mut Cx<'_, '_>,
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

    fn remove_rec(&mut self, id: u64) {
        if let Some(r) = self.recs.remove(&id) {
            self.names.remove(&r.name);
        }
        self.live.remove(&id);
        self.unlogged.insert(id);
        self.deleted.insert(id);
        self.dirty_recs.remove(&id);
    }

    /// Destroys one snapshot (checked by the caller: no clones).
    fn destroy_snapshot(&mut self, cx: &mut Cx<'_, '_>, snap: u64) -> Result<(), DsError> {
        let s = self.rec(snap)?.clone();
        if !s.clones.is_empty() {
            let names: Vec<String> = s
                .clones
                .iter()
                .filter_map(|c| self.recs.get(c).map(|r| r.name.clone()))
                .collect();
            return Err(DsError::Busy(format!(
                "snapshot '{}' has dependent clones: {}; destroy them first",
                s.name,
                names.join(", ")
            )));
        }
        let Some(next) = self.next_of(snap) else {
            return Err(DsError::Corrupt(format!(
                "snapshot '{}' has no successor in its chain",
                s.name
            )));
        };
        let next_rec = self.rec(next)?.clone();
        // Blocks born after S's previous snapshot and dead by `next`: only S
        // held them.
        let freed = self.dead_from(next, s.prev_snap_txg);
        self.drain_deadlist(cx, next_rec.deadlist, s.prev_snap_txg, true, None)?;
        // S's own dead blocks are still held by older snapshots: next
        // inherits them.
        self.drain_deadlist(cx, s.deadlist, 0, false, Some(next_rec.deadlist))?;
        if let Some(n) = self.recs.get_mut(&next) {
            n.dead.retain(|b, _| *b < s.prev_snap_txg);
            for (b, sum) in &s.dead {
                n.dead.entry(*b).or_default().add(*sum);
            }
            n.prev_snap = s.prev_snap;
            n.prev_snap_txg = s.prev_snap_txg;
            // A scan that already walked `next` skipped blocks born after
            // the new pruning point that only S's tree led to.
            cx.rescan_tree(next);
            // What S wrote and next still holds is now next's alone.
            let mut gain = s.unique;
            gain.sub(freed);
            n.unique.add(gain);
        }
        if let Some(o) = s.origin {
            if let Some(orec) = self.recs.get_mut(&o) {
                orec.clones.retain(|c| *c != snap);
            }
        }
        self.dirty_recs.insert(next);
        self.remove_rec(snap);
        Ok(())
    }

    /// Destroys a filesystem without snapshots or children.
    fn destroy_fs(&mut self, cx: &mut Cx<'_, '_>, id: u64) -> Result<(), DsError> {
        let r = self.rec(id)?.clone();
        if r.parent.is_none() {
            return Err(DsError::Invalid(format!(
                "'{}' is the pool's root dataset; destroy the pool instead",
                r.name
            )));
        }
        if !self.snapshots_of(id).is_empty() || !self.children_of(id).is_empty() {
            return Err(DsError::Busy(format!(
                "dataset '{}' has children or snapshots; use -r",
                r.name
            )));
        }
        let root = r.root_ptr()?;
        self.free_tree(cx, &root, r.prev_snap_txg)?;
        self.drain_deadlist(cx, r.deadlist, 0, false, None)?;
        if let Some(o) = r.origin {
            if let Some(orec) = self.recs.get_mut(&o) {
                orec.clones.retain(|c| *c != id);
                self.dirty_recs.insert(o);
            }
        }
        self.remove_rec(id);
        Ok(())
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn new_guid(salt: u64) -> u64 {
    let seed = format!(
        "{:?}{}{salt}{:?}",
        std::time::SystemTime::now(),
        std::process::id(),
        std::thread::current().id()
    );
    let h = blake3_hash(seed.as_bytes());
    u64::from_le_bytes(h).max(1)
}

fn blake3_hash(b: &[u8]) -> [u8; 8] {
    let sum = tarn_block::checksum(ChecksumAlg::Blake3, b);
    let mut out = [0u8; 8];
    out.copy_from_slice(&sum[..8]);
    out
}

/// What `list` reports about a dataset (sizes in allocated bytes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DatasetInfo {
    /// Full name (`tank/photos`, `tank/photos@monday`).
    pub name: String,
    /// Filesystem or snapshot.
    pub kind: DatasetKind,
    /// Stable 64-bit id.
    pub guid: u64,
    /// Creation time (Unix seconds).
    pub creation_unix: u64,
    /// Space this dataset and everything below it uses; for a snapshot,
    /// what destroying it would free.
    pub used: u64,
    /// What can still be written (none for snapshots).
    pub available: Option<u64>,
    /// Space the dataset's tree references (shared or not).
    pub referenced: u64,
    /// `used` in logical (uncompressed) bytes.
    pub logicalused: u64,
    /// `referenced` in logical bytes.
    pub logicalreferenced: u64,
    /// Logical / physical size of the referenced data.
    pub compressratio: f64,
    /// Part of `used` only the live filesystem holds.
    pub usedbydataset: u64,
    /// Part of `used` only snapshots hold.
    pub usedbysnapshots: u64,
    /// Part of `used` children hold.
    pub usedbychildren: u64,
    /// Space written since the previous snapshot.
    pub written: u64,
    /// The snapshot a clone came from.
    pub origin: Option<String>,
    /// Resolved mountpoint (filesystems).
    pub mountpoint: Option<String>,
}

/// Validates a filesystem name under `pool`.
fn check_fs_name(pool: &str, name: &str) -> Result<(), DsError> {
    let bad = |why: &str| {
        Err(DsError::Invalid(format!(
            "invalid dataset name '{name}': {why}"
        )))
    };
    if name.len() > 255 {
        return bad("longer than 255 bytes");
    }
    let mut parts = name.split('/');
    if parts.next() != Some(pool) {
        return bad(&format!("must start with the pool name '{pool}/'"));
    }
    for p in parts {
        if p.is_empty() {
            return bad("empty component");
        }
        if !p
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
        {
            return bad("use letters, digits, '-', '_', '.', ':'");
        }
    }
    Ok(())
}

fn check_snap_part(name: &str, snap: &str) -> Result<(), DsError> {
    if snap.is_empty()
        || snap.len() > 200
        || !snap
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
    {
        return Err(DsError::Invalid(format!(
            "invalid snapshot name '{name}': use letters, digits, '-', '_', '.', ':' after '@'"
        )));
    }
    Ok(())
}

fn parent_name(name: &str) -> Option<&str> {
    name.rsplit_once('/').map(|(p, _)| p)
}

/// Runs `f` on the pool's dataset layer.
fn with<R>(
    pool: &Pool,
    write: bool,
    synced: bool,
    f: impl FnOnce(&mut Dsl, &mut Cx<'_, '_>) -> Result<R, DsError>,
) -> Result<R, DsError> {
    pool.with_ext::<Dsl, Result<R, DsError>>(write, synced, |dsl, cx| {
        if !dsl.loaded {
            return Ok(Err(DsError::Invalid("datasets are not loaded".into())));
        }
        Ok(f(dsl, cx))
    })?
}

pub(crate) fn with_dsl<R>(
    pool: &Pool,
    write: bool,
    f: impl FnOnce(&mut Dsl, &mut Cx<'_, '_>) -> Result<R, DsError>,
) -> Result<R, DsError> {
    with(pool, write, false, f)
}

/// Installs the dataset layer in an imported pool (once) and loads its
/// records; a pool without datasets gets its root dataset.
pub fn attach(pool: &Arc<Pool>) -> Result<(), DsError> {
    if pool.has_extension() {
        return Ok(());
    }
    pool.set_extension(Box::<Dsl>::default(), scan_refs);
    let name = pool.name().to_string();
    pool.with_ext::<Dsl, Result<(), DsError>>(false, false, |dsl, cx| Ok(dsl.load(cx, &name)))??;
    // Synchronous writes the last txg did not commit.
    crate::zil::replay(pool)?;
    Ok(())
}

/// Creates filesystem `name` (with `parents`, its missing ancestors too).
pub fn create(
    pool: &Pool,
    name: &str,
    props: &BTreeMap<String, String>,
    parents: bool,
) -> Result<(), DsError> {
    check_fs_name(pool.name(), name)?;
    let mut local = BTreeMap::new();
    for (k, v) in props {
        local.insert(k.clone(), props::validate(k, v)?);
    }
    with(pool, true, false, |dsl, cx| {
        if dsl.names.contains_key(name) {
            return Err(DsError::Exists(format!("dataset '{name}' already exists")));
        }
        let mut missing = Vec::new();
        let mut cur = parent_name(name);
        while let Some(p) = cur {
            if dsl.names.contains_key(p) {
                break;
            }
            missing.push(p.to_string());
            cur = parent_name(p);
        }
        if !missing.is_empty() && !parents {
            return Err(DsError::NotFound(format!(
                "parent '{}' does not exist; create it first or use -p",
                missing[0]
            )));
        }
        let txg = cx.txg();
        for n in missing
            .iter()
            .rev()
            .chain(std::iter::once(&name.to_string()))
        {
            let parent = parent_name(n).and_then(|p| dsl.names.get(p).copied());
            let mut rec = dsl.new_fs(n, parent, txg);
            if n == name {
                rec.props = local.clone();
            }
            dsl.recs.insert(rec.id, rec);
        }
        Ok(())
    })?;
    pool.sync()?;
    Ok(())
}

/// Every dataset (and snapshot, with `snapshots`), sorted by name.
pub fn list(pool: &Pool, snapshots: bool) -> Result<Vec<DatasetInfo>, DsError> {
    with(pool, false, false, |dsl, cx| {
        let mut out: Vec<DatasetInfo> = dsl
            .names
            .values()
            .filter_map(|id| dsl.info(cx, *id))
            .filter(|i| snapshots || i.kind == DatasetKind::Filesystem)
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    })
}

/// Property values of a dataset (all of them when `names` is empty).
pub fn get_props(pool: &Pool, name: &str, names: &[String]) -> Result<Vec<PropValue>, DsError> {
    with(pool, false, false, |dsl, cx| {
        let id = dsl.id_of(name)?;
        let info = dsl
            .info(cx, id)
            .ok_or_else(|| DsError::NotFound(name.to_string()))?;
        let wanted: Vec<String> = if names.is_empty() {
            props::COMPUTED
                .iter()
                .map(|s| s.to_string())
                .chain(props::SETTABLE.iter().map(|(n, _)| n.to_string()))
                .collect()
        } else {
            names.to_vec()
        };
        let mut out = Vec::new();
        for p in wanted {
            let computed = |v: String| (v, Source::None);
            let (value, source) = match p.as_str() {
                "type" => computed(
                    match info.kind {
                        DatasetKind::Filesystem => "filesystem",
                        DatasetKind::Snapshot => "snapshot",
                    }
                    .into(),
                ),
                "creation" => computed(info.creation_unix.to_string()),
                "used" => computed(info.used.to_string()),
                "available" => computed(info.available.map_or("-".into(), |a| a.to_string())),
                "referenced" => computed(info.referenced.to_string()),
                "compressratio" => computed(format!("{:.2}x", info.compressratio)),
                "logicalused" => computed(info.logicalused.to_string()),
                "logicalreferenced" => computed(info.logicalreferenced.to_string()),
                "usedbydataset" => computed(info.usedbydataset.to_string()),
                "usedbysnapshots" => computed(info.usedbysnapshots.to_string()),
                "usedbychildren" => computed(info.usedbychildren.to_string()),
                "written" => computed(info.written.to_string()),
                "origin" => computed(info.origin.clone().unwrap_or_else(|| "-".into())),
                "guid" => computed(info.guid.to_string()),
                other if props::default_of(other).is_some() => dsl.prop(id, other),
                other => {
                    return Err(DsError::Invalid(format!("unknown property '{other}'")));
                }
            };
            out.push(PropValue {
                dataset: name.to_string(),
                property: p,
                value,
                source,
            });
        }
        Ok(out)
    })
}

/// Sets a property on a filesystem.
pub fn set_prop(pool: &Pool, name: &str, prop: &str, value: &str) -> Result<(), DsError> {
    let v = props::validate(prop, value)?;
    with(pool, true, false, |dsl, _cx| {
        let id = dsl.id_of(name)?;
        let r = dsl
            .recs
            .get_mut(&id)
            .ok_or_else(|| DsError::NotFound(name.to_string()))?;
        if r.is_snapshot() {
            return Err(DsError::Invalid(format!(
                "'{name}' is a snapshot: its properties come from its filesystem"
            )));
        }
        r.props.insert(prop.to_string(), v);
        dsl.dirty_recs.insert(id);
        Ok(())
    })?;
    pool.sync()?;
    Ok(())
}

/// Removes a local property value so the inherited one applies.
pub fn inherit(pool: &Pool, name: &str, prop: &str) -> Result<(), DsError> {
    if props::default_of(prop).is_none() {
        return Err(DsError::Invalid(format!(
            "'{prop}' is not an inheritable property"
        )));
    }
    with(pool, true, false, |dsl, _cx| {
        let id = dsl.id_of(name)?;
        if let Some(r) = dsl.recs.get_mut(&id) {
            r.props.remove(prop);
        }
        dsl.dirty_recs.insert(id);
        Ok(())
    })?;
    pool.sync()?;
    Ok(())
}

/// Takes snapshots (`fs@name`), all in one txg; with `recursive`, of every
/// descendant filesystem too, under the same snapshot name.
pub fn snapshot(pool: &Pool, names: &[String], recursive: bool) -> Result<(), DsError> {
    with(pool, true, false, |dsl, cx| {
        let mut todo: Vec<(u64, String)> = Vec::new();
        for full in names {
            let Some((fs, snap)) = full.split_once('@') else {
                return Err(DsError::Invalid(format!(
                    "'{full}' is not a snapshot name (fs@name)"
                )));
            };
            check_snap_part(full, snap)?;
            let id = dsl.id_of(fs)?;
            if dsl.recs.get(&id).is_some_and(|r| r.is_snapshot()) {
                return Err(DsError::Invalid(format!("'{fs}' is a snapshot")));
            }
            todo.push((id, full.clone()));
            if recursive {
                let prefix = format!("{fs}/");
                for r in dsl.recs.values() {
                    if !r.is_snapshot() && r.name.starts_with(&prefix) {
                        todo.push((r.id, format!("{}@{snap}", r.name)));
                    }
                }
            }
        }
        let mut seen = BTreeSet::new();
        for (_, n) in &todo {
            if dsl.names.contains_key(n) || !seen.insert(n.clone()) {
                return Err(DsError::Exists(format!("snapshot '{n}' already exists")));
            }
        }
        let txg = cx.txg();
        for (head, n) in todo {
            let id = dsl.alloc_id();
            let h = dsl.rec(head)?.clone();
            dsl.names.insert(n.clone(), id);
            dsl.recs.insert(
                id,
                DsRec {
                    id,
                    guid: new_guid(id),
                    name: n,
                    kind: DatasetKind::Snapshot,
                    parent: None,
                    head: Some(head),
                    root: encode_ptr_hex(&BlockPtr::default()),
                    created_txg: txg,
                    created_unix: now_unix(),
                    prev_snap: h.prev_snap,
                    prev_snap_txg: h.prev_snap_txg,
                    origin: None,
                    clones: Vec::new(),
                    props: BTreeMap::new(),
                    referenced: Sums::default(),
                    unique: Sums::default(),
                    deadlist: 0,
                    dead: BTreeMap::new(),
                },
            );
            dsl.pending_snaps.push((head, id));
            dsl.dirty_recs.insert(id);
        }
        Ok(())
    })?;
    pool.sync()?;
    Ok(())
}

/// Destroys a filesystem (with `recursive`: its descendants and all their
/// snapshots first), a snapshot `fs@a`, or a range of snapshots `fs@a%c`
/// (from a to c inclusive, by creation; either end may be empty).
pub fn destroy(pool: &Pool, name: &str, recursive: bool) -> Result<(), DsError> {
    with(pool, true, true, |dsl, cx| {
        // Everything a user can get wrong is checked before the first
        // change; what fails after that is I/O or damage, and faults.
        if let Some((fs, spec)) = name.split_once('@') {
            let head = dsl.id_of(fs)?;
            let snaps = dsl.snapshots_of(head);
            let pos = |s: &str| -> Result<usize, DsError> {
                let full = format!("{fs}@{s}");
                let id = dsl.id_of(&full)?;
                snaps
                    .iter()
                    .position(|x| *x == id)
                    .ok_or(DsError::NotFound(full))
            };
            let chosen: Vec<u64> = match spec.split_once('%') {
                Some((a, c)) => {
                    let lo = if a.is_empty() { 0 } else { pos(a)? };
                    let hi = if c.is_empty() {
                        snaps.len().saturating_sub(1)
                    } else {
                        pos(c)?
                    };
                    if snaps.is_empty() || lo > hi {
                        return Err(DsError::Invalid(format!("empty snapshot range '{name}'")));
                    }
                    snaps[lo..=hi].to_vec()
                }
                None => vec![snaps[pos(spec)?]],
            };
            for id in &chosen {
                if let Some(r) = dsl.recs.get(id) {
                    if !r.clones.is_empty() {
                        return Err(DsError::Busy(format!(
                            "snapshot '{}' has dependent clones; destroy them first",
                            r.name
                        )));
                    }
                }
            }
            let r = chosen
                .into_iter()
                .try_for_each(|id| dsl.destroy_snapshot(cx, id));
            return applied(cx, "destroy", r);
        }
        let id = dsl.id_of(name)?;
        if dsl.rec(id)?.parent.is_none() {
            return Err(DsError::Invalid(format!(
                "'{name}' is the pool's root dataset; destroy the pool instead"
            )));
        }
        if !recursive {
            // destroy_fs refuses (changing nothing) a dataset with
            // snapshots or children.
            let r = dsl.destroy_fs(cx, id);
            return match r {
                Err(e @ (DsError::Busy(_) | DsError::Invalid(_))) => Err(e),
                other => applied(cx, "destroy", other),
            };
        }
        let prefix = format!("{name}/");
        let mut remaining: BTreeSet<u64> = dsl
            .recs
            .values()
            .filter(|r| !r.is_snapshot() && (r.id == id || r.name.starts_with(&prefix)))
            .map(|r| r.id)
            .collect();
        for d in &remaining {
            for s in dsl.snapshots_of(*d) {
                if let Some(r) = dsl.recs.get(&s) {
                    if r.clones.iter().any(|c| !remaining.contains(c)) {
                        return Err(DsError::Busy(format!(
                            "snapshot '{}' has clones outside '{name}'; destroy them first",
                            r.name
                        )));
                    }
                }
            }
        }
        // An order in which each dataset goes after its children and after
        // the clones of its snapshots.
        let mut order = Vec::new();
        while !remaining.is_empty() {
            let free = remaining.iter().copied().find(|d| {
                let no_children = dsl.children_of(*d).iter().all(|c| !remaining.contains(c));
                let no_clones = dsl.snapshots_of(*d).iter().all(|s| {
                    dsl.recs
                        .get(s)
                        .is_none_or(|r| r.clones.iter().all(|c| !remaining.contains(c)))
                });
                no_children && no_clones
            });
            let Some(d) = free else {
                return Err(DsError::Corrupt(format!(
                    "datasets under '{name}' depend on each other in a cycle"
                )));
            };
            order.push(d);
            remaining.remove(&d);
        }
        let r = order.into_iter().try_for_each(|d| {
            for s in dsl.snapshots_of(d).into_iter().rev() {
                dsl.destroy_snapshot(cx, s)?;
            }
            dsl.destroy_fs(cx, d)
        });
        applied(cx, "destroy", r)
    })?;
    pool.sync()?;
    Ok(())
}

/// Passes on the result of the changing part of an operation; an error
/// there (I/O, damage) leaves changes behind that must not commit, so the
/// pool faults.
fn applied<R>(cx: &mut Cx<'_, '_>, what: &str, r: Result<R, DsError>) -> Result<R, DsError> {
    if let Err(e) = &r {
        cx.fault(format!(
            "{what} failed part-way ({e}); the pool stopped so that nothing half-done is \
             committed: export and import it"
        ));
    }
    r
}

/// Makes clone `name` independent of its origin: the origin snapshot and
/// every older snapshot of the origin's filesystem move to the clone, and
/// that filesystem becomes a clone of the (moved) origin snapshot. After
/// it, the old filesystem can be destroyed while the clone lives on.
pub fn promote(pool: &Pool, name: &str) -> Result<(), DsError> {
    with(pool, true, true, |dsl, cx| {
        let c = dsl.id_of(name)?;
        let crec = dsl.rec(c)?.clone();
        let Some(origin) = crec.origin else {
            return Err(DsError::Invalid(format!("'{name}' is not a clone")));
        };
        let orec = dsl.rec(origin)?.clone();
        let Some(h) = orec.head else {
            return Err(DsError::Corrupt(format!(
                "origin of '{name}' has no filesystem"
            )));
        };
        let hname = dsl.rec(h)?.name.clone();
        dsl.unlogged.insert(c);
        dsl.unlogged.insert(h);
        // The snapshots that move: the origin and everything older.
        let moving: Vec<u64> = dsl
            .snapshots_of(h)
            .into_iter()
            .filter(|s| {
                dsl.recs
                    .get(s)
                    .is_some_and(|r| r.created_txg <= orec.created_txg)
            })
            .collect();
        let mut renames = Vec::new();
        for s in &moving {
            let r = dsl.rec(*s)?;
            let short = r.name.split_once('@').map(|(_, x)| x).unwrap_or("");
            let new = format!("{name}@{short}");
            if dsl.names.contains_key(&new) {
                return Err(DsError::Exists(format!(
                    "'{name}' already has a snapshot '@{short}'; rename one of them first"
                )));
            }
            renames.push((*s, new));
        }
        // Deadlist entries of the clone's side were bucketed with the
        // clone's boundaries (0, the origin txg, its snapshots); the moving
        // snapshots add boundaries below the origin txg, so entries born
        // before it are sorted into their buckets again.
        // If the origin's filesystem is itself a clone, its origin becomes
        // the promoted clone's origin.
        let grand = dsl.rec(h)?.origin;
        let mut chain: Vec<u64> = dsl.snapshots_of(c);
        chain.push(c);
        let mut new_bounds: Vec<u64> = vec![0, dsl.origin_txg(h)];
        for s in &moving {
            new_bounds.push(dsl.rec(*s)?.created_txg);
        }
        new_bounds.sort_unstable();
        new_bounds.dedup();
        let r = (|| -> Result<(), DsError> {
            for m in chain {
                let (dl, below) = {
                    let r = dsl.rec(m)?;
                    (r.deadlist, orec.created_txg)
                };
                let lo = dead_prefix(dl, None);
                let hi = dead_prefix(dl, Some(below));
                let mut moved: Vec<(Vec<u8>, BlockPtr)> = Vec::new();
                let mut start = Bound::Included(lo);
                loop {
                    let page = cx.meta_range(
                        start.as_ref().map(Vec::as_slice),
                        Bound::Excluded(&hi),
                        512,
                    )?;
                    let Some(last) = page.last().map(|(k, _)| k.clone()) else {
                        break;
                    };
                    for (k, v) in page {
                        moved.push((k, BlockPtr::decode(&v)?));
                    }
                    start = Bound::Excluded(last);
                }
                let mut sums: BTreeMap<u64, Sums> = BTreeMap::new();
                for (k, bp) in &moved {
                    cx.meta_delete(k)?;
                    let bucket = new_bounds
                        .iter()
                        .copied()
                        .filter(|t| *t < bp.birth)
                        .max()
                        .unwrap_or(0);
                    cx.meta_put(&dead_key(dl, bucket, bp), &bp.encode())?;
                    sums.entry(bucket).or_default().add(Sums::of(bp));
                }
                if let Some(r) = dsl.recs.get_mut(&m) {
                    r.dead.retain(|b, _| *b >= below);
                    for (b, s) in sums {
                        r.dead.entry(b).or_default().add(s);
                    }
                }
                dsl.dirty_recs.insert(m);
            }
            for (s, new) in renames {
                if let Some(r) = dsl.recs.get_mut(&s) {
                    dsl.names.remove(&r.name);
                    r.name = new.clone();
                    r.head = Some(c);
                    dsl.names.insert(new, s);
                }
                dsl.dirty_recs.insert(s);
            }
            if let Some(r) = dsl.recs.get_mut(&origin) {
                r.clones.retain(|x| *x != c);
                r.clones.push(h);
            }
            if let Some(g) = grand {
                if let Some(r) = dsl.recs.get_mut(&g) {
                    r.clones.retain(|x| *x != h);
                    r.clones.push(c);
                }
                dsl.dirty_recs.insert(g);
            }
            if let Some(r) = dsl.recs.get_mut(&c) {
                r.origin = grand;
            }
            if let Some(r) = dsl.recs.get_mut(&h) {
                r.origin = Some(origin);
            }
            dsl.dirty_recs.insert(c);
            dsl.dirty_recs.insert(h);
            let _ = hname;
            Ok(())
        })();
        applied(cx, "promote", r)
    })?;
    pool.sync()?;
    Ok(())
}

/// Returns filesystem `fs` to snapshot `fs@snap`. Newer snapshots must be
/// destroyed first (`destroy_newer` does it).
pub fn rollback(pool: &Pool, snap_name: &str, destroy_newer: bool) -> Result<(), DsError> {
    with(pool, true, true, |dsl, cx| {
        let snap = dsl.id_of(snap_name)?;
        let s = dsl.rec(snap)?.clone();
        let Some(head) = s.head else {
            return Err(DsError::Invalid(format!("'{snap_name}' is not a snapshot")));
        };
        let newer: Vec<u64> = dsl
            .snapshots_of(head)
            .into_iter()
            .filter(|x| {
                dsl.recs
                    .get(x)
                    .is_some_and(|r| r.created_txg > s.created_txg)
            })
            .collect();
        if !newer.is_empty() && !destroy_newer {
            return Err(DsError::Busy(format!(
                "'{snap_name}' is not the most recent snapshot; use -r to destroy the newer ones"
            )));
        }
        for n in &newer {
            if let Some(r) = dsl.recs.get(n).filter(|r| !r.clones.is_empty()) {
                return Err(DsError::Busy(format!(
                    "snapshot '{}' (newer than '{snap_name}') has dependent clones; \
                     destroy or promote them first",
                    r.name
                )));
            }
        }
        let r = (|| {
            for n in newer.into_iter().rev() {
                dsl.destroy_snapshot(cx, n)?;
            }
            let h = dsl.rec(head)?.clone();
            let root = h.root_ptr()?;
            dsl.free_tree(cx, &root, s.created_txg)?;
            dsl.drain_deadlist(cx, h.deadlist, 0, false, None)?;
            let s = dsl.rec(snap)?.clone();
            if let Some(hr) = dsl.recs.get_mut(&head) {
                hr.root = s.root.clone();
                hr.referenced = s.referenced;
                hr.unique = Sums::default();
                hr.dead.clear();
            }
            dsl.live.remove(&head);
            dsl.unlogged.insert(head);
            dsl.dirty_recs.insert(head);
            Ok(())
        })();
        applied(cx, "rollback", r)
    })?;
    pool.sync()?;
    Ok(())
}

/// Creates filesystem `name` from snapshot `snap_name`, sharing its blocks.
pub fn clone(
    pool: &Pool,
    snap_name: &str,
    name: &str,
    props: &BTreeMap<String, String>,
) -> Result<(), DsError> {
    check_fs_name(pool.name(), name)?;
    let mut local = BTreeMap::new();
    for (k, v) in props {
        local.insert(k.clone(), props::validate(k, v)?);
    }
    with(pool, true, true, |dsl, cx| {
        let snap = dsl.id_of(snap_name)?;
        let s = dsl.rec(snap)?.clone();
        if !s.is_snapshot() {
            return Err(DsError::Invalid(format!("'{snap_name}' is not a snapshot")));
        }
        if dsl.names.contains_key(name) {
            return Err(DsError::Exists(format!("dataset '{name}' already exists")));
        }
        let parent = parent_name(name)
            .and_then(|p| dsl.names.get(p).copied())
            .ok_or_else(|| DsError::NotFound(format!("the parent of '{name}' does not exist")))?;
        let mut rec = dsl.new_fs(name, Some(parent), cx.txg());
        rec.root = s.root.clone();
        rec.referenced = s.referenced;
        rec.origin = Some(snap);
        rec.prev_snap = Some(snap);
        rec.prev_snap_txg = s.created_txg;
        rec.props = local;
        let id = rec.id;
        dsl.recs.insert(id, rec);
        if let Some(sr) = dsl.recs.get_mut(&snap) {
            sr.clones.push(id);
        }
        dsl.dirty_recs.insert(snap);
        Ok(())
    })?;
    pool.sync()?;
    Ok(())
}

/// Renames a filesystem (moving it under another parent if the new name
/// says so, with all its descendants and snapshots) or a snapshot.
pub fn rename(pool: &Pool, old: &str, new: &str) -> Result<(), DsError> {
    with(pool, true, false, |dsl, _cx| {
        let id = dsl.id_of(old)?;
        if dsl.names.contains_key(new) {
            return Err(DsError::Exists(format!("dataset '{new}' already exists")));
        }
        let is_snap = dsl.rec(id)?.is_snapshot();
        if is_snap {
            let (ofs, _) = old.split_once('@').unwrap_or((old, ""));
            let Some((nfs, nsnap)) = new.split_once('@') else {
                return Err(DsError::Invalid(format!("'{new}' is not a snapshot name")));
            };
            if nfs != ofs {
                return Err(DsError::Invalid(
                    "a snapshot can only be renamed within its filesystem".into(),
                ));
            }
            check_snap_part(new, nsnap)?;
        } else {
            check_fs_name(&dsl.pool_name, new)?;
            if dsl.rec(id)?.parent.is_none() {
                return Err(DsError::Invalid(
                    "the pool's root dataset cannot be renamed".into(),
                ));
            }
            if new.starts_with(&format!("{old}/")) {
                return Err(DsError::Invalid(format!(
                    "cannot move '{old}' into its own descendant"
                )));
            }
        }
        let new_parent =
            if is_snap {
                None
            } else {
                let p = parent_name(new).unwrap_or("");
                Some(dsl.id_of(p).map_err(|_| {
                    DsError::NotFound(format!("the parent of '{new}' does not exist"))
                })?)
            };
        let renames: Vec<(u64, String)> = dsl
            .recs
            .values()
            .filter_map(|r| {
                if r.name == old {
                    Some((r.id, new.to_string()))
                } else if !is_snap {
                    r.name
                        .strip_prefix(old)
                        .filter(|rest| rest.starts_with('/') || rest.starts_with('@'))
                        .map(|rest| (r.id, format!("{new}{rest}")))
                } else {
                    None
                }
            })
            .collect();
        for (rid, n) in renames {
            if let Some(r) = dsl.recs.get_mut(&rid) {
                dsl.names.remove(&r.name);
                r.name = n.clone();
                dsl.names.insert(n, rid);
                dsl.dirty_recs.insert(rid);
            }
        }
        if let (Some(np), Some(r)) = (new_parent, dsl.recs.get_mut(&id)) {
            r.parent = Some(np);
        }
        Ok(())
    })?;
    pool.sync()?;
    Ok(())
}

/// A handle to run transactions on a dataset or snapshot.
pub fn open(pool: &Arc<Pool>, name: &str) -> Result<DatasetHandle, DsError> {
    let pending = with(pool, false, false, |dsl, _| {
        let id = dsl.id_of(name)?;
        Ok(dsl.pending_snaps.iter().any(|(_, s)| *s == id))
    })?;
    if pending {
        pool.sync()?;
    }
    with(pool, false, false, |dsl, _| {
        let id = dsl.id_of(name)?;
        let r = dsl.rec(id)?;
        Ok(DatasetHandle::new(
            pool.clone(),
            id,
            r.guid,
            r.name.clone(),
            r.is_snapshot(),
        ))
    })
}

/// Every block a dataset's committed tree reaches (its nodes and the data
/// blocks its entries name), for checks and tests. Commits pending work
/// first.
pub fn blocks(pool: &Pool, name: &str) -> Result<Vec<BlockPtr>, DsError> {
    with(pool, false, true, |dsl, cx| {
        let id = dsl.id_of(name)?;
        let root = dsl.rec(id)?.root_ptr()?;
        let out = std::cell::RefCell::new(Vec::new());
        let store = cx.store();
        tarn_tree::walk(
            &store,
            &root,
            0,
            &mut |bp| {
                out.borrow_mut().push(*bp);
                Ok(())
            },
            &mut |_, v| {
                if v.first() == Some(&TAG_BLOCK) {
                    let bp =
                        BlockPtr::decode(&v[1..]).map_err(|e| TreeError::Store(Box::new(e)))?;
                    out.borrow_mut().push(bp);
                }
                Ok(())
            },
        )?;
        Ok(out.into_inner())
    })
}

/// Converts allocated bytes into the user-facing bytes `list` reports
/// (raidz parity and padding taken out), for tools and tests.
pub fn deflated(pool: &Pool, raw: u64) -> Result<u64, DsError> {
    with(pool, false, false, |dsl, _| Ok(dsl.deflate(raw)))
}

const P_CONFIG: u8 = b'C';

fn config_key(kind: &str, name: &str) -> Vec<u8> {
    let mut k = vec![P_CONFIG];
    k.extend_from_slice(kind.as_bytes());
    k.push(0);
    k.extend_from_slice(name.as_bytes());
    k
}

fn check_config_name(kind: &str, name: &str) -> Result<(), DsError> {
    let ok_kind =
        !kind.is_empty() && kind.len() <= 32 && kind.bytes().all(|b| b.is_ascii_lowercase());
    let ok_name = !name.is_empty() && name.len() <= 128 && !name.contains('\0');
    if ok_kind && ok_name {
        Ok(())
    } else {
        Err(DsError::Invalid(format!("invalid {kind} name '{name}'")))
    }
}

/// Stores a small configuration record that belongs to the pool (users,
/// shares: what should move with the disks), durable on return.
pub fn config_put(pool: &Pool, kind: &str, name: &str, value: &[u8]) -> Result<(), DsError> {
    check_config_name(kind, name)?;
    if value.len() > 4096 {
        return Err(DsError::Invalid(format!(
            "{kind} '{name}': record too large"
        )));
    }
    with(pool, true, false, |_, cx| {
        cx.meta_put(&config_key(kind, name), value)?;
        Ok(())
    })?;
    pool.sync()?;
    Ok(())
}

/// Removes a configuration record; false if there was none.
pub fn config_delete(pool: &Pool, kind: &str, name: &str) -> Result<bool, DsError> {
    check_config_name(kind, name)?;
    let had = with(pool, true, false, |_, cx| {
        Ok(cx.meta_delete(&config_key(kind, name))?)
    })?;
    pool.sync()?;
    Ok(had)
}

/// Every configuration record of a kind, by name.
pub fn config_list(pool: &Pool, kind: &str) -> Result<Vec<(String, Vec<u8>)>, DsError> {
    check_config_name(kind, "x")?;
    with(pool, false, false, |_, cx| {
        let lo = config_key(kind, "");
        let hi = prefix_end(&lo);
        let mut out = Vec::new();
        let mut start = Bound::Included(lo);
        loop {
            let page =
                cx.meta_range(start.as_ref().map(Vec::as_slice), Bound::Excluded(&hi), 256)?;
            let Some(last) = page.last().map(|(k, _)| k.clone()) else {
                return Ok(out);
            };
            for (k, v) in page {
                let name = String::from_utf8_lossy(&k[kind.len() + 2..]).into_owned();
                out.push((name, v));
            }
            start = Bound::Excluded(last);
        }
    })
}

/// Names and ids of a filesystem's snapshots, oldest first.
pub(crate) fn snapshot_ids(dsl: &Dsl, head: u64) -> Vec<(String, u64)> {
    dsl.snapshots_of(head)
        .into_iter()
        .filter(|s| !dsl.pending_snaps.iter().any(|(_, p)| p == s))
        .filter_map(|s| dsl.recs.get(&s).map(|r| (r.name.clone(), s)))
        .collect()
}

pub(crate) fn rec_root(dsl: &Dsl, id: u64) -> Result<BlockPtr, DsError> {
    dsl.rec(id)?.root_ptr()
}

pub(crate) fn rec_name(dsl: &Dsl, id: u64) -> Result<String, DsError> {
    Ok(dsl.rec(id)?.name.clone())
}

pub(crate) fn rec_guid(dsl: &Dsl, id: u64) -> Result<u64, DsError> {
    Ok(dsl.rec(id)?.guid)
}
