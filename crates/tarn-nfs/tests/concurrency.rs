//! The server under concurrent load on a real pool: many connections at
//! once (as Linux's `nconnect` opens them) writing and reading their own
//! and shared files while txg syncs, a scrub and snapshots run; a request
//! held at the disk that does not block the requests behind it on the same
//! connection; and what COMMIT promises across a crash.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::*;
use tarn_nfs::proto::{nfsproc, NFS_PROG};
use tarn_nfs::xdr::{Reader, Writer};
use tarn_nfs::{ExportFs, Running};
use tarn_pool::{Pool, ScanAction};
use tarn_testkit::data::{env_seed, random_seed, Rng};
use tarn_testkit::datasets::{filesystem, mount, DsFs};
use tarn_testkit::pools::{attached, cksum_errors, opts, tank, try_import, wait_scan};
use tarn_vdev::fault::{find_device, WriteGate};
use tarn_vdev::VdevKind;

const OK: u32 = 0;
const CONNS: usize = 8;
/// Bytes of one stripe of the shared file; stripe `j` belongs to
/// connection `j % CONNS`.
const STRIPE: u64 = 48 << 10;
const STRIPES: u64 = 64;

fn serve(fs: Arc<DsFs>) -> (Running, Vec<u8>) {
    let dyn_fs: Arc<dyn ExportFs> = fs;
    let r = start(vec![open_export("/tank/fs", dyn_fs)]);
    let (st, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/tank/fs");
    assert_eq!(st, OK, "mount");
    (r, root)
}

/// The whole content of a file read over NFS in 256 KiB READs.
fn read_all(c: &mut Client, fh: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let (st, data, eof) = c.read(fh, out.len() as u64, 256 << 10);
        assert_eq!(st, OK, "READ at {}", out.len());
        out.extend_from_slice(&data);
        if eof || data.is_empty() {
            return out;
        }
    }
}

/// One connection's work: writes of random sizes at random places of its
/// own file and of its stripes of the shared file, each read back at once
/// on the same connection, COMMIT now and then. Returns its own file's
/// expected content and the (offset, bytes) it left in the shared file.
fn worker(
    addr: SocketAddr,
    root: Vec<u8>,
    shared: Vec<u8>,
    id: usize,
    mut rng: Rng,
    commits: bool,
) -> (Vec<u8>, Vec<(u64, Vec<u8>)>) {
    let mut c = Client::connect(addr, sys(0, 0));
    let (st, own, _) = c.create(&root, &format!("own-{id}"), 1, [0; 8]);
    assert_eq!(st, OK, "create own-{id}");
    let mut model: Vec<u8> = Vec::new();
    let mut stripes: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for round in 0..40 {
        // Own file: anywhere in the first 3 MiB, 1 byte to 300 KiB, so
        // writes cross 128K records, leave holes and extend the tail.
        let off = rng.below(3 << 20);
        let len = rng.range(1, 300 << 10) as usize;
        let data = rng.bytes(len);
        let stable = if commits && rng.chance(0.1) { 2 } else { 0 };
        let (st, n, _, _) = c.write(&own, off, &data, stable);
        assert_eq!((st, n as usize), (OK, len), "conn {id} round {round}");
        let end = off as usize + len;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[off as usize..end].copy_from_slice(&data);
        let (st, back, _) = c.read(&own, off, len as u32);
        assert_eq!(st, OK);
        assert!(back == data, "conn {id}: own file read back differs");
        // Shared file: one of this connection's stripes, all of it; the
        // neighbours' stripes share its records.
        let j = rng.below(STRIPES / CONNS as u64) * CONNS as u64 + id as u64;
        let data = rng.bytes(STRIPE as usize);
        let (st, _, _, _) = c.write(&shared, j * STRIPE, &data, 0);
        assert_eq!(st, OK);
        let (st, back, _) = c.read(&shared, j * STRIPE, STRIPE as u32);
        assert_eq!(st, OK);
        assert!(
            back == data,
            "conn {id}: shared stripe {j} read back differs"
        );
        stripes.insert(j * STRIPE, data);
        if commits && rng.chance(0.15) {
            assert_eq!(c.commit(&own).0, OK);
        }
    }
    (model, stripes.into_iter().collect())
}

