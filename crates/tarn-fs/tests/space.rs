//! Space accounting through the POSIX layer on a real pool: what files,
//! snapshots and deletions do to the dataset's `used` / `available` /
//! `referenced` and to the pool's allocated bytes; EDQUOT at a quota and
//! ENOSPC on a full pool leave files exactly as they were.

use std::collections::BTreeMap;

use tarn_fs::{Cred, DatasetBackend, Fs, ROOT_INO};
use tarn_pool::Pool;
use tarn_testkit::data::pattern as noise;
use tarn_testkit::datasets::{filesystem as mount, info};
use tarn_testkit::pools::{import, tank as new_pool};
use tarn_vdev::VdevKind;

const REC: usize = 128 * 1024;

/// Three syncs: frees are deferred by two txgs.
fn settle(pool: &Pool) {
    for _ in 0..3 {
        pool.sync().unwrap();
    }
}

/// (used, available, referenced, pool allocated), after settling.
fn figures(pool: &Pool, name: &str) -> (u64, u64, u64, u64) {
    settle(pool);
    let i = info(pool, name);
    (i.used, i.available.unwrap(), i.referenced, pool.space().1)
}

fn c() -> Cred {
    Cred::root()
}

fn create(fs: &Fs<DatasetBackend>, name: &str) -> u64 {
    fs.mknod(ROOT_INO, name.as_bytes(), libc::S_IFREG | 0o644, 0, 0, &c())
        .unwrap()
        .ino
}

fn ino_of(fs: &Fs<DatasetBackend>, dir: u64, name: &str) -> u64 {
    fs.lookup(dir, name.as_bytes(), &c()).unwrap().ino
}

/// The whole file, read in `MAX_READ` pieces.
fn read_all(fs: &Fs<DatasetBackend>, ino: u64) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let got = fs.read(ino, out.len() as u64, tarn_fs::MAX_READ).unwrap();
        assert!(!got.is_empty());
        out.extend_from_slice(&got);
    }
    out
}

/// Writes `data` at `off` in `MAX_READ`-sized pieces.
fn write_at(fs: &Fs<DatasetBackend>, ino: u64, off: u64, data: &[u8]) {
    for (i, chunk) in data.chunks(tarn_fs::MAX_READ as usize).enumerate() {
        let o = off + (i * tarn_fs::MAX_READ as usize) as u64;
        assert_eq!(fs.write(ino, o, chunk, false, &c()).unwrap(), chunk.len());
    }
}

fn patch(content: &mut Vec<u8>, off: usize, data: &[u8]) {
    if content.len() < off + data.len() {
        content.resize(off + data.len(), 0);
    }
    content[off..off + data.len()].copy_from_slice(data);
}

