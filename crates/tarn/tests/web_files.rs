//! The web page's file pages and share links against a real daemon,
//! over plain HTTP on loopback with a raw client (so a request can be cut
//! off anywhere): no credentials → 401; a user sees their own shares
//! only; changing requests need the CSRF token; an upload interrupted at
//! random points resumes to the exact bytes and no partial file is ever
//! visible under its name (nor over WebDAV); folders download as a ZIP
//! that Python's zipfile checks; previous versions come from snapshots
//! and restore; share links stay inside their folder (`..`, encoded
//! slashes, symbolic links), honour passwords and upload-only, and stop
//! when revoked or expired.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;

use common::clients::{add_user, base64};
use common::process::Daemon;
use serde_json::{json, Value};

struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    /// The `name=value` of the cookie it sets.
    fn cookie(&self) -> String {
        self.head
            .lines()
            .find_map(|l| l.strip_prefix("set-cookie: "))
            .and_then(|c| c.split(';').next())
            .unwrap()
            .to_string()
    }
    fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }
}

/// Decodes a chunked body.
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let n = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 2 + n + 2..];
    }
}

fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&out[..split]).to_lowercase();
    let mut body = out[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    Answer { status, head, body }
}

/// A logged-in browser.
struct Browser {
    port: u16,
    cookie: String,
    csrf: String,
}

impl Browser {
    fn login(port: u16, user: &str, password: &str) -> Browser {
        let body = json!({"user": user, "password": password}).to_string();
        let a = http(
            port,
            "POST",
            "/api/login",
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        );
        assert_eq!(a.status, 200, "login {user}");
        let cookie = a.cookie();
        Browser {
            port,
            cookie,
            csrf: a.json()["csrf"].as_str().unwrap().to_string(),
        }
    }

    fn get(&self, path: &str) -> Answer {
        http(self.port, "GET", path, &[("Cookie", &self.cookie)], b"")
    }

    fn send(&self, method: &str, path: &str, ctype: &str, body: &[u8]) -> Answer {
        http(
            self.port,
            method,
            path,
            &[
                ("Cookie", &self.cookie),
                ("X-CSRF-Token", &self.csrf),
                ("Content-Type", ctype),
            ],
            body,
        )
    }

    fn post(&self, path: &str, v: Value) -> Answer {
        self.send("POST", path, "application/json", v.to_string().as_bytes())
    }

    fn op(&self, v: Value) -> Answer {
        self.post("/api/files-op", v)
    }

    fn call(&self, method: &str, v: Value) -> Answer {
        self.post(&format!("/api/call/{method}"), v)
    }

    fn names(&self, path: &str) -> Vec<String> {
        let a = self.get(path);
        assert_eq!(
            a.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&a.body)
        );
        let mut n: Vec<String> = a.json()["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect();
        n.sort();
        n
    }

    /// Uploads `data` as `name` into `dir` of `share` in one piece.
    fn upload(&self, share: &str, dir: &str, name: &str, data: &[u8]) -> Value {
        let a = self.post(
            "/api/upload",
            json!({"share": share, "path": dir, "name": name, "size": data.len()}),
        );
        assert_eq!(a.status, 200, "{:?}", a.json());
        let id = a.json()["id"].as_str().unwrap().to_string();
        let a = http(
            self.port,
            "PUT",
            &format!("/api/upload/{id}"),
            &[
                ("Cookie", &self.cookie),
                ("X-CSRF-Token", &self.csrf),
                ("Content-Type", "application/octet-stream"),
                ("Upload-Offset", "0"),
            ],
            data,
        );
        assert_eq!(a.status, 200, "{:?}", a.json());
        a.json()
    }
}

fn png(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 7]));
    let mut out = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

/// A small deterministic generator (the seed is printed to replay).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Sends the head of a chunk PUT and `sent` of its `len` bytes, then
/// ends the connection.
fn cut_put(b: &Browser, id: &str, offset: u64, data: &[u8], sent: usize) {
    let mut s = TcpStream::connect(("127.0.0.1", b.port)).unwrap();
    let head = format!(
        "PUT /api/upload/{id} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nCookie: {}\r\n\
         X-CSRF-Token: {}\r\nContent-Type: application/octet-stream\r\n\
         Upload-Offset: {offset}\r\nContent-Length: {}\r\n\r\n",
        b.port,
        b.cookie,
        b.csrf,
        data.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&data[..sent]).unwrap();
    // The body ends early (as when a phone loses its network); the
    // answer, read to the end, says the server is done with the chunk.
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
}

