//! A headless chromium driven through its DevTools protocol: the web
//! page's browser tests and its render benchmark
//! (`crates/tarn/examples/web-render.rs`) use it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tarn_testkit::net::free_port;

/// A headless chromium, killed when dropped.
pub struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    port: u16,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A GET to chromium's DevTools HTTP server, which may keep the
/// connection open: the body is read up to its Content-Length.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head.lines().find_map(|l| {
                let l = l.to_ascii_lowercase();
                l.strip_prefix("content-length:")
                    .and_then(|v| v.trim().parse::<usize>().ok())
            });
            if len.is_some_and(|n| body.len() >= n) {
                return Some(body.to_string());
            }
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

impl Browser {
    pub fn start() -> Browser {
        let port = free_port();
        let profile = tempfile::tempdir().unwrap();
        let child = Command::new("chromium")
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--window-size=1280,900",
                &format!("--remote-debugging-port={port}"),
                &format!("--user-data-dir={}", profile.path().display()),
                "about:blank",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        let b = Browser {
            child,
            _profile: profile,
            port,
        };
        let t0 = Instant::now();
        while http_get(port, "/json/version").is_none() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "chromium did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        b
    }

    /// The DevTools connection of its page.
    pub fn page(&self) -> Cdp {
        let list: Value =
            serde_json::from_str(&http_get(self.port, "/json/list").unwrap()).unwrap();
        let url = list
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .expect("a page target")
            .to_string();
        let stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let (ws, _) = tungstenite::client(url.as_str(), stream).expect("DevTools websocket");
        Cdp { ws, id: 0 }
    }
}

/// A JavaScript function: whether the element `sel` is displayed, as
/// the eye sees it (a stylesheet could keep a `hidden` element shown).
pub const SHOWN: &str = "(sel => { const e = document.querySelector(sel); \
    return e !== null && getComputedStyle(e).display !== 'none'; })";

/// One DevTools session.
pub struct Cdp {
    ws: tungstenite::WebSocket<TcpStream>,
    id: u64,
}

impl Cdp {
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.id += 1;
        let id = self.id;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws.send(tungstenite::Message::text(msg)).unwrap();
        loop {
            let m = self
                .ws
                .read()
                .unwrap_or_else(|e| panic!("{method}: no answer from chromium: {e}"));
            let Ok(text) = m.to_text() else { continue };
            let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expr}: {r}");
        r["result"]["value"].clone()
    }

    /// Waits until `expr` is true in the page.
    pub fn wait(&mut self, expr: &str, what: &str) {
        let t0 = Instant::now();
        while self.eval(expr) != Value::Bool(true) {
            let text = self.eval("document.body.innerText");
            // Generous: on CI's two cores other tests run beside this
            // one, and an upload there once took more than 20 s to start.
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "timed out: {what}\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log_in(&mut self, user: &str, password: &str) {
        self.wait(&format!("{SHOWN}('#login')"), "the login form");
        self.eval(&format!(
            "document.querySelector('#user').value = {user:?}; \
             document.querySelector('#password').value = {password:?}; \
             document.querySelector('#login').requestSubmit(); true"
        ));
        // Shown and hidden as the eye sees it (a stylesheet could keep a
        // hidden element displayed).
        self.wait(
            &format!("{SHOWN}('#app') && !{SHOWN}('#login')"),
            "the page after login, the form gone",
        );
    }
}

pub fn decode_base64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            _ => 63,
        }
    };
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|b| *b != b'=' && !b.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, c)| acc | (val(*c) << (18 - 6 * i)));
        let take = chunk.len() - 1;
        out.extend_from_slice(&n.to_be_bytes()[1..1 + take]);
    }
    out
}
