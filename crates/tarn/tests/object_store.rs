//! Snapshots kept in a real object store (a MinIO server on loopback):
//! `tarn replicate` of an encrypted dataset, killed in the middle of its
//! upload and run again (the parts already stored are kept), an
//! incremental replication, no plaintext in any stored object, then a
//! fresh daemon and pool that receive everything from the store without
//! the key, scrub it, and open it with the passphrase; a damaged part is
//! refused with nothing left behind.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::minio::{Minio, BUCKET};
use common::process::{files, Daemon};
use tarn_testkit::require::{self, is_mounted};

const PASS: &[u8] = b"the store never sees this\n";

/// A MinIO server with its data in `dir`/store, and a daemon in
/// `dir`/home with pool tank (raidz1 of three files): None (the test
/// passes over) without MinIO or FUSE.
fn store_and_tank(dir: &std::path::Path) -> Option<(Minio, Daemon, PathBuf)> {
    let minio = require::program("minio")?;
    if !require::fuse() {
        return None;
    }
    let store_dir = dir.join("store");
    std::fs::create_dir_all(&store_dir).unwrap();
    let s3 = Minio::start(&minio, &store_dir);
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let a = Daemon::start(&home);
    let f = files(&home, "m", 3, 256 << 20);
    a.ok(&["pool", "create", "tank", "raidz1", &f[0], &f[1], &f[2]]);
    Some((s3, a, home))
}

