//! tarn-web: the admin API over HTTPS, for the web page and for scripts
//! (docs/api.md).
//!
//! # One API, two doors
//!
//! Every method is the admin socket's, run by the same dispatch table
//! (`tarn_api::dispatch::call`) against the same backend: `POST
//! /api/call/METHOD` with the method's parameters as a JSON body answers
//! what the socket answers. What differs is who calls. The socket is
//! root's; here a caller is a tarn user, and `tarn_api::roles` says what
//! each method needs: any user (answers filtered to their own shares and
//! datasets, and only their own password), an administrator, or never
//! over HTTPS (methods that touch the server's own files as root, byte
//! streams, other transports).
//!
//! # Who is calling
//!
//! - **Browsers** log in (`POST /api/login` with a user and password) and
//!   get a session cookie (`HttpOnly`, `SameSite=Strict`; over TLS
//!   `Secure` and named with the `__Host-` prefix, see [`COOKIE_SECURE`])
//!   and a CSRF token. Every later `POST` with the cookie must carry
//!   the token in `X-CSRF-Token` (compared in constant time), and its
//!   `Origin`, when sent, must be this server: a page of another site
//!   cannot make a logged-in browser act. Sessions end after
//!   [`SESSION_IDLE`] without use, [`SESSION_MAX`] after login, at logout,
//!   or when their user is removed.
//! - **Scripts** send `Authorization: Bearer TOKEN`, a token an
//!   administrator made for a user (`tarn user token add`); no cookie, so
//!   no CSRF token is needed. Only the token's SHA-256 is kept.
//! - The role is looked up at each request, not remembered: a user made
//!   an administrator (or no longer one) is treated so at their next
//!   request.
//!
//! Every request body must be JSON (`Content-Type: application/json`),
//! which a cross-site form cannot send without a preflight this server
//! never answers. Failed logins are counted per client address (an
//! IPv6 client per /64), each attempt before its password is checked so
//! parallel attempts cannot slip past the count: after [`LOGIN_FAILURES`]
//! in [`LOGIN_WINDOW`] that address gets 429 until the window passes.
//! The caller is settled before a body is read; bodies are bounded in
//! size ([`MAX_BODY`]) and time ([`BODY_TIMEOUT`]), request heads must
//! arrive within [`HEADER_TIMEOUT`], connections are capped in all and
//! per client address (`tarn-conn`'s admission: at the limit an idle one
//! is closed for a newcomer) and closed after [`IDLE_TIMEOUT`] idle.
//!
//! A user is a record of one pool ([`UserId`]): names repeat across
//! pools, so sessions, tokens, roles and the user methods' filters all
//! follow the (pool, name) the password or token opened.
//!
//! # Transport
//!
//! HTTP/1.1 with hyper on a small tokio runtime owned by one thread, so
//! the daemon starts and stops it like its other servers; TLS with
//! rustls (the node's certificate, as WebDAV's). Plain HTTP is the
//! caller's decision, which the daemon allows on loopback only. A call
//! runs on the runtime's blocking pool: the backend's methods block.

#![warn(missing_docs)]

mod files;
mod routes;
mod thumbs;
mod zip;

pub use files::{FileShare, LinkGrant, WebFiles};

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tarn_api::roles::Role;
use tarn_api::{ApiError, Backend, ErrorCode};

/// A session ends after this long without a request.
pub const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// A session ends this long after its login, used or not.
pub const SESSION_MAX: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at once; the least recently used goes first.
pub const MAX_SESSIONS: usize = 4096;
/// Failed logins from one address before it must wait.
pub const LOGIN_FAILURES: usize = 5;
/// The window failed logins are counted in.
pub const LOGIN_WINDOW: Duration = Duration::from_secs(60);
/// Largest request body.
pub const MAX_BODY: usize = 1 << 20;
/// Time for a TLS handshake and each request head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Connections from one client address at once.
pub const MAX_PER_ADDRESS: usize = 32;
/// A kept-alive connection without a request for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The session cookie's name over plain HTTP.
pub const COOKIE: &str = "tarn_session";
/// The session cookie's name when cookies are `Secure` (TLS, or an
/// https public origin). With the `__Host-` prefix a browser keeps the
/// cookie only if it came over TLS with `Path=/` and no `Domain`, so a
/// page on a neighbouring subdomain cannot plant one of that name that
/// the browser would send in ours' place ("cookie tossing": the victim
/// would act in a session of the attacker's). The plain name is not
/// read then.
pub const COOKIE_SECURE: &str = "__Host-tarn_session";

/// A tarn user: the pool that stores the record and the name in it.
/// Names are per pool (two pools may each have an `alice`), so a caller
/// is always both.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UserId {
    /// The pool of the user record.
    pub pool: String,
    /// The login name.
    pub name: String,
}

