//! Bad streams: cut short, with flipped bits, with records reordered, on
//! the wrong base, of a future version, with absurd lengths, or mutated
//! at random. Each is refused with a clear error, never a panic, and the
//! target is as it was (a new dataset is not left behind, an existing one
//! keeps its state), with no space leaked.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use tarn_dataset::recv::RecvOptions;
use tarn_dataset::send::{SendInfo, SendItem};
use tarn_dataset::DatasetKind;
use tarn_fs::Cred;
use tarn_pool::Pool;
use tarn_send::stream::{Header, StreamWriter, MAGIC, VERSION};
use tarn_send::{receive, send, SendError, SendOptions};
use tarn_testkit::data::Rng;
use tarn_testkit::datasets::mount;
use tarn_testkit::pools::{attached, create, props};
use tarn_vdev::VdevKind;

struct Fixture {
    _dir: tempfile::TempDir,
    tank: Arc<Pool>,
    backup: Arc<Pool>,
    full: Vec<u8>,
    incr: Vec<u8>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let a = tarn_testkit::files::make(dir.path(), "a", 1, 96 << 20);
    let b = tarn_testkit::files::make(dir.path(), "b", 1, 96 << 20);
    let tank = attached(create("tank", VdevKind::Single, &a, &[]).unwrap());
    let backup = attached(create("backup", VdevKind::Single, &b, &[]).unwrap());
    tarn_dataset::create(&tank, "tank/fs", &props(&[]), false).unwrap();
    let fs = mount(&tank, "tank/fs");
    let c = Cred::root();
    let mut rng = Rng::new(11);
    for i in 0..20 {
        let f = tarn_testkit::datasets::new_file(&fs, &format!("f{i}"));
        let n = rng.range(1, 40_000) as usize;
        fs.write(f, 0, &rng.bytes(n), false, &c).unwrap();
        fs.release(f).unwrap();
    }
    tarn_dataset::snapshot(&tank, &["tank/fs@a".into()], false).unwrap();
    fs.unlink(tarn_fs::ROOT_INO, b"f3", &c).unwrap();
    let f = tarn_testkit::datasets::new_file(&fs, "g");
    fs.write(f, 0, &rng.bytes(10_000), false, &c).unwrap();
    fs.release(f).unwrap();
    tarn_dataset::snapshot(&tank, &["tank/fs@b".into()], false).unwrap();
    let mut full = Vec::new();
    send(&tank, "tank/fs@a", &SendOptions::default(), &mut full).unwrap();
    let mut incr = Vec::new();
    let opts = SendOptions {
        from: Some("@a".into()),
        ..Default::default()
    };
    send(&tank, "tank/fs@b", &opts, &mut incr).unwrap();
    Fixture {
        _dir: dir,
        tank,
        backup,
        full,
        incr,
    }
}

fn recv(pool: &Arc<Pool>, name: &str, stream: &[u8]) -> Result<(), SendError> {
    receive(pool, name, RecvOptions::default(), stream).map(|_| ())
}

/// What a dataset's tree holds now (its root pointer), or None.
fn state(pool: &Arc<Pool>, name: &str) -> Option<tarn_block::BlockPtr> {
    tarn_dataset::open(pool, name)
        .ok()
        .map(|h| h.root().unwrap())
}

/// `stream` must be refused: with a stream error, no new dataset, an
/// existing one as it was, and no space leaked.
fn refused(f: &Fixture, name: &str, stream: &[u8], what: &str) {
    let before = state(&f.backup, name);
    let snaps = tarn_dataset::list(&f.backup, true).unwrap().len();
    match recv(&f.backup, name, stream) {
        Ok(()) => panic!("{what}: accepted"),
        Err(SendError::Stream(_) | SendError::Dataset(_)) => {}
        Err(e) => panic!("{what}: {e}"),
    }
    assert_eq!(state(&f.backup, name), before, "{what}: the target changed");
    assert_eq!(
        tarn_dataset::list(&f.backup, true).unwrap().len(),
        snaps,
        "{what}"
    );
    let leaks = f.backup.leak_check().unwrap();
    assert!(leaks.is_clean(), "{what}: {leaks:?}");
}

