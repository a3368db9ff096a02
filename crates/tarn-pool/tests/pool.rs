//! Pool-level tests on real member files: corruption within and beyond
//! redundancy, degraded import and replace, bad input, space exhaustion.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tarn_pool::status::{Health, ScanState};
use tarn_pool::{Pool, PoolError, PoolOptions, ScanAction, VdevSpec};
use tarn_vdev::{VdevKind, DATA_START};

use tarn_testkit::blobs::{damage_name, Blobs};
use tarn_testkit::data::Rng;
use tarn_testkit::files::{make as make_files, overwrite};
use tarn_testkit::pools::{
    attached, block_ranges, cksum_errors, create, opts, props, redundancy, scrub, singles,
    try_import, wait_scan,
};
use tarn_testkit::MIB;

fn write_objects(
    pool: &Arc<Pool>,
    rng: &mut Rng,
    n: usize,
    max_len: u64,
) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for i in 0..n {
        let len = 1 + rng.below(max_len) as usize;
        let data = rng.bytes(len);
        pool.object_write(&format!("obj{i}"), 0, &data, false)
            .unwrap();
        out.insert(format!("obj{i}"), data);
    }
    pool.sync().unwrap();
    out
}

fn verify_all(pool: &Arc<Pool>, objs: &BTreeMap<String, Vec<u8>>) {
    for (name, data) in objs {
        let got = pool
            .object_read(name, 0, data.len() + 10)
            .unwrap_or_else(|e| panic!("read {name}: {e}"));
        assert!(
            got == *data,
            "object {name} differs ({} vs {} bytes)",
            got.len(),
            data.len()
        );
    }
}

/// Imports the test pool `tank` from the devices in `dir`.
fn import_tank(dir: &Path) -> Arc<Pool> {
    tarn_testkit::pools::import(dir, "tank")
}

/// Random ranges overwritten on up to `p` members: every byte still reads
/// back, scrub repairs, a second scrub is clean.
fn corruption_within_redundancy(kind: VdevKind, n: usize, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", n, 96 * MIB);
    let pool = create("tank", kind, &devs, &[("compression", "off")]).unwrap();
    let mut rng = Rng::new(seed);
    let objs = write_objects(&pool, &mut rng, 12, 3 * MIB / 2);
    let (_, allocated, _) = pool.space();
    let width = match kind {
        VdevKind::Raidz { .. } => n as u64,
        _ => 1,
    };
    let used = allocated / width + MIB;
    let p = redundancy(kind, n);
    // Choose up to p victims among the members.
    let mut victims: Vec<usize> = (0..n).collect();
    for i in (1..victims.len()).rev() {
        victims.swap(i, rng.below(i as u64 + 1) as usize);
    }
    victims.truncate(1 + rng.below(p as u64) as usize);
    let mut hits = 0;
    for _ in 0..40 {
        let v = victims[rng.below(victims.len() as u64) as usize];
        let len = 1 + rng.below(64 * 1024);
        let off = DATA_START + rng.below(used);
        overwrite(&devs[v], off, &rng.bytes(len as usize));
        hits += 1;
    }
    assert!(hits > 0);
    if seed.is_multiple_of(2) {
        // Scrub first: it must find and repair, then reads are exact.
        let s = scrub(&pool);
        assert_eq!(s.errors, 0, "scrub left unrepaired errors: {s:?}");
        assert!(s.repaired_bytes > 0, "scrub repaired nothing: {s:?}");
        verify_all(&pool, &objs);
    } else {
        // Reads first: they reconstruct and heal; then scrub fixes the rest.
        verify_all(&pool, &objs);
        let s = scrub(&pool);
        assert_eq!(s.errors, 0, "scrub left unrepaired errors: {s:?}");
    }
    assert!(cksum_errors(&pool) > 0, "no checksum errors counted");
    let again = scrub(&pool);
    assert_eq!(
        (again.errors, again.repaired_bytes),
        (0, 0),
        "second scrub not clean: {again:?}"
    );
    assert!(pool.status().damaged.is_empty());
    // And after a clean export/import, still exact.
    pool.export(false).unwrap();
    drop(pool);
    let pool = import_tank(dir.path());
    assert_eq!(pool.health(), Health::Online);
    verify_all(&pool, &objs);
    pool.export(false).unwrap();
}

#[test]
fn corruption_raidz1() {
    for seed in 1..=2 {
        corruption_within_redundancy(VdevKind::Raidz { parity: 1 }, 4, seed);
    }
}

#[test]
fn corruption_raidz2() {
    for seed in 3..=4 {
        corruption_within_redundancy(VdevKind::Raidz { parity: 2 }, 6, seed);
    }
}

#[test]
fn corruption_raidz3() {
    for seed in 5..=6 {
        corruption_within_redundancy(VdevKind::Raidz { parity: 3 }, 7, seed);
    }
}

#[test]
fn corruption_mirror() {
    corruption_within_redundancy(VdevKind::Mirror, 2, 7);
    corruption_within_redundancy(VdevKind::Mirror, 3, 8);
}

