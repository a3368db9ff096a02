//! Users and shares as the API shows them: who may reach which dataset,
//! over NFS and WebDAV. The daemon stores shares in the pool in its own
//! record type, of the same JSON shape; users are stored with a password
//! hash the API never shows.
//!
//! The name checks here need no pool, so the client runs them before
//! sending and the daemon again before storing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// A user as `user.list` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    /// The pool that stores the user.
    pub pool: String,
    /// Login name.
    pub name: String,
    /// Numeric user id.
    pub uid: u32,
    /// Numeric group id.
    pub gid: u32,
    /// The user has a CHAP secret for iSCSI logins (API 2.1); the secret
    /// itself is never shown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chap: bool,
    /// The user may log in over SMB: an NT hash of their password is
    /// stored for Samba (API 2.3; `tarn user passwd --smb`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub smb: bool,
    /// An administrator of the web page and the HTTPS API (API 2.5).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
}

/// Read-only or read-write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// May read.
    Ro,
    /// May read and change.
    Rw,
}

/// How NFS exports a share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NfsShare {
    /// Client networks allowed (CIDR, e.g. `192.168.1.0/24`, `::1/128`).
    pub clients: Vec<String>,
    /// Refuse changes.
    #[serde(default)]
    pub read_only: bool,
    /// Map uid 0 to the anonymous ids (on by default, as in exports(5)).
    #[serde(default = "yes")]
    pub root_squash: bool,
    /// Map every uid to the anonymous ids.
    #[serde(default)]
    pub all_squash: bool,
    /// Anonymous uid.
    #[serde(default = "nobody")]
    pub anon_uid: u32,
    /// Anonymous gid.
    #[serde(default = "nobody")]
    pub anon_gid: u32,
}

fn yes() -> bool {
    true
}

fn nobody() -> u32 {
    65534
}

/// Which users reach a share over WebDAV.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebdavShare {
    /// User name → access.
    pub users: BTreeMap<String, Access>,
}

/// How NBD serves a volume share (API 2.0).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NbdShare {
    /// Client networks allowed (CIDR, e.g. `192.168.1.0/24`, `::1/128`).
    pub clients: Vec<String>,
    /// Refuse writes.
    #[serde(default)]
    pub read_only: bool,
}

/// How iSCSI serves a volume share (API 2.1): one target named `iqn`
/// with the volume as LUN 0.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiShare {
    /// The target's iSCSI name (`iqn.…`, `eui.…` or `naa.…`, lower case);
    /// unique on the node. Empty in `share.add`: the daemon names it
    /// `iqn.2026-11.org.tarn:POOL.SHARE`.
    #[serde(default)]
    pub iqn: String,
    /// Client networks that may see and use the target. Empty: any
    /// network, which is allowed only with CHAP.
    #[serde(default)]
    pub clients: Vec<String>,
    /// Initiator names (`InitiatorName`) that may log in; empty: any.
    #[serde(default)]
    pub initiators: Vec<String>,
    /// Initiators must log in with CHAP as this tarn user, with the
    /// user's CHAP secret (`tarn user chap`).
    #[serde(default)]
    pub chap: Option<String>,
    /// For mutual CHAP: the tarn user whose CHAP name and secret the
    /// target answers with when the initiator asks it to authenticate.
    #[serde(default)]
    pub mutual_chap: Option<String>,
    /// Refuse writes.
    #[serde(default)]
    pub read_only: bool,
}

/// SMB3 encryption of a share's traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmbEncrypt {
    /// Encrypt when the client asks (Samba's `if_required`).
    #[default]
    Off,
    /// Offer encryption; clients that support it use it.
    Desired,
    /// Refuse clients that cannot encrypt.
    Required,
}

/// How SMB (Samba) serves a filesystem share (API 2.3).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmbShare {
    /// User name → access. Users need an SMB password
    /// (`tarn user passwd --smb`).
    #[serde(default)]
    pub users: BTreeMap<String, Access>,
    /// Anyone may read without a password (as the anonymous user).
    #[serde(default)]
    pub guest: bool,
    /// A Time Machine backup target for Macs.
    #[serde(default)]
    pub timemachine: bool,
    /// Largest size Time Machine may fill, in bytes (0: no limit).
    #[serde(default)]
    pub tm_quota: u64,
    /// SMB3 encryption of the traffic.
    #[serde(default)]
    pub encrypt: SmbEncrypt,
    /// Signing required (it is always offered).
    #[serde(default)]
    pub signing_required: bool,
}

/// A share: a filesystem dataset and how it is served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Share {
    /// Share name: the NFS export path is `/NAME`, the WebDAV URL `/NAME/`,
    /// the NBD export name `NAME`.
    pub name: String,
    /// The dataset: a filesystem for NFS and WebDAV, a volume for NBD.
    pub dataset: String,
    /// NFS export, if any.
    #[serde(default)]
    pub nfs: Option<NfsShare>,
    /// WebDAV share, if any.
    #[serde(default)]
    pub webdav: Option<WebdavShare>,
    /// NBD export of a volume, if any (API 2.0): `nbd://HOST/NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd: Option<NbdShare>,
    /// iSCSI target of a volume, if any (API 2.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iscsi: Option<IscsiShare>,
    /// SMB share of a filesystem, if any (API 2.3): `\\HOST\NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smb: Option<SmbShare>,
}

/// A share as `share.list` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareInfo {
    /// The pool that stores it.
    pub pool: String,
    /// The share. For a damaged record only its name is known (the dataset
    /// is empty, neither NFS nor WebDAV set).
    pub share: Share,
    /// Why the share's stored record cannot be read, if it cannot: such a
    /// share is not served (API 1.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub damaged: Option<String>,
}

/// Checks a user name: what Unix tools accept.
pub fn check_user_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    // Samba reads a name such as `s-1-5-11` in a list of users as a
    // Windows security identifier (here: every authenticated user).
    let sid = name
        .strip_prefix("s-")
        .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()));
    if sid {
        return Err(ApiError::invalid(format!(
            "invalid user name '{name}': SMB would read it as a Windows security identifier \
             (a group of users); choose another"
        )));
    }
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "invalid user name '{name}': use up to 32 lowercase letters, digits, '_' or '-', \
             starting with a letter"
        )))
    }
}

/// Checks a share name: one path component.
pub fn check_share_name(name: &str) -> Result<(), ApiError> {
    check_name("share", name)
}

/// Checks the name of a share, schedule or alert (`what`): up to 64
/// letters, digits, '-', '_', '.', and not `.` or `..` (it may become a
/// path component or a section name).
pub fn check_name(what: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "invalid {what} name '{name}': use up to 64 letters, digits, '-', '_', '.'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["alice", "_svc", "bob-2", "s-alice", "s-"] {
            check_user_name(ok).unwrap();
        }
        let long = "x".repeat(33);
        for bad in [
            "", "Alice", "1bob", "a b", "a/b", &long, "s-1-5-11", "s-1-1-0",
        ] {
            assert!(check_user_name(bad).is_err(), "{bad}");
        }
        check_share_name("photos.2026").unwrap();
        for bad in ["", "..", "a/b", "a b"] {
            assert!(check_share_name(bad).is_err(), "{bad}");
        }
    }
}
