//! The admin API: methods, parameters, errors and line framing.
//!
//! A request is one JSON object on one line:
//! `{"id":1,"method":"pool.status","params":{"name":"tank"}}`. The answer is
//! one line too, carrying the same id and either a `result` or an `error`
//! with a machine-readable `code` and a sentence for the operator:
//! `{"id":1,"error":{"code":"not_found","message":"..."}}`.
//!
//! [`dispatch`] is the only place that knows which method calls which
//! [`Backend`] function. It does not know about sockets, so the web page can
//! later reach the same methods over HTTPS. Parameters are typed structs that
//! refuse unknown fields: a misspelt `"forse": true` is an error, never a
//! silently ignored flag.

use std::fmt;
use std::io::{self, BufRead};

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::backend::{Backend, CreateRequest, ImportRequest, ScrubAction, VdevSpec};

/// Method names, shared by the client and [`dispatch`] so they cannot drift.
pub mod method {
    /// Liveness check: answers [`super::PingResult`].
    pub const DAEMON_PING: &str = "daemon.ping";
    /// Export every pool and stop the daemon (served by the socket transport).
    pub const DAEMON_STOP: &str = "daemon.stop";
    /// Create a pool: [`crate::backend::CreateRequest`].
    pub const POOL_CREATE: &str = "pool.create";
    /// Find or import pools: [`crate::backend::ImportRequest`].
    pub const POOL_IMPORT: &str = "pool.import";
    /// Export a pool: [`super::ForceParams`].
    pub const POOL_EXPORT: &str = "pool.export";
    /// Destroy a pool: [`super::ForceParams`].
    pub const POOL_DESTROY: &str = "pool.destroy";
    /// List imported pools.
    pub const POOL_LIST: &str = "pool.list";
    /// Status of one or all pools: [`super::OptionalNameParams`].
    pub const POOL_STATUS: &str = "pool.status";
    /// Start, pause, resume or cancel a scrub: [`super::ScrubParams`].
    pub const POOL_SCRUB: &str = "pool.scrub";
    /// Take a device out of service: [`super::DeviceParams`].
    pub const POOL_OFFLINE: &str = "pool.offline";
    /// Bring a device back: [`super::DeviceParams`].
    pub const POOL_ONLINE: &str = "pool.online";
    /// Replace a device: [`super::ReplaceParams`].
    pub const POOL_REPLACE: &str = "pool.replace";
    /// Add a log vdev: [`super::AddLogParams`].
    pub const POOL_ADD_LOG: &str = "pool.add_log";
    /// Remove a log vdev: [`super::DeviceParams`].
    pub const POOL_REMOVE: &str = "pool.remove";
    /// Reset error counters: [`super::ClearParams`].
    pub const POOL_CLEAR: &str = "pool.clear";
    /// Cumulative I/O counters: [`super::OptionalNameParams`].
    pub const POOL_IOSTAT: &str = "pool.iostat";
    /// Commit the open txg now: [`super::NameParams`].
    pub const POOL_SYNC: &str = "pool.sync";
    /// Write a raw object from a file: [`super::ObjectWriteParams`].
    pub const OBJECT_WRITE: &str = "object.write";
    /// Read a raw object into a file: [`super::ObjectReadParams`].
    pub const OBJECT_READ: &str = "object.read";
    /// List raw objects: [`super::PoolParams`].
    pub const OBJECT_LIST: &str = "object.list";
    /// Delete a raw object: [`super::ObjectParams`].
    pub const OBJECT_DELETE: &str = "object.delete";

