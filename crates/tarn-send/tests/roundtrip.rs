//! Send and receive between two pools on real member files: full,
//! incremental and `-I` streams of filesystems and volumes, raw streams of
//! an encrypted dataset received without its key (scrubbed there, then
//! opened with the same passphrase), `-F`, resuming after a cut at random
//! places, replication packages (`-R`) of trees, plain and raw, cut and
//! sent again, bad streams refused with the target unchanged, and
//! nothing made under a dataset while it is being received.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use tarn_dataset::recv::RecvOptions;
use tarn_dataset::{DsError, Value};
use tarn_fs::{Cred, SetAttr, ROOT_INO};
use tarn_pool::Pool;
use tarn_send::{receive, send, SendError, SendOptions};
use tarn_testkit::data::{pattern, Rng};
use tarn_testkit::datasets::{encrypted, mount, passphrase, DsFs};
use tarn_testkit::pools::{attached, create, props, scrub};
use tarn_vdev::VdevKind;

const PASS: &str = "the passphrase of the source";

fn pools(dir: &std::path::Path) -> (Arc<Pool>, Arc<Pool>) {
    let a = tarn_testkit::files::make(dir, "a", 3, 128 << 20);
    let b = tarn_testkit::files::make(dir, "b", 2, 128 << 20);
    (
        attached(create("tank", VdevKind::Raidz { parity: 1 }, &a, &[]).unwrap()),
        attached(create("backup", VdevKind::Mirror, &b, &[]).unwrap()),
    )
}

/// Every entry of `name`'s tree as its dataset layer reads it (values
/// opened, blocks read): two datasets with equal trees hold the same
/// files, names, attributes, times, links and holes.
fn tree(pool: &Arc<Pool>, name: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let h = tarn_dataset::open(pool, name).unwrap();
    let mut out = BTreeMap::new();
    let mut from: Option<Vec<u8>> = None;
    loop {
        let page = h
            .txn(false, |t| {
                let lo = from.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
                let page = t.range(lo, Bound::Unbounded, 256)?;
                let mut full = Vec::new();
                for (k, v) in page {
                    let bytes = match v {
                        Value::Plain(p) => p,
                        Value::Block { .. } => {
                            let mut b = t.read_block(&k)?.unwrap_or_default();
                            b.insert(0, 0xbb);
                            b
                        }
                    };
                    full.push((k, bytes));
                }
                Ok::<_, DsError>(full)
            })
            .unwrap();
        let Some((last, _)) = page.last() else {
            return out;
        };
        from = Some(last.clone());
        out.extend(page);
    }
}

/// Every dataset and snapshot of `p`, by name, sorted.
fn names(p: &Arc<Pool>) -> Vec<String> {
    let mut v: Vec<String> = tarn_dataset::list(p, true)
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    v.sort();
    v
}

fn to_vec(pool: &Arc<Pool>, snap: &str, opts: &SendOptions) -> Vec<u8> {
    let mut out = Vec::new();
    send(pool, snap, opts, &mut out).unwrap_or_else(|e| panic!("send {snap}: {e}"));
    out
}

fn recv(pool: &Arc<Pool>, name: &str, stream: &[u8], force: bool) -> Result<(), SendError> {
    let opts = RecvOptions {
        force,
        resumable: false,
        ..Default::default()
    };
    receive(pool, name, opts, stream).map(|_| ())
}

/// `tank/fs` with files of every kind at `@a`, changed at `@b`.
fn fs_at_a_and_b(tank: &Arc<Pool>, rng: &mut Rng) {
    tarn_dataset::create(tank, "tank/fs", &props(&[]), false).unwrap();
    let fs = mount(tank, "tank/fs");
    populate(&fs, rng);
    tarn_dataset::snapshot(tank, &["tank/fs@a".into()], false).unwrap();
    change(&fs, rng, 0);
    tarn_dataset::snapshot(tank, &["tank/fs@b".into()], false).unwrap();
}

/// `name` encrypted with [`PASS`], holding files of every kind.
fn encrypted_with_files(tank: &Arc<Pool>, name: &str, rng: &mut Rng) {
    encrypted(tank, name, PASS, &[]);
    populate(&mount(tank, name), rng);
}

/// A raw stream, whole.
fn raw_stream() -> SendOptions {
    SendOptions {
        raw: true,
        ..Default::default()
    }
}

fn incr(from: &str) -> SendOptions {
    SendOptions {
        from: Some(from.into()),
        ..Default::default()
    }
}

/// Files of every kind, with holes, links, attributes and odd times.
fn populate(fs: &DsFs, rng: &mut Rng) {
    let c = Cred::root();
    let d = fs.mkdir(ROOT_INO, b"photos", 0o750, 0, &c).unwrap().ino;
    for i in 0..12 {
        let f = fs
            .create(
                d,
                format!("img{i}.raw").as_bytes(),
                libc::S_IFREG | 0o640,
                0,
                libc::O_RDWR,
                &c,
            )
            .unwrap()
            .ino;
        let len = rng.range(0, 600_000) as usize;
        fs.write(f, 0, &rng.bytes(len), false, &c).unwrap();
        fs.release(f).unwrap();
    }
    // Sparse: a hole between two runs of data.
    let s = fs
        .create(
            ROOT_INO,
            b"sparse",
            libc::S_IFREG | 0o600,
            0,
            libc::O_RDWR,
            &c,
        )
        .unwrap()
        .ino;
    fs.write(s, 0, b"start", false, &c).unwrap();
    fs.write(s, 5 << 20, b"end", false, &c).unwrap();
    fs.release(s).unwrap();
    let img0 = fs.lookup(d, b"img0.raw", &c).unwrap().ino;
    fs.link(img0, ROOT_INO, b"hardlink", &c).unwrap();
    fs.symlink(ROOT_INO, b"short", b"photos/img1.raw", &c)
        .unwrap();
    fs.symlink(ROOT_INO, b"long", &[b'x'; 3000], &c).unwrap();
    fs.setxattr(img0, b"user.tag", b"summer", 0, &c).unwrap();
    fs.setxattr(img0, b"user.big", &pattern(5, 5000), 0, &c)
        .unwrap();
    let sa = SetAttr {
        uid: Some(1234),
        gid: Some(99),
        ..Default::default()
    };
    fs.setattr(img0, &sa, &c).unwrap();
}

/// Changes between two snapshots (round `n`, from 0 to 3): new,
/// rewritten, truncated, deleted, renamed files and attributes.
fn change(fs: &DsFs, rng: &mut Rng, n: usize) {
    let c = Cred::root();
    let d = fs.lookup(ROOT_INO, b"photos", &c).unwrap().ino;
    let f = fs
        .create(
            d,
            format!("new{n}.raw").as_bytes(),
            libc::S_IFREG | 0o644,
            0,
            libc::O_RDWR,
            &c,
        )
        .unwrap()
        .ino;
    fs.write(f, 0, &rng.bytes(300_000), false, &c).unwrap();
    fs.release(f).unwrap();
    let g = fs
        .lookup(d, format!("img{n}.raw").as_bytes(), &c)
        .unwrap()
        .ino;
    fs.open(g, libc::O_RDWR, &c).unwrap();
    fs.write(g, 1000, &rng.bytes(70_000), false, &c).unwrap();
    fs.release(g).unwrap();
    let t = fs
        .lookup(d, format!("img{}.raw", n + 4).as_bytes(), &c)
        .unwrap()
        .ino;
    let sa = SetAttr {
        size: Some(10),
        ..Default::default()
    };
    fs.setattr(t, &sa, &c).unwrap();
    fs.unlink(d, format!("img{}.raw", n + 8).as_bytes(), &c)
        .unwrap();
    fs.rename(
        d,
        format!("new{n}.raw").as_bytes(),
        ROOT_INO,
        format!("moved{n}.raw").as_bytes(),
        0,
        &c,
    )
    .unwrap();
    let img0 = fs.lookup(d, b"img0.raw", &c).unwrap().ino;
    fs.setxattr(img0, b"user.round", &[n as u8], 0, &c).unwrap();
    if n == 1 {
        fs.removexattr(img0, b"user.tag", &c).unwrap();
    }
}

