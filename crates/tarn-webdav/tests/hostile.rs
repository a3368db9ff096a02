//! Hostile clients over raw sockets: malformed and truncated headers,
//! fragments, broken chunked bodies, panics inside a request, and
//! hundreds of idle and slow connections from several loopback
//! addresses (127.0.0.x) while a well-behaved client keeps working.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tarn_fs::testing::MemBackend;
use tarn_fs::{Backend, Fs, FsError, Store};
use tarn_testkit::net::{connect_from, idle_and_trickling, Trickle};
use tarn_webdav::{serve, Authenticator, Principal, Running, Share, WebdavConfig};

fn server_with(cfg: impl FnOnce(&mut WebdavConfig)) -> Running {
    let mut c = WebdavConfig::new("127.0.0.1:0".parse().unwrap());
    cfg(&mut c);
    serve(c, vec![Share::new("s", mem_fs())], users()).unwrap()
}

/// The cases the issue reported, and their relatives: each is 400 (not
/// a dropped connection), and the connection goes on serving.
#[test]
fn truncated_and_malformed_headers_are_400() {
    let r = server_with(|_| {});
    let mut c = Http::connect(r.local_addr());
    assert_eq!(c.call("PUT", "/s/f", &[], b"data").status, 201);
    let cases: &[(&str, &str)] = &[
        ("PUT", "If: <"),
        ("PUT", "If: (<"),
        ("PUT", "If: ([\""),
        ("DELETE", "If: (<opaquelocktoken:abc"),
        ("PROPPATCH", "If: <http://x/s/f> ([W/\""),
        ("LOCK", "If: (Not"),
        ("PUT", "If-Match: \""),
        ("PUT", "If-None-Match: W/\""),
        ("GET", "If-Range: \""),
        ("GET", "If-Match: \"a\" junk"),
        ("MOVE", "Destination: /s/dir/#frag"),
        ("COPY", "Destination: ftp://elsewhere/x"),
        ("COPY", r"Destination: http://h\s\x"),
        ("MOVE", r"Destination: http://h/s/x\..\..\sx\f2"),
        ("PROPFIND", "Depth: 2"),
        ("LOCK", "Timeout: Second-"),
        ("COPY", "Overwrite: maybe"),
    ];
    for (method, h) in cases {
        let mut extra = vec![*h];
        if matches!(*method, "COPY" | "MOVE") && !h.starts_with("Destination") {
            extra.push("Destination: /s/g");
        }
        let resp = c.call(method, "/s/f", &extra, b"");
        assert_eq!(resp.status, 400, "{method} with {h}: {}", resp.text());
    }
    // COPY and MOVE need a Destination.
    assert_eq!(c.call("MOVE", "/s/f", &[], b"").status, 400);
    // Still the same connection, and the file untouched.
    let got = c.call("GET", "/s/f", &[], b"");
    assert_eq!((got.status, got.body.as_slice()), (200, &b"data"[..]));
    // A well-formed If header still works: a wrong etag fails the
    // precondition.
    assert_eq!(
        c.call("PUT", "/s/f", &["If: ([\"nope\"])"], b"x").status,
        412
    );
}

