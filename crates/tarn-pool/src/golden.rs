//! Golden tests of the pool's JSON records (docs/format.md, "The pool meta
//! tree"): renaming a Rust field or enum variant must fail here rather than
//! silently change what is stored.
//!
//! Each test builds a value with every field set to a distinctive value,
//! and compares its JSON with a literal by parsing both into
//! `serde_json::Value`: field order and whitespace are not part of the
//! format (readers accept any order), every name, type and value is. Then
//! the literal is decoded back (round trip), and the older or minimal forms
//! readers must still accept are decoded.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::config::PoolProps;
use crate::pool::{MetaState, K_PROPS, K_STATE};
use crate::scan::ScanRecord;
use crate::status::{ScanKind, ScanState};
use crate::zil::{LogAddr, LogHeader};

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap()
}

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap()
}

#[test]
fn meta_tree_keys_are_pinned() {
    assert_eq!(K_PROPS, b"\x01props");
    assert_eq!(K_STATE, b"\x01state");
}

#[test]
fn pool_props_json_is_pinned() {
    let props = PoolProps {
        checksum: "xxh3".into(),
        compression: "zstd-7".into(),
        copies: 3,
        recordsize: 1 << 20,
        features: Vec::new(),
    };
    let golden = r#"{"checksum": "xxh3", "compression": "zstd-7", "copies": 3,
        "recordsize": 1048576}"#;
    assert_eq!(to_json(&props), json(golden));
    assert_eq!(serde_json::from_str::<PoolProps>(golden).unwrap(), props);
    // What a pool without a props record uses.
    assert_eq!(
        to_json(&PoolProps::default()),
        json(r#"{"checksum":"blake3","compression":"lz4","copies":1,"recordsize":131072}"#)
    );
    // Every field is required; unknown fields are ignored.
    assert!(serde_json::from_str::<PoolProps>(
        r#"{"checksum":"xxh3","copies":3,"recordsize":4096}"#
    )
    .is_err());
    let extra = golden.replacen('{', r#"{"dedup": "on", "#, 1);
    assert_eq!(serde_json::from_str::<PoolProps>(&extra).unwrap(), props);
    // Features: written only when a pool has any.
    let with = PoolProps {
        features: vec!["encryption".into()],
        ..props.clone()
    };
    let golden_f = golden.replacen('{', r#"{"features": ["encryption"], "#, 1);
    assert_eq!(to_json(&with), json(&golden_f));
    assert_eq!(serde_json::from_str::<PoolProps>(&golden_f).unwrap(), with);
}

fn scan_record() -> ScanRecord {
    ScanRecord {
        kind: ScanKind::Resilver,
        state: ScanState::Paused,
        started_unix: 1_700_000_001,
        ended_unix: Some(1_700_000_999),
        examined: 5_000_000_001,
        total: 9_000_000_002,
        repaired: 65_536,
        errors: 2,
        phase: 3,
        bookmark: "00000000000000a1".into(),
        min_birth: 120,
        max_birth: 180,
        targets: vec![0xF00D_CAFE_0000_0001, 31],
        target_write_errors: vec![4, 0],
        failed_targets: vec![31],
        rate: 123_456_789,
        unverified: 1,
        moved: None,
    }
}

const SCAN_GOLDEN: &str = r#"{
    "kind": "resilver", "state": "paused",
    "started_unix": 1700000001, "ended_unix": 1700000999,
    "examined": 5000000001, "total": 9000000002, "repaired": 65536, "errors": 2,
    "phase": 3, "bookmark": "00000000000000a1",
    "min_birth": 120, "max_birth": 180,
    "targets": [17297704936070447105, 31], "target_write_errors": [4, 0],
    "failed_targets": [31], "rate": 123456789, "unverified": 1}"#;

#[test]
fn scan_record_json_is_pinned() {
    assert_eq!(to_json(&scan_record()), json(SCAN_GOLDEN));
    assert_eq!(
        serde_json::from_str::<ScanRecord>(SCAN_GOLDEN).unwrap(),
        scan_record()
    );
    for (kind, s) in [(ScanKind::Scrub, "scrub"), (ScanKind::Resilver, "resilver")] {
        assert_eq!(to_json(&kind), Value::from(s));
    }
    for (state, s) in [
        (ScanState::Scanning, "scanning"),
        (ScanState::Paused, "paused"),
        (ScanState::Finished, "finished"),
        (ScanState::Canceled, "canceled"),
    ] {
        assert_eq!(to_json(&state), Value::from(s));
    }
    // Written before resilvers kept their targets' write errors and before
    // the rate was recorded; a scan that has not ended.
    let old = r#"{"kind":"scrub","state":"scanning","started_unix":5,
        "examined":1,"total":2,"repaired":0,"errors":0,"phase":1,
        "bookmark":"20","min_birth":0,"max_birth":18446744073709551615,"targets":[]}"#;
    let rec: ScanRecord = serde_json::from_str(old).unwrap();
    assert_eq!(rec.ended_unix, None);
    assert!(rec.target_write_errors.is_empty());
    assert!(rec.failed_targets.is_empty());
    assert_eq!(rec.rate, 0);
    assert_eq!(rec.unverified, 0);
    assert_eq!(rec.max_birth, u64::MAX);
    assert!(serde_json::from_str::<ScanRecord>(&old.replace(r#""phase":1,"#, "")).is_err());
}

fn meta_state() -> MetaState {
    MetaState {
        created_unix: 1_650_000_000,
        config_gen: 17,
        dtl: BTreeMap::from([(0xF00D_CAFE_0000_0001, (5, 9)), (77, (100, 100))]),
        scan: Some(scan_record()),
        damaged: BTreeSet::from(["meta tree".to_string(), "object 'x' record 3".to_string()]),
        log: Some(LogHeader {
            guid: 0x8000_0000_0000_0002,
            seq: 12,
            first: LogAddr {
                vdev: 65_536,
                offset: (1 << 40) + 4096,
                psize: 131_072,
                asize: 139_264,
            },
            replay_after: None,
        }),
    }
}

#[test]
fn meta_state_json_is_pinned() {
    let golden = format!(
        r#"{{
        "created_unix": 1650000000, "config_gen": 17,
        "dtl": {{"17297704936070447105": [5, 9], "77": [100, 100]}},
        "scan": {SCAN_GOLDEN},
        "damaged": ["meta tree", "object 'x' record 3"],
        "log": {{"guid": 9223372036854775810, "seq": 12,
                 "first": {{"vdev": 65536, "offset": 1099511631872,
                           "psize": 131072, "asize": 139264}}}}}}"#
    );
    assert_eq!(to_json(&meta_state()), json(&golden));
    assert_eq!(
        serde_json::from_str::<MetaState>(&golden).unwrap(),
        meta_state()
    );
}

#[test]
fn older_and_minimal_meta_states_decode() {
    // Written before the intent log existed (no `log`), never scanned, by
    // a tarn that still had raw objects (`next_object`, ignored now).
    let old = r#"{"next_object":1,"created_unix":2,"config_gen":0,"dtl":{},
        "scan":null,"damaged":[]}"#;
    let ms: MetaState = serde_json::from_str(old).unwrap();
    assert_eq!(
        ms,
        MetaState {
            created_unix: 2,
            ..MetaState::default()
        }
    );
    // `scan` may be absent too; `log` may be null; unknown fields are ignored.
    let minimal = r#"{"created_unix":2,"config_gen":0,"dtl":{},
        "damaged":[],"log":null,"from_the_future":{"a":1}}"#;
    assert_eq!(serde_json::from_str::<MetaState>(minimal).unwrap(), ms);
    // Required fields are required.
    assert!(serde_json::from_str::<MetaState>(&old.replace(r#""dtl":{},"#, "")).is_err());
}
