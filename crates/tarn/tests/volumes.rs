//! Volumes through the real daemon and real NBD and iSCSI clients:
//! create, share, qemu-img, nbdcopy and fio verify jobs, libiscsi's tools
//! with CHAP users, a snapshot under write load served read-only, TRIM
//! giving space back, and SIGKILL crash loops under flushing writes over
//! both protocols.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::clients::{add_user, tarn_with_stdin};
use common::iscsi::Iscsi;
use common::nbd::Nbd;
use common::process::{files, Daemon};
use common::seeded::crash_settings;
use tarn_testkit::data::{pattern, Rng};
use tarn_testkit::net::free_port;
use tarn_testkit::require;

const MIB: u64 = 1 << 20;

/// A daemon serving NBD on a free port, with a raidz1 pool `tank`.
fn daemon(dir: &Path, log: &Path) -> (Daemon, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let d = Daemon::start_logged(dir, &["--nbd", &addr, "--txg-interval", "1"], log);
    (d, addr)
}

fn pool(d: &Daemon, dir: &Path) {
    let f = files(dir, "m", 4, 256 << 20);
    d.ok(&[
        "pool", "create", "tank", "raidz1", &f[0], &f[1], &f[2], &f[3],
    ]);
}

fn run(args: &[&str]) -> std::process::Output {
    let o = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", args[0]));
    assert!(
        o.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Writes a raw image of `mib` MiB to `path`, MiB `i` seeded with
/// `seed + i` except every `every`-th (from the second), a hole; returns
/// its bytes.
fn image_with_holes(path: &Path, mib: usize, every: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; mib << 20];
    for (i, chunk) in bytes.chunks_mut(MIB as usize).enumerate() {
        if i % every != 1 {
            chunk.copy_from_slice(&pattern(seed + i as u64, MIB as usize));
        }
    }
    std::fs::write(path, &bytes).unwrap();
    bytes
}

/// `qemu-img convert` of raw `img` into the raw device at `url`, which
/// it does not create.
fn qemu_img_convert<'a>(img: &'a Path, url: &'a str) -> [&'a str; 9] {
    [
        "qemu-img",
        "convert",
        "-n",
        "-f",
        "raw",
        "-O",
        "raw",
        img.to_str().unwrap(),
        url,
    ]
}

/// Runs [`qemu_img_convert`], which must succeed.
fn qemu_img_into(img: &Path, url: &str) {
    run(&qemu_img_convert(img, url));
}

/// Discards all 64 MiB of the volume `tank/vm` at `url` with qemu-io
/// (NBD TRIM, iSCSI UNMAP): its space goes back to the pool within a few
/// txgs, and it reads as zeros.
fn discard_frees_space(d: &Daemon, url: &str) {
    d.ok(&["pool", "sync", "tank"]);
    let (before, _) = used_by(d, "tank/vm");
    run(&["qemu-io", "-f", "raw", url, "-c", "discard 0 64M"]);
    for _ in 0..3 {
        d.ok(&["pool", "sync", "tank"]);
    }
    let (after, _) = used_by(d, "tank/vm");
    assert!(
        after < before / 10,
        "discard kept the space: {before} -> {after}"
    );
    let zeros = run(&["qemu-io", "-f", "raw", url, "-c", "read -P 0 0 64M"]);
    assert!(!String::from_utf8_lossy(&zeros.stdout).contains("Pattern verification failed"));
}

fn used_by(d: &Daemon, name: &str) -> (u64, u64) {
    let v: serde_json::Value =
        serde_json::from_str(&d.ok(&["-o", "json", "dataset", "list", "-t", "all"])).unwrap();
    let row = v
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {v}"));
    (
        row["usedbydataset"].as_u64().unwrap(),
        row["usedbysnapshots"].as_u64().unwrap(),
    )
}

