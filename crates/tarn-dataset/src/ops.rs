//! Operations on datasets: create, snapshot, clone, promote, rollback,
//! rename. Each checks every user error before its first change; a failure
//! after that faults the pool (`applied`).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use tarn_block::BlockPtr;
use tarn_pool::{Cx, Pool, SyncCx};

use crate::crypt::{KeyFormat, KeyInput, KeyRec};
use crate::dsl::{with_dir_excl, Dir};
use crate::props;
use crate::record::{
    check_fs_name, check_snap_part, dead_key, dead_prefix, encode_ptr_hex, new_guid, now_unix,
    parent_name, DatasetKind, DsRec, Sums, VolSpec,
};
use crate::DsError;
use tarn_block::{Cipher, KeySet};

/// Creates filesystem `name` (with `parents`, its missing ancestors too).
pub fn create(
    pool: &Pool,
    name: &str,
    props: &BTreeMap<String, String>,
    parents: bool,
) -> Result<(), DsError> {
    create_with_key(pool, name, props, parents, None)
}

/// [`create`], where `props` may ask for encryption (`encryption`,
/// `keyformat`, `keylocation`) and `key` gives a new encryption root's
/// key. Without `keyformat` the filesystem inherits its parent's key, if
/// any (see `crypt`).
pub fn create_with_key(
    pool: &Pool,
    name: &str,
    props: &BTreeMap<String, String>,
    parents: bool,
    key: Option<&KeyInput>,
) -> Result<(), DsError> {
    check_fs_name(pool.name(), name)?;
    let (local, enc) = split_props(props)?;
    let new_key = enc.new_key(key)?;
    with_dir_excl(pool, |dsl, cx| {
        enc.check(dsl, name)?;
        let id = create_recs(dsl, cx, name, local, parents, None)?;
        enc.apply(dsl, id, new_key);
        Ok(())
    })
}

/// The nearest existing ancestor of the new dataset `name` (with `-p`,
/// its parents may not exist yet).
fn nearest_ancestor(dsl: &Dir, name: &str) -> Option<u64> {
    let mut above = parent_name(name);
    while let Some(p) = above {
        if let Some(id) = dsl.names.get(p) {
            return Some(*id);
        }
        above = parent_name(p);
    }
    None
}

/// What a new dataset's properties ask of encryption.
struct EncProps {
    cipher: Option<Cipher>,
    off: bool,
    format: Option<KeyFormat>,
    location: Option<String>,
}

/// Separates the encryption properties from the others (validated).
fn split_props(
    props: &BTreeMap<String, String>,
) -> Result<(BTreeMap<String, String>, EncProps), DsError> {
    let mut local = BTreeMap::new();
    let mut enc = EncProps {
        cipher: None,
        off: false,
        format: None,
        location: None,
    };
    for (k, v) in props {
        match k.as_str() {
            "encryption" if v == "off" => enc.off = true,
            "encryption" => {
                enc.cipher = Some(Cipher::parse(v).map_err(|e| DsError::Invalid(e.to_string()))?)
            }
            "keyformat" => enc.format = Some(KeyFormat::parse(v)?),
            "keylocation" => {
                crate::crypt::check_keylocation(v)?;
                enc.location = Some(v.clone());
            }
            _ => {
                local.insert(k.clone(), props::validate(k, v)?);
            }
        }
    }
    Ok((local, enc))
}

impl EncProps {
    /// The new encryption root's key, when `keyformat` asks for one (made
    /// here, outside every lock: Argon2id is slow).
    fn new_key(&self, key: Option<&KeyInput>) -> Result<Option<(KeyRec, KeySet)>, DsError> {
        let Some(format) = self.format else {
            if self.location.is_some() {
                return Err(DsError::Invalid(
                    "keylocation needs keyformat: it belongs to a new encryption root".into(),
                ));
            }
            return Ok(None);
        };
        if self.off {
            return Err(DsError::Invalid(
                "keyformat with encryption=off: choose one".into(),
            ));
        }
        let Some(input) = key else {
            return Err(DsError::Invalid(
                "a new encryption root needs its key (a passphrase, or a key file)".into(),
            ));
        };
        if input.format != format {
            return Err(DsError::Invalid(format!(
                "keyformat={} but the key was given as {}",
                format.name(),
                input.format.name()
            )));
        }
        let location = self.location.clone().unwrap_or_else(|| "prompt".into());
        if input.location != location {
            return Err(DsError::Invalid(format!(
                "keylocation={location} but the key came from {}",
                input.location
            )));
        }
        crate::crypt::new_key(self.cipher.unwrap_or_default(), input).map(Some)
    }

