//! The parameters of the methods (one struct each, refusing unknown
//! fields: a misspelt `"forse": true` is an error, never a silently ignored
//! flag) and the small results that have no other home.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::pool::{Fault, ScrubAction, VdevSpec};

/// Parameters of methods that take none (`{}` or `null`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// A pool by name (`pool.sync`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameParams {
    /// Pool name.
    pub name: String,
}

/// An optional pool name (`pool.status`, `pool.iostat`); none means all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptionalNameParams {
    /// Pool name, or all pools.
    #[serde(default)]
    pub name: Option<String>,
}

/// A pool and a force flag (`pool.export`, `pool.destroy`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForceParams {
    /// Pool name.
    pub name: String,
    /// Proceed although the pool is busy.
    #[serde(default)]
    pub force: bool,
}

/// `pool.scrub`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrubParams {
    /// Pool name.
    pub name: String,
    /// What to do; `start` when absent.
    #[serde(default)]
    pub action: ScrubAction,
}

/// A device of a pool (`pool.offline`, `pool.online`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceParams {
    /// Pool name.
    pub name: String,
    /// Device path (or another name the pool knows it by).
    pub device: String,
}

/// `pool.add_log`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddLogParams {
    /// Pool name.
    pub name: String,
    /// The log vdev: one device, or a mirror.
    pub vdev: VdevSpec,
    /// Use devices even if they seem to belong to another pool.
    #[serde(default)]
    pub force: bool,
}

/// `pool.replace`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaceParams {
    /// Pool name.
    pub name: String,
    /// The device leaving the pool.
    pub old: String,
    /// The device taking its place (absolute path).
    pub new: String,
    /// Use the new device even if it seems to belong to another pool.
    #[serde(default)]
    pub force: bool,
}

/// `pool.clear`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClearParams {
    /// Pool name.
    pub name: String,
    /// One device, or every device of the pool.
    #[serde(default)]
    pub device: Option<String>,
}

/// A pool, for object methods (`object.list`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolParams {
    /// Pool name.
    pub pool: String,
}

/// `object.write`: copy a file on the daemon's machine into an object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectWriteParams {
    /// Pool name.
    pub pool: String,
    /// Object name.
    pub object: String,
    /// Absolute path of the source file.
    pub from_path: String,
    /// Byte offset in the object at which the file's bytes land.
    #[serde(default)]
    pub offset: u64,
    /// Make the write durable before answering.
    #[serde(default)]
    pub sync: bool,
}

/// `object.read`: copy an object into a file on the daemon's machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectReadParams {
    /// Pool name.
    pub pool: String,
    /// Object name.
    pub object: String,
    /// Absolute path of the file to write.
    pub to_path: String,
}

/// An object of a pool (`object.delete`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectParams {
    /// Pool name.
    pub pool: String,
    /// Object name.
    pub object: String,
}

/// `dataset.create`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetCreateParams {
    /// Full name (`tank/home/alice`).
    pub name: String,
    /// Local properties.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Create missing ancestors too.
    #[serde(default)]
    pub parents: bool,
    /// A new encryption root's key (`-o keyformat=...`), as hex of the
    /// bytes given (a passphrase's text, a hex key's text, a raw key's
    /// bytes); absent: the daemon reads `keylocation` (a `file://` URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// `key.load`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyLoadParams {
    /// The encryption root.
    pub name: String,
    /// The key, hex of the bytes given (see [`DatasetCreateParams::key`]);
    /// absent: read from `location`, or the root's `keylocation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Read the key from here this once (`file:///path`), instead of the
    /// root's `keylocation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Drop intent log records parked since a crash that can no longer be
    /// read, instead of refusing the load (they are reported as damage).
    #[serde(default)]
    pub discard_log: bool,
}

impl std::fmt::Debug for KeyLoadParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyLoadParams")
            .field("name", &self.name)
            .field("key", &self.key.as_ref().map(|_| "<secret>"))
            .field("location", &self.location)
            .field("discard_log", &self.discard_log)
            .finish()
    }
}

/// `key.change`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyChangeParams {
    /// The encryption root (its key loaded).
    pub name: String,
    /// The new key format (`passphrase`, `raw`, `hex`); absent: unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyformat: Option<String>,
    /// The new key location (`prompt`, `file:///path`); absent: unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keylocation: Option<String>,
    /// The new key, hex of the bytes given; absent: read from the new
    /// location (a `file://` URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl std::fmt::Debug for KeyChangeParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyChangeParams")
            .field("name", &self.name)
            .field("keyformat", &self.keyformat)
            .field("keylocation", &self.keylocation)
            .field("key", &self.key.as_ref().map(|_| "<secret>"))
            .finish()
    }
}

