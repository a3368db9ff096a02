//! POSIX behaviour through a real mount: std::fs, libc calls and real
//! programs against a memory-backed filesystem. Needs root and /dev/fuse
//! (each test prints why and passes if they are missing).

mod common;

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, UNIX_EPOCH};

use common::mount_default;
use tarn_testkit::data::pattern;
use tarn_testkit::require;

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in test paths")
}

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[test]
fn create_write_read_append() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    let p = f.path("a.txt");
    fs::write(&p, b"hello").unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"hello");

    // Overwrite in the middle through a positioned write.
    let file = OpenOptions::new().write(true).open(&p).unwrap();
    file.write_all_at(b"J", 0).unwrap();
    drop(file);
    assert_eq!(fs::read(&p).unwrap(), b"Jello");

    // O_APPEND: every write goes to the end, even after a seek, and two
    // appending handles interleave without overwriting each other.
    let mut a1 = OpenOptions::new().append(true).open(&p).unwrap();
    let mut a2 = OpenOptions::new().append(true).open(&p).unwrap();
    a1.write_all(b" one").unwrap();
    a2.write_all(b" two").unwrap();
    a1.seek(SeekFrom::Start(0)).unwrap();
    a1.write_all(b" three").unwrap();
    drop((a1, a2));
    assert_eq!(fs::read(&p).unwrap(), b"Jello one two three");
    // O_APPEND cleared with fcntl: writes go where they are asked again.
    let a3 = OpenOptions::new().append(true).open(&p).unwrap();
    {
        use std::os::fd::AsRawFd;
        // SAFETY: F_SETFL on a descriptor this test owns and keeps open.
        let rc = unsafe { libc::fcntl(a3.as_raw_fd(), libc::F_SETFL, 0) };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
    }
    a3.write_all_at(b"H", 0).unwrap();
    drop(a3);
    assert_eq!(fs::read(&p).unwrap(), b"Hello one two three");
    fs::write(&p, b"Jello one two three").unwrap();

    // O_EXCL on an existing name fails; on a new one it creates.
    let e = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap_err();
    assert_eq!(errno_of(&e), libc::EEXIST);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(f.path("new"))
        .unwrap();

    // O_TRUNC empties an existing file atomically with the open.
    let mut t = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);
    t.write_all(b"x").unwrap();
    drop(t);
    assert_eq!(fs::read(&p).unwrap(), b"x");

    // A big single write (several max_write requests) reads back intact.
    let big = pattern(1, 5 * 1024 * 1024 + 123);
    fs::write(f.path("big"), &big).unwrap();
    assert_eq!(fs::read(f.path("big")).unwrap(), big);

    // fsync reaches the backend.
    let before = f.backend.sync_count();
    File::open(f.path("big")).unwrap().sync_all().unwrap();
    assert!(f.backend.sync_count() > before);
}

/// A program running from the mount cannot be emptied or opened for
/// writing (ETXTBSY), and a refused `open(O_TRUNC)` leaves its bytes
/// alone: given `FUSE_ATOMIC_O_TRUNC`, the kernel sent the truncation
/// with the open before its own check, and every program so opened died
/// while loading (its pages read back empty).
#[test]
fn a_running_program_is_neither_written_nor_emptied() {
    use std::os::unix::fs::OpenOptionsExt;
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    let sleep = fs::read("/usr/bin/sleep").unwrap();
    for round in 0..10 {
        let p = f.path(&format!("prog{round}"));
        fs::write(&p, &sleep).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        let mut child = Command::new(&p).arg("0.3").spawn().unwrap();
        for (write, truncate) in [(true, false), (false, true)] {
            let e = OpenOptions::new()
                .read(!write)
                .write(write)
                .custom_flags(if truncate { libc::O_TRUNC } else { 0 })
                .open(&p)
                .unwrap_err();
            assert_eq!(errno_of(&e), libc::ETXTBSY, "round {round}: {e}");
        }
        let st = child.wait().unwrap();
        assert!(st.success(), "round {round}: the program ended with {st}");
        assert!(
            fs::read(&p).unwrap() == sleep,
            "round {round}: its bytes changed"
        );
    }
}

