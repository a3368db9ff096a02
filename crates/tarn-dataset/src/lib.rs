//! tarn-dataset: datasets, their properties, snapshots, clones, rollback,
//! deadlists and space accounting.
//!
//! # Theory
//!
//! **Datasets.** Every dataset (filesystem, snapshot, clone) has a record
//! in the pool's meta tree (`D` + id, JSON) and, for filesystems, one
//! copy-on-write B+tree of its own whose root the record names. The pool's
//! root dataset carries the pool's name. Names are kept in the records; the
//! name index is rebuilt in memory when the pool is attached.
//!
//! **Values.** The tree's values carry a one-byte tag: plain bytes, a block
//! pointer to a data block, or (in memory only) a placeholder for a data
//! block staged in the open txg. At sync the staged blocks are written and
//! every placeholder is replaced by its pointer before the tree commits, so
//! no placeholder ever reaches disk.
//!
//! **Transactions.** A [`Txn`] changes one dataset under the pool lock and
//! journals every change; if its closure fails, the journal is applied
//! backwards and its space charge returned, so the open txg is as if it
//! never ran. Blocks it stops referencing ("kills") are only queued, and
//! handed on when it succeeds.
//!
//! **Birth-time rule.** A killed block born after the dataset's newest
//! snapshot (`prev_snap_txg`) is referenced by nobody else and is freed at
//! once. An older one is still referenced by that snapshot: it goes on the
//! dataset's *deadlist*. A snapshot taken in txg T captures the tree as
//! committed at the end of T and takes over the head's deadlist; the head
//! starts a new one. Destroying snapshot S frees, from the deadlist of the
//! dataset after it ("next"), exactly the blocks born after S's own previous
//! snapshot (nobody else references them), and moves S's deadlist into
//! next's. Deadlist entries are bucketed by the snapshot interval of their
//! birth, so these questions are range sums over small per-bucket
//! summaries, which also make every snapshot's `used` exact.
//!
//! **Accounting.** Per dataset: `referenced` (every block the tree
//! reaches), `unique` (blocks born after `prev_snap_txg`: what destroying
//! the head would free) and the deadlist summaries. Tree nodes count like
//! data. Snapshots record `written`, the head's unique space when they
//! were taken. Everything is in allocated bytes (parity and copies
//! included), like ZFS; `compressratio` uses logical and physical sizes.
//!
//! **Crash reasoning.** All of it lives in the meta tree and the dataset
//! trees and commits in one txg with the uberblock, so a crash lands on a
//! state where records, deadlists, trees and space maps agree.

#![warn(missing_docs)]

mod dsl;
pub mod props;
mod txn;
mod zil;

#[cfg(test)]
mod golden;

pub use dsl::{DatasetInfo, DatasetKind, Sums};
pub use props::{PropValue, Source};
pub use txn::{DatasetHandle, Txn, Value};
pub use zil::IMMEDIATE_BYTES;

use tarn_pool::PoolError;

/// Errors of the dataset layer; each names the dataset and the fix.
#[derive(Debug, thiserror::Error)]
pub enum DsError {
    /// No such dataset or snapshot.
    #[error("{0}")]
    NotFound(String),
    /// The name is taken.
    #[error("{0}")]
    Exists(String),
    /// Something depends on it (children, snapshots, clones, a mount).
    #[error("{0}")]
    Busy(String),
    /// A request that cannot be carried out as asked.
    #[error("{0}")]
    Invalid(String),
    /// Out of space in the pool or the dataset's reservation.
    #[error("out of space: {0}")]
    NoSpace(String),
    /// A quota is reached.
    #[error("quota exceeded: {0}")]
    Quota(String),
    /// The dataset or snapshot is read-only.
    #[error("read-only: {0}")]
    ReadOnly(String),
    /// Data that cannot be read correctly from any copy.
    #[error("damaged: {0}")]
    Damaged(String),
    /// Records that do not decode.
    #[error("damaged dataset metadata: {0}")]
    Corrupt(String),
    /// The pool failed.
    #[error("{0}")]
    Pool(#[from] PoolError),
}

impl From<tarn_tree::TreeError> for DsError {
    fn from(e: tarn_tree::TreeError) -> Self {
        DsError::Pool(PoolError::from(e))
    }
}

impl From<tarn_block::BlockError> for DsError {
    fn from(e: tarn_block::BlockError) -> Self {
        DsError::Pool(PoolError::from(e))
    }
}

pub use dsl::{
    attach, blocks, clone, config_delete, config_list, config_put, create, deflated, destroy,
    get_props, inherit, list, open, promote, rename, rollback, set_prop, snapshot,
};