/// How the web front end checks users; the daemon answers from the
/// pools' user records and its token store. These block (they read
/// records and hash passwords): the server calls them off its async
/// threads.
pub trait WebAuth: Send + Sync + 'static {
    /// The user whose record these credentials open, with that record's
    /// [`WebAuth::stamp`] (None: wrong; the check costs the same for a name
    /// that does not exist). The stamp comes with the record the password
    /// opened: read apart, a password changed between the check and the
    /// read would give the new stamp to a session opened with the old
    /// password, which the change would then not end.
    fn login(&self, user: &str, password: &str) -> Option<(UserId, u64)>;
    /// The user a bearer token acts as (None: not a token of ours).
    fn token(&self, token: &str) -> Option<UserId>;
    /// Whether `user` is an administrator of this daemon now (None: no
    /// such user any more).
    fn is_admin(&self, user: &UserId) -> Option<bool>;
    /// A value that changes whenever `user`'s password does, however it
    /// is changed (here, with the `tarn` command, over another API), and
    /// when the user is removed and made again (None: no such user). A
    /// session opened under one value ends when it changes, so whoever
    /// knew the old password is out. The default never changes.
    fn stamp(&self, user: &UserId) -> Option<u64> {
        let _ = user;
        Some(0)
    }
}

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    /// The address could not be bound, or the runtime not started.
    #[error("web API: {0}")]
    Io(#[from] std::io::Error),
}

/// A logged-in browser.
struct Session {
    user: UserId,
    csrf: String,
    created: Instant,
    last: Instant,
    /// The user's [`WebAuth::stamp`] at login.
    stamp: u64,
}

struct State {
    backend: Weak<dyn Backend + Send + Sync>,
    auth: Arc<dyn WebAuth>,
    tls: bool,
    /// The public origin when behind a proxy (`https://nas.example.org`).
    origin: Option<String>,
    sessions: Mutex<HashMap<String, Session>>,
    /// Failed logins and wrong link passwords per client.
    failures: tarn_conn::LoginLimiter,
    /// Password checks at once (argon2 is slow on purpose).
    logins: Arc<tokio::sync::Semaphore>,
    /// The file pages' daemon side (None: not served).
    files: Option<Arc<dyn WebFiles>>,
    /// Upload sessions in progress.
    uploads: files::Uploads,
    /// Unlocked password links: cookie → (link id, when).
    link_sessions: Mutex<HashMap<String, (String, Instant)>>,
    /// Made thumbnails.
    thumbs: thumbs::Thumbs,
    /// Folder downloads streaming now ([`files::MAX_ZIPS`]).
    zips: Arc<tokio::sync::Semaphore>,
    /// Folders swept of forgotten upload temporaries, and when.
    swept: Mutex<HashMap<(usize, u64), Instant>>,
}

