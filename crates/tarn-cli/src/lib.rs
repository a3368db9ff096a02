//! tarn-cli: the `tarn` command's client half: argument parsing, the
//! blocking client of the daemon's admin socket, and human output.
//!
//! Every command is one or a few admin API calls ([`tarn_api`]) whose
//! answers are rendered like the `zpool` and `zfs` commands (or printed as
//! JSON with `-o json`). `tarn daemon` and `tarn demo` are parsed here too,
//! into plain options ([`daemon::DaemonRun`], [`daemon::DemoRun`]) that the
//! binary runs with the node crate. The pieces:
//!
//! - [`cli`]: the top-level parser, output options and [`cli::run`].
//! - [`pool`], [`dataset`], [`key`], [`access`], [`object`], [`daemon`]: each command
//!   group's arguments and what it sends.
//! - [`client`]: a blocking client of the admin socket; `session` opens it
//!   for a command and prints what it answers.
//! - [`render`]: human output in the style of `zpool status` and friends.
//!
//! Layering: this crate depends on `tarn-api`, clap, anyhow and serde, and
//! never on `tarn-daemon` or the engine and server crates, so the client
//! does not link the code it talks to.

#![warn(missing_docs)]

pub mod access;
pub mod bench;
pub mod cli;
pub mod client;
pub mod config;
pub mod daemon;
pub mod dataset;
pub mod disk;
pub mod events;
pub mod key;
pub mod object;
pub mod pool;
pub mod remote;
pub mod render;
pub mod replicate;
pub mod schedule;
pub mod send;
mod session;
pub mod volume;

pub use cli::{is_broken_pipe, run, Cli, Run};