#[test]
fn real_nbd_clients_read_and_write_a_volume() {
    if !require::programs(&["qemu-img", "qemu-io", "nbdcopy", "nbdinfo", "fio"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("daemon.log");
    let (d, addr) = daemon(dir.path(), &log);
    pool(&d, dir.path());
    d.ok(&[
        "volume",
        "create",
        "-V",
        "64M",
        "-o",
        "volblocksize=64K",
        "tank/vm",
    ]);
    // A filesystem cannot be shared over NBD, a volume not over NFS.
    d.ok(&["dataset", "create", "tank/fs"]);
    assert!(d
        .fails(&["share", "add", "x", "tank/fs", "--nbd", "127.0.0.1/32"])
        .contains("not a volume"));
    assert!(d
        .fails(&["share", "add", "x", "tank/vm", "--nfs", "127.0.0.1/32"])
        .contains("not a filesystem"));
    d.ok(&["share", "add", "vm", "tank/vm", "--nbd", "127.0.0.1/32"]);
    let url = format!("nbd://{addr}/vm");
    let listed = d.ok(&["volume", "list"]);
    assert!(
        listed.contains("64K"),
        "-o volblocksize was not applied:\n{listed}"
    );
    // A volume is never mounted as a filesystem.
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let err = d.fails(&["mount", "tank/vm", mnt.to_str().unwrap()]);
    assert!(err.contains("volume"), "{err}");

    let info = run(&["nbdinfo", "--json", &url]);
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["exports"][0]["export-size"], 64 * MIB, "{info}");

    // qemu-img: a raw image with holes and data in, compared, and out.
    let img = dir.path().join("guest.raw");
    let bytes = image_with_holes(&img, 48, 3, 0);
    qemu_img_into(&img, &url);
    let cmp = Command::new("qemu-img")
        .args([
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            img.to_str().unwrap(),
            &url,
        ])
        .output()
        .unwrap();
    // The volume is longer: compare says so but finds the rest zero (0).
    assert_eq!(
        cmp.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&cmp.stdout)
    );
    let out = dir.path().join("back.raw");
    run(&["nbdcopy", &url, out.to_str().unwrap()]);
    let back = std::fs::read(&out).unwrap();
    assert_eq!(back.len() as u64, 64 * MIB);
    assert!(
        back[..bytes.len()] == bytes[..],
        "nbdcopy read back other bytes"
    );
    assert!(back[bytes.len()..].iter().all(|&b| b == 0));
    // Holes are reported: the map of the first 3 MiB shows data, hole, data.
    let map = run(&["nbdinfo", "--map", "--json", &url]);
    let map: serde_json::Value = serde_json::from_slice(&map.stdout).unwrap();
    let hole_at = |off: u64| {
        map.as_array().unwrap().iter().any(|e| {
            let (o, l) = (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap());
            o <= off && off < o + l && e["type"].as_u64().unwrap() & 1 == 1
        })
    };
    assert!(
        !hole_at(0) && hole_at(MIB + 4096) && !hole_at(2 * MIB),
        "{map}"
    );

    // fio's nbd engine: random 4k and sequential 1M writes, verified.
    for (rw, bs) in [("randwrite", "4k"), ("write", "1M")] {
        run(&[
            "fio",
            "--name=v",
            "--ioengine=nbd",
            &format!("--uri={url}"),
            &format!("--rw={rw}"),
            &format!("--bs={bs}"),
            "--size=32M",
            "--iodepth=16",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ]);
    }

    // TRIM gives space back.
    discard_frees_space(&d, &url);

    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!said.contains("panicked"), "the daemon panicked:\n{said}");
    d.stop();
}

