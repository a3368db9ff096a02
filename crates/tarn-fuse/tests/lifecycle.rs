//! Mount lifecycle, cache invalidation, read-only mounts, credentials and
//! concurrency. Needs root and /dev/fuse (each test prints why and passes
//! if they are missing).

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{mount_backend, mount_default, mount_test_backend, mount_with};
use tarn_fs::testing::MemBackend;
use tarn_fs::{Cred, ROOT_INO};
use tarn_fuse::{FuseError, MountOptions};
use tarn_testkit::data::pattern;
use tarn_testkit::require::{self, is_mounted};

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn assert_plain_empty_dir(p: &Path) {
    assert!(!is_mounted(p), "{} still mounted", p.display());
    let m = fs::symlink_metadata(p).unwrap();
    assert!(m.is_dir());
    assert_eq!(fs::read_dir(p).unwrap().count(), 0);
}

#[test]
fn unmount_on_drop() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    let mp = f.root();
    fs::write(f.path("file"), b"x").unwrap();
    assert!(is_mounted(&mp));
    assert!(f.mount.is_mounted());
    let common::Fixture {
        mount,
        dir,
        fs: _fs,
        ..
    } = f;
    drop(mount);
    assert_plain_empty_dir(&mp);
    drop(dir);
    assert!(!mp.exists());
}

#[test]
fn explicit_unmount_and_busy() {
    if !require::fuse() {
        return;
    }
    let mut f = mount_default();
    let mp = f.root();
    fs::write(f.path("file"), b"x").unwrap();
    let open = File::open(f.path("file")).unwrap();
    match f.mount.unmount() {
        Err(FuseError::Busy { .. }) => {}
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(f.mount.is_mounted());
    let mut s = String::new();
    (&open).read_to_string(&mut s).unwrap();
    assert_eq!(s, "x");
    drop(open);
    f.mount.unmount().unwrap();
    assert!(!f.mount.is_mounted());
    assert_plain_empty_dir(&mp);
    // Idempotent.
    f.mount.unmount().unwrap();
}

#[test]
fn drop_while_busy_detaches_lazily() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    let mp = f.root();
    fs::write(f.path("file"), b"kept open").unwrap();
    let open = File::open(f.path("file")).unwrap();
    let common::Fixture { mount, dir, .. } = f;
    drop(mount);
    assert_plain_empty_dir(&mp);
    // The open file is still served until it is closed.
    let mut s = String::new();
    (&open).read_to_string(&mut s).unwrap();
    assert_eq!(s, "kept open");
    drop(open);
    drop(dir);
}

#[test]
fn kernel_lost_the_mount() {
    if !require::fuse() {
        return;
    }
    // External umount.
    let mut f = mount_default();
    let mp = f.root();
    let st = Command::new("umount").arg(&mp).status().unwrap();
    assert!(st.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    while f.mount.is_mounted() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!f.mount.is_mounted());
    f.mount.unmount().unwrap();
    assert_plain_empty_dir(&mp);

    // Connection aborted through fusectl: a dead mount stays at the path
    // until the handle detaches it.
    let f = mount_default();
    let mp = f.root();
    let dev = fs::metadata(&mp).unwrap().dev();
    let minor = libc::minor(dev);
    let abort = format!("/sys/fs/fuse/connections/{minor}/abort");
    if !Path::new(&abort).exists() {
        eprintln!("fusectl not mounted; skipping the abort half");
        return;
    }
    fs::write(&abort, b"1").unwrap();
    let e = fs::metadata(f.path("x")).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENOTCONN);
    assert!(!f.mount.is_mounted());
    let common::Fixture { mount, dir, .. } = f;
    drop(mount);
    assert_plain_empty_dir(&mp);
    drop(dir);
}

