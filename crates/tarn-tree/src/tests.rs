use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;

use proptest::prelude::*;
use tarn_block::{checksum, BlockPtr, BlockType, ChecksumAlg, Dva};

use crate::leaf::Leaf;
use crate::node::{decode, Body, Kid, Node, Slot};
use crate::{
    check, diff, walk, Change, NodeStore, Tree, TreeError, MAX_KEY, MAX_VALUE, NODE_MAX_BYTES,
};

/// An in-memory node store: blocks by offset, a txg counter, and a record of
/// everything written and freed so tests can account for every block.
#[derive(Clone)]
struct MemStore {
    txg: u64,
    next: u64,
    /// Written and not yet freed.
    blocks: HashMap<u64, Vec<u8>>,
    written: HashSet<u64>,
    freed: Vec<u64>,
    reads: Cell<u64>,
    /// When false, reads skip checksum verification so that corrupted bytes
    /// reach the decoder.
    verify: bool,
    /// When set, every read returns these bytes.
    garbage: Option<Vec<u8>>,
    /// When true, frees are only recorded: undetected damage can make a
    /// tree reference one block twice.
    lenient: bool,
    /// When true, freed blocks stay readable (older versions of a tree,
    /// as snapshots keep them, for diffs).
    keep: bool,
}

fn offset(ptr: &BlockPtr) -> u64 {
    ptr.dvas[0].offset
}

impl MemStore {
    fn new() -> MemStore {
        MemStore {
            txg: 1,
            next: 0,
            blocks: HashMap::new(),
            written: HashSet::new(),
            freed: Vec::new(),
            reads: Cell::new(0),
            verify: true,
            garbage: None,
            lenient: false,
            keep: false,
        }
    }

    /// Commits `tree` as the pool would at the end of a txg.
    fn sync(&mut self, tree: &mut Tree) -> BlockPtr {
        let root = tree.commit(self).expect("commit");
        self.txg += 1;
        root
    }
}

impl NodeStore for MemStore {
    fn read(&self, ptr: &BlockPtr) -> Result<Vec<u8>, TreeError> {
        self.reads.set(self.reads.get() + 1);
        if let Some(g) = &self.garbage {
            return Ok(g.clone());
        }
        let data = self
            .blocks
            .get(&offset(ptr))
            .ok_or_else(|| TreeError::Store(format!("no block at {:#x}", offset(ptr)).into()))?;
        if self.verify && checksum(ChecksumAlg::Xxh3, data) != ptr.checksum {
            return Err(TreeError::Store("checksum mismatch".into()));
        }
        Ok(data.clone())
    }

    fn write(&mut self, data: Vec<u8>, level: u8) -> Result<BlockPtr, TreeError> {
        self.next += 1;
        let off = self.next * 0x1000;
        let len = data.len() as u32;
        let ptr = BlockPtr {
            dvas: [
                Dva {
                    vdev: 0,
                    asize: len.next_multiple_of(512),
                    offset: off,
                },
                Dva::default(),
                Dva::default(),
            ],
            lsize: len,
            psize: len,
            birth: self.txg,
            btype: BlockType::TreeNode,
            level,
            checksum_alg: ChecksumAlg::Xxh3,
            checksum: checksum(ChecksumAlg::Xxh3, &data),
            ..Default::default()
        };
        self.written.insert(off);
        self.blocks.insert(off, data);
        Ok(ptr)
    }

    fn free(&mut self, ptr: &BlockPtr) {
        let off = offset(ptr);
        if self.keep {
            self.freed.push(off);
            return;
        }
        if self.lenient {
            self.blocks.remove(&off);
            self.freed.push(off);
            return;
        }
        assert!(
            self.written.contains(&off),
            "freed a block never written: {off:#x}"
        );
        assert!(
            self.blocks.remove(&off).is_some(),
            "double free of {off:#x}"
        );
        self.freed.push(off);
    }
}

/// Every node reachable from `root`, with its birth.
fn reachable(store: &MemStore, root: &BlockPtr, min_birth: u64) -> (HashMap<u64, u64>, u64) {
    let mut nodes = HashMap::new();
    let mut entries = 0u64;
    walk(
        store,
        root,
        min_birth,
        &mut |p| {
            assert!(
                nodes.insert(offset(p), p.birth).is_none(),
                "node reached twice"
            );
            Ok(())
        },
        &mut |_, _| {
            entries += 1;
            Ok(())
        },
    )
    .expect("walk");
    (nodes, entries)
}

