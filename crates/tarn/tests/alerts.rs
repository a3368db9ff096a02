//! Events and alerts from a real daemon: a device that fails reaches a
//! webhook (retried after a 500), a real SMTP server (Python's aiosmtpd)
//! and a program; a flapping device is throttled; a scrub, a failing
//! schedule and a daemon that was killed are in `tarn events`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::clients::tarn_with_stdin;
use common::process::{files, Daemon};
use tarn_testkit::net::free_port;
use tarn_testkit::require;

const TICK: (&str, &str) = ("TARN_SCHEDULE_TICK_MS", "100");

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(30), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn events(d: &Daemon) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_str(&d.ok(&["-o", "json", "events", "-n", "1000"])).unwrap();
    v.as_array().unwrap().clone()
}

fn has_event(d: &Daemon, kind: &str, device: Option<&str>) -> bool {
    events(d)
        .iter()
        .any(|e| e["kind"] == kind && device.is_none_or(|dev| e["device"].as_str() == Some(dev)))
}

/// A loopback HTTP server that records POST bodies and answers each with
/// the next status of `statuses` (then 200).
fn hook_server(statuses: Vec<u16>) -> (u16, Arc<Mutex<Vec<serde_json::Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let seen = got.clone();
    std::thread::spawn(move || {
        let mut statuses = statuses.into_iter();
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { break };
            let mut r = BufReader::new(conn.try_clone().unwrap());
            let mut len = 0usize;
            let mut line = String::new();
            loop {
                line.clear();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                if line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0u8; len];
            if r.read_exact(&mut body).is_err() {
                continue;
            }
            if let Ok(v) = serde_json::from_slice(&body) {
                seen.lock().unwrap().push(v);
            }
            let status = statuses.next().unwrap_or(200);
            let _ = conn.write_all(
                format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .as_bytes(),
            );
        }
    });
    (port, got)
}

