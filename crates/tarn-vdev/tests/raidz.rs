//! raidz: encode, reconstruct, self-heal and scrub over in-memory leaves.

mod common;

use std::sync::Arc;

use common::{mem_leaves, open, verifier};
use proptest::prelude::*;
use proptest::sample::Index;
use tarn_testkit::data::pattern;
use tarn_vdev::testing::MemLeaf;
use tarn_vdev::{ChildExtent, TopVdev, VdevError, VdevKind};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Missing,
    ReadError,
    Corrupt,
}

fn raw(leaves: &[Arc<MemLeaf>], e: &ChildExtent) -> Vec<u8> {
    leaves[e.child].raw_read(e.leaf_offset, e.len as usize)
}

/// Writes one block on a healthy vdev and returns (vdev, extents, raw column bytes).
fn write_block(
    leaves: &[Arc<MemLeaf>],
    kind: VdevKind,
    ashift: u8,
    offset: u64,
    data: &[u8],
) -> (Vec<ChildExtent>, Vec<Vec<u8>>) {
    let v = open(kind, ashift, leaves, &[]);
    let out = v.write(offset, data).unwrap();
    assert!(out.missed.is_empty());
    let ext = v.extents(offset, data.len() as u64).unwrap();
    let cols = ext.iter().map(|e| raw(leaves, e)).collect();
    (ext, cols)
}

fn aligned_offset(v: &TopVdev, slot: u64) -> u64 {
    let align = v.alloc_align();
    (slot * (1 << 20)) / align * align
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]

    /// Up to `parity` lost, unreadable or corrupted columns: read returns the
    /// exact data, heals what it touched, scrub heals the rest, and a second
    /// scrub finds nothing.
    #[test]
    fn raidz_recovers_from_up_to_parity_faults(
        parity in 1usize..=3,
        extra in 0usize..=9,
        ashift in prop_oneof![Just(9u8), Just(12u8)],
        // Small blocks, and large ones whose data columns are read in
        // parallel.
        psize in prop_oneof![1usize..=64 * 1024, 200usize * 1024..=1024 * 1024],
        slot in 0u64..48,
        seed in any::<u64>(),
        picks in proptest::collection::vec((any::<Index>(), 0u8..3, any::<u32>(), any::<u32>()), 0..=3),
    ) {
        let width = (parity + 2 + extra).min(12);
        let kind = VdevKind::Raidz { parity: parity as u8 };
        let leaves = mem_leaves(width);
        let data = pattern(seed, psize);
        let offset = aligned_offset(&open(kind, ashift, &leaves, &[]), slot);
        let (ext, cols) = write_block(&leaves, kind, ashift, offset, &data);

        // Choose distinct columns to damage, at most `parity` of them.
        let mut free: Vec<usize> = (0..ext.len()).collect();
        let mut faults: Vec<(usize, Fault)> = Vec::new();
        let mut corrupt_at = vec![0u64; ext.len()];
        for (idx, kind_sel, a, b) in picks.iter().take(parity) {
            if free.is_empty() { break; }
            let c = free.remove(idx.index(free.len()));
            let f = [Fault::Missing, Fault::ReadError, Fault::Corrupt][*kind_sel as usize];
            let e = &ext[c];
            match f {
                Fault::Missing => {}
                Fault::ReadError => leaves[e.child].set_fail_reads(true),
                Fault::Corrupt => {
                    let start = u64::from(*a) % e.len;
                    let len = 1 + u64::from(*b) % (e.len - start);
                    leaves[e.child].corrupt(e.leaf_offset + start, len);
                    corrupt_at[c] = start;
                }
            }
            faults.push((c, f));
        }
        let missing: Vec<usize> = faults.iter().filter(|f| f.1 == Fault::Missing).map(|f| ext[f.0].child).collect();
        let v = open(kind, ashift, &leaves, &missing);
        let verify = verifier(&data);

        let got = v.read(offset, psize, &verify).unwrap();
        prop_assert_eq!(&got, &data);

        // Where each data column starts in the block's byte stream.
        let mut data_pos = vec![0u64; ext.len()];
        let mut pos = 0;
        for (c, e) in ext.iter().enumerate().filter(|(_, e)| !e.parity) {
            data_pos[c] = pos;
            pos += e.len;
        }
        // Faults the block checksum can see: lost data columns, or corruption
        // of real data bytes (not parity, not the padding past psize).
        let touches_data = faults.iter().any(|(c, f)| {
            !ext[*c].parity && (*f != Fault::Corrupt || data_pos[*c] + corrupt_at[*c] < psize as u64)
        });
        let info = v.leaves();
        let fault_of = |child: usize| faults.iter().find(|(c, _)| ext[*c].child == child).map(|f| f.1);
        if touches_data {
            // The slow path recomputed the whole stripe: every column on a
            // readable child now holds exactly what was written, and only the
            // children we damaged are blamed.
            for (c, e) in ext.iter().enumerate() {
                match fault_of(e.child) {
                    Some(Fault::Missing) => {}
                    Some(Fault::ReadError) => prop_assert!(info[e.child].counters.read_errors >= 1),
                    Some(Fault::Corrupt) => prop_assert_eq!(info[e.child].counters.cksum_errors, 1),
                    None => prop_assert_eq!(info[e.child].counters.cksum_errors, 0),
                }
                if fault_of(e.child) != Some(Fault::Missing) {
                    prop_assert_eq!(raw(&leaves, e), cols[c].clone(), "column {} not healed by read", c);
                }
            }
        }

        // Scrub checks parity too, so every corrupted column is fixed now.
        let s = v.scrub(offset, psize, &verify).unwrap();
        for (c, f) in &faults {
            if *f == Fault::Corrupt {
                // Corrupt parity or padding is only noticed by scrub; read already fixed the rest.
                prop_assert_eq!(s.bad_children.contains(&ext[*c].child), !touches_data);
            }
        }
        for (c, e) in ext.iter().enumerate() {
            prop_assert_eq!(raw(&leaves, e), cols[c].clone(), "column {} differs after scrub", c);
        }

        // With every device back, a second scrub finds nothing to do.
        for l in &leaves { l.set_fail_reads(false); }
        let v = open(kind, ashift, &leaves, &[]);
        let s = v.scrub(offset, psize, &verify).unwrap();
        prop_assert_eq!(s.repaired_bytes, 0);
        prop_assert!(s.bad_children.is_empty());
        prop_assert_eq!(v.read(offset, psize, &verify).unwrap(), data);
    }

    /// More damage than parity: either the exact data (damage only where it
    /// does not matter) or Unrecoverable — never wrong bytes, never a panic.
    #[test]
    fn raidz_beyond_parity_never_returns_wrong_data(
        parity in 1usize..=3,
        extra in 0usize..=7,
        ashift in prop_oneof![Just(9u8), Just(12u8)],
        psize in 1usize..=64 * 1024,
        seed in any::<u64>(),
        picks in proptest::collection::vec(any::<Index>(), 2..=5),
    ) {
        let width = (parity + 2 + extra).min(12);
        let kind = VdevKind::Raidz { parity: parity as u8 };
        let leaves = mem_leaves(width);
        let data = pattern(seed, psize);
        let (ext, _) = write_block(&leaves, kind, ashift, 0, &data);
        let mut free: Vec<usize> = (0..ext.len()).collect();
        let mut bad_data_cols = 0;
        for idx in picks.iter().take(parity + 2) {
            if free.is_empty() { break; }
            let e = &ext[free.remove(idx.index(free.len()))];
            leaves[e.child].corrupt(e.leaf_offset, e.len);
            bad_data_cols += usize::from(!e.parity);
        }
        let v = open(kind, ashift, &leaves, &[]);
        match v.read(0, psize, &verifier(&data)) {
            Ok(got) => {
                prop_assert_eq!(got, data);
                prop_assert!(bad_data_cols <= parity);
            }
            Err(VdevError::Unrecoverable { .. }) => prop_assert!(bad_data_cols > 0),
            Err(e) => prop_assert!(false, "unexpected error {}", e),
        }
    }
}