/// Where upload `id` stands once no chunk is arriving.
fn settled(b: &Browser, id: &str) -> u64 {
    for _ in 0..500 {
        let v = b.get(&format!("/api/upload/{id}")).json();
        if v["busy"] == false {
            return v["offset"].as_u64().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("upload {id} stayed busy");
}

/// A JSON POST without credentials (a visitor of a share link).
/// A daemon with the web page, WebDAV and a pool, where alice owns share
/// `a` (dataset `tank/a`, read-write): the daemon, the web and WebDAV ports.
fn alice_sharing_a(dir: &std::path::Path) -> (Daemon, u16, u16) {
    let (d, port, dav) = Daemon::with_web_and_pool(dir);
    d.ok(&["dataset", "create", "tank/a"]);
    add_user(&d, "alice", "alice-password");
    d.ok(&[
        "share", "add", "a", "tank/a", "--webdav", "alice=rw", "--owner", "alice",
    ]);
    (d, port, dav)
}

fn post_json(port: u16, path: &str, v: Value) -> Answer {
    http(
        port,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        v.to_string().as_bytes(),
    )
}

fn webdav_get(port: u16, path: &str, user: &str, password: &str) -> Answer {
    let auth = format!("Basic {}", base64(format!("{user}:{password}").as_bytes()));
    http(port, "GET", path, &[("Authorization", &auth)], b"")
}

#[test]
fn files_uploads_versions_and_share_links() {
    let dir = tempfile::tempdir().unwrap();
    let (d, port, dav) = Daemon::with_web_and_pool(dir.path());
    for ds in ["tank/a", "tank/b"] {
        d.ok(&["dataset", "create", ds]);
    }
    add_user(&d, "alice", "alice-password");
    add_user(&d, "bob", "bob-password-1");
    d.ok(&[
        "share", "add", "a", "tank/a", "--webdav", "alice=rw", "--webdav", "bob=ro", "--owner",
        "alice",
    ]);
    d.ok(&[
        "share", "add", "b", "tank/b", "--webdav", "bob=rw", "--owner", "bob",
    ]);

    // Without credentials: nothing.
    assert_eq!(http(port, "GET", "/api/files", &[], b"").status, 401);
    assert_eq!(
        http(port, "GET", "/api/files/a/?list", &[], b"").status,
        401
    );
    let alice = Browser::login(port, "alice", "alice-password");
    let bob = Browser::login(port, "bob", "bob-password-1");
    let shares = alice.get("/api/files").json();
    assert_eq!(shares, json!([{"name": "a", "writable": true}]));
    assert_eq!(alice.get("/api/files/b/?list").status, 404, "not alice's");

    // Folders; a changing request needs the CSRF token and this origin.
    assert_eq!(
        alice
            .op(json!({"op": "mkdir", "share": "a", "path": "docs"}))
            .status,
        200
    );
    assert_eq!(
        alice
            .op(json!({"op": "mkdir", "share": "a", "path": "pub"}))
            .status,
        200
    );
    assert_eq!(
        alice
            .op(json!({"op": "mkdir", "share": "a", "path": "secret"}))
            .status,
        200
    );
    let no_csrf = http(
        port,
        "POST",
        "/api/files-op",
        &[
            ("Cookie", &alice.cookie),
            ("Content-Type", "application/json"),
        ],
        json!({"op": "mkdir", "share": "a", "path": "x"})
            .to_string()
            .as_bytes(),
    );
    assert_eq!((no_csrf.status, no_csrf.code().as_str()), (403, "csrf"));
    let other_site = http(
        port,
        "POST",
        "/api/upload",
        &[
            ("Cookie", &alice.cookie),
            ("X-CSRF-Token", &alice.csrf),
            ("Origin", "https://evil.example"),
            ("Content-Type", "application/json"),
        ],
        json!({"share": "a", "path": "", "name": "x", "size": 1})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(
        (other_site.status, other_site.code().as_str()),
        (403, "origin")
    );
    let ro = bob.op(json!({"op": "mkdir", "share": "a", "path": "bobs"}));
    assert_eq!(ro.status, 403, "bob reads share a only");
    assert_eq!(alice.names("/api/files/a/?list"), ["docs", "pub", "secret"]);

    // A resumable upload, cut at random points.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("upload seed {seed}");
    let mut rng = Rng(seed);
    let data: Vec<u8> = (0..(3 << 20) + 12345).map(|_| rng.next() as u8).collect();
    let start = alice.post(
        "/api/upload",
        json!({"share": "a", "path": "docs", "name": "big.bin", "size": data.len()}),
    );
    assert_eq!(start.status, 200, "{:?}", start.json());
    let id = start.json()["id"].as_str().unwrap().to_string();
    let mut offset = 0u64;
    let mut cuts = 0;
    let mut rounds = 0;
    while offset < data.len() as u64 {
        rounds += 1;
        assert!(rounds < 200, "no progress");
        let len = (1 + rng.below(1 << 18)).min(data.len() as u64 - offset) as usize;
        let chunk = &data[offset as usize..offset as usize + len];
        if rng.below(2) == 0 {
            let sent = rng.below(len as u64) as usize;
            cut_put(&alice, &id, offset, chunk, sent);
            let now = settled(&alice, &id);
            assert!(
                now >= offset && now <= offset + sent as u64,
                "offset {now} after sending {sent} from {offset}"
            );
            offset = now;
            cuts += 1;
            // Never a partial file under its name, here or over WebDAV.
            assert!(!alice
                .names("/api/files/a/docs?list")
                .contains(&"big.bin".to_string()));
            assert_eq!(alice.get("/api/files/a/docs/big.bin").status, 404);
            assert_eq!(
                webdav_get(dav, "/a/docs/big.bin", "alice", "alice-password").status,
                404
            );
        } else {
            // A wrong offset is refused with the right one.
            let wrong = http(
                port,
                "PUT",
                &format!("/api/upload/{id}"),
                &[
                    ("Cookie", &alice.cookie),
                    ("X-CSRF-Token", &alice.csrf),
                    ("Upload-Offset", &(offset + 1).to_string()),
                ],
                b"x",
            );
            assert_eq!((wrong.status, wrong.code().as_str()), (409, "offset"));
            let a = http(
                port,
                "PUT",
                &format!("/api/upload/{id}"),
                &[
                    ("Cookie", &alice.cookie),
                    ("X-CSRF-Token", &alice.csrf),
                    ("Content-Type", "application/octet-stream"),
                    ("Upload-Offset", &offset.to_string()),
                ],
                chunk,
            );
            assert_eq!(a.status, 200, "{:?}", a.json());
            offset = a.json()["offset"].as_u64().unwrap();
            let done = a.json()["done"] == true;
            assert_eq!(done, offset == data.len() as u64);
            if !done {
                assert_eq!(alice.get("/api/files/a/docs/big.bin").status, 404);
            }
        }
    }
    eprintln!("{cuts} cut chunks in {rounds}");
    let got = alice.get("/api/files/a/docs/big.bin");
    assert_eq!(got.status, 200);
    assert!(got.body == data, "the uploaded bytes, exactly");
    let over_dav = webdav_get(dav, "/a/docs/big.bin", "alice", "alice-password");
    assert!(
        over_dav.status == 200 && over_dav.body == data,
        "the same bytes over WebDAV"
    );
    assert_eq!(
        alice.names("/api/files/a/docs?list"),
        ["big.bin"],
        "no temporaries shown"
    );
    // A range, as a video player asks.
    let r = http(
        port,
        "GET",
        "/api/files/a/docs/big.bin",
        &[("Cookie", &alice.cookie), ("Range", "bytes=100-199")],
        b"",
    );
    assert_eq!(r.status, 206);
    assert!(r.body == data[100..200]);
    // A resumed download: ranged while the file is the one the client
    // started (its tag), whole once it may have changed.
    let tag = r
        .head
        .lines()
        .find_map(|l| l.strip_prefix("etag: "))
        .unwrap()
        .trim()
        .to_string();
    let resume = |if_range: &str| {
        http(
            port,
            "GET",
            "/api/files/a/docs/big.bin",
            &[
                ("Cookie", &alice.cookie),
                ("Range", "bytes=100-"),
                ("If-Range", if_range),
            ],
            b"",
        )
    };
    let same = resume(&tag);
    assert_eq!(same.status, 206);
    assert!(same.body == data[100..]);
    let changed = resume("\"1-2.000000003-4\"");
    assert_eq!(changed.status, 200, "another file's tag: the whole file");
    assert!(changed.body == data);
    // Another user cannot continue or see alice's sessions.
    let s2 = alice.post(
        "/api/upload",
        json!({"share": "a", "path": "", "name": "n.txt", "size": 3}),
    );
    let id2 = s2.json()["id"].as_str().unwrap().to_string();
    assert_eq!(bob.get(&format!("/api/upload/{id2}")).status, 404);
    let exists = alice.post(
        "/api/upload",
        json!({"share": "a", "path": "docs", "name": "big.bin", "size": 3}),
    );
    assert_eq!(exists.status, 409, "no silent replacement");
    assert_eq!(
        alice
            .send(
                "DELETE",
                &format!("/api/upload/{id2}"),
                "application/json",
                b""
            )
            .status,
        200
    );

    // Two uploads of one name: the second to finish finds it taken,
    // keeps its bytes, and replaces it when asked to.
    let start = |b: &Browser| {
        let a = b.post(
            "/api/upload",
            json!({"share": "a", "path": "", "name": "late.txt", "size": 3}),
        );
        assert_eq!(a.status, 200, "{:?}", a.json());
        a.json()["id"].as_str().unwrap().to_string()
    };
    let (first, second) = (start(&alice), start(&alice));
    // A session's temporary is nobody's file meanwhile.
    let tmp = format!(".tarn-upload-{first}");
    assert_eq!(alice.get(&format!("/api/files/a/{tmp}")).status, 403);
    let mv = alice.op(json!({"op": "rename", "share": "a", "path": tmp, "to": "peek.txt"}));
    assert_eq!(mv.status, 403, "{:?}", mv.json());
    let chunk = |id: &str, offset: &str, body: &[u8], extra: &[(&str, &str)]| {
        let mut h = vec![
            ("Cookie", alice.cookie.as_str()),
            ("X-CSRF-Token", alice.csrf.as_str()),
            ("Upload-Offset", offset),
        ];
        h.extend_from_slice(extra);
        http(port, "PUT", &format!("/api/upload/{id}"), &h, body)
    };
    assert_eq!(chunk(&second, "0", b"two", &[]).status, 200);
    let clash = chunk(&first, "0", b"one", &[]);
    assert_eq!((clash.status, clash.code().as_str()), (409, "exists"));
    assert_eq!(
        alice.get(&format!("/api/upload/{first}")).json(),
        json!({"offset": 3, "size": 3, "busy": false}),
        "the bytes are kept"
    );
    let done = chunk(&first, "3", b"", &[("Upload-Replace", "true")]);
    assert_eq!(done.status, 200, "{:?}", done.json());
    assert_eq!(alice.get("/api/files/a/late.txt").body, b"one");
    assert_eq!(
        alice
            .op(json!({"op": "delete", "share": "a", "path": "late.txt"}))
            .status,
        200
    );

    // Files for the rest: a folder downloads as a checked ZIP.
    alice.upload("a", "pub", "hello.txt", b"hello, world\n");
    alice.upload("a", "pub", "photo.jpg", &[0xFF, 0xD8, 0xFF, 0xE0, 1, 2, 3]);
    alice.upload("a", "secret", "diary.txt", b"private\n");
    let z = alice.get("/api/files/a/pub?zip");
    assert_eq!(z.status, 200);
    assert!(
        z.head.contains("content-type: application/zip"),
        "{}",
        z.head
    );
    let zpath = dir.path().join("pub.zip");
    std::fs::write(&zpath, &z.body).unwrap();
    let py = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys,zipfile; z=zipfile.ZipFile(sys.argv[1]); assert z.testzip() is None; \
             print(sorted(z.namelist())); print(z.read('pub/hello.txt').decode(), end='')",
        ])
        .arg(&zpath)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&py.stdout);
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    assert_eq!(
        out,
        "['pub/', 'pub/hello.txt', 'pub/photo.jpg']\nhello, world\n"
    );
    // A stored page is never served as a page of this origin.
    alice.upload("a", "", "page.html", b"<script>alert(1)</script>");
    let page = alice.get("/api/files/a/page.html");
    assert!(
        page.head.contains("content-disposition: attachment"),
        "{}",
        page.head
    );
    assert!(page.head.contains("sandbox"), "{}", page.head);

    // Previous versions from snapshots, and restore.
    alice.upload("a", "docs", "note.txt", b"version one\n");
    d.ok(&["snapshot", "tank/a@one"]);
    assert_eq!(
        alice
            .op(json!({"op": "delete", "share": "a", "path": "docs/note.txt"}))
            .status,
        200
    );
    alice.upload("a", "docs", "note.txt", b"version two, longer\n");
    let v = alice.get("/api/files/a/docs/note.txt?versions").json();
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    assert_eq!(
        (v[0]["snapshot"].as_str(), v[0]["size"].as_u64()),
        (Some("one"), Some(12))
    );
    let bad =
        alice.op(json!({"op": "restore", "share": "a", "path": "docs/note.txt", "snapshot": ".."}));
    assert_eq!(bad.status, 400);
    let r = alice
        .op(json!({"op": "restore", "share": "a", "path": "docs/note.txt", "snapshot": "one"}));
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(
        alice.get("/api/files/a/docs/note.txt").body,
        b"version one\n"
    );
    // What the restore replaced is kept in a snapshot of its own.
    let kept = r.json()["kept_in"].as_str().unwrap().to_string();
    assert!(kept.starts_with("tank/a@restore-"), "{kept}");
    let snap = kept.split('@').nth(1).unwrap().to_string();
    let v = alice.get("/api/files/a/docs/note.txt?versions").json();
    let replaced = v
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["snapshot"] == snap.as_str())
        .unwrap_or_else(|| panic!("{v}"))
        .clone();
    assert_eq!(replaced["size"], 20, "the replaced version: {v}");
    // A folder: its files come back, newer ones stay.
    assert_eq!(
        alice
            .op(json!({"op": "delete", "share": "a", "path": "docs"}))
            .status,
        200
    );
    let r = alice.op(json!({"op": "restore", "share": "a", "path": "docs", "snapshot": "one"}));
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(
        alice.names("/api/files/a/docs?list"),
        ["big.bin", "note.txt"]
    );
    assert!(alice.get("/api/files/a/docs/big.bin").body == data);
    // A name that is a folder now and was a file then is kept, as a file
    // that was a folder is; the rest of the folder is restored.
    for path in ["docs/big.bin", "docs/note.txt"] {
        let del = alice.op(json!({"op": "delete", "share": "a", "path": path}));
        assert_eq!(del.status, 200);
    }
    let mk = alice.op(json!({"op": "mkdir", "share": "a", "path": "docs/big.bin"}));
    assert_eq!(mk.status, 200, "{:?}", mk.json());
    alice.upload("a", "docs", "note.txt", b"changed since\n");
    let r = alice.op(json!({"op": "restore", "share": "a", "path": "docs", "snapshot": "one"}));
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(
        alice.get("/api/files/a/docs/note.txt").body,
        b"version one\n"
    );
    assert_eq!(
        alice.names("/api/files/a/docs/big.bin?list"),
        [] as [&str; 0]
    );
    // Rename is a move, never over an existing name.
    let mv = alice
        .op(json!({"op": "rename", "share": "a", "path": "docs/note.txt", "to": "pub/hello.txt"}));
    assert_eq!(mv.status, 409);
    let mv =
        alice.op(json!({"op": "rename", "share": "a", "path": "docs/note.txt", "to": "note.txt"}));
    assert_eq!(mv.status, 200);
    assert_eq!(
        alice
            .op(json!({"op": "rename", "share": "a", "path": "docs", "to": "docs/inner"}))
            .status,
        400
    );

    // Thumbnails: made once, then from the cache, made again when the
    // file changes in place (through a mount, the same inode).
    alice.upload("a", "pub", "wide.png", &png(600, 300));
    let thumb = |b: &Browser| {
        let a = b.get("/api/files/a/pub/wide.png?thumb");
        assert_eq!(a.status, 200, "{:?}", a.json());
        assert!(a.head.contains("content-type: image/jpeg"), "{}", a.head);
        let img = image::load_from_memory(&a.body).unwrap();
        let how = if a.head.contains("x-thumbnail: cached") {
            "cached"
        } else {
            "made"
        };
        ((img.width(), img.height()), how)
    };
    assert_eq!(thumb(&alice), ((256, 128), "made"));
    assert_eq!(thumb(&alice), ((256, 128), "cached"));
    assert_eq!(thumb(&bob), ((256, 128), "cached"), "bob reads share a too");
    let not_image = alice.get("/api/files/a/pub/hello.txt?thumb");
    assert_eq!(
        (not_image.status, not_image.code().as_str()),
        (415, "no_thumbnail")
    );

    // A file rewritten in place with its size and mtime kept (as tools
    // that fix a photo's metadata do) has a new tag: a download resumed
    // with the old one gets the whole file, not old and new spliced.
    alice.upload("a", "pub", "same.bin", &[b'o'; 4096]);
    let tag_of = |path: &str| {
        let r = alice.get(path);
        assert_eq!(r.status, 200);
        let t = r.head.lines().find_map(|l| l.strip_prefix("etag: "));
        t.expect("a tag").trim().to_string()
    };
    let old_tag = tag_of("/api/files/a/pub/same.bin");

    // A symbolic link out of the linked folder, made through a mount.
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    d.ok(&["mount", "tank/a", mnt.to_str().unwrap()]);
    std::os::unix::fs::symlink("../secret", mnt.join("pub/escape")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", mnt.join("pub/passwd")).unwrap();
    // Temporaries of upload sessions a restart forgot: one two days old,
    // one fresh (a day must pass before a temporary counts as forgotten).
    std::fs::create_dir(mnt.join("stale")).unwrap();
    std::fs::set_permissions(
        mnt.join("stale"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let old_tmp = mnt.join("stale/.tarn-upload-00112233445566778899aabbccddeeff");
    let new_tmp = mnt.join("stale/.tarn-upload-ffeeddccbbaa99887766554433221100");
    std::fs::write(&old_tmp, b"half an upload").unwrap();
    std::fs::write(&new_tmp, b"half another").unwrap();
    let two_days_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 86_400);
    std::fs::File::options()
        .write(true)
        .open(&old_tmp)
        .unwrap()
        .set_modified(two_days_ago)
        .unwrap();
    let ino =
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(mnt.join("pub/wide.png")).unwrap());
    std::fs::write(mnt.join("pub/wide.png"), png(200, 400)).unwrap();
    let same =
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(mnt.join("pub/wide.png")).unwrap());
    assert_eq!(ino, same, "rewritten in place");
    let same_bin = mnt.join("pub/same.bin");
    let kept_mtime = std::fs::metadata(&same_bin).unwrap().modified().unwrap();
    let mut f = std::fs::File::options()
        .write(true)
        .open(&same_bin)
        .unwrap();
    f.write_all(&[b'n'; 4096]).unwrap();
    f.set_modified(kept_mtime).unwrap();
    drop(f);
    assert_eq!(
        std::fs::metadata(&same_bin).unwrap().modified().unwrap(),
        kept_mtime
    );
    // Only alice may read it now: her cached thumbnail is not bob's.
    std::fs::set_permissions(
        mnt.join("pub/wide.png"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    d.ok(&["unmount", mnt.to_str().unwrap()]);
    assert_ne!(tag_of("/api/files/a/pub/same.bin"), old_tag);
    let resumed = http(
        port,
        "GET",
        "/api/files/a/pub/same.bin",
        &[
            ("Cookie", &alice.cookie),
            ("Range", "bytes=100-"),
            ("If-Range", &old_tag),
        ],
        b"",
    );
    assert_eq!(resumed.status, 200, "the old tag: the whole file");
    assert!(resumed.body == [b'n'; 4096]);
    let del = alice.op(json!({"op": "delete", "share": "a", "path": "pub/same.bin"}));
    assert_eq!(del.status, 200);
    assert_eq!(
        thumb(&alice),
        ((128, 256), "made"),
        "the changed file's thumbnail"
    );
    let denied = bob.get("/api/files/a/pub/wide.png?thumb");
    assert_eq!(denied.status, 403, "bob may not read it, cached or not");

    // A read link to pub/, opened logged out.
    let made = alice.call("link.create", json!({"share": "a", "path": "pub"}));
    assert_eq!(made.status, 200, "{:?}", made.json());
    let token = made.json()["result"]["token"].as_str().unwrap().to_string();
    let link_id = made.json()["result"]["id"].as_str().unwrap().to_string();
    let anon = |p: &str| http(port, "GET", &format!("/s/{token}{p}"), &[], b"");
    assert_eq!(anon("").status, 200, "the page");
    assert_eq!(anon("/info").json()["upload"], false);
    let list = anon("/f/?list").json();
    let mut names: Vec<&str> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["escape", "hello.txt", "passwd", "photo.jpg", "wide.png"]
    );
    assert_eq!(anon("/f/hello.txt").body, b"hello, world\n");
    let t = anon("/f/wide.png?thumb&v=1");
    assert_eq!(t.status, 200, "thumbnails through a read link");
    assert!(t.head.contains("immutable"), "{}", t.head);
    for escape in [
        "/f/../secret/diary.txt",
        "/f/..%2fsecret/diary.txt",
        "/f/%2e%2e/secret/diary.txt",
        "/f/%2E%2E%2Fsecret%2Fdiary.txt",
        "/f/escape/diary.txt",
        "/f/escape?list",
        "/f/passwd",
        "/f/.snapshot",
    ] {
        let a = anon(escape);
        assert!(
            a.status == 400 || a.status == 403 || a.status == 404,
            "{escape}: {}",
            a.status
        );
        assert!(
            !String::from_utf8_lossy(&a.body).contains("private"),
            "{escape}"
        );
        assert!(
            !String::from_utf8_lossy(&a.body).contains("root:"),
            "{escape}"
        );
    }
    assert_eq!(anon("/f/escape/diary.txt").code(), "forbidden");
    // Read-only: no uploads through it.
    let up = post_json(
        port,
        &format!("/s/{token}/upload"),
        json!({"path": "", "name": "x", "size": 1}),
    );
    assert_eq!(up.status, 403);
    // Only the owner (or an administrator) sees and revokes it.
    let bobs = bob.call("link.list", json!({})).json();
    assert_eq!(bobs["result"], json!([]));
    assert_eq!(
        bob.call("link.revoke", json!({"name": link_id})).status,
        404
    );
    assert_eq!(
        alice.call("link.list", json!({})).json()["result"][0]["path"],
        "pub"
    );
    assert!(
        d.ok(&["link", "list"]).contains(&link_id),
        "the CLI lists links"
    );
    assert_eq!(
        alice.call("link.revoke", json!({"name": link_id})).status,
        200
    );
    assert_eq!(anon("/f/?list").status, 404, "revoked");
    assert_eq!(anon("/info").code(), "no_link");

    // Bob reads share a: no upload link there for him.
    let up = bob.call(
        "link.create",
        json!({"share": "a", "path": "pub", "upload": true}),
    );
    assert_eq!(up.status, 403, "{:?}", up.json());
    // Nor by naming the fields in order, which serde would read as
    // alice's own call (the rule that makes a link act as its maker looks
    // for the field by name).
    let ids = |b: &Browser| -> Vec<String> {
        b.call("link.list", json!({})).json()["result"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|l| l["id"].as_str())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    let alices = ids(&alice);
    let as_alice = bob.call(
        "link.create",
        json!(["a", "pub", true, null, null, "tank/alice"]),
    );
    assert!(
        as_alice.status == 400 || as_alice.status == 403,
        "{} {:?}",
        as_alice.status,
        as_alice.json()
    );
    assert_eq!(ids(&alice), alices, "no link was made in alice's name");
    let outside = alice.call("link.create", json!({"share": "a", "path": "pub/escape"}));
    assert!(
        outside.status == 400 || outside.status == 404,
        "{:?}",
        outside.json()
    );

    // A password, an expiry.
    let made = alice.call(
        "link.create",
        json!({"share": "a", "path": "pub", "password": "open sesame", "expires_in_secs": 3}),
    );
    let token2 = made.json()["result"]["token"].as_str().unwrap().to_string();
    let anon2 = |p: &str| http(port, "GET", &format!("/s/{token2}{p}"), &[], b"");
    assert_eq!(anon2("/info").json()["password"], true);
    assert_eq!(anon2("/f/?list").code(), "link_password");
    let unlock = |pw: &str| {
        post_json(
            port,
            &format!("/s/{token2}/unlock"),
            json!({"password": pw}),
        )
    };
    assert_eq!(unlock("wrong").status, 401);
    let ok = unlock("open sesame");
    assert_eq!(ok.status, 200);
    let cookie = ok.cookie();
    assert!(
        ok.head.contains(&format!("path=/s/{token2}/")),
        "{}",
        ok.head
    );
    let with = http(
        port,
        "GET",
        &format!("/s/{token2}/f/hello.txt"),
        &[("Cookie", &cookie)],
        b"",
    );
    assert_eq!(with.body, b"hello, world\n");
    std::thread::sleep(std::time::Duration::from_millis(3500));
    let late = http(
        port,
        "GET",
        &format!("/s/{token2}/f/hello.txt"),
        &[("Cookie", &cookie)],
        b"",
    );
    assert_eq!(
        (late.status, late.code().as_str()),
        (404, "no_link"),
        "expired"
    );

    // Upload-only: visitors add files, see nothing, replace nothing.
    let made = alice.call(
        "link.create",
        json!({"share": "a", "path": "pub", "upload": true}),
    );
    let token3 = made.json()["result"]["token"].as_str().unwrap().to_string();
    assert_eq!(
        http(port, "GET", &format!("/s/{token3}/f/?list"), &[], b"").status,
        403
    );
    assert_eq!(
        http(port, "GET", &format!("/s/{token3}/f/hello.txt"), &[], b"").status,
        403
    );
    let start = post_json(
        port,
        &format!("/s/{token3}/upload"),
        json!({"path": "", "name": "hello.txt", "size": 6}),
    );
    assert_eq!(start.status, 200, "{:?}", start.json());
    let id3 = start.json()["id"].as_str().unwrap().to_string();
    let put = http(
        port,
        "PUT",
        &format!("/s/{token3}/upload/{id3}"),
        &[("Upload-Offset", "0")],
        b"guest\n",
    );
    assert_eq!(put.status, 200, "{:?}", put.json());
    assert_eq!(put.json()["done"], true);
    assert!(
        put.json().get("name").is_none(),
        "visitors are not told which names are taken"
    );
    assert_eq!(
        alice.get("/api/files/a/pub/hello.txt").body,
        b"hello, world\n"
    );
    assert_eq!(
        alice.get("/api/files/a/pub/hello%20(2).txt").body,
        b"guest\n"
    );
    // Into its folder only: not below, and not above.
    let up = post_json(
        port,
        &format!("/s/{token3}/upload"),
        json!({"path": "sub", "name": "x", "size": 1}),
    );
    assert_eq!(up.status, 403);
    // The link cannot reach above its folder either.
    let up = post_json(
        port,
        &format!("/s/{token3}/upload"),
        json!({"path": "../secret", "name": "x", "size": 1}),
    );
    assert_eq!(up.status, 400);
    // An upload into the folder sweeps the forgotten temporary, and only
    // that one.
    alice.upload("a", "stale", "new.txt", b"new\n");
    d.ok(&["mount", "tank/a", mnt.to_str().unwrap()]);
    let mut left: Vec<String> = std::fs::read_dir(mnt.join("stale"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    left.sort();
    d.ok(&["unmount", mnt.to_str().unwrap()]);
    assert_eq!(
        left,
        [".tarn-upload-ffeeddccbbaa99887766554433221100", "new.txt"],
        "the two-day-old temporary is gone, the fresh one stays"
    );
    // Taking the share from its owner closes their links.
    d.ok(&["share", "add", "a", "tank/a", "--webdav", "bob=ro"]);
    let info3 = || http(port, "GET", &format!("/s/{token3}/info"), &[], b"").status;
    assert_eq!(info3(), 404);
    // Giving it back opens them again; deleting the user removes them: a
    // user added later under the same name does not inherit them.
    let give_back = || {
        d.ok(&[
            "share", "add", "a", "tank/a", "--webdav", "alice=rw", "--webdav", "bob=ro", "--owner",
            "alice",
        ])
    };
    give_back();
    assert_eq!(info3(), 200);
    d.ok(&["share", "add", "a", "tank/a", "--webdav", "bob=ro"]);
    d.ok(&["user", "del", "alice"]);
    add_user(&d, "alice", "another-alice");
    give_back();
    assert_eq!(info3(), 404, "the old alice's link stays closed");
    d.stop();
}

/// Downloads whose clients stop reading hold no thread the page needs:
/// with more of them stalled than the server has blocking threads, a
/// listing and a login still answer at once, and a whole download beside
/// them is whole.
/// A user's links share the user's limits: the unfinished uploads of
/// every visitor of every link count in the user's 64, so making links
/// does not let one user take the server's table of uploads; and a user
/// keeps at most 256 links.
/// A thumbnail is a picture of a file's plaintext: made from a photo in an
/// encrypted dataset, it goes when the key is unloaded (as the cached
/// blocks do), and is made again only once the key is back.
#[test]
fn thumbnails_of_an_encrypted_dataset_go_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let (d, port, _dav) = Daemon::with_web_and_pool(dir.path());
    let pass: &[u8] = b"a long passphrase for thumbnails\n";
    d.create_encrypted_with("tank/e", &[], pass);
    add_user(&d, "alice", "alice-password");
    d.ok(&[
        "share", "add", "e", "tank/e", "--webdav", "alice=rw", "--owner", "alice",
    ]);
    let alice = Browser::login(port, "alice", "alice-password");
    let mk = alice.op(json!({"op": "mkdir", "share": "e", "path": "pics"}));
    assert_eq!(mk.status, 200, "{:?}", mk.json());
    alice.upload("e", "pics", "p.png", &png(600, 300));
    let thumb = || {
        let a = alice.get("/api/files/e/pics/p.png?thumb");
        (a.status, a.head.contains("x-thumbnail: cached"))
    };
    assert_eq!(thumb(), (200, false));
    assert_eq!(thumb(), (200, true));
    d.ok(&["key", "unload", "tank/e"]);
    assert_ne!(thumb().0, 200, "a thumbnail of a locked dataset");
    let o = d.tarn_input(&["key", "load", "tank/e"], pass);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        thumb(),
        (200, false),
        "the thumbnail outlived the key's unload"
    );
    d.stop();
}

#[test]
fn links_do_not_multiply_what_a_user_may_hold() {
    let dir = tempfile::tempdir().unwrap();
    let (_d, port, _dav) = alice_sharing_a(dir.path());
    let alice = Browser::login(port, "alice", "alice-password");
    let link = || {
        let made = alice.call(
            "link.create",
            json!({"share": "a", "path": "", "upload": true}),
        );
        assert_eq!(made.status, 200, "{:?}", made.json());
        made.json()["result"]["token"].as_str().unwrap().to_string()
    };
    let (one, two) = (link(), link());
    let start = |token: &str, i: usize| {
        post_json(
            port,
            &format!("/s/{token}/upload"),
            json!({"path": "", "name": format!("f{i}"), "size": 1}),
        )
    };
    for i in 0..40 {
        assert_eq!(start(&one, i).status, 200, "upload {i}");
    }
    for i in 40..64 {
        assert_eq!(start(&two, i).status, 200, "upload {i}");
    }
    let over = start(&two, 64);
    assert_eq!(
        (over.status, over.code().as_str()),
        (429, "too_many_uploads"),
        "a second link gave more room"
    );
    let own = alice.post(
        "/api/upload",
        json!({"share": "a", "path": "", "name": "mine", "size": 1}),
    );
    assert_eq!(own.status, 429, "{:?}", own.json());

    for _ in 2..256 {
        link();
    }
    let made = alice.call("link.create", json!({"share": "a", "path": ""}));
    assert_ne!(made.status, 200, "a 257th link");
    assert!(
        made.json().to_string().contains("256 links"),
        "{:?}",
        made.json()
    );
}

#[test]
fn stalled_downloads_do_not_hold_up_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let (d, port, dav) = alice_sharing_a(dir.path());
    // 32 MiB: far more than the socket buffers and the server's queue
    // take before a download that is not read has to wait.
    let big: Vec<u8> = (0..32u32 << 20).map(|i| (i % 251) as u8).collect();
    let auth = format!("Basic {}", base64(b"alice:alice-password"));
    let put = http(dav, "PUT", "/a/big.bin", &[("Authorization", &auth)], &big);
    assert!(matches!(put.status, 201 | 204), "{}", put.status);
    let alice = Browser::login(port, "alice", "alice-password");
    let stalled: Vec<TcpStream> = (0..12)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let req = format!(
                "GET /api/files/a/big.bin HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {}\r\n\r\n",
                alice.cookie
            );
            s.write_all(req.as_bytes()).unwrap();
            s
        })
        .collect();
    // Let every download fill what it can and stall.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let probe = |path: &str| -> u16 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(15)))
            .unwrap();
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {}\r\nConnection: close\r\n\r\n",
            alice.cookie
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head)
            .unwrap_or_else(|e| panic!("{path} did not answer beside stalled downloads: {e}"));
        String::from_utf8_lossy(&head[9..12]).parse().unwrap()
    };
    assert_eq!(probe("/api/files/a/?list"), 200);
    assert_eq!(probe("/api/files"), 200);
    let again = Browser::login(port, "alice", "alice-password");
    assert_eq!(again.names("/api/files/a/?list"), ["big.bin"]);
    // One download read to the end is whole.
    assert_eq!(alice.get("/api/files/a/big.bin").body, big);
    drop(stalled);
    d.stop();
}