#[test]
fn full_incremental_and_series_streams_recreate_the_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0x5e4d);
    tarn_dataset::create(&tank, "tank/fs", &props(&[("recordsize", "128K")]), false).unwrap();
    let fs = mount(&tank, "tank/fs");
    populate(&fs, &mut rng);
    tarn_dataset::snapshot(&tank, &["tank/fs@a".into()], false).unwrap();
    change(&fs, &mut rng, 0);
    tarn_dataset::snapshot(&tank, &["tank/fs@b".into()], false).unwrap();
    change(&fs, &mut rng, 1);
    tarn_dataset::snapshot(&tank, &["tank/fs@c".into()], false).unwrap();
    change(&fs, &mut rng, 2);
    tarn_dataset::snapshot(&tank, &["tank/fs@d".into()], false).unwrap();

    let full = to_vec(&tank, "tank/fs@a", &SendOptions::default());
    recv(&backup, "backup/fs", &full, false).unwrap();
    assert_eq!(tree(&backup, "backup/fs@a"), tree(&tank, "tank/fs@a"));
    assert_eq!(tree(&backup, "backup/fs"), tree(&tank, "tank/fs@a"));
    // The same stream again is refused: the dataset exists.
    assert!(matches!(
        recv(&backup, "backup/fs", &full, false),
        Err(SendError::Dataset(DsError::Exists(_)))
    ));
    let ab = to_vec(&tank, "tank/fs@b", &incr("@a"));
    assert!(
        ab.len() < full.len(),
        "the incremental stream carries only changes"
    );
    recv(&backup, "backup/fs", &ab, false).unwrap();
    assert_eq!(tree(&backup, "backup/fs@b"), tree(&tank, "tank/fs@b"));
    // -I: @c and @d in one input, two streams.
    let series = to_vec(
        &tank,
        "tank/fs@d",
        &SendOptions {
            from: Some("tank/fs@b".into()),
            intermediates: true,
            ..Default::default()
        },
    );
    recv(&backup, "backup/fs", &series, false).unwrap();
    for s in ["c", "d"] {
        assert_eq!(
            tree(&backup, &format!("backup/fs@{s}")),
            tree(&tank, &format!("tank/fs@{s}"))
        );
    }
    // The POSIX view agrees too.
    let copy = mount(&backup, "backup/fs");
    let c = Cred::root();
    let a = fs.lookup(ROOT_INO, b"sparse", &c).unwrap();
    let b = copy.lookup(ROOT_INO, b"sparse", &c).unwrap();
    assert_eq!(
        (a.size, a.blocks, a.mtime, a.mode),
        (b.size, b.blocks, b.mtime, b.mode)
    );
    assert_eq!(
        copy.readlink(copy.lookup(ROOT_INO, b"long", &c).unwrap().ino)
            .unwrap(),
        vec![b'x'; 3000]
    );
    assert_eq!(copy.lookup(ROOT_INO, b"hardlink", &c).unwrap().nlink, 2);
    drop(copy);
    // The received dataset scrubs clean and holds no leaked space.
    assert_eq!(scrub(&backup).errors, 0);
    assert!(backup.leak_check().unwrap().is_clean());
    // -F: a change on the target is rolled back before an incremental.
    tarn_dataset::snapshot(&tank, &["tank/fs@e".into()], false).unwrap();
    let de = to_vec(&tank, "tank/fs@e", &incr("@d"));
    let copy = mount(&backup, "backup/fs");
    let f = tarn_testkit::datasets::new_file(&copy, "local change");
    copy.release(f).unwrap();
    drop(copy);
    let busy = recv(&backup, "backup/fs", &de, false);
    assert!(
        matches!(busy, Err(SendError::Dataset(DsError::Busy(_)))),
        "{busy:?}"
    );
    recv(&backup, "backup/fs", &de, true).unwrap();
    assert_eq!(tree(&backup, "backup/fs"), tree(&tank, "tank/fs@e"));
    // A wrong base is refused, and changes nothing.
    let before = tree(&backup, "backup/fs");
    let bc = to_vec(&tank, "tank/fs@c", &incr("@b"));
    let r = recv(&backup, "backup/fs", &bc, false);
    assert!(
        r.is_err(),
        "an incremental whose base is not the newest snapshot"
    );
    assert_eq!(tree(&backup, "backup/fs"), before);
}

#[test]
fn volumes_and_non_raw_streams_of_encrypted_datasets() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let spec = tarn_dataset::VolSpec {
        size: 8 << 20,
        block: 16384,
    };
    tarn_dataset::create_volume(&tank, "tank/vol", spec, true, &props(&[]), false).unwrap();
    let v = tarn_dataset::open(&tank, "tank/vol").unwrap();
    v.txn(true, |t| {
        for b in [0u64, 3, 200, 511] {
            t.write_block(&b.to_be_bytes(), pattern(b, 16384))?;
        }
        Ok::<_, DsError>(())
    })
    .unwrap();
    tarn_dataset::snapshot(&tank, &["tank/vol@1".into()], false).unwrap();
    recv(
        &backup,
        "backup/vol",
        &to_vec(&tank, "tank/vol@1", &SendOptions::default()),
        false,
    )
    .unwrap();
    assert_eq!(tree(&backup, "backup/vol"), tree(&tank, "tank/vol@1"));
    assert_eq!(
        tarn_dataset::open(&backup, "backup/vol")
            .unwrap()
            .volume()
            .unwrap(),
        Some(spec)
    );
    // An encrypted filesystem sent without -w: plaintext in the stream,
    // received into an encrypted parent it is sealed with that one's key.
    encrypted(&tank, "tank/secret", PASS, &[]);
    let fs = mount(&tank, "tank/secret");
    let f = tarn_testkit::datasets::new_file(&fs, "note");
    fs.write(f, 0, b"CANARY-plain-stream", false, &Cred::root())
        .unwrap();
    fs.release(f).unwrap();
    drop(fs);
    tarn_dataset::snapshot(&tank, &["tank/secret@s".into()], false).unwrap();
    let stream = to_vec(&tank, "tank/secret@s", &SendOptions::default());
    assert!(stream.windows(19).any(|w| w == b"CANARY-plain-stream"));
    encrypted(&backup, "backup/vault", "another passphrase", &[]);
    recv(&backup, "backup/vault/secret", &stream, false).unwrap();
    assert_eq!(
        tree(&backup, "backup/vault/secret"),
        tree(&tank, "tank/secret@s")
    );
    let info = tarn_testkit::datasets::info(&backup, "backup/vault/secret");
    assert_eq!(info.encryptionroot.as_deref(), Some("backup/vault"));
    // Locked, the source refuses a non-raw send.
    tarn_dataset::unload_key(&tank, "tank/secret").unwrap();
    let mut out = Vec::new();
    let r = send(&tank, "tank/secret@s", &SendOptions::default(), &mut out);
    assert!(
        matches!(r, Err(SendError::Dataset(DsError::Locked(_)))),
        "{r:?}"
    );
}

#[test]
fn raw_streams_travel_and_scrub_without_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(77);
    encrypted(&tank, "tank/s", PASS, &[("compression", "lz4")]);
    let fs = mount(&tank, "tank/s");
    populate(&fs, &mut rng);
    let c = Cred::root();
    let f = tarn_testkit::datasets::new_file(&fs, "CANARY-raw-name");
    fs.write(f, 0, &b"CANARY-raw-data ".repeat(5000), false, &c)
        .unwrap();
    fs.release(f).unwrap();
    tarn_dataset::snapshot(&tank, &["tank/s@1".into()], false).unwrap();
    change(&fs, &mut rng, 3);
    tarn_dataset::snapshot(&tank, &["tank/s@2".into()], false).unwrap();
    drop(fs);
    let raw = SendOptions {
        raw: true,
        ..Default::default()
    };
    // The sender's key is not needed either.
    tarn_dataset::unload_key(&tank, "tank/s").unwrap();
    let full = to_vec(&tank, "tank/s@1", &raw);
    for canary in [&b"CANARY-raw-name"[..], b"CANARY-raw-data"] {
        assert!(
            !full.windows(canary.len()).any(|w| w == canary),
            "plaintext in a raw stream"
        );
    }
    recv(&backup, "backup/s", &full, false).unwrap();
    let info = tarn_testkit::datasets::info(&backup, "backup/s");
    assert_eq!(info.keystatus.as_deref(), Some("unavailable"));
    assert_eq!(info.encryptionroot.as_deref(), Some("backup/s"));
    let incremental = to_vec(
        &tank,
        "tank/s@2",
        &SendOptions {
            from: Some("@1".into()),
            raw: true,
            ..Default::default()
        },
    );
    recv(&backup, "backup/s", &incremental, false).unwrap();
    let s = scrub(&backup);
    assert_eq!(s.errors, 0, "{s:?}");
    assert!(backup.leak_check().unwrap().is_clean());
    // The same passphrase opens it there: the same files.
    tarn_dataset::load_key(&tank, "tank/s", &passphrase(PASS)).unwrap();
    tarn_dataset::load_key(&backup, "backup/s", &passphrase(PASS)).unwrap();
    assert_eq!(tree(&backup, "backup/s"), tree(&tank, "tank/s@2"));
    assert_eq!(tree(&backup, "backup/s@1"), tree(&tank, "tank/s@1"));
    let copy = mount(&backup, "backup/s");
    assert!(copy.lookup(ROOT_INO, b"CANARY-raw-name", &c).is_ok());
}