/// Beyond redundancy: the damaged object's read fails naming it, status
/// lists it, other objects still read, nothing panics.
fn corruption_beyond_redundancy(kind: VdevKind, n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", n, 96 * MIB);
    let pool = create("tank", kind, &devs, &[("compression", "off")]).unwrap();
    let mut rng = Rng::new(99);
    let victim = rng.bytes(3 * 128 * 1024);
    let bystander = rng.bytes(5 * 128 * 1024);
    pool.object_write("victim", 0, &victim, false).unwrap();
    pool.object_write("bystander", 0, &bystander, true).unwrap();
    let blocks = pool.object_blocks("victim").unwrap();
    let (blk, bp) = blocks[1];
    let p = redundancy(kind, n);
    for (child, off, len) in block_ranges(kind, n, &bp).into_iter().take(p + 1) {
        overwrite(&devs[child], off, &rng.bytes(len as usize));
    }
    let err = pool.object_read("victim", 0, victim.len()).unwrap_err();
    let msg = err.to_string();
    let what = damage_name(&pool, "victim", blk);
    assert!(
        msg.contains(&what) && msg.contains(&format!("at offset {}", blk * 128 * 1024)),
        "error does not name the damage: {msg}"
    );
    // The undamaged records of the victim and the bystander still read.
    assert_eq!(
        pool.object_read("victim", 0, 128 * 1024).unwrap(),
        victim[..128 * 1024]
    );
    assert_eq!(
        pool.object_read("bystander", 0, bystander.len()).unwrap(),
        bystander
    );
    assert!(
        pool.status().damaged.iter().any(|d| d.contains(&what)),
        "status does not list {what}"
    );
    let s = scrub(&pool);
    assert!(s.errors >= 1, "scrub did not count the lost block: {s:?}");
    assert!(pool.status().damaged.iter().any(|d| d.contains(&what)));
    // The pool keeps working.
    pool.object_write("after", 0, b"still writable", true)
        .unwrap();
    assert_eq!(
        pool.object_read("after", 0, 100).unwrap(),
        b"still writable"
    );
    // Deleting the damaged blob frees its blocks: a scrub then finds
    // nothing wrong.
    pool.object_delete("victim").unwrap();
    pool.sync().unwrap();
    let s = scrub(&pool);
    assert_eq!(s.errors, 0, "{s:?}");
    pool.export(false).unwrap();
}

#[test]
fn beyond_redundancy_raidz() {
    corruption_beyond_redundancy(VdevKind::Raidz { parity: 1 }, 4);
    corruption_beyond_redundancy(VdevKind::Raidz { parity: 2 }, 5);
}

#[test]
fn beyond_redundancy_mirror() {
    corruption_beyond_redundancy(VdevKind::Mirror, 2);
}

/// raidz1 with one member file deleted imports DEGRADED and reads
/// everything; replace + resilver returns it to ONLINE; the new member
/// really holds the data.
#[test]
fn degraded_import_and_replace() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 4, 80 * MIB);
    let pool = create("tank", VdevKind::Raidz { parity: 1 }, &devs, &[]).unwrap();
    let mut rng = Rng::new(5);
    let objs = write_objects(&pool, &mut rng, 10, 2 * MIB);
    pool.export(false).unwrap();
    drop(pool);

    std::fs::remove_file(&devs[2]).unwrap();
    let pool = import_tank(dir.path());
    assert_eq!(pool.health(), Health::Degraded);
    assert!(pool.status().message.is_some());
    verify_all(&pool, &objs);
    // Writes while degraded are readable too.
    pool.object_write("degraded-write", 0, &rng.bytes(300_000), true)
        .unwrap();

    let spare = make_files(dir.path(), "spare", 1, 80 * MIB).remove(0);
    pool.replace(devs[2].to_str().unwrap(), &spare, false)
        .unwrap();
    let s = wait_scan(&pool);
    assert_eq!(s.errors, 0);
    assert_eq!(pool.health(), Health::Online);
    let s = scrub(&pool);
    assert_eq!(
        (s.errors, s.repaired_bytes),
        (0, 0),
        "scrub after resilver: {s:?}"
    );
    let extra = pool.object_read("degraded-write", 0, 300_000).unwrap();
    pool.export(false).unwrap();
    drop(pool);

    // Lose a different member: the resilvered one must carry its share.
    std::fs::remove_file(&devs[0]).unwrap();
    let pool = import_tank(dir.path());
    assert_eq!(pool.health(), Health::Degraded);
    verify_all(&pool, &objs);
    assert_eq!(
        pool.object_read("degraded-write", 0, 300_000).unwrap(),
        extra
    );
    pool.export(false).unwrap();
}

/// Offline a mirror side, write, online it: only the missed txgs are
/// resilvered and the side then holds everything.
#[test]
fn offline_online_resilvers_missed_writes() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "m", 2, 80 * MIB);
    let pool = create("tank", VdevKind::Mirror, &devs, &[]).unwrap();
    let mut rng = Rng::new(11);
    let before = write_objects(&pool, &mut rng, 4, MIB);
    assert!(pool.offline(devs[0].to_str().unwrap()).is_ok());
    assert!(
        pool.offline(devs[1].to_str().unwrap()).is_err(),
        "offlined the last side"
    );
    assert_eq!(pool.health(), Health::Degraded);
    let during = rng.bytes(700_000);
    pool.object_write("during", 0, &during, true).unwrap();
    pool.online(devs[0].to_str().unwrap()).unwrap();
    let s = wait_scan(&pool);
    assert_eq!(s.errors, 0);
    assert!(
        s.examined_bytes < pool.space().1,
        "resilver visited everything, not just the missed txgs"
    );
    assert_eq!(pool.health(), Health::Online);
    pool.export(false).unwrap();
    drop(pool);
    // Only the once-offline side remains: it must hold old and new data.
    std::fs::remove_file(&devs[1]).unwrap();
    let pool = import_tank(dir.path());
    verify_all(&pool, &before);
    assert_eq!(pool.object_read("during", 0, during.len()).unwrap(), during);
    pool.export(false).unwrap();
}

