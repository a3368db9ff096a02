//! Datasets mounted with FUSE by the real daemon: through the mountpoint
//! property and `tarn mount`, with snapshots under `.snapshot`, unmounted
//! on export, rollback, destroy and daemon stop, and mounted again when the
//! pool comes back.

mod common;

use common::process::{files, Daemon};
use tarn_testkit::require::{self, is_mounted};

#[test]
fn mounts_follow_properties_snapshots_and_pool_lifetime() {
    if !require::fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path());
    let f = files(dir.path(), "m", 4, 64 << 20);
    d.ok(&[
        "pool", "create", "tank", "raidz1", &f[0], &f[1], &f[2], &f[3],
    ]);
    let mnt = dir.path().join("mnt");
    let photos = mnt.join("photos");
    let mp = format!("mountpoint={}", photos.display());
    d.ok(&["dataset", "create", "-o", &mp, "tank/photos"]);
    assert!(
        is_mounted(&photos),
        "the mountpoint property mounts the dataset"
    );

    // Files through the kernel.
    std::fs::create_dir(photos.join("2026")).unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(photos.join("2026/beach.raw"), &big).unwrap();
    std::fs::write(photos.join("note.txt"), b"first").unwrap();
    d.ok(&["snapshot", "tank/photos@one"]);
    std::fs::write(photos.join("note.txt"), b"second").unwrap();
    std::fs::remove_file(photos.join("2026/beach.raw")).unwrap();
    let snap = photos.join(".snapshot/one");
    assert_eq!(std::fs::read(snap.join("note.txt")).unwrap(), b"first");
    assert_eq!(std::fs::read(snap.join("2026/beach.raw")).unwrap(), big);
    let e = std::fs::write(snap.join("x"), b"no").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let list = d.ok(&["mount"]);
    assert!(
        list.contains("tank/photos") && list.contains("property"),
        "{list}"
    );

    // A child inherits the mountpoint below its parent.
    d.ok(&["dataset", "create", "tank/photos/raw"]);
    assert!(is_mounted(&photos.join("raw")));
    std::fs::write(photos.join("raw/a"), b"child").unwrap();

    // Rollback takes the mounts down and brings them back.
    d.ok(&["rollback", "tank/photos@one"]);
    assert!(is_mounted(&photos) && is_mounted(&photos.join("raw")));
    assert_eq!(std::fs::read(photos.join("note.txt")).unwrap(), b"first");
    assert_eq!(std::fs::read(photos.join("2026/beach.raw")).unwrap(), big);

    // A busy mount stops a destroy.
    let held = std::fs::File::open(photos.join("raw/a")).unwrap();
    let err = d.fails(&["destroy", "tank/photos/raw"]);
    assert!(err.contains("busy"), "{err}");
    drop(held);
    d.ok(&["destroy", "tank/photos/raw"]);
    assert!(!is_mounted(&photos.join("raw")));

    // Manual mounts of a snapshot, read-only.
    let snapdir = dir.path().join("snapview");
    std::fs::create_dir(&snapdir).unwrap();
    d.ok(&["mount", "tank/photos@one", snapdir.to_str().unwrap()]);
    assert_eq!(std::fs::read(snapdir.join("note.txt")).unwrap(), b"first");
    d.ok(&["unmount", snapdir.to_str().unwrap()]);
    assert!(!is_mounted(&snapdir));
    let err = d.fails(&["unmount", "tank/nothing"]);
    assert!(err.contains("not mounted"), "{err}");

    // A filesystem in use stops an export without -f, and what was
    // unmounted before it was found busy (its child) is mounted again.
    d.ok(&["dataset", "create", "tank/photos/keep"]);
    assert!(is_mounted(&photos.join("keep")));
    let held = std::fs::File::open(photos.join("note.txt")).unwrap();
    for verb in ["export", "destroy"] {
        let err = d.fails(&["pool", verb, "tank"]);
        assert!(err.contains("in use") && err.contains("-f"), "{err}");
        assert!(is_mounted(&photos) && is_mounted(&photos.join("keep")));
    }
    assert_eq!(std::fs::read(photos.join("note.txt")).unwrap(), b"first");
    drop(held);
    d.ok(&["destroy", "tank/photos/keep"]);

    // Export unmounts; import mounts again; daemon stop unmounts.
    d.ok(&["pool", "export", "tank"]);
    assert!(!is_mounted(&photos));
    d.ok(&["pool", "import", "-d", dir.path().to_str().unwrap(), "tank"]);
    assert!(is_mounted(&photos));
    assert_eq!(std::fs::read(photos.join("note.txt")).unwrap(), b"first");
    d.stop();
    assert!(!is_mounted(&photos), "daemon stop unmounts");
    d = Daemon::start(dir.path());
    assert!(
        is_mounted(&photos),
        "a restarted daemon mounts its datasets"
    );
    d.ok(&["dataset", "set", "mountpoint=none", "tank/photos"]);
    assert!(!is_mounted(&photos));
    d.stop();
}

