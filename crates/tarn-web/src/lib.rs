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
//!   get a session cookie (`HttpOnly`, `SameSite=Strict`, `Secure` over
//!   TLS) and a CSRF token. Every later `POST` with the cookie must carry
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
//! never answers. Failed logins are counted per client address: after
//! [`LOGIN_FAILURES`] in [`LOGIN_WINDOW`] that address gets 429 until
//! the window passes. Bodies are bounded ([`MAX_BODY`]), request heads
//! must arrive within [`HEADER_TIMEOUT`], connections are capped.
//!
//! # Transport
//!
//! HTTP/1.1 with hyper on a small tokio runtime owned by one thread, so
//! the daemon starts and stops it like its other servers; TLS with
//! rustls (the node's certificate, as WebDAV's). Plain HTTP is the
//! caller's decision, which the daemon allows on loopback only. A call
//! runs on the runtime's blocking pool: the backend's methods block.

#![warn(missing_docs)]

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
/// The session cookie's name.
pub const COOKIE: &str = "tarn_session";

/// How the web front end checks users; the daemon answers from the
/// pools' user records and its token store.
pub trait WebAuth: Send + Sync + 'static {
    /// The user these credentials log in (None: wrong).
    fn login(&self, user: &str, password: &str) -> Option<String>;
    /// The user a bearer token acts as (None: not a token of ours).
    fn token(&self, token: &str) -> Option<String>;
    /// Whether `user` is an administrator now (None: no such user any
    /// more).
    fn is_admin(&self, user: &str) -> Option<bool>;
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
    user: String,
    csrf: String,
    created: Instant,
    last: Instant,
}

struct State {
    backend: Weak<dyn Backend + Send + Sync>,
    auth: Arc<dyn WebAuth>,
    tls: bool,
    sessions: Mutex<HashMap<String, Session>>,
    failures: Mutex<HashMap<IpAddr, Vec<Instant>>>,
}

/// The running server.
pub struct Running {
    addr: SocketAddr,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
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
pub fn serve(
    addr: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    backend: Weak<dyn Backend + Send + Sync>,
    auth: Arc<dyn WebAuth>,
) -> Result<Running, WebError> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let state = Arc::new(State {
        backend,
        auth,
        tls: tls.is_some(),
        sessions: Mutex::new(HashMap::new()),
        failures: Mutex::new(HashMap::new()),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .thread_name("tarn-web")
        .enable_all()
        .build()?;
    let thread = std::thread::Builder::new()
        .name("tarn-web".into())
        .spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) else {
                    return;
                };
                accept_loop(listener, state, tls, stop_rx).await;
            });
            rt.shutdown_timeout(Duration::from_secs(5));
        })?;
    Ok(Running {
        addr,
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
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
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
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue; // full: the connection is closed
        };
        let _ = sock.set_nodelay(true);
        let (st, acc, mut sd) = (state.clone(), acceptor.clone(), stop.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match acc {
                Some(acc) => {
                    let Ok(Ok(s)) = tokio::time::timeout(HEADER_TIMEOUT, acc.accept(sock)).await
                    else {
                        return;
                    };
                    serve_conn(s, peer, st, &mut sd).await;
                }
                None => serve_conn(sock, peer, st, &mut sd).await,
            }
        });
    }
}

