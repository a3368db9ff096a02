//! Dataset-layer tests on a real pool of files: properties, persistence,
//! transactions that fail, and space accounting checked against an
//! independent computation from the trees' block sets.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;

use proptest::prelude::*;
use tarn_block::BlockPtr;
use tarn_dataset::{self as ds, DsError, Source, Value};
use tarn_pool::Pool;
use tarn_testkit::data::Rng;
use tarn_testkit::datasets::info;
use tarn_testkit::files::overwrite;
use tarn_testkit::pools::{import, opts, props, scrub, tank as new_pool};
use tarn_vdev::VdevKind;

fn key(i: u64) -> Vec<u8> {
    let mut k = b"f".to_vec();
    k.extend_from_slice(&i.to_be_bytes());
    k
}

fn write(h: &ds::DatasetHandle, k: &[u8], data: Vec<u8>) -> Result<(), DsError> {
    h.txn(true, |t| t.write_block(k, data))
}

fn read(h: &ds::DatasetHandle, k: &[u8]) -> Option<Vec<u8>> {
    h.txn(false, |t| t.read_block(k)).unwrap()
}

#[test]
fn properties_inherit_and_report_sources() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Single, 1, 64 << 20);
    ds::create(
        &pool,
        "tank/home",
        &props(&[("compression", "zstd")]),
        false,
    )
    .unwrap();
    ds::create(&pool, "tank/home/alice/docs", &BTreeMap::new(), true).unwrap();
    assert!(matches!(
        ds::create(&pool, "tank/nope/x", &BTreeMap::new(), false),
        Err(DsError::NotFound(_))
    ));
    assert!(matches!(
        ds::create(&pool, "tank/home", &BTreeMap::new(), false),
        Err(DsError::Exists(_))
    ));
    assert!(ds::create(&pool, "other/x", &BTreeMap::new(), false).is_err());
    assert!(ds::create(&pool, "tank/bad name", &BTreeMap::new(), false).is_err());
    assert!(ds::create(&pool, "tank/x", &props(&[("recordsize", "3000")]), false).is_err());

    let get = |name: &str, p: &str| {
        ds::get_props(&pool, name, &[p.to_string()])
            .unwrap()
            .remove(0)
    };
    let c = get("tank/home/alice/docs", "compression");
    assert_eq!(c.value, "zstd");
    assert_eq!(c.source, Source::Inherited("tank/home".into()));
    assert_eq!(get("tank/home", "compression").source, Source::Local);
    let r = get("tank/home/alice", "recordsize");
    assert_eq!((r.value.as_str(), r.source), ("131072", Source::Default));

    ds::set_prop(&pool, "tank/home", "mountpoint", "/srv/home").unwrap();
    assert_eq!(
        get("tank/home/alice/docs", "mountpoint").value,
        "/srv/home/alice/docs"
    );
    ds::set_prop(&pool, "tank/home/alice", "compression", "off").unwrap();
    assert_eq!(get("tank/home/alice/docs", "compression").value, "off");
    ds::inherit(&pool, "tank/home/alice", "compression").unwrap();
    assert_eq!(get("tank/home/alice/docs", "compression").value, "zstd");
    assert!(ds::set_prop(&pool, "tank/home", "used", "5").is_err());
    assert!(ds::set_prop(&pool, "tank/home", "sync", "sometimes").is_err());

    // A quota or a reservation applies where it is set: children do not
    // inherit it, so two children do not each reserve the parent's room.
    ds::create(&pool, "tank/home/bob", &BTreeMap::new(), false).unwrap();
    ds::set_prop(&pool, "tank/home", "quota", "32M").unwrap();
    ds::set_prop(&pool, "tank/home", "reservation", "8M").unwrap();
    // No more than the dataset could still write (the pool has 64 MiB).
    for big in ["1G", "16000000T"] {
        assert!(
            matches!(
                ds::set_prop(&pool, "tank/home", "reservation", big),
                Err(DsError::NoSpace(_))
            ),
            "reservation={big}"
        );
    }
    assert_eq!(
        get("tank/home", "reservation").value,
        (8u64 << 20).to_string()
    );
    assert!(matches!(
        ds::create(&pool, "tank/big", &props(&[("reservation", "1G")]), false),
        Err(DsError::NoSpace(_))
    ));
    for p in ["quota", "reservation"] {
        for child in ["tank/home/alice", "tank/home/bob"] {
            let v = get(child, p);
            assert_eq!(
                (v.value.as_str(), &v.source),
                ("none", &Source::Default),
                "{p} of {child}"
            );
        }
        assert_eq!(get("tank/home", p).source, Source::Local);
    }
    let used = info(&pool, "tank").used;
    assert!(
        (8 << 20..12 << 20).contains(&used),
        "the pool's root counts the reservation once: {used}"
    );
    ds::inherit(&pool, "tank/home", "reservation").unwrap();
    ds::inherit(&pool, "tank/home", "quota").unwrap();
    assert_eq!(get("tank/home", "reservation").value, "none");
    assert!(info(&pool, "tank").used < 8 << 20);
    ds::destroy(&pool, "tank/home/bob", false).unwrap();

    // Rename moves descendants; properties follow.
    ds::rename(&pool, "tank/home/alice", "tank/alice").unwrap();
    assert_eq!(get("tank/alice/docs", "compression").value, "lz4");
    assert!(ds::rename(&pool, "tank/alice", "tank/alice/docs/x").is_err());

    // Everything survives export and import.
    pool.export(false).unwrap();
    drop(pool);
    let pool = import(dir.path(), "tank");
    let names: Vec<String> = ds::list(&pool, false)
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(
        names,
        ["tank", "tank/alice", "tank/alice/docs", "tank/home"]
    );
    let m = ds::get_props(&pool, "tank/alice/docs", &["mountpoint".into()]).unwrap();
    assert_eq!(m[0].value, "none");

    // Imported under a new name, the pool's datasets follow it.
    pool.export(false).unwrap();
    drop(pool);
    let pool = Pool::import(
        &[dir.path().to_path_buf()],
        &[],
        "tank",
        Some("vault"),
        false,
        opts(),
    )
    .unwrap();
    ds::attach(&pool).unwrap();
    let names: Vec<String> = ds::list(&pool, false)
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(
        names,
        ["vault", "vault/alice", "vault/alice/docs", "vault/home"]
    );
    ds::create(&pool, "vault/new", &BTreeMap::new(), false).unwrap();
}