/// Sessions one user may have; their least recently used goes first.
pub const SESSIONS_PER_USER: usize = 32;
/// Password checks running at once.
pub const LOGINS_AT_ONCE: usize = tarn_conn::PASSWORD_CHECKS_AT_ONCE;
/// Time for a request body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// The running server.
pub struct Running {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Memory held by cached thumbnails (the metric
    /// `tarn_web_thumbnail_cache_bytes`).
    pub fn thumbnail_cache_bytes(&self) -> usize {
        self.state.thumbs.bytes()
    }

    /// Drops the cached thumbnails (when a key is unloaded: they show
    /// the plaintext of its datasets' photos).
    pub fn forget_thumbnails(&self) {
        self.state.thumbs.clear();
    }

    /// Stops listening and ends the connections.
    pub fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn random_hex(n: usize) -> Option<String> {
    let mut raw = vec![0u8; n];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw).ok()?;
    Some(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// Equal, in a time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Starts serving on `addr` (HTTPS with `tls`, else plain HTTP).
/// `origin` is the public origin (`https://nas.example.org`) when a
/// reverse proxy serves the API there: the only `Origin` accepted from
/// browsers, and it makes cookies `Secure` when it is https.
pub fn serve(
    addr: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    origin: Option<String>,
    backend: Weak<dyn Backend + Send + Sync>,
    auth: Arc<dyn WebAuth>,
    files: Option<Arc<dyn WebFiles>>,
) -> Result<Running, WebError> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let state = Arc::new(State {
        backend,
        auth,
        tls: tls.is_some(),
        origin: origin.map(|o| o.trim_end_matches('/').to_string()),
        sessions: Mutex::new(HashMap::new()),
        failures: tarn_conn::LoginLimiter::new(LOGIN_FAILURES as u32, LOGIN_WINDOW),
        logins: Arc::new(tokio::sync::Semaphore::new(LOGINS_AT_ONCE)),
        files,
        uploads: Default::default(),
        link_sessions: Mutex::new(HashMap::new()),
        thumbs: thumbs::Thumbs::default(),
        swept: Mutex::new(HashMap::new()),
        zips: Arc::new(tokio::sync::Semaphore::new(files::MAX_ZIPS)),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .thread_name("tarn-web")
        .enable_all()
        .build()?;
    let st = state.clone();
    let thread = std::thread::Builder::new()
        .name("tarn-web".into())
        .spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) else {
                    return;
                };
                // Idle upload sessions end even when nobody uploads.
                let reaped = st.clone();
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(files::REAP_EVERY).await;
                        let st = reaped.clone();
                        let _ = tokio::task::spawn_blocking(move || files::reap(&st)).await;
                    }
                });
                accept_loop(listener, st, tls, stop_rx).await;
            });
            rt.shutdown_timeout(Duration::from_secs(5));
        })?;
    Ok(Running {
        addr,
        state,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let adm = tarn_conn::Admission::new(
        "tarn-web",
        tarn_conn::Limits {
            max_connections: MAX_CONNECTIONS,
            max_per_address: MAX_PER_ADDRESS,
        },
    );
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let (sock, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    log::warn!("tarn-web: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let Ok(conn) = adm.admit(peer.ip()) else {
            continue; // over a limit: the connection is closed
        };
        let _ = sock.set_nodelay(true);
        let (st, acc, mut sd) = (state.clone(), acceptor.clone(), stop.clone());
        tokio::spawn(async move {
            match acc {
                Some(acc) => {
                    let Ok(Ok(s)) = tokio::time::timeout(HEADER_TIMEOUT, acc.accept(sock)).await
                    else {
                        return;
                    };
                    serve_conn(s, peer, conn, st, &mut sd).await;
                }
                None => serve_conn(sock, peer, conn, st, &mut sd).await,
            }
        });
    }
}

async fn serve_conn<I>(
    io: I,
    peer: SocketAddr,
    conn: tarn_conn::Conn,
    state: Arc<State>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let activity = conn.state().clone();
    // A client that stops reading its answer counts as idle after a
    // while, and is closed by the idle timeout (see `watch`).
    let (io, clock) = tarn_conn::Progress::new(io);
    let svc = service_fn(move |req: Request<Incoming>| {
        let st = state.clone();
        // Busy while a request runs and its answer is sent (a download
        // streams long after the handler returned): only idle
        // connections are evicted or closed for idleness.
        let busy = activity.begin();
        let activity = activity.clone();
        async move {
            let r = CONN.scope(activity, handle(req, peer.ip(), st)).await;
            Ok::<_, Infallible>(r.map(|b| {
                BusyBody {
                    inner: b,
                    _busy: busy,
                }
                .boxed_unsync()
            }))
        }
    });
    let http = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(io), svc);
    tokio::pin!(http);
    tokio::select! {
        _ = http.as_mut() => {}
        // Idle too long, or evicted for a newcomer.
        _ = conn.closed(Some(IDLE_TIMEOUT)) => {}
        _ = clock.watch(conn.state(), IDLE_TIMEOUT) => {}
        _ = stop.changed() => {
            http.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), http).await;
        }
    }
}

/// An answer's body: a whole one, or a stream (downloads) whose error
/// aborts the connection.
type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;
type Resp = Response<Body>;

/// A response body that keeps its connection marked busy until it is
/// sent or dropped.
struct BusyBody {
    inner: Body,
    _busy: tarn_conn::Busy,
}

impl hyper::body::Body for BusyBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A whole body.
fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|e| match e {}).boxed_unsync()
}

/// An answer with the API's headers: JSON, never cached, not framed, no
/// referrer, and HSTS over TLS.
fn answer(state: &State, status: StatusCode, body: Value, extra: &[(&str, String)]) -> Resp {
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    let set = |h: &mut HeaderMap, k: &'static str, v: &str| {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.append(k, v);
        }
    };
    set(h, "content-type", "application/json");
    set(h, "cache-control", "no-store");
    set(h, "x-content-type-options", "nosniff");
    set(h, "x-frame-options", "DENY");
    set(h, "referrer-policy", "no-referrer");
    set(
        h,
        "content-security-policy",
        "default-src 'none'; frame-ancestors 'none'",
    );
    if state.secure() {
        set(h, "strict-transport-security", "max-age=31536000");
    }
    for (k, v) in extra {
        if let (Ok(k), Ok(v)) = (
            header::HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            h.append(k, v);
        }
    }
    r
}

