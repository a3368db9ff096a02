//! The POSIX layer under concurrent load on a real pool: threads writing
//! and reading their own files and stripes of a shared file, with
//! `fsync`s through the intent log, while txgs sync, snapshots are taken
//! and a scrub runs; then every file is checked, before and after an
//! export and import. Seeded (`TARN_FS_SEED`), so a failure replays.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tarn_fs::{Cred, ROOT_INO};
use tarn_pool::ScanAction;
use tarn_testkit::data::{env_seed, pattern, random_seed, Rng};
use tarn_testkit::datasets::{filesystem, mount, new_file, DsFs};
use tarn_testkit::gates;
use tarn_testkit::pools::{self, wait_scan};
use tarn_vdev::VdevKind;

const THREADS: usize = 6;
const STRIPE: u64 = 48 << 10;
const STRIPES: u64 = 48;

type Own = Vec<u8>;
type Stripes = Vec<(u64, Vec<u8>)>;

fn worker(fs: &DsFs, shared: u64, id: usize, mut rng: Rng, fsyncs: bool) -> (Own, Stripes) {
    let c = Cred::root();
    let own = new_file(fs, &format!("own-{id}"));
    let mut model: Vec<u8> = Vec::new();
    let mut stripes = BTreeMap::new();
    for round in 0..40 {
        let off = rng.below(3 << 20);
        let len = rng.range(1, 300 << 10) as usize;
        let data = rng.bytes(len);
        let sync = fsyncs && rng.chance(0.1);
        fs.write(own, off, &data, false, &c).unwrap();
        if sync {
            // A stable write: durable before it is acknowledged.
            fs.fsync(own).unwrap();
        }
        let end = off as usize + len;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[off as usize..end].copy_from_slice(&data);
        let back = fs.read(own, off, len as u32).unwrap();
        if back != data {
            let first = back.iter().zip(&data).position(|(a, b)| a != b);
            panic!(
                "thread {id} round {round}: own file read back differs: wrote {} at {off}, \
                 read {}, first difference at {first:?}",
                data.len(),
                back.len()
            );
        }
        let j = rng.below(STRIPES / THREADS as u64) * THREADS as u64 + id as u64;
        let data = rng.bytes(STRIPE as usize);
        fs.write(shared, j * STRIPE, &data, false, &c).unwrap();
        let back = fs.read(shared, j * STRIPE, STRIPE as u32).unwrap();
        assert!(
            back == data,
            "thread {id}: shared stripe {j} read back differs"
        );
        stripes.insert(j * STRIPE, data);
        if fsyncs && rng.chance(0.15) {
            fs.fsync(own).unwrap();
        }
    }
    fs.release(own).unwrap();
    (model, stripes.into_iter().collect())
}

fn read_all(fs: &DsFs, ino: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let got = fs.read(ino, out.len() as u64, 256 << 10).unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend_from_slice(&got);
    }
}

fn verify(fs: &DsFs, own: &[Own], shared: &Stripes) {
    let c = Cred::root();
    for (i, model) in own.iter().enumerate() {
        let a = fs
            .lookup(ROOT_INO, format!("own-{i}").as_bytes(), &c)
            .unwrap();
        let got = read_all(fs, a.ino);
        assert_eq!(got.len(), model.len(), "own-{i}: size");
        assert!(got == *model, "own-{i}: content differs");
    }
    let a = fs.lookup(ROOT_INO, b"shared", &c).unwrap();
    for (off, data) in shared {
        let got = fs.read(a.ino, *off, data.len() as u32).unwrap();
        assert!(got == *data, "shared stripe at {off} differs");
    }
}

