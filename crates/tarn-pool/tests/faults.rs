//! Drills with injected device faults on a live pool of real files: flipped
//! bits and silently dropped writes are found and repaired from parity,
//! a vanished device leaves the pool serving, and nothing wrong is ever
//! returned.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tarn_pool::{Pool, VdevSpec};
use tarn_testkit::blobs::Blobs;
use tarn_testkit::data::pattern as data;
use tarn_testkit::files::make as make_files;
use tarn_testkit::pools::{opts, scrub};
use tarn_vdev::{Fault, FaultKind, VdevKind};

fn files(dir: &Path, n: usize) -> Vec<PathBuf> {
    make_files(dir, "d", n, 64 << 20)
}

/// A pool `tank` on a mirror of two files in `dir`, uncompressed.
fn mirror(dir: &Path) -> (Arc<Pool>, Vec<PathBuf>) {
    let devs = files(dir, 2);
    let spec = VdevSpec {
        kind: VdevKind::Mirror,
        devices: devs.clone(),
    };
    let mut props = BTreeMap::new();
    props.insert("compression".to_string(), "off".to_string());
    let pool = Pool::create("tank", &[spec], 12, &props, false, opts()).unwrap();
    (pool, devs)
}

fn check_all(pool: &Arc<Pool>, objs: &BTreeMap<String, Vec<u8>>) {
    for (name, want) in objs {
        let got = pool.object_read(name, 0, want.len() + 1).unwrap();
        assert!(got == *want, "object {name} differs");
    }
}

#[test]
fn injected_faults_are_survived_and_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let devs = files(dir.path(), 4);
    let spec = VdevSpec {
        kind: VdevKind::Raidz { parity: 1 },
        devices: devs.clone(),
    };
    let mut props = BTreeMap::new();
    props.insert("compression".to_string(), "off".to_string());
    let pool = Pool::create("tank", &[spec], 12, &props, false, opts()).unwrap();
    let dev1 = devs[1].to_str().unwrap();
    let dev2 = devs[2].to_str().unwrap();
    let mut objs = BTreeMap::new();
    for i in 0..6u64 {
        let d = data(i, 300_000 + i as usize * 10_000);
        pool.object_write(&format!("o{i}"), 0, &d, false).unwrap();
        objs.insert(format!("o{i}"), d);
    }
    pool.sync().unwrap();

    // Every read of one member returns a flipped bit: reads are still right
    // (reconstructed from parity) and the member's checksum errors count.
    pool.inject(dev1, Some(Fault::always(FaultKind::Bitflip)))
        .unwrap();
    check_all(&pool, &objs);
    let leaf = tarn_vdev::find_device(&devs[1]).unwrap();
    assert!(leaf.injected() > 0, "the fault was hit");
    assert!(pool.inject(dev1, None).unwrap().is_empty());

    // Writes to one member silently vanish: the data still reads right, and
    // a scrub finds and rewrites what the member lacks.
    pool.inject(dev2, Some(Fault::always(FaultKind::DropWrite)))
        .unwrap();
    for i in 6..10u64 {
        let d = data(i, 200_000);
        pool.object_write(&format!("o{i}"), 0, &d, false).unwrap();
        objs.insert(format!("o{i}"), d);
    }
    pool.sync().unwrap();
    pool.inject(dev2, None).unwrap();
    check_all(&pool, &objs);
    let s = scrub(&pool);
    assert!(
        s.repaired_bytes > 0,
        "the dropped writes were repaired: {s:?}"
    );
    assert_eq!(s.errors, 0);
    let s = scrub(&pool);
    assert_eq!(
        (s.repaired_bytes, s.errors),
        (0, 0),
        "a second scrub is clean"
    );

    // A member that vanishes: the pool keeps serving every byte and accepts
    // writes within its redundancy.
    pool.inject(dev1, Some(Fault::always(FaultKind::Vanish)))
        .unwrap();
    check_all(&pool, &objs);
    let d = data(99, 100_000);
    pool.object_write("late", 0, &d, false).unwrap();
    pool.sync().unwrap();
    objs.insert("late".into(), d);
    check_all(&pool, &objs);
    // Unknown devices are refused with a clear error.
    assert!(pool.inject("/nonexistent", None).is_err());
    pool.export(false).unwrap();
}

/// A member whose cache flush fails lost what the txg wrote to it (a disk
/// drops the pages whose write-back failed): the pool notes that it lacks
/// that txg, so bringing it back resilvers it, and it can then stand alone.
#[test]
fn a_member_whose_flush_failed_is_resilvered_for_what_it_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, devs) = mirror(dir.path());
    let (dev0, dev1) = (devs[0].to_str().unwrap(), devs[1].to_str().unwrap());
    let mut objs = BTreeMap::new();
    for i in 0..3u64 {
        let d = data(i, 200_000);
        pool.object_write(&format!("o{i}"), 0, &d, false).unwrap();
        objs.insert(format!("o{i}"), d);
    }
    pool.sync().unwrap();
    let leaf = tarn_vdev::find_device(&devs[1]).unwrap();
    leaf.track_unflushed(true);
    pool.inject(dev1, Some(Fault::always(FaultKind::FlushError)))
        .unwrap();
    let d = data(7, 300_000);
    pool.object_write("late", 0, &d, false).unwrap();
    objs.insert("late".into(), d);
    pool.sync().expect("one member flushed: the txg commits");
    assert!(leaf.injected() > 0, "the fault was hit");
    pool.inject(dev1, None).unwrap();
    leaf.track_unflushed(false);
    check_all(&pool, &objs);
    // Back in service: the resilver covers the txg it lost.
    pool.clear(Some(dev1)).unwrap();
    let s = tarn_testkit::pools::wait_scan(&pool);
    assert_eq!(s.errors, 0, "{s:?}");
    pool.offline(dev0).unwrap();
    check_all(&pool, &objs);
    pool.export(false).unwrap();
}

