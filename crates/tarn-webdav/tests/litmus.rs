//! The litmus WebDAV compliance suite (basic, copymove, props, locks,
//! http) against the server, over a MemBackend and over a real pool.

mod common;

use std::net::SocketAddr;
use std::process::Command;

use common::*;
use tarn_webdav::Share;

/// Runs litmus against `url` and fails the test on any failed check.
fn run_litmus(addr: SocketAddr, share: &str) {
    let dir = tempfile::tempdir().unwrap();
    let url = url(addr, &format!("/{share}/"));
    let out = Command::new("litmus")
        .args(["--keep-going", &url, "alice", "secret"])
        .env("TESTS", "basic copymove props locks http")
        .current_dir(dir.path())
        .output()
        .expect("litmus runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{text}");
    // Warnings count as failures too: litmus warns, for instance, when a
    // DELETE with a fragment removes the collection, or when a requested
    // property is left out of a PROPFIND answer instead of listed as 404.
    let failures: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("FAIL") || l.contains("ERROR") || l.contains("WARNING"))
        .collect();
    // Every suite prints a summary "<- summary for `x': of N tests run: N
    // passed, 0 failed. 100.0%".
    let summaries: Vec<&str> = text.lines().filter(|l| l.contains("summary for")).collect();
    let failed_summaries: Vec<&&str> = summaries
        .iter()
        .filter(|l| !l.contains(" 0 failed"))
        .collect();
    if !out.status.success() || !failures.is_empty() || !failed_summaries.is_empty() {
        let log = std::fs::read_to_string(dir.path().join("debug.log")).unwrap_or_default();
        let tail: String = log
            .lines()
            .rev()
            .take(80)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        panic!(
            "litmus failed (exit {:?}):\n{}\n{}\n--- debug.log tail ---\n{tail}",
            out.status.code(),
            failures.join("\n"),
            failed_summaries
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert_eq!(summaries.len(), 5, "expected five suite summaries:\n{text}");
}

#[test]
fn litmus_mem_backend() {
    if !require("litmus") {
        return;
    }
    let fs = mem_fs();
    let server = start(vec![Share::new("share", fs)]);
    run_litmus(server.local_addr(), "share");
    server.stop();
}

#[test]
fn litmus_real_dataset() {
    if !require("litmus") {
        return;
    }
    let real = real_fs(512 << 20, pool_opts());
    let server = start(vec![Share::new("tank", real.fs.clone())]);
    run_litmus(server.local_addr(), "tank");
    server.stop();
    real.pool.sync().unwrap();
}
