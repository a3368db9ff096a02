//! Authentication, rate limiting, read-only access, path escapes, error
//! statuses, live share changes, the root listing and TLS — with curl as
//! the client.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tarn_fs::testing::MemBackend;
use tarn_fs::{Cred, Fs, ROOT_INO};
use tarn_testkit::clients::{curl, status};
use tarn_testkit::require;
use tarn_webdav::{serve, Anonymous, Authenticator, FsApi, Share, WebdavConfig, WebdavError};

const A: &str = "alice:secret";

fn put_bytes(fs: &dyn FsApi, parent: u64, name: &str, data: &[u8], cred: &Cred) -> u64 {
    let a = fs
        .create(parent, name.as_bytes(), 0o644, 0, libc::O_WRONLY, cred)
        .unwrap();
    fs.write(a.ino, 0, data, false, cred).unwrap();
    fs.release(a.ino).unwrap();
    a.ino
}

#[test]
fn wrong_password_401_then_rate_limited() {
    if !require::programs(&["curl"]) {
        return;
    }
    let server = start(vec![Share::new("s", mem_fs())]);
    let u = url(server.local_addr(), "/s/");
    // No credentials: 401 with a Basic challenge, not counted as a failure.
    for _ in 0..8 {
        let (code, _, out) = curl(&["-i", &u]);
        assert_eq!(code, 401);
        let _ = out;
    }
    let (_, head, _) = curl(&["-i", &u]);
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(
        head.contains("www-authenticate: basic realm=\"tarn\""),
        "{head}"
    );
    assert_eq!(
        status(&["-u", A, "-X", "PROPFIND", "-H", "Depth: 0", &u]),
        207
    );
    // Four wrong passwords: 401; the fifth trips the limiter.
    for _ in 0..4 {
        assert_eq!(status(&["-u", "alice:wrong", &u]), 401);
    }
    assert_eq!(status(&["-u", "alice:wrong", &u]), 429);
    // Now even the right password is refused from this IP ...
    let (code, _, out) = curl(&["-i", "-u", A, &u]);
    assert_eq!(code, 429);
    let _ = out;
    // ... but another client address is not affected.
    assert_eq!(
        status(&[
            "--interface",
            "127.0.0.2",
            "-u",
            A,
            "-X",
            "PROPFIND",
            "-H",
            "Depth: 0",
            &u
        ]),
        207
    );
    // Garbage Authorization headers are refused (not counted: see
    // `malformed_credentials_are_refused_and_not_counted`).
    assert_eq!(
        status(&[
            "--interface",
            "127.0.0.3",
            "-H",
            "Authorization: Basic !!!",
            &u
        ]),
        401
    );
    server.stop();
}

/// A server of one share `s` with `auth`, refusing a client after
/// `max_failures` failed logins within `window`; with the share's URL.
fn limited(
    max_failures: u32,
    window: Duration,
    auth: Arc<dyn Authenticator>,
) -> (tarn_webdav::Running, String) {
    let mut cfg = WebdavConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.auth_max_failures = max_failures;
    cfg.auth_failure_window = window;
    let server = serve(cfg, vec![Share::new("s", mem_fs())], auth).unwrap();
    let u = url(server.local_addr(), "/s/");
    (server, u)
}

/// The default failed-login window.
const WINDOW: Duration = Duration::from_secs(60);

#[test]
fn rate_limit_window_expires() {
    if !require::programs(&["curl"]) {
        return;
    }
    let (server, u) = limited(2, Duration::from_millis(1500), users());
    assert_eq!(status(&["-u", "x:y", &u]), 401);
    assert_eq!(status(&["-u", "x:y", &u]), 429);
    assert_eq!(status(&["-u", A, &u]), 429);
    std::thread::sleep(Duration::from_millis(1700));
    assert_eq!(status(&["-u", A, &u]), 200);
    server.stop();
}

/// A right password takes back only its own attempt: someone who knows
/// one account's password cannot log in with it between guesses at
/// another to keep the count from ever filling.
#[test]
fn a_good_login_does_not_wipe_the_failed_ones() {
    if !require::programs(&["curl"]) {
        return;
    }
    let (server, u) = limited(3, WINDOW, users());
    assert_eq!(status(&["-u", "alice:guess1", &u]), 401);
    assert_eq!(status(&["-u", "alice:guess2", &u]), 401);
    assert_eq!(status(&["-u", A, &u]), 200);
    assert_eq!(status(&["-u", "alice:guess3", &u]), 429);
    server.stop();
}

