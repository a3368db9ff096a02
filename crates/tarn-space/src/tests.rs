use super::*;
use proptest::prelude::*;

const A: u64 = 4096;

fn bad_free(r: Result<(), SpaceError>) -> String {
    match r {
        Err(SpaceError::BadFree { why, .. }) => why,
        other => panic!("expected BadFree, got {other:?}"),
    }
}

#[test]
fn new_rounds_asize_and_starts_free() {
    let m = SpaceMap::new(10 * A + 100, A);
    assert_eq!(
        (m.asize(), m.align(), m.free(), m.allocated()),
        (10 * A, A, 10 * A, 0)
    );
    assert_eq!(m.largest_free(), 10 * A);
    assert!(m.allocated_extents().is_empty());
    let empty = SpaceMap::new(100, 512);
    assert_eq!((empty.asize(), empty.largest_free()), (0, 0));
    assert_eq!(SpaceMap::decode(&empty.encode()).unwrap(), empty);
    let mut m = SpaceMap::new(4 * A, A);
    assert_eq!(m.alloc(0).unwrap(), 0); // a zero-size request takes one unit
    assert_eq!(m.allocated(), A);
}

#[test]
fn sequential_allocations_are_contiguous() {
    let mut m = SpaceMap::new(1 << 30, A);
    let mut expect = 0;
    for i in 1..100u64 {
        let size = (i % 7 + 1) * 1000; // unaligned sizes round up to align
        assert_eq!(m.alloc(size).unwrap(), expect);
        expect += size.div_ceil(A) * A;
    }
    assert_eq!(m.allocated_extents(), vec![(0, expect)]);
    // A hole behind the cursor is not reused while space ahead remains.
    m.free_now(0, 4 * A).unwrap();
    assert_eq!(m.alloc(A).unwrap(), expect);
    assert_eq!(m.alloc(A).unwrap(), expect + A);
}

#[test]
fn next_fit_wraps_to_first_fit() {
    let mut m = SpaceMap::new(8 * A, A);
    for _ in 0..8 {
        m.alloc(A).unwrap();
    }
    m.free_now(2 * A, A).unwrap();
    m.free_now(5 * A, 2 * A).unwrap();
    assert_eq!(m.alloc(A).unwrap(), 2 * A); // first fit from 0 after the cursor hit the end
    assert_eq!(m.alloc(A).unwrap(), 5 * A); // next fit continues after it
    assert_eq!(m.alloc(A).unwrap(), 6 * A);
    // The cursor may sit inside a free extent after neighbours merge:
    // allocation continues there rather than restarting at the extent's start.
    m.free_now(4 * A, 2 * A).unwrap();
    assert_eq!(m.alloc(A).unwrap(), 4 * A); // cursor now 5 * A
    m.free_now(4 * A, A).unwrap(); // merges into the free extent [4, 6) * A
    assert_eq!(m.alloc(A).unwrap(), 5 * A);
    assert_eq!(m.alloc(A).unwrap(), 4 * A);
}

#[test]
fn non_power_of_two_align() {
    let align = 3 * 512;
    let mut m = SpaceMap::new(100 * align + 700, align);
    assert_eq!(m.asize(), 100 * align);
    for _ in 0..10 {
        let off = m.alloc(2000).unwrap();
        assert_eq!(off % align, 0);
    }
    assert_eq!(m.allocated(), 10 * 2 * align);
    bad_free(m.free_now(512, align));
    m.free_now(2 * align, 2000).unwrap(); // length rounds up like alloc
    assert_eq!(m.allocated(), 9 * 2 * align);
    assert_eq!(SpaceMap::decode(&m.encode()).unwrap(), m);
}