/// A txg whose blocks missed one side of a mirror (a failed write) while
/// the other side's flush failed is on neither side: the sync fails (the
/// pool stops at the txg before) instead of committing it as durable.
#[test]
fn a_txg_on_no_side_of_a_mirror_is_not_committed() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, devs) = mirror(dir.path());
    let (dev0, dev1) = (devs[0].to_str().unwrap(), devs[1].to_str().unwrap());
    let mut objs = BTreeMap::new();
    let d = data(1, 50_000);
    pool.object_write("o1", 0, &d, false).unwrap();
    objs.insert("o1".to_string(), d);
    pool.sync().unwrap();
    // The data region only: the labels, and the uberblocks in them, are
    // written as before.
    let data_region = Fault {
        range: Some((tarn_vdev::DATA_START, 48 << 20)),
        ..Fault::always(FaultKind::WriteError)
    };
    pool.inject(dev0, Some(data_region)).unwrap();
    pool.inject(dev1, Some(Fault::always(FaultKind::FlushError)))
        .unwrap();
    pool.object_write("o2", 0, &data(2, 5_000), false).unwrap();
    let r = pool.sync();
    let leaf0 = tarn_vdev::find_device(&devs[0]).unwrap();
    assert!(leaf0.injected() > 0, "the write fault was hit");
    assert!(r.is_err(), "a txg on neither side was committed");
    pool.inject(dev0, None).unwrap();
    pool.inject(dev1, None).unwrap();
    let _ = pool.export(false);
    drop(pool);
    // What was committed before is all there.
    let pool = tarn_testkit::pools::import(dir.path(), "tank");
    check_all(&pool, &objs);
    pool.export(false).unwrap();
}

/// A resilver's repairs are flushed before its target is trusted again: a
/// target whose flush fails at the end (its rebuilt columns may be gone)
/// keeps what it missed on record instead of being declared complete.
#[test]
fn a_resilver_target_whose_last_flush_fails_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, devs) = mirror(dir.path());
    let dev1 = devs[1].to_str().unwrap();
    pool.offline(dev1).unwrap();
    let mut objs = BTreeMap::new();
    for i in 0..4u64 {
        let d = data(i, 100_000);
        pool.object_write(&format!("o{i}"), 0, &d, false).unwrap();
        objs.insert(format!("o{i}"), d);
    }
    pool.sync().unwrap();
    // The resilver reads slowly from the other side, so that the fault
    // below is in place before it writes its repairs, which the flush at
    // its end then drops.
    let dev0 = devs[0].to_str().unwrap();
    let slow = Fault {
        latency_ms: 100,
        ..Fault::always(FaultKind::Latency)
    };
    pool.inject(dev0, Some(slow)).unwrap();
    pool.online(dev1).unwrap();
    let leaf = tarn_vdev::find_device(&devs[1]).unwrap();
    leaf.track_unflushed(true);
    pool.inject(dev1, Some(Fault::always(FaultKind::FlushError)))
        .unwrap();
    let s = tarn_testkit::pools::wait_scan(&pool);
    pool.inject(dev0, None).unwrap();
    assert!(
        s.errors > 0,
        "the resilver trusted a target that lost its repairs: {s:?}"
    );
    assert!(leaf.injected() > 0, "the flush fault was hit");
    pool.inject(dev1, None).unwrap();
    leaf.track_unflushed(false);
    check_all(&pool, &objs);
}

/// Blocks of one txg that missed different sides of a mirror (a few
/// failed writes on each, no flush failing) are each on the other side:
/// the txg commits, and everything reads back.
#[test]
fn misses_on_different_sides_of_a_mirror_still_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, devs) = mirror(dir.path());
    let (dev0, dev1) = (devs[0].to_str().unwrap(), devs[1].to_str().unwrap());
    let at = |mib: u64| tarn_vdev::DATA_START + (mib << 20);
    let region = |from: u64| Fault {
        range: Some((at(from), at(from) + (256 << 10))),
        ..Fault::always(FaultKind::WriteError)
    };
    pool.inject(dev0, Some(region(1))).unwrap();
    pool.inject(dev1, Some(region(6))).unwrap();
    let mut objs = BTreeMap::new();
    for i in 0..12u64 {
        let d = data(i + 40, 1 << 20);
        pool.object_write(&format!("m{i}"), 0, &d, false).unwrap();
        objs.insert(format!("m{i}"), d);
    }
    pool.sync().expect("each block is on one side");
    let hit: Vec<u64> = devs
        .iter()
        .map(|d| tarn_vdev::find_device(d).unwrap().injected())
        .collect();
    assert!(
        hit.iter().all(|h| *h > 0),
        "both sides missed writes: {hit:?}"
    );
    pool.inject(dev0, None).unwrap();
    pool.inject(dev1, None).unwrap();
    check_all(&pool, &objs);
    pool.export(false).unwrap();
    let pool = tarn_testkit::pools::import(dir.path(), "tank");
    check_all(&pool, &objs);
    pool.export(false).unwrap();
}