async fn serve_conn<I>(
    io: I,
    peer: SocketAddr,
    state: Arc<State>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req: Request<Incoming>| {
        let st = state.clone();
        async move { Ok::<_, Infallible>(handle(req, peer.ip(), st).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
        }
    }
}

type Resp = Response<Full<Bytes>>;

/// An answer with the API's headers: JSON, never cached, not framed, no
/// referrer, and HSTS over TLS.
fn answer(state: &State, status: StatusCode, body: Value, extra: &[(&str, String)]) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
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
    if state.tls {
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
    user: String,
    admin: bool,
    /// The session id, for a browser (CSRF applies); none for a token.
    session: Option<String>,
}

fn cookie_session(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
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
        } else if let Some(id) = cookie_session(headers) {
            let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let live = sessions.get_mut(&id).filter(|s| {
                now.duration_since(s.last) < SESSION_IDLE
                    && now.duration_since(s.created) < SESSION_MAX
            });
            match live {
                Some(s) => {
                    s.last = now;
                    (s.user.clone(), Some(id))
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

    fn blocked(&self, ip: IpAddr) -> Option<Duration> {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let q = f.entry(ip).or_default();
        q.retain(|t| now.duration_since(*t) < LOGIN_WINDOW);
        (q.len() >= LOGIN_FAILURES).then(|| {
            q.first().map_or(LOGIN_WINDOW, |t| {
                LOGIN_WINDOW.saturating_sub(now.duration_since(*t))
            })
        })
    }

    fn failed(&self, ip: IpAddr) {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if f.len() > 65_536 {
            f.clear(); // bounded memory; the window refills
        }
        f.entry(ip).or_default().push(Instant::now());
    }

    fn cookie(&self, id: &str, max_age: u64) -> String {
        format!(
            "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{}",
            if self.tls { "; Secure" } else { "" }
        )
    }
}

/// The `Origin` of a request, when sent, must be this server.
fn same_origin(headers: &HeaderMap, tls: bool) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let scheme = if tls { "https" } else { "http" };
    origin == format!("{scheme}://{host}")
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

async fn body_json(body: Incoming) -> Result<Value, &'static str> {
    let bytes = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|_| "the body is too large or cut short")?
        .to_bytes();
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|_| "the body is not JSON")
}

async fn handle(req: Request<Incoming>, ip: IpAddr, st: Arc<State>) -> Resp {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let headers = parts.headers;
    if parts.method == Method::GET && path == "/api/session" {
        return match st.caller(&headers) {
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
                    json!({"user": c.user, "admin": c.admin, "csrf": csrf}),
                    &[],
                )
            }
            Err(r) => r.answer(&st),
        };
    }
    if parts.method != Method::POST {
        return match path.strip_prefix("/api/") {
            Some(_) => error(&st, StatusCode::METHOD_NOT_ALLOWED, "method", "use POST"),
            None => error(&st, StatusCode::NOT_FOUND, "not_found", "no such page"),
        };
    }
    if !same_origin(&headers, st.tls) {
        return error(
            &st,
            StatusCode::FORBIDDEN,
            "origin",
            "requests from another site's pages are refused",
        );
    }
    if !is_json(&headers) {
        return error(
            &st,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content_type",
            "send the body as application/json",
        );
    }
    let body = match body_json(body).await {
        Ok(v) => v,
        Err(why) => return error(&st, StatusCode::BAD_REQUEST, "body", why),
    };
    match path.as_str() {
        "/api/login" => login(&st, ip, body).await,
        "/api/logout" => {
            let c = match st.caller(&headers) {
                Ok(c) => c,
                Err(r) => return r.answer(&st),
            };
            if let Err(r) = st.check_csrf(&c, &headers) {
                return r.answer(&st);
            }
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
        p => match p.strip_prefix("/api/call/") {
            Some(method) => call(&st, &headers, method.to_string(), body).await,
            None => error(&st, StatusCode::NOT_FOUND, "not_found", "no such endpoint"),
        },
    }
}