/// After a commit: the structure checks out, the contents equal the model,
/// and the reachable blocks are exactly the written blocks not yet freed.
fn verify(store: &MemStore, root: &BlockPtr, model: &BTreeMap<Vec<u8>, Vec<u8>>, node_max: usize) {
    let stats = check(store, root).expect("check");
    assert_eq!(stats.entries, model.len() as u64);
    assert!(
        stats.max_node_bytes <= node_max,
        "node of {} bytes",
        stats.max_node_bytes
    );
    let mut all = Vec::new();
    walk(store, root, 0, &mut |_| Ok(()), &mut |k, v| {
        all.push((k.to_vec(), v.to_vec()));
        Ok(())
    })
    .expect("walk");
    let expected: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert!(all == expected, "committed contents differ from the model");
    let (live, _) = reachable(store, root, 0);
    let live: HashSet<u64> = live.into_keys().collect();
    let stored: HashSet<u64> = store.blocks.keys().copied().collect();
    assert_eq!(
        live, stored,
        "reachable blocks differ from written minus freed"
    );
    assert_eq!(store.freed.len() + stored.len(), store.written.len());
}

fn in_range(k: &[u8], start: &Bound<Vec<u8>>, end: &Bound<Vec<u8>>) -> bool {
    let after = match start {
        Bound::Included(s) => k >= s.as_slice(),
        Bound::Excluded(s) => k > s.as_slice(),
        Bound::Unbounded => true,
    };
    let before = match end {
        Bound::Included(e) => k <= e.as_slice(),
        Bound::Excluded(e) => k < e.as_slice(),
        Bound::Unbounded => true,
    };
    after && before
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Insert(Vec<u8>, Vec<u8>),
    /// Inserts keys `[prefix, i as u16 big-endian]` for a run of `i`.
    InsertRun(u8, u16, u16, u8),
    Remove(Vec<u8>),
    Get(Vec<u8>),
    /// `get_sorted_with` of these keys, sorted first when the flag says so.
    GetMany(Vec<Vec<u8>>, bool),
    Range(Bound<Vec<u8>>, Bound<Vec<u8>>, usize),
    DeleteRange(Bound<Vec<u8>>, Bound<Vec<u8>>),
    Commit,
    /// Drops uncommitted changes: a fresh handle on the committed root.
    Reopen,
    Evict,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    // Some keys as long as the object-number prefix searches compare as one
    // integer (`leaf::cmp_keys`), and longer, from a small alphabet so they
    // often share it.
    prop_oneof![
        3 => prop::collection::vec(0u8..3, 0..5),
        1 => prop::collection::vec(0u8..2, 7..11),
    ]
}

/// Bound keys: random short keys, or keys and prefixes from the runs that
/// `InsertRun` writes, so bounds often coincide with stored keys and
/// separators.
fn bound_key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        key(),
        (0u8..3, 0u8..6).prop_map(|(p, h)| vec![p, h]),
        (0u8..3, 0u16..1600).prop_map(|(p, i)| vec![p, (i >> 8) as u8, i as u8]),
    ]
}

fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
    prop_oneof![
        1 => Just(Bound::Unbounded),
        3 => bound_key().prop_map(Bound::Included),
        3 => bound_key().prop_map(Bound::Excluded),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => (key(), prop::collection::vec(any::<u8>(), 0..24)).prop_map(|(k, v)| Op::Insert(k, v)),
        3 => (0u8..3, 0u16..1200, 1u16..400, 0u8..16).prop_map(|(p, s, n, v)| Op::InsertRun(p, s, n, v)),
        20 => key().prop_map(Op::Remove),
        8 => key().prop_map(Op::Get),
        4 => (prop::collection::vec(bound_key(), 0..40), any::<bool>())
            .prop_map(|(k, sorted)| Op::GetMany(k, sorted)),
        6 => (bound(), bound(), 0usize..40).prop_map(|(s, e, n)| Op::Range(s, e, n)),
        4 => (bound(), bound()).prop_map(|(s, e)| Op::DeleteRange(s, e)),
        8 => Just(Op::Commit),
        2 => Just(Op::Reopen),
        3 => Just(Op::Evict),
    ]
}

