//! A fake backend and helpers for running a daemon inside a test. The fake
//! tests the transport, not storage: it knows one pool, `tank`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tarn_cli::api::ApiError;
use tarn_cli::backend::{
    Backend, CreateRequest, ImportRequest, ImportResult, ObjectInfo, ScrubAction,
};
use tarn_cli::daemon::{run_daemon, DaemonOptions};
use tarn_cli::status::{
    Counters, Health, IostatEntry, PoolListEntry, PoolStatus, ScanStatus, VdevStatus,
};

/// How long `pool.sync` takes in the fake, to test draining at stop.
pub const SYNC_DELAY: Duration = Duration::from_millis(500);

/// Records what happened, in order.
#[derive(Default)]
pub struct FakeBackend {
    pub events: Mutex<Vec<&'static str>>,
    pub shutdowns: AtomicUsize,
}

impl FakeBackend {
    fn event(&self, what: &'static str) {
        self.events.lock().unwrap().push(what);
    }

    pub fn events(&self) -> Vec<&'static str> {
        self.events.lock().unwrap().clone()
    }
}

pub fn sample_status() -> PoolStatus {
    PoolStatus {
        name: "tank".into(),
        guid: "00c0ffee".into(),
        health: Health::Online,
        message: None,
        action: None,
        txg: 7,
        scan: None,
        vdevs: vec![VdevStatus {
            name: "/dev/fake0".into(),
            health: Health::Online,
            counters: Counters::default(),
            note: None,
            children: vec![],
        }],
        damaged: vec![],
    }
}

fn unsupported<T>() -> Result<T, ApiError> {
    Err(ApiError::invalid("the fake backend does not do that"))
}

fn known(name: &str) -> Result<(), ApiError> {
    if name == "tank" {
        Ok(())
    } else {
        Err(ApiError::not_found(format!("no pool named {name}")))
    }
}

impl Backend for FakeBackend {
    fn pool_create(&self, _: &CreateRequest) -> Result<PoolStatus, ApiError> {
        Err(ApiError::exists("pool tank already exists"))
    }
    fn pool_import(&self, _: &ImportRequest) -> Result<ImportResult, ApiError> {
        Ok(ImportResult::Candidates(vec![]))
    }
    fn pool_export(&self, name: &str, _: bool) -> Result<(), ApiError> {
        known(name)
    }
    fn pool_destroy(&self, _: &str, _: bool) -> Result<(), ApiError> {
        unsupported()
    }
    fn pool_list(&self) -> Result<Vec<PoolListEntry>, ApiError> {
        Ok(vec![PoolListEntry {
            name: "tank".into(),
            size: 1 << 30,
            allocated: 1 << 20,
            free: (1 << 30) - (1 << 20),
            health: Health::Online,
            guid: "00c0ffee".into(),
        }])
    }
    fn pool_status(&self, name: Option<&str>) -> Result<Vec<PoolStatus>, ApiError> {
        if let Some(name) = name {
            known(name)?;
        }
        Ok(vec![sample_status()])
    }
    fn pool_scrub(&self, _: &str, _: ScrubAction) -> Result<Option<ScanStatus>, ApiError> {
        unsupported()
    }
    fn pool_offline(&self, _: &str, _: &str) -> Result<(), ApiError> {
        unsupported()
    }
    fn pool_online(&self, _: &str, _: &str) -> Result<(), ApiError> {
        unsupported()
    }
    fn pool_replace(&self, _: &str, _: &str, _: &str, _: bool) -> Result<(), ApiError> {
        unsupported()
    }
    fn pool_clear(&self, _: &str, _: Option<&str>) -> Result<(), ApiError> {
        unsupported()
    }
    fn pool_iostat(&self, _: Option<&str>) -> Result<Vec<IostatEntry>, ApiError> {
        Ok(vec![])
    }
    fn pool_sync(&self, name: &str) -> Result<u64, ApiError> {
        known(name)?;
        self.event("sync started");
        thread::sleep(SYNC_DELAY);
        self.event("sync finished");
        Ok(8)
    }
    fn object_write(&self, _: &str, _: &str, _: &str, _: u64, _: bool) -> Result<ObjectInfo, ApiError> {
        unsupported()
    }
    fn object_read(&self, _: &str, _: &str, _: &str) -> Result<ObjectInfo, ApiError> {
        unsupported()
    }
    fn object_list(&self, _: &str) -> Result<Vec<ObjectInfo>, ApiError> {
        Ok(vec![])
    }
    fn object_delete(&self, _: &str, object: &str) -> Result<(), ApiError> {
        if object == "boom" {
            panic!("the fake backend panics on purpose");
        }
        unsupported()
    }
    fn shutdown(&self) {
        self.event("shutdown");
        self.shutdowns.fetch_add(1, Ordering::SeqCst);
    }
}

/// A daemon running on a thread of the test process.
pub struct TestDaemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub backend: Arc<FakeBackend>,
    pub thread: Option<JoinHandle<anyhow::Result<()>>>,
}

impl TestDaemon {
    /// Starts a daemon; `tune` may change the options (limits).
    pub fn start(tune: impl FnOnce(&mut DaemonOptions)) -> TestDaemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("run").join("tarn.sock");
        let mut opts = DaemonOptions::new(socket.clone(), dir.path().join("state"));
        tune(&mut opts);
        let backend = Arc::new(FakeBackend::default());
        let served: Arc<dyn Backend> = backend.clone();
        let thread = thread::spawn(move || run_daemon(opts, served));
        wait_for_socket(&socket);
        TestDaemon {
            dir,
            socket,
            backend,
            thread: Some(thread),
        }
    }

    /// Waits for `run_daemon` to return and hands back its result.
    pub fn join(&mut self) -> anyhow::Result<()> {
        self.thread.take().expect("joined twice").join().unwrap()
    }
}

/// Waits until something listens on `path` (bounded).
pub fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(path).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {}", path.display());
        thread::sleep(Duration::from_millis(20));
    }
}

/// A raw line-level connection, for framing tests.
pub struct Raw {
    pub writer: UnixStream,
    pub reader: BufReader<UnixStream>,
}

impl Raw {
    pub fn connect(path: &Path) -> Raw {
        let writer = UnixStream::connect(path).unwrap();
        writer.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let reader = BufReader::new(writer.try_clone().unwrap());
        Raw { writer, reader }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).unwrap();
    }

    /// Reads one response line as JSON; `None` on end of stream.
    pub fn recv(&mut self) -> Option<serde_json::Value> {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).unwrap();
        if n == 0 {
            return None;
        }
        Some(serde_json::from_str(&line).unwrap())
    }

    pub fn call(&mut self, line: &str) -> serde_json::Value {
        self.send(line.as_bytes());
        self.send(b"\n");
        self.recv().expect("the daemon closed the connection")
    }
}
