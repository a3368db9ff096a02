//! The intent log through the POSIX layer: what `fsync` and the `sync`
//! property promise survives a crash that no txg commit followed, replay
//! is idempotent, and the log leaves no space behind.
//!
//! A "crash" here drops every handle to the pool without exporting it:
//! nothing more is written (the txg interval is an hour), exactly like a
//! process killed after its last acknowledged request.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tarn_fs::{Cred, ROOT_INO};
use tarn_pool::{Pool, PoolOptions, VdevSpec};
use tarn_testkit::data::pattern;
use tarn_testkit::datasets::{filesystem as dataset, mount, new_file, DsFs};
use tarn_testkit::pools::{attached, create, opts, singles};
use tarn_vdev::{Fault, FaultKind, VdevKind};

fn devices(dir: &Path, n: usize) -> Vec<PathBuf> {
    tarn_testkit::files::make(dir, "d", n, 128 << 20)
}

fn create_pool(devs: &[PathBuf], kind: VdevKind) -> Arc<Pool> {
    attached(create("tank", kind, devs, &[]).expect("create pool"))
}

/// Imports "tank" from `dirs` (taking it over from the crashed owner),
/// optionally discarding an intent log that cannot be read in full.
fn try_import(dirs: &[&Path], discard_log: bool) -> Result<Arc<Pool>, tarn_pool::PoolError> {
    let opts = PoolOptions {
        discard_log,
        ..opts()
    };
    tarn_testkit::pools::try_import(dirs, "tank", true, opts)
}

fn import(dir: &Path) -> Arc<Pool> {
    attached(try_import(&[dir], false).expect("import after the crash"))
}

fn write(fs: &DsFs, ino: u64, off: u64, data: &[u8]) {
    let n = fs
        .write(ino, off, data, false, &Cred::root())
        .expect("write");
    assert_eq!(n, data.len());
}

/// The whole content of `name`, or None when it does not exist.
fn content(fs: &DsFs, name: &str) -> Option<Vec<u8>> {
    let c = Cred::root();
    let a = fs.lookup(ROOT_INO, name.as_bytes(), &c).ok()?;
    let mut out = Vec::new();
    loop {
        let chunk = fs
            .read(a.ino, out.len() as u64, 1 << 20)
            .expect("read back");
        if chunk.is_empty() {
            break;
        }
        out.extend_from_slice(&chunk);
    }
    assert_eq!(out.len() as u64, a.size, "{name}: bytes read vs size");
    Some(out)
}

#[test]
fn fsync_is_durable_without_a_txg_and_only_for_its_dataset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let devs = devices(dir.path(), 4);
    let pool = create_pool(&devs, VdevKind::Raidz { parity: 1 });
    // recordsize 128K: the 1 MiB write goes in place (referenced from the
    // log), the small ones are copied into it.
    let a = dataset(&pool, "tank/a", &[("recordsize", "128K")]);
    let b = dataset(&pool, "tank/b", &[]);
    let big = pattern(1, 1 << 20);
    let small = pattern(2, 5000);
    let f1 = new_file(&a, "big");
    write(&a, f1, 0, &big);
    let f2 = new_file(&a, "small");
    for (i, chunk) in small.chunks(700).enumerate() {
        write(&a, f2, (i * 700) as u64, chunk);
    }
    let f3 = new_file(&a, "gone");
    write(&a, f3, 0, b"soon deleted");
    a.unlink(ROOT_INO, b"gone", &Cred::root()).expect("unlink");
    // Renames are logged too.
    let f4 = new_file(&a, "old-name");
    write(&a, f4, 0, b"renamed");
    a.rename(
        ROOT_INO,
        b"old-name",
        ROOT_INO,
        b"new-name",
        0,
        &Cred::root(),
    )
    .expect("rename");
    // Another dataset's writes are not part of a's fsync.
    let g = new_file(&b, "not-synced");
    write(&b, g, 0, b"lost on crash");
    let txg = pool.txg();
    a.fsync(f2).expect("fsync");
    assert_eq!(pool.txg(), txg, "fsync went through the log, not a txg");
    // After the fsync, more writes that nobody synced.
    write(&a, f2, 0, b"UNSYNCED");
    drop((a, b));
    pool.abandon();

    let pool = import(dir.path());
    let a = mount(&pool, "tank/a");
    let b = mount(&pool, "tank/b");
    assert_eq!(content(&a, "big").as_deref(), Some(&big[..]), "big file");
    assert_eq!(
        content(&a, "small").as_deref(),
        Some(&small[..]),
        "small writes, without the write after the fsync"
    );
    assert_eq!(content(&a, "gone"), None, "unlink replayed");
    assert_eq!(content(&a, "old-name"), None, "rename replayed");
    assert_eq!(content(&a, "new-name").as_deref(), Some(&b"renamed"[..]));
    assert_eq!(content(&b, "not-synced"), None, "other dataset not logged");
    drop((a, b));
    let leaks = pool.leak_check().expect("leak check");
    assert!(leaks.is_clean(), "no space lost to the log: {leaks:?}");
    pool.export(false).expect("export");
}

