//! Share links (`link.create`, `link.list`, `link.revoke`; served by
//! the web page at `/s/TOKEN`, docs/web.md).
//!
//! A link names a folder of a share and the user it acts as. It is kept
//! in `STATE/share-links.json` (0600) as its SHA-256, never the token, with
//! its password's hash (argon2, like users'). Nothing about a link is
//! trusted from the time it was made: each use looks the owner and the
//! share up again, so removing the user, taking the share from them,
//! revoking the link or passing its expiry closes it at once.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tarn_api::params::{LinkCreateParams, LinkCreated, LinkInfo};
use tarn_api::ApiError;

use crate::replication::{load_json, random_hex, save_private, sha256_hex};

/// The file of the links, in the state directory.
pub const LINKS_FILE: &str = "share-links.json";
/// Links kept at once.
pub const MAX_LINKS: usize = 10_000;
/// Links one user may keep at once: a user cannot take every link of
/// the server (nor make the server hash a password per link without end).
pub const MAX_LINKS_PER_USER: usize = 256;

/// One link as stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct LinkRecord {
    pub id: String,
    pub sha256: String,
    pub pool: String,
    pub share: String,
    pub path: String,
    pub upload: bool,
    #[serde(default)]
    pub password_hash: Option<String>,
    /// The user name (of `pool`) it acts as.
    pub owner: String,
    pub created_unix: u64,
    #[serde(default)]
    pub expires_unix: Option<u64>,
    /// The guid of `pool` when the link was made: a pool exported and
    /// another made or imported under its name does not inherit the link
    /// (None: a link made before links were bound, taken as bound to the
    /// name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_guid: Option<u64>,
}

#[derive(Clone, Default, Serialize, Deserialize)]
struct LinkFile {
    links: Vec<LinkRecord>,
}

/// The store of share links.
pub struct Links {
    path: PathBuf,
    lock: Mutex<()>,
    /// The file as last read, with its identity (modified time, length,
    /// inode): visitors' requests do not parse it again unless it
    /// changed.
    cache: Mutex<Option<(FileKey, LinkFile)>>,
}

type FileKey = (Option<SystemTime>, u64, u64);

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Checks a link's folder path: plain names separated by `/`.
pub(crate) fn check_path(path: &str) -> Result<String, ApiError> {
    let mut out = Vec::new();
    for c in path.split('/').filter(|c| !c.is_empty()) {
        if c == "." || c == ".." || c == ".snapshot" || c.contains('\0') || c.len() > 255 {
            return Err(ApiError::invalid(format!(
                "link path '{path}': plain folder names only (no '.', '..' or .snapshot)"
            )));
        }
        out.push(c);
    }
    Ok(out.join("/"))
}

impl Links {
    /// The links kept in `state_dir`.
    pub fn new(state_dir: &Path) -> Links {
        Links {
            path: state_dir.join(LINKS_FILE),
            lock: Mutex::new(()),
            cache: Mutex::new(None),
        }
    }

