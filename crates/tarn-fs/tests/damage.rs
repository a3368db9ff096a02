//! Damage beyond redundancy reaches the POSIX layer as EIO that names the
//! dataset, the inode and the record, and `status` lists it; the rest of
//! the filesystem keeps working.

use tarn_fs::{Cred, ROOT_INO};
use tarn_testkit::datasets::{filesystem, new_file};
use tarn_testkit::files::overwrite;
use tarn_testkit::pools::tank;
use tarn_vdev::VdevKind;

#[test]
fn unrecoverable_block_is_eio_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let pool = tank(dir.path(), VdevKind::Single, 1, 64 << 20);
    let dev = dir.path().join("d0");
    let fs = filesystem(&pool, "tank/fs", &[("compression", "off")]);
    let c = Cred::root();
    let bad = new_file(&fs, "bad");
    fs.write(bad, 0, &[0x42; 8192], false, &c).unwrap();
    fs.release(bad).unwrap();
    let good = new_file(&fs, "good");
    fs.write(good, 0, &[0x17; 5000], false, &c).unwrap();
    fs.release(good).unwrap();
    pool.sync().unwrap();
    // The 8 KiB data block is the only block of that size.
    let bp = tarn_dataset::blocks(&pool, "tank/fs")
        .unwrap()
        .into_iter()
        .find(|b| b.lsize == 8192)
        .expect("the data block of 'bad'");
    overwrite(
        &dev,
        tarn_vdev::DATA_START + bp.dvas[0].offset,
        &[0u8; 4096],
    );
    let e = fs.read(bad, 0, 8192).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(
        e.message().contains(&format!("inode {}", bad)) && e.message().contains("tank/fs"),
        "{e}"
    );
    assert!(pool.status().damaged.iter().any(|d| d.contains("tank/fs")));
    assert_eq!(fs.read(good, 0, 5000).unwrap(), vec![0x17; 5000]);
    // Deleting the damaged file works and frees its space.
    fs.unlink(ROOT_INO, b"bad", &c).unwrap();
    pool.sync().unwrap();
}
