//! Shared helpers of the integration tests: servers over a MemBackend or a
//! real pool on temporary files, and a curl wrapper.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
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