#[test]
fn a_failing_device_reaches_a_webhook_a_program_and_is_throttled() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_env(
        dir.path(),
        &[],
        &[TICK, ("TARN_ALERT_THROTTLE_SECS", "600")],
    );
    let f = files(dir.path(), "m", 2, 128 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    // The first answer is a 500: the event is posted again.
    let (port, got) = hook_server(vec![500]);
    d.ok(&[
        "alert",
        "add",
        "ops",
        "webhook",
        &format!("http://127.0.0.1:{port}/tarn"),
    ]);
    let out_file = dir.path().join("program-got.json");
    let script = dir.path().join("notify.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$TARN_EVENT_KIND $TARN_EVENT_SEVERITY\" >> {0}.env\ncat >> {0}\necho >> {0}\n",
            out_file.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    d.ok(&[
        "alert",
        "add",
        "log",
        "program",
        script.to_str().unwrap(),
        "--min-severity",
        "info",
    ]);
    let err = d.fails(&["alert", "add", "x", "webhook", "ftp://nowhere"]);
    assert!(err.contains("not an http"), "{err}");

    // A device goes offline: two events (the device, a warning; the pool
    // now DEGRADED, critical), both posted, the one that got the 500
    // posted again.
    d.ok(&["pool", "offline", "tank", &f[1]]);
    wait_for("the webhook to get three posts", || {
        got.lock().unwrap().len() == 3
    });
    let posts = got.lock().unwrap().clone();
    let offline = posts
        .iter()
        .find(|e| e["kind"] == "device.offline")
        .unwrap_or_else(|| panic!("{posts:?}"));
    assert_eq!(offline["device"], f[1].as_str());
    assert_eq!(offline["severity"], "warning");
    let degraded = posts
        .iter()
        .find(|e| e["kind"] == "pool.degraded")
        .unwrap_or_else(|| panic!("{posts:?}"));
    assert_eq!(degraded["severity"], "critical");
    let twice = posts
        .iter()
        .filter(|e| posts.iter().filter(|o| o == e).count() == 2)
        .count();
    assert_eq!(twice, 2, "one event posted again after the 500: {posts:?}");

    // The program got it (and the info events the webhook does not want).
    wait_for("the program to run", || {
        std::fs::read_to_string(format!("{}.env", out_file.display()))
            .is_ok_and(|s| s.contains("device.offline warning"))
    });

    // The device flaps: every change is an event, the webhook hears of
    // the first offline only.
    for _ in 0..5 {
        d.ok(&["pool", "online", "tank", &f[1]]);
        std::thread::sleep(Duration::from_millis(350));
        d.ok(&["pool", "offline", "tank", &f[1]]);
        std::thread::sleep(Duration::from_millis(350));
    }
    wait_for("the flaps to be seen", || {
        events(&d)
            .iter()
            .filter(|e| e["kind"] == "device.offline")
            .count()
            >= 6
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(got.lock().unwrap().len(), 3, "throttled: no more posts");
    let v: serde_json::Value =
        serde_json::from_str(&d.ok(&["-o", "json", "alert", "list"])).unwrap();
    let ops = v
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["alert"]["name"] == "ops")
        .unwrap()
        .clone();
    // Five more of each of the two kinds were held back.
    assert_eq!(ops["suppressed"], 10, "{ops}");
    assert_eq!(ops["sent"], 2, "{ops}");
    let list = d.ok(&["alert", "list"]);
    assert!(list.contains("HELD BACK"), "{list}");

    // `alert test` delivers through every alert now.
    let out = d.ok(&["alert", "test"]);
    assert!(
        out.contains("ops: delivered") && out.contains("log: delivered"),
        "{out}"
    );
    wait_for("the test post", || {
        got.lock()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "alert.test")
    });
    d.ok(&["alert", "del", "ops"]);
    d.fails(&["alert", "test", "ops"]);
    d.stop();
}

#[test]
fn a_faulted_device_is_mailed_and_the_daemon_reports_what_happened() {
    let python = std::env::var("TARN_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let has = Command::new(&python)
        .args(["-c", "import aiosmtpd"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has && !require::missing("Python's aiosmtpd (TARN_TEST_PYTHON)") {
        return;
    }
    let smtp_port = free_port();
    let mut smtp = Command::new(&python)
        .args([
            "-u",
            "-m",
            "aiosmtpd",
            "-n",
            "-l",
            &format!("127.0.0.1:{smtp_port}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mail = Arc::new(Mutex::new(String::new()));
    let sink = mail.clone();
    let stdout = smtp.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let mut m = sink.lock().unwrap();
            m.push_str(&line);
            m.push('\n');
        }
    });
    wait_for("the SMTP server", || {
        std::net::TcpStream::connect(("127.0.0.1", smtp_port)).is_ok()
    });

    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start_env(dir.path(), &[], &[TICK]);
    let f = files(dir.path(), "m", 2, 128 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    let smtp_addr = format!("127.0.0.1:{smtp_port}");
    let mail_alert = vec![
        "alert",
        "add",
        "owner",
        "email",
        "--smtp",
        smtp_addr.as_str(),
        "--from",
        "nas@localhost",
        "--to",
        "owner@localhost",
        "--security",
        "none",
        "--min-severity",
        "critical",
    ];
    let mut with_login = mail_alert.clone();
    with_login.extend(["--user", "nas", "--password-stdin"]);
    let out = tarn_with_stdin(&d, &with_login, "not shown anywhere\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = d.ok(&["-o", "json", "alert", "list"]);
    assert!(!shown.contains("not shown anywhere"), "{shown}");
    // The SMTP test server takes no login: say so and send without one.
    d.ok(&mail_alert);

    // The device vanishes and writes fail on it: FAULTED.
    d.ok(&["pool", "inject", "tank", &f[1], "vanish"]);
    let data = dir.path().join("data");
    std::fs::write(&data, vec![1u8; 1 << 20]).unwrap();
    d.ok(&["object", "put", "tank", "x", data.to_str().unwrap()]);
    d.ok(&["pool", "sync", "tank"]);
    // One health check emits the pool's DEGRADED before the device's
    // FAULTED, so the first whole mail may be the pool's: wait for the
    // whole message about the device.
    wait_for("the mail about the faulted device", || {
        let m = mail.lock().unwrap();
        m.find("device.faulted")
            .is_some_and(|i| m[i..].contains("END MESSAGE"))
    });
    let m = mail.lock().unwrap().clone();
    let subject = m
        .lines()
        .find(|l| l.starts_with("Subject: ") && l.contains("device.faulted"))
        .unwrap_or_else(|| panic!("no mail about the faulted device: {m}"));
    assert!(subject.contains("CRITICAL"), "{subject}");
    assert!(subject.contains(&f[1]), "{subject}");
    assert!(
        m.contains(&format!("device {} of pool 'tank' is FAULTED", f[1])),
        "{m}"
    );
    assert!(m.contains("To: owner@localhost"), "{m}");

    // A scrub's end, and a schedule that fails, are events.
    d.ok(&["pool", "inject", "tank", &f[1], "--clear"]);
    d.ok(&["pool", "clear", "tank"]);
    // The device missed the object's writes, so the clear starts a
    // resilver, and a scrub is refused while it runs: wait for its end.
    wait_for("the resilver after the clear", || {
        let v: serde_json::Value =
            serde_json::from_str(&d.ok(&["-o", "json", "pool", "status", "tank"])).unwrap();
        v[0]["scan"]["kind"] == "resilver" && v[0]["scan"]["state"] == "finished"
    });
    d.ok(&["pool", "scrub", "--wait", "tank"]);
    wait_for("the scrub's event", || has_event(&d, "scan.finished", None));
    d.ok(&["dataset", "create", "tank/gone"]);
    d.ok(&[
        "schedule",
        "add",
        "s",
        "snapshot",
        "tank/gone",
        "--keep",
        "daily=2",
    ]);
    wait_for("the first run", || {
        let v: serde_json::Value =
            serde_json::from_str(&d.ok(&["-o", "json", "schedule", "runs", "s"])).unwrap();
        v.as_array().is_some_and(|a| a.len() == 1)
    });
    d.ok(&["destroy", "-r", "tank/gone"]);
    let out = d.tarn(&["schedule", "run-now", "s"]);
    assert!(!out.status.success());
    assert!(has_event(&d, "schedule.failed", None), "{:?}", events(&d));
    let text = d.ok(&["events"]);
    assert!(text.contains("schedule.failed"), "{text}");

    // A daemon that was killed says so when it starts again.
    assert!(!has_event(&d, "daemon.crashed", None));
    d.kill_in_place();
    let killed = d;
    let d = Daemon::start_env(dir.path(), &[], &[TICK]);
    assert!(has_event(&d, "daemon.crashed", None), "{:?}", events(&d));
    d.stop();
    drop(killed);
    // Stopped cleanly: no crash event at the next start.
    let d = Daemon::start_env(dir.path(), &[], &[TICK]);
    let crashes = events(&d)
        .iter()
        .filter(|e| e["kind"] == "daemon.crashed")
        .count();
    assert_eq!(crashes, 1);
    d.stop();
    let _ = smtp.kill();
    let _ = smtp.wait();
}
