//! Unit tests of POSIX semantics on the memory backend.
//!
//! One file on purpose, though long: each test is a short scenario of one
//! rule (renames, links, orphans, permissions, set-id bits, xattrs,
//! `.snapshot`, timestamps, readdir cookies, the pinned layouts) over the
//! same dozen helpers at the top, and none shares state with another;
//! split by topic, every file would repeat or import those helpers and
//! gain no isolation.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use crate::store::MAX_BLOCK;
use crate::testing::{MemBackend, MemValue};
use crate::*;

type TFs = Fs<MemBackend>;

fn setup() -> (Arc<MemBackend>, TFs) {
    let b = MemBackend::new();
    b.set_recordsize(4096);
    let fs = Fs::mount(b.clone()).expect("mount");
    (b, fs)
}

fn root() -> Cred {
    Cred::root()
}

/// Makes the root directory world-writable so unprivileged creds can
/// create entries in it.
fn open_root(fs: &TFs) {
    let sa = SetAttr {
        mode: Some(0o777),
        ..Default::default()
    };
    fs.setattr(ROOT_INO, &sa, &root()).expect("chmod root");
}

fn eno<T: std::fmt::Debug>(r: Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.errno(),
    }
}

fn mkfile(fs: &TFs, parent: u64, name: &str, data: &[u8]) -> u64 {
    let a = fs
        .mknod(
            parent,
            name.as_bytes(),
            libc::S_IFREG | 0o644,
            0,
            0,
            &root(),
        )
        .expect("mknod");
    if !data.is_empty() {
        fs.write(a.ino, 0, data, false, &root()).expect("write");
    }
    a.ino
}

fn mkdir(fs: &TFs, parent: u64, name: &str) -> u64 {
    fs.mkdir(parent, name.as_bytes(), 0o755, 0, &root())
        .expect("mkdir")
        .ino
}

fn read_all(fs: &TFs, ino: u64) -> Vec<u8> {
    let size = fs.getattr(ino).expect("getattr").size;
    fs.read(ino, 0, size as u32 + 10).expect("read")
}

fn names(fs: &TFs, dir: u64) -> Vec<String> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let page = fs.readdir(dir, cookie, 7).expect("readdir");
        if page.is_empty() {
            break;
        }
        for e in page {
            cookie = e.cookie;
            if e.name != b"." && e.name != b".." {
                out.push(String::from_utf8(e.name).expect("utf8"));
            }
        }
    }
    out.sort();
    out
}

fn lookup(fs: &TFs, dir: u64, name: &str) -> Result<Attr> {
    fs.lookup(dir, name.as_bytes(), &root())
}

fn data_keys(b: &MemBackend, ino: u64) -> usize {
    b.dump()
        .keys()
        .filter(|k| k.len() == 17 && k[..8] == ino.to_be_bytes() && k[8] == 0x04)
        .count()
}

#[test]
fn mount_creates_root_and_remount_keeps_it() {
    let (b, fs) = setup();
    let a = fs.getattr(ROOT_INO).unwrap();
    assert_eq!(a.kind, FileKind::Directory);
    assert_eq!(a.nlink, 2);
    mkfile(&fs, ROOT_INO, "f", b"hello");
    drop(fs);
    let fs = Fs::mount(b).unwrap();
    let f = lookup(&fs, ROOT_INO, "f").unwrap();
    assert_eq!(read_all(&fs, f.ino), b"hello");
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 2);
}

#[test]
fn rename_over_existing_file_replaces_and_frees_it() {
    let (b, fs) = setup();
    let a = mkfile(&fs, ROOT_INO, "a", b"aaa");
    let t = mkfile(&fs, ROOT_INO, "b", &vec![7u8; 10000]);
    fs.rename(ROOT_INO, b"a", ROOT_INO, b"b", 0, &root())
        .unwrap();
    assert_eq!(eno(lookup(&fs, ROOT_INO, "a")), libc::ENOENT);
    let now_b = lookup(&fs, ROOT_INO, "b").unwrap();
    assert_eq!(now_b.ino, a);
    assert_eq!(read_all(&fs, a), b"aaa");
    assert_eq!(eno(fs.getattr(t)), libc::ENOENT);
    assert_eq!(data_keys(&b, t), 0);
    assert_eq!(names(&fs, ROOT_INO), vec!["b"]);
    assert_eq!(fs.getattr(ROOT_INO).unwrap().size, 3);
}

#[test]
fn rename_directories_and_type_rules() {
    let (_b, fs) = setup();
    let d1 = mkdir(&fs, ROOT_INO, "d1");
    let d2 = mkdir(&fs, ROOT_INO, "d2");
    let sub = mkdir(&fs, d1, "sub");
    mkfile(&fs, d1, "f", b"x");
    let empty = mkdir(&fs, d2, "empty");
    let full = mkdir(&fs, d2, "full");
    mkfile(&fs, full, "x", b"");
    let c = root();
    // dir over file, file over dir
    assert_eq!(eno(fs.rename(d1, b"sub", d1, b"f", 0, &c)), libc::ENOTDIR);
    assert_eq!(eno(fs.rename(d1, b"f", d2, b"empty", 0, &c)), libc::EISDIR);
    // dir over non-empty dir
    assert_eq!(
        eno(fs.rename(d1, b"sub", d2, b"full", 0, &c)),
        libc::ENOTEMPTY
    );
    // dir over empty dir, across parents
    fs.rename(d1, b"sub", d2, b"empty", 0, &c).unwrap();
    assert_eq!(eno(fs.getattr(empty)), libc::ENOENT);
    assert_eq!(lookup(&fs, d2, "empty").unwrap().ino, sub);
    assert_eq!(fs.lookup(sub, b"..", &c).unwrap().ino, d2);
    assert_eq!(fs.getattr(d1).unwrap().nlink, 2);
    assert_eq!(fs.getattr(d2).unwrap().nlink, 4);
    // into own subtree
    assert_eq!(
        eno(fs.rename(ROOT_INO, b"d2", sub, b"x", 0, &c)),
        libc::EINVAL
    );
    assert_eq!(
        eno(fs.rename(ROOT_INO, b"d2", d2, b"x", 0, &c)),
        libc::EINVAL
    );
    // onto an ancestor
    assert_eq!(
        eno(fs.rename(d2, b"empty", ROOT_INO, b"d2", 0, &c)),
        libc::ENOTEMPTY
    );
    // same file: no-op
    fs.rename(d2, b"full", d2, b"full", 0, &c).unwrap();
    assert_eq!(names(&fs, d2), vec!["empty", "full"]);
    // move a file across directories
    fs.rename(d1, b"f", d2, b"g", 0, &c).unwrap();
    assert_eq!(names(&fs, d1), Vec::<String>::new());
    assert_eq!(read_all(&fs, lookup(&fs, d2, "g").unwrap().ino), b"x");
    // rmdir now that d1 is empty
    fs.rmdir(ROOT_INO, b"d1", &c).unwrap();
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 3);
}