/// Checks every file against what the connections wrote, over a fresh
/// connection.
fn verify(addr: SocketAddr, root: &[u8], own: &[Vec<u8>], shared: &[(u64, Vec<u8>)]) {
    let mut c = Client::connect(addr, sys(0, 0));
    for (i, model) in own.iter().enumerate() {
        let (st, fh) = c.lookup(root, &format!("own-{i}"));
        assert_eq!(st, OK);
        let got = read_all(&mut c, &fh);
        assert_eq!(got.len(), model.len(), "own-{i}: size");
        assert!(got == *model, "own-{i}: content differs");
    }
    let (st, fh) = c.lookup(root, "shared");
    assert_eq!(st, OK);
    let got = read_all(&mut c, &fh);
    let mut want = vec![0u8; got.len()];
    for (off, data) in shared {
        let end = *off as usize + data.len();
        assert!(end <= got.len(), "shared: stripe at {off} missing");
        want[*off as usize..end].copy_from_slice(data);
    }
    assert!(got == want, "shared: content differs");
}

/// UNSTABLE writes only: what reaches the disk goes through txg syncs.
#[test]
fn many_connections_with_syncs_scrub_and_snapshots() {
    under_load(false);
}

/// As above, with stable writes and COMMITs, which write blocks early
/// through the intent log while txgs sync (this load once faulted the
/// pool with a double free of space).
#[test]
fn many_connections_with_commits_syncs_scrub_and_snapshots() {
    under_load(true);
}

/// Eight connections at work (see [`worker`]; with `commits`, stable
/// writes and COMMITs too) while txgs sync, a scrub runs and a snapshot
/// follows every sync; then every file is checked over a fresh
/// connection, before and after a final sync and scrub.
fn under_load(commits: bool) {
    let seed = env_seed("TARN_NFS_SEED").unwrap_or_else(random_seed);
    eprintln!("seed {seed:#x} (TARN_NFS_SEED)");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let pool = tank(dir.path(), VdevKind::Raidz { parity: 1 }, 4, 256 << 20);
    let fs = Arc::new(filesystem(&pool, "tank/fs", &[("recordsize", "128K")]));
    // Committed data for the scrub to walk.
    let seed_file = fs
        .create(
            1,
            b"before",
            0o644,
            0,
            libc::O_CREAT,
            &tarn_fs::Cred::root(),
        )
        .unwrap();
    fs.write(
        seed_file.ino,
        0,
        &rng.bytes(3 << 20),
        false,
        &tarn_fs::Cred::root(),
    )
    .unwrap();
    fs.release(seed_file.ino).unwrap();
    pool.sync().unwrap();
    let (r, root) = serve(fs.clone());
    let addr = r.local_addrs().0;
    let mut c = Client::connect(addr, sys(0, 0));
    let (st, shared, _) = c.create(&root, "shared", 1, [0; 8]);
    assert_eq!(st, OK);

    // The engine's background work, all through the load.
    let stop = Arc::new(AtomicBool::new(false));
    let background = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                pool.sync().expect("txg sync under load");
                if n == 2 {
                    pool.scrub(ScanAction::Start).expect("scrub under load");
                }
                tarn_dataset::snapshot(&pool, &[format!("tank/fs@s{n}")], false)
                    .expect("snapshot under load");
                n += 1;
                std::thread::sleep(Duration::from_millis(30));
            }
            n
        })
    };
    let workers: Vec<_> = (0..CONNS)
        .map(|i| {
            let (root, shared, rng) = (root.clone(), shared.clone(), rng.fork());
            std::thread::spawn(move || worker(addr, root, shared, i, rng, commits))
        })
        .collect();
    let mut own = Vec::new();
    let mut stripes = Vec::new();
    for w in workers {
        let Ok((model, s)) = w.join() else {
            let st = pool.status();
            panic!(
                "a connection failed; pool: {:?} {:?}, damaged {:?}",
                st.health, st.message, st.damaged
            );
        };
        own.push(model);
        stripes.extend(s);
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = background.join().expect("background work");
    assert!(rounds >= 3, "the background work ran {rounds} rounds");
    let scan = wait_scan(&pool);
    assert_eq!(scan.errors, 0, "scrub under load found errors");

    verify(addr, &root, &own, &stripes);
    // Once more after everything is committed and scrubbed again.
    pool.sync().unwrap();
    let scan = tarn_testkit::pools::scrub(&pool);
    assert_eq!(scan.errors, 0);
    assert_eq!(cksum_errors(&pool), 0);
    verify(addr, &root, &own, &stripes);
}

/// Pool `tank` on one file with the filesystem `tank/fs` served; the data
/// device, for a write gate.
fn gated_pool(dir: &Path) -> (Arc<Pool>, Arc<DsFs>) {
    let pool = tank(dir, VdevKind::Single, 1, 256 << 20);
    let fs = Arc::new(filesystem(&pool, "tank/fs", &[]));
    (pool, fs)
}