/// The stream cut at random places: a resumable receive keeps what
/// arrived, its token resumes it, and the result is the snapshot.
#[test]
fn a_resumable_receive_continues_after_cuts_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0xc075);
    fs_at_a_and_b(&tank, &mut rng);
    let seeds = tarn_testkit::data::env_seed("TARN_SEND_SEED").map_or(6, |_| 1);
    let mut resumed_later = 0;
    for round in 0..seeds {
        let target = format!("backup/r{round}");
        let resumable = RecvOptions {
            force: false,
            resumable: true,
            ..Default::default()
        };
        for (snap, opts) in [
            ("tank/fs@a", SendOptions::default()),
            ("tank/fs@b", incr("@a")),
        ] {
            let mut stream = to_vec(&tank, snap, &opts);
            let mut cuts = 0;
            loop {
                let cut = rng.range(1, stream.len() as u64) as usize;
                match receive(&backup, &target, resumable, &stream[..cut]) {
                    Ok(_) => unreachable!("a cut stream is never complete"),
                    Err(SendError::Stream(_)) => {}
                    Err(e) => panic!("round {round}: cut at {cut}: {e}"),
                }
                cuts += 1;
                let token =
                    tarn_dataset::get_props(&backup, &target, &["receive_resume_token".into()])
                        .map(|p| p[0].value.clone())
                        .unwrap_or_else(|_| "-".into());
                let resume = SendOptions {
                    token: (token != "-").then_some(token),
                    ..opts.clone()
                };
                let whole = stream.len();
                stream = to_vec(&tank, snap, &resume);
                if stream.len() < whole {
                    resumed_later += 1;
                }
                if cuts == 3 || stream.len() < 64 {
                    break;
                }
            }
            receive(&backup, &target, resumable, &stream[..])
                .unwrap_or_else(|e| panic!("round {round}: the resumed stream: {e}"));
        }
        assert_eq!(
            tree(&backup, &format!("{target}@a")),
            tree(&tank, "tank/fs@a")
        );
        assert_eq!(
            tree(&backup, &format!("{target}@b")),
            tree(&tank, "tank/fs@b")
        );
        assert_eq!(tree(&backup, &target), tree(&tank, "tank/fs@b"));
    }
    assert!(
        resumed_later > 3,
        "only {resumed_later} cuts resumed past the start: the test would not see a bad resume point"
    );
    assert!(backup.leak_check().unwrap().is_clean());
}

/// A stream that resumes a receive, given to a dataset that holds no such
/// receive, is refused before anything is created or rolled back.
#[test]
fn a_resume_stream_without_its_receive_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0x7e5);
    fs_at_a_and_b(&tank, &mut rng);
    let resumable = RecvOptions {
        force: false,
        resumable: true,
        ..Default::default()
    };
    let stream = to_vec(&tank, "tank/fs@a", &SendOptions::default());
    let mut token = None;
    for cut in [stream.len() / 2, stream.len() * 3 / 4, stream.len() - 16] {
        assert!(receive(&backup, "backup/r", resumable, &stream[..cut]).is_err());
        let t = tarn_dataset::get_props(&backup, "backup/r", &["receive_resume_token".into()])
            .unwrap()[0]
            .value
            .clone();
        if t != "-" {
            token = Some(t);
            break;
        }
    }
    let token = token.expect("a cut stream left a resume token");
    let resume = to_vec(
        &tank,
        "tank/fs@a",
        &SendOptions {
            token: Some(token),
            ..Default::default()
        },
    );
    let before = names(&backup);
    // Another target: no dataset made, nothing left being received.
    let e = receive(&backup, "backup/other", resumable, &resume[..]).unwrap_err();
    assert!(e.to_string().contains("does not hold"), "{e}");
    assert_eq!(names(&backup), before);
    // An existing copy with a newer snapshot, with -F: nothing destroyed.
    recv(&backup, "backup/full", &stream, false).unwrap();
    tarn_dataset::snapshot(&backup, &["backup/full@local".into()], false).unwrap();
    let before = names(&backup);
    assert!(recv(&backup, "backup/full", &resume, true).is_err());
    assert_eq!(names(&backup), before);
    // Its own receive takes it.
    receive(&backup, "backup/r", resumable, &resume[..]).unwrap();
    assert_eq!(tree(&backup, "backup/r@a"), tree(&tank, "tank/fs@a"));
}

/// A one-record change to a large file: the incremental stream holds
/// about that record, and the send reads about that much.
#[test]
fn an_incremental_stream_costs_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, _backup) = pools(dir.path());
    tarn_dataset::create(
        &tank,
        "tank/big",
        &props(&[("recordsize", "128K"), ("compression", "off")]),
        false,
    )
    .unwrap();
    let fs = mount(&tank, "tank/big");
    let f = tarn_testkit::datasets::new_file(&fs, "disk.img");
    let c = Cred::root();
    let mut rng = Rng::new(3);
    for i in 0..512u64 {
        fs.write(f, i << 17, &rng.bytes(128 << 10), false, &c)
            .unwrap();
    }
    tarn_dataset::snapshot(&tank, &["tank/big@a".into()], false).unwrap();
    fs.write(f, 300 << 17, &rng.bytes(128 << 10), false, &c)
        .unwrap();
    fs.release(f).unwrap();
    tarn_dataset::snapshot(&tank, &["tank/big@b".into()], false).unwrap();
    let mut out = Vec::new();
    let r = send(&tank, "tank/big@b", &incr("@a"), &mut out).unwrap();
    assert!(
        out.len() < (128 << 10) + 8192,
        "a 64 MiB file with one changed record: {} bytes of stream",
        out.len()
    );
    assert_eq!(r.stats.blocks_read, 1, "{r:?}");
    assert!(r.stats.nodes_read < 20, "{r:?}");
    let full = send(
        &tank,
        "tank/big@b",
        &SendOptions::default(),
        std::io::sink(),
    )
    .unwrap();
    assert_eq!(full.stats.blocks_read, 512);
}

fn replicate(from: Option<&str>, intermediates: bool, raw: bool) -> SendOptions {
    SendOptions {
        from: from.map(str::to_string),
        intermediates,
        raw,
        replicate: true,
        ..Default::default()
    }
}