#[test]
fn bad_frees_are_refused_without_change() {
    let mut m = SpaceMap::new(64 * A, A);
    let a = m.alloc(4 * A).unwrap();
    let b = m.alloc(4 * A).unwrap();
    m.free_deferred(b, 2 * A, 7).unwrap();
    m.free_now(a, A).unwrap();
    let before = m.clone();
    let cases: [(u64, u64, &str); 9] = [
        (a, A, "is free"),               // double free
        (20 * A, A, "is free"),          // never allocated
        (a, 2 * A, "is free"),           // partly free
        (b, A, "already freed"),         // already deferred
        (b + A, 2 * A, "already freed"), // partly deferred
        (a + 1, A, "multiple of align"), // misaligned
        (a + A, 0, "empty"),             // empty
        (63 * A, 2 * A, "past asize"),   // out of range
        (u64::MAX - A + 1, A, "past asize"),
    ];
    for (off, len, want) in cases {
        let why = bad_free(m.free_now(off, len));
        assert!(why.contains(want), "free_now({off:#x}, {len:#x}): {why}");
        let why = bad_free(m.free_deferred(off, len, 8));
        assert!(
            why.contains(want),
            "free_deferred({off:#x}, {len:#x}): {why}"
        );
        assert_eq!(m, before);
    }
    bad_free(m.free_now(60 * A, u64::MAX - 4096)); // length overflow
    for (off, len) in [(b, A), (a + A, A), (70 * A, A), (a, 0)] {
        assert!(matches!(
            m.claim(off, len),
            Err(SpaceError::BadClaim { .. })
        ));
    }
    assert_eq!(m, before);
    assert!(format!("{}", m.free_now(a, A).unwrap_err()).starts_with("bad free of [0x0, +0x1000)"));
}

#[test]
fn no_space_then_room_again() {
    let mut m = SpaceMap::new(16 * A, A);
    let offs: Vec<u64> = (0..16).map(|_| m.alloc(A).unwrap()).collect();
    let full = SpaceError::NoSpace {
        need: A,
        largest: 0,
    };
    assert_eq!(m.alloc(1), Err(full));
    m.free_now(offs[3], A).unwrap();
    assert_eq!(m.alloc(A).unwrap(), offs[3]);
    // Fragment: every other unit free, 8 units free in total but none adjacent.
    for off in offs.iter().step_by(2) {
        m.free_now(*off, A).unwrap();
    }
    assert_eq!((m.free(), m.largest_free()), (8 * A, A));
    let fragmented = SpaceError::NoSpace {
        need: 2 * A,
        largest: A,
    };
    assert_eq!(m.alloc(2 * A), Err(fragmented));
    assert_eq!(m.free(), 8 * A);
    assert_eq!(m.alloc(A - 1).unwrap() % (2 * A), 0);
}

#[test]
fn deferred_frees_wait_defer_txgs() {
    let mut m = SpaceMap::new(4 * A, A);
    for _ in 0..4 {
        m.alloc(A).unwrap();
    }
    m.free_deferred(A, 2 * A, 5).unwrap();
    assert_eq!((m.allocated(), m.deferred(), m.free()), (4 * A, 2 * A, 0));
    assert!(m.is_allocated(0, 4 * A));
    m.release_deferred(5 + DEFER_TXGS - 1);
    assert!(matches!(m.alloc(A), Err(SpaceError::NoSpace { .. })));
    m.release_deferred(5 + DEFER_TXGS);
    assert_eq!((m.allocated(), m.deferred(), m.free()), (2 * A, 0, 2 * A));
    assert_eq!(m.largest_free(), 2 * A);
    assert_eq!(m.allocated_extents(), vec![(0, A), (3 * A, A)]);
    m.release_deferred(0); // txgs below DEFER_TXGS release nothing and do not underflow
    m.release_deferred(u64::MAX);
}

#[test]
fn claim_and_is_allocated() {
    let mut m = SpaceMap::new(32 * A, A);
    m.claim(8 * A, 4 * A).unwrap();
    assert!(m.is_allocated(8 * A, 4 * A));
    assert!(m.is_allocated(9 * A + 5, 10));
    assert!(!m.is_allocated(7 * A, 2 * A));
    assert!(!m.is_allocated(8 * A, 0));
    assert!(!m.is_allocated(u64::MAX, 2));
    assert_eq!(m.allocated_extents(), vec![(8 * A, 4 * A)]);
    assert_eq!(m.alloc(A).unwrap(), 0);
}

#[test]
fn slop_policy() {
    assert_eq!(slop_bytes(0), 0);
    assert_eq!(slop_bytes(10 << 20), 5 << 20); // capped at half
    assert_eq!(slop_bytes(100 << 20), 16 << 20); // floor
    assert_eq!(slop_bytes(1 << 40), 1 << 35); // 1/32
}

