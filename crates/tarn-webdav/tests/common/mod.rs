//! Shared helpers of the integration tests: servers over a MemBackend or a
//! real pool on temporary files, and a curl wrapper.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use tarn_fs::testing::MemBackend;
use tarn_fs::{Cred, DatasetBackend, Fs, SetAttr, ROOT_INO};
use tarn_pool::{Pool, PoolOptions, VdevSpec};
use tarn_vdev::VdevKind;
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

/// A pool on one temporary file, with one filesystem dataset `tank/fs`.
pub struct RealFs {
    pub dir: tempfile::TempDir,
    pub pool: Arc<Pool>,
    pub fs: Arc<Fs<DatasetBackend>>,
}

pub fn real_fs(dev_size: u64, opts: PoolOptions) -> RealFs {
    let dir = tempfile::tempdir().unwrap();
    let dev: PathBuf = dir.path().join("d0");
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(dev_size)
        .unwrap();
    let spec = VdevSpec {
        kind: VdevKind::Single,
        devices: vec![dev],
    };
    let pool = Pool::create("tank", &[spec], 12, &BTreeMap::new(), false, opts).unwrap();
    tarn_dataset::attach(&pool).unwrap();
    tarn_dataset::create(&pool, "tank/fs", &BTreeMap::new(), false).unwrap();
    let h = tarn_dataset::open(&pool, "tank/fs").unwrap();
    let fs = Arc::new(Fs::mount(Arc::new(DatasetBackend::new(h))).unwrap());
    chown_root(fs.as_ref());
    RealFs { dir, pool, fs }
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

/// Runs curl with `args`; returns (HTTP status, body, output).
pub fn curl(args: &[&str]) -> (u16, Vec<u8>, Output) {
    let out = Command::new("curl")
        .args([
            "-s",
            "-S",
            "--max-time",
            "600",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
        ])
        .args(args)
        .output()
        .expect("curl runs");
    let mut body = out.stdout.clone();
    let pos = body.iter().rposition(|&b| b == b'\n').unwrap_or(0);
    let code = String::from_utf8_lossy(&body[pos + 1..])
        .trim()
        .parse()
        .unwrap_or(0);
    body.truncate(pos);
    (code, body, out)
}

/// Status of a request (body discarded).
pub fn status(args: &[&str]) -> u16 {
    curl(args).0
}

pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd} >/dev/null")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// True if the test should go on; prints a skip message otherwise (and
/// panics when `TARN_REQUIRE_ALL` is set).
pub fn require(cmd: &str) -> bool {
    if have(cmd) {
        return true;
    }
    if std::env::var_os("TARN_REQUIRE_ALL").is_some() {
        panic!("{cmd} is required (TARN_REQUIRE_ALL is set) but not installed");
    }
    eprintln!("SKIP: {cmd} is not installed");
    false
}

/// Peak resident memory of this process, in bytes (VmHWM).
pub fn vm_hwm() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

pub fn tmp_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

// ----- a raw HTTP/1.1 client ----------------------------------------------
//
// curl and other clients fix up what a hostile client sends (they drop a
// `#fragment`, always send Host, encode chunks correctly), so these tests
// speak HTTP over a plain socket.

/// A TCP connection to `server` from the loopback address `from`
/// (127.0.0.x: Linux routes all of 127.0.0.0/8 to the loopback device).
pub fn connect_from(from: [u8; 4], server: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::from((from, 0)).into())?;
    s.connect_timeout(&server.into(), Duration::from_secs(10))?;
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(s)
}

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
        let mut b = [0u8; 4096];
        loop {
            match self.r.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) => {
                    return matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                    )
                }
            }
        }
    }
}
