//! The protocol through a raw RPC client: handles across restarts, stale
//! handles, read-only exports, client networks, squashing, CREATE modes,
//! write stability, out-of-order replies, MOUNT/portmapper, and hostile
//! input while another client keeps working.

mod common;

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tarn_fs::testing::MemBackend;
use tarn_fs::{Cred, Fs};
use tarn_nfs::proto::{mountproc, nfsproc, MOUNT_PROG, NFS_PROG, PMAP_PROG};
use tarn_nfs::rpc::Auth;
use tarn_nfs::xdr::{Reader, Writer};
use tarn_nfs::{Export, ExportFs, IpNet, NfsConfig};
use tarn_testkit::clients::{nfs_cp, nfs_tools, tool, write_file};
use tarn_testkit::data::pattern;
use tarn_testkit::net::closed_within;

const OK: u32 = 0;
const ACCES: u32 = 13;
const EXIST: u32 = 17;
const ROFS: u32 = 30;
const STALE: u32 = 70;
const BADHANDLE: u32 = 10001;

fn root_client(r: &tarn_nfs::Running) -> Client {
    Client::connect(r.local_addrs().0, sys(0, 0))
}

#[test]
fn handles_survive_restart_and_verifier_changes() {
    let fs = mem_fs();
    let r = start(vec![open_export("/data", fs.clone())]);
    let (nfs, mnt) = r.local_addrs();
    let mut mc = Client::connect(mnt, sys(0, 0));
    let (st, root) = mc.mnt("/data");
    assert_eq!(st, 0);
    let mut c = root_client(&r);
    let (st, fh, _) = c.create(&root, "keep", 1, [0; 8]);
    assert_eq!(st, OK);
    let (st, n, committed, v1) = c.write(&fh, 0, b"before restart", 0);
    assert_eq!(
        (st, n, committed),
        (OK, 14, 0),
        "UNSTABLE write acknowledged as such"
    );
    assert_eq!(c.commit(&fh), (OK, v1));
    let with_tools = nfs_tools();
    let tmp = tempfile::tempdir().unwrap();
    if with_tools {
        let src = write_file(tmp.path(), "a", &pattern(3, 300_000));
        assert!(nfs_cp(&src, &url(&r, "/data", "/a")));
    }

    r.stop();
    let r = start_on(
        nfs.port(),
        mnt.port(),
        vec![open_export("/data", fs.clone())],
    );
    assert_eq!(r.local_addrs(), (nfs, mnt));
    let mut c = root_client(&r);
    let (st, attr) = c.getattr(&fh);
    assert_eq!(st, OK, "handle from before the restart still valid");
    assert_eq!(attr.unwrap().size, 14);
    let (st, data, eof) = c.read(&fh, 0, 100);
    assert_eq!((st, &data[..], eof), (OK, &b"before restart"[..], true));
    let (st, root2) = c.lookup(&root, "keep");
    assert_eq!((st, &root2), (OK, &fh), "same handle for the same file");
    let (st, v2) = c.commit(&fh);
    assert_eq!(st, OK);
    assert_ne!(v1, v2, "write verifier changes with each server start");
    assert_eq!(r.write_verifier(&*fs), v2);
    if with_tools {
        let back = tmp.path().join("a.back");
        assert!(nfs_cp(&url(&r, "/data", "/a"), &back.to_string_lossy()));
        assert_eq!(std::fs::read(back).unwrap(), pattern(3, 300_000));
    }
}

/// A filesystem opened again under the running server (its pool exported
/// and imported after a failed sync stopped it) may have lost writes that
/// were answered UNSTABLE and not committed: the write verifier changes,
/// so clients send them again. While the same opening serves, it stays.
#[test]
fn reopening_a_filesystem_changes_the_write_verifier() {
    let dataset = MemBackend::new();
    let first = Arc::new(Fs::mount(dataset.clone()).unwrap());
    let r = start(vec![open_export("/data", first)]);
    let (_, mnt) = r.local_addrs();
    let mut mc = Client::connect(mnt, sys(0, 0));
    let (st, root) = mc.mnt("/data");
    assert_eq!(st, 0);
    let mut c = root_client(&r);
    let (st, fh, _) = c.create(&root, "f", 1, [0; 8]);
    assert_eq!(st, OK);
    let (st, _, committed, v1) = c.write(&fh, 0, b"unstable", 0);
    assert_eq!((st, committed), (OK, 0));
    assert_eq!(
        c.commit(&fh),
        (OK, v1),
        "the same opening: the same verifier"
    );
    let again = Arc::new(Fs::mount(dataset).unwrap());
    r.set_exports(vec![open_export("/data", again.clone())])
        .unwrap();
    let (st, v2) = c.commit(&fh);
    assert_eq!(st, OK, "the handle is the same dataset's");
    assert_ne!(v1, v2, "opened again: the verifier changes");
    assert_eq!(r.write_verifier(&*again), v2);
}

