//! The configuration file and the service around the daemon: the example
//! file in docs/ is valid and shows every key, docs/config.md documents
//! every key; a daemon started with `--config` takes its socket, state,
//! listen addresses and log level from the file while a flag overrides
//! the file; a bad file stops the start with its line; the daemon tells
//! systemd when it is ready and when it stops; and the unit file passes
//! `systemd-analyze verify`.

use std::io::Read;
use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tarn_cli::config::KEYS;
use tarn_testkit::net::free_port;
use tarn_testkit::require;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tarn(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tarn"))
        .args(args)
        .env_remove("TARN_SOCKET")
        .env_remove("TARN_STATE_DIR")
        .output()
        .unwrap()
}

#[test]
fn the_example_file_is_valid_and_every_key_is_documented() {
    let example = repo().join("docs/tarn.toml");
    let out = tarn(&["config", "check", example.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&example).unwrap();
    let guide = std::fs::read_to_string(repo().join("docs/config.md")).unwrap();
    // Every key appears in the example (set or commented out) in its own
    // section, and in the reference.
    let mut section = String::new();
    let mut seen = Vec::new();
    for line in text.lines() {
        let l = line.trim_start_matches('#').trim();
        if let Some(s) = l.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = s.to_string();
        } else if let Some((k, _)) = l.split_once(" = ") {
            seen.push((section.clone(), k.trim().to_string()));
        }
    }
    for k in KEYS {
        assert!(
            seen.contains(&(k.section.to_string(), k.name.to_string())),
            "docs/tarn.toml does not show {}",
            k.dotted()
        );
        assert!(
            guide.contains(&format!("`{}`", k.dotted())),
            "docs/config.md does not document {}",
            k.dotted()
        );
    }
    // The documented example is this file, word for word.
    assert!(
        guide.contains(text.trim()),
        "docs/config.md must include docs/tarn.toml as it is"
    );
}

#[test]
fn the_daemon_reads_its_file_flags_override_it_and_systemd_hears_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("admin.sock");
    let (nfs_file, nfs_flag, dav) = (free_port(), free_port(), free_port());
    let conf = dir.path().join("tarn.toml");
    std::fs::write(
        &conf,
        format!(
            "state_dir = \"{}\"\nsocket = \"{}\"\nlog_level = \"warn\"\n\n[listen]\n\
             nfs = \"127.0.0.1:{nfs_file}\"\nwebdav = \"127.0.0.1:{dav}\"\n\n[engine]\n\
             cache_mib = 256\n",
            dir.path().join("state").display(),
            socket.display()
        ),
    )
    .unwrap();
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let log = dir.path().join("daemon.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tarn"))
        .args(["daemon", "--config"])
        .arg(&conf)
        .args(["--nfs", &format!("127.0.0.1:{nfs_flag}")])
        .env_remove("TARN_SOCKET")
        .env_remove("TARN_STATE_DIR")
        .env("NOTIFY_SOCKET", &notify_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("READY=1 from the daemon");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.starts_with("READY=1"), "{msg}");
    // Ready means serving: the socket from the file answers at once, and
    // the state directory is the file's.
    let ping = tarn(&["--socket", socket.to_str().unwrap(), "daemon", "ping"]);
    assert!(
        ping.status.success(),
        "{}",
        String::from_utf8_lossy(&ping.stderr)
    );
    assert!(dir.path().join("state").is_dir());
    // The flag's NFS address, not the file's; the file's WebDAV address.
    assert!(TcpStream::connect(("127.0.0.1", nfs_flag)).is_ok());
    assert!(TcpStream::connect(("127.0.0.1", nfs_file)).is_err());
    assert!(TcpStream::connect(("127.0.0.1", dav)).is_ok());

    let stop = tarn(&["--socket", socket.to_str().unwrap(), "daemon", "stop"]);
    assert!(stop.status.success());
    let n = notify.recv(&mut buf).expect("STOPPING=1 from the daemon");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("STOPPING=1"));
    assert!(child.wait().unwrap().success());
    // log_level = "warn": the start-up lines (info) are not written.
    let mut said = String::new();
    std::fs::File::open(&log)
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    assert!(!said.contains("listening on"), "{said}");

    // The same file at the default level says where it listens.
    let out = Command::new(env!("CARGO_BIN_EXE_tarn"))
        .args(["daemon", "--config"])
        .arg(&conf)
        .args([
            "--log-level",
            "info",
            "--nfs",
            &format!("127.0.0.1:{nfs_flag}"),
        ])
        .env_remove("TARN_SOCKET")
        .env_remove("TARN_STATE_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !tarn(&["--socket", socket.to_str().unwrap(), "daemon", "ping"])
        .status
        .success()
    {
        assert!(t0.elapsed() < Duration::from_secs(30), "no second start");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        tarn(&["--socket", socket.to_str().unwrap(), "daemon", "stop"])
            .status
            .success()
    );
    let said = out.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&said.stderr);
    assert!(said.contains("listening on"), "{said}");
}

#[test]
fn a_bad_file_stops_the_start_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("tarn.toml");
    std::fs::write(
        &conf,
        "state_dir = \"/tmp/x\"\n[listen]\nnfs = \"0.0.0.0:2049\"\nnsf = 1\n",
    )
    .unwrap();
    let out = tarn(&["daemon", "--config", conf.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}:4: unknown key `nsf` in [listen]",
            conf.display()
        )),
        "{err}"
    );
    let out = tarn(&["config", "check", conf.to_str().unwrap()]);
    assert!(!out.status.success());
    let out = tarn(&["daemon", "--config", "/nonexistent/tarn.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the configuration file"));
}

#[test]
fn the_systemd_unit_verifies() {
    if !require::programs(&["systemd-analyze"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(repo().join("packaging/tarn.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/tarn daemon --config /etc/tarn/tarn.toml"));
    assert!(unit.contains("Type=notify"));
    // Verified with this build's binary where the unit expects it.
    let local = unit.replace("/usr/local/bin/tarn", env!("CARGO_BIN_EXE_tarn"));
    let path = dir.path().join("tarn.service");
    std::fs::write(&path, local).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("tarn.service"),
        "systemd-analyze: {err}"
    );
}