fn run_model(node_max: usize, ops: Vec<Op>) {
    let mut store = MemStore::new();
    let mut tree = Tree::new().with_node_max(node_max);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut committed = model.clone();
    for op in ops {
        match op {
            Op::Insert(k, v) => {
                assert_eq!(tree.insert(&store, &k, &v).unwrap(), model.insert(k, v));
            }
            Op::InsertRun(p, s, n, vlen) => {
                for i in 0..n {
                    let i = s.wrapping_add(i).to_be_bytes();
                    let k = vec![p, i[0], i[1]];
                    let v = vec![i[1]; vlen as usize];
                    assert_eq!(tree.insert(&store, &k, &v).unwrap(), model.insert(k, v));
                }
            }
            Op::Remove(k) => assert_eq!(tree.remove(&store, &k).unwrap(), model.remove(&k)),
            Op::Get(k) => assert_eq!(tree.get(&store, &k).unwrap(), model.get(&k).cloned()),
            Op::GetMany(mut keys, sorted) => {
                if sorted {
                    keys.sort();
                }
                let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                let mut got = Vec::new();
                tree.get_sorted_with(&store, &refs, &mut |i, v| got.push((i, v.to_vec())))
                    .unwrap();
                let want: Vec<_> = keys
                    .iter()
                    .enumerate()
                    .filter_map(|(i, k)| model.get(k).map(|v| (i, v.clone())))
                    .collect();
                assert_eq!(got, want);
            }
            Op::Range(s, e, limit) => {
                let got = tree.range(&store, as_ref(&s), as_ref(&e), limit).unwrap();
                let want: Vec<_> = model
                    .iter()
                    .filter(|(k, _)| in_range(k, &s, &e))
                    .take(limit)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert_eq!(got, want);
            }
            Op::DeleteRange(s, e) => {
                let doomed: Vec<_> = model
                    .keys()
                    .filter(|k| in_range(k, &s, &e))
                    .cloned()
                    .collect();
                for k in &doomed {
                    model.remove(k);
                }
                assert_eq!(
                    tree.delete_range(&store, as_ref(&s), as_ref(&e)).unwrap(),
                    doomed.len() as u64
                );
            }
            Op::Commit => {
                let root = store.sync(&mut tree);
                assert!(!tree.is_dirty());
                assert_eq!(tree.root(), root);
                assert_eq!(root.is_hole(), model.is_empty());
                verify(&store, &root, &model, node_max);
                committed = model.clone();
            }
            Op::Reopen => {
                tree = Tree::open(tree.root()).with_node_max(node_max);
                model = committed.clone();
            }
            Op::Evict => tree.evict_clean(),
        }
        assert_eq!(tree.len_hint(), model.len() as u64);
    }
    let root = store.sync(&mut tree);
    verify(&store, &root, &model, node_max);
    let mut fresh = Tree::open(root);
    let all = fresh
        .range(&store, Bound::Unbounded, Bound::Unbounded, usize::MAX)
        .unwrap();
    assert_eq!(all.len(), model.len());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn keys_compare_as_byte_strings(
        a in prop::collection::vec(0u8..3, 0..12),
        b in prop::collection::vec(0u8..3, 0..12),
    ) {
        prop_assert_eq!(crate::leaf::cmp_keys(&a, &b), a.cmp(&b));
        prop_assert_eq!(crate::leaf::cmp_keys(&b, &a), b.cmp(&a));
        prop_assert_eq!(crate::leaf::cmp_keys(&a, &a), std::cmp::Ordering::Equal);
    }

    #[test]
    fn model(node_max in prop::sample::select(vec![512usize, 1024, 4096]),
             ops in prop::collection::vec(op(), 1..120)) {
        run_model(node_max, ops);
    }

    #[test]
    fn garbage_nodes_are_corrupt(
        header in any::<bool>(),
        level in 0u8..3,
        count in 0u32..6,
        tail in prop::collection::vec(any::<u8>(), 0..600),
        key in key(),
    ) {
        let mut bytes = Vec::new();
        if header {
            bytes.extend_from_slice(b"TN\x01");
            bytes.push(level);
            bytes.extend_from_slice(&count.to_le_bytes());
        }
        bytes.extend_from_slice(&tail);
        let mut store = MemStore::new();
        let root = store.write(vec![0; 8], level).unwrap();
        store.garbage = Some(bytes);
        let is_corrupt = |r: Result<(), TreeError>| matches!(r, Ok(()) | Err(TreeError::Corrupt(..)));
        let mut tree = Tree::open(root);
        prop_assert!(is_corrupt(tree.get(&store, &key).map(drop)));
        prop_assert!(is_corrupt(tree.insert(&store, &key, b"v").map(drop)));
        let mut tree = Tree::open(root);
        prop_assert!(is_corrupt(tree.remove(&store, &key).map(drop)));
        prop_assert!(is_corrupt(tree.range(&store, Bound::Included(&key), Bound::Unbounded, 10).map(drop)));
        prop_assert!(is_corrupt(tree.delete_range(&store, Bound::Excluded(&key), Bound::Unbounded).map(drop)));
        prop_assert!(is_corrupt(walk(&store, &root, 0, &mut |_| Ok(()), &mut |_, _| Ok(()))));
        prop_assert!(is_corrupt(check(&store, &root).map(drop)));
    }

    #[test]
    fn damaged_nodes_never_panic(
        seed in any::<u64>(),
        which in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut store = MemStore::new();
        store.verify = false;
        store.lenient = true;
        let mut tree = Tree::new().with_node_max(512);
        let mut rng = Rng(seed | 1);
        for _ in 0..300 {
            let k = rng.next().to_be_bytes()[..3].to_vec();
            tree.insert(&store, &k, &k).unwrap();
        }
        let root = store.sync(&mut tree);
        let mut offs: Vec<u64> = store.blocks.keys().copied().collect();
        offs.sort_unstable();
        let block = store.blocks.get_mut(&offs[which.index(offs.len())]).unwrap();
        for (at, byte) in flips {
            let i = at.index(block.len());
            block[i] ^= byte | 1;
        }
        let ok = |r: Result<(), TreeError>| matches!(r, Ok(()) | Err(TreeError::Corrupt(..) | TreeError::Store(_)));
        let _ = check(&store, &root);
        prop_assert!(ok(walk(&store, &root, 0, &mut |_| Ok(()), &mut |_, _| Ok(()))));
        let mut tree = Tree::open(root).with_node_max(512);
        for _ in 0..50 {
            let k = rng.next().to_be_bytes()[..3].to_vec();
            prop_assert!(ok(tree.get(&store, &k).map(drop)));
            prop_assert!(ok(tree.insert(&store, &k, b"x").map(drop)));
            let k2 = rng.next().to_be_bytes()[..2].to_vec();
            prop_assert!(ok(tree.remove(&store, &k2).map(drop)));
            prop_assert!(ok(tree.delete_range(&store, Bound::Included(&k2), Bound::Excluded(&k)).map(drop)));
            prop_assert!(ok(tree.range(&store, Bound::Unbounded, Bound::Included(&k), 20).map(drop)));
        }
        prop_assert!(ok(tree.commit(&mut store).map(drop)));
    }
}

