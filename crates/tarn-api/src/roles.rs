//! Who may call what over the HTTPS API, and the reference of every
//! method (docs/api.md is generated from [`METHODS`]).
//!
//! The admin socket is root's: every method, no roles. Over HTTPS a
//! caller is a tarn user, and each method needs a role:
//!
//! - [`Role::User`]: any user who logged in. These answer only what is
//!   the user's own: the shares that list them, the datasets of those
//!   shares, their own password (the HTTPS front end filters and checks
//!   that, with [`visible_to`]).
//! - [`Role::Admin`]: users made administrators (`tarn user admin NAME
//!   on`); everything that changes pools, datasets, users and shares.
//! - [`Role::Local`]: never over HTTPS. Methods that read or write paths
//!   of the server's own filesystem as root (objects from files, FUSE
//!   mounts on any directory, fault injection), stream bodies the HTTP
//!   front end does not carry (send, receive), and what belongs to
//!   another transport (`daemon.stop`, `replication.hello`).

use crate::method as m;

/// What a method needs over HTTPS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Any logged-in user (answers filtered to what is theirs).
    User,
    /// An administrator.
    Admin,
    /// Not over HTTPS: the admin socket only.
    Local,
}

impl Role {
    /// How docs/api.md names it.
    pub fn name(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Admin => "admin",
            Role::Local => "socket only",
        }
    }
}