/// A mirror side taken offline, alone, is the pool as it was when it left:
/// import from it is refused rather than silently losing every later write,
/// whether the pool was exported or its owner died; with the side that
/// stayed, the pool imports with everything and the offline side stays out.
#[test]
fn an_offlined_side_alone_does_not_import_as_the_pool() {
    for exported in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let devs = make_files(dir.path(), "m", 2, 80 * MIB);
        let pool = create("tank", VdevKind::Mirror, &devs, &[]).unwrap();
        let mut rng = Rng::new(12);
        let before = write_objects(&pool, &mut rng, 3, MIB);
        pool.offline(devs[0].to_str().unwrap()).unwrap();
        let after = rng.bytes(300_000);
        pool.object_write("after", 0, &after, true).unwrap();
        pool.sync().unwrap();
        if exported {
            pool.export(false).unwrap();
        } else {
            pool.abandon();
        }
        drop(pool);
        let aside = tempfile::tempdir_in(dir.path()).unwrap();
        let kept = aside.path().join("kept");
        std::fs::rename(&devs[1], &kept).unwrap();
        let e = try_import(&[dir.path()], "tank", false, opts())
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(e, PoolError::Faulted(_)) && e.to_string().contains("taken offline"),
            "exported {exported}: {e}"
        );
        std::fs::rename(&kept, &devs[1]).unwrap();
        let pool = import_tank(dir.path());
        verify_all(&pool, &before);
        assert_eq!(pool.object_read("after", 0, after.len()).unwrap(), after);
        assert_eq!(pool.health(), Health::Degraded, "exported {exported}");
        pool.export(false).unwrap();
    }
}

/// Devices are found by label after being renamed and moved.
#[test]
fn import_after_rename_and_move() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 3, 64 * MIB);
    let pool = Pool::create(
        "tank",
        &[
            VdevSpec {
                kind: VdevKind::Mirror,
                devices: devs[..2].to_vec(),
            },
            VdevSpec {
                kind: VdevKind::Single,
                devices: devs[2..].to_vec(),
            },
        ],
        12,
        &BTreeMap::new(),
        false,
        opts(),
    )
    .unwrap();
    let mut rng = Rng::new(3);
    let objs = write_objects(&pool, &mut rng, 6, MIB);
    pool.export(false).unwrap();
    drop(pool);
    let moved = tempfile::tempdir().unwrap();
    for (i, d) in devs.iter().enumerate() {
        std::fs::rename(d, moved.path().join(format!("renamed-{i}"))).unwrap();
    }
    // A folder of links to the members (as /dev/disk/by-id is), and the
    // members' own folder besides: each member is found once.
    let links = tempfile::tempdir().unwrap();
    for i in 0..devs.len() {
        std::os::unix::fs::symlink(
            moved.path().join(format!("renamed-{i}")),
            links.path().join(format!("link-{i}")),
        )
        .unwrap();
    }
    let by_link = tarn_pool::discover(&[links.path().to_path_buf()], &[]);
    assert_eq!(by_link.len(), 1, "members found through links");
    assert_eq!(by_link[0].health, Health::Online);
    let both = tarn_pool::discover(
        &[links.path().to_path_buf(), moved.path().to_path_buf()],
        &[],
    );
    assert_eq!(both.len(), 1);
    assert_eq!(both[0].health, Health::Online);
    let found = tarn_pool::discover(&[moved.path().to_path_buf()], &[]);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].name, "tank");
    assert_eq!(found[0].health, Health::Online);
    let pool = attached(
        Pool::import(
            &[moved.path().to_path_buf()],
            &[],
            "tank",
            Some("renamed"),
            false,
            opts(),
        )
        .unwrap(),
    );
    assert_eq!(pool.name(), "renamed");
    verify_all(&pool, &objs);
    pool.export(false).unwrap();
}

/// Bad input gets clear errors, and a pool that is already open keeps
/// working throughout.
#[test]
fn bad_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let good = make_files(dir.path(), "good", 2, 64 * MIB);
    let other = create("other", VdevKind::Mirror, &good, &[]).unwrap();
    other.object_write("keep", 0, b"keep me", true).unwrap();

    let devs = make_files(dir.path(), "d", 3, 64 * MIB);
    let msg = |r: Result<Arc<Pool>, PoolError>| match r {
        Ok(_) => panic!("bad input accepted"),
        Err(e) => e.to_string(),
    };
    // Listed twice.
    let m = msg(create(
        "t1",
        VdevKind::Mirror,
        &[devs[0].clone(), devs[0].clone()],
        &[],
    ));
    assert!(m.contains("listed twice"), "{m}");
    // Belongs to another (open) pool.
    let m = msg(create("t2", VdevKind::Single, &good[..1], &[]));
    assert!(m.contains("belongs to pool 'other'"), "{m}");
    // Too small.
    let small = make_files(dir.path(), "small", 1, 10 * MIB);
    let m = msg(create("t3", VdevKind::Single, &small, &[]));
    assert!(m.contains("too small"), "{m}");
    // Unknown property and bad values.
    let m = msg(create(
        "t4",
        VdevKind::Single,
        &devs[..1],
        &[("frobnicate", "1")],
    ));
    assert!(m.contains("unknown pool property"), "{m}");
    let m = msg(create(
        "t5",
        VdevKind::Single,
        &devs[..1],
        &[("recordsize", "3K")],
    ));
    assert!(m.contains("recordsize"), "{m}");
    // Bad geometry and names.
    assert!(create("t6", VdevKind::Raidz { parity: 2 }, &devs[..3], &[]).is_err());
    assert!(create("9bad", VdevKind::Single, &devs[..1], &[]).is_err());
    let missing = dir.path().join("does-not-exist");
    let m = msg(create("t7", VdevKind::Single, &[missing], &[]));
    assert!(m.contains("does-not-exist"), "{m}");
    // Garbage and truncated files are not pools.
    let junk = dir.path().join("junk");
    std::fs::write(&junk, Rng::new(1).bytes(3 * MIB as usize)).unwrap();
    assert!(tarn_pool::discover(&[dir.path().to_path_buf()], &[])
        .iter()
        .all(|c| c.name == "other"));
    let e = Pool::import(
        &[],
        std::slice::from_ref(&junk),
        "other2",
        None,
        false,
        opts(),
    )
    .unwrap_err();
    assert!(matches!(e, PoolError::NotFound(_)), "{e}");
    // Importing a pool that is open here is refused (the devices are locked).
    let e = try_import(&[dir.path()], "other", true, opts()).unwrap_err();
    assert!(matches!(e, PoolError::InUse(_)), "{e}");

    assert_eq!(other.object_read("keep", 0, 100).unwrap(), b"keep me");
    other.object_write("keep2", 0, b"still fine", true).unwrap();
    assert_eq!(other.health(), Health::Online);
    other.export(false).unwrap();
}

