//! Writing many blocks at once (`TopVdev::write_many`, pieces that touch
//! merged into one write per child) against writing them one by one: the
//! same bytes on every child, the same outcome per block, with healthy,
//! failing and absent children.

mod common;

use common::{config, mem_leaves, open, verifier, Hiccup};
use proptest::prelude::*;
use tarn_testkit::data::pattern;
use tarn_vdev::{Leaf, VdevKind, WriteOutcome, DATA_START};

fn kinds() -> impl Strategy<Value = (VdevKind, usize)> {
    prop_oneof![
        Just((VdevKind::Single, 1)),
        Just((VdevKind::Mirror, 2)),
        Just((VdevKind::Raidz { parity: 1 }, 4)),
        Just((VdevKind::Raidz { parity: 2 }, 5)),
        Just((VdevKind::Raidz { parity: 1 }, 3)),
    ]
}

/// Blocks of random sizes laid one after the other as an allocator would
/// (each at the end of the previous one's allocation), with some gaps.
fn layout(v: &tarn_vdev::TopVdev, sizes: &[(usize, bool)]) -> Vec<(u64, Vec<u8>)> {
    let mut at = 0u64;
    sizes
        .iter()
        .enumerate()
        .map(|(i, &(len, gap))| {
            if gap {
                at += v.alloc_size(4096);
            }
            let b = (at, pattern(i as u64 * 7 + len as u64, len));
            at += v.alloc_size(len as u64);
            b
        })
        .collect()
}

proptest! {
    #![proptest_config(tarn_testkit::data::cases(64))]

    #[test]
    fn write_many_is_write_one_by_one(
        (kind, n) in kinds(),
        sizes in proptest::collection::vec((1usize..200_000, proptest::bool::weighted(0.2)), 1..40),
        failing in proptest::option::of(0usize..5),
        absent in proptest::option::of(0usize..5),
    ) {
        let (a, b) = (mem_leaves(n), mem_leaves(n));
        let missing: Vec<usize> = absent.filter(|&c| c < n).into_iter().collect();
        let (va, vb) = (open(kind, 12, &a, &missing), open(kind, 12, &b, &missing));
        if let Some(f) = failing.filter(|&f| f < n) {
            a[f].set_fail_writes(true);
            b[f].set_fail_writes(true);
        }
        let blocks = layout(&va, &sizes);
        // Errors name the two vdevs' own (different) device paths: compare
        // the kind of error only.
        let kind = |e: tarn_vdev::VdevError| std::mem::discriminant(&e);
        let one: Vec<Result<WriteOutcome, _>> = blocks
            .iter()
            .map(|(o, d)| va.write(*o, d).map_err(kind))
            .collect();
        let refs: Vec<(u64, &[u8])> = blocks.iter().map(|(o, d)| (*o, &d[..])).collect();
        let many: Vec<Result<WriteOutcome, _>> = vb
            .write_many(&refs, 3)
            .into_iter()
            .map(|r| r.map_err(kind))
            .collect();
        // Per block: written or not alike. A failing child is faulted
        // after a number of errors, and a merged write counts as one error
        // while its children are written in parallel, so the block at
        // which the failing child becomes unusable differs between the two
        // (and, merged, with the threads' timing); a block with no piece
        // on it then lists it as missed (an unusable child misses the txg)
        // on one side only. Only the failing or absent child may differ,
        // never a healthy one, and every block with a piece on the failing
        // child lists it either way, so the txg's missed set is the same.
        prop_assert_eq!(one.len(), many.len());
        let unusable: Vec<usize> = failing.into_iter().chain(absent).collect();
        let mut union = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
        for (o, m) in one.iter().zip(&many) {
            match (o, m) {
                (Ok(o), Ok(m)) => {
                    let differ = o
                        .missed
                        .iter()
                        .filter(|c| !m.missed.contains(c))
                        .chain(m.missed.iter().filter(|c| !o.missed.contains(c)));
                    for c in differ {
                        prop_assert!(unusable.contains(c), "healthy child {} differs: {:?} {:?}", c, o, m);
                    }
                    union.0.extend(o.missed.iter().copied());
                    union.1.extend(m.missed.iter().copied());
                }
                (Err(a), Err(b)) => prop_assert_eq!(a, b),
                _ => prop_assert!(false, "one by one {:?}, merged {:?}", o, m),
            }
        }
        prop_assert_eq!(union.0, union.1);
        for f in a.iter().chain(b.iter()) {
            f.set_fail_writes(false);
        }
        // The same bytes on every child, and every written block reads
        // back through its checksum.
        let end = blocks.last().map_or(0, |(o, d)| o + va.alloc_size(d.len() as u64));
        for (la, lb) in a.iter().zip(&b) {
            let span = (end as usize).div_ceil(n.max(1)) + (1 << 20);
            prop_assert!(la.raw_read(0, span) == lb.raw_read(0, span));
        }
        for ((o, d), r) in blocks.iter().zip(&many) {
            if r.is_ok() {
                let got = vb.read(*o, d.len(), &verifier(d)).map_err(|e| e.to_string());
                prop_assert!(got.as_deref() == Ok(&d[..]), "block at {} reads back", o);
            }
        }
    }
}

