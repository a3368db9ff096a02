//! The HTTP(S) server: its settings, the share table, starting and
//! stopping it.
//!
//! This module owns what lives as long as the server: the configuration,
//! the [`State`] every connection shares (the share table behind its
//! `RwLock`, the authenticator, the failed-login limiter and the login
//! cache) and the runtime that [`Running`] stops. A share table is only
//! ever replaced whole ([`Running::set_shares`]), so a request sees one
//! table from start to end; a share that keeps its name and filesystem
//! keeps its lock table.
//!
//! What happens to one connection lives in [`conn`] (admission, the TLS
//! handshake, hyper, the lingering close, the request and response body
//! types); what happens to one request, from the failed-login check to
//! the dav-server handler of its share, in [`route`] (with the virtual
//! root collection that lists the shares).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use dav_server::ls::DavLockSystem;
use dav_server::memls::MemLs;
use dav_server::DavHandler;
use tarn_conn::{Admission, Limits};
use tokio::sync::watch;

use crate::api::FsApi;
use crate::auth::{AuthCache, Authenticator, InFlight};
use crate::davfs::{Ctx, TarnDavFs, IO_CHUNK};
use crate::panics;

mod conn;
mod route;

use conn::accept_loop;
#[cfg(not(feature = "tls"))]
use conn::NoTls;

/// Errors of [`serve`] and [`Running::set_shares`].
#[derive(Debug, thiserror::Error)]
pub enum WebdavError {
    /// Binding or another socket / file operation failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Plain HTTP on a non-loopback address without
    /// [`WebdavConfig::allow_plain_http_non_loopback`].
    #[error(
        "refusing plain HTTP on non-loopback address {0}: configure TLS or allow it explicitly"
    )]
    PlainHttpRefused(SocketAddr),
    /// A share name that is empty, not URL-safe, or used twice.
    #[error("invalid share: {0}")]
    InvalidShare(String),
    /// Certificate or key problems, or TLS requested in a build without the
    /// `tls` feature.
    #[error("TLS: {0}")]
    Tls(String),
}

/// Where the server's certificate comes from.
#[derive(Clone, Debug)]
pub enum TlsConfig {
    /// A PEM certificate chain and a PEM private key (PKCS#8, PKCS#1 or SEC1).
    Pem {
        /// Certificate chain, leaf first.
        cert: PathBuf,
        /// Private key.
        key: PathBuf,
    },
    /// A self-signed certificate kept in `dir` (`webdav-cert.pem`,
    /// `webdav-key.pem`, the key mode 0600), generated at the first start.
    /// Its SHA-256 fingerprint is printed to stderr at every start and
    /// returned by [`Running::tls_fingerprint`], so users can check it.
    SelfSigned {
        /// Directory for the certificate and key.
        dir: PathBuf,
        /// Subject alternative names (DNS names or IP addresses); empty
        /// means `localhost`, `127.0.0.1`, `::1`.
        names: Vec<String>,
    },
}

/// Server settings. Build with [`WebdavConfig::new`] and adjust fields.
#[derive(Clone, Debug)]
pub struct WebdavConfig {
    /// Listen address (port 0 picks a free port; see [`Running::local_addr`]).
    pub bind: SocketAddr,
    /// HTTPS when set.
    pub tls: Option<TlsConfig>,
    /// Allow plain HTTP on an address that is not loopback (passwords then
    /// travel in clear text). Off by default.
    pub allow_plain_http_non_loopback: bool,
    /// Most connections open at once. When all are taken, an idle
    /// connection (waiting for or receiving a request head) is closed for
    /// a newcomer: one of the address holding the most connections, the
    /// longest idle of those. Only when every connection is serving a
    /// request is the newcomer turned away (503 on plain HTTP).
    pub max_connections: usize,
    /// Most connections open at once from one client address; more are
    /// turned away at accept (503 on plain HTTP). Clients behind one NAT
    /// address share it.
    pub max_connections_per_address: usize,
    /// Async worker threads (network I/O only).
    pub worker_threads: usize,
    /// Most threads running blocking filesystem calls at once.
    pub blocking_threads: usize,
    /// Failed logins from one IP within `auth_failure_window` after which
    /// that IP gets 429 until the window has passed.
    pub auth_max_failures: u32,
    /// See `auth_max_failures`.
    pub auth_failure_window: Duration,
    /// How long a successful password check is remembered (0: never), so a
    /// slow password hash is not recomputed on every request.
    pub auth_cache_ttl: Duration,
    /// A client must complete the TLS handshake, and send each request's
    /// head, within this time; a kept-alive connection waiting for its
    /// next request is closed after it too.
    pub header_read_timeout: Duration,
}

impl WebdavConfig {
    /// Defaults: no TLS, 256 connections and 32 per address, 2 async
    /// workers, 16 blocking threads, 5 failures per 60 s, 30 s auth cache,
    /// 5 s header timeout.
    pub fn new(bind: SocketAddr) -> WebdavConfig {
        WebdavConfig {
            bind,
            tls: None,
            allow_plain_http_non_loopback: false,
            max_connections: 256,
            max_connections_per_address: 32,
            worker_threads: 2,
            blocking_threads: 16,
            auth_max_failures: 5,
            auth_failure_window: Duration::from_secs(60),
            auth_cache_ttl: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(5),
        }
    }
}