/// A truncated or garbage member is treated as missing: the pool imports
/// degraded when redundancy allows, and refuses clearly when it does not.
#[test]
fn damaged_members_at_import() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 3, 64 * MIB);
    let pool = create("tank", VdevKind::Raidz { parity: 1 }, &devs, &[]).unwrap();
    let mut rng = Rng::new(8);
    let objs = write_objects(&pool, &mut rng, 5, MIB);
    pool.export(false).unwrap();
    drop(pool);
    // Garbage over a whole member, labels included.
    std::fs::write(&devs[1], rng.bytes(64 * MIB as usize)).unwrap();
    let pool = import_tank(dir.path());
    assert_eq!(pool.health(), Health::Degraded);
    verify_all(&pool, &objs);
    pool.export(false).unwrap();
    drop(pool);
    // A second member truncated: now beyond redundancy.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&devs[2])
        .unwrap();
    f.set_len(5 * MIB).unwrap();
    drop(f);
    let r = try_import(&[dir.path()], "tank", false, opts());
    let e = r.expect_err("import of a pool beyond redundancy succeeded");
    assert!(
        matches!(
            e,
            PoolError::Faulted(_) | PoolError::NotFound(_) | PoolError::Corrupt(_)
        ),
        "{e}"
    );
}

/// A full pool refuses writes with ENOSPC, stays consistent, and deletes
/// make room again.
#[test]
fn enospc_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 1, 64 * MIB);
    let pool = create("tank", VdevKind::Single, &devs, &[("compression", "off")]).unwrap();
    let mut rng = Rng::new(21);
    let chunk = rng.bytes(MIB as usize);
    let mut written = 0;
    let err = loop {
        match pool.object_write(&format!("f{written}"), 0, &chunk, false) {
            Ok(_) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 200, "never ran out of space");
    };
    assert!(matches!(err, PoolError::NoSpace(_)), "{err}");
    pool.sync().unwrap();
    // Delete everything and wait for the deferred frees.
    for i in 0..written {
        pool.object_delete(&format!("f{i}")).unwrap();
    }
    // Space comes back once two more txgs are durable; until then a full
    // pool still refuses new data.
    assert!(matches!(
        pool.object_write("early", 0, &chunk, false),
        Err(PoolError::NoSpace(_))
    ));
    let t0 = pool.txg();
    for _ in 0..3 {
        pool.sync().unwrap();
    }
    assert!(
        pool.txg() >= t0 + 2,
        "pending deferred frees did not keep txgs coming"
    );
    pool.object_write("again", 0, &chunk, true).unwrap();
    assert_eq!(pool.object_read("again", 0, chunk.len()).unwrap(), chunk);
    pool.export(false).unwrap();
    drop(pool);
    let pool = import_tank(dir.path());
    assert_eq!(pool.object_read("again", 0, chunk.len()).unwrap(), chunk);
    pool.export(false).unwrap();
}

/// Sparse objects: holes read as zeros and take no space; partial-record
/// overwrites keep the rest of the record.
#[test]
fn sparse_and_partial_writes() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 1, 64 * MIB);
    let pool = create("tank", VdevKind::Single, &devs, &[("compression", "off")]).unwrap();
    let (_, before, _) = pool.space();
    pool.object_write("sparse", 40 * MIB, b"tail", true)
        .unwrap();
    let (_, after, _) = pool.space();
    assert!(
        after - before < MIB,
        "a sparse object allocated {} bytes",
        after - before
    );
    assert_eq!(
        pool.object_read("sparse", 0, 4096).unwrap(),
        vec![0u8; 4096]
    );
    assert_eq!(pool.object_read("sparse", 40 * MIB, 10).unwrap(), b"tail");
    let mut model: Vec<u8> = Vec::new();
    let mut rng = Rng::new(2);
    for _ in 0..30 {
        let off = rng.below(280_000) as usize;
        let len = 1 + rng.below(20_000) as usize;
        let data = rng.bytes(len);
        if off + len > model.len() {
            model.resize(off + len, 0);
        }
        model[off..off + len].copy_from_slice(&data);
        pool.object_write("patch", off as u64, &data, rng.below(4) == 0)
            .unwrap();
    }
    assert_eq!(
        pool.object_read("patch", 0, model.len() + 1).unwrap(),
        model
    );
    pool.export(false).unwrap();
    drop(pool);
    let pool = import_tank(dir.path());
    let got = pool.object_read("patch", 0, model.len() + 1).unwrap();
    assert_eq!(got, model);
    pool.export(false).unwrap();
}

