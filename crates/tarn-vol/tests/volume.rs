//! Volumes on a real pool: a model-based test against a byte array, the
//! intent log across a crash, snapshots, clones, rollback and resize, and
//! space that a trim gives back.
//!
//! A "crash" drops every handle to the pool without exporting it (the txg
//! interval is an hour), like a daemon killed after its last reply.

use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use tarn_dataset::{DsError, VolSpec};
use tarn_pool::Pool;
use tarn_testkit::data::pattern;
use tarn_testkit::gates;
use tarn_testkit::pools::{props, tank};
use tarn_vdev::VdevKind;
use tarn_vol::{Device, Extent, VolError, Volume};

fn pool(dir: &Path) -> Arc<Pool> {
    tank(dir, VdevKind::Raidz { parity: 1 }, 4, 64 << 20)
}

fn volume(pool: &Arc<Pool>, name: &str, size: u64, block: u32, sparse: bool) -> Arc<Volume> {
    tarn_dataset::create_volume(
        pool,
        name,
        VolSpec { size, block },
        sparse,
        &props(&[]),
        false,
    )
    .expect("create volume");
    Volume::open(tarn_dataset::open(pool, name).expect("open")).expect("a volume")
}

fn reopen(pool: &Arc<Pool>, name: &str) -> Arc<Volume> {
    Volume::open(tarn_dataset::open(pool, name).expect("open")).expect("a volume")
}

fn crash_and_import(pool: Arc<Pool>, dir: &Path) -> Arc<Pool> {
    pool.abandon();
    drop(pool);
    let p = tarn_testkit::pools::try_import(&[dir], "tank", true, tarn_testkit::pools::opts())
        .expect("import after the crash");
    tarn_testkit::pools::attached(p)
}

/// Checks that `ext` covers `len` bytes exactly, merges neighbours, and
/// that every hole reads as zeros in `model` from `off`.
fn check_extents(ext: &[Extent], model: &[u8], off: u64, len: u64) {
    assert_eq!(
        ext.iter().map(|e| e.len).sum::<u64>(),
        len,
        "extents cover the range"
    );
    assert!(ext.iter().all(|e| e.len > 0), "no empty extent");
    assert!(
        ext.windows(2).all(|w| w[0].hole != w[1].hole),
        "neighbours merged"
    );
    let mut at = off as usize;
    for e in ext {
        if e.hole {
            assert!(
                model[at..at + e.len as usize].iter().all(|&b| b == 0),
                "a hole at {at} of {} bytes holds data",
                e.len
            );
        }
        at += e.len as usize;
    }
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        off: u64,
        len: u64,
        seed: u64,
        fua: bool,
    },
    Zero {
        off: u64,
        len: u64,
        trim: bool,
    },
    Read {
        off: u64,
        len: u64,
    },
    Extents {
        off: u64,
        len: u64,
    },
    Commit,
    Resize {
        blocks: u64,
    },
}

fn op(max: u64) -> impl Strategy<Value = Op> {
    let span = (0..max, 0..max / 2);
    prop_oneof![
        4 => (span.clone(), any::<u64>(), any::<bool>())
            .prop_map(|((off, len), seed, fua)| Op::Write { off, len, seed, fua }),
        2 => (span.clone(), any::<bool>()).prop_map(|((off, len), trim)| Op::Zero { off, len, trim }),
        3 => span.clone().prop_map(|(off, len)| Op::Read { off, len }),
        2 => span.prop_map(|(off, len)| Op::Extents { off, len }),
        1 => Just(Op::Commit),
        1 => (1u64..24).prop_map(|blocks| Op::Resize { blocks }),
    ]
}

