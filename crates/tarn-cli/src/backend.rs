//! The seam between the admin API and the storage engine.
//!
//! [`Backend`] is what the daemon serves: one function per API method, plain
//! data in and out, every failure an [`ApiError`]. The request types here are
//! also the JSON parameters of their methods, so the wire format and the
//! engine's entry points cannot drift apart. Checks that need no pool
//! (device counts, reserved names) live here, in `validate`, and run both in
//! the client and in [`crate::api::dispatch`].

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use crate::access::{Share, UserInfo};
use crate::api::ApiError;
pub use crate::api::ShareInfo;
pub use crate::mounts::MountInfo;
use crate::status::{ImportCandidate, IostatEntry, PoolListEntry, PoolStatus, ScanStatus};
pub use tarn_dataset::{DatasetInfo, DatasetKind, PropValue, Source};

/// Layout of one top-level vdev.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VdevKind {
    /// One device, no redundancy.
    Single,
    /// N-way copies.
    Mirror,
    /// Single parity.
    Raidz1,
    /// Double parity.
    Raidz2,
    /// Triple parity.
    Raidz3,
}

impl VdevKind {
    /// The word used on the command line and in vdev names (`mirror-0`).
    pub fn as_str(self) -> &'static str {
        match self {
            VdevKind::Single => "single",
            VdevKind::Mirror => "mirror",
            VdevKind::Raidz1 => "raidz1",
            VdevKind::Raidz2 => "raidz2",
            VdevKind::Raidz3 => "raidz3",
        }
    }

    /// Fewest devices this layout accepts: one more than its parity.
    pub fn min_devices(self) -> usize {
        match self {
            VdevKind::Single => 1,
            VdevKind::Mirror | VdevKind::Raidz1 => 2,
            VdevKind::Raidz2 => 3,
            VdevKind::Raidz3 => 4,
        }
    }

    /// Most devices this layout accepts.
    pub fn max_devices(self) -> usize {
        match self {
            VdevKind::Single => 1,
            _ => 255,
        }
    }
}

/// One top-level vdev to create.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VdevSpec {
    /// Layout.
    pub kind: VdevKind,
    /// Absolute device paths.
    pub devices: Vec<String>,
}

impl VdevSpec {
    /// Checks the device count; `index` is the vdev's position, for naming it
    /// the way `status` will (`mirror-1`).
    pub fn validate(&self, index: usize) -> Result<(), ApiError> {
        let kind = self.kind;
        let n = self.devices.len();
        let what = match kind {
            VdevKind::Single => format!("top-level vdev {index}"),
            _ => format!("{}-{index}", kind.as_str()),
        };
        if n < kind.min_devices() {
            let listed = if n == 0 {
                "none".to_string()
            } else {
                self.devices.join(" ")
            };
            return Err(ApiError::invalid(format!(
                "{what} needs at least {} devices for {}, got {n} ({listed}); \
                 list more devices after `{}`",
                kind.min_devices(),
                kind.as_str(),
                kind.as_str(),
            )));
        }
        if n > kind.max_devices() {
            return Err(ApiError::invalid(format!(
                "{what} has {n} devices; a {} vdev takes at most {}",
                kind.as_str(),
                kind.max_devices()
            )));
        }
        if let Some(empty) = self.devices.iter().find(|d| d.trim().is_empty()) {
            return Err(ApiError::invalid(format!(
                "{what} lists an empty device path {empty:?}"
            )));
        }
        Ok(())
    }
}

/// Lowest and highest accepted `ashift` (512 B to 64 KiB sectors).
pub const ASHIFT_RANGE: std::ops::RangeInclusive<u8> = 9..=16;

/// Longest accepted pool name, in bytes.
pub const POOL_NAME_MAX_BYTES: usize = 200;

/// Checks a pool name: it starts with a letter, holds only letters, digits
/// and `_-.:`, and does not start like a vdev type (so a forgotten name in
/// `tarn pool create mirror a b` is caught instead of naming a pool "mirror").
pub fn validate_pool_name(name: &str) -> Result<(), ApiError> {
    let bad = |why: &str| {
        Err(ApiError::invalid(format!(
            "pool name {name:?} {why}; use a name such as `tank`"
        )))
    };
    if name.is_empty() {
        return bad("is empty");
    }
    if name.len() > POOL_NAME_MAX_BYTES {
        return bad(&format!("is longer than {POOL_NAME_MAX_BYTES} bytes"));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return bad("must start with a letter");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-.:".contains(*c)))
    {
        return bad(&format!(
            "contains {c:?}; only letters, digits and _ - . : are allowed"
        ));
    }
    let reserved_prefix = ["mirror", "raidz", "draid", "spare"]
        .into_iter()
        .find(|p| name.starts_with(p));
    let reserved_word = ["log", "cache", "special", "dedup"].contains(&name);
    if reserved_prefix.is_some() || reserved_word {
        return Err(ApiError::invalid(format!(
            "pool name {name:?} is reserved for a vdev type; did you forget the pool name? \
             e.g. `tarn pool create tank mirror /dev/sdb /dev/sdc`"
        )));
    }
    Ok(())
}

/// Parameters of `pool.create`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// New pool's name.
    pub name: String,
    /// Top-level vdevs, in order.
    pub vdevs: Vec<VdevSpec>,
    /// log2 of the sector size; the engine's default when absent.
    #[serde(default)]
    pub ashift: Option<u8>,
    /// Initial properties, e.g. `checksum=xxh3`, `compression=lz4`,
    /// `copies=2`; the engine refuses names or values it does not know.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Use devices even if their labels say they belong to another pool.
    #[serde(default)]
    pub force: bool,
}

