//! The admin API over HTTP(S) of a real daemon: no credentials → 401; a
//! user sees only their shares and datasets and changes only their own
//! password; a user calling an administrator's method → 403; a browser
//! request without the session's CSRF token, from another origin or not
//! JSON is refused; socket-only methods are refused to administrators
//! too; bearer tokens work without CSRF and stop at once when deleted;
//! demoting or removing a user takes effect on their live session;
//! logout ends a session; failed logins are rate limited; off loopback
//! the API speaks TLS.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;

use common::clients::add_user;
use common::process::{files, Daemon};
use serde_json::{json, Value};
use tarn_testkit::net::free_port;
use tarn_testkit::require;

/// One plain-HTTP exchange: (status, headers in lower case, body).
fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, Value) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let v = serde_json::from_str(body).unwrap_or(Value::Null);
    (status, head.to_lowercase(), v)
}

/// A browser request's (content type, CSRF token, Origin) and the
/// answer it must get (status, error code).
type Case<'a> = (&'a str, Option<&'a str>, Option<&'a str>, u16, &'a str);

/// A browser's session: its cookie and CSRF token.
struct Browser {
    cookie: String,
    csrf: String,
}

fn login(port: u16, user: &str, password: &str) -> Browser {
    let body = json!({"user": user, "password": password}).to_string();
    let (status, head, v) = http(
        port,
        "POST",
        "/api/login",
        &[("Content-Type", "application/json")],
        &body,
    );
    assert_eq!(status, 200, "login {user}: {v}");
    let cookie = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap()
        .to_string();
    assert!(
        head.contains("httponly") && head.contains("samesite=strict"),
        "{head}"
    );
    Browser {
        cookie,
        csrf: v["csrf"].as_str().unwrap().to_string(),
    }
}

/// A call as a browser (cookie and CSRF token): (status, answer).
fn call(port: u16, b: &Browser, method: &str, params: Value) -> (u16, Value) {
    let (s, _, v) = http(
        port,
        "POST",
        &format!("/api/call/{method}"),
        &[
            ("Content-Type", "application/json"),
            ("Cookie", &b.cookie),
            ("X-CSRF-Token", &b.csrf),
        ],
        &params.to_string(),
    );
    (s, v)
}

