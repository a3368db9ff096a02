//! Labels: config copies, crash ordering, garbage, uberblock ring.

mod common;

use common::Hiccup;
use proptest::prelude::*;
use tarn_vdev::testing::MemLeaf;
use tarn_vdev::*;

fn cfg(txg: u64) -> LabelConfig {
    LabelConfig {
        version: 1,
        pool_name: "tank".into(),
        pool_guid: 0xDEAD_BEEF,
        state: PoolState::Active,
        txg,
        device_guid: 42,
        top_index: 0,
        ashift: 12,
        owner: Some("host:1234".into()),
        tree: vec![TopConfig {
            kind: VdevKind::Raidz { parity: 2 },
            guid: 9,
            children: (0..4)
                .map(|i| LeafConfig {
                    guid: 40 + i,
                    path: format!("/dev/disk{i}").into(),
                    offline: i == 3,
                })
                .collect(),
        }],
        logs: Vec::new(),
    }
}

fn offsets(l: &MemLeaf) -> [u64; 4] {
    label_offsets(l.size()).unwrap()
}

#[test]
fn layout_constants() {
    assert_eq!(
        label_offsets(MIN_LEAF_SIZE + 1000).unwrap(),
        [
            0,
            LABEL_SIZE,
            MIN_LEAF_SIZE - 2 * LABEL_SIZE,
            MIN_LEAF_SIZE - LABEL_SIZE
        ]
    );
    assert_eq!(
        data_end(MIN_LEAF_SIZE + 1000, 12),
        MIN_LEAF_SIZE - 2 * LABEL_SIZE
    );
    assert_eq!(data_end(1000, 12), 0);
    assert_eq!(label_offsets(4 * LABEL_SIZE - 1), None);
    assert_eq!((uberblock_slots(9), uberblock_slot_size(9)), (128, 1024));
    assert_eq!(uberblock_slots(10), 128);
    assert_eq!((uberblock_slots(12), uberblock_slot_size(12)), (32, 4096));
    assert_eq!(uberblock_slots(13), 16);
    // Nonsense shifts do not overflow.
    assert_eq!(uberblock_slots(200), 0);
    let _ = data_end(u64::MAX, 255);
}

#[test]
fn header_format_is_pinned() {
    let l = MemLeaf::new(MIN_LEAF_SIZE);
    write_label_config_all(&l, &cfg(7)).unwrap();
    assert_eq!(l.flush_count(), 2, "Even, flush, Odd, flush");
    let area = l.raw_read(0, LABEL_CONFIG_SIZE);
    assert_eq!(&area[..8], b"TARNLBL1");
    assert_eq!(area[8..12], 1u32.to_le_bytes());
    let len = u32::from_le_bytes(area[12..16].try_into().unwrap()) as usize;
    let body = &area[LABEL_HEADER_LEN..LABEL_HEADER_LEN + len];
    assert_eq!(&area[16..48], blake3::hash(body).as_bytes());
    let parsed: LabelConfig = serde_json::from_slice(body).unwrap();
    assert_eq!(parsed, cfg(7));
    assert!(area[LABEL_HEADER_LEN + len..].iter().all(|&b| b == 0));
    // All four copies are identical.
    for off in offsets(&l) {
        assert_eq!(l.raw_read(off, LABEL_CONFIG_SIZE), area);
    }
}

#[test]
fn roundtrip_and_newest_copy_wins() {
    let l = MemLeaf::new(MIN_LEAF_SIZE + 12345);
    write_label_config_all(&l, &cfg(5)).unwrap();
    let r = read_label(&l).unwrap();
    assert_eq!((r.config.clone(), r.valid_copies), (cfg(5), 4));

    // Crash after the Even half of an update: the new config wins from 2 copies.
    write_label_config(&l, &cfg(6), LabelHalf::Even).unwrap();
    let r = read_label(&l).unwrap();
    assert_eq!((r.config.txg, r.valid_copies), (6, 2));
    // L0 torn: L2 still has txg 6.
    let o = offsets(&l);
    l.corrupt(o[0] + 100, 1);
    let r = read_label(&l).unwrap();
    assert_eq!((r.config.txg, r.valid_copies), (6, 1));
    // L2 gone too: back to the old config in the Odd half.
    l.raw_write(o[2], &[0u8; 64]);
    let r = read_label(&l).unwrap();
    assert_eq!((r.config.txg, r.valid_copies), (5, 2));
    // Everything gone: a clear error naming each copy.
    l.corrupt(o[1], 8);
    l.corrupt(o[3] + 20, 1);
    let e = read_label(&l).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, VdevError::NoLabel { .. }));
    for what in [
        "no tarn label",
        "L0: checksum mismatch",
        "L1: bad magic",
        "L2: bad magic",
        "L3: checksum mismatch",
    ] {
        assert!(msg.contains(what), "{msg}");
    }
}

