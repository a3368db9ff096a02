//! Single and mirror vdevs: read, self-heal, scrub.

mod common;

use common::{mem_leaves, open, verifier};
use proptest::prelude::*;
use tarn_testkit::data::pattern;
use tarn_vdev::{VdevError, VdevKind, DATA_START};

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Any proper subset of sides corrupted: correct data, and after read plus
    /// scrub every side holds the data again; all sides corrupted: Unrecoverable.
    #[test]
    fn mirror_heals_any_proper_subset(
        n in 2usize..=4,
        mask in 1u8..16,
        psize in 1usize..=200_000,
        ashift in prop_oneof![Just(9u8), Just(12u8)],
        seed in any::<u64>(),
    ) {
        let leaves = mem_leaves(n);
        let v = open(VdevKind::Mirror, ashift, &leaves, &[]);
        let data = pattern(seed, psize);
        let off = 3 << 20;
        v.write(off, &data).unwrap();
        let bad: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
        for &i in &bad {
            leaves[i].corrupt(DATA_START + off + (seed % psize as u64), 1);
        }
        let verify = verifier(&data);
        let res = v.read(off, psize, &verify);
        if bad.len() == n {
            prop_assert!(matches!(res, Err(VdevError::Unrecoverable { .. })), "expected Unrecoverable");
            prop_assert!(matches!(v.scrub(off, psize, &verify), Err(VdevError::Unrecoverable { .. })), "scrub: expected Unrecoverable");
        } else {
            prop_assert_eq!(res.unwrap(), data.clone());
            let s = v.scrub(off, psize, &verify).unwrap();
            for l in &leaves {
                prop_assert_eq!(l.raw_read(DATA_START + off, psize), data.clone());
            }
            // Read healed the sides it tried before the good one; scrub the rest.
            let total: u64 = v.leaves().iter().map(|l| l.counters.cksum_errors).sum();
            prop_assert_eq!(total, bad.len() as u64);
            prop_assert!(s.bad_children.iter().all(|c| bad.contains(c)));
            let s = v.scrub(off, psize, &verify).unwrap();
            prop_assert_eq!(s.repaired_bytes, 0);
        }
    }
}

#[test]
fn mirror_all_but_one_corrupted_reads_and_heals() {
    let leaves = mem_leaves(3);
    let v = open(VdevKind::Mirror, 12, &leaves, &[]);
    let data = pattern(1, 10_000);
    v.write(0, &data).unwrap();
    leaves[0].corrupt(DATA_START, 4096);
    leaves[1].corrupt(DATA_START + 5000, 10);
    let got = v.read(0, data.len(), &verifier(&data)).unwrap();
    assert_eq!(got, data);
    // Read tried 0, then 1, then found 2 good: both bad sides were rewritten.
    for l in &leaves {
        assert_eq!(l.raw_read(DATA_START, data.len()), data);
    }
    let info = v.leaves();
    assert_eq!(info[0].counters.cksum_errors, 1);
    assert_eq!(info[1].counters.cksum_errors, 1);
    assert_eq!(info[2].counters.cksum_errors, 0);
    // Padding past psize is zero on disk.
    assert_eq!(leaves[2].raw_read(DATA_START + 10_000, 2288), vec![0; 2288]);
}

#[test]
fn mirror_read_errors_fall_over_and_heal() {
    let leaves = mem_leaves(2);
    let v = open(VdevKind::Mirror, 9, &leaves, &[]);
    let data = pattern(2, 4096);
    v.write(512, &data).unwrap();
    leaves[0].set_fail_reads(true);
    assert_eq!(v.read(512, 4096, &verifier(&data)).unwrap(), data);
    let info = v.leaves();
    assert_eq!(info[0].counters.read_errors, 1);
    assert_eq!(info[0].counters.write_ops, 2, "the write plus the repair");
    let s = v.scrub(512, 4096, &verifier(&data)).unwrap();
    assert_eq!(s.bad_children, vec![0]);
}