#[test]
fn rename_over_existing_and_flags() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    fs::write(f.path("src"), b"source").unwrap();
    fs::write(f.path("dst"), b"old target").unwrap();
    fs::rename(f.path("src"), f.path("dst")).unwrap();
    assert!(!f.path("src").exists());
    assert_eq!(fs::read(f.path("dst")).unwrap(), b"source");

    // Directory over an empty directory; not over a non-empty one.
    fs::create_dir(f.path("d1")).unwrap();
    fs::write(f.path("d1/inner"), b"i").unwrap();
    fs::create_dir(f.path("d2")).unwrap();
    fs::rename(f.path("d1"), f.path("d2")).unwrap();
    assert_eq!(fs::read(f.path("d2/inner")).unwrap(), b"i");
    fs::create_dir(f.path("d3")).unwrap();
    let e = fs::rename(f.path("d3"), f.path("d2")).unwrap_err();
    assert!(matches!(errno_of(&e), libc::ENOTEMPTY | libc::EEXIST));

    // renameat2 flags.
    fs::write(f.path("x"), b"X").unwrap();
    fs::write(f.path("y"), b"Y").unwrap();
    let (x, y) = (cpath(&f.path("x")), cpath(&f.path("y")));
    // SAFETY: valid NUL-terminated paths, AT_FDCWD, known flag values.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            x.as_ptr(),
            libc::AT_FDCWD,
            y.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    assert_eq!((r, last_errno()), (-1, libc::EEXIST));
    // SAFETY: as above.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            x.as_ptr(),
            libc::AT_FDCWD,
            y.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(r, 0, "RENAME_EXCHANGE: {}", io::Error::last_os_error());
    assert_eq!(fs::read(f.path("x")).unwrap(), b"Y");
    assert_eq!(fs::read(f.path("y")).unwrap(), b"X");
}

#[test]
fn hard_links_and_symlinks() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    fs::write(f.path("orig"), b"shared").unwrap();
    fs::hard_link(f.path("orig"), f.path("link")).unwrap();
    let (m1, m2) = (
        fs::metadata(f.path("orig")).unwrap(),
        fs::metadata(f.path("link")).unwrap(),
    );
    assert_eq!(m1.ino(), m2.ino());
    assert_eq!(m2.nlink(), 2);
    fs::write(f.path("link"), b"changed").unwrap();
    assert_eq!(fs::read(f.path("orig")).unwrap(), b"changed");
    fs::remove_file(f.path("orig")).unwrap();
    assert_eq!(fs::metadata(f.path("link")).unwrap().nlink(), 1);
    assert_eq!(fs::read(f.path("link")).unwrap(), b"changed");
    // No hard links to directories.
    fs::create_dir(f.path("dir")).unwrap();
    let e = fs::hard_link(f.path("dir"), f.path("dirlink")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EPERM);

    // Symlinks: relative, absolute-looking, dangling.
    std::os::unix::fs::symlink("link", f.path("sym")).unwrap();
    assert_eq!(fs::read_link(f.path("sym")).unwrap(), Path::new("link"));
    assert!(fs::symlink_metadata(f.path("sym"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(f.path("sym")).unwrap(), b"changed");
    std::os::unix::fs::symlink("/nonexistent/target", f.path("dangling")).unwrap();
    let e = fs::metadata(f.path("dangling")).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENOENT);
    let long = "x".repeat(4000);
    std::os::unix::fs::symlink(&long, f.path("longsym")).unwrap();
    assert_eq!(fs::read_link(f.path("longsym")).unwrap(), Path::new(&long));
    // Reading through a symlink to a directory.
    std::os::unix::fs::symlink("dir", f.path("dirsym")).unwrap();
    fs::write(f.path("dirsym/inside"), b"in").unwrap();
    assert_eq!(fs::read(f.path("dir/inside")).unwrap(), b"in");
}

