//! The daemon serving shares over NFS and WebDAV to real clients (libnfs's
//! nfs-cp/nfs-cat, curl): users and shares from the pool, changes applied
//! live, everything back after a restart.

mod common;

use common::clients::add_user;
use common::process::{files, Daemon};
use tarn_testkit::clients::{curl, nfs_cat, nfs_cp, nfs_url, tool};
use tarn_testkit::net::free_port;
use tarn_testkit::require;

#[test]
fn shares_are_served_over_nfs_and_webdav() {
    let (Some(_), Some(_), Some(_)) = (
        require::program("curl"),
        require::program("nfs-cp"),
        require::program("nfs-cat"),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (nfs, dav) = (free_port(), free_port());
    let nfs_arg = format!("127.0.0.1:{nfs}");
    let dav_arg = format!("127.0.0.1:{dav}");
    let args = ["--nfs", nfs_arg.as_str(), "--webdav", dav_arg.as_str()];
    let mut d = Daemon::start_with(dir.path(), &args);
    let f = files(dir.path(), "m", 4, 64 << 20);
    d.ok(&[
        "pool", "create", "tank", "raidz1", &f[0], &f[1], &f[2], &f[3],
    ]);
    d.ok(&["dataset", "create", "tank/photos"]);
    add_user(&d, "alice", "wonder-land");
    add_user(&d, "bob", "build-it");
    d.ok(&[
        "share",
        "add",
        "photos",
        "tank/photos",
        "--nfs",
        "127.0.0.1/32",
        "--all-squash",
        "--anon-uid",
        "10000",
        "--anon-gid",
        "10000",
        "--webdav",
        "alice=rw",
        "--webdav",
        "bob=ro",
        "--owner",
        "alice",
    ]);
    let web = |p: &str| format!("http://127.0.0.1:{dav}/photos/{p}");

    // WebDAV: alice writes, bob reads, a wrong password is refused.
    let local = dir.path().join("hello.txt");
    std::fs::write(&local, b"hello from webdav").unwrap();
    let (code, _, _) = curl(&[
        "-u",
        "alice:wonder-land",
        "-T",
        local.to_str().unwrap(),
        &web("hello.txt"),
    ]);
    assert_eq!(code, 201);
    let (code, body, _) = curl(&["-u", "bob:build-it", &web("hello.txt")]);
    assert_eq!((code, body.as_slice()), (200, &b"hello from webdav"[..]));
    let (code, _, _) = curl(&[
        "-u",
        "bob:build-it",
        "-T",
        local.to_str().unwrap(),
        &web("bob.txt"),
    ]);
    assert_eq!(code, 403, "bob is read-only on this share");
    let (code, _, _) = curl(&["-u", "alice:wrong", &web("hello.txt")]);
    assert_eq!(code, 401);

    // NFS (every client squashed to alice, uid 10000): the same dataset;
    // a file copied in shows up over WebDAV.
    let big: Vec<u8> = (0..(1 << 20) + 1).map(|i: u32| (i % 247) as u8).collect();
    let src = dir.path().join("big.bin");
    std::fs::write(&src, &big).unwrap();
    assert!(nfs_cp(
        src.to_str().unwrap(),
        &nfs_url(nfs, nfs, "/photos/big.bin")
    ));
    let (code, body, _) = curl(&["-u", "alice:wonder-land", &web("big.bin")]);
    assert_eq!(code, 200);
    assert!(body == big, "WebDAV sees what NFS wrote");
    assert_eq!(
        nfs_cat(&nfs_url(nfs, nfs, "/photos/hello.txt")),
        b"hello from webdav"
    );

    // A restarted daemon serves the same shares and data.
    d.stop();
    d = Daemon::start_with(dir.path(), &args);
    let (code, body, _) = curl(&["-u", "alice:wonder-land", &web("big.bin")]);
    assert_eq!(code, 200);
    assert!(body == big);

    // Removing the share takes it off both servers at once.
    d.ok(&["share", "del", "photos"]);
    let (code, _, _) = curl(&["-u", "alice:wonder-land", &web("hello.txt")]);
    assert_eq!(code, 404);
    let (ok, _, _) = tool(&["nfs-cat", &nfs_url(nfs, nfs, "/photos/hello.txt")]);
    assert!(!ok, "the export is gone");
    d.stop();
}

/// Off loopback, WebDAV is HTTPS with a self-signed certificate made in the
/// state directory at the first start and kept for the next.
#[test]
fn webdav_off_loopback_is_https() {
    let Some(_) = require::program("curl") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let bind = format!("0.0.0.0:{port}");
    let d = Daemon::start_with(dir.path(), &["--webdav", bind.as_str()]);
    let url = format!("https://127.0.0.1:{port}/");
    let (code, _, _) = curl(&["-k", &url]);
    assert_eq!(code, 401, "HTTPS answers (and wants a login)");
    let (code, _, _) = curl(&[&format!("http://127.0.0.1:{port}/")]);
    assert_ne!(code, 401, "no plain HTTP off loopback");
    let cert = dir.path().join("state/tls/webdav-cert.pem");
    let first = std::fs::read(&cert).expect("the self-signed certificate");
    d.stop();
    let d = Daemon::start_with(dir.path(), &["--webdav", bind.as_str()]);
    assert_eq!(std::fs::read(&cert).unwrap(), first, "kept across restarts");
    d.stop();
    // Plain HTTP off loopback only when asked for.
    let d = Daemon::start_with(
        dir.path(),
        &["--webdav", bind.as_str(), "--webdav-plain-http"],
    );
    let (code, _, _) = curl(&[&format!("http://127.0.0.1:{port}/")]);
    assert_eq!(code, 401);
    d.stop();
}

/// Users are per pool: a share is used by the users of the pool that
/// stores it, never by a user of the same name in another pool with that
/// one's password (who is another person).
#[test]
fn webdav_shares_admit_only_the_users_of_their_pool() {
    let Some(_) = require::program("curl") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let dav = free_port();
    let dav_arg = format!("127.0.0.1:{dav}");
    let d = Daemon::start_with(dir.path(), &["--webdav", dav_arg.as_str()]);
    let a = files(dir.path(), "a", 1, 64 << 20);
    let v = files(dir.path(), "v", 1, 64 << 20);
    d.ok(&["pool", "create", "tank", &a[0]]);
    d.ok(&["pool", "create", "vault", &v[0]]);
    d.ok(&["dataset", "create", "vault/docs"]);
    for (pool, pw) in [("tank", "tank-alice-pw"), ("vault", "vault-alice-pw")] {
        let o = common::clients::tarn_with_stdin(
            &d,
            &["user", "add", "--pool", pool, "--password-stdin", "alice"],
            &format!("{pw}\n"),
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    d.ok(&[
        "share",
        "add",
        "docs",
        "vault/docs",
        "--webdav",
        "alice=rw",
        "--owner",
        "alice",
    ]);
    let url = format!("http://127.0.0.1:{dav}/docs/note.txt");
    let local = dir.path().join("note.txt");
    std::fs::write(&local, b"vault's alice").unwrap();
    let put = |who: &str| curl(&["-u", who, "-T", local.to_str().unwrap(), &url]).0;
    assert_eq!(
        put("alice:tank-alice-pw"),
        401,
        "tank's alice wrote to vault's share"
    );
    assert_eq!(put("alice:vault-alice-pw"), 201);
    let (code, _, _) = curl(&["-u", "alice:tank-alice-pw", &url]);
    assert_eq!(code, 401, "tank's alice read vault's share");
    let (code, body, _) = curl(&["-u", "alice:vault-alice-pw", &url]);
    assert_eq!((code, body.as_slice()), (200, &b"vault's alice"[..]));
    d.stop();
}