#[test]
fn rename_exchange_and_noreplace() {
    let (_b, fs) = setup();
    let c = root();
    let d1 = mkdir(&fs, ROOT_INO, "d1");
    let d2 = mkdir(&fs, ROOT_INO, "d2");
    let f = mkfile(&fs, d1, "f", b"file");
    let sub = mkdir(&fs, d2, "sub");
    assert_eq!(
        eno(fs.rename(d1, b"f", d2, b"sub", RENAME_NOREPLACE, &c)),
        libc::EEXIST
    );
    assert_eq!(
        eno(fs.rename(d1, b"f", d2, b"none", RENAME_EXCHANGE, &c)),
        libc::ENOENT
    );
    fs.rename(d1, b"f", d2, b"new", RENAME_NOREPLACE, &c)
        .unwrap();
    fs.rename(d2, b"new", d1, b"f", 0, &c).unwrap();
    // exchange a file and a directory across parents
    fs.rename(d1, b"f", d2, b"sub", RENAME_EXCHANGE, &c)
        .unwrap();
    assert_eq!(lookup(&fs, d1, "f").unwrap().ino, sub);
    assert_eq!(lookup(&fs, d2, "sub").unwrap().ino, f);
    assert_eq!(lookup(&fs, d1, "f").unwrap().kind, FileKind::Directory);
    assert_eq!(fs.lookup(sub, b"..", &c).unwrap().ino, d1);
    assert_eq!(fs.getattr(d1).unwrap().nlink, 3);
    assert_eq!(fs.getattr(d2).unwrap().nlink, 2);
    let listing: Vec<_> = fs
        .readdir(d1, 0, 100)
        .unwrap()
        .into_iter()
        .filter(|e| e.name == b"f")
        .collect();
    assert_eq!(listing[0].kind, FileKind::Directory);
    // exchange a directory with its own descendant
    let inner = mkdir(&fs, sub, "inner");
    assert_eq!(
        eno(fs.rename(d1, b"f", sub, b"inner", RENAME_EXCHANGE, &c)),
        libc::EINVAL
    );
    assert_eq!(fs.getattr(inner).unwrap().nlink, 2);
    assert_eq!(
        eno(fs.rename(d1, b"f", d2, b"x", RENAME_EXCHANGE | RENAME_NOREPLACE, &c)),
        libc::EINVAL
    );
}

#[test]
fn hard_links_count_and_survive_unlink() {
    let (_b, fs) = setup();
    let c = root();
    let d = mkdir(&fs, ROOT_INO, "d");
    let f = mkfile(&fs, ROOT_INO, "f", b"data");
    let a = fs.link(f, d, b"g", &c).unwrap();
    assert_eq!(a.nlink, 2);
    assert_eq!(eno(fs.link(f, d, b"g", &c)), libc::EEXIST);
    assert_eq!(eno(fs.link(d, ROOT_INO, b"dl", &c)), libc::EPERM);
    fs.unlink(ROOT_INO, b"f", &c).unwrap();
    let g = lookup(&fs, d, "g").unwrap();
    assert_eq!(g.ino, f);
    assert_eq!(g.nlink, 1);
    assert_eq!(read_all(&fs, f), b"data");
    // rename one link over another of the same inode: nothing happens
    fs.link(f, d, b"h", &c).unwrap();
    fs.rename(d, b"g", d, b"h", 0, &c).unwrap();
    assert_eq!(names(&fs, d), vec!["g", "h"]);
    assert_eq!(eno(fs.unlink(ROOT_INO, b"d", &c)), libc::EISDIR);
    assert_eq!(eno(fs.rmdir(d, b"g", &c)), libc::ENOTDIR);
}

#[test]
fn unlinked_open_file_keeps_data_until_release() {
    let (b, fs) = setup();
    let c = root();
    let base = b.used();
    let f = mkfile(&fs, ROOT_INO, "f", &vec![5u8; 20000]);
    fs.open(f, libc::O_RDWR, &c).unwrap();
    fs.unlink(ROOT_INO, b"f", &c).unwrap();
    assert_eq!(eno(lookup(&fs, ROOT_INO, "f")), libc::ENOENT);
    assert_eq!(fs.getattr(f).unwrap().nlink, 0);
    assert_eq!(read_all(&fs, f), vec![5u8; 20000]);
    fs.write(f, 0, b"zz", false, &c).unwrap();
    assert_eq!(&fs.read(f, 0, 3).unwrap(), b"zz\x05");
    fs.release(f).unwrap();
    assert_eq!(eno(fs.getattr(f)), libc::ENOENT);
    // the superblock counter grew by 8 bytes-worth of value: only it differs
    assert_eq!(b.used(), base);
    assert_eq!(data_keys(&b, f), 0);
}

#[test]
fn orphan_of_a_crashed_mount_is_freed_at_next_mount() {
    let (b, fs) = setup();
    let c = root();
    let base = b.used();
    let f = mkfile(&fs, ROOT_INO, "f", &vec![9u8; 9000]);
    fs.open(f, libc::O_RDONLY, &c).unwrap();
    fs.unlink(ROOT_INO, b"f", &c).unwrap();
    assert!(b.used() > base);
    drop(fs); // "crash": no release
    let fs = Fs::mount(b.clone()).unwrap();
    assert_eq!(eno(fs.getattr(f)), libc::ENOENT);
    assert_eq!(b.used(), base);
}

#[test]
fn open_checks_permissions_and_truncates() {
    let (_b, fs) = setup();
    open_root(&fs);
    let f = mkfile(&fs, ROOT_INO, "f", b"secret");
    let user = Cred::user(1000, 1000);
    fs.setattr(
        f,
        &SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
        &root(),
    )
    .unwrap();
    assert_eq!(eno(fs.open(f, libc::O_RDONLY, &user)), libc::EACCES);
    assert_eq!(
        eno(fs.open(ROOT_INO, libc::O_WRONLY, &root())),
        libc::EISDIR
    );
    fs.open(f, libc::O_WRONLY | libc::O_TRUNC, &root()).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 0);
    fs.release(f).unwrap();
    let c = fs
        .create(
            ROOT_INO,
            b"f",
            0o644,
            0,
            libc::O_CREAT | libc::O_EXCL,
            &root(),
        )
        .map(|_| ());
    assert_eq!(eno(c), libc::EEXIST);
    let n = fs
        .create(
            ROOT_INO,
            b"n",
            0o666,
            0o022,
            libc::O_CREAT | libc::O_RDWR,
            &user,
        )
        .unwrap();
    assert_eq!(n.perm(), 0o644);
    assert_eq!((n.uid, n.gid), (1000, 1000));
    fs.release(n.ino).unwrap();
    assert_eq!(fs.getattr(n.ino).unwrap().nlink, 1);
}

#[test]
fn a_read_inside_one_record_comes_as_one_slice_of_its_block() {
    let (_b, fs) = setup();
    let rs = 4096usize;
    let data: Vec<u8> = (0..3 * rs + 100).map(|i| (i % 251) as u8 + 1).collect();
    let f = mkfile(&fs, ROOT_INO, "f", &data);
    // A hole between the data and a byte far past it.
    fs.write(f, 8 * rs as u64, b"x", false, &root()).unwrap();
    let mut whole = data.clone();
    whole.resize(8 * rs, 0);
    whole.push(b'x');
    for (off, len) in [
        (0, rs),
        (rs + 10, 100),
        (rs - 1, 1),
        (0, 2 * rs),
        (rs - 50, 100),
        (3 * rs, 100),
        (3 * rs + 50, rs),
        (5 * rs, 10),
        (4 * rs, 4 * rs + 1),
        (whole.len(), 10),
    ] {
        let d = fs.read_data(f, off as u64, len as u32).unwrap();
        let want = &whole[off.min(whole.len())..(off + len).min(whole.len())];
        assert_eq!(d.to_vec(), want, "read of {len} at {off}");
        // One slice exactly when the bytes are one range of one stored
        // block: inside a record that holds data, or nothing at all.
        let stored =
            want.is_empty() || (off / rs == (off + want.len() - 1) / rs && off < data.len());
        match d.contiguous() {
            Some(s) => {
                assert!(stored, "read of {len} at {off} came as one slice");
                assert_eq!(s, want, "read of {len} at {off}");
            }
            None => assert!(!stored, "read of {len} at {off} was not one slice"),
        }
    }
}

