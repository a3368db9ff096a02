//! Operations that could fail part-way: refusals change nothing, duplicate
//! snapshot names, promote of a clone of a clone, and a panicking
//! transaction (the pool faults; nothing half-done commits).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use tarn_dataset::{self as ds, DsError};
use tarn_pool::Pool;
use tarn_testkit::pools::{opts, tank, try_import};
use tarn_vdev::VdevKind;

fn new_pool(dir: &Path) -> Arc<Pool> {
    tank(dir, VdevKind::Single, 1, 64 << 20)
}

fn names(pool: &Pool) -> Vec<String> {
    ds::list(pool, true)
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect()
}

fn key(i: u64) -> Vec<u8> {
    let mut k = b"f".to_vec();
    k.extend_from_slice(&i.to_be_bytes());
    k
}

fn write(h: &ds::DatasetHandle, i: u64, b: u8) {
    h.txn::<_, DsError>(true, |t| t.write_block(&key(i), vec![b; 50_000]))
        .unwrap();
}

/// A dataset's `used`, as `list` shows it.
fn used_of(pool: &Pool, name: &str) -> u64 {
    ds::list(pool, false)
        .unwrap()
        .into_iter()
        .find(|i| i.name == name)
        .map(|i| i.used)
        .unwrap()
}

fn none() -> BTreeMap<String, String> {
    BTreeMap::new()
}

fn snap(pool: &Pool, n: &str) {
    ds::snapshot(pool, &[n.to_string()], false).unwrap();
}

/// `destroy -r` of the pool's root is refused before anything changes.
#[test]
fn destroy_r_of_root_fails_after_destroying_children() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    ds::create(&pool, "tank/a", &none(), false).unwrap();
    let h = ds::open(&pool, "tank/a").unwrap();
    write(&h, 1, 1);
    snap(&pool, "tank/a@s");
    let r = ds::destroy(&pool, "tank", true);
    assert!(r.is_err(), "root destroy must be refused");
    pool.sync().unwrap();
    let n = names(&pool);
    assert!(
        n.contains(&"tank/a".to_string()) && n.contains(&"tank/a@s".to_string()),
        "a refused destroy must change nothing, but now: {n:?}"
    );
}

/// `destroy -r tank/x` where tank/x/b is a clone of tank/x/a@s: every
/// clone is inside the tree, so the clone goes first and it succeeds.
#[test]
fn destroy_r_with_clone_inside_fails_part_way() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    ds::create(&pool, "tank/x", &none(), false).unwrap();
    ds::create(&pool, "tank/x/a", &none(), false).unwrap();
    let h = ds::open(&pool, "tank/x/a").unwrap();
    write(&h, 1, 1);
    snap(&pool, "tank/x/a@s");
    write(&h, 2, 2);
    snap(&pool, "tank/x/a@t");
    ds::clone(&pool, "tank/x/a@s", "tank/x/b", &none()).unwrap();
    let r = ds::destroy(&pool, "tank/x", true);
    pool.sync().unwrap();
    let n = names(&pool);
    assert!(
        r.is_ok(),
        "destroy -r failed: {r:?}; left behind (partially destroyed): {n:?}"
    );
}

/// rollback -r over a newer snapshot that has a clone is refused before
/// any newer snapshot is destroyed.
#[test]
fn rollback_r_refused_after_destroying_newer() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    ds::create(&pool, "tank/fs", &none(), false).unwrap();
    let h = ds::open(&pool, "tank/fs").unwrap();
    write(&h, 1, 1);
    snap(&pool, "tank/fs@s1");
    write(&h, 2, 2);
    snap(&pool, "tank/fs@s2");
    write(&h, 3, 3);
    snap(&pool, "tank/fs@s3");
    ds::clone(&pool, "tank/fs@s2", "tank/c", &none()).unwrap();
    let r = ds::rollback(&pool, "tank/fs@s1", true);
    assert!(matches!(r, Err(DsError::Busy(_))), "{r:?}");
    pool.sync().unwrap();
    let n = names(&pool);
    assert!(
        n.contains(&"tank/fs@s3".to_string()),
        "refused rollback destroyed tank/fs@s3: {n:?}"
    );
}