#[test]
fn neighbouring_pieces_become_one_write_per_child() {
    let leaves = mem_leaves(4);
    let v = open(VdevKind::Raidz { parity: 1 }, 12, &leaves, &[]);
    let data: Vec<Vec<u8>> = (0..64).map(|i| pattern(i, 16 << 10)).collect();
    let mut at = 0;
    let blocks: Vec<(u64, &[u8])> = data
        .iter()
        .map(|d| {
            let b = (at, &d[..]);
            at += v.alloc_size(d.len() as u64);
            b
        })
        .collect();
    for r in v.write_many(&blocks, 2) {
        assert!(r.expect("written").missed.is_empty());
    }
    let ops: u64 = v.leaves().iter().map(|l| l.counters.write_ops).sum();
    // One by one this is 64 blocks × 4 columns = 256 writes; merged, a few
    // per child.
    assert!(ops <= 16, "{ops} writes for 64 neighbouring 16K blocks");
    for ((o, d), _) in blocks.iter().zip(0..) {
        assert_eq!(v.read(*o, d.len(), &verifier(d)).expect("read"), *d);
    }
}

#[test]
fn a_mirror_block_is_padded_with_zeros_on_every_side() {
    let leaves = mem_leaves(3);
    // Not zeros: the padding written must be told apart from space never
    // written.
    for l in &leaves {
        let size = l.size() as usize;
        l.write_at(&vec![0xff; size], 0).unwrap();
    }
    let v = open(VdevKind::Mirror, 12, &leaves, &[]);
    let data = pattern(7, 5000);
    let off = v.alloc_align() * 3;
    for r in v.write_many(&[(off, &data[..]), (off + 8192, &data[..100])], 1) {
        assert!(r.expect("written").missed.is_empty());
    }
    for l in &leaves {
        for (at, d) in [(off, &data[..]), (off + 8192, &data[..100])] {
            let mut got = vec![0u8; 4096 * d.len().div_ceil(4096)];
            l.read_at(&mut got, DATA_START + at).unwrap();
            assert_eq!(&got[..d.len()], d);
            assert!(got[d.len()..].iter().all(|&b| b == 0), "padding at {at}");
        }
    }
}

#[test]
fn an_absent_child_misses_a_block_that_has_no_column_on_it() {
    // raidz1 of 6: a 4K block has one data and one parity column, so four
    // children hold nothing of it; the absent one still missed the txg.
    let leaves = mem_leaves(6);
    let v = open(VdevKind::Raidz { parity: 1 }, 12, &leaves, &[5]);
    let d = pattern(3, 4096);
    let cols: Vec<usize> = v
        .extents(0, 4096)
        .unwrap()
        .iter()
        .map(|e| e.child)
        .collect();
    assert!(
        !cols.contains(&5),
        "the block has a column on child 5: {cols:?}"
    );
    assert_eq!(v.write(0, &d).expect("written").missed, vec![5]);
    let many = v.write_many(&[(0, &d[..])], 1);
    assert_eq!(many[0].as_ref().expect("written").missed, vec![5]);
}

