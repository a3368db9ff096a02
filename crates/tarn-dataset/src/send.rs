//! The dataset side of send: what a snapshot holds, or what changed since
//! an older one, as a sequence of tree entries in key order, read from the
//! committed trees without any lock. The stream format around it lives in
//! `tarn-send`; the receiving side is `recv`.
//!
//! # Theory
//!
//! A dataset is its tree: every file, directory, attribute and volume
//! block is an entry (a plain value, or a block pointer). So a snapshot is
//! sent as its entries, and an incremental stream from snapshot A to
//! snapshot B as the entries that differ ([`tarn_tree::diff`]), which
//! reads only the nodes the two versions do not share: its cost follows
//! what changed, not what exists. Keys are sent as they are (they carry no
//! secret: see docs/encryption.md), values as plain bytes or, in a *raw*
//! stream, as stored: sealed values and the stored (compressed, sealed)
//! bytes of blocks with what their pointer says of them, so a raw stream
//! of an encrypted dataset is made, moved and received without its key.
//!
//! **Consistency.** A send holds the txg committed when it starts, so no
//! block it may read is reused while it runs, even if the snapshots are
//! destroyed meanwhile; snapshots never change, so the stream is the same
//! however long it takes and wherever it resumes.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tarn_block::{BlockPtr, KeySet};
use tarn_pool::{OwnedHold, Pool};

use crate::crypt::{KeyFormat, PbkdfRec};
use crate::dsl::{with_dsl, Dir};
use crate::record::{DatasetKind, VolSpec, TAG_BLOCK, TAG_PLAIN, TAG_SEALED};
use crate::DsError;

/// Largest key of a dataset's tree (what a stream may carry).
pub const MAX_KEY: usize = tarn_tree::MAX_KEY;

/// The snapshot a stream starts from (incremental streams).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FromInfo {
    /// Its short name (after `@`).
    pub name: String,
    /// Its guid: the receiver's dataset must have a snapshot with it.
    pub guid: u64,
}

/// An encryption root's key as a raw stream carries it: the wrapped
/// master key, never the key itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyExport {
    /// The key record's guid (bound into the wrapping).
    pub guid: u64,
    /// The cipher's name.
    pub cipher: String,
    /// How the user gives the key.
    pub keyformat: KeyFormat,
    /// Argon2id parameters and salt of a passphrase key.
    #[serde(default)]
    pub pbkdf: Option<PbkdfExport>,
    /// The wrapped master key, lowercase hex.
    pub wrapped: String,
}

/// Argon2id parameters and salt, as a key record keeps them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PbkdfExport {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
    /// Lowercase hex.
    pub salt: String,
}

impl PbkdfExport {
    pub(crate) fn of(p: &PbkdfRec) -> Self {
        PbkdfExport {
            memory_kib: p.memory_kib,
            iterations: p.iterations,
            parallelism: p.parallelism,
            salt: p.salt.clone(),
        }
    }

    pub(crate) fn rec(&self) -> PbkdfRec {
        PbkdfRec {
            memory_kib: self.memory_kib,
            iterations: self.iterations,
            parallelism: self.parallelism,
            salt: self.salt.clone(),
        }
    }
}

/// What a stream says of the snapshot it carries (its header).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendInfo {
    /// The snapshot's short name (after `@`).
    pub name: String,
    /// Its dataset's full name on the sending pool (for people).
    pub dataset: String,
    /// The snapshot's guid: the received snapshot gets it, so a later
    /// incremental stream finds its base.
    pub guid: u64,
    /// The txg and time it was taken.
    pub created_txg: u64,
    /// Unix seconds.
    pub created_unix: u64,
    /// Filesystem or volume.
    pub kind: DatasetKind,
    /// Volumes: the geometry when the snapshot was taken.
    #[serde(default)]
    pub volume: Option<VolSpec>,
    /// Incremental streams: the snapshot they start from.
    #[serde(default)]
    pub from: Option<FromInfo>,
    /// Values and blocks as stored (sealed, compressed).
    pub raw: bool,
    /// Raw streams of encrypted datasets: the key, wrapped.
    #[serde(default)]
    pub key: Option<KeyExport>,
    /// The dataset's local properties (sent with `-p`; else empty).
    #[serde(default)]
    pub props: BTreeMap<String, String>,
}

/// A block as stored: its bytes and what its pointer says of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawBlock {
    /// The stored bytes (compressed, sealed), `psize` of them.
    pub stored: Vec<u8>,
    /// Logical size.
    pub lsize: u32,
    /// Compression of `stored` (the on-disk value).
    pub compress: u8,
    /// Salt, nonce and tag, when sealed.
    pub seal: Option<tarn_block::crypt::Seal>,
}

