//! Real clients (libnfs's nfs-cp / nfs-ls / nfs-cat) against the server,
//! over `MemBackend` and over a real pool dataset.

mod common;

use std::sync::Arc;

use common::*;
use tarn_nfs::ExportFs;
use tarn_testkit::clients::{nfs_cp, nfs_tools, tool, write_file};
use tarn_testkit::data::pattern;
use tarn_testkit::datasets::filesystem;
use tarn_testkit::pools::tank;
use tarn_vdev::VdevKind;

const MIB: usize = 1 << 20;

/// Copies each (name, data) in through `export`, back out, and compares;
/// then checks the listing.
fn round_trip(r: &tarn_nfs::Running, export: &str, files: &[(&str, Vec<u8>)]) {
    let tmp = tempfile::tempdir().unwrap();
    for (name, data) in files {
        let src = write_file(tmp.path(), name, data);
        assert!(
            nfs_cp(&src, &url(r, export, &format!("/{name}"))),
            "copy in {name}"
        );
    }
    for (name, data) in files {
        let back = tmp.path().join(format!("{name}.back"));
        let back_s = back.to_string_lossy().into_owned();
        assert!(
            nfs_cp(&url(r, export, &format!("/{name}")), &back_s),
            "copy out {name}"
        );
        let got = std::fs::read(&back).unwrap();
        assert_eq!(got.len(), data.len(), "{name}: length");
        assert!(got == *data, "{name}: content differs");
    }
    // nfs-cat of a small file.
    if let Some((name, data)) = files.iter().find(|(_, d)| !d.is_empty() && d.len() < 4096) {
        let (ok, out, err) = tool(&["nfs-cat", &url(r, export, &format!("/{name}"))]);
        assert!(ok, "nfs-cat: {err}");
        assert_eq!(&out, data);
    }
    let (ok, out, err) = tool(&["nfs-ls", &url(r, export, "/")]);
    assert!(ok, "nfs-ls failed: {err}");
    let listing = String::from_utf8_lossy(&out);
    for (name, data) in files {
        let line = listing
            .lines()
            .find(|l| l.split_whitespace().last() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing from listing:\n{listing}"));
        assert!(
            line.split_whitespace().any(|f| f == data.len().to_string()),
            "{name}: size {} not in {line:?}",
            data.len()
        );
    }
}

fn sample_files(big: usize) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("empty", vec![]),
        ("one", vec![b'x']),
        ("mib1", pattern(1, MIB + 1)),
        ("big", pattern(2, big)),
    ]
}

#[test]
fn mem_backend_copy_in_out_and_list() {
    if !nfs_tools() {
        return;
    }
    let fs = mem_fs();
    let r = start(vec![open_export("/tank/photos", fs.clone())]);
    round_trip(&r, "/tank/photos", &sample_files(64 * MIB));
    // The files are really in the filesystem, owned by the caller.
    let a = fs.lookup(1, b"mib1", &tarn_fs::Cred::root()).unwrap();
    assert_eq!(a.size, (MIB + 1) as u64);
}

#[test]
fn mem_backend_one_gib() {
    if !nfs_tools() {
        return;
    }
    let r = start(vec![open_export("/big", mem_fs())]);
    round_trip(&r, "/big", &[("gib", pattern(9, 1 << 30))]);
}

#[test]
fn many_entries_listing() {
    if !nfs_tools() {
        return;
    }
    let fs = mem_fs();
    let root = tarn_fs::Cred::root();
    for i in 0..1500 {
        let a = fs
            .create(
                1,
                format!("file{i:05}").as_bytes(),
                0o644,
                0,
                libc::O_CREAT,
                &root,
            )
            .unwrap();
        fs.release(a.ino).unwrap();
    }
    let r = start(vec![open_export("/many", fs)]);
    let (ok, out, err) = tool(&["nfs-ls", &url(&r, "/many", "/")]);
    assert!(ok, "{err}");
    let listing = String::from_utf8_lossy(&out);
    let mut names: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|n| n.starts_with("file"))
        .collect();
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "duplicate entries");
    assert_eq!(names.len(), 1500, "every entry exactly once");
}

// ----- a real pool ------------------------------------------------------

#[test]
fn real_dataset_copy_in_out_and_list() {
    if !nfs_tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pool = tank(dir.path(), VdevKind::Mirror, 2, 512 << 20);
    let fs = Arc::new(filesystem(&pool, "tank/photos", &[]));
    let dyn_fs: Arc<dyn ExportFs> = fs.clone();
    let r = start(vec![open_export("/tank/photos", dyn_fs)]);
    round_trip(&r, "/tank/photos", &sample_files(16 * MIB));
    // Commit everything and read it back through the pool.
    pool.sync().unwrap();
    let a = fs.lookup(1, b"big", &tarn_fs::Cred::root()).unwrap();
    assert_eq!(a.size, (16 * MIB) as u64);
    let data = fs.read(a.ino, 0, 4096).unwrap();
    assert_eq!(data, pattern(2, 16 * MIB)[..4096]);
}
