//! `tarn bench` against fio on the same mount in the same run: its random
//! read (4k, 32 and 1 in flight) and random write (4k, 32 in flight)
//! figures must agree with fio's within a factor of 2.5 (both share this
//! machine's two cores with the daemon, so single runs swing by tens of
//! percent; 2.5 still catches a benchmark that measures the wrong thing:
//! the page cache instead of the file, one request in flight instead of
//! 32). They agreed within 0.76 to 1.09 in the runs made while writing
//! this. Single sequential passes are not compared (see below).
//!
//! `tarn bench --client nfs://…` measures a share over the network with
//! tarn's own NFS client, run where no daemon is: every column, the test
//! file gone afterwards, clear errors for a wrong share or port, and its
//! cat speed within a factor of 5 of libnfs's `nfs-cat` reading a file of
//! the same size from the same share (the peer reads one request at a
//! time, the bench four; ratios of 0.6 to 2.4 were seen while writing
//! this; a bench that counted bytes it never read, or read a cache of its
//! own, would be far off).

mod common;

use std::process::Command;

use common::process::{files, Daemon};
use tarn_testkit::clients::{nfs_cp, nfs_url};
use tarn_testkit::net::free_port;
use tarn_testkit::require;

/// fio's IOPS for `jobs` threads doing `rw` in `bs` requests on `file`
/// for `runtime` seconds (psync, direct, as tarn bench issues them; a
/// write job ends in an fsync, as tarn bench's does).
fn fio_iops(file: &str, rw: &str, bs: &str, jobs: u32, runtime: u32) -> f64 {
    let out = Command::new("fio")
        .args([
            "--name=cmp",
            &format!("--filename={file}"),
            "--size=64M",
            &format!("--rw={rw}"),
            &format!("--bs={bs}"),
            &format!("--numjobs={jobs}"),
            "--thread",
            "--ioengine=psync",
            "--direct=1",
            "--end_fsync=1",
            "--time_based",
            &format!("--runtime={runtime}"),
            "--group_reporting",
            "--output-format=json",
        ])
        .output()
        .expect("run fio");
    assert!(
        out.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("fio's JSON");
    let side = if rw.contains("write") {
        "write"
    } else {
        "read"
    };
    v["jobs"][0][side]["iops"].as_f64().unwrap_or(0.0)
}

fn close(what: &str, ours: f64, theirs: f64) {
    let ratio = ours / theirs;
    eprintln!("{what}: tarn bench {ours:.0}, fio {theirs:.0}, ratio {ratio:.2}");
    assert!(
        (0.4..=2.5).contains(&ratio),
        "{what}: tarn bench {ours:.0}, fio {theirs:.0} (ratio {ratio:.2})"
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
fn bench_agrees_with_fio_and_reports_every_column() {
    if !require::fuse() || !require::programs(&["fio"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
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
    let ours = &v[0];
    let file = mnt.join("fio.dat");
    let file = file.to_str().unwrap();
    // In tarn bench's order: a fresh file read once from start to end
    // (fio lays it out first; no time limit, so it reads it once, as
    // tarn bench's cat does), then the random reads for a time.
    // fio lays the file out; its random reads then run for a time, as
    // tarn bench's do. (Single sequential passes are not compared: how
    // fast one pass reads depends on whether the pool had synced the
    // freshly written blocks yet, which differs between the two runs.)
    let iops = fio_iops(file, "randread", "4k", 32, 2);
    close(
        "random read 4k QD32",
        ours["randread_iops_qd32"].as_f64().unwrap(),
        iops,
    );
    let iops1 = fio_iops(file, "randread", "4k", 1, 2);
    close(
        "random read 4k QD1",
        ours["read_iops_qd1"].as_f64().unwrap(),
        iops1,
    );
    let wiops = fio_iops(file, "randwrite", "4k", 32, 2);
    close(
        "random write 4k QD32",
        ours["write_iops_qd32"].as_f64().unwrap(),
        wiops,
    );
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
    let d = Daemon::start_with(dir.path(), &["--nfs", &listen]);
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
    let (ok, listing, err) = tarn_testkit::clients::tool(&["nfs-ls", &nfs_url(port, port, "/b")]);
    assert!(ok, "{err}");
    assert!(
        !String::from_utf8_lossy(&listing).contains("tarn-bench"),
        "the test file is left: {}",
        String::from_utf8_lossy(&listing)
    );

    // The peer: libnfs reads a file of the same size from the same share.
    let src = dir.path().join("peer.bin");
    std::fs::write(&src, tarn_testkit::data::Rng::new(5).bytes(64 << 20)).unwrap();
    let peer_url = nfs_url(port, port, "/b/peer.bin");
    assert!(
        nfs_cp(src.to_str().unwrap(), &peer_url),
        "nfs-cp into the share"
    );
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t0 = std::time::Instant::now();
        let (ok, bytes, err) = tarn_testkit::clients::tool(&["nfs-cat", &peer_url]);
        let secs = t0.elapsed().as_secs_f64();
        assert!(ok && bytes.len() == 64 << 20, "{err}");
        best = best.min(secs);
    }
    let peer = (64 << 20) as f64 / 1e6 / best;
    let ratio = ours["cat_mb_s"].as_f64().unwrap() / peer;
    eprintln!(
        "cat over NFS: tarn bench {:.0}, nfs-cat {peer:.0} MB/s, ratio {ratio:.2}",
        ours["cat_mb_s"].as_f64().unwrap_or(0.0)
    );
    assert!(
        (0.2..=5.0).contains(&ratio),
        "ratio {ratio:.2}: {ours} vs {peer:.0}"
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
