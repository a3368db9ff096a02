//! Real files: FileLeaf under labels, raidz and mirror, with on-disk damage.

mod common;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::verifier;
use tarn_testkit::data::pattern;
use tarn_testkit::files::make as make_files;
use tarn_vdev::*;

fn open_top(kind: VdevKind, paths: &[PathBuf]) -> TopVdev {
    let leaves = paths
        .iter()
        .map(|p| Arc::new(FileLeaf::open(p).unwrap()) as Arc<dyn Leaf>)
        .collect::<Vec<_>>();
    open_top_of(kind, paths, &leaves)
}

/// A top-level vdev of `leaves`, opened from `paths`.
fn open_top_of(kind: VdevKind, paths: &[PathBuf], leaves: &[Arc<dyn Leaf>]) -> TopVdev {
    let config = TopConfig {
        kind,
        guid: 1,
        children: paths
            .iter()
            .enumerate()
            .map(|(i, p)| LeafConfig {
                guid: i as u64 + 10,
                path: p.clone(),
                offline: false,
            })
            .collect(),
    };
    TopVdev::open(&config, 12, leaves.iter().cloned().map(Some).collect()).unwrap()
}

fn pread(p: &Path, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    File::open(p).unwrap().read_exact_at(&mut b, off).unwrap();
    b
}

fn scribble(p: &Path, off: u64, len: usize) {
    let f = OpenOptions::new().write(true).open(p).unwrap();
    let junk: Vec<u8> = pread(p, off, len).iter().map(|b| !b).collect();
    f.write_all_at(&junk, off).unwrap();
}

#[test]
fn raidz_on_files_heals_on_disk_damage() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_files(dir.path(), "disk", 4, MIN_LEAF_SIZE);
    let v = open_top(VdevKind::Raidz { parity: 1 }, &paths);
    let data = pattern(77, 1 << 20);
    let off = 5 * v.alloc_align();
    v.write(off, &data).unwrap();
    v.flush().unwrap();
    let ext = v.extents(off, data.len() as u64).unwrap();
    let d = ext.iter().find(|e| !e.parity).unwrap();
    let before = pread(&paths[d.child], d.leaf_offset, d.len as usize);
    scribble(&paths[d.child], d.leaf_offset + 4096, 8192);
    assert_eq!(v.read(off, data.len(), &verifier(&data)).unwrap(), data);
    assert_eq!(
        pread(&paths[d.child], d.leaf_offset, d.len as usize),
        before
    );
    assert_eq!(v.leaves()[d.child].counters.cksum_errors, 1);

    // Reopen from the files: a fresh vdev reads the same bytes.
    drop(v);
    let v = open_top(VdevKind::Raidz { parity: 1 }, &paths);
    let s = v.scrub(off, data.len(), &verifier(&data)).unwrap();
    assert_eq!(s, ScrubOutcome::default());
}

#[test]
fn mirror_and_labels_on_files() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_files(dir.path(), "disk", 2, MIN_LEAF_SIZE + 100_000);
    let v = open_top(VdevKind::Mirror, &paths);
    let data = pattern(5, 12_345);
    v.write(0, &data).unwrap();
    scribble(&paths[0], DATA_START + 100, 1);
    assert_eq!(v.read(0, data.len(), &verifier(&data)).unwrap(), data);
    assert_eq!(pread(&paths[0], DATA_START, data.len()), data);

    let leaf = FileLeaf::open(&paths[1]).unwrap();
    let cfg = LabelConfig {
        version: 1,
        pool_name: "files".into(),
        pool_guid: 3,
        state: PoolState::Exported,
        txg: 1,
        device_guid: 11,
        top_index: 0,
        ashift: 12,
        owner: None,
        tree: vec![v.config()],
        logs: Vec::new(),
    };
    write_label_config_all(&leaf, &cfg).unwrap();
    write_uberblock(&leaf, 12, 1, b"uber").unwrap();
    leaf.flush().unwrap();
    let again = FileLeaf::open(&paths[1]).unwrap();
    let r = read_label(&again).unwrap();
    assert_eq!((r.config, r.valid_copies), (cfg, 4));
    assert_eq!(&read_uberblocks(&again, 12)[33][..4], b"uber");

    // Truncate below the minimum: a clear error.
    File::options()
        .write(true)
        .open(&paths[1])
        .unwrap()
        .set_len(MIN_LEAF_SIZE / 2)
        .unwrap();
    let cut = FileLeaf::open(&paths[1]).unwrap();
    assert!(matches!(read_label(&cut), Err(VdevError::TooSmall { .. })));
    // A file that is not a pool device at all.
    let e = read_label(&FileLeaf::open(&paths[0]).unwrap()).unwrap_err();
    assert!(e.to_string().contains("no tarn label"), "{e}");
}