/// The test users, each check taking 100 ms, counting the checks and
/// how many run at once.
struct SlowChecks {
    users: Arc<tarn_webdav::StaticUsers>,
    calls: std::sync::atomic::AtomicUsize,
    now: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
}

impl SlowChecks {
    fn new() -> Arc<SlowChecks> {
        Arc::new(SlowChecks {
            users: users(),
            calls: Default::default(),
            now: Default::default(),
            peak: Default::default(),
        })
    }
}

impl Authenticator for SlowChecks {
    fn check(&self, user: &str, password: &str) -> Option<tarn_webdav::Principal> {
        use std::sync::atomic::Ordering::SeqCst;
        self.calls.fetch_add(1, SeqCst);
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.peak.fetch_max(n, SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        self.now.fetch_sub(1, SeqCst);
        self.users.check(user, password)
    }
}

/// `n` GETs of `u` at once as `creds(i)`; their statuses.
fn at_once(n: usize, u: &str, creds: impl Fn(usize) -> String) -> Vec<u16> {
    let clients: Vec<_> = (0..n)
        .map(|i| {
            let (u, c) = (u.to_string(), creds(i));
            std::thread::spawn(move || status(&["-u", &c, &u]))
        })
        .collect();
    clients.into_iter().map(|c| c.join().unwrap()).collect()
}

/// A burst of requests with the right password, the login cache empty
/// (a file manager opening a folder), is one check and one attempt, not
/// one each: none of them meets 429.
#[test]
fn parallel_requests_with_the_same_credentials_are_checked_once() {
    if !require::programs(&["curl"]) {
        return;
    }
    let auth = SlowChecks::new();
    let (server, u) = limited(5, WINDOW, auth.clone());
    assert_eq!(at_once(12, &u, |_| A.to_string()), vec![200; 12]);
    let calls = auth.calls.load(std::sync::atomic::Ordering::SeqCst);
    assert!(calls <= 2, "{calls} checks");
    server.stop();
}

/// Password checks are slow hashes: however many requests bring new
/// credentials at once, a few are checked at a time.
#[test]
fn password_checks_run_a_few_at_a_time() {
    if !require::programs(&["curl"]) {
        return;
    }
    let auth = SlowChecks::new();
    let (server, u) = limited(1000, WINDOW, auth.clone());
    assert_eq!(at_once(12, &u, |i| format!("u{i}:p")), vec![401; 12]);
    let peak = auth.peak.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (1..=tarn_conn::PASSWORD_CHECKS_AT_ONCE).contains(&peak),
        "{peak} checks at once"
    );
    // Clients that give up while their check runs do not free its slot
    // for another: the bound holds for the hashes, not the requests.
    let quitters: Vec<_> = (0..12)
        .map(|i| {
            let u = u.clone();
            std::thread::spawn(move || {
                curl(&["-m", "0.05", "-u", &format!("q{i}:p"), &u]);
            })
        })
        .collect();
    for q in quitters {
        q.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    let peak = auth.peak.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        peak <= tarn_conn::PASSWORD_CHECKS_AT_ONCE,
        "{peak} checks at once"
    );
    server.stop();
}

/// Malformed credentials carry no password: 401, and not counted (they
/// cost no hash, so counting them would let anyone fill the table of
/// clients for free).
#[test]
fn malformed_credentials_are_refused_and_not_counted() {
    if !require::programs(&["curl"]) {
        return;
    }
    let (server, u) = limited(2, WINDOW, users());
    for _ in 0..4 {
        assert_eq!(status(&["-H", "Authorization: Basic !!!", &u]), 401);
    }
    assert_eq!(status(&["-u", A, &u]), 200);
    server.stop();
}