#[test]
fn space_returns_exactly_to_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Raidz { parity: 1 }, 4, 64 << 20);
    let fs = mount(&pool, "tank/fs", &[("recordsize", "131072")]);
    let base = figures(&pool, "tank/fs");
    assert_eq!(info(&pool, "tank/fs").usedbysnapshots, 0);

    // Large multi-record files, small ones and a sparse one.
    let mut files: BTreeMap<&str, (u64, Vec<u8>)> = BTreeMap::new();
    for (name, seed, len) in [
        ("big", 1, 8 * REC + 5000),
        ("mid", 2, 300_000),
        ("s1", 3, 100),
        ("s2", 4, 5000),
    ] {
        let ino = create(&fs, name);
        let data = noise(seed, len);
        write_at(&fs, ino, 0, &data);
        files.insert(name, (ino, data));
    }
    let sparse = create(&fs, "sparse");
    let mut sparse_data = Vec::new();
    for (off, seed, len) in [(0usize, 5, 4096), (8 << 20, 6, 10), (3 * REC + 7, 7, 20)] {
        let d = noise(seed, len);
        write_at(&fs, sparse, off as u64, &d);
        patch(&mut sparse_data, off, &d);
    }
    files.insert("sparse", (sparse, sparse_data));
    let a = fs.getattr(sparse).unwrap();
    assert_eq!(a.size, (8 << 20) + 10);
    assert!(
        a.blocks * 512 <= 3 * REC as u64,
        "sparse file holds {}",
        a.blocks
    );

    let written = figures(&pool, "tank/fs");
    let data_bytes = (8 * REC + 5000 + 300_000 + 100 + 5000 + 4096 + 10 + 20) as u64;
    assert!(written.0 >= base.0 + data_bytes, "{written:?} vs {base:?}");
    // Sector rounding and tree nodes cost a little, nowhere near a copy.
    assert!(written.0 <= base.0 + data_bytes + 24 * REC as u64 / 8);
    assert_eq!(written.0 - base.0, written.2 - base.2, "used vs referenced");
    // `available` counts whole records and also pays for pool metadata.
    let (grew, shrank) = (written.0 - base.0, base.1 - written.1);
    assert!(shrank + REC as u64 >= grew && shrank <= grew + 4 * REC as u64);
    assert!(
        written.3 > base.3 + data_bytes,
        "raw allocation covers data"
    );

    // A snapshot shares everything: it holds nothing of its own yet.
    tarn_dataset::snapshot(&pool, &["tank/fs@s1".into()], false).unwrap();
    let snapped = figures(&pool, "tank/fs");
    assert_eq!(info(&pool, "tank/fs@s1").used, 0);
    assert_eq!(info(&pool, "tank/fs@s1").referenced, snapped.2);

    // Overwrite one record of "big" and the start of "s2": their old
    // records now belong to the snapshot alone.
    let (big, ref mut big_data) = *files.get_mut("big").unwrap();
    let new = noise(8, REC);
    write_at(&fs, big, REC as u64, &new);
    patch(big_data, REC, &new);
    let (s2, ref mut s2_data) = *files.get_mut("s2").unwrap();
    write_at(&fs, s2, 0, b"0123456789");
    patch(s2_data, 0, b"0123456789");
    let over = figures(&pool, "tank/fs");
    let s1 = info(&pool, "tank/fs@s1");
    assert!(s1.used >= REC as u64 + 5000, "snapshot used {}", s1.used);
    let fsi = info(&pool, "tank/fs");
    assert_eq!(fsi.usedbysnapshots, s1.used);
    assert!(over.0 >= snapped.0 + REC as u64 + 5000);

    // Deleting a file the snapshot holds whole frees nothing; the
    // snapshot's `used` grows by the file.
    fs.unlink(ROOT_INO, b"mid", &c()).unwrap();
    files.remove("mid");
    let deleted = figures(&pool, "tank/fs");
    assert!(
        deleted.3 >= over.3,
        "pool allocation dropped from {} to {}",
        over.3,
        deleted.3
    );
    let s1b = info(&pool, "tank/fs@s1");
    assert!(
        s1b.used >= s1.used + 300_000,
        "snapshot used {} -> {}",
        s1.used,
        s1b.used
    );
    let fsi = info(&pool, "tank/fs");
    assert_eq!(fsi.usedbysnapshots, s1b.used);
    assert!(fsi.referenced + 300_000 <= over.2);
    assert_eq!(info(&pool, "tank/fs@s1").referenced, snapped.2);

    // Live contents and the snapshot's old ones.
    for (name, (ino, data)) in &files {
        assert!(read_all(&fs, *ino) == *data, "{name}");
    }
    let snapdir = ino_of(&fs, ino_of(&fs, ROOT_INO, ".snapshot"), "s1");
    let old_big = read_all(&fs, ino_of(&fs, snapdir, "big"));
    assert!(old_big == noise(1, 8 * REC + 5000));
    let old_mid = read_all(&fs, ino_of(&fs, snapdir, "mid"));
    assert!(old_mid == noise(2, 300_000));

    // Destroying the snapshot frees what only it held.
    tarn_dataset::destroy(&pool, "tank/fs@s1", false).unwrap();
    let destroyed = figures(&pool, "tank/fs");
    assert_eq!(info(&pool, "tank/fs").usedbysnapshots, 0);
    assert!(
        destroyed.3 + s1b.used <= deleted.3,
        "{destroyed:?} after freeing {}",
        s1b.used
    );
    assert_eq!(destroyed.0, destroyed.2, "used vs referenced");

    // Deleting everything returns every figure exactly to the baseline.
    for name in files.keys() {
        fs.unlink(ROOT_INO, name.as_bytes(), &c()).unwrap();
    }
    assert_eq!(figures(&pool, "tank/fs"), base);
    let r = pool.leak_check().unwrap();
    assert!(r.is_clean(), "{r:?}");

    // And they stay there across an export and import.
    drop(fs);
    pool.export(false).unwrap();
    drop(pool);
    let pool = import(dir.path(), "tank");
    assert_eq!(figures(&pool, "tank/fs"), base);
}