#[test]
fn unreadable_copies_are_skipped() {
    let l = MemLeaf::new(MIN_LEAF_SIZE);
    write_label_config_all(&l, &cfg(3)).unwrap();
    l.set_fail_reads(true);
    let e = read_label(&l).unwrap_err();
    assert!(e.to_string().contains("read error"), "{e}");
    assert!(read_uberblocks(&l, 12).is_empty());
}

#[test]
fn a_label_whose_every_copy_failed_to_read_is_read_once_more() {
    use std::sync::atomic::Ordering::SeqCst;
    let l = MemLeaf::new(MIN_LEAF_SIZE);
    write_label_config_all(&l, &cfg(3)).unwrap();
    // Every copy fails once: the second round finds all four.
    let h = Hiccup::new(std::sync::Arc::new(l), 4, false, false);
    let got = read_label(&h).unwrap();
    assert_eq!(got.config, cfg(3));
    assert_eq!(got.valid_copies, 4);
    assert_eq!(h.reads.load(SeqCst), 8);

    // Only once more: a device that keeps failing has no label.
    let l = MemLeaf::new(MIN_LEAF_SIZE);
    write_label_config_all(&l, &cfg(3)).unwrap();
    let h = Hiccup::new(std::sync::Arc::new(l), 8, false, false);
    let e = read_label(&h).unwrap_err();
    assert!(e.to_string().contains("a moment of trouble"), "{e}");
    assert_eq!(h.reads.load(SeqCst), 8);

    // One copy read and decoded: no second round.
    let l = MemLeaf::new(MIN_LEAF_SIZE);
    write_label_config_all(&l, &cfg(3)).unwrap();
    let h = Hiccup::new(std::sync::Arc::new(l), 3, false, false);
    assert_eq!(read_label(&h).unwrap().valid_copies, 1);
    assert_eq!(h.reads.load(SeqCst), 4);

    // Copies that read but hold no label are not read again.
    let h = Hiccup::new(
        std::sync::Arc::new(MemLeaf::new(MIN_LEAF_SIZE)),
        0,
        false,
        false,
    );
    assert!(read_label(&h).is_err());
    assert_eq!(h.reads.load(SeqCst), 4);
}

#[test]
fn oversized_config_is_refused() {
    let l = MemLeaf::new(MIN_LEAF_SIZE);
    let mut c = cfg(1);
    c.pool_name = "x".repeat(LABEL_CONFIG_SIZE);
    assert!(matches!(
        write_label_config_all(&l, &c),
        Err(VdevError::LabelEncode(_))
    ));
    c.pool_name = "ok".into();
    c.ashift = 30;
    assert!(matches!(
        write_label_config_all(&l, &c),
        Err(VdevError::LabelEncode(_))
    ));
    assert!(read_label(&l).is_err(), "nothing was written");
}

#[test]
fn small_and_truncated_devices() {
    for size in [0, 1, LABEL_SIZE, 4 * LABEL_SIZE, MIN_LEAF_SIZE - 1] {
        let l = MemLeaf::new(size);
        assert!(
            matches!(read_label(&l), Err(VdevError::TooSmall { .. })),
            "{size}"
        );
        assert!(matches!(
            write_label_config_all(&l, &cfg(1)),
            Err(VdevError::TooSmall { .. })
        ));
        assert!(write_uberblock(&l, 12, 0, b"x").is_err());
        assert!(read_uberblocks(&l, 12).is_empty());
    }
    // A labelled device cut short: the front copies survive, the tail ones moved.
    let big = MemLeaf::new(2 * MIN_LEAF_SIZE);
    write_label_config_all(&big, &cfg(8)).unwrap();
    let cut = MemLeaf::new(2 * MIN_LEAF_SIZE - 5 * LABEL_SIZE / 2);
    cut.raw_write(0, &big.raw_read(0, 2 * LABEL_SIZE as usize));
    let r = read_label(&cut).unwrap();
    assert_eq!((r.config.txg, r.valid_copies), (8, 2));
}