#[test]
fn read_only_principal_and_share_get_403() {
    if !require::programs(&["curl"]) {
        return;
    }
    let fs = mem_fs();
    put_bytes(
        fs.as_ref(),
        ROOT_INO,
        "f.txt",
        b"hello",
        &Cred::user(UID, UID),
    );
    let mut ro = Share::new("ro", fs.clone());
    ro.read_only = true;
    let server = start(vec![Share::new("rw", fs.clone()), ro]);
    let addr = server.local_addr();
    let rw = |p: &str| url(addr, &format!("/rw/{p}"));
    let r = "reader:pw";
    assert_eq!(status(&["-u", r, &rw("f.txt")]), 200);
    assert_eq!(status(&["-u", r, "-T", "/dev/null", &rw("new.txt")]), 403);
    assert_eq!(status(&["-u", r, "-X", "MKCOL", &rw("d")]), 403);
    assert_eq!(status(&["-u", r, "-X", "DELETE", &rw("f.txt")]), 403);
    assert_eq!(
        status(&[
            "-u",
            r,
            "-X",
            "MOVE",
            "-H",
            &format!("Destination: {}", rw("g.txt")),
            &rw("f.txt")
        ]),
        403
    );
    assert_eq!(
        status(&["-u", r, "-X", "PROPPATCH", "-d", "<x/>", &rw("f.txt")]),
        403
    );
    // The writer can, on the writable share; nobody can on the read-only one.
    assert_eq!(status(&["-u", A, "-T", "/dev/null", &rw("new.txt")]), 201);
    let ro_url = url(addr, "/ro/f.txt");
    assert_eq!(status(&["-u", A, &ro_url]), 200);
    assert_eq!(
        status(&["-u", A, "-T", "/dev/null", &url(addr, "/ro/x")]),
        403
    );
    assert_eq!(status(&["-u", A, "-X", "DELETE", &ro_url]), 403);
    assert!(fs.lookup(ROOT_INO, b"f.txt", &Cred::root()).is_ok());
    assert!(fs.lookup(ROOT_INO, b"x", &Cred::root()).is_err());
    server.stop();
}

/// A share with a user list admits only those users, each with its own
/// access; others get 403 although their password is right.
#[test]
fn share_user_lists_decide_access() {
    if !require::programs(&["curl"]) {
        return;
    }
    let fs = mem_fs();
    put_bytes(
        fs.as_ref(),
        ROOT_INO,
        "f.txt",
        b"hello",
        &Cred::user(UID, UID),
    );
    let mut only_reader = Share::new("team", fs.clone());
    only_reader.users = Some([("reader".to_string(), false)].into_iter().collect());
    let mut alice_ro = Share::new("archive", fs.clone());
    alice_ro.users = Some([("alice".to_string(), false)].into_iter().collect());
    let server = start(vec![only_reader, alice_ro]);
    let addr = server.local_addr();
    assert_eq!(status(&["-u", "reader:pw", &url(addr, "/team/f.txt")]), 200);
    assert_eq!(
        status(&["-u", A, &url(addr, "/team/f.txt")]),
        403,
        "alice is not listed"
    );
    assert_eq!(status(&["-u", A, &url(addr, "/archive/f.txt")]), 200);
    assert_eq!(
        status(&["-u", A, "-T", "/dev/null", &url(addr, "/archive/new.txt")]),
        403,
        "listed read-only, though alice may write elsewhere"
    );
    server.stop();
}

#[test]
fn posix_permissions_apply() {
    if !require::programs(&["curl"]) {
        return;
    }
    let fs = mem_fs();
    // A file of another user, mode 0600: alice (uid 1000) may not read it.
    let other = Cred::user(2000, 2000);
    let ino = put_bytes(
        fs.as_ref(),
        ROOT_INO,
        "private",
        b"top secret",
        &Cred::root(),
    );
    let sa = tarn_fs::SetAttr {
        uid: Some(2000),
        gid: Some(2000),
        mode: Some(0o600),
        ..Default::default()
    };
    fs.setattr(ino, &sa, &Cred::root()).unwrap();
    let _ = other;
    let server = start(vec![Share::new("s", fs.clone())]);
    let u = url(server.local_addr(), "/s/private");
    let (code, body, _) = curl(&["-u", A, &u]);
    assert_eq!(code, 403);
    assert!(!String::from_utf8_lossy(&body).contains("top secret"));
    assert_eq!(status(&["-u", A, "-T", "/dev/null", &u]), 403);
    server.stop();
}

