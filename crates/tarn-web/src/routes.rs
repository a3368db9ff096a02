//! Where the file pages' requests go: `/api/files…` and `/api/upload…`
//! for logged-in users, `/s/TOKEN…` for visitors through a share link.
//!
//! # Share links
//!
//! A link is a secret token (256 random bits; the daemon keeps only its
//! hash) naming a folder of a share, made by a user who may use that
//! share and acting with that user's filesystem identity. Each request
//! asks the daemon again what the token opens ([`WebFiles::link`]): a
//! revoked or expired link, or one whose owner lost the share, opens
//! nothing from that moment. A read link lists and downloads below its
//! folder; an upload-only link adds files there (never replacing one: a
//! clash gets a numbered name) and shows nothing. A link with a password
//! needs an unlock first (`POST /s/TOKEN/unlock`), counted against the
//! client's address like logins; it gives a cookie scoped to the link's
//! path. Paths below the folder are confined as `files.rs` explains, so
//! nothing outside the linked folder can be reached.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, Method, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use crate::files::{self, FErr, Scope, Who};
use crate::{answer, body_json, caller_of, error, random_hex, Resp, State};

/// An unlocked password link stays open in a browser this long.
pub const LINK_SESSION: Duration = Duration::from_secs(12 * 3600);
/// Unlocked link sessions kept at once.
const MAX_LINK_SESSIONS: usize = 4096;
/// The cookie of an unlocked link (scoped to the link's path).
const LINK_COOKIE: &str = "tarn_link";

fn no_files(st: &State) -> Resp {
    error(
        st,
        StatusCode::NOT_FOUND,
        "not_found",
        "the file pages are not served here",
    )
}

/// Refuses a changing request from another site's page, or without the
/// session's CSRF token.
fn guard(st: &State, c: &crate::Caller, method: &Method, headers: &HeaderMap) -> Option<Resp> {
    if !files::is_write(method) {
        return None;
    }
    if let Some(r) = crate::other_site(st, headers) {
        return Some(r);
    }
    st.check_csrf(c, headers).err().map(|r| r.answer(st))
}

/// The scope of a logged-in user on share `name`.
async fn user_scope(st: &Arc<State>, user: &crate::UserId, name: &str) -> Result<Scope, FErr> {
    let Some(f) = st.files.clone() else {
        return Err(FErr::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no file pages",
        ));
    };
    let (u, n) = (user.clone(), name.to_string());
    let share = files::blocking(move || {
        f.shares(&u)
            .into_iter()
            .find(|s| s.name == n)
            .ok_or_else(|| FErr::new(StatusCode::NOT_FOUND, "not_found", "no such share of yours"))
    })
    .await?;
    Ok(Scope {
        share,
        base: Vec::new(),
        read: true,
        modify: true,
        add: false,
        who: Who::User(user.clone()),
    })
}

fn share_of(body: &Value) -> String {
    body.get("share")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// `/api/files…` and `/api/upload…` (`rest` is the path after `/api/`).
pub(crate) async fn files(
    st: &Arc<State>,
    method: Method,
    rest: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Incoming,
) -> Resp {
    if st.files.is_none() {
        return no_files(st);
    }
    let c = match caller_of(st, headers).await {
        Ok(c) => c,
        Err(r) => return r.answer(st),
    };
    if let Some(r) = guard(st, &c, &method, headers) {
        return r;
    }
    let ok = |v: Value| answer(st, StatusCode::OK, v, &[]);
    let who = Who::User(c.user.clone());
    let r: Result<Resp, FErr> = async {
        match (&method, rest) {
            (&Method::GET, "files" | "files/") => {
                let (f, u) = (st.files.clone(), c.user.clone());
                let list = files::blocking(move || Ok(f.map(|f| f.shares(&u)).unwrap_or_default()))
                    .await?;
                let v: Vec<Value> = list
                    .iter()
                    .map(|s| json!({"name": s.name, "writable": s.writable}))
                    .collect();
                Ok(ok(Value::Array(v)))
            }
            (&Method::GET | &Method::HEAD, p) if p.starts_with("files/") => {
                let comps = files::url_components(&p["files/".len()..])?;
                let Some((share, comps)) = comps.split_first() else {
                    return Err(FErr::new(StatusCode::NOT_FOUND, "not_found", "no share"));
                };
                let scope = user_scope(st, &c.user, &String::from_utf8_lossy(share)).await?;
                Ok(files::serve_path(st, scope, comps.to_vec(), query, headers).await)
            }
            (&Method::POST, "files-op") => {
                let body = json_body(headers, body).await?;
                let share = share_of(&body);
                let scope = user_scope(st, &c.user, &share).await?;
                let (f, user) = (st.files.clone(), c.user.clone());
                let v = files::blocking(move || {
                    let safety = || -> Result<String, FErr> {
                        let f = f.as_ref().ok_or_else(|| {
                            FErr::new(StatusCode::NOT_FOUND, "not_found", "no file pages")
                        })?;
                        f.snapshot_before_restore(&user, &share).map_err(|why| {
                            FErr::new(
                                StatusCode::INTERNAL_SERVER_ERROR,
                                "io",
                                format!("no snapshot of what the restore would replace: {why}"),
                            )
                        })
                    };
                    files::operation(&scope, &body, &safety)
                })
                .await?;
                Ok(ok(v))
            }
            (&Method::POST, "upload") => {
                let body = json_body(headers, body).await?;
                let scope = user_scope(st, &c.user, &share_of(&body)).await?;
                let st2 = st.clone();
                let v = files::blocking(move || files::upload_start(&st2, &scope, &body)).await?;
                Ok(ok(v))
            }
            (m, p) if p.starts_with("upload/") => {
                let id = &p["upload/".len()..];
                upload_session(st, m, id, who.clone(), headers, body, || async {
                    let share = session_share(st, id)?;
                    user_scope(st, &c.user, &share).await
                })
                .await
                .map(ok)
            }
            _ => Err(FErr::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such endpoint",
            )),
        }
    }
    .await;
    r.unwrap_or_else(|e| e.answer(st))
}

