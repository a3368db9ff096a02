//! The dataset side of receive: a stream's entries applied to a dataset,
//! then a snapshot with the sender's guid taken of the result.
//!
//! # Theory
//!
//! **Where a stream lands.** A full stream creates a new dataset; an
//! incremental stream applies to an existing one whose newest snapshot is
//! the stream's base (found by guid) and which has not changed since (or
//! is rolled back to it, with `force`). While the entries arrive the
//! dataset's record carries a *receive state* (what stream, how far): the
//! dataset is not mounted or shared then, and nothing else writes it.
//! [`Receiver::finish`] snapshots it, with the guid and time the stream
//! gives, and clears the state, in one exclusive operation: a later
//! incremental stream finds its base by that guid.
//!
//! **Entries** are applied in transactions of many at a time, like any
//! write (quotas hold, `readonly` does not). A raw stream's transactions
//! need no key: sealed values are stored as they are, and blocks exactly
//! as the sender stored them (compressed, sealed), written at once and
//! added to the tree by the sync as they are.
//!
//! **Resuming.** A resumable receive (`-s`) keeps its state when the stream
//! breaks off; the state's resume point is the last key whose transaction
//! has committed, never one ahead of what is on disk, so a stream resumed
//! after it (`send -t`) applies nothing twice that matters (an entry
//! applied again sets the same value). Without `-s` a broken receive is
//! undone: a new dataset is destroyed, an existing one rolled back to the
//! stream's base.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tarn_pool::{Pool, SyncCx};

use crate::crypt::KeyRec;
use crate::dsl::{with_dsl, with_excl, Dir};
use crate::record::{check_fs_name, hex, now_unix, parent_name, DatasetKind};
use crate::send::{BlockPayload, SendInfo, SendItem};
use crate::txn::Mode;
use crate::DsError;

/// A receive in progress, as the dataset's record keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecvState {
    /// The guid of the snapshot being received.
    pub to_guid: u64,
    /// Its short name.
    pub to_name: String,
    /// Incremental streams: the guid of their base.
    #[serde(default)]
    pub from_guid: Option<u64>,
    /// A raw stream.
    pub raw: bool,
    /// Kept when the stream breaks off (`receive -s`).
    pub resumable: bool,
    /// The last key whose transaction committed, lowercase hex (resume
    /// after it); absent before the first.
    #[serde(default)]
    pub after: Option<String>,
    /// The sending dataset's name, for people.
    pub source: String,
}

/// How to receive.
#[derive(Clone, Copy, Debug, Default)]
pub struct RecvOptions<'a> {
    /// Roll the target back to the stream's base (destroying newer
    /// snapshots) when it changed since.
    pub force: bool,
    /// Keep what was received when the stream breaks off, to resume.
    pub resumable: bool,
    /// Properties a stream carries that are not set on a dataset it
    /// creates (`receive -x`): `mountpoint` names a folder on the sender.
    pub exclude: &'a [String],
    /// When given, the only properties a stream may set (what a sender
    /// that is not trusted with the machine may choose).
    pub allow: Option<&'a [String]>,
    /// Keep the key wrapping an existing encryption root has when a raw
    /// stream carries another: the receiver cannot tell whether the new
    /// one opens the same key (it has no key), and the old one is the
    /// only copy of it here. Set for senders that are not trusted with
    /// the machine.
    pub keep_wrapping: bool,
}

