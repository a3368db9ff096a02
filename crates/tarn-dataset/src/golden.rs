//! Golden tests of the dataset layer's JSON records (docs/format.md,
//! "Dataset records"): renaming a Rust field or enum variant must fail here
//! rather than silently change what is stored.
//!
//! Each test builds a value with every field set to a distinctive value and
//! compares its JSON with a literal by parsing both into
//! `serde_json::Value`: field order and whitespace are not part of the
//! format (readers accept any order), every name, type and value is. Then
//! the literal is decoded back (round trip), and older or minimal forms
//! readers must still accept are decoded.

use std::collections::BTreeMap;

use serde_json::Value;
use tarn_block::{BlockPtr, BlockType, ChecksumAlg, CompressAlg, Dva};

use crate::record::DsRec;
use crate::{DatasetKind, Sums};

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap()
}

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap()
}

/// A tree root pointer with most fields set.
fn root() -> BlockPtr {
    let mut bp = BlockPtr {
        lsize: 4096,
        psize: 4096,
        birth: 42,
        btype: BlockType::TreeNode,
        level: 1,
        checksum_alg: ChecksumAlg::Blake3,
        compress: CompressAlg::Lz4,
        fill: 7,
        checksum: [0xab; 32],
        ..BlockPtr::default()
    };
    bp.dvas[0] = Dva {
        vdev: 1,
        asize: 8192,
        offset: 0x10_0000,
    };
    bp
}

/// The 160-byte encoding of `root()` in lowercase hex, as `root` stores it.
const ROOT_HEX: &str = "0100000000200000000010000000000000000000000000000000000000000000\
                        0000000000000000000000000000000000100000001000002a00000000000000\
                        0201010100000000070000000000000000000000000000000000000000000000\
                        0000000000000000000000000000000000000000000000000000000000000000\
                        abababababababababababababababababababababababababababababababab";

fn sums(a: u64) -> Sums {
    Sums {
        asize: a,
        psize: a / 2 + 1,
        lsize: a * 3 + 2,
    }
}

fn record() -> DsRec {
    DsRec {
        id: 9,
        guid: 0xF00D_CAFE_0000_0001,
        name: "tank/photos@monday".into(),
        kind: DatasetKind::Snapshot,
        parent: Some(3),
        head: Some(4),
        root: ROOT_HEX.into(),
        created_txg: 1234,
        created_unix: 1_700_000_000,
        prev_snap: Some(7),
        prev_snap_txg: 1200,
        origin: Some(5),
        clones: vec![11, 12],
        props: BTreeMap::from([
            ("compression".to_string(), "zstd-3".to_string()),
            ("quota".to_string(), "1073741824".to_string()),
        ]),
        referenced: sums(1 << 40),
        unique: sums(8192),
        deadlist: 10,
        dead: BTreeMap::from([(0, sums(4096)), (1200, sums(0x1_0000_0000))]),
        volume: None,
        key: None,
        recv: None,
        holds: Default::default(),
    }
}

const GOLDEN: &str = r#"{
    "id": 9, "guid": 17297704936070447105, "name": "tank/photos@monday",
    "kind": "snapshot", "parent": 3, "head": 4, "root": "ROOT",
    "created_txg": 1234, "created_unix": 1700000000,
    "prev_snap": 7, "prev_snap_txg": 1200, "origin": 5, "clones": [11, 12],
    "props": {"compression": "zstd-3", "quota": "1073741824"},
    "referenced": {"asize": 1099511627776, "psize": 549755813889, "lsize": 3298534883330},
    "unique": {"asize": 8192, "psize": 4097, "lsize": 24578},
    "deadlist": 10,
    "dead": {"0": {"asize": 4096, "psize": 2049, "lsize": 12290},
             "1200": {"asize": 4294967296, "psize": 2147483649, "lsize": 12884901890}}}"#;

fn golden() -> String {
    GOLDEN.replace("ROOT", ROOT_HEX)
}

