//! Nothing in open context waits for a txg sync: with the sync stopped in
//! the middle of its device writes (a write gate on the data device),
//! reads of cached and of committed data, new writes within the dirty
//! limit, and an `fsync` of another dataset (through a log device) all
//! complete before the gate opens. Each check fails by timing out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tarn_dataset::{self as ds, DatasetHandle};
use tarn_pool::{Pool, VdevSpec};
use tarn_testkit::data::pattern as noise;
use tarn_testkit::gates::{within, LONG};
use tarn_testkit::pools;
use tarn_vdev::fault::{find_device, Fault, FaultKind, FaultLeaf, WriteGate};
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

/// A sync of `pool`, started on its own thread and stopped at its first
/// write to the data device at `data` (held at the returned gate).
type HeldSync = (
    Arc<WriteGate>,
    Arc<FaultLeaf>,
    std::thread::JoinHandle<Result<u64, tarn_pool::PoolError>>,
);

fn hold_sync(pool: &Arc<Pool>, data: &Path) -> HeldSync {
    let gate = WriteGate::new();
    let leaf = find_device(data).expect("the data device");
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
    (gate, leaf, syncer)
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
    let (gate, leaf, syncer) = hold_sync(&pool, &data);

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
    let (gate, leaf, syncer) = hold_sync(&pool, &data);
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

/// Bytes written to the pool's data devices so far.
fn written(pool: &Pool) -> u64 {
    pool.status()
        .vdevs
        .iter()
        .map(|v| v.counters.write_bytes)
        .sum()
}

/// Without a log device, an fsync that finds at least
/// [`ds::WAIT_SYNC_BYTES`] of its dataset's data in the txg being synced
/// waits for that sync instead of writing the data into the log a second
/// time; what the open txg holds is logged, and survives a crash.
#[test]
fn an_fsync_behind_a_large_sync_waits_for_it_rather_than_logging_its_data_again() {
    const BLOCK: usize = 128 << 10;
    let dir = tempfile::tempdir().unwrap();
    let pool = pools::tank(dir.path(), VdevKind::Single, 1, 256 << 20);
    ds::create(&pool, "tank/a", &BTreeMap::new(), false).unwrap();
    let a = ds::open(&pool, "tank/a").unwrap();
    pool.sync().unwrap();
    let n = (2 * ds::WAIT_SYNC_BYTES / BLOCK) as u64;
    for i in 0..n {
        a.txn(true, |t| t.write_block(&key(i), noise(i, BLOCK)))
            .unwrap();
    }
    let before = written(&pool);
    let (gate, leaf, syncer) = hold_sync(&pool, &dir.path().join("d0"));
    a.txn(true, |t| t.write_block(&key(n), noise(n, 4096)))
        .unwrap();
    let fsync = {
        let a = a.clone();
        std::thread::spawn(move || a.sync())
    };
    // Time to look at what it would log (it can log nothing while the
    // gate is closed, waiting or not).
    std::thread::sleep(Duration::from_millis(300));
    gate.open();
    syncer.join().unwrap().unwrap();
    fsync.join().unwrap().unwrap();
    leaf.attach_gate(None);
    let wrote = written(&pool) - before;
    let data = n * BLOCK as u64;
    assert!(
        wrote < data + data / 2,
        "the sync and the fsync wrote {wrote} bytes for {data} bytes of data: the fsync \
         logged the syncing txg's data again"
    );
    pool.abandon();
    drop((a, pool));
    let pool =
        pools::attached(pools::try_import(&[dir.path()], "tank", true, pools::opts()).unwrap());
    let a = ds::open(&pool, "tank/a").unwrap();
    assert_eq!(
        read(&a, n).as_deref(),
        Some(&noise(n, 4096)[..]),
        "the fsynced write"
    );
    for i in 0..n {
        assert_eq!(read(&a, i).unwrap(), noise(i, BLOCK), "synced block {i}");
    }
}
