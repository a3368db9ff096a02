//! Method names, shared by clients and [`crate::dispatch()`] so they cannot
//! drift. Each names its parameter type.

/// Liveness check: answers [`crate::params::PingResult`].
pub const DAEMON_PING: &str = "daemon.ping";
/// Export every pool and stop the daemon (served by the socket transport).
pub const DAEMON_STOP: &str = "daemon.stop";
/// Connection counters of the admin socket and the NFS and WebDAV servers:
/// answers [`crate::params::DaemonStats`].
pub const DAEMON_STATS: &str = "daemon.stats";
/// Create a pool: [`crate::pool::CreateRequest`].
pub const POOL_CREATE: &str = "pool.create";
/// Find or import pools: [`crate::pool::ImportRequest`].
pub const POOL_IMPORT: &str = "pool.import";
/// Export a pool: [`crate::params::ForceParams`].
pub const POOL_EXPORT: &str = "pool.export";
/// Destroy a pool: [`crate::params::ForceParams`].
pub const POOL_DESTROY: &str = "pool.destroy";
/// List imported pools.
pub const POOL_LIST: &str = "pool.list";
/// Status of one or all pools: [`crate::params::OptionalNameParams`].
pub const POOL_STATUS: &str = "pool.status";
/// Start, pause, resume or cancel a scrub: [`crate::params::ScrubParams`].
pub const POOL_SCRUB: &str = "pool.scrub";
/// Take a device out of service: [`crate::params::DeviceParams`].
pub const POOL_OFFLINE: &str = "pool.offline";
/// Bring a device back: [`crate::params::DeviceParams`].
pub const POOL_ONLINE: &str = "pool.online";
/// Replace a device: [`crate::params::ReplaceParams`].
pub const POOL_REPLACE: &str = "pool.replace";
/// Add a log vdev: [`crate::params::AddLogParams`].
pub const POOL_ADD_LOG: &str = "pool.add_log";
/// Remove a log vdev: [`crate::params::DeviceParams`].
pub const POOL_REMOVE: &str = "pool.remove";
/// Reset error counters: [`crate::params::ClearParams`].
pub const POOL_CLEAR: &str = "pool.clear";
/// Cumulative I/O counters: [`crate::params::OptionalNameParams`].
pub const POOL_IOSTAT: &str = "pool.iostat";
/// Commit the open txg now: [`crate::params::NameParams`].
pub const POOL_SYNC: &str = "pool.sync";
/// Write an object from a file: [`crate::params::ObjectWriteParams`].
pub const OBJECT_WRITE: &str = "object.write";
/// Read an object into a file: [`crate::params::ObjectReadParams`].
pub const OBJECT_READ: &str = "object.read";
/// List objects: [`crate::params::PoolParams`].
pub const OBJECT_LIST: &str = "object.list";
/// Delete an object: [`crate::params::ObjectParams`].
pub const OBJECT_DELETE: &str = "object.delete";

/// Add or replace a schedule: [`crate::params::ScheduleAddParams`] (API 2.3).
pub const SCHEDULE_ADD: &str = "schedule.add";
/// Remove a schedule: [`crate::params::ScheduleParams`] (API 2.3).
pub const SCHEDULE_DEL: &str = "schedule.del";
/// Every schedule with its latest runs (API 2.3).
pub const SCHEDULE_LIST: &str = "schedule.list";
/// Run a schedule now: [`crate::params::ScheduleParams`]; answers a
/// [`crate::schedule::RunRecord`] (API 2.3).
pub const SCHEDULE_RUN: &str = "schedule.run";

/// Health of every device of the imported pools (API 2.3).
pub const DISK_LIST: &str = "disk.list";
/// Health of one device: [`crate::params::DiskParams`] (API 2.3).
pub const DISK_HEALTH: &str = "disk.health";
/// Start a short or long self-test: [`crate::params::DiskParams`] (API 2.3).
pub const DISK_SELFTEST: &str = "disk.selftest";
/// The daemon's latest events: [`crate::params::EventsParams`] (API 2.3).
pub const EVENTS_LIST: &str = "events.list";
/// Add or replace an alert: [`crate::params::AlertAddParams`] (API 2.3).
pub const ALERT_ADD: &str = "alert.add";
/// Remove an alert: [`crate::params::AlertParams`] (API 2.3).
pub const ALERT_DEL: &str = "alert.del";
/// Every alert with its delivery counters (API 2.3).
pub const ALERT_LIST: &str = "alert.list";
/// Send a test event through one alert or all: [`crate::params::AlertTestParams`] (API 2.3).
pub const ALERT_TEST: &str = "alert.test";