#[test]
fn encoding_layout_is_pinned() {
    let mut m = SpaceMap::new(8 * 512, 512);
    m.alloc(1024).unwrap();
    m.free_deferred(512, 512, 9).unwrap();
    let mut want = b"TSPM".to_vec();
    want.extend_from_slice(&1u32.to_le_bytes());
    for v in [4096u64, 512, 1024, 1, 0, 1024, 1, 9, 512, 512] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    let bytes = m.encode();
    assert_eq!(bytes, want);
    assert!(bytes.len() <= m.encoded_len_bound(0));
    assert_eq!(SpaceMap::decode(&bytes).unwrap(), m);
}

#[test]
fn decode_rejects_inconsistent_records() {
    let enc = |words: &[u64]| {
        let mut b = b"TSPM".to_vec();
        b.extend_from_slice(&1u32.to_le_bytes());
        for w in words {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b
    };
    let good = [8192, 512, 0, 1, 0, 1024, 1, 3, 0, 512, 0];
    let map = SpaceMap::decode(&enc(&good[..10])).unwrap();
    assert_eq!(map.deferred(), 512);
    let bad: [&[u64]; 10] = [
        &[8192, 0, 0, 0, 0],                                     // align zero
        &[8192, 700, 0, 0, 0],                                   // align not sector multiple
        &[8192, 512, 8704, 0, 0],                                // cursor past asize
        &[8192, 512, 0, 1, 0, 9000, 0],                          // extent past asize
        &[8192, 512, 0, 2, 0, 512, 512, 512, 0],                 // unmerged extents
        &[8192, 512, 0, 2, 1024, 512, 0, 512, 0],                // unsorted extents
        &[8192, 512, 0, 1, 0, 1024, 1, 3, 512, 1024],            // deferred covers free space
        &[8192, 512, 0, 1, 0, 1024, 2, 3, 0, 1024, 3, 512, 512], // deferred overlap
        &[8192, 512, 0, u64::MAX / 8, 0, 512, 0],                // count beyond record
        &good,                                                   // trailing bytes
    ];
    for words in bad {
        assert!(
            matches!(SpaceMap::decode(&enc(words)), Err(SpaceError::Corrupt(_))),
            "{words:?}"
        );
    }
    let mut wrong_magic = enc(&good[..10]);
    wrong_magic[0] = b'X';
    assert!(matches!(
        SpaceMap::decode(&wrong_magic),
        Err(SpaceError::Corrupt(_))
    ));
}

#[test]
fn many_alloc_free_pairs_are_fast() {
    // About a quarter of the map stays live, so the cursor wraps many times.
    let mut m = SpaceMap::new(1 << 30, A);
    let mut live = std::collections::VecDeque::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let start = std::time::Instant::now();
    for i in 0..100_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        live.push_back((m.alloc(x % (256 * 1024) + 1).unwrap(), x % (256 * 1024) + 1));
        if live.len() > 2000 {
            // Free out of order to fragment the map.
            let idx = (x as usize >> 20) % live.len();
            let (off, len) = live.swap_remove_back(idx).unwrap();
            if i % 2 == 0 {
                m.free_now(off, len).unwrap();
            } else {
                m.free_deferred(off, len, i).unwrap();
            }
        }
        m.release_deferred(i);
    }
    assert!(start.elapsed().as_secs() < 10, "took {:?}", start.elapsed());
}

#[test]
fn fragmented_map_falls_back_to_best_fit() {
    // Units: n one-unit holes (even units), then a 3-unit extent, then an
    // exact 2-unit extent at the end. First-fit would reach the 3-unit extent
    // only after more than SCAN_LIMIT holes, so best-fit picks the 2-unit one.
    let n = SCAN_LIMIT as u64 + 10;
    let mut m = SpaceMap::new((2 * n + 6) * 512, 512);
    for i in 0..n {
        m.claim((2 * i + 1) * 512, 512).unwrap();
    }
    m.claim((2 * n + 3) * 512, 512).unwrap();
    assert_eq!(m.alloc(1024).unwrap(), (2 * n + 4) * 512);
    assert_eq!(m.alloc(1024).unwrap(), 2 * n * 512);
}

#[test]
fn fragmented_map_allocates_quickly() {
    // 200k one-unit holes before the only extent that fits: every request
    // wraps around, and must not walk all the holes.
    let n = 200_000u64;
    let mut m = SpaceMap::new((2 * n + 8) * 512, 512);
    for i in 0..n {
        m.claim((2 * i + 1) * 512, 512).unwrap();
    }
    let start = std::time::Instant::now();
    for _ in 0..2000 {
        let off = m.alloc(4096).unwrap();
        assert_eq!(off, 2 * n * 512);
        m.free_now(off, 4096).unwrap();
    }
    assert!(start.elapsed().as_secs() < 10, "took {:?}", start.elapsed());
}

