//! Users and shares: who may reach which dataset, over NFS and WebDAV, as
//! the daemon stores them.
//!
//! Both live in the pool as configuration records (see `docs/format.md`),
//! so they move with the disks: a pool imported elsewhere keeps its shares
//! and its users. A user belongs to one pool (the pool whose shares they
//! use); a share names one filesystem dataset and says how NFS exports it
//! (client networks, read-only, squashing) and which users reach it over
//! WebDAV, read-only or read-write.
//!
//! Shares are stored as [`ShareRecord`]s, users as [`UserRecord`]s (which
//! add the password hash the API never shows): the daemon's own types, so
//! a change of the API's cannot change what is on disk (their JSON is
//! pinned by golden tests, see `docs/format.md`). A share record that
//! cannot be decoded (damaged, or written by a newer tarn with fields this
//! one does not know, which might restrict access) affects only itself: it
//! is not served, it is reported by name, and the pool's other shares are
//! served.
//!
//! Passwords are kept only as argon2id hashes (PHC strings with their own
//! salt); the daemon hashes what the client sends over its 0600 socket and
//! never writes a password anywhere. Checking a password costs tens of
//! milliseconds by design; the servers rate-limit failed logins per client
//! address on top of that.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use serde::{Deserialize, Serialize};
use tarn_pool::Pool;

use std::collections::BTreeMap;

use tarn_api::access::{
    check_share_name, check_user_name, Access, NbdShare, NfsShare, Share, UserInfo, WebdavShare,
};
use tarn_api::ApiError;

use crate::convert::ds_error;

/// Configuration-record kind of users.
pub const KIND_USER: &str = "user";
/// Configuration-record kind of shares.
pub const KIND_SHARE: &str = "share";

/// A user as stored in the pool (the hash, never the password).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    /// Login name.
    pub name: String,
    /// Numeric user id that files created through WebDAV get.
    pub uid: u32,
    /// Numeric group id.
    pub gid: u32,
    /// argon2id PHC string.
    pub hash: String,
}

/// A share as stored in the pool (a `share` configuration record, keyed by
/// its name). Unknown fields are refused: a newer tarn's field may narrow
/// who gets in, so a record this build cannot fully read is not served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareRecord {
    /// Share name: the NFS export path is `/NAME`, the WebDAV URL `/NAME/`.
    pub name: String,
    /// The filesystem dataset.
    pub dataset: String,
    /// NFS export, if any.
    #[serde(default)]
    pub nfs: Option<NfsRecord>,
    /// WebDAV share, if any.
    #[serde(default)]
    pub webdav: Option<WebdavRecord>,
    /// NBD export of a volume, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd: Option<NbdRecord>,
}

/// How NBD exports a stored volume share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NbdRecord {
    /// Client networks allowed.
    pub clients: Vec<String>,
    /// Refuse writes.
    #[serde(default)]
    pub read_only: bool,
}

/// How NFS exports a stored share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NfsRecord {
    /// Client networks allowed.
    pub clients: Vec<String>,
    /// Refuse changes.
    #[serde(default)]
    pub read_only: bool,
    /// Map uid 0 to the anonymous ids.
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

/// Which users reach a stored share over WebDAV.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebdavRecord {
    /// User name → access.
    pub users: BTreeMap<String, AccessRecord>,
}

/// Read-only or read-write, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessRecord {
    /// May read.
    Ro,
    /// May read and change.
    Rw,
}

impl From<&Share> for ShareRecord {
    fn from(s: &Share) -> Self {
        ShareRecord {
            name: s.name.clone(),
            dataset: s.dataset.clone(),
            nfs: s.nfs.as_ref().map(|n| NfsRecord {
                clients: n.clients.clone(),
                read_only: n.read_only,
                root_squash: n.root_squash,
                all_squash: n.all_squash,
                anon_uid: n.anon_uid,
                anon_gid: n.anon_gid,
            }),
            webdav: s.webdav.as_ref().map(|w| WebdavRecord {
                users: w
                    .users
                    .iter()
                    .map(|(u, a)| {
                        let a = match a {
                            Access::Ro => AccessRecord::Ro,
                            Access::Rw => AccessRecord::Rw,
                        };
                        (u.clone(), a)
                    })
                    .collect(),
            }),
            nbd: s.nbd.as_ref().map(|n| NbdRecord {
                clients: n.clients.clone(),
                read_only: n.read_only,
            }),
        }
    }
}

