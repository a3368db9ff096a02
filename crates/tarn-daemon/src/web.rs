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

use tarn_web::WebAuth;

use crate::access;
use crate::pools::Pools;

/// [`WebAuth`] from the pools' user records.
pub struct WebUsers {
    /// The daemon's pools (weak: the server must not keep them alive).
    pub pools: Weak<Pools>,
}

impl WebUsers {
    fn record(&self, user: &str) -> Option<access::UserRecord> {
        let pools = self.pools.upgrade()?;
        let all = pools.all_pools();
        all.iter().find_map(|p| access::user(p, user).ok())
    }
}

impl WebAuth for WebUsers {
    fn login(&self, user: &str, password: &str) -> Option<String> {
        let pools = self.pools.upgrade()?;
        let all = pools.all_pools();
        all.iter()
            .find_map(|p| access::authenticate(p, user, password))
            .map(|r| r.name)
    }

    fn token(&self, token: &str) -> Option<String> {
        let pools = self.pools.upgrade()?;
        let user = pools.api_tokens.check(token)?;
        // The token's user must still exist.
        self.record(&user).map(|r| r.name)
    }

    fn is_admin(&self, user: &str) -> Option<bool> {
        self.record(user).map(|r| r.admin)
    }
}

/// Starts the HTTPS API on `addr`: TLS with the node's certificate, or
/// plain HTTP on a loopback address.
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
    let running = tarn_web::serve(addr, tls, Arc::downgrade(&me), auth)
        .map_err(|e| DaemonError::msg(e.to_string()))?;
    log::info!("tarn: web API on {scheme}://{}/api/", running.addr());
    Ok(running)
}
