//! The HTTP(S) server: listener, connections, authentication, routing of
//! `/<share>/...` to one dav-server handler per share, and the tiny
//! virtual root collection that lists the shares.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use dav_server::body::Body;
use dav_server::davpath::DavPath;
use dav_server::ls::DavLockSystem;
use dav_server::memls::MemLs;
use dav_server::DavHandler;
use http::{header, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, Semaphore};

use crate::api::FsApi;
use crate::auth::{parse_basic, AuthCache, Authenticator, Principal, RateLimiter};
use crate::davfs::{Ctx, TarnDavFs, IO_CHUNK};

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
    /// Most connections served at once; further clients wait in the
    /// kernel's accept queue.
    pub max_connections: usize,
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
    /// A client must send a request's headers within this time.
    pub header_read_timeout: Duration,
}

impl WebdavConfig {
    /// Defaults: no TLS, 256 connections, 2 async workers, 16 blocking
    /// threads, 5 failures per 60 s, 30 s auth cache and header timeout.
    pub fn new(bind: SocketAddr) -> WebdavConfig {
        WebdavConfig {
            bind,
            tls: None,
            allow_plain_http_non_loopback: false,
            max_connections: 256,
            worker_threads: 2,
            blocking_threads: 16,
            auth_max_failures: 5,
            auth_failure_window: Duration::from_secs(60),
            auth_cache_ttl: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(30),
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
    limiter: RateLimiter,
    cache: AuthCache,
    window: Duration,
    header_timeout: Duration,
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
            _ => MemLs::new(),
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
    conns: Arc<Semaphore>,
    max_conns: usize,
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
        let (conns, max) = (self.conns.clone(), self.max_conns);
        rt.block_on(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while conns.available_permits() < max && tokio::time::Instant::now() < deadline {
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
        limiter: RateLimiter::new(config.auth_max_failures, config.auth_failure_window),
        cache: AuthCache::new(config.auth_cache_ttl),
        window: config.auth_failure_window,
        header_timeout: config.header_read_timeout,
    });
    let max_conns = config.max_connections.max(1);
    let conns = Arc::new(Semaphore::new(max_conns));
    let (tx, rx) = watch::channel(false);
    rt.spawn(accept_loop(listener, state.clone(), tls, rx, conns.clone()));
    Ok(Running {
        addr,
        state,
        shutdown: tx,
        runtime: Some(rt),
        conns,
        max_conns,
        fingerprint,
    })
}

#[cfg(not(feature = "tls"))]
#[derive(Clone)]
enum NoTls {}

#[cfg(feature = "tls")]
type Acceptor = tokio_rustls::TlsAcceptor;
#[cfg(not(feature = "tls"))]
type Acceptor = NoTls;

async fn accept_loop(
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    tls: Option<Acceptor>,
    mut shutdown: watch::Receiver<bool>,
    conns: Arc<Semaphore>,
) {
    loop {
        let permit = tokio::select! {
            p = conns.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = shutdown.changed() => return,
        };
        let (sock, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // e.g. EMFILE: back off instead of spinning.
                    eprintln!("tarn-webdav: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let _ = sock.set_nodelay(true);
        let (st, tls, sd) = (state.clone(), tls.clone(), shutdown.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                #[cfg(feature = "tls")]
                Some(acc) => {
                    let handshake = tokio::time::timeout(Duration::from_secs(15), acc.accept(sock));
                    if let Ok(Ok(s)) = handshake.await {
                        serve_conn(s, peer, st, sd).await;
                    }
                }
                #[cfg(not(feature = "tls"))]
                Some(n) => match n {},
                None => serve_conn(sock, peer, st, sd).await,
            }
        });
    }
}

async fn serve_conn<I>(
    io: I,
    peer: SocketAddr,
    state: Arc<State>,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let timeout = state.header_timeout;
    let svc = service_fn(move |req: Request<Incoming>| {
        let st = state.clone();
        async move { Ok::<_, Infallible>(handle(req, peer.ip(), st).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    if *shutdown.borrow() {
        conn.as_mut().graceful_shutdown();
    }
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = shutdown.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.as_mut().await;
        }
    }
}

fn simple(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn unauthorized() -> Response<Body> {
    let mut r = simple(StatusCode::UNAUTHORIZED, "authentication required\n");
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Basic realm=\"tarn\", charset=\"UTF-8\""),
    );
    r
}

fn too_many(wait: Duration) -> Response<Body> {
    let mut r = simple(
        StatusCode::TOO_MANY_REQUESTS,
        "too many failed logins; try again later\n",
    );
    let secs = wait.as_secs().max(1).to_string();
    if let Ok(v) = http::HeaderValue::from_str(&secs) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

async fn authenticate(
    req: &Request<Incoming>,
    ip: IpAddr,
    st: &Arc<State>,
) -> Result<Principal, Response<Body>> {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return st.auth.anonymous().ok_or_else(unauthorized);
    };
    let parsed = value.to_str().ok().and_then(parse_basic);
    let checked = match &parsed {
        Some((user, pass)) => match st.cache.get(user, pass) {
            Some(p) => Some(p),
            None => {
                let (auth, u, p) = (st.auth.clone(), user.clone(), pass.clone());
                let r = tokio::task::spawn_blocking(move || auth.check(&u, &p))
                    .await
                    .ok()
                    .flatten();
                if let Some(p) = &r {
                    st.cache.put(user, pass, p);
                }
                r
            }
        },
        None => None,
    };
    match checked {
        Some(p) => {
            st.limiter.succeed(ip);
            Ok(p)
        }
        None => {
            let who = parsed
                .as_ref()
                .map(|(u, _)| u.as_str())
                .unwrap_or("<malformed>");
            eprintln!("tarn-webdav: failed login for user {who:?} from {ip}");
            if st.limiter.fail(ip) {
                eprintln!("tarn-webdav: too many failed logins from {ip}; refusing it for a while");
                Err(too_many(st.window))
            } else {
                Err(unauthorized())
            }
        }
    }
}

/// Methods that never change anything.
fn is_read_only_method(m: &Method) -> bool {
    matches!(
        m.as_str(),
        "GET" | "HEAD" | "OPTIONS" | "PROPFIND" | "REPORT"
    )
}

async fn handle(req: Request<Incoming>, ip: IpAddr, st: Arc<State>) -> Response<Body> {
    if let Some(wait) = st.limiter.blocked(ip) {
        return too_many(wait);
    }
    let principal = match authenticate(&req, ip, &st).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    // Normalize exactly as dav-server will (percent-decoding, `.`/`..`
    // resolution, NUL and encoded '/' refused), then route on the first
    // segment. dav-server re-checks that the path lies under the prefix.
    let path = match DavPath::new(req.uri().path()) {
        Ok(p) => p,
        Err(dav_server::davpath::ParseError::ForbiddenPath) => {
            return simple(StatusCode::FORBIDDEN, "forbidden path\n")
        }
        Err(_) => return simple(StatusCode::BAD_REQUEST, "invalid path\n"),
    };
    let first = path
        .as_bytes()
        .split(|&b| b == b'/')
        .find(|s| !s.is_empty())
        .map(<[u8]>::to_vec);
    let Some(first) = first else {
        return root(&req, &st);
    };
    let shares = st.shares.read().unwrap_or_else(|e| e.into_inner()).clone();
    let share = match std::str::from_utf8(&first).ok().and_then(|n| shares.get(n)) {
        Some(s) => s.clone(),
        None => return simple(StatusCode::NOT_FOUND, "no such share\n"),
    };
    drop(shares);
    let listed = match &share.share.users {
        None => Some(true),
        Some(users) => users.get(&principal.name).copied(),
    };
    let Some(share_write) = listed else {
        return simple(StatusCode::FORBIDDEN, "no access to this share\n");
    };
    let can_write = principal.can_write && share_write && !share.share.read_only;
    if !can_write && !is_read_only_method(req.method()) {
        return simple(StatusCode::FORBIDDEN, "read-only\n");
    }
    let ctx = Ctx {
        cred: principal.cred(),
        can_write,
    };
    share
        .handler
        .handle_guarded(req, principal.name.clone(), ctx)
        .await
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The virtual root: lists the shares (GET: HTML, PROPFIND: multistatus).
fn root(req: &Request<Incoming>, st: &Arc<State>) -> Response<Body> {
    let shares = st.shares.read().unwrap_or_else(|e| e.into_inner()).clone();
    let mut names: Vec<&String> = shares.keys().collect();
    names.sort();
    let mut r = match req.method().as_str() {
        "OPTIONS" => {
            let mut r = Response::new(Body::empty());
            let h = r.headers_mut();
            h.insert("DAV", http::HeaderValue::from_static("1, 2"));
            h.insert("MS-Author-Via", http::HeaderValue::from_static("DAV"));
            r
        }
        "GET" | "HEAD" => {
            let mut html = String::from(
                "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tarn</title></head>\
                 <body><h1>Shares</h1><ul>\n",
            );
            for n in &names {
                let n = xml_escape(n);
                html.push_str(&format!("<li><a href=\"/{n}/\">{n}/</a></li>\n"));
            }
            html.push_str("</ul></body></html>\n");
            let body = if req.method() == Method::HEAD {
                Body::empty()
            } else {
                Body::from(html)
            };
            let mut r = Response::new(body);
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/html; charset=utf-8"),
            );
            r
        }
        "PROPFIND" => {
            let depth0 = req
                .headers()
                .get("Depth")
                .is_some_and(|d| d.as_bytes() == b"0");
            let entry = |href: &str| {
                format!(
                    "<D:response><D:href>{}</D:href><D:propstat><D:prop>\
                     <D:resourcetype><D:collection/></D:resourcetype>\
                     </D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>\n",
                    xml_escape(href)
                )
            };
            let mut x = String::from(
                "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<D:multistatus xmlns:D=\"DAV:\">\n",
            );
            x.push_str(&entry("/"));
            if !depth0 {
                for n in &names {
                    x.push_str(&entry(&format!("/{n}/")));
                }
            }
            x.push_str("</D:multistatus>\n");
            let mut r = Response::new(Body::from(x));
            *r.status_mut() = StatusCode::MULTI_STATUS;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/xml; charset=utf-8"),
            );
            r
        }
        _ => simple(
            StatusCode::METHOD_NOT_ALLOWED,
            "the root only lists shares\n",
        ),
    };
    r.headers_mut().insert(
        header::ALLOW,
        http::HeaderValue::from_static("OPTIONS, GET, HEAD, PROPFIND"),
    );
    r
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
