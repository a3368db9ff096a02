//! The real daemon and CLI against real member files: bad input gets a
//! clear error (exit 1, `error: …`) while another pool in the same daemon
//! keeps serving; a restarted daemon brings its pools back; a degraded pool
//! is replaced and resilvered through the CLI.

mod common;

use std::time::{Duration, Instant};

use common::process::{files, Daemon};
use tarn_testkit::data::pattern;

#[test]
fn bad_input_leaves_other_pools_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let a = files(dir.path(), "a", 2, 64 << 20);
    d.ok(&["pool", "create", "alpha", "mirror", &a[0], &a[1]]);
    let payload = dir.path().join("payload");
    std::fs::write(&payload, pattern(7, 3 << 20)).unwrap();
    let p = payload.to_str().unwrap();
    d.ok(&["object", "put", "alpha", "keep", p, "--sync"]);

    let b = files(dir.path(), "b", 3, 64 << 20);
    let err = d.fails(&["pool", "create", "beta", "mirror", &b[0], &b[0]]);
    assert!(err.contains("twice"), "{err}");
    let err = d.fails(&["pool", "create", "beta", &a[0]]);
    assert!(err.contains("alpha"), "{err}");
    let small = files(dir.path(), "small", 1, 8 << 20);
    let err = d.fails(&["pool", "create", "beta", &small[0]]);
    assert!(err.contains("too small"), "{err}");
    let err = d.fails(&["pool", "create", "-O", "frobnicate=1", "beta", &b[0]]);
    assert!(err.contains("frobnicate"), "{err}");
    let missing = dir.path().join("nope");
    let err = d.fails(&["pool", "create", "beta", missing.to_str().unwrap()]);
    assert!(err.contains("nope"), "{err}");

    // A pool whose members were destroyed: garbage over one, another truncated.
    d.ok(&["pool", "create", "gamma", "raidz1", &b[0], &b[1], &b[2]]);
    d.ok(&["object", "put", "gamma", "x", p, "--sync"]);
    d.ok(&["pool", "export", "gamma"]);
    std::fs::write(&b[0], pattern(3, 64 << 20)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&b[1])
        .unwrap()
        .set_len(70 << 20)
        .unwrap();
    std::fs::write(&b[2], pattern(4, 1 << 20)).unwrap();
    let err = d.fails(&[
        "pool",
        "import",
        "-d",
        dir.path().to_str().unwrap(),
        "gamma",
    ]);
    assert!(err.contains("gamma"), "{err}");
    let err = d.fails(&["pool", "status", "nosuchpool"]);
    assert!(err.contains("nosuchpool"), "{err}");
    d.fails(&[
        "object",
        "get",
        "alpha",
        "no-such-object",
        dir.path().join("o").to_str().unwrap(),
    ]);

    // alpha never noticed.
    let out = dir.path().join("back");
    d.ok(&["object", "get", "alpha", "keep", out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&payload).unwrap());
    d.ok(&["object", "put", "alpha", "more", p]);
    let st = d.ok(&["pool", "status", "alpha"]);
    assert!(st.contains("state: ONLINE"), "{st}");

    // A restarted daemon imports alpha again by itself.
    d.stop();
    let d = Daemon::start(dir.path());
    let list = d.ok(&["pool", "list"]);
    assert!(list.contains("alpha"), "{list}");
    d.ok(&["object", "get", "alpha", "more", out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&payload).unwrap());
    d.stop();
}

/// Stores `data` as object `big` of pool `tank`, durably; returns the
/// file it came from, to compare with what is read back.
fn put_big(d: &Daemon, dir: &std::path::Path, data: Vec<u8>) -> std::path::PathBuf {
    let payload = dir.join("payload");
    std::fs::write(&payload, data).unwrap();
    d.ok(&[
        "object",
        "put",
        "tank",
        "big",
        payload.to_str().unwrap(),
        "--sync",
    ]);
    payload
}

