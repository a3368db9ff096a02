//! Shared helpers of the integration tests: users, servers over a
//! MemBackend or a real pool on a temporary file, and a raw HTTP client
//! (curl, sockets and pools come from `tarn_testkit`).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tarn_fs::testing::MemBackend;
use tarn_fs::{Cred, Fs, SetAttr, ROOT_INO};
use tarn_pool::PoolOptions;
use tarn_testkit::datasets::FsPool;
use tarn_testkit::net::{connect_from, ends};
use tarn_webdav::{serve, FsApi, Principal, Running, Share, StaticUsers, WebdavConfig};

pub const UID: u32 = 1000;

pub fn principal(can_write: bool) -> Principal {
    Principal {
        name: String::new(),
        uid: UID,
        gid: UID,
        groups: vec![],
        can_write,
    }
}

/// Users: `alice`/`secret` (read-write), `reader`/`pw` (read-only).
pub fn users() -> Arc<StaticUsers> {
    Arc::new(
        StaticUsers::new()
            .with_user("alice", "secret", principal(true))
            .with_user("reader", "pw", principal(false)),
    )
}

/// Hands the root of `fs` to the test user, as an admin would.
pub fn chown_root(fs: &dyn FsApi) {
    let sa = SetAttr {
        uid: Some(UID),
        gid: Some(UID),
        ..Default::default()
    };
    fs.setattr(ROOT_INO, &sa, &Cred::root()).unwrap();
}

pub fn mem_fs() -> Arc<Fs<MemBackend>> {
    let fs = Arc::new(Fs::mount(MemBackend::new()).unwrap());
    chown_root(fs.as_ref());
    fs
}

pub fn start(shares: Vec<Share>) -> Running {
    let cfg = WebdavConfig::new("127.0.0.1:0".parse().unwrap());
    serve(cfg, shares, users()).unwrap()
}

/// A pool on one temporary file, with one filesystem dataset `tank/fs`
/// whose root belongs to the test user.
pub fn real_fs(dev_size: u64, opts: PoolOptions) -> FsPool {
    let real = FsPool::new(dev_size, opts);
    chown_root(real.fs.as_ref());
    real
}

pub fn pool_opts() -> PoolOptions {
    PoolOptions {
        sync_interval: Duration::from_secs(2),
        owner: "webdav-test".into(),
        ..Default::default()
    }
}

pub fn url(addr: SocketAddr, path: &str) -> String {
    format!("http://{addr}{path}")
}

/// Peak resident memory of this process, in bytes (VmHWM).
pub fn vm_hwm() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

// ----- a raw HTTP/1.1 client ----------------------------------------------
//
// curl and other clients fix up what a hostile client sends (they drop a
// `#fragment`, always send Host, encode chunks correctly), so these tests
// speak HTTP over a plain socket.

/// `Authorization` header value for alice/secret.
pub const ALICE: &str = "Basic YWxpY2U6c2VjcmV0";

/// A response: status, headers (lower-case names) and body.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One keep-alive connection.
pub struct Http {
    r: BufReader<TcpStream>,
}

impl Http {
    pub fn new(s: TcpStream) -> Http {
        Http {
            r: BufReader::new(s),
        }
    }

    pub fn connect(addr: SocketAddr) -> Http {
        Http::new(connect_from([127, 0, 0, 1], addr).expect("connect"))
    }

    pub fn stream(&mut self) -> &mut TcpStream {
        self.r.get_mut()
    }

    /// Sends raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.r.get_mut().write_all(bytes).expect("send");
    }

    /// Sends `METHOD target` with Host, alice's credentials, the extra
    /// header lines and a Content-Length body.
    pub fn send(&mut self, method: &str, target: &str, extra: &[&str], body: &[u8]) {
        let mut req = format!(
            "{method} {target} HTTP/1.1\r\nHost: test\r\nAuthorization: {ALICE}\r\n\
             Content-Length: {}\r\n",
            body.len()
        );
        for h in extra {
            req.push_str(h);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        self.send_raw(&bytes);
    }

    /// Sends and reads the answer.
    pub fn call(&mut self, method: &str, target: &str, extra: &[&str], body: &[u8]) -> Resp {
        self.send(method, target, extra, body);
        self.read(method == "HEAD").expect("response")
    }

    /// Reads one response.
    pub fn read(&mut self, head_only: bool) -> std::io::Result<Resp> {
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(&line))?;
        let mut headers = Vec::new();
        loop {
            let mut l = String::new();
            self.r.read_line(&mut l)?;
            let l = l.trim_end();
            if l.is_empty() {
                break;
            }
            let (n, v) = l.split_once(':').ok_or_else(|| bad(l))?;
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let mut resp = Resp {
            status,
            headers,
            body: Vec::new(),
        };
        if head_only || status == 204 || status == 304 {
            return Ok(resp);
        }
        if resp.header("transfer-encoding").is_some() {
            loop {
                let mut l = String::new();
                self.r.read_line(&mut l)?;
                let n = usize::from_str_radix(l.trim().split(';').next().unwrap_or(""), 16)
                    .map_err(|_| bad(&l))?;
                if n == 0 {
                    let mut end = String::new();
                    self.r.read_line(&mut end)?;
                    break;
                }
                let mut chunk = vec![0u8; n + 2];
                self.r.read_exact(&mut chunk)?;
                chunk.truncate(n);
                resp.body.extend_from_slice(&chunk);
            }
        } else if let Some(len) = resp.header("content-length") {
            let n: usize = len.parse().map_err(|_| bad(len))?;
            resp.body = vec![0u8; n];
            self.r.read_exact(&mut resp.body)?;
        } else {
            self.r.read_to_end(&mut resp.body)?;
        }
        Ok(resp)
    }

    /// True if the server closed the connection within `within`.
    pub fn closed_within(&mut self, within: Duration) -> bool {
        self.r.get_mut().set_read_timeout(Some(within)).unwrap();
        ends(&mut self.r)
    }
}