    /// Create a filesystem: [`super::DatasetCreateParams`].
    pub const DATASET_CREATE: &str = "dataset.create";
    /// Destroy a dataset, snapshot or snapshot range: [`super::DatasetDestroyParams`].
    pub const DATASET_DESTROY: &str = "dataset.destroy";
    /// List datasets: [`super::DatasetListParams`].
    pub const DATASET_LIST: &str = "dataset.list";
    /// Property values: [`super::DatasetGetParams`].
    pub const DATASET_GET: &str = "dataset.get";
    /// Set a property: [`super::DatasetSetParams`].
    pub const DATASET_SET: &str = "dataset.set";
    /// Inherit a property: [`super::DatasetInheritParams`].
    pub const DATASET_INHERIT: &str = "dataset.inherit";
    /// Rename: [`super::DatasetRenameParams`].
    pub const DATASET_RENAME: &str = "dataset.rename";
    /// Take snapshots: [`super::SnapshotParams`].
    pub const DATASET_SNAPSHOT: &str = "dataset.snapshot";
    /// Roll back to a snapshot: [`super::RollbackParams`].
    pub const DATASET_ROLLBACK: &str = "dataset.rollback";
    /// Clone a snapshot: [`super::CloneParams`].
    pub const DATASET_CLONE: &str = "dataset.clone";
    /// Promote a clone: [`super::NameParams`].
    pub const DATASET_PROMOTE: &str = "dataset.promote";
    /// Inject or clear a device fault (drills): [`super::InjectParams`].
    pub const POOL_INJECT: &str = "pool.inject";
    /// Add a user: [`super::UserAddParams`].
    pub const USER_ADD: &str = "user.add";
    /// Remove a user: [`super::UserParams`].
    pub const USER_DEL: &str = "user.del";
    /// Change a password: [`super::UserPasswdParams`].
    pub const USER_PASSWD: &str = "user.passwd";
    /// List users: [`super::NoParams`].
    pub const USER_LIST: &str = "user.list";
    /// Add or replace a share: [`super::ShareAddParams`].
    pub const SHARE_ADD: &str = "share.add";
    /// Remove a share: [`super::ShareDelParams`].
    pub const SHARE_DEL: &str = "share.del";
    /// List shares: [`super::NoParams`].
    pub const SHARE_LIST: &str = "share.list";
    /// Mount a dataset with FUSE: [`super::MountParams`].
    pub const DATASET_MOUNT: &str = "dataset.mount";
    /// Unmount: [`super::UnmountParams`].
    pub const DATASET_UNMOUNT: &str = "dataset.unmount";
    /// List mounts: [`super::NoParams`].
    pub const DATASET_MOUNTS: &str = "dataset.mounts";

    /// Every method, for error messages and documentation.
    pub const ALL: &[&str] = &[
        DAEMON_PING,
        DAEMON_STOP,
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
        POOL_INJECT,
        USER_ADD,
        USER_DEL,
        USER_PASSWD,
        USER_LIST,
        SHARE_ADD,
        SHARE_DEL,
        SHARE_LIST,
        DATASET_MOUNT,
        DATASET_UNMOUNT,
        DATASET_MOUNTS,
    ];
}

/// What kind of failure an [`ApiError`] reports; clients branch on this,
/// people read the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The pool, device or object does not exist.
    NotFound,
    /// Something by that name already exists.
    Exists,
    /// The request is malformed or asks for something impossible.
    Invalid,
    /// The daemon or the pool is occupied; retry later.
    Busy,
    /// A device failed.
    Io,
    /// Data is damaged beyond what redundancy can repair.
    Damaged,
    /// A bug or an unexpected state in the daemon. Codes unknown to this
    /// build (from a newer daemon) also read as `internal`.
    #[serde(other)]
    Internal,
}

impl ErrorCode {
    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not_found",
            ErrorCode::Exists => "exists",
            ErrorCode::Invalid => "invalid",
            ErrorCode::Busy => "busy",
            ErrorCode::Io => "io",
            ErrorCode::Damaged => "damaged",
            ErrorCode::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error answered by the API. The message names the thing, the cause and,
/// where there is one, the fix; it is shown to the operator as is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// Machine-readable class.
    pub code: ErrorCode,
    /// Sentence for the operator.
    pub message: String,
}

impl ApiError {
    /// An error of any code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }

    /// `not_found`: the named thing does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    /// `exists`: the name is taken.
    pub fn exists(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Exists, message)
    }

    /// `invalid`: the request is malformed or impossible.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Invalid, message)
    }

    /// `busy`: try again later.
    pub fn busy(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Busy, message)
    }

    /// `io`: a device failed.
    pub fn io(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Io, message)
    }

    /// `damaged`: data is beyond repair.
    pub fn damaged(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Damaged, message)
    }

    /// `internal`: a bug or unexpected state.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

/// One request line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Chosen by the client and echoed in the response.
    #[serde(default)]
    pub id: Option<u64>,
    /// One of [`method::ALL`].
    pub method: String,
    /// Method parameters; absent or `null` means none.
    #[serde(default)]
    pub params: Value,
}

/// One response line: exactly one of `result` and `error` is present.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The request's id, or `null` when the request could not be read.
    pub id: Option<u64>,
    /// The method's result on success (may be `null`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The failure otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiError>,
}

impl Response {
    /// Wraps a dispatch outcome.
    pub fn new(id: Option<u64>, outcome: Result<Value, ApiError>) -> Self {
        match outcome {
            Ok(result) => Response {
                id,
                result: Some(result),
                error: None,
            },
            Err(error) => Response {
                id,
                result: None,
                error: Some(error),
            },
        }
    }

    /// The response as one line, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_else(|e| {
            let fallback = Response::new(
                self.id,
                Err(ApiError::internal(format!(
                    "the daemon could not encode its answer: {e}"
                ))),
            );
            serde_json::to_vec(&fallback).unwrap_or_default()
        });
        line.push(b'\n');
        line
    }
}

/// Decodes a request line. On failure returns the id (when one could be
/// read) together with an `invalid` error, so the caller can still answer.
pub fn parse_request(line: &[u8]) -> Result<Request, (Option<u64>, ApiError)> {
    let value: Value = serde_json::from_slice(line).map_err(|e| {
        (
            None,
            ApiError::invalid(format!(
                "request is not valid JSON ({e}); send one JSON object per line, \
                 e.g. {{\"id\":1,\"method\":\"daemon.ping\"}}"
            )),
        )
    })?;
    let id = value.get("id").and_then(Value::as_u64);
    serde_json::from_value(value).map_err(|e| {
        (
            id,
            ApiError::invalid(format!(
                "malformed request ({e}); expected {{\"id\":N,\"method\":\"...\",\"params\":{{...}}}}"
            )),
        )
    })
}

/// Outcome of [`read_line_bounded`].
#[derive(Debug, PartialEq, Eq)]
pub enum LineRead {
    /// A whole line is in the buffer (without its newline).
    Line,
    /// The line was longer than the limit; it has been consumed and dropped.
    TooLong,
    /// The peer closed the stream with no partial line pending.
    Eof,
}

/// Reads one `\n`-terminated line into `buf` (cleared first), holding at most
/// `max_bytes` of it in memory. A longer line is read to its end and
/// discarded, so the stream stays in step and the next line can be served.
/// A final line without a newline counts as a line.
pub fn read_line_bounded(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max_bytes: usize,
) -> io::Result<LineRead> {
    buf.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let chunk = match reader.fill_buf() {
            Ok(chunk) => chunk,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok(match (any, too_long) {
                (false, _) => LineRead::Eof,
                (true, true) => LineRead::TooLong,
                (true, false) => LineRead::Line,
            });
        }
        any = true;
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > max_bytes {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        reader.consume(if done { take + 1 } else { take });
        if done {
            return Ok(if too_long {
                LineRead::TooLong
            } else {
                LineRead::Line
            });
        }
    }
}

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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    pub fault: Option<tarn_vdev::Fault>,
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

/// A share as `share.list` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareInfo {
    /// The pool that stores it.
    pub pool: String,
    /// The share.
    pub share: crate::access::Share,
}