#[test]
fn quota_fails_with_edquot_and_leaves_the_file_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Single, 1, 64 << 20);
    let fs = mount(
        &pool,
        "tank/q",
        &[("quota", "1M"), ("recordsize", "131072")],
    );
    let ino = create(&fs, "f");
    let mut content = Vec::new();
    let mut failed = None;
    for i in 0..32u64 {
        let data = noise(100 + i, REC);
        match fs.write(ino, content.len() as u64, &data, false, &c()) {
            Ok(n) => {
                assert_eq!(n, data.len());
                content.extend_from_slice(&data);
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let e = failed.expect("the quota was never reached");
    assert_eq!(e.errno(), libc::EDQUOT, "{e}");
    assert!(!content.is_empty());
    let check = |what: &str| {
        assert_eq!(
            fs.getattr(ino).unwrap().size,
            content.len() as u64,
            "{what}"
        );
        assert!(read_all(&fs, ino) == content, "{what}");
    };
    check("after the append that failed");
    // A write that overwrites the tail and extends fails as a whole.
    let off = content.len() as u64 - 1000;
    let e = fs
        .write(ino, off, &noise(7, 3 * REC), false, &c())
        .unwrap_err();
    assert_eq!(e.errno(), libc::EDQUOT, "{e}");
    check("after the overwrite that failed");
    // Also after the pending bytes are committed.
    settle(&pool);
    let e = fs
        .write(ino, content.len() as u64, &noise(9, REC), false, &c())
        .unwrap_err();
    assert_eq!(e.errno(), libc::EDQUOT, "{e}");
    check("after sync");
    // The tree nodes of the txg that reached the quota are not charged
    // before they are written (see `bug_quota_is_exceeded_by_unsynced_metadata`).
    assert!(info(&pool, "tank/q").used <= (1 << 20) + 64 * 1024);

    // Deleting works at the quota and gives the room back.
    fs.unlink(ROOT_INO, b"f", &c()).unwrap();
    settle(&pool);
    let ino = create(&fs, "g");
    write_at(&fs, ino, 0, &noise(10, 4 * REC));
    assert!(read_all(&fs, ino) == noise(10, 4 * REC));
    let r = pool.leak_check().unwrap();
    assert!(r.is_clean(), "{r:?}");
}

/// Appends 128 KiB records of noise, `per_file` to a file, until a write
/// fails, syncing after every file when `sync_each`; returns the files (the
/// last is the one the failing write hit) and the error.
fn fill(
    pool: &Pool,
    fs: &Fs<DatasetBackend>,
    per_file: u64,
    sync_each: bool,
) -> (Vec<(u64, Vec<u8>)>, tarn_fs::FsError) {
    let mut files: Vec<(u64, Vec<u8>)> = Vec::new();
    for i in 0..1024u64 {
        let ino = create(fs, &format!("f{i}"));
        let mut content = Vec::new();
        for j in 0..per_file {
            let data = noise(i * per_file + j + 1, REC);
            match fs.write(ino, content.len() as u64, &data, false, &c()) {
                Ok(n) => {
                    assert_eq!(n, data.len());
                    content.extend_from_slice(&data);
                }
                Err(e) => {
                    files.push((ino, content));
                    return (files, e);
                }
            }
        }
        files.push((ino, content));
        if sync_each {
            pool.sync().unwrap();
        }
    }
    panic!("the pool never filled");
}

#[test]
fn full_pool_fails_with_enospc_and_recovers_after_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Single, 1, 64 << 20);
    let fs = mount(&pool, "tank/fs", &[("recordsize", "131072")]);
    // One txg: syncing while filling trips a pool bug (see
    // `bug_syncing_while_filling_the_pool_faults_it`).
    let (files, e) = fill(&pool, &fs, 8, false);
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    assert!(files.len() > 4, "only {} files fit", files.len());
    // The file the failing write hit is exactly as before it.
    let (last, content) = files.last().unwrap();
    assert_eq!(fs.getattr(*last).unwrap().size, content.len() as u64);
    assert!(read_all(&fs, *last) == *content);

    // Deleting still works on a full pool and frees space.
    let before = figures(&pool, "tank/fs");
    for i in 0..3 {
        fs.unlink(ROOT_INO, format!("f{i}").as_bytes(), &c())
            .unwrap();
    }
    let after = figures(&pool, "tank/fs");
    let freed = 3 * 8 * REC as u64;
    assert!(after.3 + freed <= before.3, "{before:?} -> {after:?}");
    assert!(after.0 + freed <= before.0, "{before:?} -> {after:?}");
    assert!(after.1 >= before.1 + freed, "{before:?} -> {after:?}");
    // The pool is usable: a new file fits and everything reads back.
    let ino = create(&fs, "new");
    write_at(&fs, ino, 0, &noise(999, 8 * REC));
    pool.sync().unwrap();
    assert!(read_all(&fs, ino) == noise(999, 8 * REC));
    for (ino, content) in &files[3..] {
        assert!(read_all(&fs, *ino) == *content);
    }
    let r = pool.leak_check().unwrap();
    assert!(r.is_clean(), "{r:?}");
}

