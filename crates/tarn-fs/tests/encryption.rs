//! Encrypted datasets through the POSIX layer on real member files: no
//! plaintext (data, names, attributes, symlink targets, intent log
//! records) reaches a device, keys are checked and changed without
//! rewriting data, locked datasets refuse access while scrub and
//! snapshots go on, and the intent log of a locked dataset waits for its
//! key.
//!
//! A "crash" drops every handle to the pool without exporting it (the txg
//! interval is an hour), as in `zil.rs`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tarn_dataset::{DsError, KeyStatus};
use tarn_fs::{Cred, ROOT_INO};
use tarn_pool::{Pool, PoolOptions};
use tarn_testkit::data::Rng;
use tarn_testkit::datasets::{encrypted, find_in_devices, mount, new_file, passphrase, DsFs};
use tarn_testkit::pools::{attached, create, opts, scrub};
use tarn_vdev::VdevKind;

const PASS: &str = "correct horse battery staple";

fn devices(dir: &Path, n: usize) -> Vec<PathBuf> {
    tarn_testkit::files::make(dir, "d", n, 96 << 20)
}

fn import(dir: &Path) -> Arc<Pool> {
    let opts = PoolOptions { ..opts() };
    attached(tarn_testkit::pools::try_import(&[dir], "tank", true, opts).expect("import"))
}

/// A mirror of two files with `tank/s` encrypted (128K records), mounted.
fn mirror_with_encrypted(dir: &Path) -> (Arc<Pool>, DsFs) {
    let devs = devices(dir, 2);
    let pool = attached(create("tank", VdevKind::Mirror, &devs, &[]).unwrap());
    encrypted(&pool, "tank/s", PASS, &[("recordsize", "128K")]);
    let fs = mount(&pool, "tank/s");
    (pool, fs)
}

fn content(fs: &DsFs, dir: u64, name: &str) -> Option<Vec<u8>> {
    let c = Cred::root();
    let a = fs.lookup(dir, name.as_bytes(), &c).ok()?;
    let mut out = Vec::new();
    loop {
        let chunk = fs.read(a.ino, out.len() as u64, 1 << 20).expect("read");
        if chunk.is_empty() {
            break;
        }
        out.extend_from_slice(&chunk);
    }
    Some(out)
}

/// Unique canary strings of one dataset, and what was written with them.
struct Canaries {
    needles: Vec<Vec<u8>>,
}

impl Canaries {
    fn new(rng: &mut Rng, tag: &str, n: usize) -> Canaries {
        let needles = (0..n)
            .map(|i| format!("CANARY-{tag}-{i}-{:016x}", rng.next_u64()).into_bytes())
            .collect();
        Canaries { needles }
    }

    fn s(&self, i: usize) -> String {
        String::from_utf8(self.needles[i].clone()).expect("ascii")
    }

    /// Besides each canary: the first bytes of its data block compressed
    /// with lz4, as a block of the file would be stored.
    fn with_compressed(&self, blocks: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut out = self.needles.clone();
        for b in blocks {
            let c = lz4_flex::block::compress(b);
            out.push(c[..24.min(c.len())].to_vec());
        }
        out
    }
}

/// Writes every kind of thing a filesystem stores, each carrying canaries:
/// file data (compressible, and one large file), file and directory
/// names, xattr names and values (small and large), short and long
/// symlink targets. Returns the data blocks written (for their compressed
/// forms). With `fsync`, the files are fsynced (the intent log).
fn fill(fs: &DsFs, cn: &Canaries, fsync: bool) -> Vec<Vec<u8>> {
    let c = Cred::root();
    let dir = fs
        .mkdir(ROOT_INO, cn.s(0).as_bytes(), 0o755, 0, &c)
        .expect("mkdir")
        .ino;
    // Compressible: the canary many times, some text between.
    let small: Vec<u8> = cn.s(1).repeat(300).into_bytes();
    let f = fs
        .create(
            dir,
            cn.s(2).as_bytes(),
            libc::S_IFREG | 0o644,
            0,
            libc::O_RDWR,
            &c,
        )
        .expect("create")
        .ino;
    fs.write(f, 0, &small, false, &c).expect("write");
    // Large: 1 MiB of records written in place by an fsync.
    let mut big = cn.s(3).repeat((1 << 20) / cn.s(3).len() + 1).into_bytes();
    big.truncate(1 << 20);
    let g = fs
        .create(
            ROOT_INO,
            cn.s(4).as_bytes(),
            libc::S_IFREG | 0o644,
            0,
            libc::O_RDWR,
            &c,
        )
        .expect("create")
        .ino;
    fs.write(g, 0, &big, false, &c).expect("write big");
    fs.setxattr(
        f,
        format!("user.{}", cn.s(5)).as_bytes(),
        cn.s(6).as_bytes(),
        0,
        &c,
    )
    .expect("setxattr");
    let large_value = cn.s(ONLY_COMPRESSED).repeat(200).into_bytes();
    fs.setxattr(g, b"user.large", &large_value, 0, &c)
        .expect("setxattr large");
    fs.symlink(ROOT_INO, cn.s(8).as_bytes(), cn.s(9).as_bytes(), &c)
        .expect("symlink");
    let long_target = cn.s(10).repeat(40).into_bytes();
    fs.symlink(dir, b"long", &long_target, &c)
        .expect("long symlink");
    if fsync {
        fs.fsync(f).expect("fsync");
        fs.fsync(g).expect("fsync");
    }
    fs.release(f).unwrap();
    fs.release(g).unwrap();
    // The large xattr is a data block of its own: a tag, the name's
    // length, the name, then the value (format.md), compressed as a whole.
    let mut xattr_block = vec![1u8, b"user.large".len() as u8];
    xattr_block.extend_from_slice(b"user.large");
    xattr_block.extend_from_slice(&large_value);
    vec![small, big[..128 << 10].to_vec(), xattr_block]
}