#[test]
fn special_files() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    let fifo = cpath(&f.path("fifo"));
    // SAFETY: valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let m = fs::symlink_metadata(f.path("fifo")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()));
    assert_eq!(m.mode() & 0o777, 0o644 & !umask());
    // The pipe itself is the kernel's: open both ends and pass a byte.
    let mut p = OpenOptions::new()
        .read(true)
        .write(true)
        .open(f.path("fifo"))
        .unwrap();
    p.write_all(b"z").unwrap();
    let mut b = [0u8; 1];
    p.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"z");

    // A device node keeps its number (metadata only; the mount is nodev).
    let dev = cpath(&f.path("null"));
    let rdev = libc::makedev(1, 3);
    // SAFETY: valid path; mknod of a char device as root.
    let r = unsafe { libc::mknod(dev.as_ptr(), libc::S_IFCHR | 0o600, rdev) };
    assert_eq!(r, 0, "mknod: {}", io::Error::last_os_error());
    let m = fs::symlink_metadata(f.path("null")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &m.file_type()
    ));
    assert_eq!(m.rdev(), rdev);
}

fn umask() -> u32 {
    // SAFETY: umask cannot fail; it is set back at once.
    let old = unsafe { libc::umask(0o022) };
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    old
}

#[test]
fn chmod_chown() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    let p = f.path("file");
    fs::write(&p, b"data").unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o640);
    std::os::unix::fs::chown(&p, Some(1000), Some(2000)).unwrap();
    let m = fs::metadata(&p).unwrap();
    assert_eq!((m.uid(), m.gid()), (1000, 2000));
    // chown clears set-id bits of a regular file.
    fs::set_permissions(&p, fs::Permissions::from_mode(0o6755)).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o6755);
    std::os::unix::fs::chown(&p, Some(1001), None).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o755);
    // Directories too.
    fs::create_dir(f.path("d")).unwrap();
    fs::set_permissions(f.path("d"), fs::Permissions::from_mode(0o1777)).unwrap();
    assert_eq!(fs::metadata(f.path("d")).unwrap().mode() & 0o7777, 0o1777);
}

#[test]
fn timestamps_with_nanoseconds() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    let p = f.path("t");
    fs::write(&p, b"x").unwrap();
    let at = UNIX_EPOCH + Duration::new(1_234_567_890, 123_456_789);
    let mt = UNIX_EPOCH + Duration::new(1_111_111_111, 987_654_321);
    let file = OpenOptions::new().write(true).open(&p).unwrap();
    file.set_times(fs::FileTimes::new().set_accessed(at).set_modified(mt))
        .unwrap();
    drop(file);
    let m = fs::metadata(&p).unwrap();
    assert_eq!((m.atime(), m.atime_nsec()), (1_234_567_890, 123_456_789));
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_111_111_111, 987_654_321));

    // utimensat by path: UTIME_NOW for atime (the backend's clock, fixed
    // at 1_700_000_000 s), UTIME_OMIT keeps mtime.
    let c = cpath(&p);
    let ts = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    // SAFETY: valid path and a two-element timespec array.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) };
    assert_eq!(r, 0, "utimensat: {}", io::Error::last_os_error());
    let m = fs::metadata(&p).unwrap();
    assert_eq!((m.atime(), m.atime_nsec()), (1_700_000_000, 0));
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_111_111_111, 987_654_321));

    // Before 1970, with nanoseconds: -1.5 s is (-2 s, 500_000_000 ns).
    let ts = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: -2,
            tv_nsec: 500_000_000,
        },
    ];
    // SAFETY: as above.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) };
    assert_eq!(r, 0, "utimensat: {}", io::Error::last_os_error());
    let m = fs::metadata(&p).unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec()), (-2, 500_000_000));
}