#[test]
fn data_and_snapshots_survive_export_and_import() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Raidz { parity: 1 }, 4, 64 << 20);
    ds::create(&pool, "tank/photos", &BTreeMap::new(), false).unwrap();
    let h = ds::open(&pool, "tank/photos").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    for i in 0..3 {
        write(
            &h,
            &key(i),
            big[..(100_000 * (i as usize + 1)).min(big.len())].to_vec(),
        )
        .unwrap();
    }
    h.txn::<_, DsError>(true, |t| t.put(b"meta", b"hello"))
        .unwrap();
    ds::snapshot(&pool, &["tank/photos@one".into()], false).unwrap();
    write(&h, &key(0), vec![9; 5000]).unwrap();
    h.txn::<_, DsError>(true, |t| t.delete(&key(1)).map(|_| ()))
        .unwrap();
    pool.export(false).unwrap();
    drop((h, pool));

    let pool = import(dir.path(), "tank");
    let h = ds::open(&pool, "tank/photos").unwrap();
    assert_eq!(read(&h, &key(0)).unwrap(), vec![9; 5000]);
    assert_eq!(read(&h, &key(1)), None);
    assert_eq!(read(&h, &key(2)).unwrap(), big[..300_000].to_vec());
    let s = ds::open(&pool, "tank/photos@one").unwrap();
    assert_eq!(read(&s, &key(0)).unwrap(), big[..100_000].to_vec());
    assert_eq!(read(&s, &key(1)).unwrap(), big[..200_000].to_vec());
    assert_eq!(
        s.txn(false, |t| t.get(b"meta")).unwrap(),
        Some(Value::Plain(b"hello".to_vec()))
    );
    // Snapshots refuse changes.
    assert!(matches!(
        s.txn(true, |t| t.put(b"x", b"y")),
        Err(DsError::ReadOnly(_))
    ));
    let snaps = h.snapshots().unwrap();
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0].0, "one");
    // Scrub walks the dataset trees: every block is verified.
    let report = pool.leak_check().unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn failed_transactions_leave_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Single, 1, 64 << 20);
    ds::create(&pool, "tank/q", &props(&[("quota", "1M")]), false).unwrap();
    let h = ds::open(&pool, "tank/q").unwrap();
    write(&h, &key(0), vec![1; 1000]).unwrap();
    h.txn::<_, DsError>(true, |t| t.put(b"a", b"1")).unwrap();
    pool.sync().unwrap();
    let before = info(&pool, "tank/q");
    // A transaction that changes several things and then fails.
    let r: Result<(), DsError> = h.txn(true, |t| {
        t.put(b"a", b"2")?;
        t.put(b"b", b"new")?;
        t.delete(&key(0))?;
        t.write_block(&key(1), vec![5; 4096])?;
        Err(DsError::Invalid("caller gave up".into()))
    });
    assert!(r.is_err());
    assert_eq!(
        h.txn(false, |t| t.get(b"a")).unwrap(),
        Some(Value::Plain(b"1".to_vec()))
    );
    assert_eq!(h.txn(false, |t| t.get(b"b")).unwrap(), None);
    assert_eq!(read(&h, &key(0)).unwrap(), vec![1; 1000]);
    assert_eq!(read(&h, &key(1)), None);
    // The quota: incompressible data until EDQUOT, which changes nothing.
    let mut noise = Rng::new(1);
    let mut hit = None;
    for i in 10..40 {
        let r: Result<(), DsError> = h.txn(true, |t| {
            t.put(format!("k{i}").as_bytes(), b"v")?;
            t.write_block(&key(i), noise.bytes(128 * 1024))
        });
        if let Err(e) = r {
            hit = Some((i, e));
            break;
        }
        pool.sync().unwrap();
    }
    let (i, e) = hit.expect("the quota was never reached");
    assert!(matches!(e, DsError::Quota(_)), "{e}");
    assert_eq!(
        h.txn(false, |t| t.get(format!("k{i}").as_bytes())).unwrap(),
        None
    );
    assert!(info(&pool, "tank/q").used <= 1 << 20);
    pool.sync().unwrap();
    assert!(pool.leak_check().unwrap().is_clean());
    let _ = before;
}

/// Blocks of a dataset by address, with their allocated size.
type Blocks = HashMap<(u32, u64), u64>;

fn block_set(pool: &Pool, name: &str) -> Blocks {
    ds::blocks(pool, name)
        .unwrap()
        .into_iter()
        .map(|bp: BlockPtr| ((bp.dvas[0].vdev, bp.dvas[0].offset), bp.allocated_bytes()))
        .collect()
}

fn sum_except(of: &HashMap<(u32, u64), u64>, others: &[&HashMap<(u32, u64), u64>]) -> u64 {
    of.iter()
        .filter(|(k, _)| !others.iter().any(|o| o.contains_key(*k)))
        .map(|(_, a)| a)
        .sum()
}

