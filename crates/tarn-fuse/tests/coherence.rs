//! Changes made through another path than the mount (a direct `Fs` call,
//! as the NFS and WebDAV servers make them, or a second mount of the same
//! filesystem) are seen through the mount at once, although the kernel
//! may cache names and attributes for ten minutes here. Needs root and
//! /dev/fuse (each test prints why and passes if they are missing).

mod common;

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::mount_with;
use tarn_fs::{Cred, SetAttr, ROOT_INO};
use tarn_fuse::MountOptions;
use tarn_testkit::require;

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// TTLs far longer than any test: what the kernel shows after a change
/// elsewhere can only come from an invalidation.
fn long_ttls() -> MountOptions {
    MountOptions {
        attr_ttl: Duration::from_secs(600),
        entry_ttl: Duration::from_secs(600),
        ..Default::default()
    }
}

fn gone(p: &Path) -> bool {
    matches!(fs::metadata(p), Err(e) if errno_of(&e) == libc::ENOENT)
}

#[test]
fn direct_changes_are_seen_at_once() {
    if !require::fuse() {
        return;
    }
    let f = mount_with(&long_ttls());
    let root = Cred::root();
    fs::create_dir(f.path("d")).unwrap();
    fs::write(f.path("d/f"), b"hello").unwrap();
    // Fill the kernel's caches: the entries, the attributes, the pages.
    let open = File::open(f.path("d/f")).unwrap();
    assert_eq!(fs::read(f.path("d/f")).unwrap(), b"hello");
    let meta = fs::metadata(f.path("d/f")).unwrap();
    let (ino, d_ino) = (meta.ino(), fs::metadata(f.path("d")).unwrap().ino());
    assert_eq!(meta.len(), 5);
    assert_eq!(fs::metadata(f.path("d")).unwrap().nlink(), 2);

    // Write: size, mtime and contents, also through a file already open.
    f.fs.write(ino, 0, b"HELLO, world", false, &root).unwrap();
    assert_eq!(fs::metadata(f.path("d/f")).unwrap().len(), 12);
    assert_eq!(fs::read(f.path("d/f")).unwrap(), b"HELLO, world");
    let mut buf = [0u8; 12];
    open.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"HELLO, world");
    // Same size, and the memory backend's clock stands still, so the mtime
    // does not move either: only dropping the pages shows the new bytes.
    f.fs.write(ino, 0, b"hello, WORLD", false, &root).unwrap();
    open.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"hello, WORLD");
    assert_eq!(fs::read(f.path("d/f")).unwrap(), b"hello, WORLD");

    // Truncate.
    let truncate = SetAttr {
        size: Some(3),
        ..Default::default()
    };
    f.fs.setattr(ino, &truncate, &root).unwrap();
    assert_eq!(fs::metadata(f.path("d/f")).unwrap().len(), 3);
    assert_eq!(fs::read(f.path("d/f")).unwrap(), b"hel");

    // Attributes only: mode and owner.
    let chmod = SetAttr {
        mode: Some(0o604),
        uid: Some(1234),
        ..Default::default()
    };
    f.fs.setattr(ino, &chmod, &root).unwrap();
    let meta = fs::metadata(f.path("d/f")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o604);
    assert_eq!(meta.uid(), 1234);

    // Names: create (a name the kernel has cached as missing), and the
    // directory's link count after a mkdir.
    assert!(gone(&f.path("d/new")));
    f.fs.create(d_ino, b"new", 0o644, 0, libc::O_WRONLY, &root)
        .unwrap();
    f.fs.mkdir(d_ino, b"sub", 0o755, 0, &root).unwrap();
    assert!(f.path("d/new").exists());
    assert_eq!(fs::metadata(f.path("d")).unwrap().nlink(), 3);

    // Hard link: the link count of the cached inode.
    f.fs.link(ino, ROOT_INO, b"hard", &root).unwrap();
    assert_eq!(fs::metadata(f.path("d/f")).unwrap().nlink(), 2);

    // Rename: the old name goes, the new one shows the file.
    f.fs.rename(d_ino, b"f", d_ino, b"g", 0, &root).unwrap();
    assert!(gone(&f.path("d/f")), "renamed name still cached");
    assert_eq!(fs::read(f.path("d/g")).unwrap(), b"hel");

    // Rename over a cached name: it names the other file now.
    fs::write(f.path("d/victim"), b"old victim").unwrap();
    assert_eq!(fs::read(f.path("d/victim")).unwrap(), b"old victim");
    f.fs.rename(d_ino, b"g", d_ino, b"victim", 0, &root)
        .unwrap();
    assert_eq!(fs::metadata(f.path("d/victim")).unwrap().ino(), ino);
    assert_eq!(fs::read(f.path("d/victim")).unwrap(), b"hel");

    // Unlink and rmdir.
    f.fs.unlink(d_ino, b"victim", &root).unwrap();
    f.fs.rmdir(d_ino, b"sub", &root).unwrap();
    assert!(gone(&f.path("d/victim")), "unlinked name still cached");
    assert!(gone(&f.path("d/sub")), "removed directory still cached");
    assert_eq!(fs::metadata(f.path("d")).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(f.path("hard")).unwrap().nlink(), 1);
    drop(open);
    assert_eq!(f.mount.invalidation_errors(), 0);
}

#[test]
fn changes_through_a_second_mount_are_seen() {
    if !require::fuse() {
        return;
    }
    let a = mount_with(&long_ttls());
    let dir_b = tempfile::tempdir().unwrap();
    let b = tarn_fuse::mount(Arc::clone(&a.fs), dir_b.path(), &long_ttls()).unwrap();
    let on_b = |rel: &str| b.mountpoint().join(rel);

    fs::write(a.path("f"), b"one").unwrap();
    assert_eq!(fs::read(a.path("f")).unwrap(), b"one");
    assert_eq!(fs::read(on_b("f")).unwrap(), b"one");

    // A change through B reaches A through A's invalidation thread, a
    // moment after B's call returns.
    fs::write(on_b("f"), b"two, longer").unwrap();
    fs::rename(on_b("f"), on_b("g")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(gone(&a.path("f")) && fs::metadata(a.path("g")).is_ok_and(|m| m.len() == 11)) {
        assert!(
            Instant::now() < deadline,
            "mount A still shows the old name or size"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(fs::read(a.path("g")).unwrap(), b"two, longer");
    // And the other way round.
    fs::remove_file(a.path("g")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone(&on_b("g")) {
        assert!(Instant::now() < deadline, "mount B still shows g");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(b);
}