#[test]
fn sync_property_always_standard_disabled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let devs = devices(dir.path(), 1);
    let pool = create_pool(&devs, VdevKind::Single);
    let modes = ["always", "standard", "disabled"];
    // Every dataset exists (committed) before the first write, so no
    // commit of one dataset's creation carries another's writes along.
    let all: Vec<DsFs> = modes
        .iter()
        .map(|m| dataset(&pool, &format!("tank/{m}"), &[("sync", m)]))
        .collect();
    pool.sync().expect("sync");
    for (m, fs) in modes.iter().zip(&all) {
        let m = *m;
        let f = new_file(fs, "f");
        let txg = pool.txg();
        write(fs, f, 0, b"written");
        if m != "always" {
            fs.fsync(f).expect("fsync");
        }
        assert_eq!(pool.txg(), txg, "{m}: no txg commit for a sync write");
    }
    drop(all);
    pool.abandon();
    let pool = import(dir.path());
    for m in modes {
        let fs = mount(&pool, &format!("tank/{m}"));
        let want = (m != "disabled").then(|| b"written".to_vec());
        assert_eq!(content(&fs, "f"), want, "sync={m}");
    }
}

#[test]
fn replay_is_idempotent_when_its_commit_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let devs = devices(dir.path(), 2);
    let pool = create_pool(&devs, VdevKind::Mirror);
    let fs = dataset(&pool, "tank/fs", &[("recordsize", "64K")]);
    let data = pattern(3, 300_000);
    let f = new_file(&fs, "f");
    write(&fs, f, 0, &data);
    fs.fsync(f).expect("fsync");
    drop(fs);
    pool.abandon();

    // Import, then fail every write: the replay cannot commit.
    let pool = try_import(&[dir.path()], false).expect("import");
    for d in &devs {
        tarn_vdev::find_device(d)
            .expect("device is open")
            .inject(Fault::always(FaultKind::WriteError));
    }
    assert!(
        tarn_dataset::attach(&pool).is_err(),
        "the replay's commit cannot succeed with every write failing"
    );
    pool.abandon();

    // The log is still there and replays again, exactly once.
    let pool = import_holding(dir.path(), &data);

    // And once committed, a further crash has nothing left to replay: the
    // file is what the committed txg holds.
    pool.abandon();
    let pool = import(dir.path());
    let fs = mount(&pool, "tank/fs");
    assert_eq!(content(&fs, "f").as_deref(), Some(&data[..]));
}

