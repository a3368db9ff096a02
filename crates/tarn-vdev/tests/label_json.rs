//! Golden test of the label config body (docs/format.md, "Label config
//! body"): the JSON a label holds must not change when a Rust field or
//! variant is renamed.
//!
//! The comparison parses both sides into `serde_json::Value` and compares
//! those: field order and whitespace are not part of the format (every
//! reader must accept any order), but every name, every type and every
//! value is. The values are distinctive (no defaults, guids above 2^53) so a
//! field that is dropped, renamed or narrowed cannot still compare equal.

use serde_json::Value;
use tarn_vdev::testing::MemLeaf;
use tarn_vdev::{
    read_label, write_label_config_all, LabelConfig, LeafConfig, PoolState, TopConfig, VdevKind,
    LABEL_HEADER_LEN, LABEL_MAGIC, LABEL_SIZE, MIN_LEAF_SIZE,
};

fn leaf(guid: u64, path: &str, offline: bool) -> LeafConfig {
    LeafConfig {
        guid,
        path: path.into(),
        offline,
    }
}

/// Every field set, every vdev kind used.
fn sample() -> LabelConfig {
    LabelConfig {
        version: 1,
        pool_name: "tank-golden".into(),
        pool_guid: 0xF00D_CAFE_0000_0001,
        state: PoolState::Exported,
        txg: 1_234_567,
        device_guid: 0x8000_0000_0000_0002,
        top_index: 65_537,
        ashift: 13,
        owner: Some("tarn daemon 0123456789abcdef".into()),
        tree: vec![
            TopConfig {
                kind: VdevKind::Mirror,
                guid: 11,
                children: vec![
                    leaf(101, "/dev/disk/by-id/ata-a", false),
                    leaf(102, "/srv/b.img", true),
                ],
            },
            TopConfig {
                kind: VdevKind::Raidz { parity: 2 },
                guid: 12,
                children: vec![
                    leaf(201, "/dev/sdc", false),
                    leaf(202, "/dev/sdd", false),
                    leaf(203, "/dev/sde", false),
                    leaf(204, "/dev/sdf", false),
                ],
            },
            TopConfig {
                kind: VdevKind::Single,
                guid: 13,
                children: vec![leaf(301, "/dev/sdg", false)],
            },
        ],
        logs: vec![TopConfig {
            kind: VdevKind::Single,
            guid: 14,
            children: vec![leaf(401, "/dev/nvme0n1p1", false)],
        }],
    }
}

const GOLDEN: &str = r#"{
  "version": 1,
  "pool_name": "tank-golden",
  "pool_guid": 17297704936070447105,
  "state": "Exported",
  "txg": 1234567,
  "device_guid": 9223372036854775810,
  "top_index": 65537,
  "ashift": 13,
  "owner": "tarn daemon 0123456789abcdef",
  "tree": [
    {"kind": "Mirror", "guid": 11, "children": [
      {"guid": 101, "path": "/dev/disk/by-id/ata-a", "offline": false},
      {"guid": 102, "path": "/srv/b.img", "offline": true}]},
    {"kind": {"Raidz": {"parity": 2}}, "guid": 12, "children": [
      {"guid": 201, "path": "/dev/sdc", "offline": false},
      {"guid": 202, "path": "/dev/sdd", "offline": false},
      {"guid": 203, "path": "/dev/sde", "offline": false},
      {"guid": 204, "path": "/dev/sdf", "offline": false}]},
    {"kind": "Single", "guid": 13, "children": [
      {"guid": 301, "path": "/dev/sdg", "offline": false}]}
  ],
  "logs": [
    {"kind": "Single", "guid": 14, "children": [
      {"guid": 401, "path": "/dev/nvme0n1p1", "offline": false}]}
  ]
}"#;

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap()
}

fn s<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap()
}

#[test]
fn label_config_json_is_pinned() {
    let cfg = sample();
    let written: Value = serde_json::to_value(&cfg).unwrap();
    assert_eq!(written, json(GOLDEN));
    // Round trip: the pinned text decodes to the same value.
    let back: LabelConfig = serde_json::from_str(GOLDEN).unwrap();
    assert_eq!(back, cfg);
}

#[test]
fn label_config_body_on_the_device_is_the_pinned_json() {
    // What really reaches the device: header, then exactly this JSON.
    let dev = MemLeaf::new(MIN_LEAF_SIZE);
    let cfg = sample();
    write_label_config_all(&dev, &cfg).unwrap();
    let end = MIN_LEAF_SIZE - MIN_LEAF_SIZE % LABEL_SIZE;
    for off in [0, LABEL_SIZE, end - 2 * LABEL_SIZE, end - LABEL_SIZE] {
        let head = dev.raw_read(off, LABEL_HEADER_LEN);
        assert_eq!(head[..8], LABEL_MAGIC);
        assert_eq!(u32::from_le_bytes(head[8..12].try_into().unwrap()), 1);
        let len = u32::from_le_bytes(head[12..16].try_into().unwrap()) as usize;
        let body = dev.raw_read(off + LABEL_HEADER_LEN as u64, len);
        assert_eq!(head[16..48], *blake3::hash(&body).as_bytes());
        // The writer emits compact JSON: no whitespace outside strings.
        assert!(!body.contains(&b'\n') && !body.starts_with(b"{ "));
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v, json(GOLDEN), "label at {off:#x}");
    }
    assert_eq!(read_label(&dev).unwrap().config, cfg);
}

#[test]
fn every_enum_spelling_is_pinned() {
    assert_eq!(s(&PoolState::Active), json(r#""Active""#));
    assert_eq!(s(&PoolState::Exported), json(r#""Exported""#));
    assert_eq!(s(&PoolState::Destroyed), json(r#""Destroyed""#));
    assert_eq!(s(&VdevKind::Single), json(r#""Single""#));
    assert_eq!(s(&VdevKind::Mirror), json(r#""Mirror""#));
    for p in 1..=3u8 {
        assert_eq!(
            s(&VdevKind::Raidz { parity: p }),
            json(&format!(r#"{{"Raidz":{{"parity":{p}}}}}"#))
        );
    }
    // Spelling is exact: case matters.
    assert!(serde_json::from_str::<PoolState>(r#""active""#).is_err());
    assert!(serde_json::from_str::<VdevKind>(r#""Raidz""#).is_err());
}

#[test]
fn older_and_minimal_label_configs_decode() {
    // Written before separate log devices existed: no `logs`; and no owner.
    let old = r#"{"version":1,"pool_name":"old","pool_guid":5,"state":"Active",
        "txg":9,"device_guid":6,"top_index":0,"ashift":9,
        "tree":[{"kind":"Single","guid":7,"children":[
            {"guid":6,"path":"/dev/sdz","offline":false}]}]}"#;
    let cfg: LabelConfig = serde_json::from_str(old).unwrap();
    assert!(cfg.logs.is_empty());
    assert_eq!(cfg.owner, None);
    assert_eq!(
        cfg.tree[0].children[0].path,
        std::path::PathBuf::from("/dev/sdz")
    );
    // `null` is the same as absent for `owner`; unknown fields are ignored.
    let newer = old.replacen('{', r#"{"owner":null,"from_the_future":[1,2],"#, 1);
    assert_eq!(serde_json::from_str::<LabelConfig>(&newer).unwrap(), cfg);
    // A missing required field makes the copy invalid.
    let no_txg = old.replace(r#""txg":9,"#, "");
    assert!(serde_json::from_str::<LabelConfig>(&no_txg).is_err());
}