fn check_readable(fs: &DsFs, cn: &Canaries) {
    let c = Cred::root();
    let dir = fs
        .lookup(ROOT_INO, cn.s(0).as_bytes(), &c)
        .expect("dir")
        .ino;
    assert_eq!(
        content(fs, dir, &cn.s(2)).expect("small file"),
        cn.s(1).repeat(300).into_bytes()
    );
    let big = content(fs, ROOT_INO, &cn.s(4)).expect("big file");
    assert_eq!(big.len(), 1 << 20);
    assert!(big.starts_with(cn.s(3).as_bytes()));
    let f = fs.lookup(dir, cn.s(2).as_bytes(), &c).unwrap().ino;
    assert_eq!(
        fs.getxattr(f, format!("user.{}", cn.s(5)).as_bytes(), &c)
            .unwrap(),
        cn.s(6).into_bytes()
    );
    let l = fs.lookup(ROOT_INO, cn.s(8).as_bytes(), &c).unwrap().ino;
    assert_eq!(fs.readlink(l).unwrap(), cn.s(9).into_bytes());
    let l = fs.lookup(dir, b"long", &c).unwrap().ino;
    assert_eq!(fs.readlink(l).unwrap(), cn.s(10).repeat(40).into_bytes());
    let names: Vec<Vec<u8>> = fs
        .readdir(ROOT_INO, 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&cn.s(0).into_bytes()), "{names:?}");
}

/// The canaries of `secret` are nowhere on the devices; those of `plain`
/// (the same kinds of things, unencrypted) are, which shows the search
/// can find them.
fn assert_sealed(devs: &[PathBuf], secret: &[Vec<u8>], plain: &[Vec<u8>], when: &str) {
    let hits = find_in_devices(devs, secret);
    assert!(
        hits.is_empty(),
        "{when}: {} plaintext pieces of the encrypted dataset on the devices, first: {:?}",
        hits.len(),
        hits.first()
            .map(|(i, f, o)| (String::from_utf8_lossy(&secret[*i]).to_string(), f, o))
    );
    let found: std::collections::BTreeSet<usize> = find_in_devices(devs, plain)
        .into_iter()
        .map(|h| h.0)
        .collect();
    // Every canary of the unencrypted dataset is found, except perhaps
    // the large xattr value's text, which reaches the devices only
    // compressed (its compressed block is a needle of its own after the
    // txgs, see `fill`). Named, not counted: losing another one would
    // mean the search could miss what it looks for.
    let missed: Vec<String> = (0..plain.len())
        .filter(|i| *i != ONLY_COMPRESSED && !found.contains(i))
        .map(|i| String::from_utf8_lossy(&plain[i]).to_string())
        .collect();
    assert!(
        missed.is_empty(),
        "{when}: the search did not find these canaries of the unencrypted dataset: {missed:?}"
    );
}

/// The canary `fill` writes only as the large xattr's value.
const ONLY_COMPRESSED: usize = 7;

#[test]
fn nothing_of_an_encrypted_dataset_reaches_the_devices_in_the_clear() {
    let dir = tempfile::tempdir().unwrap();
    let devs = devices(dir.path(), 4);
    let pool = attached(create("tank", VdevKind::Raidz { parity: 1 }, &devs, &[]).unwrap());
    let mut rng = Rng::new(0x5ea1ed);
    let secret = Canaries::new(&mut rng, "S", 11);
    let plain = Canaries::new(&mut rng, "P", 11);
    encrypted(&pool, "tank/secret", PASS, &[("compression", "lz4")]);
    tarn_dataset::create(&pool, "tank/plain", &tarn_testkit::pools::props(&[]), false).unwrap();
    let s = mount(&pool, "tank/secret");
    let p = mount(&pool, "tank/plain");
    // Only the intent log holds the files now: a crash follows.
    let sb = fill(&s, &secret, true);
    let pb = fill(&p, &plain, true);
    let secret_all = secret.with_compressed(&sb);
    let plain_all = plain.with_compressed(&pb);
    drop((s, p));
    pool.abandon();
    assert_sealed(
        &devs,
        &secret_all,
        &plain.needles,
        "intent log after a crash",
    );
    // Import: the plain dataset's log is replayed, the encrypted one's
    // parked (no key at import), then replayed when the key is loaded.
    let pool = import(dir.path());
    let info = tarn_testkit::datasets::info(&pool, "tank/secret");
    assert_eq!(info.keystatus.as_deref(), Some("unavailable"));
    assert_eq!(info.encryption.as_deref(), Some("aes-256-gcm"));
    assert_eq!(info.encryptionroot.as_deref(), Some("tank/secret"));
    check_readable(&mount(&pool, "tank/plain"), &plain);
    assert_sealed(&devs, &secret_all, &plain.needles, "parked at import");
    let replayed = tarn_dataset::load_key(&pool, "tank/secret", &passphrase(PASS)).unwrap();
    // The first fsync logged everything pending in the dataset: one record.
    assert_eq!(replayed, 1, "the parked record");
    let s = mount(&pool, "tank/secret");
    check_readable(&s, &secret);
    // More of everything, committed by txgs this time.
    let more = Canaries::new(&mut rng, "T", 11);
    let mb = fill(&s, &more, false);
    pool.sync().unwrap();
    let leaks = pool.leak_check().unwrap();
    assert!(leaks.is_clean(), "{leaks:?}");
    drop(s);
    pool.export(false).unwrap();
    let mut all = secret_all.clone();
    all.extend(more.with_compressed(&mb));
    assert_sealed(&devs, &all, &plain_all, "after txgs and export");
}