/// A txg committed after an import but before the replay (here a sync
/// before the dataset layer attaches) reuses the number of the txg the
/// crash lost: a second crash must still replay every commit, not skip
/// those tagged with that number.
#[test]
fn a_sync_before_the_replay_keeps_what_it_replays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let devs = devices(dir.path(), 1);
    let pool = create_pool(&devs, VdevKind::Single);
    let fs = dataset(&pool, "tank/fs", &[]);
    let data = pattern(4, 100_000);
    let f = new_file(&fs, "f");
    write(&fs, f, 0, &data);
    fs.fsync(f).expect("fsync");
    let txg = pool.txg();
    drop(fs);
    pool.abandon();

    let pool = try_import(&[dir.path()], false).expect("import");
    pool.sync().expect("a sync before the replay");
    assert!(pool.txg() > txg, "the sync committed a txg: {}", pool.txg());
    pool.abandon();

    import_holding(dir.path(), &data);
}

/// Imports "tank" after a crash and checks that tank/fs's file `f` holds
/// `data` and that the replay left no space behind.
fn import_holding(dir: &Path, data: &[u8]) -> Arc<Pool> {
    let pool = import(dir);
    let fs = mount(&pool, "tank/fs");
    assert_eq!(content(&fs, "f").as_deref(), Some(data));
    drop(fs);
    let leaks = pool.leak_check().expect("leak check");
    assert!(leaks.is_clean(), "{leaks:?}");
    pool
}

#[test]
fn writes_after_a_rollback_survive_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let devs = devices(dir.path(), 1);
    let pool = create_pool(&devs, VdevKind::Single);
    let fs = dataset(&pool, "tank/fs", &[]);
    let f = new_file(&fs, "f");
    write(&fs, f, 0, b"before");
    fs.fsync(f).expect("fsync");
    tarn_dataset::snapshot(&pool, &["tank/fs@s".to_string()], false).expect("snapshot");
    write(&fs, f, 0, b"AFTER!");
    fs.fsync(f).expect("fsync");
    drop(fs);
    tarn_dataset::rollback(&pool, "tank/fs@s", false).expect("rollback");
    let fs = mount(&pool, "tank/fs");
    assert_eq!(content(&fs, "f").as_deref(), Some(&b"before"[..]));
    let f = fs
        .lookup(ROOT_INO, b"f", &Cred::root())
        .expect("lookup")
        .ino;
    write(&fs, f, 0, b"third!");
    fs.fsync(f).expect("fsync");
    drop(fs);
    pool.abandon();
    let pool = import(dir.path());
    let fs = mount(&pool, "tank/fs");
    assert_eq!(content(&fs, "f").as_deref(), Some(&b"third!"[..]));
}

fn written(v: &[tarn_pool::status::VdevStatus]) -> u64 {
    v.iter().map(|x| x.counters.write_bytes).sum()
}

fn add_log(
    pool: &Pool,
    kind: VdevKind,
    devices: &[PathBuf],
    force: bool,
) -> Result<(), tarn_pool::PoolError> {
    let spec = VdevSpec {
        kind,
        devices: devices.to_vec(),
    };
    pool.add_log(&spec, force)
}

fn log_file(dir: &Path, name: &str) -> PathBuf {
    tarn_testkit::files::make(dir, name, 1, 64 << 20).remove(0)
}

