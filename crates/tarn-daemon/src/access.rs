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
    check_share_name, check_user_name, Access, IscsiShare, NbdShare, NfsShare, Share, SmbEncrypt,
    SmbShare, UserInfo, WebdavShare,
};
use tarn_api::ApiError;

use crate::convert::ds_error;

/// Configuration-record kind of users.
pub const KIND_USER: &str = "user";
/// Configuration-record kind of shares.
pub const KIND_SHARE: &str = "share";

/// A user as stored in the pool (the hash, never the password).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    /// Login name.
    pub name: String,
    /// Numeric user id that files created through WebDAV get.
    pub uid: u32,
    /// Numeric group id.
    pub gid: u32,
    /// argon2id PHC string.
    pub hash: String,
    /// The CHAP secret for iSCSI logins, as given: CHAP's challenge and
    /// response need the secret itself, so it cannot be hashed. Separate
    /// from the password so that reading a pool's disks never yields a
    /// login password (docs/iscsi.md says what this exposes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap_secret: Option<String>,
    /// The NT hash of the password (32 upper-case hex digits), kept only
    /// for users who log in over SMB: Samba's logins need it, and it is
    /// unsalted MD4, so anyone who reads the pool's disks can try
    /// passwords against it quickly (docs/smb.md says what this exposes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nt_hash: Option<String>,
    /// The daemon (its `node-id`) on which the user is an administrator
    /// of the web page and the HTTPS API; written only when set. Bound to
    /// a daemon so that a pool from another machine brings no
    /// administrators with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_node: Option<String>,
}

impl std::fmt::Debug for UserRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserRecord")
            .field("name", &self.name)
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field(
                "chap_secret",
                &self.chap_secret.as_ref().map(|_| "<hidden>"),
            )
            .field("smb", &self.nt_hash.is_some())
            .finish_non_exhaustive()
    }
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
    /// iSCSI target of a volume, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iscsi: Option<IscsiRecord>,
    /// SMB share, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smb: Option<SmbRecord>,
}

/// How Samba serves a stored share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmbRecord {
    /// User name → access.
    pub users: BTreeMap<String, AccessRecord>,
    /// Anyone may read without a password.
    #[serde(default)]
    pub guest: bool,
    /// A Time Machine target.
    #[serde(default)]
    pub timemachine: bool,
    /// Time Machine's size limit in bytes; 0: none.
    #[serde(default)]
    pub tm_quota: u64,
    /// SMB3 encryption: "off", "desired" or "required".
    #[serde(default)]
    pub encrypt: SmbEncryptRecord,
    /// Signing required.
    #[serde(default)]
    pub signing_required: bool,
}

/// SMB3 encryption, as stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmbEncryptRecord {
    /// When the client asks.
    #[default]
    Off,
    /// Offered.
    Desired,
    /// Required.
    Required,
}

/// How iSCSI serves a stored volume share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiRecord {
    /// The target's iSCSI name.
    pub iqn: String,
    /// Client networks allowed; empty: any (only with CHAP).
    pub clients: Vec<String>,
    /// Initiator names allowed; empty: any.
    pub initiators: Vec<String>,
    /// The tarn user whose CHAP secret initiators must log in with.
    pub chap: Option<String>,
    /// The tarn user the target answers mutual CHAP as.
    pub mutual_chap: Option<String>,
    /// Refuse writes.
    pub read_only: bool,
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

fn to_records(users: &BTreeMap<String, Access>) -> BTreeMap<String, AccessRecord> {
    users
        .iter()
        .map(|(u, a)| {
            let a = match a {
                Access::Ro => AccessRecord::Ro,
                Access::Rw => AccessRecord::Rw,
            };
            (u.clone(), a)
        })
        .collect()
}