    /// Checks what the new dataset `name` would inherit, before any change:
    /// no unencrypted dataset under an encrypted one, no new cipher
    /// without a key of its own, and an inherited key must be loaded.
    fn check(&self, dsl: &Dir, name: &str) -> Result<(), DsError> {
        let parent_key = nearest_key(dsl, name);
        match parent_key {
            Some(kid) => {
                if self.off {
                    return Err(DsError::Invalid(format!(
                        "'{name}' would be unencrypted inside an encrypted dataset; \
                         encryption=off is refused there"
                    )));
                }
                if self.format.is_none() {
                    let theirs = dsl
                        .keys
                        .get(&kid)
                        .map(|k| k.cipher.clone())
                        .unwrap_or_default();
                    if let Some(c) = self.cipher.filter(|c| c.name() != theirs) {
                        return Err(DsError::Invalid(format!(
                            "encryption={} differs from the parent's {theirs}: give '{name}' a \
                             key of its own with -o keyformat=...",
                            c.name()
                        )));
                    }
                }
                if !dsl.unlocked.contains_key(&kid) && self.format.is_none() {
                    return Err(DsError::Locked(format!(
                        "'{name}' would inherit the key of '{}', which is not loaded: run \
                         `tarn key load {}`",
                        dsl.key_root_name(kid),
                        dsl.key_root_name(kid)
                    )));
                }
            }
            None => {
                if self.cipher.is_some() && self.format.is_none() {
                    return Err(DsError::Invalid(format!(
                        "'{name}' would be a new encryption root: give -o keyformat=passphrase \
                         (or raw, hex) and its key"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Gives the new dataset `id` its own key (a new record), or leaves it
    /// the one it inherited.
    fn apply(&self, dsl: &mut Dir, id: u64, new_key: Option<(KeyRec, KeySet)>) {
        if let Some((mut rec, ks)) = new_key {
            rec.id = dsl.alloc_id();
            rec.root = id;
            let kid = dsl.add_key(rec, ks);
            if let Some(r) = dsl.recs.get_mut(&id) {
                r.key = Some(kid);
            }
        }
    }
}

/// The key a new dataset `name` would inherit: that of its nearest
/// existing ancestor.
fn nearest_key(dsl: &Dir, name: &str) -> Option<u64> {
    nearest_ancestor(dsl, name)
        .and_then(|id| dsl.recs.get(&id))
        .and_then(|r| r.key)
}

/// The records of a new filesystem or volume `name` and its missing
/// ancestors, in the open directory: one exclusive operation, so a crash
/// never leaves half of them. Each inherits its parent's key. Returns the
/// new dataset's id.
fn create_recs(
    dsl: &mut crate::dsl::Dir,
    cx: &SyncCx<'_>,
    name: &str,
    local: BTreeMap<String, String>,
    parents: bool,
    volume: Option<VolSpec>,
) -> Result<u64, DsError> {
    let txg = cx.txg();
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
    if let Some(p) = cur {
        may_have_children(dsl, p)?;
    }
    // A reservation takes room from every other dataset: only what the
    // nearest existing ancestor may still write.
    let want = local.get("reservation").and_then(|r| r.parse::<u64>().ok());
    if let (Some(want), Some(&a)) = (want, cur.and_then(|p| dsl.names.get(p))) {
        let avail = dsl.available(cx, a);
        if want > avail {
            let hint = if volume.is_some() {
                " (create it sparse with -s, or make room)"
            } else {
                ""
            };
            return Err(DsError::NoSpace(format!(
                "cannot reserve {} for '{name}': {} available{hint}",
                props::human_bytes(want),
                props::human_bytes(avail)
            )));
        }
    }
    crate::stored::check_props_size(name, &local)?;
    let key = nearest_key(dsl, name);
    let mut last = 0;
    for n in missing
        .iter()
        .rev()
        .chain(std::iter::once(&name.to_string()))
    {
        let parent = parent_name(n).and_then(|p| dsl.names.get(p).copied());
        let mut rec = dsl.new_fs(n, parent, txg);
        rec.key = key;
        if n == name {
            rec.props = local.clone();
            if volume.is_some() {
                rec.kind = DatasetKind::Volume;
                rec.volume = volume;
            }
        }
        last = rec.id;
        dsl.recs.insert(rec.id, rec);
    }
    Ok(last)
}

/// Refuses a dataset under `parent` when `parent` is a volume: a volume is
/// a block device, it has no directory to hold children.
/// Refuses a new child under `parent` (created, cloned, renamed or
/// received there) when `parent` cannot have one: a volume never; a
/// dataset being received not until the stream is complete, because a
/// receive that fails destroys a dataset it created, which a child would
/// prevent.
fn may_have_children(dsl: &crate::dsl::Dir, parent: &str) -> Result<(), DsError> {
    let Some(r) = dsl.names.get(parent).and_then(|id| dsl.recs.get(id)) else {
        return Ok(());
    };
    if r.kind == DatasetKind::Volume {
        return Err(DsError::Invalid(format!(
            "'{parent}' is a volume: volumes cannot have children"
        )));
    }
    not_being_received(r)
}

/// Busy while a stream is being received into `r`: until it is complete
/// the dataset is not there for anything but the receive (it cannot be
/// opened; see `txn`), so nothing may be made under it either. A
/// snapshot or child made meanwhile would hold half a stream, and would
/// stop a failed receive from destroying the dataset it created.
pub(crate) fn not_being_received(r: &DsRec) -> Result<(), DsError> {
    if r.recv.is_some() {
        return Err(DsError::Busy(format!(
            "'{}' is being received: it can be used once the stream is complete \
             (or the receive is abandoned with receive -A)",
            r.name
        )));
    }
    Ok(())
}

/// Checks a volume's geometry: a block size that is a power of two from
/// 512 bytes to 1 MiB, and a size that is a non-zero multiple of it.
pub fn check_volspec(spec: VolSpec) -> Result<(), DsError> {
    if !spec.block.is_power_of_two() || !(512..=1 << 20).contains(&spec.block) {
        return Err(DsError::Invalid(format!(
            "volblocksize {} is not a power of two from 512 bytes to 1M",
            spec.block
        )));
    }
    if spec.size == 0 || !spec.size.is_multiple_of(spec.block as u64) {
        return Err(DsError::Invalid(format!(
            "volsize {} is not a non-zero multiple of volblocksize {}",
            spec.size, spec.block
        )));
    }
    Ok(())
}

/// Creates volume `name` (with `parents`, its missing ancestor filesystems
/// too) of geometry `spec`. Unless `sparse` (or `props` sets one), the
/// volume gets a local `reservation` of what filling it costs (see
/// `thick_reservation` in the accounting), checked against the room the
/// pool has, so a guest can fill its disk: ZFS's thick provisioning.
pub fn create_volume(
    pool: &Pool,
    name: &str,
    spec: VolSpec,
    sparse: bool,
    props: &BTreeMap<String, String>,
    parents: bool,
) -> Result<(), DsError> {
    create_volume_with_key(pool, name, spec, sparse, props, parents, None)
}

/// [`create_volume`] with encryption, as [`create_with_key`].
pub fn create_volume_with_key(
    pool: &Pool,
    name: &str,
    spec: VolSpec,
    sparse: bool,
    props: &BTreeMap<String, String>,
    parents: bool,
    key: Option<&KeyInput>,
) -> Result<(), DsError> {
    check_volspec(spec)?;
    check_fs_name(pool.name(), name)?;
    let (mut local, enc) = split_props(props)?;
    let new_key = enc.new_key(key)?;
    with_dir_excl(pool, |dsl, cx| {
        enc.check(dsl, name)?;
        // A thick volume reserves what filling it costs, with the copies
        // it inherits from its nearest ancestor; `create_recs` checks that
        // the reservation fits.
        if !sparse && !local.contains_key("reservation") {
            let copies = match local.get("copies") {
                Some(c) => c.parse().unwrap_or(1),
                None => nearest_ancestor(dsl, name)
                    .and_then(|a| dsl.prop_u64(a, "copies"))
                    .unwrap_or(1) as u8,
            };
            let r = dsl.thick_reservation(cx, spec, copies);
            local.insert("reservation".into(), r.to_string());
        }
        let id = create_recs(dsl, cx, name, local, parents, Some(spec))?;
        enc.apply(dsl, id, new_key);
        Ok(())
    })
}

/// Sets the size of the volume with id `id` from `expected` to `size`
/// bytes, as one exclusive operation by id (a rename cannot redirect it);
/// fails without changing anything if the size is no longer `expected`
/// (changed under the caller). Only the record changes: the volume layer
/// deletes every key past the smaller of the two sizes first. A
/// reservation that is what the old size needed follows the new size,
/// if the pool has room for the difference.
pub(crate) fn set_volsize(pool: &Pool, id: u64, expected: u64, size: u64) -> Result<(), DsError> {
    with_dir_excl(pool, |dsl, cx| {
        let r = dsl.rec(id)?;
        let name = r.name.clone();
        let (Some(old), DatasetKind::Volume) = (r.volume, r.kind) else {
            return Err(DsError::Invalid(format!("'{name}' is not a volume")));
        };
        if old.size != expected {
            return Err(DsError::Busy(format!(
                "the size of '{name}' changed while it was being resized; try again"
            )));
        }
        let new = VolSpec { size, ..old };
        check_volspec(new)?;
        let copies = dsl.prop_u64(id, "copies").unwrap_or(1) as u8;
        let (thick_old, thick_new) = (
            dsl.thick_reservation(cx, old, copies),
            dsl.thick_reservation(cx, new, copies),
        );
        let follows = dsl.prop_u64(id, "reservation") == Some(thick_old);
        if follows && thick_new > thick_old {
            let room = dsl
                .available(cx, id)
                .saturating_sub(dsl.unused_reservation(id));
            if thick_new - thick_old > room {
                return Err(DsError::NoSpace(format!(
                    "growing '{name}' to {} needs {} more reserved; {} available",
                    props::human_bytes(size),
                    props::human_bytes(thick_new - thick_old),
                    props::human_bytes(room)
                )));
            }
        }
        let r = dsl
            .recs
            .get_mut(&id)
            .ok_or_else(|| DsError::NotFound(name.clone()))?;
        r.volume = Some(new);
        if follows {
            r.props.insert("reservation".into(), thick_new.to_string());
        }
        dsl.dirty_recs.insert(id);
        Ok(())
    })
}

/// Takes snapshots (`fs@name`), all in one txg; with `recursive`, of every
/// descendant filesystem too, under the same snapshot name.
pub fn snapshot(pool: &Pool, names: &[String], recursive: bool) -> Result<(), DsError> {
    with_dir_excl(pool, |dsl, cx| {
        let mut todo: Vec<(u64, String)> = Vec::new();
        let mut skipped = None;
        for full in names {
            let Some((fs, snap)) = full.split_once('@') else {
                return Err(DsError::Invalid(format!(
                    "'{full}' is not a snapshot name (fs@name)"
                )));
            };
            check_snap_part(full, snap)?;
            let id = dsl.id_of(fs)?;
            let rec = dsl.rec(id)?;
            if rec.is_snapshot() {
                return Err(DsError::Invalid(format!("'{fs}' is a snapshot")));
            }
            // A recursive snapshot skips a dataset being received, the
            // top one too (a backup target's nightly schedule).
            match (not_being_received(rec), recursive) {
                (Ok(()), _) => todo.push((id, full.clone())),
                (Err(e), true) => {
                    skipped.get_or_insert(e);
                }
                (Err(e), false) => return Err(e),
            }
            if recursive {
                // A descendant being received is skipped: it is not there
                // yet (its snapshots come with its streams), and a nightly
                // snapshot of the tree must not fail for it.
                let prefix = format!("{fs}/");
                for r in dsl.recs.values() {
                    if !r.is_snapshot() && r.recv.is_none() && r.name.starts_with(&prefix) {
                        todo.push((r.id, format!("{}@{snap}", r.name)));
                    }
                }
            }
        }
        // Everything asked for was skipped: say why rather than report a
        // snapshot that was not taken.
        if todo.is_empty() {
            if let Some(e) = skipped {
                return Err(e);
            }
        }
        let mut seen = BTreeSet::new();
        for (_, n) in &todo {
            if dsl.names.contains_key(n) || !seen.insert(n.clone()) {
                return Err(DsError::Exists(format!("snapshot '{n}' already exists")));
            }
        }
        // One snapshot of a dataset per txg: two would be the same tree
        // (a snapshot is what the txg commits) at one place in the chain,
        // which the chain's order (by txg) cannot tell apart.
        let mut heads: BTreeMap<u64, &str> = BTreeMap::new();
        for (head, n) in &todo {
            if let Some(other) = heads.insert(*head, n) {
                return Err(DsError::Invalid(format!(
                    "'{other}' and '{n}' are two snapshots of one dataset in one command: \
                     take them one after the other"
                )));
            }
        }
        let txg = cx.txg();
        for (head, n) in todo {
            dsl.new_snapshot(head, n, txg, None)?;
        }
        Ok(())
    })
}

impl Dir {
    /// The record of a new snapshot `name` of `head`, taken by the sync of
    /// `txg` (which gives it the tree as committed then). `from_stream`:
    /// a received snapshot keeps the guid and time the stream gives it.
    pub(crate) fn new_snapshot(
        &mut self,
        head: u64,
        name: String,
        txg: u64,
        from_stream: Option<(u64, u64)>,
    ) -> Result<u64, DsError> {
        let id = self.alloc_id();
        let h = self.rec(head)?.clone();
        let (guid, created_unix) = from_stream.unwrap_or((new_guid(id), now_unix()));
        self.names.insert(name.clone(), id);
        self.recs.insert(
            id,
            DsRec {
                id,
                guid,
                name,
                kind: DatasetKind::Snapshot,
                parent: None,
                head: Some(head),
                root: encode_ptr_hex(&BlockPtr::default()),
                created_txg: txg,
                created_unix,
                prev_snap: h.prev_snap,
                prev_snap_txg: h.prev_snap_txg,
                origin: None,
                clones: Vec::new(),
                props: BTreeMap::new(),
                referenced: Sums::default(),
                unique: Sums::default(),
                deadlist: 0,
                dead: BTreeMap::new(),
                volume: h.volume,
                key: h.key,
                recv: None,
                holds: Default::default(),
            },
        );
        self.pending_snaps.push((head, id));
        self.dirty_recs.insert(id);
        Ok(id)
    }
}

/// Passes on the result of the changing part of an operation; an error
/// there (I/O, damage) leaves changes behind that must not commit, so the
/// pool faults.
pub(crate) fn applied<R>(
    cx: &mut SyncCx<'_>,
    what: &str,
    r: Result<R, DsError>,
) -> Result<R, DsError> {
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
    with_dir_excl(pool, |dsl, cx| {
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
        // A receive's base must stay where the receive finds it.
        not_being_received(&crec)?;
        not_being_received(dsl.rec(h)?)?;
        let hname = dsl.rec(h)?.name.clone();
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
        // Read first: each deadlist entry of the chain born before the
        // origin, and the sums of the buckets it goes to.
        let below = orec.created_txg;
        let mut plans: Vec<DeadMove> = Vec::with_capacity(chain.len());
        for m in chain {
            let dl = dsl.rec(m)?.deadlist;
            let lo = dead_prefix(dl, None);
            let hi = dead_prefix(dl, Some(below));
            let mut moved: Vec<(Vec<u8>, BlockPtr, u64)> = Vec::new();
            let mut sums: BTreeMap<u64, Sums> = BTreeMap::new();
            let mut start = Bound::Included(lo);
            loop {
                let page =
                    cx.meta_range(start.as_ref().map(Vec::as_slice), Bound::Excluded(&hi), 512)?;
                let Some(last) = page.last().map(|(k, _)| k.clone()) else {
                    break;
                };
                for (k, v) in page {
                    let bp = BlockPtr::decode(&v)?;
                    let bucket = crate::deadlist::bucket_of(&new_bounds, bp.birth);
                    sums.entry(bucket).or_default().add(Sums::of(&bp));
                    moved.push((k, bp, bucket));
                }
                start = Bound::Excluded(last);
            }
            plans.push(DeadMove {
                id: m,
                dl,
                moved,
                sums,
            });
        }
        let shape = PromoteShape {
            clone: c,
            head: h,
            origin,
            grand,
            below,
            moving: moving.clone(),
        };
        check_promote_quota(dsl, &shape, &plans, name)?;
        let r = (|| -> Result<(), DsError> {
            for p in &plans {
                for (k, bp, bucket) in &p.moved {
                    cx.meta_delete(k)?;
                    cx.meta_put(&dead_key(p.dl, *bucket, bp), &bp.encode())?;
                }
                dsl.dirty_recs.insert(p.id);
            }
            shape.apply(&mut dsl.recs, &plans);
            for (s, new) in renames {
                if let Some(r) = dsl.recs.get_mut(&s) {
                    dsl.names.remove(&r.name);
                    r.name = new.clone();
                    dsl.names.insert(new, s);
                }
                dsl.dirty_recs.insert(s);
            }
            if let Some(g) = grand {
                dsl.dirty_recs.insert(g);
            }
            dsl.dirty_recs.insert(c);
            dsl.dirty_recs.insert(h);
            let _ = hname;
            Ok(())
        })();
        applied(cx, "promote", r)
    })
}

/// One deadlist of a promoted clone's chain: its entries born before the
/// origin, each with the bucket it moves to, and those buckets' sums.
struct DeadMove {
    id: u64,
    dl: u64,
    moved: Vec<(Vec<u8>, BlockPtr, u64)>,
    sums: BTreeMap<u64, Sums>,
}

/// Who a promote moves what between: the clone, the origin's filesystem,
/// the origin snapshot, that filesystem's own origin, and the snapshots
/// that change hands (the origin and every older one).
struct PromoteShape {
    clone: u64,
    head: u64,
    origin: u64,
    grand: Option<u64>,
    below: u64,
    moving: Vec<u64>,
}

impl PromoteShape {
    /// The records' side of a promote (not the names, not the deadlist
    /// entries): done to the directory's records, and to a copy of them
    /// to see the space figures after it before anything changes.
    fn apply(&self, recs: &mut BTreeMap<u64, DsRec>, plans: &[DeadMove]) {
        for p in plans {
            if let Some(r) = recs.get_mut(&p.id) {
                r.dead.retain(|b, _| *b >= self.below);
                for (b, s) in &p.sums {
                    r.dead.entry(*b).or_default().add(*s);
                }
            }
        }
        for s in &self.moving {
            if let Some(r) = recs.get_mut(s) {
                r.head = Some(self.clone);
            }
        }
        if let Some(r) = recs.get_mut(&self.origin) {
            r.clones.retain(|x| *x != self.clone);
            r.clones.push(self.head);
        }
        if let Some(g) = self.grand {
            if let Some(r) = recs.get_mut(&g) {
                r.clones.retain(|x| *x != self.head);
                r.clones.push(self.clone);
            }
        }
        if let Some(r) = recs.get_mut(&self.clone) {
            r.origin = self.grand;
        }
        if let Some(r) = recs.get_mut(&self.head) {
            r.origin = Some(self.origin);
        }
    }
}

/// Refuses a promote that would take a dataset past its quota: the
/// clone takes over the origin's snapshots and the space only they hold,
/// which its own ancestors (those not above the origin's filesystem too)
/// count from then on, as ZFS refuses. A quota already exceeded refuses
/// only a promote that adds to it.
fn check_promote_quota(
    dsl: &mut Dir,
    shape: &PromoteShape,
    plans: &[DeadMove],
    name: &str,
) -> Result<(), DsError> {
    let shared = dsl.ancestors_and_self(shape.head);
    let gaining: Vec<u64> = dsl
        .ancestors_and_self(shape.clone)
        .into_iter()
        .filter(|a| !shared.contains(a))
        .filter(|a| dsl.prop_u64(*a, "quota").is_some())
        .collect();
    if gaining.is_empty() {
        return Ok(());
    }
    let figures = |dsl: &Dir| -> Vec<u64> {
        gaining
            .iter()
            .map(|a| dsl.user_used(*a))
            .collect::<Vec<u64>>()
    };
    let before = figures(dsl);
    // The directory is held exclusively and its kept figures are off
    // while it is (`DirGuard`): the copy's figures are computed, not kept.
    let mut after_recs = dsl.recs.clone();
    shape.apply(&mut after_recs, plans);
    std::mem::swap(&mut dsl.recs, &mut after_recs);
    let after = figures(dsl);
    std::mem::swap(&mut dsl.recs, &mut after_recs);
    for ((a, was), now) in gaining.iter().zip(before).zip(after) {
        let Some(q) = dsl.prop_u64(*a, "quota") else {
            continue;
        };
        if now > q && now > was {
            let an = dsl.rec(*a)?.name.clone();
            return Err(DsError::Quota(format!(
                "promoting '{name}' would take '{an}' past its quota of {} ({} used after it): \
                 the clone takes over the origin's older snapshots and the space they hold",
                props::human_bytes(q),
                props::human_bytes(now)
            )));
        }
    }
    Ok(())
}

/// Returns filesystem `fs` to snapshot `fs@snap`. Newer snapshots must be
/// destroyed first (`destroy_newer` does it).
pub fn rollback(pool: &Pool, snap_name: &str, destroy_newer: bool) -> Result<(), DsError> {
    with_dir_excl(pool, |dsl, cx| {
        not_received_into(dsl, snap_name)?;
        rollback_in(dsl, cx, snap_name, destroy_newer)
    })
}

/// Busy when the filesystem of snapshot `snap_name` is being received:
/// a rollback under a receive would throw away part of the stream while
/// the rest still arrives, and the snapshot it ends with would not hold
/// what its sender's does (`receive -A` abandons a receive).
fn not_received_into(dsl: &Dir, snap_name: &str) -> Result<(), DsError> {
    let snap = dsl.id_of(snap_name)?;
    match dsl.rec(snap)?.head {
        Some(head) => not_being_received(dsl.rec(head)?),
        None => Ok(()),
    }
}

/// The refusal [`rollback`] would give, if any, changing nothing: what
/// the daemon asks before it takes the dataset's mounts and volume down
/// for a rollback (a refused one must not disconnect their clients).
pub fn check_rollback(pool: &Pool, snap_name: &str, destroy_newer: bool) -> Result<(), DsError> {
    crate::dsl::with_dsl(pool, false, |dsl, cx| {
        let dir = dsl.dir();
        not_received_into(&dir, snap_name)?;
        rollback_plan(&dir, cx, snap_name, destroy_newer).map(|_| ())
    })
}

/// Every check of a rollback to `snap_name`: (the snapshot, its dataset,
/// the newer snapshots it destroys).
fn rollback_plan(
    dsl: &Dir,
    cx: &Cx<'_>,
    snap_name: &str,
    destroy_newer: bool,
) -> Result<(u64, u64, Vec<u64>), DsError> {
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
        dsl.rec(*n)?.check_not_held()?;
        if let Some(r) = dsl.recs.get(n).filter(|r| !r.clones.is_empty()) {
            return Err(DsError::Busy(format!(
                "snapshot '{}' (newer than '{snap_name}') has dependent clones; \
                 destroy or promote them first",
                r.name
            )));
        }
    }
    // A volume rolled back to a larger size takes back the reservation
    // that followed its size: only if the pool and the quotas above it can
    // give it, as when it grows (`set_volsize`).
    if let (Some(now), Some(then)) = (dsl.rec(head)?.volume, s.volume) {
        let copies = dsl.prop_u64(head, "copies").unwrap_or(1) as u8;
        let (old, new) = (
            dsl.thick_reservation(cx, now, copies),
            dsl.thick_reservation(cx, then, copies),
        );
        if dsl.prop_u64(head, "reservation") == Some(old) && new > old {
            let room = dsl
                .available(cx, head)
                .saturating_sub(dsl.unused_reservation(head));
            if new - old > room {
                return Err(DsError::NoSpace(format!(
                    "rolling back to '{snap_name}' gives the volume back its size of {}, whose \
                     reservation needs {} more; {} available (lower its reservation first, or \
                     make room)",
                    props::human_bytes(then.size),
                    props::human_bytes(new - old),
                    props::human_bytes(room)
                )));
            }
        }
    }
    Ok((snap, head, newer))
}

/// [`rollback`] inside an exclusive operation.
pub(crate) fn rollback_in(
    dsl: &mut Dir,
    cx: &mut SyncCx<'_>,
    snap_name: &str,
    destroy_newer: bool,
) -> Result<(), DsError> {
    {
        let (snap, head, newer) = rollback_plan(dsl, cx, snap_name, destroy_newer)?;
        let s = dsl.rec(snap)?.clone();
        let r = (|| {
            for n in newer.into_iter().rev() {
                dsl.destroy_snapshot(cx, n)?;
            }
            let h = dsl.rec(head)?.clone();
            let root = h.root_ptr()?;
            dsl.free_tree(cx, &root, s.created_txg)?;
            dsl.drain_deadlist(cx, h.deadlist, 0, false, None)?;
            // The intent log parked for the state thrown away goes with it.
            crate::zil::drop_parked(dsl, cx, head)?;
            let s = dsl.rec(snap)?.clone();
            // A volume gets the snapshot's size back, and a reservation
            // that followed the size follows it back.
            let follow = match (h.volume, s.volume) {
                (Some(now), Some(then)) if now != then => {
                    let copies = dsl.prop_u64(head, "copies").unwrap_or(1) as u8;
                    let thick = |v| dsl.thick_reservation(cx, v, copies);
                    (dsl.prop_u64(head, "reservation") == Some(thick(now))).then(|| thick(then))
                }
                _ => None,
            };
            if let Some(hr) = dsl.recs.get_mut(&head) {
                hr.root = s.root.clone();
                if hr.volume.is_some() {
                    hr.volume = s.volume;
                }
                if let Some(r) = follow {
                    hr.props.insert("reservation".into(), r.to_string());
                }
                hr.referenced = s.referenced;
                hr.unique = Sums::default();
                hr.dead.clear();
            }
            dsl.forgotten.push(head);
            dsl.dirty_recs.insert(head);
            Ok(())
        })();
        applied(cx, "rollback", r)
    }
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
        if props::ENCRYPTION.contains(&k.as_str()) {
            return Err(DsError::Invalid(format!(
                "a clone keeps its origin's encryption and key: '{k}' cannot be given"
            )));
        }
        local.insert(k.clone(), props::validate(k, v)?);
    }
    with_dir_excl(pool, |dsl, cx| {
        let snap = dsl.id_of(snap_name)?;
        let s = dsl.rec(snap)?.clone();
        if !s.is_snapshot() {
            return Err(DsError::Invalid(format!("'{snap_name}' is not a snapshot")));
        }
        if s.key.is_none() && nearest_key(dsl, name).is_some() {
            return Err(DsError::Invalid(format!(
                "'{snap_name}' is not encrypted: its clone cannot live inside an encrypted \
                 dataset"
            )));
        }
        if dsl.names.contains_key(name) {
            return Err(DsError::Exists(format!("dataset '{name}' already exists")));
        }
        let parent = parent_name(name)
            .and_then(|p| dsl.names.get(p).copied())
            .ok_or_else(|| DsError::NotFound(format!("the parent of '{name}' does not exist")))?;
        may_have_children(dsl, parent_name(name).unwrap_or_default())?;
        // A reservation takes room from every other dataset: only what the
        // parent may still write (as `create` checks).
        if let Some(want) = local.get("reservation").and_then(|r| r.parse::<u64>().ok()) {
            let avail = dsl.available(cx, parent);
            if want > avail {
                return Err(DsError::NoSpace(format!(
                    "cannot reserve {} for '{name}': {} available",
                    props::human_bytes(want),
                    props::human_bytes(avail)
                )));
            }
        }
        // Sizes checked before `new_fs`, which takes the name: the origin
        // gains a clone id (counted at its longest) in its list.
        crate::stored::check_props_size(name, &local)?;
        let mut sr = s.clone();
        sr.clones.push(u64::MAX);
        crate::stored::check_record_size(&sr)?;
        let mut rec = dsl.new_fs(name, Some(parent), cx.txg());
        if s.volume.is_some() {
            rec.kind = DatasetKind::Volume;
            rec.volume = s.volume;
        }
        rec.root = s.root.clone();
        rec.referenced = s.referenced;
        rec.origin = Some(snap);
        rec.prev_snap = Some(snap);
        rec.prev_snap_txg = s.created_txg;
        rec.props = local;
        // It shares the origin's blocks, so it shares their key.
        rec.key = s.key;
        let id = rec.id;
        dsl.recs.insert(id, rec);
        if let Some(sr) = dsl.recs.get_mut(&snap) {
            sr.clones.push(id);
        }
        dsl.dirty_recs.insert(snap);
        Ok(())
    })
}

/// Refuses a move that would change what a dataset's encryption means:
/// a dataset that inherits its key stays inside its encryption root, and
/// an unencrypted dataset never moves inside an encrypted one.
fn check_rename_keys(dsl: &Dir, id: u64, old: &str, new: &str) -> Result<(), DsError> {
    let key = dsl.rec(id)?.key;
    match key {
        Some(kid) => {
            let root = dsl.keys.get(&kid).map(|k| k.root);
            if root != Some(id) {
                let rname = dsl.key_root_name(kid);
                let inside = |n: &str| n.starts_with(&format!("{rname}/"));
                if inside(old) && !inside(new) {
                    return Err(DsError::Invalid(format!(
                        "'{old}' inherits its key from '{rname}': it cannot move out of it"
                    )));
                }
            }
        }
        None => {
            if nearest_key(dsl, new).is_some() {
                return Err(DsError::Invalid(format!(
                    "'{old}' is not encrypted: it cannot move inside an encrypted dataset"
                )));
            }
        }
    }
    Ok(())
}

/// Renames a filesystem (moving it under another parent if the new name
/// says so, with all its descendants and snapshots) or a snapshot.
pub fn rename(pool: &Pool, old: &str, new: &str) -> Result<(), DsError> {
    with_dir_excl(pool, |dsl, _cx| {
        let (id, new_parent, renames) = rename_plan(dsl, old, new)?;
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
    })
}

/// The refusal [`rename`] would give, if any, changing nothing (see
/// [`check_rollback`]).
pub fn check_rename(pool: &Pool, old: &str, new: &str) -> Result<(), DsError> {
    crate::dsl::with_dsl(pool, false, |dsl, _| {
        rename_plan(&dsl.dir(), old, new).map(|_| ())
    })
}

/// What renames the members of a rename's plan: the dataset, its new
/// parent (a filesystem's), and every record's new name.
type RenamePlan = (u64, Option<u64>, Vec<(u64, String)>);

/// Every check of renaming `old` to `new`, and what it renames.
fn rename_plan(dsl: &Dir, old: &str, new: &str) -> Result<RenamePlan, DsError> {
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
    let new_parent = if is_snap {
        None
    } else {
        let p = parent_name(new).unwrap_or("");
        may_have_children(dsl, p)?;
        Some(
            dsl.id_of(p)
                .map_err(|_| DsError::NotFound(format!("the parent of '{new}' does not exist")))?,
        )
    };
    if !is_snap {
        check_rename_keys(dsl, id, old, new)?;
        if let Some(np) = new_parent {
            dsl.check_move_quota(id, np)?;
        }
    }
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
    // A longer name makes every renamed record longer.
    if new.len() > old.len() {
        for (rid, name) in &renames {
            let mut r = dsl.rec(*rid)?.clone();
            r.name.clone_from(name);
            crate::stored::check_record_size(&r)?;
        }
    }
    Ok((id, new_parent, renames))
}

/// Puts a hold with `tag` on each snapshot (with `recursive`, on the
/// snapshot of that name of every filesystem below too): a held snapshot
/// cannot be destroyed until every hold on it is released.
pub fn hold(pool: &Pool, tag: &str, snaps: &[String], recursive: bool) -> Result<(), DsError> {
    check_hold_tag(tag)?;
    with_dir_excl(pool, |dsl, _cx| {
        let ids = holds_targets(dsl, snaps, recursive)?;
        for id in &ids {
            if dsl.rec(*id)?.holds.contains(tag) {
                return Err(DsError::Exists(format!(
                    "snapshot '{}' already has a hold '{tag}'",
                    dsl.rec(*id)?.name
                )));
            }
            let mut held = dsl.rec(*id)?.clone();
            held.holds.insert(tag.to_string());
            crate::stored::check_record_size(&held)?;
        }
        for id in ids {
            if let Some(r) = dsl.recs.get_mut(&id) {
                r.holds.insert(tag.to_string());
            }
            dsl.dirty_recs.insert(id);
        }
        Ok(())
    })
}

/// Releases the hold `tag` from each snapshot (and, `recursive`, from the
/// snapshots of that name below).
pub fn release(pool: &Pool, tag: &str, snaps: &[String], recursive: bool) -> Result<(), DsError> {
    with_dir_excl(pool, |dsl, _cx| {
        let ids = holds_targets(dsl, snaps, recursive)?;
        for id in &ids {
            if !dsl.rec(*id)?.holds.contains(tag) {
                return Err(DsError::NotFound(format!(
                    "snapshot '{}' has no hold '{tag}'",
                    dsl.rec(*id)?.name
                )));
            }
        }
        for id in ids {
            if let Some(r) = dsl.recs.get_mut(&id) {
                r.holds.remove(tag);
            }
            dsl.dirty_recs.insert(id);
        }
        Ok(())
    })
}

/// The holds on each snapshot: (snapshot, tag), sorted.
pub fn holds(
    pool: &Pool,
    snaps: &[String],
    recursive: bool,
) -> Result<Vec<(String, String)>, DsError> {
    crate::dsl::with_dir(pool, |dsl, _| {
        let mut out = Vec::new();
        for id in holds_targets(dsl, snaps, recursive)? {
            let r = dsl.rec(id)?;
            out.extend(r.holds.iter().map(|t| (r.name.clone(), t.clone())));
        }
        out.sort();
        Ok(out)
    })
}

fn check_hold_tag(tag: &str) -> Result<(), DsError> {
    if tag.is_empty() || tag.len() > 128 || tag.chars().any(|c| c.is_control()) {
        return Err(DsError::Invalid(format!(
            "hold tag '{tag}': 1 to 128 characters, no control characters"
        )));
    }
    Ok(())
}

/// The snapshots `snaps` name (and with `recursive`, those of the same
/// name below each one's filesystem).
fn holds_targets(dsl: &Dir, snaps: &[String], recursive: bool) -> Result<Vec<u64>, DsError> {
    let mut ids = Vec::new();
    for full in snaps {
        let id = dsl.id_of(full)?;
        if !dsl.rec(id)?.is_snapshot() {
            return Err(DsError::Invalid(format!("'{full}' is not a snapshot")));
        }
        ids.push(id);
        if recursive {
            let (fs, snap) = full.split_once('@').unwrap_or((full, ""));
            let prefix = format!("{fs}/");
            for r in dsl.recs.values() {
                if r.is_snapshot()
                    && r.name.starts_with(&prefix)
                    && r.name.rsplit_once('@').map(|(_, s)| s) == Some(snap)
                {
                    ids.push(r.id);
                }
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}