#[test]
fn keys_are_checked_changed_without_rewriting_and_survive_export() {
    let dir = tempfile::tempdir().unwrap();
    let devs = devices(dir.path(), 1);
    let pool = attached(create("tank", VdevKind::Single, &devs, &[]).unwrap());
    encrypted(
        &pool,
        "tank/s",
        PASS,
        &[("encryption", "chacha20-poly1305")],
    );
    let fs = mount(&pool, "tank/s");
    let f = new_file(&fs, "f");
    let data = tarn_testkit::data::pattern(7, 300_000);
    fs.write(f, 0, &data, false, &Cred::root()).unwrap();
    fs.release(f).unwrap();
    drop(fs);
    pool.sync().unwrap();
    // The pool says it holds sealed data: a build without encryption
    // refuses to import it.
    assert!(
        pool.props().features.iter().any(|f| f == "encryption"),
        "{:?}",
        pool.props().features
    );
    let blocks_before = tarn_dataset::blocks(&pool, "tank/s").unwrap();
    assert!(blocks_before
        .iter()
        .all(|b| b.is_encrypted() || b.btype != tarn_block::BlockType::Data));
    assert!(blocks_before.iter().any(|b| b.is_encrypted()));
    tarn_dataset::unload_key(&pool, "tank/s").unwrap();
    let wrong = tarn_dataset::load_key(&pool, "tank/s", &passphrase("not the passphrase"));
    assert!(matches!(wrong, Err(DsError::WrongKey(_))), "{wrong:?}");
    let short = tarn_dataset::load_key(&pool, "tank/s", &passphrase("short"));
    assert!(matches!(short, Err(DsError::Invalid(_))), "{short:?}");
    tarn_dataset::load_key(&pool, "tank/s", &passphrase(PASS)).unwrap();
    assert!(matches!(
        tarn_dataset::load_key(&pool, "tank/s", &passphrase(PASS)),
        Err(DsError::Busy(_))
    ));
    // A new passphrase: the blocks are the same blocks.
    tarn_dataset::change_key(&pool, "tank/s", &passphrase("a brand new passphrase")).unwrap();
    pool.sync().unwrap();
    assert_eq!(
        tarn_dataset::blocks(&pool, "tank/s").unwrap(),
        blocks_before
    );
    pool.export(false).unwrap();
    let pool = import(dir.path());
    assert_eq!(
        tarn_testkit::datasets::info(&pool, "tank/s")
            .keystatus
            .as_deref(),
        Some("unavailable")
    );
    assert!(matches!(
        tarn_dataset::load_key(&pool, "tank/s", &passphrase(PASS)),
        Err(DsError::WrongKey(_))
    ));
    tarn_dataset::load_key(&pool, "tank/s", &passphrase("a brand new passphrase")).unwrap();
    let fs = mount(&pool, "tank/s");
    assert_eq!(content(&fs, ROOT_INO, "f").unwrap(), data);
    // A raw key, hex.
    let hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let input = tarn_dataset::KeyInput::new(
        tarn_dataset::KeyFormat::Hex,
        "file:///etc/tarn/s.key",
        hex.as_bytes().to_vec(),
    );
    tarn_dataset::change_key(&pool, "tank/s", &input).unwrap();
    drop(fs);
    tarn_dataset::unload_key(&pool, "tank/s").unwrap();
    let bad = tarn_dataset::KeyInput::new(
        tarn_dataset::KeyFormat::Hex,
        "file:///etc/tarn/s.key",
        hex.replace('0', "1").into_bytes(),
    );
    assert!(matches!(
        tarn_dataset::load_key(&pool, "tank/s", &bad),
        Err(DsError::WrongKey(_))
    ));
    tarn_dataset::load_key(&pool, "tank/s", &input).unwrap();
    let fs = mount(&pool, "tank/s");
    assert_eq!(content(&fs, ROOT_INO, "f").unwrap(), data);
    let props = tarn_dataset::get_props(&pool, "tank/s", &[]).unwrap();
    let get = |n: &str| {
        props
            .iter()
            .find(|p| p.property == n)
            .unwrap()
            .value
            .clone()
    };
    assert_eq!(get("keyformat"), "hex");
    assert_eq!(get("keylocation"), "file:///etc/tarn/s.key");
    assert_eq!(get("encryption"), "chacha20-poly1305");
    assert_eq!(get("keystatus"), "available");
}

#[test]
fn damage_to_ciphertext_is_repaired_or_eio_never_wrong_bytes() {
    for kind in [VdevKind::Single, VdevKind::Mirror] {
        let dir = tempfile::tempdir().unwrap();
        let n = if kind == VdevKind::Single { 1 } else { 2 };
        let devs = devices(dir.path(), n);
        let pool = attached(create("tank", kind, &devs, &[]).unwrap());
        encrypted(&pool, "tank/s", PASS, &[("compression", "off")]);
        let fs = mount(&pool, "tank/s");
        let f = new_file(&fs, "f");
        let data = tarn_testkit::data::pattern(3, 8192);
        fs.write(f, 0, &data, false, &Cred::root()).unwrap();
        fs.release(f).unwrap();
        pool.sync().unwrap();
        let bp = tarn_dataset::blocks(&pool, "tank/s")
            .unwrap()
            .into_iter()
            .find(|b| b.lsize == 8192 && b.is_encrypted())
            .expect("the encrypted data block");
        // One flipped bit in the ciphertext of the first copy.
        let at = tarn_vdev::DATA_START + bp.dvas[0].offset + 100;
        let mut b = [0u8; 1];
        {
            use std::os::unix::fs::FileExt;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&devs[0])
                .unwrap();
            file.read_exact_at(&mut b, at).unwrap();
            b[0] ^= 0x10;
            file.write_all_at(&b, at).unwrap();
        }
        pool.evict_cache();
        let got = fs.read(f, 0, 8192);
        match kind {
            VdevKind::Single => {
                let e = got.expect_err("a damaged block without redundancy");
                assert_eq!(e.errno(), libc::EIO, "{e}");
            }
            _ => assert_eq!(got.unwrap(), data, "repaired from the other side"),
        }
    }
}

