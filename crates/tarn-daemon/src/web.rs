//! The HTTPS API's side of the daemon (`tarn daemon --web ADDR`): who a
//! login, a bearer token or a session is, from the pools' users and the
//! token store, for `tarn-web` (which serves the API; docs/api.md).
//!
//! Users are the same as for WebDAV and SMB (stored in the pools); an
//! administrator is a user with the `admin` flag (`tarn user admin NAME
//! on`). Tokens are kept hashed in `STATE/api-tokens.json` (0600) and act
//! as their user with that user's role at the time of each request, so
//! removing a user or their flag takes effect at once.

use std::sync::{Arc, Weak};

use tarn_web::{FileShare, LinkGrant, UserId, WebAuth, WebFiles};

use crate::access;
use crate::pools::Pools;

/// [`WebAuth`] from the pools' user records.
pub struct WebUsers {
    /// The daemon's pools (weak: the server must not keep them alive).
    pub pools: Weak<Pools>,
}

impl WebUsers {
    fn record(&self, user: &UserId) -> Option<(access::UserRecord, String)> {
        let pools = self.pools.upgrade()?;
        let pool = pools.get(&user.pool).ok()?;
        let rec = access::user(&pool, &user.name).ok()?;
        Some((rec, pools.node_id.clone()))
    }
}

/// What [`WebAuth::stamp`] answers for a user record: its password hash,
/// hashed again (new at every password change: a fresh salt).
fn stamp_of(rec: &access::UserRecord) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    rec.hash.hash(&mut h);
    h.finish()
}

impl WebAuth for WebUsers {
    fn login(&self, user: &str, password: &str) -> Option<(UserId, u64)> {
        let pools = self.pools.upgrade()?;
        let all = pools.all_pools();
        // Each pool's record of that name, tried in turn: the identity is
        // the record the password opened, and its stamp that record's.
        let found = all.iter().find_map(|p| {
            access::authenticate(p, user, password).map(|r| {
                let stamp = stamp_of(&r);
                (
                    UserId {
                        pool: p.name().to_string(),
                        name: r.name,
                    },
                    stamp,
                )
            })
        });
        if found.is_none() && !all.iter().any(|p| access::user(p, user).is_ok()) {
            let _ = access::verify_password(access::decoy_hash(), password);
        }
        found
    }

    fn token(&self, token: &str) -> Option<UserId> {
        let pools = self.pools.upgrade()?;
        let (scope, guid) = pools.api_tokens.check_bound(token)?;
        let (pool, name) = scope.split_once('/')?;
        let id = UserId {
            pool: pool.to_string(),
            name: name.to_string(),
        };
        // The token's pool must be the one it was made in (not another
        // under its name since), and its user must still exist.
        if !same_pool(&pools, pool, guid) {
            return None;
        }
        self.record(&id).map(|_| id)
    }

    /// The stored password hash, hashed again: new at every password
    /// change (a fresh salt) and for a user made again.
    fn stamp(&self, user: &UserId) -> Option<u64> {
        self.record(user).map(|(rec, _)| stamp_of(&rec))
    }

    fn is_admin(&self, user: &UserId) -> Option<bool> {
        // An administrator of this daemon: a pool from another machine
        // brings none.
        self.record(user)
            .map(|(r, node)| r.admin_node.as_deref() == Some(node.as_str()))
    }
}

/// True when pool `name` is imported and, for a token or link bound to a
/// pool's guid, is that pool.
fn same_pool(pools: &Pools, name: &str, guid: Option<u64>) -> bool {
    pools
        .get(name)
        .is_ok_and(|p| guid.is_none_or(|g| p.guid() == g))
}

/// The shares `user` may open in the file pages: the filesystem shares
/// of their pool that list them for WebDAV or SMB, writable when either
/// gives them read-write access.
pub(crate) fn file_shares(pools: &Pools, user: &UserId) -> Vec<FileShare> {
    use tarn_api::access::Access;
    use tarn_api::Backend;
    let Ok(pool) = pools.get(&user.pool) else {
        return Vec::new();
    };
    let Ok(rec) = access::user(&pool, &user.name) else {
        return Vec::new();
    };
    if access::is_root(&rec) {
        return Vec::new();
    }
    let Ok(list) = pools.share_list() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for s in list.into_iter().filter(|s| s.pool == user.pool) {
        let share = s.share;
        let dav = share
            .webdav
            .as_ref()
            .and_then(|w| w.users.get(&user.name).copied());
        let smb = share
            .smb
            .as_ref()
            .and_then(|w| w.users.get(&user.name).copied());
        if dav.is_none() && smb.is_none() {
            continue;
        }
        let writable = dav == Some(Access::Rw) || smb == Some(Access::Rw);
        // Volumes, and filesystems whose key is not loaded, have no files
        // to show.
        let Ok(fs) = pools.fss.get(&pool, &share.dataset) else {
            continue;
        };
        out.push(FileShare {
            name: share.name,
            fs,
            cred: tarn_fs::Cred {
                uid: rec.uid,
                gid: rec.gid,
                groups: Vec::new(),
            },
            writable,
        });
    }
    out
}

