//! The seam between the admin API and whatever serves it.
//!
//! [`Backend`] is called by [`crate::dispatch()`] after the parameters were
//! decoded and the checks that need no pool passed; it never sees JSON.

use std::collections::BTreeMap;

use crate::access::{Share, ShareInfo, UserInfo};
use crate::dataset::{DatasetInfo, HoldInfo, KeyRootInfo, MountInfo, PropValue};
use crate::error::ApiError;
use crate::params::{DaemonStats, DatasetCreateParams, KeyChangeParams, KeyLoadParams, ObjectInfo};
use crate::pool::{
    CreateRequest, Fault, ImportRequest, ImportResult, IostatEntry, PoolListEntry, PoolStatus,
    ScanStatus, ScrubAction, VdevSpec,
};

fn no_datasets() -> ApiError {
    ApiError::invalid("this backend has no datasets")
}

/// What a node serves: one function per API method, plain data in and
/// out, every failure an [`ApiError`].
///
/// The daemon implements it over its pools; tests implement it with fakes.
/// Calls arrive concurrently from several connections. Errors carry a
/// message for the operator that names the pool or device, the cause and the
/// fix. Methods past the pool level have defaults that refuse, so a backend
/// without datasets still serves the rest.
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
    /// Objects: the regular files at the top of a pool's root filesystem,
    /// copied in and out without a mount by drills, tests and benchmarks.
    /// Data moves through files on the daemon's machine, never through JSON.
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
    /// Lists the objects of a pool.
    fn object_list(&self, pool: &str) -> Result<Vec<ObjectInfo>, ApiError>;
    /// Deletes an object.
    fn object_delete(&self, pool: &str, object: &str) -> Result<(), ApiError>;
    /// Creates a filesystem dataset (with `parents`, missing ancestors
    /// too; with encryption properties and a key, a new encryption root).
    fn dataset_create(&self, _p: &DatasetCreateParams) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Loads the key of an encryption root (its datasets can be mounted
    /// and shared again).
    fn key_load(&self, _p: &KeyLoadParams) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Unloads the key of an encryption root: its datasets are locked.
    fn key_unload(&self, _name: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Rewraps the key of an encryption root under a new key.
    fn key_change(&self, _p: &KeyChangeParams) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Sends a snapshot's stream into `out` (a transport's framed body).
    fn dataset_send(
        &self,
        _p: &crate::params::SendParams,
        _out: &mut dyn std::io::Write,
    ) -> Result<crate::params::SendResult, ApiError> {
        Err(no_datasets())
    }
    /// Receives the stream `input` holds.
    fn dataset_receive(
        &self,
        _p: &crate::params::ReceiveParams,
        _input: &mut dyn std::io::Read,
    ) -> Result<crate::params::ReceiveResult, ApiError> {
        Err(no_datasets())
    }
    /// Undoes a partial resumable receive.
    fn dataset_receive_abort(&self, _name: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Makes a replication token for `label`, good for receiving into
    /// `dataset` and below; returns it (only its hash is kept).
    fn replication_token_add(
        &self,
        _label: &str,
        _dataset: &str,
    ) -> Result<crate::params::TokenAdded, ApiError> {
        Err(no_datasets())
    }
    /// The replication tokens (never the tokens themselves).
    fn replication_token_list(&self) -> Result<Vec<crate::params::TokenInfo>, ApiError> {
        Err(no_datasets())
    }
    /// Removes the replication token `label`.
    fn replication_token_del(&self, _label: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Where the replication port listens, and its certificate.
    fn replication_info(&self) -> Result<crate::params::ReplicationInfo, ApiError> {
        Err(no_datasets())
    }
    /// The encryption roots at or below `name` (every one without it).
    fn key_list(&self, _name: Option<&str>) -> Result<Vec<KeyRootInfo>, ApiError> {
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
    /// Puts the hold `tag` on snapshots (with `recursive`, on the
    /// snapshots of that name below too).
    fn dataset_hold(
        &self,
        _tag: &str,
        _snaps: &[String],
        _recursive: bool,
    ) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Releases the hold `tag` from snapshots.
    fn dataset_release(
        &self,
        _tag: &str,
        _snaps: &[String],
        _recursive: bool,
    ) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// The holds on snapshots.
    fn dataset_holds(
        &self,
        _snaps: &[String],
        _recursive: bool,
    ) -> Result<Vec<HoldInfo>, ApiError> {
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
    /// Creates a volume of `size` (see [`crate::params::VolumeCreateParams`]).
    fn volume_create(&self, _p: &crate::params::VolumeCreateParams) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Changes a volume's size; shrinking needs `force`.
    fn volume_resize(&self, _name: &str, _size: &str, _force: bool) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Drills: makes a member device misbehave, or with `None` behave
    /// again; answers the faults in force.
    fn pool_inject(
        &self,
        _name: &str,
        _device: &str,
        _fault: Option<Fault>,
    ) -> Result<Vec<Fault>, ApiError> {
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
        _smb: bool,
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
        _smb: Option<bool>,
    ) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Sets (or, with none, removes) a user's CHAP secret.
    fn user_chap(
        &self,
        _pool: Option<&str>,
        _name: &str,
        _secret: Option<&str>,
    ) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// The users of every pool.
    fn user_list(&self) -> Result<Vec<UserInfo>, ApiError> {
        Err(no_datasets())
    }
    /// Makes a user an administrator (of the HTTPS API), or not.
    fn user_admin(&self, _pool: Option<&str>, _name: &str, _admin: bool) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Makes an HTTPS API token acting as `user`; returns it (only its
    /// hash is kept).
    fn api_token_add(
        &self,
        _label: &str,
        _user: &str,
        _pool: Option<&str>,
    ) -> Result<crate::params::TokenAdded, ApiError> {
        Err(no_datasets())
    }
    /// The HTTPS API tokens (never the tokens themselves).
    fn api_token_list(&self) -> Result<Vec<crate::params::ApiTokenInfo>, ApiError> {
        Err(no_datasets())
    }
    /// Removes the HTTPS API token `label`.
    fn api_token_del(&self, _label: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Makes a share link (see [`crate::params::LinkCreateParams`]).
    fn link_create(
        &self,
        _p: &crate::params::LinkCreateParams,
    ) -> Result<crate::params::LinkCreated, ApiError> {
        Err(no_datasets())
    }
    /// The share links (never their tokens).
    fn link_list(&self) -> Result<Vec<crate::params::LinkInfo>, ApiError> {
        Err(no_datasets())
    }
    /// Revokes share link `id`.
    fn link_revoke(&self, _id: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Rates over the last hour (or day) from the daemon's history.
    fn stats_history(&self, _day: bool) -> Result<Vec<crate::params::HistoryPoint>, ApiError> {
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
    /// Health of every device of every pool.
    fn disk_list(&self) -> Result<Vec<crate::health::DiskHealth>, ApiError> {
        Err(no_datasets())
    }
    /// Health of one device of a pool.
    fn disk_health(&self, _device: &str) -> Result<crate::health::DiskHealth, ApiError> {
        Err(no_datasets())
    }
    /// Starts a self-test on a disk of a pool.
    fn disk_selftest(&self, _device: &str, _test: &str) -> Result<String, ApiError> {
        Err(no_datasets())
    }
    /// The latest events (after `after`, at most `limit`, oldest first).
    fn events_list(
        &self,
        _after: Option<u64>,
        _limit: usize,
    ) -> Result<Vec<crate::events::Event>, ApiError> {
        Err(no_datasets())
    }
    /// Adds or replaces an alert.
    fn alert_add(&self, _alert: &crate::events::Alert) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Removes an alert.
    fn alert_del(&self, _name: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Every alert.
    fn alert_list(&self) -> Result<Vec<crate::events::AlertInfo>, ApiError> {
        Err(no_datasets())
    }
    /// Sends a test event through one alert or every alert, now.
    fn alert_test(
        &self,
        _name: Option<&str>,
    ) -> Result<Vec<crate::events::AlertTestResult>, ApiError> {
        Err(no_datasets())
    }
    /// Adds or replaces a schedule.
    fn schedule_add(&self, _schedule: &crate::schedule::Schedule) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Removes a schedule.
    fn schedule_del(&self, _pool: Option<&str>, _name: &str) -> Result<(), ApiError> {
        Err(no_datasets())
    }
    /// Every schedule of every pool, with its latest runs.
    fn schedule_list(&self) -> Result<Vec<crate::schedule::ScheduleInfo>, ApiError> {
        Err(no_datasets())
    }
    /// Runs a schedule now (whether due or not).
    fn schedule_run(
        &self,
        _pool: Option<&str>,
        _name: &str,
    ) -> Result<crate::schedule::RunRecord, ApiError> {
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
    /// Connection counters of the servers the node runs (NFS, WebDAV);
    /// the transport fills in its own (`admin`). None by default.
    fn daemon_stats(&self) -> Result<DaemonStats, ApiError> {
        Ok(DaemonStats::default())
    }
}