#[test]
fn a_locked_dataset_refuses_access_while_scrub_and_snapshots_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let devs = devices(dir.path(), 3);
    let pool = attached(create("tank", VdevKind::Raidz { parity: 1 }, &devs, &[]).unwrap());
    encrypted(&pool, "tank/s", PASS, &[]);
    let fs = mount(&pool, "tank/s");
    let f = new_file(&fs, "f");
    let data = tarn_testkit::data::pattern(9, 500_000);
    fs.write(f, 0, &data, false, &Cred::root()).unwrap();
    fs.release(f).unwrap();
    drop(fs);
    tarn_dataset::snapshot(&pool, &["tank/s@one".into()], false).unwrap();
    tarn_dataset::unload_key(&pool, "tank/s").unwrap();
    // Every way in is refused.
    let h = tarn_dataset::open(&pool, "tank/s").unwrap();
    let r = h.txn(false, |t| t.get(b"anything"));
    assert!(matches!(r, Err(DsError::Locked(_))), "{r:?}");
    let snap = tarn_dataset::open(&pool, "tank/s@one").unwrap();
    assert!(matches!(
        snap.txn(false, |t| t.get(b"x")),
        Err(DsError::Locked(_))
    ));
    let e = tarn_fs::Fs::mount(Arc::new(tarn_fs::DatasetBackend::new(h))).err();
    assert_eq!(e.map(|e| e.errno()), Some(libc::EACCES));
    // What needs no key goes on.
    let s = scrub(&pool);
    assert_eq!(s.errors, 0, "{s:?}");
    assert!(s.examined_bytes > 500_000, "{s:?}");
    tarn_dataset::snapshot(&pool, &["tank/s@two".into()], false).unwrap();
    tarn_dataset::destroy(&pool, "tank/s@one", false).unwrap();
    tarn_dataset::rename(&pool, "tank/s", "tank/t").unwrap();
    assert!(pool.leak_check().unwrap().is_clean());
    // A device replaced while the key is away: the resilver rebuilds the
    // ciphertext.
    let spare = tarn_testkit::files::make(dir.path(), "spare", 1, 96 << 20).remove(0);
    pool.replace(devs[1].to_str().unwrap(), &spare, false)
        .unwrap();
    let s = tarn_testkit::pools::wait_scan(&pool);
    assert_eq!(s.errors, 0, "{s:?}");
    assert!(
        s.repaired_bytes > 0,
        "the resilver wrote the new device: {s:?}"
    );
    std::fs::remove_file(&devs[1]).unwrap();
    tarn_dataset::load_key(&pool, "tank/t", &passphrase(PASS)).unwrap();
    let fs = mount(&pool, "tank/t");
    assert_eq!(content(&fs, ROOT_INO, "f").unwrap(), data);
    let s = scrub(&pool);
    assert_eq!((s.errors, s.repaired_bytes), (0, 0), "{s:?}");
}

