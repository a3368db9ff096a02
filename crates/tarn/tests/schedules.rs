//! Schedules run by a real daemon: a snapshot policy takes recursive
//! snapshots and prunes only what its retention lets go (never a held or
//! cloned one, nor snapshots without its prefix); a period missed while
//! the daemon was down runs once; a scrub schedule starts a scrub and
//! resumes one paused outside its pause hours; a replication schedule
//! sends the newest snapshot of its policy to an object store (MinIO) and
//! holds it, so pruning keeps the next incremental's base, and only on the
//! daemon that added it; every run is recorded, and a failed one raises
//! an event.

mod common;

use std::time::{Duration, Instant};

use common::minio::{Minio, BUCKET, SECRET, USER};
use common::process::{files, Daemon};
use tarn_testkit::require;

/// The scheduler looks every 100 ms in these tests.
const TICK: (&str, &str) = ("TARN_SCHEDULE_TICK_MS", "100");

fn snapshots(d: &Daemon, of: &str) -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_str(&d.ok(&["-o", "json", "dataset", "list", "-t", "snapshot"])).unwrap();
    let mut out: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["name"].as_str())
        .filter(|n| n.starts_with(&format!("{of}@")))
        .map(|n| n.split_once('@').unwrap().1.to_string())
        .collect();
    out.sort();
    out
}

fn runs(d: &Daemon, name: &str) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_str(&d.ok(&["-o", "json", "schedule", "runs", name])).unwrap();
    v.as_array().unwrap().clone()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn snapshot_policies_take_prune_and_catch_up_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_env(dir.path(), &[], &[TICK]);
    let f = files(dir.path(), "m", 2, 128 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    d.ok(&["dataset", "create", "tank/photos"]);
    d.ok(&["dataset", "create", "tank/photos/2026"]);
    // Older snapshots of the policy (named as it names them), one of
    // someone's, and one of a policy whose prefix starts with this one's.
    let (a, b, c, dd) = (
        "auto-2020-01-01-0000",
        "auto-2020-01-01-0001",
        "auto-2020-01-01-0002",
        "auto-2020-01-01-0003",
    );
    let other = "auto-daily-2020-01-01-0000";
    for s in [a, b, c, dd, "manual", other] {
        d.ok(&["snapshot", &format!("tank/photos@{s}")]);
    }
    d.ok(&["hold", "keep-me", &format!("tank/photos@{b}")]);
    d.ok(&["clone", &format!("tank/photos@{c}"), "tank/c-clone"]);

    // Bad schedules are refused with a reason.
    let err = d.fails(&["schedule", "add", "x", "snapshot", "tank/photos"]);
    assert!(err.contains("--keep"), "{err}");
    let err = d.fails(&[
        "schedule",
        "add",
        "x",
        "snapshot",
        "tank/nope",
        "--keep",
        "daily=3",
    ]);
    assert!(err.contains("nope"), "{err}");
    let err = d.fails(&[
        "schedule",
        "add",
        "x",
        "snapshot",
        "tank/photos",
        "--keep",
        "minutely=3",
    ]);
    assert!(err.contains("minutely"), "{err}");
    // An hour for a snapshot policy would be ignored: refused.
    let err = d.fails(&[
        "schedule",
        "add",
        "x",
        "snapshot",
        "tank/photos",
        "--keep",
        "daily=3",
        "--at",
        "2",
    ]);
    assert!(err.contains("--at"), "{err}");

    // Two hours and a day: the first run is at once.
    d.ok(&[
        "schedule",
        "add",
        "photos",
        "snapshot",
        "tank/photos",
        "-r",
        "--keep",
        "hourly=2,daily=1",
    ]);
    wait_for("the first run", || runs(&d, "photos").len() == 1);
    let first = runs(&d, "photos")[0].clone();
    assert_eq!(first["ok"], true, "{first}");
    let detail = first["detail"].as_str().unwrap().to_string();
    assert!(detail.contains("took tank/photos@auto-"), "{detail}");
    assert!(detail.ends_with("pruned 1"), "only {dd} may go: {detail}");
    // The run is in the event log too.
    let events = d.ok(&["events"]);
    assert!(
        events.contains("schedule.ran") && events.contains("schedule 'photos' ran: took"),
        "{events}"
    );
    let taken = detail
        .split_once("@")
        .unwrap()
        .1
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    // Kept: the first of the hour (a), the held (b), the cloned (c), the
    // newest (the one taken), and what is not the policy's.
    let mut want = vec![a, b, c, taken.as_str(), "manual", other];
    want.sort();
    assert_eq!(snapshots(&d, "tank/photos"), want);
    assert_eq!(
        snapshots(&d, "tank/photos/2026"),
        [taken.as_str()],
        "recursive"
    );
    // Looking again and again in the same hour takes nothing more.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(runs(&d, "photos").len(), 1);
    let list = d.ok(&["schedule", "list"]);
    assert!(list.contains("keep hourly=2,daily=1 (auto-*)"), "{list}");

    // Down for three hours: one run when it is back, not three.
    d.stop();
    let d = Daemon::start_env(
        dir.path(),
        &[],
        &[TICK, ("TARN_TEST_CLOCK_OFFSET", "10800")],
    );
    wait_for("the catch-up run", || runs(&d, "photos").len() == 2);
    std::thread::sleep(Duration::from_millis(800));
    let r = runs(&d, "photos");
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!(r[1]["ok"], true, "{:?}", r[1]);
    assert!(
        r[1]["started_unix"].as_u64().unwrap() >= r[0]["started_unix"].as_u64().unwrap() + 10_800
    );
    // The held and cloned snapshots are still there.
    let now = snapshots(&d, "tank/photos");
    for s in [b, c, "manual", other] {
        assert!(now.iter().any(|n| n == s), "{s} gone: {now:?}");
    }

    // run-now runs whether due or not, and del stops it (its snapshots stay).
    let out = d.ok(&["schedule", "run-now", "photos"]);
    assert!(out.starts_with("ok: "), "{out}");
    assert_eq!(runs(&d, "photos").len(), 3);
    d.ok(&["schedule", "del", "photos"]);
    assert!(d.ok(&["schedule", "list"]).starts_with("no schedules"));
    assert!(snapshots(&d, "tank/photos").iter().any(|n| n == "manual"));
    d.fails(&["schedule", "run-now", "photos"]);
    d.stop();
}

