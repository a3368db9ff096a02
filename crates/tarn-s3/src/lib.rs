//! tarn-s3: send streams kept in an S3-compatible object store, for
//! offsite copies on a service that never holds a key.
//!
//! [`http`] is a minimal blocking HTTP/1.1 client (rustls for HTTPS),
//! [`sigv4`] signs requests, [`client`] is the bucket operations the
//! layout needs (put, get, list, delete), and [`store`] is the layout:
//! each stream cut into immutable part objects and described by a
//! manifest written last (docs/format.md, "Streams in an object store").
//! The crate knows nothing of pools: it moves bytes the caller produces
//! (`tarn send`) or consumes (`tarn receive`).

#![warn(missing_docs)]

pub mod client;
pub mod http;
pub mod sigv4;
pub mod store;

pub use client::{Bucket, Config, Object};
pub use store::{chain, newest, Manifest, Store, StreamInfo, Streams, UploadReport};

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    /// Missing or malformed settings (credentials, endpoint, names).
    #[error("object store settings: {0}")]
    Config(String),
    /// The connection failed (retried first where that may help).
    #[error("object store connection: {0}")]
    Io(String),
    /// The server answered something that is not HTTP as expected.
    #[error("object store protocol: {0}")]
    Protocol(String),
    /// The store refused: its status, error code and message.
    #[error("object store: {message} ({status} {code})")]
    Store {
        /// HTTP status.
        status: u16,
        /// The store's error code (`NoSuchBucket`, `AccessDenied`, ...).
        code: String,
        /// What was asked, and the store's message.
        message: String,
    },
    /// Objects that do not form the layout: a bad manifest, a missing or
    /// damaged part.
    #[error("stored streams: {0}")]
    Layout(String),
}
