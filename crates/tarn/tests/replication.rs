//! Send and receive through the real daemon and CLI: `tarn send | tarn
//! receive` as a shell pipe between two daemons (the second one stands for
//! an offsite box: it gets a raw stream of an encrypted dataset, scrubs it
//! without the key, and opens it only when given the passphrase), an
//! incremental stream, a stream cut short and resumed with its token, and
//! a damaged stream refused while the daemon keeps serving; a replication
//! package (`send -R`) of a tree, sent twice; `tarn replicate` to another
//! daemon's replication port over TLS with a token (scope, wrong token,
//! wrong certificate, a killed transfer resumed).

mod common;

use std::process::Command;

use common::process::{files, Daemon};
use tarn_testkit::require::{self, is_mounted};

const PASS: &[u8] = b"offsite backups never see this\n";

fn pipe(from: &Daemon, send: &str, to: &Daemon, receive: &str) -> std::process::Output {
    let tarn = env!("CARGO_BIN_EXE_tarn");
    let script = format!(
        "set -o pipefail; {tarn} --socket {} send {send} | {tarn} --socket {} receive {receive}",
        from.socket.display(),
        to.socket.display()
    );
    Command::new("bash")
        .args(["-c", &script])
        .env_remove("TARN_SOCKET")
        .output()
        .expect("run the pipe")
}

use common::process::succeeded as ok;

/// A daemon at `home` with pool `tank` and one at `offsite` with pool
/// `vault`, each laid out as given (`"-"` stands for the next member
/// file). Returns the daemons and the offsite member files.
fn two_sites(
    home: &std::path::Path,
    offsite: &std::path::Path,
    tank: &[&str],
    vault: &[&str],
) -> (Daemon, Daemon, Vec<String>) {
    let mut out = Vec::new();
    let mut members = Vec::new();
    for (dir, pool, layout) in [(home, "tank", tank), (offsite, "vault", vault)] {
        std::fs::create_dir_all(dir).unwrap();
        let d = Daemon::start(dir);
        let n = layout.iter().filter(|a| **a == "-").count();
        let f = files(dir, "m", n, 64 << 20);
        let mut it = f.iter();
        let mut args = vec!["pool", "create", pool];
        args.extend(layout.iter().map(|a| {
            if *a == "-" {
                it.next().unwrap().as_str()
            } else {
                a
            }
        }));
        d.ok(&args);
        out.push(d);
        members = f;
    }
    let b = out.pop().unwrap();
    let a = out.pop().unwrap();
    (a, b, members)
}

