//! What a test needs of the machine (root and /dev/fuse, a program): a test
//! that lacks it skips with a message, except when `TARN_REQUIRE_ALL` is set
//! (CI sets it), where a missing piece fails the test instead.

use std::path::{Path, PathBuf};

/// Says that the test skips for lack of `what`, or fails under
/// `TARN_REQUIRE_ALL`; always false.
pub fn missing(what: &str) -> bool {
    assert!(
        std::env::var_os("TARN_REQUIRE_ALL").is_none(),
        "this test needs {what} (TARN_REQUIRE_ALL is set)"
    );
    eprintln!("skipped: this test needs {what}");
    false
}

/// Why FUSE mounts cannot be made here, if they cannot.
pub fn fuse_missing() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".into());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    (euid != 0).then(|| format!("not root (euid {euid}); mounting needs root"))
}

/// Root and /dev/fuse, for FUSE mounts.
pub fn fuse() -> bool {
    match fuse_missing() {
        None => true,
        Some(why) => missing(&format!("root and /dev/fuse: {why}")),
    }
}

/// Where program `name` is, on PATH or in ~/.cargo/bin or ~/go/bin
/// (where `cargo install` and `go install` put what tests use).
pub fn find(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cargo/bin"));
        dirs.push(Path::new(&home).join("go/bin"));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// Program `name` (see [`find`]), required.
pub fn program(name: &str) -> Option<PathBuf> {
    let found = find(name);
    if found.is_none() {
        missing(&format!("the program {name}"));
    }
    found
}

/// Every program in `names`, required.
pub fn programs(names: &[&str]) -> bool {
    let absent: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| find(n).is_none())
        .collect();
    absent.is_empty() || missing(&format!("the programs {}", absent.join(", ")))
}

/// Whether `path` is a mountpoint now.
pub fn is_mounted(path: &Path) -> bool {
    let canon = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let Some(want) = canon.to_str() else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want))
}