/// The same snapshot name twice in one request is refused (it would make
/// two records with one name, one of them hidden).
#[test]
fn duplicate_snapshot_names_in_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    ds::create(&pool, "tank/a", &none(), false).unwrap();
    ds::create(&pool, "tank/a/b", &none(), false).unwrap();
    let h = ds::open(&pool, "tank/a/b").unwrap();
    write(&h, 1, 1);
    // `tank/a@x -r` already covers tank/a/b@x.
    let r = ds::snapshot(&pool, &["tank/a@x".into(), "tank/a/b@x".into()], true);
    if r.is_err() {
        return; // refused: fine
    }
    ds::destroy(&pool, "tank/a/b@x", false).unwrap();
    let n = names(&pool);
    assert!(!n.contains(&"tank/a/b@x".to_string()));
    // No snapshot is listed any more, so this must work:
    let r = ds::destroy(&pool, "tank/a/b", false);
    assert!(r.is_ok(), "ghost snapshot: {r:?}; listed: {n:?}");
}

/// A clone below its origin, promoted over it, makes `destroy -r` of the
/// origin impossible to order (the origin goes after its child, the child
/// after its snapshot's clone, the origin): refused as busy with what to
/// do, not reported as damaged metadata; nothing is destroyed.
#[test]
fn destroy_r_over_a_promoted_clone_below_is_refused_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    ds::create(&pool, "tank/a", &none(), false).unwrap();
    let a = ds::open(&pool, "tank/a").unwrap();
    write(&a, 0, 0x21);
    snap(&pool, "tank/a@x");
    ds::clone(&pool, "tank/a@x", "tank/a/c", &none()).unwrap();
    ds::promote(&pool, "tank/a/c").unwrap();
    let r = ds::destroy(&pool, "tank/a", true);
    assert!(matches!(r, Err(DsError::Busy(_))), "{r:?}");
    let left = names(&pool);
    assert!(
        left.iter().any(|n| n == "tank/a") && left.iter().any(|n| n == "tank/a/c"),
        "{left:?}"
    );
    // Promoted back, the tree goes.
    ds::promote(&pool, "tank/a").unwrap();
    ds::destroy(&pool, "tank/a", true).unwrap();
}

/// Promote of a clone whose origin filesystem is itself a clone.
#[test]
fn promote_of_clone_of_clone_leaks() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    ds::create(&pool, "tank/g", &none(), false).unwrap();
    let g = ds::open(&pool, "tank/g").unwrap();
    write(&g, 0, 0x10);
    snap(&pool, "tank/g@base");
    ds::clone(&pool, "tank/g@base", "tank/h", &none()).unwrap();
    let h = ds::open(&pool, "tank/h").unwrap();
    write(&h, 1, 0x11); // B: born after base, before s1
    snap(&pool, "tank/h@s1");
    write(&h, 2, 0x12);
    snap(&pool, "tank/h@o");
    ds::clone(&pool, "tank/h@o", "tank/c", &none()).unwrap();
    ds::promote(&pool, "tank/c").unwrap();
    let c = ds::open(&pool, "tank/c").unwrap();
    // c kills B; only c@s1 and c@o hold it now (h is a clone of c@o
    // and also holds it: destroy h first).
    c.txn::<_, DsError>(true, |t| t.delete(&key(1)).map(|_| ()))
        .unwrap();
    let hi = ds::list(&pool, false).unwrap();
    let origin_c = hi
        .iter()
        .find(|i| i.name == "tank/c")
        .unwrap()
        .origin
        .clone();
    assert_eq!(
        origin_c.as_deref(),
        Some("tank/g@base"),
        "c inherits h's origin"
    );
    ds::destroy(&pool, "tank/h", true).unwrap();
    ds::destroy(&pool, "tank/c@o", false).unwrap();
    ds::destroy(&pool, "tank/c@s1", false).unwrap();
    for _ in 0..4 {
        pool.sync().unwrap();
    }
    let leak = pool.leak_check().unwrap();
    assert!(leak.is_clean(), "{leak:?}");
    // g@base now has c as its clone: refused until c is gone.
    let gd = ds::destroy(&pool, "tank/g@base", false);
    assert!(
        matches!(&gd, Err(DsError::Busy(m)) if m.contains("clone")),
        "{gd:?}"
    );
    ds::destroy(&pool, "tank/c", false).unwrap();
    ds::destroy(&pool, "tank/g@base", false).unwrap();
    ds::destroy(&pool, "tank/g", false).unwrap();
    for _ in 0..4 {
        pool.sync().unwrap();
    }
    let leak = pool.leak_check().unwrap();
    assert!(leak.is_clean(), "{leak:?}");
}