/// Every method: (name, role over HTTPS, what it does, its parameters).
pub const METHODS: &[(&str, Role, &str, &str)] = &[
    (
        m::DAEMON_PING,
        Role::User,
        "version, pid and API version of the daemon",
        "{}",
    ),
    (
        m::DAEMON_STOP,
        Role::Local,
        "export every pool and stop the daemon",
        "{}",
    ),
    (
        m::DAEMON_STATS,
        Role::Admin,
        "connection counters of the servers",
        "{}",
    ),
    (
        m::POOL_CREATE,
        Role::Admin,
        "create a pool",
        "CreateRequest",
    ),
    (
        m::POOL_IMPORT,
        Role::Admin,
        "find or import pools",
        "ImportRequest",
    ),
    (m::POOL_EXPORT, Role::Admin, "export a pool", "ForceParams"),
    (
        m::POOL_DESTROY,
        Role::Admin,
        "destroy a pool",
        "ForceParams",
    ),
    (
        m::POOL_LIST,
        Role::Admin,
        "pools with size, allocation and health",
        "{}",
    ),
    (
        m::POOL_STATUS,
        Role::Admin,
        "pool health, devices, scan, cache",
        "OptionalNameParams",
    ),
    (
        m::POOL_SCRUB,
        Role::Admin,
        "start, pause, resume or cancel a scrub",
        "ScrubParams",
    ),
    (
        m::POOL_OFFLINE,
        Role::Admin,
        "take a device out of service",
        "DeviceParams",
    ),
    (
        m::POOL_ONLINE,
        Role::Admin,
        "bring a device back",
        "DeviceParams",
    ),
    (
        m::POOL_REPLACE,
        Role::Admin,
        "replace a device",
        "ReplaceParams",
    ),
    (
        m::POOL_ADD_LOG,
        Role::Admin,
        "add a log vdev",
        "AddLogParams",
    ),
    (
        m::POOL_REMOVE,
        Role::Admin,
        "remove a log vdev",
        "DeviceParams",
    ),
    (
        m::POOL_CLEAR,
        Role::Admin,
        "reset error counters",
        "ClearParams",
    ),
    (
        m::POOL_IOSTAT,
        Role::Admin,
        "cumulative I/O counters",
        "OptionalNameParams",
    ),
    (
        m::POOL_SYNC,
        Role::Admin,
        "commit the open txg now",
        "NameParams",
    ),
    (
        m::POOL_INJECT,
        Role::Local,
        "inject device faults (drills)",
        "InjectParams",
    ),
    (
        m::OBJECT_WRITE,
        Role::Local,
        "write an object from a file of the server",
        "ObjectWriteParams",
    ),
    (
        m::OBJECT_READ,
        Role::Local,
        "read an object into a file of the server",
        "ObjectReadParams",
    ),
    (m::OBJECT_LIST, Role::Admin, "list objects", "PoolParams"),
    (
        m::OBJECT_DELETE,
        Role::Admin,
        "delete an object",
        "ObjectParams",
    ),
    (
        m::SCHEDULE_ADD,
        Role::Admin,
        "add or replace a schedule",
        "ScheduleAddParams",
    ),
    (
        m::SCHEDULE_DEL,
        Role::Admin,
        "remove a schedule",
        "ScheduleParams",
    ),
    (
        m::SCHEDULE_LIST,
        Role::Admin,
        "schedules with their latest runs",
        "{}",
    ),
    (
        m::SCHEDULE_RUN,
        Role::Admin,
        "run a schedule now",
        "ScheduleParams",
    ),
    (m::DISK_LIST, Role::Admin, "health of every device", "{}"),
    (
        m::DISK_HEALTH,
        Role::Admin,
        "health of one device",
        "DiskParams",
    ),
    (
        m::DISK_SELFTEST,
        Role::Admin,
        "start a SMART self-test",
        "SelftestParams",
    ),
    (m::EVENTS_LIST, Role::Admin, "the event log", "EventsParams"),
    (
        m::ALERT_ADD,
        Role::Admin,
        "add or replace an alert",
        "AlertAddParams",
    ),
    (m::ALERT_DEL, Role::Admin, "remove an alert", "AlertParams"),
    (
        m::ALERT_LIST,
        Role::Admin,
        "the alerts (never their passwords)",
        "{}",
    ),
    (
        m::ALERT_TEST,
        Role::Admin,
        "send a test event through alerts",
        "OptionalNameParams",
    ),
    (
        m::DATASET_CREATE,
        Role::Admin,
        "create a filesystem",
        "DatasetCreateParams",
    ),
    (
        m::DATASET_DESTROY,
        Role::Admin,
        "destroy a dataset or snapshot",
        "DatasetDestroyParams",
    ),
    (
        m::DATASET_LIST,
        Role::User,
        "datasets (a user: those of their shares)",
        "DatasetListParams",
    ),
    (
        m::DATASET_GET,
        Role::Admin,
        "read properties",
        "DatasetGetParams",
    ),
    (
        m::DATASET_SET,
        Role::Admin,
        "set properties",
        "DatasetSetParams",
    ),
    (
        m::DATASET_INHERIT,
        Role::Admin,
        "clear a property",
        "DatasetInheritParams",
    ),
    (
        m::DATASET_RENAME,
        Role::Admin,
        "rename a dataset",
        "RenameParams",
    ),
    (
        m::DATASET_SNAPSHOT,
        Role::Admin,
        "take snapshots",
        "SnapshotParams",
    ),
    (
        m::DATASET_ROLLBACK,
        Role::Admin,
        "roll back to a snapshot",
        "RollbackParams",
    ),
    (
        m::DATASET_CLONE,
        Role::Admin,
        "clone a snapshot",
        "CloneParams",
    ),
    (
        m::DATASET_PROMOTE,
        Role::Admin,
        "promote a clone",
        "NameParams",
    ),
    (
        m::DATASET_MOUNT,
        Role::Local,
        "mount with FUSE on a directory of the server",
        "MountParams",
    ),
    (m::DATASET_UNMOUNT, Role::Local, "unmount", "UnmountParams"),
    (m::DATASET_MOUNTS, Role::Admin, "the FUSE mounts", "{}"),
    (
        m::DATASET_SEND,
        Role::Local,
        "write a send stream",
        "SendParams",
    ),
    (
        m::DATASET_RECEIVE,
        Role::Local,
        "apply a send stream",
        "ReceiveParams",
    ),
    (
        m::DATASET_RECEIVE_ABORT,
        Role::Admin,
        "undo a partial receive",
        "NameParams",
    ),
    (m::DATASET_HOLD, Role::Admin, "hold snapshots", "HoldParams"),
    (
        m::DATASET_RELEASE,
        Role::Admin,
        "release holds",
        "HoldParams",
    ),
    (
        m::DATASET_HOLDS,
        Role::Admin,
        "the holds on snapshots",
        "HoldsParams",
    ),
    (
        m::VOLUME_CREATE,
        Role::Admin,
        "create a volume",
        "VolumeCreateParams",
    ),
    (
        m::VOLUME_RESIZE,
        Role::Admin,
        "resize a volume",
        "VolumeResizeParams",
    ),
    (
        m::KEY_LOAD,
        Role::Admin,
        "load encryption keys",
        "KeyLoadParams",
    ),
    (
        m::KEY_UNLOAD,
        Role::Admin,
        "unload encryption keys",
        "KeyUnloadParams",
    ),
    (
        m::KEY_CHANGE,
        Role::Admin,
        "change a wrapping key",
        "KeyChangeParams",
    ),
    (
        m::KEY_LIST,
        Role::Admin,
        "encryption roots and key status",
        "OptionalNameParams",
    ),
    (
        m::REPLICATION_HELLO,
        Role::Local,
        "(the replication port's first request)",
        "HelloParams",
    ),
    (
        m::REPLICATION_TOKEN_ADD,
        Role::Admin,
        "make a replication token",
        "TokenAddParams",
    ),
    (
        m::REPLICATION_TOKEN_LIST,
        Role::Admin,
        "the replication tokens",
        "{}",
    ),
    (
        m::REPLICATION_TOKEN_DEL,
        Role::Admin,
        "remove a replication token",
        "NameParams",
    ),
    (
        m::REPLICATION_INFO,
        Role::Admin,
        "the replication port and certificate",
        "{}",
    ),
    (m::USER_ADD, Role::Admin, "add a user", "UserAddParams"),
    (m::USER_DEL, Role::Admin, "remove a user", "UserParams"),
    (
        m::USER_PASSWD,
        Role::User,
        "change a password (a user: their own)",
        "UserPasswdParams",
    ),
    (
        m::USER_CHAP,
        Role::Admin,
        "set a CHAP secret",
        "UserChapParams",
    ),
    (m::USER_LIST, Role::Admin, "the users", "{}"),
    (
        m::USER_ADMIN,
        Role::Admin,
        "make a user an administrator, or not",
        "UserAdminParams",
    ),
    (
        m::API_TOKEN_ADD,
        Role::Admin,
        "make an HTTPS API token",
        "ApiTokenAddParams",
    ),
    (m::API_TOKEN_LIST, Role::Admin, "the HTTPS API tokens", "{}"),
    (
        m::API_TOKEN_DEL,
        Role::Admin,
        "remove an HTTPS API token",
        "NameParams",
    ),
    (
        m::SHARE_ADD,
        Role::Admin,
        "add or replace a share",
        "ShareAddParams",
    ),
    (
        m::SHARE_DEL,
        Role::Admin,
        "remove a share",
        "ShareDelParams",
    ),
    (
        m::SHARE_LIST,
        Role::User,
        "shares (a user: those that list them)",
        "{}",
    ),
    (
        m::STATS_HISTORY,
        Role::Admin,
        "rates per pool and protocol over the last hour or day",
        "HistoryParams",
    ),
    (
        m::LINK_CREATE,
        Role::User,
        "make a share link (a user: to their shares, as themselves)",
        "LinkCreateParams",
    ),
    (
        m::LINK_LIST,
        Role::User,
        "the share links (a user: their own)",
        "{}",
    ),
    (
        m::LINK_REVOKE,
        Role::User,
        "revoke a share link (a user: their own)",
        "NameParams",
    ),
];

