//! The HTTP(S) server: listener, connections, authentication, routing of
//! `/<share>/...` to one dav-server handler per share, and the tiny
//! virtual root collection that lists the shares.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;

use dav_server::body::Body;
use dav_server::davpath::DavPath;
use dav_server::ls::DavLockSystem;
use dav_server::memls::MemLs;
use dav_server::DavHandler;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tarn_conn::{Admission, Busy, Conn, Limits};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::api::FsApi;
use crate::auth::{parse_basic, AuthCache, Authenticator, Principal, RateLimiter};
use crate::davfs::{Ctx, TarnDavFs, IO_CHUNK};
use crate::headers::{self, Depth};
use crate::panics;
use crate::propfix::{self, PropFix};
use crate::reqwatch::{Heads, Watched};

/// Largest PROPFIND body read (dav-server's limit for XML bodies).
const MAX_XML_BODY: usize = 64 << 10;

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
        limiter: RateLimiter::new(config.auth_max_failures, config.auth_failure_window),
        cache: AuthCache::new(config.auth_cache_ttl),
        window: config.auth_failure_window,
        header_timeout: config.header_read_timeout,
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

#[cfg(not(feature = "tls"))]
#[derive(Clone)]
enum NoTls {}

#[cfg(feature = "tls")]
type Acceptor = tokio_rustls::TlsAcceptor;
#[cfg(not(feature = "tls"))]
type Acceptor = NoTls;

/// The answer to a plain-HTTP client turned away at accept: written if
/// the socket takes it at once, never waited for.
const BUSY_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n\
Connection: close\r\nContent-Length: 0\r\n\r\n";

async fn accept_loop(
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    tls: Option<Acceptor>,
    mut shutdown: watch::Receiver<bool>,
    adm: Arc<Admission>,
) {
    loop {
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
        let conn = match adm.admit(peer.ip()) {
            Ok(c) => c,
            Err(_) => {
                if tls.is_none() {
                    let _ = sock.try_write(BUSY_503);
                }
                drop(sock);
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        let (st, tls, sd) = (state.clone(), tls.clone(), shutdown.clone());
        tokio::spawn(async move {
            match tls {
                #[cfg(feature = "tls")]
                Some(acc) => {
                    let handshake = tokio::time::timeout(st.header_timeout, acc.accept(sock));
                    let s = tokio::select! {
                        r = handshake => r,
                        _ = conn.closed(None) => return,
                    };
                    if let Ok(Ok(s)) = s {
                        serve_conn(s, peer, conn, st, sd).await;
                    }
                }
                #[cfg(not(feature = "tls"))]
                Some(n) => match n {},
                None => serve_conn(sock, peer, conn, st, sd).await,
            }
        });
    }
}

async fn serve_conn<I>(
    io: I,
    peer: SocketAddr,
    conn: Conn,
    state: Arc<State>,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let timeout = state.header_timeout;
    let heads = Heads::default();
    let io = Watched::new(io, heads.clone());
    let activity = conn.state().clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        let st = state.clone();
        let heads = heads.clone();
        let busy = activity.begin();
        // Boxed so the connection is `Unpin` and its socket can be taken
        // back for the lingering close.
        Box::pin(async move {
            Ok::<_, Infallible>(serve_request(req, peer.ip(), st, heads, busy).await)
        })
    });
    let mut http = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .serve_connection(TokioIo::new(io), svc);
    if *shutdown.borrow() {
        Pin::new(&mut http).graceful_shutdown();
    }
    // Run to the end: hyper flushes the last answer and shuts the write
    // side (FIN) before it returns; only then is the socket taken back.
    let stopping = tokio::select! {
        _ = Pin::new(&mut http) => false,
        // Evicted for a newcomer while idle: just close.
        _ = conn.closed(None) => return,
        _ = shutdown.changed() => {
            Pin::new(&mut http).graceful_shutdown();
            let _ = Pin::new(&mut http).await;
            true
        }
    };
    if stopping || *shutdown.borrow() {
        return;
    }
    let io = http.into_parts().io.into_inner().into_inner();
    tokio::select! {
        _ = linger(io) => {}
        _ = conn.closed(None) => {}
        _ = shutdown.changed() => {}
    }
}

/// How long a closing connection keeps reading what its client still sends.
const LINGER: Duration = Duration::from_secs(2);