/// Create a filesystem: [`crate::params::DatasetCreateParams`].
pub const DATASET_CREATE: &str = "dataset.create";
/// Destroy a dataset, snapshot or snapshot range: [`crate::params::DatasetDestroyParams`].
pub const DATASET_DESTROY: &str = "dataset.destroy";
/// List datasets: [`crate::params::DatasetListParams`].
pub const DATASET_LIST: &str = "dataset.list";
/// Property values: [`crate::params::DatasetGetParams`].
pub const DATASET_GET: &str = "dataset.get";
/// Set a property: [`crate::params::DatasetSetParams`].
pub const DATASET_SET: &str = "dataset.set";
/// Inherit a property: [`crate::params::DatasetInheritParams`].
pub const DATASET_INHERIT: &str = "dataset.inherit";
/// Rename: [`crate::params::DatasetRenameParams`].
pub const DATASET_RENAME: &str = "dataset.rename";
/// Take snapshots: [`crate::params::SnapshotParams`].
pub const DATASET_SNAPSHOT: &str = "dataset.snapshot";
/// Roll back to a snapshot: [`crate::params::RollbackParams`].
pub const DATASET_ROLLBACK: &str = "dataset.rollback";
/// Clone a snapshot: [`crate::params::CloneParams`].
pub const DATASET_CLONE: &str = "dataset.clone";
/// Promote a clone: [`crate::params::NameParams`].
pub const DATASET_PROMOTE: &str = "dataset.promote";
/// Create a volume: [`crate::params::VolumeCreateParams`] (API 2.0).
pub const VOLUME_CREATE: &str = "volume.create";
/// Resize a volume: [`crate::params::VolumeResizeParams`] (API 2.0).
pub const VOLUME_RESIZE: &str = "volume.resize";
/// Inject or clear a device fault (drills): [`crate::params::InjectParams`].
pub const POOL_INJECT: &str = "pool.inject";
/// Add a user: [`crate::params::UserAddParams`].
pub const USER_ADD: &str = "user.add";
/// Remove a user: [`crate::params::UserParams`].
pub const USER_DEL: &str = "user.del";
/// Change a password: [`crate::params::UserPasswdParams`].
pub const USER_PASSWD: &str = "user.passwd";
/// Set or remove a user's CHAP secret: [`crate::params::UserChapParams`]
/// (API 2.1).
pub const USER_CHAP: &str = "user.chap";
/// List users: [`crate::params::NoParams`].
pub const USER_LIST: &str = "user.list";
/// Make a user an administrator of the web page and the HTTPS API, or
/// not: [`crate::params::UserAdminParams`] (API 2.5).
pub const USER_ADMIN: &str = "user.admin";
/// Make a bearer token for scripts that call the HTTPS API as a user:
/// [`crate::params::ApiTokenAddParams`]; answers
/// [`crate::params::TokenAdded`] (API 2.5).
pub const API_TOKEN_ADD: &str = "api.token_add";
/// The HTTPS API's tokens (never the tokens): answers
/// [`crate::params::ApiTokenInfo`]s (API 2.5).
pub const API_TOKEN_LIST: &str = "api.token_list";
/// Remove an HTTPS API token: [`crate::params::NameParams`] (its label)
/// (API 2.5).
pub const API_TOKEN_DEL: &str = "api.token_del";
/// Throughput, IOPS and latency per pool and per protocol over the last
/// hour or day, from the daemon's bounded history:
/// [`crate::params::HistoryParams`]; answers
/// [`crate::params::HistoryPoint`]s (API 2.5).
pub const STATS_HISTORY: &str = "stats.history";
/// Make a share link to a folder of a share, read-only or upload-only,
/// with an optional password and expiry: [`crate::params::LinkCreateParams`];
/// answers [`crate::params::LinkCreated`] (API 2.6).
pub const LINK_CREATE: &str = "link.create";
/// The share links (never their tokens): answers
/// [`crate::params::LinkInfo`]s; a user sees their own (API 2.6).
pub const LINK_LIST: &str = "link.list";
/// Revoke a share link: [`crate::params::NameParams`] (its id); a user
/// may revoke their own (API 2.6).
pub const LINK_REVOKE: &str = "link.revoke";
/// Add or replace a share: [`crate::params::ShareAddParams`].
pub const SHARE_ADD: &str = "share.add";
/// Remove a share: [`crate::params::ShareDelParams`].
pub const SHARE_DEL: &str = "share.del";
/// List shares: [`crate::params::NoParams`].
pub const SHARE_LIST: &str = "share.list";
/// Mount a dataset with FUSE: [`crate::params::MountParams`].
pub const DATASET_MOUNT: &str = "dataset.mount";
/// Unmount: [`crate::params::UnmountParams`].
pub const DATASET_UNMOUNT: &str = "dataset.unmount";
/// List mounts: [`crate::params::NoParams`].
pub const DATASET_MOUNTS: &str = "dataset.mounts";
/// Load the key of an encryption root: [`crate::params::KeyLoadParams`].
pub const KEY_LOAD: &str = "key.load";
/// Unload the key of an encryption root: [`crate::params::NameParams`].
pub const KEY_UNLOAD: &str = "key.unload";
/// Rewrap an encryption root's key: [`crate::params::KeyChangeParams`].
pub const KEY_CHANGE: &str = "key.change";
/// The encryption roots (at or below a dataset, or all):
/// [`crate::params::OptionalNameParams`]; answers
/// [`crate::dataset::KeyRootInfo`]s.
pub const KEY_LIST: &str = "key.list";
/// Send a snapshot as a stream: [`crate::params::SendParams`]; the
/// stream is the reply's framed body ([`crate::wire::FrameWriter`]), then
/// a [`crate::params::SendResult`] line. Streaming transports only.
pub const DATASET_SEND: &str = "dataset.send";
/// Receive the framed stream that follows the request:
/// [`crate::params::ReceiveParams`]; answers
/// [`crate::params::ReceiveResult`]. Streaming transports only.
pub const DATASET_RECEIVE: &str = "dataset.receive";
/// Undo a partial resumable receive: [`crate::params::NameParams`].
pub const DATASET_RECEIVE_ABORT: &str = "dataset.receive_abort";

