//! Real clients as tarn's users run them, as programs: curl, libnfs's
//! `nfs-cp` / `nfs-ls` / `nfs-cat` with their URL form, and the litmus
//! WebDAV suite. Check for them first with [`crate::require`].

use std::path::Path;
use std::process::{Command, Output};

/// Runs curl with `args`; returns the HTTP status (0 when there was no
/// answer), the body, and curl's whole output.
pub fn curl(args: &[&str]) -> (u16, Vec<u8>, Output) {
    let out = Command::new("curl")
        .args([
            "-s",
            "-S",
            "--max-time",
            "600",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
        ])
        .args(args)
        .output()
        .expect("run curl");
    let mut body = out.stdout.clone();
    let pos = body.iter().rposition(|&b| b == b'\n').unwrap_or(0);
    let code = String::from_utf8_lossy(&body[pos + 1..])
        .trim()
        .parse()
        .unwrap_or(0);
    body.truncate(pos);
    (code, body, out)
}

/// The HTTP status of a curl request (the body is dropped).
pub fn status(args: &[&str]) -> u16 {
    curl(args).0
}

/// The libnfs tools the NFS tests drive.
pub const NFS_TOOLS: [&str; 3] = ["nfs-cp", "nfs-ls", "nfs-cat"];

/// True if the libnfs tools are installed (see [`crate::require`]).
pub fn nfs_tools() -> bool {
    crate::require::programs(&NFS_TOOLS)
}

/// libnfs's URL of `path` (the export's path included) on a server on
/// 127.0.0.1 answering NFS on `nfs_port` and MOUNT on `mount_port`.
pub fn nfs_url(nfs_port: u16, mount_port: u16, path: &str) -> String {
    format!("nfs://127.0.0.1{path}?nfsport={nfs_port}&mountport={mount_port}&version=3")
}

/// Runs a program (a libnfs tool): whether it succeeded, its stdout and
/// its stderr.
pub fn tool(args: &[&str]) -> (bool, Vec<u8>, String) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", args[0]));
    (
        out.status.success(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `nfs-cp src dst` (either may be an `nfs://` URL); says why on failure.
pub fn nfs_cp(src: &str, dst: &str) -> bool {
    let (ok, _, err) = tool(&["nfs-cp", src, dst]);
    if !ok {
        eprintln!("nfs-cp {src} {dst} failed: {err}");
    }
    ok
}

/// What `nfs-cat url` prints, which must succeed.
pub fn nfs_cat(url: &str) -> Vec<u8> {
    let (ok, out, err) = tool(&["nfs-cat", url]);
    assert!(ok, "nfs-cat {url}: {err}");
    out
}

/// Writes `data` to `dir/name`; returns the path as a string (for a
/// client's command line).
pub fn write_file(dir: &Path, name: &str, data: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, data).expect("write a file for a client");
    p.to_string_lossy().into_owned()
}

/// Runs litmus (suites basic, copymove, props, locks and http) against the
/// WebDAV collection at `url` as `user`, and fails the test on any failed
/// check or warning.
pub fn litmus(url: &str, user: &str, password: &str) {
    let dir = tempfile::tempdir().expect("a folder for litmus");
    let out = Command::new("litmus")
        .args(["--keep-going", url, user, password])
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