/// Offsets where records start, from the header lengths.
fn record_starts(stream: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 8 <= stream.len() {
        out.push(at);
        let k = u16::from_le_bytes([stream[at + 2], stream[at + 3]]) as usize;
        let v = u32::from_le_bytes(stream[at + 4..at + 8].try_into().unwrap()) as usize;
        at += 8 + k + v + 32;
    }
    out
}

#[test]
fn cut_flipped_reordered_and_misplaced_streams_are_refused() {
    let f = fixture();
    let mut rng = Rng::new(0xbad);
    let starts = record_starts(&f.full);
    assert!(starts.len() > 20, "a stream of many records");
    // Cut at every record boundary, and at random places.
    for &cut in starts.iter().skip(1).chain([f.full.len() - 1].iter()) {
        refused(&f, "backup/cut", &f.full[..cut], &format!("cut at {cut}"));
    }
    for _ in 0..20 {
        let cut = rng.range(1, f.full.len() as u64) as usize;
        refused(&f, "backup/cut", &f.full[..cut], &format!("cut at {cut}"));
    }
    // Flipped bits anywhere.
    for _ in 0..40 {
        let mut s = f.full.clone();
        let at = rng.below(s.len() as u64) as usize;
        s[at] ^= 1 << rng.below(8);
        refused(&f, "backup/flip", &s, &format!("bit flipped at {at}"));
    }
    // Two entry records swapped.
    let (a, b, c) = (starts[3], starts[4], starts[5]);
    let mut s = f.full[..a].to_vec();
    s.extend_from_slice(&f.full[b..c]);
    s.extend_from_slice(&f.full[a..b]);
    s.extend_from_slice(&f.full[c..]);
    refused(&f, "backup/swap", &s, "records swapped");
    // An incremental stream without its base, or onto another dataset.
    refused(
        &f,
        "backup/nobase",
        &f.incr,
        "an incremental stream into nothing",
    );
    recv(&f.backup, "backup/fs", &f.full).unwrap();
    let mut other = Vec::new();
    tarn_dataset::snapshot(&f.tank, &["tank/fs@c".into()], false).unwrap();
    let opts = SendOptions {
        from: Some("@b".into()),
        ..Default::default()
    };
    send(&f.tank, "tank/fs@c", &opts, &mut other).unwrap();
    refused(
        &f,
        "backup/fs",
        &other,
        "an incremental stream on the wrong base",
    );
    // A damaged incremental stream onto the right base: the target stays
    // at its base.
    let mut s = f.incr.clone();
    let at = s.len() / 2;
    s[at] ^= 0x40;
    refused(&f, "backup/fs", &s, "a damaged incremental stream");
    recv(&f.backup, "backup/fs", &f.incr).unwrap();
}

fn info() -> SendInfo {
    SendInfo {
        name: "s".into(),
        dataset: "x/y".into(),
        guid: 42,
        created_txg: 1,
        created_unix: 1,
        kind: DatasetKind::Filesystem,
        volume: None,
        from: None,
        raw: false,
        key: None,
        props: BTreeMap::new(),
    }
}

fn stream_of(version: u32, items: &[SendItem]) -> Vec<u8> {
    let h = Header {
        magic: MAGIC.into(),
        version,
        info: info(),
        resume_after: None,
        rel: None,
        part: None,
    };
    let mut w = StreamWriter::begin(Vec::new(), &h).unwrap();
    for i in items {
        w.item(i).unwrap();
    }
    w.end().unwrap().0
}