/// A scrub can be paused, survives export/import in that state, resumes
/// where it stopped and finishes; a scrub interrupted by export while
/// running resumes on import by itself.
/// A pool named tank of one vdev of `kind` over `devs`, with 4K records
/// and no compression (many blocks for a scan to walk), and `options`.
fn small_records(devs: &[std::path::PathBuf], kind: VdevKind, options: PoolOptions) -> Arc<Pool> {
    let props: BTreeMap<String, String> = [("recordsize", "4K"), ("compression", "off")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Pool::create(
        "tank",
        &[VdevSpec {
            kind,
            devices: devs.to_vec(),
        }],
        12,
        &props,
        false,
        options,
    )
    .unwrap()
}

#[test]
fn scrub_pause_resume_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 3, 96 * MIB);
    let slow = || PoolOptions {
        scan_batch_blocks: 1,
        ..opts()
    };
    let pool = small_records(&devs, VdevKind::Raidz { parity: 1 }, slow());
    let data = Rng::new(4).bytes(24 * MIB as usize);
    pool.object_write("many-records", 0, &data, true).unwrap();

    pool.scrub(ScanAction::Start).unwrap();
    let paused = pool.scrub(ScanAction::Pause).unwrap().unwrap();
    assert_eq!(paused.state, ScanState::Paused, "{paused:?}");
    assert!(
        paused.examined_bytes < paused.total_bytes,
        "scrub finished before it could be paused: {paused:?}"
    );
    assert!(pool.scrub(ScanAction::Pause).is_err(), "paused twice");
    pool.export(false).unwrap();
    drop(pool);

    let pool = attached(try_import(&[dir.path()], "tank", false, slow()).unwrap());
    let s = pool.status().scan.unwrap();
    assert_eq!(
        s.state,
        ScanState::Paused,
        "pause not kept across export: {s:?}"
    );
    assert!(s.examined_bytes >= paused.examined_bytes);
    pool.scrub(ScanAction::Resume).unwrap();
    // Interrupt it running: export mid-scan, import resumes it.
    pool.export(false).unwrap();
    drop(pool);
    let pool = attached(try_import(&[dir.path()], "tank", false, slow()).unwrap());
    let s = wait_scan(&pool);
    assert_eq!(s.state, ScanState::Finished, "{s:?}");
    assert_eq!(s.errors, 0);
    assert!(
        s.examined_bytes >= s.total_bytes * 9 / 10,
        "resumed scrub skipped data: {s:?}"
    );
    // Cancel works and is reported.
    pool.scrub(ScanAction::Start).unwrap();
    let c = pool.scrub(ScanAction::Cancel).unwrap().unwrap();
    assert_eq!(c.state, ScanState::Canceled);
    assert_eq!(
        pool.object_read("many-records", 0, data.len()).unwrap(),
        data
    );
    pool.export(false).unwrap();
}

/// The selectable algorithms: xxh3 checksums, zstd compression, two copies.
#[test]
fn xxh3_zstd_and_copies() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 2, 64 * MIB);
    let pool = Pool::create(
        "tank",
        &[
            VdevSpec {
                kind: VdevKind::Single,
                devices: devs[..1].to_vec(),
            },
            VdevSpec {
                kind: VdevKind::Single,
                devices: devs[1..].to_vec(),
            },
        ],
        9,
        &[
            ("checksum", "xxh3"),
            ("compression", "zstd-3"),
            ("copies", "2"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        false,
        opts(),
    )
    .unwrap();
    let text: Vec<u8> = b"the quick brown fox jumps over the lazy dog. "
        .iter()
        .cycle()
        .take(2 * MIB as usize)
        .copied()
        .collect();
    pool.object_write("text", 0, &text, true).unwrap();
    let blocks = pool.object_blocks("text").unwrap();
    assert!(blocks
        .iter()
        .all(|(_, bp)| bp.checksum_alg == tarn_block::ChecksumAlg::Xxh3));
    assert!(blocks
        .iter()
        .all(|(_, bp)| bp.compress == tarn_block::CompressAlg::Zstd && bp.psize < bp.lsize / 4));
    assert!(blocks
        .iter()
        .all(|(_, bp)| bp.used_dvas().count() == 2 && bp.dvas[0].vdev != bp.dvas[1].vdev));
    // With two copies on two single-device vdevs, losing one whole device's
    // data region still reads back (ditto blocks).
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&devs[0])
        .unwrap();
    f.write_at(&vec![0xA5u8; 56 * MIB as usize], DATA_START)
        .unwrap();
    drop(f);
    assert_eq!(pool.object_read("text", 0, text.len()).unwrap(), text);
    let s = scrub(&pool);
    assert_eq!(s.errors, 0, "{s:?}");
    assert!(s.repaired_bytes > 0);
    pool.export(false).unwrap();
    let pool = import_tank(dir.path());
    assert_eq!(pool.object_read("text", 0, text.len()).unwrap(), text);
    pool.export(false).unwrap();
}

/// raidz-p with p members missing and an N-way mirror with N-1 missing
/// import DEGRADED and serve every byte; one more missing is refused.
#[test]
fn degraded_up_to_redundancy() {
    for (kind, n) in [
        (VdevKind::Raidz { parity: 2 }, 5),
        (VdevKind::Raidz { parity: 3 }, 6),
        (VdevKind::Mirror, 3),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let devs = make_files(dir.path(), "d", n, 64 * MIB);
        let pool = create("tank", kind, &devs, &[]).unwrap();
        let mut rng = Rng::new(n as u64);
        let objs = write_objects(&pool, &mut rng, 6, MIB);
        pool.export(false).unwrap();
        drop(pool);
        let p = redundancy(kind, n);
        for d in &devs[..p] {
            std::fs::remove_file(d).unwrap();
        }
        let pool = import_tank(dir.path());
        assert_eq!(pool.health(), Health::Degraded, "{kind:?}");
        verify_all(&pool, &objs);
        pool.export(false).unwrap();
        drop(pool);
        std::fs::remove_file(&devs[p]).unwrap();
        let e = try_import(&[dir.path()], "tank", false, opts()).unwrap_err();
        if p + 1 < n {
            // Some members remain: the import names what is missing.
            assert!(matches!(e, PoolError::Faulted(_)), "{kind:?}: {e}");
            assert!(e.to_string().contains("missing"), "{e}");
        } else {
            // Nothing of the pool remains to be found.
            assert!(matches!(e, PoolError::NotFound(_)), "{kind:?}: {e}");
        }
    }
}