impl CreateRequest {
    /// Checks everything that can be checked without touching a device.
    pub fn validate(&self) -> Result<(), ApiError> {
        validate_pool_name(&self.name)?;
        if self.vdevs.is_empty() {
            return Err(ApiError::invalid(format!(
                "pool {} has no vdevs; list devices, e.g. `tarn pool create {} mirror /dev/sdb /dev/sdc`",
                self.name, self.name
            )));
        }
        let mut seen = BTreeSet::new();
        for (i, vdev) in self.vdevs.iter().enumerate() {
            vdev.validate(i)?;
            for dev in &vdev.devices {
                if !seen.insert(dev.as_str()) {
                    return Err(ApiError::invalid(format!(
                        "device {dev} is listed twice; each device can serve one vdev"
                    )));
                }
            }
        }
        if let Some(ashift) = self.ashift {
            if !ASHIFT_RANGE.contains(&ashift) {
                return Err(ApiError::invalid(format!(
                    "ashift={ashift} is out of range; use {} to {} (12 = 4 KiB sectors)",
                    ASHIFT_RANGE.start(),
                    ASHIFT_RANGE.end()
                )));
            }
        }
        if let Some(key) = self.properties.keys().find(|k| k.is_empty()) {
            return Err(ApiError::invalid(format!(
                "property name {key:?} is empty; write properties as NAME=VALUE"
            )));
        }
        Ok(())
    }
}

/// Parameters of `pool.import`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportRequest {
    /// Directories to search for devices; the engine's default when empty
    /// and no devices are given.
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Individual devices to examine.
    #[serde(default)]
    pub devices: Vec<String>,
    /// Pool to import, by name or hex GUID; none lists the candidates.
    #[serde(default)]
    pub pool: Option<String>,
    /// Import under this name instead.
    #[serde(default)]
    pub new_name: Option<String>,
    /// Import even if the labels say another process may own the pool.
    #[serde(default)]
    pub force: bool,
    /// Import even when the intent log cannot be read or replayed in
    /// full, keeping what precedes the damage.
    #[serde(default)]
    pub discard_log: bool,
}

impl ImportRequest {
    /// Checks the request's shape.
    pub fn validate(&self) -> Result<(), ApiError> {
        if let Some(new_name) = &self.new_name {
            if self.pool.is_none() {
                return Err(ApiError::invalid(
                    "a new name needs the pool to import; e.g. `tarn pool import tank tank2`",
                ));
            }
            validate_pool_name(new_name)?;
        }
        Ok(())
    }
}

/// Result of `pool.import`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImportResult {
    /// No pool was named: what could be imported.
    Candidates(Vec<ImportCandidate>),
    /// The named pool, now imported (boxed: it is much larger than the
    /// other variant).
    Imported(Box<PoolStatus>),
}

/// What `pool.scrub` does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScrubAction {
    /// Start a scrub (or resume a paused one).
    #[default]
    Start,
    /// Pause the running scrub; progress is kept.
    Pause,
    /// Resume a paused scrub.
    Resume,
    /// Stop the scrub for good.
    Cancel,
}

/// A raw object as `object.*` methods report it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectInfo {
    /// Object name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Txg of the object's last change.
    pub txg: u64,
}

fn no_datasets() -> ApiError {
    ApiError::invalid("this backend has no datasets")
}