/// Reads `want` with one merged read, asserts every block came back with
/// its bytes of `data`, and says how many checks the read made.
fn read_checked(v: &TopVdev, want: &[(u64, usize)], data: &[Vec<u8>]) -> usize {
    let checks = std::sync::atomic::AtomicUsize::new(0);
    let got = v.read_many(want, &|i, b| {
        checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        b == &data[i][..]
    });
    for (g, d) in got.into_iter().zip(data) {
        assert_eq!(&g.expect("read")[..d.len()], &d[..]);
    }
    checks.into_inner()
}

/// Merged reads go past the page cache where the file system allows it,
/// and still return what the last write put there: a direct read of a
/// range whose newest bytes sit unflushed in the page cache must not
/// return the older bytes on the disk. The leaves are opened as the pool
/// opens them (`open_device`: a file leaf inside a fault leaf).
#[test]
fn merged_reads_past_the_page_cache_see_unflushed_writes() {
    let dir = tempfile::tempdir().unwrap();
    let paths = make_files(dir.path(), "disk", 4, MIN_LEAF_SIZE);
    let leaves: Vec<Arc<dyn Leaf>> = paths
        .iter()
        .map(|p| open_device(p).unwrap() as Arc<dyn Leaf>)
        .collect();
    // Whether this file system takes direct reads at all.
    let direct_here = FileLeaf::open(&paths[0]).unwrap().reads_direct();
    let v = open_top_of(VdevKind::Raidz { parity: 1 }, &paths, &leaves);
    let direct = |ls: &[Arc<dyn Leaf>]| ls.iter().map(|l| l.direct_reads()).sum::<u64>();
    let mut want = Vec::new();
    let mut at = 0;
    for _ in 0..64 {
        want.push((at, 16 << 10));
        at += v.alloc_size(16 << 10);
    }
    let round = |seed: u64, flush: bool| {
        let data: Vec<Vec<u8>> = (0..64).map(|i| pattern(seed + i, 16 << 10)).collect();
        for (&(o, _), d) in want.iter().zip(&data) {
            v.write(o, d).expect("written");
        }
        if flush {
            v.flush().expect("flushed");
        }
        let before = direct(&leaves);
        // One check per block: every block's merged bytes verified the
        // first time. A stale direct read would fail its check and the
        // block would be read again alone (and checked again).
        assert_eq!(
            read_checked(&v, &want, &data),
            64,
            "blocks read again alone"
        );
        direct(&leaves) - before
    };
    // Flushed: the disk has the bytes. Then rewritten in place without a
    // flush: the disk still has the first round, the page cache the second.
    let first = round(1000, true);
    let second = round(2000, false);
    if direct_here {
        assert!(first > 0 && second > 0, "direct reads {first}, {second}");
    }
}

/// Four leaves as the pool opens them (a file leaf inside a fault leaf),
/// raidz1 over them, and whether this file system takes direct reads. The
/// tests that use it make their files under the build's own folder, on a
/// disk: a temporary folder on tmpfs takes no direct reads on older
/// kernels, and the batched path would not run at all.
fn raidz_of_devices(dir: &Path) -> (TopVdev, Vec<Arc<FaultLeaf>>, bool) {
    let paths = make_files(dir, "disk", 4, MIN_LEAF_SIZE);
    let faults: Vec<Arc<FaultLeaf>> = paths.iter().map(|p| open_device(p).unwrap()).collect();
    let leaves: Vec<Arc<dyn Leaf>> = faults.iter().map(|l| l.clone() as Arc<dyn Leaf>).collect();
    let direct_here = FileLeaf::open(&paths[0]).unwrap().reads_direct();
    (
        open_top_of(VdevKind::Raidz { parity: 1 }, &paths, &leaves),
        faults,
        direct_here,
    )
}