/// A pool filled to ENOSPC with small records, fragmented by deleting every
/// other object, and filled again never faults: metadata always finds room,
/// data that cannot be placed gets ENOSPC, and the pool exports and imports.
#[test]
fn fragmented_full_pool_stays_usable_and_importable() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 1, 64 * MIB);
    let pool = create(
        "tank",
        VdevKind::Single,
        &devs,
        &[("compression", "off"), ("recordsize", "4K")],
    )
    .unwrap();
    let mut rng = Rng::new(77);
    let mut live: Vec<(String, Vec<u8>)> = Vec::new();
    let mut next = 0;
    for round in 0..3 {
        loop {
            let d = rng.bytes(4096);
            let name = format!("o{next}");
            match pool.object_write(&name, 0, &d, false) {
                Ok(_) => {
                    live.push((name, d));
                    next += 1;
                }
                Err(PoolError::NoSpace(_)) => break,
                Err(e) => panic!("round {round}: {e}"),
            }
            if next % 512 == 0 {
                match pool.sync() {
                    Ok(_) | Err(PoolError::NoSpace(_)) => {}
                    Err(e) => panic!("round {round}: sync: {e}"),
                }
            }
        }
        let _ = pool.sync();
        assert_ne!(
            pool.health(),
            Health::Faulted,
            "round {round}: {:?}",
            pool.status().message
        );
        let mut keep = Vec::new();
        for (i, (n, d)) in live.drain(..).enumerate() {
            if i % 2 == 0 {
                pool.object_delete(&n).unwrap();
            } else {
                keep.push((n, d));
            }
        }
        live = keep;
        for _ in 0..3 {
            pool.sync()
                .unwrap_or_else(|e| panic!("round {round}: sync after deletes: {e}"));
        }
    }
    // Whatever was acknowledged by a successful sync reads back; the pool
    // exports and imports.
    pool.sync().unwrap();
    for (n, d) in live.iter().step_by(97) {
        assert_eq!(&pool.object_read(n, 0, 4096).unwrap(), d);
    }
    pool.export(false).unwrap();
    drop(pool);
    let pool = import_tank(dir.path());
    for (n, d) in live.iter().step_by(97) {
        assert_eq!(&pool.object_read(n, 0, 4096).unwrap(), d);
    }
    pool.export(false).unwrap();
}

/// Replace never drops the only complete copy of data.
#[test]
fn replace_refuses_to_drop_the_only_copy() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 3, 64 * MIB);
    let spare = make_files(dir.path(), "s", 1, 64 * MIB).remove(0);
    let single = create("one", VdevKind::Single, &devs[..1], &[]).unwrap();
    single.object_write("x", 0, b"only copy", true).unwrap();
    let e = single
        .replace(devs[0].to_str().unwrap(), &spare, false)
        .unwrap_err();
    assert!(e.to_string().contains("lose data"), "{e}");
    assert_eq!(single.object_read("x", 0, 9).unwrap(), b"only copy");
    single.export(false).unwrap();

    let mirror = create("two", VdevKind::Mirror, &devs[1..], &[]).unwrap();
    mirror.object_write("y", 0, b"mirrored", true).unwrap();
    mirror.offline(devs[1].to_str().unwrap()).unwrap();
    mirror
        .object_write("z", 0, b"written while one side was away", true)
        .unwrap();
    // The remaining side is the only complete one.
    let e = mirror
        .replace(devs[2].to_str().unwrap(), &spare, false)
        .unwrap_err();
    assert!(e.to_string().contains("lose data"), "{e}");
    // Replacing the stale side is fine, and resilvers.
    mirror
        .replace(devs[1].to_str().unwrap(), &spare, false)
        .unwrap();
    let s = wait_scan(&mirror);
    assert_eq!(s.errors, 0);
    assert_eq!(
        mirror.object_read("z", 0, 100).unwrap(),
        b"written while one side was away"
    );
    mirror.export(false).unwrap();
}

/// A member that comes back with old contents (restored from a copy, or a
/// disk that lost its last writes) is recognised by its uberblocks at
/// import and resilvered, even though no dirty time log recorded it.
#[test]
fn stale_member_is_found_by_its_uberblocks() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 2, 64 * MIB);
    let pool = create("tank", VdevKind::Mirror, &devs, &[]).unwrap();
    let mut rng = Rng::new(31);
    let old = write_objects(&pool, &mut rng, 3, MIB);
    pool.export(false).unwrap();
    drop(pool);
    let stale = dir.path().join("stale-copy");
    std::fs::copy(&devs[1], &stale).unwrap();
    let pool = attached(
        Pool::import(
            &[dir.path().to_path_buf()],
            &devs,
            "tank",
            None,
            false,
            opts(),
        )
        .unwrap(),
    );
    let newer = rng.bytes(900_000);
    pool.object_write("newer", 0, &newer, true).unwrap();
    pool.export(false).unwrap();
    drop(pool);
    // Put the old contents back under the member's name.
    std::fs::rename(&stale, &devs[1]).unwrap();
    let pool = import_tank(dir.path());
    let s = wait_scan(&pool);
    assert_eq!(
        s.kind,
        tarn_pool::status::ScanKind::Resilver,
        "no resilver for the stale member: {s:?}"
    );
    assert_eq!(s.errors, 0);
    pool.export(false).unwrap();
    drop(pool);
    // The once-stale member alone holds everything.
    std::fs::remove_file(&devs[0]).unwrap();
    let pool = import_tank(dir.path());
    verify_all(&pool, &old);
    assert_eq!(pool.object_read("newer", 0, newer.len()).unwrap(), newer);
    pool.export(false).unwrap();
}

/// An idle pool stops writing txgs once deferred frees are released.
#[test]
fn idle_pool_stays_idle() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 1, 64 * MIB);
    let fast = PoolOptions {
        sync_interval: Duration::from_millis(20),
        ..opts()
    };
    let pool = Pool::create(
        "tank",
        &[VdevSpec {
            kind: VdevKind::Single,
            devices: devs,
        }],
        12,
        &BTreeMap::new(),
        false,
        fast,
    )
    .unwrap();
    pool.object_write("a", 0, &[7u8; 10_000], true).unwrap();
    pool.object_delete("a").unwrap();
    std::thread::sleep(Duration::from_millis(400));
    let settled = pool.txg();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(pool.txg(), settled, "an idle pool kept committing txgs");
    pool.export(false).unwrap();
}

