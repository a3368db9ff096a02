//! The README's main command as a user runs it: start `tarn demo`, use
//! the URLs it prints (WebDAV with curl, NFS with libnfs's nfs-cat, the
//! volume over NBD with qemu-io), the FUSE folder when running as root,
//! stop it with SIGINT, start it again, and find the data still there.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::process::tarn_at as tarn;
use tarn_testkit::clients::{self, curl, nfs_url};
use tarn_testkit::require;

/// A running demo and what its banner told us.
struct Demo {
    child: Child,
    /// Everything the demo writes to standard error, once it exits.
    log: std::thread::JoinHandle<String>,
    socket: PathBuf,
    banner: String,
    webdav: String,
    password: String,
    nfs_port: u16,
    /// The volume's NBD URL.
    nbd: String,
}

/// `tarn demo --dir DIR` on ports of its choosing, its input closed.
fn demo_command(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tarn"));
    c.args([
        "demo",
        "--nfs-port",
        "0",
        "--webdav-port",
        "0",
        "--nbd-port",
        "0",
    ])
    .arg("--dir")
    .arg(dir)
    .stdin(Stdio::null());
    c
}

fn start(dir: &Path) -> Demo {
    let mut child = demo_command(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(err), &mut s);
        s
    });
    // Read the banner as a user would, until its last line.
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut banner = String::new();
    let t0 = Instant::now();
    while !banner.contains("still there") {
        let left = Duration::from_secs(60).saturating_sub(t0.elapsed());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("demo did not print its hints: {banner}"));
        banner.push_str(&line);
        banner.push('\n');
    }
    let webdav_line = banner
        .lines()
        .find(|l| l.starts_with("WebDAV"))
        .unwrap_or_else(|| panic!("no WebDAV URL: {banner}"));
    let webdav = webdav_line.split_whitespace().nth(1).unwrap().to_string();
    let password = webdav_line.rsplit(' ').next().unwrap().to_string();
    let nfs_port = banner
        .lines()
        .find(|l| l.starts_with("NFS"))
        .and_then(|l| l.split("port ").nth(1))
        .and_then(|p| p.split(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no NFS port: {banner}"));
    let nbd = banner
        .lines()
        .find(|l| l.starts_with("NBD"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no NBD URL: {banner}"))
        .to_string();
    let socket = dir.join("tarn.sock");
    assert!(tarn(&socket, &["daemon", "ping"]).status.success());
    Demo {
        child,
        log,
        socket,
        banner,
        webdav,
        password,
        nfs_port,
        nbd,
    }
}

/// Stops the demo as Ctrl-C does; returns what it logged.
fn interrupt(d: Demo) -> String {
    // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped).
    let rc = unsafe { libc::kill(d.child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(rc, 0);
    let out = d.child.wait_with_output().unwrap();
    let log = d.log.join().unwrap();
    assert!(
        out.status.success(),
        "demo did not exit cleanly on SIGINT: {:?}\n{log}",
        out.status
    );
    log
}

/// Runs qemu-io's commands `cmds` on the raw device at `url`; true when
/// every one succeeded (qemu-io says "Pattern verification failed" and
/// still exits 0 on a wrong pattern, so its output is checked too).
fn qemu_io(url: &str, cmds: &[&str]) -> bool {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let out = c.arg(url).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.status.success() && !text.contains("failed") && !text.contains("error")
}

/// What `nfs-cat` reads at `path` of the demo's NFS server.
fn nfs_cat(port: u16, path: &str) -> Vec<u8> {
    clients::nfs_cat(&nfs_url(port, port, path))
}

#[test]
fn demo_serves_and_survives_a_restart() {
    let (Some(_), Some(_)) = (require::program("curl"), require::program("nfs-cat")) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tarn-demo");
    let d = start(&dir);
    assert!(d.banner.contains("created"), "{}", d.banner);
    assert!(d.banner.contains("TARN_SOCKET="), "{}", d.banner);
    assert!(d.banner.contains("mount -t nfs"), "{}", d.banner);
    let st = tarn(&d.socket, &["pool", "status", "demo"]);
    assert!(String::from_utf8_lossy(&st.stdout).contains("raidz1-0"));

    // WebDAV: upload with the printed credentials; NFS reads it back.
    let photo: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let payload = tmp.path().join("photo.raw");
    std::fs::write(&payload, &photo).unwrap();
    let creds = format!("demo:{}", d.password);
    let url = format!("{}photo.raw", d.webdav);
    let (code, _, _) = curl(&["-u", &creds, "-T", payload.to_str().unwrap(), &url]);
    assert_eq!(code, 201, "{}", d.banner);
    assert!(nfs_cat(d.nfs_port, "/files/photo.raw") == photo);
    let (code, _, _) = curl(&["-u", "demo:wrong", &url]);
    assert_eq!(code, 401);

    // The volume over NBD, as the printed qemu-io line does it.
    let qemu = require::program("qemu-io").is_some();
    if qemu {
        assert!(d.banner.contains(&format!("qemu-img info {}", d.nbd)));
        assert!(qemu_io(
            &d.nbd,
            &["write -P 0x5a 1M 1M", "read -P 0x5a 1M 1M"]
        ));
        assert!(
            !qemu_io(&d.nbd, &["read -P 0x5b 1M 1M"]),
            "a wrong pattern must fail"
        );
    }

    // As root with FUSE, the filesystem is also a folder of the demo.
    let files = dir.join("files");
    let mounted = require::fuse();
    if mounted {
        assert!(require::is_mounted(&files));
        assert!(std::fs::read(files.join("photo.raw")).unwrap() == photo);
        std::fs::write(files.join("hello.txt"), b"hello, tarn").unwrap();
    }
    let log = interrupt(d);
    if mounted {
        assert!(!require::is_mounted(&files), "Ctrl-C unmounts");
    }
    // A clean stop says nothing failed (the FUSE library's second,
    // redundant unmount used to warn "Unmount failed" here).
    assert!(!log.contains("Unmount failed"), "{log}");

    // Again: same data, same password, both URLs.
    let d = start(&dir);
    assert!(d.banner.contains("reused"), "{}", d.banner);
    let url = format!("{}photo.raw", d.webdav);
    let (code, body, _) = curl(&["-u", &format!("demo:{}", d.password), &url]);
    assert_eq!(code, 200);
    assert!(body == photo, "data changed across the restart");
    if mounted {
        assert_eq!(nfs_cat(d.nfs_port, "/files/hello.txt"), b"hello, tarn");
    }
    if qemu {
        assert!(qemu_io(&d.nbd, &["read -P 0x5a 1M 1M", "read -P 0 0 1M"]));
    }
    interrupt(d);

    // The folder moved: the paths the daemon recorded lead nowhere, and
    // the demo imports its pool from where the folder is now.
    let moved = tmp.path().join("moved-demo");
    std::fs::rename(&dir, &moved).unwrap();
    let d = start(&moved);
    assert!(d.banner.contains("imported"), "{}", d.banner);
    let url = format!("{}photo.raw", d.webdav);
    let (code, body, _) = curl(&["-u", &format!("demo:{}", d.password), &url]);
    assert_eq!(code, 200);
    assert!(body == photo, "data changed across the move");
    interrupt(d);
}

/// A demo folder too deep for its socket is refused before anything is
/// made in it, naming the option that helps.
#[test]
fn a_demo_folder_too_deep_for_its_socket_is_refused_first() {
    let tmp = tempfile::tempdir().unwrap();
    let deep = tmp.path().join("d".repeat(100));
    let out = demo_command(&deep).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--dir"), "{err}");
    assert!(!deep.exists(), "nothing is made");
}
