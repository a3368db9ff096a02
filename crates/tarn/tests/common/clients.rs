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

/// Standard base64 with padding (HTTP Basic credentials).
pub fn base64(b: &[u8]) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
