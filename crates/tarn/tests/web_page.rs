//! The web page in a real browser (Debian's chromium, headless, driven
//! through the DevTools protocol): an administrator logs in, sees the
//! pool ONLINE with its devices, starts a scrub and watches its outcome
//! appear, takes a snapshot with a button; a phone-sized viewport shows
//! the page without horizontal scrolling; a user who logs in sees their
//! share and none of the administrator's sections. In the file pages a
//! user uploads a file through the page (read back over WebDAV; also
//! when its name is taken while it runs, and through a network outage), sees a
//! folder of photos as server-made thumbnails, restores a previous
//! version, and makes a share link that opens while logged out; those
//! pages fit a phone too. Screenshots of each view are saved as test
//! artifacts (in the target directory); the assertions are on the DOM,
//! not on pixels.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::browser::{Browser, Cdp, SHOWN};
use common::clients::add_user;
use common::process::{files, Daemon};
use serde_json::{json, Value};
use tarn_testkit::net::free_port;
use tarn_testkit::require;

#[test]
fn the_dashboard_in_a_real_browser() {
    if !require::programs(&["chromium"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let web = format!("127.0.0.1:{port}");
    // History points every 100 ms (a day point every 3 s) for the charts.
    let d = Daemon::start_env(
        dir.path(),
        &["--web", &web],
        &[("TARN_HISTORY_TICK_MS", "100")],
    );
    let f = files(dir.path(), "disk", 2, 128 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    d.ok(&["dataset", "create", "tank/photos"]);
    d.ok(&["dataset", "create", "tank/private"]);
    add_user(&d, "ada", "ada-password-1");
    d.ok(&["user", "admin", "ada", "on"]);
    add_user(&d, "alice", "alice-password");
    d.ok(&[
        "share",
        "add",
        "photos",
        "tank/photos",
        "--webdav",
        "alice=rw",
    ]);

    let browser = Browser::start();
    let mut page = browser.page();
    page.call("Page.enable", json!({}));
    page.call(
        "Page.navigate",
        json!({"url": format!("http://127.0.0.1:{port}/")}),
    );

    // The administrator: the pool, ONLINE, with both devices.
    page.log_in("ada", "ada-password-1");
    page.wait(
        "document.querySelector('#pools .pool[data-pool=\"tank\"]') !== null",
        "the pool card",
    );
    let card = page.eval("document.querySelector('#pools .pool[data-pool=\"tank\"]').innerText");
    let card = card.as_str().unwrap();
    assert!(card.contains("ONLINE"), "{card}");
    assert!(card.contains("disk0") && card.contains("disk1"), "{card}");
    assert_eq!(
        page.eval("document.querySelector('#who').innerText"),
        "ada (administrator)"
    );
    page.screenshot("dashboard");

    // Start a scrub with its button; its outcome appears on the page.
    page.eval(
        "[...document.querySelectorAll('#pools .pool[data-pool=\"tank\"] button')] \
         .find(b => b.innerText === 'Start scrub').click(); true",
    );
    page.wait(
        "/scrub (scanning|finished)/.test(document.querySelector('#pools .pool .scan').innerText)",
        "the scrub on the page",
    );
    let shares = page.eval("document.querySelector('#shares').innerText");
    assert!(
        shares.as_str().unwrap().contains("webdav alice=rw"),
        "the administrator sees who may use a share: {shares}"
    );
    let status = d.ok(&["pool", "status", "tank"]);
    assert!(status.contains("scrub"), "{status}");

    // A snapshot with a button, listed (the page refreshes by itself).
    page.eval(
        "[...document.querySelectorAll('#datasets tr')] \
         .find(r => r.cells[0] && r.cells[0].innerText === 'tank/photos') \
         .querySelector('button').click(); true",
    );
    page.wait(
        "document.querySelector('#datasets').innerText.includes('tank/photos@web-')",
        "the new snapshot",
    );
    let snaps = d.ok(&["dataset", "list", "-t", "snapshot"]);
    assert!(snaps.contains("tank/photos@web-"), "{snaps}");

    // Management: dialogs say yes, and prompts answer what the test sets.
    page.eval("window.confirm = () => true; window.prompt = () => window.answer; true");
    let click = |page: &mut Cdp, row: &str, label: &str| {
        let ok = page.eval(&format!(
            "(() => {{ const s = document.querySelector('[data-dataset=\"{row}\"]') || \
             document.querySelector('[data-user=\"{row}\"]'); if (!s) return false; \
             const b = [...s.querySelectorAll('button')].find(b => b.innerText === '{label}'); \
             if (!b) return false; b.click(); return true; }})()"
        ));
        assert_eq!(ok, true, "no {label} button for {row}");
    };
    page.submit(
        "#ds-new",
        &[("#ds-name", "tank/media"), ("#ds-compression", "lz4")],
    );
    page.wait(
        "document.querySelector('[data-dataset=\"tank/media\"]') !== null",
        "the new dataset",
    );
    assert_eq!(d.prop("tank/media", "compression"), "lz4");
    click(&mut page, "tank/media", "Properties");
    page.wait(
        "!document.querySelector('#props').hidden && \
         document.querySelector('#props-table').innerText.includes('compression')",
        "the properties",
    );
    page.eval(
        "window.answer = 'zstd'; [...document.querySelectorAll('#props-table tr')] \
         .find(r => r.cells[0] && r.cells[0].innerText === 'compression') \
         .querySelector('button').click(); true",
    );
    page.wait(
        "[...document.querySelectorAll('#props-table tr')].some(r => r.cells[0] && \
         r.cells[0].innerText === 'compression' && r.cells[1].innerText === 'zstd')",
        "the changed property",
    );
    assert_eq!(d.prop("tank/media", "compression"), "zstd");
    page.screenshot("properties");
    let snap = page.eval(
        "[...document.querySelectorAll('[data-dataset]')].map(s => s.dataset.dataset) \
         .find(n => n.startsWith('tank/photos@web-'))",
    );
    let snap = snap.as_str().unwrap().to_string();
    page.eval("window.answer = 'tank/photos-copy'; true");
    click(&mut page, &snap, "Clone");
    page.wait(
        "document.querySelector('[data-dataset=\"tank/photos-copy\"]') !== null",
        "the clone",
    );
    assert!(d.ok(&["dataset", "list"]).contains("tank/photos-copy"));
    click(&mut page, "tank/photos-copy", "Destroy");
    page.wait(
        "document.querySelector('[data-dataset=\"tank/photos-copy\"]') === null",
        "the clone destroyed",
    );
    assert!(!d.ok(&["dataset", "list"]).contains("tank/photos-copy"));
    click(&mut page, &snap, "Rollback");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        page.eval("document.querySelector('#error').innerText"),
        "",
        "the rollback"
    );
    // Users and shares.
    page.submit(
        "#user-new",
        &[
            ("#new-user", "bob"),
            ("#new-user-password", "bob-password-1"),
        ],
    );
    page.wait(
        "document.querySelector('[data-user=\"bob\"]') !== null",
        "the new user",
    );
    click(&mut page, "bob", "Make admin");
    page.wait(
        "[...document.querySelectorAll('#users tr')].some(r => r.cells[0] && \
         r.cells[0].innerText === 'bob' && r.cells[3].innerText === 'yes')",
        "bob an administrator",
    );
    let users = d.ok(&["user", "list"]);
    assert!(
        users
            .lines()
            .any(|l| l.starts_with("bob") && l.trim_end().ends_with("yes")),
        "{users}"
    );
    page.submit(
        "#share-new",
        &[
            ("#share-name", "media"),
            ("#share-dataset", "tank/media"),
            ("#share-webdav", "bob=rw"),
        ],
    );
    page.wait(
        "document.querySelector('#shares').innerText.includes('webdav bob=rw')",
        "the new share",
    );
    assert!(d.ok(&["share", "list"]).contains("media"));
    page.submit(
        "#alert-new",
        &[
            ("#alert-name", "hook"),
            ("#alert-url", "http://127.0.0.1:9/hook"),
        ],
    );
    page.wait(
        "document.querySelector('#alerts').innerText.includes('http://127.0.0.1:9/hook')",
        "the new alert",
    );
    // The chart per metric and range, with a legend per pool.
    page.eval(
        "document.querySelector('#chart-metric').value = 'latency'; \
         document.querySelector('#chart-range').value = 'day'; \
         document.querySelector('#chart-range').dispatchEvent(new Event('change')); true",
    );
    page.wait(
        "document.querySelector('#legend').innerText.includes('tank read') && \
         document.querySelector('#chart').getContext('2d') !== null",
        "the latency chart's legend",
    );
    page.screenshot("dashboard-managed");
    // A new password for bob with its button: bob logs in with it. (Last:
    // the login gives this browser bob's session.)
    page.eval("window.answer = 'bob-password-2'; true");
    click(&mut page, "bob", "Password");
    let login =
        "fetch('/api/login', {method: 'POST', headers: {'Content-Type': 'application/json'}, \
         body: JSON.stringify({user: 'bob', password: 'bob-password-2'})}).then(r => r.status)";
    let mut status = Value::Null;
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(700));
        status = page.eval(login);
        if status == 200 {
            break;
        }
    }
    assert_eq!(status, 200, "bob's new password opens his login");

    // A phone: no horizontal scrolling.
    page.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": true}),
    );
    page.wait(
        "document.documentElement.scrollWidth <= window.innerWidth",
        "no horizontal scroll on a phone",
    );
    page.screenshot("dashboard-phone");
    page.call("Emulation.clearDeviceMetricsOverride", json!({}));

    // Log out; a user sees their share, not the administrator's sections.
    page.eval("document.querySelector('#logout').click(); true");
    page.log_in("alice", "alice-password");
    page.wait(
        "document.querySelector('#shares').innerText.includes('photos')",
        "alice's share",
    );
    for s in [
        "#pools-section",
        "#users-section",
        "#events-section",
        "#activity-section",
    ] {
        let shown = page.eval(&format!("{SHOWN}('{s}')"));
        assert_eq!(shown, false, "{s} is for administrators");
    }
    let listed = page.eval("document.querySelector('#datasets').innerText");
    let listed = listed.as_str().unwrap();
    assert!(
        listed.contains("tank/photos") && !listed.contains("tank/private"),
        "{listed}"
    );
    page.screenshot("user");
    d.stop();
}