async fn login(st: &Arc<State>, ip: IpAddr, body: Value) -> Resp {
    if let Some(wait) = st.blocked(ip) {
        return answer(
            st,
            StatusCode::TOO_MANY_REQUESTS,
            json!({"error": {"code": "too_many_logins",
                "message": "too many failed logins from this address; wait"}}),
            &[("retry-after", (wait.as_secs() + 1).to_string())],
        );
    }
    let user = body.get("user").and_then(Value::as_str).unwrap_or("");
    let password = body.get("password").and_then(Value::as_str).unwrap_or("");
    let (user, password) = (user.to_string(), password.to_string());
    let auth = st.auth.clone();
    // Password hashing is slow on purpose: off the async threads.
    let who = tokio::task::spawn_blocking(move || auth.login(&user, &password))
        .await
        .ok()
        .flatten();
    let Some(user) = who else {
        st.failed(ip);
        return error(
            st,
            StatusCode::UNAUTHORIZED,
            "login",
            "wrong user or password",
        );
    };
    let (Some(id), Some(csrf)) = (random_hex(32), random_hex(32)) else {
        return error(
            st,
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "no randomness",
        );
    };
    let admin = st.auth.is_admin(&user).unwrap_or(false);
    {
        let mut sessions = st.sessions.lock().unwrap_or_else(|e| e.into_inner());
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
            },
        );
    }
    log::info!("tarn-web: {user} logged in from {ip}");
    answer(
        st,
        StatusCode::OK,
        json!({"user": user, "admin": admin, "csrf": csrf}),
        &[("set-cookie", st.cookie(&id, SESSION_MAX.as_secs()))],
    )
}

async fn call(st: &Arc<State>, headers: &HeaderMap, method: String, params: Value) -> Resp {
    let caller = match st.caller(headers) {
        Ok(c) => c,
        Err(r) => return r.answer(st),
    };
    if let Err(r) = st.check_csrf(&caller, headers) {
        return r.answer(st);
    }
    let role = tarn_api::roles::role(&method);
    let refused = match role {
        Role::Local => Some("this method is served on the admin socket only"),
        Role::Admin if !caller.admin => Some("this method is for administrators"),
        _ => None,
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
    let outcome = tokio::task::spawn_blocking(move || {
        if caller.admin {
            tarn_api::dispatch::call(&*backend, &method, params)
        } else {
            as_user(&*backend, &caller.user, &method, params)
        }
    })
    .await;
    match outcome {
        Ok(Ok(v)) => answer(st, StatusCode::OK, json!({ "result": v }), &[]),
        Ok(Err(e)) => error(st, status_of(e.code), e.code.as_str(), &e.message),
        Err(_) => error(
            st,
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the call failed",
        ),
    }
}

/// A method of the user role, for a user who is not an administrator:
/// answers only what is theirs.
fn as_user(
    backend: &dyn Backend,
    user: &str,
    method: &str,
    params: Value,
) -> Result<Value, ApiError> {
    use tarn_api::method as m;
    let shares = || -> Result<Vec<tarn_api::access::ShareInfo>, ApiError> {
        Ok(backend
            .share_list()?
            .into_iter()
            .filter(|s| tarn_api::roles::share_is_users(&s.share, user))
            .collect())
    };
    match method {
        m::DAEMON_PING => tarn_api::dispatch::call(backend, method, params),
        m::SHARE_LIST => {
            let _: tarn_api::params::NoParams =
                serde_json::from_value(if params.is_null() { json!({}) } else { params })
                    .map_err(|e| ApiError::invalid(format!("bad params for {method}: {e}")))?;
            serde_json::to_value(shares()?).map_err(|e| ApiError::internal(e.to_string()))
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
                .cloned()
                .collect();
            Ok(Value::Array(kept))
        }
        m::USER_PASSWD => {
            if params.get("name").and_then(Value::as_str) != Some(user) {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    "a user may change their own password only",
                ));
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
    fn origins_and_content_types() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("nas:8444"));
        assert!(same_origin(&h, true), "no Origin: a script, not a page");
        h.insert(header::ORIGIN, HeaderValue::from_static("https://nas:8444"));
        assert!(same_origin(&h, true));
        assert!(!same_origin(&h, false), "scheme counts");
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(!same_origin(&h, true));
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
        assert_eq!(cookie_session(&h).as_deref(), Some("abc"));
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "abcd"));
        assert_eq!(random_hex(32).map(|s| s.len()), Some(64));
        assert_eq!(status_of(ErrorCode::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(status_of(ErrorCode::Forbidden), StatusCode::FORBIDDEN);
    }
}