/// The page's files, built into the binary (no internet at run time, no
/// third-party code: the page is tarn's own HTML, CSS and JavaScript).
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("../assets/index.html"),
    ),
    (
        "/app.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/app.js"),
    ),
    (
        "/app.css",
        "text/css; charset=utf-8",
        include_str!("../assets/app.css"),
    ),
];

/// One of [`ASSETS`], with a policy that lets the page load only itself.
fn asset(state: &State, path: &str) -> Option<Resp> {
    let (_, ctype, body) = ASSETS.iter().find(|(p, ..)| *p == path)?;
    let mut r = Response::new(full(Bytes::from_static(body.as_bytes())));
    let h = r.headers_mut();
    let mut set = |k: &'static str, v: &str| {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(k, v);
        }
    };
    set("content-type", ctype);
    set("cache-control", "no-cache");
    set("x-content-type-options", "nosniff");
    set("x-frame-options", "DENY");
    set("referrer-policy", "no-referrer");
    set(
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    );
    if state.secure() {
        set("strict-transport-security", "max-age=31536000");
    }
    Some(r)
}

fn error(state: &State, status: StatusCode, code: &str, message: &str) -> Resp {
    answer(
        state,
        status,
        json!({"error": {"code": code, "message": message}}),
        &[],
    )
}

/// The HTTP status of an API error.
fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::Exists | ErrorCode::Busy => StatusCode::CONFLICT,
        ErrorCode::Invalid => StatusCode::BAD_REQUEST,
        ErrorCode::Locked => StatusCode::LOCKED,
        ErrorCode::WrongKey | ErrorCode::Forbidden => StatusCode::FORBIDDEN,
        ErrorCode::Io | ErrorCode::Damaged | ErrorCode::Internal => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

/// Why a request is refused before any method runs.
struct Refusal {
    status: StatusCode,
    code: &'static str,
    message: &'static str,
}

impl Refusal {
    fn unauthorized() -> Refusal {
        Refusal {
            status: StatusCode::UNAUTHORIZED,
            code: "unauthorized",
            message: "log in (POST /api/login) or send Authorization: Bearer TOKEN",
        }
    }

    fn answer(&self, st: &State) -> Resp {
        error(st, self.status, self.code, self.message)
    }
}

/// Who made a request, as far as it proved it.
struct Caller {
    user: UserId,
    admin: bool,
    /// The session id, for a browser (CSRF applies); none for a token.
    session: Option<String>,
}

/// The value of cookie `name` in a request.
fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// The session id a browser sent, under the name cookies have when they
/// are `secure` or not (see [`COOKIE_SECURE`]).
fn cookie_session(headers: &HeaderMap, secure: bool) -> Option<String> {
    cookie_value(headers, if secure { COOKIE_SECURE } else { COOKIE })
}

impl State {
    /// The caller of a request, or the answer refusing it.
    fn caller(&self, headers: &HeaderMap) -> Result<Caller, Refusal> {
        let unauthorized = Refusal::unauthorized;
        let user_and_session = if let Some(t) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
        {
            (self.auth.token(t.trim()).ok_or_else(unauthorized)?, None)
        } else if let Some(id) = cookie_session(headers, self.secure()) {
            let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let live = sessions.get_mut(&id).filter(|s| {
                now.duration_since(s.last) < SESSION_IDLE
                    && now.duration_since(s.created) < SESSION_MAX
            });
            match live {
                Some(s) => {
                    s.last = now;
                    let (user, stamp) = (s.user.clone(), s.stamp);
                    drop(sessions);
                    // The password changed since the login (or the user
                    // was made again): the session is over.
                    if self.auth.stamp(&user) != Some(stamp) {
                        self.sessions
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&id);
                        return Err(unauthorized());
                    }
                    (user, Some(id))
                }
                None => {
                    sessions.remove(&id);
                    return Err(unauthorized());
                }
            }
        } else {
            return Err(unauthorized());
        };
        let (user, session) = user_and_session;
        let Some(admin) = self.auth.is_admin(&user) else {
            if let Some(id) = &session {
                self.sessions
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(id);
            }
            return Err(unauthorized());
        };
        Ok(Caller {
            user,
            admin,
            session,
        })
    }

    /// For a browser's request: the CSRF token must match its session's.
    fn check_csrf(&self, caller: &Caller, headers: &HeaderMap) -> Result<(), Refusal> {
        let Some(id) = &caller.session else {
            return Ok(());
        };
        let want = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .map(|s| s.csrf.clone());
        let given = headers.get("x-csrf-token").and_then(|v| v.to_str().ok());
        match (want, given) {
            (Some(w), Some(g)) if same(&w, g) => Ok(()),
            _ => Err(Refusal {
                status: StatusCode::FORBIDDEN,
                code: "csrf",
                message: "this request needs the session's X-CSRF-Token header",
            }),
        }
    }

    /// Cookies are `Secure` when the browser reaches us over TLS
    /// (directly, or through an https proxy origin).
    fn secure(&self) -> bool {
        self.tls
            || self
                .origin
                .as_deref()
                .is_some_and(|o| o.starts_with("https://"))
    }

    fn cookie(&self, id: &str, max_age: u64) -> String {
        if self.secure() {
            format!("{COOKIE_SECURE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}; Secure")
        } else {
            format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}")
        }
    }
}