#[test]
fn request_without_host_is_400() {
    let r = server_with(|_| {});
    let mut c = Http::connect(r.local_addr());
    c.send_raw(format!("GET /s/ HTTP/1.1\r\nAuthorization: {ALICE}\r\n\r\n").as_bytes());
    assert_eq!(c.read(false).unwrap().status, 400);
    let mut c = Http::connect(r.local_addr());
    c.send_raw(
        format!("GET /s/ HTTP/1.1\r\nHost: a\r\nHost: b\r\nAuthorization: {ALICE}\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(c.read(false).unwrap().status, 400, "two Host headers");
    // HTTP/1.0 has no Host requirement.
    let mut c = Http::connect(r.local_addr());
    c.send_raw(format!("GET /s/ HTTP/1.0\r\nAuthorization: {ALICE}\r\n\r\n").as_bytes());
    assert_eq!(c.read(false).unwrap().status, 200);
}

/// `DELETE /s/frag/#ment` must not delete `frag/` (what the fragment
/// stripped by the HTTP stack would leave).
#[test]
fn fragment_never_widens_a_delete() {
    let r = server_with(|_| {});
    let mut c = Http::connect(r.local_addr());
    assert_eq!(c.call("MKCOL", "/s/frag/", &[], b"").status, 201);
    assert_eq!(c.call("PUT", "/s/frag/keep", &[], b"k").status, 201);
    assert_eq!(c.call("DELETE", "/s/frag/#ment", &[], b"").status, 400);
    assert_eq!(c.call("DELETE", "/s/frag#ment", &[], b"").status, 400);
    // Pipelined behind a body, in one write.
    let mut two = format!(
        "PUT /s/frag/x HTTP/1.1\r\nHost: t\r\nAuthorization: {ALICE}\r\n\
         Content-Length: 5\r\n\r\nhello"
    )
    .into_bytes();
    two.extend_from_slice(
        format!("DELETE /s/frag/#y HTTP/1.1\r\nHost: t\r\nAuthorization: {ALICE}\r\n\r\n")
            .as_bytes(),
    );
    c.send_raw(&two);
    assert_eq!(c.read(false).unwrap().status, 201);
    assert_eq!(c.read(false).unwrap().status, 400);
    // The collection and its files are still there; an encoded '#' is an
    // ordinary character.
    assert_eq!(c.call("GET", "/s/frag/keep", &[], b"").status, 200);
    assert_eq!(c.call("DELETE", "/s/frag/%23ment", &[], b"").status, 404);
    assert_eq!(c.call("GET", "/s/frag/x", &[], b"").text(), "hello");
    assert_eq!(c.call("DELETE", "/s/frag/", &[], b"").status, 204);
}

#[test]
fn malformed_chunked_put_is_400() {
    let r = server_with(|_| {});
    let mut c = Http::connect(r.local_addr());
    c.send_raw(
        format!(
            "PUT /s/chunky HTTP/1.1\r\nHost: t\r\nAuthorization: {ALICE}\r\n\
             Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz-not-hex\r\n"
        )
        .as_bytes(),
    );
    let resp = c.read(false).unwrap();
    assert_eq!(resp.status, 400, "{}", resp.text());
    // A good chunked PUT works.
    let mut c = Http::connect(r.local_addr());
    c.send_raw(
        format!(
            "PUT /s/chunky HTTP/1.1\r\nHost: t\r\nAuthorization: {ALICE}\r\n\
             Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )
        .as_bytes(),
    );
    assert!(matches!(c.read(false).unwrap().status, 201 | 204));
}

#[test]
fn propfind_depth_infinity_is_403_finite_depth() {
    let r = server_with(|_| {});
    let mut c = Http::connect(r.local_addr());
    for target in ["/s/", "/"] {
        let resp = c.call("PROPFIND", target, &["Depth: infinity"], b"");
        assert_eq!(resp.status, 403, "{target}");
        assert!(
            resp.text().contains("propfind-finite-depth"),
            "{}",
            resp.text()
        );
    }
    assert_eq!(c.call("PROPFIND", "/s/", &["Depth: 1"], b"").status, 207);
}

/// COPY and MOVE to another share, or to a share whose name only starts
/// with this one's, are 502 and change nothing; within the share they
/// work, with a path or a full URL, encoded or not.
#[test]
fn copy_and_move_stay_in_their_share() {
    let r = server_with(|_| {});
    let mut c = Http::connect(r.local_addr());
    assert_eq!(c.call("PUT", "/s/f", &[], b"data").status, 201);
    assert_eq!(c.call("MKCOL", "/s/x", &[], b"").status, 201);
    for dest in ["/sx/f2", "/other/f2", "http://h/sx/f2", "/%73x/f2"] {
        let h = format!("Destination: {dest}");
        for m in ["COPY", "MOVE"] {
            let resp = c.call(m, "/s/f", &[&h], b"");
            assert_eq!(resp.status, 502, "{m} to {dest}: {}", resp.text());
        }
    }
    assert_eq!(c.call("GET", "/s/x/f2", &[], b"").status, 404);
    assert_eq!(c.call("GET", "/s/f", &[], b"").body, b"data");
    for (i, dest) in ["/s/x/f2", "http://h/s/x/f3", "/%73/x/f4"]
        .iter()
        .enumerate()
    {
        let h = format!("Destination: {dest}");
        assert_eq!(c.call("COPY", "/s/f", &[&h], b"").status, 201, "{dest}");
        let got = c.call("GET", &format!("/s/x/f{}", i + 2), &[], b"");
        assert_eq!(got.body, b"data", "{dest}");
    }
}

/// Files dated before 1970 or after 9999 (SMB and FUSE clients set such
/// times) are listed and served with the nearest date HTTP can say,
/// instead of failing (the library's date formatting panics outside
/// those years).
#[test]
fn files_dated_outside_http_dates_are_served() {
    let fs = mem_fs();
    let r = serve(
        WebdavConfig::new("127.0.0.1:0".parse().unwrap()),
        vec![Share::new("s", fs.clone())],
        users(),
    )
    .unwrap();
    let mut c = Http::connect(r.local_addr());
    let root = tarn_fs::Cred::root();
    for (name, sec) in [("old", -11_644_473_600i64), ("far", 400_000_000_000)] {
        assert_eq!(
            c.call("PUT", &format!("/s/{name}"), &[], b"when").status,
            201
        );
        let ino = fs
            .lookup(tarn_fs::ROOT_INO, name.as_bytes(), &root)
            .unwrap()
            .ino;
        let t = tarn_fs::TimeSet::At(tarn_fs::Timestamp::new(sec, 0));
        let sa = tarn_fs::SetAttr {
            mtime: Some(t),
            atime: Some(t),
            ..Default::default()
        };
        fs.setattr(ino, &sa, &root).unwrap();
        let got = c.call("GET", &format!("/s/{name}"), &[], b"");
        assert_eq!(got.status, 200, "{name}: {}", got.text());
        assert_eq!(got.body, b"when");
        let one = c.call("PROPFIND", &format!("/s/{name}"), &["Depth: 0"], b"");
        assert_eq!(one.status, 207, "{name}: {}", one.text());
    }
    let all = c.call("PROPFIND", "/s/", &["Depth: 1"], b"");
    assert_eq!(all.status, 207);
    let text = all.text();
    assert!(text.contains("/s/old") && text.contains("/s/far"), "{text}");
    assert!(text.contains("1970") && text.contains("9999"), "{text}");
}

/// XML bodies nested tens of thousands deep (within the 64 KiB limit)
/// would overflow a worker's stack in any tree-building parser and kill
/// the process; each is a 400, and the server goes on serving. So is a
/// PROPFIND naming more properties than any client needs.
#[test]
fn deeply_nested_xml_and_huge_property_lists_are_400() {
    let r = server_with(|_| {});
    let mut c = Http::connect(r.local_addr());
    assert_eq!(c.call("PUT", "/s/f", &[], b"data").status, 201);
    // Only opening tags, as an attacker would send them: a recursive
    // parser descends through all of them before it finds the body
    // unfinished.
    let deep = |root: &str| -> Vec<u8> {
        let mut b = format!(r#"<?xml version="1.0"?><D:{root} xmlns:D="DAV:">"#);
        b.push_str(&"<a>".repeat(21_000));
        b.into_bytes()
    };
    for (method, root) in [
        ("PROPFIND", "propfind"),
        ("PROPPATCH", "propertyupdate"),
        ("LOCK", "lockinfo"),
    ] {
        let body = deep(root);
        assert!(body.len() < 64 << 10);
        let resp = c.call(method, "/s/f", &["Depth: 0"], &body);
        assert_eq!(resp.status, 400, "{method}: {}", resp.text());
        assert!(resp.text().contains("nested too deeply"), "{}", resp.text());
    }
    let many: String = (0..1000).map(|i| format!("<x:p{i}/>")).collect();
    let ask = format!(
        r#"<?xml version="1.0"?><D:propfind xmlns:D="DAV:" xmlns:x="urn:x"><D:prop>{many}</D:prop></D:propfind>"#
    );
    let resp = c.call("PROPFIND", "/s/f", &["Depth: 0"], ask.as_bytes());
    assert_eq!(resp.status, 400, "{}", resp.text());
    // Repeats count, and so do names under a `prop` of another namespace.
    let same = "<D:getetag/>".repeat(1000);
    let foreign: String = (0..1000).map(|i| format!("<x:p{i}/>")).collect();
    for body in [
        format!(
            r#"<?xml version="1.0"?><D:propfind xmlns:D="DAV:"><D:prop>{same}</D:prop></D:propfind>"#
        ),
        format!(
            r#"<?xml version="1.0"?><D:propfind xmlns:D="DAV:" xmlns:x="urn:x"><x:prop>{foreign}</x:prop></D:propfind>"#
        ),
    ] {
        let resp = c.call("PROPFIND", "/s/f", &["Depth: 0"], body.as_bytes());
        assert_eq!(resp.status, 400, "{}", resp.text());
    }
    // An ordinary PROPFIND still works, on the same connection.
    let ask = br#"<?xml version="1.0"?><D:propfind xmlns:D="DAV:"><D:prop><D:getcontentlength/></D:prop></D:propfind>"#;
    assert_eq!(c.call("PROPFIND", "/s/f", &["Depth: 0"], ask).status, 207);
    assert_eq!(c.call("GET", "/s/f", &[], b"").body, b"data");
}

/// A removed dead property, and a live one the resource lacks, are
/// reported in a 404 propstat, not left out.
#[test]
fn propfind_reports_missing_properties_with_404() {
    let r = server_with(|_| {});
    let mut c = Http::connect(r.local_addr());
    assert_eq!(c.call("PUT", "/s/f", &[], b"data").status, 201);
    let set = br#"<?xml version="1.0"?><D:propertyupdate xmlns:D="DAV:" xmlns:x="urn:x"><D:set><D:prop><x:color>red</x:color><x:size>big</x:size></D:prop></D:set></D:propertyupdate>"#;
    assert_eq!(c.call("PROPPATCH", "/s/f", &[], set).status, 207);
    let remove = br#"<?xml version="1.0"?><D:propertyupdate xmlns:D="DAV:" xmlns:x="urn:x"><D:remove><D:prop><x:color/></D:prop></D:remove></D:propertyupdate>"#;
    assert_eq!(c.call("PROPPATCH", "/s/f", &[], remove).status, 207);
    let ask = br#"<?xml version="1.0"?><D:propfind xmlns:D="DAV:" xmlns:x="urn:x"><D:prop><x:color/><x:size/><D:getcontentlength/></D:prop></D:propfind>"#;
    let resp = c.call("PROPFIND", "/s/f", &["Depth: 0"], ask);
    assert_eq!(resp.status, 207);
    let doc = xmltree::Element::parse(resp.body.as_slice()).expect("well-formed");
    let statuses = props_by_status(&doc);
    assert!(
        statuses.contains(&("urn:x color".to_string(), "404".to_string())),
        "{statuses:?}\n{}",
        resp.text()
    );
    assert!(statuses.contains(&("urn:x size".to_string(), "200".to_string())));
    // Depth 1 over the collection: getcontentlength of the collection
    // itself is 404, the file's is 200.
    let resp = c.call("PROPFIND", "/s/", &["Depth: 1"], ask);
    let doc = xmltree::Element::parse(resp.body.as_slice()).expect("well-formed");
    let statuses = props_by_status(&doc);
    assert!(statuses.contains(&("DAV: getcontentlength".to_string(), "404".to_string())));
    assert!(statuses.contains(&("DAV: getcontentlength".to_string(), "200".to_string())));
}

/// (namespace + name, status code) of every property in a multistatus.
fn props_by_status(doc: &xmltree::Element) -> Vec<(String, String)> {
    let kids = |e: &xmltree::Element| -> Vec<xmltree::Element> {
        e.children
            .iter()
            .filter_map(|c| c.as_element().cloned())
            .collect()
    };
    let mut out = Vec::new();
    for resp in kids(doc) {
        for ps in kids(&resp).into_iter().filter(|e| e.name == "propstat") {
            let status = kids(&ps)
                .into_iter()
                .find(|e| e.name == "status")
                .and_then(|s| s.get_text().map(|t| t.to_string()))
                .unwrap_or_default();
            let code = status.split_whitespace().nth(1).unwrap_or("").to_string();
            for prop in kids(&ps).into_iter().filter(|e| e.name == "prop") {
                for p in kids(&prop) {
                    let ns = p.namespace.clone().unwrap_or_default();
                    out.push((format!("{ns} {}", p.name), code.clone()));
                }
            }
        }
    }
    out
}

/// An authenticator whose anonymous() panics: a panic on the request's
/// own task.
struct PanicAuth;

impl Authenticator for PanicAuth {
    fn check(&self, user: &str, password: &str) -> Option<Principal> {
        if user == "boom" {
            panic!("deliberate panic in a password check");
        }
        users().check(user, password)
    }
    fn anonymous(&self) -> Option<Principal> {
        panic!("deliberate panic in a test authenticator");
    }
}

/// A backend that panics while `armed`: a panic in a filesystem call.
struct PanicBackend {
    inner: Arc<MemBackend>,
    armed: Arc<AtomicBool>,
}

impl Backend for PanicBackend {
    fn txn<R>(
        &self,
        write: bool,
        f: &mut dyn FnMut(&mut dyn Store) -> Result<R, FsError>,
    ) -> Result<R, FsError> {
        if self.armed.load(Ordering::Relaxed) {
            panic!("deliberate panic in a test backend");
        }
        self.inner.txn(write, f)
    }
    fn sync(&self) -> Result<(), FsError> {
        self.inner.sync()
    }
    fn snapshots(&self) -> Result<Vec<(String, Arc<Self>)>, FsError> {
        Ok(vec![])
    }
}

/// Panics inside a request are answered 500; the server goes on.
#[test]
fn panics_are_caught_per_request_and_answered_500() {
    let armed = Arc::new(AtomicBool::new(false));
    let fs = Arc::new(
        Fs::mount(Arc::new(PanicBackend {
            inner: MemBackend::new(),
            armed: armed.clone(),
        }))
        .unwrap(),
    );
    chown_root(fs.as_ref());
    let cfg = WebdavConfig::new("127.0.0.1:0".parse().unwrap());
    let r = serve(cfg, vec![Share::new("s", fs)], Arc::new(PanicAuth)).unwrap();
    for _ in 0..3 {
        let mut c = Http::connect(r.local_addr());
        c.send_raw(b"GET /s/ HTTP/1.1\r\nHost: t\r\n\r\n");
        assert_eq!(
            c.read(false).unwrap().status,
            500,
            "panic on the request task"
        );
    }
    // A password check that panics is a failed login.
    let mut c = Http::connect(r.local_addr());
    c.send_raw(b"GET /s/ HTTP/1.1\r\nHost: t\r\nAuthorization: Basic Ym9vbTp4\r\n\r\n");
    assert_eq!(c.read(false).unwrap().status, 401);
    let mut c = Http::connect(r.local_addr());
    assert_eq!(c.call("PUT", "/s/f", &[], b"x").status, 201);
    armed.store(true, Ordering::Relaxed);
    assert_eq!(
        c.call("GET", "/s/f", &[], b"").status,
        500,
        "panic in a filesystem call"
    );
    armed.store(false, Ordering::Relaxed);
    // (dav-server closes the connection after a 500.)
    let mut c = Http::connect(r.local_addr());
    assert_eq!(c.call("GET", "/s/f", &[], b"").status, 200);
}

/// What a trickling connection sends: a request head, then one byte of a
/// header every 100 ms, never finishing it.
fn trickle() -> Trickle {
    Trickle::new(b"GET /s/ HTTP/1.1\r\nHost: t\r\nX-Slow: ", b"a")
}

/// Hundreds of connection attempts, half idle and half trickling a
/// request head: 100 each from two addresses (held to 16 each by the
/// per-address limit) and 15 each from four more (filling the table, so
/// idle ones are evicted — from the two big holders first). Meanwhile a
/// good client makes 100 requests and opens a new connection every 10:
/// it finishes well within the stated bound, and slow heads are cut at
/// the header timeout.
#[test]
fn idle_and_slow_connections_do_not_lock_out_a_good_client() {
    const BOUND: Duration = Duration::from_secs(20);
    let r = server_with(|c| {
        c.max_connections = 64;
        c.max_connections_per_address = 16;
        c.header_read_timeout = Duration::from_secs(2);
    });
    let addr = r.local_addr();
    let mut setup = Http::connect(addr);
    assert_eq!(setup.call("PUT", "/s/f", &[], b"payload").status, 201);
    drop(setup);

    let stop = Arc::new(AtomicBool::new(false));
    let big = (0..200u32).map(|i| 2 + (i % 2) as u8);
    let small = (0..60u32).map(|i| 4 + (i % 4) as u8);
    let from = big.chain(small).map(|last| [127, 0, 0, last]).collect();
    let attackers = idle_and_trickling(addr, from, trickle(), stop.clone());
    let start = Instant::now();
    let mut c = Http::connect(addr);
    for i in 0..100 {
        if i % 10 == 9 {
            c = Http::connect(addr);
        }
        let resp = c.call("GET", "/s/f", &[], b"");
        assert_eq!(
            (resp.status, resp.text().as_str()),
            (200, "payload"),
            "request {i}"
        );
        assert!(r.stats().open <= 64, "{:?}", r.stats());
    }
    let took = start.elapsed();
    assert!(took < BOUND, "good client took {took:?}");
    // A slow head is cut at the header timeout (2 s), whatever it sends.
    let mut slow = Http::new(connect_from([127, 0, 0, 9], addr).unwrap());
    let stop_one = Arc::new(AtomicBool::new(false));
    let t = trickle().start(vec![slow.stream().try_clone().unwrap()], stop_one.clone());
    let cut = Instant::now();
    assert!(slow.closed_within(Duration::from_secs(10)), "slow head cut");
    assert!(
        cut.elapsed() < Duration::from_secs(8),
        "{:?}",
        cut.elapsed()
    );
    stop_one.store(true, Ordering::Relaxed);
    t.join().unwrap();

    stop.store(true, Ordering::Relaxed);
    attackers.join().unwrap();
    let st = r.stats();
    eprintln!("{st:?}");
    assert!(st.refused_per_address > 0, "{st:?}");
    assert!(st.evicted > 0, "{st:?}");
}

/// The per-address limit refuses only the address that reached it (503
/// on plain HTTP); the global limit evicts an idle connection rather
/// than refuse a newcomer; a kept-alive idle connection is closed at the
/// header timeout.
#[test]
fn connection_limits_and_idle_keep_alive() {
    let r = server_with(|c| {
        c.max_connections = 4;
        c.max_connections_per_address = 2;
        c.header_read_timeout = Duration::from_secs(2);
    });
    let addr = r.local_addr();
    let mut a1 = Http::new(connect_from([127, 0, 0, 2], addr).unwrap());
    let _a2 = Http::new(connect_from([127, 0, 0, 2], addr).unwrap());
    let mut a3 = Http::new(connect_from([127, 0, 0, 2], addr).unwrap());
    let resp = a3.read(false).expect("an answer before the close");
    assert_eq!(resp.status, 503);
    assert!(a3.closed_within(Duration::from_secs(5)));
    let mut b = Http::new(connect_from([127, 0, 0, 3], addr).unwrap());
    assert_eq!(
        b.call("GET", "/s/", &[], b"").status,
        200,
        "others unaffected"
    );
    let _b2 = Http::new(connect_from([127, 0, 0, 3], addr).unwrap());
    // Full (4): a newcomer from a third address evicts an idle one.
    let mut c = Http::new(connect_from([127, 0, 0, 4], addr).unwrap());
    assert_eq!(
        c.call("GET", "/s/", &[], b"").status,
        200,
        "newcomer served"
    );
    assert_eq!(r.stats().evicted, 1);
    // Kept alive but idle: closed at the header timeout.
    let t = Instant::now();
    assert!(c.closed_within(Duration::from_secs(10)));
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    drop(a1.stream().flush());
}

/// A client that stops reading a download holds a request that never
/// ends: while it takes the answer it keeps its slot, but once it has
/// taken nothing for a while it counts as idle and a newcomer evicts it,
/// instead of being turned away for as long as the client likes.
#[test]
fn a_client_that_stops_reading_a_download_can_be_evicted() {
    let r = server_with(|c| {
        c.max_connections = 1;
        c.max_connections_per_address = 1;
    });
    let addr = r.local_addr();
    let big = vec![7u8; 48 << 20];
    let mut up = Http::new(connect_from([127, 0, 0, 2], addr).unwrap());
    let put = up.call("PUT", "/s/big", &[], &big);
    assert!(matches!(put.status, 201 | 204), "{}", put.status);
    drop(up);

    let mut stalled = Http::new(connect_from([127, 0, 0, 3], addr).unwrap());
    stalled.send("GET", "/s/big", &[], b"");
    std::thread::sleep(Duration::from_millis(300));
    // (The upload's connection, if still closing, made room for it.)
    let evicted = r.stats().evicted;
    let t0 = Instant::now();
    let mut refused = 0;
    loop {
        let mut c = Http::new(connect_from([127, 0, 0, 4], addr).unwrap());
        c.send("GET", "/s/", &[], b"");
        match c.read(false) {
            Ok(resp) if resp.status == 200 => break,
            _ => refused += 1,
        }
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "the stalled download kept its slot"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(refused > 0, "the download was busy at first");
    assert!(stalled.closed_within(Duration::from_secs(10)));
    assert_eq!(
        r.stats().evicted,
        evicted + 1,
        "the stalled download made room"
    );
}

/// A file someone put on a share (`.html`, `.svg`, or HTML under another
/// name) cannot run script on the server's origin when a browser opens
/// it: every GET or HEAD of a share's file or folder comes with a
/// sandboxing Content-Security-Policy and `nosniff`.
#[test]
fn files_opened_in_a_browser_cannot_run_script() {
    let r = server_with(|_| {});
    let mut c = Http::connect(r.local_addr());
    let page = b"<html><script>fetch('/s/', {method: 'DELETE'})</script></html>";
    for name in ["x.html", "x.svg", "x.bin"] {
        let put = c.call("PUT", &format!("/s/{name}"), &[], page);
        assert_eq!(put.status, 201, "{name}");
        for method in ["GET", "HEAD"] {
            let got = c.call(method, &format!("/s/{name}"), &[], b"");
            assert_eq!(got.status, 200, "{method} {name}");
            let csp = got.header("content-security-policy").unwrap_or_default();
            assert!(
                csp.contains("sandbox") && csp.contains("default-src 'none'"),
                "{method} {name}: {csp:?}"
            );
            assert_eq!(got.header("x-content-type-options"), Some("nosniff"));
        }
    }
    let listing = c.call("GET", "/s/", &[], b"");
    assert_eq!(listing.status, 200);
    assert!(listing.text().contains("x.html"), "{}", listing.text());
    let csp = listing
        .header("content-security-policy")
        .unwrap_or_default();
    assert!(csp.contains("sandbox"), "{csp:?}");
}