#[test]
fn a_log_device_takes_the_log_and_replays_after_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let devs = devices(dir.path(), 4);
    let pool = create_pool(&devs, VdevKind::Raidz { parity: 1 });
    let logdir = tempfile::tempdir().expect("tempdir");
    let slog = log_file(logdir.path(), "slog");
    add_log(&pool, VdevKind::Single, std::slice::from_ref(&slog), false).expect("add log");
    assert!(
        add_log(&pool, VdevKind::Single, &devs[..1], true).is_err(),
        "a member cannot become its own pool's log"
    );
    let fs = dataset(&pool, "tank/vm", &[("recordsize", "64K")]);
    // The next sync puts the chain's start on the log device.
    pool.sync().expect("sync");
    let f = new_file(&fs, "disk.img");
    let before = pool.status();
    let mut want = vec![0u8; 0];
    for i in 0..20u64 {
        let chunk = pattern(10 + i, 4096);
        write(&fs, f, i * 4096, &chunk);
        want.extend_from_slice(&chunk);
        fs.fsync(f).expect("fsync");
    }
    // A 64K block goes into the log too: with a log device nothing is
    // written in place.
    let big = pattern(99, 65536);
    write(&fs, f, 1 << 20, &big);
    fs.fsync(f).expect("fsync");
    let after = pool.status();
    assert_eq!(after.logs.len(), 1, "status lists the log device");
    let log_bytes = written(&after.logs) - written(&before.logs);
    let data_bytes = written(&after.vdevs) - written(&before.vdevs);
    assert!(
        log_bytes >= 20 * 4096 + 65536,
        "the log device took the log ({log_bytes} bytes)"
    );
    assert_eq!(data_bytes, 0, "no fsync wrote to the data vdevs");
    drop(fs);
    pool.abandon();

    // Without its log device the pool refuses to import (next test); the
    // device is found by its label wherever it lives.
    let pool = try_import(&[dir.path(), logdir.path()], false).expect("import with the log device");
    tarn_dataset::attach(&pool).expect("attach replays the log");
    let fs = mount(&pool, "tank/vm");
    let mut got = content(&fs, "disk.img").expect("file exists");
    assert_eq!(&got[..want.len()], &want[..], "the small writes");
    assert_eq!(&got[1 << 20..], &big[..], "the 64K write");
    got.truncate(0);
    drop(fs);
    let leaks = pool.leak_check().expect("leak check");
    assert!(leaks.is_clean(), "{leaks:?}");
    pool.export(false).expect("export");
}

#[test]
fn a_missing_log_device_refuses_import_unless_discarded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let devs = devices(dir.path(), 2);
    let pool = create_pool(&devs, VdevKind::Mirror);
    let slog = log_file(dir.path(), "slog");
    add_log(&pool, VdevKind::Single, std::slice::from_ref(&slog), false).expect("add log");
    let fs = dataset(&pool, "tank/fs", &[]);
    let f = new_file(&fs, "committed");
    write(&fs, f, 0, b"in a txg");
    pool.sync().expect("sync");
    let g = new_file(&fs, "logged");
    write(&fs, g, 0, b"only in the log");
    fs.fsync(g).expect("fsync");
    drop(fs);
    pool.abandon();
    std::fs::remove_file(&slog).expect("lose the log device");

    let err =
        try_import(&[dir.path()], false).expect_err("import must refuse without the log device");
    let msg = err.to_string();
    assert!(
        msg.contains("log device") && msg.contains("slog") && msg.contains("--discard-log"),
        "the refusal names the device and the way out: {msg}"
    );
    let pool = try_import(&[dir.path()], true).expect("import discarding the log");
    tarn_dataset::attach(&pool).expect("attach");
    let fs = mount(&pool, "tank/fs");
    assert_eq!(content(&fs, "committed").as_deref(), Some(&b"in a txg"[..]));
    assert_eq!(content(&fs, "logged"), None, "discarded with the device");
}

#[test]
fn removing_a_log_device_keeps_every_acknowledged_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let devs = devices(dir.path(), 1);
    let pool = create_pool(&devs, VdevKind::Single);
    let logs = [log_file(dir.path(), "la"), log_file(dir.path(), "lb")];
    add_log(&pool, VdevKind::Mirror, &logs, false).expect("add mirrored log");
    let fs = dataset(&pool, "tank/fs", &[]);
    pool.sync().expect("sync");
    let f = new_file(&fs, "f");
    write(&fs, f, 0, b"one");
    fs.fsync(f).expect("fsync on the log device");
    pool.remove_log(&logs[1]).expect("remove by either leg");
    assert!(pool.status().logs.is_empty(), "gone from status");
    write(&fs, f, 3, b"-two");
    fs.fsync(f).expect("fsync without a log device");
    drop(fs);
    pool.abandon();
    // The removed devices no longer claim to belong to the pool.
    for l in &logs {
        std::fs::remove_file(l).expect("remove old log file");
    }
    let pool = import(dir.path());
    let fs = mount(&pool, "tank/fs");
    assert_eq!(content(&fs, "f").as_deref(), Some(&b"one-two"[..]));
}