/// The share an upload session was started on.
fn session_share(st: &State, id: &str) -> Result<String, FErr> {
    st.uploads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(id)
        .map(|u| u.share_name().to_string())
        .ok_or_else(|| FErr::new(StatusCode::NOT_FOUND, "no_upload", "no such upload"))
}

/// GET (where it stands), PUT (a chunk) or DELETE (cancel) on an upload.
async fn upload_session<F, Fut>(
    st: &Arc<State>,
    method: &Method,
    id: &str,
    who: Who,
    headers: &HeaderMap,
    body: Incoming,
    scope: F,
) -> Result<Value, FErr>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Scope, FErr>>,
{
    match *method {
        Method::GET => files::upload_status(st, &who, id),
        Method::DELETE => {
            let (st2, id) = (st.clone(), id.to_string());
            files::blocking(move || files::upload_cancel(&st2, &who, &id)).await
        }
        Method::PUT => {
            let scope = scope().await?;
            if scope.who != who {
                return Err(FErr::new(
                    StatusCode::NOT_FOUND,
                    "no_upload",
                    "no such upload",
                ));
            }
            files::upload_put(st, scope, id, headers, body).await
        }
        _ => Err(FErr::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method",
            "GET, PUT or DELETE",
        )),
    }
}

async fn json_body(headers: &HeaderMap, body: Incoming) -> Result<Value, FErr> {
    if !crate::is_json(headers) {
        return Err(FErr::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content_type",
            "send the body as application/json",
        ));
    }
    body_json(body)
        .await
        .map_err(|why| FErr::new(StatusCode::BAD_REQUEST, "body", why))
}

/// Whether this browser unlocked link `id`.
fn unlocked(st: &State, headers: &HeaderMap, id: &str) -> bool {
    let Some(c) = crate::cookie_value(headers, LINK_COOKIE) else {
        return false;
    };
    let s = st.link_sessions.lock().unwrap_or_else(|e| e.into_inner());
    s.get(&c)
        .is_some_and(|(link, at)| link == id && at.elapsed() < LINK_SESSION)
}