/// The role `method` needs over HTTPS; an unknown method is `Local`.
pub fn role(method: &str) -> Role {
    METHODS
        .iter()
        .find(|(n, ..)| *n == method)
        .map_or(Role::Local, |(_, r, ..)| *r)
}

/// Whether a share (by its record) is `user`'s: its WebDAV or SMB users
/// list them.
pub fn share_is_users(share: &crate::access::Share, user: &str) -> bool {
    share
        .webdav
        .as_ref()
        .is_some_and(|w| w.users.contains_key(user))
        || share
            .smb
            .as_ref()
            .is_some_and(|s| s.users.contains_key(user))
}

/// Whether a dataset (or snapshot) `name` is visible to a user whose
/// shares serve `datasets`: it is one of them, below one, or a snapshot
/// of one of those.
pub fn visible_to(name: &str, datasets: &[String]) -> bool {
    let fs = name.split('@').next().unwrap_or(name);
    datasets.iter().any(|d| {
        fs == d
            || fs
                .strip_prefix(d.as_str())
                .is_some_and(|r| r.starts_with('/'))
    })
}

/// Every string in a JSON value, with the key it sits under (the nearest
/// object key; "" at the top).
fn strings<'a>(v: &'a serde_json::Value, key: &'a str, out: &mut Vec<(&'a str, &'a str)>) {
    match v {
        serde_json::Value::String(s) => out.push((key, s)),
        serde_json::Value::Array(a) => a.iter().for_each(|x| strings(x, key, out)),
        serde_json::Value::Object(o) => o.iter().for_each(|(k, x)| strings(x, k, out)),
        _ => {}
    }
}

