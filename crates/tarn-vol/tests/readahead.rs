//! Read-ahead on a volume: a guest reading its disk in sequence finds the
//! blocks it asks for next in the block cache, random reads read nothing
//! ahead, and a block read ahead is never served over a newer write. And
//! where a volume's lone blocks are read from: past the member files'
//! page cache, as its runs of blocks are.

use std::sync::Arc;
use std::time::Duration;

use tarn_block::BlockCache;
use tarn_dataset::VolSpec;
use tarn_pool::{Pool, PoolOptions};
use tarn_testkit::data::{pattern, Rng};
use tarn_testkit::pools::{opts, props, tank_with, wait_prefetched};
use tarn_vdev::VdevKind;
use tarn_vol::{Device, Volume};

const BLOCK: u32 = 16 << 10;
const SIZE: u64 = 16 << 20;

/// A pool with a cache of its own (so its counters are this test's) and a
/// 16 MiB volume of 16K blocks, written whole and committed; the cache is
/// then emptied.
fn setup(dir: &std::path::Path) -> (Arc<Pool>, Arc<BlockCache>, Arc<Volume>, Vec<u8>) {
    let cache = Arc::new(BlockCache::new(256 << 20));
    let o = PoolOptions {
        cache: Some(cache.clone()),
        ..opts()
    };
    let pool = tank_with(dir, VdevKind::Raidz { parity: 1 }, 4, 64 << 20, o);
    tarn_dataset::create_volume(
        &pool,
        "tank/vm",
        VolSpec {
            size: SIZE,
            block: BLOCK,
        },
        true,
        &props(&[("compression", "off")]),
        false,
    )
    .expect("create volume");
    let vol = Volume::open(tarn_dataset::open(&pool, "tank/vm").expect("open")).expect("volume");
    let data = pattern(21, SIZE as usize);
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        vol.write((i as u64) << 20, chunk, false).unwrap();
    }
    pool.sync().unwrap();
    cache.evict_pool(pool.guid());
    (pool, cache, vol, data)
}

#[test]
fn a_sequential_reader_finds_its_next_blocks_in_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (_pool, cache, vol, data) = setup(dir.path());
    let len = 64u64 << 10;
    assert!(vol.read(0, len as u32).unwrap() == data[..len as usize]);
    assert_eq!(cache.stats().prefetched, 0, "one read is not a stream");
    assert!(vol.read(len, len as u32).unwrap() == data[len as usize..2 * len as usize]);
    // The second read doubles the first window of 256 KiB: 32 blocks of
    // 16K are read ahead, in two jobs.
    let s = wait_prefetched(&cache, 32);
    let misses = s.data_misses;
    for i in 2..6 {
        let off = i * len;
        assert!(vol.read(off, len as u32).unwrap() == data[off as usize..(off + len) as usize]);
    }
    let s = cache.stats();
    assert!(s.prefetch_hits >= 16, "{s:?}");
    assert_eq!(s.data_misses, misses, "a block read ahead was read again");
    // The rest reads right whatever the race with read-ahead.
    let mut off = 6 * len;
    while off < SIZE {
        let n = (1u64 << 20).min(SIZE - off);
        assert!(
            vol.read(off, n as u32).unwrap() == data[off as usize..(off + n) as usize],
            "at {off}"
        );
        off += n;
    }
    assert!(cache.stats().prefetched > 64, "the window did not grow");
}

#[test]
fn random_reads_read_next_to_nothing_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let (_pool, cache, vol, data) = setup(dir.path());
    let mut rng = Rng::new(9);
    for _ in 0..300 {
        let off = rng.below(SIZE / 4096) * 4096;
        assert!(vol.read(off, 4096).unwrap() == data[off as usize..off as usize + 4096]);
    }
    // Jobs queued by then have run (or would be counted) after this.
    std::thread::sleep(Duration::from_millis(500));
    // A read landing right after an earlier one by chance (about one in
    // a thousand here) continues that stream and reads its window ahead,
    // 32 blocks at first: two such windows at most, where one sequential
    // pass of the same reads would bring hundreds of blocks.
    let s = cache.stats();
    assert!(s.prefetched <= 64, "{s:?}");
}

#[test]
fn blocks_read_ahead_are_never_served_over_newer_data() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, cache, vol, _) = setup(dir.path());
    let len = 64u64 << 10;
    vol.read(0, len as u32).unwrap();
    vol.read(len, len as u32).unwrap();
    wait_prefetched(&cache, 32);
    // Blocks 8.. were read ahead; now part of them changes, in memory,
    // then on disk, and another part is trimmed.
    let new = pattern(22, 3 * BLOCK as usize);
    vol.write(9 * BLOCK as u64, &new, false).unwrap();
    vol.trim(13 * BLOCK as u64, BLOCK as u64).unwrap();
    let check = |v: &Volume| {
        assert!(v.read(9 * BLOCK as u64, new.len() as u32).unwrap() == new);
        assert!(v
            .read(13 * BLOCK as u64, BLOCK)
            .unwrap()
            .iter()
            .all(|&b| b == 0));
    };
    check(&vol);
    pool.sync().unwrap();
    check(&vol);
}

/// A guest's small random read, and the old block a write into part of a
/// block patches, are read past the member files' page cache where the
/// file system allows it (the guest keeps its own hot data; the block
/// cache keeps the block): each of the block's three data columns is one
/// direct read. The bytes are the block's, and the patch lands on them.
#[test]
fn a_lone_block_is_read_past_the_page_cache() {
    // On the build's own disk: tmpfs takes no direct reads on older kernels.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (pool, cache, vol, mut data) = setup(dir.path());
    let paths: Vec<std::path::PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    let direct_here = tarn_vdev::FileLeaf::open(&paths[0]).unwrap().reads_direct();
    let leaves: Vec<_> = paths
        .iter()
        .filter_map(|p| tarn_vdev::find_device(p))
        .collect();
    assert_eq!(leaves.len(), 4, "the pool's members are open");
    let direct = || {
        leaves
            .iter()
            .map(|l| tarn_vdev::Leaf::direct_reads(l.as_ref()))
            .sum::<u64>()
    };
    let b = BLOCK as u64;

    let before = direct();
    let at = (5 * b + 4096) as usize;
    assert!(vol.read(at as u64, 4096).unwrap() == data[at..at + 4096]);
    let read = direct() - before;

    let before = direct();
    let at = (9 * b + 4096) as usize;
    let patch = pattern(23, 4096);
    vol.write(at as u64, &patch, false).unwrap();
    let patched = direct() - before;
    data[at..at + 4096].copy_from_slice(&patch);

    if direct_here {
        assert_eq!(read, 3, "a cold 16K block is three data columns");
        assert_eq!(patched, 3, "the old block of a patch, read the same way");
    }
    pool.sync().unwrap();
    cache.evict_pool(pool.guid());
    let whole = vol.read(8 * b, 2 * BLOCK).unwrap();
    assert!(whole == data[(8 * b) as usize..(10 * b) as usize]);
}