/// Every snapshot (and the live tree) of each `(source, copy)` pair is the
/// same, and the copy has no snapshot the source did not send.
fn same_trees(tank: &Arc<Pool>, backup: &Arc<Pool>, pairs: &[(&str, &str)], upto: &str) {
    for (src, dst) in pairs {
        let names = |p: &Arc<Pool>, fs: &str| -> Vec<String> {
            tarn_dataset::open(p, fs)
                .unwrap_or_else(|e| panic!("open {fs}: {e}"))
                .snapshots()
                .unwrap()
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        let mut want = names(tank, src);
        if let Some(end) = want.iter().position(|n| n == upto) {
            want.truncate(end + 1);
        }
        assert_eq!(names(backup, dst), want, "{dst}'s snapshots");
        for n in &want {
            assert_eq!(
                tree(backup, &format!("{dst}@{n}")),
                tree(tank, &format!("{src}@{n}")),
                "{dst}@{n}"
            );
        }
        assert_eq!(
            tree(backup, dst),
            tree(tank, &format!("{src}@{upto}")),
            "{dst} itself"
        );
    }
}

/// `-R`: a tree of filesystems with their snapshots and properties, then
/// an incremental package with a dataset that is new since; a package
/// received again is skipped whole; a child without the snapshot stays
/// home; `-F` rolls every dataset of the package back.
#[test]
fn a_replication_package_recreates_a_tree_with_its_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0x2e9);
    let mk = |name: &str, p: &[(&str, &str)]| {
        tarn_dataset::create(&tank, name, &props(p), false).unwrap();
    };
    mk("tank/home", &[]);
    mk("tank/home/alice", &[("compression", "zstd")]);
    mk("tank/home/bob", &[("quota", "1G")]);
    mk("tank/home/bob/music", &[("recordsize", "1M")]);
    let alice = mount(&tank, "tank/home/alice");
    populate(&alice, &mut rng);
    let music = mount(&tank, "tank/home/bob/music");
    populate(&music, &mut rng);
    tarn_dataset::snapshot(&tank, &["tank/home@mon".into()], true).unwrap();
    change(&alice, &mut rng, 0);
    mk("tank/home/carol", &[]);
    let carol = mount(&tank, "tank/home/carol");
    populate(&carol, &mut rng);
    tarn_dataset::snapshot(&tank, &["tank/home@tue".into()], true).unwrap();
    mk("tank/home/dave", &[]);
    tarn_dataset::snapshot(&tank, &["tank/home/dave@own".into()], false).unwrap();
    // A child with the snapshot below a dataset without it: left out too.
    mk("tank/home/dave/sub", &[]);
    tarn_dataset::snapshot(&tank, &["tank/home/dave/sub@tue".into()], false).unwrap();

    let pkg = to_vec(&tank, "tank/home@tue", &replicate(None, false, false));
    let opts = RecvOptions::default();
    let r = receive(&backup, "backup/home", opts, &pkg[..]).unwrap();
    // home, alice, bob, bob/music: two snapshots each; carol: one.
    assert_eq!(r.snapshots.len(), 9, "{:?}", r.snapshots);
    let pairs = [
        ("tank/home", "backup/home"),
        ("tank/home/alice", "backup/home/alice"),
        ("tank/home/bob", "backup/home/bob"),
        ("tank/home/bob/music", "backup/home/bob/music"),
        ("tank/home/carol", "backup/home/carol"),
    ];
    same_trees(&tank, &backup, &pairs, "tue");
    assert!(tarn_dataset::open(&backup, "backup/home/dave").is_err());
    let local = |p: &Arc<Pool>, name: &str, prop: &str| {
        let v = tarn_dataset::get_props(p, name, &[prop.to_string()]).unwrap();
        (v[0].value.clone(), v[0].source.clone())
    };
    for (name, prop) in [
        ("home/alice", "compression"),
        ("home/bob", "quota"),
        ("home/bob/music", "recordsize"),
    ] {
        assert_eq!(
            local(&backup, &format!("backup/{name}"), prop),
            local(&tank, &format!("tank/{name}"), prop),
            "{name} {prop}"
        );
    }

    // Incremental: changes below, and a dataset new since @tue.
    change(&music, &mut rng, 1);
    change(&alice, &mut rng, 2);
    mk("tank/home/eve", &[]);
    tarn_dataset::snapshot(&tank, &["tank/home@wed".into()], true).unwrap();
    change(&carol, &mut rng, 3);
    tarn_dataset::snapshot(&tank, &["tank/home@thu".into()], true).unwrap();
    let inc = to_vec(
        &tank,
        "tank/home@thu",
        &replicate(Some("@tue"), true, false),
    );
    let r = receive(&backup, "backup/home", opts, &inc[..]).unwrap();
    assert!(r.skipped.is_empty(), "{:?}", r.skipped);
    let mut pairs = pairs.to_vec();
    pairs.push(("tank/home/eve", "backup/home/eve"));
    pairs.push(("tank/home/dave", "backup/home/dave"));
    pairs.push(("tank/home/dave/sub", "backup/home/dave/sub"));
    same_trees(&tank, &backup, &pairs, "thu");
    // The same package again: every stream read, checked and skipped.
    let before = tree(&backup, "backup/home/alice");
    let r = receive(&backup, "backup/home", opts, &inc[..]).unwrap();
    assert!(r.snapshots.is_empty(), "{:?}", r.snapshots);
    // dave has @wed and @thu now, but not @tue: it came whole, from its
    // own first snapshot, and so did dave/sub below it, from its @tue.
    assert_eq!(r.skipped.len(), 18, "{:?}", r.skipped);
    assert_eq!(tree(&backup, "backup/home/alice"), before);

    // A change on the target refuses the next package; -F rolls back.
    let copy = mount(&backup, "backup/home/bob/music");
    let f = tarn_testkit::datasets::new_file(&copy, "local change");
    copy.release(f).unwrap();
    drop(copy);
    tarn_dataset::snapshot(&tank, &["tank/home@fri".into()], true).unwrap();
    let next = to_vec(
        &tank,
        "tank/home@fri",
        &replicate(Some("@thu"), false, false),
    );
    let r = receive(&backup, "backup/home", opts, &next[..]);
    assert!(
        matches!(r, Err(SendError::Dataset(DsError::Busy(_)))),
        "{r:?}"
    );
    let force = RecvOptions {
        force: true,
        resumable: false,
        ..Default::default()
    };
    receive(&backup, "backup/home", force, &next[..]).unwrap();
    same_trees(&tank, &backup, &pairs, "fri");
    // -i names a snapshot of the top dataset.
    let mut out = Vec::new();
    let r = send(
        &tank,
        "tank/home@fri",
        &replicate(Some("tank/home/alice@thu"), false, false),
        &mut out,
    );
    assert!(
        matches!(r, Err(SendError::Dataset(DsError::Invalid(_)))),
        "{r:?}"
    );
    assert_eq!(scrub(&backup).errors, 0);
    assert!(backup.leak_check().unwrap().is_clean());
}

/// `-R -w` of an encrypted tree: the children that share the root's key
/// share the copy's key, a child with its own key is its own encryption
/// root there; all of it received and scrubbed without a key, then opened
/// with the sender's passphrases.
#[test]
fn a_raw_package_keeps_the_tree_of_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0x5ec);
    const OWN: &str = "another passphrase entirely";
    encrypted(&tank, "tank/sec", PASS, &[]);
    tarn_dataset::create(&tank, "tank/sec/a", &props(&[]), false).unwrap();
    encrypted(&tank, "tank/sec/own", OWN, &[]);
    for name in ["tank/sec", "tank/sec/a", "tank/sec/own"] {
        let fs = mount(&tank, name);
        populate(&fs, &mut rng);
    }
    tarn_dataset::snapshot(&tank, &["tank/sec@1".into()], true).unwrap();
    let fs = mount(&tank, "tank/sec/a");
    change(&fs, &mut rng, 0);
    drop(fs);
    tarn_dataset::snapshot(&tank, &["tank/sec@2".into()], true).unwrap();
    let trees = |p: &Arc<Pool>, top: &str| -> Vec<BTreeMap<Vec<u8>, Vec<u8>>> {
        ["", "/a", "/own"]
            .iter()
            .flat_map(|c| ["@1", "@2"].map(|s| tree(p, &format!("{top}{c}{s}"))))
            .collect()
    };
    let want = trees(&tank, "tank/sec");
    tarn_dataset::unload_key(&tank, "tank/sec/own").unwrap();
    tarn_dataset::unload_key(&tank, "tank/sec").unwrap();
    let pkg = to_vec(&tank, "tank/sec@2", &replicate(None, false, true));
    recv(&backup, "backup/sec", &pkg, false).unwrap();
    for (name, root) in [
        ("backup/sec", "backup/sec"),
        ("backup/sec/a", "backup/sec"),
        ("backup/sec/own", "backup/sec/own"),
    ] {
        let i = tarn_testkit::datasets::info(&backup, name);
        assert_eq!(i.encryptionroot.as_deref(), Some(root), "{name}");
        assert_eq!(i.keystatus.as_deref(), Some("unavailable"), "{name}");
    }
    assert_eq!(scrub(&backup).errors, 0);
    assert!(backup.leak_check().unwrap().is_clean());
    tarn_dataset::load_key(&backup, "backup/sec", &passphrase(PASS)).unwrap();
    tarn_dataset::load_key(&backup, "backup/sec/own", &passphrase(OWN)).unwrap();
    assert!(trees(&backup, "backup/sec") == want, "the copies differ");
}

