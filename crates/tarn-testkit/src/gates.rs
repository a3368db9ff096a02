//! Tests that hold a device's I/O at a [`WriteGate`] and check what still
//! runs meanwhile: each check runs on its own thread and fails by timing
//! out, with the gate opened first so nothing stays stuck behind it.

use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use tarn_vdev::fault::{find_device, WriteGate};

/// How long a check may take before it counts as waiting for the gate.
pub const LONG: Duration = Duration::from_secs(20);

/// Runs `f` on its own thread and returns what it returns; panics with
/// "`what` waited for ..." if it does not finish within [`LONG`] (after
/// opening `gate`).
pub fn within<R: Send + 'static>(
    gate: &WriteGate,
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(LONG) {
        Ok(r) => r,
        Err(_) => {
            let held = gate.waiting();
            gate.open();
            panic!("{what} waited for the I/O held at the gate ({held} I/Os were held)");
        }
    }
}

/// A closed gate on the reads of every member file `paths` names (the
/// pool's devices, opened through the fault layer).
pub fn hold_reads(paths: &[&Path]) -> Arc<WriteGate> {
    let gate = WriteGate::new();
    for p in paths {
        find_device(p)
            .unwrap_or_else(|| panic!("{} is not an open pool device", p.display()))
            .attach_read_gate(Some(gate.clone()));
    }
    gate.close();
    gate
}
