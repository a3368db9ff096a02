//! Disk health through a real daemon: file-backed devices say plainly that
//! they have no health data, loop devices are asked through smartctl, and
//! a self-test is refused where there is no disk.

mod common;

use std::process::Command;

use common::process::{files, Daemon};
use tarn_testkit::require;

#[test]
fn files_have_no_health_data_and_disks_are_asked() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let f = files(dir.path(), "m", 2, 64 << 20);
    d.ok(&["pool", "create", "tank", "mirror", &f[0], &f[1]]);
    let v: serde_json::Value =
        serde_json::from_str(&d.ok(&["-o", "json", "disk", "list"])).unwrap();
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), 2, "{v}");
    for h in list {
        assert_eq!(h["note"], "no health data: a file, not a disk", "{h}");
        assert_eq!(h["pool"], "tank");
    }
    let text = d.ok(&["disk", "list"]);
    assert!(text.contains("no data"), "{text}");
    let one = d.ok(&["disk", "health", &f[0]]);
    assert!(one.contains("a file, not a disk"), "{one}");
    let err = d.fails(&["disk", "selftest", &f[0]]);
    assert!(err.contains("a file, not a disk"), "{err}");
    let err = d.fails(&["disk", "health", "/dev/nonexistent-disk"]);
    assert!(err.contains("not a device of an imported pool"), "{err}");
    // A self-test schedule of a pool of files has nothing to test, and
    // says so; it waits for its next period before its first run.
    d.ok(&[
        "schedule", "add", "tests", "selftest", "tank", "--test", "long", "--every", "weekly",
    ]);
    let list = d.ok(&["schedule", "list"]);
    assert!(
        list.contains("long self-test") && list.contains("never"),
        "{list}"
    );
    let out = d.ok(&["schedule", "run-now", "tests"]);
    assert!(out.contains("no disks to test (2 file devices"), "{out}");

    // Block devices (loop devices here) go to smartctl, which has no SMART
    // data for them either, and says so.
    if !require::fuse() || !require::programs(&["losetup", "smartctl"]) {
        return;
    }
    let loops: Vec<String> = files(dir.path(), "l", 2, 64 << 20)
        .iter()
        .map(|p| {
            let o = Command::new("losetup")
                .args(["--find", "--show", p])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        })
        .collect();
    let created = d.tarn(&["pool", "create", "loops", "mirror", &loops[0], &loops[1]]);
    // The loop devices are detached whatever the checks say.
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(
            created.status.success(),
            "{}",
            String::from_utf8_lossy(&created.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_str(&d.ok(&["-o", "json", "disk", "health", &loops[0]])).unwrap();
        let note = v["note"].as_str().unwrap_or("");
        assert!(
            note.starts_with("no health data") && !note.contains("a file"),
            "a loop device is a disk without SMART data: {v}"
        );
        // A scheduled self-test goes to smartctl, which cannot test a loop
        // device: the run fails, names the disks, and raises an event.
        d.ok(&["schedule", "add", "loop-tests", "selftest", "loops"]);
        let err = d.fails(&["schedule", "run-now", "loop-tests"]);
        assert!(
            err.contains(&loops[0]) && err.contains("could not start the test"),
            "{err}"
        );
        let events = d.ok(&["events"]);
        assert!(events.contains("'loop-tests' failed"), "{events}");
    }));
    let _ = d.tarn(&["pool", "destroy", "-f", "loops"]);
    d.stop();
    for l in &loops {
        let _ = Command::new("losetup").args(["-d", l]).status();
    }
    if let Err(e) = checked {
        std::panic::resume_unwind(e);
    }
}