/// Runs a program; returns (success, stdout and stderr).
fn try_run(args: &[&str]) -> (bool, String) {
    let o = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", args[0]));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

/// The unit serial number (VPD page 80h) of the logical unit at `url`, as
/// libiscsi's `iscsi-inq` shows it.
fn unit_serial(url: &str) -> String {
    let (ok, out) = try_run(&["iscsi-inq", "-e", "1", "-c", "128", url]);
    assert!(ok, "{url}: {out}");
    let serial = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Unit Serial Number:"))
        .map(|s| s.trim().trim_matches(|c| c == '[' || c == ']').to_string())
        .unwrap_or_default();
    assert!(!serial.is_empty(), "{url}: no serial in {out}");
    serial
}

/// Sets `user`'s CHAP secret through `tarn user chap --secret-stdin`.
fn set_chap(d: &Daemon, user: &str, secret: &str) -> std::process::Output {
    tarn_with_stdin(
        d,
        &["user", "chap", "--secret-stdin", user],
        &format!("{secret}\n"),
    )
}

#[test]
fn iscsi_shares_with_chap_users_through_the_daemon() {
    if !require::programs(&["iscsi-ls", "iscsi-inq", "qemu-img", "qemu-io", "nbdcopy"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("daemon.log");
    let nbd = format!("127.0.0.1:{}", free_port());
    let iscsi = format!("127.0.0.1:{}", free_port());
    let d = Daemon::start_logged(
        dir.path(),
        &["--nbd", &nbd, "--iscsi", &iscsi, "--txg-interval", "1"],
        &log,
    );
    pool(&d, dir.path());
    d.ok(&["volume", "create", "-V", "64M", "-b", "64K", "tank/vm"]);
    d.ok(&["volume", "create", "-V", "8M", "tank/lab"]);
    add_user(&d, "alice", "alice-login-pw");
    add_user(&d, "nas", "nas-login-pw");

    // What the daemon refuses, and why.
    let refuse = |args: &[&str], why: &str| {
        let err = d.fails(args);
        assert!(err.contains(why), "{args:?}: {err}");
    };
    refuse(
        &["share", "add", "vm", "tank/vm", "--iscsi", "auto"],
        "client networks",
    );
    refuse(
        &[
            "share",
            "add",
            "vm",
            "tank/vm",
            "--iscsi",
            "auto,chap=alice",
        ],
        "no CHAP secret",
    );
    refuse(
        &[
            "share",
            "add",
            "vm",
            "tank/vm",
            "--iscsi",
            "auto,chap=carol",
        ],
        "no user 'carol'",
    );
    refuse(
        &[
            "share",
            "add",
            "vm",
            "tank/vm",
            "--iscsi",
            "IQN.Upper,client=::1",
        ],
        "not an iSCSI name",
    );
    d.ok(&["dataset", "create", "tank/fs"]);
    refuse(
        &["share", "add", "x", "tank/fs", "--iscsi", "auto,client=::1"],
        "not a volume",
    );
    let o = set_chap(&d, "alice", "short");
    assert!(!o.status.success(), "a 5-byte CHAP secret was taken");
    let o = set_chap(&d, "alice", "alice-login-pw");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("differ from the user's password"),
        "{o:?}"
    );
    assert!(set_chap(&d, "alice", "alice-chap-secret-1")
        .status
        .success());
    // Nor may the password become the secret stored in the clear.
    let o = tarn_with_stdin(
        &d,
        &["user", "passwd", "--password-stdin", "alice"],
        "alice-chap-secret-1\n",
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("differ from the user's CHAP secret"),
        "{o:?}"
    );
    assert!(set_chap(&d, "nas", "alice-chap-secret-1").status.success());
    refuse(
        &[
            "share",
            "add",
            "vm",
            "tank/vm",
            "--iscsi",
            "auto,chap=alice,mutual=nas",
        ],
        "different secrets",
    );
    assert!(set_chap(&d, "nas", "nas-target-secret").status.success());

    // vm: CHAP from anywhere, served over NBD as well; lab: no CHAP,
    // loopback only, read-only.
    d.ok(&[
        "share",
        "add",
        "vm",
        "tank/vm",
        "--nbd",
        "127.0.0.1/32",
        "--iscsi",
        "auto,chap=alice",
    ]);
    let lab_iqn = "iqn.2026-11.org.example:lab";
    d.ok(&[
        "share",
        "add",
        "lab",
        "tank/lab",
        "--iscsi",
        &format!("{lab_iqn},client=127.0.0.1/32"),
        "--iscsi-ro",
    ]);
    // alice logs in to vm with her secret: it may not be a target's
    // mutual secret anywhere (a login to one could answer for the other).
    refuse(
        &[
            "share",
            "add",
            "vm2",
            "tank/lab",
            "--iscsi",
            "auto,chap=nas,mutual=alice",
        ],
        "the other way round",
    );
    // Nor can a secret changed later make that clash: nas is the mutual
    // user of vm3, and may not take the secret alice logs in to vm with.
    add_user(&d, "bob", "bob-login-pw");
    assert!(set_chap(&d, "bob", "bob-chap-secret-1").status.success());
    d.ok(&["volume", "create", "-V", "8M", "tank/vm3"]);
    d.ok(&[
        "share",
        "add",
        "vm3",
        "tank/vm3",
        "--iscsi",
        "iqn.2026-11.org.example:vm3,chap=bob,mutual=nas,client=127.0.0.1/32",
    ]);
    let o = set_chap(&d, "nas", "alice-chap-secret-1");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("the other way round"),
        "{o:?}"
    );
    d.ok(&["share", "del", "vm3"]);
    refuse(
        &[
            "share",
            "add",
            "lab2",
            "tank/vm",
            "--iscsi",
            &format!("{lab_iqn},client=::1"),
        ],
        "already serves",
    );
    let vm_iqn = "iqn.2026-11.org.tarn:tank.vm";
    let listed = d.ok(&["share", "list"]);
    assert!(
        listed.contains(vm_iqn) && listed.contains("chap=alice"),
        "{listed}"
    );
    let users = d.ok(&["user", "list"]);
    assert!(users.contains("CHAP"), "{users}");

    // Discovery lists both targets; logins need alice's CHAP secret.
    let (ok, out) = try_run(&["iscsi-ls", &format!("iscsi://{iscsi}")]);
    assert!(ok && out.contains(vm_iqn) && out.contains(lab_iqn), "{out}");
    let good = format!("iscsi://alice%alice-chap-secret-1@{iscsi}/{vm_iqn}/0");
    let (ok, out) = try_run(&["iscsi-inq", &good]);
    assert!(ok, "CHAP login: {out}");
    for bad in [
        format!("iscsi://alice%not-the-secret-1@{iscsi}/{vm_iqn}/0"),
        format!("iscsi://alice%alice-login-pw@{iscsi}/{vm_iqn}/0"),
        format!("iscsi://{iscsi}/{vm_iqn}/0"),
    ] {
        let (ok, out) = try_run(&["iscsi-inq", &bad]);
        assert!(!ok, "{bad} logged in: {out}");
    }

    // An image written over iSCSI reads back over NBD.
    let img = dir.path().join("guest.raw");
    let bytes = image_with_holes(&img, 40, 4, 100);
    qemu_img_into(&img, &good);
    let back = dir.path().join("back.raw");
    run(&[
        "nbdcopy",
        &format!("nbd://{nbd}/vm"),
        back.to_str().unwrap(),
    ]);
    let read = std::fs::read(&back).unwrap();
    assert_eq!(read.len() as u64, 64 * MIB);
    assert!(read[..bytes.len()] == bytes[..], "NBD reads other bytes");
    assert!(read[bytes.len()..].iter().all(|&b| b == 0));

    // UNMAP (qemu's discard over iSCSI) gives the space back.
    discard_frees_space(&d, &good);

    // A new secret takes effect at once; the old one stops working.
    assert!(set_chap(&d, "alice", "alice-chap-secret-2")
        .status
        .success());
    let (ok, _) = try_run(&["iscsi-inq", &good]);
    assert!(!ok, "the old CHAP secret still logs in");
    let (ok, out) = try_run(&[
        "iscsi-inq",
        &format!("iscsi://alice%alice-chap-secret-2@{iscsi}/{vm_iqn}/0"),
    ]);
    assert!(ok, "{out}");
    // A secret a share logs in with cannot be removed, nor its user.
    let o = tarn_with_stdin(&d, &["user", "chap", "--remove", "alice"], "");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("share 'vm'"),
        "{o:?}"
    );
    refuse(&["user", "del", "alice"], "share 'vm'");

    // The read-only target refuses writes and still reads.
    let lab = format!("iscsi://{iscsi}/{lab_iqn}/0");
    let (ok, out) = try_run(&["qemu-img", "info", &lab]);
    assert!(ok && out.contains("8 MiB"), "{out}");
    let small = dir.path().join("small.raw");
    std::fs::write(&small, pattern(7, MIB as usize)).unwrap();
    let (ok, _) = try_run(&qemu_img_convert(&small, &lab));
    assert!(!ok, "a read-only target took a write");

    // Removing the share removes the target.
    let lab_serial = unit_serial(&lab);
    d.ok(&["share", "del", "lab"]);
    let (ok, out) = try_run(&["iscsi-ls", &format!("iscsi://{iscsi}")]);
    assert!(
        ok && !out.contains(lab_iqn) && out.contains(vm_iqn),
        "{out}"
    );
    // A logical unit is known by its volume, not by the target's name:
    // another volume shared under lab's old name is another disk to the
    // initiator, and lab shared again under a new name is the same one.
    d.ok(&["volume", "create", "-V", "8M", "tank/other"]);
    d.ok(&[
        "share",
        "add",
        "lab",
        "tank/other",
        "--iscsi",
        &format!("{lab_iqn},client=127.0.0.1/32"),
    ]);
    let other_serial = unit_serial(&lab);
    assert_ne!(other_serial, lab_serial, "another volume, the same serial");
    let lab2_iqn = "iqn.2026-11.org.example:lab-again";
    d.ok(&[
        "share",
        "add",
        "lab2",
        "tank/lab",
        "--iscsi",
        &format!("{lab2_iqn},client=127.0.0.1/32"),
    ]);
    assert_eq!(
        unit_serial(&format!("iscsi://{iscsi}/{lab2_iqn}/0")),
        lab_serial,
        "the same volume under a new target name, another serial"
    );
    // A volume grown under a session: its next command reports CAPACITY
    // DATA HAS CHANGED once (how an initiator learns to rescan), and the
    // new blocks are there.
    let mut live = Iscsi::open(&iscsi, lab2_iqn).unwrap();
    live.read(0, 4096).unwrap();
    d.ok(&["volume", "resize", "tank/lab", "16M"]);
    // Every command of the session runs until one finds the new size;
    // the next one reports it.
    let mut told = None;
    for _ in 0..3 {
        if let Err(e) = live.read(0, 4096) {
            told = Some(e.to_string());
            break;
        }
    }
    let told = told.expect("the resize was never reported");
    assert!(told.contains("sense 06/2a/09"), "{told}");
    assert_eq!(live.read(12 * MIB, 4096).unwrap(), vec![0u8; 4096]);
    live.close();
    let stats = d.ok(&["daemon", "stats"]);
    assert!(stats.contains("iscsi"), "{stats}");

    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!said.contains("panicked"), "the daemon panicked:\n{said}");
    d.stop();
}