/// Basic-auth GET over plain HTTP (WebDAV): (status, body).
fn basic_get(port: u16, path: &str, user: &str, password: &str) -> (u16, Vec<u8>) {
    let auth = common::clients::base64(format!("{user}:{password}").as_bytes());
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {auth}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&out[..split]).to_string();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, out[split + 4..].to_vec())
}

fn png(w: u32, h: u32, shade: u8) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, shade]));
    let mut out = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

impl Cdp {
    /// Fills form `form`'s fields (selector, value) and submits it.
    fn submit(&mut self, form: &str, fields: &[(&str, &str)]) {
        let mut js = String::new();
        for (sel, v) in fields {
            js.push_str(&format!("document.querySelector({sel:?}).value = {v:?}; "));
        }
        js.push_str(&format!(
            "document.querySelector({form:?}).requestSubmit(); true"
        ));
        self.eval(&js);
    }

    /// Saves a screenshot of the page as a test artifact
    /// (`target/tmp/web-page/NAME.png`).
    fn screenshot(&mut self, name: &str) {
        let r = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = common::browser::decode_base64(r["data"].as_str().unwrap());
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-page");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    /// Gives the page's file input these files, as a person choosing
    /// them would (the input's change event fires).
    fn choose_files(&mut self, paths: &[&std::path::Path]) {
        let doc = self.call("DOM.getDocument", json!({}));
        let root = doc["root"]["nodeId"].clone();
        let node = self.call(
            "DOM.querySelector",
            json!({"nodeId": root, "selector": "#upload-input"}),
        );
        let files: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        self.call(
            "DOM.setFileInputFiles",
            json!({"nodeId": node["nodeId"], "files": files}),
        );
    }

    /// Clicks the button labelled `label` in the listing row of `name`.
    fn click_in_row(&mut self, name: &str, label: &str) {
        let ok = self.eval(&format!(
            "(() => {{ const r = [...document.querySelectorAll('#listing .row')] \
             .find(r => r.dataset.name === {name:?}); if (!r) return false; \
             const b = [...r.querySelectorAll('button')].find(b => b.innerText === {label:?}); \
             if (!b) return false; b.click(); return true; }})()"
        ));
        assert_eq!(ok, true, "no {label} button for {name}");
    }
}

#[test]
fn files_in_a_real_browser() {
    if !require::programs(&["chromium"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (d, port, dav) = Daemon::with_web_and_pool(dir.path());
    d.ok(&["dataset", "create", "tank/family"]);
    add_user(&d, "alice", "alice-password");
    d.ok(&[
        "share",
        "add",
        "family",
        "tank/family",
        "--webdav",
        "alice=rw",
        "--owner",
        "alice",
    ]);
    let up = dir.path().join("upload");
    std::fs::create_dir(&up).unwrap();
    let note = up.join("note.txt");
    std::fs::write(&note, "the first version\n").unwrap();

    let browser = Browser::start();
    let mut page = browser.page();
    page.call("Page.enable", json!({}));
    page.call("DOM.enable", json!({}));
    page.call(
        "Page.navigate",
        json!({"url": format!("http://127.0.0.1:{port}/#files")}),
    );
    page.wait(&format!("{SHOWN}('#login')"), "the login form");
    page.submit(
        "#login",
        &[("#user", "alice"), ("#password", "alice-password")],
    );
    page.wait(&format!("{SHOWN}('#files-view')"), "the file pages");
    // Dialogs answer yes, and a new folder is called album.
    page.eval("window.confirm = () => true; window.prompt = () => 'album'; true");

    // Upload through the page; WebDAV reads the same bytes.
    page.choose_files(&[&note]);
    page.wait(
        "document.querySelector('#listing .row[data-name=\"note.txt\"]') !== null",
        "the uploaded file in the listing",
    );
    assert_eq!(
        basic_get(dav, "/family/note.txt", "alice", "alice-password"),
        (200, b"the first version\n".to_vec())
    );
    page.screenshot("files");

    // A folder of photos: a grid of thumbnails, not the originals.
    page.eval("document.querySelector('#new-folder').click(); true");
    page.wait(
        "document.querySelector('#listing .row[data-name=\"album\"]') !== null",
        "the new folder",
    );
    page.eval(
        "[...document.querySelectorAll('#listing .row[data-name=\"album\"] a')][0].click(); true",
    );
    page.wait(
        "document.querySelector('#crumbs').innerText.includes('album')",
        "inside the album",
    );
    let mut photos = Vec::new();
    for i in 0..3u8 {
        let p = up.join(format!("photo{i}.png"));
        std::fs::write(&p, png(640, 480, i * 80)).unwrap();
        photos.push(p);
    }
    let refs: Vec<&std::path::Path> = photos.iter().map(|p| p.as_path()).collect();
    page.choose_files(&refs);
    page.wait(
        "document.querySelectorAll('#grid img').length === 3 && \
         [...document.querySelectorAll('#grid img')].every(i => i.complete && i.naturalWidth > 0)",
        "three thumbnails, loaded",
    );
    let widths = page.eval(
        "[...document.querySelectorAll('#grid img')].map(i => [i.naturalWidth, i.naturalHeight])",
    );
    assert_eq!(
        widths,
        json!([[256, 192], [256, 192], [256, 192]]),
        "thumbnails, not originals"
    );
    let srcs = page.eval("[...document.querySelectorAll('#grid img')].map(i => i.src).join(' ')");
    assert!(srcs.as_str().unwrap().contains("?thumb"), "{srcs}");
    page.screenshot("album");

    // A previous version, restored through the page.
    page.eval("[...document.querySelectorAll('#crumbs a')][0].click(); true");
    page.wait(
        "document.querySelector('#listing .row[data-name=\"note.txt\"]') !== null",
        "back at the top",
    );
    d.ok(&["snapshot", "tank/family@monday"]);
    std::fs::write(&note, "the second version, longer\n").unwrap();
    page.choose_files(&[&note]);
    page.wait(
        "document.querySelectorAll('#uploads li').length === 5 && \
         document.querySelectorAll('#uploads li')[4].innerText === 'note.txt: uploaded as note.txt'",
        "the replacing upload",
    );
    assert_eq!(
        basic_get(dav, "/family/note.txt", "alice", "alice-password").1,
        b"the second version, longer\n"
    );
    page.click_in_row("note.txt", "Versions");
    page.wait(
        "!document.querySelector('#versions').hidden && \
         document.querySelector('#versions-table').innerText.includes('monday')",
        "the versions",
    );
    page.screenshot("versions");
    page.eval("document.querySelector('#versions-table button.restore').click(); true");
    page.wait("document.querySelector('#versions').hidden", "the restore");
    assert_eq!(
        basic_get(dav, "/family/note.txt", "alice", "alice-password").1,
        b"the first version\n"
    );

    // The name taken by someone else while the upload runs (just before
    // its bytes go): the page asks, and on yes its bytes replace theirs.
    let raced = up.join("raced.txt");
    std::fs::write(&raced, "the page's bytes\n").unwrap();
    page.eval(
        "(() => { const real = window.fetch; window.realFetch = real; let raced = false; \
         window.fetch = async (url, opts) => { \
           if (!raced && opts && opts.method === 'PUT' && String(url).includes('/api/upload/')) { \
             raced = true; \
             const h = files.headers(); \
             const s = await (await real('/api/upload', { method: 'POST', credentials: 'same-origin', \
               headers: Object.assign({ 'Content-Type': 'application/json' }, h), \
               body: JSON.stringify({ share: files.share, path: files.path, name: 'raced.txt', size: 6 }) })).json(); \
             await real('/api/upload/' + s.id, { method: 'PUT', credentials: 'same-origin', \
               headers: Object.assign({ 'Content-Type': 'application/octet-stream', 'Upload-Offset': '0' }, h), \
               body: 'theirs' }); \
           } \
           return real(url, opts); }; return true; })()",
    );
    page.choose_files(&[&raced]);
    let last = "[...document.querySelectorAll('#uploads li')].pop().innerText";
    page.wait(
        &format!("{last} === 'raced.txt: uploaded as raced.txt'"),
        "the upload that replaced a name taken meanwhile",
    );
    assert_eq!(
        basic_get(dav, "/family/raced.txt", "alice", "alice-password"),
        (200, b"the page's bytes\n".to_vec())
    );

    // The network gone for three seconds from the first chunk on: the
    // page keeps asking where the upload stands, and finishes it.
    let later = up.join("later.txt");
    std::fs::write(&later, "sent once the network came back\n").unwrap();
    page.eval(
        "(() => { const real = window.realFetch; let until = 0; \
         window.fetch = (url, opts) => { \
           if (String(url).includes('/api/upload/')) { \
             if (until === 0) until = Date.now() + 3000; \
             if (Date.now() < until) return Promise.reject(new TypeError('Failed to fetch')); \
           } \
           return real(url, opts); }; return true; })()",
    );
    page.choose_files(&[&later]);
    page.wait(
        &format!("{last} === 'later.txt: uploaded as later.txt'"),
        "the upload through a network outage",
    );
    assert_eq!(
        basic_get(dav, "/family/later.txt", "alice", "alice-password").1,
        b"sent once the network came back\n"
    );
    page.eval("window.fetch = window.realFetch; true");

    // A share link to the album, opened after logging out.
    page.eval(
        "[...document.querySelectorAll('#listing .row[data-name=\"album\"] a')][0].click(); true",
    );
    page.wait(
        "document.querySelector('#crumbs').innerText.includes('album')",
        "inside the album again",
    );
    page.eval("document.querySelector('#link-button').click(); document.querySelector('#link-make').click(); true");
    page.wait("document.querySelector('#link-url') !== null", "the link");
    let url = page.eval("document.querySelector('#link-url').href");
    let url = url.as_str().unwrap().to_string();
    assert!(url.contains("/s/"), "{url}");
    page.eval("document.querySelector('#logout').click(); true");
    page.wait(&format!("{SHOWN}('#login')"), "logged out");
    page.call("Page.navigate", json!({ "url": url }));
    page.wait(
        "document.querySelectorAll('#grid img').length === 3 && \
         [...document.querySelectorAll('#grid img')].every(i => i.complete && i.naturalWidth === 256)",
        "the album through the link, with thumbnails",
    );
    let session = page.eval("fetch('/api/session').then(r => r.status)");
    assert_eq!(session, 401, "logged out");
    let got = page.eval(
        "fetch(document.querySelector('#grid a').href).then(r => r.arrayBuffer()).then(b => b.byteLength)",
    );
    assert_eq!(
        got.as_u64(),
        Some(png(640, 480, 0).len() as u64),
        "a photo downloaded through the link"
    );
    page.screenshot("link");
    page.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": true}),
    );
    page.wait(
        "document.documentElement.scrollWidth <= window.innerWidth",
        "no horizontal scroll on a phone",
    );
    page.screenshot("link-phone");
    d.stop();
}