/// A panic inside a transaction closure (a bug in a caller) comes back as
/// an error, and the pool faults so its half-done change never commits;
/// after export and import the pool is whole and holds what was committed.
#[test]
fn panic_in_txn_faults_the_pool_and_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    ds::create(&pool, "tank/a", &none(), false).unwrap();
    let h = ds::open(&pool, "tank/a").unwrap();
    write(&h, 1, 1);
    pool.sync().unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        h.txn::<(), DsError>(true, |t| {
            t.write_block(&key(2), vec![2; 50_000])?;
            panic!("bug in a caller");
        })
    }));
    let inner = r.expect("the panic is contained");
    assert!(inner.is_err());
    assert!(pool.sync().is_err(), "the pool is faulted");
    let _ = pool.export(false);
    drop((h, pool));
    let pool = try_import(&[dir.path()], "tank", true, opts()).unwrap();
    ds::attach(&pool).unwrap();
    let h = ds::open(&pool, "tank/a").unwrap();
    assert_eq!(
        h.txn::<_, DsError>(false, |t| t.read_block(&key(1)))
            .unwrap(),
        Some(vec![1; 50_000])
    );
    assert_eq!(
        h.txn::<_, DsError>(false, |t| t.read_block(&key(2)))
            .unwrap(),
        None
    );
    let leak = pool.leak_check().unwrap();
    assert!(leak.is_clean(), "{leak:?}");
}

/// What each dataset was written with: its name and its blocks.
type Written = Vec<(String, Vec<Vec<u8>>)>;

/// A mirror of d0 and d1 (slow scans, fast syncs) with twelve datasets
/// written while d1 was offline, d1 back online (its resilver started):
/// the pool, both devices' paths, and what was written.
fn sets_d1_missed(dir: &Path, seed: u64) -> (Arc<Pool>, String, String, Written) {
    use std::time::Duration;
    use tarn_pool::PoolOptions;
    let options = PoolOptions {
        scan_batch_blocks: 1,
        sync_interval: Duration::from_millis(20),
        ..opts()
    };
    let pool = tarn_testkit::pools::tank_with(dir, VdevKind::Mirror, 2, 96 << 20, options);
    let dev = |i: usize| dir.join(format!("d{i}")).to_string_lossy().to_string();
    let (d0, d1) = (dev(0), dev(1));
    let mut off = BTreeMap::new();
    off.insert("compression".to_string(), "off".to_string());
    let sets: Vec<String> = (0..12).map(|i| format!("tank/s{i:02}")).collect();
    for s in &sets {
        ds::create(&pool, s, &off, false).unwrap();
    }
    pool.sync().unwrap();
    pool.offline(&d1).unwrap();
    let mut rng = tarn_testkit::data::Rng::new(seed);
    let mut want = Vec::new();
    for s in &sets {
        let h = ds::open(&pool, s).unwrap();
        let blocks: Vec<Vec<u8>> = (0..8).map(|_| rng.bytes(64 << 10)).collect();
        h.txn::<_, DsError>(true, |t| {
            for (i, b) in blocks.iter().enumerate() {
                t.write_block(&key(i as u64), b.clone())?;
            }
            Ok(())
        })
        .unwrap();
        want.push((s.clone(), blocks));
    }
    pool.sync().unwrap();
    pool.online(&d1).unwrap();
    (pool, d0, d1, want)
}