#[test]
fn blocks_written_in_place_are_flushed_with_the_log() {
    // Two top-level vdevs: the log blocks and the blocks written in place
    // for them land on different devices, and a power cut drops whatever
    // was not flushed.
    let dir = tempfile::tempdir().expect("tempdir");
    let devs = devices(dir.path(), 2);
    let pool = Pool::create("tank", &singles(&devs), 12, &BTreeMap::new(), false, opts())
        .expect("create pool");
    tarn_dataset::attach(&pool).expect("attach");
    let fs = dataset(&pool, "tank/fs", &[("recordsize", "128K")]);
    pool.sync().expect("sync");
    let leaves: Vec<_> = devs
        .iter()
        .map(|d| tarn_vdev::find_device(d).expect("device is open"))
        .collect();
    for l in &leaves {
        l.track_unflushed(true);
    }
    let data = pattern(5, 2 << 20);
    let f = new_file(&fs, "f");
    write(&fs, f, 0, &data);
    fs.fsync(f).expect("fsync");
    drop(fs);
    pool.abandon();
    for l in &leaves {
        l.power_cut(1.0).expect("power cut");
    }
    let pool = import(dir.path());
    let fs = mount(&pool, "tank/fs");
    assert_eq!(content(&fs, "f").as_deref(), Some(&data[..]));
}

#[test]
fn a_failed_log_write_never_acknowledges_an_fsync_later() {
    let dir = tempfile::tempdir().expect("tempdir");
    let devs = devices(dir.path(), 1);
    let pool = create_pool(&devs, VdevKind::Single);
    let fs = dataset(&pool, "tank/fs", &[("recordsize", "128K")]);
    let f = new_file(&fs, "f");
    pool.sync().expect("sync");
    let data = pattern(7, 128 << 10);
    write(&fs, f, 0, &data);
    let leaf = tarn_vdev::find_device(&devs[0]).expect("device is open");
    leaf.inject(Fault::always(FaultKind::WriteError));
    assert!(
        fs.fsync(f).is_err(),
        "nothing can be durable with every write failing"
    );
    leaf.clear();
    // The pending changes were not dropped by the failed commit: a later
    // fsync either makes them durable or fails too.
    let second = fs.fsync(f);
    drop(fs);
    pool.abandon();
    let pool = import(dir.path());
    let fs = mount(&pool, "tank/fs");
    if second.is_ok() {
        assert_eq!(
            content(&fs, "f").as_deref(),
            Some(&data[..]),
            "acknowledged fsync lost"
        );
    }
}

