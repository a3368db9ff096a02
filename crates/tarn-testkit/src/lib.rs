//! tarn-testkit: what tarn's tests share, so no fixture is copied between
//! crates. A dev-dependency only; nothing in a production crate uses it.
//!
//! - [`data`]: a seeded generator, so every failure replays exactly.
//! - [`files`]: sparse member files in a temporary folder.
//! - [`pools`]: pools on those files (create, import, options that never
//!   sync on their own), scans waited for, counters summed.
//! - [`blobs`]: named byte arrays kept in a pool's root dataset, for the
//!   pool's own tests, which need data to damage, scrub and resilver.
//!
//! Crates below `tarn-dataset` may use this kit in their integration tests
//! (`tests/*.rs`): those link the crate's normal library, the same one the
//! kit links. Unit tests (`src/`) cannot.

pub mod blobs;
pub mod data;
pub mod files;
pub mod pools;

/// One mebibyte.
pub const MIB: u64 = 1 << 20;
