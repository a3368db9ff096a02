//! SMB through the Samba that the daemon configures and supervises, driven
//! by Samba's own client (`smbclient`): users and their access, the same
//! files and owners over SMB, NFS, WebDAV and FUSE, snapshots as previous
//! versions, a share torn down under a connected client, and smbd killed
//! and brought back.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::clients::tarn_with_stdin;
use common::process::{files, Daemon};
use tarn_testkit::clients::{curl, nfs_cat, nfs_cp, nfs_url, tool};
use tarn_testkit::net::free_port;
use tarn_testkit::require;

/// What an SMB test needs: root with FUSE (service mounts, smbd switching
/// users) and Samba's server and client.
fn smb_ready() -> bool {
    require::fuse() && require::programs(&["smbd", "smbclient", "smbcontrol", "testparm"])
}

/// Runs `smbclient //127.0.0.1/SHARE -p PORT` as `user` (`name%password`,
/// or none for a guest) with the commands `cmds`: whether it succeeded and
/// everything it said.
fn smbclient(port: u16, share: &str, user: Option<&str>, cmds: &str) -> (bool, String) {
    let mut c = Command::new("smbclient");
    c.arg(format!("//127.0.0.1/{share}"))
        .args(["-p", &port.to_string(), "-m", "SMB3"]);
    match user {
        Some(u) => c.args(["-U", u]),
        None => c.arg("-N"),
    };
    let out = c.args(["-c", cmds]).output().expect("run smbclient");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // smbclient exits 0 after some failed commands; an NT_STATUS error
    // says a command failed.
    let ok = out.status.success() && !text.contains("NT_STATUS_");
    (ok, text)
}

fn smb_ok(port: u16, share: &str, user: Option<&str>, cmds: &str) -> String {
    let (ok, text) = smbclient(port, share, user, cmds);
    assert!(ok, "smbclient {share} {user:?} {cmds:?}: {text}");
    text
}

fn smb_refused(port: u16, share: &str, user: Option<&str>, cmds: &str, status: &str) {
    let (ok, text) = smbclient(port, share, user, cmds);
    assert!(
        !ok && text.contains(status),
        "smbclient {share} {user:?} {cmds:?} should fail with {status}: {text}"
    );
}

