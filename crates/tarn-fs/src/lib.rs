//! tarn-fs: POSIX files, directories and attributes on one dataset — the
//! API every front end (FUSE, NFS, WebDAV) calls, and the only crate they
//! call into (docs/design.md, "Layers and crates").
//!
//! # Shape
//!
//! [`Fs`] is inode-based like FUSE's low-level API: every operation names
//! inodes by number and takes the caller's [`Cred`], so a FUSE adapter is a
//! thin mapping and an NFSv3 server can use the same calls (file handles
//! come from [`Attr::handle`]). Permissions are enforced here, Linux-style,
//! so the result is right with or without the kernel's
//! `default_permissions`. The dataset below is reached only through the
//! [`store`] seam ([`Backend`] / [`Store`]).
//!
//! # Transactions and crashes
//!
//! Every operation is one [`Backend::txn`]: all its changes commit together
//! or (on any error, e.g. ENOSPC halfway through a rename) none of them do,
//! and a crash can never split it, because one transaction lands in one
//! txg. So there is no journal and no fsck: each operation moves the
//! on-disk state from one consistent state to the next. The only state
//! that spans operations is "unlinked but still open" (below). Reads that
//! refresh `atime` (relatime rules, only when the dataset's `atime`
//! property is on) do so in a second, best-effort transaction.
//!
//! # Key layout
//!
//! Every key starts with an 8-byte big-endian inode number, then a kind
//! byte, so all keys of one inode are contiguous and freeing an inode is a
//! single `delete_range`:
//!
//! | key | value |
//! |---|---|
//! | `0 ‖ 01` | superblock: magic, version, next inode number |
//! | `0 ‖ 05 ‖ ino` | orphan: `ino` is unlinked but was open |
//! | `ino ‖ 01` | inode record (mode, owner, times, size, ...) |
//! | `ino ‖ 02 ‖ h` | xattr: name and value (block if large) |
//! | `ino ‖ 03 ‖ h` | directory entry: child inode, type, name |
//! | `ino ‖ 04 ‖ i` | data record `i` of a file (block value) |
//!
//! `h` is a 64-bit big-endian number: the first 40 bits of BLAKE3(name),
//! shifted left 16, plus a 16-bit collision counter. Looking a name up reads
//! one hash bucket (one key, barring collisions), so it is O(log n) in the
//! directory size. `docs/format.md` has the byte layouts.
//!
//! # Directory cookies
//!
//! `readdir` walks keys in order and returns `h + 3` as each entry's cookie
//! (0, 1 and 2 are "start", "after `.`" and "after `..`"). Resuming is a
//! range scan from that key, so it costs O(entries returned) and needs no
//! cursor state. Because a cookie names a key, not a position, it stays
//! valid across restarts and across inserts and deletes by others: entries
//! that exist for the whole listing are returned exactly once; entries
//! added or removed meanwhile may or may not appear (as POSIX allows).
//!
//! # Files
//!
//! A file's record size is fixed at creation (the dataset's `recordsize`
//! then). A file no larger than its record size is one block of just its
//! length; a larger one uses full records. Writes read-modify-write
//! partial records; an all-zero record is a hole (the store deletes it), so
//! sparse files and punched holes take no space. The inode tracks allocated
//! bytes for `st_blocks`.
//!
//! # Unlinked-but-open files and orphans
//!
//! Open counts live in memory ([`Fs::open`] / [`Fs::release`]). When the
//! last link of an inode goes while it is open, the same transaction that
//! removes the name writes an orphan key `0 ‖ 05 ‖ ino` and keeps the inode
//! (with `nlink = 0`); the last release frees the inode and deletes the
//! key in one transaction. If the server crashes (or is dropped) first, the
//! orphan key survives and [`Fs::mount`] frees the inode: nothing leaks,
//! and nothing is freed while it could still be read.
//!
//! # Inode numbers and snapshots
//!
//! Inode numbers come from a counter in the superblock and are never
//! reused; each inode also keeps a generation number for NFS handles. Live
//! inodes use the low 48 bits (1 is the root, 2 the `.snapshot` directory,
//! 0..16 reserved). The root holds a hidden, read-only `.snapshot`
//! directory listing [`Backend::snapshots`]; inode `i` inside a snapshot is
//! reported as `(slot << 48) | i`, with slots handed out per `Fs` the first
//! time a snapshot (by guid) is seen, so numbers are unique across the
//! whole mount. Every change inside a snapshot fails with EROFS.

mod codec;
pub mod dataset;
mod dir;
mod dynfs;
mod file;
mod fs;
mod inode;
mod io;
mod namespace;
pub mod notify;
mod perm;
mod readdir;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod types;
mod xattr;
mod xattrs;

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

pub use dataset::DatasetBackend;
pub use dynfs::DynFs;
pub use fs::{Fs, MAX_READ};
pub use notify::{Change, Origin, Subscriber, Subscription};
pub use store::{
    patch_by_rewrite, Backend, BlockReader, Bytes, Prefetch, SpaceInfo, Store, StoreError,
    StoreInfo, Val,
};
pub use tarn_dataset::read_data::{Part, ReadData};
pub use types::*;

/// Result type of every `tarn-fs` operation.
pub type Result<T, E = FsError> = std::result::Result<T, E>;

/// An error with the errno a front end should return, plus a message for
/// logs (the errno is the contract; the message is for people).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg} (errno {errno})")]
pub struct FsError {
    errno: i32,
    msg: Cow<'static, str>,
}

impl FsError {
    /// An error with the given errno and message.
    pub fn new(errno: i32, msg: impl Into<Cow<'static, str>>) -> Self {
        FsError {
            errno,
            msg: msg.into(),
        }
    }

    /// An EIO error: stored bytes that cannot be decoded, or a broken
    /// invariant of the stored structure.
    pub fn io(msg: impl Into<Cow<'static, str>>) -> Self {
        FsError::new(libc::EIO, msg)
    }

    /// The errno value (positive, e.g. `libc::ENOENT`).
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.msg
    }
}

impl From<StoreError> for FsError {
    fn from(e: StoreError) -> Self {
        let errno = match &e {
            StoreError::NoSpace(_) => libc::ENOSPC,
            StoreError::Quota(_) => libc::EDQUOT,
            StoreError::ReadOnly(_) => libc::EROFS,
            StoreError::Damaged(_) | StoreError::Other(_) => libc::EIO,
            StoreError::Invalid(_) => libc::EINVAL,
            StoreError::Locked(_) => libc::EACCES,
            StoreError::Gone(_) => libc::ESTALE,
        };
        FsError::new(errno, e.to_string())
    }
}
