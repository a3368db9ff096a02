//! The device layer of tarn: leaf devices (files and block devices), the labels
//! that identify them, and the top-level vdevs (single, mirror, raidz1/2/3)
//! that turn leaves into one redundant, self-healing address space.
//!
//! Everything above this crate sees a top-level vdev as a flat range of bytes
//! `[0, asize)`: it writes whole blocks at offsets chosen by its allocator and
//! reads them back with a verification closure (the block checksum). This crate
//! never returns bytes the closure rejected: it reconstructs from redundancy,
//! rewrites the bad copies in place, and counts what went wrong per leaf.

#![warn(missing_docs)]

mod batch;
pub mod fault;
mod label;
mod leaf;
mod mirror;
mod parity;
mod raidz;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod top;
mod uring;
pub mod workers;

use std::path::PathBuf;

pub use fault::{find_device, open_device, Fault, FaultKind, FaultLeaf};
pub use label::{
    clear_labels, data_end, label_offsets, read_label, read_uberblocks, uberblock_slot_size,
    uberblock_slots, write_label_config, write_label_config_all, write_uberblock, LabelConfig,
    LabelHalf, LabelRead, LeafConfig, PoolState, TopConfig, VdevKind, DATA_START,
    LABEL_CONFIG_SIZE, LABEL_HEADER_LEN, LABEL_HEADER_VERSION, LABEL_MAGIC, LABEL_SIZE,
    LOG_TOP_BASE, MIN_LEAF_SIZE, UBERBLOCK_RING_SIZE, UBERBLOCK_SLOT_MIN,
};
pub use leaf::{FileLeaf, Leaf, DIRECT_ALIGN};
pub use top::{
    ChildExtent, Counters, FlushMark, LeafInfo, LeafState, ScrubOutcome, TopHealth, TopVdev,
    WriteOutcome, FAULT_AFTER_ERRORS, MAX_COMBINATIONS,
};

/// Smallest supported sector shift (512-byte sectors).
pub const MIN_ASHIFT: u8 = 9;
/// Largest supported sector shift (64 KiB sectors), as in ZFS; it keeps at
/// least two uberblock slots per label.
pub const MAX_ASHIFT: u8 = 16;
/// Largest block a vdev reads or writes in one call. Block sizes come from
/// block pointers read from disk, so this bounds the memory one bad pointer
/// can make us allocate.
pub const MAX_BLOCK_SIZE: usize = 16 * 1024 * 1024;

/// Everything that can go wrong in the device layer.
#[derive(Debug, thiserror::Error)]
pub enum VdevError {
    /// A system call on a leaf failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// Device path.
        path: PathBuf,
        /// What we were doing ("open", "read label", ...).
        op: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// None of the four label copies of a device is a valid tarn label.
    #[error("{path}: no tarn label ({reason})")]
    NoLabel {
        /// Device path.
        path: PathBuf,
        /// Why each copy was rejected.
        reason: String,
    },
    /// The device is too small to hold labels and a useful data region.
    #[error("{path}: device too small ({size} bytes, need at least {min})")]
    TooSmall {
        /// Device path.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
        /// The minimum in bytes.
        min: u64,
    },
    /// A label config could not be encoded (too large, bad field, not UTF-8 path).
    #[error("label config cannot be written: {0}")]
    LabelEncode(String),
    /// The vdev description is impossible (wrong child count, parity, ashift).
    #[error("invalid vdev geometry: {0}")]
    Geometry(String),
    /// An I/O would fall outside the vdev's address space.
    #[error("I/O out of range: offset {offset:#x} length {len:#x} (vdev size {limit:#x})")]
    OutOfRange {
        /// Vdev offset of the request.
        offset: u64,
        /// Allocated length of the request.
        len: u64,
        /// Size of the address space.
        limit: u64,
    },
    /// A caller-supplied argument is invalid (misaligned offset, zero or oversized block, bad slot).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No combination of copies or columns produced bytes that verify.
    #[error("unrecoverable block at offset {offset:#x} (psize {psize}): {reason}")]
    Unrecoverable {
        /// Vdev offset of the block.
        offset: u64,
        /// Stored size of the block.
        psize: usize,
        /// What was tried.
        reason: String,
    },
    /// More children failed an operation than the vdev's redundancy covers.
    #[error(
        "{op} failed on {failed} children ({}), more than the {tolerated} this vdev tolerates",
        devices.join(", ")
    )]
    InsufficientReplicas {
        /// "write" or "flush".
        op: &'static str,
        /// Children that failed or were unusable.
        failed: usize,
        /// The vdev's redundancy.
        tolerated: usize,
        /// Paths of the children that failed or were unusable.
        devices: Vec<String>,
    },
    /// A state change was refused because it would leave data unreadable.
    #[error("refused: {0}")]
    Refused(String),
    /// A child index does not exist in this vdev.
    #[error("no child {idx} in a vdev of {count} children")]
    NoSuchChild {
        /// Requested index.
        idx: usize,
        /// Number of children.
        count: usize,
    },
}

/// Sector size in bytes for a sector shift; the shift is clamped so that a
/// corrupt value cannot overflow.
pub(crate) fn sector(ashift: u8) -> u64 {
    1u64 << u32::from(ashift.min(40))
}

pub(crate) fn check_ashift(ashift: u8) -> Result<(), String> {
    if (MIN_ASHIFT..=MAX_ASHIFT).contains(&ashift) {
        Ok(())
    } else {
        Err(format!(
            "ashift {ashift} outside {MIN_ASHIFT}..={MAX_ASHIFT}"
        ))
    }
}