#[test]
fn children_inherit_the_key_and_clones_share_it() {
    let dir = tempfile::tempdir().unwrap();
    let devs = devices(dir.path(), 1);
    let pool = attached(create("tank", VdevKind::Single, &devs, &[]).unwrap());
    encrypted(&pool, "tank/s", PASS, &[]);
    let props = tarn_testkit::pools::props;
    tarn_dataset::create(&pool, "tank/s/child", &props(&[]), false).unwrap();
    tarn_dataset::create_volume(
        &pool,
        "tank/s/vol",
        tarn_dataset::VolSpec {
            size: 1 << 20,
            block: 16384,
        },
        true,
        &props(&[]),
        false,
    )
    .unwrap();
    // Off inside an encrypted dataset, or another cipher without a key of
    // its own, is refused; a key of its own makes a new root.
    let off = tarn_dataset::create(&pool, "tank/s/x", &props(&[("encryption", "off")]), false);
    assert!(matches!(off, Err(DsError::Invalid(_))), "{off:?}");
    let other = tarn_dataset::create(
        &pool,
        "tank/s/y",
        &props(&[("encryption", "aes-128-gcm")]),
        false,
    );
    assert!(matches!(other, Err(DsError::Invalid(_))), "{other:?}");
    encrypted(&pool, "tank/s/own", "another passphrase", &[]);
    let child = tarn_dataset::open(&pool, "tank/s/child").unwrap();
    let fs = mount(&pool, "tank/s/child");
    let f = new_file(&fs, "f");
    fs.write(f, 0, b"in the child", false, &Cred::root())
        .unwrap();
    fs.release(f).unwrap();
    drop(fs);
    tarn_dataset::snapshot(&pool, &["tank/s/child@a".into()], false).unwrap();
    tarn_dataset::clone(&pool, "tank/s/child@a", "tank/elsewhere", &props(&[])).unwrap();
    let clone_key = tarn_dataset::clone(
        &pool,
        "tank/s/child@a",
        "tank/e2",
        &props(&[("keyformat", "raw")]),
    );
    assert!(matches!(clone_key, Err(DsError::Invalid(_))));
    let info = |n: &str| tarn_testkit::datasets::info(&pool, n);
    for n in [
        "tank/s/child",
        "tank/s/vol",
        "tank/elsewhere",
        "tank/s/child@a",
    ] {
        assert_eq!(info(n).encryptionroot.as_deref(), Some("tank/s"), "{n}");
    }
    assert_eq!(
        info("tank/s/own").encryptionroot.as_deref(),
        Some("tank/s/own")
    );
    assert_eq!(info("tank").encryption, None);
    // Moving an inheriting child out of its root is refused; an
    // unencrypted dataset cannot move in.
    let out = tarn_dataset::rename(&pool, "tank/s/child", "tank/child");
    assert!(matches!(out, Err(DsError::Invalid(_))), "{out:?}");
    tarn_dataset::create(&pool, "tank/plain", &props(&[]), false).unwrap();
    let inside = tarn_dataset::rename(&pool, "tank/plain", "tank/s/plain");
    assert!(matches!(inside, Err(DsError::Invalid(_))), "{inside:?}");
    tarn_dataset::rename(&pool, "tank/s/own", "tank/own").unwrap();
    // A child names its root to load a key.
    assert!(matches!(
        tarn_dataset::load_key(&pool, "tank/s/child", &passphrase(PASS)),
        Err(DsError::Invalid(_))
    ));
    tarn_dataset::unload_key(&pool, "tank/s").unwrap();
    for n in ["tank/s/child", "tank/s/vol", "tank/elsewhere"] {
        assert_eq!(info(n).keystatus.as_deref(), Some("unavailable"), "{n}");
    }
    assert_eq!(info("tank/own").keystatus.as_deref(), Some("available"));
    assert!(matches!(
        child.txn(false, |t| t.get(b"k")),
        Err(DsError::Locked(_))
    ));
    // A child inheriting a locked key cannot be created.
    let locked = tarn_dataset::create(&pool, "tank/s/z", &props(&[]), false);
    assert!(matches!(locked, Err(DsError::Locked(_))), "{locked:?}");
    let roots = tarn_dataset::encryption_roots(&pool, None).unwrap();
    let names: Vec<(&str, bool)> = roots.iter().map(|r| (r.0.as_str(), r.1)).collect();
    assert_eq!(names, [("tank/own", true), ("tank/s", false)]);
    tarn_dataset::load_key(&pool, "tank/s", &passphrase(PASS)).unwrap();
    let fs = mount(&pool, "tank/elsewhere");
    assert_eq!(content(&fs, ROOT_INO, "f").unwrap(), b"in the child");
    drop(fs);
    // The clone outlives its origin's root after a promote: the key
    // record stays, and moves to a dataset that still uses it.
    tarn_dataset::promote(&pool, "tank/elsewhere").unwrap();
    tarn_dataset::destroy(&pool, "tank/s", true).unwrap();
    assert_eq!(
        info("tank/elsewhere").encryptionroot.as_deref(),
        Some("tank/elsewhere")
    );
    tarn_dataset::unload_key(&pool, "tank/elsewhere").unwrap();
    tarn_dataset::load_key(&pool, "tank/elsewhere", &passphrase(PASS)).unwrap();
    assert!(pool.leak_check().unwrap().is_clean());
    let _ = KeyStatus::None;
}

#[test]
fn a_parked_intent_log_replays_at_key_load_and_a_rollback_drops_it() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, fs) = mirror_with_encrypted(dir.path());
    let c = Cred::root();
    let base = new_file(&fs, "base");
    fs.write(base, 0, b"committed", false, &c).unwrap();
    fs.release(base).unwrap();
    pool.sync().unwrap();
    tarn_dataset::snapshot(&pool, &["tank/s@before".into()], false).unwrap();
    // Logged only: a small file (copied into the log), a 512 KiB file
    // (written in place, referenced), a patch of the committed file.
    let small = new_file(&fs, "small");
    fs.write(small, 0, b"small and fsynced", false, &c).unwrap();
    fs.fsync(small).unwrap();
    let big = new_file(&fs, "big");
    let bigdata = tarn_testkit::data::pattern(11, 512 << 10);
    fs.write(big, 0, &bigdata, false, &c).unwrap();
    fs.fsync(big).unwrap();
    let base = fs.lookup(ROOT_INO, b"base", &c).unwrap().ino;
    fs.open(base, libc::O_RDWR, &c).unwrap();
    fs.write(base, 2, b"MMIT", false, &c).unwrap();
    fs.fsync(base).unwrap();
    drop(fs);
    pool.abandon();
    // Crash. Import parks the records; a snapshot taken while locked does
    // not hold them; the key load replays them as new blocks.
    let pool = import(dir.path());
    tarn_dataset::snapshot(&pool, &["tank/s@locked".into()], false).unwrap();
    let s = scrub(&pool);
    assert_eq!(s.errors, 0, "parked records scrub clean: {s:?}");
    assert!(
        pool.leak_check().unwrap().is_clean(),
        "parked blocks are accounted for"
    );
    assert_eq!(
        tarn_dataset::load_key(&pool, "tank/s", &passphrase(PASS)).unwrap(),
        3
    );
    let fs = mount(&pool, "tank/s");
    assert_eq!(
        content(&fs, ROOT_INO, "small").unwrap(),
        b"small and fsynced"
    );
    assert_eq!(content(&fs, ROOT_INO, "big").unwrap(), bigdata);
    assert_eq!(content(&fs, ROOT_INO, "base").unwrap(), b"coMMITted");
    drop(fs);
    pool.sync().unwrap();
    tarn_dataset::destroy(&pool, "tank/s@locked", false).unwrap();
    assert!(pool.leak_check().unwrap().is_clean());
    // Parked again after another crash, then dropped by a rollback.
    let fs = mount(&pool, "tank/s");
    let late = new_file(&fs, "late");
    fs.write(late, 0, b"never seen", false, &c).unwrap();
    fs.fsync(late).unwrap();
    drop(fs);
    pool.abandon();
    let pool = import(dir.path());
    assert_eq!(tarn_dataset::parked_records(&pool, "tank/s").unwrap(), 1);
    tarn_dataset::rollback(&pool, "tank/s@before", false).unwrap();
    assert_eq!(tarn_dataset::parked_records(&pool, "tank/s").unwrap(), 0);
    assert_eq!(
        tarn_dataset::load_key(&pool, "tank/s", &passphrase(PASS)).unwrap(),
        0
    );
    let fs = mount(&pool, "tank/s");
    assert_eq!(content(&fs, ROOT_INO, "late"), None);
    assert_eq!(content(&fs, ROOT_INO, "base").unwrap(), b"committed");
    drop(fs);
    pool.sync().unwrap();
    assert!(pool.leak_check().unwrap().is_clean());
}

