//! A fake backend and helpers for running a daemon inside a test. The fake
//! tests the transport, not storage: it knows one pool, `tank`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use tarn_api::params::ObjectInfo;
use tarn_api::pool::{
    Counters, CreateRequest, Health, ImportRequest, ImportResult, IostatEntry, PoolListEntry,
    PoolStatus, ScanKind, ScanState, ScanStatus, ScrubAction, VdevSpec, VdevStatus,
};
use tarn_api::{ApiError, Backend};
use tarn_daemon::{run_daemon, DaemonOptions, Node};
use tarn_testkit::net::wait_for_socket;

/// How long `pool.sync` takes in the fake, to test draining at stop.
pub const SYNC_DELAY: Duration = Duration::from_millis(500);

/// Records what happened, in order.
#[derive(Default)]
pub struct FakeBackend {
    pub events: Mutex<Vec<&'static str>>,
    pub shutdowns: AtomicUsize,
    /// Status polls since a scrub started; 0 means no scrub.
    pub scrub_polls: AtomicUsize,
    /// `pool.iostat` calls so far; each adds 100 read ops.
    pub iostat_calls: AtomicUsize,
    /// What `shutdown` reports it could not do.
    pub shutdown_failures: Mutex<Vec<String>>,
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
        logs: vec![],
        damaged: vec![],
        locked: vec![],
        cache: None,
    }
}

/// The fake scrub after `polls` status calls.
fn fake_scan(polls: usize) -> ScanStatus {
    let finished = polls >= 3;
    ScanStatus {
        kind: ScanKind::Scrub,
        state: if finished {
            ScanState::Finished
        } else {
            ScanState::Scanning
        },
        started_unix: 1_700_000_000,
        ended_unix: finished.then_some(1_700_000_060),
        examined_bytes: (polls.min(3) as u64) << 20,
        total_bytes: 3 << 20,
        repaired_bytes: 4096,
        errors: if finished { 2 } else { 0 },
        rate_bytes_per_sec: 1 << 20,
        eta_secs: (!finished).then_some(3 - polls as u64),
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
        let mut status = sample_status();
        let polls = self.scrub_polls.load(Ordering::SeqCst);
        if polls > 0 {
            // Running for two polls, then finished with unrepaired errors.
            self.scrub_polls.fetch_add(1, Ordering::SeqCst);
            status.scan = Some(fake_scan(polls));
        }
        Ok(vec![status])
    }
    fn pool_scrub(&self, name: &str, action: ScrubAction) -> Result<Option<ScanStatus>, ApiError> {
        known(name)?;
        if action != ScrubAction::Start {
            return unsupported();
        }
        self.scrub_polls.store(1, Ordering::SeqCst);
        Ok(Some(fake_scan(0)))
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
    fn pool_add_log(&self, _: &str, _: &VdevSpec, _: bool) -> Result<(), ApiError> {
        unsupported()
    }
    fn pool_remove(&self, _: &str, _: &str) -> Result<(), ApiError> {
        unsupported()
    }
    fn pool_clear(&self, _: &str, _: Option<&str>) -> Result<(), ApiError> {
        unsupported()
    }
    fn pool_iostat(&self, _: Option<&str>) -> Result<Vec<IostatEntry>, ApiError> {
        let ops = self.iostat_calls.fetch_add(1, Ordering::SeqCst) as u64 * 100;
        Ok(vec![IostatEntry {
            name: "tank".into(),
            depth: 0,
            allocated: 1 << 20,
            free: 1 << 30,
            counters: Counters {
                read_ops: ops,
                ..Counters::default()
            },
        }])
    }
    fn pool_sync(&self, name: &str) -> Result<u64, ApiError> {
        known(name)?;
        self.event("sync started");
        thread::sleep(SYNC_DELAY);
        self.event("sync finished");
        Ok(8)
    }
    fn object_write(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: u64,
        _: bool,
    ) -> Result<ObjectInfo, ApiError> {
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
}

impl Node for FakeBackend {
    fn shutdown(&self) -> Vec<String> {
        self.event("shutdown");
        self.shutdowns.fetch_add(1, Ordering::SeqCst);
        self.shutdown_failures.lock().unwrap().clone()
    }
}

/// A daemon running on a thread of the test process.
pub struct TestDaemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub backend: Arc<FakeBackend>,
    pub thread: Option<JoinHandle<tarn_daemon::Result<()>>>,
}

impl TestDaemon {
    /// Starts a daemon; `tune` may change the options (limits).
    pub fn start(tune: impl FnOnce(&mut DaemonOptions)) -> TestDaemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("run").join("tarn.sock");
        Self::launch(dir, socket, tune)
    }

    /// Starts a daemon with default options on a given socket path.
    pub fn start_at(socket: PathBuf) -> TestDaemon {
        Self::launch(tempfile::tempdir().unwrap(), socket, |_| {})
    }

    fn launch(
        dir: tempfile::TempDir,
        socket: PathBuf,
        tune: impl FnOnce(&mut DaemonOptions),
    ) -> TestDaemon {
        let mut opts = DaemonOptions::new(socket.clone(), dir.path().join("state"));
        tune(&mut opts);
        let backend = Arc::new(FakeBackend::default());
        let served: Arc<dyn Node> = backend.clone();
        let thread = thread::spawn(move || run_daemon(opts, served));
        wait_for_socket(&socket);
        TestDaemon {
            dir,
            socket,
            backend,
            thread: Some(thread),
        }
    }

    /// Stops the daemon through `daemon.stop` and waits for it to return.
    pub fn stop(mut self) {
        tarn_cli::client::Client::connect(&self.socket)
            .unwrap()
            .call(tarn_api::method::DAEMON_STOP, &serde_json::json!({}))
            .unwrap();
        self.join().unwrap();
    }

    /// Waits for `run_daemon` to return and hands back its result.
    pub fn join(&mut self) -> tarn_daemon::Result<()> {
        self.thread.take().expect("joined twice").join().unwrap()
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
        writer
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
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

    /// Like [`Raw::call`], but `None` if the daemon hung up instead.
    pub fn try_call(&mut self, line: &str) -> Option<serde_json::Value> {
        self.writer.write_all(format!("{line}\n").as_bytes()).ok()?;
        let mut answer = String::new();
        self.reader.read_line(&mut answer).ok()?;
        serde_json::from_str(&answer).ok()
    }

    pub fn call(&mut self, line: &str) -> serde_json::Value {
        self.send(line.as_bytes());
        self.send(b"\n");
        self.recv().expect("the daemon closed the connection")
    }
}
