//! Throughput of the raidz encode/write and read paths with a leaf that costs
//! nothing, so the numbers measure this crate. Timings never gate tests:
//! run with `cargo test -p tarn-vdev --release --test bench -- --ignored --nocapture`.

mod common;

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use common::config;
use tarn_testkit::data::pattern;
use tarn_vdev::{Leaf, TopVdev, VdevKind, MIN_LEAF_SIZE};

/// Discards writes and reads zeros.
#[derive(Debug)]
struct NullLeaf;

impl Leaf for NullLeaf {
    fn read_at(&self, buf: &mut [u8], _offset: u64) -> io::Result<()> {
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        64 * MIN_LEAF_SIZE
    }
    fn path(&self) -> &Path {
        Path::new("null")
    }
}

fn run(kind: VdevKind, width: usize, block: usize, missing: Option<usize>) {
    let leaves = (0..width)
        .map(|i| (Some(i) != missing).then(|| Arc::new(NullLeaf) as Arc<dyn Leaf>))
        .collect();
    let v = TopVdev::open(&config(kind, width), 12, leaves).unwrap();
    let data = pattern(1, block);
    let n = (4usize << 30) / block;
    let step = v.alloc_size(block as u64);
    let t = Instant::now();
    for i in 0..n {
        v.write(
            (i as u64 * step) % (v.asize() - step) / v.alloc_align() * v.alloc_align(),
            &data,
        )
        .unwrap();
    }
    let w = t.elapsed().as_secs_f64();
    // Zeros verify: measures the read path without checksum cost.
    let t = Instant::now();
    for i in 0..n {
        let off = (i as u64 * step) % (v.asize() - step) / v.alloc_align() * v.alloc_align();
        v.read(off, block, &|_| true).unwrap();
    }
    let r = t.elapsed().as_secs_f64();
    let gib = (n * block) as f64 / (1u64 << 30) as f64;
    println!(
        "{kind:?} x{width}, {} KiB blocks{}: write {:.2} GiB/s, read {:.2} GiB/s",
        block >> 10,
        if missing.is_some() {
            ", one child missing"
        } else {
            ""
        },
        gib / w,
        gib / r
    );
}

#[test]
#[ignore]
fn bench_raidz_throughput() {
    run(VdevKind::Raidz { parity: 1 }, 4, 1 << 20, None);
    run(VdevKind::Raidz { parity: 2 }, 6, 1 << 20, None);
    run(VdevKind::Raidz { parity: 3 }, 11, 1 << 20, None);
    run(VdevKind::Raidz { parity: 1 }, 4, 128 << 10, None);
    run(VdevKind::Raidz { parity: 1 }, 4, 1 << 20, Some(1));
    run(VdevKind::Raidz { parity: 2 }, 6, 1 << 20, Some(3));
}