/// Checks every figure of a filesystem and its snapshots against the block
/// sets of the trees, and the pool for leaks.
fn check_accounting(pool: &Pool, fs: &str) {
    pool.sync().unwrap();
    let all = ds::list(pool, true).unwrap();
    let head = block_set(pool, fs);
    let snaps: Vec<(String, Blocks)> = all
        .iter()
        .filter(|i| i.name.starts_with(&format!("{fs}@")))
        .map(|i| (i.name.clone(), block_set(pool, &i.name)))
        .collect();
    let d = |raw: u64| ds::deflated(pool, raw).unwrap();
    let hi = all.iter().find(|i| i.name == fs).unwrap();
    // A clone shares its origin's blocks: they are the origin's to count.
    let origin: Blocks = hi
        .origin
        .as_ref()
        .map(|o| block_set(pool, o))
        .unwrap_or_default();
    assert_eq!(
        hi.referenced,
        d(head.values().sum::<u64>()),
        "{fs} referenced"
    );
    // Blocks the head shares with its own snapshots are its own (what
    // destroying it with its snapshots frees), as in ZFS.
    assert_eq!(
        hi.usedbydataset,
        d(sum_except(&head, &[&origin])),
        "{fs} usedbydataset"
    );
    let mut union: HashMap<(u32, u64), u64> = HashMap::new();
    for (_, s) in &snaps {
        union.extend(s.iter().map(|(k, v)| (*k, *v)));
    }
    assert_eq!(
        hi.usedbysnapshots,
        d(sum_except(&union, &[&head, &origin])),
        "{fs} usedbysnapshots"
    );
    for (name, s) in &snaps {
        let mut others: Vec<&HashMap<_, _>> = vec![&head, &origin];
        others.extend(snaps.iter().filter(|(n, _)| n != name).map(|(_, o)| o));
        let si = all.iter().find(|i| &i.name == name).unwrap();
        assert_eq!(si.used, d(sum_except(s, &others)), "{name} used");
        assert_eq!(
            si.referenced,
            d(s.values().sum::<u64>()),
            "{name} referenced"
        );
    }
    let leak = pool.leak_check().unwrap();
    assert!(leak.is_clean(), "{leak:?}");
}

#[test]
fn space_returns_to_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Raidz { parity: 1 }, 4, 64 << 20);
    ds::create(&pool, "tank/fs", &props(&[("compression", "off")]), false).unwrap();
    let h = ds::open(&pool, "tank/fs").unwrap();
    h.txn::<_, DsError>(true, |t| t.put(b"root", b"inode"))
        .unwrap();
    for _ in 0..3 {
        pool.sync().unwrap();
    }
    let base_pool = pool.space().1;
    let base = info(&pool, "tank/fs");
    let base_root = info(&pool, "tank");

    for i in 0..8 {
        write(&h, &key(i), vec![i as u8 + 1; 128 * 1024]).unwrap();
    }
    check_accounting(&pool, "tank/fs");
    let full = info(&pool, "tank/fs");
    // Used counts data as written, without raidz parity (as `zfs list`).
    assert!(full.used >= base.used + 8 * 128 * 1024);
    assert!(full.used < base.used + 9 * 128 * 1024, "{}", full.used);
    assert!(full.available.unwrap() < base.available.unwrap());

    ds::snapshot(&pool, &["tank/fs@a".into()], false).unwrap();
    for i in 0..4 {
        write(&h, &key(i), vec![0xaa; 128 * 1024]).unwrap(); // overwrite
    }
    for i in 4..8 {
        h.txn::<_, DsError>(true, |t| t.delete(&key(i)).map(|_| ()))
            .unwrap();
    }
    check_accounting(&pool, "tank/fs");
    // Deleting what the snapshot holds freed nothing of it.
    let a = info(&pool, "tank/fs@a");
    assert!(
        a.used >= 8 * 128 * 1024,
        "snapshot holds all 8 old records: {}",
        a.used
    );
    ds::snapshot(&pool, &["tank/fs@b".into()], false).unwrap();
    ds::clone(&pool, "tank/fs@b", "tank/c", &BTreeMap::new()).unwrap();
    let c = ds::open(&pool, "tank/c").unwrap();
    write(&c, &key(0), vec![0xcc; 50_000]).unwrap();
    assert_eq!(read(&c, &key(1)).unwrap(), vec![0xaa; 128 * 1024]);
    check_accounting(&pool, "tank/fs");
    assert!(matches!(
        ds::destroy(&pool, "tank/fs@b", false),
        Err(DsError::Busy(_))
    ));
    ds::destroy(&pool, "tank/c", false).unwrap();
    ds::destroy(&pool, "tank/fs@a", false).unwrap();
    check_accounting(&pool, "tank/fs");
    // Roll back to b, then delete everything and drop b.
    write(&h, &key(3), vec![0x33; 1000]).unwrap();
    ds::rollback(&pool, "tank/fs@b", false).unwrap();
    assert_eq!(read(&h, &key(3)).unwrap(), vec![0xaa; 128 * 1024]);
    check_accounting(&pool, "tank/fs");
    for i in 0..4 {
        h.txn::<_, DsError>(true, |t| t.delete(&key(i)).map(|_| ()))
            .unwrap();
    }
    ds::destroy(&pool, "tank/fs@b", false).unwrap();
    check_accounting(&pool, "tank/fs");
    for _ in 0..3 {
        pool.sync().unwrap();
    }
    let end = info(&pool, "tank/fs");
    assert_eq!((end.used, end.referenced), (base.used, base.referenced));
    assert_eq!(end.available, base.available);
    assert_eq!(info(&pool, "tank").used, base_root.used);
    assert_eq!(
        pool.space().1,
        base_pool,
        "pool allocated returns to its baseline"
    );
}

#[derive(Clone, Debug)]
enum Op {
    Write(u8, u32, u8),
    Delete(u8),
    Snapshot,
    DestroySnap(u8),
    Rollback,
    Clone,
    CloneWrite(u8, u8),
    DestroyClone,
    Sync,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..12, 1u32..70_000, any::<u8>()).prop_map(|(k, l, b)| Op::Write(k, l, b)),
        4 => (0u8..12).prop_map(Op::Delete),
        3 => Just(Op::Snapshot),
        2 => any::<u8>().prop_map(Op::DestroySnap),
        1 => Just(Op::Rollback),
        1 => Just(Op::Clone),
        2 => (0u8..12, any::<u8>()).prop_map(|(k, b)| Op::CloneWrite(k, b)),
        1 => Just(Op::DestroyClone),
        2 => Just(Op::Sync),
    ]
}