/// Runs `ops` on a volume and on a byte array; every read and extent list
/// agrees, requests past the end fail without changing anything, and after
/// a crash the volume holds exactly what the last flush had.
fn run_model(block: u32, ops: &[Op]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    let bs = block as u64;
    let mut model = vec![0u8; (16 * bs) as usize];
    let vol = volume(&pool, "tank/v", model.len() as u64, block, true);
    for o in ops {
        let size = model.len() as u64;
        // Offsets are drawn over 24 blocks, so some fall past the end.
        let scale = |x: u64| x * bs / 512;
        match *o {
            Op::Write {
                off,
                len,
                seed,
                fua,
            } => {
                let (off, len) = (scale(off), scale(len) + 1);
                let data = pattern(seed, len as usize);
                let r = vol.write(off, &data, fua);
                if off + len > size {
                    assert!(matches!(r, Err(VolError::OutOfRange(_))), "{r:?}");
                } else {
                    r.expect("write");
                    model[off as usize..(off + len) as usize].copy_from_slice(&data);
                }
            }
            Op::Zero { off, len, trim } => {
                let (off, len) = (scale(off), scale(len));
                let r = if trim {
                    vol.trim(off, len)
                } else {
                    vol.write_zeroes(off, len, false)
                };
                if off + len > size {
                    assert!(matches!(r, Err(VolError::OutOfRange(_))), "{r:?}");
                } else {
                    r.expect("zero");
                    model[off as usize..(off + len) as usize].fill(0);
                }
            }
            Op::Read { off, len } => {
                let (off, len) = (scale(off), scale(len));
                // From memory first: whatever it answers is right.
                match vol.read_cached(off, len as u32) {
                    None => {}
                    Some(Ok(got)) => assert!(
                        got.to_vec() == model[off as usize..(off + len) as usize],
                        "read from memory {len} at {off}"
                    ),
                    Some(Err(e)) => assert!(off + len > size, "read from memory: {e}"),
                }
                match vol.read(off, len as u32) {
                    Ok(got) => {
                        assert!(off + len <= size);
                        assert!(
                            got == model[off as usize..(off + len) as usize],
                            "read {len} at {off}"
                        );
                        // Just read: every block it needs is in memory (a
                        // read-ahead job may hold the dataset a moment).
                        if len <= 1 << 20 {
                            let again = (0..200).find_map(|_| {
                                let r = vol.read_cached(off, len as u32);
                                if r.is_none() {
                                    std::thread::sleep(std::time::Duration::from_millis(5));
                                }
                                r
                            });
                            assert!(
                                matches!(&again, Some(Ok(d)) if d.to_vec() == got),
                                "a read just done is answered from memory ({len} at {off})"
                            );
                        }
                    }
                    Err(e) => assert!(off + len > size, "read {len} at {off}: {e}"),
                }
            }
            Op::Extents { off, len } => {
                let (off, len) = (scale(off), scale(len));
                match vol.extents(off, len) {
                    Ok(ext) => check_extents(&ext, &model, off, len),
                    Err(e) => assert!(off + len > size, "extents {len} at {off}: {e}"),
                }
            }
            Op::Commit => {
                pool.sync().expect("commit");
            }
            Op::Resize { blocks } => {
                let new = blocks * bs;
                if new < size {
                    assert!(vol.resize(new, false).is_err(), "shrink without force");
                }
                vol.resize(new, true).expect("resize");
                model.resize(new as usize, 0);
                assert_eq!(vol.size(), new);
            }
        }
    }
    assert!(vol.read(0, model.len() as u32).expect("read all") == model);
    vol.flush().expect("flush");
    drop(vol);
    let pool = crash_and_import(pool, dir.path());
    let vol = reopen(&pool, "tank/v");
    assert_eq!(vol.size(), model.len() as u64, "size after the crash");
    assert!(
        vol.read(0, model.len() as u32).expect("read all") == model,
        "contents after the crash"
    );
    let ext = vol.extents(0, model.len() as u64).expect("extents");
    check_extents(&ext, &model, 0, model.len() as u64);
}

proptest! {
    #![proptest_config(tarn_testkit::data::cases(24))]

    #[test]
    fn a_volume_behaves_like_a_byte_array(ops in proptest::collection::vec(op(24 * 512), 1..40)) {
        run_model(4096, &ops);
    }

    /// 64K blocks: whole-block writes go to the intent log by reference
    /// (written in place), and the crash at the end replays them.
    #[test]
    fn large_blocks_behave_like_a_byte_array(ops in proptest::collection::vec(op(24 * 512), 1..30)) {
        run_model(64 << 10, &ops);
    }

    #[test]
    fn small_blocks_behave_like_a_byte_array(ops in proptest::collection::vec(op(24 * 512), 1..40)) {
        run_model(512, &ops);
    }
}

#[test]
fn flushed_and_fua_writes_survive_a_crash_and_an_unflushed_one_is_whole_or_absent() {
    for (block, commit) in [(16 << 10, false), (16 << 10, true), (128 << 10, false)] {
        flushed_and_fua_writes_survive(block, commit);
    }
}