#[test]
fn uberblock_ring_roundtrip_in_all_labels() {
    for ashift in [9u8, 12, 13, 16] {
        let l = MemLeaf::new(MIN_LEAF_SIZE);
        let slots = uberblock_slots(ashift);
        let size = uberblock_slot_size(ashift);
        for slot in [0, 1, slots - 1] {
            let ub = vec![slot as u8 + 1; size.min(300 + slot)];
            write_uberblock(&l, ashift, slot, &ub).unwrap();
        }
        let all = read_uberblocks(&l, ashift);
        assert_eq!(all.len(), 4 * slots);
        for label in 0..4 {
            for slot in [0, 1, slots - 1] {
                let got = &all[label * slots + slot];
                let n = size.min(300 + slot);
                assert_eq!(got.len(), size);
                assert!(got[..n].iter().all(|&b| b == slot as u8 + 1));
                assert!(got[n..].iter().all(|&b| b == 0), "zero padded");
            }
            if slots > 3 {
                assert!(all[label * slots + 2].iter().all(|&b| b == 0));
            }
        }
        assert!(write_uberblock(&l, ashift, slots, b"x").is_err());
        assert!(write_uberblock(&l, ashift, 0, &vec![1; size + 1]).is_err());
        // The uberblock ring never touches the config area.
        write_label_config_all(&l, &cfg(2)).unwrap();
        write_uberblock(&l, ashift, 0, &vec![9; size]).unwrap();
        assert_eq!(read_label(&l).unwrap().valid_copies, 4);
    }
}

#[test]
fn clear_labels_forgets_the_pool() {
    let l = MemLeaf::new(MIN_LEAF_SIZE);
    write_label_config_all(&l, &cfg(2)).unwrap();
    write_uberblock(&l, 12, 3, b"ub").unwrap();
    clear_labels(&l).unwrap();
    assert!(matches!(read_label(&l), Err(VdevError::NoLabel { .. })));
    assert!(read_uberblocks(&l, 12)
        .iter()
        .all(|s| s.iter().all(|&b| b == 0)));
    assert!(clear_labels(&MemLeaf::new(1000)).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Random bytes where the labels should be: a clear error, never a panic.
    #[test]
    fn garbage_is_rejected(
        size in (MIN_LEAF_SIZE - 3)..(MIN_LEAF_SIZE + 3 * LABEL_SIZE),
        junk in proptest::collection::vec(any::<u8>(), 0..4096),
        magic_prefix in any::<bool>(),
        len_field in any::<u32>(),
    ) {
        let l = MemLeaf::new(size);
        let mut head = junk.clone();
        if magic_prefix && head.len() >= 16 {
            head[..8].copy_from_slice(&LABEL_MAGIC);
            head[8..12].copy_from_slice(&1u32.to_le_bytes());
            head[12..16].copy_from_slice(&len_field.to_le_bytes());
        }
        if let Some(offs) = label_offsets(size) {
            for o in offs {
                l.raw_write(o, &head);
                l.raw_write(o + LABEL_CONFIG_SIZE as u64, &junk);
            }
        }
        prop_assert!(read_label(&l).is_err());
        let ubs = read_uberblocks(&l, 12);
        prop_assert!(ubs.is_empty() || ubs.len() == 4 * uberblock_slots(12));
    }

    /// Damage to any proper subset of copies (torn, zeroed or random bytes
    /// anywhere in the config area) never hides the newest surviving config.
    #[test]
    fn damaged_copies_do_not_hide_good_ones(
        mask in 0u8..15,
        at in 0usize..LABEL_CONFIG_SIZE,
        junk in proptest::collection::vec(any::<u8>(), 1..64),
    ) {
        let l = MemLeaf::new(MIN_LEAF_SIZE);
        write_label_config_all(&l, &cfg(11)).unwrap();
        let offs = offsets(&l);
        let mut damaged = 0;
        for (i, o) in offs.iter().enumerate() {
            if mask & (1 << i) != 0 {
                // Overwrite with junk that differs from what is there.
                let old = l.raw_read(o + at as u64, junk.len());
                let new: Vec<u8> = junk.iter().zip(&old).map(|(j, b)| if j == b { !b } else { *j }).collect();
                l.raw_write(o + at as u64, &new);
                damaged += 1;
            }
        }
        let r = read_label(&l).unwrap();
        prop_assert_eq!(r.config, cfg(11));
        // Damage past the body in the zero fill is invisible: that copy stays valid.
        prop_assert!(usize::from(r.valid_copies) >= 4 - damaged);
    }
}