fn data_of(len: u32, b: u8) -> Vec<u8> {
    // Varied but compressible so compression is exercised too.
    (0..len)
        .map(|i| if i % 7 == 0 { b } else { (i / 64) as u8 ^ b })
        .collect()
}

type Model = BTreeMap<u8, Vec<u8>>;

fn run(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Mirror, 2, 96 << 20);
    ds::create(&pool, "tank/fs", &BTreeMap::new(), false).unwrap();
    let h = ds::open(&pool, "tank/fs").unwrap();
    let mut head: Model = BTreeMap::new();
    let mut snaps: Vec<(String, Model)> = Vec::new();
    let mut clone: Option<(String, Model)> = None;
    let mut n = 0;
    for op in ops {
        match op {
            Op::Write(k, len, b) => {
                write(&h, &key(k as u64), data_of(len, b)).unwrap();
                head.insert(k, data_of(len, b));
            }
            Op::Delete(k) => {
                let had = h
                    .txn::<_, DsError>(true, |t| t.delete(&key(k as u64)))
                    .unwrap();
                assert_eq!(had, head.remove(&k).is_some());
            }
            Op::Snapshot => {
                n += 1;
                let name = format!("tank/fs@s{n}");
                ds::snapshot(&pool, std::slice::from_ref(&name), false).unwrap();
                snaps.push((name, head.clone()));
            }
            Op::DestroySnap(i) => {
                if snaps.is_empty() {
                    continue;
                }
                let i = i as usize % snaps.len();
                let is_origin = clone_origin(&clone, &snaps[i].0);
                let r = ds::destroy(&pool, &snaps[i].0, false);
                if is_origin {
                    assert!(matches!(r, Err(DsError::Busy(_))));
                } else {
                    r.unwrap();
                    snaps.remove(i);
                }
            }
            Op::Rollback => {
                let Some((name, m)) = snaps.last().cloned() else {
                    continue;
                };
                ds::rollback(&pool, &name, false).unwrap();
                head = m;
            }
            Op::Clone => {
                if clone.is_some() {
                    continue;
                }
                let Some((name, m)) = snaps.last().cloned() else {
                    continue;
                };
                ds::clone(&pool, &name, "tank/c", &BTreeMap::new()).unwrap();
                clone = Some((name, m));
            }
            Op::CloneWrite(k, b) => {
                let Some((_, m)) = clone.as_mut() else {
                    continue;
                };
                let c = ds::open(&pool, "tank/c").unwrap();
                write(&c, &key(k as u64), data_of(3000 + b as u32 * 10, b)).unwrap();
                m.insert(k, data_of(3000 + b as u32 * 10, b));
            }
            Op::DestroyClone => {
                if clone.take().is_some() {
                    ds::destroy(&pool, "tank/c", false).unwrap();
                }
            }
            Op::Sync => {
                pool.sync().unwrap();
            }
        }
    }
    // Every view reads back exactly its model.
    let check = |name: &str, m: &Model| {
        let hh = ds::open(&pool, name).unwrap();
        for k in 0..12u8 {
            assert_eq!(
                read(&hh, &key(k as u64)).as_ref(),
                m.get(&k),
                "{name} key {k}"
            );
        }
        let listed = hh
            .txn::<_, DsError>(false, |t| t.range(Bound::Unbounded, Bound::Unbounded, 100))
            .unwrap();
        assert_eq!(listed.len(), m.len(), "{name} listing");
    };
    check("tank/fs", &head);
    for (name, m) in &snaps {
        check(name, m);
    }
    if let Some((_, m)) = &clone {
        check("tank/c", m);
    }
    check_accounting(&pool, "tank/fs");
    // Tear everything down: the pool returns to a dataset-free footprint.
    if clone.is_some() {
        ds::destroy(&pool, "tank/c", false).unwrap();
    }
    ds::destroy(&pool, "tank/fs", true).unwrap();
    for _ in 0..3 {
        pool.sync().unwrap();
    }
    assert!(pool.leak_check().unwrap().is_clean());
    assert_eq!(info(&pool, "tank").used, info(&pool, "tank").referenced);
}

fn clone_origin(clone: &Option<(String, Model)>, snap: &str) -> bool {
    clone.as_ref().is_some_and(|(o, _)| o == snap)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn accounting_matches_the_trees(ops in prop::collection::vec(op(), 1..40)) {
        run(ops);
    }
}

#[test]
fn snapshots_of_a_subtree_are_atomic_and_ranges_destroy() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Single, 1, 64 << 20);
    ds::create(&pool, "tank/a/b", &BTreeMap::new(), true).unwrap();
    let txg = pool.txg();
    ds::snapshot(&pool, &["tank/a@x".into()], true).unwrap();
    assert!(pool.txg() <= txg + 2);
    let names: HashSet<String> = ds::list(&pool, true)
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert!(names.contains("tank/a@x") && names.contains("tank/a/b@x"));
    assert!(matches!(
        ds::snapshot(&pool, &["tank/a@x".into()], false),
        Err(DsError::Exists(_))
    ));
    for s in ["y", "z", "w"] {
        ds::snapshot(&pool, &[format!("tank/a@{s}")], false).unwrap();
    }
    ds::destroy(&pool, "tank/a@y%z", false).unwrap();
    let left: Vec<String> = ds::list(&pool, true)
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .filter(|n| n.starts_with("tank/a@"))
        .collect();
    assert_eq!(left, ["tank/a@w", "tank/a@x"]);
    assert!(matches!(
        ds::destroy(&pool, "tank/a", false),
        Err(DsError::Busy(_))
    ));
    ds::destroy(&pool, "tank/a", true).unwrap();
    assert_eq!(ds::list(&pool, true).unwrap().len(), 1);
    assert!(matches!(
        ds::destroy(&pool, "tank", true),
        Err(DsError::Invalid(_))
    ));
}