#[test]
fn scrub_schedules_scrub_and_resume_outside_pause_hours() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_env(dir.path(), &[], &[TICK]);
    let f = files(dir.path(), "m", 2, 128 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    let data = dir.path().join("data");
    std::fs::write(&data, vec![7u8; 8 << 20]).unwrap();
    d.ok(&["object", "put", "tank", "blob", data.to_str().unwrap()]);
    d.ok(&["pool", "sync", "tank"]);

    let err = d.fails(&["schedule", "add", "s", "scrub", "tank", "--at", "24"]);
    assert!(err.contains("0 to 23"), "{err}");
    // A monthly scrub added now waits for next month.
    d.ok(&[
        "schedule", "add", "monthly", "scrub", "tank", "--every", "monthly",
    ]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        runs(&d, "monthly").is_empty(),
        "it ran in the month it was added"
    );
    let list = d.ok(&["schedule", "list"]);
    assert!(list.contains("monthly from 00:00"), "{list}");
    // By hand it scrubs now.
    let out = d.ok(&["schedule", "run-now", "monthly"]);
    assert!(out.contains("started a scrub of 'tank'"), "{out}");
    d.ok(&["pool", "scrub", "--wait", "tank"]);

    // Slow disks, so a scrub lasts while the scheduler looks at it.
    let slow = |on: bool| {
        for dev in [&f[0], &f[1]] {
            if on {
                d.ok(&[
                    "pool",
                    "inject",
                    "tank",
                    dev,
                    "latency",
                    "--latency-ms",
                    "30",
                ]);
            } else {
                d.ok(&["pool", "inject", "tank", dev, "--clear"]);
            }
        }
    };
    slow(true);
    let hour = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 86_400)
        / 3600;
    let state = || {
        let v: serde_json::Value =
            serde_json::from_str(&d.ok(&["-o", "json", "pool", "status", "tank"])).unwrap();
        v[0]["scan"]["state"].as_str().unwrap_or("").to_string()
    };
    // In its pause hours (this hour and the next), a running scrub is
    // paused by the scheduler.
    let now_hours = format!("{hour}-{}", (hour + 2) % 24);
    d.ok(&[
        "schedule", "add", "nightly", "scrub", "tank", "--every", "daily", "--pause", &now_hours,
    ]);
    // Another pause window for the pool's scrub would take turns with it.
    let elsewhen = format!("{}-{}", (hour + 5) % 24, (hour + 6) % 24);
    let err = d.fails(&[
        "schedule", "add", "weekly", "scrub", "tank", "--every", "weekly", "--pause", &elsewhen,
    ]);
    assert!(
        err.contains("'nightly'") && err.contains("--pause"),
        "{err}"
    );
    d.ok(&["pool", "scrub", "tank"]);
    wait_for("the scheduler to pause the scrub", || state() == "paused");
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(state(), "paused", "it stays paused in the pause hours");
    // Outside its pause hours, a paused scrub is resumed and finishes.
    d.ok(&["schedule", "del", "nightly"]);
    let later = format!("{}-{}", (hour + 2) % 24, (hour + 4) % 24);
    d.ok(&[
        "schedule", "add", "daytime", "scrub", "tank", "--every", "daily", "--pause", &later,
    ]);
    wait_for("the scheduler to resume the scrub", || state() != "paused");
    slow(false);
    wait_for("the resumed scrub to finish", || state() == "finished");
    // A scrub paused by hand outside the pause hours stays paused: the
    // scheduler resumes only what it paused.
    slow(true);
    d.ok(&["pool", "scrub", "tank"]);
    d.ok(&["pool", "scrub", "-p", "tank"]);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(state(), "paused", "a pause by hand was undone");
    // Nor does a period's run start it (starting would resume it).
    let out = d.ok(&["schedule", "run-now", "monthly"]);
    assert!(
        out.starts_with("ok: ") && out.contains("stays paused"),
        "{out}"
    );
    assert_eq!(state(), "paused", "a period's run resumed a pause by hand");
    d.ok(&["pool", "scrub", "--resume", "tank"]);
    // A scrub still running at a period's run is no failure.
    let out = d.ok(&["schedule", "run-now", "monthly"]);
    assert!(
        out.starts_with("ok: ") && out.contains("still running"),
        "{out}"
    );
    slow(false);
    wait_for("the scrub to finish", || state() == "finished");
    d.stop();
}

