//! One request, from its head to the dav-server handler of its share.
//!
//! [`handle`] refuses in a fixed order, cheapest and least revealing
//! first: an address blocked for failed logins (429), a fragment in the
//! request target (400: the HTTP stack drops it, so `DELETE /s/dir/#x`
//! would name `dir/`), malformed headers (400), then authentication (401,
//! or 429 once an address fails too often); only an authenticated
//! principal learns whether a share exists (404) or admits it (403). A
//! PROPFIND of infinite depth is refused (403, RFC 4918 §9.1) before any
//! walk. Permission to write is decided here, from the principal, the
//! share's user list and the share's read-only flag, and refused for
//! every modifying method before dav-server sees the request; the
//! filesystem refuses writes again ([`Ctx::can_write`]).
//!
//! The path is normalized exactly as dav-server will normalize it, then
//! routed on its first segment; dav-server re-checks that the path lies
//! under the share's prefix. A PROPFIND body (small XML) is read here
//! whole, to learn which properties the answer must list ([`PropFix`]).
//!
//! Requests for `/` itself go to the virtual root, [`root`]: a collection
//! listing the shares (GET as HTML, PROPFIND as a multistatus) that holds
//! nothing else.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dav_server::body::Body;
use dav_server::davpath::DavPath;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::conn::ReqBody;
use super::State;
use crate::auth::{parse_basic, Principal};
use crate::davfs::{Ctx, Replace};
use crate::headers::{self, Depth};
use crate::panics;
use crate::propfix::{self, PropFix};
use crate::reqwatch::Heads;

/// Largest PROPFIND body read (dav-server's limit for XML bodies).
const MAX_XML_BODY: usize = 64 << 10;