#[test]
fn sparse_write_reads_zeros_and_uses_no_blocks() {
    let (b, fs) = setup();
    let f = mkfile(&fs, ROOT_INO, "f", b"");
    fs.write(f, 1 << 20, b"end", false, &root()).unwrap();
    let a = fs.getattr(f).unwrap();
    assert_eq!(a.size, (1 << 20) + 3);
    assert_eq!(data_keys(&b, f), 1);
    assert_eq!(a.blocks, 8); // one 4 KiB record
    let mid = fs.read(f, 4096 * 10, 4096).unwrap();
    assert_eq!(mid, vec![0u8; 4096]);
    assert_eq!(&fs.read(f, 1 << 20, 10).unwrap(), b"end");
    // writing zeros over data makes a hole again
    fs.write(f, (1 << 20) - 100, &vec![0u8; 4096 + 100], false, &root())
        .unwrap();
    assert_eq!(data_keys(&b, f), 0);
    assert_eq!(fs.getattr(f).unwrap().blocks, 0);
}

#[test]
fn small_file_is_one_block_of_its_length() {
    let (b, fs) = setup();
    let f = mkfile(&fs, ROOT_INO, "f", &[1u8; 100]);
    let blocks: Vec<_> = b
        .dump()
        .into_iter()
        .filter(|(k, _)| k.len() == 17 && k[..8] == f.to_be_bytes() && k[8] == 4)
        .collect();
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].1, MemValue::Block(vec![1u8; 100]));
    assert_eq!(fs.getattr(f).unwrap().blksize, 4096);
}

#[test]
fn truncate_shrink_and_extend_never_resurrect_data() {
    for (size, cut) in [
        (100u64, 10u64),
        (10000, 5000),
        (10000, 100),
        (10000, 4096),
        (8192, 0),
    ] {
        let (b, fs) = setup();
        let f = mkfile(&fs, ROOT_INO, "f", &vec![0xabu8; size as usize]);
        let set = |s: u64| {
            fs.setattr(
                f,
                &SetAttr {
                    size: Some(s),
                    ..Default::default()
                },
                &root(),
            )
            .unwrap()
        };
        set(cut);
        assert_eq!(read_all(&fs, f), vec![0xab; cut as usize]);
        let a = set(size);
        assert_eq!(a.size, size);
        let mut want = vec![0xabu8; cut as usize];
        want.resize(size as usize, 0);
        assert_eq!(read_all(&fs, f), want, "size {size} cut {cut}");
        assert!(data_keys(&b, f) as u64 <= cut.div_ceil(4096));
        assert!(a.blocks * 512 >= cut);
    }
}

#[test]
fn append_writes_at_end() {
    let (_b, fs) = setup();
    let f = mkfile(&fs, ROOT_INO, "f", b"abc");
    assert_eq!(fs.write(f, 0, b"def", true, &root()).unwrap(), 3);
    assert_eq!(fs.write(f, 1, b"ghi", true, &root()).unwrap(), 3);
    assert_eq!(read_all(&fs, f), b"abcdefghi");
}

#[test]
fn punch_hole_frees_records_and_zeroes_partials() {
    let (b, fs) = setup();
    let f = mkfile(&fs, ROOT_INO, "f", &vec![3u8; 5 * 4096]);
    assert_eq!(data_keys(&b, f), 5);
    let mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    fs.fallocate(f, 4096 + 100, 2 * 4096, mode, &root())
        .unwrap();
    let data = read_all(&fs, f);
    assert_eq!(data.len(), 5 * 4096);
    for (i, &byte) in data.iter().enumerate() {
        let holed = (4096 + 100..3 * 4096 + 100).contains(&i);
        assert_eq!(byte, if holed { 0 } else { 3 }, "byte {i}");
    }
    assert_eq!(data_keys(&b, f), 4); // record 2 freed entirely
    assert_eq!(fs.getattr(f).unwrap().blocks, 4 * 8);
    assert_eq!(
        eno(fs.fallocate(f, 0, 10, FALLOC_FL_PUNCH_HOLE, &root())),
        libc::EOPNOTSUPP
    );
    assert_eq!(eno(fs.fallocate(f, 0, 10, 0x8, &root())), libc::EOPNOTSUPP);
    fs.fallocate(f, 0, 100_000, 0, &root()).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 100_000);
    fs.fallocate(f, 0, 200_000, FALLOC_FL_KEEP_SIZE, &root())
        .unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 100_000);
}

#[test]
fn xattrs_create_replace_remove_list() {
    let (_b, fs) = setup();
    let c = root();
    let f = mkfile(&fs, ROOT_INO, "f", b"");
    assert_eq!(eno(fs.getxattr(f, b"user.a", &c)), libc::ENODATA);
    assert_eq!(
        eno(fs.setxattr(f, b"user.a", b"1", XATTR_REPLACE, &c)),
        libc::ENODATA
    );
    fs.setxattr(f, b"user.a", b"1", XATTR_CREATE, &c).unwrap();
    assert_eq!(
        eno(fs.setxattr(f, b"user.a", b"2", XATTR_CREATE, &c)),
        libc::EEXIST
    );
    fs.setxattr(f, b"user.a", b"2", XATTR_REPLACE, &c).unwrap();
    assert_eq!(fs.getxattr(f, b"user.a", &c).unwrap(), b"2");
    let big: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    fs.setxattr(f, b"user.big", &big, 0, &c).unwrap();
    fs.setxattr(f, b"user.zeros", &vec![0u8; 65536], 0, &c)
        .unwrap();
    fs.setxattr(f, b"user.empty", b"", 0, &c).unwrap();
    let long = [b"user.".as_slice(), &[b'n'; 250]].concat();
    fs.setxattr(f, &long, b"v", 0, &c).unwrap();
    assert_eq!(fs.getxattr(f, b"user.big", &c).unwrap(), big);
    assert_eq!(fs.getxattr(f, b"user.zeros", &c).unwrap(), vec![0u8; 65536]);
    assert_eq!(fs.getxattr(f, b"user.empty", &c).unwrap(), b"");
    assert_eq!(fs.getxattr(f, &long, &c).unwrap(), b"v");
    assert_eq!(
        eno(fs.setxattr(f, b"user.x", &vec![1u8; 65537], 0, &c)),
        libc::E2BIG
    );
    assert_eq!(
        eno(fs.setxattr(f, b"bogus.x", b"", 0, &c)),
        libc::EOPNOTSUPP
    );
    let list: BTreeSet<Vec<u8>> = fs.listxattr(f, &c).unwrap().into_iter().collect();
    let want: BTreeSet<Vec<u8>> = [
        b"user.a".to_vec(),
        b"user.big".to_vec(),
        b"user.zeros".to_vec(),
        b"user.empty".to_vec(),
        long.clone(),
    ]
    .into_iter()
    .collect();
    assert_eq!(list, want);
    fs.removexattr(f, b"user.big", &c).unwrap();
    assert_eq!(eno(fs.removexattr(f, b"user.big", &c)), libc::ENODATA);
    assert_eq!(fs.listxattr(f, &c).unwrap().len(), 4);
    // permissions: user xattrs need write permission; trusted need root
    let user = Cred::user(1000, 1000);
    assert_eq!(eno(fs.setxattr(f, b"user.u", b"", 0, &user)), libc::EACCES);
    assert_eq!(
        eno(fs.setxattr(f, b"trusted.t", b"", 0, &user)),
        libc::EPERM
    );
    assert_eq!(fs.getxattr(f, b"user.a", &user).unwrap(), b"2");
}