/// With `commit`, a txg commits after the unflushed write, so it must be
/// there whole; without, it is absent (nothing made it durable).
fn flushed_and_fua_writes_survive(block: u32, commit: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    let vol = volume(&pool, "tank/v", 8 << 20, block, false);
    let a = pattern(1, 3 << 20);
    let b = pattern(2, 100_000);
    let c = pattern(3, 70_000);
    vol.write(0, &a, false).expect("write a");
    vol.flush().expect("flush");
    vol.write(5 << 20, &b, true).expect("fua write b");
    // Not flushed: may be lost, but never torn (one request, one txn).
    vol.write(1000, &c, false).expect("write c");
    if commit {
        pool.sync().expect("commit");
    }
    drop(vol);
    let pool = crash_and_import(pool, dir.path());
    let vol = reopen(&pool, "tank/v");
    assert!(
        vol.read(5 << 20, b.len() as u32).expect("read b") == b,
        "the FUA write"
    );
    let got = vol.read(0, a.len() as u32).expect("read a");
    let mut with_c = a.clone();
    with_c[1000..1000 + c.len()].copy_from_slice(&c);
    if commit {
        assert!(
            got == with_c,
            "a committed write is whole ({block}-byte blocks)"
        );
    } else {
        assert!(
            got == a,
            "nothing made the last write durable ({block}-byte blocks)"
        );
    }
}

/// A write of part of a block that is on disk but not cached reads the
/// old block without holding the volume's dataset: with that read held at
/// a gate, a whole-block write and a read of it on the same volume still
/// finish. (Read inside the write's transaction, the disk read would hold
/// up every other request of the volume; the check then times out.)
#[test]
fn a_partial_write_reads_its_old_block_without_holding_up_the_volume() {
    const BS: usize = 16 << 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    let vol = volume(&pool, "tank/v", 1 << 20, BS as u32, true);
    vol.write(0, &pattern(1, 2 * BS), false)
        .expect("write blocks 0 and 1");
    pool.sync().expect("commit");
    drop(vol);
    // Imported again: the block cache is empty, block 0 is on disk only.
    let pool = crash_and_import(pool, dir.path());
    let vol = reopen(&pool, "tank/v");
    // The tree's nodes and the allocator are in memory before the gate.
    vol.write(3 * BS as u64, &pattern(3, BS), false)
        .expect("write block 3");
    assert!(vol.read(BS as u64, BS as u32).expect("read block 1") == pattern(1, 2 * BS)[BS..]);
    let members: Vec<_> = (0..4).map(|i| dir.path().join(format!("d{i}"))).collect();
    let gate = gates::hold_reads(&members.iter().map(|p| p.as_path()).collect::<Vec<_>>());
    let patcher = {
        let vol = vol.clone();
        std::thread::spawn(move || vol.write(4096, &[7; 4096], false))
    };
    assert!(
        gate.wait_for_waiter(gates::LONG),
        "the partial write never read its old block"
    );
    let other = vol.clone();
    let back = gates::within(&gate, "a whole-block write beside a patch", move || {
        other.write(2 * BS as u64, &pattern(2, BS), false)?;
        other.read(2 * BS as u64, BS as u32)
    });
    assert!(back.expect("write and read block 2") == pattern(2, BS));
    gate.open();
    patcher.join().expect("patcher").expect("the partial write");
    let mut want = pattern(1, 2 * BS)[..BS].to_vec();
    want[4096..8192].fill(7);
    assert!(vol.read(0, BS as u32).expect("read block 0") == want);
}

#[test]
fn sync_always_makes_every_write_durable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    let vol = volume(&pool, "tank/v", 1 << 20, 4096, true);
    tarn_dataset::set_prop(&pool, "tank/v", "sync", "always").expect("sync=always");
    let a = pattern(4, 10_000);
    vol.write(4096 * 3 + 7, &a, false).expect("write");
    drop(vol);
    let pool = crash_and_import(pool, dir.path());
    let vol = reopen(&pool, "tank/v");
    assert!(vol.read(4096 * 3 + 7, a.len() as u32).expect("read") == a);
}