pub(super) fn simple(status: StatusCode, body: &'static str) -> Response<Body> {
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
    realm: Option<String>,
) -> Result<Principal, Response<Body>> {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return st.auth.anonymous().ok_or_else(unauthorized);
    };
    let parsed = value.to_str().ok().and_then(parse_basic);
    // Credentials checked a moment ago are not checked, or counted,
    // again.
    if let Some(p) = parsed
        .as_ref()
        .and_then(|(user, pass)| st.cache.get(realm.as_deref(), user, pass))
    {
        return Ok(p);
    }
    // Malformed credentials carry no password to guess: 401, not
    // counted (counting them would let anyone fill the limiter's table
    // without paying for a single hash).
    let Some((user, pass)) = &parsed else {
        log::warn!("tarn-webdav: malformed credentials from {ip}");
        return Err(unauthorized());
    };
    // A password check. Requests that bring the same credentials from the
    // same client at the same time share one (`InFlight`). It waits for a
    // slot (a few slow hashes at a time, whoever asks), then counts as an
    // attempt (`tarn_conn::LoginLimiter`), then runs to its end even if
    // every request waiting for it goes away: the slot goes with the
    // hash, not with the request.
    let run = || async {
        let Ok(permit) = st.checks.clone().acquire_owned().await else {
            return Ok(None);
        };
        let attempt = st.limiter.attempt(ip)?;
        let (auth, u, p) = (st.auth.clone(), user.clone(), pass.clone());
        let r = realm.clone();
        let check = move || {
            let _slot = permit;
            panics::catch(
                "a password check",
                std::panic::AssertUnwindSafe(|| auth.check_in(r.as_deref(), &u, &p)),
            )
            .flatten()
        };
        let got = tokio::task::spawn_blocking(check).await.ok().flatten();
        if let Some(p) = &got {
            st.cache.put(realm.as_deref(), user, pass, p);
            st.limiter.succeeded(attempt);
        }
        Ok(got)
    };
    let client = tarn_conn::client_key(ip);
    let checked = match st
        .in_flight
        .check(realm.as_deref(), user, pass, client, run)
        .await
    {
        Ok(c) => c,
        Err(wait) => {
            log::warn!("tarn-webdav: too many failed logins from {ip}; refusing it for a while");
            return Err(too_many(wait));
        }
    };
    match checked {
        Some(p) => Ok(p),
        None => {
            log::warn!("tarn-webdav: failed login for user {user:?} from {ip}");
            match st.limiter.blocked(ip) {
                Some(wait) => {
                    log::warn!(
                        "tarn-webdav: too many failed logins from {ip}; refusing it for a while"
                    );
                    Err(too_many(wait))
                }
                None => Err(unauthorized()),
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

pub(super) async fn handle(
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
    // Credentials are checked where the share's users are defined (its
    // realm); a path that names no share is checked anywhere (and then
    // answered as before).
    let realm = DavPath::new(req.uri().path()).ok().and_then(|p| {
        let first = p.as_bytes().split(|&b| b == b'/').find(|s| !s.is_empty())?;
        let name = std::str::from_utf8(first).ok()?;
        let shares = st.shares.read().unwrap_or_else(|e| e.into_inner());
        shares.get(name).and_then(|s| s.share.realm.clone())
    });
    let principal = match authenticate(&req, ip, &st, realm).await {
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
    // COPY and MOVE stay inside their share: a Destination in another
    // (or one whose name merely starts with this one's, `/ab/x` from
    // share `a`, which the library's byte-prefix strip would turn into
    // `b/x` here) is another server's business (RFC 4918 §9.8.5: 502).
    if matches!(req.method().as_str(), "COPY" | "MOVE") {
        let dest = req
            .headers()
            .get("destination")
            .and_then(|d| destination_segments(d.as_bytes()));
        if dest
            .as_ref()
            .and_then(|d| d.first())
            .is_some_and(|s| *s != first)
        {
            return (
                simple(
                    StatusCode::BAD_GATEWAY,
                    "the destination is not in this share\n",
                ),
                None,
            );
        }
        // The library deletes an existing destination before it moves or
        // copies onto it: what would make the move or copy fail after
        // that is refused first, with nothing deleted.
        if let Some(dest) = &dest {
            let src = segments(path.as_bytes());
            if let Some(why) = copy_move_refusal(req.method().as_str(), &src, dest) {
                return (simple(StatusCode::FORBIDDEN, why), None);
            }
        }
    }
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
    // UNLOCK ends only the caller's own lock: tokens are not secret (a
    // PROPFIND lists them to anyone who may read), and the library lets
    // any token holder unlock.
    if req.method().as_str() == "UNLOCK" {
        if let Some(why) = others_lock(&share, &path, &req, &principal.name).await {
            return (simple(StatusCode::FORBIDDEN, why), None);
        }
    }
    // An overwriting COPY or MOVE sets the destination file aside rather
    // than deleting it, and puts it back if the request fails.
    let replace = if matches!(req.method().as_str(), "COPY" | "MOVE") {
        req.headers()
            .get("destination")
            .and_then(|d| destination_segments(d.as_bytes()))
            .map(|dest| {
                let under = |v: Vec<Vec<u8>>| v.into_iter().skip(1).collect::<Vec<_>>();
                Replace::new(under(segments(path.as_bytes())), under(dest))
            })
    } else {
        None
    };
    let cred = principal.cred();
    let ctx = Ctx {
        cred: cred.clone(),
        can_write,
        replace: replace.clone(),
    };
    let is_get = matches!(*req.method(), Method::GET | Method::HEAD);
    let (parts, body) = req.into_parts();
    let failed = Arc::new(AtomicBool::new(false));
    // The bodies of PROPFIND, PROPPATCH and LOCK are small XML (dav-server
    // reads them whole too): read here, their nesting is checked before
    // anything builds them into a tree (see `propfix::MAX_XML_DEPTH`), and
    // a PROPFIND's tells which properties the answer must list.
    let method = parts.method.as_str();
    let (body, wanted) = if matches!(method, "PROPFIND" | "PROPPATCH" | "LOCK") {
        match http_body_util::Limited::new(body, MAX_XML_BODY)
            .collect()
            .await
        {
            Ok(c) => {
                let b = c.to_bytes();
                if !propfix::nesting_within(&b, propfix::MAX_XML_DEPTH) {
                    return (
                        simple(StatusCode::BAD_REQUEST, "XML body nested too deeply\n"),
                        None,
                    );
                }
                if method == "PROPFIND" && propfix::requested_count(&b) > propfix::MAX_REQUESTED {
                    return (
                        simple(StatusCode::BAD_REQUEST, "too many properties requested\n"),
                        None,
                    );
                }
                let wanted = if method == "PROPFIND" {
                    propfix::requested(&b)
                } else {
                    None
                };
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
    let mut resp = share
        .handler
        .handle_guarded(req, principal.name.clone(), ctx)
        .await;
    if is_get {
        confine(resp.headers_mut());
    }
    if let Some(r) = replace {
        let ok = matches!(resp.status(), StatusCode::CREATED | StatusCode::NO_CONTENT);
        let fs = share.share.fs.clone();
        let _ = tokio::task::spawn_blocking(move || r.finish(fs.as_ref(), &cred, ok)).await;
    }
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

/// Headers for what a GET of a share returns (a file, or the listing of a
/// folder): a file anyone with write access put there (`.html`, `.svg`)
/// must not run script on this origin in a browser that opens it, where
/// the browser holds the viewer's credentials. `sandbox` gives the
/// document no scripts and an origin of its own; `nosniff` keeps a file
/// of another name from being taken for HTML. The folder listing needs
/// only its inline style.
fn confine(h: &mut http::HeaderMap) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        http::HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'; sandbox"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        http::HeaderValue::from_static("nosniff"),
    );
}

/// Why an UNLOCK must be refused: its token names a lock on the path that
/// another user holds.
async fn others_lock<B>(
    share: &super::ShareState,
    path: &DavPath,
    req: &Request<B>,
    user: &str,
) -> Option<&'static str> {
    let token = req.headers().get("lock-token")?.to_str().ok()?.trim();
    let token = token.strip_prefix('<')?.strip_suffix('>')?;
    let mut rel = path.clone();
    rel.set_prefix(&format!("/{}", share.share.name)).ok()?;
    let locks = share.ls.discover(&rel).await;
    let lock = locks.iter().find(|l| l.token == token)?;
    (lock.principal.as_deref() != Some(user)).then_some("the lock is another user's\n")
}

/// The non-empty segments of a normalized path.
fn segments(path: &[u8]) -> Vec<Vec<u8>> {
    path.split(|&b| b == b'/')
        .filter(|s| !s.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

/// Why a COPY or MOVE from `src` to `dest` (segments, the share first)
/// must be refused before the library deletes the destination: the share
/// itself as the destination, a destination that holds the source (it
/// would be deleted with the source in it), a destination inside the
/// source (deleted, and then the move or copy into it fails), and a MOVE
/// out of a snapshot
/// (read-only: the rename would fail once the destination is gone; a
/// COPY restores from a snapshot).
fn copy_move_refusal(method: &str, src: &[Vec<u8>], dest: &[Vec<u8>]) -> Option<&'static str> {
    if dest.len() <= 1 {
        return Some("the share itself cannot be replaced\n");
    }
    if src.len() > dest.len() && src.starts_with(dest) {
        return Some("the destination holds the source\n");
    }
    if dest.len() > src.len() && dest.starts_with(src) {
        return Some("the destination is inside the source\n");
    }
    if method == "MOVE" && src.get(1).is_some_and(|s| s == b".snapshot") {
        return Some("snapshots are read-only: COPY from a snapshot to restore\n");
    }
    None
}

/// The segments (normalized as the request path is) of the path a
/// `Destination` header names, the share first; None when it does not
/// parse (the library answers those).
fn destination_segments(v: &[u8]) -> Option<Vec<Vec<u8>>> {
    let v = std::str::from_utf8(v).ok()?;
    let path = if v.starts_with('/') {
        v
    } else {
        let lower = v.to_ascii_lowercase();
        let skip = if lower.starts_with("http://") {
            7
        } else if lower.starts_with("https://") {
            8
        } else {
            return None;
        };
        let rest = &v[skip..];
        &rest[rest.find('/')?..]
    };
    let p = DavPath::new(path).ok()?;
    Some(segments(p.as_bytes()))
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