/// A held snapshot survives every way of destroying it (by name, in a
/// range, recursively, by rollback over it) and export and import, until
/// each of its holds is released.
#[test]
fn holds_keep_snapshots_until_released() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Single, 1, 64 << 20);
    ds::create(&pool, "tank/a/b", &BTreeMap::new(), true).unwrap();
    for s in ["x", "y", "z"] {
        ds::snapshot(&pool, &[format!("tank/a@{s}")], true).unwrap();
    }
    let held = |p: &Pool| ds::holds(p, &["tank/a@x".into(), "tank/a@y".into()], true).unwrap();
    ds::hold(&pool, "offsite", &["tank/a@y".into()], true).unwrap();
    ds::hold(&pool, "backup", &["tank/a@y".into()], false).unwrap();
    assert!(matches!(
        ds::hold(&pool, "backup", &["tank/a@y".into()], false),
        Err(DsError::Exists(_))
    ));
    for bad in ["", "tab\there"] {
        assert!(matches!(
            ds::hold(&pool, bad, &["tank/a@y".into()], false),
            Err(DsError::Invalid(_))
        ));
    }
    assert!(matches!(
        ds::hold(&pool, "t", &["tank/a".into()], false),
        Err(DsError::Invalid(_))
    ));
    assert!(matches!(
        ds::hold(&pool, "t", &["tank/a@nope".into()], false),
        Err(DsError::NotFound(_))
    ));
    let want = [
        ("tank/a/b@y", "offsite"),
        ("tank/a@y", "backup"),
        ("tank/a@y", "offsite"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(held(&pool), want);

    let busy = |r: Result<(), DsError>| assert!(matches!(r, Err(DsError::Busy(_))), "{r:?}");
    busy(ds::destroy(&pool, "tank/a@y", false));
    busy(ds::destroy(&pool, "tank/a/b@y", false));
    busy(ds::destroy(&pool, "tank/a@x%z", false));
    busy(ds::destroy(&pool, "tank/a", true));
    busy(ds::rollback(&pool, "tank/a@x", true));
    // A refused destroy took nothing with it.
    let names = |p: &Pool| -> Vec<String> {
        ds::list(p, true)
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .filter(|n| n.contains('@'))
            .collect()
    };
    assert_eq!(names(&pool).len(), 6);

    pool.export(false).unwrap();
    drop(pool);
    let pool = import(dir.path(), "tank");
    assert_eq!(held(&pool), want);
    busy(ds::destroy(&pool, "tank/a@y", false));

    ds::release(&pool, "offsite", &["tank/a@y".into()], true).unwrap();
    assert!(matches!(
        ds::release(&pool, "offsite", &["tank/a@y".into()], false),
        Err(DsError::NotFound(_))
    ));
    busy(ds::destroy(&pool, "tank/a@y", false));
    ds::destroy(&pool, "tank/a/b@y", false).unwrap();
    ds::release(&pool, "backup", &["tank/a@y".into()], false).unwrap();
    assert!(held(&pool).is_empty());
    ds::rollback(&pool, "tank/a@x", true).unwrap();
    assert!(!names(&pool).contains(&"tank/a@y".to_string()));
    ds::destroy(&pool, "tank/a", true).unwrap();
    assert!(names(&pool).is_empty());
}

/// Scrub reaches the blocks of every dataset and snapshot tree: damage to
/// a mirror half is found and repaired; on a single device it is reported.
#[test]
fn scrub_walks_dataset_trees() {
    for kind in [VdevKind::Mirror, VdevKind::Single] {
        let dir = tempfile::tempdir().unwrap();
        let n = if kind == VdevKind::Mirror { 2 } else { 1 };
        let pool = new_pool(dir.path(), kind, n, 64 << 20);
        ds::create(&pool, "tank/fs", &props(&[("compression", "off")]), false).unwrap();
        let h = ds::open(&pool, "tank/fs").unwrap();
        write(&h, &key(1), vec![0x5a; 64 * 1024]).unwrap();
        ds::snapshot(&pool, &["tank/fs@s".into()], false).unwrap();
        // Only the snapshot holds the block from now on.
        h.txn::<_, DsError>(true, |t| t.delete(&key(1)).map(|_| ()))
            .unwrap();
        pool.sync().unwrap();
        let bp = ds::blocks(&pool, "tank/fs@s")
            .unwrap()
            .into_iter()
            .find(|b| b.lsize == 64 * 1024)
            .expect("the data block");
        overwrite(
            &dir.path().join("d0"),
            tarn_vdev::DATA_START + bp.dvas[0].offset,
            &[0xff; 4096],
        );
        let s = scrub(&pool);
        let st = pool.status();
        if kind == VdevKind::Mirror {
            assert!(s.repaired_bytes >= 4096, "{s:?}");
            assert_eq!(s.errors, 0);
            let snap = ds::open(&pool, "tank/fs@s").unwrap();
            assert_eq!(read(&snap, &key(1)).unwrap(), vec![0x5a; 64 * 1024]);
        } else {
            assert_eq!(s.errors, 1, "{s:?}");
            assert!(
                st.damaged.iter().any(|d| d.contains("dataset tree")),
                "{:?}",
                st.damaged
            );
            let snap = ds::open(&pool, "tank/fs@s").unwrap();
            assert!(matches!(
                snap.txn(false, |t| t.read_block(&key(1))),
                Err(DsError::Damaged(_))
            ));
        }
    }
}

/// Trees are scanned in id order, so a filesystem's head comes before the
/// snapshots taken of it, and its walk skips the blocks born before its
/// last snapshot (that snapshot's walk visits them). A snapshot destroyed
/// while the head's walk runs leaves those blocks to the head alone: the
/// scan must walk the head again, or damage in them goes unseen (and a
/// resilver would end trusting a device that never got them).
#[test]
fn a_snapshot_destroyed_while_its_head_is_scanned_leaves_nothing_unvisited() {
    use std::time::{Duration, Instant};
    use tarn_pool::status::ScanState;
    use tarn_pool::ScanAction;
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Mirror, 2, 64 << 20);
    ds::create(&pool, "tank/fs", &props(&[("compression", "off")]), false).unwrap();
    let h = ds::open(&pool, "tank/fs").unwrap();
    let a0 = pool.space().1;
    for i in 0..8 {
        write(&h, &key(i), vec![i as u8 + 1; 64 * 1024]).unwrap();
    }
    ds::snapshot(&pool, &["tank/fs@s".into()], false).unwrap();
    let a1 = pool.space().1;
    for i in 100..300 {
        write(&h, &key(i), vec![(i % 251) as u8; 64 * 1024]).unwrap();
    }
    pool.sync().unwrap();
    let a2 = pool.space().1;
    let (old, new) = (a1 - a0, a2 - a1);
    let full = scrub(&pool).examined_bytes;
    // Damage, on one side, a block only the walk of @s visits.
    let bp = ds::blocks(&pool, "tank/fs@s")
        .unwrap()
        .into_iter()
        .find(|b| b.lsize == 64 * 1024)
        .expect("a data block of @s");
    overwrite(
        &dir.path().join("d1"),
        tarn_vdev::DATA_START + bp.dvas[0].offset,
        &[0xee; 4096],
    );
    let d0 = dir.path().join("d0").display().to_string();
    let slow = tarn_vdev::Fault {
        latency_ms: 20,
        ..tarn_vdev::Fault::always(tarn_vdev::FaultKind::Latency)
    };
    pool.inject(&d0, Some(slow)).unwrap();
    pool.scrub(ScanAction::Start).unwrap();
    // Into the head's walk: past the metadata and a quarter of the head's
    // own blocks, short of @s.
    let t0 = Instant::now();
    loop {
        let s = pool.status().scan.unwrap();
        assert_eq!(s.state, ScanState::Scanning, "ended too soon: {s:?}");
        if s.examined_bytes >= full - old - new * 3 / 4 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    ds::destroy(&pool, "tank/fs@s", false).unwrap();
    let s = pool.status().scan.unwrap();
    assert!(
        s.state == ScanState::Scanning && s.examined_bytes < full - old,
        "the head's walk ended before the destroy; make it slower: {s:?}"
    );
    pool.inject(&d0, None).unwrap();
    let s = tarn_testkit::pools::wait_scan(&pool);
    assert!(
        s.repaired_bytes >= 4096,
        "the damaged block went unvisited: {s:?}"
    );
    assert_eq!(s.errors, 0, "{s:?}");
    let again = scrub(&pool);
    assert_eq!((again.repaired_bytes, again.errors), (0, 0), "{again:?}");
}

/// A reservation between a writer and a quota above both absorbs the
/// writer's bytes as it absorbs its own dataset's: the quota counts the
/// whole reservation already, so writes into it must not count twice
/// (they used to, and the writer got only the quota's free part).
#[test]
fn a_reservation_between_a_writer_and_a_quota_absorbs_its_writes() {
    const BLOCK: usize = 128 << 10;
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Single, 1, 128 << 20);
    let off = props(&[("compression", "off")]);
    let with = |kv: (&str, &str)| props(&[("compression", "off"), kv]);
    ds::create(&pool, "tank/a", &with(("quota", "16M")), false).unwrap();
    ds::create(&pool, "tank/a/x", &off, false).unwrap();
    ds::create(&pool, "tank/a/b", &with(("reservation", "8M")), false).unwrap();
    ds::create(&pool, "tank/a/b/c", &off, false).unwrap();
    // a holds 5M of x's and b's reservation of 8M: 13M of its 16M.
    let x = ds::open(&pool, "tank/a/x").unwrap();
    for i in 0..40 {
        write(&x, &key(i), vec![1; BLOCK]).unwrap();
    }
    pool.sync().unwrap();
    let avail = info(&pool, "tank/a/b/c").available.unwrap();
    assert!(
        avail >= 10 << 20,
        "c may write into b's reservation and a's free part: {avail}"
    );
    let c = ds::open(&pool, "tank/a/b/c").unwrap();
    let mut n = 0u64;
    loop {
        match write(&c, &key(n), vec![2; BLOCK]) {
            Ok(()) => n += 1,
            Err(DsError::Quota(_)) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(n < 200, "the quota never stopped c");
    }
    // About 16M - 5M = 11M fit (a little goes to metadata); counted
    // twice, c got 16M - 13M = 3M.
    let mib = (n * BLOCK as u64) >> 20;
    assert!((9..=11).contains(&mib), "c took {mib} MiB");
    pool.sync().unwrap();
    let used = info(&pool, "tank/a").used;
    assert!(used <= 16 << 20, "a is past its quota: {used}");
}

#[test]
fn promote_moves_the_origin_history_to_the_clone() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Raidz { parity: 1 }, 4, 64 << 20);
    ds::create(&pool, "tank/fs", &props(&[("compression", "off")]), false).unwrap();
    for _ in 0..3 {
        pool.sync().unwrap();
    }
    let base_pool = pool.space().1;
    let h = ds::open(&pool, "tank/fs").unwrap();
    for i in 0..4 {
        write(&h, &key(i), vec![i as u8 + 1; 100_000]).unwrap();
    }
    ds::snapshot(&pool, &["tank/fs@s1".into()], false).unwrap();
    write(&h, &key(0), vec![0x10; 100_000]).unwrap();
    h.txn::<_, DsError>(true, |t| t.delete(&key(1)).map(|_| ()))
        .unwrap();
    ds::snapshot(&pool, &["tank/fs@s2".into()], false).unwrap();
    write(&h, &key(2), vec![0x20; 100_000]).unwrap();
    ds::snapshot(&pool, &["tank/fs@s3".into()], false).unwrap();
    ds::clone(&pool, "tank/fs@s2", "tank/c", &BTreeMap::new()).unwrap();
    let c = ds::open(&pool, "tank/c").unwrap();
    write(&c, &key(3), vec![0x33; 100_000]).unwrap();
    h.txn::<_, DsError>(true, |t| t.delete(&key(3)).map(|_| ()))
        .unwrap();
    ds::snapshot(&pool, &["tank/c@mine".into()], false).unwrap();
    c.txn::<_, DsError>(true, |t| t.delete(&key(0)).map(|_| ()))
        .unwrap();
    check_accounting(&pool, "tank/fs");
    check_accounting(&pool, "tank/c");
    assert!(matches!(
        ds::promote(&pool, "tank/fs"),
        Err(DsError::Invalid(_))
    ));

    ds::promote(&pool, "tank/c").unwrap();
    let names: Vec<String> = ds::list(&pool, true)
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    for n in ["tank/c@s1", "tank/c@s2", "tank/c@mine", "tank/fs@s3"] {
        assert!(names.contains(&n.to_string()), "{n} missing: {names:?}");
    }
    assert!(!names.iter().any(|n| n == "tank/fs@s1" || n == "tank/fs@s2"));
    assert_eq!(info(&pool, "tank/fs").origin.as_deref(), Some("tank/c@s2"));
    assert_eq!(info(&pool, "tank/c").origin, None);
    check_accounting(&pool, "tank/fs");
    check_accounting(&pool, "tank/c");
    // The old filesystem can go now; the clone keeps everything it sees.
    assert!(matches!(
        ds::destroy(&pool, "tank/c@s2", false),
        Err(DsError::Busy(_))
    ));
    ds::destroy(&pool, "tank/fs", true).unwrap();
    check_accounting(&pool, "tank/c");
    let s1 = ds::open(&pool, "tank/c@s1").unwrap();
    assert_eq!(read(&s1, &key(1)).unwrap(), vec![2; 100_000]);
    assert_eq!(read(&c, &key(3)).unwrap(), vec![0x33; 100_000]);
    assert_eq!(read(&c, &key(0)), None);
    ds::destroy(&pool, "tank/c@s1%mine", false).unwrap();
    check_accounting(&pool, "tank/c");
    ds::destroy(&pool, "tank/c", false).unwrap();
    for _ in 0..3 {
        pool.sync().unwrap();
    }
    assert!(pool.leak_check().unwrap().is_clean());
    assert!(pool.space().1 <= base_pool, "everything freed");
}