// ---- model-based property test ----

#[derive(Clone, Copy, Debug, PartialEq)]
enum Unit {
    Free,
    Live,
    Deferred(u64),
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        units: u64,
        shave: u64,
    },
    FreeLive {
        pick: usize,
        deferred: bool,
    },
    FreeRaw {
        unit: u64,
        units: u64,
        deferred: bool,
        misalign: bool,
    },
    Claim {
        unit: u64,
        units: u64,
    },
    NextTxg,
    Roundtrip,
}

const UNITS: u64 = 64;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1..=8u64, 0..512u64).prop_map(|(units, shave)| Op::Alloc { units, shave }),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, deferred)| Op::FreeLive { pick, deferred }),
        1 => (0..UNITS + 2, 0..5u64, any::<bool>(), prop::bool::weighted(0.1))
            .prop_map(|(unit, units, deferred, misalign)| Op::FreeRaw { unit, units, deferred, misalign }),
        1 => (0..UNITS + 2, 0..5u64).prop_map(|(unit, units)| Op::Claim { unit, units }),
        2 => Just(Op::NextTxg),
        1 => Just(Op::Roundtrip),
    ]
}

struct Model {
    units: Vec<Unit>,
    live: Vec<(u64, u64)>,
    txg: u64,
}

impl Model {
    fn span(&self, unit: u64, units: u64) -> Option<&[Unit]> {
        let end = unit.checked_add(units)?;
        (units > 0 && end <= UNITS).then(|| &self.units[unit as usize..end as usize])
    }

    fn set(&mut self, unit: u64, units: u64, to: Unit) {
        self.units[unit as usize..(unit + units) as usize].fill(to);
        self.live
            .retain(|&(u, n)| u + n <= unit || u >= unit + units);
    }

    fn runs(&self, pred: impl Fn(Unit) -> bool) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (i, &u) in self.units.iter().enumerate() {
            if pred(u) {
                match out.last_mut() {
                    Some((s, n)) if *s + *n == i as u64 => *n += 1,
                    _ => out.push((i as u64, 1)),
                }
            }
        }
        out
    }
}

fn check(map: &SpaceMap, model: &Model, a: u64) {
    map.audit().unwrap();
    let count =
        |pred: &dyn Fn(Unit) -> bool| model.units.iter().filter(|&&u| pred(u)).count() as u64 * a;
    assert_eq!(map.free(), count(&|u| u == Unit::Free));
    assert_eq!(map.deferred(), count(&|u| matches!(u, Unit::Deferred(_))));
    assert_eq!(map.allocated(), count(&|u| u != Unit::Free));
    let scale = |v: Vec<(u64, u64)>| {
        v.into_iter()
            .map(|(s, n)| (s * a, n * a))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        map.allocated_extents(),
        scale(model.runs(|u| u != Unit::Free))
    );
    let largest = model
        .runs(|u| u == Unit::Free)
        .iter()
        .map(|r| r.1)
        .max()
        .unwrap_or(0);
    assert_eq!(map.largest_free(), largest * a);
}