/// A package (and an `-I` series) cut anywhere: the receive fails, even
/// at a boundary between two streams; what arrived is kept, and the same
/// package sent again from its start finishes it.
#[test]
fn a_cut_package_sent_again_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0xc0de);
    for name in ["tank/t", "tank/t/x", "tank/t/y"] {
        tarn_dataset::create(&tank, name, &props(&[]), false).unwrap();
    }
    let x = mount(&tank, "tank/t/x");
    populate(&x, &mut rng);
    tarn_dataset::snapshot(&tank, &["tank/t@1".into()], true).unwrap();
    change(&x, &mut rng, 0);
    let y = mount(&tank, "tank/t/y");
    populate(&y, &mut rng);
    tarn_dataset::snapshot(&tank, &["tank/t@2".into()], true).unwrap();
    drop((x, y));
    let pkg = to_vec(&tank, "tank/t@2", &replicate(None, false, false));
    // Where each stream begins: cut just there too.
    let magic = br#"{"magic""#;
    let at: Vec<usize> = (0..pkg.len())
        .filter(|&i| pkg[i..].starts_with(magic))
        .collect();
    let boundaries: Vec<usize> = at[1..].iter().map(|i| i - at[0]).collect();
    assert_eq!(boundaries.len(), 5, "six streams");
    let resumable = RecvOptions {
        force: false,
        resumable: true,
        ..Default::default()
    };
    let rounds = tarn_testkit::data::env_seed("TARN_SEND_SEED").map_or(4, |_| 1);
    for round in 0..rounds {
        let target = format!("backup/c{round}");
        let cuts = [
            boundaries[round % boundaries.len()],
            rng.range(1, pkg.len() as u64) as usize,
            rng.range(1, pkg.len() as u64) as usize,
        ];
        for cut in cuts {
            let r = receive(&backup, &target, resumable, &pkg[..cut]);
            assert!(
                matches!(r, Err(SendError::Stream(_))),
                "round {round}: cut at {cut} of {}: {r:?}",
                pkg.len()
            );
        }
        receive(&backup, &target, resumable, &pkg[..])
            .unwrap_or_else(|e| panic!("round {round}: the package again: {e}"));
        same_trees(
            &tank,
            &backup,
            &[
                ("tank/t", &target),
                ("tank/t/x", &format!("{target}/x")),
                ("tank/t/y", &format!("{target}/y")),
            ],
            "2",
        );
    }
    assert!(backup.leak_check().unwrap().is_clean());
}

/// `stream` with its key's wrapping replaced by `wrapped` (hex), the
/// chained checksums made again: what a hostile sender or store can send.
fn with_wrapping(stream: &[u8], wrapped: &str) -> Vec<u8> {
    rewritten(
        stream,
        |h| h.info.key.as_mut().expect("a raw stream's key").wrapped = wrapped.to_string(),
        |own| own,
    )
}

/// A raw stream that names its parent's key but carries another wrapping
/// gets a key record of its own; an incremental stream into a dataset
/// that shares its encryption root's key never rewrites that key: the
/// root still opens with its passphrase.
#[test]
fn a_raw_stream_cannot_change_a_parents_key() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0xbad);
    encrypted(&tank, "tank/sec", PASS, &[]);
    tarn_dataset::create(&tank, "tank/sec/a", &props(&[]), false).unwrap();
    let fs = mount(&tank, "tank/sec/a");
    populate(&fs, &mut rng);
    tarn_dataset::snapshot(&tank, &["tank/sec@1".into()], true).unwrap();
    change(&fs, &mut rng, 0);
    drop(fs);
    tarn_dataset::snapshot(&tank, &["tank/sec/a@2".into()], false).unwrap();
    recv(
        &backup,
        "backup/sec",
        &to_vec(&tank, "tank/sec@1", &replicate(None, false, true)),
        false,
    )
    .unwrap();
    let bogus = "ab".repeat(tarn_block::crypt::WRAPPED_LEN);
    // A full stream below the root with the root's key guid.
    let full = to_vec(&tank, "tank/sec/a@1", &raw_stream());
    recv(
        &backup,
        "backup/sec/evil",
        &with_wrapping(&full, &bogus),
        false,
    )
    .unwrap();
    let i = tarn_testkit::datasets::info(&backup, "backup/sec/evil");
    assert_eq!(i.encryptionroot.as_deref(), Some("backup/sec/evil"));
    // An incremental into the child that shares the root's key.
    let inc = to_vec(
        &tank,
        "tank/sec/a@2",
        &SendOptions {
            from: Some("@1".into()),
            raw: true,
            ..Default::default()
        },
    );
    recv(&backup, "backup/sec/a", &with_wrapping(&inc, &bogus), false).unwrap();
    // The root's key is as it was: the passphrase opens the whole tree.
    tarn_dataset::load_key(&backup, "backup/sec", &passphrase(PASS)).unwrap();
    assert_eq!(tree(&backup, "backup/sec/a@1"), tree(&tank, "tank/sec/a@1"));
    assert_eq!(tree(&backup, "backup/sec/a@2"), tree(&tank, "tank/sec/a@2"));
    // Bad key fields are refused before anything is made.
    for bad in ["00", "zz".repeat(tarn_block::crypt::WRAPPED_LEN).as_str()] {
        let r = recv(
            &backup,
            "backup/sec/worse",
            &with_wrapping(&full, bad),
            false,
        );
        assert!(
            matches!(r, Err(SendError::Dataset(DsError::Invalid(_)))),
            "{r:?}"
        );
    }
    assert!(tarn_dataset::open(&backup, "backup/sec/worse").is_err());
}

/// A raw incremental carries the sender's key wrapping: a changed
/// passphrase travels with it, unless the receiver keeps the wrapping it
/// has (the replication port does), and then neither a real change nor a
/// hostile sender's made-up wrapping takes away the passphrase that opens
/// the copy.
#[test]
fn a_receiver_that_keeps_its_wrapping_still_opens_with_its_passphrase() {
    const NEW: &str = "the passphrase after the change";
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0x4e1);
    encrypted_with_files(&tank, "tank/sec", &mut rng);
    let snap = |n: u32| {
        tarn_dataset::snapshot(&tank, &[format!("tank/sec@{n}")], false).unwrap();
    };
    let raw_from = |from: u32, to: u32| {
        to_vec(
            &tank,
            &format!("tank/sec@{to}"),
            &SendOptions {
                from: Some(format!("@{from}")),
                raw: true,
                ..Default::default()
            },
        )
    };
    let recv_keeping = |stream: &[u8], keep_wrapping: bool| {
        let opts = RecvOptions {
            keep_wrapping,
            ..Default::default()
        };
        receive(&backup, "backup/sec", opts, stream).map(|_| ())
    };
    let opens_with = |pass: &str| {
        let ok = tarn_dataset::load_key(&backup, "backup/sec", &passphrase(pass)).is_ok();
        if ok {
            tarn_dataset::unload_key(&backup, "backup/sec").unwrap();
        }
        ok
    };
    snap(1);
    let full = to_vec(&tank, "tank/sec@1", &raw_stream());
    recv(&backup, "backup/sec", &full, false).unwrap();
    assert!(opens_with(PASS));

    // The passphrase changes on the sender; the copy keeps its own.
    tarn_dataset::change_key(&tank, "tank/sec", &passphrase(NEW)).unwrap();
    snap(2);
    recv_keeping(&raw_from(1, 2), true).unwrap();
    assert!(opens_with(PASS), "the kept wrapping");
    assert!(!opens_with(NEW));

    // A made-up wrapping from a hostile sender changes nothing either.
    snap(3);
    let bogus = "cd".repeat(tarn_block::crypt::WRAPPED_LEN);
    recv_keeping(&with_wrapping(&raw_from(2, 3), &bogus), true).unwrap();
    assert!(opens_with(PASS), "a hostile wrapping was applied");

    // A receiver that trusts its sender takes the change.
    snap(4);
    recv_keeping(&raw_from(3, 4), false).unwrap();
    assert!(opens_with(NEW), "the change did not travel");
    assert!(!opens_with(PASS));
    tarn_dataset::load_key(&backup, "backup/sec", &passphrase(NEW)).unwrap();
    assert_eq!(tree(&backup, "backup/sec@4"), tree(&tank, "tank/sec@4"));
}