/// A small deterministic generator (xorshift64*), so tests need no crates.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn walk_prunes_by_birth() {
    let mut store = MemStore::new();
    let mut tree = Tree::new().with_node_max(512);
    let mut rng = Rng(7);
    // Nodes reachable right after each commit, by txg.
    let mut versions: Vec<(u64, HashSet<u64>)> = Vec::new();
    for txg in 0..8 {
        for _ in 0..if txg == 0 { 2000 } else { 40 } {
            let k = (rng.next() % 5000).to_be_bytes();
            if rng.below(4) == 0 {
                tree.remove(&store, &k).unwrap();
            } else {
                tree.insert(&store, &k, &[txg as u8; 8]).unwrap();
            }
        }
        let txg_written = store.txg;
        let root = store.sync(&mut tree);
        let (nodes, _) = reachable(&store, &root, 0);
        versions.push((txg_written, nodes.into_keys().collect()));
    }
    let root = tree.root();
    let (all, all_entries) = reachable(&store, &root, 0);
    let last_txg = store.txg;
    let mut pruned_somewhere = false;
    for t in 0..=last_txg {
        let (seen, _) = reachable(&store, &root, t);
        let want: HashSet<u64> = all
            .iter()
            .filter(|(_, &b)| b > t)
            .map(|(&o, _)| o)
            .collect();
        assert_eq!(
            seen.keys().copied().collect::<HashSet<_>>(),
            want,
            "min_birth {t}"
        );
        // What was born after t is exactly what the version committed at t lacks.
        if let Some((_, old)) = versions.iter().find(|(txg, _)| *txg == t) {
            let new: HashSet<u64> = all.keys().filter(|o| !old.contains(o)).copied().collect();
            assert_eq!(new, want, "nodes new since txg {t}");
        }
        pruned_somewhere |= !want.is_empty() && want.len() < all.len();
    }
    assert!(pruned_somewhere);
    assert!(reachable(&store, &root, last_txg).0.is_empty());
    assert_eq!(all_entries, check(&store, &root).unwrap().entries);
}

#[test]
fn sequential_200k_then_random_deletes_to_empty() {
    const N: u64 = 200_000;
    let mut store = MemStore::new();
    let mut tree = Tree::new();
    let key = |i: u64| {
        let mut k = (i / 1000).to_be_bytes().to_vec();
        k.extend_from_slice(&((i % 1000) * 131_072).to_be_bytes());
        k
    };
    let value = |i: u64| i.to_le_bytes().repeat(3);
    for i in 0..N {
        assert_eq!(tree.insert(&store, &key(i), &value(i)).unwrap(), None);
    }
    let root = store.sync(&mut tree);
    let stats = check(&store, &root).unwrap();
    assert_eq!(stats.entries, N);
    // Ascending inserts leave nodes nearly full rather than half full.
    let leaf_bytes = N as usize * (6 + 16 + 24);
    assert!(
        (stats.nodes as usize) < leaf_bytes / (NODE_MAX_BYTES * 8 / 10),
        "{} nodes for {leaf_bytes} leaf bytes",
        stats.nodes
    );

    let mut tree = Tree::open(root);
    assert_eq!(tree.len_hint(), N);
    let mut next = 0u64;
    let mut cursor: Option<Vec<u8>> = None;
    loop {
        let start = cursor.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let page = tree.range(&store, start, Bound::Unbounded, 1000).unwrap();
        if page.is_empty() {
            break;
        }
        for (k, v) in &page {
            assert_eq!((k, v), (&key(next), &value(next)));
            next += 1;
        }
        cursor = page.last().map(|(k, _)| k.clone());
    }
    assert_eq!(next, N);
    tree.evict_clean();
    assert_eq!(tree.loaded_nodes(), 0);

    let mut order: Vec<u64> = (0..N).collect();
    let mut rng = Rng(0x5eed);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    for (n, &i) in order.iter().enumerate() {
        assert_eq!(tree.remove(&store, &key(i)).unwrap(), Some(value(i)));
        if n % 50_000 == 49_999 || n == 195_000 {
            let root = store.sync(&mut tree);
            let stats = check(&store, &root).unwrap();
            let left = N - n as u64 - 1;
            assert_eq!(stats.entries, left);
            // Removals merge small nodes: at least a quarter full, give or take
            // one partly filled node per level.
            let bytes = left as usize * (6 + 16 + 24);
            let bound = bytes / (NODE_MAX_BYTES / 4) + 1 + 2 * stats.depth as usize;
            assert!(
                (stats.nodes as usize) <= bound,
                "{} nodes for {left} entries",
                stats.nodes
            );
            tree.evict_clean();
        }
    }
    let root = store.sync(&mut tree);
    assert!(root.is_hole());
    assert!(
        store.blocks.is_empty(),
        "{} blocks never freed",
        store.blocks.len()
    );
    assert_eq!(store.freed.len(), store.written.len());
}

