//! Dataset commands through the real daemon and CLI: hierarchy, property
//! sources, snapshots, rollback, clones, ranges, rename, JSON output, and
//! the state after a daemon restart.

mod common;

use common::process::{files, Daemon};

#[test]
fn dataset_commands_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path());
    let f = files(dir.path(), "m", 2, 64 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);

    // The pool's root dataset exists from the start.
    let list = d.ok(&["dataset", "list"]);
    assert!(list.contains("NAME") && list.contains("tank"), "{list}");

    d.ok(&["dataset", "create", "-o", "compression=zstd", "tank/home"]);
    d.ok(&["dataset", "create", "-p", "tank/home/alice/docs"]);
    let err = d.fails(&["dataset", "create", "tank/nope/x"]);
    assert!(err.contains("-p"), "{err}");
    let err = d.fails(&["dataset", "create", "-o", "recordsize=3K", "tank/x"]);
    assert!(err.contains("recordsize"), "{err}");
    let err = d.fails(&["dataset", "create", "other/x"]);
    assert!(err.contains("other"), "{err}");

    let get = d.ok(&[
        "dataset",
        "get",
        "compression,recordsize",
        "tank/home/alice/docs",
    ]);
    assert!(get.contains("inherited from tank/home"), "{get}");
    assert!(get.contains("128K") && get.contains("default"), "{get}");
    d.ok(&["dataset", "set", "quota=1G", "tank/home/alice"]);
    let get = d.ok(&["dataset", "get", "quota", "tank/home/alice"]);
    assert!(get.contains("1G") && get.contains("local"), "{get}");
    let err = d.fails(&["dataset", "set", "used=1", "tank/home"]);
    assert!(err.contains("read-only"), "{err}");
    d.ok(&["dataset", "inherit", "quota", "tank/home/alice"]);

    // Snapshots, recursive and atomic; list -t snapshot; ranges.
    d.ok(&["snapshot", "-r", "tank/home@mon"]);
    d.ok(&["snapshot", "tank/home@tue", "tank/home/alice@tue"]);
    d.ok(&["snapshot", "tank/home@wed"]);
    let snaps = d.ok(&["dataset", "list", "-t", "snapshot"]);
    for s in [
        "tank/home@mon",
        "tank/home/alice@mon",
        "tank/home/alice/docs@mon",
        "tank/home@wed",
    ] {
        assert!(snaps.contains(s), "{s} missing: {snaps}");
    }
    assert!(!snaps.contains("tank/home/alice/docs\n"), "{snaps}");
    let err = d.fails(&["rollback", "tank/home@mon"]);
    assert!(err.contains("-r"), "{err}");
    d.ok(&[
        "clone",
        "-o",
        "compression=off",
        "tank/home@tue",
        "tank/tuesday",
    ]);
    let err = d.fails(&["destroy", "tank/home@tue"]);
    assert!(err.contains("clone"), "{err}");
    // Promote moves tue and older to the clone; then back again.
    d.ok(&["dataset", "promote", "tank/tuesday"]);
    let snaps = d.ok(&["dataset", "list", "-t", "snapshot"]);
    assert!(
        snaps.contains("tank/tuesday@mon") && snaps.contains("tank/tuesday@tue"),
        "{snaps}"
    );
    let err = d.fails(&["dataset", "promote", "tank/tuesday"]);
    assert!(err.contains("not a clone"), "{err}");
    d.ok(&["dataset", "promote", "tank/home"]);
    d.ok(&["destroy", "tank/tuesday"]);
    d.ok(&["destroy", "tank/home@tue%wed"]);
    d.ok(&["rollback", "tank/home@mon"]);

    // JSON output carries raw numbers.
    let json = d.ok(&["dataset", "list", "-t", "all", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"tank/home@mon") && !names.contains(&"tank/home@wed"),
        "{names:?}"
    );
    assert!(v[0]["used"].is_u64());

    d.ok(&["dataset", "rename", "tank/home/alice", "tank/alice"]);
    let err = d.fails(&["dataset", "rename", "tank/alice", "other/alice"]);
    assert!(err.contains("pool"), "{err}");

    // Everything is still there after a restart of the daemon.
    d.stop();
    d = Daemon::start(dir.path());
    let all = d.ok(&["dataset", "list", "-t", "all"]);
    for s in [
        "tank/alice",
        "tank/alice/docs",
        "tank/alice@mon",
        "tank/home@mon",
    ] {
        assert!(all.contains(s), "{s} missing after restart: {all}");
    }
    let err = d.fails(&["destroy", "tank/alice"]);
    assert!(err.contains("-r"), "{err}");
    d.ok(&["destroy", "-r", "tank/alice"]);
    let err = d.fails(&["destroy", "-r", "tank"]);
    assert!(err.contains("root dataset"), "{err}");
    d.stop();
}

/// Holds through the CLI: a held snapshot refuses `destroy` with a message
/// naming the hold, `holds` lists it (text and JSON), the hold survives a
/// daemon restart, and after `release` the snapshot goes.
#[test]
fn holds_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path());
    let f = files(dir.path(), "h", 1, 64 << 20);
    d.ok(&["pool", "create", "tank", &f[0]]);
    d.ok(&["dataset", "create", "-p", "tank/home/alice"]);
    d.ok(&["snapshot", "-r", "tank/home@mon"]);
    d.ok(&["hold", "-r", "offsite", "tank/home@mon"]);
    let err = d.fails(&["hold", "offsite", "tank/home@mon"]);
    assert!(err.contains("already"), "{err}");
    let err = d.fails(&["hold", "x", "tank/home"]);
    assert!(err.contains("not a snapshot"), "{err}");
    let list = d.ok(&["holds", "-r", "tank/home@mon"]);
    assert!(
        list.contains("tank/home@mon") && list.contains("tank/home/alice@mon"),
        "{list}"
    );
    assert!(list.contains("offsite"), "{list}");
    let err = d.fails(&["destroy", "tank/home/alice@mon"]);
    assert!(err.contains("held") && err.contains("offsite"), "{err}");
    let err = d.fails(&["destroy", "-r", "tank/home"]);
    assert!(err.contains("held"), "{err}");

    d.stop();
    d = Daemon::start(dir.path());
    let json = d.ok(&["holds", "-o", "json", "tank/home/alice@mon"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        v,
        serde_json::json!([{"snapshot": "tank/home/alice@mon", "tag": "offsite"}])
    );
    d.ok(&["release", "offsite", "tank/home/alice@mon"]);
    let err = d.fails(&["release", "offsite", "tank/home/alice@mon"]);
    assert!(err.contains("no hold"), "{err}");
    d.ok(&["destroy", "tank/home/alice@mon"]);
    let err = d.fails(&["destroy", "tank/home@mon"]);
    assert!(err.contains("held"), "{err}");
    d.ok(&["release", "-r", "offsite", "tank/home@mon"]);
    d.ok(&["destroy", "-r", "tank/home"]);
    d.stop();
}