impl From<ShareRecord> for Share {
    fn from(r: ShareRecord) -> Self {
        Share {
            name: r.name,
            dataset: r.dataset,
            nfs: r.nfs.map(|n| NfsShare {
                clients: n.clients,
                read_only: n.read_only,
                root_squash: n.root_squash,
                all_squash: n.all_squash,
                anon_uid: n.anon_uid,
                anon_gid: n.anon_gid,
            }),
            webdav: r.webdav.map(|w| WebdavShare {
                users: w
                    .users
                    .into_iter()
                    .map(|(u, a)| {
                        let a = match a {
                            AccessRecord::Ro => Access::Ro,
                            AccessRecord::Rw => Access::Rw,
                        };
                        (u, a)
                    })
                    .collect(),
            }),
            nbd: r.nbd.map(|n| NbdShare {
                clients: n.clients,
                read_only: n.read_only,
            }),
        }
    }
}

/// A stored share record that cannot be read: its name (the record's key)
/// and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedShare {
    /// The record's key: the share's name.
    pub name: String,
    /// Why it cannot be read.
    pub error: String,
}

/// The stored shares of a pool: those that can be read, and those that
/// cannot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredShares {
    /// Readable shares.
    pub shares: Vec<Share>,
    /// Records that cannot be read (not served).
    pub damaged: Vec<DamagedShare>,
}

fn check_password(password: &str) -> Result<(), ApiError> {
    if password.is_empty() || password.len() > 1024 || password.contains('\0') {
        return Err(ApiError::invalid(
            "a password must be 1 to 1024 bytes without NUL",
        ));
    }
    Ok(())
}

/// Checks a client network (`192.168.1.0/24`, `fd00::/8`, or one
/// address) with the NFS server's own parser, so what is stored is what
/// it will enforce.
pub fn check_network(s: &str) -> Result<tarn_nfs::IpNet, ApiError> {
    s.parse::<tarn_nfs::IpNet>()
        .map_err(|_| ApiError::invalid(format!("'{s}' is not a network like 192.168.1.0/24")))
}

/// Hashes a password with argon2id and a fresh random salt.
pub fn hash_password(password: &str) -> Result<String, ApiError> {
    check_password(password)?;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| ApiError::internal(format!("cannot read /dev/urandom: {e}")))?;
    let salt = SaltString::encode_b64(&bytes)
        .map_err(|e| ApiError::internal(format!("cannot make a salt: {e}")))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| ApiError::internal(format!("cannot hash the password: {e}")))
}

/// Whether `password` matches a stored hash (false for a damaged hash).
pub fn verify_password(hash: &str, password: &str) -> bool {
    match PasswordHash::new(hash) {
        Ok(h) => Argon2::default()
            .verify_password(password.as_bytes(), &h)
            .is_ok(),
        Err(_) => false,
    }
}

fn decode<T: serde::de::DeserializeOwned>(kind: &str, name: &str, v: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(v)
        .map_err(|e| ApiError::damaged(format!("{kind} '{name}' is damaged: {e}")))
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(v).map_err(|e| ApiError::internal(e.to_string()))
}

/// The users stored in `pool`.
pub fn users(pool: &Pool) -> Result<Vec<UserRecord>, ApiError> {
    tarn_dataset::config_list(pool, KIND_USER)
        .map_err(ds_error)?
        .into_iter()
        .map(|(n, v)| decode(KIND_USER, &n, &v))
        .collect()
}

/// The shares stored in `pool`, each record read on its own: one that
/// cannot be read is listed apart and does not hide the others.
pub fn stored_shares(pool: &Pool) -> Result<StoredShares, ApiError> {
    let mut out = StoredShares::default();
    for (name, bytes) in tarn_dataset::config_list(pool, KIND_SHARE).map_err(ds_error)? {
        match serde_json::from_slice::<ShareRecord>(&bytes) {
            Ok(record) => out.shares.push(record.into()),
            Err(e) => out.damaged.push(DamagedShare {
                name,
                error: e.to_string(),
            }),
        }
    }
    Ok(out)
}

/// The readable shares stored in `pool`; each record that cannot be read
/// is logged by name and left out.
pub fn shares(pool: &Pool) -> Result<Vec<Share>, ApiError> {
    let stored = stored_shares(pool)?;
    for d in &stored.damaged {
        eprintln!(
            "tarn: pool '{}': share '{}' is not served: its record cannot be read ({}); \
             `tarn share add {}` replaces it, `tarn share del {}` removes it",
            pool.name(),
            d.name,
            d.error,
            d.name,
            d.name
        );
    }
    Ok(stored.shares)
}