#[test]
fn xattrs() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    let p = f.path("x");
    fs::write(&p, b"").unwrap();
    let c = cpath(&p);
    let name = CString::new("user.color").unwrap();
    let set = |value: &[u8], flags: i32| -> (isize, i32) {
        // SAFETY: valid path/name pointers; value pointer and length match.
        let r = unsafe {
            libc::setxattr(
                c.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        };
        (r as isize, if r < 0 { last_errno() } else { 0 })
    };
    let get = |size: usize| -> (isize, i32, Vec<u8>) {
        let mut buf = vec![0u8; size];
        // SAFETY: the buffer has `size` bytes (a null pointer for 0 would
        // also do; an empty Vec's dangling pointer is not dereferenced).
        let r = unsafe { libc::getxattr(c.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), size) };
        let e = if r < 0 { last_errno() } else { 0 };
        buf.truncate(r.max(0) as usize);
        (r, e, buf)
    };
    assert_eq!(get(64).1, libc::ENODATA);
    assert_eq!(set(b"blue", 0), (0, 0));
    // Size probe, too-small buffer, then the value.
    assert_eq!(get(0).0, 4);
    assert_eq!(get(2).1, libc::ERANGE);
    assert_eq!(get(64).2, b"blue");
    assert_eq!(set(b"red", libc::XATTR_CREATE).1, libc::EEXIST);
    assert_eq!(set(b"green", libc::XATTR_REPLACE), (0, 0));
    assert_eq!(get(64).2, b"green");
    // A value of the maximum size.
    let big = pattern(3, 65536);
    assert_eq!(set(&big, 0), (0, 0));
    assert_eq!(get(70000).2, big);

    let n2 = CString::new("user.second").unwrap();
    // SAFETY: valid pointers, value of length 1.
    let r = unsafe { libc::setxattr(c.as_ptr(), n2.as_ptr(), b"2".as_ptr().cast(), 1, 0) };
    assert_eq!(r, 0);
    // SAFETY: null buffer with size 0 is the documented size probe.
    let len = unsafe { libc::listxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(len as usize, "user.color\0user.second\0".len());
    let mut buf = vec![0u8; len as usize];
    // SAFETY: buffer of `len` bytes.
    let r = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(r, len);
    let names: BTreeSet<&[u8]> = buf.split(|b| *b == 0).filter(|s| !s.is_empty()).collect();
    assert_eq!(
        names,
        BTreeSet::from([&b"user.color"[..], &b"user.second"[..]])
    );
    // SAFETY: 1-byte buffer, too small on purpose.
    let r = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), 1) };
    assert_eq!((r, last_errno()), (-1, libc::ERANGE));

    // SAFETY: valid pointers.
    assert_eq!(unsafe { libc::removexattr(c.as_ptr(), name.as_ptr()) }, 0);
    assert_eq!(get(64).1, libc::ENODATA);
    // SAFETY: valid pointers.
    let r = unsafe { libc::removexattr(c.as_ptr(), name.as_ptr()) };
    assert_eq!((r, last_errno()), (-1, libc::ENODATA));
}

#[test]
fn sparse_files_truncate_fallocate() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    let p = f.path("sparse");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&p)
        .unwrap();
    let off = 10 * 1024 * 1024;
    file.write_all_at(b"end", off).unwrap();
    let m = fs::metadata(&p).unwrap();
    assert_eq!(m.len(), off + 3);
    // One record (128 KiB) at most, not 10 MiB.
    assert!(m.blocks() <= 256 + 8, "st_blocks {}", m.blocks());
    let mut buf = vec![1u8; 64 * 1024];
    file.read_exact_at(&mut buf, 5 * 1024 * 1024).unwrap();
    assert!(buf.iter().all(|b| *b == 0));
    let mut end = [0u8; 3];
    file.read_exact_at(&mut end, off).unwrap();
    assert_eq!(&end, b"end");

    // Truncate down and up: the regrown part reads as zeros.
    let data = pattern(7, 100_000);
    file.write_all_at(&data, 0).unwrap();
    file.set_len(1000).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 1000);
    file.set_len(300_000).unwrap();
    let all = fs::read(&p).unwrap();
    assert_eq!(all.len(), 300_000);
    assert_eq!(&all[..1000], &data[..1000]);
    assert!(all[1000..].iter().all(|b| *b == 0));
    // truncate(2) by path.
    let c = cpath(&p);
    // SAFETY: valid path.
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), 10) }, 0);
    assert_eq!(fs::read(&p).unwrap(), &data[..10]);

    // fallocate: mode 0 extends the size without allocating.
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    // SAFETY: valid fd.
    let r = unsafe { libc::fallocate(fd, 0, 0, 1 << 20) };
    assert_eq!(r, 0, "fallocate: {}", io::Error::last_os_error());
    assert_eq!(fs::metadata(&p).unwrap().len(), 1 << 20);
    // Punch a hole into written data.
    file.write_all_at(&pattern(8, 200_000), 0).unwrap();
    // SAFETY: valid fd.
    let r = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            4096,
            8192,
        )
    };
    assert_eq!(r, 0, "punch: {}", io::Error::last_os_error());
    let mut hole = vec![1u8; 8192];
    file.read_exact_at(&mut hole, 4096).unwrap();
    assert!(hole.iter().all(|b| *b == 0));
    assert_eq!(fs::metadata(&p).unwrap().len(), 1 << 20);
    // Unsupported modes are refused.
    // SAFETY: valid fd.
    let r = unsafe { libc::fallocate(fd, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096) };
    assert_eq!((r, last_errno()), (-1, libc::EOPNOTSUPP));
}