#[test]
fn a_commit_held_at_the_disk_does_not_block_the_requests_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, fs) = gated_pool(dir.path());
    let (r, root) = serve(fs);
    let mut c = Client::connect(r.local_addrs().0, sys(0, 0));
    let (_, fh, _) = c.create(&root, "f", 1, [0; 8]);
    let (st, _, _, _) = c.write(&fh, 0, &[1u8; 100_000], 0);
    assert_eq!(st, OK);
    pool.sync().unwrap();
    let (st, _, _, _) = c.write(&fh, 0, &[2u8; 8192], 0);
    assert_eq!(st, OK);

    // Every device write waits from now on: the COMMIT's log write too.
    let gate = WriteGate::new();
    find_device(&dir.path().join("d0"))
        .expect("the data device")
        .attach_gate(Some(gate.clone()));
    gate.close();
    let mut w = Writer::new();
    w.opaque(&fh).u64(0).u32(0);
    let commit = c.send(NFS_PROG, nfsproc::COMMIT, &w.into_bytes());
    assert!(
        gate.wait_for_waiter(Duration::from_secs(20)),
        "the COMMIT never reached the disk"
    );
    // Behind it on the same connection: GETATTR, READ (cached and
    // committed data) and an UNSTABLE WRITE.
    let mut behind = Vec::new();
    let mut w = Writer::new();
    w.opaque(&fh);
    behind.push(c.send(NFS_PROG, nfsproc::GETATTR, &w.into_bytes()));
    let mut w = Writer::new();
    w.opaque(&fh).u64(50_000).u32(4096);
    behind.push(c.send(NFS_PROG, nfsproc::READ, &w.into_bytes()));
    let mut w = Writer::new();
    w.opaque(&fh).u64(200_000).u32(5).u32(0).opaque(b"after");
    behind.push(c.send(NFS_PROG, nfsproc::WRITE, &w.into_bytes()));

    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for _ in 0..4 {
            match c.recv() {
                Reply::Success(xid, body) => tx.send((xid, body)).unwrap(),
                other => panic!("{other:?}"),
            }
        }
    });
    for _ in 0..behind.len() {
        let got = rx.recv_timeout(Duration::from_secs(20));
        let Ok((xid, body)) = got else {
            gate.open();
            panic!("a request waited behind the COMMIT held at the disk");
        };
        assert_ne!(xid, commit, "the COMMIT answered while its write was held");
        assert!(behind.contains(&xid));
        assert_eq!(body[..4], [0, 0, 0, 0], "request {xid} failed");
    }
    assert!(gate.waiting() > 0, "the COMMIT's write is still held");
    gate.open();
    let (xid, body) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the COMMIT answers once the disk does");
    assert_eq!((xid, &body[..4]), (commit, &[0u8, 0, 0, 0][..]));
    reader.join().unwrap();
}

#[test]
fn commit_survives_a_crash_and_uncommitted_writes_damage_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(env_seed("TARN_NFS_SEED").unwrap_or_else(random_seed));
    let (pool, fs) = gated_pool(dir.path());
    let (r, root) = serve(fs.clone());
    let mut c = Client::connect(r.local_addrs().0, sys(0, 0));
    // Committed: a, and the first MiB of b.
    let a_data = rng.bytes(3 << 20);
    let b_data = rng.bytes(1 << 20);
    let (_, a, _) = c.create(&root, "a", 1, [0; 8]);
    let (_, b, _) = c.create(&root, "b", 1, [0; 8]);
    for (fh, data) in [(&a, &a_data), (&b, &b_data)] {
        for (i, chunk) in data.chunks(1 << 20).enumerate() {
            let (st, _, committed, _) = c.write(fh, (i << 20) as u64, chunk, 0);
            assert_eq!((st, committed), (OK, 0), "UNSTABLE");
        }
    }
    let txg = pool.txg();
    assert_eq!(c.commit(&a).0, OK);
    assert_eq!(c.commit(&b).0, OK);
    assert_eq!(pool.txg(), txg, "COMMIT went through the intent log");
    // Never committed: the data of a new file (its CREATE is durable when
    // answered), b overwritten and extended.
    let (_, lost, _) = c.create(&root, "lost", 1, [0; 8]);
    let lost_data = rng.bytes(700_000);
    assert_eq!(c.write(&lost, 0, &lost_data, 0).0, OK);
    let b_new = rng.bytes(1 << 20);
    assert_eq!(c.write(&b, 512 << 10, &b_new, 0).0, OK);
    // Taken over from the crashed owner, as after a reboot.
    let (_pool, _r, root, mut c) = crash_and_serve(dir.path(), pool, fs, r);
    let (st, a) = c.lookup(&root, "a");
    assert_eq!(st, OK, "a committed file is there after the crash");
    assert!(read_all(&mut c, &a) == a_data, "a: committed content");
    let (st, b) = c.lookup(&root, "b");
    assert_eq!(st, OK);
    let got = read_all(&mut c, &b);
    // b is its committed content, or that with the uncommitted write
    // applied in whole records; never anything else.
    assert!(got.len() == b_data.len() || got.len() == (512 << 10) + b_new.len());
    for (i, byte) in got.iter().enumerate() {
        let old = b_data.get(i);
        let new = (i >= 512 << 10).then(|| b_new[i - (512 << 10)]);
        assert!(
            old == Some(byte) || new == Some(*byte),
            "b: byte {i} is neither the committed nor the uncommitted data"
        );
    }
    let (st, lost) = c.lookup(&root, "lost");
    assert_eq!(st, OK, "an answered CREATE is durable");
    let got = read_all(&mut c, &lost);
    for (i, byte) in got.iter().enumerate() {
        assert!(
            *byte == 0 || lost_data.get(i) == Some(byte),
            "lost: byte {i} is garbage"
        );
    }
}