/// Filling a pool with a sync after every file ends in a clean ENOSPC: a
/// block's room is allocated when the write is accepted, so a sync never
/// meets a pool too fragmented for what it admitted (it used to fault the
/// pool, with ~40% of it free in holes too small for a record).
#[test]
fn syncing_while_filling_the_pool_ends_in_enospc() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Single, 1, 64 << 20);
    let fs = mount(&pool, "tank/fs", &[("recordsize", "131072")]);
    let (_, e) = fill(&pool, &fs, 8, true);
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    assert!(pool.sync().is_ok(), "the pool keeps committing");
    let r = pool.leak_check().unwrap();
    assert!(r.is_clean(), "{r:?}");
}

/// A quota counts the data blocks of the open txg, not the tree nodes the
/// txg will write with them, so filling a quota in one txg may end above
/// it by those nodes; the overshoot is bounded by one txg's metadata
/// (documented in the guide).
#[test]
fn quota_overshoot_is_bounded_by_one_txg_of_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Single, 1, 64 << 20);
    let fs = mount(
        &pool,
        "tank/q",
        &[("quota", "1M"), ("recordsize", "131072")],
    );
    let ino = create(&fs, "f");
    let mut off = 0;
    while fs
        .write(ino, off, &noise(off + 1, REC), false, &c())
        .is_ok()
    {
        off += REC as u64;
    }
    settle(&pool);
    let used = info(&pool, "tank/q").used;
    assert!(
        used >= (1 << 20) - REC as u64,
        "the quota was not filled: {used}"
    );
    assert!(
        used <= (1 << 20) + (64 << 10),
        "used {used} overshoots the 1M quota"
    );
}

/// A writer that deletes as it goes, faster than txgs commit, with every
/// file made durable through the intent log: far more than the pool's size
/// passes through one open txg. Its deletes free space only when txgs
/// sync, so a write that finds the pool full commits txgs and tries again
/// instead of failing with ENOSPC (or EDQUOT under a quota).
#[test]
fn a_writer_that_deletes_as_it_goes_never_sees_a_full_pool() {
    for quota in [None, Some("24M")] {
        let dir = tempfile::tempdir().unwrap();
        // Txgs commit only when asked or at the dirty limit.
        let pool = new_pool(dir.path(), VdevKind::Single, 1, 64 << 20);
        let props: Vec<(&str, &str)> = quota.iter().map(|q| ("quota", *q)).collect();
        let fs = mount(&pool, "tank/fs", &props);
        let data = noise(3, 1 << 20);
        for k in 0..300u64 {
            let name = format!("f{k}");
            let ino = create(&fs, &name);
            write_at(&fs, ino, 0, &data);
            fs.fsync(ino).unwrap();
            fs.release(ino).unwrap();
            if k >= 4 {
                fs.unlink(ROOT_INO, format!("f{}", k - 4).as_bytes(), &c())
                    .unwrap();
            }
        }
        // 300 MiB went through a 64 MiB pool; what is left reads back.
        for k in 296..300u64 {
            let ino = ino_of(&fs, ROOT_INO, &format!("f{k}"));
            assert!(read_all(&fs, ino) == data, "f{k} ({quota:?})");
        }
    }
}

/// A snapshot destroyed while something is open in it through
/// `.snapshot`: what still refers to it gets ESTALE (a stale handle, as
/// NFS and FUSE clients expect), not EIO, which reads as damage.
#[test]
fn a_destroyed_snapshot_is_stale_not_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Single, 1, 64 << 20);
    let fs = mount(&pool, "tank/fs", &[]);
    let f = create(&fs, "f");
    fs.write(f, 0, b"kept in the snapshot", false, &c())
        .unwrap();
    tarn_dataset::snapshot(&pool, &["tank/fs@s1".into()], false).unwrap();
    let sd = fs.lookup(ROOT_INO, b".snapshot", &c()).unwrap();
    let s1 = fs.lookup(sd.ino, b"s1", &c()).unwrap();
    let in_snap = fs.lookup(s1.ino, b"f", &c()).unwrap();
    assert_eq!(
        fs.read(in_snap.ino, 0, 100).unwrap(),
        b"kept in the snapshot"
    );
    tarn_dataset::destroy(&pool, "tank/fs@s1", false).unwrap();
    let e = fs.getattr(in_snap.ino).unwrap_err();
    assert_eq!(e.errno(), libc::ESTALE, "{e}");
    let e = fs.read(in_snap.ino, 0, 100).unwrap_err();
    assert_eq!(e.errno(), libc::ESTALE, "{e}");
    // The live filesystem goes on.
    assert_eq!(fs.read(f, 0, 100).unwrap(), b"kept in the snapshot");
}
