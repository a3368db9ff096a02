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
pub use transport::{run_daemon, DaemonOptions, Node};

/// Opens the state directory, imports the pools the daemon owned, and
/// starts the NFS and WebDAV servers the options ask for.
pub fn start_node(opts: &DaemonOptions) -> Result<Arc<Pools>> {
    let pools = Arc::new(Pools::open(&opts.state_dir, &opts.tuning)?);
    let _ = pools.admin_socket.set(opts.socket.clone());
    pools.start_servers(&opts.servers)?;
    pools.start_scheduler()?;
    pools.start_history()?;
    Ok(pools)
}

/// Runs the daemon in the foreground: starts the node, then serves the admin
/// socket until a stop (signal or `daemon.stop`) and exports every pool.
pub fn run(opts: DaemonOptions) -> Result<()> {
    let node = start_node(&opts)?;
    run_daemon(opts, node)
}