    fn load(&self) -> Result<LinkFile, ApiError> {
        use std::os::unix::fs::MetadataExt;
        let key = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.modified().ok(), m.len(), m.ino()));
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(k), Some((ck, f))) = (key, cache.as_ref()) {
            if k == *ck {
                return Ok(f.clone());
            }
        }
        let f: LinkFile = load_json(&self.path)?;
        *cache = key.map(|k| (k, f.clone()));
        Ok(f)
    }

    fn save(&self, f: &LinkFile) -> Result<(), ApiError> {
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = None;
        save_private(&self.path, f)
    }

    /// Adds a link for `owner` of `pool` (already checked by the caller:
    /// the share is theirs and the folder exists); returns its token.
    pub(crate) fn create(
        &self,
        pool: &str,
        pool_guid: Option<u64>,
        owner: &str,
        p: &LinkCreateParams,
    ) -> Result<LinkCreated, ApiError> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut f = self.load()?;
        let now = now_unix();
        f.links.retain(|l| l.expires_unix.is_none_or(|e| e > now));
        if f.links.len() >= MAX_LINKS {
            return Err(ApiError::invalid(format!(
                "{MAX_LINKS} links exist; revoke some first"
            )));
        }
        if f.links
            .iter()
            .filter(|l| l.pool == pool && l.owner == owner)
            .count()
            >= MAX_LINKS_PER_USER
        {
            return Err(ApiError::invalid(format!(
                "'{owner}' has {MAX_LINKS_PER_USER} links; revoke some first"
            )));
        }
        let password_hash = match p.password.as_deref() {
            Some("") => return Err(ApiError::invalid("an empty password protects nothing")),
            Some(pw) => Some(crate::access::hash_password(pw)?),
            None => None,
        };
        let expires_unix = match p.expires_in_secs {
            Some(0) => return Err(ApiError::invalid("the link would expire at once")),
            Some(s) => Some(now.saturating_add(s)),
            None => None,
        };
        let token = random_hex(32)?;
        let id = random_hex(6)?;
        f.links.push(LinkRecord {
            id: id.clone(),
            sha256: sha256_hex(&token),
            pool: pool.to_string(),
            share: p.share.clone(),
            path: check_path(&p.path)?,
            upload: p.upload,
            password_hash,
            owner: owner.to_string(),
            created_unix: now,
            expires_unix,
            pool_guid,
        });
        self.save(&f)?;
        Ok(LinkCreated { id, token })
    }

    /// Every live link (expired ones are not shown).
    pub(crate) fn list(&self) -> Result<Vec<LinkInfo>, ApiError> {
        let now = now_unix();
        Ok(self
            .load()?
            .links
            .into_iter()
            .filter(|l| l.expires_unix.is_none_or(|e| e > now))
            .map(|l| LinkInfo {
                id: l.id,
                pool: l.pool.clone(),
                share: l.share,
                path: l.path,
                upload: l.upload,
                password: l.password_hash.is_some(),
                owner: format!("{}/{}", l.pool, l.owner),
                created_unix: l.created_unix,
                expires_unix: l.expires_unix,
            })
            .collect())
    }

    /// Removes link `id`.
    pub(crate) fn revoke(&self, id: &str) -> Result<(), ApiError> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut f = self.load()?;
        let before = f.links.len();
        f.links.retain(|l| l.id != id);
        if f.links.len() == before {
            return Err(ApiError::not_found(format!("no link '{id}'")));
        }
        self.save(&f)
    }

    /// Removes the links of user `owner` of `pool` (every user's when
    /// None): a user deleted, or a pool destroyed, takes its links along,
    /// so a user added later under the same name (on a new pool of the
    /// same name) does not inherit links someone else made.
    pub(crate) fn forget(&self, pool: &str, owner: Option<&str>) -> Result<(), ApiError> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut f = self.load()?;
        let before = f.links.len();
        f.links
            .retain(|l| !(l.pool == pool && owner.is_none_or(|o| l.owner == o)));
        if f.links.len() == before {
            return Ok(());
        }
        self.save(&f)
    }

    /// The live link whose token this is.
    pub(crate) fn find(&self, token: &str) -> Option<LinkRecord> {
        // Hashes are compared, not tokens (see replication::Tokens).
        let want = sha256_hex(token.trim());
        let now = now_unix();
        self.load()
            .ok()?
            .links
            .into_iter()
            .find(|l| l.sha256 == want)
            .filter(|l| l.expires_unix.is_none_or(|e| e > now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(path: &str) -> LinkCreateParams {
        LinkCreateParams {
            share: "photos".into(),
            path: path.into(),
            upload: false,
            password: None,
            expires_in_secs: None,
            owner: None,
        }
    }

    #[test]
    fn a_deleted_user_or_destroyed_pool_takes_its_links_along() {
        let dir = tempfile::tempdir().unwrap();
        let links = Links::new(dir.path());
        let alice = links.create("tank", None, "alice", &params("a")).unwrap();
        let bob = links.create("tank", None, "bob", &params("b")).unwrap();
        let other = links.create("backup", None, "alice", &params("c")).unwrap();
        links.forget("tank", Some("alice")).unwrap();
        assert!(links.find(&alice.token).is_none());
        assert!(links.find(&bob.token).is_some(), "other users keep theirs");
        assert!(links.find(&other.token).is_some(), "other pools too");
        links.forget("tank", None).unwrap();
        assert!(links.find(&bob.token).is_none());
        assert!(links.find(&other.token).is_some());
    }

    #[test]
    fn tokens_are_kept_hashed_and_links_revoke_and_expire() {
        let dir = tempfile::tempdir().unwrap();
        let links = Links::new(dir.path());
        let a = links
            .create("tank", None, "alice", &params("2024/summer"))
            .unwrap();
        assert_eq!(a.token.len(), 64);
        let stored = std::fs::read_to_string(dir.path().join(LINKS_FILE)).unwrap();
        assert!(
            !stored.contains(&a.token),
            "the token itself is never stored"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(LINKS_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let found = links.find(&a.token).unwrap();
        assert_eq!(
            (found.path.as_str(), found.owner.as_str()),
            ("2024/summer", "alice")
        );
        assert!(links.find(&"0".repeat(64)).is_none());
        let mut expiring = params("");
        expiring.expires_in_secs = Some(1);
        let b = links.create("tank", None, "alice", &expiring).unwrap();
        assert!(links.find(&b.token).is_some());
        std::thread::sleep(std::time::Duration::from_millis(2100));
        assert!(links.find(&b.token).is_none(), "expired");
        assert_eq!(
            links.list().unwrap().len(),
            1,
            "expired links are not listed"
        );
        links.revoke(&a.id).unwrap();
        assert!(links.find(&a.token).is_none(), "revoked");
        assert!(links.revoke(&a.id).is_err());
        for bad in ["..", "a/../b", ".snapshot/x", "./a"] {
            assert!(
                links.create("tank", None, "alice", &params(bad)).is_err(),
                "{bad}"
            );
        }
        let mut empty_pw = params("");
        empty_pw.password = Some(String::new());
        assert!(links.create("tank", None, "alice", &empty_pw).is_err());
    }
}