/// Share links and API tokens name their user by pool and name; a pool
/// exported and another made under its name later, with a user of the
/// same name, is someone else's: the old links and tokens open nothing
/// of it.
#[test]
fn links_and_tokens_stay_with_their_pool() {
    let dir = tempfile::tempdir().unwrap();
    let (d, port, _dav) = Daemon::with_web_and_pool(dir.path());
    let make_vault = |file: &str, password: &str| {
        let f = common::process::files(dir.path(), file, 1, 64 << 20);
        d.ok(&["pool", "create", "vault", &f[0]]);
        d.ok(&["dataset", "create", "vault/p"]);
        let out = common::clients::tarn_with_stdin(
            &d,
            &[
                "user",
                "add",
                "--pool",
                "vault",
                "--password-stdin",
                "alice",
            ],
            &format!("{password}\n"),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        d.ok(&[
            "share", "add", "p", "vault/p", "--webdav", "alice=rw", "--owner", "alice",
        ]);
    };
    make_vault("first", "first-alice-password");
    let alice = Browser::login(port, "alice", "first-alice-password");
    let made = alice.call("link.create", json!({"share": "p", "path": ""}));
    assert_eq!(made.status, 200, "{:?}", made.json());
    let link = made.json()["result"]["token"].as_str().unwrap().to_string();
    let token = d
        .ok(&["user", "token", "add", "--pool", "vault", "script", "alice"])
        .trim()
        .to_string();
    let bearer = format!("Bearer {token}");
    let with_token = || {
        http(
            port,
            "GET",
            "/api/files",
            &[("Authorization", bearer.as_str())],
            b"",
        )
    };
    let link_info = || http(port, "GET", &format!("/s/{link}/info"), &[], b"").status;
    assert_eq!(with_token().status, 200);
    assert_eq!(link_info(), 200);

    d.ok(&["pool", "export", "vault"]);
    assert_eq!(with_token().status, 401, "no pool, no user");
    assert_eq!(link_info(), 404);
    // Another pool under the name, with its own alice and share p.
    make_vault("second", "second-alice-password");
    assert_eq!(
        with_token().status,
        401,
        "the first pool's token acts as the second pool's alice"
    );
    assert_eq!(
        link_info(),
        404,
        "the first pool's link opens the second pool's share"
    );
    d.stop();
}