/// The hash in a directory entry's key (which is not encrypted) is keyed
/// with the dataset's secret in an encrypted dataset: hashing a guessed
/// name does not find its entry. The unencrypted dataset shows the
/// unkeyed hash, so the check can fail.
#[test]
fn entry_keys_do_not_reveal_names() {
    let dir = tempfile::tempdir().unwrap();
    let devs = devices(dir.path(), 1);
    let pool = attached(create("tank", VdevKind::Single, &devs, &[]).unwrap());
    encrypted(&pool, "tank/s", PASS, &[]);
    tarn_dataset::create(&pool, "tank/p", &tarn_testkit::pools::props(&[]), false).unwrap();
    let unkeyed = {
        let h = blake3::hash(b"tax-return-2025.pdf");
        let b = h.as_bytes();
        u64::from_be_bytes([0, 0, 0, b[0], b[1], b[2], b[3], b[4]]) << 16
    };
    for (name, keyed) in [("tank/s", true), ("tank/p", false)] {
        let fs = mount(&pool, name);
        let f = new_file(&fs, "tax-return-2025.pdf");
        fs.release(f).unwrap();
        let h = tarn_dataset::open(&pool, name).unwrap();
        // Directory entries of the root (inode 1, kind 3).
        let mut lo = 1u64.to_be_bytes().to_vec();
        lo.push(3);
        let mut hi = lo.clone();
        hi[8] = 4;
        let keys: Vec<u64> = h
            .txn(false, |t| {
                t.range(
                    std::ops::Bound::Included(&lo[..]),
                    std::ops::Bound::Excluded(&hi[..]),
                    10,
                )
            })
            .unwrap()
            .into_iter()
            .map(|(k, _)| u64::from_be_bytes(k[9..17].try_into().unwrap()) & !0xffff)
            .collect();
        assert_eq!(keys.len(), 1, "{name}");
        assert_eq!(keys[0] == unkeyed, !keyed, "{name}: the entry's hash");
        // One name in two directories: the same hash only when unkeyed.
        let c = Cred::root();
        let mut buckets = Vec::new();
        for d in [b"a", b"b"] {
            let dir = fs.mkdir(ROOT_INO, d, 0o755, 0, &c).unwrap().ino;
            let f = fs
                .create(dir, b"README", libc::S_IFREG | 0o644, 0, libc::O_RDWR, &c)
                .unwrap();
            fs.release(f.ino).unwrap();
            let mut lo = dir.to_be_bytes().to_vec();
            lo.push(3);
            let mut hi = lo.clone();
            hi[8] = 4;
            let k = h
                .txn(false, |t| {
                    t.range(
                        std::ops::Bound::Included(&lo[..]),
                        std::ops::Bound::Excluded(&hi[..]),
                        10,
                    )
                })
                .unwrap();
            buckets.push(u64::from_be_bytes(k[0].0[9..17].try_into().unwrap()) & !0xffff);
        }
        assert_eq!(buckets[0] == buckets[1], !keyed, "{name}: {buckets:x?}");
    }
}

/// A parked record that cannot be read back: the load fails and changes
/// nothing (the key stays unloaded, the records parked, and nothing the
/// replay decrypted before it failed stays in the cache); asked to discard
/// it, the load goes on without it and says so in the pool's status.
#[test]
fn an_unreadable_parked_record_fails_the_load_unless_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let devs = devices(dir.path(), 1);
    let pool = attached(create("tank", VdevKind::Single, &devs, &[]).unwrap());
    encrypted(&pool, "tank/s", PASS, &[]);
    let fs = mount(&pool, "tank/s");
    let c = Cred::root();
    // A committed file that the first record patches (its replay reads
    // and decrypts the block), and a second record, the damaged one.
    let base = new_file(&fs, "base");
    fs.write(base, 0, &[0x42; 8192], false, &c).unwrap();
    fs.release(base).unwrap();
    pool.sync().unwrap();
    let base = fs.lookup(ROOT_INO, b"base", &c).unwrap().ino;
    fs.open(base, libc::O_RDWR, &c).unwrap();
    fs.write(base, 100, b"patched", false, &c).unwrap();
    fs.fsync(base).unwrap();
    let f = new_file(&fs, "f");
    fs.write(f, 0, b"logged only", false, &c).unwrap();
    fs.fsync(f).unwrap();
    drop(fs);
    pool.abandon();
    // A cache of its own, so that only this pool's blocks are counted.
    let opts = PoolOptions {
        cache: Some(Arc::new(tarn_block::BlockCache::new(64 << 20))),
        ..opts()
    };
    let pool =
        attached(tarn_testkit::pools::try_import(&[dir.path()], "tank", true, opts).unwrap());
    assert_eq!(tarn_dataset::parked_records(&pool, "tank/s").unwrap(), 2);
    // Damage the block holding the last parked record (no redundancy on
    // one device).
    let chunks = tarn_dataset::parked_blocks(&pool, "tank/s").unwrap();
    let chunk = *chunks.last().unwrap();
    tarn_testkit::files::overwrite(
        &devs[0],
        tarn_vdev::DATA_START + chunk.dvas[0].offset,
        &[0xee; 512],
    );
    pool.evict_cache();
    let r = tarn_dataset::load_key(&pool, "tank/s", &passphrase(PASS));
    assert!(matches!(r, Err(DsError::Damaged(_))), "{r:?}");
    // What the failed replay read with the key (decrypted) is not kept.
    assert_eq!(
        pool.cache_stats().blocks,
        0,
        "a failed key load left blocks in the cache"
    );
    let info = tarn_testkit::datasets::info(&pool, "tank/s");
    assert_eq!(
        info.keystatus.as_deref(),
        Some("unavailable"),
        "a failed load leaves it locked"
    );
    assert_eq!(
        tarn_dataset::parked_records(&pool, "tank/s").unwrap(),
        2,
        "and the records parked"
    );
    let n = tarn_dataset::load_key_with(&pool, "tank/s", &passphrase(PASS), true).unwrap();
    assert_eq!(n, 1);
    assert_eq!(tarn_dataset::parked_records(&pool, "tank/s").unwrap(), 0);
    assert!(pool
        .status()
        .damaged
        .iter()
        .any(|d| d.contains("--discard-log")));
    let fs = mount(&pool, "tank/s");
    assert_eq!(
        content(&fs, ROOT_INO, "f"),
        None,
        "the dropped record's file"
    );
    let mut want = vec![0x42; 8192];
    want[100..107].copy_from_slice(b"patched");
    assert_eq!(
        content(&fs, ROOT_INO, "base"),
        Some(want),
        "the replayed one"
    );
    drop(fs);
    pool.sync().unwrap();
    assert!(pool.leak_check().unwrap().is_clean());
}