/// compressratio and logicalused follow what compression did: lz4 on
/// repetitive data stores far less than it holds; off stores it all.
#[test]
fn compression_figures() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Mirror, 2, 64 << 20);
    ds::create(&pool, "tank/lz", &props(&[("compression", "lz4")]), false).unwrap();
    ds::create(&pool, "tank/raw", &props(&[("compression", "off")]), false).unwrap();
    let text: Vec<u8> = b"the same line again and again\n"
        .iter()
        .cycle()
        .take(128 * 1024)
        .copied()
        .collect();
    for name in ["tank/lz", "tank/raw"] {
        let h = ds::open(&pool, name).unwrap();
        for i in 0..8 {
            write(&h, &key(i), text.clone()).unwrap();
        }
    }
    pool.sync().unwrap();
    let lz = info(&pool, "tank/lz");
    let raw = info(&pool, "tank/raw");
    assert!(lz.compressratio > 4.0, "{}", lz.compressratio);
    assert!(
        (raw.compressratio - 1.0).abs() < 0.02,
        "{}",
        raw.compressratio
    );
    // Logical sizes count the data as written (plus the tree nodes).
    for i in [&lz, &raw] {
        assert!(i.logicalused >= 8 * 128 * 1024, "{}", i.logicalused);
        assert!(i.logicalreferenced >= 8 * 128 * 1024);
        assert!(i.logicalused < 8 * 128 * 1024 + (64 << 10));
    }
    assert!(
        lz.used * 4 < raw.used,
        "lz4 {} vs off {}",
        lz.used,
        raw.used
    );
    // The pool's root counts both children.
    let root = info(&pool, "tank");
    assert!(root.logicalused >= lz.logicalused + raw.logicalused);
    assert!(root.usedbychildren >= lz.used + raw.used);
}

