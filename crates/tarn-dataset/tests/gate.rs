//! Nothing in open context waits for a txg sync: with the sync stopped in
//! the middle of its device writes (a write gate on the data device),
//! reads of cached and of committed data, new writes within the dirty
//! limit, and an `fsync` of another dataset (through a log device) all
//! complete before the gate opens. Each check fails by timing out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tarn_dataset::{self as ds, DatasetHandle};
use tarn_pool::{Pool, VdevSpec};
use tarn_testkit::data::pattern as noise;
use tarn_testkit::gates::{within, LONG};
use tarn_testkit::pools;
use tarn_vdev::fault::{find_device, Fault, FaultKind, WriteGate};
use tarn_vdev::VdevKind;

/// Pool `tank` on a data file `d0` with a log device, and the data file.
fn pool_with_log(dir: &Path) -> (Arc<Pool>, PathBuf) {
    let pool = pools::tank(dir, VdevKind::Single, 1, 256 << 20);
    let log = tarn_testkit::files::make(dir, "log", 1, 64 << 20);
    let spec = VdevSpec {
        kind: VdevKind::Single,
        devices: log,
    };
    pool.add_log(&spec, false).unwrap();
    (pool, dir.join("d0"))
}

fn key(i: u64) -> Vec<u8> {
    let mut k = b"k".to_vec();
    k.extend_from_slice(&i.to_be_bytes());
    k
}

fn read(h: &DatasetHandle, i: u64) -> Option<Vec<u8>> {
    h.txn(false, |t| t.read_block(&key(i))).unwrap()
}

#[test]
fn open_context_goes_on_while_a_sync_is_held_at_its_device_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, data) = pool_with_log(dir.path());
    let none = BTreeMap::new();
    ds::create(&pool, "tank/a", &none, false).unwrap();
    ds::create(&pool, "tank/b", &none, false).unwrap();
    let a = ds::open(&pool, "tank/a").unwrap();
    let b = ds::open(&pool, "tank/b").unwrap();

    // Committed data in a: block 1 read once (cached), block 2 never read.
    a.txn(true, |t| t.write_block(&key(1), noise(1, 128 << 10)))
        .unwrap();
    a.txn(true, |t| t.write_block(&key(2), noise(2, 128 << 10)))
        .unwrap();
    pool.sync().unwrap();
    assert_eq!(read(&a, 1).unwrap(), noise(1, 128 << 10));

    // A large txg in b, then its sync, stopped at its first device write.
    for i in 0..64 {
        b.txn(true, |t| t.write_block(&key(i), noise(100 + i, 128 << 10)))
            .unwrap();
    }
    let gate = WriteGate::new();
    let leaf = find_device(&data).expect("the data device");
    leaf.attach_gate(Some(gate.clone()));
    gate.close();
    let syncer = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.sync())
    };
    assert!(
        gate.wait_for_waiter(LONG),
        "the sync never reached the device"
    );

    // Reads: cached, and committed but not cached (read from the device).
    let a2 = a.clone();
    within(&gate, "a cached read", move || {
        assert_eq!(read(&a2, 1).unwrap(), noise(1, 128 << 10))
    });
    let a2 = a.clone();
    within(&gate, "a read from the device", move || {
        assert_eq!(read(&a2, 2).unwrap(), noise(2, 128 << 10))
    });
    // Reads of the txg being synced, in the dataset being synced.
    let b2 = b.clone();
    within(&gate, "a read of the syncing txg", move || {
        assert_eq!(read(&b2, 5).unwrap(), noise(105, 128 << 10))
    });
    // New writes, in both datasets, and an fsync of the other one.
    let (a2, b2) = (a.clone(), b.clone());
    within(&gate, "a write and an fsync", move || {
        a2.txn(true, |t| t.write_block(&key(3), noise(3, 128 << 10)))
            .unwrap();
        a2.txn(true, |t| t.put(b"small", b"value")).unwrap();
        b2.txn(true, |t| t.write_block(&key(500), noise(500, 4096)))
            .unwrap();
        a2.sync().unwrap();
    });
    // All of that happened while the sync was still held.
    assert!(gate.waiting() > 0, "the sync was not held any more");
    assert!(!syncer.is_finished());

    gate.open();
    let txg = syncer.join().unwrap().unwrap();
    assert!(txg > 0);
    leaf.attach_gate(None);
    pool.sync().unwrap();

    // Everything is there after an export and import.
    drop((a, b));
    pool.export(false).unwrap();
    let pool = pools::import(dir.path(), "tank");
    let a = ds::open(&pool, "tank/a").unwrap();
    let b = ds::open(&pool, "tank/b").unwrap();
    for i in 1..=3 {
        assert_eq!(read(&a, i).unwrap(), noise(i, 128 << 10), "a/{i}");
    }
    for i in 0..64 {
        assert_eq!(read(&b, i).unwrap(), noise(100 + i, 128 << 10), "b/{i}");
    }
    assert_eq!(read(&b, 500).unwrap(), noise(500, 4096));
}

#[test]
fn an_fsync_lands_in_the_log_while_the_sync_is_held_and_replays_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, data) = pool_with_log(dir.path());
    ds::create(&pool, "tank/a", &BTreeMap::new(), false).unwrap();
    let a = ds::open(&pool, "tank/a").unwrap();
    for i in 0..16 {
        a.txn(true, |t| t.write_block(&key(i), noise(i, 64 << 10)))
            .unwrap();
    }
    let gate = WriteGate::new();
    let leaf = find_device(&data).expect("the data device");
    leaf.attach_gate(Some(gate.clone()));
    gate.close();
    let syncer = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.sync())
    };
    assert!(gate.wait_for_waiter(LONG));
    // The txg being synced (0..16) and a new write (16), made durable by
    // the log while the sync cannot finish.
    let a2 = a.clone();
    within(&gate, "an fsync", move || {
        a2.txn(true, |t| t.write_block(&key(16), noise(16, 64 << 10)))
            .unwrap();
        a2.sync().unwrap();
    });
    // The data device dies before the held sync lands anything: the sync
    // fails, and the pool is let go as after a crash.
    leaf.inject(Fault::always(FaultKind::Vanish));
    gate.open();
    assert!(syncer.join().unwrap().is_err(), "the sync landed");
    pool.abandon();
    drop((a, pool));
    let pool =
        pools::attached(pools::try_import(&[dir.path()], "tank", true, pools::opts()).unwrap());
    let a = ds::open(&pool, "tank/a").unwrap();
    for i in 0..=16 {
        assert_eq!(
            read(&a, i).as_deref(),
            Some(&noise(i, 64 << 10)[..]),
            "block {i} was acknowledged by fsync and lost"
        );
    }
}