/// `stream` with its header changed by `edit` and its entries changed by
/// `items` (given the stream's own), the chained checksums made again:
/// what a hostile sender (with a valid token) or store can send.
fn rewritten(
    stream: &[u8],
    edit: impl FnOnce(&mut tarn_send::stream::Header),
    items: impl FnOnce(Vec<tarn_dataset::send::SendItem>) -> Vec<tarn_dataset::send::SendItem>,
) -> Vec<u8> {
    use tarn_send::stream::{Record, StreamReader, StreamWriter};
    let mut r = StreamReader::new(stream);
    let Some(Record::Begin(mut h)) = r.next_record().unwrap() else {
        panic!("a stream starts with BEGIN");
    };
    edit(&mut h);
    let mut own = Vec::new();
    while let Some(rec) = r.next_record().unwrap() {
        match rec {
            Record::Item(i) => own.push(i),
            Record::End(_) => break,
            Record::Begin(_) => panic!("one stream"),
        }
    }
    let mut w = StreamWriter::begin(Vec::new(), &h).unwrap();
    for i in items(own) {
        w.item(&i).unwrap();
    }
    w.end().unwrap().0
}

/// Streams a receiver must refuse without harm to its pool: a plaintext
/// block in a raw stream of an encrypted dataset (a raw receive holds no
/// key to seal it, and the sync would fail), a source name no dataset
/// can have (the record would be too large to store), an incremental
/// volume stream that changes the block size or drops its geometry, and
/// an incremental that carries its base's guid again. After each, the
/// pool still takes changes and the honest streams.
#[test]
fn hostile_streams_are_refused_and_the_pool_goes_on() {
    use tarn_dataset::send::{BlockPayload, SendItem};
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0x5eed);
    encrypted_with_files(&tank, "tank/s", &mut rng);
    tarn_dataset::snapshot(&tank, &["tank/s@1".into()], false).unwrap();
    let raw = SendOptions {
        raw: true,
        ..Default::default()
    };
    let full_raw = to_vec(&tank, "tank/s@1", &raw);
    let spec = tarn_dataset::VolSpec {
        size: 4 << 20,
        block: 16384,
    };
    tarn_dataset::create_volume(&tank, "tank/vol", spec, true, &props(&[]), false).unwrap();
    let write = |blocks: &[u64]| {
        let v = tarn_dataset::open(&tank, "tank/vol").unwrap();
        v.txn(true, |t| {
            for &b in blocks {
                t.write_block(&b.to_be_bytes(), pattern(b, 16384))?;
            }
            Ok::<_, DsError>(())
        })
        .unwrap();
    };
    write(&[0, 7]);
    tarn_dataset::snapshot(&tank, &["tank/vol@1".into()], false).unwrap();
    write(&[3]);
    tarn_dataset::snapshot(&tank, &["tank/vol@2".into()], false).unwrap();
    let vol_full = to_vec(&tank, "tank/vol@1", &SendOptions::default());
    let vol_incr = to_vec(&tank, "tank/vol@2", &incr("@1"));
    recv(&backup, "backup/vol", &vol_full, false).unwrap();

    let plaintext_in_raw = rewritten(
        &full_raw,
        |_| {},
        |own| {
            let (k, _) = own
                .iter()
                .find_map(|i| match i {
                    SendItem::Block(k, b) => Some((k.clone(), b.clone())),
                    _ => None,
                })
                .expect("a raw stream of files has blocks");
            vec![SendItem::Block(k, BlockPayload::Logical(vec![0x42; 4096]))]
        },
    );
    // A raw block of the encrypted dataset with its seal taken off and
    // plaintext put in: a downgrade the receiver must refuse (a reader
    // would otherwise take the bytes unauthenticated).
    let unsealed_in_raw = rewritten(
        &full_raw,
        |_| {},
        |own| {
            own.into_iter()
                .map(|i| match i {
                    SendItem::Block(k, BlockPayload::Raw(mut b)) => {
                        b.stored = vec![0x42; 4096];
                        b.lsize = 4096;
                        b.compress = 0;
                        b.seal = None;
                        SendItem::Block(k, BlockPayload::Raw(b))
                    }
                    other => other,
                })
                .collect()
        },
    );
    let long_source = rewritten(&vol_full, |h| h.info.dataset = "x".repeat(10_000), |o| o);
    let other_block = rewritten(
        &vol_incr,
        |h| {
            h.info.volume = Some(tarn_dataset::VolSpec {
                size: 4 << 20,
                block: 8192,
            })
        },
        |o| o,
    );
    let no_geometry = rewritten(&vol_incr, |h| h.info.volume = None, |o| o);
    let same_guid = rewritten(
        &vol_incr,
        |h| h.info.guid = h.info.from.as_ref().unwrap().guid,
        |o| o,
    );
    let cases: [(&str, &[u8], &str); 6] = [
        (
            "backup/evil",
            &plaintext_in_raw,
            "plaintext in a raw stream",
        ),
        (
            "backup/evil",
            &unsealed_in_raw,
            "an unsealed block in an encrypted raw stream",
        ),
        ("backup/long", &long_source, "a source name too long"),
        ("backup/vol", &other_block, "another block size"),
        ("backup/vol", &no_geometry, "no geometry"),
        ("backup/vol", &same_guid, "the base's guid again"),
    ];
    for (i, (target, stream, what)) in cases.into_iter().enumerate() {
        let r = recv(&backup, target, stream, false);
        assert!(
            matches!(
                r,
                Err(SendError::Dataset(DsError::Invalid(_) | DsError::Exists(_)))
            ),
            "{what}: {r:?}"
        );
        // The pool still commits changes.
        tarn_dataset::create(&backup, &format!("backup/ok{i}"), &props(&[]), false)
            .unwrap_or_else(|e| panic!("after {what}: {e}"));
    }
    assert!(tarn_dataset::open(&backup, "backup/evil").is_err());
    assert!(tarn_dataset::open(&backup, "backup/long").is_err());
    // The honest streams go in as before.
    recv(&backup, "backup/s", &full_raw, false).unwrap();
    recv(&backup, "backup/vol", &vol_incr, false).unwrap();
    assert_eq!(tree(&backup, "backup/vol@2"), tree(&tank, "tank/vol@2"));
    // With -F a refused stream destroys nothing: the rollback to the base
    // comes after every check.
    tarn_dataset::snapshot(&backup, &["backup/vol@local".into()], false).unwrap();
    let snaps = |p: &Arc<Pool>| -> Vec<String> {
        names(p)
            .into_iter()
            .filter(|n| n.starts_with("backup/vol@"))
            .collect()
    };
    let before = snaps(&backup);
    assert_eq!(before, ["backup/vol@1", "backup/vol@2", "backup/vol@local"]);
    for bad in [&other_block, &no_geometry] {
        assert!(recv(&backup, "backup/vol", bad, true).is_err());
        assert_eq!(snaps(&backup), before, "a refused -F stream rolled back");
    }
    // The honest stream with -F replaces the newer snapshots, its own
    // (same guid, after the base) included.
    recv(&backup, "backup/vol", &vol_incr, true).unwrap();
    assert_eq!(snaps(&backup), ["backup/vol@1", "backup/vol@2"]);
    assert_eq!(tree(&backup, "backup/vol@2"), tree(&tank, "tank/vol@2"));
    // A stream that continues a partial receive is checked as the first
    // one was: its geometry is what the volume ends with.
    recv(&backup, "backup/vol2", &vol_full, false).unwrap();
    let resumable = RecvOptions {
        force: false,
        resumable: true,
        ..Default::default()
    };
    let cut = &vol_incr[..vol_incr.len() - 8];
    assert!(receive(&backup, "backup/vol2", resumable, cut).is_err());
    for (bad, what) in [
        (&other_block, "another block size"),
        (&no_geometry, "no geometry"),
    ] {
        let r = receive(&backup, "backup/vol2", resumable, &bad[..]);
        assert!(
            matches!(r, Err(SendError::Dataset(DsError::Invalid(_)))),
            "{what}: {r:?}"
        );
    }
    receive(&backup, "backup/vol2", resumable, &vol_incr[..]).unwrap();
    assert_eq!(tree(&backup, "backup/vol2@2"), tree(&tank, "tank/vol@2"));
    let v = tarn_dataset::open(&backup, "backup/vol2").unwrap();
    assert_eq!(v.volume().unwrap().map(|s| s.block), Some(16384));
    assert!(backup.leak_check().unwrap().is_clean());
}