fn has_key(v: &serde_json::Value, want: &str) -> bool {
    match v {
        serde_json::Value::Array(a) => a.iter().any(|x| has_key(x, want)),
        serde_json::Value::Object(o) => o.iter().any(|(k, x)| k == want || has_key(x, want)),
        _ => false,
    }
}

/// True when nothing is at `path` (not even a dangling link): a call
/// naming it fails on its own, so it needs no refusal. Any other error
/// (a link to a pipe, no permission) is not "nothing there".
fn absent(path: &str) -> bool {
    matches!(std::fs::symlink_metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

/// Whether `path` is `/dev` or below it, with no `.` or `..` component.
fn under_dev(path: &str) -> bool {
    (path == "/dev" || path.starts_with("/dev/")) && !path.split('/').any(|c| c == "." || c == "..")
}

/// Whether `path`, named as a pool's device over HTTPS, is one: under
/// `/dev/` with no `.` or `..` component (`/dev/../etc/shadow` is not),
/// and, if anything is there, a block device once its links are
/// followed (not `/dev/null`, nor `/dev/fd/N`, an open file or pipe of
/// the daemon's, nor a file in `/dev/shm`).
fn dev_path_ok(path: &str) -> bool {
    use std::os::unix::fs::FileTypeExt;
    if !under_dev(path) || path == "/dev" {
        return false;
    }
    if absent(path) {
        return true;
    }
    std::fs::canonicalize(path).is_ok_and(|real| {
        real.starts_with("/dev/")
            && std::fs::metadata(&real).is_ok_and(|m| m.file_type().is_block_device())
    })
}

/// Whether `dir`, a folder an import over HTTPS searches for a pool's
/// devices, is one only root can fill: under `/dev` with no `.` or `..`,
/// and it and every folder above it up to `/dev` owned by root and
/// writable by nobody else (not `/dev/shm`, nor a folder a user made
/// there), so no file in it passes for a pool's device that root did not
/// put there.
fn dev_dir_ok(dir: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    if !under_dev(dir) {
        return false;
    }
    if absent(dir) {
        return true;
    }
    let Ok(real) = std::fs::canonicalize(dir) else {
        return false;
    };
    if !real.starts_with("/dev") {
        return false;
    }
    real.ancestors()
        .take_while(|p| p.starts_with("/dev"))
        .all(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0)
        })
}

