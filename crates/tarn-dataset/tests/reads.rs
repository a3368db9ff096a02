//! Reads outside the dataset lock: a block found by one transaction must
//! read back as it was, whatever the dataset and the pool do before the
//! read, and a read that fails must still be reported as damage.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tarn_dataset::{self as ds, DsError};
use tarn_pool::Pool;
use tarn_testkit::data::pattern as noise;
use tarn_testkit::pools;
use tarn_vdev::VdevKind;

/// Pool `tank` on one member file of `size` bytes, and that file.
fn new_pool(dir: &Path, size: u64) -> (Arc<Pool>, PathBuf) {
    (pools::tank(dir, VdevKind::Single, 1, size), dir.join("d0"))
}

fn key(i: u64) -> Vec<u8> {
    let mut k = b"k".to_vec();
    k.extend_from_slice(&i.to_be_bytes());
    k
}

/// Writes 64 KiB blocks until the pool refuses, syncing as it goes, so
/// every extent that can be reused is.
fn fill(pool: &Pool, h: &ds::DatasetHandle, from: u64) -> u64 {
    let mut i = from;
    loop {
        match h.txn(true, |t| t.write_block(&key(i), noise(i, 64 << 10))) {
            Ok(()) => i += 1,
            Err(DsError::NoSpace(_)) | Err(DsError::Quota(_)) => break,
            Err(e) => panic!("write {i}: {e}"),
        }
        if i.is_multiple_of(32) {
            pool.sync().unwrap();
        }
    }
    pool.sync().unwrap();
    i
}

#[test]
fn a_found_block_reads_as_it_was_after_its_space_was_freed_and_the_pool_filled() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _) = new_pool(dir.path(), 96 << 20);
    let h = ds::open(&pool, "tank").unwrap();
    let old = noise(1, 64 << 10);
    h.txn(true, |t| t.write_block(&key(0), old.clone()))
        .unwrap();
    pool.sync().unwrap();

    let found = h
        .txn(false, |t| t.block_ref(&key(0)))
        .unwrap()
        .expect("the block is there");
    assert_eq!(found.len(), old.len());

    // Replace and then delete the block, commit enough txgs for a deferred
    // free to come back, then take every free extent of the pool.
    h.txn(true, |t| t.write_block(&key(0), noise(2, 64 << 10)))
        .unwrap();
    pool.sync().unwrap();
    h.txn(true, |t| t.delete(&key(0))).unwrap();
    for _ in 0..4 {
        pool.sync().unwrap();
        h.txn(true, |t| t.put(b"tick", b"x")).unwrap();
    }
    let end = fill(&pool, &h, 1);
    assert!(end > 100, "the pool took only {end} blocks");

    // The block was never reused: it reads back, and nothing was damaged.
    let got = found.read(&pool).unwrap();
    assert!(*got == old[..], "the held block changed under its reader");
    assert!(pool.status().damaged.is_empty());

    // Once the reader is gone, the next syncs give its space back.
    let held = pool.list_entry().allocated;
    drop(got);
    for _ in 0..3 {
        h.txn(true, |t| t.put(b"tick", b"y")).unwrap();
        pool.sync().unwrap();
    }
    let after = pool.list_entry().allocated;
    assert!(
        after + (64 << 10) <= held,
        "the freed block's space never came back: {held} then {after}"
    );
}

#[test]
fn a_staged_block_reads_as_it_was_after_it_was_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _) = new_pool(dir.path(), 64 << 20);
    let h = ds::open(&pool, "tank").unwrap();
    let old = noise(7, 10_000);
    h.txn(true, |t| t.write_block(&key(0), old.clone()))
        .unwrap();
    let found = h.txn(false, |t| t.block_ref(&key(0))).unwrap().unwrap();
    h.txn(true, |t| t.write_block(&key(0), noise(8, 10_000)))
        .unwrap();
    pool.sync().unwrap();
    assert!(*found.read(&pool).unwrap() == old[..]);
    assert!(h.txn(false, |t| t.block_ref(b"absent")).unwrap().is_none());
    h.txn(true, |t| t.put(b"plain", b"v")).unwrap();
    assert!(matches!(
        h.txn(false, |t| t.block_ref(b"plain")),
        Err(DsError::Invalid(_))
    ));
}

#[test]
fn a_block_that_does_not_verify_outside_the_lock_is_reported_as_damage() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, _) = new_pool(dir.path(), 64 << 20);
    let h = ds::open(&pool, "tank").unwrap();
    h.txn(true, |t| t.write_block(&key(3), noise(3, 32 << 10)))
        .unwrap();
    pool.sync().unwrap();
    let found = h.txn(false, |t| t.block_ref(&key(3))).unwrap().unwrap();
    // Every read of the device now returns flipped bits.
    let leaf = tarn_vdev::fault::find_device(&dir.path().join("d0")).expect("the pool's leaf");
    leaf.inject(tarn_vdev::fault::Fault::always(
        tarn_vdev::fault::FaultKind::Bitflip,
    ));
    // A single device has one copy of data: nothing to heal from.
    match found.read(&pool) {
        Err(DsError::Damaged(m)) => assert!(m.contains("dataset tank"), "{m}"),
        Ok(_) => panic!("bad bytes were served"),
        Err(e) => panic!("unexpected error: {e}"),
    }
    leaf.clear();
    let damaged = pool.status().damaged;
    assert!(
        damaged
            .iter()
            .any(|d| d.starts_with("dataset tank: block at key")),
        "{damaged:?}"
    );
}