/// A stream read through `Read`, cut at byte `at` (the end of input
/// there), where `hook` runs first: what a user does while a receive
/// waits for the network.
struct CutWithHook<'a> {
    data: &'a [u8],
    pos: usize,
    at: usize,
    hook: Option<Box<dyn FnOnce() + 'a>>,
}

impl std::io::Read for CutWithHook<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos >= self.at {
            if let Some(h) = self.hook.take() {
                h();
            }
            return Ok(0);
        }
        let n = buf.len().min(self.at - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// While a stream is being received into a new dataset, nothing can be
/// made under it (a snapshot, a child, a clone) and a recursive snapshot
/// of its parent skips it; when the stream then breaks off, the receive
/// undoes itself, also after a rename, and the pool goes on. (A snapshot
/// made meanwhile used to stop the failed receive from destroying its
/// dataset, and the half-done undo stopped the pool.)
#[test]
fn nothing_is_made_under_a_receive_and_a_broken_one_undoes_itself() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0xab07);
    tarn_dataset::create(&tank, "tank/fs", &props(&[]), false).unwrap();
    let fs = mount(&tank, "tank/fs");
    populate(&fs, &mut rng);
    drop(fs);
    tarn_dataset::snapshot(&tank, &["tank/fs@a".into()], false).unwrap();
    let stream = to_vec(&tank, "tank/fs@a", &SendOptions::default());
    tarn_dataset::create(&backup, "backup/keep", &props(&[]), false).unwrap();
    tarn_dataset::snapshot(&backup, &["backup/keep@k".into()], false).unwrap();
    for rename in [false, true] {
        let seen: std::cell::RefCell<Vec<String>> = Default::default();
        let hook = || {
            let mut seen = seen.borrow_mut();
            let r = tarn_dataset::snapshot(&backup, &["backup/r@mid".into()], false);
            seen.push(format!("snapshot: {r:?}"));
            let r = tarn_dataset::create(&backup, "backup/r/child", &props(&[]), false);
            seen.push(format!("child: {r:?}"));
            let r = tarn_dataset::clone(&backup, "backup/keep@k", "backup/r/c", &props(&[]));
            seen.push(format!("clone: {r:?}"));
            let r = tarn_dataset::snapshot(&backup, &["backup@nightly".into()], true);
            seen.push(format!("recursive: {r:?}"));
            let r = tarn_dataset::snapshot(&backup, &["backup/r@own".into()], true);
            seen.push(format!("recursive from it: {r:?}"));
            let all = names(&backup);
            seen.push(format!("names: {all:?}"));
            if rename {
                let r = tarn_dataset::rename(&backup, "backup/r", "backup/moved");
                seen.push(format!("rename: {r:?}"));
            }
        };
        let input = CutWithHook {
            data: &stream,
            pos: 0,
            at: stream.len() / 2,
            hook: Some(Box::new(hook)),
        };
        let opts = RecvOptions {
            force: false,
            resumable: false,
            ..Default::default()
        };
        let r = receive(&backup, "backup/r", opts, input);
        let seen = seen.into_inner();
        assert!(matches!(r, Err(SendError::Stream(_))), "{r:?}; {seen:?}");
        for (i, what) in ["snapshot", "child", "clone"].iter().enumerate() {
            assert!(
                seen[i].starts_with(&format!("{what}: Err(Busy(")),
                "{seen:?}"
            );
        }
        assert_eq!(seen[3], "recursive: Ok(())", "{seen:?}");
        // Nothing left to take: refused, not reported as taken.
        assert!(
            seen[4].starts_with("recursive from it: Err(Busy("),
            "{seen:?}"
        );
        assert!(seen[5].contains("backup/keep@nightly"), "{seen:?}");
        assert!(!seen[5].contains("backup/r@"), "{seen:?}");
        if rename {
            assert_eq!(seen[6], "rename: Ok(())", "{seen:?}");
        }
        // Undone: the partial dataset is gone, whatever its name now.
        let all = names(&backup);
        assert!(
            !all.iter()
                .any(|n| n.starts_with("backup/r") || n.starts_with("backup/moved")),
            "{all:?}"
        );
        // The pool still commits changes and takes the whole stream.
        tarn_dataset::destroy(&backup, "backup@nightly", false).unwrap();
        tarn_dataset::destroy(&backup, "backup/keep@nightly", false).unwrap();
        recv(&backup, "backup/r", &stream, false).unwrap();
        assert_eq!(tree(&backup, "backup/r@a"), tree(&tank, "tank/fs@a"));
        tarn_dataset::destroy(&backup, "backup/r", true).unwrap();
    }
    assert!(backup.leak_check().unwrap().is_clean());
}

/// While an incremental stream is being received, a handle of its dataset
/// opened before can neither write nor read, its dataset cannot be
/// rolled back (that threw away part of the stream while the rest went
/// on arriving, and the snapshot it ended with did not hold what its
/// sender's did) and its base cannot be destroyed (without it the part
/// applied could not be undone); when the stream breaks off, the dataset
/// is back at the base.
#[test]
fn an_incremental_receive_keeps_its_base_and_cannot_be_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0xba5e);
    fs_at_a_and_b(&tank, &mut rng);
    recv(
        &backup,
        "backup/r",
        &to_vec(&tank, "tank/fs@a", &SendOptions::default()),
        false,
    )
    .unwrap();
    let inc = to_vec(&tank, "tank/fs@b", &incr("@a"));
    // Opened before the stream begins, as a share keeps a volume open.
    let early = tarn_dataset::open(&backup, "backup/r").unwrap();
    tarn_dataset::clone(&backup, "backup/r@a", "backup/c", &props(&[])).unwrap();
    let seen: std::cell::RefCell<Vec<String>> = Default::default();
    let hook = || {
        let mut seen = seen.borrow_mut();
        let w = early.txn::<_, DsError>(true, |t| t.put(b"stray", b"write"));
        seen.push(format!("write: {w:?}"));
        let r = early.txn::<_, DsError>(false, |t| t.get(b"stray"));
        seen.push(format!("read: {:?}", r.map(|_| ())));
        // The front ends' read from memory gives way to the refusal.
        let cached = early.try_block_refs(&[b"stray"]).is_some();
        seen.push(format!("cached: {cached}"));
        let r = tarn_dataset::promote(&backup, "backup/c");
        seen.push(format!("promote: {r:?}"));
        let r = tarn_dataset::rollback(&backup, "backup/r@a", true);
        seen.push(format!("rollback: {r:?}"));
        let r = tarn_dataset::check_rollback(&backup, "backup/r@a", true);
        seen.push(format!("check: {r:?}"));
        let r = tarn_dataset::destroy(&backup, "backup/r@a", false);
        seen.push(format!("destroy: {r:?}"));
    };
    let input = CutWithHook {
        data: &inc,
        pos: 0,
        at: inc.len() * 3 / 4,
        hook: Some(Box::new(hook)),
    };
    let r = receive(&backup, "backup/r", RecvOptions::default(), input);
    let seen = seen.into_inner();
    assert!(matches!(r, Err(SendError::Stream(_))), "{r:?}; {seen:?}");
    for (i, what) in [
        "write", "read", "", "promote", "rollback", "check", "destroy",
    ]
    .iter()
    .enumerate()
    {
        if what.is_empty() {
            assert_eq!(seen[i], "cached: false", "{seen:?}");
            continue;
        }
        assert!(
            seen[i].starts_with(&format!("{what}: Err(Busy(")),
            "{seen:?}"
        );
    }
    assert_eq!(tree(&backup, "backup/r"), tree(&tank, "tank/fs@a"));
    assert_eq!(tree(&backup, "backup/r@a"), tree(&tank, "tank/fs@a"));
    recv(&backup, "backup/r", &inc, false).unwrap();
    assert_eq!(tree(&backup, "backup/r@b"), tree(&tank, "tank/fs@b"));
    // Once the stream is complete, the early handle works again.
    early
        .txn::<_, DsError>(true, |t| t.put(b"after", b"the receive"))
        .unwrap();
    assert!(backup.leak_check().unwrap().is_clean());
}

