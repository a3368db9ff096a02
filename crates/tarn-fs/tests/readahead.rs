//! Read-ahead on a real pool: a sequential reader finds the records it
//! asks for next already in the block cache, random readers cause no
//! read-ahead, nothing read ahead is ever served over newer data, and
//! readers that share one read of a damaged record get the truth or an
//! error.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use tarn_block::BlockCache;
use tarn_fs::Cred;
use tarn_pool::PoolOptions;
use tarn_testkit::data::{pattern, Rng};
use tarn_testkit::datasets::{self, new_file, DsFs, FsPool};
use tarn_testkit::pools::wait_prefetched;
use tarn_testkit::{files, pools};
use tarn_vdev::{VdevKind, DATA_START};

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

/// Many readers of the same damaged records at once, with read-ahead
/// beside them: one of them reads each record (the others wait for it),
/// so every reader must still get the true bytes while one side of the
/// mirror heals; with both sides damaged every reader gets an error, and
/// none gets wrong bytes from another's failed read.
#[test]
fn readers_of_one_damaged_record_at_once_each_get_the_truth_or_an_error() {
    const READERS: usize = 8;
    let cache = Arc::new(BlockCache::new(256 << 20));
    let opts = PoolOptions {
        cache: Some(cache.clone()),
        ..pools::opts()
    };
    let dir = tempfile::tempdir().unwrap();
    let pool = pools::tank_with(dir.path(), VdevKind::Mirror, 2, 64 << 20, opts);
    let fs = datasets::filesystem(
        &pool,
        "tank/fs",
        &[
            ("compression", "off"),
            ("recordsize", "128K"),
            ("atime", "off"),
        ],
    );
    let c = Cred::root();
    let f = new_file(&fs, "f");
    let data = pattern(5, 4 << 20);
    fs.write(f, 0, &data, false, &c).unwrap();
    pool.sync().unwrap();
    let (_, allocated, _) = pool.space();
    let used = allocated + (1 << 20);
    let damage = |member: &str, seed: u64| {
        let junk = Rng::new(seed).bytes(used as usize);
        files::overwrite(&dir.path().join(member), DATA_START, &junk);
    };
    // Reader `i` starts at its own record and wraps around, so readers
    // meet on records in every order, not in step.
    let records = data.len() as u64 / REC;
    let read_all = |fs: &DsFs, i: u64| -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; data.len()];
        for n in 0..records {
            let off = (n + i * 5) % records * REC;
            let got = fs.read(f, off, REC as u32).map_err(|e| e.to_string())?;
            out[off as usize..(off + REC) as usize].copy_from_slice(&got);
        }
        Ok(out)
    };
    let together = |fs: &DsFs| -> Vec<Result<Vec<u8>, String>> {
        let start = Barrier::new(READERS);
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..READERS as u64)
                .map(|i| {
                    let (start, read_all) = (&start, &read_all);
                    s.spawn(move || {
                        start.wait();
                        read_all(fs, i)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("reader")).collect()
        })
    };

    // One side damaged: every reader gets the file, the other side heals it.
    damage("d0", 1);
    cache.evict_pool(pool.guid());
    for (i, r) in together(&fs).into_iter().enumerate() {
        assert!(
            r.as_ref().is_ok_and(|b| *b == data),
            "reader {i}: {:?}",
            r.err()
        );
    }
    assert!(pools::cksum_errors(&pool) > 0, "no damage was met");
    assert!(
        pool.status().damaged.is_empty(),
        "{:?}",
        pool.status().damaged
    );

    // Both sides damaged: nobody gets bytes, least of all wrong ones.
    damage("d0", 2);
    damage("d1", 3);
    cache.evict_pool(pool.guid());
    for (i, r) in together(&fs).into_iter().enumerate() {
        assert!(
            r.is_err(),
            "reader {i} read a file both sides of which are damaged"
        );
    }
}