#[test]
fn paths_cannot_escape_the_share() {
    if !require::programs(&["curl"]) {
        return;
    }
    let fs = mem_fs();
    let me = Cred::user(UID, UID);
    // The share's root is /inner; /outside.txt lies above it.
    put_bytes(fs.as_ref(), ROOT_INO, "outside.txt", b"OUTSIDE-MARKER", &me);
    let inner = fs.mkdir(ROOT_INO, b"inner", 0o755, 0, &me).unwrap();
    put_bytes(fs.as_ref(), inner.ino, "in.txt", b"inside", &me);
    let mut share = Share::new("sub", fs.clone());
    share.root = inner.ino;
    let server = start(vec![share]);
    let addr = server.local_addr();
    let base = format!("http://{addr}");
    assert_eq!(status(&["-u", A, &format!("{base}/sub/in.txt")]), 200);
    let attacks = [
        "/sub/../outside.txt",
        "/sub/../../outside.txt",
        "/sub/%2e%2e/outside.txt",
        "/sub/%2E%2E/%2E%2E/outside.txt",
        "/sub/..%2Foutside.txt",
        "/sub/..%2fouts%69de.txt",
        "/sub/%2F..%2F..%2Foutside.txt",
        "/sub/%2e%2e%2f%2e%2e%2foutside.txt",
        "/sub/in.txt%00",
        "/sub/%00/../outside.txt",
        "/sub/inner/../../outside.txt",
        "/sub/./../outside.txt",
        "/sub/..\\outside.txt",
        "/sub/%5c..%5coutside.txt",
        "/../outside.txt",
        "/%2e%2e/outside.txt",
    ];
    for a in attacks {
        let u = format!("{base}{a}");
        for method in ["GET", "PROPFIND"] {
            let (code, body, _) = curl(&["--path-as-is", "-u", A, "-X", method, &u]);
            let text = String::from_utf8_lossy(&body);
            assert!(
                !text.contains("OUTSIDE-MARKER") && !text.contains("outside.txt"),
                "{method} {a} -> {code}: {text}"
            );
            assert!(code >= 400, "{method} {a} -> {code}");
            println!("{method} {a} -> {code}");
        }
        // Writes through the same paths must not touch the outside file.
        let code = status(&["--path-as-is", "-u", A, "-T", "/dev/null", &u]);
        println!("PUT {a} -> {code}");
        assert!(code >= 400 || code == 201, "PUT {a} -> {code}");
    }
    // MOVE/COPY with escaping destinations.
    for dest in [
        "/sub/../outside.txt",
        "/sub/%2e%2e/outside.txt",
        "/outside.txt",
    ] {
        for m in ["MOVE", "COPY"] {
            let code = status(&[
                "-u",
                A,
                "-X",
                m,
                "-H",
                &format!("Destination: {base}{dest}"),
                &format!("{base}/sub/in.txt"),
            ]);
            assert!(code >= 400, "{m} -> {dest}: {code}");
        }
    }
    // The outside file is untouched and nothing was created next to it.
    let o = fs.lookup(ROOT_INO, b"outside.txt", &Cred::root()).unwrap();
    assert_eq!(fs.read(o.ino, 0, 100).unwrap(), b"OUTSIDE-MARKER");
    let names: Vec<Vec<u8>> = fs
        .readdirplus(ROOT_INO, 0, 100)
        .unwrap()
        .into_iter()
        .map(|(e, _)| e.name)
        .collect();
    assert_eq!(names.len(), 4, "{:?}", names); // . .. outside.txt inner
    assert!(fs.lookup(inner.ino, b"in.txt", &Cred::root()).is_ok());
    // %2F inside a segment is refused, not treated as a separator.
    assert_eq!(
        status(&["--path-as-is", "-u", A, &format!("{base}/sub%2Fin.txt")]),
        400
    );
    server.stop();
}

#[test]
fn enospc_and_quota_are_507() {
    if !require::programs(&["curl"]) {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let big = work.path().join("big");
    std::fs::write(&big, vec![7u8; 3 << 20]).unwrap();
    for quota in [false, true] {
        let b = MemBackend::new();
        let fs = Arc::new(Fs::mount(b.clone()).unwrap());
        chown_root(fs.as_ref());
        b.set_budget(Some(b.used() + (1 << 20)), quota);
        let server = start(vec![Share::new("s", fs.clone())]);
        let u = url(server.local_addr(), "/s/big");
        let code = status(&["-u", A, "-T", big.to_str().unwrap(), &u]);
        assert_eq!(code, 507, "quota={quota}");
        server.stop();
    }
}

/// A client still sending an upload the server has already refused (the
/// pool filled part-way) is not reset: the server's close is a lingering
/// one. A reset fails the client's next send, and a client such as curl
/// then gives up without reading the 507 that had already arrived.
#[test]
fn refused_upload_is_answered_not_reset() {
    use std::io::{Read, Write};
    let b = MemBackend::new();
    let fs = Arc::new(Fs::mount(b.clone()).unwrap());
    chown_root(fs.as_ref());
    b.set_budget(Some(b.used() + (1 << 20)), false);
    let server = start(vec![Share::new("s", fs.clone())]);
    let mut sock = std::net::TcpStream::connect(server.local_addr()).unwrap();
    let head = format!(
        "PUT /s/big HTTP/1.1\r\nHost: t\r\nAuthorization: {ALICE}\r\n\
         Content-Length: 67108864\r\n\r\n"
    );
    sock.write_all(head.as_bytes()).unwrap();
    // Send 8 MiB of the announced 64 in the background (more than the
    // server reads before it fails), stopping at the first error.
    let mut w = sock.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![5u8; 64 << 10];
        for i in 0..128 {
            // Slower than the wire, so the answer and close come mid-upload.
            if i % 32 == 31 {
                std::thread::sleep(Duration::from_millis(50));
            }
            w.write_all(&chunk)?;
        }
        Ok::<(), std::io::Error>(())
    });
    // By now the server has answered and closed; read only afterwards.
    std::thread::sleep(Duration::from_millis(700));
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = Vec::new();
    let r = sock.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.starts_with("HTTP/1.1 507"),
        "read {r:?}, answer {text:?}"
    );
    let sent = writer.join().unwrap();
    assert!(sent.is_ok(), "the upload was reset: {sent:?}");
    server.stop();
}