/// Why an administrator's call is refused over HTTPS although the method
/// is theirs: parameters that would make the daemon (root) read, run or
/// write something of the server's own filesystem, which the `tarn`
/// command on the machine may do and a web session may not. None: fine.
///
/// - devices of pools that are not block devices under `/dev/` (a file
///   "device" would overwrite any file; see `dev_path_ok`);
/// - `mountpoint` and `file://` key locations (a mount over a system
///   folder; a key read from any file);
/// - replication schedules (they name token and credential files the
///   daemon reads and sends) and program alerts (a program run as root).
///
/// The checks below look for fields by name, so they hold only for params
/// that are an object: anything else is refused here (and by the
/// dispatcher), since serde would read an array as the fields in order.
/// The devices of the pool methods are also checked as the dispatcher
/// will decode them, so a name without a `/` (a file in the daemon's
/// working folder) is no way around the rule.
pub fn https_refusal(method: &str, params: &serde_json::Value) -> Option<&'static str> {
    if !(params.is_object() || params.is_null()) {
        return Some("params are a JSON object of named fields");
    }
    let mut all = Vec::new();
    strings(params, "", &mut all);
    match method {
        m::POOL_CREATE | m::POOL_REPLACE | m::POOL_ADD_LOG | m::POOL_IMPORT => {
            (all.iter().any(|(k, s)| {
                *k == "mountpoint"
                    || (*k == "keylocation" && s.starts_with("file:"))
                    || (*k == "dirs" && !dev_dir_ok(s))
                    || (*k != "dirs" && s.contains('/') && !dev_path_ok(s))
            }) || pool_devices(method, params).iter().any(|d| !dev_path_ok(d)))
            .then_some(
                "over HTTPS a pool's devices are block devices under /dev/ and mountpoints \
                 and file:// key locations are refused (files and folders of the server: \
                 the tarn command)",
            )
        }
        m::DATASET_CREATE
        | m::VOLUME_CREATE
        | m::DATASET_CLONE
        | m::DATASET_SET
        | m::KEY_LOAD
        | m::KEY_CHANGE => {
            let property = params.get("property").and_then(|p| p.as_str());
            let refused = all.iter().any(|(k, s)| {
                *k == "mountpoint"
                    || ((*k == "keylocation" || *k == "location") && s.starts_with("file:"))
                    || (*k == "value" && property == Some("mountpoint"))
                    || (*k == "value" && property == Some("keylocation") && s.starts_with("file:"))
            });
            refused.then_some(
                "over HTTPS mountpoints and file:// key locations are refused (they name folders \
                 and files of the server): use the tarn command",
            )
        }
        m::SCHEDULE_ADD => has_key(params, "replicate").then_some(
            "replication schedules name files of the server: add them with the tarn command",
        ),
        m::ALERT_ADD => has_key(params, "program")
            .then_some("program alerts run as root: add them with the tarn command"),
        _ => None,
    }
}