#[test]
fn single_detects_but_cannot_repair() {
    let leaves = mem_leaves(1);
    let v = open(VdevKind::Single, 12, &leaves, &[]);
    assert_eq!(v.redundancy(), 0);
    let data = pattern(3, 5000);
    v.write(8192, &data).unwrap();
    assert_eq!(v.read(8192, 5000, &verifier(&data)).unwrap(), data);
    leaves[0].corrupt(DATA_START + 8192, 1);
    let e = v.read(8192, 5000, &verifier(&data)).unwrap_err();
    assert!(matches!(e, VdevError::Unrecoverable { .. }), "{e}");
    assert_eq!(v.leaves()[0].counters.cksum_errors, 1);
}

/// With self-heal off a read still returns the right bytes from the good
/// side but writes nothing back; turned on again, the next read heals.
#[test]
fn self_heal_can_be_switched_off() {
    for kind in [VdevKind::Mirror, VdevKind::Raidz { parity: 1 }] {
        let leaves = mem_leaves(3);
        let v = open(kind, 12, &leaves, &[]);
        let data = pattern(5, 64 * 1024);
        let off = 1 << 20;
        v.write(off, &data).unwrap();
        let damaged = leaves[0].raw_read(DATA_START, 8 << 20);
        leaves[0].corrupt(DATA_START, 8 << 20);
        let corrupted = leaves[0].raw_read(DATA_START, 8 << 20);
        assert_ne!(damaged, corrupted);
        v.set_self_heal(false);
        assert_eq!(
            v.read(off, data.len(), &verifier(&data)).unwrap(),
            data,
            "{kind:?}"
        );
        assert_eq!(
            leaves[0].raw_read(DATA_START, 8 << 20),
            corrupted,
            "{kind:?}: wrote while self-heal was off"
        );
        v.set_self_heal(true);
        assert_eq!(
            v.read(off, data.len(), &verifier(&data)).unwrap(),
            data,
            "{kind:?}"
        );
        assert_ne!(
            leaves[0].raw_read(DATA_START, 8 << 20),
            corrupted,
            "{kind:?}: did not heal once on again"
        );
    }
}

/// A failed write-back is reported once, to the flush that meets it, and
/// the pages are gone: a writer that flushes after another caller's flush
/// failed hears of it through the mark it took before writing, on one
/// device (an error) and on a mirror (that side is named as not durable),
/// though its own flush succeeds.
#[test]
fn a_flush_failure_met_by_another_caller_is_reported_to_every_writer_before_it() {
    use std::sync::Arc;
    use tarn_vdev::{Fault, FaultKind, FaultLeaf, Leaf};
    for (kind, n) in [(VdevKind::Single, 1), (VdevKind::Mirror, 2)] {
        let mem = mem_leaves(n);
        let faulty: Vec<Arc<FaultLeaf>> = mem
            .iter()
            .map(|m| Arc::new(FaultLeaf::new(m.clone(), 4096)))
            .collect();
        faulty[n - 1].track_unflushed(true);
        let v = tarn_vdev::TopVdev::open(
            &common::config(kind, n),
            12,
            faulty
                .iter()
                .map(|l| Some(l.clone() as Arc<dyn Leaf>))
                .collect(),
        )
        .unwrap();
        let mark = v.flush_mark();
        let data = pattern(9, 8192);
        v.write(0, &data).unwrap();
        // Another caller's flush meets the failure.
        faulty[n - 1].inject(Fault::always(FaultKind::FlushError));
        let other = v.flush();
        faulty[n - 1].clear();
        // A flush of its own writes now succeeds; the mark says otherwise.
        assert!(v.flush().is_ok());
        let mine = v.flush_since(&mark);
        match kind {
            VdevKind::Single => {
                assert!(other.is_err());
                assert!(mine.is_err(), "{mine:?}");
                let e = v.read(0, 8192, &verifier(&data)).unwrap_err();
                assert!(matches!(e, VdevError::Unrecoverable { .. }), "{e}");
            }
            _ => {
                assert_eq!(other.unwrap(), vec![1]);
                assert_eq!(mine.unwrap(), vec![1]);
            }
        }
        // A mark taken after the failure does not see it again.
        assert!(v.flush_since(&v.flush_mark()).is_ok());
    }
}