/// The `Origin` of a request, when sent, must be this server: the
/// configured public origin, or the scheme and `Host` it was reached by.
fn same_origin(headers: &HeaderMap, tls: bool, public: Option<&str>) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    if let Some(p) = public {
        return origin == p;
    }
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let scheme = if tls { "https" } else { "http" };
    origin == format!("{scheme}://{host}")
}

/// The refusal of a request from another site's page (its `Origin`, when
/// sent, is not this server), for every request that changes something.
fn other_site(st: &State, headers: &HeaderMap) -> Option<Resp> {
    (!same_origin(headers, st.tls, st.origin.as_deref())).then(|| {
        error(
            st,
            StatusCode::FORBIDDEN,
            "origin",
            "requests from another site's pages are refused",
        )
    })
}

/// Plain HTTP serves loopback only: the `Host` must name loopback (or
/// the public origin's host, behind a proxy), so a page on another name
/// that resolves here (DNS rebinding) is refused.
fn host_allowed(headers: &HeaderMap, tls: bool, public: Option<&str>) -> bool {
    if tls {
        return true;
    }
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    let public_host = public
        .and_then(|p| p.split_once("://"))
        .map(|(_, rest)| rest.split('/').next().unwrap_or(""))
        .map(|a| a.rsplit_once(':').map_or(a, |(h, _)| h));
    name == "localhost"
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
        || public_host == Some(name)
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

tokio::task_local! {
    /// The activity record of the connection a request came on, for the
    /// readers of small bodies ([`body_json`]).
    static CONN: Arc<tarn_conn::ConnState>;
}

/// A small JSON body, within [`MAX_BODY`] and [`BODY_TIMEOUT`]. While it
/// arrives the connection counts as idle: a login (read before anyone
/// is known) that trickles its body must not make its connection one
/// that cannot be evicted for a newcomer.
async fn body_json(body: Incoming) -> Result<Value, &'static str> {
    let read = tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, MAX_BODY).collect());
    let read = match CONN.try_with(Arc::clone) {
        Ok(conn) => conn.idle_during(read).await,
        Err(_) => read.await,
    };
    let bytes = read
        .map_err(|_| "the body did not arrive in time")?
        .map_err(|_| "the body is too large or cut short")?
        .to_bytes();
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|_| "the body is not JSON")
}

/// Who calls, found off the async threads (it reads records and the
/// token store).
async fn caller_of(st: &Arc<State>, headers: &HeaderMap) -> Result<Caller, Refusal> {
    let (st2, h) = (st.clone(), headers.clone());
    tokio::task::spawn_blocking(move || st2.caller(&h))
        .await
        .unwrap_or_else(|_| Err(Refusal::unauthorized()))
}