#[test]
fn snapshots_clones_and_rollback_carry_contents_and_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    let vol = volume(&pool, "tank/v", 1 << 20, 8192, true);
    let a = pattern(5, 1 << 20);
    vol.write(0, &a, false).expect("write a");
    tarn_dataset::snapshot(&pool, &["tank/v@one".into()], false).expect("snapshot");
    let b = pattern(6, 300_000);
    vol.write(50_000, &b, false).expect("write b");
    vol.resize(2 << 20, false).expect("grow");

    let snap = reopen(&pool, "tank/v@one");
    assert!(snap.read_only());
    assert_eq!(snap.size(), 1 << 20, "a snapshot keeps the size it had");
    assert!(snap.read(0, 1 << 20).expect("read snap") == a);
    assert!(matches!(
        snap.write(0, b"x", false),
        Err(VolError::ReadOnly(_))
    ));

    tarn_dataset::clone(&pool, "tank/v@one", "tank/c", &props(&[])).expect("clone");
    let clone = reopen(&pool, "tank/c");
    assert_eq!(clone.size(), 1 << 20);
    assert!(clone.read(0, 1 << 20).expect("read clone") == a);
    clone.write(0, &b, false).expect("write the clone");
    assert!(
        snap.read(0, 1 << 20).expect("read snap") == a,
        "the clone's write stays in the clone"
    );
    // A read from memory, when it answers, answers what a read would.
    let from_memory = |v: &Volume, want: &[u8], what: &str| match v.read_cached(0, 1 << 20) {
        None => {}
        Some(r) => assert!(r.expect(what).to_vec() == want, "{what}"),
    };
    from_memory(&snap, &a, "the snapshot from memory");
    let mut with_b = a.clone();
    with_b[50_000..350_000].copy_from_slice(&b);
    assert!(vol.read(0, 1 << 20).expect("read the head") == with_b);
    from_memory(&vol, &with_b, "the head from memory");
    let mut clone_b = a.clone();
    clone_b[..300_000].copy_from_slice(&b);
    from_memory(&clone, &clone_b, "the clone from memory");

    drop(vol);
    tarn_dataset::rollback(&pool, "tank/v@one", false).expect("rollback");
    let vol = reopen(&pool, "tank/v");
    assert_eq!(vol.size(), 1 << 20, "rollback restores the size");
    // The head's newer blocks are still cached: never served again.
    from_memory(&vol, &a, "rolled back, from memory");
    assert!(
        vol.read(0, 1 << 20).expect("read") == a,
        "rollback restores the contents"
    );
    from_memory(&vol, &a, "rolled back, from memory after a read");
    let kinds: Vec<_> = tarn_dataset::list(&pool, true)
        .expect("list")
        .into_iter()
        .map(|i| (i.name, i.kind))
        .collect();
    assert!(
        kinds.contains(&("tank/c".into(), tarn_dataset::DatasetKind::Volume)),
        "{kinds:?}"
    );
}

#[test]
fn shrinking_then_growing_exposes_zeros_not_old_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    let vol = volume(&pool, "tank/v", 1 << 20, 4096, true);
    vol.write(0, &pattern(7, 1 << 20), false).expect("write");
    pool.sync().expect("commit");
    vol.resize(4096 * 3, true).expect("shrink");
    vol.resize(1 << 20, false).expect("grow");
    let got = vol.read(4096 * 3, (1 << 20) - 4096 * 3).expect("read");
    assert!(
        got.iter().all(|&b| b == 0),
        "old data came back after shrink and grow"
    );
    assert_eq!(
        vol.extents(0, 1 << 20).expect("extents"),
        vec![
            Extent {
                len: 4096 * 3,
                hole: false
            },
            Extent {
                len: (1 << 20) - 4096 * 3,
                hole: true
            }
        ]
    );
}

#[test]
fn trim_gives_space_back_unless_a_snapshot_holds_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    let vol = volume(&pool, "tank/v", 32 << 20, 16 << 10, true);
    let used = |pool: &Pool| {
        tarn_dataset::list(pool, false)
            .expect("list")
            .into_iter()
            .find(|i| i.name == "tank/v")
            .map(|i| (i.usedbydataset, i.usedbysnapshots))
            .expect("tank/v listed")
    };
    let commit = |pool: &Pool| {
        for _ in 0..3 {
            pool.sync().expect("commit");
        }
    };
    vol.write(0, &pattern(8, 16 << 20), false).expect("write");
    commit(&pool);
    let (full, _) = used(&pool);
    assert!(full >= 16 << 20, "16 MiB written: {full}");
    // Half of it trimmed (with unaligned edges), the rest zeroed.
    vol.trim(1000, (8 << 20) - 1000).expect("trim");
    commit(&pool);
    let (half, _) = used(&pool);
    assert!(
        half < full * 6 / 10,
        "trim gave back half: {full} -> {half}"
    );
    tarn_dataset::snapshot(&pool, &["tank/v@keep".into()], false).expect("snapshot");
    vol.write_zeroes(8 << 20, 8 << 20, false).expect("zero");
    commit(&pool);
    let (ds, snaps) = used(&pool);
    assert!(ds < 1 << 20, "zeroed blocks left the volume: {ds}");
    assert!(
        snaps >= (8 << 20) - (1 << 20),
        "the snapshot still holds them: {snaps}"
    );
    assert!(
        vol.read(0, 1000).expect("read") == pattern(8, 1000),
        "bytes before the trim kept"
    );
    assert!(vol.read(1000, 4000).expect("read").iter().all(|&b| b == 0));
}

