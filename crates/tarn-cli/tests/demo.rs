//! The README's main command as a user runs it: start `tarn demo`, use the
//! pool, stop it with SIGINT, start it again, and find the data still there.

mod common;

use std::path::Path;

use common::process::tarn_at as tarn;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn start(dir: &Path) -> (Child, std::path::PathBuf) {
    let child = Command::new(env!("CARGO_BIN_EXE_tarn"))
        .args(["demo", "--dir"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let socket = dir.join("tarn.sock");
    let t0 = Instant::now();
    while !tarn(&socket, &["daemon", "ping"]).status.success() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "demo did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, socket)
}

fn interrupt(child: Child) -> String {
    // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped).
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(rc, 0);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "demo did not exit cleanly on SIGINT: {:?}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn demo_survives_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tarn-demo");
    let (child, socket) = start(&dir);
    let payload = tmp.path().join("payload");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&payload, &data).unwrap();
    let o = tarn(
        &socket,
        &["object", "put", "demo", "photo", payload.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = tarn(&socket, &["pool", "status", "demo"]);
    assert!(String::from_utf8_lossy(&st.stdout).contains("raidz1-0"));
    let ls = tarn(&socket, &["dataset", "list"]);
    assert!(String::from_utf8_lossy(&ls.stdout).contains("demo/files"));
    // As root with FUSE, the filesystem is a folder of the demo.
    let files = dir.join("files");
    let mounted = common::require::fuse();
    if mounted {
        assert!(common::require::is_mounted(&files));
        std::fs::write(files.join("hello.txt"), b"hello, tarn").unwrap();
    }
    let banner = interrupt(child);
    if mounted {
        assert!(!common::require::is_mounted(&files), "Ctrl-C unmounts");
    }
    assert!(
        banner.contains("TARN_SOCKET="),
        "no hints printed: {banner}"
    );
    assert!(banner.contains("created"), "{banner}");

    let (child, socket) = start(&dir);
    let back = tmp.path().join("back");
    let o = tarn(
        &socket,
        &["object", "get", "demo", "photo", back.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "data changed across the restart"
    );
    if mounted {
        assert_eq!(
            std::fs::read(files.join("hello.txt")).unwrap(),
            b"hello, tarn"
        );
    }
    let banner = interrupt(child);
    assert!(banner.contains("reused"), "{banner}");
}