proptest! {
    #![proptest_config(tarn_testkit::data::cases(64))]

    /// Reading many blocks at once gives each block what reading it alone
    /// gives: its bytes, or the same kind of error, whatever is corrupt,
    /// failing or absent; and it repairs what reading alone repairs (the
    /// children's bytes end up the same on both sides).
    #[test]
    fn read_many_is_read_one_by_one(
        (kind, n) in kinds(),
        sizes in proptest::collection::vec((1usize..100_000, proptest::bool::weighted(0.2)), 1..40),
        corrupt in proptest::collection::vec((0usize..5, 0u64..(4 << 20), 1u64..20_000), 0..4),
        failing in proptest::option::of(0usize..5),
        absent in proptest::option::of(0usize..5),
    ) {
        let (a, b) = (mem_leaves(n), mem_leaves(n));
        let missing: Vec<usize> = absent.filter(|&c| c < n).into_iter().collect();
        let (va, vb) = (open(kind, 12, &a, &missing), open(kind, 12, &b, &missing));
        let blocks = layout(&va, &sizes);
        for (o, d) in &blocks {
            let _ = va.write(*o, d);
            let _ = vb.write(*o, d);
        }
        // The same damage on both sides.
        for &(child, off, len) in &corrupt {
            if child < n {
                a[child].corrupt(off, len);
                b[child].corrupt(off, len);
            }
        }
        if let Some(f) = failing.filter(|&f| f < n) {
            a[f].set_fail_reads(true);
            b[f].set_fail_reads(true);
        }
        let kind_of = |e: tarn_vdev::VdevError| std::mem::discriminant(&e);
        let one: Vec<Result<Vec<u8>, _>> = blocks
            .iter()
            .map(|(o, d)| va.read(*o, d.len(), &verifier(d)).map_err(kind_of))
            .collect();
        let want: Vec<(u64, usize)> = blocks.iter().map(|(o, d)| (*o, d.len())).collect();
        let datas: Vec<&Vec<u8>> = blocks.iter().map(|(_, d)| d).collect();
        let many: Vec<Result<Vec<u8>, _>> = vb
            .read_many(&want, &|i, bytes| bytes == &datas[i][..])
            .into_iter()
            .zip(&want)
            .map(|(r, &(_, psize))| r.map(|b| b[..psize].to_vec()).map_err(kind_of))
            .collect();
        prop_assert_eq!(one.len(), many.len());
        for (k, (o, m)) in one.iter().zip(&many).enumerate() {
            prop_assert!(o == m, "block {}: alone {:?}, many {:?}", k, o.as_ref().map(|v| v.len()), m.as_ref().map(|v| v.len()));
            if let Ok(bytes) = m {
                prop_assert!(bytes == datas[k], "block {} read back other bytes", k);
            }
        }
        // Whatever reading alone repaired, reading many repaired too.
        for f in a.iter().chain(b.iter()) {
            f.set_fail_reads(false);
        }
        for (o, d) in &blocks {
            let ra = va.read(*o, d.len(), &verifier(d)).map_err(kind_of);
            let rb = vb.read(*o, d.len(), &verifier(d)).map_err(kind_of);
            prop_assert_eq!(ra.is_ok(), rb.is_ok());
        }
    }
}

#[test]
fn neighbouring_blocks_are_read_in_a_few_reads_per_child() {
    let leaves = mem_leaves(4);
    let v = open(VdevKind::Raidz { parity: 1 }, 12, &leaves, &[]);
    let data: Vec<Vec<u8>> = (0..64).map(|i| pattern(i, 16 << 10)).collect();
    let mut at = 0;
    let mut want = Vec::new();
    for d in &data {
        v.write(at, d).expect("written");
        want.push((at, d.len()));
        at += v.alloc_size(d.len() as u64);
    }
    let before: u64 = v.leaves().iter().map(|l| l.counters.read_ops).sum();
    let got = v.read_many(&want, &|i, b| b == &data[i][..]);
    let reads = v.leaves().iter().map(|l| l.counters.read_ops).sum::<u64>() - before;
    // Alone, 64 blocks × 3 data columns = 192 reads; merged, a few per
    // child.
    assert!(reads <= 12, "{reads} reads for 64 neighbouring 16K blocks");
    for (g, d) in got.into_iter().zip(&data) {
        assert_eq!(&g.expect("read")[..d.len()], &d[..]);
    }
    // A column that does not verify: that block is read again alone and
    // reconstructed (and repaired); the others stay as they were.
    let cols = v.extents(want[10].0, want[10].1 as u64).unwrap();
    let col = cols.iter().find(|e| !e.parity).expect("a data column");
    let good = leaves[col.child].raw_read(col.leaf_offset, 512);
    leaves[col.child].corrupt(col.leaf_offset, 512);
    assert_ne!(leaves[col.child].raw_read(col.leaf_offset, 512), good);
    let got = v.read_many(&want, &|i, b| b == &data[i][..]);
    for (g, d) in got.into_iter().zip(&data) {
        assert_eq!(
            &g.expect("read, reconstructed where needed")[..d.len()],
            &d[..]
        );
    }
    assert_eq!(
        leaves[col.child].raw_read(col.leaf_offset, 512),
        good,
        "the damaged column was repaired"
    );
}