/// `/s/TOKEN…` (`rest` is after `/s/`).
pub(crate) async fn link(
    st: &Arc<State>,
    ip: IpAddr,
    method: Method,
    rest: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Incoming,
) -> Resp {
    let (token, sub) = rest.split_once('/').unwrap_or((rest, ""));
    if token.len() != 64 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return error(st, StatusCode::NOT_FOUND, "no_link", "no such link");
    }
    if (method == Method::GET || method == Method::HEAD) && sub.is_empty() {
        // The page itself: it finds its link in the address.
        return crate::asset(st, "/").unwrap_or_else(|| no_files(st));
    }
    let Some(f) = st.files.clone() else {
        return no_files(st);
    };
    if files::is_write(&method) {
        if let Some(r) = crate::other_site(st, headers) {
            return r;
        }
    }
    let t = token.to_string();
    let grant = match files::blocking(move || Ok(f.link(&t))).await {
        Ok(Some(g)) => g,
        _ => {
            return error(
                st,
                StatusCode::NOT_FOUND,
                "no_link",
                "this link does not exist, was revoked or has expired",
            )
        }
    };
    let open = !grant.password || unlocked(st, headers, &grant.id);
    let ok = |v: Value| answer(st, StatusCode::OK, v, &[]);
    let r: Result<Resp, FErr> = async {
        match (&method, sub) {
            (&Method::GET, "info") => {
                let name = grant
                    .path
                    .rsplit('/')
                    .find(|s| !s.is_empty())
                    .unwrap_or(&grant.share.name)
                    .to_string();
                Ok(ok(json!({"name": name, "upload": grant.upload,
                    "password": grant.password, "open": open})))
            }
            (&Method::POST, "unlock") => unlock(st, ip, token, &grant.id, headers, body).await,
            _ if !open => Err(FErr::new(
                StatusCode::UNAUTHORIZED,
                "link_password",
                "this link needs its password (POST /s/TOKEN/unlock)",
            )),
            (m, p) => {
                let scope = Scope {
                    base: files::json_components(&grant.path)?,
                    read: !grant.upload,
                    modify: false,
                    add: grant.upload,
                    who: Who::Link {
                        id: grant.id.clone(),
                        owner: grant.owner.clone(),
                    },
                    share: grant.share.clone(),
                };
                if (*m == Method::GET || *m == Method::HEAD) && (p == "f" || p.starts_with("f/")) {
                    let comps = files::url_components(p.strip_prefix('f').unwrap_or(""))?;
                    return Ok(files::serve_path(st, scope, comps, query, headers).await);
                }
                if *m == Method::POST && p == "upload" {
                    let body = json_body(headers, body).await?;
                    let st2 = st.clone();
                    let v =
                        files::blocking(move || files::upload_start(&st2, &scope, &body)).await?;
                    return Ok(ok(v));
                }
                if let Some(id) = p.strip_prefix("upload/") {
                    let who = scope.who.clone();
                    return upload_session(st, m, id, who, headers, body, || async { Ok(scope) })
                        .await
                        .map(ok);
                }
                Err(FErr::new(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "no such endpoint",
                ))
            }
        }
    }
    .await;
    r.unwrap_or_else(|e| e.answer(st))
}

/// `POST /s/TOKEN/unlock {password}`: counted like a login.
async fn unlock(
    st: &Arc<State>,
    ip: IpAddr,
    token: &str,
    link_id: &str,
    headers: &HeaderMap,
    body: Incoming,
) -> Result<Resp, FErr> {
    let too_many = || {
        FErr::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_logins",
            "too many wrong passwords from this address; wait a minute",
        )
    };
    if st.failures.blocked(ip).is_some() {
        return Err(too_many());
    }
    let body = json_body(headers, body).await?;
    let password = body
        .get("password")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let Some(f) = st.files.clone() else {
        return Ok(no_files(st));
    };
    let t = token.to_string();
    // A link password is a slow hash too: the same slots as logins, and
    // the attempt counts just before it (see `login`).
    let Ok(permit) = st.logins.clone().acquire_owned().await else {
        return Err(FErr::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "stopping",
            "the server is stopping",
        ));
    };
    let attempt = st.failures.attempt(ip).map_err(|_| too_many())?;
    let good = files::blocking(move || {
        let _slot = permit;
        Ok(f.link_password(&t, &password))
    })
    .await?;
    if !good {
        return Err(FErr::new(
            StatusCode::UNAUTHORIZED,
            "link_password",
            "wrong password",
        ));
    }
    st.failures.succeeded(attempt);
    let id = random_hex(32).ok_or_else(|| {
        FErr::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "no randomness",
        )
    })?;
    {
        let mut s = st.link_sessions.lock().unwrap_or_else(|e| e.into_inner());
        s.retain(|_, (_, at)| at.elapsed() < LINK_SESSION);
        if s.len() >= MAX_LINK_SESSIONS {
            let oldest = s
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                s.remove(&k);
            }
        }
        s.insert(id.clone(), (link_id.to_string(), Instant::now()));
    }
    let cookie = format!(
        "{LINK_COOKIE}={id}; Path=/s/{token}/; HttpOnly; SameSite=Strict; Max-Age={}{}",
        LINK_SESSION.as_secs(),
        if st.secure() { "; Secure" } else { "" }
    );
    Ok(answer(
        st,
        StatusCode::OK,
        json!({"open": true}),
        &[("set-cookie", cookie)],
    ))
}