/// The volume `vm` at `nbd` as a file, `dir/mnt/disk`, through libnbd's
/// FUSE client, until [`unmount`]; a real file system's tools run on it
/// as on a disk, their `fsync`s reaching the daemon as NBD flushes.
fn nbdfuse(dir: &Path, nbd: &str, size: u64) -> (std::process::Child, std::path::PathBuf) {
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let child = Command::new("nbdfuse")
        .arg(mnt.join("disk"))
        .arg(format!("nbd://{nbd}/vm"))
        .spawn()
        .expect("start nbdfuse");
    let t0 = Instant::now();
    while std::fs::metadata(mnt.join("disk")).map(|m| m.len()).ok() != Some(size) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "nbdfuse did not mount"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, mnt)
}

fn unmount(mut child: std::process::Child, mnt: &Path) {
    run(&["umount", mnt.to_str().unwrap()]);
    let _ = child.wait();
}

/// mkfs.ext4 on a volume through NBD, files written into it with
/// debugfs (each run ends with an fsync, an NBD flush), the daemon
/// SIGKILLed after each: e2fsck finds the file system clean and every
/// file as written. (The kernel's ext4 and NBD client are out of reach
/// here; these are e2fsprogs' own user-space tools on libnbd's FUSE
/// client, so a kill lands between flushed runs, not inside one.)
#[test]
fn ext4_made_on_a_volume_is_clean_after_sigkills() {
    if !require::programs(&["nbdfuse", "mkfs.ext4", "debugfs", "e2fsck", "umount"])
        || !require::fuse()
    {
        return;
    }
    let (rounds, seed) = crash_settings(6);
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("daemon.log");
    let nbd = format!("127.0.0.1:{}", free_port());
    let args = ["--nbd", nbd.as_str(), "--txg-interval", "30"];
    let mut d = Daemon::start_logged(dir.path(), &args, &log);
    pool(&d, dir.path());
    let size = 128 * MIB;
    d.ok(&["volume", "create", "-V", "128M", "-b", "4K", "tank/vm"]);
    d.ok(&["share", "add", "vm", "tank/vm", "--nbd", "127.0.0.1/32"]);
    let (child, mnt) = nbdfuse(dir.path(), &nbd, size);
    let disk = mnt.join("disk");
    let disk = disk.to_str().unwrap();
    run(&["mkfs.ext4", "-q", "-F", disk]);
    unmount(child, &mnt);
    let mut written: Vec<(String, Vec<u8>)> = Vec::new();
    for round in 0..rounds {
        let (child, mnt) = nbdfuse(dir.path(), &nbd, size);
        let name = format!("f{round}");
        let len = 1 + rng.below(3 << 20) as usize;
        let data = rng.bytes(len);
        let src = dir.path().join(&name);
        std::fs::write(&src, &data).unwrap();
        let cmd = format!("write {} {name}", src.display());
        run(&["debugfs", "-w", "-R", &cmd, disk]);
        written.push((name, data));
        unmount(child, &mnt);
        // Nothing is in flight: the last flush has returned.
        d.kill_in_place();
        drop(d);
        d = Daemon::start_logged(dir.path(), &args, &log);
        let (child, mnt) = nbdfuse(dir.path(), &nbd, size);
        let (clean, out) = try_run(&["e2fsck", "-fn", disk]);
        assert!(clean, "round {round} (seed {seed}): e2fsck:\n{out}");
        for (n, bytes) in &written {
            let back = dir.path().join("back");
            let cmd = format!("dump {n} {}", back.display());
            run(&["debugfs", "-R", &cmd, disk]);
            assert!(
                std::fs::read(&back).unwrap() == *bytes,
                "round {round} (seed {seed}): {n} differs"
            );
            std::fs::remove_file(&back).unwrap();
        }
        unmount(child, &mnt);
    }
    d.stop();
}