/// Exports `pool`, imports it again (past every cache) and reads
/// everything `want` names from d1 alone (d0 taken offline).
fn d1_alone_has(pool: Arc<Pool>, dir: &Path, d0: &str, want: &Written) {
    pool.export(false).unwrap();
    drop(pool);
    let pool = tarn_testkit::pools::attached(try_import(&[dir], "tank", false, opts()).unwrap());
    pool.offline(d0).unwrap();
    for (s, blocks) in want {
        let h = ds::open(&pool, s).unwrap();
        for (i, b) in blocks.iter().enumerate() {
            let found = h
                .txn(false, |t| t.block_ref(&key(i as u64)))
                .unwrap_or_else(|e| panic!("{s}: block {i}: {e}"))
                .unwrap_or_else(|| panic!("{s}: block {i} is gone"));
            let got = found.read(&pool);
            assert!(
                got.as_ref().is_ok_and(|g| g[..] == b[..]),
                "{s}: block {i} is not on d1 alone"
            );
        }
    }
    pool.export(false).unwrap();
}

/// A resilver target taken out while the resilver runs misses the blocks
/// the resilver visits meanwhile (each dataset's tree is visited once, in
/// order). Brought back before that resilver ends, it must not end the
/// target's dirty time log: another resilver covers it, and only then may
/// the target stand alone.
#[test]
fn a_target_out_during_its_resilver_is_resilvered_again() {
    use std::time::{Duration, Instant};
    use tarn_pool::status::{Health, ScanState};
    use tarn_pool::ScanAction;
    let dir = tempfile::tempdir().unwrap();
    let (pool, d0, d1, want) = sets_d1_missed(dir.path(), 61);
    let first = pool.scrub(ScanAction::Pause).unwrap().unwrap();
    // Out again while the resilver goes on (slowly: d0's reads wait), so
    // that what it visits now is not written to d1.
    pool.offline(&d1).unwrap();
    let slow = tarn_vdev::Fault {
        latency_ms: 5,
        ..tarn_vdev::Fault::always(tarn_vdev::FaultKind::Latency)
    };
    pool.inject(&d0, Some(slow)).unwrap();
    pool.scrub(ScanAction::Resume).unwrap();
    let t0 = Instant::now();
    let half = first.examined_bytes + (2 << 20);
    while pool.status().scan.unwrap().examined_bytes < half {
        let s = pool.status().scan.unwrap();
        assert!(
            s.state == ScanState::Scanning,
            "ended while d1 was out: {s:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(60), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    pool.scrub(ScanAction::Pause).unwrap();
    pool.inject(&d0, None).unwrap();
    pool.online(&d1).unwrap();
    let _ = pool.scrub(ScanAction::Resume);
    // Until d1 has everything, the pool is not healthy.
    let t0 = Instant::now();
    loop {
        let s = pool.status().scan.unwrap();
        if s.state == ScanState::Finished && pool.health() == Health::Online {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "{s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    d1_alone_has(pool, dir.path(), &d0, &want);
}

/// A resilver whose writes to its target failed in trees it had already
/// walked, then interrupted by an export, must not trust the target when
/// it ends after the import: the target's error counters start again at
/// zero there, so the record of the failure has to come from the disk.
#[test]
fn a_resumed_resilver_remembers_its_failed_writes() {
    use std::time::{Duration, Instant};
    use tarn_pool::status::{Health, ScanState};
    use tarn_pool::{PoolOptions, ScanAction};
    let dir = tempfile::tempdir().unwrap();
    let (pool, d0, d1, want) = sets_d1_missed(dir.path(), 62);
    let first = pool.scrub(ScanAction::Pause).unwrap().unwrap();
    // A third of the writes to d1 fail (too few in a row to fault it) while
    // the resilver walks several datasets' trees, slowly.
    let failing = tarn_vdev::Fault {
        probability: 0.3,
        ..tarn_vdev::Fault::always(tarn_vdev::FaultKind::WriteError)
    };
    let slow = tarn_vdev::Fault {
        latency_ms: 5,
        ..tarn_vdev::Fault::always(tarn_vdev::FaultKind::Latency)
    };
    pool.inject(&d1, Some(failing)).unwrap();
    pool.inject(&d0, Some(slow)).unwrap();
    pool.scrub(ScanAction::Resume).unwrap();
    let t0 = Instant::now();
    let half = first.examined_bytes + (3 << 20);
    while pool.status().scan.unwrap().examined_bytes < half {
        let s = pool.status().scan.unwrap();
        assert!(s.state == ScanState::Scanning, "ended early: {s:?}");
        assert!(t0.elapsed() < Duration::from_secs(60), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    pool.scrub(ScanAction::Pause).unwrap();
    pool.inject(&d1, None).unwrap();
    pool.inject(&d0, None).unwrap();
    pool.export(false).unwrap();
    drop(pool);
    let slow_scans = PoolOptions {
        scan_batch_blocks: 1,
        sync_interval: Duration::from_millis(20),
        ..opts()
    };
    let pool = tarn_testkit::pools::attached(
        try_import(&[dir.path()], "tank", false, slow_scans).unwrap(),
    );
    let _ = pool.scrub(ScanAction::Resume);
    let finished = |pool: &Pool| {
        let t0 = Instant::now();
        loop {
            let s = pool.status().scan.unwrap();
            if s.state == ScanState::Finished {
                return s;
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "{s:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let s = finished(&pool);
    // d1 missed writes in trees walked before the export: it is not
    // trusted with the data yet.
    assert!(s.errors > 0, "{s:?}");
    assert_ne!(
        pool.health(),
        Health::Online,
        "a target that failed writes before the export passed for whole"
    );
    assert!(pool.offline(&d0).is_err(), "d1 would stand alone");
    // Taken out and back, it is resilvered again, now without failures.
    pool.offline(&d1).unwrap();
    pool.online(&d1).unwrap();
    let t0 = Instant::now();
    while !(finished(&pool).errors == 0 && pool.health() == Health::Online) {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{:?}",
            pool.status()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    d1_alone_has(pool, dir.path(), &d0, &want);
}

/// Two snapshots of one dataset in one command would be one txg's tree
/// twice at one place in the snapshot chain; a promote of a clone of the
/// first then split the chain, and destroying the second faulted the
/// pool. Refused, nothing taken; one after the other they work.
#[test]
fn two_snapshots_of_one_dataset_in_one_command_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    ds::create(&pool, "tank/a", &none(), false).unwrap();
    let h = ds::open(&pool, "tank/a").unwrap();
    write(&h, 1, 1);
    let before = names(&pool);
    let e = ds::snapshot(&pool, &["tank/a@x".into(), "tank/a@y".into()], false).unwrap_err();
    assert!(matches!(e, DsError::Invalid(_)), "{e}");
    let e = ds::snapshot(&pool, &["tank@x".into(), "tank/a@y".into()], true).unwrap_err();
    assert!(matches!(e, DsError::Invalid(_)), "{e}");
    assert_eq!(names(&pool), before, "nothing taken");
    snap(&pool, "tank/a@x");
    snap(&pool, "tank/a@y");
    write(&h, 2, 2);
    snap(&pool, "tank/a@z");
    ds::clone(&pool, "tank/a@x", "tank/c", &none()).unwrap();
    ds::promote(&pool, "tank/c").unwrap();
    ds::destroy(&pool, "tank/a@y", false).unwrap();
    assert_eq!(pool.health(), tarn_pool::status::Health::Online);
    let s = tarn_testkit::pools::scrub(&pool);
    assert_eq!(s.errors, 0, "{s:?}");
}

/// A clone's reservation is checked against what its parent may still
/// write, as a new dataset's is: one larger than the pool would leave
/// every other dataset without room.
#[test]
fn a_clone_cannot_reserve_more_than_there_is() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    ds::create(&pool, "tank/a", &none(), false).unwrap();
    write(&ds::open(&pool, "tank/a").unwrap(), 1, 1);
    snap(&pool, "tank/a@s");
    let mut huge = BTreeMap::new();
    huge.insert("reservation".to_string(), "10T".to_string());
    let e = ds::clone(&pool, "tank/a@s", "tank/c", &huge).unwrap_err();
    assert!(matches!(e, DsError::NoSpace(_)), "{e}");
    assert!(!names(&pool).contains(&"tank/c".to_string()));
    let mut small = BTreeMap::new();
    small.insert("reservation".to_string(), "1M".to_string());
    ds::clone(&pool, "tank/a@s", "tank/c", &small).unwrap();
}

/// A dataset moved under a parent with a quota must fit it: the move is
/// refused rather than leave the parent over its quota.
#[test]
fn a_move_under_a_quota_must_fit_it() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    for n in ["tank/a", "tank/b"] {
        ds::create(&pool, n, &none(), false).unwrap();
    }
    let b = ds::open(&pool, "tank/b").unwrap();
    let mut rng = tarn_testkit::data::Rng::new(5);
    for i in 0..40 {
        let data = rng.bytes(50_000);
        b.txn::<_, DsError>(true, |t| t.write_block(&key(i), data.clone()))
            .unwrap();
    }
    pool.sync().unwrap();
    ds::set_prop(&pool, "tank/a", "quota", "1M").unwrap();
    let e = ds::rename(&pool, "tank/b", "tank/a/b").unwrap_err();
    assert!(matches!(e, DsError::Quota(_)), "{e}");
    assert!(ds::check_rename(&pool, "tank/b", "tank/a/b").is_err());
    assert!(names(&pool).contains(&"tank/b".to_string()), "not moved");
    ds::set_prop(&pool, "tank/a", "quota", "10M").unwrap();
    ds::rename(&pool, "tank/b", "tank/a/b").unwrap();
    // Within the same parent, nothing to check.
    ds::rename(&pool, "tank/a/b", "tank/a/c").unwrap();
}

/// An empty dataset with a reservation counts as its reservation in its
/// parent's use, so it may not be moved under a quota that reservation
/// would pass.
#[test]
fn a_reservation_moves_under_a_quota_only_if_it_fits() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    for n in ["tank/a", "tank/b"] {
        ds::create(&pool, n, &none(), false).unwrap();
    }
    ds::set_prop(&pool, "tank/a", "quota", "4M").unwrap();
    ds::set_prop(&pool, "tank/b", "reservation", "8M").unwrap();
    let e = ds::rename(&pool, "tank/b", "tank/a/b").unwrap_err();
    assert!(matches!(e, DsError::Quota(_)), "{e}");
    assert!(names(&pool).contains(&"tank/b".to_string()), "not moved");
    ds::set_prop(&pool, "tank/b", "reservation", "2M").unwrap();
    ds::rename(&pool, "tank/b", "tank/a/b").unwrap();
}

/// Each block of one transaction counts the blocks the transaction staged
/// before it: one large request cannot pass a quota whole, and what is
/// refused leaves nothing behind.
#[test]
fn one_large_transaction_cannot_pass_a_quota() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    ds::create(&pool, "tank/q", &none(), false).unwrap();
    ds::set_prop(&pool, "tank/q", "quota", "1M").unwrap();
    let q = ds::open(&pool, "tank/q").unwrap();
    let mut rng = tarn_testkit::data::Rng::new(8);
    let blocks: Vec<Vec<u8>> = (0..16).map(|_| rng.bytes(128 << 10)).collect();
    let e = q
        .txn::<_, DsError>(true, |t| {
            for (i, b) in blocks.iter().enumerate() {
                t.write_block(&key(i as u64), b.clone())?;
            }
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(e, DsError::Quota(_)), "{e}");
    pool.sync().unwrap();
    let used = used_of(&pool, "tank/q");
    assert!(used < 1 << 20, "used {used} after a refused transaction");
    // Blocks that fit still go in, one transaction each.
    for (i, b) in blocks.iter().take(4).enumerate() {
        q.txn::<_, DsError>(true, |t| t.write_block(&key(i as u64), b.clone()))
            .unwrap();
    }
}

/// What a txg staged counts once while it is written: its sync adds the
/// blocks to the records' use before the txg commits, and until then they
/// must not also count as pending, or a write that fits the quota beside
/// them is refused.
#[test]
fn a_write_beside_a_syncing_txg_is_not_refused_by_the_quota() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    let mut off = none();
    off.insert("compression".to_string(), "off".to_string());
    ds::create(&pool, "tank/q", &off, false).unwrap();
    ds::set_prop(&pool, "tank/q", "quota", "4M").unwrap();
    pool.sync().unwrap();
    let q = ds::open(&pool, "tank/q").unwrap();
    let mut rng = tarn_testkit::data::Rng::new(12);
    for i in 0..40 {
        let data = rng.bytes(64 << 10);
        q.txn::<_, DsError>(true, |t| t.write_block(&key(i), data.clone()))
            .unwrap();
    }
    // A slow device keeps the sync's later steps (trees, records, the
    // uberblock) long enough to write beside them many times.
    let dev = dir.path().join("d0").to_string_lossy().to_string();
    let slow = tarn_vdev::Fault {
        latency_ms: 10,
        ..tarn_vdev::Fault::always(tarn_vdev::FaultKind::Latency)
    };
    pool.inject(&dev, Some(slow)).unwrap();
    let syncer = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.sync())
    };
    let small = rng.bytes(4 << 10);
    let mut tries = 0;
    while !syncer.is_finished() {
        let r = q.txn::<_, DsError>(true, |t| t.write_block(&key(1000), small.clone()));
        assert!(r.is_ok(), "refused beside a sync: {r:?}");
        tries += 1;
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    syncer.join().unwrap().unwrap();
    pool.inject(&dev, None).unwrap();
    assert!(tries > 10, "the sync was too quick to write beside it");
    pool.sync().unwrap();
}

/// A child's unused reservation counts once under its parent's quota: it
/// may be lowered (or raised within the quota), and writes into it that
/// the reservation covers are not refused by the parent's quota.
#[test]
fn a_reservation_under_a_quota_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    let mut off = none();
    off.insert("compression".to_string(), "off".to_string());
    ds::create(&pool, "tank/p", &off, false).unwrap();
    ds::set_prop(&pool, "tank/p", "quota", "10M").unwrap();
    ds::create(&pool, "tank/p/c", &off, false).unwrap();
    ds::set_prop(&pool, "tank/p/c", "reservation", "6M").unwrap();
    ds::set_prop(&pool, "tank/p/c", "reservation", "5M").unwrap();
    ds::set_prop(&pool, "tank/p/c", "reservation", "9M").unwrap();
    let e = ds::set_prop(&pool, "tank/p/c", "reservation", "11M").unwrap_err();
    assert!(matches!(e, DsError::NoSpace(_)), "{e}");
    ds::set_prop(&pool, "tank/p/c", "reservation", "6M").unwrap();
    // 8 MiB into the child: past its reservation, within the quota.
    let c = ds::open(&pool, "tank/p/c").unwrap();
    let mut rng = tarn_testkit::data::Rng::new(21);
    for i in 0..64 {
        let data = rng.bytes(128 << 10);
        c.txn::<_, DsError>(true, |t| t.write_block(&key(i), data.clone()))
            .unwrap_or_else(|e| panic!("block {i}: {e}"));
    }
    pool.sync().unwrap();
    let used = used_of(&pool, "tank/p");
    assert!(used <= 10 << 20, "{used}");
}

/// Bad ranges and keys from a caller are answered, never a panic or a
/// failed sync: an empty or inverted range reads and deletes nothing, and
/// a key too long for the tree is refused when it is written.
#[test]
fn bad_ranges_and_keys_are_refused_not_fatal() {
    use std::ops::Bound::{Excluded, Included};
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    ds::create(&pool, "tank/a", &none(), false).unwrap();
    let a = ds::open(&pool, "tank/a").unwrap();
    write(&a, 1, 7);
    let k: &[u8] = b"k";
    let (lo, hi): (&[u8], &[u8]) = (b"b", b"a");
    let got = a
        .txn::<_, DsError>(false, |t| t.range(Excluded(k), Excluded(k), 10))
        .unwrap();
    assert!(got.is_empty());
    let got = a
        .txn::<_, DsError>(false, |t| t.range(Included(lo), Excluded(hi), 10))
        .unwrap();
    assert!(got.is_empty());
    a.txn::<_, DsError>(true, |t| t.delete_range(Included(lo), Excluded(hi)))
        .unwrap();
    let long = vec![1u8; 1025];
    let e = a
        .txn::<_, DsError>(true, |t| t.write_block(&long, vec![1; 100]))
        .unwrap_err();
    assert!(matches!(e, DsError::Invalid(_)), "{e}");
    let e = a
        .txn::<_, DsError>(true, |t| {
            t.patch_block(&long, 100, 0, vec![1; 10]).map(|_| ())
        })
        .unwrap_err();
    assert!(matches!(e, DsError::Invalid(_)), "{e}");
    pool.sync().unwrap();
    assert!(a
        .txn::<_, DsError>(false, |t| t.get(&key(1)))
        .unwrap()
        .is_some());
}

/// A promoted clone takes over the origin's older snapshots and the space
/// only they hold; a promote that would take one of the clone's own
/// ancestors past its quota is refused before anything changes, as ZFS
/// refuses it, and goes through once the quota allows it.
#[test]
fn a_promote_that_would_pass_a_quota_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    for n in ["tank/a", "tank/b"] {
        ds::create(&pool, n, &none(), false).unwrap();
    }
    let a = ds::open(&pool, "tank/a").unwrap();
    let mut rng = tarn_testkit::data::Rng::new(9);
    for i in 0..40 {
        let data = rng.bytes(50_000);
        a.txn::<_, DsError>(true, |t| t.write_block(&key(i), data.clone()))
            .unwrap();
    }
    pool.sync().unwrap();
    snap(&pool, "tank/a@s");
    ds::clone(&pool, "tank/a@s", "tank/b/c", &none()).unwrap();
    // The origin's filesystem lets go of its data: the snapshot, and the
    // clone, hold it now.
    for i in 0..40 {
        a.txn::<_, DsError>(true, |t| t.delete(&key(i)).map(|_| ()))
            .unwrap();
    }
    pool.sync().unwrap();
    ds::set_prop(&pool, "tank/b", "quota", "1M").unwrap();
    let before = (
        names(&pool),
        used_of(&pool, "tank/a"),
        used_of(&pool, "tank/b"),
    );
    assert!(before.2 < 1 << 20, "{before:?}");
    let e = ds::promote(&pool, "tank/b/c").unwrap_err();
    assert!(
        matches!(&e, DsError::Quota(m) if m.contains("tank/b")),
        "{e}"
    );
    let after = (
        names(&pool),
        used_of(&pool, "tank/a"),
        used_of(&pool, "tank/b"),
    );
    assert_eq!(after, before, "nothing changed");
    assert_eq!(pool.health(), tarn_pool::status::Health::Online);
    ds::set_prop(&pool, "tank/b", "quota", "10M").unwrap();
    ds::promote(&pool, "tank/b/c").unwrap();
    let moved = used_of(&pool, "tank/b");
    assert!(
        moved > 1 << 20,
        "the snapshot's space moved to tank/b: {moved}"
    );
    assert!(names(&pool).contains(&"tank/b/c@s".to_string()));
    pool.sync().unwrap();
    let s = tarn_testkit::pools::scrub(&pool);
    assert_eq!(s.errors, 0, "{s:?}");
}

/// A snapshot takes nothing out of its dataset's use: the blocks the head
/// shares with it are the dataset's until the head lets go of them, so a
/// quota cannot be passed by taking snapshots between writes, and `used`
/// is what destroying the dataset with its snapshots would free.
#[test]
fn a_snapshot_does_not_take_data_out_of_a_quota() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path());
    ds::create(&pool, "tank/q", &none(), false).unwrap();
    ds::set_prop(&pool, "tank/q", "quota", "1M").unwrap();
    let q = ds::open(&pool, "tank/q").unwrap();
    let mut rng = tarn_testkit::data::Rng::new(10);
    let mut refused = None;
    for round in 0..6u64 {
        let r = (0..5u64).try_for_each(|i| {
            let data = rng.bytes(50_000);
            q.txn::<_, DsError>(true, |t| t.write_block(&key(round * 5 + i), data.clone()))
        });
        if let Err(e) = r {
            refused = Some((round, e));
            break;
        }
        pool.sync().unwrap();
        let used = used_of(&pool, "tank/q");
        snap(&pool, &format!("tank/q@r{round}"));
        pool.sync().unwrap();
        assert_eq!(used_of(&pool, "tank/q"), used, "a snapshot changed used");
    }
    let (round, e) = refused.expect("snapshots let the writes pass the quota");
    assert!(matches!(e, DsError::Quota(_)), "{e}");
    assert!(round < 5, "{round}");
    assert!(used_of(&pool, "tank/q") <= 1 << 20);
}
