//! tarn-testkit: what tarn's tests share, so no fixture is copied between
//! crates. A dev-dependency only; nothing in a production crate uses it.
//!
//! - [`data`]: a seeded generator, patterns and mixed workloads, so every
//!   failure replays exactly; seeds from the environment; proptest's cases.
//! - [`files`]: sparse member files in a temporary folder, damaged on
//!   purpose.
//! - [`pools`]: pools on those files (`tank` in one call, create, import,
//!   options that never sync on their own), scans waited for, counters
//!   summed, where a block's bytes lie.
//! - [`gates`]: device reads or writes held at a gate, and checks that
//!   fail by timing out if they wait for it.
//! - [`datasets`]: filesystem datasets with the POSIX layer mounted, and a
//!   pool with one filesystem ready.
//! - [`blobs`]: named byte arrays kept in a pool's root dataset, for the
//!   pool's own tests, which need data to damage, scrub and resilver.
//! - [`stores`]: a pass-through store with its own clock and a watch on
//!   reads, for test backends that wrap a real one.
//! - [`require`]: root and FUSE, programs: skip when missing, fail under
//!   `TARN_REQUIRE_ALL`.
//! - [`clients`]: curl, libnfs's tools and URLs, litmus, run as programs.
//! - [`net`]: free ports, Unix sockets waited for, connections from
//!   127.0.0.x, hang-ups noticed, idle and trickling crowds.
//!
//! The kit links tarn-vdev, -block, -pool, -dataset and -fs (and what they
//! link). Those crates may use it in their integration tests (`tests/*.rs`):
//! these link the crate's normal library, the same one the kit links. Their
//! unit tests (`src/`) cannot: they would see two copies of the crate. The
//! kit needs no async runtime and no HTTP stack; clients are run as
//! programs.

pub mod blobs;
pub mod clients;
pub mod data;
pub mod datasets;
pub mod files;
pub mod gates;
pub mod net;
pub mod pools;
pub mod require;
pub mod stores;

/// One mebibyte.
pub const MIB: u64 = 1 << 20;
