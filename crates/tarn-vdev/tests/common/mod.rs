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

/// A leaf over memory whose reads go wrong the first `left` times, then
/// read well: a disk with a moment of trouble, a flaky cable.
#[derive(Debug)]
pub struct Hiccup {
    pub inner: Arc<MemLeaf>,
    /// Reads still to go wrong.
    pub left: std::sync::atomic::AtomicU32,
    /// Reads asked of it.
    pub reads: std::sync::atomic::AtomicU32,
    /// Wrong bytes (one byte flipped) instead of a failed read.
    pub flip: bool,
    /// Only reads past the page cache (merged reads) go wrong.
    pub direct_only: bool,
}

impl Hiccup {
    pub fn new(inner: Arc<MemLeaf>, left: u32, flip: bool, direct_only: bool) -> Hiccup {
        Hiccup {
            inner,
            left: left.into(),
            reads: 0.into(),
            flip,
            direct_only,
        }
    }

    fn read_maybe_wrong(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        self.reads.fetch_add(1, SeqCst);
        let left = self.left.load(SeqCst);
        if left == 0 {
            return self.inner.read_at(buf, offset);
        }
        self.left.store(left - 1, SeqCst);
        if !self.flip {
            return Err(std::io::Error::other("a moment of trouble"));
        }
        self.inner.read_at(buf, offset)?;
        buf[0] ^= 0x55;
        Ok(())
    }
}

impl Leaf for Hiccup {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if self.direct_only {
            return self.inner.read_at(buf, offset);
        }
        self.read_maybe_wrong(buf, offset)
    }
    fn read_direct_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.read_maybe_wrong(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn path(&self) -> &std::path::Path {
        self.inner.path()
    }
}
