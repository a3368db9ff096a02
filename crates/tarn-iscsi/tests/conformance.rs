//! libiscsi's conformance suite, `iscsi-test-cu`, against the server
//! over `MemDevice`. `tests/iscsi-test-cu.txt` pins which tests pass
//! (`pass NAME`) and which are skipped and why (`skip NAME  # why`);
//! this runs every `pass` entry and fails if any of them fails.
//!
//! `TARN_ISCSI_SUITES="ALL.Read10 ALL.Unmap"` runs those instead and
//! only reports (to try suites before pinning them); with
//! `TARN_ISCSI_VERBOSE=1` the suite logs every step it takes,
//! `TARN_ISCSI_BLOCK=512` serves a device of 512-byte blocks, and
//! `TARN_ISCSI_PATHS=2` gives the suite the target's URL twice (two
//! paths to one logical unit, for the multipath tests).

mod common;

use common::*;
use tarn_iscsi::{IscsiConfig, IscsiTarget};
use tarn_testkit::require;

/// How a pinned entry runs: the device's block size and how many paths
/// (sessions, each with its own I_T nexus) the suite gets.
#[derive(Clone, Copy)]
struct Setup {
    block: u32,
    paths: usize,
}

/// The `pass` entries with their setups. After the name an entry may
/// give the device's block size (`block=512`; default 4096) and the
/// number of paths (`paths=2`: the URL twice, as the multipath tests
/// need; default 1).
fn pinned() -> Vec<(String, Setup)> {
    let list = include_str!("iscsi-test-cu.txt");
    list.lines()
        .filter_map(|l| l.strip_prefix("pass "))
        .filter_map(|l| {
            let mut w = l.split('#').next().unwrap_or("").split_whitespace();
            let name = w.next()?.to_string();
            let mut setup = Setup {
                block: 4096,
                paths: 1,
            };
            for opt in w {
                match opt.split_once('=') {
                    Some(("block", b)) => setup.block = b.parse().expect("block=N"),
                    Some(("paths", n)) => setup.paths = n.parse().expect("paths=N"),
                    _ => panic!("unknown option {opt:?} in iscsi-test-cu.txt"),
                }
            }
            Some((name, setup))
        })
        .collect()
}

/// Runs one test (or suite) on a fresh server over a device of
/// `setup.block` byte blocks, given `setup.paths` URLs of it; (passed,
/// output).
fn run_one(name: &str, setup: Setup) -> (bool, String) {
    // WriteSame16.Unmap writes 65536 blocks in one WRITE(16) whatever
    // the Block Limits page says, so transfers of 32 MiB are allowed.
    let cfg = IscsiConfig {
        max_transfer: 32 << 20,
        ..IscsiConfig::default()
    };
    let r = start_with(cfg, vec![IscsiTarget::new(IQN, mem(64 * MIB, setup.block))]);
    let u = url(&r, IQN);
    let test = format!("--test={name}");
    let mut args = vec![
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
        &test,
    ];
    args.extend(std::iter::repeat_n(u.as_str(), setup.paths.max(1)));
    let (ok, out, err) = run(&args);
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
        let env = |k: &str, d| {
            std::env::var(k)
                .ok()
                .and_then(|b| b.parse().ok())
                .unwrap_or(d)
        };
        let setup = Setup {
            block: env("TARN_ISCSI_BLOCK", 4096) as u32,
            paths: env("TARN_ISCSI_PATHS", 1),
        };
        for name in s.split_whitespace() {
            let (ok, text) = run_one(name, setup);
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
                let Some((name, setup)) = queue.lock().unwrap().pop() else {
                    break;
                };
                let (ok, text) = run_one(&name, setup);
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
