//! Real clients as the daemon's users run them: the CLI reading a
//! password from stdin, curl, and libnfs's URL form.

use std::io::Write;
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};

use super::process::Daemon;

/// Runs the CLI against `d` with `input` on its stdin.
pub fn tarn_with_stdin(d: &Daemon, args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tarn"))
        .arg("--socket")
        .arg(&d.socket)
        .args(args)
        .env_remove("TARN_SOCKET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tarn");
    if let Some(mut stdin) = child.stdin.take() {
        // A command refused before it reads (a bad user name) may be gone.
        if let Err(e) = stdin.write_all(input.as_bytes()) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
        }
    }
    child.wait_with_output().expect("wait for tarn")
}

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Runs curl; returns the HTTP status code and the body.
pub fn curl(args: &[&str]) -> (String, Vec<u8>) {
    let out = Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("run curl");
    let mut body = out.stdout;
    let split = body.iter().rposition(|&b| b == b'\n').unwrap_or(0);
    let code = String::from_utf8_lossy(&body[split + 1..]).into_owned();
    body.truncate(split);
    (code, body)
}

/// libnfs's URL of `path` on a server answering NFS and MOUNT on `port`.
pub fn nfs_url(port: u16, path: &str) -> String {
    format!("nfs://127.0.0.1{path}?nfsport={port}&mountport={port}&version=3")
}