/// A receive in progress (see the module docs).
pub struct Receiver {
    pool: Arc<Pool>,
    id: u64,
    mode: Mode,
    info: SendInfo,
    /// Keys applied, with the txg of their transaction.
    pending: VecDeque<(u64, Vec<u8>)>,
    /// The resume point a resumed stream starts after.
    resume_after: Option<Vec<u8>>,
    resumable: bool,
    /// [`RecvOptions::keep_wrapping`].
    keep_wrapping: bool,
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Receiver {
    /// Prepares dataset `name` to receive the stream `info` describes
    /// (see the module docs). A dataset with a resumable receive of the
    /// same stream resumes it: [`Receiver::resume_after`] says after which
    /// key the stream must start.
    pub fn begin(
        pool: &Arc<Pool>,
        name: &str,
        info: &SendInfo,
        opts: RecvOptions<'_>,
    ) -> Result<Receiver, DsError> {
        check_fs_name(pool.name(), name)?;
        crate::record::check_snap_part(&format!("{name}@{}", info.name), &info.name)?;
        // The source's name is only reported, but it is kept in the
        // record until the receive ends: a name no dataset can have would
        // make the record too large to store, which fails the sync.
        if info.dataset.len() > 255 || info.dataset.chars().any(char::is_control) {
            return Err(DsError::Invalid(format!(
                "the stream's source dataset name ({} bytes) is not one a dataset can have",
                info.dataset.len()
            )));
        }
        let mode = if info.raw {
            Mode::ReceiveRaw
        } else {
            Mode::Receive
        };
        // A rollback (`force`) replaces the dataset's tree: its open state
        // is forgotten when the operation ends (`with_dir_excl`).
        let (id, after) = crate::dsl::with_dir_excl(pool, |dir, cx| {
            let state = RecvState {
                to_guid: info.guid,
                to_name: info.name.clone(),
                from_guid: info.from.as_ref().map(|f| f.guid),
                raw: info.raw,
                resumable: opts.resumable,
                after: None,
                source: info.dataset.clone(),
            };
            crate::stored::check_recv_state_size(name, &state)?;
            if let Some(&id) = dir.names.get(name) {
                if let Some(old) = dir.rec(id)?.recv.clone() {
                    let same = old.to_guid == state.to_guid
                        && old.from_guid == state.from_guid
                        && old.raw == state.raw;
                    if old.resumable && same {
                        // The stream's header is checked as the first
                        // one was: `finish` applies its geometry and key.
                        check_resumed(dir, id, info)?;
                        let after = match &old.after {
                            Some(h) => Some(unhex(h).ok_or_else(|| {
                                DsError::Corrupt(format!("'{name}': its resume point"))
                            })?),
                            None => None,
                        };
                        return Ok((id, after));
                    }
                    return Err(DsError::Busy(format!(
                        "'{name}' holds a partial receive of another stream \
                         ({}@{}); finish it with `tarn send -t` of its \
                         receive_resume_token, or abort it with `tarn receive -A {name}`",
                        old.source, old.to_name
                    )));
                }
            }
            let id = match &info.from {
                None => begin_full(dir, cx, name, info, &opts)?,
                Some(from) => begin_incremental(dir, cx, name, info, from.guid, opts.force)?,
            };
            if let Some(r) = dir.recs.get_mut(&id) {
                r.recv = Some(state);
            }
            dir.dirty_recs.insert(id);
            Ok((id, None))
        })?;
        Ok(Receiver {
            pool: pool.clone(),
            id,
            mode,
            info: info.clone(),
            pending: VecDeque::new(),
            resume_after: after,
            resumable: opts.resumable,
            keep_wrapping: opts.keep_wrapping,
        })
    }

    /// True when `name` holds a resumable partial receive of the stream
    /// `info` describes. Asked before [`Receiver::begin`] for a stream
    /// that resumes a receive: without one to continue, it is refused
    /// before anything is created or rolled back.
    pub fn can_resume(pool: &Arc<Pool>, name: &str, info: &SendInfo) -> Result<bool, DsError> {
        crate::dsl::with_dir(pool, |dir, _| {
            let Some(&id) = dir.names.get(name) else {
                return Ok(false);
            };
            Ok(dir.rec(id)?.recv.as_ref().is_some_and(|old| {
                old.resumable
                    && old.to_guid == info.guid
                    && old.from_guid == info.from.as_ref().map(|f| f.guid)
                    && old.raw == info.raw
            }))
        })
    }

    /// Where a resumed stream must start: after this key (None: from the
    /// beginning).
    pub fn resume_after(&self) -> Option<&[u8]> {
        self.resume_after.as_deref()
    }

    /// Applies entries of the stream, in order, as one transaction.
    pub fn apply(&mut self, items: Vec<SendItem>) -> Result<(), DsError> {
        let Some(last) = items.last().map(|i| i.key().to_vec()) else {
            return Ok(());
        };
        let (id, mode, guid) = (self.id, self.mode, self.info.guid);
        let (txg, committed) = with_dsl(&self.pool, true, |dsl, cx| {
            still_receiving(&dsl.dir(), id, guid)?;
            let r = crate::txn::run_mode(dsl, cx, id, mode, false, |t| {
                let mut raw = Vec::new();
                for item in items {
                    match item {
                        SendItem::Put(k, v) => t.put(&k, &v)?,
                        SendItem::Delete(k) => {
                            t.delete(&k)?;
                        }
                        SendItem::Block(_, BlockPayload::Logical(_))
                            if mode == Mode::ReceiveRaw =>
                        {
                            // A raw receive holds no key: plaintext staged
                            // for a sealed dataset could not be written,
                            // and that sync's failure would stop the pool.
                            return Err(DsError::Invalid(
                                "a plaintext block in a raw stream".into(),
                            ));
                        }
                        SendItem::Block(k, BlockPayload::Logical(d)) => {
                            if d.len() > crate::txn::MAX_BLOCK {
                                return Err(DsError::Invalid(format!(
                                    "a block of {} bytes in the stream",
                                    d.len()
                                )));
                            }
                            t.write_block(&k, d)?
                        }
                        SendItem::Block(k, BlockPayload::Raw(b)) => raw.push((k, b)),
                    }
                }
                if !raw.is_empty() {
                    t.write_raw_blocks(&raw)?;
                }
                Ok::<(), DsError>(())
            })?;
            r?;
            Ok((cx.txg(), cx.committed_txg()))
        })?;
        self.pending.push_back((txg, last));
        self.save_progress(committed)
    }

    /// Records the newest key whose transaction has committed as the
    /// resume point (see the module docs).
    fn save_progress(&mut self, committed: u64) -> Result<(), DsError> {
        let mut durable = None;
        while self.pending.front().is_some_and(|(t, _)| *t <= committed) {
            durable = self.pending.pop_front().map(|(_, k)| k);
        }
        let Some(key) = durable else { return Ok(()) };
        if !self.resumable {
            return Ok(());
        }
        let id = self.id;
        with_dsl(&self.pool, false, |dsl, _| {
            let mut dir = dsl.dir();
            if let Some(st) = dir.recs.get_mut(&id).and_then(|r| r.recv.as_mut()) {
                st.after = Some(hex(&key));
            }
            dir.dirty_recs.insert(id);
            Ok(())
        })
    }

    /// Ends the receive: the snapshot the stream carries is taken, with
    /// its guid and time, and the dataset can be used again.
    /// On an error nothing is undone here: the caller ends the receive
    /// with [`Receiver::fail`], as for an error while applying.
    pub fn finish(&self) -> Result<(), DsError> {
        let (id, info) = (self.id, &self.info);
        with_excl(&self.pool, |dsl, cx| {
            let mut dir = dsl.dir();
            let dir = &mut *dir;
            still_receiving(dir, id, info.guid)?;
            let rec = dir.rec(id)?.clone();
            let snap = format!("{}@{}", rec.name, info.name);
            if dir.names.contains_key(&snap) {
                return Err(DsError::Exists(format!("snapshot '{snap}' already exists")));
            }
            // Checked at the start too; a snapshot made meanwhile.
            if crate::dsl::snapshot_ids(dir, id)
                .iter()
                .any(|(_, s)| dir.recs.get(s).is_some_and(|r| r.guid == info.guid))
            {
                return Err(DsError::Exists(format!(
                    "'{}' already has a snapshot of the stream's guid {}",
                    rec.name, info.guid
                )));
            }
            if let Some(r) = dir.recs.get_mut(&id) {
                if r.kind == DatasetKind::Volume {
                    r.volume = info.volume;
                }
                r.recv = None;
            }
            // A raw stream carries its key's wrapping as the sender has it
            // now (a changed passphrase travels with it): applied to the
            // record only when this dataset is its encryption root, and
            // the receiver trusts the sender with it.
            if let (Some(kid), Some(k), false) = (rec.key, &info.key, self.keep_wrapping) {
                if let Some(kr) = dir.keys.get_mut(&kid) {
                    if kr.root == id && kr.guid == k.guid && kr.wrapped != k.wrapped {
                        kr.keyformat = k.keyformat;
                        kr.pbkdf = k.pbkdf.as_ref().map(|p| p.rec());
                        kr.wrapped = k.wrapped.clone();
                        dir.dirty_keys.insert(kid);
                    }
                }
            }
            dir.dirty_recs.insert(id);
            dir.new_snapshot(id, snap, cx.txg(), Some((info.guid, info.created_unix)))?;
            Ok(())
        })
    }

    /// Ends a receive that failed: kept to resume if it is resumable,
    /// else undone (see [`abort`]).
    pub fn fail(self) -> Result<(), DsError> {
        if self.resumable {
            // Whatever committed since is the resume point.
            self.pool.sync()?;
            let committed = with_dsl(&self.pool, false, |_, cx| Ok(cx.committed_txg()))?;
            let mut me = self;
            return me.save_progress(committed);
        }
        let id = self.id;
        crate::dsl::with_dir_excl(&self.pool, |dir, cx| abort_in(dir, cx, id))
    }
}

/// Busy unless dataset `id` is still receiving the stream of snapshot
/// `guid`: an abandoned receive (`receive -A`, a rollback) must not go on
/// writing, nor snapshot what is left.
fn still_receiving(dir: &Dir, id: u64, guid: u64) -> Result<(), DsError> {
    let rec = dir.rec(id)?;
    if rec.recv.as_ref().map(|s| s.to_guid) != Some(guid) {
        return Err(DsError::Busy(format!(
            "the receive into '{}' was abandoned while it ran",
            rec.name
        )));
    }
    Ok(())
}

/// A stream's key as it may be stored: a known cipher, a wrapped key of
/// the right size, and Argon2id parameters (exactly for a passphrase)
/// within what a load accepts.
fn check_key_export(k: &crate::send::KeyExport) -> Result<(), DsError> {
    let bad = |why: &str| Err(DsError::Invalid(format!("the stream's key: {why}")));
    tarn_block::Cipher::parse(&k.cipher).map_err(|e| DsError::Invalid(e.to_string()))?;
    if k.wrapped.len() != 2 * tarn_block::crypt::WRAPPED_LEN || unhex(&k.wrapped).is_none() {
        return bad("the wrapped key has the wrong size");
    }
    match (&k.pbkdf, k.keyformat) {
        (Some(p), crate::KeyFormat::Passphrase) => {
            if p.memory_kib > 4 << 20
                || p.iterations > 64
                || !(1..=16).contains(&p.parallelism)
                || unhex(&p.salt).is_none_or(|s| s.len() < 16 || s.len() > 64)
            {
                return bad("Argon2id parameters or salt out of range");
            }
        }
        (None, crate::KeyFormat::Raw | crate::KeyFormat::Hex) => {}
        _ => return bad("Argon2id parameters go with a passphrase, and only with one"),
    }
    Ok(())
}

/// The header of a stream that resumes the receive into dataset `id`:
/// of the dataset's kind, a volume's geometry valid and of its block size,
/// a key valid and the dataset's own (what the first header of the
/// receive was checked for, and what [`Receiver::finish`] applies).
fn check_resumed(dir: &Dir, id: u64, info: &SendInfo) -> Result<(), DsError> {
    let rec = dir.rec(id)?;
    let name = &rec.name;
    check_kind_and_geometry(rec, info)?;
    if let Some(k) = &info.key {
        check_key_export(k)?;
    }
    let mine = rec.key.and_then(|kid| dir.keys.get(&kid)).map(|r| r.guid);
    match (&info.key, mine) {
        (Some(k), Some(g)) if k.guid != g => Err(DsError::Invalid(format!(
            "the resumed stream is sealed with another key than '{name}'"
        ))),
        (Some(_), None) => Err(DsError::Invalid(format!(
            "the resumed stream is encrypted and '{name}' is not"
        ))),
        // As for a fresh incremental: a raw receive stores what it is
        // given, and entries without a seal must not land in an
        // encrypted dataset.
        (None, Some(_)) if info.raw => Err(DsError::Invalid(format!(
            "'{name}' is encrypted and the resumed raw stream is not"
        ))),
        _ => Ok(()),
    }
}

/// A stream into existing dataset `rec` (an incremental, or one that
/// resumes a receive): of its kind, and for a volume with the geometry it
/// takes at the end, checked as for a full stream, whose block size never
/// changes (the blocks it has are of that size).
fn check_kind_and_geometry(rec: &crate::record::DsRec, info: &SendInfo) -> Result<(), DsError> {
    let name = &rec.name;
    if (rec.kind == DatasetKind::Volume) != (info.kind == DatasetKind::Volume) {
        return Err(DsError::Invalid(format!(
            "'{name}' and the stream are not of the same kind (filesystem, volume)"
        )));
    }
    if rec.kind == DatasetKind::Volume {
        let (Some(new), Some(old)) = (info.volume, rec.volume) else {
            return Err(DsError::Invalid(format!(
                "a stream of volume '{name}' without its geometry"
            )));
        };
        crate::check_volspec(new)?;
        if new.block != old.block {
            return Err(DsError::Invalid(format!(
                "the stream's volblocksize {} differs from '{name}''s {}",
                new.block, old.block
            )));
        }
    }
    Ok(())
}

/// A new dataset for a full stream.
fn begin_full(
    dir: &mut Dir,
    cx: &tarn_pool::Cx<'_>,
    name: &str,
    info: &SendInfo,
    opts: &RecvOptions<'_>,
) -> Result<u64, DsError> {
    let txg = cx.txg();
    if dir.names.contains_key(name) {
        return Err(DsError::Exists(format!(
            "'{name}' exists: a full stream makes a new dataset (receive into a new name, or \
             send incrementally from a snapshot it has)"
        )));
    }
    let parent = parent_name(name)
        .and_then(|p| dir.names.get(p).copied())
        .ok_or_else(|| DsError::NotFound(format!("the parent of '{name}' does not exist")))?;
    if dir.rec(parent)?.kind == DatasetKind::Volume {
        return Err(DsError::Invalid(format!(
            "the parent of '{name}' is a volume: volumes cannot have children"
        )));
    }
    crate::ops::not_being_received(dir.rec(parent)?)?;
    let parent_key = dir.rec(parent)?.key;
    let mut props = std::collections::BTreeMap::new();
    let wanted = |k: &String| !opts.exclude.contains(k) && opts.allow.is_none_or(|a| a.contains(k));
    for (k, v) in info.props.iter().filter(|(k, _)| wanted(k)) {
        props.insert(k.clone(), crate::props::validate(k, v)?);
    }
    crate::stored::check_props_size(name, &props)?;
    if let Some(k) = &info.key {
        check_key_export(k)?;
    }
    let key = match (&info.key, info.raw) {
        // The parent holds the very same key record (a tree sent with
        // -R -w, or a child received below its encryption root): the
        // child shares it, as on the sender. Anything short of identical
        // gets a record of its own, so a stream cannot change the key of
        // a dataset it is not the root of.
        (Some(k), true)
            if parent_key
                .and_then(|pk| dir.keys.get(&pk))
                .is_some_and(|r| {
                    r.guid == k.guid
                        && r.cipher == k.cipher
                        && r.keyformat == k.keyformat
                        && r.wrapped == k.wrapped
                        && r.pbkdf.as_ref().map(crate::send::PbkdfExport::of) == k.pbkdf
                }) =>
        {
            None
        }
        (Some(k), true) => Some(k.clone()),
        (Some(_), false) => {
            return Err(DsError::Invalid("a key in a stream that is not raw".into()))
        }
        (None, true) if parent_key.is_some() => {
            return Err(DsError::Invalid(format!(
                "'{name}' would be unencrypted inside an encrypted dataset: receive a raw stream \
                 of an unencrypted dataset elsewhere, or send it without -w"
            )))
        }
        (None, _) => {
            if parent_key.is_some() {
                // It inherits the parent's key: the key must be loaded to
                // seal what arrives.
                dir.keyset(parent)?;
            }
            None
        }
    };
    if let Some(v) = info.volume {
        crate::check_volspec(v)?;
    } else if info.kind == DatasetKind::Volume {
        return Err(DsError::Invalid(
            "a volume stream without its geometry".into(),
        ));
    }
    // A reservation takes room from every other dataset: the stream may
    // set one only where it fits, as `create` checks.
    if let Some(r) = props.get("reservation").and_then(|r| r.parse::<u64>().ok()) {
        let avail = dir.available(cx, parent);
        if r > avail {
            return Err(DsError::NoSpace(format!(
                "the stream's reservation of {} for '{name}' does not fit: {} available \
                 (receive with -x reservation)",
                crate::props::human_bytes(r),
                crate::props::human_bytes(avail)
            )));
        }
    }
    let mut rec = dir.new_fs(name, Some(parent), txg);
    rec.props = props;
    rec.key = parent_key;
    if info.kind == DatasetKind::Volume {
        rec.kind = DatasetKind::Volume;
        rec.volume = info.volume;
    }
    let id = rec.id;
    dir.recs.insert(id, rec);
    if let Some(k) = key {
        let kid = dir.alloc_id();
        dir.keys.insert(
            kid,
            KeyRec {
                id: kid,
                guid: k.guid,
                cipher: k.cipher.clone(),
                keyformat: k.keyformat,
                keylocation: "prompt".into(),
                pbkdf: k.pbkdf.as_ref().map(|p| p.rec()),
                wrapped: k.wrapped.clone(),
                root: id,
                created_unix: now_unix(),
            },
        );
        dir.dirty_keys.insert(kid);
        if let Some(r) = dir.recs.get_mut(&id) {
            r.key = Some(kid);
        }
    }
    Ok(id)
}

/// An existing dataset for an incremental stream: at its base snapshot
/// (rolled back to it with `force`).
fn begin_incremental(
    dir: &mut Dir,
    cx: &mut tarn_pool::SyncCx<'_>,
    name: &str,
    info: &SendInfo,
    from: u64,
    force: bool,
) -> Result<u64, DsError> {
    let id = dir.id_of(name)?;
    let rec = dir.rec(id)?.clone();
    if rec.is_snapshot() {
        return Err(DsError::Invalid(format!("'{name}' is a snapshot")));
    }
    let snaps = crate::dsl::snapshot_ids(dir, id);
    let Some((base_name, base)) = snaps
        .iter()
        .find(|(_, s)| dir.recs.get(s).is_some_and(|r| r.guid == from))
        .cloned()
    else {
        return Err(DsError::NotFound(format!(
            "'{name}' has no snapshot {} (guid {from}), the base of this incremental stream",
            info.from
                .as_ref()
                .map_or(String::new(), |f| format!("@{}", f.name))
        )));
    };
    let newest = snaps.last().map(|(_, s)| *s);
    // Intent log records parked for a key not loaded are changes too
    // (fsynced writes its tree does not show yet): a load would replay
    // them over the received state.
    let parked = crate::zil::has_parked(dir, cx, id)?;
    let changed = rec.root != dir.rec(base)?.root || parked;
    let roll_back = newest != Some(base) || changed;
    if roll_back && !force {
        let what = if parked {
            "writes in its intent log, waiting for its key"
        } else {
            "newer snapshots or changes"
        };
        return Err(DsError::Busy(format!(
            "'{name}' changed since {base_name} ({what}): `tarn receive -F` rolls it back \
             first"
        )));
    }
    // Everything is checked before the rollback (`force`), so a stream
    // refused for another reason destroys nothing. Snapshots are found by
    // guid (an incremental's base, a mount's snapshot folder): the
    // snapshots that stay (the rollback removes those after the base)
    // must not share the stream's guid, nor its name. `finish` checks
    // again, for a snapshot made meanwhile.
    let stays = snaps
        .iter()
        .position(|(_, s)| *s == base)
        .map_or(snaps.len(), |i| if roll_back { i + 1 } else { snaps.len() });
    let snap_name = format!("{name}@{}", info.name);
    for (n, s) in &snaps[..stays] {
        if dir.recs.get(s).is_some_and(|r| r.guid == info.guid) {
            return Err(DsError::Exists(format!(
                "'{name}' already has a snapshot of the stream's guid {}",
                info.guid
            )));
        }
        if *n == snap_name {
            return Err(DsError::Exists(format!(
                "snapshot '{snap_name}' already exists"
            )));
        }
    }
    if let Some(k) = &info.key {
        check_key_export(k)?;
    }
    match (dir.rec(id)?.key, &info.key) {
        (Some(kid), Some(k)) => {
            let same = dir.keys.get(&kid).is_some_and(|r| r.guid == k.guid);
            if !same {
                return Err(DsError::Invalid(format!(
                    "the stream is sealed with another key than '{name}'"
                )));
            }
        }
        (Some(_), None) if info.raw => {
            return Err(DsError::Invalid(format!(
                "'{name}' is encrypted and the raw stream is not"
            )))
        }
        (None, Some(_)) => {
            return Err(DsError::Invalid(format!(
                "the raw stream is encrypted and '{name}' is not"
            )))
        }
        (Some(_), None) => {
            dir.keyset(id)?;
        }
        (None, None) => {}
    }
    check_kind_and_geometry(&rec, info)?;
    if roll_back {
        crate::ops::rollback_in(dir, cx, &base_name, true)?;
    }
    Ok(id)
}

/// Undoes a partial receive into `name` (`receive -A`): a dataset the
/// receive created is destroyed, an existing one rolled back to the
/// stream's base.
pub fn abort(pool: &Pool, name: &str) -> Result<(), DsError> {
    crate::dsl::with_dir_excl(pool, |dir, cx| {
        let id = dir.id_of(name)?;
        abort_in(dir, cx, id)
    })
}

/// [`abort`] of dataset `id`, whatever it is called by now (a receive
/// that fails undoes itself by id: its dataset, or an ancestor, may have
/// been renamed while it ran).
fn abort_in(dir: &mut Dir, cx: &mut SyncCx<'_>, id: u64) -> Result<(), DsError> {
    let name = dir.rec(id)?.name.clone();
    let Some(state) = dir.rec(id)?.recv.clone() else {
        return Err(DsError::Invalid(format!("'{name}' is not being received")));
    };
    if state.from_guid.is_none() {
        // Checked before the first change, so that it is an error and
        // not a stopped pool. Nothing can be made under a dataset
        // being received now; a pool from before that rule may hold
        // such a snapshot or child.
        if dir.has_dependents(id) {
            return Err(DsError::Busy(format!(
                "'{name}' has snapshots or children made while it was being received: \
                 destroy it with -r"
            )));
        }
        let r = crate::zil::drop_parked(dir, cx, id).and_then(|()| dir.destroy_fs(cx, id));
        return crate::ops::applied(cx, "aborting a receive", r);
    }
    let base = crate::dsl::snapshot_ids(dir, id)
        .into_iter()
        .find(|(_, s)| dir.recs.get(s).map(|r| Some(r.guid)) == Some(state.from_guid));
    // Without its base the part of the stream already applied cannot
    // be taken back: the dataset stays marked as being received (not
    // usable) rather than pass for a finished one.
    let Some((base_name, _)) = base else {
        return Err(DsError::Busy(format!(
            "the base snapshot of the receive into '{name}' is gone, so the part of \
             the stream already applied cannot be undone: destroy '{name}' with -r"
        )));
    };
    crate::ops::rollback_in(dir, cx, &base_name, true)?;
    if let Some(r) = dir.recs.get_mut(&id) {
        r.recv = None;
    }
    dir.dirty_recs.insert(id);
    Ok(())
}

/// The `receive_resume_token` of dataset `id`: what `tarn send -t` needs
/// to continue a resumable receive, or None.
pub(crate) fn resume_token(dir: &Dir, id: u64) -> Option<String> {
    let st = dir.recs.get(&id)?.recv.as_ref()?;
    if !st.resumable {
        return None;
    }
    let t = Token {
        version: 1,
        guid: st.to_guid,
        from_guid: st.from_guid,
        raw: st.raw,
        after: st.after.clone(),
        name: st.to_name.clone(),
        source: st.source.clone(),
    };
    serde_json::to_vec(&t).ok().map(|j| hex(&j))
}

/// What a resume token says: which stream, resumed after which key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// Token format (1).
    pub version: u32,
    /// The snapshot being sent.
    pub guid: u64,
    /// Its base, for an incremental stream.
    #[serde(default)]
    pub from_guid: Option<u64>,
    /// A raw stream.
    pub raw: bool,
    /// Resume after this key (hex).
    #[serde(default)]
    pub after: Option<String>,
    /// The snapshot's short name.
    pub name: String,
    /// The sending dataset's name.
    pub source: String,
}