/// A paused resilver stays paused while the pool keeps syncing, and
/// finishes when resumed.
#[test]
fn paused_resilver_stays_paused() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 2, 96 * MIB);
    let slow_fast_sync = || PoolOptions {
        scan_batch_blocks: 1,
        sync_interval: Duration::from_millis(20),
        ..opts()
    };
    let pool = small_records(&devs, VdevKind::Mirror, slow_fast_sync());
    pool.offline(devs[1].to_str().unwrap()).unwrap();
    let data = Rng::new(6).bytes(16 * MIB as usize);
    pool.object_write("while-away", 0, &data, true).unwrap();
    pool.online(devs[1].to_str().unwrap()).unwrap();
    let paused = pool.scrub(ScanAction::Pause).unwrap().unwrap();
    assert_eq!(paused.state, ScanState::Paused);
    assert_eq!(paused.kind, tarn_pool::status::ScanKind::Resilver);
    std::thread::sleep(Duration::from_millis(300));
    let s = pool.status().scan.unwrap();
    assert_eq!(
        s.state,
        ScanState::Paused,
        "the syncer restarted a paused resilver: {s:?}"
    );
    assert!(s.examined_bytes >= paused.examined_bytes);
    pool.scrub(ScanAction::Resume).unwrap();
    let s = wait_scan(&pool);
    assert_eq!(
        (s.kind, s.state, s.errors),
        (
            tarn_pool::status::ScanKind::Resilver,
            ScanState::Finished,
            0
        )
    );
    assert_eq!(pool.health(), Health::Online);
    pool.export(false).unwrap();
}

/// A pool striped over several small vdevs fills up with ENOSPC and stays
/// healthy: per-vdev metadata reserves count against what data may take.
#[test]
fn multi_vdev_pool_fills_without_fault() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 6, 64 * MIB);
    let pool = Pool::create(
        "tank",
        &singles(&devs),
        12,
        &props(&[("compression", "off")]),
        false,
        opts(),
    )
    .unwrap();
    let chunk = Rng::new(12).bytes(MIB as usize);
    let mut n = 0;
    loop {
        match pool.object_write(&format!("f{n}"), 0, &chunk, false) {
            Ok(_) => n += 1,
            Err(PoolError::NoSpace(_)) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(n < 1000);
        if n % 16 == 0 {
            pool.sync()
                .unwrap_or_else(|e| panic!("sync after {n} MiB: {e}"));
        }
    }
    pool.sync().unwrap();
    assert_eq!(pool.health(), Health::Online);
    assert!(n > 150, "only {n} MiB fit in six 64 MiB vdevs");
    pool.export(false).unwrap();
}

/// A paused resilver survives export/import with its targets still
/// untrusted: the only complete side of a mirror cannot be taken offline.
#[test]
fn paused_resilver_keeps_targets_untrusted_across_import() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 2, 96 * MIB);
    let slow = || PoolOptions {
        scan_batch_blocks: 1,
        ..opts()
    };
    let pool = small_records(&devs, VdevKind::Mirror, slow());
    pool.offline(devs[1].to_str().unwrap()).unwrap();
    pool.object_write("away", 0, &Rng::new(8).bytes(16 * MIB as usize), true)
        .unwrap();
    pool.online(devs[1].to_str().unwrap()).unwrap();
    assert_eq!(
        pool.scrub(ScanAction::Pause).unwrap().unwrap().state,
        ScanState::Paused
    );
    pool.export(false).unwrap();
    drop(pool);
    let pool = attached(try_import(&[dir.path()], "tank", false, slow()).unwrap());
    let e = pool.offline(devs[0].to_str().unwrap()).unwrap_err();
    assert!(e.to_string().contains("lose data"), "{e}");
    pool.scrub(ScanAction::Resume).unwrap();
    let s = wait_scan(&pool);
    assert_eq!((s.state, s.errors), (ScanState::Finished, 0));
    pool.offline(devs[0].to_str().unwrap()).unwrap();
    assert_eq!(pool.object_read("away", 0, 16).unwrap().len(), 16);
    pool.export(false).unwrap();
}

/// An extension with one meta entry its scan function cannot decode; each
/// [`Garbled::poke`] makes the next sync write one more (plain) entry.
#[derive(Default)]
struct Garbled {
    written: std::sync::atomic::AtomicBool,
    pokes: std::sync::atomic::AtomicU64,
}

impl Garbled {
    fn poke(&self) {
        self.pokes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl tarn_pool::Extension for Garbled {
    fn has_changes(&self) -> bool {
        !self.written.load(std::sync::atomic::Ordering::Relaxed)
            || self.pokes.load(std::sync::atomic::Ordering::Relaxed) > 0
    }
    fn sync(&self, cx: &mut tarn_pool::SyncCx<'_>) -> Result<(), PoolError> {
        if !self
            .written
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            cx.meta_put(b"garbled", b"not a record")?;
        }
        let n = self.pokes.swap(0, std::sync::atomic::Ordering::Relaxed);
        if n > 0 {
            cx.meta_put(format!("entry{n}").as_bytes(), &[7u8; 2000])?;
        }
        Ok(())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn garbled_scan(_kind: u8, key: &[u8], _value: &[u8], out: &mut Vec<tarn_pool::ExtRef>) {
    if key == b"garbled" {
        out.push(tarn_pool::ExtRef::Undecodable("a test entry".into()));
    }
}

/// An entry a scan cannot decode is an error of the scrub, listed as
/// damage, and makes the leak check unclean: whatever it references went
/// unverified, which must not read as a clean pool.
#[test]
fn undecodable_entries_are_errors_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "u", 1, 64 * MIB);
    let pool = create("tank", VdevKind::Single, &devs, &[]).unwrap();
    pool.set_extension(Arc::new(Garbled::default()), garbled_scan);
    pool.sync().unwrap();
    let s = scrub(&pool);
    assert_eq!(s.state, ScanState::Finished);
    assert_eq!(s.errors, 1, "{s:?}");
    let damaged = pool.status().damaged;
    assert!(
        damaged.iter().any(|d| d.contains("a test entry")),
        "{damaged:?}"
    );
    let leaks = pool.leak_check().unwrap();
    assert_eq!(leaks.undecodable.len(), 1, "{leaks:?}");
    assert!(!leaks.is_clean());
}

/// A clean scrub clears the damage reports made before it started (it
/// read their blocks and found them whole, or they are gone), not one made
/// while it ran: that block may be one it had walked past, or one born
/// after it began, and its file still fails to read.
#[test]
fn a_clean_scrub_keeps_damage_reported_while_it_ran() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "c", 1, 96 * MIB);
    let pool = small_records(
        &devs,
        VdevKind::Single,
        PoolOptions {
            scan_batch_blocks: 1,
            ..opts()
        },
    );
    let data = Rng::new(5).bytes(16 * MIB as usize);
    pool.object_write("many-records", 0, &data, true).unwrap();
    pool.report_damage("object 'before' record 0".into());
    pool.scrub(ScanAction::Start).unwrap();
    let paused = pool.scrub(ScanAction::Pause).unwrap().unwrap();
    assert_eq!(
        paused.state,
        ScanState::Paused,
        "the scrub ended before it could be paused: {paused:?}"
    );
    pool.report_damage("object 'during' record 0".into());
    pool.scrub(ScanAction::Resume).unwrap();
    let s = wait_scan(&pool);
    assert_eq!((s.state, s.errors), (ScanState::Finished, 0), "{s:?}");
    let damaged = pool.status().damaged;
    assert!(
        !damaged.iter().any(|d| d.contains("'before'")),
        "{damaged:?}"
    );
    assert!(
        damaged.iter().any(|d| d.contains("'during'")),
        "a report made while the scrub ran was cleared: {damaged:?}"
    );
    // The next clean scrub started after it clears it.
    let s = scrub(&pool);
    assert_eq!(s.errors, 0, "{s:?}");
    assert!(pool.status().damaged.is_empty());
}