#[test]
fn symlinks_up_to_4095_bytes() {
    let (_b, fs) = setup();
    let c = root();
    for len in [1usize, 700, 800, 1023, 1024, 4095] {
        let target: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
        let name = format!("l{len}");
        let a = fs.symlink(ROOT_INO, name.as_bytes(), &target, &c).unwrap();
        assert_eq!(a.kind, FileKind::Symlink);
        assert_eq!(a.size, len as u64);
        assert_eq!(fs.readlink(a.ino).unwrap(), target);
    }
    assert_eq!(
        eno(fs.symlink(ROOT_INO, b"x", &vec![b'a'; 4096], &c)),
        libc::ENAMETOOLONG
    );
    assert_eq!(eno(fs.symlink(ROOT_INO, b"x", b"", &c)), libc::ENOENT);
    let f = mkfile(&fs, ROOT_INO, "f", b"");
    assert_eq!(eno(fs.readlink(f)), libc::EINVAL);
    fs.unlink(ROOT_INO, b"l4095", &c).unwrap();
}

#[test]
fn mknod_special_files() {
    let (_b, fs) = setup();
    let c = root();
    let fifo = fs
        .mknod(ROOT_INO, b"p", libc::S_IFIFO | 0o644, 0, 0, &c)
        .unwrap();
    assert_eq!(fifo.kind, FileKind::Fifo);
    assert_eq!(fifo.mode, libc::S_IFIFO | 0o644);
    let dev = fs
        .mknod(ROOT_INO, b"c", libc::S_IFCHR | 0o600, 0x0501, 0, &c)
        .unwrap();
    assert_eq!(dev.kind, FileKind::CharDevice);
    assert_eq!(fs.getattr(dev.ino).unwrap().rdev, 0x0501);
    let blk = fs
        .mknod(ROOT_INO, b"b", libc::S_IFBLK | 0o600, 0x0802, 0, &c)
        .unwrap();
    assert_eq!(blk.rdev, 0x0802);
    let sock = fs
        .mknod(ROOT_INO, b"s", libc::S_IFSOCK | 0o777, 0, 0o022, &c)
        .unwrap();
    assert_eq!(sock.perm(), 0o755);
    let user = Cred::user(1000, 1000);
    assert_eq!(
        eno(fs.mknod(ROOT_INO, b"c2", libc::S_IFCHR | 0o600, 1, 0, &user)),
        libc::EPERM
    );
    assert_eq!(
        eno(fs.mknod(ROOT_INO, b"d", libc::S_IFDIR | 0o600, 0, 0, &c)),
        libc::EPERM
    );
    assert_eq!(eno(fs.read(fifo.ino, 0, 10)), libc::EINVAL);
    let kinds: HashSet<FileKind> = fs
        .readdir(ROOT_INO, 2, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds.len(), 4);
}

#[test]
fn sticky_directory_rules() {
    let (_b, fs) = setup();
    let alice = Cred::user(1000, 1000);
    let bob = Cred::user(1001, 1001);
    let tmp = fs.mkdir(ROOT_INO, b"tmp", 0o1777, 0, &root()).unwrap();
    assert_eq!(tmp.perm(), 0o1777);
    let a = fs
        .mknod(tmp.ino, b"a", libc::S_IFREG | 0o666, 0, 0, &alice)
        .unwrap();
    fs.mknod(tmp.ino, b"b", libc::S_IFREG | 0o666, 0, 0, &bob)
        .unwrap();
    assert_eq!(eno(fs.unlink(tmp.ino, b"a", &bob)), libc::EPERM);
    assert_eq!(
        eno(fs.rename(tmp.ino, b"a", tmp.ino, b"c", 0, &bob)),
        libc::EPERM
    );
    assert_eq!(
        eno(fs.rename(tmp.ino, b"b", tmp.ino, b"a", 0, &bob)),
        libc::EPERM
    );
    fs.unlink(tmp.ino, b"b", &bob).unwrap();
    fs.rename(tmp.ino, b"a", tmp.ino, b"c", 0, &alice).unwrap();
    fs.unlink(tmp.ino, b"c", &root()).unwrap();
    assert_eq!(eno(fs.getattr(a.ino)), libc::ENOENT);
    // non-sticky, writable dir: anyone with write permission may delete
    let open = fs.mkdir(ROOT_INO, b"open", 0o777, 0, &root()).unwrap();
    fs.mknod(open.ino, b"a", libc::S_IFREG | 0o644, 0, 0, &alice)
        .unwrap();
    fs.unlink(open.ino, b"a", &bob).unwrap();
    // no write permission on the directory
    let ro = fs.mkdir(ROOT_INO, b"ro", 0o755, 0, &root()).unwrap();
    mkfile(&fs, ro.ino, "f", b"");
    assert_eq!(eno(fs.unlink(ro.ino, b"f", &bob)), libc::EACCES);
    assert_eq!(
        eno(fs.mknod(ro.ino, b"g", libc::S_IFREG | 0o644, 0, 0, &bob)),
        libc::EACCES
    );
}

/// chown(path, -1, -1) reaches the filesystem as a setattr with nothing
/// set; like Linux filesystems, it marks the inode changed (ctime), and
/// nothing else moves.
#[test]
fn chown_minus_one_updates_ctime() {
    let (b, fs) = setup();
    open_root(&fs);
    let alice = Cred::user(1000, 1000);
    let f = mkfile(&fs, ROOT_INO, "f", b"data");
    let before = fs.getattr(f).unwrap();
    b.advance(1_000_000);
    let after = fs.setattr(f, &SetAttr::default(), &alice).unwrap();
    assert!(after.ctime > before.ctime, "ctime updated");
    assert_eq!(
        (
            after.mtime,
            after.atime,
            after.uid,
            after.gid,
            after.mode,
            after.size
        ),
        (
            before.mtime,
            before.atime,
            before.uid,
            before.gid,
            before.mode,
            before.size
        )
    );
    assert_eq!(
        fs.getattr(f).unwrap().ctime,
        after.ctime,
        "and it is stored"
    );
}