#[test]
fn replication_schedules_send_hold_and_report_failures() {
    let Some(minio) = require::program("minio") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    std::fs::create_dir_all(&store_dir).unwrap();
    let s3 = Minio::start(&minio, &store_dir);
    let url = format!("s3://{BUCKET}/nas/docs");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let d = Daemon::start_env(&home, &[], &[TICK]);
    let f = files(&home, "m", 2, 128 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    d.ok(&["dataset", "create", "tank/docs"]);
    d.ok(&["snapshot", "tank/docs@auto-2026-01-01-0000"]);
    d.ok(&["snapshot", "tank/docs@manual"]);

    // The store's credentials live in a file only the owner may read.
    let env = dir.path().join("s3.env");
    std::fs::write(
        &env,
        format!(
            "# the offsite store\nTARN_S3_ENDPOINT={}\nAWS_ACCESS_KEY_ID={USER}\n\
             AWS_SECRET_ACCESS_KEY={SECRET}\nAWS_REGION=us-east-1\n",
            s3.endpoint
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&env, std::fs::Permissions::from_mode(0o644)).unwrap();
    let env_s = env.to_str().unwrap();
    let add = |name: &str, env_file: &str| {
        d.tarn(&[
            "schedule",
            "add",
            name,
            "replicate",
            "tank/docs",
            "--to",
            &url,
            "--env-file",
            env_file,
            "--every",
            "daily",
        ])
    };
    let refused = add("offsite", env_s);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("chmod 600"),
        "{err}"
    );
    std::fs::set_permissions(&env, std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = d.fails(&[
        "schedule",
        "add",
        "x",
        "replicate",
        "tank/docs",
        "--to",
        "tarn://h/v/d",
    ]);
    assert!(err.contains("--token-file"), "{err}");

    // A new replication schedule runs at once, and sends the newest
    // snapshot of its prefix (not "manual", taken later).
    let added = add("offsite", env_s);
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    wait_for("the first replication", || runs(&d, "offsite").len() == 1);
    let first = runs(&d, "offsite")[0].clone();
    assert_eq!(first["ok"], true, "{first}");
    let detail = first["detail"].as_str().unwrap();
    assert!(
        detail.contains("stored tank/docs@auto-2026-01-01-0000"),
        "{detail}"
    );
    let tag = format!("replicate {url}");
    let holds = d.ok(&["holds", "tank/docs@auto-2026-01-01-0000"]);
    assert!(holds.contains(&tag), "{holds}");
    // Not again in the same day, however often the scheduler looks.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(runs(&d, "offsite").len(), 1);

    // By hand: the next snapshot goes as incrementals (through "manual",
    // taken between), and the hold moves.
    d.ok(&["snapshot", "tank/docs@auto-2026-01-02-0000"]);
    let out = d.ok(&["schedule", "run-now", "offsite"]);
    assert!(
        out.contains("stored tank/docs@manual since @auto-2026-01-01-0000")
            && out.contains("stored tank/docs@auto-2026-01-02-0000 since @manual"),
        "{out}"
    );
    let holds = d.ok(&[
        "holds",
        "tank/docs@auto-2026-01-01-0000",
        "tank/docs@auto-2026-01-02-0000",
    ]);
    let ours: Vec<&str> = holds.lines().filter(|l| l.contains(&tag)).collect();
    assert!(ours.len() == 1 && ours[0].contains("-02-0000"), "{holds}");
    let manifests = s3
        .bucket()
        .list("nas/docs/")
        .unwrap()
        .iter()
        .filter(|o| o.key.ends_with("/manifest.json"))
        .count();
    assert_eq!(manifests, 3);

    // A policy keeping one hour keeps the first of this hour (01) and the
    // one it takes; it prunes 03, but not 02, the held base.
    d.ok(&["snapshot", "tank/docs@auto-2026-01-03-0000"]);
    d.ok(&[
        "schedule",
        "add",
        "docs",
        "snapshot",
        "tank/docs",
        "--keep",
        "hourly=1",
    ]);
    wait_for("the policy's run", || runs(&d, "docs").len() == 1);
    let left = snapshots(&d, "tank/docs");
    assert!(
        !left.contains(&"auto-2026-01-03-0000".to_string())
            && left.contains(&"auto-2026-01-02-0000".to_string()),
        "{left:?}"
    );

    // Wrong credentials: the run fails, says why, and raises an event.
    std::fs::write(
        &env,
        format!(
            "TARN_S3_ENDPOINT={}\nAWS_ACCESS_KEY_ID={USER}\nAWS_SECRET_ACCESS_KEY=wrong\n",
            s3.endpoint
        ),
    )
    .unwrap();
    let err = d.fails(&["schedule", "run-now", "offsite"]);
    assert!(err.contains("replicating tank/docs@auto-"), "{err}");
    let last = runs(&d, "offsite").last().cloned().unwrap();
    assert_eq!(last["ok"], false, "{last}");
    let events = d.ok(&["events"]);
    assert!(
        events.contains("schedule.failed") && events.contains("'offsite' failed"),
        "{events}"
    );

    // The pool on another machine (another daemon identity): the
    // replication schedule is listed but does not run there, and says why.
    d.stop();
    std::fs::write(
        home.join("state/node-id"),
        "0123456789abcdef0123456789abcdef\n",
    )
    .unwrap();
    let d = Daemon::start_env(&home, &[], &[TICK]);
    let list = d.ok(&["schedule", "list"]);
    assert!(list.contains("offsite"), "{list}");
    let err = d.fails(&["schedule", "run-now", "offsite"]);
    assert!(err.contains("added on another machine"), "{err}");
    d.stop();
}

/// Two snapshot policies with one prefix on datasets one of them covers
/// would each prune the other's snapshots: the second is refused, and
/// with its own prefix accepted. A recursive policy whose snapshot is
/// refused because a dataset below has its name already (taken by hand)
/// records a failed run, not "exists already" with nothing taken.
#[test]
fn policies_that_would_prune_each_other_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_env(dir.path(), &[], &[TICK]);
    let f = files(dir.path(), "m", 1, 128 << 20);
    d.ok(&["pool", "create", "tank", &f[0]]);
    d.ok(&["dataset", "create", "tank/photos"]);
    d.ok(&["dataset", "create", "tank/photos/kid"]);
    d.ok(&[
        "schedule", "add", "all", "snapshot", "tank", "-r", "--keep", "daily=7",
    ]);
    let err = d.fails(&[
        "schedule",
        "add",
        "kid",
        "snapshot",
        "tank/photos/kid",
        "--keep",
        "monthly=12",
    ]);
    assert!(err.contains("'all'") && err.contains("--prefix"), "{err}");
    d.ok(&[
        "schedule",
        "add",
        "kid",
        "snapshot",
        "tank/photos/kid",
        "--keep",
        "monthly=12",
        "--prefix",
        "monthly",
    ]);
    // The names a policy with prefix `p` takes this minute and the next,
    // taken by hand below it first.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for t in [now, now + 60] {
        let short = tarn_daemon::schedule::snapshot_name("p", t);
        d.ok(&["snapshot", &format!("tank/photos/kid@{short}")]);
    }
    d.ok(&[
        "schedule",
        "add",
        "p",
        "snapshot",
        "tank/photos",
        "-r",
        "--keep",
        "daily=1",
        "--prefix",
        "p",
    ]);
    wait_for("the run of p", || !runs(&d, "p").is_empty());
    let r = &runs(&d, "p")[0];
    assert_eq!(r["ok"], false, "{r}");
    assert!(r["detail"].as_str().unwrap().contains("tank/photos"), "{r}");
    let taken = snapshots(&d, "tank/photos");
    assert!(!taken.iter().any(|s| s.starts_with("p-")), "{taken:?}");

    // Two policies of one prefix on datasets apart, brought together by
    // a rename: both are checked again at each run and neither prunes.
    d.ok(&["dataset", "create", "tank/r1"]);
    d.ok(&["dataset", "create", "tank/r2"]);
    d.ok(&[
        "schedule", "add", "ra", "snapshot", "tank/r1", "-r", "--keep", "daily=1", "--prefix", "rn",
    ]);
    d.ok(&[
        "schedule", "add", "rb", "snapshot", "tank/r2", "--keep", "daily=1", "--prefix", "rn",
    ]);
    wait_for("the first runs", || {
        !runs(&d, "ra").is_empty() && !runs(&d, "rb").is_empty()
    });
    // Older snapshots of rb, which its retention would let go.
    let old = ["rn-2020-01-01-0000", "rn-2020-01-02-0000"];
    for s in old {
        d.ok(&["snapshot", &format!("tank/r2@{s}")]);
    }
    d.ok(&["dataset", "rename", "tank/r2", "tank/r1/r2"]);
    // The run fails, so the command does too.
    let _ = d.tarn(&["schedule", "run-now", "rb"]);
    wait_for("the second run of rb", || runs(&d, "rb").len() >= 2);
    let r = runs(&d, "rb").last().cloned().unwrap();
    assert_eq!(r["ok"], false, "{r}");
    assert!(
        r["detail"].as_str().unwrap().contains("pruned nothing"),
        "{r}"
    );
    let left = snapshots(&d, "tank/r1/r2");
    assert!(old.iter().all(|o| left.iter().any(|l| l == o)), "{left:?}");
    d.stop();
}

