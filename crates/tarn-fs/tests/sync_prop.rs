//! The `sync` property through the POSIX layer: `always` commits every
//! change before it returns, `standard` commits on fsync, `disabled` makes
//! fsync return without committing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tarn_fs::{Cred, DatasetBackend, Fs, ROOT_INO};
use tarn_pool::{Pool, PoolOptions, VdevSpec};
use tarn_vdev::VdevKind;

#[test]
fn sync_property_decides_when_changes_are_durable() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let opts = PoolOptions {
        sync_interval: Duration::from_secs(3600),
        owner: "test".into(),
        ..Default::default()
    };
    let spec = VdevSpec {
        kind: VdevKind::Single,
        devices: vec![dev],
    };
    let pool = Pool::create("tank", &[spec], 12, &BTreeMap::new(), false, opts).unwrap();
    tarn_dataset::attach(&pool).unwrap();
    let c = Cred::root();
    for mode in ["always", "standard", "disabled"] {
        let name = format!("tank/{mode}");
        let props = BTreeMap::from([("sync".to_string(), mode.to_string())]);
        tarn_dataset::create(&pool, &name, &props, false).unwrap();
        let h = tarn_dataset::open(&pool, &name).unwrap();
        let fs = Fs::mount(Arc::new(DatasetBackend::new(h))).unwrap();
        pool.sync().unwrap();
        let before = pool.txg();
        let f = fs
            .create(ROOT_INO, b"f", libc::S_IFREG | 0o644, 0, libc::O_RDWR, &c)
            .unwrap();
        fs.write(f.ino, 0, b"data", false, &c).unwrap();
        let after_write = pool.txg();
        fs.fsync(f.ino).unwrap();
        let after_fsync = pool.txg();
        fs.release(f.ino).unwrap();
        match mode {
            "always" => assert!(after_write > before, "sync=always commits each change"),
            "standard" => {
                assert_eq!(after_write, before, "sync=standard waits for fsync");
                assert!(after_fsync > after_write, "fsync commits");
            }
            _ => assert_eq!(after_fsync, before, "sync=disabled: fsync commits nothing"),
        }
    }
}