#[test]
fn geometry_and_hierarchy_are_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    let bad = |size, block| {
        tarn_dataset::create_volume(
            &pool,
            "tank/bad",
            VolSpec { size, block },
            true,
            &props(&[]),
            false,
        )
    };
    assert!(
        matches!(bad(1 << 20, 3000), Err(DsError::Invalid(_))),
        "block not a power of two"
    );
    assert!(
        matches!(bad(1 << 20, 256), Err(DsError::Invalid(_))),
        "block too small"
    );
    assert!(
        matches!(bad(1 << 20, 2 << 20), Err(DsError::Invalid(_))),
        "block too large"
    );
    assert!(
        matches!(bad(5000, 4096), Err(DsError::Invalid(_))),
        "size not a multiple"
    );
    assert!(matches!(bad(0, 4096), Err(DsError::Invalid(_))), "empty");
    // A thick volume larger than the pool is refused; a sparse one is not.
    let huge = VolSpec {
        size: 1 << 40,
        block: 16384,
    };
    let thick = tarn_dataset::create_volume(&pool, "tank/thick", huge, false, &props(&[]), false);
    assert!(matches!(thick, Err(DsError::NoSpace(_))), "{thick:?}");
    tarn_dataset::create_volume(&pool, "tank/thin", huge, true, &props(&[]), false)
        .expect("sparse");
    // A thick volume reserves what filling it costs: more than its size
    // on raidz with 16K blocks (parity and padding), and it follows the
    // size; growing past what the pool can reserve is refused.
    let v = volume(&pool, "tank/v", 4 << 20, 16384, false);
    let reserved = |pool: &Pool| -> u64 {
        let p = tarn_dataset::get_props(pool, "tank/v", &["reservation".into()]).expect("get");
        p[0].value.parse().expect("a number")
    };
    let res = tarn_dataset::get_props(&pool, "tank/v", &["type".into()]).expect("get");
    assert_eq!(res[0].value, "volume");
    let small = reserved(&pool);
    assert!(small > 4 << 20 && small < 8 << 20, "{small}");
    v.resize(8 << 20, false).expect("grow");
    let big = reserved(&pool);
    assert!(
        big > 2 * small - (64 << 10) && big < 2 * small + (64 << 10),
        "{small} -> {big}"
    );
    let res = tarn_dataset::get_props(&pool, "tank/v", &["volsize".into()]).expect("get");
    assert_eq!(res[0].value, (8u64 << 20).to_string());
    assert!(matches!(
        v.resize(1 << 40, false),
        Err(VolError::NoSpace(_))
    ));
    assert_eq!(v.size(), 8 << 20, "a refused grow changes nothing");
    assert_eq!(reserved(&pool), big);
    // No children under a volume, by create, clone or rename.
    let child = tarn_dataset::create(&pool, "tank/v/child", &props(&[]), false);
    assert!(matches!(child, Err(DsError::Invalid(_))), "{child:?}");
    tarn_dataset::create(&pool, "tank/fs", &props(&[]), false).expect("fs");
    let moved = tarn_dataset::rename(&pool, "tank/fs", "tank/v/fs");
    assert!(matches!(moved, Err(DsError::Invalid(_))), "{moved:?}");
    tarn_dataset::snapshot(&pool, &["tank/fs@s".into()], false).expect("snapshot");
    let cl = tarn_dataset::clone(&pool, "tank/fs@s", "tank/v/c", &props(&[]));
    assert!(matches!(cl, Err(DsError::Invalid(_))), "{cl:?}");
    // A filesystem is not a volume.
    let fs = Volume::open(tarn_dataset::open(&pool, "tank/fs").expect("open"));
    assert!(matches!(fs, Err(VolError::Invalid(_))));
}

#[test]
fn an_object_older_than_a_resize_cannot_resize_and_a_grow_clears_strays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    let a = volume(&pool, "tank/v", 1 << 20, 4096, true);
    let b = reopen(&pool, "tank/v");
    a.resize(2 << 20, false).expect("grow through one object");
    assert!(!b.is_current(), "the other object's size is stale");
    assert!(b.resize(512 << 10, true).is_err(), "a stale object resized");
    assert_eq!(reopen(&pool, "tank/v").size(), 2 << 20);
    // A key past the end (left by anything) never shows after a grow.
    let stray = (600u64).to_be_bytes();
    a.handle()
        .txn(true, |t| t.write_block(&stray, vec![7; 4096]))
        .expect("a stray block");
    a.resize(4 << 20, false).expect("grow");
    assert!(a
        .read(600 * 4096, 4096)
        .expect("read")
        .iter()
        .all(|&x| x == 0));
}