#[test]
fn dead_props_with_long_names_and_quota() {
    if !require::programs(&["curl"]) {
        return;
    }
    let fs = mem_fs();
    let server = start(vec![Share::new("s", fs.clone())]);
    let u = url(server.local_addr(), "/s/f");
    assert_eq!(status(&["-u", A, "-T", "/dev/null", &u]), 201);
    let ns = format!("urn:{}", "n".repeat(400));
    let name = "p".repeat(200);
    let patch = format!(
        "<?xml version=\"1.0\"?><D:propertyupdate xmlns:D=\"DAV:\" xmlns:Z=\"{ns}\">\
         <D:set><D:prop><Z:{name}>value-42</Z:{name}></D:prop></D:set></D:propertyupdate>"
    );
    let (code, body, _) = curl(&["-u", A, "-X", "PROPPATCH", "-d", &patch, &u]);
    assert_eq!(code, 207, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("200 OK"));
    let find = format!(
        "<?xml version=\"1.0\"?><D:propfind xmlns:D=\"DAV:\" xmlns:Z=\"{ns}\">\
         <D:prop><Z:{name}/><D:quota-available-bytes/><D:quota-used-bytes/></D:prop></D:propfind>"
    );
    let (code, body, _) = curl(&["-u", A, "-X", "PROPFIND", "-H", "Depth: 0", "-d", &find, &u]);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(code, 207, "{text}");
    assert!(text.contains("value-42"), "{text}");
    assert!(text.contains("quota-available-bytes>"), "{text}");
    // Stored as a hashed xattr name within the 255-byte limit.
    let f = fs.lookup(ROOT_INO, b"f", &Cred::root()).unwrap();
    let names = fs.listxattr(f.ino, &Cred::root()).unwrap();
    assert_eq!(names.len(), 1);
    assert!(names[0].starts_with(tarn_webdav::PROP_XATTR_PREFIX) && names[0].len() <= 255);
    server.stop();
}

#[test]
fn set_shares_live_keeps_locks() {
    if !require::programs(&["curl"]) {
        return;
    }
    let fs_a = mem_fs();
    let fs_b = mem_fs();
    let server = start(vec![Share::new("a", fs_a.clone())]);
    let addr = server.local_addr();
    let fa = url(addr, "/a/f");
    assert_eq!(status(&["-u", A, "-T", "/dev/null", &fa]), 201);
    let lock = "<?xml version=\"1.0\"?><D:lockinfo xmlns:D=\"DAV:\"><D:lockscope><D:exclusive/>\
                </D:lockscope><D:locktype><D:write/></D:locktype></D:lockinfo>";
    assert_eq!(status(&["-u", A, "-X", "LOCK", "-d", lock, &fa]), 200);
    assert_eq!(status(&["-u", A, &url(addr, "/b/")]), 404);
    server
        .set_shares(vec![Share::new("a", fs_a.clone()), Share::new("b", fs_b)])
        .unwrap();
    assert_eq!(status(&["-u", A, &url(addr, "/b/")]), 200);
    // The lock on /a/f survived: a PUT without its token is refused.
    assert_eq!(status(&["-u", A, "-T", "/dev/null", &fa]), 423);
    server.set_shares(vec![Share::new("b", mem_fs())]).unwrap();
    assert_eq!(status(&["-u", A, &fa]), 404);
    assert!(matches!(
        server.set_shares(vec![Share::new("bad/name", mem_fs())]),
        Err(WebdavError::InvalidShare(_))
    ));
    server.stop();
}

