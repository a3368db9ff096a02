//! tarn-iscsi: an iSCSI target (RFC 7143) for block devices behind
//! [`tarn_vol::Device`], such as tarn's volumes.

#![warn(missing_docs)]

pub mod digest;
pub mod login;
pub mod pdu;
pub mod scsi;
mod server;
mod target;
pub mod text;

pub use server::{ConnStats, IscsiConfig, IscsiServer, Running};
pub use target::{valid_name, Chap, IscsiTarget};

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