#[test]
fn readdir_ten_thousand() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    fs::create_dir(f.path("many")).unwrap();
    let n = 10_000;
    for i in 0..n {
        File::create(f.path(&format!("many/file-{i:05}"))).unwrap();
    }
    let names: BTreeSet<String> = fs::read_dir(f.path("many"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), n);
    assert!(names.contains("file-00000") && names.contains("file-09999"));
    // Through a real program too (getdents + stat of every entry).
    let out = Command::new("ls")
        .arg("-la")
        .arg(f.path("many"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let lines = out.stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty());
    // "total", ".", ".." and n entries.
    assert_eq!(lines.count(), n + 3);
    assert_eq!(fs::metadata(f.path("many")).unwrap().nlink(), 2);
}

fn build_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    for (i, size) in [0usize, 1, 4095, 4096, 131_079, 3 * 1024 * 1024 + 5]
        .iter()
        .enumerate()
    {
        fs::write(root.join(format!("a/f{i}")), pattern(i as u64, *size)).unwrap();
        fs::write(
            root.join(format!("a/b/c/g{i}")),
            pattern(100 + i as u64, *size / 3),
        )
        .unwrap();
    }
    fs::write(root.join("secret"), b"s").unwrap();
    fs::set_permissions(root.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink("a/f1", root.join("link")).unwrap();
    std::os::unix::fs::symlink("../nowhere", root.join("a/dangling")).unwrap();
    fs::hard_link(root.join("a/f2"), root.join("a/f2-hard")).unwrap();
}

#[test]
fn cp_a_and_diff() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    let src_dir = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("tree");
    build_tree(&src);
    let dst = f.path("copy");
    let st = Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(&dst)
        .status()
        .unwrap();
    assert!(st.success(), "cp -a into the mount failed");
    let out = Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "diff -r: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // cp -a kept modes, mtimes (to the nanosecond) and the hard link.
    for rel in ["secret", "a/f5", "a/b/c/g3", "a"] {
        let (s, d) = (
            fs::symlink_metadata(src.join(rel)).unwrap(),
            fs::symlink_metadata(dst.join(rel)).unwrap(),
        );
        assert_eq!(s.mode(), d.mode(), "{rel}");
        assert_eq!(
            (s.mtime(), s.mtime_nsec()),
            (d.mtime(), d.mtime_nsec()),
            "{rel}"
        );
    }
    assert_eq!(
        fs::metadata(dst.join("a/f2")).unwrap().ino(),
        fs::metadata(dst.join("a/f2-hard")).unwrap().ino()
    );
    // And back out again.
    let back = src_dir.path().join("back");
    let st = Command::new("cp")
        .arg("-a")
        .arg(&dst)
        .arg(&back)
        .status()
        .unwrap();
    assert!(st.success());
    let st = Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(&src)
        .arg(&back)
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn snapshot_directory() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    fs::create_dir(f.path("docs")).unwrap();
    fs::write(f.path("docs/note"), b"version 1").unwrap();
    f.backend.snapshot("before").unwrap();
    fs::write(f.path("docs/note"), b"version 2, longer").unwrap();
    fs::write(f.path("docs/later"), b"new").unwrap();

    let snaps: Vec<String> = fs::read_dir(f.path(".snapshot"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(snaps, vec!["before".to_string()]);
    assert_eq!(
        fs::read(f.path(".snapshot/before/docs/note")).unwrap(),
        b"version 1"
    );
    assert!(!f.path(".snapshot/before/docs/later").exists());
    assert_eq!(fs::read(f.path("docs/note")).unwrap(), b"version 2, longer");
    // Inode numbers differ between the live file and its snapshot copy.
    assert_ne!(
        fs::metadata(f.path("docs/note")).unwrap().ino(),
        fs::metadata(f.path(".snapshot/before/docs/note"))
            .unwrap()
            .ino()
    );
    // Snapshots are read-only.
    let e = OpenOptions::new()
        .write(true)
        .open(f.path(".snapshot/before/docs/note"))
        .unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS);
    let e = fs::write(f.path(".snapshot/before/docs/x"), b"x").unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS);
    let e = fs::remove_file(f.path(".snapshot/before/docs/note")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS);
    // A snapshot taken while mounted shows up at once.
    f.backend.snapshot("after").unwrap();
    assert_eq!(
        fs::read(f.path(".snapshot/after/docs/note")).unwrap(),
        b"version 2, longer"
    );
}

