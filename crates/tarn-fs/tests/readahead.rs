//! Read-ahead on a real pool: a sequential reader finds the records it
//! asks for next already in the block cache, random readers cause no
//! read-ahead, and nothing read ahead is ever served over newer data.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tarn_block::{BlockCache, CacheStats};
use tarn_fs::Cred;
use tarn_pool::PoolOptions;
use tarn_testkit::data::{pattern, Rng};
use tarn_testkit::datasets::{new_file, DsFs, FsPool};
use tarn_testkit::pools;

const REC: u64 = 128 << 10;
const SIZE: usize = 16 << 20;

/// A pool with a cache of its own (so its counters are this test's), and
/// a 16 MiB file of 128 KiB records, committed; the cache is then emptied.
fn setup() -> (FsPool, Arc<BlockCache>, u64, Vec<u8>) {
    let cache = Arc::new(BlockCache::new(256 << 20));
    let opts = PoolOptions {
        cache: Some(cache.clone()),
        ..pools::opts()
    };
    let p = FsPool::new(256 << 20, opts);
    let c = Cred::root();
    let movie = new_file(&p.fs, "movie");
    let data = pattern(11, SIZE);
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        p.fs.write(movie, (i as u64) << 20, chunk, false, &c)
            .unwrap();
    }
    p.fs.release(movie).unwrap();
    p.pool.sync().unwrap();
    cache.evict_pool(p.pool.guid());
    (p, cache, movie, data)
}

fn read(fs: &DsFs, ino: u64, off: u64, len: u64) -> Vec<u8> {
    fs.read(ino, off, len as u32).unwrap()
}

/// Waits until the cache holds `n` blocks read ahead.
fn wait_prefetched(cache: &BlockCache, n: u64) -> CacheStats {
    let t0 = Instant::now();
    loop {
        let s = cache.stats();
        if s.prefetched >= n {
            return s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "read-ahead never came: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_sequential_reader_finds_its_next_records_in_the_cache() {
    let (p, cache, ino, data) = setup();
    // Two reads in sequence start a stream: the second reads ahead two
    // records (256 KiB..768 KiB, the smallest window).
    assert!(read(&p.fs, ino, 0, REC) == data[..REC as usize]);
    assert_eq!(cache.stats().prefetched, 0, "one read is not a stream");
    assert!(read(&p.fs, ino, REC, REC) == data[REC as usize..2 * REC as usize]);
    let s = wait_prefetched(&cache, 4);
    let misses = s.data_misses;
    // The next records are hits on blocks read ahead, not disk reads.
    for i in 2..6 {
        let off = i * REC;
        assert!(read(&p.fs, ino, off, REC) == data[off as usize..(off + REC) as usize]);
    }
    let s = cache.stats();
    assert!(s.prefetch_hits >= 4, "{s:?}");
    assert_eq!(s.data_misses, misses, "a record read ahead was read again");
    // The rest of the file reads right whatever the race with read-ahead.
    let mut off = 6 * REC;
    while off < SIZE as u64 {
        let got = read(&p.fs, ino, off, 64 << 10);
        assert!(
            got == data[off as usize..off as usize + got.len()],
            "at {off}"
        );
        off += got.len() as u64;
    }
}

/// Random reads may land right after an earlier one by chance (one
/// position in 4096 here) and read two records ahead; no more.
#[test]
fn random_reads_read_next_to_nothing_ahead() {
    let (p, cache, ino, data) = setup();
    let mut rng = Rng::new(5);
    for _ in 0..300 {
        let off = rng.below(SIZE as u64 / 4096) * 4096;
        assert!(read(&p.fs, ino, off, 4096) == data[off as usize..off as usize + 4096]);
    }
    std::thread::sleep(Duration::from_millis(50));
    let s = cache.stats();
    assert!(s.prefetched <= 4, "{s:?}");
}

#[test]
fn records_read_ahead_are_never_served_over_newer_data() {
    let (p, cache, ino, data) = setup();
    let c = Cred::root();
    read(&p.fs, ino, 0, REC);
    read(&p.fs, ino, REC, REC);
    wait_prefetched(&cache, 4);
    // Record 3 was read ahead; now it changes (in memory, then on disk),
    // and record 4 is cut off by a truncate.
    let new = pattern(12, REC as usize);
    p.fs.write(ino, 3 * REC, &new, false, &c).unwrap();
    assert!(read(&p.fs, ino, 3 * REC, REC) == new);
    p.pool.sync().unwrap();
    assert!(read(&p.fs, ino, 3 * REC, REC) == new);
    assert!(read(&p.fs, ino, 2 * REC, REC) == data[2 * REC as usize..3 * REC as usize]);
    let attr = tarn_fs::SetAttr {
        size: Some(4 * REC + 100),
        ..Default::default()
    };
    p.fs.setattr(ino, &attr, &c).unwrap();
    let tail = read(&p.fs, ino, 4 * REC, REC);
    assert!(tail == data[4 * REC as usize..4 * REC as usize + 100]);
    p.fs.setattr(
        ino,
        &tarn_fs::SetAttr {
            size: Some(5 * REC),
            ..Default::default()
        },
        &c,
    )
    .unwrap();
    let tail = read(&p.fs, ino, 4 * REC, REC);
    assert!(tail[..100] == data[4 * REC as usize..4 * REC as usize + 100]);
    assert!(
        tail[100..].iter().all(|&b| b == 0),
        "old bytes past a truncate"
    );
}