#[test]
fn snapshots_go_to_an_object_store_and_come_back_without_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let Some((s3, a, home)) = store_and_tank(dir.path()) else {
        return;
    };
    let url = format!("s3://{BUCKET}/nas/docs");
    let mnt = home.join("docs");
    a.create_encrypted("tank/docs", &mnt, PASS);
    let canary = b"CANARY-in-the-bucket-77e1".repeat(4000);
    std::fs::write(mnt.join("letter.txt"), &canary).unwrap();
    // Random data: sixteen parts of stream, so a kill can land between
    // them.
    let big = tarn_testkit::data::Rng::new(11).bytes(128 << 20);
    std::fs::write(mnt.join("video.bin"), &big).unwrap();
    a.ok(&["snapshot", "tank/docs@night-9"]);

    // Killed as soon as the first parts are stored.
    let mut up = s3
        .command(&a, &["replicate", "tank/docs@night-9", "--to", &url])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut b = s3.bucket();
    let t0 = Instant::now();
    loop {
        let parts = b
            .list("nas/docs/")
            .unwrap()
            .iter()
            .filter(|o| o.key.contains("/part-"))
            .count();
        if parts >= 2 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no part stored");
        assert!(
            up.try_wait().unwrap().is_none(),
            "the upload ended before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Stopped in the middle (so it cannot finish meanwhile), it still
    // holds the snapshot, so pruning cannot take it, and a second run to
    // the same place is refused: it would release the first one's holds.
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &up.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let holds = a.ok(&["holds", "tank/docs@night-9"]);
    assert!(holds.contains(&format!("sending {url}")), "{holds}");
    let second = s3.run(&a, &["replicate", "tank/docs@night-9", "--to", &url]);
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success() && said.contains("is running"),
        "a second run at once: {said}"
    );
    let holds = a.ok(&["holds", "tank/docs@night-9"]);
    assert!(holds.contains(&format!("sending {url}")), "{holds}");
    // Killed, it leaves no lock behind: the runs below go ahead.
    up.kill().unwrap();
    up.wait().unwrap();
    let listed = b.list("nas/docs/").unwrap();
    assert!(
        !listed.iter().any(|o| o.key.ends_with("manifest.json")),
        "a cut upload has no manifest: {listed:?}"
    );
    a.ok(&["daemon", "ping"]);

    // Run again: the parts already there are kept.
    let out = s3.ok(
        &a,
        &["-o", "json", "replicate", "tank/docs@night-9", "--to", &url],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let r = &v[0];
    assert!(r["reused"].as_u64().unwrap() >= 2, "{out}");
    assert_eq!(
        r["reused"].as_u64().unwrap() + r["uploaded"].as_u64().unwrap(),
        r["parts"].as_u64().unwrap(),
        "{out}"
    );
    assert!(r["parts"].as_u64().unwrap() >= 16, "{out}");
    let again = s3.ok(&a, &["replicate", "tank/docs@night-9", "--to", &url]);
    assert!(again.contains("already stored"), "{again}");
    // The killed run's hold was released by the next one.
    let holds = a.ok(&["holds", "tank/docs@night-9"]);
    assert!(!holds.contains("sending"), "{holds}");

    // An incremental run sends what changed, as its own stream.
    std::fs::write(mnt.join("letter.txt"), b"rewritten").unwrap();
    a.ok(&["snapshot", "tank/docs@night-10"]);
    let out = s3.ok(
        &a,
        &[
            "-o",
            "json",
            "replicate",
            "tank/docs@night-10",
            "--to",
            &url,
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["from"], "night-9", "{out}");
    assert_eq!(v[0]["parts"], 1, "{out}");
    // The base of the next incremental is held (moved from night-9), so
    // pruning cannot take it.
    let tag = format!("replicate {url}");
    let holds = a.ok(&["holds", "tank/docs@night-9", "tank/docs@night-10"]);
    let held: Vec<&str> = holds.lines().filter(|l| l.contains(&tag)).collect();
    assert!(held.len() == 1 && held[0].contains("@night-10"), "{holds}");
    let err = a.fails(&["destroy", "tank/docs@night-10"]);
    assert!(
        err.contains(&format!("is held ({tag})")) && err.contains(&format!("release '{tag}'")),
        "{err}"
    );

    // No stored object holds the plaintext; parts of the cut try that
    // the finished stream does not name are gone.
    let objects = b.list("").unwrap();
    for o in &objects {
        let bytes = b.get(&o.key).unwrap().unwrap();
        assert!(
            !bytes.windows(25).any(|w| w == &canary[..25]),
            "plaintext in {}",
            o.key
        );
    }
    let manifests = objects
        .iter()
        .filter(|o| o.key.ends_with("/manifest.json"))
        .count();
    assert_eq!(manifests, 2);

    // A fresh machine: a new daemon and pool receive it all, no key.
    let away = dir.path().join("away");
    std::fs::create_dir_all(&away).unwrap();
    let c = Daemon::start(&away);
    let g = files(&away, "m", 2, 512 << 20);
    c.ok(&["pool", "create", "vault", "mirror", &g[0], &g[1]]);
    let out = s3.ok(&c, &["receive", "-u", "--from", &url, "vault/docs"]);
    assert!(
        out.contains("received vault/docs@night-9") && out.contains("received vault/docs@night-10"),
        "{out}"
    );
    assert_eq!(c.prop("vault/docs", "keystatus"), "unavailable");
    c.ok(&["pool", "scrub", "--wait", "vault"]);
    let status = c.ok(&["pool", "status", "vault"]);
    assert!(status.contains("No known data errors"), "{status}");
    let out = s3.ok(&c, &["receive", "--from", &url, "vault/docs"]);
    assert!(out.contains("already has"), "{out}");
    // Snapshots are ordered by when they were taken, not by name
    // ("night-10" sorts before "night-9"); the next restore takes only
    // what is new.
    a.ok(&["snapshot", "tank/docs@night-11"]);
    let out = s3.ok(
        &a,
        &[
            "-o",
            "json",
            "replicate",
            "tank/docs@night-11",
            "--to",
            &url,
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["from"], "night-10", "{out}");
    let out = s3.ok(&c, &["receive", "-u", "--from", &url, "vault/docs"]);
    assert_eq!(out.trim(), "received vault/docs@night-11", "{out}");
    c.ok(&["dataset", "set", "readonly=on", "vault/docs"]);
    let o = c.tarn_input(&["key", "load", "vault/docs"], PASS);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let view: PathBuf = away.join("view");
    std::fs::create_dir(&view).unwrap();
    c.ok(&["mount", "vault/docs", view.to_str().unwrap()]);
    assert!(is_mounted(&view));
    assert_eq!(
        std::fs::read(view.join("letter.txt")).unwrap(),
        b"rewritten"
    );
    assert!(std::fs::read(view.join("video.bin")).unwrap() == big);
    c.ok(&["unmount", view.to_str().unwrap()]);

    // A damaged part: refused, and the target is not created.
    let part = objects
        .iter()
        .find(|o| o.key.contains("-full/part-00000003-"))
        .expect("a part of the full stream");
    let mut bytes = b.get(&part.key).unwrap().unwrap();
    bytes[1000] ^= 1;
    b.put(&part.key, &bytes).unwrap();
    let o = s3.run(&c, &["receive", "--from", &url, "vault/other"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not what the manifest says"), "{err}");
    assert!(!c.ok(&["dataset", "list"]).contains("vault/other"));
    c.ok(&["daemon", "ping"]);
}

/// A series of streams that breaks off part way (the store goes away
/// during the third) moves the replication's hold to the newest stream
/// that was stored, as a series to another tarn does: held there, pruning
/// cannot destroy it, and the next run goes on from it instead of sending
/// again from the older base (which would leave two ways through the
/// store).
#[test]
fn a_series_cut_short_moves_its_hold_to_what_was_stored() {
    let dir = tempfile::tempdir().unwrap();
    let Some((s3, a, home)) = store_and_tank(dir.path()) else {
        return;
    };
    let url = format!("s3://{BUCKET}/nas/series");
    let mnt = home.join("series");
    let mp = format!("mountpoint={}", mnt.display());
    a.ok(&["dataset", "create", "-o", &mp, "tank/series"]);
    std::fs::write(mnt.join("a.txt"), b"one").unwrap();
    a.ok(&["snapshot", "tank/series@s1"]);
    s3.ok(&a, &["replicate", "tank/series@s1", "--to", &url]);
    std::fs::write(mnt.join("a.txt"), b"two").unwrap();
    a.ok(&["snapshot", "tank/series@s2"]);
    std::fs::write(mnt.join("a.txt"), b"three").unwrap();
    a.ok(&["snapshot", "tank/series@s3"]);
    // The third stream is long enough to be cut in the middle.
    let big = tarn_testkit::data::Rng::new(12).bytes(160 << 20);
    std::fs::write(mnt.join("big.bin"), &big).unwrap();
    a.ok(&["snapshot", "tank/series@s4"]);

    let mut up = s3
        .command(&a, &["replicate", "tank/series@s4", "--to", &url])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut b = s3.bucket();
    let t0 = Instant::now();
    loop {
        // Two streams of the series stored, and a part of the third: the
        // command has heard that the second's manifest was stored (the
        // third starts after that).
        let listed = b.list("nas/series/").unwrap();
        let dir = |k: &str| {
            k.rsplit_once('/')
                .map_or(String::new(), |(d, _)| d.to_string())
        };
        let done: std::collections::HashSet<String> = listed
            .iter()
            .filter(|o| o.key.ends_with("/manifest.json"))
            .map(|o| dir(&o.key))
            .collect();
        let third = listed
            .iter()
            .any(|o| o.key.contains("/part-") && !done.contains(&dir(&o.key)));
        if done.len() >= 3 && third {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "s3 never stored");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        up.try_wait().unwrap().is_none(),
        "the series ended before the store could be taken away"
    );
    drop(s3);
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = up.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "the run never gave up"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        !status.success(),
        "a series without its last stream succeeded"
    );
    let tag = format!("replicate {url}");
    let holds = a.ok(&[
        "holds",
        "tank/series@s1",
        "tank/series@s2",
        "tank/series@s3",
        "tank/series@s4",
    ]);
    let held: Vec<&str> = holds.lines().filter(|l| l.contains(&tag)).collect();
    assert!(
        held.len() == 1 && held[0].contains("@s3"),
        "the hold stays on the old base: {holds}"
    );
    assert!(!holds.contains("sending"), "{holds}");
    a.fails(&["destroy", "tank/series@s3"]);
}