/// Many snapshots, each after one block was written, then every block
/// rewritten at once: the head's deadlist summary gets one entry per
/// snapshot interval, more than a record stored whole can hold (the sync
/// used to fail on it and stop the pool). It is stored apart, survives
/// export and import with the space figures it gives, and goes back into
/// the record when snapshots are destroyed.
#[test]
fn many_snapshot_intervals_of_dead_blocks_sync() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Single, 1, 256 << 20);
    ds::create(&pool, "tank/vm", &BTreeMap::new(), false).unwrap();
    let h = ds::open(&pool, "tank/vm").unwrap();
    let n = 300u64;
    for i in 0..n {
        write(&h, &key(i), vec![i as u8; 4096]).unwrap();
        pool.sync().unwrap();
        ds::snapshot(&pool, &[format!("tank/vm@s{i}")], false).unwrap();
    }
    h.txn(true, |t| {
        for i in 0..n {
            t.write_block(&key(i), vec![0xee; 4096])?;
        }
        Ok::<_, DsError>(())
    })
    .unwrap();
    pool.sync().unwrap();
    assert!(
        pool.props().features.iter().any(|f| f == "large_records"),
        "{:?}",
        pool.props().features
    );
    ds::snapshot(&pool, &["tank/vm@after".to_string()], false).unwrap();
    pool.sync().unwrap();
    ds::create(&pool, "tank/ok", &BTreeMap::new(), false).unwrap();
    let figures = |p: &Pool| {
        let mut v: Vec<_> = ds::list(p, true)
            .unwrap()
            .into_iter()
            .map(|d| format!("{d:?}"))
            .collect();
        v.sort();
        v
    };
    let before = figures(&pool);
    check_accounting(&pool, "tank/vm");
    pool.export(false).unwrap();
    drop((h, pool));

    let pool = import(dir.path(), "tank");
    assert_eq!(figures(&pool), before, "the space figures after import");
    check_accounting(&pool, "tank/vm");
    let h = ds::open(&pool, "tank/vm").unwrap();
    assert!(read(&h, &key(7)) == Some(vec![0xee; 4096]));
    let s = ds::open(&pool, "tank/vm@s7").unwrap();
    assert!(read(&s, &key(7)) == Some(vec![7; 4096]));
    // Destroying most snapshots folds the intervals: the summaries fit
    // their records again, and the pieces stored apart go.
    ds::destroy(&pool, "tank/vm@s0%s289", false).unwrap();
    pool.sync().unwrap();
    check_accounting(&pool, "tank/vm");
    let report = pool.leak_check().unwrap();
    assert!(report.is_clean(), "{report:?}");
    let before = figures(&pool);
    pool.export(false).unwrap();
    drop((h, s, pool));
    let pool = import(dir.path(), "tank");
    assert_eq!(figures(&pool), before);
    let s = ds::open(&pool, "tank/vm@s295").unwrap();
    assert!(read(&s, &key(295)) == Some(vec![295u64 as u8; 4096]));
    assert!(read(&s, &key(296)).is_none());
}

