//! tarn-cli: the `tarn` binary's library half.
//!
//! The daemon owns the pools and serves the admin API over a Unix socket; the
//! command-line client is a thin program that sends one request per command
//! and renders the answer. The pieces:
//!
//! - [`api`]: the protocol (one JSON object per line), typed parameters and
//!   [`api::dispatch`], which maps a method name onto a [`backend::Backend`].
//! - [`backend`]: the trait the storage engine implements, and its request
//!   types.
//! - [`daemon`]: the socket listener, connection limits and signal handling.
//! - [`client`]: a blocking client of the admin socket.
//! - [`cli`]: command-line parsing and the commands themselves.
//! - [`render`]: human output in the style of `zpool status` and friends.

#![warn(missing_docs)]

pub mod access;
pub mod api;
pub mod backend;
pub mod cli;
pub mod client;
pub mod daemon;
pub mod demo;
pub mod filesystems;
pub mod mounts;
pub mod pools;
pub mod render;
pub mod servers;

/// The status types shared with the pool layer, re-exported so API users
/// need one crate.
pub use tarn_pool::status;