impl RawBlock {
    fn of(bp: &BlockPtr, stored: Vec<u8>) -> RawBlock {
        RawBlock {
            stored,
            lsize: bp.lsize,
            compress: bp.compress as u8,
            seal: bp.is_encrypted().then_some(tarn_block::crypt::Seal {
                salt: bp.salt,
                iv: bp.iv,
                mac: bp.mac,
            }),
        }
    }
}

/// A block's contents in a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockPayload {
    /// Its logical bytes.
    Logical(Vec<u8>),
    /// As stored (raw streams).
    Raw(RawBlock),
}

/// One entry of a stream, in key order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendItem {
    /// A plain value (sealed, in a raw stream of an encrypted dataset).
    Put(Vec<u8>, Vec<u8>),
    /// A data block.
    Block(Vec<u8>, BlockPayload),
    /// A key the older snapshot has and this one does not.
    Delete(Vec<u8>),
}

impl SendItem {
    /// The entry's key.
    pub fn key(&self) -> &[u8] {
        match self {
            SendItem::Put(k, _) | SendItem::Block(k, _) | SendItem::Delete(k) => k,
        }
    }
}

/// What a send read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendStats {
    /// Tree nodes read.
    pub nodes_read: u64,
    /// Data blocks read.
    pub blocks_read: u64,
    /// Entries sent.
    pub items: u64,
}

/// A snapshot (and its base) ready to be sent (see the module docs).
pub struct SendSource {
    pool: Arc<Pool>,
    hold: OwnedHold,
    info: SendInfo,
    from_root: BlockPtr,
    to_root: BlockPtr,
    /// Non-raw sends of an encrypted dataset: its key, to open values and
    /// blocks.
    key: Option<Arc<KeySet>>,
}

/// True when snapshot `from` is an earlier state of snapshot `to`: an
/// older snapshot of its filesystem, or (through a clone) of the
/// filesystem its origin came from.
fn is_ancestor(dir: &Dir, from: u64, to: u64) -> bool {
    let (Some(f), Some(t)) = (dir.recs.get(&from), dir.recs.get(&to)) else {
        return false;
    };
    let mut head = t.head;
    let mut before = t.created_txg;
    for _ in 0..1024 {
        let Some(h) = head else { return false };
        if f.head == Some(h) && f.created_txg < before {
            return true;
        }
        // Up through the origin of a clone.
        let Some(o) = dir.recs.get(&h).and_then(|r| r.origin) else {
            return false;
        };
        if o == from {
            return true;
        }
        let Some(orec) = dir.recs.get(&o) else {
            return false;
        };
        head = orec.head;
        before = orec.created_txg;
    }
    false
}

impl SendSource {
    /// Opens snapshot `snap` (`pool/fs@name`) for sending, whole or since
    /// snapshot `from` (`@name` or the full name; an earlier snapshot of
    /// the same lineage). A non-raw send of an encrypted dataset needs its
    /// key; a raw one never does.
    pub fn open(
        pool: &Arc<Pool>,
        snap: &str,
        from: Option<&str>,
        raw: bool,
        with_props: bool,
    ) -> Result<SendSource, DsError> {
        with_dsl(pool, false, |dsl, cx| {
            let dir = dsl.dir();
            let to = dir.id_of(snap)?;
            let rec = dir.rec(to)?.clone();
            if !rec.is_snapshot() {
                return Err(DsError::Invalid(format!(
                    "'{snap}' is not a snapshot: send snapshots (take one with `tarn snapshot`)"
                )));
            }
            let head = dir
                .rec(rec.head.unwrap_or(0))
                .map_err(|_| DsError::Corrupt(format!("snapshot '{snap}' has no dataset")))?;
            let fs_name = head.name.clone();
            let kind = if rec.volume.is_some() {
                DatasetKind::Volume
            } else {
                DatasetKind::Filesystem
            };
            let (from_root, from_info) = match from {
                None => (BlockPtr::default(), None),
                Some(f) => {
                    let full = if f.starts_with('@') {
                        format!("{fs_name}{f}")
                    } else {
                        f.to_string()
                    };
                    let fid = dir.id_of(&full)?;
                    let frec = dir.rec(fid)?;
                    if !frec.is_snapshot() {
                        return Err(DsError::Invalid(format!("'{full}' is not a snapshot")));
                    }
                    if !is_ancestor(&dir, fid, to) {
                        return Err(DsError::Invalid(format!(
                            "'{full}' is not an earlier snapshot of '{snap}': an incremental \
                             stream starts from an older snapshot of the same dataset (or of \
                             the one it was cloned from)"
                        )));
                    }
                    let short = full.split_once('@').map_or("", |(_, s)| s).to_string();
                    (
                        frec.root_ptr()?,
                        Some(FromInfo {
                            name: short,
                            guid: frec.guid,
                        }),
                    )
                }
            };
            let (key, export) = match rec.key {
                None => (None, None),
                Some(kid) if raw => {
                    let k = dir.keys.get(&kid).ok_or_else(|| {
                        DsError::Corrupt(format!(
                            "'{snap}' names key record {kid}, which is missing"
                        ))
                    })?;
                    let export = KeyExport {
                        guid: k.guid,
                        cipher: k.cipher.clone(),
                        keyformat: k.keyformat,
                        pbkdf: k.pbkdf.as_ref().map(PbkdfExport::of),
                        wrapped: k.wrapped.clone(),
                    };
                    (None, Some(export))
                }
                Some(_) => (dir.keyset(to)?, None),
            };
            let info = SendInfo {
                name: snap.split_once('@').map_or("", |(_, s)| s).to_string(),
                dataset: fs_name,
                guid: rec.guid,
                created_txg: rec.created_txg,
                created_unix: rec.created_unix,
                kind,
                volume: rec.volume,
                from: from_info,
                raw,
                key: export,
                props: if with_props {
                    head.props.clone()
                } else {
                    BTreeMap::new()
                },
            };
            let hold = cx.hold(cx.committed_txg());
            Ok(SendSource {
                pool: pool.clone(),
                hold,
                info,
                from_root,
                to_root: rec.root_ptr()?,
                key,
            })
        })
    }