/// `volume.create`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeCreateParams {
    /// Full name (`tank/vm/disk0`).
    pub name: String,
    /// Size: bytes, or with a K/M/G/T suffix (`100G`).
    pub size: String,
    /// Block size (`volblocksize`), fixed for the volume's life; default
    /// 16K.
    #[serde(default)]
    pub block_size: Option<String>,
    /// Thin provisioning: no reservation of the size.
    #[serde(default)]
    pub sparse: bool,
    /// Local properties.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Create missing ancestor filesystems too.
    #[serde(default)]
    pub parents: bool,
    /// A new encryption root's key, as for [`DatasetCreateParams::key`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl std::fmt::Debug for DatasetCreateParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetCreateParams")
            .field("name", &self.name)
            .field("properties", &self.properties)
            .field("parents", &self.parents)
            .field("key", &self.key.as_ref().map(|_| "<secret>"))
            .finish()
    }
}

impl std::fmt::Debug for VolumeCreateParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeCreateParams")
            .field("name", &self.name)
            .field("size", &self.size)
            .field("block_size", &self.block_size)
            .field("sparse", &self.sparse)
            .field("properties", &self.properties)
            .field("parents", &self.parents)
            .field("key", &self.key.as_ref().map(|_| "<secret>"))
            .finish()
    }
}

/// `volume.resize`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeResizeParams {
    /// The volume.
    pub name: String,
    /// New size: bytes, or with a K/M/G/T suffix.
    pub size: String,
    /// Allow shrinking, which discards the data past the new end.
    #[serde(default)]
    pub force: bool,
}

/// `dataset.destroy`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetDestroyParams {
    /// Filesystem, `fs@snap` or `fs@first%last`.
    pub name: String,
    /// Destroy descendants and snapshots too.
    #[serde(default)]
    pub recursive: bool,
}

/// `dataset.list`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetListParams {
    /// Include snapshots.
    #[serde(default)]
    pub snapshots: bool,
}

/// `dataset.get`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetGetParams {
    /// Dataset name.
    pub name: String,
    /// Property names; empty means all.
    #[serde(default)]
    pub properties: Vec<String>,
}

/// `dataset.set`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSetParams {
    /// Dataset name.
    pub name: String,
    /// Property name.
    pub property: String,
    /// New value.
    pub value: String,
}

/// `dataset.inherit`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetInheritParams {
    /// Dataset name.
    pub name: String,
    /// Property name.
    pub property: String,
}

/// `dataset.rename`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetRenameParams {
    /// Current name.
    pub name: String,
    /// New name.
    pub new_name: String,
}

/// `dataset.snapshot`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotParams {
    /// Snapshot names (`fs@name`), taken in one txg.
    pub names: Vec<String>,
    /// Also snapshot every descendant filesystem.
    #[serde(default)]
    pub recursive: bool,
}

/// `replication.hello`: the token a receiving daemon gave out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelloParams {
    /// The token, as `replication token add` printed it.
    pub token: String,
}

impl std::fmt::Debug for HelloParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HelloParams { token: <redacted> }")
    }
}

/// `replication.token_add`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenAddParams {
    /// A name for the sender it is for (`offsite-nas`).
    pub label: String,
    /// The dataset the token may receive into (itself and below).
    pub dataset: String,
}

/// `replication.token_add`'s answer: the token, shown this once.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenAdded {
    /// The label.
    pub label: String,
    /// The token (64 hex digits); only its hash is kept.
    pub token: String,
}

impl std::fmt::Debug for TokenAdded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TokenAdded {{ label: {:?}, token: <redacted> }}",
            self.label
        )
    }
}

/// A replication token as `replication.token_list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    /// The label.
    pub label: String,
    /// The dataset it may receive into.
    pub dataset: String,
    /// When it was made (Unix seconds).
    pub created_unix: u64,
}

/// `user.admin` (API 2.5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserAdminParams {
    /// The pool (optional with one pool).
    #[serde(default)]
    pub pool: Option<String>,
    /// The user.
    pub name: String,
    /// An administrator from now on, or not.
    pub admin: bool,
}

/// `api.token_add` (API 2.5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiTokenAddParams {
    /// A name for what uses it (`backup-script`).
    pub label: String,
    /// The user it acts as (with that user's role, looked up at each
    /// request).
    pub user: String,
    /// The pool of that user (needed when several pools have one).
    #[serde(default)]
    pub pool: Option<String>,
}

