//! `/metrics` of a real daemon, read by Prometheus's own text-format
//! parser (Python's `prometheus_client`): every family parses, the
//! device, txg, request and connection counters move when NFS and WebDAV
//! clients do I/O, histograms are consistent (buckets rise to the
//! count), a token guards the endpoint when one is set, and the daemon
//! refuses to open it to the network without one.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use common::clients::add_user;
use common::process::{files, Daemon};
use tarn_testkit::clients::{curl, nfs_cp, nfs_url};
use tarn_testkit::net::free_port;
use tarn_testkit::require;

/// One HTTP exchange: (status, body).
fn get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

/// (family name, type, [(sample name, labels, value)]) as Prometheus's
/// reference parser reads `text`; it fails on anything malformed.
type Families = BTreeMap<String, (String, Vec<(String, BTreeMap<String, String>, f64)>)>;

fn parse(python: &str, text: &str) -> Families {
    const SCRIPT: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for f in text_string_to_metric_families(sys.stdin.read()):
    out[f.name] = [f.type, [[s.name, s.labels, s.value] for s in f.samples]]
print(json.dumps(out))
"#;
    let mut child = Command::new(python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused the text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The sum of the samples named `sample` whose labels include `with`.
fn sum(f: &Families, family: &str, sample: &str, with: &[(&str, &str)]) -> f64 {
    f.get(family)
        .map(|(_, samples)| {
            samples
                .iter()
                .filter(|(n, l, _)| {
                    n == sample && with.iter().all(|(k, v)| l.get(*k).is_some_and(|x| x == v))
                })
                .map(|(_, _, v)| v)
                .sum()
        })
        .unwrap_or(0.0)
}

#[test]
fn metrics_parse_move_with_io_and_are_guarded() {
    let python = std::env::var("TARN_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let has = Command::new(&python)
        .args(["-c", "import prometheus_client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has && !require::missing("Python's prometheus_client (TARN_TEST_PYTHON)") {
        return;
    }
    if !require::programs(&["curl", "nfs-cp"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (nfs, dav, metrics) = (free_port(), free_port(), free_port());
    let token_file = dir.path().join("metrics.token");
    std::fs::write(&token_file, "a-token-for-the-scraper-77\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let args = [
        "--nfs".to_string(),
        format!("127.0.0.1:{nfs}"),
        "--webdav".to_string(),
        format!("127.0.0.1:{dav}"),
        "--metrics".to_string(),
        format!("127.0.0.1:{metrics}"),
        "--metrics-token-file".to_string(),
        token_file.display().to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = Daemon::start_env(dir.path(), &args, &[("TARN_HISTORY_TICK_MS", "100")]);
    let f = files(dir.path(), "m", 2, 256 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    d.ok(&["dataset", "create", "tank/b"]);
    add_user(&d, "alice", "wonder-land");
    d.ok(&[
        "share",
        "add",
        "b",
        "tank/b",
        "--nfs",
        "127.0.0.1/32",
        "--no-root-squash",
        "--webdav",
        "alice=rw",
        "--owner",
        "alice",
    ]);

    // The token: none, or a wrong one, is refused; only /metrics answers.
    let token = Some("a-token-for-the-scraper-77");
    assert_eq!(get(metrics, "/metrics", None).0, 401);
    assert_eq!(
        get(metrics, "/metrics", Some("a-token-for-the-scraper-78")).0,
        401
    );
    assert_eq!(get(metrics, "/", token).0, 404);

    let (status, before) = get(metrics, "/metrics", token);
    assert_eq!(status, 200);
    let before = parse(&python, &before);
    let wrote_before = sum(
        &before,
        "tarn_device_written_bytes",
        "tarn_device_written_bytes_total",
        &[],
    );

    // I/O: 8 MiB over NFS, a file over WebDAV and back, a sync.
    let src = dir.path().join("src.bin");
    std::fs::write(&src, tarn_testkit::data::Rng::new(3).bytes(8 << 20)).unwrap();
    assert!(nfs_cp(
        src.to_str().unwrap(),
        &nfs_url(nfs, nfs, "/b/src.bin")
    ));
    let web = format!("http://127.0.0.1:{dav}/b/hello.txt");
    let (code, _, _) = curl(&["-u", "alice:wonder-land", "-T", src.to_str().unwrap(), &web]);
    assert_eq!(code, 201);
    let (code, body, _) = curl(&["-u", "alice:wonder-land", &web]);
    assert_eq!((code, body.len()), (200, 8 << 20));
    d.ok(&["pool", "sync", "tank"]);

    let (_, after) = get(metrics, "/metrics", token);
    let after = parse(&python, &after);
    for family in [
        "tarn_build_info",
        "tarn_pool_health",
        "tarn_pool_size_bytes",
        "tarn_pool_txg",
        "tarn_device_read_ops",
        "tarn_device_errors",
        "tarn_device_write_latency_seconds",
        "tarn_pool_txg_sync_seconds",
        "tarn_pool_dirty_bytes",
        "tarn_cache_hits",
        "tarn_connections_open",
        "tarn_request_duration_seconds",
        "tarn_request_errors",
    ] {
        assert!(
            after.contains_key(family),
            "no {family}: {:?}",
            after.keys()
        );
    }
    assert_eq!(after["tarn_device_write_latency_seconds"].0, "histogram");
    assert_eq!(after["tarn_device_read_ops"].0, "counter");
    assert_eq!(
        sum(
            &after,
            "tarn_pool_health",
            "tarn_pool_health",
            &[("pool", "tank"), ("state", "ONLINE")]
        ),
        1.0
    );
    // Counters moved with the I/O: two copies of at least 16 MiB written
    // (a mirror), NFS WRITEs and WebDAV PUTs and GETs counted.
    let wrote = sum(
        &after,
        "tarn_device_written_bytes",
        "tarn_device_written_bytes_total",
        &[],
    );
    assert!(
        wrote - wrote_before >= 2.0 * (16 << 20) as f64,
        "{wrote_before} -> {wrote}"
    );
    let nfs_writes = sum(
        &after,
        "tarn_request_duration_seconds",
        "tarn_request_duration_seconds_count",
        &[("protocol", "nfs"), ("op", "write")],
    );
    assert!(
        nfs_writes >= 8.0,
        "8 MiB in WRITEs of at most 1 MiB: {nfs_writes}"
    );
    for op in ["PUT", "GET"] {
        let n = sum(
            &after,
            "tarn_request_duration_seconds",
            "tarn_request_duration_seconds_count",
            &[("protocol", "webdav"), ("op", op)],
        );
        assert!(n >= 1.0, "WebDAV {op}: {n}");
    }
    let syncs = sum(
        &after,
        "tarn_pool_txg_sync_seconds",
        "tarn_pool_txg_sync_seconds_count",
        &[("pool", "tank")],
    );
    assert!(syncs >= 1.0, "{syncs}");
    // Every histogram: buckets rise, and the +Inf bucket is the count.
    for (name, (ty, samples)) in &after {
        if ty != "histogram" {
            continue;
        }
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        let mut counts: BTreeMap<String, f64> = BTreeMap::new();
        for (n, l, v) in samples {
            let mut key = l.clone();
            let le = key.remove("le");
            let key = format!("{key:?}");
            if n.ends_with("_bucket") {
                let le = le.unwrap();
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                series.entry(key).or_default().push((le, *v));
            } else if n.ends_with("_count") {
                counts.insert(key, *v);
            }
        }
        for (key, buckets) in series {
            assert!(
                buckets
                    .windows(2)
                    .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
                "{name} {key}"
            );
            assert_eq!(
                buckets.last().map(|b| b.1),
                counts.get(&key).copied(),
                "{name} {key}"
            );
        }
    }
    // The history (the dashboard's charts) saw the same I/O: points with
    // bytes written to the pool and NFS requests.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let v: serde_json::Value =
        serde_json::from_str(&d.ok(&["-o", "json", "pool", "history"])).unwrap();
    let points = v.as_array().unwrap();
    assert!(points.len() >= 2, "{v}");
    let wrote: f64 = points
        .iter()
        .flat_map(|p| p["pools"].as_array().unwrap().clone())
        .filter(|r| r["pool"] == "tank")
        .map(|r| r["write_bytes_per_sec"].as_f64().unwrap() * 0.1)
        .sum();
    assert!(
        wrote > (8 << 20) as f64,
        "the pool's writes in the history: {wrote}"
    );
    let nfs_requests: f64 = points
        .iter()
        .flat_map(|p| p["protocols"].as_array().unwrap().clone())
        .filter(|r| r["protocol"] == "nfs")
        .map(|r| r["requests_per_sec"].as_f64().unwrap())
        .sum();
    assert!(nfs_requests > 0.0, "{v}");
    let table = d.ok(&["pool", "history", "--last", "3"]);
    assert!(
        table.contains("tank") && table.contains("READ MB/S"),
        "{table}"
    );
    d.stop();

    // Off loopback without a token: the daemon does not start.
    let out = Command::new(env!("CARGO_BIN_EXE_tarn"))
        .args(["daemon", "--socket"])
        .arg(dir.path().join("other.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("other-state"))
        .args(["--metrics", &format!("0.0.0.0:{}", free_port())])
        .env_remove("TARN_SOCKET")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--metrics-token-file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