#[test]
fn a_closed_volume_refuses_every_request_and_a_fresh_one_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    let vol = volume(&pool, "tank/v", 1 << 20, 4096, true);
    vol.write(0, b"before", false).expect("write");
    vol.close();
    assert!(matches!(vol.read(0, 6), Err(VolError::Other(_))));
    assert!(matches!(
        vol.write(0, b"after", false),
        Err(VolError::Other(_))
    ));
    assert!(vol.trim(0, 4096).is_err() && vol.extents(0, 4096).is_err());
    assert!(vol.resize(2 << 20, false).is_err());
    assert!(
        matches!(vol.flush(), Err(VolError::Other(_))),
        "a closed volume's flush"
    );
    assert!(!vol.is_current());
    let fresh = reopen(&pool, "tank/v");
    assert!(fresh.is_current());
    assert_eq!(fresh.read(0, 6).expect("read"), b"before");
}

/// A read from memory never waits: while a transaction of the volume
/// holds its dataset (parked inside it here), it answers None at once
/// (the front end then reads on a blocking thread), and once the
/// transaction is done the same read is answered from memory.
#[test]
fn a_read_from_memory_never_waits_for_a_transaction() {
    use std::sync::mpsc;
    use std::time::Duration;
    const BS: usize = 16 << 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    let vol = volume(&pool, "tank/v", 1 << 20, BS as u32, true);
    vol.write(0, &pattern(1, 2 * BS), false).expect("write");
    pool.sync().expect("commit");
    assert!(vol.read(0, 2 * BS as u32).expect("read") == pattern(1, 2 * BS));
    assert!(
        matches!(vol.read_cached(0, 2 * BS as u32), Some(Ok(_))),
        "in memory after a read"
    );
    let (inside_tx, inside_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let holder = {
        let vol = vol.clone();
        std::thread::spawn(move || {
            vol.handle().txn(false, |_t| {
                inside_tx.send(()).expect("tell");
                let _ = release_rx.recv();
                Ok::<(), DsError>(())
            })
        })
    };
    inside_rx.recv().expect("inside the transaction");
    let (done_tx, done_rx) = mpsc::channel();
    {
        let vol = vol.clone();
        std::thread::spawn(move || {
            let _ = done_tx.send(vol.read_cached(0, 2 * BS as u32).is_none());
        });
    }
    let none = done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the read from memory waited for the transaction");
    assert!(none, "held: the read says it would wait");
    release_tx.send(()).expect("release");
    holder.join().expect("holder").expect("the transaction");
    let again = vol.read_cached(0, 2 * BS as u32);
    assert!(
        matches!(&again, Some(Ok(d)) if d.to_vec() == pattern(1, 2 * BS)),
        "answered from memory once the transaction is done"
    );
}

/// An encrypted volume is read from memory only while its key is loaded:
/// once the key is unloaded, a read from memory gives no bytes (not the
/// plaintext the cache held) and the usual read refuses.
#[test]
fn a_read_from_memory_of_an_encrypted_volume_needs_its_key() {
    const BS: usize = 16 << 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    tarn_testkit::datasets::encrypted(&pool, "tank/secret", "correct horse", &[]);
    let vol = volume(&pool, "tank/secret/v", 1 << 20, BS as u32, true);
    assert_eq!(
        tarn_testkit::datasets::info(&pool, "tank/secret/v")
            .encryptionroot
            .as_deref(),
        Some("tank/secret"),
        "the volume is encrypted"
    );
    vol.write(0, &pattern(5, 2 * BS), false).expect("write");
    pool.sync().expect("commit");
    assert!(vol.read(0, 2 * BS as u32).expect("read") == pattern(5, 2 * BS));
    assert!(
        matches!(vol.read_cached(0, 2 * BS as u32), Some(Ok(d)) if d.to_vec() == pattern(5, 2 * BS)),
        "read from memory with the key loaded"
    );
    // A lone block read from the disks (as a batch of one) is opened with
    // the key too.
    tarn_block::BlockCache::global().evict_pool(pool.guid());
    let lone = vol.read(BS as u64 + 4096, 4096).expect("a lone block");
    assert!(lone == pattern(5, 2 * BS)[BS + 4096..BS + 8192]);
    tarn_dataset::unload_key(&pool, "tank/secret").expect("unload the key");
    if let Some(Ok(d)) = vol.read_cached(0, 2 * BS as u32) {
        panic!(
            "a read from memory gave {} bytes after the key was unloaded",
            d.len()
        );
    }
    assert!(
        vol.read(0, 2 * BS as u32).is_err(),
        "the usual read refuses too"
    );
}

/// A power cut at any point of a sync that hands its rooms out in block
/// order loses no flushed write. The txg mixes blocks the intent log wrote
/// early (a flush of 1.5 MiB of whole blocks writes them in place, and its
/// log record names their rooms) with blocks written after the flush,
/// which the sync places; if the sync gave an early block's room to
/// another block, a cut after that write and before the commit would
/// leave the log naming a room that holds other bytes. Each round cuts
/// the power after a different number of device writes, then imports and
/// checks every block: flushed ones new, unflushed ones old or new (never
/// torn), the rest old.
#[test]
fn a_power_cut_in_a_sync_that_places_blocks_loses_no_flushed_write() {
    use tarn_vdev::fault::PowerSwitch;
    const BS: u64 = 16384;
    const BLOCKS: u64 = 256;
    let version = |b: u64, v: u64| pattern(b + v * BLOCKS, BS as usize);
    let order: Vec<u64> = (0..BLOCKS).map(|i| (i * 389) % BLOCKS).collect();
    let (flushed, later) = (&order[..96], &order[96..192]);
    // The sync takes some 46 device writes here: a cut after every second
    // one, and none.
    let mut cut = 0;
    for budget in (0..50).step_by(2).chain([u64::MAX]) {
        let dir = tempfile::tempdir().expect("tempdir");
        let pool = pool(dir.path());
        let vol = volume(&pool, "tank/v", BLOCKS * BS, BS as u32, true);
        for b in 0..BLOCKS {
            vol.write(b * BS, &version(b, 0), false).expect("write");
        }
        pool.sync().expect("sync");
        for &b in flushed {
            vol.write(b * BS, &version(b, 1), false).expect("write");
        }
        vol.flush().expect("flush");
        for &b in later {
            vol.write(b * BS, &version(b, 2), false).expect("write");
        }
        let switch = PowerSwitch::new();
        let leaves: Vec<_> = (0..4)
            .filter_map(|i| tarn_vdev::find_device(&dir.path().join(format!("d{i}"))))
            .collect();
        assert_eq!(leaves.len(), 4, "the pool's four devices");
        for l in &leaves {
            l.attach_switch(Some(switch.clone()));
        }
        switch.arm(budget, false);
        let synced = pool.sync().is_ok();
        assert!(synced || budget != u64::MAX, "a sync with the power on");
        cut += u32::from(!synced);
        for l in &leaves {
            l.attach_switch(None);
        }
        drop(leaves);
        drop(vol);
        let pool = crash_and_import(pool, dir.path());
        let vol = reopen(&pool, "tank/v");
        for b in 0..BLOCKS {
            let got = vol.read(b * BS, BS as u32).expect("read after the cut");
            let ok = if flushed.contains(&b) {
                got == version(b, 1)
            } else if later.contains(&b) {
                got == version(b, 2) || (!synced && got == version(b, 0))
            } else {
                got == version(b, 0)
            };
            assert!(
                ok,
                "block {b} after a cut at {budget} writes (sync done: {synced})"
            );
        }
    }
    assert!(cut >= 10, "only {cut} rounds cut a sync short");
}

/// Random writes of whole blocks get their rooms in the order they
/// arrive. The sync hands a txg's rooms out again in block order and
/// writes the blocks in room order, so the rooms touch: the sync's writes
/// are a few merged device writes rather than one per column, and a later
/// sequential read of the volume reads long runs of neighbouring blocks
/// (a few device reads per MiB) rather than each block's columns one by
/// one, as it would if every block kept the room its write got. The
/// contents read back right after an export, so every pointer names its
/// own block's room.
#[test]
fn random_writes_are_laid_out_in_block_order() {
    const BS: u64 = 16384;
    const BLOCKS: u64 = 512;
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    let vol = volume(&pool, "tank/v", BLOCKS * BS, BS as u32, true);
    pool.sync().expect("sync");
    let ops = |p: &Pool| -> (u64, u64) {
        let v = p.status().vdevs;
        let sum =
            |f: fn(&tarn_pool::status::Counters) -> u64| v.iter().map(|v| f(&v.counters)).sum();
        (sum(|c| c.write_ops), sum(|c| c.read_ops))
    };
    // 389 is odd, so this visits every block of 512 once, scattered.
    for b in (0..BLOCKS).map(|i| (i * 389) % BLOCKS) {
        vol.write(b * BS, &pattern(b, BS as usize), false)
            .expect("write");
    }
    let before = ops(&pool).0;
    pool.sync().expect("sync");
    let writes = ops(&pool).0 - before;
    // One by one, 512 blocks would be 2,048 writes (a column on each of
    // the four devices); the txg's own metadata adds a few dozen.
    assert!(writes < 512, "{writes} device writes for {BLOCKS} blocks");
    drop(vol);
    pool.export(false).expect("export");
    let pool = tarn_testkit::pools::attached(
        tarn_testkit::pools::try_import(&[dir.path()], "tank", false, tarn_testkit::pools::opts())
            .expect("import"),
    );
    let vol = reopen(&pool, "tank/v");
    let before = ops(&pool).1;
    const CHUNK: u64 = 64 * BS;
    for c in 0..BLOCKS * BS / CHUNK {
        let got = vol.read(c * CHUNK, CHUNK as u32).expect("read");
        for (i, block) in got.chunks(BS as usize).enumerate() {
            let b = c * CHUNK / BS + i as u64;
            assert!(block == pattern(b, BS as usize).as_slice(), "block {b}");
        }
    }
    let reads = ops(&pool).1 - before;
    // Block by block, 512 blocks on raidz1 of four are 1,536 reads (three
    // data columns each); in block order, each MiB is a run per device.
    assert!(
        reads < 300,
        "{reads} device reads for {BLOCKS} blocks read in order"
    );
}

/// A thick volume rolled back to a larger size takes back the reservation
/// that followed its size only if the pool can give it: otherwise the
/// rollback is refused and changes nothing, as a grow would be.
#[test]
fn a_rollback_that_needs_more_reserved_than_the_pool_has_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(dir.path());
    let v = volume(&pool, "tank/v", 32 << 20, 16384, false);
    tarn_dataset::snapshot(&pool, &["tank/v@big".into()], false).expect("snapshot");
    v.resize(4 << 20, true).expect("shrink");
    let get = |name: &str, prop: &str| -> u64 {
        let p = tarn_dataset::get_props(&pool, name, &[prop.into()]).expect("get");
        p[0].value.parse().expect("a number")
    };
    let small = get("tank/v", "reservation");
    // Another dataset reserves what is left.
    let left = get("tank", "available");
    tarn_dataset::create(
        &pool,
        "tank/hog",
        &props(&[("reservation", &(left - (1 << 20)).to_string())]),
        false,
    )
    .expect("reserve the rest");
    let r = tarn_dataset::rollback(&pool, "tank/v@big", false);
    assert!(matches!(r, Err(DsError::NoSpace(_))), "{r:?}");
    assert_eq!(get("tank/v", "volsize"), 4 << 20, "nothing changed");
    assert_eq!(get("tank/v", "reservation"), small);
    tarn_dataset::destroy(&pool, "tank/hog", false).expect("destroy");
    tarn_dataset::rollback(&pool, "tank/v@big", false).expect("rollback");
    assert_eq!(get("tank/v", "volsize"), 32 << 20);
    assert!(get("tank/v", "reservation") > 32 << 20);
}