/// Result of `daemon.ping`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingResult {
    /// The daemon's version.
    pub version: String,
    /// The daemon's process id.
    pub pid: u32,
}

/// Result of `pool.sync`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncResult {
    /// The txg committed by the sync.
    pub txg: u64,
}

/// Decodes `params` for `method`; `null` reads as `{}`.
fn params<T: DeserializeOwned>(method: &str, params: Value) -> Result<T, ApiError> {
    let params = if params.is_null() {
        Value::Object(Default::default())
    } else {
        params
    };
    serde_json::from_value(params)
        .map_err(|e| ApiError::invalid(format!("bad params for {method}: {e}")))
}

/// Encodes a result.
fn reply<T: Serialize>(value: T) -> Result<Value, ApiError> {
    serde_json::to_value(value)
        .map_err(|e| ApiError::internal(format!("the daemon could not encode its answer: {e}")))
}

/// Runs one API call against `backend`. Transport-independent: the socket
/// daemon and any other front end call this with the decoded method and
/// params. `daemon.stop` belongs to the transport and is refused here.
pub fn dispatch(backend: &dyn Backend, method: &str, p: Value) -> Result<Value, ApiError> {
    use crate::api::method as m;
    match method {
        m::DAEMON_PING => {
            let NoParams {} = params(method, p)?;
            reply(PingResult {
                version: env!("CARGO_PKG_VERSION").to_string(),
                pid: std::process::id(),
            })
        }
        m::POOL_CREATE => {
            let req: CreateRequest = params(method, p)?;
            req.validate()?;
            reply(backend.pool_create(&req)?)
        }
        m::POOL_IMPORT => {
            let req: ImportRequest = params(method, p)?;
            req.validate()?;
            reply(backend.pool_import(&req)?)
        }
        m::POOL_EXPORT => {
            let ForceParams { name, force } = params(method, p)?;
            reply(backend.pool_export(&name, force)?)
        }
        m::POOL_DESTROY => {
            let ForceParams { name, force } = params(method, p)?;
            reply(backend.pool_destroy(&name, force)?)
        }
        m::POOL_LIST => {
            let NoParams {} = params(method, p)?;
            reply(backend.pool_list()?)
        }
        m::POOL_STATUS => {
            let OptionalNameParams { name } = params(method, p)?;
            reply(backend.pool_status(name.as_deref())?)
        }
        m::POOL_SCRUB => {
            let ScrubParams { name, action } = params(method, p)?;
            reply(backend.pool_scrub(&name, action)?)
        }
        m::POOL_OFFLINE => {
            let DeviceParams { name, device } = params(method, p)?;
            reply(backend.pool_offline(&name, &device)?)
        }
        m::POOL_ONLINE => {
            let DeviceParams { name, device } = params(method, p)?;
            reply(backend.pool_online(&name, &device)?)
        }
        m::POOL_REPLACE => {
            let ReplaceParams {
                name,
                old,
                new,
                force,
            } = params(method, p)?;
            reply(backend.pool_replace(&name, &old, &new, force)?)
        }
        m::POOL_ADD_LOG => {
            let AddLogParams { name, vdev, force } = params(method, p)?;
            reply(backend.pool_add_log(&name, &vdev, force)?)
        }
        m::POOL_REMOVE => {
            let DeviceParams { name, device } = params(method, p)?;
            reply(backend.pool_remove(&name, &device)?)
        }
        m::POOL_CLEAR => {
            let ClearParams { name, device } = params(method, p)?;
            reply(backend.pool_clear(&name, device.as_deref())?)
        }
        m::POOL_IOSTAT => {
            let OptionalNameParams { name } = params(method, p)?;
            reply(backend.pool_iostat(name.as_deref())?)
        }
        m::POOL_SYNC => {
            let NameParams { name } = params(method, p)?;
            let txg = backend.pool_sync(&name)?;
            reply(SyncResult { txg })
        }
        m::OBJECT_WRITE => {
            let ObjectWriteParams {
                pool,
                object,
                from_path,
                offset,
                sync,
            } = params(method, p)?;
            reply(backend.object_write(&pool, &object, &from_path, offset, sync)?)
        }
        m::OBJECT_READ => {
            let ObjectReadParams {
                pool,
                object,
                to_path,
            } = params(method, p)?;
            reply(backend.object_read(&pool, &object, &to_path)?)
        }
        m::OBJECT_LIST => {
            let PoolParams { pool } = params(method, p)?;
            reply(backend.object_list(&pool)?)
        }
        m::OBJECT_DELETE => {
            let ObjectParams { pool, object } = params(method, p)?;
            reply(backend.object_delete(&pool, &object)?)
        }
        m::DATASET_CREATE => {
            let DatasetCreateParams {
                name,
                properties,
                parents,
            } = params(method, p)?;
            reply(backend.dataset_create(&name, &properties, parents)?)
        }
        m::DATASET_DESTROY => {
            let DatasetDestroyParams { name, recursive } = params(method, p)?;
            reply(backend.dataset_destroy(&name, recursive)?)
        }
        m::DATASET_LIST => {
            let DatasetListParams { snapshots } = params(method, p)?;
            reply(backend.dataset_list(snapshots)?)
        }
        m::DATASET_GET => {
            let DatasetGetParams { name, properties } = params(method, p)?;
            reply(backend.dataset_get(&name, &properties)?)
        }
        m::DATASET_SET => {
            let DatasetSetParams {
                name,
                property,
                value,
            } = params(method, p)?;
            reply(backend.dataset_set(&name, &property, &value)?)
        }
        m::DATASET_INHERIT => {
            let DatasetInheritParams { name, property } = params(method, p)?;
            reply(backend.dataset_inherit(&name, &property)?)
        }
        m::DATASET_RENAME => {
            let DatasetRenameParams { name, new_name } = params(method, p)?;
            reply(backend.dataset_rename(&name, &new_name)?)
        }
        m::DATASET_SNAPSHOT => {
            let SnapshotParams { names, recursive } = params(method, p)?;
            if names.is_empty() {
                return Err(ApiError::invalid("name at least one snapshot (fs@name)"));
            }
            reply(backend.dataset_snapshot(&names, recursive)?)
        }
        m::DATASET_ROLLBACK => {
            let RollbackParams {
                snapshot,
                destroy_newer,
            } = params(method, p)?;
            reply(backend.dataset_rollback(&snapshot, destroy_newer)?)
        }
        m::DATASET_CLONE => {
            let CloneParams {
                snapshot,
                name,
                properties,
            } = params(method, p)?;
            reply(backend.dataset_clone(&snapshot, &name, &properties)?)
        }
        m::DATASET_PROMOTE => {
            let NameParams { name } = params(method, p)?;
            reply(backend.dataset_promote(&name)?)
        }
        m::POOL_INJECT => {
            let InjectParams {
                name,
                device,
                fault,
            } = params(method, p)?;
            if let Some(f) = &fault {
                if !(0.0..=1.0).contains(&f.probability) {
                    return Err(ApiError::invalid("probability must be between 0 and 1"));
                }
            }
            reply(backend.pool_inject(&name, &device, fault)?)
        }
        m::USER_ADD => {
            let UserAddParams {
                pool,
                name,
                password,
                uid,
                gid,
            } = params(method, p)?;
            reply(backend.user_add(pool.as_deref(), &name, &password, uid, gid)?)
        }
        m::USER_DEL => {
            let UserParams { pool, name } = params(method, p)?;
            reply(backend.user_del(pool.as_deref(), &name)?)
        }
        m::USER_PASSWD => {
            let UserPasswdParams {
                pool,
                name,
                password,
            } = params(method, p)?;
            reply(backend.user_passwd(pool.as_deref(), &name, &password)?)
        }
        m::USER_LIST => {
            let NoParams {} = params(method, p)?;
            reply(backend.user_list()?)
        }
        m::SHARE_ADD => {
            let ShareAddParams { share, owner } = params(method, p)?;
            reply(backend.share_add(&share, owner.as_deref())?)
        }
        m::SHARE_DEL => {
            let ShareDelParams { pool, name } = params(method, p)?;
            reply(backend.share_del(pool.as_deref(), &name)?)
        }
        m::SHARE_LIST => {
            let NoParams {} = params(method, p)?;
            reply(backend.share_list()?)
        }
        m::DATASET_MOUNT => {
            let MountParams {
                name,
                mountpoint,
                allow_other,
                read_only,
            } = params(method, p)?;
            reply(backend.dataset_mount(&name, mountpoint.as_deref(), allow_other, read_only)?)
        }
        m::DATASET_UNMOUNT => {
            let UnmountParams { name } = params(method, p)?;
            reply(backend.dataset_unmount(&name)?)
        }
        m::DATASET_MOUNTS => {
            let NoParams {} = params(method, p)?;
            reply(backend.dataset_mounts()?)
        }
        m::DAEMON_STOP => Err(ApiError::invalid(
            "daemon.stop is only served on the daemon's admin socket; use `tarn daemon stop`",
        )),
        other => Err(ApiError::invalid(format!(
            "unknown method {other:?}; known methods: {}",
            m::ALL.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn read_all(input: &[u8], max: usize) -> Vec<(LineRead, Vec<u8>)> {
        let mut reader = io::BufReader::with_capacity(7, Cursor::new(input.to_vec()));
        let mut out = Vec::new();
        let mut buf = Vec::new();
        loop {
            let r = read_line_bounded(&mut reader, &mut buf, max).unwrap();
            if r == LineRead::Eof {
                return out;
            }
            out.push((r, buf.clone()));
        }
    }

    #[test]
    fn bounded_lines_drop_oversized_and_keep_step() {
        let long = vec![b'x'; 40];
        let mut input = b"short\n".to_vec();
        input.extend_from_slice(&long);
        input.extend_from_slice(b"\nexact-ten!\nlast");
        let lines = read_all(&input, 10);
        assert_eq!(
            lines,
            vec![
                (LineRead::Line, b"short".to_vec()),
                (LineRead::TooLong, Vec::new()),
                (LineRead::Line, b"exact-ten!".to_vec()),
                (LineRead::Line, b"last".to_vec()),
            ]
        );
    }

    #[test]
    fn garbage_and_malformed_requests_are_invalid() {
        let (id, err) = parse_request(b"{not json").unwrap_err();
        assert_eq!(id, None);
        assert_eq!(err.code, ErrorCode::Invalid);

        let (id, err) = parse_request(br#"{"id":7,"methd":"daemon.ping"}"#).unwrap_err();
        assert_eq!(id, Some(7));
        assert_eq!(err.code, ErrorCode::Invalid);

        let req = parse_request(br#"{"id":3,"method":"pool.list"}"#).unwrap();
        assert_eq!(req.id, Some(3));
        assert!(req.params.is_null());
    }

    #[test]
    fn responses_round_trip() {
        let ok = Response::new(Some(1), Ok(Value::Null));
        assert_eq!(ok.to_line(), b"{\"id\":1,\"result\":null}\n");
        let err = Response::new(None, Err(ApiError::busy("later")));
        let text = String::from_utf8(err.to_line()).unwrap();
        assert_eq!(
            text,
            "{\"id\":null,\"error\":{\"code\":\"busy\",\"message\":\"later\"}}\n"
        );
        let back: Response = serde_json::from_str(&text).unwrap();
        assert_eq!(back.error.unwrap().code, ErrorCode::Busy);
        let future: ApiError = serde_json::from_str(r#"{"code":"quota","message":"m"}"#).unwrap();
        assert_eq!(future.code, ErrorCode::Internal);
    }
}