#[test]
fn chmod_chown_utimes_ownership_rules() {
    let (b, fs) = setup();
    open_root(&fs);
    let alice = Cred {
        uid: 1000,
        gid: 1000,
        groups: vec![50],
    };
    let bob = Cred::user(1001, 1001);
    let f = fs
        .mknod(ROOT_INO, b"f", libc::S_IFREG | 0o644, 0, 0, &alice)
        .unwrap()
        .ino;
    let mode = |m| SetAttr {
        mode: Some(m),
        ..Default::default()
    };
    assert_eq!(eno(fs.setattr(f, &mode(0o777), &bob)), libc::EPERM);
    fs.setattr(f, &mode(0o640), &alice).unwrap();
    // chown to another user: root only; chgrp to a group you are in
    let own = |u, g| SetAttr {
        uid: u,
        gid: g,
        ..Default::default()
    };
    assert_eq!(
        eno(fs.setattr(f, &own(Some(1001), None), &alice)),
        libc::EPERM
    );
    fs.setattr(f, &own(Some(1000), None), &alice).unwrap();
    assert_eq!(eno(fs.setattr(f, &own(None, Some(7)), &alice)), libc::EPERM);
    let a = fs.setattr(f, &own(None, Some(50)), &alice).unwrap();
    assert_eq!(a.gid, 50);
    assert_eq!(eno(fs.setattr(f, &own(None, Some(50)), &bob)), libc::EPERM);
    // explicit times: owner only; "now": write permission is enough
    let t = Timestamp::new(1000, 5);
    let at = SetAttr {
        atime: Some(TimeSet::At(t)),
        mtime: Some(TimeSet::At(t)),
        ..Default::default()
    };
    let now = SetAttr {
        atime: Some(TimeSet::Now),
        mtime: Some(TimeSet::Now),
        ..Default::default()
    };
    assert_eq!(eno(fs.setattr(f, &at, &bob)), libc::EPERM);
    assert_eq!(eno(fs.setattr(f, &now, &bob)), libc::EACCES);
    let a = fs.setattr(f, &at, &alice).unwrap();
    assert_eq!((a.atime, a.mtime), (t, t));
    fs.setattr(f, &mode(0o666), &alice).unwrap();
    b.advance(1_000_000);
    let a = fs.setattr(f, &now, &bob).unwrap();
    assert!(a.mtime > t && a.ctime == a.mtime);
    // root may give the file away
    let a = fs
        .setattr(f, &own(Some(1001), Some(1001)), &root())
        .unwrap();
    assert_eq!((a.uid, a.gid), (1001, 1001));
}

#[test]
fn setid_bits_are_cleared_like_linux() {
    let (_b, fs) = setup();
    open_root(&fs);
    let alice = Cred {
        uid: 1000,
        gid: 1000,
        groups: vec![],
    };
    let f = fs
        .mknod(ROOT_INO, b"f", libc::S_IFREG | 0o755, 0, 0, &alice)
        .unwrap()
        .ino;
    let mode = |m| SetAttr {
        mode: Some(m),
        ..Default::default()
    };
    // chmod SGID on a file whose group alice is not in: SGID dropped
    fs.setattr(
        f,
        &SetAttr {
            gid: Some(2000),
            ..Default::default()
        },
        &root(),
    )
    .unwrap();
    let a = fs.setattr(f, &mode(0o6755), &alice).unwrap();
    assert_eq!(a.perm(), 0o4755);
    // root keeps it
    let a = fs.setattr(f, &mode(0o6755), &root()).unwrap();
    assert_eq!(a.perm(), 0o6755);
    // a write by root keeps the bits, a write by the owner clears them
    fs.write(f, 0, b"x", false, &root()).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm(), 0o6755);
    fs.write(f, 0, b"x", false, &alice).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm(), 0o0755);
    // chown clears them even for root (non-directories)
    fs.setattr(f, &mode(0o6755), &root()).unwrap();
    let a = fs
        .setattr(
            f,
            &SetAttr {
                uid: Some(1000),
                ..Default::default()
            },
            &root(),
        )
        .unwrap();
    assert_eq!(a.perm(), 0o0755);
    // SGID without group-execute is not cleared by a write
    fs.setattr(f, &mode(0o2745), &root()).unwrap();
    fs.write(f, 0, b"y", false, &alice).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm(), 0o2745);
    // truncate by non-root clears SUID
    fs.setattr(f, &mode(0o4755), &root()).unwrap();
    fs.setattr(
        f,
        &SetAttr {
            size: Some(0),
            ..Default::default()
        },
        &alice,
    )
    .unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm(), 0o0755);
    // fallocate that changes the file (a punch, growing it) is a write:
    // root keeps the bits, anyone else clears them; one that changes
    // nothing (KEEP_SIZE alone) keeps them.
    let punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    fs.write(f, 0, &[1u8; 8192], false, &root()).unwrap();
    fs.setattr(f, &mode(0o6755), &root()).unwrap();
    fs.fallocate(f, 0, 100, punch, &root()).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm(), 0o6755);
    fs.fallocate(f, 0, 100, FALLOC_FL_KEEP_SIZE, &alice)
        .unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm(), 0o6755);
    fs.fallocate(f, 0, 100, punch, &alice).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm(), 0o0755);
    fs.setattr(f, &mode(0o6755), &root()).unwrap();
    fs.fallocate(f, 0, 1 << 20, 0, &alice).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm(), 0o0755);
}

#[test]
fn sgid_directory_inheritance() {
    let (_b, fs) = setup();
    let alice = Cred {
        uid: 1000,
        gid: 1000,
        groups: vec![],
    };
    let d = fs.mkdir(ROOT_INO, b"d", 0o777, 0, &root()).unwrap().ino;
    fs.setattr(
        d,
        &SetAttr {
            mode: Some(0o2777),
            gid: Some(300),
            ..Default::default()
        },
        &root(),
    )
    .unwrap();
    let f = fs
        .mknod(d, b"f", libc::S_IFREG | 0o644, 0, 0, &alice)
        .unwrap();
    assert_eq!(f.gid, 300);
    assert_eq!(f.perm(), 0o644);
    let sub = fs.mkdir(d, b"sub", 0o755, 0, &alice).unwrap();
    assert_eq!(sub.gid, 300);
    assert_eq!(sub.perm(), 0o2755);
    let g = fs
        .mknod(d, b"g", libc::S_IFREG | 0o2755, 0, 0, &alice)
        .unwrap();
    assert_eq!(g.perm(), 0o755, "SGID file in a group alice is not in");
    // outside: the creator's group
    let h = fs
        .mknod(
            ROOT_INO,
            b"h",
            libc::S_IFREG | 0o644,
            0,
            0,
            &Cred::user(0, 77),
        )
        .unwrap();
    assert_eq!(h.gid, 77);
}

#[test]
fn search_permission_is_needed_for_lookup() {
    let (_b, fs) = setup();
    let d = fs.mkdir(ROOT_INO, b"d", 0o700, 0, &root()).unwrap().ino;
    mkfile(&fs, d, "f", b"");
    let user = Cred::user(1000, 1000);
    assert_eq!(eno(fs.lookup(d, b"f", &user)), libc::EACCES);
    assert_eq!(eno(fs.access(d, X_OK, &user)), libc::EACCES);
    assert!(fs.lookup(d, b"f", &root()).is_ok());
    assert_eq!(eno(fs.opendir(d, &user)), libc::EACCES);
    assert!(fs.access(d, R_OK | W_OK | X_OK, &root()).is_ok());
    let f = lookup(&fs, d, "f").unwrap().ino;
    assert_eq!(eno(fs.access(f, X_OK, &root())), libc::EACCES);
}

#[test]
fn name_length_and_bad_names() {
    let (_b, fs) = setup();
    let c = root();
    let n255 = vec![b'a'; 255];
    let n256 = vec![b'a'; 256];
    fs.mknod(ROOT_INO, &n255, libc::S_IFREG | 0o644, 0, 0, &c)
        .unwrap();
    assert_eq!(
        fs.lookup(ROOT_INO, &n255, &c).unwrap().kind,
        FileKind::Regular
    );
    assert_eq!(
        eno(fs.mknod(ROOT_INO, &n256, libc::S_IFREG, 0, 0, &c)),
        libc::ENAMETOOLONG
    );
    assert_eq!(
        eno(fs.mkdir(ROOT_INO, &n256, 0o755, 0, &c)),
        libc::ENAMETOOLONG
    );
    assert_eq!(eno(fs.lookup(ROOT_INO, &n256, &c)), libc::ENAMETOOLONG);
    assert_eq!(
        eno(fs.rename(ROOT_INO, &n255, ROOT_INO, &n256, 0, &c)),
        libc::ENAMETOOLONG
    );
    assert_eq!(eno(fs.mkdir(ROOT_INO, b"a/b", 0o755, 0, &c)), libc::EINVAL);
    assert_eq!(eno(fs.mkdir(ROOT_INO, b".", 0o755, 0, &c)), libc::EEXIST);
    assert_eq!(eno(fs.rmdir(ROOT_INO, b".", &c)), libc::EINVAL);
    assert_eq!(eno(fs.rmdir(ROOT_INO, b"..", &c)), libc::ENOTEMPTY);
}

