//! Large uploads and downloads with curl over a real pool: content checked
//! by hash, and the process's peak memory must grow far less than the file.

mod common;

use std::io::{Read, Write};
use std::path::Path;

use common::*;
use tarn_pool::PoolOptions;
use tarn_testkit::clients::curl;
use tarn_testkit::data::Rng;
use tarn_testkit::require;
use tarn_testkit::MIB;
use tarn_webdav::Share;

/// Writes `size` bytes of incompressible noise to `path` in 1 MiB pieces;
/// returns their BLAKE3 hash.
fn make_file(path: &Path, size: u64, seed: u64) -> blake3::Hash {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut h = blake3::Hasher::new();
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; MIB as usize];
    let mut left = size;
    while left > 0 {
        let n = left.min(MIB) as usize;
        rng.fill(&mut buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        h.update(&buf[..n]);
        left -= n as u64;
    }
    f.flush().unwrap();
    h.finalize()
}

fn hash_file(path: &Path) -> (blake3::Hash, u64) {
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; MIB as usize];
    let mut total = 0;
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        total += n as u64;
    }
    (h.finalize(), total)
}

fn round_trip(size: u64) {
    if !require::programs(&["curl"]) {
        return;
    }
    let opts = PoolOptions {
        dirty_max_bytes: 16 << 20,
        dirty_sync_bytes: 4 << 20,
        // The memory bound below counts this cache: keep it small.
        cache: Some(std::sync::Arc::new(tarn_block::BlockCache::new(8 << 20))),
        ..pool_opts()
    };
    let real = real_fs(size * 2 + (512 << 20), opts);
    let server = start(vec![Share::new("tank", real.fs.clone())]);
    let addr = server.local_addr();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src.bin");
    let dst = work.path().join("dst.bin");
    let want = make_file(&src, size, 7);

    let before = vm_hwm();
    let u = url(addr, "/tank/big.bin");
    let src_s = src.to_str().unwrap();
    let (code, body, _) = curl(&["-u", "alice:secret", "-T", src_s, &u]);
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));

    let out = std::process::Command::new("curl")
        .args(["-s", "-S", "-f", "-u", "alice:secret", "-o"])
        .arg(&dst)
        .arg(&u)
        .status()
        .unwrap();
    assert!(out.success());
    let (got, len) = hash_file(&dst);
    assert_eq!(len, size);
    assert_eq!(got, want, "downloaded content differs");

    // A range from the middle.
    let start = size / 2 + 12345;
    let range = format!("{start}-{}", start + 99_999);
    let (code, body, _) = curl(&["-u", "alice:secret", "-r", &range, &u]);
    assert_eq!(code, 206);
    let mut f = std::fs::File::open(&src).unwrap();
    let mut expect = vec![0u8; 100_000];
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(start)).unwrap();
    f.read_exact(&mut expect).unwrap();
    assert!(body == expect, "range content differs");

    let after = vm_hwm();
    let growth = after.saturating_sub(before);
    println!(
        "{} MiB round trip: VmHWM {} MiB -> {} MiB (+{} MiB)",
        size / MIB,
        before / MIB,
        after / MIB,
        growth / MIB
    );
    // What may stay in memory does not depend on the file: the cache, the
    // open txg and the one syncing (each up to the dirty limit), and the
    // transfer buffers of the server and of the test itself.
    let bound = (8 + 2 * 16 + 48) * MIB;
    assert!(
        growth < bound,
        "peak memory grew by {} MiB for a {} MiB file",
        growth / MIB,
        size / MIB
    );
    server.stop();
}

#[test]
fn stream_256_mib() {
    round_trip(256 * MIB);
}

#[test]
fn stream_2_gib() {
    round_trip(2048 * MIB);
}