/// Raidz1 of four files under `dir` whose syncs start only when asked
/// (one txg holds up to 256 MiB), with an encrypted lz4 dataset
/// `tank/secret` mounted: for the tests of the sync's write windows.
fn one_txg_secret(dir: &Path) -> (Vec<PathBuf>, Arc<Pool>, DsFs) {
    let devs = devices(dir, 4);
    let one_txg = PoolOptions {
        dirty_sync_bytes: 256 << 20,
        ..opts()
    };
    let pool = attached(
        tarn_testkit::pools::create_with(
            "tank",
            VdevKind::Raidz { parity: 1 },
            &devs,
            &[],
            one_txg,
        )
        .unwrap(),
    );
    encrypted(&pool, "tank/secret", PASS, &[("compression", "lz4")]);
    let s = mount(&pool, "tank/secret");
    (devs, pool, s)
}

/// A txg holding more than one write window of sealed blocks (the pool
/// prepares and writes data in windows, and reuses the buffers of one
/// window's sealed and compressed bytes for the window after next):
/// blocks of every size and kind read back exactly after export and
/// import, and none of their plaintext is on the devices.
#[test]
fn a_txg_of_many_write_windows_reads_back_exactly_and_stays_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let (devs, pool, s) = one_txg_secret(dir.path());
    let c = Cred::root();
    let mut rng = Rng::new(0x3a11_d0e5);
    let canaries = Canaries::new(&mut rng, "W", 64);
    let mut files = Vec::new();
    let mut total = 0usize;
    // 48 MiB: more than the 32 MiB window, in one txg. Sizes from 70 KiB
    // to over a record, so records and tails of many sizes share the
    // buffers in turn.
    while total < 48 << 20 {
        let i = files.len();
        let len = rng.range(70 << 10, (1 << 20) + (300 << 10)) as usize;
        let (mut data, _) = rng.mixed(len);
        let needle = &canaries.needles[i % canaries.needles.len()];
        data[..needle.len()].copy_from_slice(needle);
        let name = format!("f{i}");
        let ino = new_file(&s, &name);
        s.write(ino, 0, &data, false, &c).expect("write");
        s.release(ino).unwrap();
        total += len;
        files.push((name, data));
    }
    pool.sync().unwrap();
    let leaks = pool.leak_check().unwrap();
    assert!(leaks.is_clean(), "{leaks:?}");
    drop(s);
    pool.export(false).unwrap();
    let hits = find_in_devices(&devs, &canaries.needles);
    assert!(hits.is_empty(), "{} canaries in the clear", hits.len());
    let pool = import(dir.path());
    tarn_dataset::load_key(&pool, "tank/secret", &passphrase(PASS)).unwrap();
    let s = mount(&pool, "tank/secret");
    for (name, data) in &files {
        let got = content(&s, ROOT_INO, name).expect("file");
        assert!(
            got == *data,
            "{name}: {} bytes back for {}",
            got.len(),
            data.len()
        );
    }
}

