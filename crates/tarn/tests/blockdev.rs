//! Block devices as pool members: a mirror on two loop devices, exported,
//! detached, reattached in swapped order (so each device comes back under
//! another name), found by label with `import -d /dev`, data intact.
//!
//! Loop devices need root; as another user the test says so and passes
//! without running (CI runs as root).

mod common;

use std::path::Path;
use std::process::Command;

use common::process::{files, Daemon};
use tarn_testkit::data::pattern;

/// A loop device detached when dropped.
struct Loop(String);

impl Loop {
    fn attach(file: &str) -> Loop {
        let out = Command::new("losetup")
            .args(["-f", "--show", file])
            .output()
            .expect("run losetup");
        assert!(
            out.status.success(),
            "losetup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[test]
fn mirror_on_loop_devices_survives_renaming() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: loop devices unavailable, block-device test not run");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let imgs = files(dir.path(), "img", 2, 96 << 20);
    let a = Loop::attach(&imgs[0]);
    let b = Loop::attach(&imgs[1]);
    let d = Daemon::start(dir.path());
    // Another test run may use other loop devices at the same time: a unique name.
    let name = format!("loop{}", std::process::id());
    d.ok(&["pool", "create", &name, "mirror", &a.0, &b.0]);
    let payload = dir.path().join("payload");
    std::fs::write(&payload, pattern(11, 5 << 20)).unwrap();
    d.ok(&[
        "object",
        "put",
        &name,
        "x",
        payload.to_str().unwrap(),
        "--sync",
    ]);
    let st = d.ok(&["pool", "status", &name]);
    assert!(st.contains(&a.0) && st.contains(&b.0), "{st}");
    d.ok(&["pool", "export", &name]);
    drop((a, b));
    // Reattach in the opposite order.
    let b2 = Loop::attach(&imgs[1]);
    let a2 = Loop::attach(&imgs[0]);
    d.ok(&["pool", "import", "-d", "/dev", &name]);
    let st = d.ok(&["pool", "status", &name]);
    assert!(st.contains("state: ONLINE"), "{st}");
    let back = dir.path().join("back");
    d.ok(&["object", "get", &name, "x", back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == std::fs::read(Path::new(&payload)).unwrap());
    d.ok(&["pool", "export", &name]);
    d.stop();
    drop((a2, b2));
}
