//! `tarn bench` in a FUSE mount of the daemon (the pool mode with a
//! sweep, then `--dir`) and from a client machine over NFS (`--client
//! nfs://…`, where no daemon is): every column a figure, scratch
//! datasets and test files gone afterwards, clear errors for a wrong
//! share or port, and the reads it claims to have made reached the pool
//! (its devices' read counters; see [`reads_reached_the_pool`]). That
//! last check is what catches a bench measuring the wrong thing: the
//! client's page cache instead of the file, or a cache of its own.
//!
//! Nothing here compares speeds: single runs on this machine's two
//! shared cores swing by a factor of three, and CI never fails on a
//! timing. The comparison with fio's figures for the same jobs on the
//! same mount lives in `scripts/bench-sweep.sh`, reported as ratios (the
//! NFS client's against libnfs: `docs/performance.md`).

mod common;

use std::process::Command;

use common::process::{files, Daemon};
use tarn_testkit::clients::nfs_url;
use tarn_testkit::net::free_port;
use tarn_testkit::require;

/// Read operations the pool's devices were asked for since import (the
/// mirror's counters, summed over its members).
fn device_reads(d: &Daemon) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(&d.ok(&["-o", "json", "pool", "status", "tank"])).unwrap();
    v[0]["vdevs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["counters"]["read_ops"].as_u64().unwrap())
        .sum()
}

/// The random reads a row claims (both random-read workloads ran for
/// `runtime` seconds at the reported rate) against the reads the pool's
/// devices served meanwhile. The daemon runs with a 1 MiB block cache,
/// which holds no 128 KiB block, and at most 16 MiB of dirty data, so
/// most of the 64 MiB test file is on the devices when it is read (data
/// not yet synced is answered from memory): each random read that
/// reached tarn costs a device read, but for the unsynced tail and reads
/// of one block in flight together, hence the half. A bench that read
/// the client's page cache, or a cache of its own, claims far more reads
/// than the devices saw (without O_DIRECT: 1.3 million against 28,000).
fn reads_reached_the_pool(what: &str, row: &serde_json::Value, runtime: f64, served: u64) {
    let claimed = (row["randread_iops_qd32"].as_f64().unwrap()
        + row["read_iops_qd1"].as_f64().unwrap())
        * runtime;
    eprintln!("{what}: {claimed:.0} random reads claimed, {served} device reads");
    assert!(
        served as f64 >= claimed / 2.0,
        "{what}: the bench claims {claimed:.0} random reads, the devices served {served}"
    );
}

/// A row has every column, each a figure above zero.
fn every_column(r: &serde_json::Value) {
    for col in [
        "randread_iops_qd32",
        "read_iops_qd1",
        "write_iops_qd32",
        "read_mb_s",
        "write_mb_s",
        "cat_mb_s",
    ] {
        assert!(r[col].as_f64().is_some_and(|x| x > 0.0), "{col}: {r}");
    }
}

#[test]
fn bench_reports_every_column_and_its_reads_reach_the_pool() {
    if !require::fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(dir.path(), &["--cache-mib", "1", "--dirty-max-mib", "16"]);
    let f = files(dir.path(), "m", 2, 512 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);

    // The pool mode: a scratch dataset per combination, gone afterwards.
    let v: serde_json::Value = serde_json::from_str(&d.ok(&[
        "-o",
        "json",
        "bench",
        "tank",
        "--size",
        "32M",
        "--runtime",
        "1",
        "--sweep",
        "compression=off,lz4",
    ]))
    .unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        every_column(r);
    }
    assert_eq!(
        rows[1]["settings"][0],
        serde_json::json!(["compression", "lz4"])
    );
    let left = d.ok(&["dataset", "list"]);
    assert!(!left.contains("tarn-bench"), "scratch dataset left: {left}");

    // The same workloads in a directory, beside fio on the same mount.
    d.ok(&["dataset", "create", "tank/b"]);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    d.ok(&["mount", "tank/b", mnt.to_str().unwrap()]);
    let before = device_reads(&d);
    let v: serde_json::Value = serde_json::from_str(&d.ok(&[
        "-o",
        "json",
        "bench",
        "--dir",
        mnt.to_str().unwrap(),
        "--size",
        "64M",
        "--runtime",
        "2",
    ]))
    .unwrap();
    let served = device_reads(&d) - before;
    let ours = &v[0];
    every_column(ours);
    reads_reached_the_pool("in a FUSE mount", ours, 2.0, served);
    d.ok(&["unmount", "tank/b"]);
    d.stop();
}

#[test]
fn bench_measures_an_nfs_share_from_a_client() {
    if !require::programs(&["nfs-cp", "nfs-cat", "nfs-ls"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let d = Daemon::start_with(
        dir.path(),
        &[
            "--nfs",
            &listen,
            "--cache-mib",
            "1",
            "--dirty-max-mib",
            "16",
        ],
    );
    let f = files(dir.path(), "m", 2, 512 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    d.ok(&["dataset", "create", "tank/b"]);
    d.ok(&[
        "share",
        "add",
        "b",
        "tank/b",
        "--nfs",
        "127.0.0.1/32",
        "--no-root-squash",
    ]);
    // The client side needs no daemon: the CLI is pointed at no socket.
    let client = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tarn"))
            .arg("--socket")
            .arg(dir.path().join("no-daemon-here.sock"))
            .args(args)
            .env_remove("TARN_SOCKET")
            .output()
            .unwrap()
    };
    let url = format!("nfs://127.0.0.1:{port}/b");
    let before = device_reads(&d);
    let out = client(&[
        "-o",
        "json",
        "bench",
        "--client",
        &url,
        "--size",
        "64M",
        "--runtime",
        "1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ours = &v[0];
    every_column(ours);
    reads_reached_the_pool("over NFS", ours, 1.0, device_reads(&d) - before);
    let (ok, listing, err) = tarn_testkit::clients::tool(&["nfs-ls", &nfs_url(port, port, "/b")]);
    assert!(ok, "{err}");
    assert!(
        !String::from_utf8_lossy(&listing).contains("tarn-bench"),
        "the test file is left: {}",
        String::from_utf8_lossy(&listing)
    );

    // Clear errors: a share that does not exist, a port nobody serves.
    let out = client(&[
        "bench",
        "--client",
        &format!("nfs://127.0.0.1:{port}/nope"),
        "--size",
        "16M",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("mounting /nope"),
        "{err}"
    );
    let out = client(&[
        "bench",
        "--client",
        &format!("nfs://127.0.0.1:{}/b", free_port()),
        "--size",
        "16M",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("cannot connect"),
        "{err}"
    );
    d.stop();
}
