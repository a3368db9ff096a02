//! A real `tarn daemon` process on a temporary socket, and the CLI run
//! against it: what tests of the built binary share.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs the built `tarn` CLI against the daemon on `socket`.
pub fn tarn_at(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tarn"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env_remove("TARN_SOCKET")
        .output()
        .expect("run tarn")
}

/// The stdout of a command that must have succeeded (`what` names it
/// when it did not).
pub fn succeeded(o: Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A running `tarn daemon` with its socket and state in one folder.
pub struct Daemon {
    /// The daemon process.
    pub child: Child,
    /// Its admin socket.
    pub socket: PathBuf,
}

impl Daemon {
    /// Starts a daemon with socket and state under `dir` and waits until it answers.
    pub fn start(dir: &Path) -> Daemon {
        Daemon::start_with(dir, &[])
    }

    /// Like [`Daemon::start`], with more daemon arguments.
    pub fn start_with(dir: &Path, extra: &[&str]) -> Daemon {
        Daemon::spawn(dir, extra, Stdio::null(), &[])
    }

    /// A daemon serving the web page and WebDAV on free loopback ports
    /// (returned, in that order), with a pool `tank` on one 256 MiB file.
    #[allow(dead_code)]
    pub fn with_web_and_pool(dir: &Path) -> (Daemon, u16, u16) {
        let (web, dav) = (
            tarn_testkit::net::free_port(),
            tarn_testkit::net::free_port(),
        );
        let d = Daemon::start_with(
            dir,
            &[
                "--web",
                &format!("127.0.0.1:{web}"),
                "--webdav",
                &format!("127.0.0.1:{dav}"),
            ],
        );
        let f = files(dir, "m", 1, 256 << 20);
        d.ok(&["pool", "create", "tank", &f[0]]);
        (d, web, dav)
    }

    /// Like [`Daemon::start_with`], with environment variables (the
    /// schedules' test clock and tick).
    pub fn start_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn(dir, extra, Stdio::null(), env)
    }

    /// Like [`Daemon::start_with`], keeping what the daemon says on stderr
    /// in the file `log`, for tests that check it (no panics, say).
    pub fn start_logged(dir: &Path, extra: &[&str], log: &Path) -> Daemon {
        let file = std::fs::File::create(log).expect("create the daemon log");
        Daemon::spawn(dir, extra, Stdio::from(file), &[])
    }

    fn spawn(dir: &Path, extra: &[&str], stderr: Stdio, env: &[(&str, &str)]) -> Daemon {
        let socket = dir.join("tarn.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_tarn"))
            .envs(env.iter().copied())
            .args(["daemon", "--socket"])
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn tarn daemon");
        Daemon::adopt(child, socket)
    }

    /// A daemon process started some other way (under a wrapper program),
    /// once it answers on `socket`.
    pub fn adopt(child: Child, socket: PathBuf) -> Daemon {
        let d = Daemon { child, socket };
        let t0 = Instant::now();
        while !d.tarn(&["daemon", "ping"]).status.success() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        d
    }

    /// Runs the CLI against this daemon.
    pub fn tarn(&self, args: &[&str]) -> Output {
        tarn_at(&self.socket, args)
    }

    /// Runs the CLI against this daemon with `input` on its standard input
    /// (a passphrase, as a script pipes it).
    pub fn tarn_input(&self, args: &[&str], input: &[u8]) -> Output {
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_tarn"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .env_remove("TARN_SOCKET")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run tarn");
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(input);
        }
        child.wait_with_output().expect("wait for tarn")
    }

    /// Creates `name` as an encryption root with the passphrase `pass`
    /// piped in, mounted at `mountpoint`.
    pub fn create_encrypted(&self, name: &str, mountpoint: &Path, pass: &[u8]) {
        let mp = format!("mountpoint={}", mountpoint.display());
        self.create_encrypted_with(name, &["-o", &mp], pass);
    }

    /// [`Daemon::create_encrypted`] with other options than a mountpoint
    /// (none: not mounted).
    pub fn create_encrypted_with(&self, name: &str, opts: &[&str], pass: &[u8]) {
        let mut args = vec![
            "dataset",
            "create",
            "-o",
            "encryption=on",
            "-o",
            "keyformat=passphrase",
        ];
        args.extend_from_slice(opts);
        args.push(name);
        let o = self.tarn_input(&args, pass);
        assert!(
            o.status.success(),
            "create {name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// Runs a command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        succeeded(self.tarn(args), &format!("tarn {args:?}"))
    }

    /// A property's value (`dataset get -o json`), as text.
    pub fn prop(&self, name: &str, p: &str) -> String {
        let v: serde_json::Value =
            serde_json::from_str(&self.ok(&["-o", "json", "dataset", "get", p, name]))
                .expect("dataset get answers JSON");
        v[0]["value"].as_str().unwrap_or_default().to_string()
    }

    /// Runs a command that must fail cleanly (exit 1, `error: …`); returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let o = self.tarn(args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(
            o.status.code(),
            Some(1),
            "tarn {args:?} should fail with exit 1: {err}"
        );
        assert!(
            err.starts_with("error: "),
            "unclear error for {args:?}: {err}"
        );
        err
    }

    /// Detaches FUSE mounts left under this daemon's folder by a killed
    /// daemon, so a crashed or failed test leaves no dead mounts behind.
    pub fn detach_mounts(&self) {
        let Some(dir) = self.socket.parent() else {
            return;
        };
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        for line in mounts.lines() {
            let Some(point) = line.split(' ').nth(1) else {
                continue;
            };
            if Path::new(point).starts_with(dir) {
                if let Ok(c) = std::ffi::CString::new(point) {
                    // SAFETY: a valid NUL-terminated path; MNT_DETACH only
                    // detaches, and failure is harmless here.
                    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
                }
            }
        }
    }

    /// SIGKILLs the daemon and reaps it, leaving its (now dead) mounts in
    /// place so programs using them see the failure; dropping the daemon
    /// detaches them.
    pub fn kill_in_place(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGKILLs the daemon and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the daemon cleanly (it exports its pools) and reaps it.
    pub fn stop(mut self) {
        let _ = self.tarn(&["daemon", "stop"]);
        let _ = self.child.wait();
    }
}

/// Sparse member files (`tarn_testkit::files::make`) as path strings, for
/// the CLI's arguments.
pub fn files(dir: &Path, prefix: &str, n: usize, size: u64) -> Vec<String> {
    tarn_testkit::files::make(dir, prefix, n, size)
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

impl Drop for Daemon {
    /// A test that fails half-way still stops its daemon and its mounts.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        self.detach_mounts();
    }
}
