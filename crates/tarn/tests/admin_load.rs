//! The admin socket under a local program that holds hundreds of
//! connections it does not use: idle ones, and slow ones trickling a
//! request that never ends, each reopened when the daemon closes it. The
//! `tarn` commands of a well-behaved user must keep working meanwhile,
//! each within [`BOUND`] (they take milliseconds on an idle machine), and
//! `tarn daemon stats` must show the limits tripping.

mod common;

use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::process::Daemon;

/// Idle connections held open (and reopened when closed).
const IDLE: usize = 300;
/// Connections trickling one byte of a request every [`TRICKLE`].
const SLOW: usize = 100;
const TRICKLE: Duration = Duration::from_millis(100);
/// The most one `tarn` command may take under the flood.
const BOUND: Duration = Duration::from_secs(5);
/// How long commands run under the flood.
const UNDER_FLOOD: Duration = Duration::from_secs(5);

/// Whether the daemon has closed `s` (or answered on it: its reason).
fn closed(s: &UnixStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: one writable byte; MSG_PEEK | MSG_DONTWAIT neither consumes
    // nor blocks, and `s` keeps the descriptor open.
    let n = unsafe {
        libc::recv(
            s.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n >= 0
}

/// Opens connections to `socket` until `stop`, keeping `n` of them open;
/// `slow` ones also send a byte of an endless request every [`TRICKLE`].
fn flood(socket: PathBuf, n: usize, slow: bool, stop: Arc<AtomicBool>) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let mut opened = 0u64;
        let connect = |opened: &mut u64| -> Option<UnixStream> {
            let s = UnixStream::connect(&socket).ok()?;
            *opened += 1;
            Some(s)
        };
        let mut conns: Vec<Option<UnixStream>> = (0..n).map(|_| connect(&mut opened)).collect();
        let pause = if slow {
            TRICKLE
        } else {
            Duration::from_millis(300)
        };
        while !stop.load(Ordering::Relaxed) {
            for c in conns.iter_mut() {
                let dead = match c {
                    None => true,
                    Some(s) if slow => s.write_all(b"{").is_err() || closed(s),
                    Some(s) => closed(s),
                };
                if dead {
                    *c = connect(&mut opened);
                }
            }
            thread::sleep(pause);
        }
        opened
    })
}

fn timed(d: &Daemon, args: &[&str]) -> (Duration, String) {
    let t0 = Instant::now();
    let out = d.tarn(args);
    let took = t0.elapsed();
    assert!(
        out.status.success(),
        "tarn {args:?} failed under the flood: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(took < BOUND, "tarn {args:?} took {took:?} under the flood");
    (took, String::from_utf8_lossy(&out.stdout).into_owned())
}

fn stats(d: &Daemon) -> serde_json::Value {
    let (_, out) = timed(d, &["daemon", "stats", "-o", "json"]);
    serde_json::from_str(&out).expect("stats as JSON")
}

/// Runs `tarn daemon ping` and `tarn pool list` for at least `how_long`,
/// each within [`BOUND`]; answers how many ran and the slowest.
fn keep_working(d: &Daemon, how_long: Duration) -> (usize, Duration) {
    let t0 = Instant::now();
    let (mut commands, mut slowest) = (0, Duration::ZERO);
    while t0.elapsed() < how_long || commands < 20 {
        for args in [&["daemon", "ping"][..], &["pool", "list"][..]] {
            slowest = slowest.max(timed(d, args).0);
            commands += 1;
        }
    }
    (commands, slowest)
}

#[test]
fn tarn_commands_work_while_hundreds_of_connections_idle_and_trickle() {
    let dir = tempfile::tempdir().unwrap();
    // A short request timeout so trickling connections get cut during the
    // test; the connection limit is the default (64).
    let d = Daemon::start_with(dir.path(), &["--admin-request-timeout", "2"]);

    // Hundreds of idle and slow connections, far over the limit: they push
    // each other out, and the user's commands still get through.
    let stop = Arc::new(AtomicBool::new(false));
    let idle = flood(d.socket.clone(), IDLE, false, stop.clone());
    let slow = flood(d.socket.clone(), SLOW, true, stop.clone());
    thread::sleep(Duration::from_millis(500));
    let (commands, slowest) = keep_working(&d, UNDER_FLOOD);
    let during = stats(&d);
    stop.store(true, Ordering::Relaxed);
    let opened = idle.join().unwrap() + slow.join().unwrap();
    eprintln!(
        "{commands} commands under the flood, slowest {slowest:?}; the flood opened {opened} \
         connections; admin counters {}",
        during["admin"]
    );
    let admin = &during["admin"];
    let count = |k: &str| {
        admin[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in {admin}"))
    };
    assert!(opened as usize > IDLE + SLOW, "the flood kept reconnecting");
    assert!(count("evicted") > 0, "the limit tripped: {admin}");
    assert!(count("open") <= 64 + 1, "the limit held: {admin}");
    assert_eq!(count("refused_full"), 0, "nobody was busy: {admin}");

    // Slow connections within the limit are not pushed out: the request
    // timeout cuts them.
    let stop = Arc::new(AtomicBool::new(false));
    let slow = flood(d.socket.clone(), 40, true, stop.clone());
    let (commands, slowest) = keep_working(&d, Duration::from_secs(3));
    let after = stats(&d);
    stop.store(true, Ordering::Relaxed);
    slow.join().unwrap();
    eprintln!(
        "{commands} commands beside 40 trickling connections, slowest {slowest:?}; admin \
         counters {}",
        after["admin"]
    );
    let timeouts = |v: &serde_json::Value| v["admin"]["request_timeouts"].as_u64().unwrap();
    assert!(
        timeouts(&after) > timeouts(&during),
        "slow requests were cut: {after}"
    );
    d.stop();
}