/// The devices a pool method's params name, decoded as the dispatcher
/// decodes them (params it cannot decode name none: the call fails there).
fn pool_devices(method: &str, params: &serde_json::Value) -> Vec<String> {
    use crate::params::{AddLogParams, ReplaceParams};
    use crate::pool::{CreateRequest, ImportRequest};
    let p = || params.clone();
    match method {
        m::POOL_CREATE => serde_json::from_value::<CreateRequest>(p())
            .map(|r| r.vdevs.into_iter().flat_map(|v| v.devices).collect())
            .unwrap_or_default(),
        m::POOL_ADD_LOG => serde_json::from_value::<AddLogParams>(p())
            .map(|r| r.vdev.devices)
            .unwrap_or_default(),
        m::POOL_REPLACE => serde_json::from_value::<ReplaceParams>(p())
            .map(|r| vec![r.new])
            .unwrap_or_default(),
        m::POOL_IMPORT => serde_json::from_value::<ImportRequest>(p())
            .map(|r| r.devices)
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The method table of docs/api.md.
pub fn markdown_table() -> String {
    let mut out =
        String::from("| method | role over HTTPS | params | what it does |\n|---|---|---|---|\n");
    for (name, role, what, params) in METHODS {
        out.push_str(&format!(
            "| `{name}` | {} | `{params}` | {what} |\n",
            role.name()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_has_a_role_once() {
        for m in crate::method::ALL {
            let n = METHODS.iter().filter(|(x, ..)| x == m).count();
            assert_eq!(n, 1, "{m} appears {n} times in roles::METHODS");
        }
        assert_eq!(
            METHODS.len(),
            crate::method::ALL.len(),
            "a method not in method::ALL"
        );
        assert_eq!(role("pool.destroy"), Role::Admin);
        assert_eq!(role("share.list"), Role::User);
        assert_eq!(role("object.write"), Role::Local);
        assert_eq!(role("no.such"), Role::Local);
    }

    #[test]
    fn what_an_administrator_may_not_do_over_https() {
        use serde_json::json;
        let refused = [
            (
                m::POOL_CREATE,
                json!({"name": "t", "vdevs": [{"kind": "mirror", "devices": ["/etc/passwd", "/dev/sdb"]}]}),
            ),
            (
                m::POOL_REPLACE,
                json!({"name": "t", "old": "/dev/sdb", "new": "/root/x"}),
            ),
            (m::POOL_IMPORT, json!({"dirs": ["/home"]})),
            (m::POOL_IMPORT, json!({"dirs": ["/dev/../home"]})),
            (m::POOL_IMPORT, json!({"devices": ["/dev/null"]})),
            (
                m::POOL_CREATE,
                json!({"name": "t", "vdevs": [{"kind": "mirror", "devices": ["/dev/../etc/shadow", "/dev/./sdb"]}]}),
            ),
            // Under /dev/ but no block device: a character device, and
            // (through its link) the daemon's own open file.
            (
                m::POOL_CREATE,
                json!({"name": "t", "vdevs": [{"kind": "stripe", "devices": ["/dev/null"]}]}),
            ),
            (
                m::POOL_CREATE,
                json!({"name": "t", "vdevs": [{"kind": "stripe", "devices": ["/dev/sdb"]}], "properties": {"mountpoint": "/dev/shm"}}),
            ),
            (
                m::DATASET_CLONE,
                json!({"snapshot": "t/a@s", "name": "t/b", "properties": {"mountpoint": "/etc"}}),
            ),
            (
                m::DATASET_CREATE,
                json!({"name": "t/a", "properties": {"mountpoint": "/etc"}}),
            ),
            (
                m::DATASET_CREATE,
                json!({"name": "t/a", "properties": {"keylocation": "file:///etc/shadow"}}),
            ),
            (
                m::DATASET_SET,
                json!({"name": "t/a", "property": "mountpoint", "value": "/usr"}),
            ),
            (
                m::KEY_LOAD,
                json!({"name": "t/a", "location": "file:///etc/shadow"}),
            ),
            (
                m::KEY_CHANGE,
                json!({"name": "t/a", "keylocation": "file:///k"}),
            ),
            (
                m::SCHEDULE_ADD,
                json!({"schedule": {"name": "x", "pool": "t", "kind": {"replicate": {}}}}),
            ),
            (
                m::ALERT_ADD,
                json!({"alert": {"name": "x", "target": {"program": {"path": "/bin/sh"}}}}),
            ),
            // The fields in order, as serde would read an array: no names
            // for the checks to find.
            (m::DATASET_SET, json!(["t/a", "mountpoint", "/etc"])),
            (
                m::KEY_LOAD,
                json!(["t/a", null, "file:///etc/shadow", false]),
            ),
            (
                m::LINK_CREATE,
                json!(["share", "", true, null, null, "t/someone"]),
            ),
            // A device without a `/`: a file in the daemon's working folder.
            (
                m::POOL_CREATE,
                json!({"name": "t", "vdevs": [{"kind": "single", "devices": ["swap.img"]}], "force": true}),
            ),
            (
                m::POOL_CREATE,
                json!({"name": "t", "vdevs": [["single", ["swap.img"]]]}),
            ),
            (
                m::POOL_ADD_LOG,
                json!({"name": "t", "vdev": {"kind": "single", "devices": ["log.img"]}}),
            ),
            (
                m::POOL_REPLACE,
                json!({"name": "t", "old": "/dev/sdb", "new": "disk.img"}),
            ),
            (m::POOL_IMPORT, json!({"devices": ["member.img"]})),
        ];
        for (method, p) in refused {
            assert!(https_refusal(method, &p).is_some(), "{method} {p}");
        }
        let fine = [
            (
                m::POOL_CREATE,
                json!({"name": "t", "vdevs": [{"kind": "mirror", "devices": ["/dev/sdzz", "/dev/disk/by-id/ata-x"]}]}),
            ),
            (m::POOL_IMPORT, json!({"dirs": ["/dev/disk/by-id"]})),
            (m::POOL_IMPORT, json!({"dirs": ["/dev"]})),
            (
                m::DATASET_CLONE,
                json!({"snapshot": "t/a@s", "name": "t/b", "properties": {"compression": "zstd"}}),
            ),
            (
                m::DATASET_CREATE,
                json!({"name": "t/a", "properties": {"compression": "lz4"}}),
            ),
            (
                m::DATASET_SET,
                json!({"name": "t/a", "property": "compression", "value": "zstd"}),
            ),
            (m::KEY_LOAD, json!({"name": "t/a", "key": "a passphrase"})),
            (
                m::SCHEDULE_ADD,
                json!({"schedule": {"name": "x", "pool": "t", "kind": {"scrub": {}}}}),
            ),
            (
                m::ALERT_ADD,
                json!({"alert": {"name": "x", "target": {"webhook": {"url": "https://h/x"}}}}),
            ),
            (
                m::SHARE_ADD,
                json!({"share": {"name": "x", "dataset": "t/a"}}),
            ),
        ];
        for (method, p) in fine {
            assert!(https_refusal(method, &p).is_none(), "{method} {p}");
        }
        // The daemon's own open file, through /dev/fd: a link to a file.
        let f = tempfile::tempfile().unwrap();
        let fd = format!("/dev/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&f));
        let p = json!({"name": "t", "devices": [fd]});
        assert!(https_refusal(m::POOL_ADD_LOG, &p).is_some(), "{p}");
        // A folder any local user can write into, and one made inside it
        // (where /dev/shm is such a folder).
        use std::os::unix::fs::PermissionsExt;
        if std::fs::metadata("/dev/shm").is_ok_and(|m| m.permissions().mode() & 0o002 != 0) {
            let made = tempfile::tempdir_in("/dev/shm").unwrap();
            std::fs::set_permissions(made.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
            for d in ["/dev/shm", made.path().to_str().unwrap()] {
                let p = json!({"dirs": [d]});
                assert!(https_refusal(m::POOL_IMPORT, &p).is_some(), "{d}");
            }
        }
        // A block device that exists passes (most machines have one of
        // these), also through a link to it.
        use std::os::unix::fs::FileTypeExt;
        let block = ["/dev/loop0", "/dev/vda", "/dev/sda", "/dev/nvme0n1"]
            .into_iter()
            .find(|d| std::fs::metadata(d).is_ok_and(|m| m.file_type().is_block_device()));
        if let Some(d) = block {
            let p = json!({"name": "t", "vdevs": [{"kind": "stripe", "devices": [d]}]});
            assert!(https_refusal(m::POOL_CREATE, &p).is_none(), "{d}");
        }
    }

    /// docs/api.md holds the table as the code has it.
    #[test]
    fn the_reference_is_the_code() {
        let doc = include_str!("../../../docs/api.md");
        assert!(
            doc.contains(&markdown_table()),
            "docs/api.md's method table differs from roles::METHODS: paste \
             tarn_api::roles::markdown_table() there"
        );
    }

    #[test]
    fn visibility_follows_dataset_names() {
        let mine = vec!["tank/photos".to_string()];
        assert!(visible_to("tank/photos", &mine));
        assert!(visible_to("tank/photos@mon", &mine));
        assert!(visible_to("tank/photos/2026@mon", &mine));
        assert!(!visible_to("tank/photos2", &mine));
        assert!(!visible_to("tank", &mine));
        assert!(!visible_to("tank/other@photos", &mine));
    }
}