#[test]
fn rmdir_non_empty_fails() {
    let (_b, fs) = setup();
    let d = mkdir(&fs, ROOT_INO, "d");
    mkfile(&fs, d, "f", b"");
    assert_eq!(eno(fs.rmdir(ROOT_INO, b"d", &root())), libc::ENOTEMPTY);
    fs.unlink(d, b"f", &root()).unwrap();
    fs.rmdir(ROOT_INO, b"d", &root()).unwrap();
    assert_eq!(eno(fs.getattr(d)), libc::ENOENT);
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 2);
}

/// A snapshot taken before the filesystem was made on its dataset (a
/// dataset created and snapshotted, never mounted) holds no root: the
/// `.snapshot` listing leaves it out instead of failing for every
/// snapshot, and looking it up says it does not exist.
#[test]
fn a_snapshot_without_a_root_does_not_break_the_listing() {
    let b = MemBackend::new();
    b.snapshot("early").unwrap();
    let fs = Fs::mount(b.clone()).unwrap();
    mkfile(&fs, ROOT_INO, "f", b"data");
    b.snapshot("late").unwrap();
    let plus: Vec<String> = fs
        .readdirplus(SNAPDIR_INO, 0, 32)
        .unwrap()
        .into_iter()
        .map(|(e, _)| String::from_utf8(e.name).unwrap())
        .filter(|n| n != "." && n != "..")
        .collect();
    assert_eq!(plus, vec!["late"]);
    assert_eq!(names(&fs, SNAPDIR_INO), vec!["late"]);
    let e = lookup(&fs, SNAPDIR_INO, "early").unwrap_err();
    assert_eq!(e.errno(), libc::ENOENT);
    let late = lookup(&fs, SNAPDIR_INO, "late").unwrap();
    assert_eq!(names(&fs, late.ino), vec!["f"]);
}

#[test]
fn snapshot_dir_lists_and_reads_read_only() {
    let (b, fs) = setup();
    let c = root();
    let d = mkdir(&fs, ROOT_INO, "d");
    let f = mkfile(&fs, d, "f", b"version one");
    b.snapshot("s1").unwrap();
    fs.write(f, 8, b"two", false, &c).unwrap();
    mkfile(&fs, ROOT_INO, "later", b"");
    b.snapshot("s2").unwrap();
    // hidden from the root listing, but reachable
    assert_eq!(names(&fs, ROOT_INO), vec!["d", "later"]);
    let sd = lookup(&fs, ROOT_INO, ".snapshot").unwrap();
    assert_eq!(sd.ino, SNAPDIR_INO);
    assert_eq!(names(&fs, SNAPDIR_INO), vec!["s1", "s2"]);
    let s1 = lookup(&fs, SNAPDIR_INO, "s1").unwrap();
    let s2 = lookup(&fs, SNAPDIR_INO, "s2").unwrap();
    assert_ne!(s1.ino, s2.ino);
    assert_ne!(s1.ino, ROOT_INO);
    assert_ne!(s1.dataset, fs.getattr(ROOT_INO).unwrap().dataset);
    assert_eq!(names(&fs, s1.ino), vec!["d"]);
    assert_eq!(names(&fs, s2.ino), vec!["d", "later"]);
    let sd1 = lookup(&fs, s1.ino, "d").unwrap();
    let sf1 = lookup(&fs, sd1.ino, "f").unwrap();
    assert_eq!(sf1.ino & ((1 << 48) - 1), f);
    assert_ne!(sf1.ino, f);
    assert_eq!(read_all(&fs, sf1.ino), b"version one");
    assert_eq!(read_all(&fs, f), b"version two");
    assert_eq!(fs.lookup(s1.ino, b"..", &c).unwrap().ino, SNAPDIR_INO);
    assert_eq!(fs.lookup(SNAPDIR_INO, b"..", &c).unwrap().ino, ROOT_INO);
    assert_eq!(eno(fs.lookup(s1.ino, b".snapshot", &c)), libc::ENOENT);
    let plus = fs.readdirplus(sd1.ino, 0, 10).unwrap();
    assert_eq!(plus.len(), 3);
    assert!(plus.iter().all(|(e, a)| e.ino == a.ino));
    // every change is EROFS
    assert_eq!(eno(fs.write(sf1.ino, 0, b"x", false, &c)), libc::EROFS);
    assert_eq!(eno(fs.mkdir(sd1.ino, b"n", 0o755, 0, &c)), libc::EROFS);
    assert_eq!(eno(fs.unlink(sd1.ino, b"f", &c)), libc::EROFS);
    assert_eq!(eno(fs.mkdir(SNAPDIR_INO, b"n", 0o755, 0, &c)), libc::EROFS);
    assert_eq!(eno(fs.rmdir(ROOT_INO, b".snapshot", &c)), libc::EROFS);
    assert_eq!(
        eno(fs.setattr(
            sf1.ino,
            &SetAttr {
                mode: Some(0),
                ..Default::default()
            },
            &c
        )),
        libc::EROFS
    );
    assert_eq!(
        eno(fs.setxattr(sf1.ino, b"user.a", b"", 0, &c)),
        libc::EROFS
    );
    assert_eq!(eno(fs.open(sf1.ino, libc::O_RDWR, &c)), libc::EROFS);
    assert_eq!(eno(fs.access(sf1.ino, W_OK, &c)), libc::EROFS);
    assert!(fs.open(sf1.ino, libc::O_RDONLY, &c).is_ok());
    assert_eq!(
        eno(fs.mkdir(ROOT_INO, b".snapshot", 0o755, 0, &c)),
        libc::EEXIST
    );
    assert_eq!(
        eno(fs.mknod(ROOT_INO, b".snapshot", libc::S_IFREG, 0, 0, &c)),
        libc::EEXIST
    );
    // a new mount numbers snapshots afresh but still finds them
    drop(fs);
    let fs = Fs::mount(b.clone()).unwrap();
    let s1 = lookup(&fs, SNAPDIR_INO, "s1").unwrap();
    let sd1 = lookup(&fs, s1.ino, "d").unwrap();
    assert_eq!(
        read_all(&fs, lookup(&fs, sd1.ino, "f").unwrap().ino),
        b"version one"
    );
}