/// A thick volume's writes that have not committed yet do not take room
/// from other datasets: their blocks fall inside its reservation, and
/// the pool's free space is already short of them. Counted a second time
/// as unused reservation, they left a filesystem beside a volume being
/// written with less room than it had, and near a full pool its writes
/// failed for want of space until the volume's txg committed.
#[test]
fn a_thick_volume_being_written_takes_no_room_from_other_datasets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(dir.path());
    let v = volume(&pool, "tank/v", 48 << 20, 16384, false);
    tarn_dataset::create(&pool, "tank/fs", &props(&[]), false).expect("fs");
    let fs = tarn_dataset::open(&pool, "tank/fs").expect("open fs");
    let available = |pool: &Pool| -> u64 {
        let p = tarn_dataset::get_props(pool, "tank/fs", &["available".into()]).expect("get");
        p[0].value.parse().expect("a number")
    };
    // Fill the filesystem until about 12 MiB are left for it.
    let mut n = 0u64;
    while available(&pool) > 20 << 20 {
        for _ in 0..32 {
            let key = n.to_be_bytes();
            fs.txn(true, |t| t.write_block(&key, pattern(n, 128 << 10)))
                .expect("fill");
            n += 1;
        }
        pool.sync().expect("commit");
    }
    let before = available(&pool);
    assert!(before > 12 << 20, "{before}");
    // The volume writes 24 MiB into its reservation, not committed yet.
    for i in 0..24u64 {
        v.write(i << 20, &pattern(1000 + i, 1 << 20), false)
            .expect("volume write");
    }
    let during = available(&pool);
    assert!(
        during + (1 << 20) >= before,
        "the filesystem's room fell from {before} to {during} while the volume wrote"
    );
    // And the filesystem can write what it had room for before.
    for i in 0..(before - (4 << 20)) / (128 << 10) {
        let key = (n + i).to_be_bytes();
        fs.txn(true, |t| t.write_block(&key, pattern(n + i, 128 << 10)))
            .expect("a write within the room the filesystem had");
    }
    pool.sync().expect("commit");
    for i in 0..24u64 {
        assert_eq!(
            v.read(i << 20, 1 << 20).expect("read"),
            pattern(1000 + i, 1 << 20)
        );
    }
}