#[test]
fn degraded_replace_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let m = files(dir.path(), "m", 4, 96 << 20);
    d.ok(&[
        "pool", "create", "tank", "raidz1", &m[0], &m[1], &m[2], &m[3],
    ]);
    let payload = put_big(&d, dir.path(), pattern(9, 20 << 20));
    d.ok(&["pool", "export", "tank"]);
    std::fs::remove_file(&m[3]).unwrap();
    d.ok(&["pool", "import", "-d", dir.path().to_str().unwrap(), "tank"]);
    let st = d.ok(&["pool", "status", "tank"]);
    assert!(st.contains("DEGRADED"), "{st}");
    let out = dir.path().join("out");
    d.ok(&["object", "get", "tank", "big", out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&payload).unwrap());

    let spare = files(dir.path(), "spare", 1, 96 << 20);
    d.ok(&["pool", "replace", "tank", &m[3], &spare[0]]);
    let t0 = Instant::now();
    loop {
        let st = d.ok(&["pool", "status", "tank"]);
        if st.contains("state: ONLINE") && st.contains("resilvered") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "resilver did not finish: {st}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = d.tarn(&["pool", "scrub", "--wait", "tank"]);
    assert!(
        o.status.success(),
        "scrub after resilver: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let st = d.ok(&["-o", "json", "pool", "status", "tank"]);
    let v: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(v[0]["scan"]["errors"], 0, "{st}");
    assert_eq!(v[0]["health"], "ONLINE", "{st}");
    d.stop();
}

/// The daemon's own state is guarded: a second daemon on the same state
/// directory is refused without touching the pool cache; importing another
/// pool of the same name by GUID cannot displace the imported one; object
/// copies refuse to write over a pool's device or to relative paths.
#[test]
fn daemon_state_and_paths_are_guarded() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let a = files(dir.path(), "a", 1, 64 << 20);
    d.ok(&["pool", "create", "tank", &a[0]]);
    let cache = std::fs::read_to_string(dir.path().join("state/pools.json")).unwrap();
    assert!(cache.contains("tank"));

    let second = std::process::Command::new(env!("CARGO_BIN_EXE_tarn"))
        .args(["daemon", "--socket"])
        .arg(dir.path().join("other.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("state directory"),
        "{second:?}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("state/pools.json")).unwrap(),
        cache
    );

    // Another pool also named tank, exported, imported by its GUID.
    let other = tempfile::tempdir().unwrap();
    let b = files(other.path(), "b", 1, 64 << 20);
    let d2 = Daemon::start(other.path());
    d2.ok(&["pool", "create", "tank", &b[0]]);
    let v: serde_json::Value =
        serde_json::from_str(&d2.ok(&["-o", "json", "pool", "list"])).unwrap();
    let guid = v[0]["guid"].as_str().unwrap().to_string();
    d2.ok(&["pool", "export", "tank"]);
    d2.stop();
    let err = d.fails(&[
        "pool",
        "import",
        "-d",
        other.path().to_str().unwrap(),
        &guid,
    ]);
    assert!(err.contains("already imported"), "{err}");
    let list = d.ok(&["-o", "json", "pool", "list"]);
    assert!(
        !list.contains(&guid),
        "the GUID import displaced the imported pool: {list}"
    );
    d.ok(&[
        "pool",
        "import",
        "-d",
        other.path().to_str().unwrap(),
        &guid,
        "tank2",
    ]);

    let payload = dir.path().join("payload");
    std::fs::write(&payload, pattern(5, 100_000)).unwrap();
    d.ok(&["object", "put", "tank", "x", payload.to_str().unwrap()]);
    let err = d.fails(&["object", "get", "tank", "x", &a[0]]);
    assert!(err.contains("device of an imported pool"), "{err}");
    // A raw API client (the CLI always sends absolute paths).
    use std::io::{BufRead, Write};
    let mut raw = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    raw.write_all(b"{\"id\":1,\"method\":\"object.read\",\"params\":{\"pool\":\"tank\",\"object\":\"x\",\"to_path\":\"relative/out\"}}\n")
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(raw).read_line(&mut line).unwrap();
    assert!(line.contains("not an absolute path"), "{line}");
    d.ok(&["pool", "sync", "tank"]);
    d.stop();
}

/// Separate log devices through the CLI: added (single or mirror) and shown
/// under `logs`, refused when they make no sense, removed again; a pool
/// whose log device went missing is refused at import, naming it, until
/// `--discard-log`.
#[test]
fn log_devices_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let pool_dir = dir.path().join("members");
    std::fs::create_dir(&pool_dir).unwrap();
    let m = files(&pool_dir, "m", 2, 64 << 20);
    let l = files(dir.path(), "l", 3, 64 << 20);
    let d = Daemon::start(dir.path());
    d.ok(&["pool", "create", "tank", "mirror", &m[0], &m[1]]);
    let err = d.fails(&["pool", "add", "tank", "raidz1", &l[0], &l[1], &l[2]]);
    assert!(err.contains("log devices only"), "{err}");
    let err = d.fails(&["pool", "add", "tank", "log", "raidz1", &l[0], &l[1], &l[2]]);
    assert!(err.contains("not raidz"), "{err}");
    let err = d.fails(&["pool", "add", "tank", "log", &m[0]]);
    assert!(err.contains("already part of pool"), "{err}");
    d.ok(&["pool", "add", "tank", "log", "mirror", &l[0], &l[1]]);
    let st = d.ok(&["pool", "status", "tank"]);
    let logs_at = st
        .find("\tlogs")
        .unwrap_or_else(|| panic!("no logs heading:\n{st}"));
    assert!(
        st[logs_at..].contains(&l[0]) && st[logs_at..].contains(&l[1]),
        "{st}"
    );
    let js = d.ok(&["-o", "json", "pool", "status", "tank"]);
    let v: serde_json::Value = serde_json::from_str(&js).unwrap();
    assert_eq!(
        v[0]["logs"][0]["children"].as_array().map(Vec::len),
        Some(2),
        "{js}"
    );

    d.ok(&["pool", "remove", "tank", &l[0]]);
    let st = d.ok(&["pool", "status", "tank"]);
    assert!(!st.contains("\tlogs"), "{st}");
    let err = d.fails(&["pool", "remove", "tank", &l[0]]);
    assert!(err.contains("not a log device"), "{err}");

    // A single log device that then goes missing with the daemon.
    d.ok(&["pool", "add", "tank", "log", &l[2]]);
    d.ok(&["pool", "export", "tank"]);
    std::fs::remove_file(&l[2]).unwrap();
    let err = d.fails(&["pool", "import", "-d", pool_dir.to_str().unwrap(), "tank"]);
    assert!(
        err.contains("log device is missing")
            && err.contains(&l[2])
            && err.contains("--discard-log"),
        "{err}"
    );
    d.ok(&[
        "pool",
        "import",
        "--discard-log",
        "-d",
        pool_dir.to_str().unwrap(),
        "tank",
    ]);
    let st = d.ok(&["pool", "status", "tank"]);
    assert!(
        st.contains("logs"),
        "the missing device is still listed:\n{st}"
    );
    d.ok(&["pool", "remove", "tank", &l[2]]);
    let st = d.ok(&["pool", "status", "tank"]);
    assert!(
        !st.contains("\tlogs") && st.contains("state: ONLINE"),
        "{st}"
    );
    d.stop();
}

