//! libiscsi's conformance suite, `iscsi-test-cu`, against the server
//! over `MemDevice`. `tests/iscsi-test-cu.txt` pins which tests pass
//! (`pass NAME`) and which are skipped and why (`skip NAME  # why`);
//! this runs every `pass` entry and fails if any of them fails.
//!
//! `TARN_ISCSI_SUITES="ALL.Read10 ALL.Unmap"` runs those instead and
//! only reports (to try suites before pinning them); with
//! `TARN_ISCSI_VERBOSE=1` the suite logs every step it takes, and
//! `TARN_ISCSI_BLOCK=512` serves a device of 512-byte blocks.

mod common;

use common::*;
use tarn_iscsi::{IscsiConfig, IscsiTarget};
use tarn_testkit::require;

/// The `pass` entries: (name, device block size). An entry may name
/// the device's block size after the test (`pass NAME block=512`);
/// the default is 4096.
fn pinned() -> Vec<(String, u32)> {
    let list = include_str!("iscsi-test-cu.txt");
    list.lines()
        .filter_map(|l| l.strip_prefix("pass "))
        .filter_map(|l| {
            let mut w = l.split('#').next().unwrap_or("").split_whitespace();
            let name = w.next()?.to_string();
            let block = w
                .next()
                .and_then(|b| b.strip_prefix("block="))
                .map(|b| b.parse().expect("block=N in iscsi-test-cu.txt"))
                .unwrap_or(4096);
            Some((name, block))
        })
        .collect()
}

/// Runs one test (or suite) on a fresh server over a device of `block`
/// byte blocks; (passed, output).
fn run_one(name: &str, block: u32) -> (bool, String) {
    // WriteSame16.Unmap writes 65536 blocks in one WRITE(16) whatever
    // the Block Limits page says, so transfers of 32 MiB are allowed.
    let cfg = IscsiConfig {
        max_transfer: 32 << 20,
        ..IscsiConfig::default()
    };
    let r = start_with(cfg, vec![IscsiTarget::new(IQN, mem(64 * MIB, block))]);
    let (ok, out, err) = run(&[
        "iscsi-test-cu",
        "--dataloss",
        if std::env::var_os("TARN_ISCSI_VERBOSE").is_some() {
            "--verbose"
        } else if std::env::var_os("TARN_ISCSI_SUITES").is_some() {
            "--normal"
        } else {
            "--silent"
        },
        "--fail",
        &format!("--test={name}"),
        &url(&r, IQN),
    ]);
    let text = format!("{out}\n{err}");
    // CUnit's summary: "tests  Total  Ran  Passed  Failed  Inactive".
    // Every test must have run and passed.
    let counts: Option<Vec<u64>> = text
        .lines()
        .find(|l| l.trim_start().starts_with("tests "))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .filter_map(|w| w.parse().ok())
                .collect()
        });
    let good = match counts.as_deref() {
        Some([total, ran, passed, failed, ..]) => {
            *total > 0 && ran == total && passed == ran && *failed == 0
        }
        _ => false,
    };
    // A "[SKIPPED]" line means a test returned early; that is not a
    // pass. (The suite's start-up probes print such lines too, for
    // PERSISTENT RESERVE IN and REPORT SUPPORTED OPERATION CODES, but
    // the target implements both, so they print none.)
    let skipped = text.lines().any(|l| l.contains("[SKIPPED]"));
    (ok && good && !skipped, text)
}

#[test]
fn iscsi_test_cu_pinned_tests_pass() {
    if require::program("iscsi-test-cu").is_none() {
        return;
    }
    if let Ok(s) = std::env::var("TARN_ISCSI_SUITES") {
        let block = std::env::var("TARN_ISCSI_BLOCK")
            .ok()
            .and_then(|b| b.parse().ok())
            .unwrap_or(4096);
        for name in s.split_whitespace() {
            let (ok, text) = run_one(name, block);
            eprintln!("=== {name}: {}\n{text}", if ok { "pass" } else { "FAIL" });
        }
        return;
    }
    // Each entry runs on its own server, and most of an entry's time is
    // the suite waiting on its own round trips, so a few run at once.
    let queue = std::sync::Mutex::new(pinned());
    let failed = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| loop {
                let Some((name, block)) = queue.lock().unwrap().pop() else {
                    break;
                };
                let (ok, text) = run_one(&name, block);
                if !ok {
                    eprintln!("=== {name} failed:\n{text}");
                    failed.lock().unwrap().push(name);
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap();
    assert!(failed.is_empty(), "iscsi-test-cu failures: {failed:?}");
}

/// How many pinned entries run at once.
const WORKERS: usize = 4;