async fn handle(req: Request<Incoming>, ip: IpAddr, st: Arc<State>) -> Resp {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let headers = parts.headers;
    if !host_allowed(&headers, st.tls, st.origin.as_deref()) {
        return error(
            &st,
            StatusCode::MISDIRECTED_REQUEST,
            "host",
            "plain HTTP answers for loopback names only",
        );
    }
    if parts.method == Method::GET && path == "/api/session" {
        return match caller_of(&st, &headers).await {
            Ok(c) => {
                let csrf = c.session.as_ref().and_then(|id| {
                    st.sessions
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(id)
                        .map(|s| s.csrf.clone())
                });
                answer(
                    &st,
                    StatusCode::OK,
                    json!({"user": c.user.name, "pool": c.user.pool, "admin": c.admin, "csrf": csrf}),
                    &[],
                )
            }
            Err(r) => r.answer(&st),
        };
    }
    if let Some(rest) = path.strip_prefix("/s/") {
        let rest = rest.to_string();
        return routes::link(
            &st,
            ip,
            parts.method,
            &rest,
            parts.uri.query(),
            &headers,
            body,
        )
        .await;
    }
    if let Some(rest) = path.strip_prefix("/api/") {
        if rest == "files"
            || rest.starts_with("files/")
            || rest == "files-op"
            || rest == "upload"
            || rest.starts_with("upload/")
        {
            let rest = rest.to_string();
            return routes::files(&st, parts.method, &rest, parts.uri.query(), &headers, body)
                .await;
        }
    }
    if parts.method == Method::GET || parts.method == Method::HEAD {
        if let Some(r) = asset(&st, &path) {
            return r;
        }
    }
    if parts.method != Method::POST {
        return match path.strip_prefix("/api/") {
            Some(_) => error(&st, StatusCode::METHOD_NOT_ALLOWED, "method", "use POST"),
            None => error(&st, StatusCode::NOT_FOUND, "not_found", "no such page"),
        };
    }
    if let Some(r) = other_site(&st, &headers) {
        return r;
    }
    if !is_json(&headers) {
        return error(
            &st,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content_type",
            "send the body as application/json",
        );
    }
    if path == "/api/login" {
        return match body_json(body).await {
            Ok(v) => login(&st, ip, v).await,
            Err(why) => error(&st, StatusCode::BAD_REQUEST, "body", why),
        };
    }
    let method = match path.strip_prefix("/api/call/") {
        Some(m) => Some(m.to_string()),
        None if path == "/api/logout" => None,
        None => return error(&st, StatusCode::NOT_FOUND, "not_found", "no such endpoint"),
    };
    // Who calls is settled before the body is read: nobody may hold a
    // connection open with a slow body without logging in first.
    let c = match caller_of(&st, &headers).await {
        Ok(c) => c,
        Err(r) => return r.answer(&st),
    };
    if let Err(r) = st.check_csrf(&c, &headers) {
        return r.answer(&st);
    }
    let body = match body_json(body).await {
        Ok(v) => v,
        Err(why) => return error(&st, StatusCode::BAD_REQUEST, "body", why),
    };
    match method {
        Some(m) => call(&st, c, m, body).await,
        None => {
            if let Some(id) = &c.session {
                st.sessions
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(id);
            }
            answer(
                &st,
                StatusCode::OK,
                json!({}),
                &[("set-cookie", st.cookie("", 0))],
            )
        }
    }
}

async fn login(st: &Arc<State>, ip: IpAddr, body: Value) -> Resp {
    let too_many = |wait: Duration| {
        answer(
            st,
            StatusCode::TOO_MANY_REQUESTS,
            json!({"error": {"code": "too_many_logins",
                "message": "too many failed logins from this address; wait"}}),
            &[("retry-after", (wait.as_secs() + 1).to_string())],
        )
    };
    if let Some(wait) = st.failures.blocked(ip) {
        return too_many(wait);
    }
    let user = body.get("user").and_then(Value::as_str).unwrap_or("");
    let password = body.get("password").and_then(Value::as_str).unwrap_or("");
    let (user, password) = (user.to_string(), password.to_string());
    let auth = st.auth.clone();
    // Password hashing is slow on purpose: off the async threads, a few
    // at a time. The slot is taken first and goes with the hash, not
    // with this request: a client that goes away while its hash runs
    // does not free a slot for another. The attempt counts once the
    // slot is there, just before the hash (one abandoned while waiting
    // is not counted, and fills nothing).
    let Ok(permit) = st.logins.clone().acquire_owned().await else {
        return error(
            st,
            StatusCode::SERVICE_UNAVAILABLE,
            "stopping",
            "the server is stopping",
        );
    };
    let attempt = match st.failures.attempt(ip) {
        Ok(at) => at,
        Err(wait) => return too_many(wait),
    };
    let who = tokio::task::spawn_blocking(move || {
        let _slot = permit;
        let (id, stamp) = auth.login(&user, &password)?;
        let admin = auth.is_admin(&id).unwrap_or(false);
        Some((id, admin, stamp))
    })
    .await
    .ok()
    .flatten();
    let Some((user, admin, stamp)) = who else {
        return error(
            st,
            StatusCode::UNAUTHORIZED,
            "login",
            "wrong user or password",
        );
    };
    st.failures.succeeded(attempt);
    let (Some(id), Some(csrf)) = (random_hex(32), random_hex(32)) else {
        return error(
            st,
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "no randomness",
        );
    };
    {
        let mut sessions = st.sessions.lock().unwrap_or_else(|e| e.into_inner());
        // This user's oldest beyond their share, then anyone's oldest.
        let theirs: Vec<(String, Instant)> = sessions
            .iter()
            .filter(|(_, s)| s.user == user)
            .map(|(k, s)| (k.clone(), s.last))
            .collect();
        if theirs.len() >= SESSIONS_PER_USER {
            if let Some((k, _)) = theirs.iter().min_by_key(|(_, t)| *t) {
                sessions.remove(k);
            }
        }
        if sessions.len() >= MAX_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                sessions.remove(&k);
            }
        }
        let now = Instant::now();
        sessions.insert(
            id.clone(),
            Session {
                user: user.clone(),
                csrf: csrf.clone(),
                created: now,
                last: now,
                stamp,
            },
        );
    }
    log::info!(
        "tarn-web: {} (pool {}) logged in from {ip}",
        user.name,
        user.pool
    );
    answer(
        st,
        StatusCode::OK,
        json!({"user": user.name, "pool": user.pool, "admin": admin, "csrf": csrf}),
        &[("set-cookie", st.cookie(&id, SESSION_MAX.as_secs()))],
    )
}