fn run(align: u64, ops: Vec<Op>) {
    let a = align;
    let mut map = SpaceMap::new(UNITS * a + a / 2, a);
    let mut model = Model {
        units: vec![Unit::Free; UNITS as usize],
        live: Vec::new(),
        txg: 1,
    };
    for op in ops {
        let before = map.clone();
        match op {
            Op::Alloc { units, shave } => {
                let bound = map.encoded_len_bound(1);
                match map.alloc(units * a - shave) {
                    Ok(off) => {
                        assert_eq!(off % a, 0);
                        let span = model.span(off / a, units).expect("allocation out of range");
                        assert!(
                            span.iter().all(|&u| u == Unit::Free),
                            "handed out non-free space"
                        );
                        model.set(off / a, units, Unit::Live);
                        model.live.push((off / a, units));
                        assert!(map.encode().len() <= bound);
                    }
                    Err(SpaceError::NoSpace { need, largest }) => {
                        assert_eq!(need, units * a);
                        assert_eq!(largest, map.largest_free());
                        assert!(model.runs(|u| u == Unit::Free).iter().all(|r| r.1 < units));
                        assert_eq!(map, before);
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            Op::FreeLive { pick, deferred } => {
                if model.live.is_empty() {
                    continue;
                }
                let (unit, units) = model.live[pick % model.live.len()];
                let (off, len) = (unit * a, units * a);
                if deferred {
                    map.free_deferred(off, len, model.txg).unwrap();
                    model.set(unit, units, Unit::Deferred(model.txg));
                } else {
                    map.free_now(off, len).unwrap();
                    model.set(unit, units, Unit::Free);
                }
            }
            Op::FreeRaw {
                unit,
                units,
                deferred,
                misalign,
            } => {
                let ok = !misalign
                    && model
                        .span(unit, units)
                        .is_some_and(|s| s.iter().all(|&u| u == Unit::Live));
                let off = unit * a + u64::from(misalign);
                let r = if deferred {
                    map.free_deferred(off, units * a, model.txg)
                } else {
                    map.free_now(off, units * a)
                };
                assert_eq!(r.is_ok(), ok, "{r:?}");
                if ok {
                    model.set(
                        unit,
                        units,
                        if deferred {
                            Unit::Deferred(model.txg)
                        } else {
                            Unit::Free
                        },
                    );
                } else {
                    bad_free(r);
                    assert_eq!(map, before);
                }
            }
            Op::Claim { unit, units } => {
                let ok = model
                    .span(unit, units)
                    .is_some_and(|s| s.iter().all(|&u| u == Unit::Free));
                let r = map.claim(unit * a, units * a);
                assert_eq!(r.is_ok(), ok, "{r:?}");
                if ok {
                    model.set(unit, units, Unit::Live);
                    model.live.push((unit, units));
                } else {
                    assert!(matches!(r, Err(SpaceError::BadClaim { .. })));
                    assert_eq!(map, before);
                }
            }
            Op::NextTxg => {
                model.txg += 1;
                map.release_deferred(model.txg);
                for u in &mut model.units {
                    if matches!(*u, Unit::Deferred(t) if t + DEFER_TXGS <= model.txg) {
                        *u = Unit::Free;
                    }
                }
            }
            Op::Roundtrip => {
                let bytes = map.encode();
                assert!(bytes.len() <= map.encoded_len_bound(0));
                let back = SpaceMap::decode(&bytes).unwrap();
                assert_eq!(back, map);
                assert_eq!(back.encode(), bytes);
                let (mut x, mut y) = (back.clone(), map.clone());
                assert_eq!(x.alloc(a).ok(), y.alloc(a).ok());
                map = back;
            }
        }
        check(&map, &model, a);
    }
}

/// Builds a varied valid map for the decoder tests.
fn sample_map(align: u64, steps: &[(u8, u64)]) -> SpaceMap {
    let mut m = SpaceMap::new(256 * align, align);
    let mut live = Vec::new();
    for (i, &(kind, x)) in steps.iter().enumerate() {
        match kind % 3 {
            0 => live.extend(
                m.alloc((x % 8 + 1) * align)
                    .ok()
                    .map(|o| (o, (x % 8 + 1) * align)),
            ),
            1 if !live.is_empty() => {
                let (o, l) = live.swap_remove(x as usize % live.len());
                m.free_deferred(o, l, i as u64).unwrap();
            }
            _ if !live.is_empty() => {
                let (o, l) = live.swap_remove(x as usize % live.len());
                m.free_now(o, l).unwrap();
            }
            _ => {}
        }
    }
    m
}

fn decoded_is_canonical(bytes: &[u8]) {
    if let Ok(m) = SpaceMap::decode(bytes) {
        m.audit().unwrap();
        assert_eq!(m.encode(), bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn matches_model(align in prop::sample::select(vec![512u64, 1536, 4096]),
                     ops in prop::collection::vec(op(), 1..200)) {
        run(align, ops);
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        decoded_is_canonical(&bytes);
    }

    /// Nearly-valid records (random gaps and lengths in units, some zero,
    /// counts sometimes off by one) reach every validation rule.
    #[test]
    fn structured_garbage(units in 0..40u64, align in 1..4u64, cursor in 0..42u64,
                          extents in prop::collection::vec((0..3u64, 0..5u64), 0..8),
                          deferred in prop::collection::vec((0..3u64, 0..3u64, 0..4u64), 0..5),
                          fudge in prop::sample::select(vec![0i64, 0, 0, 0, 1, -1])) {
        let align = align * 512;
        let mut words = vec![units * align, align, cursor * align];
        words.push((extents.len() as u64).saturating_add_signed(fudge));
        let mut pos = 0;
        for (gap, len) in extents {
            words.extend([(pos + gap) * align, len * align]);
            pos += gap + len;
        }
        words.push(deferred.len() as u64);
        let mut pos = 0;
        for (txg, gap, len) in deferred {
            words.extend([txg, (pos + gap) * align, len * align]);
            pos += gap + len;
        }
        let mut b = b"TSPM".to_vec();
        b.extend_from_slice(&1u32.to_le_bytes());
        for w in words {
            b.extend_from_slice(&w.to_le_bytes());
        }
        decoded_is_canonical(&b);
    }

    #[test]
    fn truncated_or_flipped_encodings(steps in prop::collection::vec((any::<u8>(), any::<u64>()), 0..60),
                                      cut in any::<prop::sample::Index>(),
                                      flip in any::<prop::sample::Index>(), bit in 0..8u8) {
        let m = sample_map(1024, &steps);
        let bytes = m.encode();
        prop_assert_eq!(&SpaceMap::decode(&bytes).unwrap(), &m);
        let short = &bytes[..cut.index(bytes.len())];
        prop_assert!(matches!(SpaceMap::decode(short), Err(SpaceError::Corrupt(_))));
        let mut flipped = bytes.clone();
        flipped[flip.index(bytes.len())] ^= 1 << bit;
        decoded_is_canonical(&flipped);
    }
}

#[test]
fn alloc_keeping_spares_the_largest_extent() {
    // Free: many 4 KiB holes plus one 64 KiB extent at the end.
    let mut m = SpaceMap::new(1 << 20, 4096);
    let mut held = Vec::new();
    while let Ok(o) = m.alloc(4096) {
        held.push(o);
    }
    for (i, o) in held.iter().enumerate() {
        if i % 2 == 0 && *o < (1 << 20) - 65536 {
            m.free_now(*o, 4096).unwrap();
        }
    }
    for o in held.iter().filter(|o| **o >= (1 << 20) - 65536) {
        m.free_now(*o, 4096).unwrap();
    }
    assert_eq!(m.largest_free(), 65536);
    let holes = (m.free() - 65536) / 4096;
    // Data keeping 64 KiB fills every hole and never touches the extent.
    for _ in 0..holes {
        let o = m.alloc_keeping(4096, 65536).unwrap();
        assert!(
            o < (1 << 20) - 65536,
            "cut into the reserved extent at {o:#x}"
        );
        assert_eq!(m.largest_free(), 65536);
    }
    assert!(matches!(
        m.alloc_keeping(4096, 65536),
        Err(SpaceError::NoSpace { .. })
    ));
    // Metadata (no reserve) still gets it.
    assert!(m.alloc(32768).is_ok());
}

#[test]
fn alloc_keeping_uses_the_largest_extent_while_it_stays_big() {
    let mut m = SpaceMap::new(1 << 20, 4096);
    let a = m.alloc_keeping(4096, 65536).unwrap();
    let b = m.alloc_keeping(4096, 65536).unwrap();
    assert_eq!(b, a + 4096, "sequential writes should stay sequential");
}

proptest! {
    /// Encoding with exclusions equals encoding the map with those ranges
    /// freed: a txg's map never shows the later txg's allocations.
    #[test]
    fn encode_excluding_is_encode_after_freeing(
        sizes in proptest::collection::vec(1u64..20, 1..40),
        pick in proptest::collection::vec(any::<bool>(), 40),
    ) {
        let mut m = SpaceMap::new(4096 * 1024, 4096);
        let mut allocs = Vec::new();
        for s in &sizes {
            if let Ok(off) = m.alloc(s * 4096) {
                allocs.push((off, s * 4096));
            }
        }
        let mut exclude: Vec<(u64, u64)> = allocs
            .iter()
            .zip(&pick)
            .filter(|(_, p)| **p)
            .map(|(a, _)| *a)
            .collect();
        exclude.sort_unstable();
        let mut freed = m.clone();
        for (off, len) in &exclude {
            freed.free_now(*off, *len).unwrap();
        }
        let got = SpaceMap::decode(&m.encode_excluding(&exclude)).unwrap();
        prop_assert_eq!(got.allocated_extents(), freed.allocated_extents());
        prop_assert!(m.encode_excluding(&exclude).len() <= m.encoded_len_bound(exclude.len()));
    }
}