#[test]
fn enospc_undoes_the_whole_operation() {
    let (b, fs) = setup();
    let c = root();
    let f = mkfile(&fs, ROOT_INO, "f", &vec![1u8; 3 * 4096]);
    let d = mkdir(&fs, ROOT_INO, "d");
    mkfile(&fs, d, "x", b"x");
    let before = b.dump();
    // room for about one more record, not for three
    b.set_budget(Some(b.used() + 6000), false);
    let r = fs.write(f, 3 * 4096, &vec![2u8; 3 * 4096], false, &c);
    assert_eq!(eno(r), libc::ENOSPC);
    assert_eq!(b.dump(), before);
    assert_eq!(fs.getattr(f).unwrap().size, 3 * 4096);
    // rewriting existing records needs no more room than they hold
    fs.write(f, 0, &vec![9u8; 4096], false, &c).unwrap();
    // EDQUOT variant, for a metadata-only change
    b.set_budget(Some(b.used()), true);
    let before = b.dump();
    let big = vec![b'n'; 200];
    assert_eq!(eno(fs.mkdir(d, &big, 0o755, 0, &c)), libc::EDQUOT);
    assert_eq!(b.dump(), before);
    // deleting still works at the limit
    fs.unlink(d, b"x", &c).unwrap();
    b.set_budget(None, false);
    assert_eq!(fs.getattr(d).unwrap().size, 2);
}

#[test]
fn readonly_dataset_is_erofs() {
    let (b, fs) = setup();
    mkfile(&fs, ROOT_INO, "f", b"x");
    b.set_readonly(true);
    let c = root();
    assert_eq!(eno(fs.mkdir(ROOT_INO, b"d", 0o755, 0, &c)), libc::EROFS);
    assert_eq!(eno(fs.unlink(ROOT_INO, b"f", &c)), libc::EROFS);
    let f = lookup(&fs, ROOT_INO, "f").unwrap();
    assert_eq!(read_all(&fs, f.ino), b"x");
    // Opening for writing fails at open, not at the first write.
    assert_eq!(eno(fs.open(f.ino, libc::O_WRONLY, &c)), libc::EROFS);
    assert_eq!(eno(fs.open(f.ino, libc::O_RDWR, &c)), libc::EROFS);
    fs.open(f.ino, libc::O_RDONLY, &c).unwrap();
    fs.release(f.ino).unwrap();
    drop(fs);
    assert!(Fs::mount(b).is_ok());
}

#[test]
fn relatime_updates_atime_only_when_stale() {
    let (b, fs) = setup();
    let f = mkfile(&fs, ROOT_INO, "f", b"data");
    let a0 = fs.getattr(f).unwrap();
    b.advance(1_000);
    fs.read(f, 0, 4).unwrap(); // atime == mtime: updated
    let a1 = fs.getattr(f).unwrap();
    assert!(a1.atime > a0.atime);
    b.advance(1_000);
    fs.read(f, 0, 4).unwrap(); // atime > mtime, fresh: kept
    assert_eq!(fs.getattr(f).unwrap().atime, a1.atime);
    b.advance(25 * 3600 * 1_000_000_000);
    fs.read(f, 0, 4).unwrap(); // a day old: updated
    assert!(fs.getattr(f).unwrap().atime > a1.atime);
    b.set_atime(false);
    fs.write(f, 0, b"x", false, &root()).unwrap();
    let a2 = fs.getattr(f).unwrap();
    b.advance(1_000);
    fs.read(f, 0, 4).unwrap();
    assert_eq!(fs.getattr(f).unwrap().atime, a2.atime);
}

#[test]
fn timestamps_follow_operations() {
    let (b, fs) = setup();
    let c = root();
    let f = mkfile(&fs, ROOT_INO, "f", b"");
    let r0 = fs.getattr(ROOT_INO).unwrap();
    b.advance(10);
    let f2 = mkfile(&fs, ROOT_INO, "g", b"");
    let r1 = fs.getattr(ROOT_INO).unwrap();
    assert!(r1.mtime > r0.mtime && r1.ctime == r1.mtime);
    let g = fs.getattr(f2).unwrap();
    assert_eq!(g.crtime, g.mtime);
    b.advance(10);
    fs.write(f, 0, b"x", false, &c).unwrap();
    let a = fs.getattr(f).unwrap();
    assert!(a.mtime > g.mtime && a.ctime == a.mtime);
    b.advance(10);
    fs.link(f, ROOT_INO, b"h", &c).unwrap();
    let a2 = fs.getattr(f).unwrap();
    assert!(a2.ctime > a.ctime && a2.mtime == a.mtime);
    assert_ne!(a2.generation, 0);
    assert_eq!(a2.handle().ino, f);
}

#[test]
fn corrupt_inode_is_eio_not_panic() {
    let (b, fs) = setup();
    let f = mkfile(&fs, ROOT_INO, "f", b"x");
    let key: Vec<u8> = [f.to_be_bytes().as_slice(), &[0x01]].concat();
    b.txn(true, &mut |s| {
        s.put(&key, &[1, 0, 3])?;
        Ok(())
    })
    .unwrap();
    assert_eq!(eno(fs.getattr(f)), libc::EIO);
    assert_eq!(eno(lookup(&fs, ROOT_INO, "f")), libc::EIO);
    b.txn(true, &mut |s| {
        s.put(&key, &[9; 200])?;
        Ok(())
    })
    .unwrap();
    assert_eq!(eno(fs.read(f, 0, 1)), libc::EIO);
}

/// A patch past the largest block is refused, not attempted.
#[test]
fn patch_past_the_largest_block_is_refused() {
    let (b, _fs) = setup();
    for (len, off, n) in [(0, MAX_BLOCK, 1), (MAX_BLOCK + 1, 0, 1), (0, usize::MAX, 2)] {
        let r = b.txn(true, &mut |s| {
            s.patch_block(b"k", len, off, vec![1; n])?;
            Ok(())
        });
        assert_eq!(eno(r), libc::EINVAL, "len {len}, off {off}, {n} bytes");
    }
    b.txn(true, &mut |s| {
        assert_eq!(
            s.patch_block(b"k", 10, MAX_BLOCK - 1, vec![1])?,
            (0, MAX_BLOCK)
        );
        Ok(())
    })
    .unwrap();
}

#[test]
fn readdir_100k_entries_pages_exactly_once_under_changes() {
    let (b, fs) = setup();
    let c = root();
    let d = mkdir(&fs, ROOT_INO, "big");
    let n = 100_000;
    for i in 0..n {
        fs.mknod(
            d,
            format!("file-{i}").as_bytes(),
            libc::S_IFREG | 0o644,
            0,
            0,
            &c,
        )
        .unwrap();
    }
    assert_eq!(fs.getattr(d).unwrap().size, n + 2);
    // lookups stay cheap
    assert!(lookup(&fs, d, "file-99999").is_ok());
    let mut seen: HashSet<Vec<u8>> = HashSet::new();
    let mut removed: HashSet<Vec<u8>> = HashSet::new();
    let mut added: HashSet<Vec<u8>> = HashSet::new();
    let mut cookie = 0;
    let mut page_no = 0u64;
    let mut restarted = false;
    let mut fs = fs;
    loop {
        let page = fs.readdir(d, cookie, 1000).unwrap();
        if page.is_empty() {
            break;
        }
        for e in page {
            cookie = e.cookie;
            assert!(seen.insert(e.name.clone()), "duplicate {:?}", e.name);
        }
        page_no += 1;
        // churn: remove some names, add some, between pages
        for k in 0..20u64 {
            let i = (page_no * 7919 + k * 104_729) % n;
            let name = format!("file-{i}").into_bytes();
            if !removed.contains(&name) && fs.unlink(d, &name, &c).is_ok() {
                removed.insert(name);
            }
            let new = format!("new-{page_no}-{k}").into_bytes();
            fs.mknod(d, &new, libc::S_IFREG | 0o644, 0, 0, &c).unwrap();
            added.insert(new);
        }
        if page_no == 50 && !restarted {
            drop(fs);
            fs = Fs::mount(b.clone()).unwrap();
            restarted = true;
        }
    }
    for i in 0..n {
        let name = format!("file-{i}").into_bytes();
        if !removed.contains(&name) {
            assert!(seen.contains(&name), "missing {i}");
        }
    }
    for name in &seen {
        assert!(
            name == b"." || name == b".." || name.starts_with(b"file-") || added.contains(name),
            "unexpected {name:?}"
        );
    }
    assert_eq!(
        fs.getattr(d).unwrap().size,
        n + 2 + added.len() as u64 - removed.len() as u64
    );
}