impl Token {
    /// Decodes a token (`receive_resume_token`).
    pub fn parse(s: &str) -> Result<Token, DsError> {
        let bad = || DsError::Invalid("not a receive_resume_token".into());
        let j = unhex(s.trim()).ok_or_else(bad)?;
        let t: Token = serde_json::from_slice(&j).map_err(|_| bad())?;
        if t.version != 1 {
            return Err(DsError::Invalid(format!(
                "a resume token of version {}: this tarn reads version 1",
                t.version
            )));
        }
        Ok(t)
    }

    /// The key to resume after, decoded.
    pub fn after_key(&self) -> Result<Option<Vec<u8>>, DsError> {
        match &self.after {
            None => Ok(None),
            Some(h) => unhex(h)
                .map(Some)
                .ok_or_else(|| DsError::Invalid("a resume token with a bad key".into())),
        }
    }
}

/// The full name of a snapshot `pool` holds with guid `guid` (`send -t`
/// finds its snapshot by the token's guid): one of dataset `of` if it has
/// one, else any. A received copy of a snapshot keeps its guid, and the
/// copy may have let go of its history or be sealed with another key:
/// the token's own dataset is the one to resume from.
pub fn snapshot_by_guid(pool: &Pool, guid: u64, of: &str) -> Result<Option<String>, DsError> {
    crate::dsl::with_dir(pool, |dir, _| {
        let mut any = None;
        for r in dir
            .recs
            .values()
            .filter(|r| r.is_snapshot() && r.guid == guid)
        {
            if dataset_of(&r.name) == of {
                return Ok(Some(r.name.clone()));
            }
            any.get_or_insert_with(|| r.name.clone());
        }
        Ok(any)
    })
}

/// The dataset part of a snapshot's full name.
pub fn dataset_of(snap: &str) -> &str {
    snap.split_once('@').map_or(snap, |(d, _)| d)
}

/// Whether filesystem `fs` has a snapshot with this guid: a stream of a
/// replication package that it already received is skipped.
pub fn has_snapshot(pool: &Pool, fs: &str, guid: u64) -> Result<bool, DsError> {
    crate::dsl::with_dir(pool, |dir, _| {
        let Some(&id) = dir.names.get(fs) else {
            return Ok(false);
        };
        Ok(crate::dsl::snapshot_ids(dir, id)
            .iter()
            .any(|(_, s)| dir.recs.get(s).is_some_and(|r| r.guid == guid)))
    })
}
