//! Faults beyond redundancy on a live daemon with three pools: `good` (raidz1
//! of four files) under a steady workload; `bad` (a mirror of two) whose
//! every device is made to vanish, to return flipped bits or errors on every
//! read, and to fail every write while a writer is busy; and `one` (a single
//! device) whose reads return flipped bits.
//!
//! What must hold throughout:
//!
//! - every CLI call returns (bounded), and each failure is one clean
//!   `error: …` line (exit 1) that names the pool and the device or damaged
//!   object, never panic text; the daemon stays up and logs no panic;
//! - `status` (human and JSON) tells the truth: not ONLINE while every
//!   device fails, FAULTED with the reason once a txg sync failed, the
//!   damaged objects listed with their error counters;
//! - `good` keeps reading back exactly what it wrote, stays ONLINE and
//!   scrubs clean;
//! - once the faults are cleared, `bad` and `one` come back (`pool clear`,
//!   and export and import when the pool is faulted) and every byte
//!   acknowledged as synced before a fault reads back exactly; what was not
//!   acknowledged is either absent or exact. An error is acceptable while
//!   devices misbehave; wrong bytes never are.
//!
//! With root and /dev/fuse each pool also has a mounted dataset with files
//! written and fsynced through the kernel, checked the same way; without,
//! the CLI's objects carry the data alone.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::process::{files, Daemon};
use tarn_testkit::data::pattern;
use tarn_testkit::require::{self, is_mounted};

/// Longest one CLI call (or one file operation through a mount) may take
/// before the test calls it a hang.
const CALL_LIMIT: Duration = Duration::from_secs(30);
/// Longest the test polls for a state it expects.
const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// Runs `f` on a thread and returns its result, failing the test if it
/// does not finish within [`CALL_LIMIT`] (the thread is left behind; the
/// daemon's drop ends whatever it waits for).
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(CALL_LIMIT)
        .unwrap_or_else(|_| panic!("{what} did not return within {CALL_LIMIT:?}: a hang"))
}

/// Polls `cond` until it holds, failing with `what` after [`WAIT_LIMIT`].
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < WAIT_LIMIT, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Text that only a crash or a bug puts in a message.
fn assert_no_panic_text(text: &str, what: &str) {
    for sign in ["panicked", "hit a bug", "RUST_BACKTRACE", "internal error"] {
        assert!(!text.contains(sign), "{what}: {text}");
    }
}

/// What one CLI call did.
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// The CLI of one daemon, usable from several threads; payloads and
/// read-backs go through files in `scratch`.
struct Cli {
    socket: PathBuf,
    scratch: PathBuf,
    next: AtomicU64,
}