fn names(v: &Value, field: &str) -> Vec<String> {
    let mut out: Vec<String> = v["result"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .filter_map(|x| x.pointer(field).and_then(Value::as_str).map(str::to_string))
        .collect();
    out.sort();
    out
}

#[test]
fn the_api_knows_who_calls_and_what_they_may_do() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let web = format!("127.0.0.1:{port}");
    let d = Daemon::start_with(dir.path(), &["--web", &web]);
    let f = files(dir.path(), "m", 2, 128 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    for ds in ["tank/a", "tank/b"] {
        d.ok(&["dataset", "create", ds]);
    }
    d.ok(&["snapshot", "tank/a@mon"]);
    add_user(&d, "alice", "alice-password");
    add_user(&d, "bob", "bob-password-1");
    add_user(&d, "ada", "ada-password-1");
    d.ok(&["user", "admin", "ada", "on"]);
    d.ok(&["share", "add", "a", "tank/a", "--webdav", "alice=rw"]);
    d.ok(&["share", "add", "b", "tank/b", "--webdav", "bob=ro"]);
    let users = d.ok(&["user", "list"]);
    assert!(
        users
            .lines()
            .any(|l| l.starts_with("ada") && l.trim_end().ends_with("yes")),
        "{users}"
    );

    // No credentials, a wrong password.
    let json_ct = [("Content-Type", "application/json")];
    let (s, _, v) = http(port, "POST", "/api/call/pool.status", &json_ct, "{}");
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let (s, _, _) = http(
        port,
        "POST",
        "/api/login",
        &json_ct,
        r#"{"user":"alice","password":"nope"}"#,
    );
    assert_eq!(s, 401);
    let (s, _, _) = http(port, "GET", "/api/session", &[], "");
    assert_eq!(s, 401);

    // A user: their own shares and datasets only, their own password.
    let alice = login(port, "alice", "alice-password");
    let (s, v) = call(port, &alice, "share.list", json!({}));
    assert_eq!(s, 200, "{v}");
    assert_eq!(names(&v, "/share/name"), ["a"]);
    let (s, v) = call(port, &alice, "dataset.list", json!({"snapshots": true}));
    assert_eq!(s, 200, "{v}");
    assert_eq!(names(&v, "/name"), ["tank/a", "tank/a@mon"]);
    for m in ["pool.status", "user.list", "dataset.destroy", "share.add"] {
        let (s, v) = call(port, &alice, m, json!({}));
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (403, Some("forbidden")),
            "{m}: {v}"
        );
    }
    let (s, _) = call(
        port,
        &alice,
        "user.passwd",
        json!({"name": "bob", "password": "x-12345678"}),
    );
    assert_eq!(s, 403, "not bob's password");
    let (s, v) = call(
        port,
        &alice,
        "user.passwd",
        json!({"name": "alice", "password": "alice-password-2"}),
    );
    assert_eq!(s, 200, "{v}");

    // Browser requests need the CSRF token, this origin, and JSON: each
    // case is alice's cookie with (content type, CSRF token, Origin).
    let own = format!("http://127.0.0.1:{port}");
    let zeros = "0".repeat(64);
    let cases: [Case; 6] = [
        ("application/json", None, None, 403, "csrf"),
        ("application/json", Some(&zeros), None, 403, "csrf"),
        (
            "application/json",
            Some(&alice.csrf),
            Some("https://evil.example"),
            403,
            "origin",
        ),
        ("text/plain", Some(&alice.csrf), None, 415, "content_type"),
        ("application/json", Some(&alice.csrf), Some(&own), 200, ""),
        ("application/json", Some(&alice.csrf), None, 200, ""),
    ];
    for (ct, csrf, origin, want, code) in cases {
        let mut h = vec![("Content-Type", ct), ("Cookie", alice.cookie.as_str())];
        h.extend(csrf.map(|c| ("X-CSRF-Token", c)));
        h.extend(origin.map(|o| ("Origin", o)));
        let (s, _, v) = http(port, "POST", "/api/call/share.list", &h, "{}");
        assert_eq!(s, want, "{h:?}: {v}");
        if !code.is_empty() {
            assert_eq!(v["error"]["code"], code, "{h:?}");
        }
    }
    // A password changed with the tarn command ends her web sessions too:
    // whoever holds a cookie from before is out.
    let out = common::clients::tarn_with_stdin(
        &d,
        &["user", "passwd", "--password-stdin", "alice"],
        "alice-password-3\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (s, v) = call(port, &alice, "share.list", json!({}));
    assert_eq!(s, 401, "a session outlived a password change: {v}");
    let alice = login(port, "alice", "alice-password-3");
    let (s, v) = call(port, &alice, "share.list", json!({}));
    assert_eq!(s, 200, "{v}");

    // An administrator: everything but what is socket only.
    let ada = login(port, "ada", "ada-password-1");
    let (s, v) = call(port, &ada, "pool.status", json!({}));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["result"][0]["name"], "tank");
    let (s, v) = call(
        port,
        &ada,
        "object.write",
        json!({"pool": "tank", "object": "x", "from_path": "/etc/shadow"}),
    );
    assert_eq!(s, 403, "socket only: {v}");
    let (s, v) = call(port, &ada, "no.such.method", json!({}));
    assert_eq!(s, 403, "{v}");

    // A bearer token acts as its user, without CSRF, until deleted.
    let token = d
        .ok(&["user", "token", "add", "script", "ada"])
        .trim()
        .to_string();
    assert_eq!(token.len(), 64);
    let bearer = format!("Bearer {token}");
    let auth = [
        ("Content-Type", "application/json"),
        ("Authorization", bearer.as_str()),
    ];
    let (s, _, v) = http(port, "POST", "/api/call/pool.list", &auth, "{}");
    assert_eq!(s, 200, "{v}");
    let listed = d.ok(&["user", "token", "list"]);
    assert!(
        listed.contains("script") && !listed.contains(&token),
        "{listed}"
    );
    d.ok(&["user", "token", "del", "script"]);
    let (s, _, _) = http(port, "POST", "/api/call/pool.list", &auth, "{}");
    assert_eq!(s, 401, "a deleted token stops at once");

    // Over HTTPS an administrator may not name the server's own files.
    let (s, v) = call(
        port,
        &ada,
        "dataset.set",
        json!({"name": "tank/a", "property": "mountpoint", "value": "/etc"}),
    );
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{v}"
    );
    let (s, _) = call(
        port,
        &ada,
        "pool.create",
        json!({"name": "evil", "vdevs": [{"kind": "single", "devices": ["/etc/hostname"]}]}),
    );
    assert_eq!(s, 403);

    // Another pool's user of the same name is someone else: not an
    // administrator, and not able to reach tank's ada.
    let g = files(dir.path(), "v", 1, 64 << 20);
    d.ok(&["pool", "create", "vault", &g[0]]);
    let out = common::clients::tarn_with_stdin(
        &d,
        &["user", "add", "--pool", "vault", "--password-stdin", "ada"],
        "other-ada-password\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let other = login(port, "ada", "other-ada-password");
    let (s, v) = call(port, &other, "pool.status", json!({}));
    assert_eq!(s, 403, "vault's ada is no administrator: {v}");
    let (s, v) = call(
        port,
        &other,
        "user.passwd",
        json!({"pool": "tank", "name": "ada", "password": "taken-over-1"}),
    );
    assert_eq!(s, 200, "{v}");
    let (s, _, _) = http(
        port,
        "POST",
        "/api/login",
        &json_ct,
        r#"{"user":"ada","password":"ada-password-1"}"#,
    );
    assert_eq!(
        s, 200,
        "tank's ada keeps her password: the change went to vault's"
    );

    // Demoted: the live session is a user's now.
    d.ok(&["user", "admin", "--pool", "tank", "ada", "off"]);
    let (s, _) = call(port, &ada, "pool.status", json!({}));
    assert_eq!(s, 403);
    // Logout ends the session.
    let (s, _) = call(port, &ada, "../logout", json!({}));
    assert_eq!(s, 403, "no path tricks: not a method");
    let (s, _, _) = http(
        port,
        "POST",
        "/api/logout",
        &[
            ("Content-Type", "application/json"),
            ("Cookie", &ada.cookie),
            ("X-CSRF-Token", &ada.csrf),
        ],
        "{}",
    );
    assert_eq!(s, 200);
    let (s, _) = call(port, &ada, "share.list", json!({}));
    assert_eq!(s, 401);
    // A removed user's session ends too.
    d.ok(&["share", "del", "a"]);
    let alice_token = d
        .ok(&["user", "token", "add", "--pool", "tank", "alices", "alice"])
        .trim()
        .to_string();
    d.ok(&["user", "del", "--pool", "tank", "alice"]);
    let (s, _) = call(port, &alice, "share.list", json!({}));
    assert_eq!(s, 401);
    // Her tokens went with her: an alice added again does not get them.
    let out = common::clients::tarn_with_stdin(
        &d,
        &["user", "add", "--pool", "tank", "--password-stdin", "alice"],
        "new-alice-password\n",
    );
    assert!(out.status.success());
    let bearer = format!("Bearer {alice_token}");
    let (s, _, _) = http(
        port,
        "POST",
        "/api/call/share.list",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", bearer.as_str()),
        ],
        "{}",
    );
    assert_eq!(s, 401);

    // One address may hold 32 connections; the next is closed at once,
    // and room comes back when they close.
    let held: Vec<TcpStream> = (0..32)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    // The server counts a connection once it has accepted it, which a
    // loaded machine may take a while to do (a CI run saw it take more
    // than 5 s): the 33rd is tried until the 32 are in (and must then be
    // closed at once), for 8 s, less than the server's header timeout
    // (10 s), after which it closes the 32 silent ones itself and room is
    // back. A server that never refuses still fails here.
    let t0 = std::time::Instant::now();
    loop {
        let mut extra = TcpStream::connect(("127.0.0.1", port)).unwrap();
        extra
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let _ = extra.write_all(
            b"GET /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        );
        let mut got = Vec::new();
        let _ = extra.read_to_end(&mut got);
        if got.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(8),
            "the 33rd connection is served: {}",
            String::from_utf8_lossy(&got)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    drop(held);
    let t0 = std::time::Instant::now();
    loop {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let _ = s.write_all(
            b"GET /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        );
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        if got.starts_with(b"HTTP/1.1 401") {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "room never came back"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    // Failed logins are limited per address.
    let mut codes = Vec::new();
    for _ in 0..6 {
        let (s, head, _) = http(
            port,
            "POST",
            "/api/login",
            &json_ct,
            r#"{"user":"bob","password":"wrong"}"#,
        );
        if s == 429 {
            assert!(head.contains("retry-after:"), "{head}");
        }
        codes.push(s);
    }
    assert_eq!(
        codes,
        [401, 401, 401, 401, 429, 429],
        "the first was earlier: 5 in the window"
    );
    let (s, _, _) = http(
        port,
        "POST",
        "/api/login",
        &json_ct,
        r#"{"user":"bob","password":"bob-password-1"}"#,
    );
    assert_eq!(s, 429, "even the right password waits");
    d.stop();
}

#[test]
fn off_loopback_the_api_speaks_tls() {
    if !require::programs(&["curl"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let web = format!("0.0.0.0:{port}");
    let d = Daemon::start_with(dir.path(), &["--web", &web]);
    let out = Command::new("curl")
        .args([
            "-sk",
            "-i",
            &format!("https://127.0.0.1:{port}/api/session"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(text.starts_with("http/1.1 401"), "{text}");
    assert!(text.contains("strict-transport-security"), "{text}");
    let plain = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("http://127.0.0.1:{port}/api/session"),
        ])
        .output()
        .unwrap();
    assert_ne!(
        String::from_utf8_lossy(&plain.stdout),
        "401",
        "plain HTTP is not served there"
    );

    // A browser's session over TLS: the cookie is Secure and named with
    // the __Host- prefix (a neighbouring subdomain cannot plant one), and
    // the plain name is not read.
    let f = files(dir.path(), "m", 1, 64 << 20);
    d.ok(&["pool", "create", "tank", &f[0]]);
    add_user(&d, "ada", "ada-login-pw");
    let curl = |args: &[&str]| {
        let out = Command::new("curl")
            .args(["-sk"])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let head = curl(&[
        "-i",
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"user": "ada", "password": "ada-login-pw"}"#,
        &format!("https://127.0.0.1:{port}/api/login"),
    ]);
    let set = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no cookie: {head}"));
    assert!(set.contains("; Secure"), "{set}");
    let pair = set["set-cookie:".len()..].trim().split(';').next().unwrap();
    let id = pair
        .strip_prefix("__Host-tarn_session=")
        .unwrap_or_else(|| panic!("{set}"));
    let status = |cookie: &str| {
        curl(&[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            &format!("Cookie: {cookie}"),
            &format!("https://127.0.0.1:{port}/api/session"),
        ])
    };
    assert_eq!(status(&format!("__Host-tarn_session={id}")), "200");
    assert_eq!(status(&format!("tarn_session={id}")), "401");
    d.stop();
}
