//! Crash test of the real binary: a writer drives a mixed workload of
//! synchronous and asynchronous object writes and deletes through the admin
//! socket while the daemon is SIGKILLed at a random moment. After each kill
//! the daemon is restarted (it re-imports its pool on its own) and the pool
//! must:
//!
//! - import, ONLINE, at a txg no older than the last acknowledged one;
//! - hold, for every object, the state of the model after some prefix of the
//!   operations that includes every operation acknowledged before the last
//!   acknowledged synchronous write (a txg is atomic: all or nothing);
//! - read back without a single checksum error and pass a scrub with
//!   nothing to repair, after every round.
//!
//! Rounds: `TARN_CRASH_ROUNDS` (default 50). The seed is printed; rerun with
//! `TARN_CRASH_SEED=<seed>` to replay the same random choices.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::process::Daemon;
use common::seeded::crash_settings;
use tarn_testkit::data::Rng;

fn call(socket: &Path, method: &str, params: Value) -> Result<Value, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(|e| e.to_string())?;
    let req = json!({"id": 1, "method": method, "params": params});
    let mut line = serde_json::to_vec(&req).map_err(|e| e.to_string())?;
    line.push(b'\n');
    s.write_all(&line).map_err(|e| format!("send: {e}"))?;
    let mut r = BufReader::new(s);
    let mut out = String::new();
    r.read_line(&mut out).map_err(|e| format!("recv: {e}"))?;
    if out.is_empty() {
        return Err("connection closed".into());
    }
    let v: Value = serde_json::from_str(&out).map_err(|e| format!("bad response {out:?}: {e}"))?;
    match v.get("error") {
        Some(e) => Err(format!("api error: {e}")),
        None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
    }
}

/// One operation of the workload, in the order it was issued.
#[derive(Clone, Debug)]
enum Op {
    Write { name: String, data: Arc<Vec<u8>> },
    Delete { name: String },
}

/// An issued operation and what the daemon said about it.
struct Issued {
    op: Op,
    sync: bool,
    acked: bool,
    txg: u64,
}

/// The object contents after the first `n` operations.
fn model(base: &BTreeMap<String, Vec<u8>>, ops: &[Op]) -> BTreeMap<String, Vec<u8>> {
    let mut m = base.clone();
    for op in ops {
        match op {
            Op::Write { name, data } => {
                let e = m.entry(name.clone()).or_default();
                if e.len() < data.len() {
                    e.resize(data.len(), 0);
                }
                e[..data.len()].copy_from_slice(data);
            }
            Op::Delete { name } => {
                m.remove(name);
            }
        }
    }
    m
}

fn observe(socket: &Path, scratch: &Path) -> BTreeMap<String, Vec<u8>> {
    let list = call(socket, "object.list", json!({"pool": "tank"})).expect("object list");
    let mut out = BTreeMap::new();
    for o in list.as_array().expect("list is an array") {
        let name = o["name"].as_str().expect("name").to_string();
        let to = scratch.join("read-back");
        call(
            socket,
            "object.read",
            json!({"pool": "tank", "object": name, "to_path": to}),
        )
        .unwrap_or_else(|e| panic!("read of {name} failed after crash: {e}"));
        out.insert(name, std::fs::read(&to).unwrap());
    }
    out
}

