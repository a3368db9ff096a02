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
//! Shares are stored as the API's [`Share`] (JSON), users as
//! [`UserRecord`]s, which add the password hash the API never shows.
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

use tarn_api::access::{check_share_name, check_user_name, Share, UserInfo};
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

/// The shares stored in `pool`.
pub fn shares(pool: &Pool) -> Result<Vec<Share>, ApiError> {
    tarn_dataset::config_list(pool, KIND_SHARE)
        .map_err(ds_error)?
        .into_iter()
        .map(|(n, v)| decode(KIND_SHARE, &n, &v))
        .collect()
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
    let kind =
        tarn_dataset::get_props(pool, &share.dataset, &["type".to_string()]).map_err(ds_error)?;
    if kind.first().map(|p| p.value.as_str()) != Some("filesystem") {
        return Err(ApiError::invalid(format!(
            "'{}' is not a filesystem dataset",
            share.dataset
        )));
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
    if share.nfs.is_none() && share.webdav.is_none() {
        return Err(ApiError::invalid("a share needs --nfs, --webdav or both"));
    }
    tarn_dataset::config_put(pool, KIND_SHARE, &share.name, &encode(share)?).map_err(ds_error)
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