/// `n` blocks of 16 KiB written at the start of `v`, `gap` bytes apart,
/// and flushed: where they are, and their bytes.
fn written_blocks(v: &TopVdev, n: u64, gap: u64, seed: u64) -> (Vec<(u64, usize)>, Vec<Vec<u8>>) {
    let mut want = Vec::new();
    let mut at = 0;
    for _ in 0..n {
        want.push((at, 16 << 10));
        at += v.alloc_size(16 << 10) + gap;
    }
    let data: Vec<Vec<u8>> = (0..n).map(|i| pattern(seed + i, 16 << 10)).collect();
    for (&(o, _), d) in want.iter().zip(&data) {
        v.write(o, d).expect("written");
    }
    v.flush().expect("flushed");
    (want, data)
}

/// Asserts that reads went through the ring since `before` (a count of
/// `tarn_vdev::testing::ring_reads`) where this machine has rings and the
/// files take direct reads: a test of the batched path that ran only the
/// other one would prove nothing about it.
fn assert_rang(before: u64, direct_here: bool) {
    if direct_here && tarn_vdev::testing::rings_available() {
        assert!(
            tarn_vdev::testing::ring_reads() > before,
            "no read went through the ring"
        );
    }
}

/// Blocks far apart are a run each on every child: a merged read of many
/// of them is hundreds of runs, submitted together (more than a ring takes
/// at once, so in chunks). Each block gets its own bytes, verified the
/// first time (a run read into the wrong buffer, or taken whole when it
/// came back short, would fail its check and be read again alone).
#[test]
fn merged_reads_of_scattered_blocks_are_submitted_together() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (v, _faults, direct_here) = raidz_of_devices(dir.path());
    // A gap of more than the read gap on every child: no two blocks share
    // a run.
    let (want, data) = written_blocks(&v, 96, 256 << 10, 77);
    let before = tarn_vdev::testing::ring_reads();
    let checks = read_checked(&v, &want, &data);
    assert_eq!(checks, want.len(), "blocks read again alone");
    if direct_here && tarn_vdev::testing::rings_available() {
        // Three data columns per block, each a run of its own.
        let rang = tarn_vdev::testing::ring_reads() - before;
        assert!(
            rang >= 3 * want.len() as u64,
            "{rang} reads through the ring"
        );
    }
}

/// A fault set on a child reaches merged reads: its runs go through the
/// leaf's own read path (where faults are injected), not straight to the
/// file, and the blocks are rebuilt from parity.
#[test]
fn merged_reads_meet_faults_set_on_a_child() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (v, faults, direct_here) = raidz_of_devices(dir.path());
    let (want, data) = written_blocks(&v, 64, 0, 500);
    faults[2].inject(Fault::always(FaultKind::ReadError));
    let before = tarn_vdev::testing::ring_reads();
    let got = v.read_many(&want, &|i, b| b == &data[i][..]);
    for (g, d) in got.into_iter().zip(&data) {
        assert_eq!(&g.expect("rebuilt")[..d.len()], &d[..]);
    }
    assert!(faults[2].injected() > 0, "the fault was bypassed");
    // The other children's runs went through the ring.
    assert_rang(before, direct_here);
}

/// A run that comes back short (here a member file cut shorter than the
/// size the leaf was opened with, as a device that shrank) is not taken
/// as read: its blocks are read again alone and rebuilt from parity, and
/// no check ever sees the bytes the short read left in its buffer.
#[test]
fn a_short_merged_read_is_not_taken_whole() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (v, faults, direct_here) = raidz_of_devices(dir.path());
    let (want, data) = written_blocks(&v, 64, 0, 900);
    // Child 1 keeps only the first 8 KiB of its data region.
    let cut = OpenOptions::new()
        .write(true)
        .open(faults[1].inner().path())
        .unwrap();
    cut.set_len(DATA_START + 8192).unwrap();
    let wrong = std::sync::atomic::AtomicUsize::new(0);
    let before = tarn_vdev::testing::ring_reads();
    let got = v.read_many(&want, &|i, b| {
        let right = b == &data[i][..];
        if !right {
            wrong.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        right
    });
    for (g, d) in got.into_iter().zip(&data) {
        assert_eq!(&g.expect("rebuilt")[..d.len()], &d[..]);
    }
    assert_eq!(wrong.into_inner(), 0, "checks saw what a short read left");
    assert_rang(before, direct_here);
}
