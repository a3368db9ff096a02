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
    // One NFS export per dataset: a second, read-only one would not be
    // told apart from the first by a client's file handles.
    let err = d.fails(&[
        "share",
        "add",
        "x",
        "tank/photos",
        "--nfs",
        "10.0.0.0/8",
        "--nfs-ro",
    ]);
    assert!(err.contains("exported over NFS already"), "{err}");
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

/// The shares of each dataset, by share name, as the daemon lists them.
fn shared(d: &Daemon) -> std::collections::BTreeMap<String, String> {
    let v: serde_json::Value =
        serde_json::from_str(&d.ok(&["-o", "json", "share", "list"])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["share"]["name"].as_str().unwrap().to_string(),
                s["share"]["dataset"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A renamed dataset stays shared on the same terms: its shares, and
/// those of its descendants and snapshots, follow the new names (they
/// used to keep naming the old one and stop being served). A destroyed
/// dataset's shares go with it, so one made later under the same name is
/// not served on the old terms; the shares of what stays, stay.
#[test]
fn shares_follow_renames_and_go_with_destroys() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let f = files(dir.path(), "m", 2, 64 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    for ds in ["tank/photos", "tank/photos/2026", "tank/photostudio"] {
        d.ok(&["dataset", "create", ds]);
    }
    d.ok(&["volume", "create", "-s", "-V", "16M", "tank/photos/disk"]);
    d.ok(&["snapshot", "tank/photos/disk@a"]);
    d.ok(&["snapshot", "tank/photos/disk@b"]);
    for (share, ds) in [
        ("photos", "tank/photos"),
        ("year", "tank/photos/2026"),
        ("studio", "tank/photostudio"),
    ] {
        d.ok(&["share", "add", share, ds, "--nfs", "127.0.0.1/32"]);
    }
    d.ok(&[
        "share",
        "add",
        "then",
        "tank/photos/disk@a",
        "--nbd",
        "127.0.0.1/32",
    ]);
    // Snapshot policies too.
    for (name, ds) in [
        ("snaps", "tank/photos/2026"),
        ("studio", "tank/photostudio"),
    ] {
        d.ok(&["schedule", "add", name, "snapshot", ds, "--keep", "daily=3"]);
    }
    d.ok(&["dataset", "create", "tank/media"]);
    d.ok(&["dataset", "rename", "tank/photos", "tank/media/photos"]);
    let v: serde_json::Value =
        serde_json::from_str(&d.ok(&["-o", "json", "schedule", "list"])).unwrap();
    let policies: std::collections::BTreeMap<String, String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let kind = &s["schedule"]["kind"]["snapshot"];
            (
                s["schedule"]["name"].as_str().unwrap().to_string(),
                kind["dataset"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(policies["snaps"], "tank/media/photos/2026", "{v}");
    assert_eq!(policies["studio"], "tank/photostudio", "{v}");
    let want = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert_eq!(
        shared(&d),
        want(&[
            ("photos", "tank/media/photos"),
            ("year", "tank/media/photos/2026"),
            ("then", "tank/media/photos/disk@a"),
            ("studio", "tank/photostudio"),
        ])
    );
    d.ok(&[
        "dataset",
        "rename",
        "tank/media/photos/disk@a",
        "tank/media/photos/disk@first",
    ]);
    assert_eq!(shared(&d)["then"], "tank/media/photos/disk@first");
    // Another snapshot destroyed: the shared one stays shared.
    d.ok(&["dataset", "destroy", "tank/media/photos/disk@b"]);
    assert_eq!(shared(&d).len(), 4);
    d.ok(&["dataset", "destroy", "-r", "tank/media/photos"]);
    assert_eq!(shared(&d), want(&[("studio", "tank/photostudio")]));
    // A dataset made under the old name is not shared.
    d.ok(&["dataset", "create", "tank/media/photos"]);
    assert_eq!(shared(&d).len(), 1);
    // Nor a snapshot made again after a rollback destroyed the shared one.
    d.ok(&["volume", "create", "-s", "-V", "16M", "tank/vm"]);
    d.ok(&["snapshot", "tank/vm@a"]);
    d.ok(&["snapshot", "tank/vm@b"]);
    d.ok(&["share", "add", "vm-b", "tank/vm@b", "--nbd", "127.0.0.1/32"]);
    d.ok(&["rollback", "-r", "tank/vm@a"]);
    d.ok(&["snapshot", "tank/vm@b"]);
    assert_eq!(shared(&d), want(&[("studio", "tank/photostudio")]));
    d.stop();
}

/// Two imported pools with a share of one name: the first pool's is
/// served, the other's is left out (logged), and later changes still
/// reach the NFS server: a share added is exported, and one removed is
/// no longer (an export list the server refused whole would keep the old
/// one, access that was revoked included).
#[test]
fn a_share_name_in_two_pools_does_not_freeze_the_exports() {
    if !tarn_testkit::require::programs(&["nfs-ls"]) {
        return;
    }
    use tarn_testkit::clients::{nfs_url, tool};
    let dir = tempfile::tempdir().unwrap();
    let nfs = tarn_testkit::net::free_port();
    let d = Daemon::start_with(dir.path(), &["--nfs", &format!("127.0.0.1:{nfs}")]);
    let f = files(dir.path(), "m", 2, 64 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    d.ok(&["dataset", "create", "tank/a"]);
    d.ok(&["share", "add", "media", "tank/a", "--nfs", "127.0.0.1/32"]);
    d.ok(&["pool", "export", "tank"]);
    let g = files(dir.path(), "o", 2, 64 << 20);
    d.ok(&["pool", "create", "old", "mirror", &g[0], &g[1]]);
    d.ok(&["dataset", "create", "old/b"]);
    d.ok(&["share", "add", "media", "old/b", "--nfs", "127.0.0.1/32"]);
    d.ok(&["pool", "import", "-d", dir.path().to_str().unwrap(), "tank"]);

    let listed = |path: &str| tool(&["nfs-ls", &nfs_url(nfs, nfs, path)]).0;
    assert!(listed("/media"), "the first pool's share is served");
    d.ok(&["dataset", "create", "tank/new"]);
    d.ok(&["share", "add", "fresh", "tank/new", "--nfs", "127.0.0.1/32"]);
    assert!(listed("/fresh"), "a share added later is exported");
    d.ok(&["share", "del", "fresh"]);
    assert!(!listed("/fresh"), "a share removed is no longer exported");
}
