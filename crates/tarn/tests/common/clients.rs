//! The CLI as the daemon's users run it when it reads a password from
//! stdin (curl and libnfs's tools are in `tarn_testkit::clients`).

use std::io::Write;
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
        // The CLI may refuse its arguments and exit before it reads stdin.
        if let Err(e) = stdin.write_all(input.as_bytes()) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
        }
    }
    child.wait_with_output().expect("wait for tarn")
}

/// Adds the user `name` with `password` (`user add --password-stdin`),
/// which must succeed.
pub fn add_user(d: &Daemon, name: &str, password: &str) {
    let out = tarn_with_stdin(
        d,
        &["user", "add", "--password-stdin", name],
        &format!("{password}\n"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