    /// What the stream's header says.
    pub fn info(&self) -> &SendInfo {
        &self.info
    }

    /// One entry of the snapshot as sent: a tree value decoded, opened
    /// (non-raw, encrypted) or read (blocks).
    fn item(
        &self,
        key: Vec<u8>,
        raw_value: Vec<u8>,
        stats: &mut SendStats,
    ) -> Result<SendItem, DsError> {
        match raw_value.split_first() {
            Some((&TAG_PLAIN, v)) => Ok(SendItem::Put(key, v.to_vec())),
            Some((&TAG_SEALED, v)) => {
                if self.info.raw {
                    return Ok(SendItem::Put(key, v.to_vec()));
                }
                let k = self.key.as_ref().ok_or_else(|| {
                    DsError::Corrupt(format!(
                        "a sealed value at key {key:02x?} of a dataset without a key"
                    ))
                })?;
                let plain = k
                    .open_value(&key, v)
                    .map_err(|e| DsError::Damaged(format!("{}: {e}", self.info.dataset)))?;
                Ok(SendItem::Put(key, plain))
            }
            Some((&TAG_BLOCK, v)) => {
                let bp = BlockPtr::decode(v).map_err(|e| {
                    DsError::Corrupt(format!("block pointer at key {key:02x?}: {e}"))
                })?;
                stats.blocks_read += 1;
                let what = |e: tarn_pool::PoolError| {
                    DsError::Damaged(format!(
                        "{}@{}: block at key {key:02x?}: {e}",
                        self.info.dataset, self.info.name
                    ))
                };
                let payload = if self.info.raw {
                    let stored = self.pool.read_stored_held(&bp, &self.hold).map_err(what)?;
                    BlockPayload::Raw(RawBlock::of(&bp, stored))
                } else {
                    let data = self
                        .pool
                        .read_held(&bp, self.key.as_deref(), &self.hold)
                        .map_err(what)?;
                    BlockPayload::Logical(data.to_vec())
                };
                Ok(SendItem::Block(key, payload))
            }
            _ => Err(DsError::Corrupt(format!("value tag at key {key:02x?}"))),
        }
    }

    /// Calls `visit` with every entry of the stream in key order, after
    /// key `after` when given (a resumed stream); `visit` returns false to
    /// stop.
    pub fn run(
        &self,
        after: Option<&[u8]>,
        visit: &mut dyn FnMut(SendItem) -> Result<bool, DsError>,
    ) -> Result<SendStats, DsError> {
        let store = self.pool.committed_store();
        let mut stats = SendStats::default();
        let mut failed: Option<DsError> = None;
        let d = tarn_tree::diff(&store, &self.from_root, &self.to_root, after, &mut |c| {
            let item = match c {
                tarn_tree::Change::Added(k, v) | tarn_tree::Change::Changed(k, _, v) => {
                    self.item(k, v, &mut stats)
                }
                tarn_tree::Change::Removed(k, _) => Ok(SendItem::Delete(k)),
            };
            let go = item.and_then(|i| {
                stats.items += 1;
                visit(i)
            });
            match go {
                Ok(go) => Ok(go),
                Err(e) => {
                    failed = Some(e);
                    Ok(false)
                }
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        stats.nodes_read = d.nodes_read;
        Ok(stats)
    }
}