/// One HTTPS API token, as `api.token_list` shows it (API 2.5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiTokenInfo {
    /// Its label.
    pub label: String,
    /// The user it acts as.
    pub user: String,
    /// That user's pool.
    pub pool: String,
    /// When it was made (Unix seconds).
    pub created_unix: u64,
}

/// `link.create` (API 2.6): a link to `path` of share `share`, acting
/// as `owner` (`POOL/USER`; over HTTPS always the caller).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkCreateParams {
    /// The share.
    pub share: String,
    /// The folder, relative to the share's root (`""` for all of it).
    #[serde(default)]
    pub path: String,
    /// Upload-only (visitors add files and see nothing) instead of
    /// read-only.
    #[serde(default)]
    pub upload: bool,
    /// A password visitors must give first.
    #[serde(default)]
    pub password: Option<String>,
    /// Seconds from now until the link stops working.
    #[serde(default)]
    pub expires_in_secs: Option<u64>,
    /// The user it acts as, `POOL/USER` (a share is a pool's, so is the
    /// user).
    #[serde(default)]
    pub owner: Option<String>,
}

/// A new share link: its id and its secret token (shown once; the
/// address is `/s/TOKEN` on the web page's server) (API 2.6).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkCreated {
    /// The id (for `link.revoke`).
    pub id: String,
    /// The secret token.
    pub token: String,
}

/// One share link as `link.list` shows it (API 2.6).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkInfo {
    /// Its id.
    pub id: String,
    /// The pool of its share and owner.
    pub pool: String,
    /// The share.
    pub share: String,
    /// The folder.
    pub path: String,
    /// Upload-only.
    pub upload: bool,
    /// Whether it has a password.
    pub password: bool,
    /// The user it acts as.
    pub owner: String,
    /// When it was made (Unix seconds).
    pub created_unix: u64,
    /// When it stops working (Unix seconds), if ever.
    pub expires_unix: Option<u64>,
}

/// `stats.history` (API 2.5).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryParams {
    /// The last day (a point per 5 minutes) instead of the last hour (a
    /// point per 10 seconds).
    #[serde(default)]
    pub day: bool,
}

/// One point of `stats.history`: rates over the interval that ends at
/// `t` (API 2.5).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryPoint {
    /// End of the interval (Unix seconds).
    pub t: u64,
    /// Its length in seconds.
    pub secs: f64,
    /// Per pool.
    pub pools: Vec<PoolRates>,
    /// Per protocol (NFS, WebDAV), while their servers run.
    pub protocols: Vec<ProtocolRates>,
    /// Share of block-cache lookups answered from the cache (0 to 1;
    /// none without lookups).
    pub cache_hit_ratio: Option<f64>,
}

/// A pool's device traffic over one interval (all its devices together).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolRates {
    /// The pool.
    pub pool: String,
    /// Device reads per second.
    pub read_iops: f64,
    /// Device writes per second.
    pub write_iops: f64,
    /// Bytes read per second.
    pub read_bytes_per_sec: f64,
    /// Bytes written per second.
    pub write_bytes_per_sec: f64,
    /// Mean time of a device read in milliseconds (none without reads).
    pub read_latency_ms: Option<f64>,
    /// Mean time of a device write in milliseconds.
    pub write_latency_ms: Option<f64>,
}

/// A protocol's requests over one interval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProtocolRates {
    /// `nfs` or `webdav`.
    pub protocol: String,
    /// Requests per second.
    pub requests_per_sec: f64,
    /// Mean time to answer in milliseconds (none without requests).
    pub latency_ms: Option<f64>,
    /// Requests answered with an error.
    pub errors: u64,
}

/// `replication.info`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationInfo {
    /// The address the replication port listens on (absent: not
    /// started).
    pub listen: Option<String>,
    /// SHA-256 of its TLS certificate, `AB:CD:...`: what a sender pins.
    pub fingerprint: Option<String>,
}

/// `dataset.hold` and `dataset.release` (API 2.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldParams {
    /// The hold's tag: 1 to 128 characters, no control characters.
    pub tag: String,
    /// The snapshots (`fs@name`).
    pub snapshots: Vec<String>,
    /// Also the snapshots of the same name on every descendant.
    #[serde(default)]
    pub recursive: bool,
}

/// `dataset.holds` (API 2.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldsParams {
    /// The snapshots (`fs@name`).
    pub snapshots: Vec<String>,
    /// Also the snapshots of the same name on every descendant.
    #[serde(default)]
    pub recursive: bool,
}

/// `dataset.rollback`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackParams {
    /// The snapshot to return to.
    pub snapshot: String,
    /// Destroy newer snapshots first.
    #[serde(default)]
    pub destroy_newer: bool,
}