#[test]
fn invalidate_all_shows_changes_made_under_the_mount() {
    if !require::fuse() {
        return;
    }
    // Long TTLs so the kernel certainly caches.
    let f = mount_with(&MountOptions {
        attr_ttl: Duration::from_secs(600),
        entry_ttl: Duration::from_secs(600),
        ..Default::default()
    });
    fs::write(f.path("f"), b"hello").unwrap();
    assert_eq!(fs::read(f.path("f")).unwrap(), b"hello");
    let ino = fs::metadata(f.path("f")).unwrap().ino();
    assert_eq!(fs::metadata(f.path("f")).unwrap().len(), 5);

    // Change the file behind the kernel's back, as a rollback would: through
    // a second `Fs` on the same dataset, whose changes the mount does not
    // hear about (every change through the mounted `Fs` is invalidated by
    // itself; tests/coherence.rs).
    let under = tarn_fs::Fs::mount(f.backend.clone()).unwrap();
    under
        .write(ino, 0, b"HELLO, world", false, &Cred::root())
        .unwrap();
    under
        .rename(ROOT_INO, b"f", ROOT_INO, b"g", 0, &Cred::root())
        .unwrap();
    // Still the cached view...
    assert_eq!(fs::metadata(f.path("f")).unwrap().len(), 5);
    // ...until invalidated.
    let n = f.mount.invalidate_all().unwrap();
    assert!(n >= 2);
    let e = fs::metadata(f.path("f")).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENOENT);
    assert_eq!(fs::read(f.path("g")).unwrap(), b"HELLO, world");

    // Single-inode invalidation. (A read marks the cached atime stale, so
    // stat once more to have every attribute cached again.)
    assert_eq!(fs::metadata(f.path("g")).unwrap().len(), 12);
    under.write(ino, 12, b"!", false, &Cred::root()).unwrap();
    assert_eq!(fs::metadata(f.path("g")).unwrap().len(), 12);
    f.mount.invalidate_inode(ino).unwrap();
    assert_eq!(fs::metadata(f.path("g")).unwrap().len(), 13);
    assert_eq!(fs::read(f.path("g")).unwrap(), b"HELLO, world!");
}

#[test]
fn read_only_backend_and_read_only_mount() {
    if !require::fuse() {
        return;
    }
    // A dataset made read-only after it was populated.
    let backend = MemBackend::new();
    {
        let f = mount_backend(backend.clone(), &MountOptions::default());
        fs::create_dir(f.path("d")).unwrap();
        fs::write(f.path("d/file"), b"content").unwrap();
    }
    backend.set_readonly(true);
    let f = mount_backend(backend.clone(), &MountOptions::default());
    assert_eq!(fs::read(f.path("d/file")).unwrap(), b"content");
    let e = fs::write(f.path("d/new"), b"x").unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS);
    // open(O_WRONLY) should fail with EROFS; tarn-fs currently lets the
    // open succeed and fails the first write instead (reported), so accept
    // either as long as nothing is written.
    match OpenOptions::new().write(true).open(f.path("d/file")) {
        Err(e) => assert_eq!(errno_of(&e), libc::EROFS),
        Ok(mut file) => {
            let e = file.write_all(b"overwrite").unwrap_err();
            assert_eq!(errno_of(&e), libc::EROFS);
        }
    }
    assert_eq!(fs::read(f.path("d/file")).unwrap(), b"content");
    let e = fs::create_dir(f.path("d2")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS);
    let e = fs::remove_file(f.path("d/file")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS);
    let e = fs::set_permissions(f.path("d/file"), fs::Permissions::from_mode(0o600)).unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS);
    drop(f);

    // A writable dataset mounted read-only: the kernel refuses, and
    // reading and listing through the mount write nothing (no atime).
    backend.set_readonly(false);
    let under = tarn_fs::Fs::mount(backend.clone()).unwrap();
    let root = tarn_fs::Cred::root();
    let times = |under: &tarn_fs::Fs<MemBackend>| {
        let d = under.lookup(tarn_fs::ROOT_INO, b"d", &root).unwrap();
        let file = under.lookup(d.ino, b"file", &root).unwrap();
        (d.atime, file.atime)
    };
    // Reading through the dataset itself does refresh them (relatime:
    // not yet read since written), so the test can see a change.
    let before = times(&under);
    backend.advance(2_000_000_000);
    let f = mount_backend(
        backend,
        &MountOptions {
            read_only: true,
            ..Default::default()
        },
    );
    assert_eq!(fs::read(f.path("d/file")).unwrap(), b"content");
    assert_eq!(fs::read_dir(f.path("d")).unwrap().count(), 1);
    assert_eq!(times(&under), before, "a read-only mount wrote atimes");
    let d = under.lookup(tarn_fs::ROOT_INO, b"d", &root).unwrap().ino;
    let file = under.lookup(d, b"file", &root).unwrap().ino;
    under.read(file, 0, 16).unwrap();
    under.readdir(d, 0, 16).unwrap();
    assert_ne!(
        times(&under),
        before,
        "reads through the dataset refresh atime"
    );
    let e = fs::write(f.path("d/new"), b"x").unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS);
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.contains(&*f.root().to_string_lossy()))
        .unwrap();
    assert!(line.contains(" ro,"), "{line}");
}