/// A temporary folder that smbd, running as a user, can walk through.
fn open_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Runs `tarn ARGS` with `input` on its stdin; panics unless it succeeds.
fn ok_with_stdin(d: &Daemon, args: &[&str], input: &str) {
    let out = tarn_with_stdin(d, args, input);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn add_user(d: &Daemon, args: &[&str], password: &str) {
    let mut all = vec!["user", "add", "--password-stdin"];
    all.extend_from_slice(args);
    let out = tarn_with_stdin(d, &all, &format!("{password}\n"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Deterministic bytes that differ per file and per position.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn smb_stats(d: &Daemon) -> serde_json::Value {
    let v: serde_json::Value =
        serde_json::from_str(&d.ok(&["-o", "json", "daemon", "stats"])).unwrap();
    v["smb"].clone()
}

fn nfs_ls_line(nfs: u16, path: &str, name: &str) -> Vec<String> {
    let (ok, out, err) = tool(&["nfs-ls", &nfs_url(nfs, nfs, path)]);
    assert!(ok, "nfs-ls: {err}");
    let text = String::from_utf8_lossy(&out).into_owned();
    text.lines()
        .find(|l| l.split_whitespace().last() == Some(name))
        .unwrap_or_else(|| panic!("{name} not in nfs-ls of {path}: {text}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn smb_serves_users_the_same_files_as_every_other_front_end() {
    if !smb_ready() || !require::programs(&["nfs-cp", "nfs-cat", "nfs-ls", "curl"]) {
        return;
    }
    let dir = open_tempdir();
    let (smb, nfs, dav) = (free_port(), free_port(), free_port());
    let smb_arg = format!("127.0.0.1:{smb}");
    let nfs_arg = format!("127.0.0.1:{nfs}");
    let dav_arg = format!("127.0.0.1:{dav}");
    let d = Daemon::start_with(
        dir.path(),
        &["--smb", &smb_arg, "--nfs", &nfs_arg, "--webdav", &dav_arg],
    );
    let f = files(dir.path(), "m", 4, 1 << 30);
    d.ok(&[
        "pool", "create", "tank", "raidz1", &f[0], &f[1], &f[2], &f[3],
    ]);
    d.ok(&["dataset", "create", "tank/photos"]);
    d.ok(&["dataset", "create", "tank/media"]);
    add_user(&d, &["--smb", "--uid", "1001", "alice"], "wonder-land");
    add_user(&d, &["--smb", "--uid", "1002", "bob"], "build-it");
    add_user(&d, &["--uid", "1003", "carol"], "sing-along");

    // A user without an SMB password cannot be given SMB access.
    let err = d.fails(&["share", "add", "x", "tank/photos", "--smb", "carol=rw"]);
    assert!(err.contains("tarn user passwd --smb carol"), "{err}");
    d.ok(&[
        "share",
        "add",
        "photos",
        "tank/photos",
        "--smb",
        "alice=rw",
        "bob=ro",
        "--nfs",
        "127.0.0.1/32",
        "--all-squash",
        "--anon-uid",
        "1001",
        "--anon-gid",
        "1001",
        "--webdav",
        "alice=rw",
        "--owner",
        "alice",
    ]);
    anonymous_learns_nothing(smb);
    d.ok(&["share", "add", "media", "tank/media", "--smb", "--guest"]);
    let list = d.ok(&["share", "list"]);
    assert!(list.contains("alice=rw,bob=ro"), "{list}");
    // Names Samba would read as its own sections, or as another share.
    let err = d.fails(&["share", "add", "Global", "tank/media", "--smb", "--guest"]);
    assert!(err.contains("meaning of its own"), "{err}");
    let err = d.fails(&["share", "add", "PHOTOS", "tank/media", "--smb", "--guest"]);
    assert!(err.contains("do not differ by case"), "{err}");
    // Nor across pools: every pool's shares are served by one smbd.
    let g = files(dir.path(), "g", 1, 256 << 20);
    d.ok(&["pool", "create", "backup", &g[0]]);
    d.ok(&["dataset", "create", "backup/pics"]);
    let err = d.fails(&["share", "add", "PHOTOS", "backup/pics", "--smb", "--guest"]);
    assert!(err.contains("do not differ by case"), "{err}");
    d.ok(&["pool", "destroy", "backup"]);
    let users = d.ok(&["user", "list"]);
    assert!(
        users
            .lines()
            .any(|l| l.starts_with("carol") && l.trim_end().ends_with('-')),
        "carol has no SMB login: {users}"
    );

    // Put and get, byte for byte, as alice; bob reads them.
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    for (name, len) in [("empty", 0usize), ("one", 1), ("mib1", (1 << 20) + 1)] {
        let src = work.join(name);
        std::fs::write(&src, pattern(len, 7)).unwrap();
        smb_ok(
            smb,
            "photos",
            Some("alice%wonder-land"),
            &format!("put {} {name}", src.display()),
        );
        let back = work.join(format!("{name}.back"));
        smb_ok(
            smb,
            "photos",
            Some("bob%build-it"),
            &format!("get {name} {}", back.display()),
        );
        assert_eq!(
            std::fs::read(&back).unwrap(),
            pattern(len, 7),
            "{name} read back over SMB"
        );
    }

    // Who may do what.
    let src = work.join("one");
    smb_refused(
        smb,
        "photos",
        Some("bob%build-it"),
        &format!("put {} bob.txt", src.display()),
        "NT_STATUS_ACCESS_DENIED",
    );
    smb_refused(
        smb,
        "photos",
        Some("alice%wrong"),
        "ls",
        "NT_STATUS_LOGON_FAILURE",
    );
    // carol has no SMB login: with a guest share on the server she is
    // only a guest, who may not use this share.
    smb_refused(
        smb,
        "photos",
        Some("carol%sing-along"),
        "ls",
        "NT_STATUS_ACCESS_DENIED",
    );
    smb_refused(smb, "photos", None, "ls", "NT_STATUS_ACCESS_DENIED");
    // The guest share: anyone reads, nobody writes.
    smb_ok(smb, "media", None, "ls");
    smb_refused(
        smb,
        "media",
        None,
        &format!("put {} guest.txt", src.display()),
        "NT_STATUS_ACCESS_DENIED",
    );

    // A file alice writes over SMB: alice's over NFS and FUSE, the same
    // bytes over NFS, WebDAV and FUSE.
    let data = pattern(300_000, 3);
    let src = work.join("from-smb");
    std::fs::write(&src, &data).unwrap();
    smb_ok(
        smb,
        "photos",
        Some("alice%wonder-land"),
        &format!("mkdir sub; put {} from-smb.bin", src.display()),
    );
    let line = nfs_ls_line(nfs, "/photos", "from-smb.bin");
    assert_eq!(
        (line[2].as_str(), line[3].as_str()),
        ("1001", "1001"),
        "{line:?}"
    );
    let smb_mode = line[0].clone();
    assert_eq!(nfs_cat(&nfs_url(nfs, nfs, "/photos/from-smb.bin")), data);
    let (code, body, _) = curl(&[
        "-u",
        "alice:wonder-land",
        &format!("http://127.0.0.1:{dav}/photos/from-smb.bin"),
    ]);
    assert_eq!((code, body == data), (200, true), "WebDAV read");
    let mnt = dir.path().join("fuse");
    std::fs::create_dir(&mnt).unwrap();
    d.ok(&["mount", "tank/photos", mnt.to_str().unwrap()]);
    let meta = std::fs::metadata(mnt.join("from-smb.bin")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1001, 1001));
    assert!(
        smb_mode.starts_with("-rwxr--r--"),
        "Samba's create mask 0744: {smb_mode}"
    );
    assert_eq!(meta.mode() & 0o777, 0o744);
    assert_eq!(std::fs::read(mnt.join("from-smb.bin")).unwrap(), data);

    // And the reverse: written over NFS, WebDAV and FUSE, read over SMB.
    let nfs_src = work.join("nfs-src");
    std::fs::write(&nfs_src, pattern(70_000, 11)).unwrap();
    assert!(nfs_cp(
        nfs_src.to_str().unwrap(),
        &nfs_url(nfs, nfs, "/photos/from-nfs.bin")
    ));
    let dav_src = work.join("dav-src");
    std::fs::write(&dav_src, pattern(90_000, 13)).unwrap();
    let (code, _, _) = curl(&[
        "-u",
        "alice:wonder-land",
        "-T",
        dav_src.to_str().unwrap(),
        &format!("http://127.0.0.1:{dav}/photos/from-dav.bin"),
    ]);
    assert_eq!(code, 201);
    std::fs::write(mnt.join("from-fuse.bin"), pattern(50_000, 17)).unwrap();
    for (name, want) in [
        ("from-nfs.bin", pattern(70_000, 11)),
        ("from-dav.bin", pattern(90_000, 13)),
        ("from-fuse.bin", pattern(50_000, 17)),
    ] {
        let back = work.join(format!("{name}.smb"));
        // alice: the files are hers (whether bob may read them is up to
        // the mode each client gave them, as the POSIX layer says).
        smb_ok(
            smb,
            "photos",
            Some("alice%wonder-land"),
            &format!("get {name} {}", back.display()),
        );
        assert_eq!(std::fs::read(&back).unwrap(), want, "{name} over SMB");
    }
    let dav_meta = std::fs::metadata(mnt.join("from-dav.bin")).unwrap();
    assert_eq!(dav_meta.uid(), 1001, "alice's over WebDAV and SMB alike");
    d.ok(&["unmount", "tank/photos"]);

    // 1 GiB each way, compared byte for byte.
    let big = work.join("big");
    {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&big).unwrap());
        let chunk = pattern(1 << 20, 0);
        for i in 0..1024u32 {
            let mut c = chunk.clone();
            c[..4].copy_from_slice(&i.to_le_bytes());
            w.write_all(&c).unwrap();
        }
    }
    smb_ok(
        smb,
        "photos",
        Some("alice%wonder-land"),
        &format!("put {} big.bin", big.display()),
    );
    let big_back = work.join("big.back");
    smb_ok(
        smb,
        "photos",
        Some("alice%wonder-land"),
        &format!("get big.bin {}", big_back.display()),
    );
    assert!(same_file(&big, &big_back), "1 GiB read back differs");

    // Users change live: bob's SMB login goes, alice's password changes.
    // A session bob already has loses the share at once, not when it
    // next connects.
    let mut bob = Session::open(smb, "photos", "bob%build-it");
    let listed = bob.ls();
    assert!(listed.contains("mib1"), "{listed}");
    d.ok(&["share", "add", "photos", "tank/photos", "--smb", "alice=rw"]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let after = bob.ls();
    assert!(
        after.contains("NT_STATUS_") && !after.contains("mib1"),
        "bob's open session still lists the share: {after}"
    );
    drop(bob);
    ok_with_stdin(
        &d,
        &["user", "passwd", "--no-smb", "--password-stdin", "bob"],
        "build-it\n",
    );
    ok_with_stdin(
        &d,
        &["user", "passwd", "--password-stdin", "alice"],
        "new-land\n",
    );
    // bob is a guest now (there is a guest share), and not on this share.
    smb_refused(
        smb,
        "photos",
        Some("bob%build-it"),
        "ls",
        "NT_STATUS_ACCESS_DENIED",
    );
    smb_refused(
        smb,
        "photos",
        Some("alice%wonder-land"),
        "ls",
        "NT_STATUS_LOGON_FAILURE",
    );
    smb_ok(smb, "photos", Some("alice%new-land"), "ls");

    // A share moved to another dataset while its old mount is busy is not
    // served from the old dataset meanwhile: it is left out, and said so.
    d.ok(&["dataset", "create", "tank/photos2"]);
    let mut held = Command::new("sleep")
        .arg("120")
        .current_dir(dir.path().join("state/smb/mnt/photos"))
        .spawn()
        .unwrap();
    d.ok(&[
        "share",
        "add",
        "photos",
        "tank/photos2",
        "--smb",
        "alice=rw",
    ]);
    smb_refused(
        smb,
        "photos",
        Some("alice%new-land"),
        "ls",
        "NT_STATUS_BAD_NETWORK_NAME",
    );
    let st = smb_stats(&d);
    assert!(st["problems"].to_string().contains("photos"), "{st}");
    let _ = held.kill();
    let _ = held.wait();
    d.stop();
}

/// An smbclient session kept open across commands, as a client that
/// stays connected to a share.
struct Session {
    child: std::process::Child,
    out: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Session {
    fn open(port: u16, share: &str, user: &str) -> Session {
        use std::io::Read;
        // stdbuf: smbclient's output line by line although it is a pipe.
        let mut child = Command::new("stdbuf")
            .args(["-oL", "-eL", "smbclient"])
            .arg(format!("//127.0.0.1/{share}"))
            .args(["-p", &port.to_string(), "-m", "SMB3", "-U", user])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run smbclient");
        let out = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let pipes: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().expect("stdout")),
            Box::new(child.stderr.take().expect("stderr")),
        ];
        for mut pipe in pipes {
            let o = out.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    o.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        Session { child, out }
    }

    /// Runs `ls` in the session; what it printed: the listing (which ends
    /// with the share's size in blocks) or an error.
    fn ls(&mut self) -> String {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(b"ls\n").expect("smbclient takes commands");
        let t0 = std::time::Instant::now();
        loop {
            {
                let mut o = self.out.lock().unwrap();
                let end = ["blocks of size", "NT_STATUS_"]
                    .iter()
                    .filter_map(|m| o.find(m).map(|at| at + m.len()))
                    .min();
                if let Some(end) = end {
                    let line_end = o[end..].find('\n').map_or(o.len(), |n| end + n);
                    let said = o[..line_end].to_string();
                    o.replace_range(..line_end, "");
                    return said;
                }
            }
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(30),
                "smbclient said: {}",
                self.out.lock().unwrap()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    if fa.metadata().unwrap().len() != fb.metadata().unwrap().len() {
        return false;
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = fa.read(&mut ba).unwrap();
        if n == 0 {
            return true;
        }
        fb.read_exact(&mut bb[..n]).unwrap();
        if ba[..n] != bb[..n] {
            return false;
        }
    }
}

#[test]
fn snapshots_are_previous_versions_and_smbd_is_supervised() {
    if !smb_ready() {
        return;
    }
    let dir = open_tempdir();
    let smb = free_port();
    let smb_arg = format!("127.0.0.1:{smb}");
    let d = Daemon::start_with(dir.path(), &["--smb", &smb_arg]);
    let f = files(dir.path(), "m", 2, 256 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    d.ok(&["dataset", "create", "tank/docs"]);
    d.ok(&["dataset", "create", "tank/tm"]);
    add_user(&d, &["--smb", "--uid", "1001", "alice"], "wonder-land");
    d.ok(&[
        "share",
        "add",
        "docs",
        "tank/docs",
        "--smb",
        "alice=rw",
        "--owner",
        "alice",
    ]);
    d.ok(&[
        "share",
        "add",
        "tm",
        "tank/tm",
        "--smb",
        "alice=rw",
        "--timemachine",
        "--quota",
        "500G",
        "--smb-encrypt",
        "required",
        "--owner",
        "alice",
    ]);
    let alice = Some("alice%wonder-land");
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();

    // Samba reads the options as tarn means them.
    let conf = dir.path().join("state/smb/smb.conf");
    let out = Command::new("testparm")
        .args(["-s", "--section-name", "tm"])
        .arg(&conf)
        .output()
        .unwrap();
    let parsed = String::from_utf8_lossy(&out.stdout).to_lowercase();
    for want in [
        "fruit:time machine = yes",
        "fruit:time machine max size = 512000m",
        "server smb encrypt = required",
    ] {
        assert!(parsed.contains(want), "testparm lacks {want:?}: {parsed}");
    }
    let out = Command::new("testparm")
        .args(["-s", "--parameter-name", "server min protocol"])
        .arg(&conf)
        .output()
        .unwrap();
    let min = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        min.starts_with("SMB2") || min.starts_with("SMB3"),
        "no SMB1: {min}"
    );
    smb_ok(smb, "tm", alice, "ls");
    // Encryption required: a client that cannot encrypt (SMB 2.1) is
    // refused on that share, and served on the others.
    let old_client = |share: &str| {
        let out = Command::new("smbclient")
            .arg(format!("//127.0.0.1/{share}"))
            .args([
                "-p",
                &smb.to_string(),
                "-m",
                "SMB2_10",
                "-U",
                "alice%wonder-land",
            ])
            .args(["-c", "ls"])
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let text = old_client("tm");
    assert!(text.contains("NT_STATUS_ACCESS_DENIED"), "{text}");
    let text = old_client("docs");
    assert!(!text.contains("NT_STATUS_"), "{text}");

    // Version 1 is snapshotted, then replaced by version 2.
    let v1 = pattern(10_000, 1);
    let v2 = pattern(12_000, 2);
    let src = work.join("v");
    std::fs::write(&src, &v1).unwrap();
    smb_ok(
        smb,
        "docs",
        alice,
        &format!("put {} report.txt", src.display()),
    );
    d.ok(&["snapshot", "tank/docs@monday"]);
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(&src, &v2).unwrap();
    smb_ok(
        smb,
        "docs",
        alice,
        &format!("put {} report.txt", src.display()),
    );
    let info = smb_ok(smb, "docs", alice, "allinfo report.txt");
    let versions: Vec<&str> = info.lines().filter(|l| l.starts_with("@GMT-")).collect();
    assert_eq!(versions.len(), 1, "one previous version: {info}");
    let gmt = versions[0].trim();
    let old = work.join("old");
    smb_ok(
        smb,
        "docs",
        alice,
        &format!("get {gmt}\\report.txt {}", old.display()),
    );
    assert_eq!(std::fs::read(&old).unwrap(), v1, "the previous version");
    let now = work.join("now");
    smb_ok(
        smb,
        "docs",
        alice,
        &format!("get report.txt {}", now.display()),
    );
    assert_eq!(std::fs::read(&now).unwrap(), v2);
    // Previous versions are read-only.
    smb_refused(
        smb,
        "docs",
        alice,
        &format!("put {} {gmt}\\report.txt", src.display()),
        "NT_STATUS_",
    );

    // A rollback under a connected client: the client is disconnected,
    // the share comes back with the old file.
    // stdbuf: smbclient's output line by line although it is a pipe.
    let mut held = Command::new("stdbuf")
        .args(["-oL", "smbclient", "//127.0.0.1/docs"])
        .args(["-p", &smb.to_string(), "-U", "alice%wonder-land"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = held.stdin.take().unwrap();
    let held_out = held.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(held_out)) {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Connected: a listing came back through this session.
    stdin.write_all(b"ls\n").unwrap();
    let t0 = Instant::now();
    while !rx
        .recv_timeout(Duration::from_secs(10))
        .is_ok_and(|l| l.contains("blocks of size"))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the held session did not list"
        );
    }
    d.ok(&["rollback", "tank/docs@monday"]);
    // The held session was cut: its next command fails.
    stdin.write_all(b"ls\n").unwrap();
    drop(stdin);
    let mut err = String::new();
    held.stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let _ = held.wait();
    // Every line it printed, once its output has ended.
    let _ = reader.join();
    let rest: Vec<String> = rx.try_iter().collect();
    let said = format!("{err}{}", rest.join("\n"));
    assert!(
        said.contains("NT_STATUS_"),
        "the connected client was not disconnected by the rollback: {said}"
    );
    let after = work.join("after");
    smb_ok(
        smb,
        "docs",
        alice,
        &format!("get report.txt {}", after.display()),
    );
    assert_eq!(std::fs::read(&after).unwrap(), v1, "rolled back");

    // An encrypted dataset's share: gone while its key is unloaded (its
    // clients disconnected first), back when the key is loaded.
    let secret_mp = dir.path().join("secret-mp");
    std::fs::create_dir(&secret_mp).unwrap();
    d.create_encrypted("tank/secret", &secret_mp, b"a long passphrase\n");
    d.ok(&[
        "share",
        "add",
        "secret",
        "tank/secret",
        "--smb",
        "alice=rw",
        "--owner",
        "alice",
    ]);
    smb_ok(
        smb,
        "secret",
        alice,
        &format!("put {} s.txt", src.display()),
    );
    d.ok(&["key", "unload", "tank/secret"]);
    smb_refused(smb, "secret", alice, "ls", "NT_STATUS_BAD_NETWORK_NAME");
    let st = smb_stats(&d);
    assert!(
        st["problems"].to_string().contains("secret"),
        "the locked share is reported: {st}"
    );
    let o = d.tarn_input(&["key", "load", "tank/secret"], b"a long passphrase\n");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t0 = Instant::now();
    while !smbclient(smb, "secret", alice, "ls s.txt").0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the share did not come back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    d.ok(&["share", "del", "secret"]);

    // smbd killed: restarted, shares back, and the status says so.
    let s = smb_stats(&d);
    let pid = s["pid"].as_u64().expect("smbd runs") as i32;
    assert_eq!(s["restarts"], 0);
    assert_eq!(s["shares"].as_array().map(Vec::len), Some(2), "{s}");
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    let t0 = Instant::now();
    loop {
        let s = smb_stats(&d);
        if s["restarts"] == 1 && s["pid"].as_u64().is_some_and(|p| p as i32 != pid) {
            assert!(
                s["last_exit"].as_str().unwrap_or("").contains("signal 9"),
                "{s}"
            );
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "not restarted: {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = d.ok(&["daemon", "stats"]);
    assert!(text.contains("restarted 1 time"), "{text}");
    let t0 = Instant::now();
    while !smbclient(smb, "docs", alice, "ls").0 {
        assert!(t0.elapsed() < Duration::from_secs(15), "shares not back");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Stopping the daemon stops smbd.
    let pid = smb_stats(&d)["pid"].as_u64().unwrap();
    d.stop();
    let t0 = Instant::now();
    while running(pid) {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "smbd outlived the daemon"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The suites of `smbtorture-expected.txt` (the part of each name before
/// the test), as smbtorture wants them named on its command line.
fn torture_suites(tests: &BTreeSet<String>) -> Vec<String> {
    let mut suites: Vec<String> = tests
        .iter()
        .map(|t| {
            let parts: Vec<&str> = t.splitn(3, '.').collect();
            parts[..parts.len().min(2)].join(".")
        })
        .collect();
    suites.sort();
    suites.dedup();
    suites
}

/// The names of the passing tests in smbtorture's subunit output: a result
/// line is `STATUS: NAME`, and any but success may open a detail block
/// (` [` … a line `]`).
fn torture_passes(subunit: &str) -> BTreeSet<String> {
    let mut passed = BTreeSet::new();
    let mut other = BTreeSet::new();
    let mut in_detail = false;
    for line in subunit.lines() {
        if in_detail {
            in_detail = line != "]";
            continue;
        }
        let Some((status, rest)) = line.split_once(": ") else {
            continue;
        };
        if ![
            "success",
            "successful",
            "failure",
            "fail",
            "skip",
            "error",
            "xfail",
            "uxsuccess",
        ]
        .contains(&status)
        {
            continue;
        }
        let name = match rest.strip_suffix(" [") {
            Some(n) => {
                in_detail = true;
                n
            }
            None => rest,
        };
        if status.starts_with("success") {
            passed.insert(name.to_string());
        } else {
            other.insert(name.to_string());
        }
    }
    passed.difference(&other).cloned().collect()
}

#[test]
fn the_torture_parser_reads_subunit() {
    let out = "smbtorture 4.17.12-Debian\ntest: smb2.a.x\ntime: 1\nsuccess: smb2.a.x\n\
               test: smb2.a.y\nfailure: smb2.a.y [\nsome: detail\nsuccess: fake\n]\n\
               skip: smb2.b.z [\nwhy\n]\nsuccess: smb2.c.CREATE Existing\nprogress: 3\n";
    let p = torture_passes(out);
    assert_eq!(
        p.into_iter().collect::<Vec<_>>(),
        ["smb2.a.x", "smb2.c.CREATE Existing"]
    );
    let tests: BTreeSet<String> = ["smb2.connect", "smb2.dir.find", "smb2.dir.many"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(torture_suites(&tests), ["smb2.connect", "smb2.dir"]);
}

/// What smbtorture said about the tests `names` that did not pass (the
/// detail blocks of their subunit records), for a failing assertion.
fn torture_details(subunit: &str, names: &[&String]) -> String {
    let mut out = String::new();
    let mut keep = false;
    for line in subunit.lines() {
        if keep {
            out.push_str(line);
            out.push('\n');
            keep = line != "]";
            continue;
        }
        if let Some((status, rest)) = line.split_once(": ") {
            if status != "success" && names.iter().any(|n| rest == format!("{n} [")) {
                out.push_str(line);
                out.push('\n');
                keep = true;
            }
        }
    }
    out
}

/// Runs the listed smbtorture tests against `share`; the passing ones and
/// smbtorture's whole report.
fn torture(
    port: u16,
    share: &str,
    list: &Path,
    suites: &[String],
    work: &Path,
) -> (BTreeSet<String>, String) {
    let conf = work.join("client.conf");
    std::fs::write(&conf, "[global]\n").unwrap();
    let run = work.join(share);
    std::fs::create_dir_all(&run).unwrap();
    let out = Command::new("smbtorture")
        .arg("-s")
        .arg(&conf)
        .arg(format!("//127.0.0.1/{share}"))
        .args(["-p", &port.to_string(), "-U", "alice%wonder-land"])
        .args(["--target=samba3", "--fullname", "--format=subunit"])
        .arg("--maximum-runtime=300")
        .arg(format!("--load-list={}", list.display()))
        .args(suites)
        .current_dir(&run)
        .output()
        .expect("run smbtorture");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    (torture_passes(&report), report)
}

#[test]
fn samba_torture_suites_pass_on_a_tarn_share_as_on_a_plain_directory() {
    if !smb_ready() || !require::programs(&["smbtorture"]) {
        return;
    }
    let dir = open_tempdir();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    // The reference: a plain directory of alice's, served by the same smbd
    // with the same settings, through the owner's include file.
    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    std::os::unix::fs::chown(&plain, Some(1001), Some(1001)).unwrap();
    let include = dir.path().join("extra.conf");
    std::fs::write(
        &include,
        format!(
            "[reference]\n  path = {}\n  read only = no\n  valid users = alice\n",
            plain.display()
        ),
    )
    .unwrap();
    let smb = free_port();
    let smb_arg = format!("127.0.0.1:{smb}");
    let d = Daemon::start_with(
        dir.path(),
        &[
            "--smb",
            &smb_arg,
            "--smb-include",
            include.to_str().unwrap(),
        ],
    );
    let f = files(dir.path(), "m", 2, 512 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    d.ok(&["dataset", "create", "tank/t"]);
    add_user(&d, &["--smb", "--uid", "1001", "alice"], "wonder-land");
    d.ok(&[
        "share", "add", "t", "tank/t", "--smb", "alice=rw", "--owner", "alice",
    ]);

    let list = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/smbtorture-expected.txt");
    let expected: BTreeSet<String> = std::fs::read_to_string(&list)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    let suites = torture_suites(&expected);
    // smbtorture's --load-list takes names only.
    let names = work.join("tests.txt");
    std::fs::write(
        &names,
        expected
            .iter()
            .map(|t| format!("{t}\n"))
            .collect::<String>(),
    )
    .unwrap();
    let (reference, ref_report) = torture(smb, "reference", &names, &suites, &work);
    let (ours, report) = torture(smb, "t", &names, &suites, &work);
    let missing_ref: Vec<&String> = expected.difference(&reference).collect();
    assert!(
        missing_ref.is_empty(),
        "the reference directory does not pass {missing_ref:?}: the suite or the Samba \
         settings changed\n{}",
        torture_details(&ref_report, &missing_ref)
    );
    let missing: Vec<&String> = expected.difference(&ours).collect();
    // Some tests leave a handle open for the disconnect to close (smb2.read.eof
    // does), and the next one recreates the same file name: if the smbd
    // process of the previous connection has not closed it yet, the file is
    // still delete-pending and the create fails. Which side that race hits
    // depends on the load, not on the share; a test that failed is run
    // again on its own once, and only a second failure counts.
    let (missing, report) = if missing.is_empty() {
        (Vec::new(), report)
    } else {
        let again = work.join("again.txt");
        std::fs::write(
            &again,
            missing.iter().map(|t| format!("{t}\n")).collect::<String>(),
        )
        .unwrap();
        let first = torture_details(&report, &missing);
        let (passed, report) = torture(smb, "t", &again, &suites, &work);
        let still: Vec<&String> = missing
            .into_iter()
            .filter(|t| !passed.contains(*t))
            .collect();
        eprintln!("failed once on the tarn share, run again:\n{first}");
        (still, report)
    };
    assert!(
        missing.is_empty(),
        "tests that pass on a plain directory but fail on the tarn share, twice: \
         {missing:?}\n{}",
        torture_details(&report, &missing)
    );
    d.stop();
}

/// Byte `pos` of band `n` as `tools/smb_bands.py` writes it.
fn band_byte(n: u64, pos: u64) -> u8 {
    let i = (pos + n) % 251;
    ((i * 7 + n * 31) & 0xff) as u8
}

/// The Python with smbprotocol that sends SMB2 FLUSH (`TARN_TEST_PYTHON`,
/// which `.ci/run` sets, or `python3`), if it has the module.
fn smb_python() -> Option<String> {
    let py = std::env::var("TARN_TEST_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let ok = Command::new(&py)
        .args(["-c", "import smbprotocol"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Some(py)
    } else {
        require::missing("Python's smbprotocol (pip install smbprotocol; TARN_TEST_PYTHON)");
        None
    }
}

/// For a test driving smbprotocol: its Python, and a daemon serving SMB
/// on a port of its own with pool `tank` (a mirror of two files of
/// `size` bytes) in a folder smbd can walk through; None (skipped) when
/// SMB or the module is missing.
fn smb_with_python(size: u64) -> Option<(String, tempfile::TempDir, u16, Daemon)> {
    if !smb_ready() {
        return None;
    }
    let python = smb_python()?;
    let dir = open_tempdir();
    let smb = free_port();
    let smb_arg = format!("127.0.0.1:{smb}");
    let d = Daemon::start_with(dir.path(), &["--smb", &smb_arg]);
    let f = files(dir.path(), "m", 2, size);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    Some((python, dir, smb, d))
}

#[test]
fn time_machine_bands_flushed_over_smb_survive_a_daemon_kill() {
    let Some((python, dir, smb, mut d)) = smb_with_python(1 << 30) else {
        return;
    };
    d.ok(&["dataset", "create", "tank/tm"]);
    add_user(&d, &["--smb", "--uid", "1001", "alice"], "wonder-land");
    d.ok(&[
        "share",
        "add",
        "mac",
        "tank/tm",
        "--smb",
        "alice=rw",
        "--timemachine",
        "--quota",
        "100G",
        "--owner",
        "alice",
    ]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/smb_bands.py");
    let mut client = Command::new(&python)
        .arg(&script)
        .args([
            "127.0.0.1",
            &smb.to_string(),
            "mac",
            "alice",
            "wonder-land",
            "60",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the band writer");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(client.stdout.take().unwrap()));
    // Kill the daemon once a dozen bands are flushed, while the next is
    // being written.
    let mut flushed = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("flushed ") {
            let n: u64 = n.parse().unwrap();
            flushed = Some(n);
            if n == 11 {
                break;
            }
        }
    }
    let flushed = flushed.expect("no band was flushed");
    assert_eq!(flushed, 11, "the writer stopped early");
    std::thread::sleep(Duration::from_millis(150));
    let smbd = smb_stats(&d)["pid"].as_u64().expect("smbd runs");
    d.kill_in_place();
    // smbd does not outlive the daemon that supervised it.
    let t0 = Instant::now();
    while running(smbd) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "smbd {smbd} outlived the killed daemon"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // What the writer heard after the kill can only add bands it saw
    // flushed before the daemon died; count only those seen before.
    let _ = client.kill();
    let _ = client.wait();

    // The daemon comes back on the same state: it stops the smbd the
    // killed one left running and detaches its dead mounts (`killed` is
    // dropped only at the end, as its drop would detach them itself).
    let killed = d;
    let d = Daemon::start_with(dir.path(), &["--smb", &format!("127.0.0.1:{smb}")]);
    let t0 = Instant::now();
    while !smbclient(smb, "mac", Some("alice%wonder-land"), "ls bands\\*").0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the share did not come back"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let mnt = dir.path().join("check");
    std::fs::create_dir(&mnt).unwrap();
    d.ok(&["mount", "tank/tm", mnt.to_str().unwrap()]);
    for n in 0..=flushed {
        let data = std::fs::read(mnt.join(format!("bands/{n:x}"))).unwrap();
        assert_eq!(data.len(), 8 << 20, "band {n} length");
        if let Some(pos) = (0..data.len() as u64).find(|&p| data[p as usize] != band_byte(n, p)) {
            panic!("band {n} differs at byte {pos}");
        }
    }
    // One band back over SMB too.
    let back = dir.path().join("band0");
    smb_ok(
        smb,
        "mac",
        Some("alice%wonder-land"),
        &format!("get bands\\0 {}", back.display()),
    );
    assert_eq!(
        std::fs::read(&back).unwrap(),
        std::fs::read(mnt.join("bands/0")).unwrap()
    );
    d.ok(&["unmount", "tank/tm"]);
    d.stop();
    drop(killed);
}

/// Without logging in, nobody gets the list of shares (and the datasets
/// they serve) or of users (names to guess passwords for), while no
/// share allows guests.
fn anonymous_learns_nothing(port: u16) {
    let run = |c: &mut Command| {
        let out = c.output().expect("run an SMB client");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let shares = run(Command::new("smbclient").args([
        "-L",
        "//127.0.0.1",
        "-p",
        &port.to_string(),
        "-m",
        "SMB3",
        "-U%",
        "-N",
    ]));
    assert!(
        shares.contains("NT_STATUS_ACCESS_DENIED") && !shares.contains("photos"),
        "anonymous share list: {shares}"
    );
    // rpcclient comes with smbclient.
    let users = run(Command::new("rpcclient").args([
        "-U%",
        "-N",
        "-p",
        &port.to_string(),
        "-c",
        "enumdomusers",
        "127.0.0.1",
    ]));
    assert!(
        users.contains("NT_STATUS_") && !users.contains("alice"),
        "anonymous user list: {users}"
    );
}

/// Whether process `pid` runs (exists and is not a zombie waiting for
/// whoever inherited it).
fn running(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// An SMB session held open by `tests/tools/smb_session.py`, logged in
/// and connected to a share, waiting to connect to it again.
struct Held {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Held {
    fn open(python: &str, port: u16, share: &str, user: &str, password: &str) -> Held {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/smb_session.py");
        let mut child = Command::new(python)
            .arg(&script)
            .args(["127.0.0.1", &port.to_string(), share, user, password])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the SMB client");
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line.trim(), "ready", "{user} logs in");
        Held { child, out }
    }

    /// Connects to the share again on the same session: "connected", or
    /// "refused: WHY".
    fn again(mut self) -> String {
        self.child
            .stdin
            .as_mut()
            .unwrap()
            .write_all(b"go\n")
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut self.out, &mut line).unwrap();
        let _ = self.child.wait();
        line.trim().to_string()
    }
}

/// A session logged in with a password that has since changed (or whose
/// user lost SMB) ends: its client must log in again, with the new
/// password. Closing the share's connections alone left the session, on
/// which a client connects to the share again without being asked.
#[test]
fn a_changed_password_ends_the_sessions_made_with_the_old_one() {
    let Some((python, _dir, smb, d)) = smb_with_python(256 << 20) else {
        return;
    };
    d.ok(&["dataset", "create", "tank/docs"]);
    add_user(&d, &["--smb", "alice"], "old-password");
    add_user(&d, &["--smb", "bob"], "bobs-password");
    let share = "share add docs tank/docs --owner alice --smb alice=rw --smb bob=ro";
    d.ok(&share.split(' ').collect::<Vec<_>>());
    let hold = |user: &str, password: &str| Held::open(&python, smb, "docs", user, password);
    let alice = hold("alice", "old-password");
    let bob = hold("bob", "bobs-password");
    let bob_later = hold("bob", "bobs-password");
    ok_with_stdin(
        &d,
        &["user", "passwd", "--smb", "--password-stdin", "alice"],
        "new-password\n",
    );
    std::thread::sleep(Duration::from_millis(500));
    let said = alice.again();
    assert!(said.starts_with("refused"), "alice's old session: {said}");
    assert_eq!(bob.again(), "connected", "bob's account did not change");
    // Taken off the share, bob cannot connect to it again on a session
    // he already has: the process serving it reads the new settings.
    d.ok(&[
        "share",
        "add",
        "docs",
        "tank/docs",
        "--owner",
        "alice",
        "--smb",
        "alice=rw",
    ]);
    std::thread::sleep(Duration::from_millis(500));
    let said = bob_later.again();
    assert!(
        said.starts_with("refused"),
        "bob, no longer on the share: {said}"
    );
}