/// What the daemon serves: the storage engine behind the admin API.
///
/// Calls arrive concurrently from several connections. Errors carry a
/// message for the operator that names the pool or device, the cause and the
/// fix.
pub trait Backend: Send + Sync {
    /// Creates and imports a pool.
    fn pool_create(&self, req: &CreateRequest) -> Result<PoolStatus, ApiError>;
    /// Lists importable pools (no `pool` given) or imports one.
    fn pool_import(&self, req: &ImportRequest) -> Result<ImportResult, ApiError>;
    /// Commits and releases a pool so another host or process can import it.
    fn pool_export(&self, name: &str, force: bool) -> Result<(), ApiError>;
    /// Destroys a pool: its labels are invalidated, its data abandoned.
    fn pool_destroy(&self, name: &str, force: bool) -> Result<(), ApiError>;
    /// Imported pools with their sizes and health.
    fn pool_list(&self) -> Result<Vec<PoolListEntry>, ApiError>;
    /// Status of one pool or all of them.
    fn pool_status(&self, name: Option<&str>) -> Result<Vec<PoolStatus>, ApiError>;
    /// Starts, pauses, resumes or cancels a scrub; answers the scan's state.
    fn pool_scrub(&self, name: &str, action: ScrubAction) -> Result<Option<ScanStatus>, ApiError>;
    /// Takes a device out of service.
    fn pool_offline(&self, name: &str, device: &str) -> Result<(), ApiError>;
    /// Brings a device back and resilvers what it missed.
    fn pool_online(&self, name: &str, device: &str) -> Result<(), ApiError>;
    /// Replaces `old` by `new` and resilvers onto it.
    fn pool_replace(&self, name: &str, old: &str, new: &str, force: bool) -> Result<(), ApiError>;
    /// Adds a separate intent log vdev (one device or a mirror).
    fn pool_add_log(&self, name: &str, vdev: &VdevSpec, force: bool) -> Result<(), ApiError>;
    /// Removes the log vdev holding `device`.
    fn pool_remove(&self, name: &str, device: &str) -> Result<(), ApiError>;
    /// Resets error counters of one device or of the whole pool.
    fn pool_clear(&self, name: &str, device: Option<&str>) -> Result<(), ApiError>;
    /// Cumulative I/O counters of one pool or all of them, as a tree.
    fn pool_iostat(&self, name: Option<&str>) -> Result<Vec<IostatEntry>, ApiError>;
    /// Commits the open txg; answers the committed txg.
    fn pool_sync(&self, name: &str) -> Result<u64, ApiError>;
    /// Writes the file at `from_path` into `object` at `offset`; durable
    /// before returning when `sync`.
    ///
    /// Raw objects: a pool-level store of named byte objects used by drills,
    /// tests and benchmarks until datasets exist. Data moves through files
    /// on the daemon's machine, never through JSON.
    fn object_write(
        &self,
        pool: &str,
        object: &str,
        from_path: &str,
        offset: u64,
        sync: bool,
    ) -> Result<ObjectInfo, ApiError>;
    /// Writes the whole of `object` into a file at `to_path`.
    fn object_read(&self, pool: &str, object: &str, to_path: &str) -> Result<ObjectInfo, ApiError>;
    /// Lists the raw objects of a pool.
    fn object_list(&self, pool: &str) -> Result<Vec<ObjectInfo>, ApiError>;
    /// Deletes a raw object.
    fn object_delete(&self, pool: &str, object: &str) -> Result<(), ApiError>;
    /// Creates a filesystem dataset (with `parents`, missing ancestors too).
    fn dataset_create(
        &self,
        _name: &str,
        _properties: &BTreeMap<String, String>,
        _parents: bool,
    ) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Destroys a filesystem (with `recursive`, everything below it), a
    /// snapshot `fs@s` or a snapshot range `fs@a%c`.
    fn dataset_destroy(&self, _name: &str, _recursive: bool) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Every dataset of every pool (and the snapshots, with `snapshots`).
    fn dataset_list(&self, _snapshots: bool) -> Result<Vec<DatasetInfo>, ApiError> {
        Err(no_datasets())
    }
    /// Property values (all when `properties` is empty).
    fn dataset_get(&self, _name: &str, _properties: &[String]) -> Result<Vec<PropValue>, ApiError> {
        Err(no_datasets())
    }
    /// Sets a property locally.
    fn dataset_set(&self, _name: &str, _property: &str, _value: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Drops a local value so the inherited one applies.
    fn dataset_inherit(&self, _name: &str, _property: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Renames a filesystem (with its descendants) or a snapshot.
    fn dataset_rename(&self, _name: &str, _new_name: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Takes snapshots atomically (with `recursive`, of descendants too).
    fn dataset_snapshot(&self, _names: &[String], _recursive: bool) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Returns a filesystem to a snapshot (with `destroy_newer`, destroying
    /// the snapshots taken after it).
    fn dataset_rollback(&self, _snapshot: &str, _destroy_newer: bool) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Creates a filesystem from a snapshot.
    fn dataset_clone(
        &self,
        _snapshot: &str,
        _name: &str,
        _properties: &BTreeMap<String, String>,
    ) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Makes a clone independent of its origin (the origin's history moves
    /// to it).
    fn dataset_promote(&self, _name: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Drills: makes a member device misbehave, or with `None` behave
    /// again; answers the faults in force.
    fn pool_inject(
        &self,
        _name: &str,
        _device: &str,
        _fault: Option<tarn_vdev::Fault>,
    ) -> Result<Vec<tarn_vdev::Fault>, ApiError> {
        Err(no_datasets())
    }
    /// Adds a user to a pool (the only pool when `pool` is none).
    fn user_add(
        &self,
        _pool: Option<&str>,
        _name: &str,
        _password: &str,
        _uid: Option<u32>,
        _gid: Option<u32>,
    ) -> Result<UserInfo, ApiError> {
        Err(no_datasets())
    }
    /// Removes a user.
    fn user_del(&self, _pool: Option<&str>, _name: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Changes a user's password.
    fn user_passwd(
        &self,
        _pool: Option<&str>,
        _name: &str,
        _password: &str,
    ) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// The users of every pool.
    fn user_list(&self) -> Result<Vec<UserInfo>, ApiError> {
        Err(no_datasets())
    }
    /// Adds or replaces a share (stored in its dataset's pool); with
    /// `owner`, gives the dataset's root directory to that user.
    fn share_add(&self, _share: &Share, _owner: Option<&str>) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Removes a share.
    fn share_del(&self, _pool: Option<&str>, _name: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// The shares of every pool.
    fn share_list(&self) -> Result<Vec<ShareInfo>, ApiError> {
        Err(no_datasets())
    }
    /// Mounts a dataset (at `mountpoint`, or where its property says).
    fn dataset_mount(
        &self,
        _name: &str,
        _mountpoint: Option<&str>,
        _allow_other: bool,
        _read_only: bool,
    ) -> Result<MountInfo, ApiError> {
        Err(no_datasets())
    }
    /// Unmounts a dataset, given by name or mountpoint.
    fn dataset_unmount(&self, _name: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// The daemon's mounts.
    fn dataset_mounts(&self) -> Result<Vec<MountInfo>, ApiError> {
        Err(no_datasets())
    }
    /// Where the NFS and WebDAV servers listen (none when not running).
    fn endpoints(&self) -> crate::servers::Endpoints {
        crate::servers::Endpoints::default()
    }
    /// Exports every pool cleanly; called once when the daemon stops.
    fn shutdown(&self);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ErrorCode;

    fn create(vdevs: Vec<VdevSpec>) -> CreateRequest {
        CreateRequest {
            name: "tank".into(),
            vdevs,
            ashift: None,
            properties: BTreeMap::new(),
            force: false,
        }
    }

    fn spec(kind: VdevKind, devices: &[&str]) -> VdevSpec {
        VdevSpec {
            kind,
            devices: devices.iter().map(|d| d.to_string()).collect(),
        }
    }

    #[test]
    fn pool_names() {
        for ok in ["tank", "t", "data_1.backup:x-y"] {
            validate_pool_name(ok).unwrap();
        }
        for bad in ["", "1tank", "ta nk", "ta/nk", "mirror", "raidz2x", "log"] {
            let err = validate_pool_name(bad).unwrap_err();
            assert_eq!(err.code, ErrorCode::Invalid, "{bad}");
        }
        assert!(validate_pool_name("mirror")
            .unwrap_err()
            .message
            .contains("forget the pool name"));
    }

    #[test]
    fn create_checks_counts_duplicates_and_ashift() {
        create(vec![spec(VdevKind::Raidz2, &["/a", "/b", "/c"])])
            .validate()
            .unwrap();
        let err = create(vec![spec(VdevKind::Raidz3, &["/a", "/b", "/c"])])
            .validate()
            .unwrap_err();
        assert!(
            err.message.contains("raidz3-0 needs at least 4"),
            "{}",
            err.message
        );
        let err = create(vec![
            spec(VdevKind::Single, &["/a"]),
            spec(VdevKind::Mirror, &["/b", "/a"]),
        ])
        .validate()
        .unwrap_err();
        assert!(
            err.message.contains("/a is listed twice"),
            "{}",
            err.message
        );
        assert!(create(vec![]).validate().is_err());
        let mut req = create(vec![spec(VdevKind::Single, &["/a"])]);
        req.ashift = Some(30);
        assert!(req.validate().unwrap_err().message.contains("ashift=30"));
    }

    #[test]
    fn import_result_wire_shape() {
        let v = serde_json::to_value(ImportResult::Candidates(vec![])).unwrap();
        assert_eq!(v, serde_json::json!({"candidates": []}));
        let v = serde_json::to_value(ScrubAction::Cancel).unwrap();
        assert_eq!(v, serde_json::json!("cancel"));
        let v = serde_json::to_value(spec(VdevKind::Raidz1, &["/a", "/b"])).unwrap();
        assert_eq!(v["kind"], "raidz1");
    }
}