/// A sync of several windows whose device writes fail (the first window
/// fails while the second is being prepared: `Pool::write_data` prepares
/// one window while it writes the one before) reports the error and
/// commits nothing: once the devices work again, an import finds the last
/// committed txg exactly, and the failed txg left nothing the leak check
/// can see. (That a failed window stops the windows after it is tested on
/// its own, `pipelined` in tarn-pool's sync module.)
#[test]
fn a_sync_failing_while_its_next_window_is_prepared_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (devs, pool, s) = one_txg_secret(dir.path());
    let c = Cred::root();
    let mut rng = Rng::new(0x5e7f_a11e);
    let (kept, _) = rng.mixed(700 << 10);
    let ino = new_file(&s, "kept");
    s.write(ino, 0, &kept, false, &c).expect("write");
    s.release(ino).unwrap();
    pool.sync().expect("the first txg commits");
    // 80 MiB in one txg: three windows.
    let mut total = 0usize;
    let mut i = 0;
    while total < 80 << 20 {
        let (data, _) = rng.mixed(1 << 20);
        let ino = new_file(&s, &format!("lost{i}"));
        s.write(ino, 0, &data, false, &c).expect("write");
        s.release(ino).unwrap();
        total += data.len();
        i += 1;
    }
    // Two of four members refuse every write: no block of raidz1 can be
    // written, so the first window fails while the second is prepared.
    for d in &devs[..2] {
        tarn_vdev::find_device(d)
            .expect("device is open")
            .inject(tarn_vdev::Fault::always(tarn_vdev::FaultKind::WriteError));
    }
    assert!(pool.sync().is_err(), "a sync that cannot write reports it");
    drop(s);
    pool.abandon();

    let pool = import(dir.path());
    tarn_dataset::load_key(&pool, "tank/secret", &passphrase(PASS)).unwrap();
    let s = mount(&pool, "tank/secret");
    assert!(
        content(&s, ROOT_INO, "kept") == Some(kept),
        "the committed file"
    );
    assert_eq!(
        content(&s, ROOT_INO, "lost0"),
        None,
        "nothing of the failed txg"
    );
    drop(s);
    let leaks = pool.leak_check().unwrap();
    assert!(leaks.is_clean(), "{leaks:?}");
}

/// A key load whose parked intent log does not fit the pool any more
/// (filled while the key was unloaded) is refused for lack of room,
/// replaying nothing that does not fit, and the pool goes on: it used to
/// stop the pool. With room made, the load replays the rest.
#[test]
fn a_parked_log_that_does_not_fit_fails_the_key_load_not_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, fs) = mirror_with_encrypted(dir.path());
    let c = Cred::root();
    let mut files = Vec::new();
    for i in 0..4 {
        let f = new_file(&fs, &format!("f{i}"));
        let data = tarn_testkit::data::pattern(i, 256 << 10);
        fs.write(f, 0, &data, false, &c).unwrap();
        fs.fsync(f).unwrap();
        files.push(data);
    }
    drop(fs);
    pool.abandon();
    let pool = import(dir.path());
    assert!(tarn_dataset::parked_records(&pool, "tank/s").unwrap() > 0);
    // Fill the pool from another dataset while the key is unloaded.
    tarn_dataset::create(&pool, "tank/fill", &Default::default(), false).unwrap();
    let fill = mount(&pool, "tank/fill");
    let f = new_file(&fill, "fill");
    let chunk = Rng::new(9).bytes(1 << 20);
    let mut at = 0u64;
    while fill.write(f, at, &chunk, false, &c).is_ok() {
        at += chunk.len() as u64;
        if at.is_multiple_of(8 << 20) {
            let _ = fill.fsync(f);
        }
    }
    let _ = fill.fsync(f);
    drop(fill);
    let r = tarn_dataset::load_key(&pool, "tank/s", &passphrase(PASS));
    assert!(matches!(r, Err(DsError::NoSpace(_))), "{r:?}");
    // The pool still takes changes; the rest of the log stays parked.
    tarn_dataset::destroy(&pool, "tank/fill", false).unwrap();
    pool.sync().unwrap();
    tarn_dataset::load_key(&pool, "tank/s", &passphrase(PASS)).unwrap();
    assert_eq!(tarn_dataset::parked_records(&pool, "tank/s").unwrap(), 0);
    let fs = mount(&pool, "tank/s");
    for (i, data) in files.iter().enumerate() {
        assert!(
            content(&fs, ROOT_INO, &format!("f{i}")).as_ref() == Some(data),
            "f{i}"
        );
    }
    drop(fs);
    pool.sync().unwrap();
    assert!(pool.leak_check().unwrap().is_clean());
}

/// Many small fsynced writes into one record are replayed as one block:
/// the room a key load checks for counts that block once, so a nearly
/// full pool with room for it loads the key.
#[test]
fn a_parked_log_of_many_patches_to_one_block_needs_room_for_one() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, fs) = mirror_with_encrypted(dir.path());
    let c = Cred::root();
    let f = new_file(&fs, "f");
    let mut expect = tarn_testkit::data::pattern(3, 128 << 10);
    fs.write(f, 0, &expect, false, &c).unwrap();
    fs.fsync(f).unwrap();
    pool.sync().unwrap();
    for i in 0..64usize {
        let at = i * 2000;
        let bytes = [i as u8; 100];
        fs.write(f, at as u64, &bytes, false, &c).unwrap();
        fs.fsync(f).unwrap();
        expect[at..at + 100].copy_from_slice(&bytes);
    }
    drop(fs);
    pool.abandon();
    let pool = import(dir.path());
    assert!(tarn_dataset::parked_records(&pool, "tank/s").unwrap() >= 64);
    // Fill the pool, then free about 2 MiB: room for the block, not for
    // 64 of them.
    tarn_dataset::create(&pool, "tank/fill", &Default::default(), false).unwrap();
    let fill = mount(&pool, "tank/fill");
    let spare = new_file(&fill, "spare");
    fill.write(spare, 0, &Rng::new(8).bytes(2 << 20), false, &c)
        .unwrap();
    fill.fsync(spare).unwrap();
    let big = new_file(&fill, "big");
    let chunk = Rng::new(9).bytes(1 << 20);
    let mut at = 0u64;
    while fill.write(big, at, &chunk, false, &c).is_ok() {
        at += chunk.len() as u64;
    }
    let _ = fill.fsync(big);
    fill.unlink(ROOT_INO, b"spare", &c).unwrap();
    drop(fill);
    pool.sync().unwrap();
    pool.sync().unwrap();
    tarn_dataset::load_key(&pool, "tank/s", &passphrase(PASS)).unwrap();
    let fs = mount(&pool, "tank/s");
    assert!(content(&fs, ROOT_INO, "f") == Some(expect));
}