fn under_load(fsyncs: bool) {
    let seed = env_seed("TARN_FS_SEED").unwrap_or_else(random_seed);
    eprintln!("seed {seed:#x} (TARN_FS_SEED)");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let pool = pools::tank(dir.path(), VdevKind::Raidz { parity: 1 }, 4, 256 << 20);
    let fs = Arc::new(filesystem(&pool, "tank/fs", &[("recordsize", "128K")]));
    pool.sync().unwrap();
    let empty = pool.list_entry().allocated;
    let c = Cred::root();
    let before = new_file(&fs, "before");
    let base = rng.bytes(3 << 20);
    fs.write(before, 0, &base, false, &c).unwrap();
    fs.release(before).unwrap();
    let shared = new_file(&fs, "shared");
    pool.sync().unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let background = {
        let (pool, done) = (pool.clone(), done.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            let mut scrubbed = false;
            while !done.load(Ordering::Acquire) {
                pool.sync().unwrap();
                n += 1;
                let snap = format!("tank/fs@s{n}");
                tarn_dataset::snapshot(&pool, &[snap], false).unwrap();
                if !scrubbed {
                    pool.scrub(ScanAction::Start).unwrap();
                    scrubbed = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            n
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|id| {
            let fs = fs.clone();
            let r = rng.fork();
            std::thread::spawn(move || worker(&fs, shared, id, r, fsyncs))
        })
        .collect();
    let mut own = Vec::new();
    let mut stripes = Vec::new();
    for w in workers {
        let (o, s) = w.join().unwrap();
        own.push(o);
        stripes.extend(s);
    }
    done.store(true, Ordering::Release);
    let syncs = background.join().unwrap();
    assert!(syncs > 0);
    fs.release(shared).unwrap();
    verify(&fs, &own, &stripes);
    assert!(read_all(&fs, before) == base);
    pool.sync().unwrap();
    let scan = wait_scan(&pool);
    assert_eq!(scan.errors, 0, "{scan:?}");
    assert!(pool.status().damaged.is_empty());

    drop(fs);
    pool.export(false).unwrap();
    let pool = pools::import(dir.path(), "tank");
    let fs = mount(&pool, "tank/fs");
    verify(&fs, &own, &stripes);
    let scan = pools::scrub(&pool);
    assert_eq!(scan.errors, 0, "{scan:?}");

    // Everything deleted, snapshots destroyed: the space comes back (a
    // block written twice, or freed but never given back, would stay).
    for i in 0..own.len() {
        fs.unlink(ROOT_INO, format!("own-{i}").as_bytes(), &c)
            .unwrap();
    }
    fs.unlink(ROOT_INO, b"shared", &c).unwrap();
    fs.unlink(ROOT_INO, b"before", &c).unwrap();
    for i in tarn_dataset::list(&pool, true).unwrap() {
        if i.name.starts_with("tank/fs@") {
            tarn_dataset::destroy(&pool, &i.name, false).unwrap();
        }
    }
    for _ in 0..4 {
        pool.sync().unwrap();
    }
    let left = pool.list_entry().allocated;
    assert!(
        left < empty + (4 << 20),
        "{} KiB still allocated after everything was deleted ({} KiB when empty)",
        left >> 10,
        empty >> 10
    );
}

#[test]
fn many_writers_with_syncs_snapshots_and_a_scrub() {
    under_load(false);
}

#[test]
fn many_writers_with_fsyncs_syncs_snapshots_and_a_scrub() {
    under_load(true);
}

/// A write into part of a record that is on disk but not cached reads the
/// old record without holding the dataset: with that read held at a gate,
/// a whole-record write to another file of the dataset, and a read of it,
/// still finish. (Read inside the write's transaction, the disk read would
/// hold up every other request on the dataset; the check then times out.)
#[test]
fn a_partial_write_reads_its_old_record_without_holding_up_the_dataset() {
    const RS: usize = 16 << 10;
    let c = Cred::root();
    let dir = tempfile::tempdir().unwrap();
    let pool = pools::tank(dir.path(), VdevKind::Raidz { parity: 1 }, 4, 64 << 20);
    let fs = filesystem(&pool, "tank/fs", &[("recordsize", "16K")]);
    let f = new_file(&fs, "f");
    fs.write(f, 0, &pattern(1, 4 * RS), false, &c).unwrap();
    fs.release(f).unwrap();
    let g = new_file(&fs, "g");
    fs.release(g).unwrap();
    pool.sync().unwrap();
    drop(fs);
    // Imported again: the block cache is empty, f's records on disk only.
    pool.abandon();
    drop(pool);
    let pool = pools::attached(
        pools::try_import(&[dir.path()], "tank", true, pools::opts()).expect("import"),
    );
    let fs = Arc::new(mount(&pool, "tank/fs"));
    // The tree's nodes, both inodes and the allocator in memory first.
    fs.write(g, 0, &pattern(3, RS), false, &c).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 4 * RS as u64);
    let members: Vec<_> = (0..4).map(|i| dir.path().join(format!("d{i}"))).collect();
    let gate = gates::hold_reads(&members.iter().map(|p| p.as_path()).collect::<Vec<_>>());
    let patcher = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.write(f, RS as u64 + 100, &[7; 4096], false, &Cred::root()))
    };
    assert!(
        gate.wait_for_waiter(gates::LONG),
        "the partial write never read its old record"
    );
    let other = fs.clone();
    let back = gates::within(&gate, "a whole-record write beside a patch", move || {
        other.write(g, RS as u64, &pattern(2, RS), false, &Cred::root())?;
        other.read(g, RS as u64, RS as u32)
    });
    assert!(back.unwrap() == pattern(2, RS));
    gate.open();
    assert_eq!(patcher.join().unwrap().unwrap(), 4096);
    let mut want = pattern(1, 4 * RS);
    want[RS + 100..RS + 100 + 4096].fill(7);
    assert!(fs.read(f, 0, 4 * RS as u32).unwrap() == want);
}