#[test]
fn root_lists_shares_and_anonymous_mode() {
    if !require::programs(&["curl"]) {
        return;
    }
    let cfg = WebdavConfig::new("127.0.0.1:0".parse().unwrap());
    let server = serve(
        cfg,
        vec![Share::new("one", mem_fs()), Share::new("two", mem_fs())],
        Arc::new(Anonymous(principal(true))),
    )
    .unwrap();
    let addr = server.local_addr();
    let (code, body, _) = curl(&[&url(addr, "/")]);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(code, 200);
    assert!(text.contains("/one/") && text.contains("/two/"), "{text}");
    let (code, body, _) = curl(&["-X", "PROPFIND", "-H", "Depth: 1", &url(addr, "/")]);
    assert_eq!(code, 207);
    assert!(String::from_utf8_lossy(&body).contains("<D:href>/two/</D:href>"));
    // Autoindex: GET on a collection is an HTML listing.
    assert_eq!(
        status(&["-T", "/dev/null", &url(addr, "/one/hello.txt")]),
        201
    );
    let (code, body, _) = curl(&[&url(addr, "/one/")]);
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&body).contains("hello.txt"));
    server.stop();
}

#[test]
fn plain_http_refused_off_loopback() {
    let cfg = WebdavConfig::new("0.0.0.0:0".parse().unwrap());
    let r = serve(cfg.clone(), vec![], users());
    assert!(matches!(r, Err(WebdavError::PlainHttpRefused(_))));
    let mut cfg = cfg;
    cfg.allow_plain_http_non_loopback = true;
    let s = serve(cfg, vec![], users()).unwrap();
    s.stop();
}

#[cfg(feature = "tls")]
#[test]
fn tls_self_signed_is_generated_once() {
    use tarn_webdav::TlsConfig;
    if !require::programs(&["curl"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = WebdavConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.tls = Some(TlsConfig::SelfSigned {
        dir: dir.path().to_path_buf(),
        names: vec![],
    });
    let server = serve(cfg.clone(), vec![Share::new("s", mem_fs())], users()).unwrap();
    let fp = server.tls_fingerprint().unwrap().to_string();
    assert_eq!(fp.len(), 32 * 3 - 1);
    let port = server.local_addr().port();
    let https = format!("https://127.0.0.1:{port}/s/");
    assert_eq!(status(&["-k", "-u", A, &https]), 200);
    // Plain HTTP to the TLS port does not get through.
    assert_ne!(
        status(&["-u", A, &format!("http://127.0.0.1:{port}/s/")]),
        200
    );
    server.stop();
    // The key is private; a restart reuses the same certificate.
    use std::os::unix::fs::PermissionsExt;
    let key = dir.path().join("webdav-key.pem");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let server = serve(cfg, vec![], users()).unwrap();
    assert_eq!(server.tls_fingerprint(), Some(fp.as_str()));
    server.stop();
    if require::find("openssl").is_some() {
        let out = std::process::Command::new("openssl")
            .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
            .arg(dir.path().join("webdav-cert.pem"))
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(s.trim().ends_with(&fp), "{s} vs {fp}");
    }
    // A PEM pair given explicitly works too.
    let mut cfg2 = WebdavConfig::new("127.0.0.1:0".parse().unwrap());
    cfg2.tls = Some(TlsConfig::Pem {
        cert: dir.path().join("webdav-cert.pem"),
        key,
    });
    let server = serve(cfg2, vec![], users()).unwrap();
    assert_eq!(server.tls_fingerprint(), Some(fp.as_str()));
    server.stop();
    // A missing file is a clear error.
    let mut cfg3 = WebdavConfig::new("127.0.0.1:0".parse().unwrap());
    cfg3.tls = Some(TlsConfig::Pem {
        cert: dir.path().join("nope.pem"),
        key: dir.path().join("nope.pem"),
    });
    assert!(matches!(
        serve(cfg3, vec![], users()),
        Err(WebdavError::Tls(_))
    ));
}

#[cfg(not(feature = "tls"))]
#[test]
fn tls_without_the_feature_is_an_error() {
    let mut cfg = WebdavConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.tls = Some(tarn_webdav::TlsConfig::SelfSigned {
        dir: std::env::temp_dir(),
        names: vec![],
    });
    assert!(matches!(
        serve(cfg, vec![], users()),
        Err(WebdavError::Tls(_))
    ));
}

#[test]
fn snapshots_are_browsable_read_only() {
    if !require::programs(&["curl"]) {
        return;
    }
    let b = MemBackend::new();
    let fs = Arc::new(Fs::mount(b.clone()).unwrap());
    chown_root(fs.as_ref());
    put_bytes(
        fs.as_ref(),
        ROOT_INO,
        "v.txt",
        b"version-1",
        &Cred::user(UID, UID),
    );
    b.snapshot("monday").unwrap();
    let server = start(vec![Share::new("s", fs.clone())]);
    let addr = server.local_addr();
    assert_eq!(
        status(&["-u", A, "-T", "/dev/null", &url(addr, "/s/v.txt")]),
        204
    );
    let (code, body, _) = curl(&["-u", A, &url(addr, "/s/.snapshot/monday/v.txt")]);
    assert_eq!((code, body.as_slice()), (200, &b"version-1"[..]));
    let (code, body, _) = curl(&["-u", A, &url(addr, "/s/.snapshot/")]);
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&body).contains("monday"));
    let snap = url(addr, "/s/.snapshot/monday/v.txt");
    assert_eq!(status(&["-u", A, "-T", "/dev/null", &snap]), 403);
    assert_eq!(status(&["-u", A, "-X", "DELETE", &snap]), 403);
    server.stop();
}

