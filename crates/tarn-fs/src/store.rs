//! The seam between the POSIX layer and the dataset that holds it.
//!
//! A dataset is one copy-on-write B+tree of byte keys. The POSIX layer owns
//! the key layout completely; the dataset only distinguishes two kinds of
//! values: *plain* values (inode records, directory entries, xattrs, ...)
//! stored inline in the tree, and *block* values: file data of up to
//! `recordsize` bytes that the dataset compresses, checksums and writes as
//! its own block at the next txg sync, keeping only a block pointer in the
//! tree. Deleting a block value frees its block (or hands it to the
//! snapshot deadlist: the POSIX layer never needs to know).
//!
//! Every operation happens inside a transaction ([`Backend::txn`]). A
//! transaction is atomic: if the closure returns an error, every change it
//! made is undone before `txn` returns, so an `ENOSPC` halfway through a
//! rename leaves no trace. All changes of one transaction land in the same
//! txg, so a crash never splits them either.

use std::ops::Bound;

/// Bytes of a block as a store hands them out: shared with its cache when
/// it can, so a read costs no extra copy.
pub type Bytes = tarn_dataset::read_data::Bytes;

/// A read of a block into a cache ahead of its reader, found inside a
/// transaction and run after it (see [`Store::block_prefetcher`]).
pub use tarn_dataset::readahead::Prefetch;

/// Reads a block later, outside the transaction that found it (see
/// [`Store::block_reader`]).
pub type BlockReader = Box<dyn FnOnce() -> Result<Bytes, StoreError> + Send>;

/// A value as the tree holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Val {
    /// An inline value written with [`Store::put`].
    Plain(Vec<u8>),
    /// A data block written with [`Store::write_block`], of `len` logical
    /// bytes; read it with [`Store::read_block`].
    Block {
        /// Logical length in bytes.
        len: u32,
    },
}

/// Errors a store reports; the POSIX layer maps them to errno values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The pool (or the dataset's reservation) has no room: ENOSPC.
    #[error("out of space: {0}")]
    NoSpace(String),
    /// The dataset (or an ancestor) is at its quota: EDQUOT.
    #[error("quota exceeded: {0}")]
    Quota(String),
    /// The dataset or snapshot is read-only: EROFS.
    #[error("read-only: {0}")]
    ReadOnly(String),
    /// Data or metadata that cannot be read correctly from any copy: EIO.
    #[error("damaged: {0}")]
    Damaged(String),
    /// Anything else (a faulted pool, an internal error): EIO.
    #[error("{0}")]
    Other(String),
    /// A key or value over the tree's limits (a bug in the caller): EINVAL.
    #[error("invalid: {0}")]
    Invalid(String),
    /// The dataset is encrypted and its key is not loaded: EACCES.
    #[error("{0}")]
    Locked(String),
    /// The dataset (a snapshot reached through `.snapshot`, a destroyed
    /// filesystem) no longer exists: ESTALE, what a client holding a
    /// handle into it should see, not an I/O error.
    #[error("{0}")]
    Gone(String),
}

/// Maximum key length in bytes the tree accepts.
pub const MAX_KEY: usize = 255;
/// Maximum plain value length in bytes the tree accepts.
pub const MAX_VALUE: usize = 1024;
/// Maximum block value length in bytes (the largest recordsize).
pub const MAX_BLOCK: usize = 1 << 20;

/// Facts about the dataset a transaction runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreInfo {
    /// The dataset's `recordsize` property now (new files take it).
    pub recordsize: u32,
    /// True for snapshots and `readonly=on` datasets: every change fails
    /// with [`StoreError::ReadOnly`].
    pub readonly: bool,
    /// The `atime` property: update access times on reads.
    pub atime: bool,
    /// Stable 64-bit id of the dataset (or snapshot), for file handles.
    pub guid: u64,
    /// The dataset is encrypted: names are hashed with a secret key (see
    /// `codec::name_bucket`).
    pub encrypted: bool,
    /// When the dataset or snapshot was created (seconds since the epoch;
    /// 0 when unknown): names snapshots by time for SMB clients.
    pub created_unix: u64,
}

/// Space figures for statfs, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpaceInfo {
    /// `used + available` as the dataset sees it (quota-limited).
    pub total: u64,
    /// Bytes that can still be written (after quota, reservation, slop).
    pub available: u64,
}