/// The block cache shows in `status` (JSON and text) and under `iostat -v`:
/// reading an object twice turns misses into hits.
#[test]
fn cache_counters_in_status_and_iostat() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(dir.path(), &["--cache-mib", "64"]);
    let m = files(dir.path(), "m", 1, 96 << 20);
    d.ok(&["pool", "create", "tank", &m[0]]);
    let payload = dir.path().join("payload");
    std::fs::write(&payload, pattern(3, 4 << 20)).unwrap();
    let p = payload.to_str().unwrap();
    d.ok(&["object", "put", "tank", "x", p]);
    // Committed, so reads go to the disks and the cache, not to the
    // open txg's buffers.
    d.ok(&["pool", "sync", "tank"]);
    let cache = |d: &Daemon| -> serde_json::Value {
        let v: serde_json::Value =
            serde_json::from_str(&d.ok(&["-o", "json", "pool", "status", "tank"])).unwrap();
        v[0]["cache"].clone()
    };
    let before = cache(&d);
    assert_eq!(before["max_bytes"], 64u64 << 20, "{before}");
    let out = dir.path().join("out");
    for _ in 0..2 {
        d.ok(&["object", "get", "tank", "x", out.to_str().unwrap()]);
        assert!(std::fs::read(&out).unwrap() == std::fs::read(&payload).unwrap());
    }
    let after = cache(&d);
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
    // The second read of 4 MiB found its blocks in the cache.
    assert!(
        n(&after, "data_hits") > n(&before, "data_hits"),
        "{before} then {after}"
    );
    assert!(n(&after, "bytes") >= 4 << 20, "{after}");
    let text = d.ok(&["pool", "status", "tank"]);
    assert!(
        text.contains(" cache: ") && text.contains("hits: data"),
        "{text}"
    );
    let io = d.ok(&["pool", "iostat", "-v", "tank"]);
    assert!(io.contains("read-ahead") && io.contains("metadata"), "{io}");
    let io = d.ok(&["pool", "iostat", "tank"]);
    assert!(!io.contains("read-ahead"), "{io}");
    d.stop();
}

