//! Dataset records and the values they hold: `DsRec` (one per dataset,
//! JSON in the pool's meta tree), byte totals (`Sums`), the tags of values
//! inside dataset trees, meta-tree keys, and the scan function that tells
//! the pool which blocks a record references.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tarn_block::{BlockPtr, ChecksumAlg, BLOCK_PTR_SIZE};
use tarn_pool::ExtRef;

use crate::DsError;

/// Value tags inside dataset trees.
pub(crate) const TAG_PLAIN: u8 = 0;

pub(crate) const TAG_BLOCK: u8 = 1;

/// A plain value of an encrypted dataset, sealed with its key (see
/// `tarn_block::crypt`); 2 is the in-memory tag of a staged block.
pub(crate) const TAG_SEALED: u8 = 3;

pub(crate) const K_NEXT: &[u8] = b"N";

/// Block size whose allocation defines the deflate ratio.
pub(crate) const DEFLATE_BLOCK: u64 = 128 * 1024;

pub(crate) const P_DS: u8 = b'D';

pub(crate) const P_DEAD: u8 = b'L';

/// Key records (`crypt`): `K` + key id.
pub(crate) const P_KEY: u8 = b'K';

/// Parked intent log records of encrypted datasets (`zil`): `P` + dataset
/// id + sequence + part.
pub(crate) const P_PARK: u8 = b'P';

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

    pub(crate) fn add(&mut self, o: Sums) {
        self.asize = self.asize.saturating_add(o.asize);
        self.psize = self.psize.saturating_add(o.psize);
        self.lsize = self.lsize.saturating_add(o.lsize);
    }

    pub(crate) fn sub(&mut self, o: Sums) {
        self.asize = self.asize.saturating_sub(o.asize);
        self.psize = self.psize.saturating_sub(o.psize);
        self.lsize = self.lsize.saturating_sub(o.lsize);
    }

    pub(crate) fn plus(mut self, o: Sums) -> Sums {
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
    /// A read-only point-in-time copy of a filesystem or a volume.
    Snapshot,
    /// A block volume (ZFS's zvol): one sparse block device of a fixed
    /// size, cut into `volblocksize` blocks. It has no children.
    Volume,
}

/// A volume's geometry (ZFS's `volsize` and `volblocksize`). A volume's
/// record holds it, and each snapshot's record holds a copy as it was when
/// taken, so a clone or a rollback gets the size its blocks belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolSpec {
    /// Size of the device in bytes, a multiple of `block`.
    pub size: u64,
    /// Block size in bytes: a power of two from 512 to 1 MiB, fixed at
    /// creation.
    pub block: u32,
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
    /// Volumes and their snapshots: the geometry (absent for filesystems,
    /// so their records are unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolSpec>,
    /// Encrypted datasets (and their snapshots): the id of the key record
    /// their blocks and values are sealed with (absent when unencrypted,
    /// so unencrypted records are unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<u64>,
    /// While a stream is being received into the dataset: what it is and
    /// how far it came (see `recv`). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recv: Option<crate::recv::RecvState>,
    /// Snapshots: the tags of the holds on it; a held snapshot cannot be
    /// destroyed (what keeps a replication's base). Absent when none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub holds: std::collections::BTreeSet<String>,
}

impl DsRec {
    pub(crate) fn root_ptr(&self) -> Result<BlockPtr, DsError> {
        decode_ptr_hex(&self.root)
            .map_err(|e| DsError::Corrupt(format!("dataset {}: root pointer: {e}", self.name)))
    }

    pub(crate) fn is_snapshot(&self) -> bool {
        self.kind == DatasetKind::Snapshot
    }