/// Put a hold on snapshots: [`crate::params::HoldParams`] (API 2.2).
pub const DATASET_HOLD: &str = "dataset.hold";
/// Release a hold: [`crate::params::HoldParams`] (API 2.2).
pub const DATASET_RELEASE: &str = "dataset.release";
/// The holds on snapshots: [`crate::params::HoldsParams`]; answers
/// [`crate::dataset::HoldInfo`]s (API 2.2).
pub const DATASET_HOLDS: &str = "dataset.holds";

/// Open a session on the replication port: [`crate::params::HelloParams`]
/// (the first request there; refused on the admin socket).
pub const REPLICATION_HELLO: &str = "replication.hello";
/// Make a replication token: [`crate::params::TokenAddParams`]; answers
/// [`crate::params::TokenAdded`] (API 2.2).
pub const REPLICATION_TOKEN_ADD: &str = "replication.token_add";
/// The replication tokens: answers [`crate::params::TokenInfo`]s.
pub const REPLICATION_TOKEN_LIST: &str = "replication.token_list";
/// Remove a replication token by label: [`crate::params::NameParams`].
pub const REPLICATION_TOKEN_DEL: &str = "replication.token_del";
/// Where replication listens and its certificate: answers
/// [`crate::params::ReplicationInfo`].
pub const REPLICATION_INFO: &str = "replication.info";

/// The methods whose request or reply carries a streamed body.
pub const STREAMING: &[&str] = &[DATASET_SEND, DATASET_RECEIVE];

/// Every method, for error messages and documentation.
pub const ALL: &[&str] = &[
    DAEMON_PING,
    DAEMON_STOP,
    DAEMON_STATS,
    POOL_CREATE,
    POOL_IMPORT,
    POOL_EXPORT,
    POOL_DESTROY,
    POOL_LIST,
    POOL_STATUS,
    POOL_SCRUB,
    POOL_OFFLINE,
    POOL_ONLINE,
    POOL_REPLACE,
    POOL_ADD_LOG,
    POOL_REMOVE,
    POOL_CLEAR,
    POOL_IOSTAT,
    POOL_SYNC,
    OBJECT_WRITE,
    OBJECT_READ,
    OBJECT_LIST,
    OBJECT_DELETE,
    DATASET_CREATE,
    DATASET_DESTROY,
    DATASET_LIST,
    DATASET_GET,
    DATASET_SET,
    DATASET_INHERIT,
    DATASET_RENAME,
    DATASET_SNAPSHOT,
    DATASET_ROLLBACK,
    DATASET_CLONE,
    DATASET_PROMOTE,
    VOLUME_CREATE,
    VOLUME_RESIZE,
    KEY_LOAD,
    KEY_UNLOAD,
    KEY_CHANGE,
    KEY_LIST,
    DATASET_SEND,
    DATASET_RECEIVE,
    DATASET_RECEIVE_ABORT,
    DATASET_HOLD,
    DATASET_RELEASE,
    DATASET_HOLDS,
    REPLICATION_HELLO,
    REPLICATION_TOKEN_ADD,
    REPLICATION_TOKEN_LIST,
    REPLICATION_TOKEN_DEL,
    REPLICATION_INFO,
    POOL_INJECT,
    USER_ADD,
    USER_DEL,
    USER_PASSWD,
    USER_CHAP,
    USER_LIST,
    USER_ADMIN,
    API_TOKEN_ADD,
    API_TOKEN_LIST,
    API_TOKEN_DEL,
    SHARE_ADD,
    SHARE_DEL,
    SHARE_LIST,
    DATASET_MOUNT,
    DATASET_UNMOUNT,
    DATASET_MOUNTS,
    SCHEDULE_ADD,
    SCHEDULE_DEL,
    SCHEDULE_LIST,
    SCHEDULE_RUN,
    EVENTS_LIST,
    DISK_LIST,
    DISK_HEALTH,
    DISK_SELFTEST,
    ALERT_ADD,
    ALERT_DEL,
    ALERT_LIST,
    ALERT_TEST,
    STATS_HISTORY,
    LINK_CREATE,
    LINK_LIST,
    LINK_REVOKE,
];