/// A daemon started with a shell's low soft limit of open files (each
/// device of a pool holds three descriptors) raises it to the hard limit
/// before it opens anything.
#[test]
fn the_daemon_raises_its_soft_limit_of_open_files() {
    let limit = |pid: &str| -> (u64, u64) {
        let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .expect("a line for open files");
        let f: Vec<&str> = line.split_whitespace().collect();
        // "Max open files  SOFT  HARD  files"
        (f[3].parse().unwrap(), f[4].parse().unwrap())
    };
    let (_, hard) = limit("self");
    let low = 256.min(hard);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tarn.sock");
    let child = std::process::Command::new("prlimit")
        .arg(format!("--nofile={low}:{hard}"))
        .arg(env!("CARGO_BIN_EXE_tarn"))
        .args(["daemon", "--socket"])
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run tarn daemon under prlimit (util-linux)");
    let d = Daemon::adopt(child, socket);
    // prlimit runs the daemon in its own process: the same pid.
    let (soft, daemon_hard) = limit(&d.child.id().to_string());
    assert_eq!(daemon_hard, hard);
    assert_eq!(soft, hard.min(1 << 20), "soft limit {soft}, hard {hard}");
    d.stop();
}

/// Members imported through a folder of links (as from `/dev/disk/by-id`)
/// are found again at the next start when one of them is no longer where
/// the pool recorded it (a disk renumbered at boot, a member file
/// renamed): the daemon searches the members' folders, and the pool comes
/// back whole, not degraded.
#[test]
fn a_restarted_daemon_finds_members_that_moved() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    let byid = dir.path().join("by-id");
    std::fs::create_dir_all(&byid).unwrap();
    std::fs::create_dir_all(&real).unwrap();
    let m = files(&real, "d", 4, 96 << 20);
    let links: Vec<String> = m
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let l = byid.join(format!("disk-{i}"));
            std::os::unix::fs::symlink(f, &l).unwrap();
            l.to_str().unwrap().to_string()
        })
        .collect();
    let d = Daemon::start(dir.path());
    d.ok(&[
        "pool", "create", "tank", "raidz1", &links[0], &links[1], &links[2], &links[3],
    ]);
    let payload = put_big(&d, dir.path(), pattern(3, 4 << 20));
    // Imported from the folder of links, as `-d /dev/disk/by-id` is: the
    // pool records the members the links led to.
    d.ok(&["pool", "export", "tank"]);
    d.ok(&["pool", "import", "-d", byid.to_str().unwrap(), "tank"]);
    d.stop();
    // The first member moves; its link follows it, as by-id names do.
    let moved = real.join("e0");
    std::fs::rename(&m[0], &moved).unwrap();
    std::fs::remove_file(&links[0]).unwrap();
    std::os::unix::fs::symlink(&moved, &links[0]).unwrap();
    let d = Daemon::start(dir.path());
    let st = d.ok(&["-o", "json", "pool", "status", "tank"]);
    let v: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(v[0]["health"], "ONLINE", "{st}");
    let out = dir.path().join("out");
    d.ok(&["object", "get", "tank", "big", out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&payload).unwrap());
    d.stop();
}

/// The `tarn` command talks only to a daemon run by its own user or root:
/// a daemon another user runs on a socket the command is pointed at (one
/// put where it looks) hears nothing of what it would send, passwords
/// included. Needs root, to run that other daemon as `nobody`.
#[test]
fn the_command_talks_only_to_a_daemon_of_its_own_user_or_root() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run a daemon as another user");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = theirs.join("tarn.sock");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tarn"))
        .arg("daemon")
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(theirs.join("state"))
        .uid(65534)
        .gid(65534)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !socket.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the other user's daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = common::process::tarn_at(&socket, &["daemon", "ping"]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("runs as uid 65534"), "{err}");
}
