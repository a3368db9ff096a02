//! tarn-api: the admin API of a tarn node, as plain data.
//!
//! Everything a client needs to talk to the daemon, and nothing of the
//! engine behind it: the method names ([`method`]), the request and
//! response lines and their framing ([`wire`]), the errors ([`ApiError`]),
//! every parameter and result type (pools, datasets, users, shares,
//! mounts), the [`Backend`] trait a node implements, and [`dispatch()`], the
//! one table that maps a method onto a [`Backend`] function. What every
//! client must read the same way lives here too: the `zpool`-style vdev
//! words ([`pool::parse_vdev_words`]) and which pools need attention
//! ([`pool::PoolStatus::needs_attention`]).
//!
//! The types here are the API's own copies, not the engine's: the daemon
//! converts its engine's types into them, so a client (the `tarn` command,
//! a web page) links this crate alone. Their JSON shape is the wire format;
//! changing it is a change of [`API_VERSION`].
//!
//! Layering: this crate depends on serde, serde_json and thiserror only. It
//! sits below `tarn-daemon` (which implements [`Backend`]) and `tarn-cli`
//! (which sends requests), and imports neither.

#![warn(missing_docs)]

pub mod access;
pub mod backend;
pub mod dataset;
pub mod dispatch;
pub mod error;
pub mod events;
pub mod health;
pub mod method;
pub mod params;
pub mod peer;
pub mod pool;
pub mod roles;
pub mod schedule;
pub mod time;
pub mod wire;

pub use backend::Backend;
pub use dispatch::{call, dispatch};
pub use error::{ApiError, ErrorCode};
pub use wire::{parse_request, read_line_bounded, LineRead, Request, Response};

/// Version of the admin API, `MAJOR.MINOR`, reported by `daemon.ping`.
///
/// The minor number grows when methods or optional fields are added (old
/// clients keep working); the major number when something a client relies
/// on changes. A client refuses a daemon of another major version rather
/// than misread its answers.
///
/// 2.0 added volumes: a dataset kind (`"volume"`) and a share field
/// (`nbd`) that a 1.x client cannot read, so it refuses the daemon instead
/// of failing on the first volume it lists.
///
/// 2.1 added iSCSI: a share field (`iscsi`), `user.chap`, the `chap` flag
/// of users and the `iscsi` counters of `daemon.stats`.
///
/// 2.3 added SMB: a share field (`smb`), the `smb` flag of `user.add`,
/// `user.passwd` and users, and the `smb` status of `daemon.stats`; and
/// schedules (`schedule.add`, `schedule.del`, `schedule.list`,
/// `schedule.run`).
///
/// 2.4 added self-test and replication schedules, and the `hourly`
/// period.
///
/// 2.5 added administrators (`user.admin`, the `admin` flag of users)
/// and the HTTPS API's tokens (`api.token_add`, `api.token_list`,
/// `api.token_del`).
///
/// 2.6 added share links (`link.create`, `link.list`, `link.revoke`).
pub const API_VERSION: &str = "2.6";

/// The major number of an API version string (`1` of `1.0`), or `None`
/// when the string is not a version.
pub fn api_major(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

/// Whether a daemon reporting API `version` speaks the same major version
/// as this build.
pub fn api_compatible(version: &str) -> bool {
    api_major(version).is_some() && api_major(version) == api_major(API_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_major() {
        assert_eq!(api_major("1.0"), Some(1));
        assert_eq!(api_major("12.3"), Some(12));
        assert_eq!(api_major(""), None);
        assert!(api_compatible(API_VERSION));
        assert!(api_compatible(&format!(
            "{}.99",
            api_major(API_VERSION).unwrap()
        )));
        assert!(!api_compatible("0.9"));
        assert!(!api_compatible("999.0"));
        assert!(!api_compatible("garbage"));
    }
}