/// One exported directory tree, served under `/<name>/`.
#[derive(Clone)]
pub struct Share {
    /// URL prefix: the share is `/<name>/`. Letters, digits, `.`, `_`, `-`.
    pub name: String,
    /// The filesystem (any `tarn_fs::Fs<B>` in an `Arc`).
    pub fs: Arc<dyn FsApi>,
    /// Inode of the share's root directory (normally `tarn_fs::ROOT_INO`);
    /// nothing above it is reachable.
    pub root: u64,
    /// Refuse every modifying request with 403, whoever asks.
    pub read_only: bool,
    /// umask for files (mode 0666) and directories (0777) created here.
    pub umask: u32,
    /// Who may use the share, by principal name, with write access or
    /// not; None admits every authenticated principal.
    pub users: Option<std::collections::BTreeMap<String, bool>>,
    /// Where the names in `users` are defined (tarn: the pool that stores
    /// the share and its users): credentials for a request to this share
    /// are checked there ([`crate::Authenticator::check_in`]), so a user of
    /// the same name elsewhere is not taken for one of them.
    pub realm: Option<String>,
}

impl Share {
    /// A writable share of the whole filesystem with umask 022.
    pub fn new(name: impl Into<String>, fs: Arc<dyn FsApi>) -> Share {
        Share {
            name: name.into(),
            fs,
            root: tarn_fs::ROOT_INO,
            read_only: false,
            umask: 0o022,
            users: None,
            realm: None,
        }
    }
}

struct ShareState {
    share: Share,
    handler: DavHandler<Ctx>,
    ls: Box<dyn DavLockSystem>,
}

type ShareMap = Arc<HashMap<String, Arc<ShareState>>>;

struct State {
    shares: RwLock<ShareMap>,
    auth: Arc<dyn Authenticator>,
    limiter: tarn_conn::LoginLimiter,
    /// Password checks running at once (cache misses; see
    /// [`tarn_conn::PASSWORD_CHECKS_AT_ONCE`]).
    checks: Arc<tokio::sync::Semaphore>,
    /// Password checks running, which requests with the same credentials
    /// wait for.
    in_flight: InFlight,
    cache: AuthCache,
    header_timeout: Duration,
    /// Per method (by [`METHODS`], then others): time to the response
    /// head, and 5xx answers.
    requests: Vec<tarn_stats::RequestStats>,
}

/// The methods metrics count one by one; the last slot is any other.
pub const METHODS: [&str; 14] = [
    "GET",
    "HEAD",
    "PUT",
    "DELETE",
    "PROPFIND",
    "PROPPATCH",
    "MKCOL",
    "COPY",
    "MOVE",
    "LOCK",
    "UNLOCK",
    "OPTIONS",
    "POST",
    "other",
];