/// `dataset.clone`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloneParams {
    /// The origin snapshot.
    pub snapshot: String,
    /// The new filesystem.
    pub name: String,
    /// Local properties of the clone.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// `dataset.mount`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountParams {
    /// Dataset or snapshot.
    pub name: String,
    /// Absolute directory; the `mountpoint` property when absent.
    #[serde(default)]
    pub mountpoint: Option<String>,
    /// Let other users use the mount.
    #[serde(default)]
    pub allow_other: bool,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// `dataset.unmount`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnmountParams {
    /// Dataset name or mountpoint.
    pub name: String,
}

/// `pool.inject`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InjectParams {
    /// Pool name.
    pub name: String,
    /// Member device.
    pub device: String,
    /// The fault to add; none clears every fault of the device.
    #[serde(default)]
    pub fault: Option<Fault>,
}

/// `user.add`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserAddParams {
    /// The pool that stores the user (optional with one pool).
    #[serde(default)]
    pub pool: Option<String>,
    /// Login name.
    pub name: String,
    /// The password (hashed by the daemon, never stored).
    pub password: String,
    /// Numeric uid (chosen from 10000 up when absent).
    #[serde(default)]
    pub uid: Option<u32>,
    /// Numeric gid (the uid when absent).
    #[serde(default)]
    pub gid: Option<u32>,
    /// Also store an NT hash of the password so the user can log in over
    /// SMB (API 2.3).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub smb: bool,
}

/// `user.del`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserParams {
    /// The pool (optional with one pool).
    #[serde(default)]
    pub pool: Option<String>,
    /// Login name.
    pub name: String,
}

/// `user.passwd`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserPasswdParams {
    /// The pool (optional with one pool).
    #[serde(default)]
    pub pool: Option<String>,
    /// Login name.
    pub name: String,
    /// The new password.
    pub password: String,
    /// Some(true): also keep an NT hash for SMB logins; Some(false): drop
    /// it; none: as before (API 2.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smb: Option<bool>,
}

/// `user.chap` (API 2.1).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserChapParams {
    /// The pool (optional with one pool).
    #[serde(default)]
    pub pool: Option<String>,
    /// Login name.
    pub name: String,
    /// The CHAP secret for iSCSI logins (12 to 255 bytes), stored as
    /// given because CHAP needs it; none removes it.
    #[serde(default)]
    pub secret: Option<String>,
}

impl std::fmt::Debug for UserChapParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserChapParams")
            .field("pool", &self.pool)
            .field("name", &self.name)
            .field("secret", &self.secret.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

/// `share.add`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareAddParams {
    /// The share (its pool is its dataset's).
    pub share: crate::access::Share,
    /// Give the dataset's root directory to this user (uid and gid), so
    /// the user can create files in it.
    #[serde(default)]
    pub owner: Option<String>,
}

/// `schedule.add`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleAddParams {
    /// The schedule (stored in its pool).
    pub schedule: crate::schedule::Schedule,
}

/// `schedule.del`, `schedule.run`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleParams {
    /// The pool (optional when the name is unique).
    #[serde(default)]
    pub pool: Option<String>,
    /// Schedule name.
    pub name: String,
}

/// `disk.health`, `disk.selftest`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskParams {
    /// The device path, as its pool names it.
    pub device: String,
    /// `disk.selftest`: `short` or `long`.
    #[serde(default)]
    pub test: Option<String>,
}

/// `events.list`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsParams {
    /// Only events with a larger id (for following the log).
    #[serde(default)]
    pub after: Option<u64>,
    /// At most this many, the newest (100 when absent).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// `alert.add`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertAddParams {
    /// The alert.
    pub alert: crate::events::Alert,
}

/// `alert.del`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertParams {
    /// Alert name.
    pub name: String,
}

/// `alert.test`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertTestParams {
    /// One alert; every alert when absent.
    #[serde(default)]
    pub name: Option<String>,
}

/// `share.del`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareDelParams {
    /// The pool (optional when the name is unique).
    #[serde(default)]
    pub pool: Option<String>,
    /// Share name.
    pub name: String,
}

/// Result of `daemon.ping`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingResult {
    /// The daemon's version.
    pub version: String,
    /// The daemon's process id.
    pub pid: u32,
    /// The admin API version the daemon speaks ([`crate::API_VERSION`]);
    /// empty from a daemon older than versioned APIs.
    #[serde(default)]
    pub api_version: String,
}

