//! Runs the Rust port of pjdfstest against a mounted memory filesystem, to
//! find semantic bugs. Not part of the normal test run (it takes minutes
//! and its verdicts are about tarn-fs as much as this crate):
//!
//! ```text
//! cargo test -p tarn-fuse --test pjdfstest -- --ignored --nocapture
//! ```
//!
//! `PJDFSTEST` overrides the binary (default: `pjdfstest` on `PATH`, then
//! in `~/.cargo/bin`); `PJDFSTEST_FILTER` passes test-name
//! patterns (space separated); `PJDFSTEST_ALLOW_REMOUNT=1` enables the
//! EROFS tests, which remount the mount read-only with `mount -o
//! remount,ro` (they pass alone, but in a full run the remount sometimes
//! fails with EBUSY right after the preceding test);
//! `PJDFSTEST_NO_DEFAULT_PERMISSIONS=1` mounts without
//! `default_permissions`, so that tarn-fs alone judges permissions.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::mount_test_backend;
use tarn_fuse::MountOptions;
use tarn_testkit::require;

/// The configuration; `{secondary}` is replaced by a directory on another
/// filesystem (for the EXDEV tests), `{remount}` by whether the EROFS tests
/// may remount the filesystem read-only.
const CONFIG: &str = r#"
[features]
secondary_fs = "{secondary}"
posix_fallocate = {}
utimensat = {}
utime_now = {}
rename_ctime = {}

[settings]
naptime = 0.01
allow_remount = {remount}

[dummy_auth]
entries = [
    ["nobody", "nogroup"],
    ["daemon", "daemon"],
]
"#;

fn pjdfstest_binary() -> Option<PathBuf> {
    match std::env::var_os("PJDFSTEST") {
        Some(p) => Some(PathBuf::from(p)),
        None => require::program("pjdfstest"),
    }
}

#[test]
#[ignore = "slow; run explicitly to audit POSIX semantics"]
fn pjdfstest_suite() {
    if !require::fuse() {
        return;
    }
    let Some(bin) = pjdfstest_binary() else {
        return;
    };
    // Real clock (pjdfstest checks that times move), other users allowed
    // (it switches to the dummy users).
    let f = mount_test_backend(
        &MountOptions {
            allow_other: true,
            default_permissions: std::env::var_os("PJDFSTEST_NO_DEFAULT_PERMISSIONS").is_none(),
            ..Default::default()
        },
        true,
    );
    let conf_dir = tempfile::tempdir().unwrap();
    let conf = conf_dir.path().join("pjdfstest.toml");
    let secondary = conf_dir.path().join("secondary");
    std::fs::create_dir(&secondary).unwrap();
    let remount = std::env::var_os("PJDFSTEST_ALLOW_REMOUNT").is_some();
    let config = CONFIG
        .replace("{secondary}", &secondary.to_string_lossy())
        .replace("{remount}", if remount { "true" } else { "false" });
    std::fs::write(&conf, config).unwrap();
    let mut cmd = Command::new(&bin);
    cmd.arg("-c").arg(&conf).arg("-p").arg(f.mount.mountpoint());
    if let Ok(filter) = std::env::var("PJDFSTEST_FILTER") {
        cmd.args(filter.split_whitespace());
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    let failed: Vec<&str> = stdout.lines().filter(|l| l.contains("FAILED")).collect();
    println!("pjdfstest: {} failing test(s)", failed.len());
    for l in &failed {
        println!("  {l}");
    }
    assert!(out.status.success(), "pjdfstest reported failures");
}