impl State {
    /// The stats slot of `method`.
    fn method_stats(&self, method: &str) -> Option<&tarn_stats::RequestStats> {
        let i = METHODS
            .iter()
            .position(|m| *m == method)
            .unwrap_or(METHODS.len() - 1);
        self.requests.get(i)
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 128
        && n != "."
        && n != ".."
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

fn same_fs(a: &Share, b: &Share) -> bool {
    std::ptr::eq(
        Arc::as_ptr(&a.fs) as *const (),
        Arc::as_ptr(&b.fs) as *const (),
    ) && a.root == b.root
}

/// Builds the share table; a share whose name and filesystem are unchanged
/// keeps its lock table (so `set_shares` does not drop clients' locks).
fn build_shares(
    shares: Vec<Share>,
    old: &HashMap<String, Arc<ShareState>>,
) -> Result<ShareMap, WebdavError> {
    let mut map = HashMap::new();
    for share in shares {
        if !valid_name(&share.name) {
            return Err(WebdavError::InvalidShare(format!(
                "{:?}: use letters, digits, '.', '_' and '-'",
                share.name
            )));
        }
        if map.contains_key(&share.name) {
            return Err(WebdavError::InvalidShare(format!(
                "{:?} appears twice",
                share.name
            )));
        }
        let ls: Box<dyn DavLockSystem> = match old.get(&share.name) {
            Some(o) if same_fs(&o.share, &share) => o.ls.clone(),
            _ => crate::locks::ExpiringLs::new(MemLs::new()),
        };
        let handler = DavHandler::builder()
            .filesystem(Box::new(TarnDavFs::new(
                share.fs.clone(),
                share.root,
                share.umask,
            )))
            .locksystem(ls.clone())
            .strip_prefix(format!("/{}", share.name))
            .autoindex(true)
            .read_buf_size(IO_CHUNK)
            .build_handler();
        map.insert(
            share.name.clone(),
            Arc::new(ShareState { share, handler, ls }),
        );
    }
    Ok(Arc::new(map))
}

/// A running server. Dropping it stops it, like [`Running::stop`].
pub struct Running {
    addr: SocketAddr,
    state: Arc<State>,
    shutdown: watch::Sender<bool>,
    runtime: Option<tokio::runtime::Runtime>,
    admission: Arc<Admission>,
    fingerprint: Option<String>,
}

impl Running {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// SHA-256 fingerprint of the TLS certificate (`AB:CD:...`), if TLS is on.
    pub fn tls_fingerprint(&self) -> Option<&str> {
        self.fingerprint.as_deref()
    }

    /// Connection counters: open connections, refusals by reason,
    /// evictions.
    pub fn stats(&self) -> tarn_conn::Stats {
        self.admission.stats()
    }

    /// Requests per method since the start: (method, latency to the
    /// response head, 5xx answers), for the metrics endpoint.
    pub fn request_stats(&self) -> Vec<(&'static str, tarn_stats::Snapshot, u64)> {
        METHODS
            .iter()
            .zip(&self.state.requests)
            .map(|(m, s)| {
                (
                    *m,
                    s.latency.snapshot(),
                    s.errors.load(std::sync::atomic::Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// Replaces the set of shares. Connections stay open; requests already
    /// running finish on the old set, later ones see the new one. Shares
    /// that keep their name and filesystem keep their locks.
    pub fn set_shares(&self, shares: Vec<Share>) -> Result<(), WebdavError> {
        let mut cur = self.state.shares.write().unwrap_or_else(|e| e.into_inner());
        let new = build_shares(shares, &cur)?;
        *cur = new;
        Ok(())
    }

    /// Stops accepting, lets running requests finish (up to 5 s), then
    /// closes every connection.
    pub fn stop(mut self) {
        self.shutdown_now();
    }

    fn shutdown_now(&mut self) {
        let _ = self.shutdown.send(true);
        let Some(rt) = self.runtime.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Inside another runtime we must not block.
            rt.shutdown_background();
            return;
        }
        let adm = self.admission.clone();
        rt.block_on(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while adm.stats().open > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        rt.shutdown_timeout(Duration::from_secs(1));
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown_now();
    }
}

/// Starts a WebDAV server on its own tokio runtime and returns once it is
/// listening. Plain HTTP on a non-loopback address is refused unless
/// [`WebdavConfig::allow_plain_http_non_loopback`] is set.
pub fn serve(
    config: WebdavConfig,
    shares: Vec<Share>,
    auth: Arc<dyn Authenticator>,
) -> Result<Running, WebdavError> {
    if config.tls.is_none()
        && !config.bind.ip().is_loopback()
        && !config.allow_plain_http_non_loopback
    {
        return Err(WebdavError::PlainHttpRefused(config.bind));
    }
    let shares = build_shares(shares, &HashMap::new())?;
    panics::install_hook();
    #[cfg(feature = "tls")]
    let (tls, fingerprint) = match &config.tls {
        Some(t) => {
            let (sc, fp) = crate::tls::server_config(t)?;
            (Some(tokio_rustls::TlsAcceptor::from(sc)), Some(fp))
        }
        None => (None, None),
    };
    #[cfg(not(feature = "tls"))]
    let (tls, fingerprint): (Option<NoTls>, Option<String>) = match &config.tls {
        Some(_) => {
            return Err(WebdavError::Tls(
                "this build of tarn-webdav has no TLS support (feature `tls`)".into(),
            ))
        }
        None => (None, None),
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.worker_threads.max(1))
        .max_blocking_threads(config.blocking_threads.max(1))
        .thread_name("tarn-webdav")
        .enable_all()
        .build()?;
    let std_listener = std::net::TcpListener::bind(config.bind)?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let listener = {
        let _guard = rt.enter();
        tokio::net::TcpListener::from_std(std_listener)?
    };
    let state = Arc::new(State {
        shares: RwLock::new(shares),
        auth,
        limiter: tarn_conn::LoginLimiter::new(config.auth_max_failures, config.auth_failure_window),
        checks: Arc::new(tokio::sync::Semaphore::new(
            tarn_conn::PASSWORD_CHECKS_AT_ONCE,
        )),
        in_flight: InFlight::default(),
        cache: AuthCache::new(config.auth_cache_ttl),
        header_timeout: config.header_read_timeout,
        requests: METHODS
            .iter()
            .map(|_| tarn_stats::RequestStats::default())
            .collect(),
    });
    let admission = Admission::new(
        "tarn-webdav",
        Limits {
            max_connections: config.max_connections,
            max_per_address: config.max_connections_per_address,
        },
    );
    let (tx, rx) = watch::channel(false);
    rt.spawn(accept_loop(
        listener,
        state.clone(),
        tls,
        rx,
        admission.clone(),
    ));
    Ok(Running {
        addr,
        state,
        shutdown: tx,
        runtime: Some(rt),
        admission,
        fingerprint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_names() {
        assert!(valid_name("media"));
        assert!(valid_name("a.b_c-1"));
        for bad in ["", ".", "..", "a/b", "a b", "é", "a%2F"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