#[test]
fn parity_plus_one_bad_data_columns_is_unrecoverable() {
    for parity in 1..=3u8 {
        let width = 8;
        let kind = VdevKind::Raidz { parity };
        let leaves = mem_leaves(width);
        let data = pattern(parity.into(), 64 * 1024);
        let (ext, cols) = write_block(&leaves, kind, 12, 0, &data);
        for e in ext
            .iter()
            .filter(|e| !e.parity)
            .take(usize::from(parity) + 1)
        {
            leaves[e.child].corrupt(e.leaf_offset + 100, 1);
        }
        let v = open(kind, 12, &leaves, &[]);
        let verify = verifier(&data);
        let err = v.read(0, data.len(), &verify).unwrap_err();
        assert!(matches!(err, VdevError::Unrecoverable { .. }), "{err}");
        assert!(matches!(
            v.scrub(0, data.len(), &verify),
            Err(VdevError::Unrecoverable { .. })
        ));
        // Nothing was "repaired" with a wrong guess: parity columns are untouched.
        for (c, e) in ext.iter().enumerate().filter(|(_, e)| e.parity) {
            assert_eq!(raw(&leaves, e), cols[c]);
        }
    }
}

#[test]
fn scrub_repairs_parity_that_read_does_not_see() {
    let kind = VdevKind::Raidz { parity: 2 };
    let leaves = mem_leaves(6);
    let data = pattern(9, 100_000);
    let (ext, cols) = write_block(&leaves, kind, 12, 0, &data);
    let p0 = &ext[0];
    assert!(p0.parity);
    leaves[p0.child].corrupt(p0.leaf_offset + 10, 50);

    let v = open(kind, 12, &leaves, &[]);
    let verify = verifier(&data);
    assert_eq!(v.read(0, data.len(), &verify).unwrap(), data);
    assert_ne!(raw(&leaves, p0), cols[0], "read must not need parity");

    let s = v.scrub(0, data.len(), &verify).unwrap();
    assert_eq!(s.bad_children, vec![p0.child]);
    assert_eq!(s.repaired_bytes, p0.len);
    assert_eq!(raw(&leaves, p0), cols[0]);
    assert_eq!(v.leaves()[p0.child].counters.cksum_errors, 1);

    let s = v.scrub(0, data.len(), &verify).unwrap();
    assert_eq!(s.repaired_bytes, 0);
    assert!(s.bad_children.is_empty());
}