async fn call(st: &Arc<State>, caller: Caller, method: String, params: Value) -> Resp {
    let role = tarn_api::roles::role(&method);
    let refused = match role {
        Role::Local => Some("this method is served on the admin socket only"),
        Role::Admin if !caller.admin => Some("this method is for administrators"),
        _ => tarn_api::roles::https_refusal(&method, &params),
    };
    if let Some(why) = refused {
        return error(st, StatusCode::FORBIDDEN, "forbidden", why);
    }
    let Some(backend) = st.backend.upgrade() else {
        return error(
            st,
            StatusCode::SERVICE_UNAVAILABLE,
            "stopping",
            "the daemon is stopping",
        );
    };
    let current = caller.session.clone();
    // A password change: whose (a user's own pool is forced in as_user).
    let target = (method == tarn_api::method::USER_PASSWD).then(|| {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let pool = if caller.admin {
            params
                .get("pool")
                .and_then(Value::as_str)
                .map(str::to_string)
        } else {
            Some(caller.user.pool.clone())
        };
        (name, pool)
    });
    let mut params = params;
    if caller.admin && method == tarn_api::method::LINK_CREATE {
        // An administrator's link acts as them unless they name another
        // user of theirs.
        if let Some(o) = params.as_object_mut() {
            o.entry("owner").or_insert_with(|| {
                Value::String(format!("{}/{}", caller.user.pool, caller.user.name))
            });
        }
    }
    let auth = st.auth.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        let r = if caller.admin {
            tarn_api::dispatch::call(&*backend, &method, params)
        } else {
            as_user(&*backend, &caller.user, &method, params)
        };
        // After a password change, the stamp the changing session goes
        // on with (its own password may be the one changed).
        let stamp = auth.stamp(&caller.user);
        (r, stamp)
    })
    .await;
    match outcome {
        Ok((Ok(v), stamp)) => {
            if let Some((name, pool)) = target {
                // A new password ends that user's other sessions (not the
                // one that changed it): whoever knew the old one is out.
                let mut sessions = st.sessions.lock().unwrap_or_else(|e| e.into_inner());
                sessions.retain(|k, s| {
                    let theirs =
                        s.user.name == name && pool.as_ref().is_none_or(|p| *p == s.user.pool);
                    !theirs || Some(k) == current.as_ref()
                });
                if let (Some(s), Some(stamp)) =
                    (current.as_ref().and_then(|k| sessions.get_mut(k)), stamp)
                {
                    s.stamp = stamp;
                }
            }
            answer(st, StatusCode::OK, json!({ "result": v }), &[])
        }
        Ok((Err(e), _)) => error(st, status_of(e.code), e.code.as_str(), &e.message),
        Err(_) => error(
            st,
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the call failed",
        ),
    }
}