#[test]
fn statfs_and_df() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    fs::write(f.path("f"), pattern(1, 100_000)).unwrap();
    let c = cpath(&f.path(""));
    // SAFETY: statvfs is plain old data; zeroed is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-pointer.
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    assert_eq!(r, 0, "statvfs: {}", io::Error::last_os_error());
    assert_eq!(st.f_namemax, 255);
    assert!(st.f_bsize > 0 && st.f_frsize > 0);
    assert!(st.f_blocks >= st.f_bfree && st.f_bfree >= st.f_bavail);
    assert!(st.f_files >= st.f_ffree);
    let expected = f.fs.statfs(tarn_fs::ROOT_INO).unwrap();
    assert_eq!(st.f_blocks, expected.blocks);
    assert_eq!(st.f_ffree, expected.ffree);

    let out = Command::new("df")
        .arg("-P")
        .arg(f.path(""))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&*f.root().to_string_lossy()) && text.contains("tarn"),
        "{text}"
    );
}

#[test]
fn unlinked_open_file_stays_readable() {
    if !require::fuse() {
        return;
    }
    let f = mount_default();
    let p = f.path("ghost");
    fs::write(&p, b"still here").unwrap();
    let mut file = File::open(&p).unwrap();
    fs::remove_file(&p).unwrap();
    assert!(!p.exists());
    let mut s = String::new();
    file.read_to_string(&mut s).unwrap();
    assert_eq!(s, "still here");
    drop(file);
    // Directory operations on a plain file are refused.
    let e = fs::read_dir(f.path("nope")).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENOENT);
    fs::write(f.path("plain"), b"").unwrap();
    let e = fs::create_dir(f.path("plain/sub")).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENOTDIR);
    let e = fs::remove_dir(f.path("plain")).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENOTDIR);
    let long = "n".repeat(256);
    let e = File::create(f.path(&long)).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENAMETOOLONG);
}

/// A write to a file opened `O_SYNC` or `O_DSYNC` returns only after the
/// backend made it durable; a plain write does not wait.
#[test]
fn synchronous_writes_sync_before_returning() {
    if !require::fuse() {
        return;
    }
    use std::os::unix::fs::OpenOptionsExt;
    use std::sync::atomic::Ordering;
    let f = common::mount_test_backend(&tarn_fuse::MountOptions::default(), false);
    let syncs = || f.backend.syncs.load(Ordering::SeqCst);
    let mut plain = File::create(f.path("plain")).expect("create");
    let before = syncs();
    plain.write_all(b"no wait").expect("write");
    assert_eq!(syncs(), before, "a plain write is not synchronous");
    for (name, flag) in [("o_sync", libc::O_SYNC), ("o_dsync", libc::O_DSYNC)] {
        let mut file = OpenOptions::new()
            .create(true)
            .write(true)
            .custom_flags(flag)
            .open(f.path(name))
            .expect("open");
        for i in 0..3u64 {
            let before = syncs();
            file.write_all(&pattern(i, 1000)).expect("write");
            assert!(syncs() > before, "{name}: write {i} returned before a sync");
        }
    }
}