#[test]
fn future_versions_absurd_lengths_and_odd_entries_are_refused() {
    let f = fixture();
    let item = SendItem::Put(b"\0\0\0\0\0\0\0\x10\x01".to_vec(), vec![1, 2, 3]);
    let err = recv(
        &f.backup,
        "backup/v",
        &stream_of(VERSION + 1, std::slice::from_ref(&item)),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("version"), "{err}");
    refused(
        &f,
        "backup/v",
        &stream_of(VERSION + 1, std::slice::from_ref(&item)),
        "a future version",
    );
    // A header that claims a 10 GiB value: refused before reading it.
    let mut s = stream_of(VERSION, std::slice::from_ref(&item));
    let second = record_starts(&s)[1];
    s[second + 4..second + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    let err = recv(&f.backup, "backup/len", &s).unwrap_err().to_string();
    assert!(err.contains("at most"), "{err}");
    refused(&f, "backup/len", &s, "an absurd length");
    // Entries out of key order, and a stream that is not one at all.
    let b = SendItem::Put(b"b".to_vec(), vec![]);
    let a = SendItem::Put(b"a".to_vec(), vec![]);
    refused(
        &f,
        "backup/order",
        &stream_of(VERSION, &[b, a]),
        "keys out of order",
    );
    refused(
        &f,
        "backup/junk",
        b"this is not a stream at all, not even close......",
        "junk",
    );
    refused(&f, "backup/empty", b"", "empty input");
}

proptest! {
    #![proptest_config(tarn_testkit::data::cases(64))]

    /// Random bytes and random mutations of a real stream: the reader
    /// never panics, and the receiver refuses them.
    #[test]
    fn mutated_streams_never_panic(
        seed in any::<u64>(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in proptest::option::of(any::<usize>()),
    ) {
        let mut s = stream_of(
            VERSION,
            &[
                SendItem::Put(b"k1".to_vec(), vec![7; 100]),
                SendItem::Delete(b"k2".to_vec()),
            ],
        );
        let mut rng = Rng::new(seed);
        for (at, b) in edits {
            let i = at % s.len();
            s[i] = if rng.chance(0.5) { b } else { s[i] ^ 1 };
        }
        if let Some(c) = cut {
            s.truncate(c % (s.len() + 1));
        }
        let mut r = tarn_send::stream::StreamReader::new(&s[..]);
        for _ in 0..16 {
            match r.next_record() {
                Ok(Some(_)) => continue,
                _ => break,
            }
        }
    }
}

/// The record layout and the checksum chain, recomputed from
/// docs/format.md ("Send streams") alone.
#[test]
fn stream_layout_is_pinned() {
    let s = stream_of(
        VERSION,
        &[
            SendItem::Put(b"k".to_vec(), b"vv".to_vec()),
            SendItem::Delete(b"d".to_vec()),
        ],
    );
    let mut want = Vec::new();
    let mut sum = *blake3::hash(b"tarn-send stream v1").as_bytes();
    let mut record = |kind: u8, key: &[u8], value: &[u8]| {
        let mut r = vec![kind, 0];
        r.extend_from_slice(&(key.len() as u16).to_le_bytes());
        r.extend_from_slice(&(value.len() as u32).to_le_bytes());
        r.extend_from_slice(key);
        r.extend_from_slice(value);
        let mut h = blake3::Hasher::new();
        h.update(&sum);
        h.update(&r);
        sum = *h.finalize().as_bytes();
        r.extend_from_slice(&sum);
        want.extend_from_slice(&r);
    };
    let header = serde_json::to_vec(&Header {
        magic: MAGIC.into(),
        version: VERSION,
        info: info(),
        resume_after: None,
        rel: None,
        part: None,
    })
    .unwrap();
    let h: serde_json::Value = serde_json::from_slice(&header).unwrap();
    assert_eq!(h["magic"], "tarn-send");
    assert_eq!(h["version"], 1);
    assert_eq!(h["info"]["kind"], "filesystem");
    record(1, b"", &header);
    record(2, b"k", b"vv");
    record(5, b"d", b"");
    record(6, b"", &2u64.to_le_bytes());
    assert_eq!(s, want);
}