/// Every change but an unstable WRITE is on stable storage when it is
/// answered, as NFSv3 clients take it: a file replaced by a rename after
/// its data was written FILE_SYNC, a truncation, a new directory and a
/// removal are all there after a crash right after the answers, with no
/// COMMIT and no txg in between.
#[test]
fn namespace_changes_are_durable_when_answered() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, fs) = gated_pool(dir.path());
    let (r, root) = serve(fs.clone());
    let mut c = Client::connect(r.local_addrs().0, sys(0, 0));
    let (_, tmp, _) = c.create(&root, "config.tmp", 1, [0; 8]);
    assert_eq!(c.write(&tmp, 0, b"new settings", 2).0, OK, "FILE_SYNC");
    let (_, short, _) = c.create(&root, "log", 1, [0; 8]);
    assert_eq!(c.write(&short, 0, &[7u8; 5000], 2).0, OK);
    let (_, _gone, _) = c.create(&root, "gone", 1, [0; 8]);
    let txg = pool.txg();
    let mut w = Writer::new();
    w.opaque(&root)
        .opaque(b"config.tmp")
        .opaque(&root)
        .opaque(b"config");
    let b = c.call(NFS_PROG, nfsproc::RENAME, &w.into_bytes());
    assert_eq!(Reader::new(&b).u32().unwrap(), OK, "RENAME");
    // SETATTR size=10: mode, uid, gid unset, size set, times unchanged,
    // no guard.
    let mut w = Writer::new();
    w.opaque(&short)
        .bool(false)
        .bool(false)
        .bool(false)
        .bool(true)
        .u64(10)
        .u32(0)
        .u32(0)
        .bool(false);
    let b = c.call(NFS_PROG, nfsproc::SETATTR, &w.into_bytes());
    assert_eq!(Reader::new(&b).u32().unwrap(), OK, "SETATTR");
    let mut w = Writer::new();
    w.opaque(&root)
        .opaque(b"d")
        .bool(false)
        .bool(false)
        .bool(false)
        .bool(false)
        .u32(0)
        .u32(0);
    let b = c.call(NFS_PROG, nfsproc::MKDIR, &w.into_bytes());
    assert_eq!(Reader::new(&b).u32().unwrap(), OK, "MKDIR");
    assert_eq!(c.remove(&root, "gone"), OK);
    assert_eq!(pool.txg(), txg, "answered through the intent log");
    let (_pool, r, root, mut c) = crash_and_serve(dir.path(), pool, fs, r);
    let (st, config) = c.lookup(&root, "config");
    assert_eq!(st, OK, "the renamed file is there");
    assert_eq!(read_all(&mut c, &config), b"new settings");
    assert_ne!(
        c.lookup(&root, "config.tmp").0,
        OK,
        "under its new name only"
    );
    let (st, log) = c.lookup(&root, "log");
    assert_eq!(st, OK);
    assert_eq!(read_all(&mut c, &log), [7u8; 10], "truncated");
    assert_eq!(c.lookup(&root, "d").0, OK, "the new directory");
    assert_ne!(
        c.lookup(&root, "gone").0,
        OK,
        "the removed file stays removed"
    );
    r.stop();
}

/// Stops the server, drops the pool without exporting it (a crash), imports
/// it again as after a reboot and serves tank/fs: the pool, the server, its
/// root handle and a client.
fn crash_and_serve(
    dir: &Path,
    pool: Arc<Pool>,
    fs: Arc<DsFs>,
    r: Running,
) -> (Arc<Pool>, Running, Vec<u8>, Client) {
    r.stop();
    drop(fs);
    pool.abandon();
    drop(pool);
    let pool = attached(try_import(&[dir], "tank", true, opts()).expect("import after the crash"));
    let fs = Arc::new(mount(&pool, "tank/fs"));
    let (r, root) = serve(fs);
    let c = Client::connect(r.local_addrs().0, sys(0, 0));
    (pool, r, root, c)
}
