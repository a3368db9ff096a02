//! Helpers shared by this crate's integration tests: vdevs over memory
//! leaves (seeded data comes from `tarn_testkit::data`).
#![allow(dead_code)]

use std::sync::Arc;

use tarn_vdev::testing::MemLeaf;
use tarn_vdev::{Leaf, LeafConfig, TopConfig, TopVdev, VdevKind, MIN_LEAF_SIZE};

pub fn config(kind: VdevKind, n: usize) -> TopConfig {
    TopConfig {
        kind,
        guid: 77,
        children: (0..n)
            .map(|i| LeafConfig {
                guid: 1000 + i as u64,
                path: format!("mem:{i}").into(),
                offline: false,
            })
            .collect(),
    }
}

pub fn mem_leaves(n: usize) -> Vec<Arc<MemLeaf>> {
    (0..n)
        .map(|_| Arc::new(MemLeaf::new(MIN_LEAF_SIZE)))
        .collect()
}

/// Opens a vdev over `leaves`, treating the children in `missing` as absent.
pub fn open(kind: VdevKind, ashift: u8, leaves: &[Arc<MemLeaf>], missing: &[usize]) -> TopVdev {
    let opts: Vec<Option<Arc<dyn Leaf>>> = leaves
        .iter()
        .enumerate()
        .map(|(i, l)| (!missing.contains(&i)).then(|| l.clone() as Arc<dyn Leaf>))
        .collect();
    TopVdev::open(&config(kind, leaves.len()), ashift, opts).expect("open vdev")
}

/// A verification closure: the block's BLAKE3 must match.
pub fn verifier(data: &[u8]) -> impl Fn(&[u8]) -> bool {
    let want = blake3::hash(data);
    move |b: &[u8]| blake3::hash(b) == want
}
