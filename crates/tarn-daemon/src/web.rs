//! The HTTPS API's side of the daemon (`tarn daemon --web ADDR`): who a
//! login, a bearer token or a session is, from the pools' users and the
//! token store, for `tarn-web` (which serves the API; docs/api.md).
//!
//! Users are the same as for WebDAV and SMB (stored in the pools); an
//! administrator is a user with the `admin` flag (`tarn user admin NAME
//! on`). Tokens are kept hashed in `STATE/api-tokens.json` (0600) and act
//! as their user with that user's role at the time of each request, so
//! removing a user or their flag takes effect at once.

use std::sync::{Arc, OnceLock, Weak};

use tarn_web::{UserId, WebAuth};

use crate::access;
use crate::pools::Pools;

/// [`WebAuth`] from the pools' user records.
pub struct WebUsers {
    /// The daemon's pools (weak: the server must not keep them alive).
    pub pools: Weak<Pools>,
}

/// A hash no password opens, checked for names that do not exist so a
/// failed login costs the same whether or not the name is a user's (the
/// time would otherwise tell which names are).
fn decoy_hash() -> &'static str {
    static DECOY: OnceLock<String> = OnceLock::new();
    DECOY.get_or_init(|| access::hash_password("tarn decoy password").unwrap_or_default())
}

impl WebUsers {
    fn record(&self, user: &UserId) -> Option<(access::UserRecord, String)> {
        let pools = self.pools.upgrade()?;
        let pool = pools.get(&user.pool).ok()?;
        let rec = access::user(&pool, &user.name).ok()?;
        Some((rec, pools.node_id.clone()))
    }
}

impl WebAuth for WebUsers {
    fn login(&self, user: &str, password: &str) -> Option<UserId> {
        let pools = self.pools.upgrade()?;
        let all = pools.all_pools();
        // Each pool's record of that name, tried in turn: the identity is
        // the record the password opened.
        let found = all.iter().find_map(|p| {
            access::authenticate(p, user, password).map(|r| UserId {
                pool: p.name().to_string(),
                name: r.name,
            })
        });
        if found.is_none() && !all.iter().any(|p| access::user(p, user).is_ok()) {
            let _ = access::verify_password(decoy_hash(), password);
        }
        found
    }

    fn token(&self, token: &str) -> Option<UserId> {
        let pools = self.pools.upgrade()?;
        let scope = pools.api_tokens.check(token)?;
        let (pool, name) = scope.split_once('/')?;
        let id = UserId {
            pool: pool.to_string(),
            name: name.to_string(),
        };
        // The token's user must still exist.
        self.record(&id).map(|_| id)
    }

    fn is_admin(&self, user: &UserId) -> Option<bool> {
        // An administrator of this daemon: a pool from another machine
        // brings none.
        self.record(user)
            .map(|(r, node)| r.admin_node.as_deref() == Some(node.as_str()))
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
    let running = tarn_web::serve(
        addr,
        tls,
        opts.web_origin.clone(),
        Arc::downgrade(&me),
        auth,
    )
    .map_err(|e| DaemonError::msg(e.to_string()))?;
    log::info!("tarn: web API on {scheme}://{}/api/", running.addr());
    Ok(running)
}