/// The lingering close of a connection whose last answer is written and
/// flushed: FIN (again, if hyper sent it already, or first, after an
/// error), then read and drop whatever the client still sends until it
/// closes too (or [`LINGER`] passes). Closing a socket with unread bytes makes the
/// kernel send a reset, and a client still uploading (a PUT answered 507
/// when the pool filled, a 413, a 401 before the body) would lose the
/// answer it had not read yet to that reset.
async fn linger<I: AsyncRead + AsyncWrite + Unpin>(mut io: I) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tokio::time::timeout(LINGER, async {
        let _ = io.shutdown().await;
        let mut sink = vec![0u8; 64 << 10];
        while let Ok(n) = io.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// One request: panics caught (500, one log line), the request's
/// [`Busy`] guard held until its response body is done.
async fn serve_request(
    req: Request<Incoming>,
    ip: IpAddr,
    st: Arc<State>,
    heads: Heads,
    busy: Busy,
) -> Response<RespBody> {
    let what = format!("{} {:.200} from {ip}", req.method(), req.uri().path());
    match panics::Caught(Box::pin(handle(req, ip, st, heads))).await {
        Ok((resp, fix)) => resp.map(|b| RespBody::new(b, busy, fix, what)),
        Err(p) => {
            panics::report(&what, p.as_ref());
            let mut r = simple(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n");
            r.headers_mut()
                .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
            r.map(|b| RespBody::new(b, busy, None, what))
        }
    }
}

/// A request body handed to dav-server: the connection's (a decoding
/// error is remembered, so the request is answered 400 rather than with
/// the library's 502), or one read ahead.
enum ReqBody {
    Stream(Incoming, Arc<AtomicBool>),
    Read(Option<Bytes>),
}

impl HttpBody for ReqBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            ReqBody::Stream(b, failed) => Pin::new(b).poll_frame(cx).map_err(|e| {
                failed.store(true, Ordering::Relaxed);
                std::io::Error::new(std::io::ErrorKind::InvalidData, e)
            }),
            ReqBody::Read(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Stream(b, _) => b.is_end_stream(),
            ReqBody::Read(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Stream(b, _) => b.size_hint(),
            ReqBody::Read(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ReqBody::Read(None) => SizeHint::with_exact(0),
        }
    }
}

/// A response body: dav-server's, possibly completed by [`PropFix`],
/// holding the request's [`Busy`] guard until it is done, and with
/// panics while it is produced caught (the connection is then closed).
pub(crate) struct RespBody {
    inner: Body,
    fix: Option<PropFix>,
    done: bool,
    _busy: Busy,
    what: String,
}

impl RespBody {
    fn new(inner: Body, busy: Busy, fix: Option<PropFix>, what: String) -> RespBody {
        RespBody {
            inner,
            fix,
            done: false,
            _busy: busy,
            what,
        }
    }
}

impl HttpBody for RespBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let inner = &mut this.inner;
            let polled = panics::catch(
                &this.what,
                std::panic::AssertUnwindSafe(|| Pin::new(inner).poll_frame(cx)),
            );
            let frame = match polled {
                None => {
                    this.done = true;
                    return Poll::Ready(Some(Err(std::io::Error::other(
                        "panic while producing the response",
                    ))));
                }
                Some(Poll::Pending) => return Poll::Pending,
                Some(Poll::Ready(f)) => f,
            };
            let Some(fix) = &mut this.fix else {
                return Poll::Ready(frame);
            };
            match frame {
                Some(Ok(f)) => match f.into_data() {
                    Ok(data) => {
                        let out = fix.feed(&data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                        }
                    }
                    Err(f) => return Poll::Ready(Some(Ok(f))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.done = true;
                    let out = fix.finish();
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.fix.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        if self.fix.is_some() {
            SizeHint::default()
        } else {
            self.inner.size_hint()
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
                let check = move || {
                    panics::catch(
                        "a password check",
                        std::panic::AssertUnwindSafe(|| auth.check(&u, &p)),
                    )
                    .flatten()
                };
                let r = tokio::task::spawn_blocking(check).await.ok().flatten();
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

/// The answer to a PROPFIND with `Depth: infinity` (RFC 4918 §9.1).
fn finite_depth() -> Response<Body> {
    let mut r = Response::new(Body::from(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n\
         <D:error xmlns:D=\"DAV:\"><D:propfind-finite-depth/></D:error>\n",
    ));
    *r.status_mut() = StatusCode::FORBIDDEN;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/xml; charset=utf-8"),
    );
    r
}

async fn handle(
    req: Request<Incoming>,
    ip: IpAddr,
    st: Arc<State>,
    heads: Heads,
) -> (Response<Body>, Option<PropFix>) {
    if let Some(wait) = st.limiter.blocked(ip) {
        return (too_many(wait), None);
    }
    // A fragment never reaches a request target the HTTP stack hands us,
    // so `DELETE /share/dir/#x` would remove all of dir/: refuse it.
    if heads.had_fragment(req.method().as_str(), &req.uri().to_string()) {
        return (
            simple(StatusCode::BAD_REQUEST, "fragment in request target\n"),
            None,
        );
    }
    if let Err(e) = headers::check(req.method(), req.version(), req.headers()) {
        let mut r = Response::new(Body::from(format!("{e}\n")));
        *r.status_mut() = StatusCode::BAD_REQUEST;
        return (r, None);
    }
    let principal = match authenticate(&req, ip, &st).await {
        Ok(p) => p,
        Err(r) => return (r, None),
    };
    if req.method().as_str() == "PROPFIND"
        && req
            .headers()
            .get("depth")
            .and_then(|d| headers::parse_depth(d.as_bytes()).ok())
            == Some(Depth::Infinity)
    {
        return (finite_depth(), None);
    }
    // Normalize exactly as dav-server will (percent-decoding, `.`/`..`
    // resolution, NUL and encoded '/' refused), then route on the first
    // segment. dav-server re-checks that the path lies under the prefix.
    let path = match DavPath::new(req.uri().path()) {
        Ok(p) => p,
        Err(dav_server::davpath::ParseError::ForbiddenPath) => {
            return (simple(StatusCode::FORBIDDEN, "forbidden path\n"), None)
        }
        Err(_) => return (simple(StatusCode::BAD_REQUEST, "invalid path\n"), None),
    };
    let first = path
        .as_bytes()
        .split(|&b| b == b'/')
        .find(|s| !s.is_empty())
        .map(<[u8]>::to_vec);
    let Some(first) = first else {
        return (root(&req, &st), None);
    };
    let shares = st.shares.read().unwrap_or_else(|e| e.into_inner()).clone();
    let share = match std::str::from_utf8(&first).ok().and_then(|n| shares.get(n)) {
        Some(s) => s.clone(),
        None => return (simple(StatusCode::NOT_FOUND, "no such share\n"), None),
    };
    drop(shares);
    let listed = match &share.share.users {
        None => Some(true),
        Some(users) => users.get(&principal.name).copied(),
    };
    let Some(share_write) = listed else {
        return (
            simple(StatusCode::FORBIDDEN, "no access to this share\n"),
            None,
        );
    };
    let can_write = principal.can_write && share_write && !share.share.read_only;
    if !can_write && !is_read_only_method(req.method()) {
        return (simple(StatusCode::FORBIDDEN, "read-only\n"), None);
    }
    let ctx = Ctx {
        cred: principal.cred(),
        can_write,
    };
    let (parts, body) = req.into_parts();
    let failed = Arc::new(AtomicBool::new(false));
    // A PROPFIND body is small XML (dav-server reads it whole too): read
    // it here to learn which properties the answer must list.
    let (body, wanted) = if parts.method.as_str() == "PROPFIND" {
        match http_body_util::Limited::new(body, MAX_XML_BODY)
            .collect()
            .await
        {
            Ok(c) => {
                let b = c.to_bytes();
                let wanted = propfix::requested(&b);
                (ReqBody::Read(Some(b)), wanted)
            }
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return (
                    simple(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n"),
                    None,
                )
            }
            Err(_) => {
                return (
                    simple(StatusCode::BAD_REQUEST, "malformed request body\n"),
                    None,
                )
            }
        }
    } else {
        (ReqBody::Stream(body, failed.clone()), None)
    };
    let req = Request::from_parts(parts, body);
    let resp = share
        .handler
        .handle_guarded(req, principal.name.clone(), ctx)
        .await;
    if failed.load(Ordering::Relaxed) {
        // The body could not be decoded (e.g. broken chunked encoding):
        // the client's fault, not a gateway's.
        let mut r = simple(StatusCode::BAD_REQUEST, "malformed request body\n");
        r.headers_mut()
            .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
        return (r, None);
    }
    let fix = match wanted {
        Some(w) if resp.status() == StatusCode::MULTI_STATUS => Some(PropFix::new(w)),
        _ => None,
    };
    (resp, fix)
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
