//! Datasets as the API shows them: `dataset.list` rows, property values
//! with their source, and FUSE mounts. The API's own copies of what the
//! dataset layer reports, with the same JSON shape.

use serde::{Deserialize, Serialize};

/// What a dataset is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetKind {
    /// A POSIX filesystem (a clone is one too).
    Filesystem,
    /// A read-only point-in-time copy of a filesystem or a volume.
    Snapshot,
    /// A block volume (API 2.0): one block device of a fixed size, served
    /// over NBD or iSCSI.
    Volume,
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
    /// The txg that created it: orders snapshots exactly, where creation
    /// times tie (API 2.2).
    #[serde(default)]
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
    /// Volumes and their snapshots: the size in bytes (API 2.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volsize: Option<u64>,
    /// Volumes and their snapshots: the block size in bytes (API 2.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volblocksize: Option<u32>,
    /// Encrypted datasets: the cipher (API 2.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<String>,
    /// Encrypted datasets: `available` (key loaded) or `unavailable`
    /// (locked) (API 2.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keystatus: Option<String>,
    /// Encrypted datasets: the dataset whose key they use (API 2.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryptionroot: Option<String>,
}

/// An encryption root and its key, as `key.list` answers (API 2.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRootInfo {
    /// The encryption root's name.
    pub name: String,
    /// `available` (loaded) or `unavailable`.
    pub keystatus: String,
    /// `passphrase`, `raw` or `hex`.
    pub keyformat: String,
    /// `prompt` or `file:///path`.
    pub keylocation: String,
}

/// One hold on a snapshot, as `dataset.holds` answers (API 2.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldInfo {
    /// The held snapshot (`fs@name`).
    pub snapshot: String,
    /// The hold's tag.
    pub tag: String,
}

/// Where a property's value comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Set on this dataset.
    Local,
    /// Taken from the named ancestor.
    Inherited(String),
    /// Nobody set it.
    Default,
    /// Computed (space figures, type, ...); cannot be set.
    None,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Local => write!(f, "local"),
            Source::Inherited(from) => write!(f, "inherited from {from}"),
            Source::Default => write!(f, "default"),
            Source::None => write!(f, "-"),
        }
    }
}

/// One property value as `get` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PropValue {
    /// Dataset name.
    pub dataset: String,
    /// Property name.
    pub property: String,
    /// Value as text (sizes in bytes).
    pub value: String,
    /// Where it comes from.
    pub source: Source,
}

/// A mount as `dataset.mounts` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountInfo {
    /// Dataset (or snapshot) name.
    pub dataset: String,
    /// Where it is mounted.
    pub mountpoint: String,
    /// True when `tarn mount` made it, false when the `mountpoint`
    /// property did.
    pub manual: bool,
    /// Other users may use it.
    pub allow_other: bool,
    /// Mounted read-only.
    pub read_only: bool,
}