/// A pool imported under a new name (`tarn pool import -d DIR tank
/// vault`) keeps its schedules and shares: their records, stored in the
/// pool, still name the old pool's datasets, and are read as the new
/// one's. The scheduler runs the policy when it is due (a record it could
/// not check used to be skipped without a word), and the share is served.
#[test]
fn a_pool_imported_under_a_new_name_keeps_its_schedules_and_shares() {
    if !require::programs(&["nfs-ls"]) {
        return;
    }
    use tarn_testkit::clients::{nfs_url, tool};
    let dir = tempfile::tempdir().unwrap();
    let nfs = tarn_testkit::net::free_port();
    let bind = format!("127.0.0.1:{nfs}");
    let d = Daemon::start_env(dir.path(), &["--nfs", &bind], &[TICK]);
    let f = files(dir.path(), "m", 2, 64 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    d.ok(&["dataset", "create", "tank/a"]);
    d.ok(&["share", "add", "media", "tank/a", "--nfs", "127.0.0.1/32"]);
    d.ok(&[
        "schedule", "add", "often", "snapshot", "tank/a", "--keep", "hourly=5",
    ]);
    wait_for("the first run", || runs(&d, "often").len() == 1);
    d.ok(&["pool", "export", "tank"]);
    let pool_dir = dir.path().to_str().unwrap();
    d.ok(&["pool", "import", "-d", pool_dir, "tank", "vault"]);

    let list = d.ok(&["schedule", "list"]);
    assert!(
        list.contains("vault/a") && !list.contains("tank/"),
        "{list}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&d.ok(&["-o", "json", "share", "list"])).unwrap();
    assert_eq!(v[0]["share"]["dataset"], "vault/a", "{v}");
    assert!(
        tool(&["nfs-ls", &nfs_url(nfs, nfs, "/media")]).0,
        "the share is not served"
    );

    // Three hours on, the scheduler itself runs it.
    d.stop();
    let d = Daemon::start_env(
        dir.path(),
        &["--nfs", &bind],
        &[TICK, ("TARN_TEST_CLOCK_OFFSET", "10800")],
    );
    wait_for("the run when due", || runs(&d, "often").len() == 2);
    let r = runs(&d, "often");
    assert_eq!(r[1]["ok"], true, "{:?}", r[1]);
    let detail = r[1]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("took vault/a@auto-"), "{detail}");
    assert_eq!(snapshots(&d, "vault/a").len(), 2);
    d.stop();
}

/// A snapshot policy leaves what the replication port receives into to
/// the sender: the port never rolls back, so a snapshot taken here of a
/// received dataset would make it refuse the next incremental. A
/// recursive policy above such a dataset snapshots the rest at once and
/// says what it left out; a policy on one fails, saying why.
#[test]
fn snapshot_policies_leave_replication_targets_to_their_sender() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_env(dir.path(), &[], &[TICK]);
    let f = files(dir.path(), "m", 1, 128 << 20);
    d.ok(&["pool", "create", "tank", &f[0]]);
    for ds in ["tank/docs", "tank/backup", "tank/backup/photos"] {
        d.ok(&["dataset", "create", ds]);
    }
    d.ok(&["replication", "token", "add", "offsite", "tank/backup"]);
    d.ok(&[
        "schedule", "add", "all", "snapshot", "tank", "-r", "--keep", "hourly=3",
    ]);
    wait_for("the first run", || runs(&d, "all").len() == 1);
    let r = runs(&d, "all");
    assert_eq!(r[0]["ok"], true, "{:?}", r[0]);
    let detail = r[0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("not of tank/backup, tank/backup/photos (receiving replication)"),
        "{detail}"
    );
    assert_eq!(snapshots(&d, "tank").len(), 1);
    assert_eq!(snapshots(&d, "tank/docs").len(), 1);
    assert!(snapshots(&d, "tank/backup").is_empty());
    assert!(snapshots(&d, "tank/backup/photos").is_empty());

    d.ok(&[
        "schedule",
        "add",
        "photos",
        "snapshot",
        "tank/backup/photos",
        "--keep",
        "daily=3",
        "--prefix",
        "mine",
    ]);
    wait_for("the photos policy's run", || runs(&d, "photos").len() == 1);
    let r = runs(&d, "photos");
    assert_eq!(r[0]["ok"], false, "{:?}", r[0]);
    let detail = r[0]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("receives replication"), "{detail}");
    assert!(snapshots(&d, "tank/backup/photos").is_empty());
    d.stop();
}