/// A memory filesystem whose root the test user may write, its backend,
/// and that user.
fn users_fs() -> (Arc<MemBackend>, Arc<Fs<MemBackend>>, Cred) {
    let b = MemBackend::new();
    let fs = Arc::new(Fs::mount(b.clone()).unwrap());
    chown_root(fs.as_ref());
    (b, fs, Cred::user(UID, UID))
}

/// The status of a COPY or MOVE (`m`) from `from` to `to`, as alice.
fn copy_or_move(addr: std::net::SocketAddr, m: &str, from: &str, to: &str) -> u16 {
    status(&[
        "-u",
        A,
        "-X",
        m,
        "-H",
        &format!("Destination: {}", url(addr, to)),
        &url(addr, from),
    ])
}

/// A MOVE or COPY onto an existing destination deletes it first (in the
/// library): what would fail after that is refused before it, and nothing
/// is lost. A destination holding the source, the share itself, and a
/// MOVE out of a snapshot (a restore by drag and drop) are refused; a COPY
/// from a snapshot restores.
#[test]
fn copy_and_move_never_delete_what_they_cannot_replace() {
    if !require::programs(&["curl"]) {
        return;
    }
    let (b, fs, me) = users_fs();
    let a = fs.mkdir(ROOT_INO, b"a", 0o755, 0, &me).unwrap();
    let ab = fs.mkdir(a.ino, b"b", 0o755, 0, &me).unwrap();
    put_bytes(fs.as_ref(), ab.ino, "deep.txt", b"deep", &me);
    put_bytes(fs.as_ref(), ROOT_INO, "report.txt", b"version-1", &me);
    b.snapshot("daily").unwrap();
    let live = put_bytes(fs.as_ref(), ROOT_INO, "report.txt", b"version-2", &me);
    let server = start(vec![Share::new("s", fs.clone())]);
    let addr = server.local_addr();
    let go = |m: &str, from: &str, to: &str| copy_or_move(addr, m, from, to);
    for m in ["MOVE", "COPY"] {
        assert_eq!(go(m, "/s/a/b", "/s/a"), 403, "{m} onto its own parent");
        assert_eq!(go(m, "/s/a/b/deep.txt", "/s/a"), 403);
        assert_eq!(go(m, "/s/report.txt", "/s/"), 403, "{m} onto the share");
        assert_eq!(go(m, "/s/a", "/s/a/b"), 403, "{m} into itself");
    }
    assert_eq!(
        go("MOVE", "/s/.snapshot/daily/report.txt", "/s/report.txt"),
        403
    );
    let deep = fs.lookup(ab.ino, b"deep.txt", &Cred::root()).unwrap();
    assert_eq!(fs.read(deep.ino, 0, 100).unwrap(), b"deep");
    assert_eq!(fs.read(live, 0, 100).unwrap(), b"version-2");
    // A COPY out of the snapshot restores it.
    assert_eq!(
        go("COPY", "/s/.snapshot/daily/report.txt", "/s/report.txt"),
        204
    );
    let (code, body, _) = curl(&["-u", A, &url(addr, "/s/report.txt")]);
    assert_eq!((code, body.as_slice()), (200, &b"version-1"[..]));
    server.stop();
}