#[test]
fn an_unreadable_log_refuses_import_unless_discarded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let devs = devices(dir.path(), 1);
    let pool = create_pool(&devs, VdevKind::Single);
    let slog = log_file(dir.path(), "slog");
    add_log(&pool, VdevKind::Single, std::slice::from_ref(&slog), false).expect("add log");
    let fs = dataset(&pool, "tank/fs", &[]);
    pool.sync().expect("sync");
    let f = new_file(&fs, "first");
    write(&fs, f, 0, b"logged first");
    fs.fsync(f).expect("fsync");
    let g = new_file(&fs, "second");
    write(&fs, g, 0, b"logged second");
    fs.fsync(g).expect("fsync");
    drop(fs);
    pool.abandon();

    // The log device's data region fails every read from now on (its
    // labels still read, so it is present, not missing).
    let size = std::fs::metadata(&slog).expect("log file").len();
    let data = (tarn_vdev::DATA_START, size - 2 * tarn_vdev::LABEL_SIZE);
    tarn_vdev::fault::set_open_hook(
        &slog,
        Some(Arc::new(move |l: &tarn_vdev::FaultLeaf| {
            l.inject(Fault {
                kind: FaultKind::ReadError,
                probability: 1.0,
                range: Some(data),
                latency_ms: 0,
            })
        })),
    );
    let err = try_import(&[dir.path()], false)
        .expect_err("an unreadable log block is not the end of the log");
    assert!(
        err.to_string().contains("intent log could not be read"),
        "{err}"
    );
    let pool = try_import(&[dir.path()], true).expect("import discarding the log");
    tarn_vdev::fault::set_open_hook(&slog, None);
    tarn_dataset::attach(&pool).expect("attach");
    let fs = mount(&pool, "tank/fs");
    assert_eq!(content(&fs, "first"), None, "not replayed: unreadable");
    assert_eq!(content(&fs, "second"), None);
}

/// On a raidz1 pool of four in `dir`, dataset `tank/a` of `recordsize`
/// (compression off) gets file `name` holding `data`, written `chunk`
/// bytes at a time, then fsynced (through the intent log, checked), then
/// a txg syncs: returns the pool, the dataset and the bytes its devices
/// took for all that.
fn fsynced_file(
    dir: &Path,
    recordsize: &str,
    name: &str,
    data: &[u8],
    chunk: usize,
) -> (Arc<Pool>, DsFs, u64) {
    let devs = devices(dir, 4);
    let pool = create_pool(&devs, VdevKind::Raidz { parity: 1 });
    let fs = dataset(
        &pool,
        "tank/a",
        &[("recordsize", recordsize), ("compression", "off")],
    );
    pool.sync().expect("sync");
    let f = new_file(&fs, name);
    let before = written(&pool.status().vdevs);
    for (i, piece) in data.chunks(chunk).enumerate() {
        write(&fs, f, (i * chunk) as u64, piece);
    }
    let txg = pool.txg();
    fs.fsync(f).expect("fsync");
    assert_eq!(pool.txg(), txg, "fsync went through the log, not a txg");
    pool.sync().expect("sync");
    let bytes = written(&pool.status().vdevs) - before;
    (pool, fs, bytes)
}

/// A file written in one piece smaller than its record is one block the
/// write gave every byte of: an fsync writes it in place and the sync then
/// uses it as is, so its bytes reach the disks once, not once into the
/// log and again at the sync.
#[test]
fn a_small_file_written_at_once_reaches_the_disks_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = pattern(7, 768 << 10);
    let (_pool, fs, bytes) = fsynced_file(dir.path(), "1M", "photo.jpg", &data, data.len());
    // raidz1 of 4: the block and its parity are 1 MiB; twice that would
    // be the bytes written twice. The rest is the sync's metadata.
    assert!(
        bytes < (1 << 20) + (512 << 10),
        "{bytes} bytes written for a 768 KiB file"
    );
    assert_eq!(content(&fs, "photo.jpg"), Some(data));
}