    /// Busy when this snapshot is held (it cannot be destroyed); the hint
    /// quotes a tag a shell would split.
    pub(crate) fn check_not_held(&self) -> Result<(), DsError> {
        if self.holds.is_empty() {
            return Ok(());
        }
        let tags: Vec<&str> = self.holds.iter().map(String::as_str).collect();
        Err(DsError::Busy(format!(
            "snapshot '{}' is held ({}): release it first with `tarn release {} {}`",
            self.name,
            tags.join(", "),
            shell_word(tags[0]),
            self.name
        )))
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(crate) fn encode_ptr_hex(bp: &BlockPtr) -> String {
    hex(&bp.encode())
}

pub(crate) fn decode_ptr_hex(s: &str) -> Result<BlockPtr, String> {
    if s.len() != BLOCK_PTR_SIZE * 2 || !s.is_ascii() {
        return Err(format!("bad length {}", s.len()));
    }
    let mut b = Vec::with_capacity(BLOCK_PTR_SIZE);
    for i in (0..s.len()).step_by(2) {
        b.push(u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| e.to_string())?);
    }
    BlockPtr::decode(&b).map_err(|e| e.to_string())
}

pub(crate) fn ds_key(id: u64) -> Vec<u8> {
    let mut k = vec![P_DS];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

pub(crate) fn dead_key(dl: u64, bucket: u64, bp: &BlockPtr) -> Vec<u8> {
    let mut k = vec![P_DEAD];
    k.extend_from_slice(&dl.to_be_bytes());
    k.extend_from_slice(&bucket.to_be_bytes());
    let d = bp.dvas[0];
    k.extend_from_slice(&d.vdev.to_be_bytes());
    k.extend_from_slice(&d.offset.to_be_bytes());
    k
}

pub(crate) fn dead_prefix(dl: u64, bucket: Option<u64>) -> Vec<u8> {
    let mut k = vec![P_DEAD];
    k.extend_from_slice(&dl.to_be_bytes());
    if let Some(b) = bucket {
        k.extend_from_slice(&b.to_be_bytes());
    }
    k
}

pub(crate) fn prefix_end(p: &[u8]) -> Vec<u8> {
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
pub(crate) fn scan_refs(kind: u8, key: &[u8], value: &[u8], out: &mut Vec<ExtRef>) {
    match kind {
        0 if key.first() == Some(&P_DS) => {
            let root = serde_json::from_slice::<DsRec>(value)
                .map_err(|e| e.to_string())
                .and_then(|rec| {
                    rec.root_ptr()
                        .map(|root| (rec, root))
                        .map_err(|e| e.to_string())
                });
            match root {
                Ok((rec, root)) if !root.is_hole() => out.push(ExtRef::Tree {
                    id: rec.id,
                    root,
                    min_birth: rec.prev_snap_txg,
                    kind: 1,
                }),
                Ok(_) => {}
                Err(e) => out.push(ExtRef::Undecodable(format!("a dataset record: {e}"))),
            }
        }
        // Parked log records: their chunks and the blocks they reference.
        0 if key.first() == Some(&P_PARK) && value.first() == Some(&TAG_BLOCK) => {
            match BlockPtr::decode(&value[1..]) {
                Ok(bp) => out.push(ExtRef::Block(bp)),
                Err(e) => out.push(ExtRef::Undecodable(format!("a parked log block: {e}"))),
            }
        }
        1 if value.first() == Some(&TAG_BLOCK) => match BlockPtr::decode(&value[1..]) {
            Ok(bp) => out.push(ExtRef::Block(bp)),
            Err(e) => out.push(ExtRef::Undecodable(format!("a block pointer: {e}"))),
        },
        _ => {}
    }
}

pub(crate) fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(crate) fn new_guid(salt: u64) -> u64 {
    let seed = format!(
        "{:?}{}{salt}{:?}",
        std::time::SystemTime::now(),
        std::process::id(),
        std::thread::current().id()
    );
    let h = blake3_hash(seed.as_bytes());
    u64::from_le_bytes(h).max(1)
}

pub(crate) fn blake3_hash(b: &[u8]) -> [u8; 8] {
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
    /// Filesystem, volume or snapshot.
    pub kind: DatasetKind,
    /// Volumes and their snapshots: the size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volsize: Option<u64>,
    /// Volumes and their snapshots: the block size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volblocksize: Option<u32>,
    /// Stable 64-bit id.
    pub guid: u64,
    /// Creation time (Unix seconds).
    pub creation_unix: u64,
    /// The txg that created it: orders snapshots exactly (times tie).
    pub createtxg: u64,
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
    /// Encrypted datasets: the cipher (`aes-256-gcm`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<String>,
    /// Encrypted datasets: `available` (key loaded) or `unavailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keystatus: Option<String>,
    /// Encrypted datasets: the dataset whose key they use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryptionroot: Option<String>,
}

/// Validates a filesystem name under `pool`.
pub(crate) fn check_fs_name(pool: &str, name: &str) -> Result<(), DsError> {
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
        if p == "." || p == ".." {
            return bad("a component cannot be '.' or '..'");
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

pub(crate) fn check_snap_part(name: &str, snap: &str) -> Result<(), DsError> {
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

pub(crate) fn parent_name(name: &str) -> Option<&str> {
    name.rsplit_once('/').map(|(p, _)| p)
}

/// `word` as one shell word: quoted when it holds anything but letters,
/// digits and `-_.:/@=+,`.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/@=+,".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hold_tags_in_hints_are_one_shell_word() {
        use super::shell_word;
        assert_eq!(shell_word("offsite"), "offsite");
        assert_eq!(shell_word("replicate s3://b/p"), "'replicate s3://b/p'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
    }
}
