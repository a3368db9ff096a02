//! The block cache never serves stale bytes: random sequences of writes,
//! deletes, snapshots, rollbacks, snapshot destroys, filling the pool so
//! that freed space is reallocated (and read back), and damage repaired by
//! a scrub (self-heal rewrites),
//! checked after every read against a model of what each key holds. The
//! cache is large enough to keep every block ever read or written, so a
//! stale entry would be found if one could exist; a second run uses a
//! cache small enough to evict all the time.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use tarn_block::BlockCache;
use tarn_dataset::{self as ds, DatasetHandle, DsError};
use tarn_pool::{Pool, PoolOptions};
use tarn_testkit::data::{cases, pattern};
use tarn_testkit::datasets::handle;
use tarn_testkit::files::overwrite;
use tarn_testkit::pools::{self, block_ranges};
use tarn_vdev::VdevKind;

type Model = BTreeMap<u64, Vec<u8>>;

/// First key of the blocks that fill the pool.
const FILL: u64 = 1 << 20;

#[derive(Clone, Debug)]
enum Op {
    Write {
        key: u64,
        seed: u64,
        len: usize,
    },
    Delete {
        key: u64,
    },
    Read {
        key: u64,
    },
    Sync,
    Snapshot,
    Rollback,
    DestroyOldestSnapshot,
    /// Fill the pool with blocks that are read back, then free them, so
    /// every freed extent is reused and read.
    Fill {
        seed: u64,
    },
    /// Damage the first copy of one of the dataset's blocks, then scrub.
    DamageAndScrub {
        pick: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..12u64, any::<u64>(), prop_oneof![Just(4096usize), Just(65536), Just(131072), 1..20_000usize])
            .prop_map(|(key, seed, len)| Op::Write { key, seed, len }),
        1 => (0..12u64).prop_map(|key| Op::Delete { key }),
        4 => (0..12u64).prop_map(|key| Op::Read { key }),
        2 => Just(Op::Sync),
        1 => Just(Op::Snapshot),
        1 => Just(Op::Rollback),
        1 => Just(Op::DestroyOldestSnapshot),
        1 => any::<u64>().prop_map(|seed| Op::Fill { seed }),
        1 => any::<usize>().prop_map(|pick| Op::DamageAndScrub { pick }),
    ]
}

fn key(k: u64) -> Vec<u8> {
    let mut v = b"blk".to_vec();
    v.extend_from_slice(&k.to_be_bytes());
    v
}

fn check(h: &DatasetHandle, k: u64, model: &Model, when: &str) {
    let got = h.txn(false, |t| t.read_block(&key(k))).unwrap();
    let want = model.get(&k);
    // Lengths and a hash in the message: blocks are too long to print.
    let brief =
        |v: Option<&Vec<u8>>| v.map(|v| (v.len(), blake3::hash(v).to_hex()[..16].to_string()));
    assert!(
        got.as_ref() == want,
        "key {k} {when}: read {:?}, expected {:?}",
        brief(got.as_ref()),
        brief(want)
    );
}