/// Adds a user (uid/gid chosen from 10000 up when not given).
pub fn user_add(
    pool: &Pool,
    name: &str,
    password: &str,
    uid: Option<u32>,
    gid: Option<u32>,
) -> Result<UserInfo, ApiError> {
    check_user_name(name)?;
    let existing = users(pool)?;
    if existing.iter().any(|u| u.name == name) {
        return Err(ApiError::exists(format!(
            "user '{name}' already exists in pool '{}'",
            pool.name()
        )));
    }
    let uid = uid.unwrap_or_else(|| {
        (10000..)
            .find(|u| !existing.iter().any(|x| x.uid == *u))
            .unwrap_or(10000)
    });
    let rec = UserRecord {
        name: name.to_string(),
        uid,
        gid: gid.unwrap_or(uid),
        hash: hash_password(password)?,
    };
    tarn_dataset::config_put(pool, KIND_USER, name, &encode(&rec)?).map_err(ds_error)?;
    Ok(UserInfo {
        pool: pool.name().to_string(),
        name: rec.name,
        uid: rec.uid,
        gid: rec.gid,
    })
}

/// Changes a user's password.
pub fn user_passwd(pool: &Pool, name: &str, password: &str) -> Result<(), ApiError> {
    let mut rec = users(pool)?
        .into_iter()
        .find(|u| u.name == name)
        .ok_or_else(|| {
            ApiError::not_found(format!("no user '{name}' in pool '{}'", pool.name()))
        })?;
    rec.hash = hash_password(password)?;
    tarn_dataset::config_put(pool, KIND_USER, name, &encode(&rec)?).map_err(ds_error)
}

/// Removes a user (refused while a share names them).
pub fn user_del(pool: &Pool, name: &str) -> Result<(), ApiError> {
    if let Some(s) = shares(pool)?.into_iter().find(|s| {
        s.webdav
            .as_ref()
            .is_some_and(|w| w.users.contains_key(name))
    }) {
        return Err(ApiError::busy(format!(
            "share '{}' gives user '{name}' access; change the share first",
            s.name
        )));
    }
    if !tarn_dataset::config_delete(pool, KIND_USER, name).map_err(ds_error)? {
        return Err(ApiError::not_found(format!(
            "no user '{name}' in pool '{}'",
            pool.name()
        )));
    }
    Ok(())
}

/// Checks a login against the users of `pool`.
pub fn authenticate(pool: &Pool, name: &str, password: &str) -> Option<UserRecord> {
    users(pool)
        .ok()?
        .into_iter()
        .find(|u| u.name == name)
        .filter(|u| verify_password(&u.hash, password))
}

/// Adds or replaces a share after checking it.
pub fn share_put(pool: &Pool, share: &Share) -> Result<(), ApiError> {
    check_share_name(&share.name)?;
    let kind = tarn_dataset::get_props(
        pool,
        &share.dataset,
        &["type".to_string(), "volsize".to_string()],
    )
    .map_err(ds_error)?;
    let is = |k: &str| kind.first().map(|p| p.value.as_str()) == Some(k);
    // A volume, or a snapshot of one (served read-only).
    let block_device = kind.get(1).is_some_and(|p| p.value != "-");
    if (share.nfs.is_some() || share.webdav.is_some()) && !is("filesystem") {
        return Err(ApiError::invalid(format!(
            "'{}' is not a filesystem dataset: NFS and WebDAV serve filesystems",
            share.dataset
        )));
    }
    if let Some(n) = &share.nbd {
        if !block_device {
            return Err(ApiError::invalid(format!(
                "'{}' is not a volume or a snapshot of one: NBD serves volumes \
                 (tarn volume create)",
                share.dataset
            )));
        }
        if n.clients.is_empty() {
            return Err(ApiError::invalid(
                "an NBD share needs at least one client network (e.g. 192.168.1.0/24)",
            ));
        }
        for c in &n.clients {
            check_network(c)?;
        }
    }
    if let Some(n) = &share.nfs {
        if n.clients.is_empty() {
            return Err(ApiError::invalid(
                "an NFS export needs at least one client network (e.g. 192.168.1.0/24)",
            ));
        }
        for c in &n.clients {
            check_network(c)?;
        }
    }
    if let Some(w) = &share.webdav {
        let known = users(pool)?;
        for u in w.users.keys() {
            if !known.iter().any(|k| &k.name == u) {
                return Err(ApiError::not_found(format!(
                    "no user '{u}' in pool '{}'; add it first with `tarn user add {u}`",
                    pool.name()
                )));
            }
        }
    }
    if share.nfs.is_none() && share.webdav.is_none() && share.nbd.is_none() {
        return Err(ApiError::invalid(
            "a share needs --nfs or --webdav (a filesystem) or --nbd (a volume)",
        ));
    }
    let record = ShareRecord::from(share);
    tarn_dataset::config_put(pool, KIND_SHARE, &share.name, &encode(&record)?).map_err(ds_error)
}