/// A backend that counts the read transactions run on the dataset.
struct Counting {
    inner: tarn_fs::DatasetBackend,
    reads: std::sync::atomic::AtomicU64,
}

impl tarn_fs::Backend for Counting {
    fn txn<R>(
        &self,
        write: bool,
        f: &mut dyn FnMut(&mut dyn tarn_fs::Store) -> Result<R, tarn_fs::FsError>,
    ) -> Result<R, tarn_fs::FsError> {
        if !write {
            self.reads.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.txn(write, f)
    }

    fn sync(&self) -> Result<(), tarn_fs::FsError> {
        self.inner.sync()
    }

    fn snapshots(&self) -> Result<Vec<(String, Arc<Self>)>, tarn_fs::FsError> {
        Ok(Vec::new())
    }

    fn generation(&self) -> Option<u64> {
        self.inner.generation()
    }
}

/// A write that continues the file's last write inside the same record,
/// in the same open txg, skips the read transaction that warms the
/// records it patches (the record is in the open txg already); a write
/// elsewhere, or one after the txg moved on, still runs it; and every
/// byte reads back as written.
#[test]
fn a_write_continuing_the_last_one_in_its_record_skips_warming() {
    const RS: u64 = 16 << 10;
    let c = Cred::root();
    let dir = tempfile::tempdir().unwrap();
    let pool = pools::tank(dir.path(), VdevKind::Raidz { parity: 1 }, 4, 64 << 20);
    drop(filesystem(&pool, "tank/fs", &[("recordsize", "16K")]));
    let h = tarn_dataset::open(&pool, "tank/fs").unwrap();
    let backend = Arc::new(Counting {
        inner: tarn_fs::DatasetBackend::new(h),
        reads: Default::default(),
    });
    let fs = tarn_fs::Fs::mount(backend.clone()).unwrap();
    let f = fs
        .create(ROOT_INO, b"f", libc::S_IFREG | 0o644, 0, libc::O_RDWR, &c)
        .unwrap()
        .ino;
    let mut model = Vec::new();
    let mut write = |off: u64, len: usize, seed: u64| -> u64 {
        let data = pattern(seed, len);
        let before = backend.reads.load(Ordering::Relaxed);
        fs.write(f, off, &data, false, &c).unwrap();
        let end = off as usize + len;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[off as usize..end].copy_from_slice(&data);
        backend.reads.load(Ordering::Relaxed) - before
    };
    assert!(write(0, 4096, 1) >= 1, "a first write warms");
    assert_eq!(write(4096, 4096, 2), 0, "continuing in the record");
    assert_eq!(write(8192, 8192, 3), 0, "up to the record's end");
    assert!(
        write(RS, 4096, 4) >= 1,
        "a write starting a new record warms"
    );
    assert!(write(3 * RS + 5, 100, 5) >= 1, "a write elsewhere warms");
    pool.sync().unwrap();
    assert!(
        write(3 * RS + 105, 100, 6) >= 1,
        "after the txg moved on, the record is not in the open txg"
    );
    assert!(
        write(3 * RS + 205, 2 * RS as usize, 7) >= 1,
        "a write reaching past its record warms"
    );
    assert!(fs.read(f, 0, model.len() as u32).unwrap() == model);
}
