//! Users and shares through the real daemon and CLI: stored in the pool,
//! checked, listed, kept across a restart; passwords only as argon2
//! hashes.

mod common;

use common::clients::tarn_with_stdin;
use common::process::{files, Daemon};
use tarn_testkit::pools::{attached, opts, try_import};

#[test]
fn users_and_shares_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path());
    let f = files(dir.path(), "m", 2, 64 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    d.ok(&["dataset", "create", "tank/photos"]);

    let o = tarn_with_stdin(&d, &["user", "add", "alice"], "s3cret-pw\n");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = tarn_with_stdin(&d, &["user", "add", "--uid", "2000", "bob"], "hunter22\n");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = tarn_with_stdin(&d, &["user", "add", "alice"], "again\n");
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists"));
    let o = tarn_with_stdin(&d, &["user", "add", "Bad Name"], "x\n");
    assert!(!o.status.success());
    let list = d.ok(&["user", "list"]);
    assert!(list.contains("alice") && list.contains("10000"), "{list}");
    assert!(list.contains("bob") && list.contains("2000"), "{list}");

    d.ok(&[
        "share",
        "add",
        "photos",
        "tank/photos",
        "--nfs",
        "192.168.1.0/24",
        "--nfs",
        "::1",
        "--webdav",
        "alice=rw",
        "--webdav",
        "bob=ro",
    ]);
    let shares = d.ok(&["share", "list"]);
    assert!(
        shares.contains("photos") && shares.contains("192.168.1.0/24"),
        "{shares}"
    );
    assert!(
        shares.contains("alice=rw") && shares.contains("bob=ro"),
        "{shares}"
    );
    let err = d.fails(&["share", "add", "x", "tank/photos", "--nfs", "10.0.0.0/33"]);
    assert!(err.contains("10.0.0.0/33"), "{err}");
    let err = d.fails(&["share", "add", "x", "tank/photos", "--webdav", "carol"]);
    assert!(err.contains("carol"), "{err}");
    let err = d.fails(&["share", "add", "x", "tank/photos"]);
    assert!(err.contains("--nfs"), "{err}");
    let err = d.fails(&["share", "add", "x", "tank/nothing", "--nfs", "10.0.0.0/8"]);
    assert!(err.contains("tank/nothing"), "{err}");
    let err = d.fails(&["user", "del", "bob"]);
    assert!(err.contains("photos"), "{err}");
    let o = tarn_with_stdin(&d, &["user", "passwd", "bob"], "new-pass\n");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Everything lives in the pool: a restart keeps it.
    d.stop();
    d = Daemon::start(dir.path());
    let shares = d.ok(&["share", "list"]);
    assert!(shares.contains("alice=rw"), "{shares}");
    assert!(d.ok(&["user", "list"]).contains("bob"));
    d.ok(&["share", "del", "photos"]);
    d.ok(&["user", "del", "bob"]);
    let err = d.fails(&["user", "del", "bob"]);
    assert!(err.contains("no user"), "{err}");
    d.ok(&["pool", "export", "tank"]);
    d.stop();

    // The password is stored only as a hash, and checks against it.
    let pool = attached(try_import(&[dir.path()], "tank", true, opts()).unwrap());
    let users = tarn_daemon::access::users(&pool).unwrap();
    let alice = users.iter().find(|u| u.name == "alice").unwrap();
    assert!(alice.hash.starts_with("$argon2id$") && !alice.hash.contains("s3cret"));
    assert!(tarn_daemon::access::authenticate(&pool, "alice", "s3cret-pw").is_some());
    assert!(tarn_daemon::access::authenticate(&pool, "alice", "s3cret-pX").is_none());
    assert!(tarn_daemon::access::authenticate(&pool, "nobody", "s3cret-pw").is_none());
}
