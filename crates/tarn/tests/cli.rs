//! The built `tarn` binary: exit codes, error text, and a real daemon
//! process stopped by `tarn daemon stop` and by SIGTERM.

mod common;

use common::process::tarn_at as tarn;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tarn_testkit::net::wait_for_socket;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A `tarn daemon` process on a temporary socket.
struct DaemonProcess {
    child: Child,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl DaemonProcess {
    fn start() -> DaemonProcess {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("tarn.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_tarn"))
            .args(["daemon", "--socket"])
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_socket(&socket);
        DaemonProcess {
            child,
            socket,
            _dir: dir,
        }
    }

    /// Waits (bounded) for the process to exit and returns its status.
    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the daemon did not exit");
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn no_daemon_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nobody.sock");
    let out = tarn(&socket, &["pool", "list"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!(
            "error: no tarn daemon is listening on {}\n\
             hint: start one with `tarn daemon` (or set TARN_SOCKET / --socket to where it listens)\n",
            socket.display()
        )
    );
    assert!(out.stdout.is_empty());

    // The same through the environment.
    let out = Command::new(env!("CARGO_BIN_EXE_tarn"))
        .args(["pool", "status"])
        .env("TARN_SOCKET", &socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(&socket.display().to_string()));
}

#[test]
fn usage_errors_exit_2_and_argument_errors_need_no_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nobody.sock");
    let out = tarn(&socket, &["pool", "create", "tank"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));

    // Checked before connecting, so the message is about the mistake.
    let out = tarn(&socket, &["pool", "create", "tank", "mirror", "/dev/a"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.starts_with("error: mirror-0 needs at least 2 devices"),
        "{err}"
    );

    let out = tarn(
        &socket,
        &["pool", "create", "tank", "raidz4", "a", "b", "c", "d", "e"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("raidz4 is not a vdev type"));
}

#[test]
fn daemon_process_answers_and_stops_on_request() {
    let mut daemon = DaemonProcess::start();
    let out = tarn(&daemon.socket, &["daemon", "ping"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("is listening on"),
        "{}",
        text(&out.stdout)
    );

    let out = tarn(&daemon.socket, &["-o", "json", "daemon", "ping"]);
    let ping: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ping["pid"], daemon.child.id());

    // An API error: whatever backend is wired, this pool does not exist.
    let out = tarn(&daemon.socket, &["pool", "status", "no-such-pool"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).starts_with("error: "),
        "{}",
        text(&out.stderr)
    );

    // A second daemon on the same socket refuses to start.
    let second = Command::new(env!("CARGO_BIN_EXE_tarn"))
        .args(["daemon", "--socket"])
        .arg(&daemon.socket)
        .arg("--state-dir")
        .arg(daemon._dir.path().join("state2"))
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    assert!(text(&second.stderr).contains("a tarn daemon is already listening on"));

    let out = tarn(&daemon.socket, &["daemon", "stop"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(daemon.wait().success());
    assert!(!daemon.socket.exists(), "socket left behind");
}

#[test]
fn daemon_process_stops_on_sigterm() {
    let mut daemon = DaemonProcess::start();
    let pid = libc::pid_t::try_from(daemon.child.id()).unwrap();
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = daemon.wait();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(!daemon.socket.exists(), "socket left behind");
}

/// Context switches of every thread of process `pid` that sleeps
/// voluntarily (the admin socket's accept loop among them).
fn wakeups(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let path = task.unwrap().path();
        let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
        let name = status
            .lines()
            .find_map(|l| l.strip_prefix("Name:"))
            .unwrap_or("")
            .trim()
            .to_string();
        let n: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let tid = path.file_name().unwrap().to_string_lossy().into_owned();
        out.insert(format!("{tid} {name}"), n);
    }
    out
}

/// An idle daemon with no pool sleeps: none of its threads wakes up (no
/// polling loop), so a NAS can idle at its lowest power.
#[test]
fn idle_daemon_threads_do_not_wake_up() {
    let mut daemon = DaemonProcess::start();
    let pid = daemon.child.id();
    thread::sleep(Duration::from_millis(300));
    let before = wakeups(pid);
    thread::sleep(Duration::from_millis(1500));
    let after = wakeups(pid);
    assert_eq!(before, after, "threads woke up while the daemon was idle");
    let out = tarn(&daemon.socket, &["daemon", "stop"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(daemon.wait().success());
}