/// Removes a share.
pub fn share_del(pool: &Pool, name: &str) -> Result<(), ApiError> {
    if !tarn_dataset::config_delete(pool, KIND_SHARE, name).map_err(ds_error)? {
        return Err(ApiError::not_found(format!(
            "no share '{name}' in pool '{}'",
            pool.name()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_are_checked_before_they_are_stored() {
        for ok in [
            "192.168.1.0/24",
            "127.0.0.1",
            "0.0.0.0/0",
            "fd00::/8",
            "::1",
        ] {
            check_network(ok).unwrap();
        }
        for bad in [
            "10.0.0.0/33",
            "nonsense",
            "1.2.3/8",
            "::/129",
            "1.2.3.4/x",
            "",
        ] {
            assert!(check_network(bad).is_err(), "{bad}");
        }
    }

    /// A volume's share record: the `nbd` field, and nothing of it in the
    /// records of shares without one (above).
    #[test]
    fn nbd_share_record_golden() {
        let golden = r#"{"name":"vm1","dataset":"tank/vm1","nfs":null,"webdav":null,"nbd":{"clients":["10.0.0.0/8"],"read_only":true}}"#;
        let record = ShareRecord {
            name: "vm1".into(),
            dataset: "tank/vm1".into(),
            nfs: None,
            webdav: None,
            nbd: Some(NbdRecord {
                clients: vec!["10.0.0.0/8".into()],
                read_only: true,
            }),
        };
        let written: serde_json::Value = serde_json::to_value(&record).unwrap();
        assert_eq!(
            written,
            serde_json::from_str::<serde_json::Value>(golden).unwrap()
        );
        assert_eq!(serde_json::from_str::<ShareRecord>(golden).unwrap(), record);
        assert_eq!(ShareRecord::from(&Share::from(record.clone())), record);
    }

    /// The share record's JSON, pinned: renaming a field or a variant in
    /// the code must fail here, not change the format (docs/format.md).
    #[test]
    fn share_record_golden() {
        let golden = r#"{"name":"photos","dataset":"tank/photos","nfs":{"clients":["192.168.1.0/24","::1"],"read_only":true,"root_squash":false,"all_squash":true,"anon_uid":1000,"anon_gid":1001},"webdav":{"users":{"alice":"rw","bob":"ro"}}}"#;
        let record = ShareRecord {
            name: "photos".into(),
            dataset: "tank/photos".into(),
            nfs: Some(NfsRecord {
                clients: vec!["192.168.1.0/24".into(), "::1".into()],
                read_only: true,
                root_squash: false,
                all_squash: true,
                anon_uid: 1000,
                anon_gid: 1001,
            }),
            webdav: Some(WebdavRecord {
                users: [
                    ("alice".to_string(), AccessRecord::Rw),
                    ("bob".to_string(), AccessRecord::Ro),
                ]
                .into(),
            }),
            nbd: None,
        };
        let written: serde_json::Value = serde_json::to_value(&record).unwrap();
        let pinned: serde_json::Value = serde_json::from_str(golden).unwrap();
        assert_eq!(written, pinned);
        assert_eq!(serde_json::from_str::<ShareRecord>(golden).unwrap(), record);
        // Through the API's type and back, nothing is lost.
        assert_eq!(ShareRecord::from(&Share::from(record.clone())), record);

        // Absent optional fields take their documented defaults.
        let minimal: ShareRecord = serde_json::from_str(
            r#"{"name":"a","dataset":"tank/a","nfs":{"clients":["10.0.0.0/8"]}}"#,
        )
        .unwrap();
        let nfs = minimal.nfs.unwrap();
        assert_eq!(
            (nfs.read_only, nfs.root_squash, nfs.all_squash),
            (false, true, false)
        );
        assert_eq!((nfs.anon_uid, nfs.anon_gid), (65534, 65534));
        assert_eq!(minimal.webdav, None);
        // A field this build does not know is refused (it might narrow access).
        assert!(serde_json::from_str::<ShareRecord>(
            r#"{"name":"a","dataset":"tank/a","expires":1}"#
        )
        .is_err());
    }

    #[test]
    fn passwords_hash_with_salt_and_verify() {
        let a = hash_password("correct horse").unwrap();
        let b = hash_password("correct horse").unwrap();
        assert_ne!(a, b, "salted");
        assert!(a.starts_with("$argon2id$"));
        assert!(verify_password(&a, "correct horse"));
        assert!(!verify_password(&a, "correct horsf"));
        assert!(!verify_password("garbage", "x"));
        assert!(hash_password("").is_err());
    }
}