/// Checks that `path` (checked plain names) is a folder of `share` as
/// its user reaches it, through no symbolic link.
pub(crate) fn folder_of(share: &FileShare, path: &str) -> Result<(), tarn_api::ApiError> {
    use tarn_api::ApiError;
    let mut cur = share
        .fs
        .getattr(tarn_fs::ROOT_INO)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        cur = share
            .fs
            .lookup(cur.ino, c.as_bytes(), &share.cred)
            .map_err(|e| ApiError::not_found(format!("folder '{path}': {}", e.message())))?;
        if cur.kind != tarn_fs::FileKind::Directory {
            return Err(ApiError::invalid(format!(
                "'{path}' is not a folder (links are to folders; symbolic links are not followed)"
            )));
        }
    }
    Ok(())
}

impl WebFiles for WebUsers {
    fn shares(&self, user: &UserId) -> Vec<FileShare> {
        match self.pools.upgrade() {
            Some(p) => file_shares(&p, user),
            None => Vec::new(),
        }
    }

    fn link(&self, token: &str) -> Option<LinkGrant> {
        let pools = self.pools.upgrade()?;
        let rec = pools
            .links
            .find(token)
            .filter(|r| same_pool(&pools, &r.pool, r.pool_guid))?;
        let owner = UserId {
            pool: rec.pool.clone(),
            name: rec.owner.clone(),
        };
        // Looked up now: an owner who lost the share (or was removed)
        // takes their links with them.
        let mut share = file_shares(&pools, &owner)
            .into_iter()
            .find(|s| s.name == rec.share)?;
        if rec.upload && !share.writable {
            return None;
        }
        share.writable = rec.upload;
        Some(LinkGrant {
            id: rec.id,
            share,
            path: rec.path,
            upload: rec.upload,
            password: rec.password_hash.is_some(),
            owner,
        })
    }

    fn snapshot_before_restore(&self, user: &UserId, share: &str) -> Result<String, String> {
        use tarn_api::Backend;
        let pools = self.pools.upgrade().ok_or("the daemon is stopping")?;
        let list = pools.share_list().map_err(|e| e.message)?;
        let dataset = list
            .iter()
            .find(|s| s.pool == user.pool && s.share.name == share)
            .map(|s| s.share.dataset.clone())
            .ok_or_else(|| format!("no share '{share}'"))?;
        let now = crate::links::now_unix();
        let (y, m, d) = tarn_api::time::civil_from_days(now / 86_400);
        let s = now % 86_400;
        let stamp = format!(
            "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
            s / 3600,
            s / 60 % 60,
            s % 60
        );
        for n in 0..100 {
            let name = match n {
                0 => format!("{dataset}@restore-{stamp}"),
                n => format!("{dataset}@restore-{stamp}-{n}"),
            };
            match pools.dataset_snapshot(std::slice::from_ref(&name), false) {
                Ok(()) => return Ok(name),
                Err(e) if e.code == tarn_api::ErrorCode::Exists => continue,
                Err(e) => return Err(e.message),
            }
        }
        Err("too many restores this second".into())
    }

    fn link_password(&self, token: &str, password: &str) -> bool {
        let Some(pools) = self.pools.upgrade() else {
            return false;
        };
        match pools
            .links
            .find(token)
            .filter(|r| same_pool(&pools, &r.pool, r.pool_guid))
            .and_then(|r| r.password_hash)
        {
            Some(h) => access::verify_password(&h, password),
            None => false,
        }
    }
}

/// Starts the HTTPS API on `addr`: TLS with the node's certificate, or
/// plain HTTP on a loopback address (for a reverse proxy, whose public
/// origin `opts.web_origin` names).
pub fn start(
    pools: &Arc<Pools>,
    addr: std::net::SocketAddr,
    opts: &crate::servers::ServerOptions,
    state_dir: &std::path::Path,
) -> crate::error::Result<tarn_web::Running> {
    use crate::error::DaemonError;
    let tls = if addr.ip().is_loopback() {
        None
    } else {
        let cfg = crate::servers::tls_config(opts, state_dir);
        let (tls, _fp) = tarn_webdav::tls_server_config(&cfg)
            .map_err(|e| DaemonError::msg(format!("web API TLS: {e}")))?;
        let mut tls = (*tls).clone();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Some(Arc::new(tls))
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let me: Arc<dyn tarn_api::Backend + Send + Sync> = pools.clone();
    let auth = Arc::new(WebUsers {
        pools: Arc::downgrade(pools),
    });
    let files: Arc<dyn WebFiles> = auth.clone();
    let running = tarn_web::serve(
        addr,
        tls,
        opts.web_origin.clone(),
        Arc::downgrade(&me),
        auth,
        Some(files),
    )
    .map_err(|e| DaemonError::msg(e.to_string()))?;
    log::info!("tarn: web API on {scheme}://{}/api/", running.addr());
    Ok(running)
}