#[test]
fn delete_range_reads_only_the_edges() {
    let mut store = MemStore::new();
    let mut tree = Tree::new().with_node_max(1024);
    let mut model = BTreeMap::new();
    for i in 0u32..20_000 {
        let k = i.to_be_bytes().to_vec();
        tree.insert(&store, &k, &k).unwrap();
        model.insert(k.clone(), k);
    }
    let root = store.sync(&mut tree);
    let before = check(&store, &root).unwrap();
    assert!(before.depth >= 4);

    let mut tree = Tree::open(root).with_node_max(1024);
    store.reads.set(0);
    let (lo, hi) = (1_000u32.to_be_bytes(), 19_000u32.to_be_bytes());
    let n = tree
        .delete_range(&store, Bound::Included(&lo), Bound::Excluded(&hi))
        .unwrap();
    assert_eq!(n, 18_000);
    model.retain(|k, _| k.as_slice() < &lo[..] || k.as_slice() >= &hi[..]);
    let reads = store.reads.get();
    assert!(
        reads <= 4 * before.depth as u64,
        "{reads} reads for a range delete"
    );

    store.reads.set(0);
    let freed_before = store.freed.len();
    let root = store.sync(&mut tree);
    let freed = (store.freed.len() - freed_before) as u64;
    // Commit reads the internal nodes of dropped subtrees, never their leaves.
    assert!(
        store.reads.get() * 4 < freed,
        "{} reads to free {freed} nodes",
        store.reads.get()
    );
    verify(&store, &root, &model, 1024);
}

/// Every key of a deep tree as an inclusive or exclusive bound on either
/// side, and many two-sided ranges: each deletion runs on a copy of the
/// committed tree and must match the model, structure and block accounting.
#[test]
fn delete_range_at_every_boundary() {
    let mut store = MemStore::new();
    let mut tree = Tree::new().with_node_max(512);
    let mut model = BTreeMap::new();
    let mut rng = Rng(99);
    for _ in 0..400 {
        let n = rng.below(3) + 1;
        let k: Vec<u8> = (0..n).map(|_| rng.below(8) as u8).collect();
        tree.insert(&store, &k, &[1; 9]).unwrap();
        model.insert(k, vec![1; 9]);
    }
    let root = store.sync(&mut tree);
    assert!(check(&store, &root).unwrap().depth >= 3);
    let mut probes: Vec<Vec<u8>> = model.keys().cloned().collect();
    probes.extend(
        (0..8u8)
            .map(|a| vec![a])
            .chain((0..64u8).map(|a| vec![a / 8, a % 8, 9])),
    );
    let mut ranges = Vec::new();
    for p in &probes {
        for b in [Bound::Included(p.clone()), Bound::Excluded(p.clone())] {
            ranges.push((b.clone(), Bound::Unbounded));
            ranges.push((Bound::Unbounded, b));
        }
    }
    for _ in 0..1500 {
        let a = probes[rng.below(probes.len())].clone();
        let b = probes[rng.below(probes.len())].clone();
        let (a, b) = if a <= b { (a, b) } else { (b, a) };
        let pick = |k: Vec<u8>, r: &mut Rng| {
            if r.below(2) == 0 {
                Bound::Included(k)
            } else {
                Bound::Excluded(k)
            }
        };
        ranges.push((pick(a, &mut rng), pick(b, &mut rng)));
    }
    for (s, e) in ranges {
        let mut store = store.clone();
        let mut tree = Tree::open(root).with_node_max(512);
        let mut want = model.clone();
        want.retain(|k, _| !in_range(k, &s, &e));
        let n = tree.delete_range(&store, as_ref(&s), as_ref(&e)).unwrap();
        assert_eq!(n as usize, model.len() - want.len(), "{s:?}..{e:?}");
        let got = tree
            .range(&store, Bound::Unbounded, Bound::Unbounded, usize::MAX)
            .unwrap();
        assert!(got.iter().map(|(k, _)| k).eq(want.keys()), "{s:?}..{e:?}");
        let new_root = store.sync(&mut tree);
        verify(&store, &new_root, &want, 512);
    }
}