/// Sum of the CKSUM counters of every leaf in a status vdev tree.
fn cksum_errors(vdevs: &Value) -> u64 {
    vdevs
        .as_array()
        .map(|v| {
            v.iter()
                .map(|x| match x["children"].as_array() {
                    Some(c) if !c.is_empty() => cksum_errors(&x["children"]),
                    _ => x["counters"]["cksum_errors"].as_u64().unwrap_or(0),
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Runs a scrub to the end and returns its final scan status.
fn scrub(socket: &Path) -> Value {
    call(
        socket,
        "pool.scrub",
        json!({"name": "tank", "action": "start"}),
    )
    .expect("start scrub");
    let t0 = Instant::now();
    loop {
        let st = call(socket, "pool.status", json!({"name": "tank"})).unwrap();
        let scan = st[0]["scan"].clone();
        if scan["state"] == "finished" {
            return scan;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "scrub did not finish: {scan}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn sigkill_during_writes() {
    let (rounds, seed) = crash_settings(50);
    eprintln!("crash test: {rounds} rounds, replay with TARN_CRASH_SEED={seed}");
    let mut rng = Rng::new(seed);

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tarn.sock");
    let devs = tarn_testkit::files::make(dir.path(), "d", 4, 192 << 20);
    let mut daemon = Daemon::start(dir.path());
    call(
        &socket,
        "pool.create",
        json!({"name": "tank", "vdevs": [{"kind": "raidz1", "devices": devs}], "properties": {"compression": "off"}}),
    )
    .expect("create pool");

    let names: Vec<String> = (0..12).map(|i| format!("obj{i}")).collect();
    let mut state: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut last_acked_txg = 0u64;
    for round in 0..rounds {
        // The writer: issues ops until the daemon dies, recording each op
        // before sending it and whether it was acknowledged.
        let ops: Arc<Mutex<Vec<Issued>>> = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let ops = Arc::clone(&ops);
            let stop = Arc::clone(&stop);
            let socket = socket.clone();
            let names = names.clone();
            let scratch = dir.path().to_path_buf();
            let mut wrng = rng.fork();
            std::thread::spawn(move || {
                let mut k = 0;
                while !stop.load(Ordering::Relaxed) {
                    let name = names[wrng.below(names.len() as u64) as usize].clone();
                    let sync = wrng.below(10) < 6;
                    let r = if wrng.below(12) == 0 {
                        ops.lock().unwrap().push(Issued {
                            op: Op::Delete { name: name.clone() },
                            sync: false,
                            acked: false,
                            txg: 0,
                        });
                        call(
                            &socket,
                            "object.delete",
                            json!({"pool": "tank", "object": name}),
                        )
                        .map(|_| 0)
                    } else {
                        let len = 1 + wrng.below(1 << 20) as usize;
                        let data = wrng.bytes(len);
                        let path = scratch.join(format!("w{k}"));
                        k += 1;
                        std::fs::write(&path, &data).unwrap();
                        ops.lock().unwrap().push(Issued {
                            op: Op::Write {
                                name: name.clone(),
                                data: Arc::new(data),
                            },
                            sync,
                            acked: false,
                            txg: 0,
                        });
                        call(&socket, "object.write", json!({"pool": "tank", "object": name, "from_path": path, "sync": sync}))
                            .map(|v| v["txg"].as_u64().unwrap_or(0))
                    };
                    match r {
                        Ok(txg) => {
                            let mut g = ops.lock().unwrap();
                            if let Some(last) = g.last_mut() {
                                last.acked = true;
                                last.txg = txg;
                            }
                        }
                        Err(e) if e.starts_with("api error") && e.contains("not_found") => {
                            // Deleting a missing object: a no-op, acknowledged.
                            let mut g = ops.lock().unwrap();
                            if let Some(last) = g.last_mut() {
                                last.acked = true;
                            }
                        }
                        Err(_) => break,
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(20 + rng.below(400)));
        daemon.kill();
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("writer thread");
        let ops = std::mem::take(&mut *ops.lock().unwrap());

        daemon = Daemon::start(dir.path());
        let status = call(&socket, "pool.status", json!({"name": "tank"}))
            .unwrap_or_else(|e| panic!("round {round}: pool not back after restart: {e}"));
        let st = &status[0];
        assert_eq!(st["health"], "ONLINE", "round {round}: {st}");
        let txg = st["txg"].as_u64().unwrap();
        // Everything acknowledged up to the last acknowledged synchronous
        // write must be there; the rest may or may not be.
        let must = ops
            .iter()
            .rposition(|i| i.acked && i.sync && matches!(i.op, Op::Write { .. }))
            .map(|i| i + 1)
            .unwrap_or(0);
        for i in &ops[..must] {
            if i.sync && i.acked {
                last_acked_txg = last_acked_txg.max(i.txg);
            }
        }
        assert!(
            txg >= last_acked_txg,
            "round {round}: imported txg {txg} older than acknowledged txg {last_acked_txg}"
        );
        let seen = observe(&socket, dir.path());
        let plain: Vec<Op> = ops.iter().map(|i| i.op.clone()).collect();
        let matched = (must..=plain.len())
            .rev()
            .find(|&j| model(&state, &plain[..j]) == seen);
        let Some(j) = matched else {
            panic!(
                "round {round} (seed {seed}): pool state matches no prefix from {must} to {} of the {} operations",
                plain.len(),
                plain.len()
            );
        };
        state = model(&state, &plain[..j]);
        // Full verify: nothing read so far hit a bad checksum, and a scrub
        // of the whole pool finds nothing to repair.
        let st = call(&socket, "pool.status", json!({"name": "tank"})).unwrap();
        assert_eq!(
            cksum_errors(&st[0]["vdevs"]),
            0,
            "round {round}: checksum errors after the crash: {st}"
        );
        let scan = scrub(&socket);
        assert_eq!(
            (scan["errors"].as_u64(), scan["repaired_bytes"].as_u64()),
            (Some(0), Some(0)),
            "round {round}: {scan}"
        );
        for f in std::fs::read_dir(dir.path()).unwrap().flatten() {
            if f.file_name().to_string_lossy().starts_with('w') {
                let _ = std::fs::remove_file(f.path());
            }
        }
    }
    daemon.stop();
}