/// One dataset inside one transaction. Keys are at most [`MAX_KEY`] bytes,
/// plain values at most [`MAX_VALUE`], block values at most [`MAX_BLOCK`].
pub trait Store {
    /// Facts about the dataset.
    fn info(&self) -> StoreInfo;
    /// Space figures for statfs.
    fn space(&mut self) -> SpaceInfo;
    /// The value under `key`.
    fn get(&mut self, key: &[u8]) -> Result<Option<Val>, StoreError>;
    /// The values under `keys`, which are in ascending order; a store
    /// whose lookups share work across neighbouring keys overrides it.
    fn get_many(&mut self, keys: &[&[u8]]) -> Result<Vec<Option<Val>>, StoreError> {
        keys.iter().map(|k| self.get(k)).collect()
    }
    /// Stores a plain value, replacing (and freeing) whatever was there.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError>;
    /// Removes `key`, freeing its block if it held one. False if absent.
    fn delete(&mut self, key: &[u8]) -> Result<bool, StoreError>;
    /// Up to `limit` entries in key order inside `start..end`. Page with
    /// `Bound::Excluded(last key)`.
    fn range(
        &mut self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Val)>, StoreError>;
    /// Removes every key inside `start..end` (freeing their blocks). Costs
    /// the same whatever the range holds.
    fn delete_range(&mut self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<(), StoreError>;
    /// Stores `data` as a block value under `key`, replacing what was there.
    /// Fails with `NoSpace`/`Quota` before changing anything when it cannot
    /// fit. Data that is all zeros is stored as no block at all (a hole):
    /// the key is deleted, so holes take no space.
    fn write_block(&mut self, key: &[u8], data: Vec<u8>) -> Result<(), StoreError>;
    /// Writes `bytes` at `off` into the block value under `key`, extended
    /// with zeros to at least `len` bytes first (absent: an empty block);
    /// returns its length before and after, 0 for a hole. Like
    /// [`Store::write_block`] of the patched block, but a store may change
    /// its own uncommitted block in place, so a small write into a large
    /// record costs the write's size. Required, so that a store wrapping
    /// another cannot silently fall back to rewriting whole blocks; a
    /// store without anything better calls [`patch_by_rewrite`].
    fn patch_block(
        &mut self,
        key: &[u8],
        len: usize,
        off: usize,
        bytes: Vec<u8>,
    ) -> Result<(usize, usize), StoreError>;
    /// The bytes of the block value under `key` (None if absent; an error
    /// if the key holds a plain value).
    fn read_block(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Like [`Store::read_block`], but the bytes are fetched when the
    /// returned reader is called, after the transaction has ended, so a
    /// slow read does not hold up the dataset's other operations. The
    /// reader returns the block as it was when this was called, whatever
    /// happened since. The default reads at once.
    fn block_reader(&mut self, key: &[u8]) -> Result<Option<BlockReader>, StoreError> {
        Ok(self.read_block(key)?.map(|d| {
            let r: BlockReader = Box::new(move || Ok(Box::new(d) as Bytes));
            r
        }))
    }
    /// Something that reads the block at `key` into a cache ahead of its
    /// reader (read-ahead), run later on another thread; `None` when there
    /// is nothing to gain (no block, a block in memory, a store without a
    /// cache: the default).
    fn block_prefetcher(&mut self, _key: &[u8]) -> Result<Option<Prefetch>, StoreError> {
        Ok(None)
    }
    /// Wall-clock time now, as (seconds, nanoseconds) since the Unix epoch.
    /// A seam so tests can run on a fixed clock.
    fn now(&self) -> (i64, u32);
}

/// A place to run transactions: the live dataset, or one of its snapshots.
pub trait Backend: Send + Sync {
    /// Runs `f` as one atomic transaction on the dataset (see module docs).
    /// `write` is false for transactions that only read (they may run on a
    /// snapshot and never wait for the write throttle).
    ///
    /// Write transactions must be serializable: the result must be as if
    /// they ran one at a time (running them one at a time is the simple way).
    /// The POSIX layer relies on it: creating a file reads and bumps the
    /// inode counter in the superblock, and checks that a name is free
    /// before inserting it, inside one transaction. `f` should be called
    /// once; if an implementation ever retries, it must undo the first
    /// attempt completely (tarn-fs closures are safe to call again).
    fn txn<R>(
        &self,
        write: bool,
        f: &mut dyn FnMut(&mut dyn Store) -> Result<R, crate::FsError>,
    ) -> Result<R, crate::FsError>;
    /// Waits until every transaction that has returned is durable (in the
    /// intent log or a committed txg), unless the dataset says `sync=disabled`.
    /// What fsync calls.
    fn sync(&self) -> Result<(), crate::FsError>;
    /// The dataset's snapshots, oldest first: (name, a backend to read it).
    /// Empty for a snapshot itself.
    fn snapshots(&self) -> Result<Vec<(String, std::sync::Arc<Self>)>, crate::FsError>
    where
        Self: Sized;
    /// A number that stays the same while the changes of write
    /// transactions gather in one batch in memory (the pool's open txg),
    /// or None when the store cannot tell. Only a hint for skipping work
    /// that would find nothing to do (see `Fs::write_iov`); nothing's
    /// correctness depends on it.
    fn generation(&self) -> Option<u64> {
        None
    }
}

/// [`Store::patch_block`] for a store that keeps no uncommitted blocks of
/// its own: reads the block, patches it, and writes it whole.
pub fn patch_by_rewrite(
    s: &mut (impl Store + ?Sized),
    key: &[u8],
    len: usize,
    off: usize,
    bytes: Vec<u8>,
) -> Result<(usize, usize), StoreError> {
    let mut data = s.read_block(key)?.unwrap_or_default();
    let before = data.len();
    tarn_dataset::apply_patch(&mut data, len, off, &bytes).map_err(crate::dataset::store_err)?;
    let after = if data.iter().all(|&b| b == 0) {
        0
    } else {
        data.len()
    };
    if before > 0 || after > 0 {
        s.write_block(key, data)?;
    }
    Ok((before, after))
}
