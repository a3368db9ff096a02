//! Writes into part of a data block (`Txn::patch_block`), checked against a
//! model: random patches (some all zeros, some growing the block), whole
//! writes and deletes of a few keys; readers that took a block before it
//! was patched again and must keep reading the bytes they took; failing
//! transactions (one of them holding a reference to the patched bytes when
//! it fails) that must leave nothing behind; `fsync`, txg syncs and crashes
//! after which the intent log's replay must give back exactly the state of
//! the last `fsync` or sync; changes of `copies`, after which every block
//! written (patched in place or not) must have that many copies once its
//! txg commits. A leak check at the end proves the rooms of grown,
//! replaced and rolled-back blocks all came back.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use tarn_dataset::{self as ds, BlockRef, DatasetHandle, DsError};
use tarn_pool::Pool;
use tarn_testkit::data::{cases, pattern};
use tarn_testkit::datasets::handle;
use tarn_testkit::pools;
use tarn_vdev::VdevKind;

type Model = BTreeMap<u64, Vec<u8>>;

const KEYS: u64 = 4;
const MAX: usize = 1 << 20;

#[derive(Clone, Debug)]
enum Op {
    Patch {
        key: u64,
        len: usize,
        off: usize,
        n: usize,
        seed: u64,
        zeros: bool,
    },
    Write {
        key: u64,
        len: usize,
        seed: u64,
    },
    Delete {
        key: u64,
    },
    /// Take a reference to the block, to read after later changes.
    Hold {
        key: u64,
    },
    /// Read every held reference and let them go.
    ReadHeld,
    /// A transaction that patches `key` (and grows it to the largest
    /// block), rewrites `other`, takes a reference to the patched bytes
    /// (if `hold`) and fails.
    Failing {
        key: u64,
        other: u64,
        off: usize,
        n: usize,
        seed: u64,
        hold: bool,
    },
    Fsync,
    Sync,
    Crash,
    /// Set the `copies` property (a property change commits the txg
    /// first, and itself): blocks written after it, in place or not, must
    /// have as many copies.
    Copies {
        n: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![Just(0usize), Just(4096), Just(MAX), 1..MAX];
    let small = prop_oneof![Just(1usize), Just(512), Just(4096), 1..MAX / 4];
    prop_oneof![
        8 => (0..KEYS, size.clone(), size.clone(), small.clone(), any::<u64>(), prop::bool::weighted(0.15))
            .prop_map(|(key, len, off, n, seed, zeros)| {
                let off = off.min(MAX - 1);
                Op::Patch { key, len, off, n: n.min(MAX - off), seed, zeros }
            }),
        2 => (0..KEYS, 1..MAX, any::<u64>()).prop_map(|(key, len, seed)| Op::Write { key, len, seed }),
        1 => (0..KEYS).prop_map(|key| Op::Delete { key }),
        2 => (0..KEYS).prop_map(|key| Op::Hold { key }),
        1 => Just(Op::ReadHeld),
        1 => (0..KEYS, 0..KEYS, size, small, any::<u64>(), any::<bool>())
            .prop_map(|(key, other, off, n, seed, hold)| {
                let off = off.min(MAX - 1);
                Op::Failing { key, other, off, n: n.min(MAX - off), seed, hold }
            }),
        2 => Just(Op::Fsync),
        1 => Just(Op::Sync),
        1 => Just(Op::Crash),
        1 => (1..=2u8).prop_map(|n| Op::Copies { n }),
    ]
}

/// Why a transaction of the test failed.
enum Fail {
    Ds(DsError),
    /// On purpose, holding a reference to patched bytes (or not).
    Deliberate(#[allow(dead_code)] Option<Box<BlockRef>>),
}

impl From<DsError> for Fail {
    fn from(e: DsError) -> Self {
        Fail::Ds(e)
    }
}

fn key(k: u64) -> Vec<u8> {
    let mut v = b"blk".to_vec();
    v.extend_from_slice(&k.to_be_bytes());
    v
}

/// What a patch does, in the model: the block (absent: empty) extended to
/// `len`, `bytes` at `off`; all zeros is a hole. Returns (before, after).
fn model_patch(m: &mut Model, k: u64, len: usize, off: usize, bytes: &[u8]) -> (usize, usize) {
    let mut data = m.get(&k).cloned().unwrap_or_default();
    let before = data.len();
    let end = off + bytes.len();
    if data.len() < len.max(end) {
        data.resize(len.max(end), 0);
    }
    data[off..end].copy_from_slice(bytes);
    if data.iter().all(|&b| b == 0) {
        m.remove(&k);
        (before, 0)
    } else {
        let after = data.len();
        m.insert(k, data);
        (before, after)
    }
}

fn brief(v: Option<&[u8]>) -> Option<(usize, String)> {
    v.map(|v| (v.len(), blake3::hash(v).to_hex()[..16].to_string()))
}

fn check_all(h: &DatasetHandle, model: &Model, when: &str) {
    for k in 0..KEYS {
        let got = h.txn(false, |t| t.read_block(&key(k))).unwrap();
        let want = model.get(&k);
        assert!(
            got.as_ref() == want,
            "key {k} {when}: read {:?}, expected {:?}",
            brief(got.as_deref()),
            brief(want.map(Vec::as_slice))
        );
    }
}

/// Notes the `copies` a patch of `k` wrote with, when it wrote anything.
fn note_write(written: &mut BTreeMap<u64, u8>, model: &Model, k: u64, copies: u8, wrote: bool) {
    if !model.contains_key(&k) {
        written.remove(&k);
    } else if wrote {
        written.insert(k, copies);
    }
}

/// Every committed block has the copies it was written with.
fn check_copies(h: &DatasetHandle, written: &BTreeMap<u64, u8>, when: &str) {
    let blocks = h.committed_blocks(&key(0), &key(KEYS)).unwrap();
    assert_eq!(blocks.len(), written.len(), "{when}: committed blocks");
    for (k, bp) in blocks {
        let i = u64::from_be_bytes(k[3..11].try_into().unwrap());
        assert_eq!(
            bp.used_dvas().count(),
            written[&i] as usize,
            "{when}: copies of key {i}"
        );
    }
}

fn open_pool(dir: &Path) -> (Arc<Pool>, DatasetHandle) {
    let pool = pools::attached(pools::import(dir, "tank"));
    let h = ds::open(&pool, "tank/a").unwrap();
    (pool, h)
}

fn run(ops: &[Op]) {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = pools::attached(pools::tank(
        dir.path(),
        VdevKind::Raidz { parity: 1 },
        3,
        64 << 20,
    ));
    let mut h = handle(&pool, "tank/a", &[("compression", "off")]);
    let mut model = Model::new();
    let mut durable = Model::new();
    let mut held: Vec<(u64, Vec<u8>, BlockRef)> = Vec::new();
    // The `copies` each key's block was last written with.
    let mut copies = 1u8;
    let mut written: BTreeMap<u64, u8> = BTreeMap::new();
    let mut durable_written = written.clone();
    for (i, op) in ops.iter().enumerate() {
        let when = format!("after op {i} {op:?}");
        match op {
            Op::Patch {
                key: k,
                len,
                off,
                n,
                seed,
                zeros,
            } => {
                let bytes = if *zeros {
                    vec![0; *n]
                } else {
                    pattern(*seed, *n)
                };
                let got = h
                    .txn(true, |t| t.patch_block(&key(*k), *len, *off, bytes.clone()))
                    .unwrap();
                let want = model_patch(&mut model, *k, *len, *off, &bytes);
                assert_eq!(got, want, "{when}: lengths before and after");
                note_write(&mut written, &model, *k, copies, want != (0, 0));
            }
            Op::Write { key: k, len, seed } => {
                let data = pattern(*seed, *len);
                h.txn(true, |t| t.write_block(&key(*k), data.clone()))
                    .unwrap();
                model.insert(*k, data);
                written.insert(*k, copies);
            }
            Op::Delete { key: k } => {
                h.txn(true, |t| t.delete(&key(*k))).unwrap();
                model.remove(k);
                written.remove(k);
            }
            Op::Hold { key: k } => {
                if let Some(r) = h.txn(false, |t| t.block_ref(&key(*k))).unwrap() {
                    let want = model.get(k).cloned().expect("model has a held block");
                    held.push((*k, want, r));
                } else {
                    assert!(!model.contains_key(k), "{when}: block missing");
                }
            }
            Op::ReadHeld => {
                for (k, want, r) in held.drain(..) {
                    let got = r.read(&pool).unwrap();
                    assert!(
                        &got[..] == want.as_slice(),
                        "{when}: a reader of key {k} saw {:?}, took {:?}",
                        brief(Some(&got[..])),
                        brief(Some(want.as_slice()))
                    );
                }
            }
            Op::Failing {
                key: k,
                other,
                off,
                n,
                seed,
                hold,
            } => {
                let bytes = pattern(*seed, *n);
                let r = h.txn(true, |t| -> Result<(), Fail> {
                    // A patch that leaves a block of this txg only the
                    // overlay holds, then one that grows it in place to
                    // the largest block (new room, undone with the rest).
                    let at = (*off).max(1);
                    t.patch_block(&key(*k), 0, at, bytes[..bytes.len().min(MAX - at)].to_vec())?;
                    t.patch_block(&key(*k), MAX, 0, vec![7])?;
                    t.write_block(&key(*other), pattern(!*seed, 5000))?;
                    t.patch_block(&key(*other), 9000, 100, bytes.clone())?;
                    let r = if *hold {
                        t.block_ref(&key(*k))?.map(Box::new)
                    } else {
                        None
                    };
                    Err(Fail::Deliberate(r))
                });
                match r {
                    Err(Fail::Deliberate(_)) => {}
                    Err(Fail::Ds(e)) => panic!("{when}: the failing transaction failed early: {e}"),
                    Ok(()) => panic!("{when}: the failing transaction succeeded"),
                }
                check_all(&h, &model, &when);
            }
            Op::Fsync => {
                h.sync().unwrap();
                durable = model.clone();
                durable_written = written.clone();
            }
            Op::Sync => {
                pool.sync().unwrap();
                durable = model.clone();
                durable_written = written.clone();
                check_copies(&h, &written, &when);
            }
            Op::Copies { n } => {
                ds::set_prop(&pool, "tank/a", "copies", &n.to_string()).unwrap();
                copies = *n;
                durable = model.clone();
                durable_written = written.clone();
            }
            Op::Crash => {
                held.clear();
                drop(h);
                pool.abandon();
                drop(pool);
                (pool, h) = open_pool(dir.path());
                model = durable.clone();
                written = durable_written.clone();
                check_all(&h, &model, &when);
            }
        }
    }
    check_all(&h, &model, "at the end");
    for (k, want, r) in held.drain(..) {
        let got = r.read(&pool).unwrap();
        assert!(
            &got[..] == want.as_slice(),
            "a reader of key {k} at the end"
        );
    }
    // Every room given back: what the pool holds is what the tree needs.
    pool.sync().unwrap();
    let leaks = pool.leak_check().unwrap();
    assert!(leaks.is_clean(), "leak check: {leaks:?}");
    drop(h);
    pool.export(false).unwrap();
    let (_pool, h) = open_pool(dir.path());
    check_all(&h, &model, "after import");
}

proptest! {
    #![proptest_config(cases(24))]

    #[test]
    fn patches_match_the_model_through_readers_failures_and_crashes(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        run(&ops);
    }
}
