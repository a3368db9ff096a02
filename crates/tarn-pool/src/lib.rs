//! tarn-pool: pools of top-level vdevs, committed one transaction group at a
//! time.
//!
//! # Theory
//!
//! A pool on disk is always exactly one committed txg: the newest uberblock
//! whose trees verify. Everything else is in memory until the next sync.
//!
//! * **Open txg.** The dataset layer (the extension, see `ext`) keeps the
//!   open txg's changes and charges their bytes to the write throttle
//!   (`dirty_max_bytes`: writers wait when it is full). The pool's own
//!   state record stays in memory and the extension's records go into the
//!   in-memory meta tree; neither reaches disk before the next sync.
//! * **Sync of txg T**, under the pool lock, in the order `docs/design.md`
//!   ("The txg and the sync order") explains: the extension's data blocks
//!   (compressed and checksummed on worker threads, then written) and its
//!   trees, bottom-up → the intent log's new chain and the pool state record
//!   → meta tree nodes bottom-up (the tree commits children before parents)
//!   → space maps (their own blocks are allocated *before* the maps are
//!   encoded, so the encoding includes them) → flush → uberblock T into slot
//!   `T % slots` of every label of every leaf that got every write of T →
//!   flush. Only then is T committed and announced.
//! * **Frees** of blocks the new version no longer references are deferred:
//!   they stay allocated until `T + DEFER_TXGS` has committed (and no reader
//!   holds an older txg), so the previous uberblocks stay importable.
//! * **Crash at any instant.** Before the second flush nothing of T is
//!   referenced by a valid uberblock (its blocks were written into free
//!   space); a torn uberblock fails its checksum and import takes T-1; after
//!   the flush T is complete. Import therefore always lands on a committed txg.
//! * **Synchronous writes** of the dataset layer go to the intent log (`zil`):
//!   records appended to a self-checksummed chain of log blocks between
//!   txgs, optionally on separate log devices (`logdev`), claimed and handed
//!   back for replay at import.
//!

#![warn(missing_docs)]

pub mod status;
pub mod uberblock;

mod config;
mod devices;
pub mod ext;
mod flight;
mod import;
mod logdev;
mod pool;
mod report;
mod scan;
mod space;
mod store;
mod sync;
mod txg;
mod vdevs;
mod zil;

#[cfg(test)]
mod golden;

pub use config::{parse_size, PoolOptions, PoolProps, VdevSpec, FEATURES};
pub use ext::{BlockOpts, Cx, ExtRef, Extension, RawStored, Reservation, Rooms, ScanFn, SyncCx};
pub use import::discover;
pub use pool::Pool;
pub use scan::{LeakReport, ScanAction};
pub use store::{OwnedHold, ReadStore};
pub use sync::SPACE_CHUNK_MAX;
pub use zil::LogCommit;

use tarn_block::BlockError;
use tarn_space::SpaceError;
use tarn_tree::TreeError;
use tarn_vdev::VdevError;

/// Errors of the pool layer; each names the thing, the cause, and where it
/// helps, the fix.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// On-disk structures are damaged.
    #[error("damaged pool metadata: {0}")]
    Corrupt(String),
    /// Written by a newer tarn.
    #[error("unsupported format: {0}")]
    Unsupported(String),
    /// No such pool, device or object.
    #[error("{0}")]
    NotFound(String),
    /// Something exists already.
    #[error("{0}")]
    Exists(String),
    /// A device or pool is in use by someone else.
    #[error("{0}")]
    InUse(String),
    /// A request that cannot be carried out as asked.
    #[error("{0}")]
    Invalid(String),
    /// Out of space.
    #[error("out of space: {0}")]
    NoSpace(String),
    /// Data that cannot be read back correctly from any copy.
    #[error("{0}")]
    Damaged(String),
    /// The pool has lost more devices than its redundancy or failed a sync.
    #[error("pool is faulted: {0}")]
    Faulted(String),
    /// A device operation failed.
    #[error("{0}")]
    Device(#[from] VdevError),
    /// A block operation failed.
    #[error("{0}")]
    Block(#[from] BlockError),
    /// A space map operation failed.
    #[error("{0}")]
    Space(#[from] SpaceError),
    /// A tree operation failed.
    #[error("{0}")]
    Tree(String),
    /// A bug or an impossible state, reported rather than panicked on.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<TreeError> for PoolError {
    fn from(e: TreeError) -> Self {
        match e {
            TreeError::Store(inner) => match inner.downcast::<PoolError>() {
                Ok(p) => *p,
                Err(inner) => match inner.downcast::<BlockError>() {
                    Ok(b) => PoolError::Block(*b),
                    Err(other) => PoolError::Tree(other.to_string()),
                },
            },
            other => PoolError::Tree(other.to_string()),
        }
    }
}