/// A large write into small records (a dataset of a small `recordsize`,
/// as a volume's 16K blocks are) is written in place by the fsync that
/// follows, every block of it: its bytes reach the disks once, not once
/// copied into the log and again at the sync. A crash after such an
/// fsync replays the blocks from where they were written.
#[test]
fn a_large_write_of_small_records_reaches_the_disks_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = pattern(9, 4 << 20);
    let (pool, fs, bytes) = fsynced_file(dir.path(), "16K", "disk.img", &data, 256 << 10);
    // raidz1 of 4: a 16K block and its parity take 24K, so 6 MiB for the
    // file; copied into the log first, it would be more than 10 MiB.
    assert!(
        bytes < 8 << 20,
        "{bytes} bytes written for a 4 MiB file of 16K records"
    );

    // The same after a crash: the fsync's blocks are found where they lie.
    let g = new_file(&fs, "after.img");
    let more = pattern(10, 2 << 20);
    write(&fs, g, 0, &more);
    let txg = pool.txg();
    fs.fsync(g).expect("fsync");
    assert_eq!(pool.txg(), txg, "fsync went through the log, not a txg");
    drop(fs);
    pool.abandon();
    let pool = import(dir.path());
    let fs = mount(&pool, "tank/a");
    assert_eq!(content(&fs, "disk.img"), Some(data));
    assert_eq!(content(&fs, "after.img"), Some(more));
    drop(fs);
    let leaks = pool.leak_check().expect("leak check");
    assert!(leaks.is_clean(), "no space lost to the log: {leaks:?}");
    pool.export(false).expect("export");
}

/// An import that must go back a txg (the newest one's metadata does not
/// verify) replays the commits logged in the txg after the one it loads:
/// each is the prefix of its dataset's operations that an fsync wrote. A
/// commit of a later txg was made on top of what that txg committed
/// without logging, which the rewind lost: it is not replayed onto a state
/// it was never made against, and `status` lists the lost txgs as damage.
#[test]
fn a_rewound_import_replays_only_what_follows_the_loaded_txg() {
    let dir = tempfile::tempdir().expect("tempdir");
    let devs = devices(dir.path(), 1);
    let pool = create_pool(&devs, VdevKind::Single);
    let fs = dataset(&pool, "tank/fs", &[]);
    pool.sync().expect("sync");
    let loaded = pool.txg();
    // Logged in the txg after `loaded`: a prefix of what follows it.
    let a = new_file(&fs, "a");
    write(&fs, a, 0, b"logged first");
    fs.fsync(a).expect("fsync a");
    // Committed by that txg without the log.
    let x = new_file(&fs, "x");
    write(&fs, x, 0, b"committed only");
    pool.sync().expect("sync");
    assert_eq!(pool.txg(), loaded + 1);
    // Logged in the txg after that, on top of x.
    let b = new_file(&fs, "b");
    write(&fs, b, 0, b"logged later");
    fs.fsync(b).expect("fsync b");
    drop(fs);
    pool.abandon();
    drop(pool);

    // Damage every copy of the newest txg's meta tree root.
    let leaf = tarn_vdev::open_device(&devs[0]).expect("open");
    let ashift = tarn_vdev::read_label(leaf.as_ref())
        .expect("label")
        .config
        .ashift;
    let newest = tarn_vdev::read_uberblocks(leaf.as_ref(), ashift)
        .iter()
        .filter_map(|raw| tarn_pool::uberblock::Uberblock::decode(raw).ok())
        .max_by_key(|u| u.txg)
        .expect("uberblocks");
    drop(leaf);
    assert_eq!(newest.txg, loaded + 1);
    for d in newest.meta_root.used_dvas() {
        tarn_testkit::files::overwrite(
            &devs[0],
            tarn_vdev::DATA_START + d.offset,
            &vec![0x5a; d.asize as usize],
        );
    }

    let pool = import(dir.path());
    let fs = mount(&pool, "tank/fs");
    assert_eq!(content(&fs, "a").as_deref(), Some(&b"logged first"[..]));
    assert_eq!(content(&fs, "x"), None, "txg {} was lost", loaded + 1);
    assert_eq!(
        content(&fs, "b"),
        None,
        "a commit made on top of the lost txg was replayed without it"
    );
    let st = pool.status();
    assert!(
        st.damaged
            .iter()
            .any(|d| d.contains(&format!("imported at txg {loaded}")) && d.contains("1 intent log")),
        "{:?}",
        st.damaged
    );
    drop(fs);
    let leaks = pool.leak_check().expect("leak check");
    assert!(leaks.is_clean(), "{leaks:?}");
}