/// Connection counters of one server since the daemon started: how often
/// its limits tripped. Every field reads as 0 when absent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConnCounters {
    /// Connections open now.
    pub open: u64,
    /// Connections admitted.
    pub accepted: u64,
    /// Refused: the client address already held its per-address limit.
    pub refused_per_address: u64,
    /// Refused: every connection slot was running a request.
    pub refused_full: u64,
    /// Refused: the client may not use the server at all (NFS: no export
    /// lists its address; admin socket: another user than the daemon's or
    /// root).
    pub refused_unlisted: u64,
    /// Idle connections closed to make room for a newcomer.
    pub evicted: u64,
    /// Connections closed after their idle timeout.
    pub idle_closed: u64,
    /// Connections closed because a request did not arrive whole in time
    /// (admin socket).
    pub request_timeouts: u64,
}

/// Result of `daemon.stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonStats {
    /// The admin socket.
    #[serde(default)]
    pub admin: ConnCounters,
    /// The NFS server, when it runs.
    #[serde(default)]
    pub nfs: Option<ConnCounters>,
    /// The WebDAV server, when it runs.
    #[serde(default)]
    pub webdav: Option<ConnCounters>,
    /// The NBD server, when it runs (API 2.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd: Option<ConnCounters>,
    /// The iSCSI target, when it runs (API 2.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iscsi: Option<ConnCounters>,
    /// The supervised Samba server, when SMB is on (API 2.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smb: Option<SmbStatus>,
}

/// How the Samba server that tarn supervises is doing (API 2.3).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SmbStatus {
    /// Where it listens.
    pub address: String,
    /// The `smbd` process id while it runs; none while it is restarted.
    pub pid: Option<u32>,
    /// Times it ended without being asked and was started again.
    pub restarts: u64,
    /// How it last ended without being asked (e.g. "killed by signal 9"),
    /// with the time (seconds since the epoch).
    pub last_exit: Option<String>,
    /// Unix time of `last_exit`.
    pub last_exit_unix: u64,
    /// Shares it serves now.
    pub shares: Vec<String>,
    /// Shares it cannot serve, each with the reason.
    pub problems: Vec<String>,
}

/// Result of `pool.sync`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncResult {
    /// The txg committed by the sync.
    pub txg: u64,
}

/// An object as `object.*` methods report it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectInfo {
    /// Object name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// The pool's last committed txg when the answer was made (objects are
    /// files; no txg of their last change is kept).
    pub txg: u64,
}

/// `dataset.send`: which snapshot, and how (its stream is the reply's
/// body, see [`crate::wire::FrameWriter`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendParams {
    /// The snapshot (`pool/fs@name`); absent with `token`.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// Only what changed since this snapshot (`@name` or full): `-i`.
    #[serde(default)]
    pub from: Option<String>,
    /// With `from`: every snapshot in between, one stream each (`-I`).
    #[serde(default)]
    pub intermediates: bool,
    /// As stored: sealed values and blocks, no key needed (`-w`).
    #[serde(default)]
    pub raw: bool,
    /// The dataset's local properties travel with it (`-p`).
    #[serde(default)]
    pub props: bool,
    /// Continue an interrupted resumable receive (`-t`).
    #[serde(default)]
    pub token: Option<String>,
    /// A replication package: the dataset and those below it, with
    /// their snapshots and properties (`-R`).
    #[serde(default)]
    pub replicate: bool,
}

/// What `dataset.send` reports after its body.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendResult {
    /// Streams sent (more than one with `-I`).
    pub streams: u64,
    /// Bytes of stream.
    pub bytes: u64,
    /// Entries sent.
    pub items: u64,
    /// Data blocks read.
    pub blocks_read: u64,
}

/// `dataset.receive`: where the stream that follows the request goes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiveParams {
    /// The dataset the stream becomes (or updates).
    pub name: String,
    /// Roll it back to the stream's base first (`-F`).
    #[serde(default)]
    pub force: bool,
    /// Keep what arrived if the stream breaks off, to resume (`-s`).
    #[serde(default)]
    pub resumable: bool,
    /// Do not mount it after (`-u`).
    #[serde(default)]
    pub no_mount: bool,
    /// Properties the stream carries that are not set on a dataset it
    /// creates (`-x PROP`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// When given, the only properties the stream may set (the
    /// replication port sets this; a sender there chooses nothing else).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub props_allowed: Option<Vec<String>>,
    /// Keep the key wrapping the target has when a raw stream carries
    /// another (a sender that is not trusted with the machine must not be
    /// able to make its copies unopenable with the passphrase that opens
    /// them; the replication port sets this).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_wrapping: bool,
}

/// What `dataset.receive` reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiveResult {
    /// The snapshots received, by full name.
    pub snapshots: Vec<String>,
    /// Snapshots of a series or package the target already had (sent
    /// again after a break).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Entries applied.
    pub items: u64,
}