#[test]
fn snapshots_travel_between_daemons_raw_and_resumed() {
    if !require::fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (home, offsite) = (dir.path().join("home"), dir.path().join("offsite"));
    let (a, b, fb) = two_sites(
        &home,
        &offsite,
        &["raidz1", "-", "-", "-"],
        &["mirror", "-", "-"],
    );
    let mnt = home.join("docs");
    a.create_encrypted("tank/docs", &mnt, PASS);
    let canary = b"CANARY-offsite-5c1d00aa".repeat(2000);
    std::fs::write(mnt.join("taxes.pdf"), &canary).unwrap();
    std::fs::create_dir(mnt.join("2026")).unwrap();
    std::fs::write(mnt.join("2026/receipt.txt"), b"first").unwrap();
    a.ok(&["snapshot", "tank/docs@mon"]);
    std::fs::write(mnt.join("2026/receipt.txt"), b"second").unwrap();
    a.ok(&["snapshot", "tank/docs@tue"]);

    // Raw, full then incremental, into a pool that never gets the key.
    ok(pipe(&a, "-w tank/docs@mon", &b, "vault/docs"), "raw full");
    ok(
        pipe(&a, "-w -i @mon tank/docs@tue", &b, "vault/docs"),
        "raw incremental",
    );
    assert_eq!(b.prop("vault/docs", "keystatus"), "unavailable");
    for m in &fb {
        let bytes = std::fs::read(m).unwrap();
        assert!(
            !bytes.windows(23).any(|w| w == &canary[..23]),
            "plaintext on the offsite pool"
        );
    }
    b.ok(&["pool", "scrub", "--wait", "vault"]);
    let status = b.ok(&["pool", "status", "vault"]);
    assert!(status.contains("No known data errors"), "{status}");
    let snaps = b.ok(&["dataset", "list", "-t", "snapshot"]);
    assert!(
        snaps.contains("vault/docs@mon") && snaps.contains("vault/docs@tue"),
        "{snaps}"
    );
    // The passphrase opens it there: the same files.
    // A backup copy is kept read-only (reading would update access
    // times); receiving goes on regardless.
    b.ok(&["dataset", "set", "readonly=on", "vault/docs"]);
    ok(
        b.tarn_input(&["key", "load", "vault/docs"], PASS),
        "key load offsite",
    );
    let view = offsite.join("view");
    std::fs::create_dir(&view).unwrap();
    b.ok(&["mount", "vault/docs", view.to_str().unwrap()]);
    assert!(is_mounted(&view));
    assert_eq!(std::fs::read(view.join("taxes.pdf")).unwrap(), canary);
    assert_eq!(
        std::fs::read(view.join("2026/receipt.txt")).unwrap(),
        b"second"
    );
    b.ok(&["unmount", view.to_str().unwrap()]);

    // A stream cut short, received resumably, then finished with its token.
    let big = tarn_testkit::data::Rng::new(5).bytes(3 << 20);
    std::fs::write(mnt.join("big.bin"), &big).unwrap();
    a.ok(&["snapshot", "tank/docs@wed"]);
    let file = dir.path().join("wed.stream");
    a.ok(&[
        "send",
        "-w",
        "-i",
        "@tue",
        "--to",
        file.to_str().unwrap(),
        "tank/docs@wed",
    ]);
    let whole = std::fs::read(&file).unwrap();
    let cut = dir.path().join("cut.stream");
    std::fs::write(&cut, &whole[..whole.len() * 2 / 3]).unwrap();
    let err = b.fails(&[
        "receive",
        "-s",
        "--from",
        cut.to_str().unwrap(),
        "vault/docs",
    ]);
    assert!(err.contains("stream"), "{err}");
    let token = b.prop("vault/docs", "receive_resume_token");
    assert!(token.len() > 20, "a resume token: {token}");
    let rest = dir.path().join("rest.stream");
    a.ok(&["send", "-t", &token, "--to", rest.to_str().unwrap()]);
    assert!(std::fs::metadata(&rest).unwrap().len() < whole.len() as u64);
    b.ok(&[
        "receive",
        "-s",
        "--from",
        rest.to_str().unwrap(),
        "vault/docs",
    ]);
    assert_eq!(b.prop("vault/docs", "receive_resume_token"), "-");
    b.ok(&["mount", "vault/docs", view.to_str().unwrap()]);
    assert_eq!(std::fs::read(view.join("big.bin")).unwrap(), big);
    b.ok(&["unmount", view.to_str().unwrap()]);

    // A damaged stream is refused, leaves nothing behind, and both
    // daemons go on serving.
    let full = dir.path().join("full.stream");
    a.ok(&[
        "send",
        "-w",
        "--to",
        full.to_str().unwrap(),
        "tank/docs@wed",
    ]);
    let mut bad = std::fs::read(&full).unwrap();
    let at = bad.len() / 2;
    bad[at] ^= 0x20;
    let damaged = dir.path().join("bad.stream");
    std::fs::write(&damaged, &bad).unwrap();
    let err = b.fails(&[
        "receive",
        "--from",
        damaged.to_str().unwrap(),
        "vault/other",
    ]);
    assert!(err.contains("bad stream"), "{err}");
    assert!(!b.ok(&["dataset", "list"]).contains("vault/other"));
    b.ok(&["daemon", "ping"]);
    a.ok(&["daemon", "ping"]);
    // Not to a terminal, and nothing without a snapshot.
    let err = a.fails(&["send", "tank/docs"]);
    assert!(
        err.contains("not a snapshot") || err.contains("binary"),
        "{err}"
    );
}