fn setpriv(groups: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=1000", "--regid=1000"]);
    match groups {
        Some(g) => c.arg(format!("--groups={g}")),
        None => c.arg("--clear-groups"),
    };
    c.args(args).output().unwrap()
}

#[test]
fn other_users_and_supplementary_groups() {
    if !require::fuse() {
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("SKIPPED other_users_and_supplementary_groups: no setpriv");
        return;
    }
    for default_permissions in [false, true] {
        let f = mount_with(&MountOptions {
            allow_other: true,
            default_permissions,
            ..Default::default()
        });
        fs::set_permissions(f.root(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::create_dir(f.path("team")).unwrap();
        fs::write(f.path("team/plan"), b"secret plan").unwrap();
        std::os::unix::fs::chown(f.path("team"), Some(0), Some(2000)).unwrap();
        std::os::unix::fs::chown(f.path("team/plan"), Some(0), Some(2000)).unwrap();
        fs::set_permissions(f.path("team"), fs::Permissions::from_mode(0o750)).unwrap();
        fs::set_permissions(f.path("team/plan"), fs::Permissions::from_mode(0o640)).unwrap();
        let plan = f.path("team/plan");
        let plan = plan.to_str().unwrap();

        // Not in group 2000: no search permission on the directory.
        let out = setpriv(None, &["cat", plan]);
        assert!(!out.status.success(), "dp={default_permissions}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
            "dp={default_permissions}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // In group 2000 as a supplementary group: may read, not write.
        let out = setpriv(Some("2000"), &["cat", plan]);
        assert!(
            out.status.success(),
            "dp={default_permissions}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, b"secret plan");
        let out = setpriv(Some("2000"), &["sh", "-c", &format!("echo x >> {plan}")]);
        assert!(!out.status.success(), "dp={default_permissions}");
        // A file created by the user belongs to them.
        fs::set_permissions(f.path("team"), fs::Permissions::from_mode(0o770)).unwrap();
        let mine = f.path("team/mine");
        let out = setpriv(Some("2000"), &["touch", mine.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let m = fs::metadata(&mine).unwrap();
        assert_eq!((m.uid(), m.gid()), (1000, 1000));
    }

    // Without allow_other, other users are kept out entirely.
    let f = mount_default();
    fs::set_permissions(f.root(), fs::Permissions::from_mode(0o755)).unwrap();
    let out = setpriv(None, &["ls", f.root().to_str().unwrap()]);
    assert!(!out.status.success());
}

#[test]
fn eight_threads_of_io() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    fs::create_dir(f.path("shared")).unwrap();
    let root = f.root();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let root = root.clone();
            std::thread::spawn(move || {
                let p = root.join(format!("file-{t}"));
                let data = pattern(t, 3 * 1024 * 1024 + t as usize * 777);
                let mut file = File::create(&p).unwrap();
                // Uneven chunk sizes, so requests do not line up.
                let mut off = 0;
                let mut step = 1000 + t as usize * 3001;
                while off < data.len() {
                    let end = (off + step).min(data.len());
                    file.write_all(&data[off..end]).unwrap();
                    off = end;
                    step = step * 7 % 300_000 + 1;
                }
                file.sync_all().unwrap();
                drop(file);
                for i in 0..100 {
                    fs::write(root.join(format!("shared/t{t}-{i}")), [t as u8; 10]).unwrap();
                }
                // Read back in pieces at random-ish offsets, then whole.
                let file = File::open(&p).unwrap();
                for k in 0..50u64 {
                    let start = (k * 65_537 * (t + 1)) as usize % data.len();
                    let len = 4096.min(data.len() - start);
                    let mut buf = vec![0u8; len];
                    file.read_exact_at(&mut buf, start as u64).unwrap();
                    assert_eq!(buf, &data[start..start + len]);
                }
                assert_eq!(fs::read(&p).unwrap(), data);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(fs::read_dir(f.path("shared")).unwrap().count(), 800);
    for t in 0..8u64 {
        let data = pattern(t, 3 * 1024 * 1024 + t as usize * 777);
        assert_eq!(fs::read(f.path(&format!("file-{t}"))).unwrap(), data);
    }
}

#[test]
fn slow_read_does_not_block_other_requests() {
    if !require::fuse() {
        return;
    }
    let f = mount_test_backend(&MountOptions::default(), false);
    fs::write(f.path("slow"), b"").unwrap();
    let ino = fs::metadata(f.path("slow")).unwrap().ino();
    // Written past the kernel, so its pages are not cached: the read below
    // must reach `Fs`.
    f.fs.write(ino, 0, &pattern(1, 8192), false, &Cred::root())
        .unwrap();
    let fast = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(f.path("fast"))
        .unwrap();
    f.backend.slow_ms.store(3000, Ordering::SeqCst);
    f.backend.slow_ino.store(ino, Ordering::SeqCst);
    let slow_path = f.path("slow");
    let started = Instant::now();
    let reader = std::thread::spawn(move || {
        let data = fs::read(slow_path).unwrap();
        (data, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    fast.write_all_at(b"quick", 0).unwrap();
    let meta = fs::metadata(f.path("fast")).unwrap();
    fs::create_dir(f.path("newdir")).unwrap();
    let quick = t0.elapsed();
    assert_eq!(meta.len(), 5);
    assert!(!reader.is_finished(), "the slow read finished early");
    assert!(quick < Duration::from_millis(1500), "blocked for {quick:?}");
    f.backend.slow_ino.store(0, Ordering::SeqCst);
    let (data, took) = reader.join().unwrap();
    assert_eq!(data, pattern(1, 8192));
    assert!(took >= Duration::from_millis(2500), "read took {took:?}");
}

#[test]
fn large_writes_arrive_in_few_requests() {
    if !require::fuse() {
        return;
    }
    let f = mount_test_backend(&MountOptions::default(), false);
    let file = File::create(f.path("big")).unwrap();
    let data = pattern(9, 8 << 20);
    let before = f.backend.write_txns.load(Ordering::SeqCst);
    file.write_all_at(&data, 0).unwrap();
    let txns = f.backend.write_txns.load(Ordering::SeqCst) - before;
    // 8 MiB in 1 MiB requests is 8 writes (128 KiB requests would be 64).
    assert!(txns <= 12, "{txns} write transactions for 8 MiB");
    drop(file);
    assert_eq!(fs::read(f.path("big")).unwrap(), data);
}

#[test]
fn large_reads_arrive_in_few_requests() {
    if !require::fuse() {
        return;
    }
    let f = mount_test_backend(&MountOptions::default(), false);
    fs::write(f.path("big"), b"").unwrap();
    let ino = fs::metadata(f.path("big")).unwrap().ino();
    // Written past the kernel, so nothing of it is cached.
    let data = pattern(10, 8 << 20);
    f.fs.write(ino, 0, &data, false, &Cred::root()).unwrap();
    let mut file = File::open(f.path("big")).unwrap();
    let before = f.backend.read_txns.load(Ordering::SeqCst);
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let txns = f.backend.read_txns.load(Ordering::SeqCst) - before;
    assert!(got == data, "read back differs");
    // 8 MiB in 1 MiB readahead requests is 8 reads (the kernel's default
    // readahead of 128 KiB would make 64), plus a few lookups and getattrs.
    assert!(txns <= 24, "{txns} read transactions for 8 MiB");
}

/// A mount for Samba lists `.snapshot` by the time each snapshot was taken
/// (`@GMT-…`), finds snapshots by that name only, and shows one snapshot
/// per second; another mount of the same `Fs` keeps the real names.
#[test]
fn snapshots_by_time_for_samba() {
    if !require::fuse() {
        return;
    }
    let backend = MemBackend::new();
    let opts = MountOptions {
        snapshot_time_names: true,
        ..MountOptions::default()
    };
    let f = mount_backend(backend.clone(), &opts);
    fs::write(f.path("file"), b"one").unwrap();
    backend.set_time(1_700_000_000, 0);
    backend.snapshot("monday").unwrap();
    fs::write(f.path("file"), b"two").unwrap();
    backend.set_time(1_700_086_400, 0);
    backend.snapshot("tuesday").unwrap();
    // Same second as tuesday: no name of its own.
    backend.snapshot("tuesday-again").unwrap();
    fs::write(f.path("file"), b"three").unwrap();

    let mut names: Vec<String> = fs::read_dir(f.path(".snapshot"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["@GMT-2023.11.14-22.13.20", "@GMT-2023.11.15-22.13.20"]
    );
    assert_eq!(
        fs::read(f.path(".snapshot/@GMT-2023.11.14-22.13.20/file")).unwrap(),
        b"one"
    );
    assert_eq!(
        fs::read(f.path(".snapshot/@GMT-2023.11.15-22.13.20/file")).unwrap(),
        b"two"
    );
    let e = fs::metadata(f.path(".snapshot/monday")).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENOENT, "real names are not looked up");
    let e = fs::metadata(f.path(".snapshot/@GMT-2023.11.16-22.13.20")).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENOENT, "no snapshot at that time");

    // A second, ordinary mount of the same Fs: the names as given.
    let dir = tempfile::tempdir().unwrap();
    let plain = tarn_fuse::mount(f.fs.clone(), dir.path(), &MountOptions::default()).unwrap();
    let mut real: Vec<String> = fs::read_dir(dir.path().join(".snapshot"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    real.sort();
    assert_eq!(real, ["monday", "tuesday", "tuesday-again"]);
    drop(plain);
    // Hundreds of snapshots in one second, then one more: whole batches of
    // the listing lose their names, and the listing still goes on to the
    // end instead of stopping at an empty batch.
    for i in 0..300 {
        backend.snapshot(&format!("burst-{i}")).unwrap();
    }
    backend.set_time(1_700_172_800, 0);
    backend.snapshot("wednesday").unwrap();
    let names: Vec<String> = fs::read_dir(f.path(".snapshot"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names.iter().any(|n| n == "@GMT-2023.11.16-22.13.20"),
        "{names:?}"
    );
}

/// Another filesystem mounted over a tarn mount is never unmounted in its
/// place: unmounting says why it cannot, leaves both as they are and
/// does not hang; once the other one is gone, it unmounts.
#[test]
fn a_filesystem_mounted_over_it_is_left_alone() {
    if !require::fuse() {
        return;
    }
    let mut f = mount_default();
    let mp = f.root();
    fs::write(f.path("file"), b"x").unwrap();
    let over = Command::new("mount")
        .args(["-t", "tmpfs", "over", mp.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(over.success());
    fs::write(mp.join("theirs"), b"y").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut mount = f.mount;
    std::thread::spawn(move || {
        let r = mount.unmount();
        let _ = tx.send((r.map_err(|e| e.to_string()), mount));
    });
    let (r, mount) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("unmount hung");
    assert!(
        r.is_err(),
        "unmounted although another filesystem is on top"
    );
    assert_eq!(fs::read(mp.join("theirs")).unwrap(), b"y", "theirs is gone");
    let off = Command::new("umount").arg(&mp).status().unwrap();
    assert!(off.success());
    assert_eq!(fs::read(mp.join("file")).unwrap(), b"x");
    f.mount = mount;
    f.mount.unmount().unwrap();
    assert_plain_empty_dir(&mp);
}