/// An unreadable short data column rebuilt through a parity column whose last
/// row is corrupt: the data verifies, but the rebuilt column's zero tail picks
/// up garbage. Parity must be recomputed from the zero-extended data, or the
/// repair would write wrong bytes into the good parity column.
#[test]
fn rebuilt_short_column_does_not_poison_parity() {
    let kind = VdevKind::Raidz { parity: 2 };
    let leaves = mem_leaves(6);
    // 9 data sectors on 4 data columns: q = 2, r = 1 -> columns 0..3 big (3 sectors), 3..6 short.
    let data = pattern(5, 9 * 512);
    let (ext, cols) = write_block(&leaves, kind, 9, 0, &data);
    assert_eq!(ext[0].len, 3 * 512);
    assert_eq!(ext[5].len, 2 * 512);
    leaves[ext[0].child].corrupt(ext[0].leaf_offset + 2 * 512, 512);
    leaves[ext[5].child].set_fail_reads(true);
    let v = open(kind, 9, &leaves, &[]);
    assert_eq!(v.read(0, data.len(), &verifier(&data)).unwrap(), data);
    for c in 0..5 {
        assert_eq!(raw(&leaves, &ext[c]), cols[c], "column {c}");
    }
    assert_eq!(v.leaves()[ext[1].child].counters.cksum_errors, 0);
}

/// Damage only in the zero padding after the block's last byte: the checksum
/// cannot see it, read ignores it, scrub rewrites the data column (not the
/// parity, which is right).
#[test]
fn scrub_repairs_padding_without_touching_parity() {
    let kind = VdevKind::Raidz { parity: 1 };
    let leaves = mem_leaves(4);
    let data = pattern(8, 1000);
    let (ext, cols) = write_block(&leaves, kind, 12, 0, &data);
    assert_eq!(ext.len(), 2);
    leaves[ext[1].child].corrupt(ext[1].leaf_offset + 2000, 3);
    let v = open(kind, 12, &leaves, &[]);
    let verify = verifier(&data);
    assert_eq!(v.read(0, data.len(), &verify).unwrap(), data);
    let s = v.scrub(0, data.len(), &verify).unwrap();
    assert_eq!(s.bad_children, vec![ext[1].child]);
    assert_eq!(raw(&leaves, &ext[0]), cols[0]);
    assert_eq!(raw(&leaves, &ext[1]), cols[1]);
}

#[test]
fn degraded_write_reports_missed_children_and_reads_back() {
    let kind = VdevKind::Raidz { parity: 1 };
    let leaves = mem_leaves(5);
    let v = open(kind, 9, &leaves, &[3]);
    let data = pattern(3, 20_000);
    let out = v.write(0, &data).unwrap();
    assert_eq!(out.missed, vec![3]);
    assert_eq!(v.read(0, data.len(), &verifier(&data)).unwrap(), data);

    // A second failure on this block is too many for raidz1.
    leaves[1].set_fail_writes(true);
    let e = v.write(4096, &data).unwrap_err();
    assert!(
        matches!(e, VdevError::InsufficientReplicas { op: "write", .. }),
        "{e}"
    );
}

#[test]
fn alloc_size_and_align() {
    let leaves = mem_leaves(5);
    let v = open(VdevKind::Raidz { parity: 2 }, 12, &leaves, &[]);
    assert_eq!(v.alloc_align(), 3 * 4096);
    // 1 byte: 1 data + 2 parity sectors = 3.
    assert_eq!(v.alloc_size(1), 3 * 4096);
    // 4 data sectors on 3 data columns: 2 rows -> 4 + 4 = 8, padded to 9.
    assert_eq!(v.alloc_size(4 * 4096), 9 * 4096);
    assert_eq!(v.asize() % v.alloc_align(), 0);
    assert_eq!(v.redundancy(), 2);
}
