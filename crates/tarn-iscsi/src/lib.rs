//! tarn-iscsi: an iSCSI target (RFC 7143) for block devices behind
//! [`tarn_vol::Device`], such as tarn's volumes. User guide:
//! `docs/iscsi.md`.
//!
//! # Shape
//!
//! [`IscsiServer::start`] binds a listener and runs a small tokio runtime
//! (2 threads) on its own thread, as tarn's other network servers do;
//! [`Running`] changes the targets live, reports connection counters and
//! stops the server. Connections are admitted by
//! [`tarn_conn::Admission`]. Each [`IscsiTarget`] is an IQN with one
//! logical unit, LUN 0, and its access rules (client networks, initiator
//! names, CHAP).
//!
//! # Layers
//!
//! - [`pdu`]: the wire format (BHS, AHS, digests, padding); pure, never
//!   panics on input.
//! - [`text`]: `key=value` segments.
//! - [`login`]: the login state machine (stages, negotiation, CHAP);
//!   pure, one request in, one response out.
//! - [`scsi`]: SCSI commands over a `Device`: parsing (before any data
//!   is gathered) and execution (on a blocking thread).
//! - `server`: connections, the full feature phase (R2T, Data-In,
//!   numbering, task management); its module comment explains the flow.
//!
//! The choices the RFC leaves open (one connection per session, error
//! recovery level 0, one outstanding R2T, in-order data, a write-back
//! cache flushed by SYNCHRONIZE CACHE) are explained where they are made
//! and summed up in `docs/iscsi.md`.

#![warn(missing_docs)]

pub mod digest;
pub mod login;
pub mod lu;
pub mod pdu;
pub mod pr;
pub mod scsi;
mod server;
mod target;
pub mod text;

pub use server::{ConnStats, IscsiConfig, IscsiServer, Running};
pub use target::{reflected, valid_name, Chap, IscsiTarget};

/// Errors starting or reconfiguring the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding or runtime setup failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Invalid targets or configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
}