#[test]
fn node_format_is_pinned() {
    let leaf = Node::new(
        0,
        Body::Leaf(Leaf::from_entries([(&b"ab"[..], &b"xyz"[..])])),
    );
    assert_eq!(
        leaf.encode(),
        [b'T', b'N', 1, 0, 1, 0, 0, 0, 2, 0, 3, 0, 0, 0, b'a', b'b', b'x', b'y', b'z']
    );
    let mut store = MemStore::new();
    let child = store.write(leaf.encode(), 0).unwrap();
    let kids = vec![
        Kid {
            key: Vec::new(),
            slot: Slot::clean(child),
        },
        Kid {
            key: b"q".to_vec(),
            slot: Slot::clean(child),
        },
    ];
    let inner = Node::new(1, Body::Internal(kids));
    let bytes = inner.encode();
    assert_eq!(bytes.len(), 8 + 2 * (2 + 160) + 1);
    assert_eq!(&bytes[..10], &[b'T', b'N', 1, 1, 2, 0, 0, 0, 0, 0]);
    assert_eq!(&bytes[10..170], &child.encode());
    assert_eq!(&bytes[170..173], &[1, 0, b'q']);
    let mut ptr = child;
    ptr.level = 1;
    let back = decode(&ptr, &bytes).unwrap();
    assert_eq!(back.size, bytes.len());
    assert_eq!(back.encode(), bytes);
}