#[test]
fn dataset_record_json_is_pinned() {
    let rec = record();
    assert_eq!(to_json(&rec), json(&golden()));
    let back: DsRec = serde_json::from_str(&golden()).unwrap();
    assert_eq!(to_json(&back), json(&golden()));
    // `root` is the block pointer's encoding in lowercase hex.
    assert_eq!(back.root_ptr().unwrap(), root());
    assert_eq!(
        ROOT_HEX,
        root()
            .encode()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
}

#[test]
fn a_held_snapshot_adds_its_tags_and_nothing_else() {
    let mut rec = record();
    rec.holds = ["offsite".to_string(), "backup".to_string()].into();
    let mut want = json(&golden());
    want["holds"] = json(r#"["backup", "offsite"]"#);
    assert_eq!(to_json(&rec), want);
    let back: DsRec = serde_json::from_value(want.clone()).unwrap();
    assert_eq!(to_json(&back), want);
}

#[test]
fn a_volume_record_adds_its_geometry_and_nothing_else() {
    let mut rec = record();
    rec.kind = DatasetKind::Volume;
    rec.volume = Some(crate::VolSpec {
        size: 1 << 30,
        block: 16384,
    });
    let mut want = json(&golden());
    want["kind"] = Value::from("volume");
    want["volume"] = json(r#"{"size": 1073741824, "block": 16384}"#);
    assert_eq!(to_json(&rec), want);
    let back: DsRec = serde_json::from_value(want.clone()).unwrap();
    assert_eq!(back.volume, rec.volume);
    assert_eq!(to_json(&back), want);
}

#[test]
fn an_encrypted_record_adds_its_key_and_nothing_else() {
    let mut rec = record();
    rec.key = Some(77);
    let mut want = json(&golden());
    want["key"] = Value::from(77);
    assert_eq!(to_json(&rec), want);
    let back: DsRec = serde_json::from_value(want.clone()).unwrap();
    assert_eq!(back.key, Some(77));
    // Records without the field (unencrypted, or written before
    // encryption) read as unencrypted.
    let plain: DsRec = serde_json::from_str(&golden()).unwrap();
    assert_eq!(plain.key, None);
}

#[test]
fn key_record_json_is_pinned() {
    use crate::crypt::{KeyFormat, KeyRec, PbkdfRec};
    let rec = KeyRec {
        id: 77,
        guid: 18_446_744_073_709_551_557,
        cipher: "aes-256-gcm".into(),
        keyformat: KeyFormat::Passphrase,
        keylocation: "prompt".into(),
        pbkdf: Some(PbkdfRec {
            memory_kib: 65536,
            iterations: 3,
            parallelism: 1,
            salt: "00112233445566778899aabbccddeeff".into(),
        }),
        wrapped: "ab".repeat(60),
        root: 12,
        created_unix: 1_700_000_000,
    };
    let golden = format!(
        r#"{{"id": 77, "guid": 18446744073709551557, "cipher": "aes-256-gcm",
            "keyformat": "passphrase", "keylocation": "prompt",
            "pbkdf": {{"memory_kib": 65536, "iterations": 3, "parallelism": 1,
                       "salt": "00112233445566778899aabbccddeeff"}},
            "wrapped": "{}", "root": 12, "created_unix": 1700000000}}"#,
        "ab".repeat(60)
    );
    assert_eq!(to_json(&rec), json(&golden));
    let back: KeyRec = serde_json::from_str(&golden).unwrap();
    assert_eq!(back, rec);
    // A raw or hex key has no passphrase parameters.
    let hex: KeyRec = serde_json::from_value({
        let mut v = json(&golden);
        v["keyformat"] = Value::from("hex");
        v.as_object_mut().unwrap().remove("pbkdf");
        v
    })
    .unwrap();
    assert_eq!((hex.keyformat, hex.pbkdf), (KeyFormat::Hex, None));
    for f in ["passphrase", "raw", "hex"] {
        assert_eq!(to_json(&KeyFormat::parse(f).unwrap()), Value::from(f));
    }
}

#[test]
fn summary_piece_keys_and_feature_are_pinned() {
    assert_eq!(
        crate::stored::piece_key(7, 2),
        b"S\0\0\0\0\0\0\0\x07\0\x02".to_vec()
    );
    assert_eq!(crate::stored::LARGE_RECORDS, "large_records");
    assert!(tarn_pool::FEATURES.contains(&crate::stored::LARGE_RECORDS));
}

#[test]
fn sums_and_kinds_json_are_pinned() {
    assert_eq!(
        to_json(&sums(10)),
        json(r#"{"asize": 10, "psize": 6, "lsize": 32}"#)
    );
    assert_eq!(
        serde_json::from_str::<Sums>(r#"{"lsize":32,"psize":6,"asize":10}"#).unwrap(),
        sums(10)
    );
    assert_eq!(to_json(&DatasetKind::Filesystem), Value::from("filesystem"));
    assert_eq!(to_json(&DatasetKind::Snapshot), Value::from("snapshot"));
    assert_eq!(to_json(&DatasetKind::Volume), Value::from("volume"));
    assert!(serde_json::from_str::<DatasetKind>(r#""Snapshot""#).is_err());
}

#[test]
fn older_and_minimal_dataset_records_decode() {
    // A pool's root filesystem as first written: the optional fields
    // absent, and no `clones`, `props` or `dead` yet.
    let hole = "0".repeat(320);
    let old = format!(
        r#"{{"id":1,"guid":2,"name":"tank","kind":"filesystem","root":"{hole}",
        "created_txg":3,"created_unix":4,"prev_snap_txg":0,
        "referenced":{{"asize":0,"psize":0,"lsize":0}},
        "unique":{{"asize":0,"psize":0,"lsize":0}},"deadlist":5}}"#
    );
    let rec: DsRec = serde_json::from_str(&old).unwrap();
    assert_eq!(
        (rec.parent, rec.head, rec.prev_snap, rec.origin),
        (None, None, None, None)
    );
    assert!(rec.clones.is_empty() && rec.props.is_empty() && rec.dead.is_empty());
    assert!(rec.root_ptr().unwrap().is_hole());
    // What it is written back as: every field present, optional ones null.
    let full = format!(
        r#"{{"id":1,"guid":2,"name":"tank","kind":"filesystem","parent":null,"head":null,
        "root":"{hole}","created_txg":3,"created_unix":4,"prev_snap":null,"prev_snap_txg":0,
        "origin":null,"clones":[],"props":{{}},"referenced":{{"asize":0,"psize":0,"lsize":0}},
        "unique":{{"asize":0,"psize":0,"lsize":0}},"deadlist":5,"dead":{{}}}}"#
    );
    assert_eq!(to_json(&rec), json(&full));
    // Unknown fields are ignored; required ones are required.
    let extra = old.replacen('{', r#"{"encryption":"aes-256-gcm","#, 1);
    assert_eq!(
        to_json(&serde_json::from_str::<DsRec>(&extra).unwrap()),
        json(&full)
    );
    assert!(serde_json::from_str::<DsRec>(&old.replace(r#""deadlist":5"#, r#""x":5"#)).is_err());
}

/// What a scan makes of dataset records and block values: the tree or the
/// block they reference, or, when they do not decode, an entry the scan
/// reports as an error instead of passing over it.
#[test]
fn scan_refs_report_what_does_not_decode() {
    use crate::record::{block_value, ds_key, scan_refs};
    use tarn_pool::ExtRef;
    let refs = |kind: u8, key: &[u8], value: &[u8]| {
        let mut out = Vec::new();
        scan_refs(kind, key, value, &mut out);
        out
    };
    let rec = serde_json::to_vec(&record()).unwrap();
    assert!(matches!(
        refs(0, &ds_key(7), &rec)[..],
        [ExtRef::Tree { .. }]
    ));
    for bad in [&b"{not json"[..], br#"{"id": 7}"#] {
        let r = refs(0, &ds_key(7), bad);
        assert!(
            matches!(&r[..], [ExtRef::Undecodable(w)] if w.contains("dataset record")),
            "{r:?}"
        );
    }
    let mut broken = serde_json::to_value(record()).unwrap();
    broken["root"] = Value::String("zz".into());
    let r = refs(0, &ds_key(7), &serde_json::to_vec(&broken).unwrap());
    assert!(matches!(&r[..], [ExtRef::Undecodable(_)]), "{r:?}");
    let v = block_value(&root());
    assert!(matches!(refs(1, b"k", &v)[..], [ExtRef::Block(_)]));
    let r = refs(1, b"k", &v[..10]);
    assert!(
        matches!(&r[..], [ExtRef::Undecodable(w)] if w.contains("block pointer")),
        "{r:?}"
    );
    // Plain values and other meta entries reference nothing.
    assert!(refs(1, b"k", &[0, 1, 2]).is_empty());
    assert!(refs(0, b"Lxyz", b"whatever").is_empty());
}