/// `--fuse-threads` sets how many threads serve each mount (the most the
/// FUSE layer takes, too), and a mount is served by exactly that many.
#[test]
fn fuse_threads_flag_sets_the_workers_of_each_mount() {
    if !require::fuse() {
        return;
    }
    let workers = |d: &Daemon| -> usize {
        let tasks = format!("/proc/{}/task", d.child.id());
        std::fs::read_dir(tasks)
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            // The workers are fuser-0, fuser-1, ... (beside one fuser-bg).
            .filter(|c| {
                c.trim()
                    .strip_prefix("fuser-")
                    .is_some_and(|i| i.parse::<usize>().is_ok())
            })
            .count()
    };
    for n in [3usize, 64] {
        let dir = tempfile::tempdir().unwrap();
        let d = Daemon::start_with(dir.path(), &["--fuse-threads", &n.to_string()]);
        let f = files(dir.path(), "t", 1, 64 << 20);
        d.ok(&["pool", "create", "tank", &f[0]]);
        let before = workers(&d);
        let mnt = dir.path().join("mnt");
        let mp = format!("mountpoint={}", mnt.display());
        d.ok(&["dataset", "create", "-o", &mp, "tank/fs"]);
        assert!(is_mounted(&mnt));
        std::fs::write(mnt.join("f"), b"served").unwrap();
        // The session starts its threads in the background.
        let t0 = std::time::Instant::now();
        while workers(&d) - before < n && t0.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(workers(&d) - before, n, "threads serving one mount");
    }
}

/// Runs `tarn daemon` with state and socket under `dir` (socket `sock`)
/// and `extra` arguments, expecting it to fail its start: the exit status
/// and what it said. A daemon still running after 60 s fails the test.
fn failed_start(dir: &std::path::Path, sock: &str, extra: &[&str]) -> (bool, String) {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_tarn"))
        .args(["daemon", "--socket"])
        .arg(dir.join(sock))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed().as_secs() > 60 {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon kept running where its start should have failed");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A pool `tank` on one file under `dir`, with `tank/fs` mounted at
/// `dir/mnt` holding one file, left by a daemon stopped cleanly.
fn pool_with_a_mount(dir: &std::path::Path) -> std::path::PathBuf {
    let d = Daemon::start(dir);
    let f = files(dir, "s", 1, 128 << 20);
    d.ok(&["pool", "create", "tank", &f[0]]);
    let mnt = dir.join("mnt");
    let mp = format!("mountpoint={}", mnt.display());
    d.ok(&["dataset", "create", "-o", &mp, "tank/fs"]);
    std::fs::write(mnt.join("kept"), b"before the failed start").unwrap();
    d.stop();
    assert!(!is_mounted(&mnt));
    mnt
}

/// Takes a mount a failed test left behind down.
fn unmount_leftover(mnt: &std::path::Path) {
    if is_mounted(mnt) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(mnt)
            .status();
    }
}

/// A start that fails after the pools were imported and their
/// filesystems mounted (a server's port is taken) stops as a stop would:
/// the mount goes (a FUSE mount whose daemon exited answers only
/// "transport endpoint is not connected"), the pool is exported, and the
/// next start is not taken for a crash.
#[test]
fn a_start_that_fails_late_unmounts_and_exports() {
    if !require::fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = pool_with_a_mount(dir.path());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (ok, said) = failed_start(dir.path(), "tarn.sock", &["--webdav", &addr]);
    let left = is_mounted(&mnt);
    unmount_leftover(&mnt);
    assert!(!ok, "the start should fail: {said}");
    assert!(!left, "the failed start left its mount behind: {said}");
    assert!(
        !dir.path().join("state/running").exists(),
        "the failed start did not stop cleanly: {said}"
    );
    assert!(
        !dir.path().join("tarn.sock").exists(),
        "socket left: {said}"
    );
    drop(taken);
    let d = Daemon::start(dir.path());
    assert!(is_mounted(&mnt));
    assert_eq!(
        std::fs::read(mnt.join("kept")).unwrap(),
        b"before the failed start"
    );
    let events = d.ok(&["events"]);
    assert!(!events.contains("daemon.crashed"), "{events}");
    d.stop();
}

/// A daemon whose admin socket is another daemon's fails before it
/// imports or mounts anything of its own.
#[test]
fn a_daemon_that_cannot_have_its_socket_touches_nothing() {
    if !require::fuse() {
        return;
    }
    let other = tempfile::tempdir().unwrap();
    let running = Daemon::start(other.path());
    let dir = tempfile::tempdir().unwrap();
    let mnt = pool_with_a_mount(dir.path());
    let sock = running.socket.to_str().unwrap().to_string();
    let (ok, said) = failed_start(dir.path(), &sock, &[]);
    let left = is_mounted(&mnt);
    unmount_leftover(&mnt);
    assert!(!ok, "the start should fail: {said}");
    assert!(said.contains("already listening"), "{said}");
    assert!(!left, "the failed start mounted its filesystem: {said}");
    assert!(
        !dir.path().join("state/running").exists(),
        "the failed start opened its pools: {said}"
    );
    running.stop();
}