/// A resilver that meets an entry it cannot decode did not rebuild what
/// lies beneath it: it ends with an error and the returning side keeps
/// its dirty time log (still marked resilvering), instead of passing for
/// whole.
#[test]
fn resilver_with_undecodable_entries_keeps_the_dirty_time_log() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "m", 2, 80 * MIB);
    let pool = create("tank", VdevKind::Mirror, &devs, &[]).unwrap();
    let ext = Arc::new(Garbled::default());
    pool.set_extension(ext.clone(), garbled_scan);
    pool.sync().unwrap();
    assert!(pool.offline(devs[0].to_str().unwrap()).is_ok());
    // Writes the offline side misses.
    for _ in 0..3 {
        ext.poke();
        pool.sync().unwrap();
    }
    pool.online(devs[0].to_str().unwrap()).unwrap();
    let s = wait_scan(&pool);
    assert_eq!(s.state, ScanState::Finished);
    assert!(s.errors >= 1, "{s:?}");
    let st = pool.status();
    let side = &st.vdevs[0].children[0];
    assert!(
        side.note.as_deref().is_some_and(|n| n.contains("resilver")),
        "{side:?}"
    );
}

/// Space maps too large for one block (the deferred frees of a large
/// delete, the extents of a fragmented pool) are written in chunks that
/// an index block lists: the txg commits, the next one frees the old
/// chunks, the pool imports with the same maps, a scrub reads every chunk
/// and nothing leaks. The chunks are made small here, so that a small
/// pool needs many; the default is 8 MiB, and a block holds at most 16.
#[test]
fn space_maps_larger_than_a_block_are_written_in_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let devs = make_files(dir.path(), "d", 1, 128 * MIB);
    let small = || PoolOptions {
        space_chunk_bytes: 4096,
        ..opts()
    };
    let pool = tarn_testkit::pools::create_with(
        "tank",
        VdevKind::Single,
        &devs,
        &[("compression", "off")],
        small(),
    )
    .unwrap();
    let mut rng = Rng::new(21);
    let mut objs = BTreeMap::new();
    for i in 0..3000 {
        let len = 600 + rng.below(1500) as usize;
        let data = rng.bytes(len);
        pool.object_write(&format!("o{i}"), 0, &data, false)
            .unwrap();
        objs.insert(format!("o{i}"), data);
    }
    pool.sync().unwrap();
    // Every other one goes: holes between the rest, and deferred frees.
    for i in (0..3000).step_by(2) {
        pool.object_delete(&format!("o{i}")).unwrap();
        objs.remove(&format!("o{i}"));
    }
    pool.sync().unwrap();
    let blocks = pool.space_map_blocks();
    assert!(blocks > 3, "the maps took {blocks} block(s)");
    let space = pool.space();
    // The next txgs free the old chunks and write new ones.
    pool.object_write("late", 0, &rng.bytes(5000), false)
        .unwrap();
    for _ in 0..3 {
        pool.sync().unwrap();
    }
    let leak = pool.leak_check().unwrap();
    assert!(leak.is_clean(), "{leak:?}");
    pool.export(false).unwrap();
    drop(pool);
    let pool = tarn_testkit::pools::try_import(&[dir.path()], "tank", false, small()).unwrap();
    assert!(pool.space_map_blocks() > 3);
    assert!(
        pool.space().1 >= space.1 / 2,
        "{:?} after {space:?}",
        pool.space()
    );
    verify_all(&pool, &objs);
    let s = scrub(&pool);
    assert_eq!(s.errors, 0, "{s:?}");
    let leak = pool.leak_check().unwrap();
    assert!(leak.is_clean(), "{leak:?}");
    // The same pool imported with the default size writes one block again.
    pool.export(false).unwrap();
    drop(pool);
    let pool = tarn_testkit::pools::try_import(&[dir.path()], "tank", false, opts()).unwrap();
    pool.object_write("later", 0, &rng.bytes(5000), false)
        .unwrap();
    pool.sync().unwrap();
    assert_eq!(pool.space_map_blocks(), 1);
    verify_all(&pool, &objs);
    pool.sync().unwrap();
    let leak = pool.leak_check().unwrap();
    assert!(leak.is_clean(), "{leak:?}");
}