#[test]
fn a_snapshot_under_write_load_holds_whole_writes_and_is_served_read_only() {
    if !require::programs(&["nbdcopy"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("daemon.log");
    let (d, addr) = daemon(dir.path(), &log);
    pool(&d, dir.path());
    d.ok(&["volume", "create", "-s", "-V", "16M", "tank/vm"]);
    d.ok(&["share", "add", "vm", "tank/vm", "--nbd", "127.0.0.1/32"]);
    let mut c = Nbd::open(&addr, "vm").unwrap();
    c.write(0, &vec![0xaa; (16 * MIB) as usize], false).unwrap();
    c.flush().unwrap();
    // A writer rewrites the volume front to back, 1 MiB per request, while
    // a snapshot is taken: every 1 MiB of the snapshot is wholly old or
    // wholly new, and the new ones are a prefix.
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(Mutex::new(0u64));
    let w = {
        let (stop, writes, addr) = (stop.clone(), writes.clone(), addr.clone());
        std::thread::spawn(move || {
            let mut c = Nbd::open(&addr, "vm").unwrap();
            let mut pass = 0u8;
            while !stop.load(Ordering::Relaxed) {
                pass = pass.wrapping_add(1);
                for i in 0..16 {
                    c.write(i * MIB, &vec![pass; MIB as usize], false).unwrap();
                    *writes.lock().unwrap() += 1;
                }
            }
            c.close();
        })
    };
    let t0 = Instant::now();
    while *writes.lock().unwrap() < 24 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the writer is stuck"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    d.ok(&["snapshot", "tank/vm@busy"]);
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    w.join().unwrap();
    // A snapshot share is read-only.
    d.ok(&[
        "share",
        "add",
        "busy",
        "tank/vm@busy",
        "--nbd",
        "127.0.0.1/32",
    ]);
    let mut s = Nbd::open(&addr, "busy").unwrap();
    assert!(s.write(0, b"x", false).is_err(), "a snapshot took a write");
    drop(s);
    let out = dir.path().join("snap.raw");
    run(&[
        "nbdcopy",
        &format!("nbd://{addr}/busy"),
        out.to_str().unwrap(),
    ]);
    let snap = std::fs::read(&out).unwrap();
    assert_eq!(snap.len() as u64, 16 * MIB);
    let firsts: Vec<u8> = snap
        .chunks(MIB as usize)
        .map(|m| {
            assert!(
                m.iter().all(|&b| b == m[0]),
                "a 1 MiB write was split by the snapshot"
            );
            m[0]
        })
        .collect();
    // Pass p rewrote chunks in order: the snapshot is pass p+1 for a
    // prefix and pass p (or the first fill) for the rest.
    let distinct: BTreeSet<u8> = firsts.iter().copied().collect();
    assert!(
        distinct.len() <= 2,
        "more than two passes in one snapshot: {firsts:?}"
    );
    let newer = firsts[0];
    let cut = firsts
        .iter()
        .position(|&b| b != newer)
        .unwrap_or(firsts.len());
    assert!(
        firsts[cut..].iter().all(|&b| b == firsts[cut.min(15)]),
        "{firsts:?}"
    );
    // The clone of a volume's snapshot is a volume with the same bytes.
    d.ok(&["clone", "tank/vm@busy", "tank/vm2"]);
    d.ok(&["share", "add", "vm2", "tank/vm2", "--nbd", "127.0.0.1/32"]);
    let mut c2 = Nbd::open(&addr, "vm2").unwrap();
    assert!(c2.read(0, MIB as u32).unwrap() == snap[..MIB as usize]);
    c2.close();
    let v = d.ok(&["volume", "list"]);
    assert!(v.contains("tank/vm2") && v.contains("16M"), "{v}");

    // A rollback closes the volume under an open session: its next
    // request fails, and a new session sees the snapshot's bytes and size.
    let mut live = Nbd::open(&addr, "vm").unwrap();
    d.ok(&["volume", "resize", "tank/vm", "32M"]);
    // A resize keeps the volume open: the session goes on (it learns the
    // new size when it reconnects).
    live.write(0, b"kept", false).unwrap();
    let mut live = Nbd::open(&addr, "vm").unwrap();
    assert_eq!(live.size, 32 * MIB);
    // A rollback, destroy or rename that is refused takes nothing down:
    // the session goes on, its writes and flushes answered.
    d.ok(&["snapshot", "tank/vm@later"]);
    for refused in [
        &["rollback", "tank/vm@busy"][..],
        &["destroy", "tank/vm"],
        &["dataset", "rename", "tank/vm", "tank/nowhere/vm"],
    ] {
        d.fails(refused);
        live.write(0, b"kept", false)
            .unwrap_or_else(|e| panic!("after a refused {refused:?}: {e}"));
        live.flush()
            .unwrap_or_else(|e| panic!("flush after a refused {refused:?}: {e}"));
    }
    // Destroying one snapshot leaves the readers of another connected.
    let mut reader = Nbd::open(&addr, "busy").unwrap();
    d.ok(&["destroy", "tank/vm@later"]);
    assert!(
        reader.read(0, 4096).unwrap() == snap[..4096],
        "the reader of another snapshot"
    );
    d.ok(&["rollback", "tank/vm@busy"]);
    assert!(
        live.write(0, b"late", false).is_err(),
        "a write landed after the rollback"
    );
    assert!(
        live.flush().is_err(),
        "a flush was acknowledged after the rollback"
    );
    let mut after = Nbd::open(&addr, "vm").unwrap();
    assert_eq!(after.size, 16 * MIB, "the rollback restored the size");
    assert!(after.read(0, MIB as u32).unwrap() == snap[..MIB as usize]);
    after.close();
    // `dataset set volsize=` grows like `volume resize`, and cannot shrink.
    d.ok(&["dataset", "set", "volsize=24M", "tank/vm"]);
    assert_eq!(Nbd::open(&addr, "vm").unwrap().size, 24 * MIB);
    assert!(d
        .fails(&["dataset", "set", "volsize=8M", "tank/vm"])
        .contains("--force"));
    d.stop();
}

/// A sector (512 bytes) written by write `id`: every 8-byte word is the
/// id xor'd with the sector number, so a torn sector or a sector from
/// the wrong place shows.
fn sector(id: u64, n: u64) -> [u8; 512] {
    let mut s = [0u8; 512];
    for w in s.chunks_mut(8) {
        w.copy_from_slice(&(id ^ (n << 40)).to_le_bytes());
    }
    s
}

fn sector_id(bytes: &[u8], n: u64) -> Option<u64> {
    if bytes.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let id = u64::from_le_bytes(bytes[..8].try_into().unwrap()) ^ (n << 40);
    (sector(id, n)[..] == *bytes).then_some(id)
}

/// What the writer knows of each sector: the writes that may have landed
/// (all since the last durable one) and the durable one.
#[derive(Clone, Default)]
struct Known {
    durable: u64,
    since: Vec<u64>,
}

/// A block protocol the crash loop writes through.
#[derive(Clone, Copy, Debug)]
enum Proto {
    Nbd,
    Iscsi,
    /// iSCSI with up to eight writes (and flushes) in flight at once.
    IscsiQueued,
}

/// A session of either client: write (with FUA), flush, read.
enum Session {
    Nbd(Nbd),
    Iscsi(Iscsi),
}

const CRASH_IQN: &str = "iqn.2026-11.org.tarn:crash";

impl Session {
    fn open(proto: Proto, addr: &str) -> std::io::Result<Session> {
        Ok(match proto {
            Proto::Nbd => Session::Nbd(Nbd::open(addr, "vm")?),
            Proto::Iscsi | Proto::IscsiQueued => Session::Iscsi(Iscsi::open(addr, CRASH_IQN)?),
        })
    }

    fn write(&mut self, off: u64, data: &[u8], fua: bool) -> std::io::Result<()> {
        match self {
            Session::Nbd(c) => c.write(off, data, fua),
            Session::Iscsi(c) => c.write(off, data, fua),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Session::Nbd(c) => c.flush(),
            Session::Iscsi(c) => c.flush(),
        }
    }

    fn read(&mut self, off: u64, len: u32) -> std::io::Result<Vec<u8>> {
        match self {
            Session::Nbd(c) => c.read(off, len),
            Session::Iscsi(c) => c.read(off, len),
        }
    }

    fn close(self) {
        match self {
            Session::Nbd(c) => c.close(),
            Session::Iscsi(c) => c.close(),
        }
    }
}

/// The bytes of write `id` over sectors `at..at + n`, noted in `model`
/// first: once sent, a write may land.
fn prepare(model: &Mutex<Vec<Known>>, id: u64, at: u64, n: u64) -> Vec<u8> {
    let mut m = model.lock().unwrap();
    let mut data = Vec::with_capacity((n * 512) as usize);
    for s in at..at + n {
        data.extend_from_slice(&sector(id, s));
        m[s as usize].since.push(id);
    }
    data
}

/// Writes random runs of sectors through `proto` until the daemon dies,
/// sometimes with FUA, flushing now and then; returns the next write id
/// and the flushes that returned.
fn writer(
    proto: Proto,
    addr: &str,
    seed: u64,
    first: u64,
    sectors: u64,
    model: &Mutex<Vec<Known>>,
) -> (u64, u64) {
    let mut r = Rng::new(seed);
    let (mut id, mut flushes) = (first, 0);
    let Ok(mut c) = Session::open(proto, addr) else {
        return (id, flushes);
    };
    loop {
        let n = 1 + r.below(64);
        let at = r.below(sectors - n);
        let fua = r.chance(0.1);
        let data = prepare(model, id, at, n);
        let acked = c.write(at * 512, &data, fua).is_ok();
        id += 1;
        if !acked {
            return (id, flushes);
        }
        if fua {
            let mut m = model.lock().unwrap();
            for s in at..at + n {
                m[s as usize] = Known {
                    durable: id - 1,
                    since: vec![id - 1],
                };
            }
        }
        if r.chance(0.15) {
            if c.flush().is_err() {
                return (id, flushes);
            }
            // Every write acknowledged before the flush is durable: for
            // each sector, the last one written to it.
            for k in model.lock().unwrap().iter_mut() {
                if let Some(&last) = k.since.last() {
                    *k = Known {
                        durable: last,
                        since: vec![last],
                    };
                }
            }
            flushes += 1;
        }
    }
}

#[test]
fn sigkill_during_flushing_nbd_writes_loses_no_flushed_write() {
    crash_loop(Proto::Nbd);
}

#[test]
fn sigkill_during_flushing_iscsi_writes_loses_no_flushed_write() {
    crash_loop(Proto::Iscsi);
}

#[test]
fn sigkill_during_queued_iscsi_writes_loses_no_flushed_write() {
    crash_loop(Proto::IscsiQueued);
}

/// Like [`writer`], with up to eight writes in flight on one iSCSI
/// session (which the target runs at once and answers in any order),
/// and flushes sent among them. Writes in flight never overlap, so each
/// sector's writes land in the order they were sent. A flush makes
/// durable what had been acknowledged when it was *sent*: for each
/// sector, the last write acknowledged by then.
fn queued_writer(
    addr: &str,
    seed: u64,
    first: u64,
    sectors: u64,
    model: &Mutex<Vec<Known>>,
) -> (u64, u64) {
    use std::collections::HashMap;
    let mut r = Rng::new(seed);
    let (mut id, mut flushes) = (first, 0);
    let Ok(mut c) = Iscsi::open(addr, CRASH_IQN) else {
        return (id, flushes);
    };
    // The last write acknowledged on each sector (this round).
    let mut acked: Vec<Option<u64>> = vec![None; sectors as usize];
    // In flight: ITT -> (first sector, sectors, write id, FUA), or a
    // flush with what it covers.
    let mut writes: HashMap<u32, (u64, u64, u64, bool)> = HashMap::new();
    let mut flushes_in_flight: HashMap<u32, Vec<Option<u64>>> = HashMap::new();
    loop {
        while writes.len() + flushes_in_flight.len() < 8 {
            if r.chance(0.1) {
                let Ok(itt) = c.start_flush() else {
                    return (id, flushes);
                };
                flushes_in_flight.insert(itt, acked.clone());
                continue;
            }
            let n = 1 + r.below(64);
            let at = r.below(sectors - n);
            let busy = writes
                .values()
                .any(|&(a, m, _, _)| at < a + m && a < at + n);
            if busy {
                break;
            }
            let fua = r.chance(0.1);
            let data = prepare(model, id, at, n);
            let Ok(itt) = c.start_write(at * 512, data, fua) else {
                return (id, flushes);
            };
            writes.insert(itt, (at, n, id, fua));
            id += 1;
        }
        let Ok((itt, res)) = c.next_done() else {
            return (id, flushes);
        };
        if res.is_err() {
            return (id, flushes);
        }
        let mut m = model.lock().unwrap();
        if let Some((at, n, wid, fua)) = writes.remove(&itt) {
            for s in at..at + n {
                acked[s as usize] = Some(wid);
                let k = &mut m[s as usize];
                if fua && wid >= k.durable {
                    k.durable = wid;
                    k.since.retain(|&x| x >= wid);
                }
            }
        } else if let Some(covered) = flushes_in_flight.remove(&itt) {
            for (s, last) in covered.iter().enumerate() {
                if let Some(wid) = *last {
                    let k = &mut m[s];
                    if wid > k.durable {
                        k.durable = wid;
                        k.since.retain(|&x| x >= wid);
                    }
                }
            }
            flushes += 1;
        }
    }
}

/// SIGKILLs the daemon at random moments while a client writes through
/// `proto` with FUA writes and flushes; after each restart every sector
/// holds its last flushed write or one written since, never a torn or
/// misplaced one.
fn crash_loop(proto: Proto) {
    let (rounds, seed) = crash_settings(20);
    eprintln!("{proto:?} volume crash seed {seed} (replay: TARN_CRASH_SEED={seed})");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("daemon.log");
    let addr = format!("127.0.0.1:{}", free_port());
    let flag = match proto {
        Proto::Nbd => "--nbd",
        Proto::Iscsi | Proto::IscsiQueued => "--iscsi",
    };
    let args = [flag, addr.as_str(), "--txg-interval", "1"];
    let mut d = Daemon::start_logged(dir.path(), &args, &log);
    pool(&d, dir.path());
    // 4K blocks: most writes patch blocks in part.
    d.ok(&["volume", "create", "-V", "8M", "-b", "4K", "tank/vm"]);
    let spec = format!("{CRASH_IQN},client=127.0.0.1/32");
    d.ok(&[
        "share",
        "add",
        "vm",
        "tank/vm",
        "--nbd",
        "127.0.0.1/32",
        "--iscsi",
        &spec,
    ]);
    let sectors = 8 * MIB / 512;
    let model = Arc::new(Mutex::new(vec![Known::default(); sectors as usize]));
    let (mut next, mut flushes) = (1u64, 0u64);
    for round in 0..rounds {
        let (m, a, wseed, first) = (model.clone(), addr.clone(), rng.next_u64(), next);
        let w = std::thread::spawn(move || match proto {
            Proto::IscsiQueued => queued_writer(&a, wseed, first, sectors, &m),
            _ => writer(proto, &a, wseed, first, sectors, &m),
        });
        std::thread::sleep(Duration::from_millis(20 + rng.below(250)));
        d.kill_in_place();
        let (n, f) = w.join().unwrap();
        (next, flushes) = (n, flushes + f);
        drop(d);
        d = Daemon::start_logged(dir.path(), &args, &log);
        let said = || std::fs::read_to_string(&log).unwrap_or_default();
        let mut c = Session::open(proto, &addr)
            .unwrap_or_else(|e| panic!("round {round}: {e}\n{}", said()));
        let disk = c.read(0, (8 * MIB) as u32).unwrap();
        c.close();
        let mut m = model.lock().unwrap();
        for (i, k) in m.iter_mut().enumerate() {
            let bytes = &disk[i * 512..(i + 1) * 512];
            let Some(id) = sector_id(bytes, i as u64) else {
                panic!(
                    "round {round} (seed {seed}): sector {i} is torn or misplaced\n{}",
                    said()
                );
            };
            assert!(
                id >= k.durable && (id == k.durable || k.since.contains(&id)),
                "round {round} (seed {seed}): sector {i} holds write {id}, but write {} was \
                 flushed and later ones were {:?}\n{}",
                k.durable,
                k.since,
                said()
            );
            *k = Known {
                durable: id,
                since: vec![id],
            };
        }
    }
    assert!(
        flushes >= rounds,
        "only {flushes} flushes in {rounds} rounds"
    );
    eprintln!(
        "{proto:?} volume crash: {flushes} flushes and {} writes over {rounds} kills",
        next - 1
    );
    let out = d.ok(&["pool", "scrub", "--wait", "tank"]);
    let status = d.ok(&["-o", "json", "pool", "status", "tank"]);
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v[0]["scan"]["errors"], 0, "{out}");
    assert_eq!(v[0]["health"], "ONLINE", "{status}");
    d.stop();
}