/// Writes an encrypted copy fsynced before a crash, parked at import for
/// want of its key, are changes since its last snapshot: a raw
/// incremental stream is refused without `-F` (a later key load would
/// replay them over the received state), and with `-F` they go with the
/// rollback, so the key then opens exactly the stream's snapshot.
#[test]
fn a_raw_incremental_over_a_parked_log_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0x9a4c);
    encrypted(&tank, "tank/s", PASS, &[]);
    let fs = mount(&tank, "tank/s");
    populate(&fs, &mut rng);
    tarn_dataset::snapshot(&tank, &["tank/s@1".into()], false).unwrap();
    change(&fs, &mut rng, 3);
    tarn_dataset::snapshot(&tank, &["tank/s@2".into()], false).unwrap();
    drop(fs);
    let raw = SendOptions {
        raw: true,
        ..Default::default()
    };
    recv(&backup, "backup/s", &to_vec(&tank, "tank/s@1", &raw), false).unwrap();
    // On the copy: the key loaded, a write fsynced (in the intent log
    // only), then a crash, and an import without the key.
    tarn_dataset::load_key(&backup, "backup/s", &passphrase(PASS)).unwrap();
    let copy = mount(&backup, "backup/s");
    let c = Cred::root();
    let f = tarn_testkit::datasets::new_file(&copy, "written-after-1");
    copy.write(f, 0, &pattern(5, 300 << 10), false, &c).unwrap();
    copy.fsync(f).unwrap();
    drop(copy);
    backup.abandon();
    drop(backup);
    let backup = attached(
        tarn_testkit::pools::try_import(&[dir.path()], "backup", true, tarn_testkit::pools::opts())
            .expect("import"),
    );
    assert!(tarn_dataset::parked_records(&backup, "backup/s").unwrap() > 0);
    let incremental = to_vec(
        &tank,
        "tank/s@2",
        &SendOptions {
            from: Some("@1".into()),
            raw: true,
            ..Default::default()
        },
    );
    let r = recv(&backup, "backup/s", &incremental, false);
    assert!(
        matches!(r, Err(SendError::Dataset(DsError::Busy(_)))),
        "{r:?}"
    );
    assert!(tarn_dataset::parked_records(&backup, "backup/s").unwrap() > 0);
    recv(&backup, "backup/s", &incremental, true).unwrap();
    assert_eq!(
        tarn_dataset::parked_records(&backup, "backup/s").unwrap(),
        0
    );
    tarn_dataset::load_key(&backup, "backup/s", &passphrase(PASS)).unwrap();
    assert_eq!(tree(&backup, "backup/s"), tree(&tank, "tank/s@2"));
    assert!(backup.leak_check().unwrap().is_clean());
}

/// A dataset below whose `@from` was taken after its `@want` (destroyed
/// and taken again) cannot be sent incrementally: the package is refused
/// rather than sent without it, which would leave the receiver without
/// that dataset's `@want` and call the replica complete.
#[test]
fn a_package_whose_child_base_is_newer_than_its_target_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, _backup) = pools(dir.path());
    for n in ["tank/home", "tank/home/kids"] {
        tarn_dataset::create(&tank, n, &props(&[]), false).unwrap();
    }
    tarn_dataset::snapshot(&tank, &["tank/home@mon".into()], true).unwrap();
    tarn_dataset::snapshot(&tank, &["tank/home@tue".into()], true).unwrap();
    tarn_dataset::destroy(&tank, "tank/home/kids@mon", false).unwrap();
    tarn_dataset::snapshot(&tank, &["tank/home/kids@mon".into()], false).unwrap();
    let e = send(
        &tank,
        "tank/home@tue",
        &replicate(Some("mon"), false, false),
        &mut Vec::new(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("tank/home/kids"), "{e}");
}

/// A raw receive into an encrypted dataset, cut and resumed with a
/// stream that carries no key (a resume made from an unencrypted copy of
/// the snapshot, or edited): refused as a fresh incremental would be,
/// before any of its entries lands in the encrypted dataset unsealed.
/// The honest resume stream then finishes the receive.
#[test]
fn a_raw_resume_without_the_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0x7e5);
    encrypted_with_files(&tank, "tank/s", &mut rng);
    tarn_dataset::snapshot(&tank, &["tank/s@1".into()], false).unwrap();
    let resumable = RecvOptions {
        force: false,
        resumable: true,
        ..Default::default()
    };
    let whole = to_vec(&tank, "tank/s@1", &raw_stream());
    // Cut it where the receive has made the dataset and saved a token.
    let token = cut_until_resumable(&backup, "backup/s", &whole, &mut rng);
    let resume = to_vec(
        &tank,
        "tank/s@1",
        &SendOptions {
            token: Some(token),
            ..raw_stream()
        },
    );
    let keyless = rewritten(&resume, |h| h.info.key = None, |own| own);
    let r = receive(&backup, "backup/s", resumable, &keyless[..]);
    assert!(
        matches!(&r, Err(SendError::Dataset(DsError::Invalid(m))) if m.contains("raw")),
        "{r:?}"
    );
    receive(&backup, "backup/s", resumable, &resume[..]).expect("the honest resume");
    tarn_dataset::load_key(&backup, "backup/s", &passphrase(PASS)).unwrap();
    assert_eq!(tree(&backup, "backup/s@1"), tree(&tank, "tank/s@1"));
}

/// `send -t` resumes from the token's own dataset. A pool that also holds
/// a copy of the snapshot under another name (the same guid: received
/// copies keep it) resumed from whichever record came first, and a copy
/// that had let go of the base snapshot made the resume fail for good.
#[test]
fn a_resume_token_is_sent_from_its_own_dataset_not_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let (tank, backup) = pools(dir.path());
    let mut rng = Rng::new(0x70c);
    // tank/orig at @a and @b; tank/fs, a copy of both, is what the
    // offsite box receives from; then tank/orig lets go of @a.
    let fs = tarn_testkit::datasets::filesystem(&tank, "tank/orig", &[]);
    populate(&fs, &mut rng);
    tarn_dataset::snapshot(&tank, &["tank/orig@a".into()], false).unwrap();
    change(&fs, &mut rng, 0);
    tarn_dataset::snapshot(&tank, &["tank/orig@b".into()], false).unwrap();
    drop(fs);
    recv(
        &tank,
        "tank/fs",
        &to_vec(&tank, "tank/orig@a", &SendOptions::default()),
        false,
    )
    .unwrap();
    recv(
        &tank,
        "tank/fs",
        &to_vec(&tank, "tank/orig@b", &incr("@a")),
        false,
    )
    .unwrap();
    tarn_dataset::destroy(&tank, "tank/orig@a", false).unwrap();

    recv(
        &backup,
        "backup/off",
        &to_vec(&tank, "tank/fs@a", &SendOptions::default()),
        false,
    )
    .unwrap();
    let resumable = RecvOptions {
        force: false,
        resumable: true,
        ..Default::default()
    };
    let whole = to_vec(&tank, "tank/fs@b", &incr("@a"));
    let token = cut_until_resumable(&backup, "backup/off", &whole, &mut rng);
    let resume = SendOptions {
        token: Some(token),
        ..Default::default()
    };
    let mut stream = Vec::new();
    send(&tank, "", &resume, &mut stream).expect("the resume stream, from tank/fs");
    receive(&backup, "backup/off", resumable, &stream[..]).expect("the resumed receive");
    assert_eq!(tree(&backup, "backup/off@b"), tree(&tank, "tank/fs@b"));
}

/// Receives `stream` into `target` (resumable) cut in its second half,
/// until a cut leaves a resume token; the token.
fn cut_until_resumable(backup: &Arc<Pool>, target: &str, stream: &[u8], rng: &mut Rng) -> String {
    let resumable = RecvOptions {
        force: false,
        resumable: true,
        ..Default::default()
    };
    (0..50)
        .find_map(|_| {
            let cut = rng.range(stream.len() as u64 / 2, stream.len() as u64) as usize;
            assert!(receive(backup, target, resumable, &stream[..cut]).is_err());
            let t = tarn_dataset::get_props(backup, target, &["receive_resume_token".into()])
                .ok()?[0]
                .value
                .clone();
            (t != "-").then_some(t)
        })
        .expect("a cut that leaves a resumable receive")
}