/// `send -R` through the pipe: the tree arrives with its snapshots and
/// local properties, the receiver says what it received, and the same
/// package sent again is skipped, not refused.
#[test]
fn a_tree_travels_as_one_package() {
    let dir = tempfile::tempdir().unwrap();
    let (home, offsite) = (dir.path().join("home"), dir.path().join("offsite"));
    let (a, b, _) = two_sites(&home, &offsite, &["-"], &["-"]);
    a.ok(&["dataset", "create", "-o", "compression=zstd", "tank/home"]);
    a.ok(&["dataset", "create", "-o", "quota=1G", "tank/home/kids"]);
    a.ok(&["dataset", "create", "tank/home/kids/lego"]);
    a.ok(&["snapshot", "-r", "tank/home@one"]);
    a.ok(&["snapshot", "-r", "tank/home@two"]);
    let out = ok(pipe(&a, "-R tank/home@two", &b, "vault/home"), "-R");
    for s in [
        "vault/home@one",
        "vault/home/kids@two",
        "vault/home/kids/lego@two",
    ] {
        assert!(out.contains(&format!("received {s}")), "{s}: {out}");
    }
    assert_eq!(b.prop("vault/home", "compression"), "zstd");
    assert_eq!(b.prop("vault/home/kids", "quota"), "1073741824");
    let snaps = b.ok(&["dataset", "list", "-t", "snapshot"]);
    assert_eq!(snaps.matches("vault/home").count(), 6, "{snaps}");
    let again = ok(pipe(&a, "-R tank/home@two", &b, "vault/home"), "-R again");
    assert!(!again.contains("received"), "{again}");
    assert_eq!(again.matches("skipped").count(), 6, "{again}");
    // The incremental package after a new snapshot: only it arrives.
    a.ok(&["snapshot", "-r", "tank/home@three"]);
    let out = ok(
        pipe(&a, "-R -i @two tank/home@three", &b, "vault/home"),
        "-R -i",
    );
    assert_eq!(out.matches("received").count(), 3, "{out}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `tarn replicate --to tarn://`: an encrypted dataset goes raw to
/// another daemon's replication port, which never has the key; later
/// snapshots go as a series; the token's scope, a wrong token, a wrong
/// certificate and a deleted token are refused; a transfer killed half
/// way is finished by the next run from where it broke off.
#[test]
fn replicate_to_another_tarn_over_tls() {
    if !require::fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (home, offsite) = (dir.path().join("home"), dir.path().join("offsite"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&offsite).unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let a = Daemon::start(&home);
    let b = Daemon::start_with(&offsite, &["--replication", &listen]);
    let fa = files(&home, "m", 1, 512 << 20);
    let fb = files(&offsite, "m", 1, 512 << 20);
    a.ok(&["pool", "create", "tank", &fa[0]]);
    b.ok(&["pool", "create", "vault", &fb[0]]);
    b.ok(&["dataset", "create", "vault/backups"]);
    let token = b.ok(&["replication", "token", "add", "home-nas", "vault/backups"]);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token.trim()).unwrap();
    let info: serde_json::Value =
        serde_json::from_str(&b.ok(&["-o", "json", "replication", "info"])).unwrap();
    let fp = info["fingerprint"].as_str().unwrap().to_string();
    assert_eq!(info["listen"], listen.as_str());
    let tokens = b.ok(&["replication", "token", "list"]);
    assert!(
        tokens.contains("home-nas") && !tokens.contains(token.trim()),
        "{tokens}"
    );

    let mnt = home.join("docs");
    a.create_encrypted("tank/docs", &mnt, PASS);
    let canary = b"CANARY-over-the-wire-0b7a".repeat(2000);
    std::fs::write(mnt.join("letter.txt"), &canary).unwrap();
    a.ok(&["snapshot", "tank/docs@night-9"]);
    let url = format!("tarn://127.0.0.1:{port}/vault/backups/docs");
    let tf = token_file.to_str().unwrap();
    let replicate = |snap: &str, to: &str, fp: &str| {
        a.tarn(&[
            "replicate",
            snap,
            "--to",
            to,
            "--token-file",
            tf,
            "--fingerprint",
            fp,
        ])
    };
    let out = ok(replicate("tank/docs@night-9", &url, &fp), "replicate");
    assert!(out.contains("received vault/backups/docs@night-9"), "{out}");
    assert_eq!(b.prop("vault/backups/docs", "keystatus"), "unavailable");
    // The sender's mountpoint (a folder on the sender) is not taken over.
    let mp = b.prop("vault/backups/docs", "mountpoint");
    assert!(!mp.contains("home/docs"), "{mp}");
    for m in &fb {
        let bytes = std::fs::read(m).unwrap();
        assert!(
            !bytes.windows(25).any(|w| w == &canary[..25]),
            "plaintext on the receiver"
        );
    }
    // Two more snapshots: one series ("night-10" sorts before "night-9").
    std::fs::write(mnt.join("letter.txt"), b"second").unwrap();
    a.ok(&["snapshot", "tank/docs@night-10"]);
    a.ok(&["snapshot", "tank/docs@night-11"]);
    let out = ok(
        replicate("tank/docs@night-11", &url, &fp),
        "replicate a series",
    );
    assert!(
        out.contains("received vault/backups/docs@night-10")
            && out.contains("received vault/backups/docs@night-11"),
        "{out}"
    );
    let out = ok(replicate("tank/docs@night-11", &url, &fp), "again");
    assert!(out.contains("already has"), "{out}");

    // A series that breaks part way: the held base moves to the newest
    // snapshot the receiver got, so pruning here keeps what the next
    // incremental needs.
    let holds = |snap: &str| a.ok(&["holds", snap]);
    assert!(holds("tank/docs@night-11").contains("replicate"));
    std::fs::write(mnt.join("note.txt"), b"small").unwrap();
    a.ok(&["snapshot", "tank/docs@night-12"]);
    std::fs::write(
        mnt.join("large.bin"),
        tarn_testkit::data::Rng::new(12).bytes(24 << 20),
    )
    .unwrap();
    a.ok(&["snapshot", "tank/docs@night-13"]);
    let used: u64 = b.prop("vault/backups/docs", "used").parse().unwrap();
    let quota = format!("quota={}", used + (8 << 20));
    b.ok(&["dataset", "set", &quota, "vault/backups/docs"]);
    let o = replicate("tank/docs@night-13", &url, &fp);
    assert!(!o.status.success(), "the quota stops the second stream");
    assert!(b
        .ok(&["dataset", "list", "-t", "snapshot"])
        .contains("vault/backups/docs@night-12"));
    assert!(
        holds("tank/docs@night-12").contains("replicate"),
        "{}",
        holds("tank/docs@night-12")
    );
    assert!(!holds("tank/docs@night-11").contains("replicate"));
    b.ok(&["dataset", "set", "quota=none", "vault/backups/docs"]);
    let out = ok(
        replicate("tank/docs@night-13", &url, &fp),
        "after the quota",
    );
    assert!(
        out.contains("received vault/backups/docs@night-13"),
        "{out}"
    );
    assert!(holds("tank/docs@night-13").contains("replicate"));
    assert!(
        !holds("tank/docs@night-12").contains("sending"),
        "released after the failure"
    );

    // While a snapshot travels it is held, so that pruning cannot take it
    // (the receiver's disk made slow so that the transfer lasts); the
    // hold goes when it has arrived.
    std::fs::write(
        mnt.join("large2.bin"),
        tarn_testkit::data::Rng::new(14).bytes(24 << 20),
    )
    .unwrap();
    a.ok(&["snapshot", "tank/docs@night-14"]);
    b.ok(&[
        "pool",
        "inject",
        "vault",
        &fb[0],
        "latency",
        "--latency-ms",
        "20",
    ]);
    let mut slow = std::process::Command::new(env!("CARGO_BIN_EXE_tarn"))
        .args(["--socket"])
        .arg(&a.socket)
        .args([
            "replicate",
            "tank/docs@night-14",
            "--to",
            &url,
            "--token-file",
            tf,
            "--fingerprint",
            &fp,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !holds("tank/docs@night-14").contains("sending") {
        assert!(
            slow.try_wait().unwrap().is_none(),
            "the transfer ended and its snapshot was never held"
        );
        assert!(t0.elapsed().as_secs() < 60, "no hold while sending");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let err = a.fails(&["destroy", "tank/docs@night-14"]);
    assert!(err.contains("held"), "{err}");
    assert!(slow.wait().unwrap().success(), "the slow transfer");
    b.ok(&["pool", "inject", "vault", &fb[0], "--clear"]);
    let h = holds("tank/docs@night-14");
    assert!(h.contains("replicate") && !h.contains("sending"), "{h}");

    // What the token may not do, and who may not use it.
    let other = format!("tarn://127.0.0.1:{port}/vault/elsewhere");
    let err =
        String::from_utf8_lossy(&replicate("tank/docs@night-11", &other, &fp).stderr).into_owned();
    assert!(err.contains("outside"), "{err}");
    let wrong_fp = "00".repeat(32);
    let o = replicate("tank/docs@night-11", &url, &wrong_fp);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("pinned") || err.contains("certificate"),
        "{err}"
    );
    std::fs::write(&token_file, "ab".repeat(32)).unwrap();
    let err =
        String::from_utf8_lossy(&replicate("tank/docs@night-11", &url, &fp).stderr).into_owned();
    assert!(err.contains("not a replication token"), "{err}");
    std::fs::write(&token_file, token.trim()).unwrap();

    // A transfer killed half way: the next run resumes it.
    let big = tarn_testkit::data::Rng::new(9).bytes(160 << 20);
    std::fs::write(mnt.join("video.bin"), &big).unwrap();
    a.ok(&["snapshot", "tank/docs@big"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tarn"))
        .arg("--socket")
        .arg(&a.socket)
        .args([
            "replicate",
            "tank/docs@big",
            "--to",
            &url,
            "--token-file",
            tf,
        ])
        .args(["--fingerprint", &fp])
        .env_remove("TARN_SOCKET")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    loop {
        let t = b.prop("vault/backups/docs", "receive_resume_token");
        if t != "-" && !t.is_empty() {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the transfer ended before it could be cut"
        );
        assert!(t0.elapsed().as_secs() < 120, "no partial receive seen");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // The receiver notices the cut and keeps what arrived; until then a
    // second receive into the dataset is refused as busy.
    let t0 = std::time::Instant::now();
    let resumed = loop {
        let o = replicate("tank/docs@big", &url, &fp);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        if o.status.success() || !err.contains("running") || t0.elapsed().as_secs() > 30 {
            break o;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let out = ok(resumed, "resume");
    assert!(
        out.contains("resumed and received vault/backups/docs@big"),
        "{out}"
    );
    assert_eq!(b.prop("vault/backups/docs", "receive_resume_token"), "-");

    // The receiver scrubs it without the key; the passphrase opens it.
    b.ok(&["pool", "scrub", "--wait", "vault"]);
    let status = b.ok(&["pool", "status", "vault"]);
    assert!(status.contains("No known data errors"), "{status}");
    b.ok(&["dataset", "set", "readonly=on", "vault/backups/docs"]);
    ok(
        b.tarn_input(&["key", "load", "vault/backups/docs"], PASS),
        "key load",
    );
    let view = offsite.join("view");
    std::fs::create_dir(&view).unwrap();
    b.ok(&["mount", "vault/backups/docs", view.to_str().unwrap()]);
    assert!(is_mounted(&view));
    assert_eq!(std::fs::read(view.join("letter.txt")).unwrap(), b"second");
    assert!(std::fs::read(view.join("video.bin")).unwrap() == big);
    b.ok(&["unmount", view.to_str().unwrap()]);

    // A sender that asks the port for more than it allows gets less: no
    // mount, no rollback, no mountpoint or reservation of its choosing;
    // how data is stored (compression) it may choose.
    let hostile = home.join("hostile");
    std::fs::create_dir(&hostile).unwrap();
    let mp = format!("mountpoint={}", hostile.display());
    a.ok(&[
        "dataset",
        "create",
        "-o",
        &mp,
        "-o",
        "reservation=100M",
        "-o",
        "compression=zstd",
        "tank/evil",
    ]);
    a.ok(&["snapshot", "tank/evil@1"]);
    let stream = dir.path().join("evil.stream");
    a.ok(&[
        "send",
        "-p",
        "--to",
        stream.to_str().unwrap(),
        "tank/evil@1",
    ]);
    let bytes = std::fs::read(&stream).unwrap();
    let t = tarn_cli::remote::Target::parse(&format!("tarn://127.0.0.1:{port}/vault/backups/evil"))
        .unwrap();
    let pin = tarn_cli::remote::parse_fingerprint(&fp).unwrap();
    let remote = tarn_cli::remote::Remote::connect(&t, &pin, token.trim()).unwrap();
    let asked = serde_json::json!({
        "name": "vault/backups/evil", "force": true, "no_mount": false,
        "props_allowed": ["mountpoint", "reservation", "compression"],
    });
    remote
        .call_with_body("dataset.receive", &asked, |w| {
            w.write_all(&bytes)?;
            Ok(())
        })
        .unwrap();
    assert_eq!(b.prop("vault/backups/evil", "compression"), "zstd");
    let mp = b.prop("vault/backups/evil", "mountpoint");
    assert!(!mp.contains("hostile"), "{mp}");
    assert_ne!(b.prop("vault/backups/evil", "reservation"), "104857600");
    // (The sender mounts its own dataset there; the receiver nothing.)
    assert!(!b.ok(&["mount"]).contains("vault/backups/evil"));

    // A token deleted while its stream comes ends the receive: the rest
    // of the stream is not taken.
    let big_stream = dir.path().join("big.stream");
    a.ok(&[
        "send",
        "-w",
        "--to",
        big_stream.to_str().unwrap(),
        "tank/docs@big",
    ]);
    let bytes = std::fs::read(&big_stream).unwrap();
    let t = tarn_cli::remote::Target::parse(&format!("tarn://127.0.0.1:{port}/vault/backups/cut"))
        .unwrap();
    let remote = tarn_cli::remote::Remote::connect(&t, &pin, token.trim()).unwrap();
    let half = bytes.len() / 2;
    let cut = remote.call_with_body(
        "dataset.receive",
        &serde_json::json!({"name": "vault/backups/cut"}),
        |w| {
            w.write_all(&bytes[..half])?;
            w.flush()?;
            b.ok(&["replication", "token", "del", "home-nas"]);
            std::thread::sleep(std::time::Duration::from_millis(1500));
            w.write_all(&bytes[half..])?;
            Ok(())
        },
    );
    assert!(
        cut.is_err(),
        "the receive went on after its token was deleted"
    );
    assert!(
        !b.ok(&["dataset", "list"]).contains("vault/backups/cut"),
        "the stream of a deleted token was received"
    );

    // A deleted token no longer opens a session.
    let err = String::from_utf8_lossy(&replicate("tank/docs@big", &url, &fp).stderr).into_owned();
    assert!(err.contains("not a replication token"), "{err}");

    // A token is for the pool it was made in: another pool that takes
    // its name (the old one exported, a new disk set up) is not it.
    let second = b.ok(&["replication", "token", "add", "second", "vault/backups"]);
    let t =
        tarn_cli::remote::Target::parse(&format!("tarn://127.0.0.1:{port}/vault/backups")).unwrap();
    assert!(tarn_cli::remote::Remote::connect(&t, &pin, second.trim()).is_ok());
    b.ok(&["pool", "export", "vault"]);
    let other = files(&offsite, "other", 1, 512 << 20);
    b.ok(&["pool", "create", "vault", &other[0]]);
    b.ok(&["dataset", "create", "vault/backups"]);
    let refused = tarn_cli::remote::Remote::connect(&t, &pin, second.trim()).map(|_| ());
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("not a replication token")),
        "a token of the exported pool opened the new one: {refused:?}"
    );
    b.ok(&["daemon", "ping"]);
}
