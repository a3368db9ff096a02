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
//! **Values.** The tree's values carry a one-byte tag: plain bytes (sealed
//! with the dataset's key when it is encrypted, see `crypt`), or a block
//! pointer to a data block.
//!
//! **Open txg** (`overlay`). Open context never changes a committed tree:
//! the txg's changes (plain values, data blocks staged with the room
//! already allocated for them, deletions, deleted ranges) sit in the
//! dataset's overlay, and readers see the overlay over the tree. The sync
//! writes the staged blocks, applies the overlay to the tree and commits
//! it; every value it replaces that names a block is killed then.
//!
//! **Transactions.** A [`Txn`] changes one dataset's overlay under the pool
//! lock and journals every change; if its closure fails, the journal is
//! applied backwards and its space charge and room returned, so the open
//! txg is as if it never ran.
//!
//! **Birth-time rule and deadlists** (`deadlist`): a block a dataset stops
//! referencing is freed at once when no snapshot can reference it, else it
//! goes on the dataset's deadlist; destroying a snapshot frees what only it
//! held.
//!
//! **Accounting** (`accounting`): `referenced`, `unique` and deadlist
//! summaries per dataset make every figure `list` shows a range sum.
//!
//! **Crash reasoning.** All of it lives in the meta tree and the dataset
//! trees and commits in one txg with the uberblock, so a crash lands on a
//! state where records, deadlists, trees and space maps agree. Where this
//! layer's sync sits in the txg: docs/design.md ("The txg and the sync
//! order").

#![warn(missing_docs)]

mod accounting;
mod config;
pub mod crypt;
mod deadlist;
mod destroy;
mod dsl;
mod ops;
mod overlay;
pub mod props;
pub mod read_data;
pub mod readahead;
mod record;
pub mod recv;
pub mod send;
mod stored;
mod sync;
mod txn;
mod zil;

#[cfg(test)]
mod golden;

pub use props::{PropValue, Source};
pub use read_data::{Part, ReadData};
pub use record::{DatasetInfo, DatasetKind, Sums, VolSpec};
pub use txn::{apply_patch, BlockData, BlockRef, DatasetHandle, Txn, Value};
pub use zil::{
    parked_blocks, parked_records, IMMEDIATE_BYTES, IMMEDIATE_RECORD_BYTES, WAIT_SYNC_BYTES,
};

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
    /// An encrypted dataset whose key is not loaded.
    #[error("{0}")]
    Locked(String),
    /// A key or passphrase that does not unwrap the dataset's key.
    #[error("{0}")]
    WrongKey(String),
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

pub use config::{config_delete, config_list, config_put};
pub use crypt::{
    change_key, encryption_roots, key_location, load_key, load_key_with, unload_key, Encryption,
    KeyFormat, KeyInput, KeyStatus,
};
pub use destroy::{check_destroy, destroy};
pub use dsl::{attach, blocks, deflated, list, open};
pub use ops::{
    check_rename, check_rollback, check_volspec, clone, create, create_volume,
    create_volume_with_key, create_with_key, hold, holds, promote, release, rename, rollback,
    snapshot,
};
pub use props::{get_props, inherit, set_prop};
