//! tarn-daemon: the node. It owns the pools this machine has imported and
//! everything that hangs off them: FUSE mounts, the users and shares stored
//! in the pools, the NFS and WebDAV servers that serve those shares, and the
//! admin API's Unix-socket transport.
//!
//! The pieces:
//!
//! - [`pools`]: the set of imported pools and the daemon's state directory;
//!   [`node`] implements the admin API ([`tarn_api::Backend`]) over it and
//!   [`objects`] the object methods (files at the top of a pool's root
//!   filesystem, copied in and out without a mount).
//! - [`convert`]: engine types and errors into the API's types, in one place.
//! - [`access`]: users and shares as stored in the pools.
//! - [`filesystems`], [`mounts`]: one POSIX filesystem per dataset, and its
//!   FUSE mounts.
//! - [`servers`]: the NFS, WebDAV, NBD and iSCSI front ends; [`smb`]: the
//!   Samba that tarn configures and supervises for SMB.
//! - [`replication`]: the replication port, where other tarns send
//!   snapshots over TLS with a token.
//! - [`events`]: the event log, what the daemon observes of its pools,
//!   and the alerts that send events by webhook, email or program.
//! - [`health`]: SMART and NVMe health of the pools' disks (smartctl).
//! - [`schedule`]: snapshot policies with retention and scrub schedules,
//!   and the thread that runs them.
//! - [`transport`]: the admin socket, its limits and the stop sequence.
//! - [`demo`]: what `tarn demo` runs.
//! - [`heap`]: one malloc arena for the process, set first in `main`.
//!
//! Layering: this crate calls `tarn-api` and the engine and front-end crates
//! (`tarn-pool`, `tarn-dataset`, `tarn-fs`, `tarn-fuse`, `tarn-nfs`,
//! `tarn-webdav`, `tarn-vdev`). It never calls `tarn-cli`; the `tarn` binary
//! hands it plain options. Later transports (HTTPS), schedules and alerts
//! plug in here. Its threads, its maps and their lock order are in
//! docs/design.md ("Process and threading model").

#![warn(missing_docs)]

pub mod access;
pub mod convert;
pub mod demo;
pub mod error;
pub mod events;
pub mod filesystems;
pub mod health;
pub mod heap;
pub mod history;
mod keys;
pub mod links;
pub mod metrics;
pub mod mounts;
pub mod node;
pub mod objects;
pub mod periodic;
pub mod pools;
pub mod replication;
pub mod schedule;
pub mod servers;
pub mod smb;
pub mod transport;
pub mod web;

use std::sync::Arc;

pub use error::{DaemonError, Result};
pub use pools::{Pools, Tuning};
pub use servers::{NfsLimits, ServerOptions, WebdavLimits};
pub use transport::{run_daemon, serve, DaemonOptions, Node, Prepared};

/// Opens the state directory, imports the pools the daemon owned, and
/// starts the NFS and WebDAV servers the options ask for.
pub fn start_node(opts: &DaemonOptions) -> Result<Arc<Pools>> {
    if let Err(e) = raise_open_file_limit() {
        log::warn!("could not raise the limit of open files: {e}");
    }
    let pools = Arc::new(Pools::open(&opts.state_dir, &opts.tuning)?);
    let _ = pools.admin_socket.set(opts.socket.clone());
    let started = pools
        .start_servers(&opts.servers)
        .and_then(|()| pools.start_scheduler())
        .and_then(|()| pools.start_history());
    if let Err(e) = started {
        stop_node(&pools);
        return Err(e);
    }
    Ok(pools)
}

/// Takes a node whose start failed after its pools were imported (a port
/// taken, a certificate missing) down as a stop would: servers stopped,
/// filesystems unmounted (the process is about to exit, and a FUSE mount
/// whose daemon is gone answers only "transport endpoint is not
/// connected" until someone unmounts it by hand), pools exported.
pub fn stop_node(node: &Pools) {
    for failure in Node::shutdown(node) {
        log::warn!("tarn: stopping after a failed start: {failure}");
    }
}

/// Runs the daemon in the foreground: takes its socket and the stop
/// signals, starts the node, then serves the admin socket until a stop
/// (signal or `daemon.stop`) and exports every pool.
pub fn run(opts: DaemonOptions) -> Result<()> {
    let prepared = transport::Prepared::take(&opts)?;
    let node = match start_node(&opts) {
        Ok(node) => node,
        Err(e) => {
            prepared.abandon();
            return Err(e);
        }
    };
    transport::serve(opts, node, prepared)
}

/// Most open files the daemon asks for, whatever the hard limit says (the
/// kernel refuses more than its `fs.nr_open`, 1,048,576 by default).
const OPEN_FILES_MAX: libc::rlim_t = 1 << 20;

/// Raises the soft limit of open files to the hard one (at most
/// [`OPEN_FILES_MAX`]) and returns the soft limit now in force. A pool
/// holds three descriptors per device (reads and writes, reads past the
/// page cache, the device lock) and every client connection one more; a
/// daemon started from a shell inherits its soft limit, often 1,024, far
/// below the hard limit it may take. (The service unit sets its own.)
fn raise_open_file_limit() -> std::io::Result<libc::rlim_t> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into `lim`, which lives across
    // the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let want = lim.rlim_max.min(OPEN_FILES_MAX);
    if lim.rlim_cur >= want {
        return Ok(lim.rlim_cur);
    }
    let raised = libc::rlimit {
        rlim_cur: want,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: setrlimit reads one `rlimit` from `raised`, which lives
    // across the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(want)
}

#[cfg(test)]
mod tests {
    /// The soft limit ends at the hard one (or the cap), and a second call
    /// changes nothing.
    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_one() {
        let soft = super::raise_open_file_limit().expect("raised");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in `raise_open_file_limit`.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, soft);
        assert_eq!(soft, lim.rlim_max.min(super::OPEN_FILES_MAX));
        assert_eq!(super::raise_open_file_limit().expect("again"), soft);
    }
}