/// Commands that would make a record too large to store are refused
/// before they change anything (a record the meta tree refuses failed the
/// sync and stopped the pool): a long property value full of characters
/// JSON escapes, set or given at creation; holds past what a record
/// holds; a key location likewise. The pool goes on taking changes.
#[test]
fn records_are_kept_within_what_the_meta_tree_stores() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Single, 1, 64 << 20);
    ds::create(&pool, "tank/a", &BTreeMap::new(), false).unwrap();
    let escaped = format!("/{}", "\\".repeat(4000));
    assert!(matches!(
        ds::set_prop(&pool, "tank/a", "mountpoint", &escaped),
        Err(DsError::Invalid(_))
    ));
    assert!(matches!(
        ds::create(&pool, "tank/b", &props(&[("mountpoint", &escaped)]), false),
        Err(DsError::Invalid(_))
    ));
    assert!(ds::open(&pool, "tank/b").is_err());
    assert!(matches!(
        ds::crypt::check_keylocation(&format!("file://{escaped}")),
        Err(DsError::Invalid(_))
    ));
    // A plain long value still goes in.
    let plain = format!("/{}", "m".repeat(2000));
    ds::set_prop(&pool, "tank/a", "mountpoint", &plain).unwrap();
    ds::snapshot(&pool, &["tank/a@s".to_string()], false).unwrap();
    // A clone refused for its properties leaves its name free.
    assert!(matches!(
        ds::clone(
            &pool,
            "tank/a@s",
            "tank/cl",
            &props(&[("mountpoint", &escaped)])
        ),
        Err(DsError::Invalid(_))
    ));
    ds::create(&pool, "tank/cl", &BTreeMap::new(), false).unwrap();
    ds::create(&pool, "tank/cl/child", &BTreeMap::new(), false).unwrap();
    let mut refused = None;
    for i in 0..200 {
        let tag = format!("{i:03}{}", "\"".repeat(120));
        match ds::hold(&pool, &tag, &["tank/a@s".to_string()], false) {
            Ok(()) => {}
            Err(DsError::Invalid(_)) => {
                refused = Some(i);
                break;
            }
            Err(e) => panic!("hold {i}: {e}"),
        }
    }
    let refused = refused.expect("200 holds of 123 characters fit a record");
    assert!(refused >= 10, "refused at hold {refused}");
    pool.sync().unwrap();
    ds::create(&pool, "tank/c", &BTreeMap::new(), false).unwrap();
    pool.sync().unwrap();
    assert_eq!(
        ds::holds(&pool, &["tank/a@s".to_string()], false)
            .unwrap()
            .len(),
        refused
    );
}

/// A rename to a longer name makes every renamed record longer (the
/// dataset, its snapshots, its descendants): one that would take a record
/// past what it may hold is refused before anything changes, as a hold
/// would be; a rename that does not lengthen names is not.
#[test]
fn a_rename_that_would_overfill_a_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(dir.path(), VdevKind::Single, 1, 64 << 20);
    ds::create(&pool, "tank/a", &BTreeMap::new(), false).unwrap();
    ds::snapshot(&pool, &["tank/a@s".to_string()], false).unwrap();
    // Holds of 37 bytes each (escaped) until the snapshot's record is
    // full to within one of them.
    let mut refused = false;
    for i in 0..1000 {
        let tag = format!("{i:03}{}", "\"".repeat(16));
        match ds::hold(&pool, &tag, &["tank/a@s".to_string()], false) {
            Ok(()) => {}
            Err(DsError::Invalid(_)) => {
                refused = true;
                break;
            }
            Err(e) => panic!("hold {i}: {e}"),
        }
    }
    assert!(refused, "1000 holds fit a record");
    let long = format!("tank/{}", "r".repeat(100));
    let r = ds::rename(&pool, "tank/a", &long);
    assert!(matches!(r, Err(DsError::Invalid(_))), "{r:?}");
    assert!(ds::open(&pool, "tank/a@s").is_ok());
    assert!(ds::open(&pool, &format!("{long}@s")).is_err());
    ds::rename(&pool, "tank/a", "tank/b").unwrap();
    pool.sync().unwrap();
    assert!(ds::open(&pool, "tank/b@s").is_ok());
}
