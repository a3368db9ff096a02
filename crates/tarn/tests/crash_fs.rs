//! Crash loop of the real daemon under a file workload: a writer creates,
//! overwrites, appends to and removes files on a FUSE mount of a raidz1
//! dataset, calling fsync after each change like a database, while the
//! daemon is SIGKILLed at a random moment. After every kill the daemon is
//! restarted (it re-imports its pool and mounts the dataset again by its
//! mountpoint property), and:
//!
//! - every change whose fsync returned is there, with its exact bytes (a
//!   removed file whose fsync of the directory returned is gone);
//! - every other file either matches one of the states the writer gave it
//!   or does not exist (a txg is atomic: no torn file);
//! - at the end a scrub finds nothing to repair.
//!
//! Rounds: `TARN_CRASH_ROUNDS` (default 100). The seed is printed; rerun
//! with `TARN_CRASH_SEED=<seed>` to replay the same choices.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::process::{files, Daemon};
use common::seeded::crash_settings;
use tarn_testkit::data::{pattern, Rng};
use tarn_testkit::require;

/// What the writer knows about each file: every content it ever wrote
/// (any of them may be on disk after a crash), and the content durable
/// for certain (None: durably removed, or never durable).
#[derive(Default, Clone)]
struct Known {
    seen: Vec<Option<Vec<u8>>>,
    durable: Option<Option<Vec<u8>>>,
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// fsynced changes over all rounds: the test must have exercised something.
static FSYNCED: AtomicU64 = AtomicU64::new(0);

/// Runs the writer until an I/O fails (the daemon died).
fn writer(mnt: &Path, seed: u64, model: &Mutex<BTreeMap<String, Known>>) {
    let mut r = Rng::new(seed);
    for step in 0.. {
        let name = format!("f{}", r.below(12));
        let path = mnt.join(&name);
        let op = r.below(10);
        let mut m = model.lock().unwrap();
        let k = m.entry(name.clone()).or_default();
        let prev = k.seen.last().cloned().flatten();
        let next: Option<Vec<u8>> = match op {
            0 => None,
            1..=2 => prev.as_ref().map(|p| {
                let mut v = p.clone();
                v.extend_from_slice(&pattern(seed ^ step, 1 + r.below(20_000) as usize));
                v
            }),
            _ => Some(pattern(seed ^ (step << 8), r.below(300_000) as usize)),
        };
        let next = match (op, next) {
            (1..=2, None) => Some(pattern(seed ^ step, 1000)),
            (_, n) => n,
        };
        k.seen.push(next.clone());
        drop(m);
        let res = match &next {
            None => std::fs::remove_file(&path)
                .or_else(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .and_then(|()| fsync_dir(mnt)),
            Some(bytes) => (|| {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&path)?;
                f.write_all(bytes)?;
                f.sync_all()?;
                fsync_dir(mnt)
            })(),
        };
        if res.is_err() {
            return;
        }
        if let Some(k) = model.lock().unwrap().get_mut(&name) {
            k.durable = Some(next);
        }
        FSYNCED.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn sigkill_during_fsync_heavy_file_workload() {
    if !require::fuse() {
        return;
    }
    let (rounds, seed) = crash_settings(100);
    eprintln!("crash_fs seed {seed} (replay: TARN_CRASH_SEED={seed})");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let log = dir.path().join("daemon.log");
    let mut d = Daemon::start_logged(dir.path(), &["--txg-interval", "1"], &log);
    let f = files(dir.path(), "m", 4, 256 << 20);
    d.ok(&[
        "pool", "create", "tank", "raidz1", &f[0], &f[1], &f[2], &f[3],
    ]);
    let mp = format!("mountpoint={}", mnt.display());
    d.ok(&["dataset", "create", "-o", &mp, "tank/db"]);
    let model: Arc<Mutex<BTreeMap<String, Known>>> = Arc::default();
    for round in 0..rounds {
        assert!(require::is_mounted(&mnt), "round {round}: not mounted");
        let m = model.clone();
        let p = mnt.clone();
        let wseed = rng.next_u64();
        let w = std::thread::spawn(move || writer(&p, wseed, &m));
        std::thread::sleep(Duration::from_millis(20 + rng.below(250)));
        // The dead mount stays until the writer has seen it fail: detached
        // earlier, the writer would go on in the directory beneath it.
        d.kill_in_place();
        let t0 = Instant::now();
        while !w.is_finished() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "round {round}: the writer hangs on a dead mount"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        w.join().unwrap();
        drop(d); // detaches the dead mount
        d = Daemon::start_logged(dir.path(), &["--txg-interval", "1"], &log);
        // What the restarted daemon said, for the failure messages below.
        let said = || std::fs::read_to_string(&log).unwrap_or_default();
        // Check every file against what the writer knows, then make the
        // state on disk the new baseline (any seen state is now fixed).
        let mut m = model.lock().unwrap();
        for (name, k) in m.iter_mut() {
            let on_disk = match std::fs::read(mnt.join(name)) {
                Ok(b) => Some(b),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => panic!("round {round} (seed {seed}): reading {name}: {e}"),
            };
            if let Some(durable) = &k.durable {
                // The durable state, or a later one the writer had started.
                let pos = k.seen.iter().rposition(|s| s == durable);
                let later = pos.map(|p| &k.seen[p..]).unwrap_or(&[]);
                assert!(
                    later.contains(&on_disk),
                    "round {round} (seed {seed}): {name} lost an fsynced change \
                     ({} bytes on disk); the daemon said:\n{}",
                    on_disk.as_ref().map_or(0, |b| b.len()),
                    said()
                );
            } else {
                assert!(
                    on_disk.is_none() || k.seen.contains(&on_disk),
                    "round {round} (seed {seed}): {name} holds bytes nobody wrote; \
                     the daemon said:\n{}",
                    said()
                );
            }
            k.seen = vec![on_disk.clone()];
            k.durable = Some(on_disk);
        }
    }
    let done = FSYNCED.load(Ordering::Relaxed);
    assert!(
        done >= rounds,
        "only {done} fsynced changes in {rounds} rounds"
    );
    eprintln!("crash_fs: {done} fsynced changes over {rounds} kills");
    let out = d.ok(&["pool", "scrub", "--wait", "tank"]);
    let status = d.ok(&["-o", "json", "pool", "status", "tank"]);
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v[0]["scan"]["errors"], 0, "{out}");
    assert_eq!(v[0]["scan"]["repaired_bytes"], 0, "{out}");
    assert_eq!(v[0]["health"], "ONLINE", "{status}");
    d.stop();
}