fn run(ops: &[Op], cache_bytes: usize) {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(BlockCache::new(cache_bytes));
    let opts = PoolOptions {
        cache: Some(cache.clone()),
        ..pools::opts()
    };
    // A small mirror: freed space is soon reused, and a damaged copy can
    // be repaired from the other.
    let pool: Arc<Pool> = pools::tank_with(dir.path(), VdevKind::Mirror, 2, 64 << 20, opts);
    let mut h = handle(&pool, "tank/a", &[("compression", "off")]);
    let mut model = Model::new();
    let mut snaps: Vec<(String, Model)> = Vec::new();
    let mut made = 0;
    for (i, op) in ops.iter().enumerate() {
        let when = format!("after op {i} {op:?}");
        match op {
            Op::Write { key: k, seed, len } => {
                let data = pattern(*seed, *len);
                h.txn(true, |t| t.write_block(&key(*k), data.clone()))
                    .unwrap();
                model.insert(*k, data);
            }
            Op::Delete { key: k } => {
                h.txn(true, |t| t.delete(&key(*k))).unwrap();
                model.remove(k);
            }
            Op::Read { key: k } => check(&h, *k, &model, &when),
            Op::Sync => {
                pool.sync().unwrap();
            }
            Op::Snapshot => {
                made += 1;
                let name = format!("tank/a@s{made}");
                ds::snapshot(&pool, std::slice::from_ref(&name), false).unwrap();
                snaps.push((name, model.clone()));
            }
            Op::Rollback => {
                if let Some((name, m)) = snaps.last() {
                    ds::rollback(&pool, name, false).unwrap();
                    model = m.clone();
                    h = ds::open(&pool, "tank/a").unwrap();
                }
            }
            Op::DestroyOldestSnapshot => {
                if !snaps.is_empty() {
                    let (name, _) = snaps.remove(0);
                    ds::destroy(&pool, &name, false).unwrap();
                }
            }
            Op::Fill { seed } => {
                // Take every free extent (those of blocks read and freed
                // before among them) with blocks that are read back, then
                // give them back.
                let mut j = 0u64;
                loop {
                    let data = pattern(seed ^ j, 64 << 10);
                    match h.txn(true, |t| t.write_block(&key(FILL + j), data.clone())) {
                        Ok(()) => {
                            model.insert(FILL + j, data);
                            j += 1;
                        }
                        Err(DsError::NoSpace(_)) | Err(DsError::Quota(_)) => break,
                        Err(e) => panic!("{when}: fill {j}: {e}"),
                    }
                    if j.is_multiple_of(32) {
                        pool.sync().unwrap();
                    }
                }
                pool.sync().unwrap();
                for k in FILL..FILL + j {
                    check(&h, k, &model, &when);
                }
                for k in FILL..FILL + j {
                    h.txn(true, |t| t.delete(&key(k))).unwrap();
                    model.remove(&k);
                }
                for _ in 0..3 {
                    h.txn(true, |t| t.put(b"tick", &j.to_be_bytes())).unwrap();
                    pool.sync().unwrap();
                }
            }
            Op::DamageAndScrub { pick } => {
                pool.sync().unwrap();
                let blocks = ds::blocks(&pool, "tank/a").unwrap();
                if blocks.is_empty() {
                    continue;
                }
                let bp = blocks[pick % blocks.len()];
                let (member, off, len) = block_ranges(VdevKind::Mirror, 2, &bp)[0];
                overwrite(
                    &dir.path().join(format!("d{member}")),
                    off,
                    &vec![0x5a; len as usize],
                );
                let scan = pools::scrub(&pool);
                assert_eq!(scan.errors, 0, "{when}: {scan:?}");
            }
        }
    }
    for k in 0..12 {
        check(&h, k, &model, "at the end");
    }
    // And once more from the disks, with the cache of the pool dropped.
    drop(h);
    pool.export(false).unwrap();
    assert_eq!(cache.stats().blocks, 0, "export left blocks of the pool");
    let pool = pools::import(dir.path(), "tank");
    let h = ds::open(&pool, "tank/a").unwrap();
    for k in 0..12 {
        check(&h, k, &model, "after import");
    }
}

proptest! {
    #![proptest_config(cases(12))]

    #[test]
    fn a_cache_that_keeps_everything_is_never_stale(ops in proptest::collection::vec(op(), 1..40)) {
        run(&ops, 256 << 20);
    }

    #[test]
    fn a_cache_that_evicts_all_the_time_is_never_stale(ops in proptest::collection::vec(op(), 1..40)) {
        run(&ops, 1 << 20);
    }
}

/// A block freed by an overwrite leaves the cache at the sync that frees
/// it (its memory goes to blocks that can still be read); a block a
/// snapshot still holds stays, and reads give the new contents.
#[test]
fn freed_blocks_leave_the_cache_and_held_ones_stay() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(BlockCache::new(256 << 20));
    let opts = PoolOptions {
        cache: Some(cache.clone()),
        ..pools::opts()
    };
    let pool: Arc<Pool> = pools::tank_with(dir.path(), VdevKind::Mirror, 2, 64 << 20, opts);
    let h = handle(&pool, "tank/a", &[("compression", "off")]);
    let data_bytes = || cache.bytes_of(tarn_block::BlockKind::Data);
    let (held, freed) = (20_000usize, 30_000usize);
    let mut model = Model::new();
    let write = |model: &mut Model, k: u64, seed: u64, len: usize| {
        let data = pattern(seed, len);
        h.txn(true, |t| t.write_block(&key(k), data.clone()))
            .unwrap();
        model.insert(k, data);
    };
    write(&mut model, 1, 1, held);
    pool.sync().unwrap();
    ds::snapshot(&pool, &["tank/a@s".to_string()], false).unwrap();
    write(&mut model, 2, 2, freed);
    pool.sync().unwrap();
    check(&h, 1, &model, "before the overwrite");
    check(&h, 2, &model, "before the overwrite");
    assert_eq!(data_bytes(), (held + freed) as u64, "both blocks read once");
    write(&mut model, 1, 3, held);
    write(&mut model, 2, 4, freed);
    pool.sync().unwrap();
    assert_eq!(
        data_bytes(),
        held as u64,
        "the block only the head held is still cached after it was freed"
    );
    check(&h, 1, &model, "after the overwrite");
    check(&h, 2, &model, "after the overwrite");
    // The snapshot's block is still there, and still read from memory.
    let snap = ds::open(&pool, "tank/a@s").unwrap();
    let misses = cache.stats().data_misses;
    let got = snap.txn(false, |t| t.read_block(&key(1))).unwrap();
    assert_eq!(got.as_deref(), Some(&pattern(1, held)[..]));
    assert_eq!(
        cache.stats().data_misses,
        misses,
        "the held block was evicted"
    );
}
