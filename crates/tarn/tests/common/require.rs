//! Tests that need something of the machine (root and /dev/fuse, a
//! program) skip with a message when it is missing, except under CI
//! (`TARN_REQUIRE_ALL` set by `.ci/run`), where a missing piece fails.

use std::path::{Path, PathBuf};

fn missing(what: &str) -> bool {
    assert!(
        std::env::var_os("TARN_REQUIRE_ALL").is_none(),
        "this test needs {what}"
    );
    eprintln!("skipped: this test needs {what}");
    false
}

/// Root and /dev/fuse, for FUSE mounts.
pub fn fuse() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if root && Path::new("/dev/fuse").exists() {
        true
    } else {
        missing("root and /dev/fuse")
    }
}

/// A program on PATH (or in ~/.cargo/bin), by name.
pub fn program(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cargo/bin"));
    }
    let found = dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file());
    if found.is_none() {
        missing(&format!("the program {name}"));
    }
    found
}

/// Whether `path` is a mountpoint now.
pub fn is_mounted(path: &Path) -> bool {
    let canon = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(canon.to_str().unwrap_or("")))
}