/// Each malformation the decoder guards against is reported as corrupt.
#[test]
fn decode_rejects_malformed_nodes() {
    let mut store = MemStore::new();
    let leaf = |keys: &[&[u8]]| {
        Node::new(
            0,
            Body::Leaf(Leaf::from_entries(keys.iter().map(|k| (*k, &b"v"[..])))),
        )
        .encode()
    };
    let good_leaf = leaf(&[b"a", b"b"]);
    let leaf_ptr = store.write(good_leaf.clone(), 0).unwrap();
    let inner = |keys: [&[u8]; 2], child: BlockPtr| {
        let kids = keys
            .iter()
            .map(|k| Kid {
                key: k.to_vec(),
                slot: Slot::clean(child),
            })
            .collect();
        Node::new(1, Body::Internal(kids)).encode()
    };
    let good_inner = inner([b"", b"m"], leaf_ptr);
    let mut inner_ptr = leaf_ptr;
    inner_ptr.level = 1;
    assert!(decode(&leaf_ptr, &good_leaf).is_ok());
    assert!(decode(&inner_ptr, &good_inner).is_ok());

    let edit = |bytes: &[u8], f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = bytes.to_vec();
        f(&mut b);
        b
    };
    let mut data_child = leaf_ptr;
    data_child.btype = BlockType::Data;
    let mut high_child = leaf_ptr;
    high_child.level = 3;
    let cases: Vec<(&str, &BlockPtr, Vec<u8>)> = vec![
        ("short", &leaf_ptr, good_leaf[..5].to_vec()),
        ("magic", &leaf_ptr, edit(&good_leaf, &|b| b[1] = b'X')),
        ("version", &leaf_ptr, edit(&good_leaf, &|b| b[2] = 9)),
        ("level", &inner_ptr, good_leaf.clone()),
        ("count 0", &leaf_ptr, edit(&good_leaf, &|b| b[4..8].fill(0))),
        ("count high", &leaf_ptr, edit(&good_leaf, &|b| b[4] = 3)),
        (
            "truncated",
            &leaf_ptr,
            good_leaf[..good_leaf.len() - 1].to_vec(),
        ),
        ("trailing", &leaf_ptr, edit(&good_leaf, &|b| b.push(0))),
        (
            "key length",
            &leaf_ptr,
            edit(&good_leaf, &|b| {
                b[8..10].copy_from_slice(&1025u16.to_le_bytes())
            }),
        ),
        ("unsorted", &leaf_ptr, leaf(&[b"b", b"a"])),
        ("duplicate", &leaf_ptr, leaf(&[b"a", b"a"])),
        ("too big", &leaf_ptr, vec![0; NODE_MAX_BYTES + 1]),
        ("first separator", &inner_ptr, inner([b"a", b"m"], leaf_ptr)),
        ("separators", &inner_ptr, inner([b"", b""], leaf_ptr)),
        ("child level", &inner_ptr, inner([b"", b"m"], high_child)),
        ("child type", &inner_ptr, inner([b"", b"m"], data_child)),
        (
            "child hole",
            &inner_ptr,
            edit(&good_inner, &|b| b[10..170].fill(0)),
        ),
        (
            "child pointer",
            &inner_ptr,
            edit(&good_inner, &|b| b[10 + 64] = 77),
        ),
    ];
    for (what, ptr, bytes) in cases {
        match decode(ptr, &bytes) {
            Err(TreeError::Corrupt(node, _)) => assert!(node.contains("birth"), "{what}: {node}"),
            Err(e) => panic!("{what}: wrong error {e}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
}

#[test]
fn empty_and_noop_changes() {
    let mut store = MemStore::new();
    let mut tree = Tree::new();
    assert!(!tree.is_dirty());
    assert!(tree.commit(&mut store).unwrap().is_hole());
    tree.insert(&store, b"k", b"v").unwrap();
    assert!(tree.is_dirty());
    assert_eq!(tree.remove(&store, b"k").unwrap(), Some(b"v".to_vec()));
    assert!(!tree.is_dirty());
    assert!(tree.commit(&mut store).unwrap().is_hole());
    assert!(store.written.is_empty());

    tree.insert(&store, b"k", b"v").unwrap();
    let root = store.sync(&mut tree);
    assert_eq!(root.fill, 1);
    // Rewriting the same value and removing a missing key change nothing.
    assert_eq!(
        tree.insert(&store, b"k", b"v").unwrap(),
        Some(b"v".to_vec())
    );
    assert_eq!(tree.remove(&store, b"zz").unwrap(), None);
    assert_eq!(
        tree.delete_range(&store, Bound::Included(b"x"), Bound::Unbounded)
            .unwrap(),
        0
    );
    assert!(!tree.is_dirty());
    // Emptying a committed tree frees its root.
    assert_eq!(
        tree.delete_range(&store, Bound::Unbounded, Bound::Unbounded)
            .unwrap(),
        1
    );
    assert!(tree.is_dirty());
    assert!(store.sync(&mut tree).is_hole());
    assert!(store.blocks.is_empty());
}

#[test]
fn size_limits_and_store_errors() {
    let mut store = MemStore::new();
    let mut tree = Tree::new();
    let big_key = vec![0u8; MAX_KEY + 1];
    assert!(
        matches!(tree.insert(&store, &big_key, b""), Err(TreeError::KeyTooLarge(n)) if n == MAX_KEY + 1)
    );
    let big_value = vec![0u8; MAX_VALUE + 1];
    assert!(matches!(
        tree.insert(&store, b"k", &big_value),
        Err(TreeError::ValueTooLarge(_))
    ));
    // Entries of the maximum size still split into nodes that fit.
    for i in 0u8..20 {
        let mut k = vec![i; MAX_KEY];
        k[MAX_KEY - 1] = 0;
        tree.insert(&store, &k, &vec![i; MAX_VALUE]).unwrap();
    }
    let root = store.sync(&mut tree);
    assert!(check(&store, &root).unwrap().max_node_bytes <= NODE_MAX_BYTES);

    // A store error reaches the caller whole and leaves the handle usable.
    let mut tree = Tree::open(root);
    let saved = std::mem::take(&mut store.blocks);
    match tree.get(&store, &[3u8; 4]) {
        Err(TreeError::Store(e)) => assert!(e.to_string().contains("no block")),
        other => panic!("expected a store error, got {other:?}"),
    }
    store.blocks = saved;
    assert_eq!(tree.get(&store, &[3u8; 4]).unwrap(), None);
    let msg = TreeError::Corrupt("0:0x1000".into(), "bad magic".into()).to_string();
    assert_eq!(msg, "tree node 0:0x1000: bad magic");
}

#[test]
fn evict_keeps_dirty_nodes() {
    let mut store = MemStore::new();
    let mut tree = Tree::new().with_node_max(512);
    for i in 0u16..500 {
        tree.insert(&store, &i.to_be_bytes(), b"first").unwrap();
    }
    store.sync(&mut tree);
    let cached = tree.loaded_nodes();
    tree.insert(&store, &7u16.to_be_bytes(), b"second").unwrap();
    tree.evict_clean();
    let kept = tree.loaded_nodes();
    assert!(kept > 0 && kept < cached, "{kept} of {cached}");
    let root = store.sync(&mut tree);
    let mut fresh = Tree::open(root);
    assert_eq!(
        fresh.get(&store, &7u16.to_be_bytes()).unwrap(),
        Some(b"second".to_vec())
    );
    assert_eq!(
        fresh.get(&store, &8u16.to_be_bytes()).unwrap(),
        Some(b"first".to_vec())
    );
}

#[test]
fn handle_is_send() {
    fn send<T: Send>() {}
    send::<Tree>();
}

/// Applies `ops` (no reopen: every change lands) to `tree` and `model`.
fn apply_ops(
    store: &MemStore,
    tree: &mut Tree,
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    ops: &[Op],
) {
    for op in ops {
        match op {
            Op::Insert(k, v) => {
                tree.insert(store, k, v).unwrap();
                model.insert(k.clone(), v.clone());
            }
            Op::InsertRun(p, s, n, vlen) => {
                for i in 0..*n {
                    let i = s.wrapping_add(i).to_be_bytes();
                    let k = vec![*p, i[0], i[1]];
                    let v = vec![i[1]; *vlen as usize];
                    tree.insert(store, &k, &v).unwrap();
                    model.insert(k, v);
                }
            }
            Op::Remove(k) => {
                tree.remove(store, k).unwrap();
                model.remove(k);
            }
            Op::DeleteRange(a, b) => {
                tree.delete_range(store, as_ref(a), as_ref(b)).unwrap();
                model.retain(|k, _| !in_range(k, a, b));
            }
            _ => {}
        }
    }
}

/// The differences of two models, in key order.
fn model_diff(
    a: &BTreeMap<Vec<u8>, Vec<u8>>,
    b: &BTreeMap<Vec<u8>, Vec<u8>>,
    after: Option<&[u8]>,
) -> Vec<Change> {
    let keys: std::collections::BTreeSet<&Vec<u8>> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| after.is_none_or(|x| k.as_slice() > x))
        .filter_map(|k| match (a.get(k), b.get(k)) {
            (Some(x), Some(y)) if x != y => Some(Change::Changed(k.clone(), x.clone(), y.clone())),
            (Some(x), None) => Some(Change::Removed(k.clone(), x.clone())),
            (None, Some(y)) => Some(Change::Added(k.clone(), y.clone())),
            _ => None,
        })
        .collect()
}

fn tree_diff(
    store: &MemStore,
    a: &BlockPtr,
    b: &BlockPtr,
    after: Option<&[u8]>,
) -> (Vec<Change>, crate::DiffStats) {
    let mut out = Vec::new();
    let stats = diff(store, a, b, after, &mut |c| {
        out.push(c);
        Ok(true)
    })
    .unwrap();
    (out, stats)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// The diff of two committed versions (the second made from the first
    /// by random changes) is exactly the models' difference, from any
    /// resume point; a version against itself reads nothing.
    #[test]
    fn diff_matches_the_models(
        node_max in prop::sample::select(vec![512usize, 1024]),
        first in prop::collection::vec(op(), 1..60),
        second in prop::collection::vec(op(), 0..60),
        after in prop::option::of(bound_key()),
    ) {
        let mut store = MemStore::new();
        store.keep = true;
        let mut tree = Tree::new().with_node_max(node_max);
        let mut ma = BTreeMap::new();
        apply_ops(&store, &mut tree, &mut ma, &first);
        let a = store.sync(&mut tree);
        let mut mb = ma.clone();
        apply_ops(&store, &mut tree, &mut mb, &second);
        let b = store.sync(&mut tree);
        let hole = BlockPtr::default();
        prop_assert_eq!(tree_diff(&store, &a, &b, None).0, model_diff(&ma, &mb, None));
        prop_assert_eq!(tree_diff(&store, &b, &a, None).0, model_diff(&mb, &ma, None));
        prop_assert_eq!(
            tree_diff(&store, &a, &b, after.as_deref()).0,
            model_diff(&ma, &mb, after.as_deref())
        );
        prop_assert_eq!(tree_diff(&store, &hole, &b, None).0, model_diff(&BTreeMap::new(), &mb, None));
        prop_assert_eq!(tree_diff(&store, &b, &hole, None).0, model_diff(&mb, &BTreeMap::new(), None));
        let (same, stats) = tree_diff(&store, &b, &b, None);
        prop_assert!(same.is_empty());
        prop_assert_eq!(stats.nodes_read, 0);
    }
}

/// One changed key in a large tree: the diff reads the two paths to it
/// (and the neighbours a rebalance touched), not the tree.
#[test]
fn diff_reads_only_what_changed() {
    let mut store = MemStore::new();
    store.keep = true;
    let mut tree = Tree::new().with_node_max(512);
    for i in 0..20_000u32 {
        tree.insert(&store, &i.to_be_bytes(), &[7; 16]).unwrap();
    }
    let a = store.sync(&mut tree);
    let depth = check(&store, &a).unwrap().depth as u64;
    tree.insert(&store, &12_345u32.to_be_bytes(), &[8; 16])
        .unwrap();
    let b = store.sync(&mut tree);
    let (changes, stats) = tree_diff(&store, &a, &b, None);
    assert_eq!(
        changes,
        vec![Change::Changed(
            12_345u32.to_be_bytes().to_vec(),
            vec![7; 16],
            vec![8; 16]
        )]
    );
    assert!(depth >= 3, "a tree of several levels: {depth}");
    assert!(
        stats.nodes_read <= 4 * depth,
        "read {} nodes of a {depth}-level tree for one change",
        stats.nodes_read
    );
    // Resuming after the change reads next to nothing, and finds nothing.
    let (rest, stats) = tree_diff(&store, &a, &b, Some(&12_345u32.to_be_bytes()));
    assert!(rest.is_empty());
    assert!(stats.nodes_read <= 4 * depth, "{stats:?}");
    // Deleting a run of keys: each removed key, nothing else.
    tree.delete_range(
        &store,
        Bound::Included(&100u32.to_be_bytes()[..]),
        Bound::Excluded(&200u32.to_be_bytes()[..]),
    )
    .unwrap();
    let c = store.sync(&mut tree);
    let (changes, _) = tree_diff(&store, &b, &c, None);
    assert_eq!(changes.len(), 100);
    assert!(changes.iter().all(|c| matches!(c, Change::Removed(..))));
}