#[test]
fn fs_is_send_and_sync_and_works_from_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<TFs>();
    let (_b, fs) = setup();
    let fs = Arc::new(fs);
    let d = mkdir(&fs, ROOT_INO, "d");
    let shared = mkfile(&fs, ROOT_INO, "log", b"");
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                for i in 0..200u32 {
                    let name = format!("t{t}-{i}");
                    let a = fs
                        .create(d, name.as_bytes(), 0o644, 0, libc::O_RDWR, &Cred::root())
                        .unwrap();
                    fs.write(a.ino, 0, name.as_bytes(), false, &Cred::root())
                        .unwrap();
                    fs.release(a.ino).unwrap();
                    fs.write(shared, 0, &[t; 10], true, &Cred::root()).unwrap();
                    if i % 2 == 0 {
                        fs.unlink(d, name.as_bytes(), &Cred::root()).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(names(&fs, d).len(), 400);
    let log = read_all(&fs, shared);
    assert_eq!(log.len(), 4 * 200 * 10);
    // appends never interleave inside one write
    for chunk in log.chunks(10) {
        assert!(chunk.iter().all(|&b| b == chunk[0]));
    }
}

#[test]
fn fsync_statfs_and_handles() {
    let (b, fs) = setup();
    let f = mkfile(&fs, ROOT_INO, "f", b"x");
    fs.fsync(f).unwrap();
    assert_eq!(b.sync_count(), 1);
    b.set_budget(Some(1 << 30), false);
    let st = fs.statfs(ROOT_INO).unwrap();
    assert_eq!(st.blocks, (1 << 30) / 4096);
    assert!(st.bfree < st.blocks && st.bfree > 0);
    assert_eq!(st.namelen, 255);
    assert!(st.ffree > 1 << 40);
    let h = fs.getattr(f).unwrap().handle();
    assert_eq!(fs.getattr_handle(&h).unwrap().ino, f);
    let mut wrong = h;
    wrong.generation ^= 1;
    assert_eq!(eno(fs.getattr_handle(&wrong)), libc::ESTALE);
    fs.unlink(ROOT_INO, b"f", &root()).unwrap();
    assert_eq!(eno(fs.getattr_handle(&h)), libc::ESTALE);
}

#[test]
fn readdir_cookies_survive_remount_and_dots_come_first() {
    let (b, fs) = setup();
    let d = mkdir(&fs, ROOT_INO, "d");
    for i in 0..50 {
        mkfile(&fs, d, &format!("f{i}"), b"");
    }
    let first = fs.readdir(d, 0, 12).unwrap();
    assert_eq!(first[0].name, b".");
    assert_eq!((first[0].ino, first[0].cookie), (d, 1));
    assert_eq!(first[1].name, b"..");
    assert_eq!((first[1].ino, first[1].cookie), (ROOT_INO, 2));
    let cookie = first.last().unwrap().cookie;
    let rest_before = fs.readdir(d, cookie, 1000).unwrap();
    drop(fs);
    let fs = Fs::mount(b).unwrap();
    let rest_after = fs.readdir(d, cookie, 1000).unwrap();
    assert_eq!(rest_before, rest_after);
    assert_eq!(first.len() - 2 + rest_after.len(), 50);
    assert_eq!(fs.readdir(d, 1, 1).unwrap()[0].name, b"..");
    let plus = fs.readdirplus(d, 0, 5).unwrap();
    assert_eq!(plus[1].1.ino, ROOT_INO);
    assert!(plus.iter().all(|(e, a)| e.ino == a.ino && e.kind == a.kind));
}

#[test]
fn inode_and_superblock_layouts_are_pinned() {
    use crate::inode::{Inode, Superblock};
    let mut i = Inode::new(20, FileKind::Symlink, 0o777, 7, 8, Timestamp::new(5, 6));
    i.target = Some(b"abc".to_vec());
    i.size = 3;
    i.gen = 0x0102;
    let v = i.encode();
    assert_eq!(v.len(), 112 + 3);
    assert_eq!(v[0], 1);
    assert_eq!(&v[2..6], &(libc::S_IFLNK | 0o777).to_le_bytes());
    assert_eq!(&v[6..10], &7u32.to_le_bytes());
    assert_eq!(&v[18..26], &3u64.to_le_bytes());
    assert_eq!(&v[42..50], &0x0102u64.to_le_bytes());
    assert_eq!(&v[62..70], &5i64.to_le_bytes());
    assert_eq!(&v[70..74], &6u32.to_le_bytes());
    assert_eq!(&v[98..106], &5i64.to_le_bytes());
    assert_eq!(&v[110..], &[3, 0, b'a', b'b', b'c']);
    assert_eq!(Inode::decode(20, &v).unwrap(), i);
    for n in 0..v.len() {
        assert_eq!(Inode::decode(20, &v[..n]).unwrap_err().errno(), libc::EIO);
    }
    let sb = Superblock {
        next_ino: 99,
        name_key: None,
    }
    .encode();
    assert_eq!(sb.len(), 28);
    assert_eq!(&sb[..8], b"TARNFS01");
    assert_eq!(&sb[8..12], &1u32.to_le_bytes());
    assert_eq!(Superblock::decode(&sb).unwrap().next_ino, 99);
    // Version 2 (encrypted datasets) adds the 32-byte name key.
    let v2 = Superblock {
        next_ino: 99,
        name_key: Some([7; 32]),
    };
    let e = v2.encode();
    assert_eq!(e.len(), 60);
    assert_eq!(&e[8..12], &2u32.to_le_bytes());
    assert_eq!(&e[28..], &[7; 32]);
    assert_eq!(Superblock::decode(&e).unwrap(), v2);
    for n in 0..e.len() {
        assert_eq!(Superblock::decode(&e[..n]).unwrap_err().errno(), libc::EIO);
    }
}

#[test]
fn a_guarded_setattr_changes_nothing_once_the_file_changed() {
    let (b, fs) = setup();
    let ino = mkfile(&fs, ROOT_INO, "g", b"data");
    let seen = fs.getattr(ino).expect("getattr").ctime;
    // Another change (ctime moves) between the client's look and its
    // guarded SETATTR.
    b.set_time(1_700_000_100, 5);
    let chmod = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    fs.setattr(ino, &chmod, &root()).expect("chmod");
    let guarded = SetAttr {
        size: Some(0),
        if_ctime: Some(seen),
        ..Default::default()
    };
    assert_eq!(eno(fs.setattr(ino, &guarded, &root())), crate::GUARD_ERRNO);
    assert_eq!(fs.getattr(ino).expect("getattr").size, 4, "not truncated");
    // With the current ctime it goes through.
    let now = fs.getattr(ino).expect("getattr").ctime;
    let guarded = SetAttr {
        if_ctime: Some(now),
        ..guarded
    };
    assert_eq!(fs.setattr(ino, &guarded, &root()).expect("setattr").size, 0);
}