/// A method of the user role, for a user who is not an administrator:
/// answers only what is theirs, and of it only what a user needs.
fn as_user(
    backend: &dyn Backend,
    user: &UserId,
    method: &str,
    params: Value,
) -> Result<Value, ApiError> {
    use tarn_api::method as m;
    let me = format!("{}/{}", user.pool, user.name);
    let shares = || -> Result<Vec<tarn_api::access::ShareInfo>, ApiError> {
        Ok(backend
            .share_list()?
            .into_iter()
            .filter(|s| {
                s.pool == user.pool && tarn_api::roles::share_is_users(&s.share, &user.name)
            })
            .collect())
    };
    match method {
        m::DAEMON_PING => tarn_api::dispatch::call(backend, method, params),
        m::SHARE_LIST => {
            let _: tarn_api::params::NoParams =
                serde_json::from_value(if params.is_null() { json!({}) } else { params })
                    .map_err(|e| ApiError::invalid(format!("bad params for {method}: {e}")))?;
            // Of each share: its name, dataset and this user's access;
            // not other users, client networks or block settings.
            let mine: Vec<Value> = shares()?
                .into_iter()
                .map(|s| {
                    let webdav = s
                        .share
                        .webdav
                        .as_ref()
                        .and_then(|w| w.users.get(&user.name).copied());
                    let smb = s
                        .share
                        .smb
                        .as_ref()
                        .and_then(|w| w.users.get(&user.name).copied());
                    json!({
                        "pool": s.pool,
                        "share": {"name": s.share.name, "dataset": s.share.dataset},
                        "webdav": webdav,
                        "smb": smb,
                    })
                })
                .collect();
            Ok(Value::Array(mine))
        }
        m::DATASET_LIST => {
            let mine: Vec<String> = shares()?.into_iter().map(|s| s.share.dataset).collect();
            let all = tarn_api::dispatch::call(backend, method, params)?;
            let kept: Vec<Value> = all
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| {
                    d.get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|n| tarn_api::roles::visible_to(n, &mine))
                })
                .map(|d| {
                    // Where it is mounted and what it was cloned from
                    // are the server's business.
                    let mut d = d.clone();
                    if let Some(o) = d.as_object_mut() {
                        o.remove("mountpoint");
                        o.remove("origin");
                    }
                    d
                })
                .collect();
            Ok(Value::Array(kept))
        }
        m::USER_PASSWD => {
            if params.get("name").and_then(Value::as_str) != Some(user.name.as_str()) {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    "a user may change their own password only",
                ));
            }
            // Their own record: the pool is theirs, whatever was asked.
            let mut params = params;
            if let Some(o) = params.as_object_mut() {
                o.insert("pool".into(), Value::String(user.pool.clone()));
            }
            tarn_api::dispatch::call(backend, method, params)
        }
        m::LINK_CREATE => {
            // Always as themselves: the daemon checks that the share is
            // theirs (and writable, for an upload link).
            let mut params = params;
            if let Some(o) = params.as_object_mut() {
                o.insert("owner".into(), Value::String(me));
            }
            tarn_api::dispatch::call(backend, method, params)
        }
        m::LINK_LIST => {
            let all = tarn_api::dispatch::call(backend, method, params)?;
            let mine: Vec<Value> = all
                .as_array()
                .into_iter()
                .flatten()
                .filter(|l| l.get("owner").and_then(Value::as_str) == Some(me.as_str()))
                .cloned()
                .collect();
            Ok(Value::Array(mine))
        }
        m::LINK_REVOKE => {
            let id = params.get("name").and_then(Value::as_str).unwrap_or("");
            let theirs = backend
                .link_list()?
                .iter()
                .any(|l| l.id == id && l.owner == me);
            if !theirs {
                return Err(ApiError::new(ErrorCode::NotFound, "no such link of yours"));
            }
            tarn_api::dispatch::call(backend, method, params)
        }
        _ => Err(ApiError::new(
            ErrorCode::Forbidden,
            "this method is for administrators",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_hosts_and_content_types() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("nas:8444"));
        assert!(
            same_origin(&h, true, None),
            "no Origin: a script, not a page"
        );
        h.insert(header::ORIGIN, HeaderValue::from_static("https://nas:8444"));
        assert!(same_origin(&h, true, None));
        assert!(!same_origin(&h, false, None), "scheme counts");
        let public = Some("https://nas.example.org");
        assert!(
            !same_origin(&h, false, public),
            "behind a proxy: its origin only"
        );
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://nas.example.org"),
        );
        assert!(same_origin(&h, false, public));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(!same_origin(&h, true, None));
        // Plain HTTP: loopback names (or the proxy's public host) only.
        let host = |v: &'static str| {
            let mut m = HeaderMap::new();
            m.insert(header::HOST, HeaderValue::from_static(v));
            m
        };
        assert!(host_allowed(&host("127.0.0.1:8444"), false, None));
        assert!(host_allowed(&host("localhost:8444"), false, None));
        assert!(host_allowed(&host("[::1]:8444"), false, None));
        assert!(
            !host_allowed(&host("evil.example:8444"), false, None),
            "DNS rebinding"
        );
        assert!(host_allowed(&host("nas.example.org"), false, public));
        assert!(
            host_allowed(&host("evil.example"), true, None),
            "TLS: not checked here"
        );
        let mut c = HeaderMap::new();
        assert!(!is_json(&c));
        c.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        assert!(is_json(&c));
        c.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert!(!is_json(&c), "what a cross-site form can send");
    }

    #[test]
    fn cookies_and_tokens() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; tarn_session=abc; b=2"),
        );
        assert_eq!(cookie_session(&h, false).as_deref(), Some("abc"));
        // Over TLS only the __Host- cookie counts: a tossed plain one, sent
        // first by the browser, is not read.
        assert_eq!(cookie_session(&h, true), None);
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("tarn_session=evil; __Host-tarn_session=good"),
        );
        assert_eq!(cookie_session(&h, true).as_deref(), Some("good"));
        assert_eq!(cookie_session(&h, false).as_deref(), Some("evil"));
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "abcd"));
        assert_eq!(random_hex(32).map(|s| s.len()), Some(64));
        assert_eq!(status_of(ErrorCode::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(status_of(ErrorCode::Forbidden), StatusCode::FORBIDDEN);
    }
}