/// A lock's token is no secret (PROPFIND lists it): UNLOCK ends only the
/// caller's own lock.
#[test]
fn only_the_lock_holder_unlocks() {
    if !require::programs(&["curl"]) {
        return;
    }
    let users = Arc::new(
        tarn_webdav::StaticUsers::new()
            .with_user("alice", "secret", principal(true))
            .with_user("bob", "builder", principal(true)),
    );
    let cfg = WebdavConfig::new("127.0.0.1:0".parse().unwrap());
    let server = serve(cfg, vec![Share::new("s", mem_fs())], users).unwrap();
    let addr = server.local_addr();
    let f = url(addr, "/s/plan.txt");
    assert_eq!(status(&["-u", A, "-T", "/dev/null", &f]), 201);
    let lock = "<?xml version=\"1.0\"?><D:lockinfo xmlns:D=\"DAV:\"><D:lockscope><D:exclusive/>\
                </D:lockscope><D:locktype><D:write/></D:locktype></D:lockinfo>";
    // -D -: the answer's header lines come first in what curl prints.
    let (code, head, _) = curl(&["-u", A, "-D", "-", "-X", "LOCK", "-d", lock, &f]);
    assert_eq!(code, 200);
    let head = String::from_utf8_lossy(&head).to_string();
    let token = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("lock-token")
                .then(|| v.trim().to_string())
        })
        .expect("a Lock-Token header");
    let unlock = |who: &str| {
        status(&[
            "-u",
            who,
            "-X",
            "UNLOCK",
            "-H",
            &format!("Lock-Token: {token}"),
            &f,
        ])
    };
    assert_eq!(unlock("bob:builder"), 403, "bob may not end alice's lock");
    assert_eq!(status(&["-u", "bob:builder", "-T", "/dev/null", &f]), 423);
    assert_eq!(unlock(A), 204);
    assert_eq!(status(&["-u", "bob:builder", "-T", "/dev/null", &f]), 204);
    server.stop();
}

/// A COPY or MOVE onto an existing file keeps the old file until the new
/// one is in place: a copy that runs out of room part way leaves the old
/// file as it was (and no part of the copy, nothing hidden beside it); one
/// that succeeds, or a move, leaves nothing of the old file behind.
#[test]
fn an_overwriting_copy_that_fails_keeps_the_old_file() {
    if !require::programs(&["curl"]) {
        return;
    }
    let (b, fs, me) = users_fs();
    let big: Vec<u8> = (0..(3u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    put_bytes(fs.as_ref(), ROOT_INO, "big.bin", &big, &me);
    put_bytes(fs.as_ref(), ROOT_INO, "keep.txt", b"the old contents", &me);
    put_bytes(fs.as_ref(), ROOT_INO, "moved.txt", b"moved in", &me);
    let server = start(vec![Share::new("s", fs.clone())]);
    let addr = server.local_addr();
    let go = |m: &str, from: &str, to: &str| copy_or_move(addr, m, from, to);
    let listing = || -> Vec<String> {
        fs.readdir(ROOT_INO, 0, 100)
            .unwrap()
            .into_iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .filter(|n| n != "." && n != "..")
            .collect()
    };
    let read = |name: &str| -> Vec<u8> {
        let a = fs.lookup(ROOT_INO, name.as_bytes(), &Cred::root()).unwrap();
        fs.read(a.ino, 0, 8 << 20).unwrap()
    };
    // Room for about half of the copy.
    b.set_budget(Some(b.used() + (3 << 19)), false);
    assert_eq!(go("COPY", "/s/big.bin", "/s/keep.txt"), 507);
    assert_eq!(read("keep.txt"), b"the old contents");
    let mut names = listing();
    names.sort();
    assert_eq!(names, vec!["big.bin", "keep.txt", "moved.txt"]);
    b.set_budget(None, false);
    assert_eq!(go("COPY", "/s/big.bin", "/s/keep.txt"), 204);
    assert!(read("keep.txt") == big);
    assert_eq!(go("MOVE", "/s/moved.txt", "/s/keep.txt"), 204);
    assert_eq!(read("keep.txt"), b"moved in");
    let mut names = listing();
    names.sort();
    assert_eq!(names, vec!["big.bin", "keep.txt"]);
    server.stop();
}
