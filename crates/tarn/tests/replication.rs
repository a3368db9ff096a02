//! Send and receive through the real daemon and CLI: `tarn send | tarn
//! receive` as a shell pipe between two daemons (the second one stands for
//! an offsite box: it gets a raw stream of an encrypted dataset, scrubs it
//! without the key, and opens it only when given the passphrase), an
//! incremental stream, a stream cut short and resumed with its token, and
//! a damaged stream refused while the daemon keeps serving; a replication
//! package (`send -R`) of a tree, sent twice.

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
