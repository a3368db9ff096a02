//! Real NBD clients against the server over `MemDevice`: libnbd's
//! `nbdinfo` and `nbdcopy`, qemu's `qemu-io` and `qemu-img`, and fio's nbd
//! engine. Each test skips (with a message) when its program is missing,
//! and fails instead under `TARN_REQUIRE_ALL`.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::*;
use tarn_nbd::{NbdConfig, NbdExport};
use tarn_testkit::require;
use tarn_vol::testing::MemDevice;
use tarn_vol::Device;

/// Runs a program; returns (success, stdout, stderr).
fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", args[0]));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs a program that must succeed; returns its stdout.
fn ok(args: &[&str]) -> String {
    let (good, out, err) = run(args);
    assert!(good, "{} failed:\n{out}\n{err}", args.join(" "));
    out
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}):\n{s}"))
}

fn mem(size: u64, block: u32) -> Arc<MemDevice> {
    Arc::new(MemDevice::new(size, block))
}

#[test]
fn nbdinfo_lists_exports_and_reads_their_details() {
    if require::program("nbdinfo").is_none() {
        return;
    }
    let mut disk = NbdExport::new("disk", mem(64 * MIB, 4096));
    disk.description = Some("the test disk".into());
    let mut ro = NbdExport::new("backup", mem(8 * MIB, 512));
    ro.read_only = true;
    let r = start(vec![disk, ro]);

    let list = json(&ok(&["nbdinfo", "--list", "--json", &url(&r, "")]));
    let exports = list["exports"].as_array().expect("an export list");
    let names: Vec<&str> = exports
        .iter()
        .map(|e| e["export-name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["disk", "backup"], "{list}");
    let disk = &exports[0];
    assert_eq!(disk["description"], "the test disk", "{disk}");
    assert_eq!(disk["export-size"], 64 * MIB);
    assert_eq!(disk["block_size_minimum"], 1);
    assert_eq!(disk["block_size_preferred"], 4096);
    assert_eq!(disk["block_size_maximum"], 32 * MIB);
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_fast_zero",
        "can_cache",
        "can_multi_conn",
        "can_df",
    ] {
        assert_eq!(disk[flag], true, "{flag} in {disk}");
    }
    assert_eq!(disk["is_read_only"], false);
    let ctx = disk["contexts"].as_array().expect("contexts");
    assert!(ctx.iter().any(|c| c == "base:allocation"), "{disk}");

    let one = json(&ok(&["nbdinfo", "--json", &url(&r, "backup")]));
    let b = &one["exports"][0];
    assert_eq!(b["export-name"], "backup");
    assert_eq!(b["is_read_only"], true, "{b}");
    assert_eq!(b["can_trim"], false);
    assert_eq!(b["export-size"], 8 * MIB);
    assert_eq!(b["block_size_preferred"], 512);

    // An unknown export is an error naming it.
    let (good, _, err) = run(&["nbdinfo", &url(&r, "nope")]);
    assert!(!good);
    assert!(err.contains("nope"), "{err}");
}

#[test]
fn nbdinfo_map_matches_the_device_holes() {
    if require::program("nbdinfo").is_none() {
        return;
    }
    let dev = mem(16 * MIB, 4096);
    // Data at [1 MiB, 1 MiB + 8 KiB), [4 MiB, 6 MiB) and the last block.
    dev.write(MIB, &pattern(1, 8192), false).unwrap();
    dev.write(4 * MIB, &pattern(2, 2 * MIB as usize), false)
        .unwrap();
    dev.write(16 * MIB - 4096, &pattern(3, 4096), false)
        .unwrap();
    let r = start(vec![NbdExport::new("d", dev.clone())]);
    let map = json(&ok(&["nbdinfo", "--map", "--json", &url(&r, "d")]));
    let got: Vec<(u64, u64, u64)> = map
        .as_array()
        .expect("a map")
        .iter()
        .map(|e| {
            (
                e["offset"].as_u64().unwrap(),
                e["length"].as_u64().unwrap(),
                e["type"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(u64, u64, u64)> = {
        let mut at = 0;
        dev.extents(0, 16 * MIB)
            .unwrap()
            .into_iter()
            .map(|e| {
                let x = (at, e.len, if e.hole { 3 } else { 0 });
                at += e.len;
                x
            })
            .collect()
    };
    assert_eq!(got, want, "{map}");
    assert_eq!(want.len(), 6);
}

#[test]
fn qemu_io_writes_reads_flushes_discards_and_zeroes() {
    qemu_io_script(false);
}

/// The same with every read answered from memory on the network thread
/// (as a volume's cached blocks are): the same bytes reach the client.
#[test]
fn qemu_io_reads_answered_from_memory() {
    qemu_io_script(true);
}

fn qemu_io_script(from_memory: bool) {
    if require::program("qemu-io").is_none() {
        return;
    }
    let dev = Probe::new(16 * MIB, 4096);
    dev.from_memory
        .store(from_memory, std::sync::atomic::Ordering::SeqCst);
    let r = start(vec![NbdExport::new("vol", dev.clone())]);
    let u = url(&r, "vol");
    let out = ok(&[
        "qemu-io",
        "-f",
        "raw",
        &u,
        "-c",
        "write -P 0xab 0 1M",
        "-c",
        "read -P 0xab 0 1M",
        "-c",
        "write -f -P 0xcd 2M 64k",
        "-c",
        "flush",
        "-c",
        "write -P 0x11 4M 1M",
        "-c",
        "discard 4M 512k",
        "-c",
        "write -z 4608k 256k",
        "-c",
        "read -P 0 4M 768k",
        "-c",
        "read -P 0x11 4864k 256k",
        "-c",
        "read -P 0xcd 2M 64k",
    ]);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    assert!(
        out.contains("read 1048576/1048576 bytes at offset 0"),
        "{out}"
    );
    let c = dev.mem.contents();
    assert!(c[..MIB as usize].iter().all(|&b| b == 0xab));
    assert!(c[2 * MIB as usize..2 * MIB as usize + 65536]
        .iter()
        .all(|&b| b == 0xcd));
    assert!(c[4 * MIB as usize..4 * MIB as usize + 768 * 1024]
        .iter()
        .all(|&b| b == 0));
    assert!(c[4 * MIB as usize + 768 * 1024..5 * MIB as usize]
        .iter()
        .all(|&b| b == 0x11));
    assert!(dev.mem.flushes() >= 1, "the flush reached the device");
    assert!(
        Probe::get(&dev.fua_writes) >= 1,
        "write -f reached the device as FUA"
    );
    assert!(
        Probe::get(&dev.trims) >= 1,
        "discard reached the device as a trim"
    );
    assert!(
        Probe::get(&dev.zeroes) >= 1,
        "write -z reached the device as write zeroes"
    );

    // A pattern that does not match is reported: the check can fail.
    let (good, out, _) = run(&["qemu-io", "-f", "raw", &u, "-c", "read -P 0x55 0 4k"]);
    assert!(
        !good && out.contains("Pattern verification failed"),
        "{out}"
    );
    let cached = Probe::get(&dev.cached_reads);
    if from_memory {
        assert!(
            cached >= 5,
            "the reads were answered from memory ({cached})"
        );
    } else {
        assert_eq!(cached, 0);
    }
}

#[test]
fn qemu_io_on_a_read_only_export_refuses_writes() {
    if require::program("qemu-io").is_none() {
        return;
    }
    let dev = mem(4 * MIB, 4096);
    dev.write(0, &[7; 4096], false).unwrap();
    let mut e = NbdExport::new("ro", dev.clone());
    e.read_only = true;
    let r = start(vec![e]);
    let u = url(&r, "ro");
    ok(&["qemu-io", "-r", "-f", "raw", &u, "-c", "read -P 7 0 4k"]);
    // qemu sees NBD_FLAG_READ_ONLY and refuses to open the export for
    // writing, or to write to it when opened read-only.
    for opts in [&["-f", "raw"][..], &["-r", "-f", "raw"][..]] {
        let mut args = vec!["qemu-io"];
        args.extend_from_slice(opts);
        args.extend_from_slice(&[&u, "-c", "write -P 1 0 4k"]);
        let (good, out, err) = run(&args);
        assert!(!good, "a write to a read-only export fails:\n{out}\n{err}");
    }
    assert!(
        dev.contents()[..4096].iter().all(|&b| b == 7),
        "nothing written"
    );
}

fn write_file(dir: &Path, name: &str, data: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p.to_string_lossy().into_owned()
}

/// 32 MiB with data and holes.
fn image() -> Vec<u8> {
    let mut img = vec![0u8; 32 * MIB as usize];
    for (i, chunk) in img.chunks_mut(MIB as usize).enumerate() {
        if i % 3 != 1 {
            let p = pattern(i as u64 + 10, chunk.len() / 2);
            chunk[..p.len()].copy_from_slice(&p);
        }
    }
    img
}

#[test]
fn qemu_img_convert_and_compare_byte_for_byte() {
    if !require::programs(&["qemu-img"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = image();
    let src = write_file(dir.path(), "src.img", &img);
    let dev = mem(32 * MIB, 65536);
    let r = start(vec![NbdExport::new("vol", dev.clone())]);
    let u = url(&r, "vol");
    ok(&[
        "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", &src, &u,
    ]);
    assert!(dev.contents() == img, "the export holds the image");
    ok(&["qemu-img", "compare", "-f", "raw", "-F", "raw", &src, &u]);
    let back = dir.path().join("back.img");
    ok(&[
        "qemu-img",
        "convert",
        "-f",
        "raw",
        "-O",
        "raw",
        &u,
        back.to_str().unwrap(),
    ]);
    assert!(std::fs::read(&back).unwrap() == img, "the image read back");
    // One changed byte is found.
    dev.write(17 * MIB + 5, &[0x5a], false).unwrap();
    let (same, out, _) = run(&["qemu-img", "compare", "-f", "raw", "-F", "raw", &src, &u]);
    assert!(!same, "compare finds the difference: {out}");
    assert!(out.contains(&format!("{}", 17 * MIB)), "{out}");
    // `qemu-img map` sees the holes through block status.
    let map = json(&ok(&["qemu-img", "map", "--output=json", "-f", "raw", &u]));
    let zero_bytes: u64 = map
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["zero"] == true)
        .map(|e| e["length"].as_u64().unwrap())
        .sum();
    let holes = dev
        .extents(0, 32 * MIB)
        .unwrap()
        .iter()
        .filter(|e| e.hole)
        .map(|e| e.len)
        .sum::<u64>();
    assert_eq!(zero_bytes, holes, "{map}");
}

#[test]
fn nbdcopy_with_several_connections() {
    if !require::programs(&["nbdcopy"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = image();
    let src = write_file(dir.path(), "src.img", &img);
    let dev = mem(32 * MIB, 4096);
    let r = start(vec![NbdExport::new("vol", dev.clone())]);
    let u = url(&r, "vol");
    ok(&[
        "nbdcopy",
        "--connections=4",
        "--threads=4",
        "--requests=32",
        "--flush",
        &src,
        &u,
    ]);
    assert!(dev.contents() == img, "the export holds the image");
    assert!(dev.flushes() >= 1, "--flush reached the device");
    assert!(
        r.stats().accepted >= 4,
        "several connections were used: {:?}",
        r.stats()
    );
    let out = dir.path().join("out.img");
    ok(&[
        "nbdcopy",
        "--connections=4",
        "--threads=4",
        &u,
        out.to_str().unwrap(),
    ]);
    assert!(std::fs::read(&out).unwrap() == img, "the image read back");
}

fn fio(u: &str, args: &[&str]) -> String {
    let mut all = vec![
        "fio",
        "--name=nbd",
        "--ioengine=nbd",
        "--size=32M",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--output-format=terse",
        // No verification state file left in the working folder.
        "--verify_state_save=0",
    ];
    let uri = format!("--uri={u}");
    all.push(&uri);
    all.extend_from_slice(args);
    ok(&all)
}

#[test]
fn fio_random_4k_and_sequential_1m_with_verification() {
    if !require::programs(&["fio"]) {
        return;
    }
    let dev = mem(32 * MIB, 4096);
    let r = start(vec![NbdExport::new("vol", dev.clone())]);
    let u = url(&r, "vol");
    // Terse format, version 3: the fifth field is the job's error code.
    let error = |out: &str| {
        out.lines()
            .find(|l| l.starts_with("3;fio-"))
            .and_then(|l| l.split(';').nth(4))
            .map(str::to_string)
    };
    let out = fio(&u, &["--rw=randwrite", "--bs=4k", "--iodepth=32"]);
    assert_eq!(error(&out).as_deref(), Some("0"), "{out}");
    let out = fio(&u, &["--rw=write", "--bs=1M", "--iodepth=8"]);
    assert_eq!(error(&out).as_deref(), Some("0"), "{out}");
    assert!(
        dev.extents(0, 32 * MIB).unwrap().iter().all(|e| !e.hole),
        "fio wrote everything"
    );
}

#[test]
fn multi_connection_clients_see_each_others_writes_after_flush() {
    if require::program("qemu-io").is_none() {
        return;
    }
    // Two qemu-io processes, each its own connection, on disjoint halves;
    // then a third reads everything back.
    let dev = mem(8 * MIB, 4096);
    let r = start_with(
        NbdConfig {
            max_connections_per_address: 4,
            ..NbdConfig::default()
        },
        vec![NbdExport::new("vol", dev.clone())],
    );
    let u = url(&r, "vol");
    let (a, b) = (u.clone(), u.clone());
    let ta = std::thread::spawn(move || {
        ok(&[
            "qemu-io",
            "-f",
            "raw",
            &a,
            "-c",
            "write -P 0xa1 0 4M",
            "-c",
            "flush",
        ])
    });
    let tb = std::thread::spawn(move || {
        ok(&[
            "qemu-io",
            "-f",
            "raw",
            &b,
            "-c",
            "write -P 0xb2 4M 4M",
            "-c",
            "flush",
        ])
    });
    ta.join().unwrap();
    tb.join().unwrap();
    ok(&[
        "qemu-io",
        "-f",
        "raw",
        &u,
        "-c",
        "read -P 0xa1 0 4M",
        "-c",
        "read -P 0xb2 4M 4M",
    ]);
    let c = dev.contents();
    assert!(c[..4 * MIB as usize].iter().all(|&x| x == 0xa1));
    assert!(c[4 * MIB as usize..].iter().all(|&x| x == 0xb2));
}