/// A merged read that went wrong where reading the block alone then
/// worked still counts the error on the child it came from, as reading
/// alone counts it, and only once: a failure as a read error, wrong bytes
/// as a checksum error, the column then written again from the verified
/// block. Wrong once (a flaky cable), or every time past the page cache
/// while the read alone gets a good copy (a column that rotted under a
/// cached one), or wrong on the device for good (a failing disk, a
/// damaged column: counted, and repaired, by the read alone, not twice).
#[test]
fn a_merged_read_that_went_wrong_once_is_counted_once() {
    use std::sync::Arc;
    #[derive(Clone, Copy, Debug)]
    enum Wrong {
        Once,
        PastTheCache,
        ForGood,
    }
    for flip in [false, true] {
        for wrong in [Wrong::Once, Wrong::PastTheCache, Wrong::ForGood] {
            let mems = mem_leaves(4);
            // Only the merged reads go wrong on it: the read alone is
            // another.
            let flaky = Arc::new(Hiccup::new(mems[1].clone(), 0, flip, true));
            let leaves: Vec<Option<Arc<dyn Leaf>>> = mems
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    Some(if i == 1 {
                        flaky.clone() as Arc<dyn Leaf>
                    } else {
                        l.clone() as Arc<dyn Leaf>
                    })
                })
                .collect();
            let v = tarn_vdev::TopVdev::open(&config(VdevKind::Raidz { parity: 1 }, 4), 12, leaves)
                .expect("open vdev");
            // A lone 16K block: three data columns, one of them on child 1.
            let data = pattern(5, 16 << 10);
            v.write(0, &data).expect("written");
            let cols = v.extents(0, data.len() as u64).unwrap();
            let col = cols
                .iter()
                .find(|e| !e.parity && e.child == 1)
                .expect("a data column on child 1");
            let writes = v.leaves()[1].counters.write_ops;
            let left = |n| flaky.left.store(n, std::sync::atomic::Ordering::SeqCst);
            match (wrong, flip) {
                (Wrong::Once, _) => left(1),
                (Wrong::PastTheCache, _) => left(u32::MAX),
                (Wrong::ForGood, true) => mems[1].corrupt(col.leaf_offset, 512),
                (Wrong::ForGood, false) => mems[1].set_fail_reads(true),
            }
            let got = v.read_many(&[(0, data.len())], &|_, b| b == &data[..]);
            let got = got.into_iter().next().unwrap().expect("the block");
            assert!(got[..data.len()] == data[..]);
            let c = &v.leaves()[1].counters;
            let (errors, other) = if flip {
                (c.cksum_errors, c.read_errors)
            } else {
                (c.read_errors, c.cksum_errors)
            };
            let what = format!("flip {flip}, {wrong:?}: {c:?}");
            assert_eq!((errors, other), (1, 0), "{what}");
            if flip {
                assert_eq!(c.write_ops - writes, 1, "the column written again: {what}");
                mems[1].set_fail_reads(false);
                assert_eq!(
                    mems[1].raw_read(col.leaf_offset, 512),
                    data[..512].to_vec(),
                    "{what}"
                );
            }
            for i in [0, 2, 3] {
                let c = &v.leaves()[i].counters;
                assert_eq!((c.read_errors, c.cksum_errors), (0, 0), "child {i}");
            }
        }
    }
}
