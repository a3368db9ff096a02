//! What the tests of the built `tarn` binary share: a real daemon process
//! and the CLI run against it, real network clients, the checks for what a
//! test needs (root, FUSE, tools), and seeded randomness for the crash loops.

#![allow(dead_code)]

pub mod clients;
pub mod process;
pub mod require;
pub mod seeded;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

/// Waits until something listens on `path` (bounded).
pub fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(path).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listens on {}",
            path.display()
        );
        thread::sleep(Duration::from_millis(20));
    }
}
