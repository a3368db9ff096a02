//! Damage beyond redundancy reaches the POSIX layer as EIO that names the
//! dataset, the inode and the record, and `status` lists it; the rest of
//! the filesystem keeps working.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use tarn_fs::{Cred, DatasetBackend, Fs, ROOT_INO};
use tarn_pool::{Pool, PoolOptions, VdevSpec};
use tarn_vdev::VdevKind;

#[test]
fn unrecoverable_block_is_eio_naming_the_file() {
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
    let pool = Pool::create(
        "tank",
        &[VdevSpec {
            kind: VdevKind::Single,
            devices: vec![dev.clone()],
        }],
        12,
        &BTreeMap::new(),
        false,
        opts,
    )
    .unwrap();
    tarn_dataset::attach(&pool).unwrap();
    let props = BTreeMap::from([("compression".to_string(), "off".to_string())]);
    tarn_dataset::create(&pool, "tank/fs", &props, false).unwrap();
    let h = tarn_dataset::open(&pool, "tank/fs").unwrap();
    let fs = Fs::mount(Arc::new(DatasetBackend::new(h))).unwrap();
    let c = Cred::root();
    let bad = fs
        .create(ROOT_INO, b"bad", libc::S_IFREG | 0o644, 0, libc::O_RDWR, &c)
        .unwrap();
    fs.write(bad.ino, 0, &[0x42; 8192], false, &c).unwrap();
    fs.release(bad.ino).unwrap();
    let good = fs
        .create(
            ROOT_INO,
            b"good",
            libc::S_IFREG | 0o644,
            0,
            libc::O_RDWR,
            &c,
        )
        .unwrap();
    fs.write(good.ino, 0, &[0x17; 5000], false, &c).unwrap();
    fs.release(good.ino).unwrap();
    pool.sync().unwrap();
    // The 8 KiB data block is the only block of that size.
    let bp = tarn_dataset::blocks(&pool, "tank/fs")
        .unwrap()
        .into_iter()
        .find(|b| b.lsize == 8192)
        .expect("the data block of 'bad'");
    let f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
    f.write_at(&[0u8; 4096], tarn_vdev::DATA_START + bp.dvas[0].offset)
        .unwrap();
    drop(f);
    let e = fs.read(bad.ino, 0, 8192).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(
        e.message().contains(&format!("inode {}", bad.ino)) && e.message().contains("tank/fs"),
        "{e}"
    );
    assert!(pool.status().damaged.iter().any(|d| d.contains("tank/fs")));
    assert_eq!(fs.read(good.ino, 0, 5000).unwrap(), vec![0x17; 5000]);
    // Deleting the damaged file works and frees its space.
    fs.unlink(ROOT_INO, b"bad", &c).unwrap();
    pool.sync().unwrap();
}