fn from_records(users: BTreeMap<String, AccessRecord>) -> BTreeMap<String, Access> {
    users
        .into_iter()
        .map(|(u, a)| {
            let a = match a {
                AccessRecord::Ro => Access::Ro,
                AccessRecord::Rw => Access::Rw,
            };
            (u, a)
        })
        .collect()
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
                users: to_records(&w.users),
            }),
            nbd: s.nbd.as_ref().map(|n| NbdRecord {
                clients: n.clients.clone(),
                read_only: n.read_only,
            }),
            iscsi: s.iscsi.as_ref().map(|i| IscsiRecord {
                iqn: i.iqn.clone(),
                clients: i.clients.clone(),
                initiators: i.initiators.clone(),
                chap: i.chap.clone(),
                mutual_chap: i.mutual_chap.clone(),
                read_only: i.read_only,
            }),
            smb: s.smb.as_ref().map(|m| SmbRecord {
                users: to_records(&m.users),
                guest: m.guest,
                timemachine: m.timemachine,
                tm_quota: m.tm_quota,
                encrypt: match m.encrypt {
                    SmbEncrypt::Off => SmbEncryptRecord::Off,
                    SmbEncrypt::Desired => SmbEncryptRecord::Desired,
                    SmbEncrypt::Required => SmbEncryptRecord::Required,
                },
                signing_required: m.signing_required,
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
                users: from_records(w.users),
            }),
            nbd: r.nbd.map(|n| NbdShare {
                clients: n.clients,
                read_only: n.read_only,
            }),
            iscsi: r.iscsi.map(|i| IscsiShare {
                iqn: i.iqn,
                clients: i.clients,
                initiators: i.initiators,
                chap: i.chap,
                mutual_chap: i.mutual_chap,
                read_only: i.read_only,
            }),
            smb: r.smb.map(|m| SmbShare {
                users: from_records(m.users),
                guest: m.guest,
                timemachine: m.timemachine,
                tm_quota: m.tm_quota,
                encrypt: match m.encrypt {
                    SmbEncryptRecord::Off => SmbEncrypt::Off,
                    SmbEncryptRecord::Desired => SmbEncrypt::Desired,
                    SmbEncryptRecord::Required => SmbEncrypt::Required,
                },
                signing_required: m.signing_required,
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
            Ok(mut record) => {
                record.dataset = crate::pools::named_in(pool.name(), &record.dataset);
                out.shares.push(record.into())
            }
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
        log::warn!(
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
    smb: bool,
) -> Result<UserInfo, ApiError> {
    check_user_name(name)?;
    let existing = users(pool)?;
    if existing.iter().any(|u| u.name == name) {
        return Err(ApiError::exists(format!(
            "user '{name}' already exists in pool '{}'",
            pool.name()
        )));
    }
    if uid == Some(0) || gid == Some(0) {
        return Err(ApiError::invalid(
            "uid and gid 0 are root's: a tarn user with them would pass every permission \
             check on the files it reaches (SMB refuses them too); choose other ids",
        ));
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
        chap_secret: None,
        nt_hash: smb.then(|| nt_hash(password)),
        admin_node: None,
    };
    tarn_dataset::config_put(pool, KIND_USER, name, &encode(&rec)?).map_err(ds_error)?;
    Ok(UserInfo {
        pool: pool.name().to_string(),
        name: rec.name,
        uid: rec.uid,
        gid: rec.gid,
        chap: false,
        smb,
        admin: false,
    })
}

/// Makes `name` an administrator of the daemon `node`, or not.
pub fn user_admin(pool: &Pool, name: &str, admin: bool, node: &str) -> Result<(), ApiError> {
    let mut rec = user(pool, name)?;
    rec.admin_node = admin.then(|| node.to_string());
    tarn_dataset::config_put(pool, KIND_USER, name, &encode(&rec)?).map_err(ds_error)
}

/// The stored record of user `name`.
pub fn user(pool: &Pool, name: &str) -> Result<UserRecord, ApiError> {
    users(pool)?
        .into_iter()
        .find(|u| u.name == name)
        .ok_or_else(|| ApiError::not_found(format!("no user '{name}' in pool '{}'", pool.name())))
}

/// The NT hash Samba checks SMB logins against: MD4 of the password in
/// UTF-16LE, as 32 upper-case hex digits (the form of its `smbpasswd`
/// file).
pub fn nt_hash(password: &str) -> String {
    use md4::{Digest, Md4};
    let utf16: Vec<u8> = password.encode_utf16().flat_map(u16::to_le_bytes).collect();
    Md4::digest(&utf16)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect()
}

/// Changes a user's password; `smb` says whether an NT hash is kept for
/// SMB logins from now on (none: as before; a kept one follows the new
/// password).
pub fn user_passwd(
    pool: &Pool,
    name: &str,
    password: &str,
    smb: Option<bool>,
) -> Result<(), ApiError> {
    let mut rec = user(pool, name)?;
    if smb == Some(false) {
        if let Some(s) = shares(pool)?
            .into_iter()
            .find(|s| s.smb.as_ref().is_some_and(|m| m.users.contains_key(name)))
        {
            return Err(ApiError::busy(format!(
                "share '{}' gives user '{name}' SMB access; change the share first",
                s.name
            )));
        }
    }
    if rec.chap_secret.as_deref() == Some(password) {
        return Err(ApiError::invalid(
            "the password must differ from the user's CHAP secret: the secret is stored as \
             given, the password only as a hash",
        ));
    }
    rec.hash = hash_password(password)?;
    let keep = smb.unwrap_or(rec.nt_hash.is_some());
    rec.nt_hash = keep.then(|| nt_hash(password));
    tarn_dataset::config_put(pool, KIND_USER, name, &encode(&rec)?).map_err(ds_error)
}

/// Checks a CHAP secret: the bounds the iSCSI target enforces (RFC 7143
/// asks for at least 96 bits in a secret that is not random).
pub fn check_chap_secret(secret: &str) -> Result<(), ApiError> {
    if !(12..=255).contains(&secret.len()) || secret.contains('\0') {
        return Err(ApiError::invalid(
            "a CHAP secret must be 12 to 255 bytes without NUL",
        ));
    }
    Ok(())
}

/// Sets a user's CHAP secret, or removes it (refused while an iSCSI
/// share logs in with it).
pub fn user_chap(pool: &Pool, name: &str, secret: Option<&str>) -> Result<(), ApiError> {
    let mut rec = user(pool, name)?;
    match secret {
        Some(s) => {
            check_chap_secret(s)?;
            if verify_password(&rec.hash, s) {
                return Err(ApiError::invalid(
                    "the CHAP secret must differ from the user's password: it is stored \
                     as given, the password only as a hash",
                ));
            }
            // A share that pairs this user with another for mutual CHAP
            // needs two different secrets.
            let all = users(pool)?;
            let secret_of = |u: &str| {
                all.iter()
                    .find(|r| r.name == u)
                    .and_then(|r| r.chap_secret.clone())
            };
            for sh in shares(pool)? {
                let Some(i) = &sh.iscsi else { continue };
                let partner = match (i.chap.as_deref(), i.mutual_chap.as_deref()) {
                    (Some(a), Some(b)) if a == name => b,
                    (Some(a), Some(b)) if b == name => a,
                    _ => continue,
                };
                if partner != name && secret_of(partner).as_deref() == Some(s) {
                    return Err(ApiError::invalid(format!(
                        "share '{}' pairs '{name}' with '{partner}' for mutual CHAP, which \
                         has this secret: the two must differ",
                        sh.name
                    )));
                }
            }
            // Across shares too, as `share add` checks: a secret an
            // initiator logs in with anywhere must not be a target's
            // mutual secret anywhere (a target found so is not served).
            let all_shares = shares(pool)?;
            let iscsi = || all_shares.iter().filter_map(|sh| sh.iscsi.as_ref());
            let used_in = iscsi().any(|i| i.chap.as_deref() == Some(name));
            let used_mutual = iscsi().any(|i| i.mutual_chap.as_deref() == Some(name));
            let has_s = |u: Option<&str>| {
                u.is_some_and(|u| u != name && secret_of(u).as_deref() == Some(s))
            };
            let clash = (used_in && iscsi().any(|i| has_s(i.mutual_chap.as_deref())))
                || (used_mutual && iscsi().any(|i| has_s(i.chap.as_deref())));
            if clash {
                return Err(ApiError::invalid(format!(
                    "another iSCSI share uses this secret the other way round (an initiator's \
                     secret there would be a target's mutual secret here, or the reverse): \
                     give '{name}' a secret of its own"
                )));
            }
        }
        None => {
            if let Some(s) = shares(pool)?
                .into_iter()
                .find(|s| s.iscsi.as_ref().is_some_and(|i| names_chap_user(i, name)))
            {
                return Err(ApiError::busy(format!(
                    "share '{}' logs in with user '{name}''s CHAP secret; change the share first",
                    s.name
                )));
            }
        }
    }
    rec.chap_secret = secret.map(str::to_string);
    tarn_dataset::config_put(pool, KIND_USER, name, &encode(&rec)?).map_err(ds_error)
}

fn names_chap_user(i: &IscsiShare, name: &str) -> bool {
    i.chap.as_deref() == Some(name) || i.mutual_chap.as_deref() == Some(name)
}

/// Removes a user (refused while a share names them).
pub fn user_del(pool: &Pool, name: &str) -> Result<(), ApiError> {
    if let Some(s) = shares(pool)?.into_iter().find(|s| {
        s.webdav
            .as_ref()
            .is_some_and(|w| w.users.contains_key(name))
            || s.iscsi.as_ref().is_some_and(|i| names_chap_user(i, name))
            || s.smb.as_ref().is_some_and(|m| m.users.contains_key(name))
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

/// A hash no password opens, checked for names that do not exist so a
/// failed login costs the same whether or not the name is a user's (the
/// time would otherwise tell which names are).
pub(crate) fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| hash_password("tarn decoy password").unwrap_or_default())
}

/// Checks a login against the users of `pool`.
pub fn authenticate(pool: &Pool, name: &str, password: &str) -> Option<UserRecord> {
    users(pool)
        .ok()?
        .into_iter()
        .find(|u| u.name == name)
        .filter(|u| !is_root(u))
        .filter(|u| verify_password(&u.hash, password))
}

/// Whether a user record has root's uid or gid: `user add` refuses them,
/// but a pool's records may have been written elsewhere, and such a user
/// would pass every permission check on the files it reaches. Never
/// logged in, nor handed files.
pub fn is_root(u: &UserRecord) -> bool {
    u.uid == 0 || u.gid == 0
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
    if (share.nfs.is_some() || share.webdav.is_some() || share.smb.is_some()) && !is("filesystem") {
        return Err(ApiError::invalid(format!(
            "'{}' is not a filesystem dataset: NFS, WebDAV and SMB serve filesystems",
            share.dataset
        )));
    }
    let need_volume = |proto: &str| {
        if block_device {
            Ok(())
        } else {
            Err(ApiError::invalid(format!(
                "'{}' is not a volume or a snapshot of one: {proto} serves volumes \
                 (tarn volume create)",
                share.dataset
            )))
        }
    };
    if let Some(n) = &share.nbd {
        need_volume("NBD")?;
        if n.clients.is_empty() {
            return Err(ApiError::invalid(
                "an NBD share needs at least one client network (e.g. 192.168.1.0/24)",
            ));
        }
        for c in &n.clients {
            check_network(c)?;
        }
    }
    if let Some(i) = &share.iscsi {
        need_volume("iSCSI")?;
        check_iscsi(pool, share, i)?;
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
        // An NFS file handle names a dataset, not the share it was
        // mounted through: two exports of one dataset (one read-only, one
        // not) would be told apart by nothing, and a client of both could
        // write through the read-only one.
        if let Some(other) = shares(pool)?
            .into_iter()
            .find(|o| o.nfs.is_some() && o.name != share.name && o.dataset == share.dataset)
        {
            return Err(ApiError::exists(format!(
                "'{}' is exported over NFS already, by share '{}': one NFS export per \
                 dataset (its file handles name the dataset); give that share these \
                 networks instead",
                share.dataset, other.name
            )));
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
    if let Some(m) = &share.smb {
        if crate::smb::reserved_share_name(&share.name) {
            return Err(ApiError::invalid(format!(
                "'{}' cannot be the name of an SMB share: Samba gives it a meaning of its own \
                 (reserved: {})",
                share.name,
                crate::smb::RESERVED_SHARE_NAMES.join(", ")
            )));
        }
        // Samba finds shares by name without case: two would be one.
        if let Some(other) = shares(pool)?.into_iter().find(|o| {
            o.smb.is_some() && o.name != share.name && o.name.eq_ignore_ascii_case(&share.name)
        }) {
            return Err(ApiError::exists(format!(
                "share '{}' is served over SMB already, and SMB share names do not differ by \
                 case",
                other.name
            )));
        }
        let known = users(pool)?;
        for u in m.users.keys() {
            let rec = known.iter().find(|k| &k.name == u).ok_or_else(|| {
                ApiError::not_found(format!(
                    "no user '{u}' in pool '{}'; add it first with `tarn user add --smb {u}`",
                    pool.name()
                ))
            })?;
            if rec.nt_hash.is_none() {
                return Err(ApiError::invalid(format!(
                    "user '{u}' cannot log in over SMB yet: set their password with \
                     `tarn user passwd --smb {u}` (Samba needs a hash of its own)"
                )));
            }
        }
        if m.users.is_empty() && !m.guest {
            return Err(ApiError::invalid(
                "an SMB share needs users (--smb alice=rw) or guest access (--guest)",
            ));
        }
        if m.tm_quota > 0 && !m.timemachine {
            return Err(ApiError::invalid(
                "--quota limits a Time Machine share: add --timemachine",
            ));
        }
    }
    if share.nfs.is_none()
        && share.webdav.is_none()
        && share.smb.is_none()
        && share.nbd.is_none()
        && share.iscsi.is_none()
    {
        return Err(ApiError::invalid(
            "a share needs --nfs, --webdav or --smb (a filesystem), or --nbd or --iscsi \
             (a volume)",
        ));
    }
    let record = ShareRecord::from(share);
    tarn_dataset::config_put(pool, KIND_SHARE, &share.name, &encode(&record)?).map_err(ds_error)
}

/// The target name a share gets when none is given:
/// `iqn.2026-11.org.tarn:POOL.SHARE`, lower-cased, with characters an
/// iSCSI name cannot hold replaced by `-`.
pub fn default_iqn(pool: &str, share: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| match c.to_ascii_lowercase() {
                c @ ('a'..='z' | '0'..='9' | '.' | '-') => c,
                _ => '-',
            })
            .collect()
    };
    format!("iqn.2026-11.org.tarn:{}.{}", clean(pool), clean(share))
}

/// Checks an iSCSI share before it is stored: a valid target name that
/// no other share of the pool uses, valid networks, and CHAP users of
/// the pool that have secrets. A target open to every network must ask
/// for CHAP.
fn check_iscsi(pool: &Pool, share: &Share, i: &IscsiShare) -> Result<(), ApiError> {
    if !tarn_iscsi::valid_name(&i.iqn) {
        return Err(ApiError::invalid(format!(
            "'{}' is not an iSCSI name: use iqn.YYYY-MM.reversed.domain:name in lower case \
             (letters, digits, '.', '-', ':'), at most 223 bytes",
            i.iqn
        )));
    }
    if let Some(other) = shares(pool)?
        .into_iter()
        .find(|s| s.name != share.name && s.iscsi.as_ref().is_some_and(|o| o.iqn == i.iqn))
    {
        return Err(ApiError::exists(format!(
            "share '{}' already serves the iSCSI target {}",
            other.name, i.iqn
        )));
    }
    for c in &i.clients {
        check_network(c)?;
    }
    if i.clients.is_empty() && i.chap.is_none() {
        return Err(ApiError::invalid(
            "an iSCSI share needs client networks (client=192.168.1.0/24) or CHAP (chap=USER), \
             or both",
        ));
    }
    for n in &i.initiators {
        if n.is_empty() || n.len() > 223 || n.contains('\0') {
            return Err(ApiError::invalid(format!(
                "'{n}' is not an initiator name (1 to 223 bytes)"
            )));
        }
    }
    if i.mutual_chap.is_some() && i.chap.is_none() {
        return Err(ApiError::invalid(
            "mutual CHAP needs CHAP: the initiator logs in first (chap=USER)",
        ));
    }
    let known = users(pool)?;
    let mut secrets = Vec::new();
    for u in i.chap.iter().chain(i.mutual_chap.iter()) {
        let rec = known.iter().find(|k| &k.name == u).ok_or_else(|| {
            ApiError::not_found(format!(
                "no user '{u}' in pool '{}'; add it with `tarn user add {u}`",
                pool.name()
            ))
        })?;
        let secret = rec.chap_secret.as_deref().ok_or_else(|| {
            ApiError::invalid(format!(
                "user '{u}' has no CHAP secret; set one with `tarn user chap {u}`"
            ))
        })?;
        secrets.push(secret);
    }
    if secrets.len() == 2 && secrets[0] == secrets[1] {
        return Err(ApiError::invalid(
            "the two CHAP users must have different secrets: mutual CHAP with one secret \
             proves nothing",
        ));
    }
    // Across shares too: a target's mutual secret must not be a secret an
    // initiator logs in with anywhere, or a login to one target could be
    // made to answer for the other (RFC 7143, 12.1.3).
    let secret_of = |u: &Option<String>| {
        u.as_ref()
            .and_then(|u| known.iter().find(|k| &k.name == u))
            .and_then(|k| k.chap_secret.clone())
    };
    let mine_in = secret_of(&i.chap);
    let mine_mutual = secret_of(&i.mutual_chap);
    for other in shares(pool)?.iter().filter(|s| s.name != share.name) {
        let Some(o) = &other.iscsi else { continue };
        let clash = (mine_mutual.is_some() && mine_mutual == secret_of(&o.chap))
            || (mine_in.is_some() && mine_in == secret_of(&o.mutual_chap));
        if clash {
            return Err(ApiError::invalid(format!(
                "share '{}' uses the same CHAP secret the other way round (an initiator's \
                 secret there is a target's here, or the reverse): give the target's mutual \
                 CHAP user a secret of its own",
                other.name
            )));
        }
    }
    Ok(())
}

/// Points the shares of dataset `old`, and of what was under it (its
/// descendants and their snapshots; for a snapshot, only its own), at
/// their names after a rename to `new`, so that a renamed dataset stays
/// shared on the same terms. Returns the shares changed.
pub fn shares_follow_rename(pool: &Pool, old: &str, new: &str) -> Result<Vec<String>, ApiError> {
    let whole_tree = !old.contains('@');
    let mut changed = Vec::new();
    for mut share in shares(pool)? {
        let to = if share.dataset == old {
            new.to_string()
        } else if let Some(rest) = share
            .dataset
            .strip_prefix(old)
            .filter(|r| whole_tree && (r.starts_with('/') || r.starts_with('@')))
        {
            format!("{new}{rest}")
        } else {
            continue;
        };
        share.dataset = to;
        let record = ShareRecord::from(&share);
        tarn_dataset::config_put(pool, KIND_SHARE, &share.name, &encode(&record)?)
            .map_err(ds_error)?;
        changed.push(share.name);
    }
    Ok(changed)
}

/// Removes the shares of datasets a destroy of `name` (a dataset, a
/// snapshot or a range of snapshots) took away, so that a dataset made
/// later under the same name is not served to the old share's clients on
/// the old terms. Returns the shares removed.
pub fn shares_of_destroyed(pool: &Pool, name: &str) -> Result<Vec<String>, ApiError> {
    let fs = name.split('@').next().unwrap_or(name);
    let mut gone = Vec::new();
    for share in shares(pool)? {
        let d = share.dataset.as_str();
        let related =
            d == fs || d.starts_with(&format!("{fs}/")) || d.starts_with(&format!("{fs}@"));
        if !related
            || !matches!(
                tarn_dataset::get_props(pool, d, &["type".to_string()]),
                Err(tarn_dataset::DsError::NotFound(_))
            )
        {
            continue;
        }
        tarn_dataset::config_delete(pool, KIND_SHARE, &share.name).map_err(ds_error)?;
        gone.push(share.name);
    }
    Ok(gone)
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

    /// Root's ids are refused when a user is added, and a record with them
    /// written elsewhere never logs in.
    #[test]
    fn users_with_roots_ids_are_refused_and_never_log_in() {
        let dir = tempfile::tempdir().unwrap();
        let pool = tarn_testkit::pools::tank(dir.path(), tarn_vdev::VdevKind::Mirror, 2, 64 << 20);
        for (uid, gid) in [(Some(0), None), (None, Some(0))] {
            let e =
                user_add(&pool, "eve", "a-long-password", uid, gid, false).expect_err("refused");
            assert!(e.message.contains("root's"), "{}", e.message);
        }
        user_add(&pool, "alice", "a-long-password", None, None, false).unwrap();
        assert!(authenticate(&pool, "alice", "a-long-password").is_some());
        let mut rec = user(&pool, "alice").unwrap();
        rec.uid = 0;
        tarn_dataset::config_put(&pool, KIND_USER, "alice", &encode(&rec).unwrap()).unwrap();
        assert!(
            authenticate(&pool, "alice", "a-long-password").is_none(),
            "a stored record with uid 0 logged in"
        );
    }

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

    /// `record` is written as `golden`, `golden` reads as `record`, and
    /// through the API's type and back nothing is lost.
    fn assert_pinned(record: &ShareRecord, golden: &str) {
        let written: serde_json::Value = serde_json::to_value(record).unwrap();
        let pinned: serde_json::Value = serde_json::from_str(golden).unwrap();
        assert_eq!(written, pinned);
        assert_eq!(
            &serde_json::from_str::<ShareRecord>(golden).unwrap(),
            record
        );
        assert_eq!(&ShareRecord::from(&Share::from(record.clone())), record);
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
            iscsi: None,
            smb: None,
        };
        assert_pinned(&record, golden);
    }

    /// A volume's iSCSI share record, and a user record with a CHAP
    /// secret, pinned (docs/format.md).
    #[test]
    fn iscsi_share_and_chap_user_records_golden() {
        let golden = r#"{"name":"vm1","dataset":"tank/vm1","nfs":null,"webdav":null,"iscsi":{"iqn":"iqn.2026-11.org.tarn:tank.vm1","clients":["10.0.0.0/8"],"initiators":["iqn.1993-08.org.debian:01:a"],"chap":"alice","mutual_chap":"nas","read_only":false}}"#;
        let record = ShareRecord {
            name: "vm1".into(),
            dataset: "tank/vm1".into(),
            nfs: None,
            webdav: None,
            nbd: None,
            iscsi: Some(IscsiRecord {
                iqn: "iqn.2026-11.org.tarn:tank.vm1".into(),
                clients: vec!["10.0.0.0/8".into()],
                initiators: vec!["iqn.1993-08.org.debian:01:a".into()],
                chap: Some("alice".into()),
                mutual_chap: Some("nas".into()),
                read_only: false,
            }),
            smb: None,
        };
        assert_pinned(&record, golden);

        let user = r#"{"name":"alice","uid":10000,"gid":10000,"hash":"$argon2id$x","chap_secret":"twelve bytes!"}"#;
        let rec = UserRecord {
            name: "alice".into(),
            uid: 10000,
            gid: 10000,
            hash: "$argon2id$x".into(),
            chap_secret: Some("twelve bytes!".into()),
            nt_hash: None,
            admin_node: None,
        };
        assert_eq!(
            serde_json::to_value(&rec).unwrap(),
            serde_json::from_str::<serde_json::Value>(user).unwrap()
        );
        let admin = r#"{"name":"alice","uid":10000,"gid":10000,"hash":"$argon2id$x","admin_node":"0123abcd"}"#;
        let ada = UserRecord {
            chap_secret: None,
            admin_node: Some("0123abcd".into()),
            ..rec.clone()
        };
        assert_eq!(serde_json::to_string(&ada).unwrap(), admin);
        assert_eq!(serde_json::from_str::<UserRecord>(admin).unwrap(), ada);
        let old = r#"{"name":"alice","uid":10000,"gid":10000,"hash":"$argon2id$x"}"#;
        let without = UserRecord {
            chap_secret: None,
            ..rec
        };
        assert_eq!(serde_json::from_str::<UserRecord>(old).unwrap(), without);
        assert_eq!(
            serde_json::to_value(&without).unwrap(),
            serde_json::from_str::<serde_json::Value>(old).unwrap(),
            "a user without a secret is written as before"
        );
    }

    /// An SMB share record and a user with an NT hash, pinned
    /// (docs/format.md).
    #[test]
    fn smb_share_and_user_records_golden() {
        let golden = r#"{"name":"mac","dataset":"tank/tm","nfs":null,"webdav":null,"smb":{"users":{"alice":"rw","bob":"ro"},"guest":false,"timemachine":true,"tm_quota":536870912000,"encrypt":"required","signing_required":true}}"#;
        let record = ShareRecord {
            name: "mac".into(),
            dataset: "tank/tm".into(),
            nfs: None,
            webdav: None,
            nbd: None,
            iscsi: None,
            smb: Some(SmbRecord {
                users: [
                    ("alice".to_string(), AccessRecord::Rw),
                    ("bob".to_string(), AccessRecord::Ro),
                ]
                .into(),
                guest: false,
                timemachine: true,
                tm_quota: 500 << 30,
                encrypt: SmbEncryptRecord::Required,
                signing_required: true,
            }),
        };
        assert_pinned(&record, golden);
        let minimal: ShareRecord =
            serde_json::from_str(r#"{"name":"a","dataset":"tank/a","smb":{"users":{}}}"#).unwrap();
        let smb = minimal.smb.unwrap();
        assert_eq!(
            (smb.guest, smb.timemachine, smb.tm_quota, smb.encrypt),
            (false, false, 0, SmbEncryptRecord::Off)
        );
        let user = r#"{"name":"alice","uid":10000,"gid":10000,"hash":"$argon2id$x","nt_hash":"8846F7EAEE8FB117AD06BDD830B7586C"}"#;
        let rec: UserRecord = serde_json::from_str(user).unwrap();
        assert_eq!(rec.nt_hash.as_deref(), Some(nt_hash("password").as_str()));
        assert_eq!(
            serde_json::to_value(&rec).unwrap(),
            serde_json::from_str::<serde_json::Value>(user).unwrap()
        );
        assert!(!format!("{rec:?}").contains("8846"), "Debug hides the hash");
    }

    /// NT hashes as Samba computes them (its own `smbpasswd` wrote the
    /// second; the first is the well-known hash of "password"), including
    /// a character outside ASCII (UTF-16, not bytes).
    #[test]
    fn nt_hashes_match_samba() {
        assert_eq!(nt_hash("password"), "8846F7EAEE8FB117AD06BDD830B7586C");
        assert_eq!(nt_hash("secret1"), "B39A61F16A4E11FA80580241F1D4AAE8");
        assert_ne!(nt_hash("Passwort"), nt_hash("passwort"));
        assert_ne!(nt_hash("caf\u{e9}"), nt_hash("cafe"));
        assert_eq!(nt_hash(""), "31D6CFE0D16AE931B73C59D7E0C089C0");
    }

    #[test]
    fn default_target_names_are_valid_iscsi_names() {
        for (pool, share) in [("tank", "vm1"), ("Tank_2", "VM.Disk_1"), ("p", "a-b")] {
            let n = default_iqn(pool, share);
            assert!(tarn_iscsi::valid_name(&n), "{n}");
        }
        assert_eq!(
            default_iqn("Tank", "vm_1"),
            "iqn.2026-11.org.tarn:tank.vm-1"
        );
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
            iscsi: None,
            smb: None,
        };
        assert_pinned(&record, golden);

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