/// Clients that create one new name at once without EXCLUSIVE (`open`
/// with O_CREAT and no O_EXCL, as parallel jobs appending to one log
/// do) all get the file: the one that loses the race finds the winner's
/// rather than an EEXIST its open never asked for.
#[test]
fn unchecked_creates_of_one_name_at_once_all_succeed() {
    let r = start(vec![open_export("/data", mem_fs())]);
    let (_, mnt) = r.local_addrs();
    let mut mc = Client::connect(mnt, sys(0, 0));
    let (st, root) = mc.mnt("/data");
    assert_eq!(st, 0);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (r, root) = (r.local_addrs().0, root.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(r, sys(0, 0));
                let mut handles = Vec::new();
                for i in 0..300 {
                    let (st, fh, _) = c.create(&root, &format!("log{i}"), 0, [0; 8]);
                    assert_eq!(st, OK, "log{i}");
                    handles.push(fh);
                }
                handles
            })
        })
        .collect();
    let all: Vec<Vec<Vec<u8>>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for i in 0..300 {
        assert!(
            all.iter().all(|h| h[i] == all[0][i]),
            "log{i}: one file for all"
        );
    }
}

#[test]
fn deleted_file_is_stale_and_forged_handle_is_bad() {
    let fs = mem_fs();
    let r = start(vec![open_export("/d", fs)]);
    let mut c = root_client(&r);
    let (_, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/d");
    let (st, fh, _) = c.create(&root, "gone", 1, [0; 8]);
    assert_eq!(st, OK);
    assert_eq!(c.getattr(&fh).0, OK);
    assert_eq!(c.remove(&root, "gone"), OK);
    assert_eq!(c.getattr(&fh).0, STALE);
    assert_eq!(c.read(&fh, 0, 10).0, STALE);
    let mut forged = fh.clone();
    forged[14] ^= 1;
    assert_eq!(c.getattr(&forged).0, BADHANDLE);
    assert_eq!(c.getattr(&[1, 2, 3]).0, BADHANDLE);
}

#[test]
fn read_only_export_refuses_changes() {
    let fs = mem_fs();
    let a = fs
        .create(1, b"f", 0o666, 0, libc::O_CREAT, &Cred::root())
        .unwrap();
    fs.write(a.ino, 0, b"data", false, &Cred::root()).unwrap();
    fs.release(a.ino).unwrap();
    // With atime on, a read or a listing would stamp the access time: a
    // write the read-only export must not make.
    fs.backend().set_atime(true);
    fs.backend().advance(5_000_000_000);
    let atimes = || {
        (
            fs.getattr(a.ino).unwrap().atime,
            fs.getattr(1).unwrap().atime,
        )
    };
    let before = atimes();
    let mut e = open_export("/ro", fs.clone());
    e.read_only = true;
    let r = start(vec![e]);
    let mut c = root_client(&r);
    let (_, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/ro");
    assert_eq!(c.create(&root, "new", 0, [0; 8]).0, ROFS);
    let (st, fh) = c.lookup(&root, "f");
    assert_eq!(st, OK);
    assert_eq!(c.write(&fh, 0, b"x", 2).0, ROFS);
    assert_eq!(c.commit(&fh).0, ROFS, "a reader cannot force syncs");
    assert_eq!(c.remove(&root, "f"), ROFS);
    let (st, data, _) = c.read(&fh, 0, 10);
    assert_eq!((st, &data[..]), (OK, &b"data"[..]));
    for plus in [false, true] {
        let mut w = Writer::new();
        w.opaque(&root).u64(0).fixed(&[0; 8]).u32(4096);
        if plus {
            w.u32(8192);
        }
        let p = if plus {
            nfsproc::READDIRPLUS
        } else {
            nfsproc::READDIR
        };
        let b = c.call(NFS_PROG, p, &w.into_bytes());
        assert_eq!(Reader::new(&b).u32().unwrap(), OK, "plus={plus}");
    }
    assert_eq!(atimes(), before, "a read-only export stamped access times");
    // ACCESS grants no modify bits.
    let mut w = Writer::new();
    w.opaque(&fh).u32(0x3f);
    let b = c.call(NFS_PROG, nfsproc::ACCESS, &w.into_bytes());
    let mut rd = Reader::new(&b);
    assert_eq!(rd.u32().unwrap(), OK);
    skip_post_op(&mut rd);
    assert_eq!(rd.u32().unwrap() & 0x1c, 0);
    if nfs_tools() {
        let tmp = tempfile::tempdir().unwrap();
        let src = write_file(tmp.path(), "x", b"x");
        assert!(
            !nfs_cp(&src, &url(&r, "/ro", "/x")),
            "copy into a read-only export fails"
        );
        let (ok, out, _) = tool(&["nfs-cat", &url(&r, "/ro", "/f")]);
        assert!(ok);
        assert_eq!(out, b"data");
    }
    assert_eq!(
        fs.lookup(1, b"new", &Cred::root()).unwrap_err().errno(),
        libc::ENOENT
    );
}

#[test]
fn client_outside_networks_is_refused() {
    let fs = mem_fs();
    let mut e = open_export("/secret", fs.clone());
    e.clients = vec![
        "10.99.0.0/16".parse().unwrap(),
        "fd00:99::/32".parse().unwrap(),
    ];
    // With no export listing localhost, its connections are closed at
    // accept.
    let alone = start(vec![e.clone()]);
    let mut s = TcpStream::connect(alone.local_addrs().0).unwrap();
    assert!(closed_by_server(&mut s), "unlisted client closed at accept");
    assert_eq!(alone.stats().refused_unlisted, 1);
    assert_eq!(alone.stats().accepted, 0);
    drop(alone);
    // Another export lets localhost connect; /secret still refuses it.
    let open = open_export("/open", mem_fs());
    let r = start(vec![e.clone(), open.clone()]);
    let mut mc = Client::connect(r.local_addrs().1, sys(0, 0));
    assert_eq!(mc.mnt("/secret").0, ACCES);
    assert_eq!(mc.mnt("/nonexistent").0, 2);
    // A valid handle obtained elsewhere does not help.
    let root = tarn_nfs::handle::encode(
        &NfsConfig::default().handle_key,
        &fs.getattr(1).unwrap().handle(),
    );
    let mut c = root_client(&r);
    assert_eq!(c.getattr(&root).0, ACCES);
    assert_eq!(c.create(&root, "x", 0, [0; 8]).0, ACCES);
    if nfs_tools() {
        let (ok, _, _) = tool(&["nfs-ls", &url(&r, "/secret", "/")]);
        assert!(!ok, "nfs-ls must fail");
    }
    // Live change: allow localhost, the same connection works at once;
    // then take it away again.
    e.clients = local();
    r.set_exports(vec![e.clone(), open.clone()]).unwrap();
    assert_eq!(c.getattr(&root).0, OK);
    e.clients = vec![IpNet::any_v6()];
    r.set_exports(vec![e, open.clone()]).unwrap();
    assert_eq!(c.getattr(&root).0, ACCES);
    // Removing the export makes its handles stale.
    r.set_exports(vec![open]).unwrap();
    assert_eq!(c.getattr(&root).0, STALE);
}

fn owner_of_new_file(e: Export, auth: Auth, name: &str) -> (u32, u32) {
    let r = start(vec![e]);
    let (_, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/s");
    let mut c = Client::connect(r.local_addrs().0, auth);
    let (st, _, a) = c.create(&root, name, 1, [0; 8]);
    assert_eq!(st, OK);
    let a = a.unwrap();
    (a.uid, a.gid)
}

#[test]
fn squashing() {
    let fs = mem_fs();
    fs.setattr(
        1,
        &tarn_fs::SetAttr {
            mode: Some(0o777),
            ..Default::default()
        },
        &Cred::root(),
    )
    .unwrap();
    let mut e = Export::new("/s", fs.clone(), local());
    // Default: root_squash.
    assert_eq!(owner_of_new_file(e.clone(), sys(0, 0), "a"), (65534, 65534));
    assert_eq!(
        owner_of_new_file(e.clone(), sys(1000, 100), "b"),
        (1000, 100)
    );
    // AUTH_NONE is anonymous.
    assert_eq!(
        owner_of_new_file(e.clone(), Auth::None, "c"),
        (65534, 65534)
    );
    // all_squash with custom anonymous ids.
    e.all_squash = true;
    e.anon_uid = 4242;
    e.anon_gid = 4343;
    assert_eq!(
        owner_of_new_file(e.clone(), sys(1000, 100), "d"),
        (4242, 4343)
    );
    assert_eq!(owner_of_new_file(e.clone(), sys(0, 0), "e"), (4242, 4343));
    // no_root_squash.
    e.all_squash = false;
    e.root_squash = false;
    assert_eq!(owner_of_new_file(e.clone(), sys(0, 0), "f"), (0, 0));
    // Squashed root cannot read a file only root can read.
    let a = fs
        .create(1, b"private", 0o600, 0, libc::O_CREAT, &Cred::root())
        .unwrap();
    fs.write(a.ino, 0, b"x", false, &Cred::root()).unwrap();
    fs.release(a.ino).unwrap();
    e.root_squash = true;
    let r = start(vec![e]);
    let (_, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/s");
    let mut c = root_client(&r);
    let (st, fh) = c.lookup(&root, "private");
    assert_eq!(st, OK);
    assert_eq!(c.read(&fh, 0, 1).0, ACCES);
    assert_eq!(c.write(&fh, 0, b"y", 2).0, ACCES);
}

#[test]
fn create_modes() {
    let fs = mem_fs();
    let r = start(vec![open_export("/c", fs.clone())]);
    let (_, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/c");
    let mut c = root_client(&r);
    let (st, fh, _) = c.create(&root, "u", 0, [0; 8]);
    assert_eq!(st, OK);
    c.write(&fh, 0, b"content", 2);
    // UNCHECKED on an existing file: success, same file, not truncated.
    let (st, fh2, a) = c.create(&root, "u", 0, [0; 8]);
    assert_eq!((st, &fh2), (OK, &fh));
    assert_eq!(a.unwrap().size, 7);
    // GUARDED: EXIST.
    assert_eq!(c.create(&root, "u", 1, [0; 8]).0, EXIST);
    // EXCLUSIVE: a retry with the same verifier succeeds with the same
    // file; another verifier is EXIST.
    let v = *b"\x01\x02\x03\x04\x05\x06\x07\x08";
    let (st, x1, _) = c.create(&root, "x", 2, v);
    assert_eq!(st, OK);
    let (st, x2, _) = c.create(&root, "x", 2, v);
    assert_eq!((st, &x2), (OK, &x1), "idempotent retry");
    assert_eq!(c.create(&root, "x", 2, *b"otherver").0, EXIST);
    assert_eq!(c.create(&root, "u", 2, v).0, EXIST);
}

#[test]
fn write_stability_and_commit() {
    let mem = MemBackend::new();
    let fs = Arc::new(Fs::mount(mem.clone()).unwrap());
    let r = start(vec![open_export("/w", fs)]);
    let (_, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/w");
    let mut c = root_client(&r);
    let (_, fh, _) = c.create(&root, "f", 1, [0; 8]);
    let s0 = mem.sync_count();
    let (st, _, committed, verf) = c.write(&fh, 0, &[7u8; 5000], 0);
    assert_eq!((st, committed), (OK, 0));
    assert_eq!(mem.sync_count(), s0, "UNSTABLE write does not sync");
    let (st, _, committed, _) = c.write(&fh, 5000, &[8u8; 10], 2);
    assert_eq!((st, committed), (OK, 2));
    assert_eq!(
        mem.sync_count(),
        s0 + 1,
        "FILE_SYNC write syncs before the reply"
    );
    let (st, _, committed, _) = c.write(&fh, 5010, &[9u8; 10], 1);
    assert_eq!((st, committed), (OK, 2));
    assert_eq!(mem.sync_count(), s0 + 2, "DATA_SYNC write syncs too");
    assert_eq!(c.commit(&fh), (OK, verf));
    assert_eq!(mem.sync_count(), s0 + 3, "COMMIT syncs");
    // COMMIT needs the right to write the file, as WRITE does: another
    // user of a 0644 file is refused, and nothing is synced for it.
    let mut other = Client::connect(r.local_addrs().0, sys(1000, 1000));
    assert_eq!(other.commit(&fh).0, ACCES);
    assert_eq!(mem.sync_count(), s0 + 3);
    let (_, data, eof) = c.read(&fh, 4998, 100);
    assert_eq!(
        data,
        [7, 7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9]
    );
    assert!(eof);
}

#[test]
fn replies_out_of_order_no_head_of_line_blocking() {
    let fs: Arc<dyn ExportFs> = Arc::new(
        Fs::mount(Arc::new(SlowSync {
            inner: MemBackend::new(),
            delay: Duration::from_millis(1500),
        }))
        .unwrap(),
    );
    let r = start(vec![open_export("/slow", fs)]);
    let (_, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/slow");
    let mut c = root_client(&r);
    let mut w = Writer::new();
    w.opaque(&root).u64(0).u32(0);
    let t = Instant::now();
    let slow = c.send(NFS_PROG, nfsproc::COMMIT, &w.into_bytes());
    let mut fast = Vec::new();
    for _ in 0..5 {
        let mut w = Writer::new();
        w.opaque(&root);
        fast.push(c.send(NFS_PROG, nfsproc::GETATTR, &w.into_bytes()));
    }
    let mut order = Vec::new();
    for _ in 0..6 {
        match c.recv() {
            Reply::Success(x, _) => order.push((x, t.elapsed())),
            other => panic!("{other:?}"),
        }
    }
    let pos = order.iter().position(|(x, _)| *x == slow).unwrap();
    assert_eq!(pos, 5, "the slow COMMIT answers last: {order:?}");
    for (x, at) in &order[..5] {
        assert!(fast.contains(x));
        assert!(
            *at < Duration::from_millis(1200),
            "GETATTR waited for COMMIT: {at:?}"
        );
    }
}

#[test]
fn mount_export_dump_umnt_and_pmap() {
    let r = start(vec![open_export("/m/", mem_fs())]);
    let (nfs, mnt) = r.local_addrs();
    let mut mc = Client::connect(mnt, sys(0, 0));
    let b = mc.call(MOUNT_PROG, mountproc::EXPORT, &[]);
    let mut rd = Reader::new(&b);
    assert!(rd.bool().unwrap());
    assert_eq!(rd.opaque(1024).unwrap(), b"/m");
    assert!(rd.bool().unwrap());
    assert_eq!(rd.opaque(100).unwrap(), b"127.0.0.0/8");
    assert_eq!(mc.mnt("/m").0, 0);
    assert_eq!(mc.mnt("/m/").0, 0);
    let b = mc.call(MOUNT_PROG, mountproc::DUMP, &[]);
    let mut rd = Reader::new(&b);
    assert!(rd.bool().unwrap());
    assert_eq!(rd.opaque(300).unwrap(), b"testhost");
    assert_eq!(rd.opaque(1024).unwrap(), b"/m");
    assert!(!rd.bool().unwrap());
    let mut w = Writer::new();
    w.opaque(b"/m");
    mc.call(MOUNT_PROG, mountproc::UMNT, &w.into_bytes());
    let b = mc.call(MOUNT_PROG, mountproc::DUMP, &[]);
    assert!(!Reader::new(&b).bool().unwrap());
    // Portmapper GETPORT on the NFS port knows both ports.
    let mut pc = Client::connect(nfs, sys(0, 0));
    let xid = pc.next_xid();
    let mut w = tarn_nfs::rpc::encode_call(xid, PMAP_PROG, 2, 3, &Auth::None);
    w.u32(MOUNT_PROG).u32(3).u32(6).u32(0);
    pc.s.write_all(&frame(&w.into_bytes())).unwrap();
    match pc.recv() {
        Reply::Success(_, b) => assert_eq!(Reader::new(&b).u32().unwrap(), u32::from(mnt.port())),
        other => panic!("{other:?}"),
    }
}

#[test]
fn rpc_level_errors() {
    let r = start(vec![open_export("/e", mem_fs())]);
    let mut c = root_client(&r);
    // Unknown program, wrong version, unknown procedure.
    c.s.write_all(&frame(
        &tarn_nfs::rpc::encode_call(5, 200000, 1, 0, &Auth::None).into_bytes(),
    ))
    .unwrap();
    assert!(matches!(c.recv(), Reply::Accepted(5, 1)));
    c.s.write_all(&frame(
        &tarn_nfs::rpc::encode_call(6, NFS_PROG, 4, 0, &Auth::None).into_bytes(),
    ))
    .unwrap();
    assert!(matches!(c.recv(), Reply::Accepted(6, 2)));
    c.s.write_all(&frame(
        &tarn_nfs::rpc::encode_call(7, NFS_PROG, 3, 99, &Auth::None).into_bytes(),
    ))
    .unwrap();
    assert!(matches!(c.recv(), Reply::Accepted(7, 3)));
    // Garbage arguments: a handle length over 64.
    let mut w = tarn_nfs::rpc::encode_call(8, NFS_PROG, 3, nfsproc::GETATTR, &sys(0, 0));
    w.u32(1000);
    c.s.write_all(&frame(&w.into_bytes())).unwrap();
    assert!(matches!(c.recv(), Reply::Accepted(8, 4)));
    // Unsupported flavor (RPCSEC_GSS = 6): AUTH_ERROR TOOWEAK.
    let w = tarn_nfs::rpc::encode_call(9, NFS_PROG, 3, nfsproc::GETATTR, &Auth::Other(6));
    c.s.write_all(&frame(&w.into_bytes())).unwrap();
    match c.recv() {
        Reply::Denied(9, b) => {
            let mut rd = Reader::new(&b);
            assert_eq!((rd.u32().unwrap(), rd.u32().unwrap()), (1, 5));
        }
        other => panic!("{other:?}"),
    }
    // The connection is still fine.
    let (_, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/e");
    assert_eq!(c.getattr(&root).0, OK);
}

/// True if the server closed the connection (EOF or reset) within 10 s.
fn closed_by_server(s: &mut TcpStream) -> bool {
    closed_within(s, Duration::from_secs(10))
}

#[test]
fn hostile_input_does_not_disturb_other_clients() {
    let r = start(vec![open_export("/h", mem_fs())]);
    let (nfs, mnt) = r.local_addrs();
    let (_, root) = Client::connect(mnt, sys(0, 0)).mnt("/h");
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let worker = {
        let (stop, done, root) = (stop.clone(), done.clone(), root.clone());
        std::thread::spawn(move || {
            let mut c = Client::connect(nfs, sys(0, 0));
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(c.getattr(&root).0, OK);
                done.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // 1. A record header claiming 100 MiB: that connection is closed.
    let mut s = TcpStream::connect(nfs).unwrap();
    s.write_all(&((100u32 << 20) | 0x8000_0000).to_be_bytes())
        .unwrap();
    let _ = s.write_all(&[0u8; 1000]);
    assert!(
        closed_by_server(&mut s),
        "oversized record closes the connection"
    );
    // 2. Pure garbage bytes (random headers and bodies).
    for seed in 0..20u64 {
        let mut s = TcpStream::connect(nfs).unwrap();
        let _ = s.write_all(&pattern(seed, 5000));
        let _ = s.shutdown(Shutdown::Write);
        assert!(closed_by_server(&mut s));
    }
    // 3. Small garbage records: answered or dropped, connection survives.
    let mut c = Client::connect(nfs, sys(0, 0));
    for seed in 0..50u64 {
        let body = pattern(seed + 100, (seed as usize * 7) % 200);
        c.s.write_all(&frame(&body)).unwrap();
    }
    // Drain any replies to garbage that parsed as calls, then a real call.
    c.s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    while read_record(&mut c.s).is_ok() {}
    c.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(c.getattr(&root).0, OK, "same connection still serves");
    // 4. A truncated record, then the client goes away.
    let mut s = TcpStream::connect(nfs).unwrap();
    s.write_all(&(100u32 | 0x8000_0000).to_be_bytes()).unwrap();
    s.write_all(&[1u8; 50]).unwrap();
    drop(s);
    // 5. Many connections at once, all dropped mid-header.
    let conns: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut s = TcpStream::connect(nfs).unwrap();
            let _ = s.write_all(&[0x80, 0]);
            s
        })
        .collect();
    drop(conns);
    let before = done.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    worker.join().expect("parallel client never failed");
    assert!(
        done.load(Ordering::Relaxed) > before,
        "parallel client kept working"
    );
    // And a fresh client works.
    assert_eq!(root_client(&r).getattr(&root).0, OK);
}

#[test]
fn connection_limit_evicts_the_longest_idle_connection() {
    let cfg = NfsConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        mount_bind: None,
        max_connections: 2,
        ..NfsConfig::default()
    };
    let r = tarn_nfs::NfsServer::start(cfg, vec![open_export("/l", mem_fs())]).unwrap();
    let nfs = r.local_addrs().0;
    assert_eq!(r.local_addrs().1, nfs, "MOUNT shares the NFS port");
    let mut a = Client::connect(nfs, sys(0, 0));
    let (st, root) = a.mnt("/l");
    assert_eq!(st, 0);
    std::thread::sleep(Duration::from_millis(50));
    let mut b = Client::connect(nfs, sys(0, 0));
    assert_eq!(b.getattr(&root).0, OK);
    // Full: the newcomer gets in, the connection idle longest (a) goes.
    let mut c = Client::connect(nfs, sys(0, 0));
    assert_eq!(c.getattr(&root).0, OK, "newcomer served");
    assert!(closed_by_server(&mut a.s), "longest-idle connection closed");
    assert_eq!(b.getattr(&root).0, OK, "the other one untouched");
    let st = r.stats();
    assert_eq!((st.evicted, st.open, st.refused_full), (1, 2, 0));
}

/// A client that sends READs and never reads the replies holds requests
/// that cannot end: while its replies go out it keeps its slot, but once
/// it has taken nothing for a while its connection counts as idle, and a
/// newcomer evicts it instead of being turned away for as long as the
/// client likes.
#[test]
fn a_client_that_stops_reading_replies_can_be_evicted() {
    let cfg = NfsConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        mount_bind: None,
        max_connections: 1,
        ..NfsConfig::default()
    };
    let r = tarn_nfs::NfsServer::start(cfg, vec![open_export("/l", mem_fs())]).unwrap();
    let nfs = r.local_addrs().0;
    let mut a = Client::connect(nfs, sys(0, 0));
    let (_, root) = a.mnt("/l");
    let (st, fh, _) = a.create(&root, "big", 1, [0; 8]);
    assert_eq!(st, OK);
    assert_eq!(a.write(&fh, 0, &pattern(1, 1 << 20), 2).0, OK);
    for _ in 0..32 {
        let mut w = Writer::new();
        w.opaque(&fh).u64(0).u32(1 << 20);
        a.send(NFS_PROG, nfsproc::READ, &w.into_bytes());
    }
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let mut refused = 0;
    loop {
        let mut c = Client::connect(nfs, sys(0, 0));
        let mut w = Writer::new();
        w.opaque(&root);
        let sent = c.try_send(NFS_PROG, nfsproc::GETATTR, &w.into_bytes());
        if sent.is_ok() && read_record(&mut c.s).is_ok() {
            break;
        }
        refused += 1;
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "the stalled reader kept its slot"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(refused > 0, "the reader was busy at first");
    assert_eq!(r.stats().evicted, 1);
}

/// READDIRPLUS pages of names of every length under random `dircount` and
/// `maxcount`: every entry exactly once, each reply within both limits,
/// and every page but the last full (its next entry would not have fit),
/// so a page ending early, or EOF said too soon, fails.
#[test]
fn readdirplus_pages_are_full_and_within_their_limits() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let fs = mem_fs();
    let mut expect = vec![".".to_string(), "..".to_string()];
    for i in 0..120usize {
        // Lengths 1..=255 in a scattered order, each name unique.
        let len = (i * 97) % 255 + 1;
        let name: String = format!("{i:03}").chars().cycle().take(len.max(3)).collect();
        fs.create(1, name.as_bytes(), 0o644, 0, 0, &Cred::root())
            .unwrap();
        expect.push(name);
    }
    expect.sort();
    let r = start(vec![open_export("/p", fs)]);
    let (_, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/p");
    // The runner takes an `Fn`: the connection is borrowed per call.
    let c = std::cell::RefCell::new(root_client(&r));
    // One entry's encoded bytes and its `dircount` bytes.
    let sizes = |name_len: usize| {
        let dir = 8 + 4 + name_len.next_multiple_of(4) + 8;
        (4 + dir + 4 + 84 + 4 + 4 + 36, dir)
    };
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&(1200u32..9000, 100u32..4000), |(maxcount, dircount)| {
            let mut pages: Vec<Vec<String>> = Vec::new();
            let mut sizes_of_pages = Vec::new();
            let (mut cookie, mut verf) = (0u64, [0u8; 8]);
            loop {
                prop_assert!(pages.len() < 1000, "no end of the listing");
                let mut w = Writer::new();
                w.opaque(&root)
                    .u64(cookie)
                    .fixed(&verf)
                    .u32(dircount)
                    .u32(maxcount);
                let b = c
                    .borrow_mut()
                    .call(NFS_PROG, nfsproc::READDIRPLUS, &w.into_bytes());
                prop_assert!(b.len() <= maxcount as usize, "{} > maxcount", b.len());
                let mut rd = Reader::new(&b);
                let st = rd.u32().unwrap();
                if st == 10005 {
                    // TOOSMALL only when the next entry alone is too big.
                    let next = expect
                        .iter()
                        .filter(|n| !pages.iter().flatten().any(|m| m == *n))
                        .map(|n| sizes(n.len()))
                        .collect::<Vec<_>>();
                    prop_assert!(
                        next.iter()
                            .any(|&(l, d)| l + 120 > maxcount as usize || d > dircount as usize),
                        "TOOSMALL with room for an entry"
                    );
                    return Ok(());
                }
                prop_assert_eq!(st, OK);
                skip_post_op(&mut rd);
                verf.copy_from_slice(rd.fixed(8).unwrap());
                let (mut page, mut dir_used) = (Vec::new(), 0usize);
                while rd.bool().unwrap() {
                    let _fileid = rd.u64().unwrap();
                    let name = String::from_utf8(rd.opaque(255).unwrap().to_vec()).unwrap();
                    dir_used += sizes(name.len()).1;
                    page.push(name);
                    cookie = rd.u64().unwrap();
                    prop_assert!(rd.bool().unwrap(), "attributes present");
                    Fattr::read(&mut rd);
                    prop_assert!(rd.bool().unwrap(), "handle present");
                    prop_assert_eq!(rd.opaque(64).unwrap().len(), 36);
                }
                prop_assert!(dir_used <= dircount as usize, "{dir_used} > dircount");
                let eof = rd.bool().unwrap();
                sizes_of_pages.push((b.len(), dir_used));
                pages.push(page);
                if eof {
                    break;
                }
            }
            let mut all: Vec<String> = pages.iter().flatten().cloned().collect();
            all.sort();
            prop_assert!(
                all == expect,
                "{} entries listed of {}, maxcount {} dircount {}",
                all.len(),
                expect.len(),
                maxcount,
                dircount
            );
            for (i, (used, dir_used)) in sizes_of_pages.iter().enumerate().take(pages.len() - 1) {
                let (len, dir) = sizes(pages[i + 1][0].len());
                prop_assert!(
                    used + len > maxcount as usize || dir_used + dir > dircount as usize,
                    "page {} ({} bytes, {} dir bytes) had room for the next entry",
                    i,
                    used,
                    dir_used
                );
            }
            Ok(())
        })
        .unwrap();
}

/// Pages through a directory with small replies: every entry exactly once,
/// attributes and handles present, cookies resumable; a foreign cookie
/// verifier is BAD_COOKIE.
#[test]
fn readdir_paging() {
    let fs = mem_fs();
    for i in 0..300 {
        fs.mkdir(1, format!("dir-{i:03}").as_bytes(), 0o755, 0, &Cred::root())
            .unwrap();
    }
    let r = start(vec![open_export("/p", fs)]);
    let (_, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/p");
    let mut c = root_client(&r);
    for plus in [true, false] {
        let mut names = Vec::new();
        let (mut cookie, mut verf) = (0u64, [0u8; 8]);
        let mut calls = 0;
        loop {
            calls += 1;
            assert!(calls < 1000);
            let mut w = Writer::new();
            w.opaque(&root).u64(cookie).fixed(&verf);
            if plus {
                w.u32(1024).u32(4096);
            } else {
                w.u32(1024);
            }
            let procnum = if plus {
                nfsproc::READDIRPLUS
            } else {
                nfsproc::READDIR
            };
            let b = c.call(NFS_PROG, procnum, &w.into_bytes());
            assert!(
                b.len() <= if plus { 4096 } else { 1024 },
                "a reply of {} bytes over maxcount",
                b.len()
            );
            let mut rd = Reader::new(&b);
            assert_eq!(rd.u32().unwrap(), OK);
            skip_post_op(&mut rd);
            verf.copy_from_slice(rd.fixed(8).unwrap());
            while rd.bool().unwrap() {
                let _fileid = rd.u64().unwrap();
                names.push(String::from_utf8(rd.opaque(255).unwrap().to_vec()).unwrap());
                cookie = rd.u64().unwrap();
                if plus {
                    assert!(rd.bool().unwrap(), "attributes present");
                    Fattr::read(&mut rd);
                    assert!(rd.bool().unwrap(), "handle present");
                    assert_eq!(rd.opaque(64).unwrap().len(), 36);
                }
            }
            if rd.bool().unwrap() {
                break;
            }
        }
        assert!(calls > 3, "small replies force paging ({calls} calls)");
        let mut expect: Vec<String> = (0..300).map(|i| format!("dir-{i:03}")).collect();
        expect.push(".".into());
        expect.push("..".into());
        expect.sort();
        names.sort();
        assert_eq!(names, expect, "plus={plus}");
    }
    let mut w = Writer::new();
    w.opaque(&root).u64(5).fixed(b"badverf!").u32(4096);
    let b = c.call(NFS_PROG, nfsproc::READDIR, &w.into_bytes());
    assert_eq!(Reader::new(&b).u32().unwrap(), 10003);
    // Room for the reply's head but not one entry: TOOSMALL, with the
    // directory's attributes and nothing else.
    let mut w = Writer::new();
    w.opaque(&root).u64(0).fixed(&[0u8; 8]).u32(4096).u32(160);
    let b = c.call(NFS_PROG, nfsproc::READDIRPLUS, &w.into_bytes());
    let mut rd = Reader::new(&b);
    assert_eq!(rd.u32().unwrap(), 10005, "NFS3ERR_TOOSMALL");
    assert!(rd.bool().unwrap(), "directory attributes");
    Fattr::read(&mut rd);
    assert!(rd.u32().is_err(), "nothing after the attributes");
}

/// READDIRPLUS of a directory the caller may read but not search lists
/// its names without attributes or handles (a handle would let the caller
/// past the missing search permission), as Linux's nfsd answers; with
/// search permission both come.
#[test]
fn readdirplus_needs_search_permission_for_handles() {
    let fs = mem_fs();
    let d = fs.mkdir(1, b"d", 0o754, 0, &Cred::root()).unwrap();
    let f = fs
        .create(d.ino, b"f", 0o666, 0, libc::O_CREAT, &Cred::root())
        .unwrap();
    fs.release(f.ino).unwrap();
    let r = start(vec![open_export("/p", fs.clone())]);
    let (_, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/p");
    let (st, dir) = root_client(&r).lookup(&root, "d");
    assert_eq!(st, OK);
    // (uid, whether attributes and handles come): others have r-- on d,
    // the owner rwx.
    for (uid, full) in [(1000, false), (0, true)] {
        let mut c = Client::connect(r.local_addrs().0, sys(uid, uid));
        let mut w = Writer::new();
        w.opaque(&dir).u64(0).fixed(&[0u8; 8]).u32(4096).u32(8192);
        let b = c.call(NFS_PROG, nfsproc::READDIRPLUS, &w.into_bytes());
        let mut rd = Reader::new(&b);
        assert_eq!(rd.u32().unwrap(), OK, "uid {uid}");
        skip_post_op(&mut rd);
        rd.fixed(8).unwrap();
        let mut names = Vec::new();
        while rd.bool().unwrap() {
            rd.u64().unwrap();
            names.push(String::from_utf8(rd.opaque(255).unwrap().to_vec()).unwrap());
            rd.u64().unwrap();
            let attrs = rd.bool().unwrap();
            if attrs {
                Fattr::read(&mut rd);
            }
            let handle = rd.bool().unwrap();
            if handle {
                rd.opaque(64).unwrap();
            }
            assert_eq!((attrs, handle), (full, full), "uid {uid}, {names:?}");
        }
        names.sort();
        assert_eq!(names, [".", "..", "f"], "uid {uid}");
    }
}

/// The status word of a successful RPC reply's result.
fn status_of(reply: Reply, xid: u32) -> u32 {
    match reply {
        Reply::Success(x, body) => {
            assert_eq!(x, xid, "the reply answers the call");
            Reader::new(&body).u32().unwrap()
        }
        other => panic!("not a successful reply: {other:?}"),
    }
}

#[test]
fn a_retransmitted_call_gets_the_first_reply_instead_of_running_again() {
    let fs = mem_fs();
    let r = start(vec![open_export("/data", fs.clone())]);
    let mut c = root_client(&r);
    let (_, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/data");
    let mut mkdir = Writer::new();
    mkdir.opaque(&root).opaque(b"made").bool(true).u32(0o755);
    for _ in 0..5 {
        mkdir.bool(false);
    }
    let mkdir = mkdir.into_bytes();
    let xid = 0x5eed_0001;
    c.send_as(xid, NFS_PROG, nfsproc::MKDIR, &mkdir);
    assert_eq!(status_of(c.recv(), xid), OK);
    // The client saw no reply and sends the call again, on the same
    // connection and after reconnecting: the first reply, not EEXIST.
    c.send_as(xid, NFS_PROG, nfsproc::MKDIR, &mkdir);
    assert_eq!(status_of(c.recv(), xid), OK, "same connection");
    let mut c2 = root_client(&r);
    c2.send_as(xid, NFS_PROG, nfsproc::MKDIR, &mkdir);
    assert_eq!(status_of(c2.recv(), xid), OK, "after a reconnect");
    // A new call (new xid) runs and fails as it should.
    let again = c2.next_xid() + 1000;
    c2.send_as(again, NFS_PROG, nfsproc::MKDIR, &mkdir);
    assert_eq!(status_of(c2.recv(), again), EXIST);

    // REMOVE: the retransmission says OK, not NOENT, and removes nothing
    // made since under the same name.
    let mut rm = Writer::new();
    rm.opaque(&root).opaque(b"f");
    let rm = rm.into_bytes();
    assert_eq!(c.create(&root, "f", 1, [0; 8]).0, OK);
    let xid = 0x5eed_0002;
    c.send_as(xid, NFS_PROG, nfsproc::REMOVE, &rm);
    assert_eq!(status_of(c.recv(), xid), OK);
    assert_eq!(c.create(&root, "f", 1, [0; 8]).0, OK, "made again");
    c2.send_as(xid, NFS_PROG, nfsproc::REMOVE, &rm);
    assert_eq!(status_of(c2.recv(), xid), OK);
    assert_eq!(c.lookup(&root, "f").0, OK, "the new file is still there");
    // The same xid with other arguments is another call.
    let mut rm2 = Writer::new();
    rm2.opaque(&root).opaque(b"never");
    c2.send_as(xid, NFS_PROG, nfsproc::REMOVE, &rm2.into_bytes());
    assert_eq!(status_of(c2.recv(), xid), 2, "NOENT");
    r.stop();
}

#[test]
fn a_guarded_setattr_applies_only_to_the_ctime_it_names() {
    let fs = mem_fs();
    let r = start(vec![open_export("/data", fs.clone())]);
    let mut c = root_client(&r);
    let (_, root) = Client::connect(r.local_addrs().1, sys(0, 0)).mnt("/data");
    let (st, fh, _) = c.create(&root, "g", 1, [0; 8]);
    assert_eq!(st, OK);
    assert_eq!(c.write(&fh, 0, b"kept", 2).0, OK);
    let ctime = c.getattr(&fh).1.unwrap().ctime;
    let truncate = |guard: (u32, u32)| {
        let mut w = Writer::new();
        w.opaque(&fh).bool(false).bool(false).bool(false);
        w.bool(true).u64(0).u32(0).u32(0);
        w.bool(true).u32(guard.0).u32(guard.1);
        w.into_bytes()
    };
    let stale = (ctime.0.wrapping_sub(1), ctime.1);
    let b = c.call(NFS_PROG, nfsproc::SETATTR, &truncate(stale));
    assert_eq!(Reader::new(&b).u32().unwrap(), 10002, "NOT_SYNC");
    assert_eq!(c.getattr(&fh).1.unwrap().size, 4, "not truncated");
    let b = c.call(NFS_PROG, nfsproc::SETATTR, &truncate(ctime));
    assert_eq!(Reader::new(&b).u32().unwrap(), OK);
    assert_eq!(c.getattr(&fh).1.unwrap().size, 0);
    r.stop();
}