impl Cli {
    /// Runs the CLI; SIGKILLs it and fails the test if it does not return
    /// within [`CALL_LIMIT`].
    fn run(&self, args: &[&str]) -> Out {
        let child = Command::new(env!("CARGO_BIN_EXE_tarn"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .env_remove("TARN_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run tarn");
        let pid = child.id() as libc::pid_t;
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let o = match rx.recv_timeout(CALL_LIMIT) {
            Ok(o) => o.expect("wait for tarn"),
            Err(_) => {
                // SAFETY: our own child, not yet reaped (its waiter still
                // blocks on it), so the pid is still ours.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("tarn {args:?} did not return within {CALL_LIMIT:?}: the daemon hangs");
            }
        };
        let out = Out {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        };
        assert_no_panic_text(&out.stdout, &format!("stdout of tarn {args:?}"));
        assert_no_panic_text(&out.stderr, &format!("stderr of tarn {args:?}"));
        out
    }

    /// A call that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert_eq!(o.code, Some(0), "tarn {args:?} failed: {}", o.stderr);
        o.stdout
    }

    /// A call that must fail cleanly; returns the message.
    fn fails(&self, args: &[&str]) -> String {
        let o = self.run(args);
        clean_failure(&o, args);
        o.stderr
    }

    fn file(&self, what: &str) -> PathBuf {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.scratch.join(format!("{what}-{n}"))
    }

    /// `object put`, with `--sync` when asked.
    fn put(&self, pool: &str, name: &str, bytes: &[u8], sync: bool) -> Out {
        let src = self.file("put");
        std::fs::write(&src, bytes).unwrap();
        let src_s = src.to_str().unwrap();
        let mut args = vec!["object", "put", pool, name, src_s];
        if sync {
            args.push("--sync");
        }
        let o = self.run(&args);
        let _ = std::fs::remove_file(&src);
        o
    }

    /// `object get`: the bytes, or the clean error message.
    fn get(&self, pool: &str, name: &str) -> Result<Vec<u8>, String> {
        let to = self.file("get");
        let args = ["object", "get", pool, name, to.to_str().unwrap()];
        let o = self.run(&args);
        if o.code == Some(0) {
            let b = std::fs::read(&to).unwrap();
            let _ = std::fs::remove_file(&to);
            Ok(b)
        } else {
            clean_failure(&o, &args);
            assert!(!to.exists(), "a failed get leaves no file behind");
            Err(o.stderr)
        }
    }

    /// `-o json pool status POOL`, the pool's entry.
    fn status(&self, pool: &str) -> Value {
        let out = self.ok(&["-o", "json", "pool", "status", pool]);
        let v: Value = serde_json::from_str(&out).expect("status is JSON");
        v[0].clone()
    }

    /// The human `pool status POOL`.
    fn status_text(&self, pool: &str) -> String {
        self.ok(&["pool", "status", pool])
    }

    /// Runs a scrub to its end; returns the final scan as JSON.
    fn scrub(&self, pool: &str) -> Value {
        let out = self.ok(&["-o", "json", "pool", "scrub", "--wait", pool]);
        serde_json::from_str(&out).expect("scrub result is JSON")
    }
}

/// A failure must be exit 1 with one `error: …` line.
fn clean_failure(o: &Out, args: &[&str]) {
    assert_eq!(
        o.code,
        Some(1),
        "tarn {args:?} should fail with exit 1, got {:?}: {}{}",
        o.code,
        o.stdout,
        o.stderr
    );
    assert!(
        o.stderr.starts_with("error: ") && o.stderr.trim_end().lines().count() == 1,
        "unclear error for tarn {args:?}: {}",
        o.stderr
    );
}

/// Sum of a counter over the leaves of a status vdev tree.
fn leaf_sum(vdevs: &Value, counter: &str) -> u64 {
    vdevs
        .as_array()
        .map(|v| {
            v.iter()
                .map(|x| match x["children"].as_array() {
                    Some(c) if !c.is_empty() => leaf_sum(&x["children"], counter),
                    _ => x["counters"][counter].as_u64().unwrap_or(0),
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The leaves of a status vdev tree, flattened.
fn leaves(vdevs: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for x in vdevs.as_array().into_iter().flatten() {
        match x["children"].as_array() {
            Some(c) if !c.is_empty() => out.extend(leaves(&x["children"])),
            _ => out.push(x.clone()),
        }
    }
    out
}

fn damaged(st: &Value) -> Vec<String> {
    st["damaged"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// What was written to a pool: acknowledged (must read back exactly) and
/// not acknowledged (absent or exact), and the failures seen on the way.
#[derive(Default)]
struct Ledger {
    acked: BTreeMap<String, Vec<u8>>,
    unacked: BTreeMap<String, Vec<u8>>,
    failures: Vec<String>,
}

/// Writes fresh objects with `--sync` to `pool` until stopped or until it
/// has seen three failures, recording each in `ledger`.
fn writer(
    cli: Arc<Cli>,
    pool: &'static str,
    prefix: &'static str,
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut k = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let name = format!("{prefix}{k}");
            let bytes = pattern(7_000 + k, 40_000 + (k as usize * 37_123) % 200_000);
            let o = cli.put(pool, &name, &bytes, true);
            let mut l = ledger.lock().unwrap();
            if o.code == Some(0) {
                l.acked.insert(name, bytes);
            } else {
                clean_failure(&o, &["object", "put", pool, &name, "--sync"]);
                l.unacked.insert(name, bytes);
                l.failures.push(o.stderr);
                if l.failures.len() >= 3 {
                    return;
                }
            }
            k += 1;
        }
    })
}

/// The steady workload on `good`: objects (half of them synchronous) and,
/// with a mount, files fsynced through the kernel, each read back at once
/// and again a few rounds later, then deleted. Stops at the first error or
/// wrong byte and leaves it in `failure`.
struct Workload {
    rounds: Arc<AtomicU64>,
    failure: Arc<Mutex<Option<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Workload {
    fn start(cli: Arc<Cli>, files: Option<PathBuf>) -> Workload {
        let rounds = Arc::new(AtomicU64::new(0));
        let failure = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (rounds, failure, stop) = (rounds.clone(), failure.clone(), stop.clone());
            thread::spawn(move || {
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let r =
                        catch_unwind(AssertUnwindSafe(|| Self::round(&cli, files.as_deref(), k)))
                            .unwrap_or_else(|p| Err(panic_text(p.as_ref())));
                    if let Err(e) = r {
                        *failure.lock().unwrap() = Some(e);
                        return;
                    }
                    k += 1;
                    rounds.store(k, Ordering::Release);
                }
            })
        };
        Workload {
            rounds,
            failure,
            stop,
            thread: Some(thread),
        }
    }

    fn bytes(k: u64) -> Vec<u8> {
        pattern(1_000 + k, 4096 + (k as usize * 104_729) % 600_000)
    }

    fn round(cli: &Cli, files: Option<&Path>, k: u64) -> Result<(), String> {
        let name = |k: u64| format!("g{k}");
        let bytes = Self::bytes(k);
        let o = cli.put("good", &name(k), &bytes, k.is_multiple_of(2));
        if o.code != Some(0) {
            // Say how full the pool was, for a failure out of space.
            let list = cli.run(&["pool", "list"]);
            return Err(format!(
                "put of {} on good failed: {}\n{}",
                name(k),
                o.stderr,
                list.stdout
            ));
        }
        let check = |k: u64| -> Result<(), String> {
            match cli.get("good", &name(k)) {
                Ok(b) if b == Self::bytes(k) => Ok(()),
                Ok(_) => Err(format!("WRONG BYTES read back from good/{}", name(k))),
                Err(e) => Err(format!("get of {} on good failed: {e}", name(k))),
            }
        };
        check(k)?;
        if let Some(dir) = files {
            let f = |k: u64| dir.join(format!("f{k}"));
            write_fsync(&f(k), &bytes).map_err(|e| format!("write of {:?}: {e}", f(k)))?;
            match std::fs::read(f(k)) {
                Ok(b) if b == bytes => {}
                Ok(_) => return Err(format!("WRONG BYTES read back from {:?}", f(k))),
                Err(e) => return Err(format!("read of {:?}: {e}", f(k))),
            }
            if k >= 6 {
                match std::fs::read(f(k - 6)) {
                    Ok(b) if b == Self::bytes(k - 6) => {}
                    Ok(_) => return Err(format!("WRONG BYTES read back from {:?}", f(k - 6))),
                    Err(e) => return Err(format!("read of {:?}: {e}", f(k - 6))),
                }
                std::fs::remove_file(f(k - 6)).map_err(|e| format!("rm {:?}: {e}", f(k - 6)))?;
            }
        }
        if k >= 6 {
            check(k - 6)?;
            let o = cli.run(&["object", "rm", "good", &name(k - 6)]);
            if o.code != Some(0) {
                return Err(format!(
                    "rm of {} on good failed: {}",
                    name(k - 6),
                    o.stderr
                ));
            }
        }
        Ok(())
    }

    fn assert_healthy(&self, when: &str) {
        if let Some(e) = self.failure.lock().unwrap().as_ref() {
            panic!("{when}: the workload on good failed: {e}");
        }
    }

    /// Waits until the workload completes two more rounds: `good` is
    /// serving right now.
    fn assert_progress(&self, when: &str) {
        let from = self.rounds.load(Ordering::Acquire);
        wait_until(&format!("good serves reads and writes {when}"), || {
            self.assert_healthy(when);
            self.rounds.load(Ordering::Acquire) >= from + 2
        });
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            bounded("the workload on good", move || t.join()).expect("workload thread");
        }
        self.assert_healthy("at the end");
        self.rounds.load(Ordering::Acquire)
    }
}

/// The message of a caught panic.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}

fn write_fsync(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// A pool under test with what it must hold.
struct Victim {
    name: &'static str,
    devices: Vec<String>,
    ledger: Arc<Mutex<Ledger>>,
    /// Files fsynced through its mount (when mounted), with their bytes.
    files: BTreeMap<PathBuf, Vec<u8>>,
    mount: Option<PathBuf>,
}

struct World {
    cli: Arc<Cli>,
    /// The folder of every pool device, searched by `pool import -d`.
    devdir: PathBuf,
    good: Workload,
}

impl World {
    fn inject(&self, v: &Victim, kind: &str) {
        for d in &v.devices {
            let out = self.cli.ok(&["pool", "inject", v.name, d, kind]);
            assert!(out.contains(&format!("{kind} (100%)")), "{out}");
        }
    }

    /// Reads of a damaged pool: exact bytes or a clean error that names
    /// the pool and the object and offset.
    fn read_during_fault(&self, v: &Victim, object: &str) -> Option<String> {
        let want = v.ledger.lock().unwrap().acked[object].clone();
        match self.cli.get(v.name, object) {
            Ok(b) => {
                assert!(
                    b == want,
                    "WRONG BYTES from {}/{object} during a fault",
                    v.name
                );
                None
            }
            Err(e) => {
                assert!(e.contains(&format!("'{}'", v.name)), "names the pool: {e}");
                Some(e)
            }
        }
    }

    /// Reads a file through a mount of a damaged pool: exact bytes or EIO.
    fn read_file_during_fault(&self, path: &Path, want: &[u8]) -> Option<std::io::Error> {
        let p = path.to_path_buf();
        match bounded(&format!("read of {path:?}"), move || std::fs::read(p)) {
            Ok(b) => {
                assert!(b == want, "WRONG BYTES from {path:?} during a fault");
                None
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{path:?}: {e}");
                Some(e)
            }
        }
    }

    /// A file written and fsynced through the mount of a pool that cannot
    /// write must not be acknowledged.
    fn fsync_must_fail(&self, v: &Victim) {
        let Some(mnt) = &v.mount else { return };
        let p = mnt.join("during-fault");
        let r = bounded("write and fsync through the mount", move || {
            write_fsync(&p, &pattern(99, 200_000))
        });
        let e = r.expect_err("fsync acknowledged a write the pool could not make durable");
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    }

    /// Clears the injected faults and brings the pool back: `pool clear`,
    /// and export and import if it stays faulted. Waits until it is ONLINE
    /// with no scan running, and its dataset mounted again.
    fn recover(&self, v: &Victim) {
        for d in &v.devices {
            let out = self.cli.ok(&["pool", "inject", v.name, d, "--clear"]);
            assert!(out.contains("no faults"), "{out}");
        }
        let o = self.cli.run(&["pool", "clear", v.name]);
        if o.code != Some(0) {
            // Refusing is honest only for a faulted pool, and the message
            // must say what to do instead.
            clean_failure(&o, &["pool", "clear", v.name]);
            assert!(
                o.stderr.contains("faulted") && o.stderr.contains("export and import"),
                "{}",
                o.stderr
            );
        }
        if self.cli.status(v.name)["health"] == "FAULTED" {
            self.cli.ok(&["pool", "export", v.name]);
            let dir = self.devdir.to_str().unwrap();
            self.cli.ok(&["pool", "import", "-d", dir, v.name]);
        }
        wait_until(&format!("{} is ONLINE again", v.name), || {
            let st = self.cli.status(v.name);
            st["health"] == "ONLINE" && st["scan"]["state"] != "scanning"
        });
        if let Some(m) = &v.mount {
            wait_until(&format!("{} is mounted again", m.display()), || {
                is_mounted(m)
            });
        }
    }

    /// Everything acknowledged reads back exactly; what was not is absent
    /// or exact.
    fn verify(&self, v: &Victim) {
        let l = v.ledger.lock().unwrap();
        for (name, want) in &l.acked {
            match self.cli.get(v.name, name) {
                Ok(b) => assert!(b == *want, "WRONG BYTES from {}/{name}", v.name),
                Err(e) => panic!("{}/{name} was acknowledged and is lost: {e}", v.name),
            }
        }
        for (name, want) in &l.unacked {
            match self.cli.get(v.name, name) {
                Ok(b) => assert!(b == *want, "WRONG BYTES from unacknowledged {name}"),
                Err(e) => assert!(e.contains("no object"), "{name}: {e}"),
            }
        }
        for (path, want) in &v.files {
            let p = path.clone();
            let got = bounded("read through the mount", move || std::fs::read(p));
            match got {
                Ok(b) => assert!(b == *want, "WRONG BYTES from {path:?}"),
                Err(e) => panic!("{path:?} was fsynced and is lost: {e}"),
            }
        }
    }

    /// A scrub after recovery finds nothing it cannot repair, and the
    /// damaged list is empty again.
    fn scrub_clean(&self, v: &Victim) {
        let scan = self.cli.scrub(v.name);
        assert_eq!(scan["errors"], 0, "{}: {scan}", v.name);
        let st = self.cli.status(v.name);
        assert!(damaged(&st).is_empty(), "{}: {st}", v.name);
        assert_eq!(st["health"], "ONLINE", "{st}");
    }
}

/// Whether a message says why a txg could not be written: the writes of a
/// block failed on every device, named; or, when the devices failed one
/// after the other during the sync, none took the uberblock.
fn says_why_writes_failed(message: &str, v: &Victim) -> bool {
    let named = v.devices.iter().all(|d| message.contains(d.as_str()));
    (message.contains("write failed") && named)
        || message.contains("no device accepted the uberblock")
}

/// Objects (and files, when mounted) written and synced before any fault.
fn seed(cli: &Cli, v: &mut Victim, objects: &[(&str, usize)]) {
    for (i, (name, len)) in objects.iter().enumerate() {
        let bytes = pattern(500 + i as u64, *len);
        let o = cli.put(v.name, name, &bytes, true);
        assert_eq!(o.code, Some(0), "{}", o.stderr);
        v.ledger
            .lock()
            .unwrap()
            .acked
            .insert(name.to_string(), bytes);
    }
    if let Some(m) = &v.mount {
        for (i, (name, len)) in objects.iter().enumerate() {
            let p = m.join(format!("{name}.bin"));
            let bytes = pattern(900 + i as u64, *len);
            write_fsync(&p, &bytes).unwrap();
            v.files.insert(p, bytes);
        }
        std::fs::File::open(m).unwrap().sync_all().unwrap();
    }
    // Commit a txg: until then what was synced lives in the intent log and
    // in memory, and the drills below would read it from memory.
    let o = cli.run(&["pool", "sync", v.name]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
}

/// Every device of the mirror vanishes: reads fail naming the object, the
/// first write faults the pool, and status says so and why.
fn vanish_every_device(w: &World, bad: &Victim) {
    let cli = &w.cli;
    w.inject(bad, "vanish");
    if let Some(e) = w.read_during_fault(bad, "keep0") {
        // Unless a background sync already faulted the pool, the read
        // itself failed: it names the object and offset.
        assert!(
            e.contains("object keep0 at offset") || e.contains("is faulted"),
            "{e}"
        );
    }
    for (p, want) in &bad.files {
        w.read_file_during_fault(p, want);
    }
    // A few failed reads need not fault the devices yet (that takes a
    // streak of them); the failed write below does.
    let st = cli.status("bad");
    assert!(st["message"].is_string(), "status says why: {st}");
    let late = pattern(3, 100_000);
    let o = cli.put("bad", "late", &late, true);
    clean_failure(&o, &["object", "put", "bad", "late", "--sync"]);
    assert!(o.stderr.contains("'bad'"), "{}", o.stderr);
    bad.ledger
        .lock()
        .unwrap()
        .unacked
        .insert("late".into(), late);
    let st = cli.status("bad");
    assert_eq!(st["health"], "FAULTED", "a txg sync failed: {st}");
    let message = st["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("stopped accepting changes") && says_why_writes_failed(message, bad),
        "status says why: {st}"
    );
    assert!(
        st["action"]
            .as_str()
            .is_some_and(|a| a.contains("export and import")),
        "{st}"
    );
    let text = cli.status_text("bad");
    assert!(text.contains("state: FAULTED"), "{text}");
    let e = cli.fails(&["object", "ls", "bad"]);
    assert!(e.contains("pool 'bad'") && e.contains("is faulted"), "{e}");
    w.fsync_must_fail(bad);
    w.good.assert_progress("while bad has no devices");
    w.recover(bad);
    w.verify(bad);
}

/// Both sides of the mirror return flipped bits on every read: the reads
/// fail naming the object, status lists it and counts the checksum errors.
fn flip_every_read(w: &World, bad: &Victim) {
    let cli = &w.cli;
    w.inject(bad, "bitflip");
    let e = w
        .read_during_fault(bad, "keep0")
        .expect("no copy can verify");
    assert!(
        e.contains("object keep0 at offset") && e.contains("bad checksum"),
        "{e}"
    );
    let mut file_errors = 0;
    for (p, want) in &bad.files {
        file_errors += usize::from(w.read_file_during_fault(p, want).is_some());
    }
    let st = cli.status("bad");
    // Objects are files of the root dataset: their damage is listed as
    // the dataset's.
    assert!(
        damaged(&st)
            .iter()
            .any(|x| x.starts_with("dataset bad: block at key")),
        "status lists the damaged object: {st}"
    );
    if file_errors > 0 {
        assert!(
            damaged(&st).iter().any(|x| x.contains("bad/fs")),
            "status lists the damaged dataset: {st}"
        );
    }
    for leaf in leaves(&st["vdevs"]) {
        assert!(
            leaf["counters"]["cksum_errors"].as_u64() > Some(0),
            "each side counts its checksum errors: {st}"
        );
    }
    assert!(
        st["message"]
            .as_str()
            .is_some_and(|m| m.contains("damaged") || m.contains("stopped accepting")),
        "{st}"
    );
    let text = cli.status_text("bad");
    assert!(text.contains("dataset bad: block at key"), "{text}");
    w.good.assert_progress("while bad returns flipped bits");
    w.recover(bad);
    w.verify(bad);
    w.scrub_clean(bad);
}

/// Both sides of the mirror fail every read.
fn fail_every_read(w: &World, bad: &Victim) {
    let cli = &w.cli;
    w.inject(bad, "read-error");
    let e = w
        .read_during_fault(bad, "keep0")
        .expect("nothing can be read");
    assert!(
        e.contains("object keep0 at offset") && e.contains("read error"),
        "{e}"
    );
    for (p, want) in &bad.files {
        w.read_file_during_fault(p, want);
    }
    // A device is faulted after a streak of failed reads; a reader that
    // keeps retrying gets there.
    // (A streak of ten faults a device.)
    for _ in 0..10 {
        if cli.status("bad")["health"] != "ONLINE" {
            break;
        }
        w.read_during_fault(bad, "keep0");
    }
    let st = cli.status("bad");
    assert_ne!(st["health"], "ONLINE", "no device can be read: {st}");
    assert!(st["message"].is_string(), "{st}");
    for leaf in leaves(&st["vdevs"]) {
        assert!(
            leaf["counters"]["read_errors"].as_u64() > Some(0),
            "each side counts its read errors: {st}"
        );
    }
    w.good.assert_progress("while bad fails every read");
    w.recover(bad);
    w.verify(bad);
    w.scrub_clean(bad);
}

/// Every device fails every write while a writer is busy: what was
/// acknowledged before stays, the failures are clean and say why.
fn fail_every_write(w: &World, bad: &Victim) {
    let cli = &w.cli;
    let stop = Arc::new(AtomicBool::new(false));
    let busy = writer(cli.clone(), "bad", "w", bad.ledger.clone(), stop.clone());
    let acked_before = bad.ledger.lock().unwrap().acked.len();
    wait_until("the writer on bad has written some", || {
        bad.ledger.lock().unwrap().acked.len() >= acked_before + 2
    });
    let early = bad.ledger.lock().unwrap().failures.clone();
    assert!(
        early.is_empty(),
        "writes failed before any fault: {early:?}"
    );
    w.inject(bad, "write-error");
    wait_until("the writer on bad sees the fault", || {
        !bad.ledger.lock().unwrap().failures.is_empty()
    });
    stop.store(true, Ordering::Relaxed);
    bounded("the writer on bad", move || busy.join()).expect("writer thread");
    for f in &bad.ledger.lock().unwrap().failures {
        assert!(
            f.contains("'bad'") && says_why_writes_failed(f, bad),
            "the error names the pool and says what failed: {f}"
        );
    }
    let st = cli.status("bad");
    assert_eq!(st["health"], "FAULTED", "{st}");
    assert!(
        st["message"]
            .as_str()
            .is_some_and(|m| says_why_writes_failed(m, bad)),
        "{st}"
    );
    w.fsync_must_fail(bad);
    w.read_during_fault(bad, "keep1");
    w.good.assert_progress("while bad fails every write");
    w.recover(bad);
    w.verify(bad);
}

/// The only device of `one` returns flipped bits: nothing to repair from,
/// so reads fail naming the object and the device, status lists the
/// damage, and the other pools do not notice.
fn flip_every_read_of_a_single_device(w: &World, one: &Victim, bad: &Victim) {
    let cli = &w.cli;
    w.inject(one, "bitflip");
    let e = w
        .read_during_fault(one, "keep")
        .expect("no copy can verify");
    assert!(
        e.contains("object keep at offset")
            && e.contains("bad checksum")
            && e.contains(&one.devices[0]),
        "{e}"
    );
    let mut file_errors = 0;
    for (p, want) in &one.files {
        file_errors += usize::from(w.read_file_during_fault(p, want).is_some());
    }
    let st = cli.status("one");
    assert!(
        damaged(&st)
            .iter()
            .any(|x| x.starts_with("dataset one: block at key")),
        "status lists the damaged object: {st}"
    );
    if file_errors > 0 {
        assert!(
            damaged(&st).iter().any(|x| x.contains("one/fs")),
            "status lists the damaged dataset: {st}"
        );
    }
    assert!(leaf_sum(&st["vdevs"], "cksum_errors") > 0, "{st}");
    let text = cli.status_text("one");
    assert!(
        text.contains("dataset one: block at key") && text.contains("damaged"),
        "{text}"
    );
    w.good.assert_progress("while one returns flipped bits");
    w.verify(bad);
    w.recover(one);
    w.verify(one);
    w.scrub_clean(one);
}

#[test]
fn faults_beyond_redundancy_give_clean_errors_and_spare_other_pools() {
    let fuse = require::fuse();
    if !fuse {
        eprintln!("(without mounts: objects only)");
    }
    let dir = tempfile::tempdir().unwrap();
    let devdir = dir.path().join("dev");
    let scratch = dir.path().join("scratch");
    std::fs::create_dir_all(&devdir).unwrap();
    std::fs::create_dir_all(&scratch).unwrap();
    let log = dir.path().join("daemon.log");
    // Reads must reach the damaged devices: the smallest block cache keeps
    // recently read blocks out of memory (with a warm cache a read of a
    // block read before the damage is served, rightly, from memory).
    let mut d = Daemon::start_logged(dir.path(), &["--cache-mib", "1"], &log);
    let cli = Arc::new(Cli {
        socket: d.socket.clone(),
        scratch,
        next: AtomicU64::new(0),
    });

    let g = files(&devdir, "good", 4, 64 << 20);
    cli.ok(&[
        "pool", "create", "good", "raidz1", &g[0], &g[1], &g[2], &g[3],
    ]);
    let b = files(&devdir, "bad", 2, 64 << 20);
    cli.ok(&["pool", "create", "bad", "mirror", &b[0], &b[1]]);
    let s = files(&devdir, "one", 1, 64 << 20);
    cli.ok(&["pool", "create", "one", &s[0]]);
    let mount = |pool: &str| -> Option<PathBuf> {
        let fs = format!("{pool}/fs");
        if !fuse {
            cli.ok(&["dataset", "create", &fs]);
            return None;
        }
        let m = dir.path().join("mnt").join(pool);
        let mp = format!("mountpoint={}", m.display());
        cli.ok(&["dataset", "create", "-o", &mp, &fs]);
        assert!(is_mounted(&m), "{fs} is mounted");
        Some(m)
    };
    let good_files = mount("good");
    let victim = |name, devices: &[String]| Victim {
        name,
        devices: devices.to_vec(),
        ledger: Arc::default(),
        files: BTreeMap::new(),
        mount: mount(name),
    };
    let mut bad = victim("bad", &b);
    let mut one = victim("one", &s);
    seed(&cli, &mut bad, &[("keep0", 3 << 20), ("keep1", 100_000)]);
    seed(&cli, &mut one, &[("keep", 1 << 20)]);

    let w = World {
        cli: cli.clone(),
        devdir,
        good: Workload::start(cli.clone(), good_files),
    };
    w.good.assert_progress("before any fault");

    vanish_every_device(&w, &bad);
    flip_every_read(&w, &bad);
    fail_every_read(&w, &bad);
    fail_every_write(&w, &bad);
    flip_every_read_of_a_single_device(&w, &one, &bad);

    // good never noticed anything.
    let rounds = w.good.finish();
    assert!(rounds >= 10, "the workload on good ran {rounds} rounds");
    let st = cli.status("good");
    assert_eq!(st["health"], "ONLINE", "{st}");
    for c in ["read_errors", "write_errors", "cksum_errors"] {
        assert_eq!(leaf_sum(&st["vdevs"], c), 0, "{c} on good: {st}");
    }
    let scan = cli.scrub("good");
    assert_eq!(
        (scan["errors"].as_u64(), scan["repaired_bytes"].as_u64()),
        (Some(0), Some(0)),
        "good scrubs clean: {scan}"
    );
    assert!(
        d.child.try_wait().unwrap().is_none(),
        "the daemon is still running"
    );
    cli.ok(&["daemon", "stop"]);
    let exit = bounded("the daemon's exit", move || {
        let mut d = d;
        d.child.wait()
    });
    assert!(exit.unwrap().success(), "the daemon stops cleanly");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains("panicked"), "the daemon panicked: {log}");
}
