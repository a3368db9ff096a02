//! tarn-vol: block volumes (ZFS's zvols) and the [`Device`] seam that the
//! block front ends (NBD, iSCSI) serve.
//!
//! A volume is a dataset whose tree holds one sparse block device of a
//! fixed size, cut into `volblocksize` blocks; see [`volume`] for the key
//! layout and its crash reasoning. Front ends see only [`Device`], so a
//! protocol can be tested against [`testing::MemDevice`] and served from a
//! real [`Volume`] alike.

#![warn(missing_docs)]

#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod volume;

pub use tarn_dataset::ReadData;
pub use volume::{resize_lock, Volume};

/// Errors of a block device, each mapped by a front end to its protocol's
/// error (an NBD errno, a SCSI sense).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolError {
    /// The request reaches past the end of the device.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// The pool (or the volume's reservation) has no room.
    #[error("out of space: {0}")]
    NoSpace(String),
    /// A quota of the volume or an ancestor is reached.
    #[error("quota exceeded: {0}")]
    Quota(String),
    /// The volume is a snapshot or `readonly=on`.
    #[error("read-only: {0}")]
    ReadOnly(String),
    /// Data that cannot be read correctly from any copy.
    #[error("damaged: {0}")]
    Damaged(String),
    /// A request the device cannot carry out as asked.
    #[error("invalid: {0}")]
    Invalid(String),
    /// Anything else (a faulted pool, an internal error).
    #[error("{0}")]
    Other(String),
}

/// One run of a device's address space, as [`Device::extents`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Length in bytes.
    pub len: u64,
    /// True if nothing is stored there: it reads as zeros and takes no
    /// space (never written, trimmed, or written with zeros).
    pub hole: bool,
}

/// A block device as a front end serves it. Offsets and lengths are in
/// bytes; every call is checked against [`Device::size`] and fails with
/// [`VolError::OutOfRange`] rather than being cut short. Calls may come
/// from many threads at once (several connections of one initiator).
pub trait Device: Send + Sync {
    /// Size in bytes (a multiple of [`Device::block_size`]).
    fn size(&self) -> u64;
    /// [`Device::size`] without waiting: None when asking would wait (a
    /// resize under way) or the device cannot say cheaply. A front end
    /// asks it on its network thread, where it must not block.
    fn try_size(&self) -> Option<u64> {
        None
    }
    /// The volume's block size: a write that covers whole blocks costs
    /// no read; advertised to initiators as the preferred I/O size.
    fn block_size(&self) -> u32;
    /// True when every write fails with [`VolError::ReadOnly`].
    fn read_only(&self) -> bool;
    /// A number naming this device's data wherever and under whatever
    /// name it is served (a volume's dataset guid: kept across renames and
    /// share changes, its own for a clone), from which an iSCSI logical
    /// unit's serial number and NAA come; None: the front end derives them
    /// from the name it serves the device under.
    fn identity(&self) -> Option<u64> {
        None
    }
    /// False once the device is closed (a rollback, destroy or key unload
    /// under way): every call fails, and a front end does not offer it to
    /// a client connecting meanwhile, who would see an empty disk.
    fn is_open(&self) -> bool {
        true
    }
    /// `len` bytes at `off`; holes read as zeros. The bytes come as
    /// ranges of the blocks that hold them (shared with the block cache,
    /// not copied) and runs of zeros, so a front end can send them with a
    /// vectored write.
    fn read_data(&self, off: u64, len: u32) -> Result<ReadData, VolError>;
    /// [`Device::read_data`] answered from memory only, without waiting for
    /// a device or a lock: None when answering would wait (a block or a
    /// tree node not cached, a transaction or an exclusive operation under
    /// way). A front end tries it on its network thread and hands the
    /// request to a blocking thread only on None. Never waiting is the
    /// whole contract; the default answers None.
    fn read_cached(&self, off: u64, len: u32) -> Option<Result<ReadData, VolError>> {
        let _ = (off, len);
        None
    }
    /// [`Device::read_data`] assembled into one buffer (one copy).
    fn read(&self, off: u64, len: u32) -> Result<Vec<u8>, VolError> {
        Ok(self.read_data(off, len)?.to_vec())
    }
    /// Writes `data` at `off`. With `fua` it is durable when this returns;
    /// without, at the next [`Device::flush`] (or txg commit).
    fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), VolError>;
    /// Makes every write that has returned, on any connection, durable.
    fn flush(&self) -> Result<(), VolError>;
    /// Discards `len` bytes at `off`: whole blocks inside the range are
    /// freed (space returns to the pool unless a snapshot holds them) and
    /// partial blocks are zeroed, so the range reads as zeros afterwards.
    fn trim(&self, off: u64, len: u64) -> Result<(), VolError>;
    /// Writes zeros over `len` bytes at `off`; a volume stores zeros as
    /// holes, so this frees space like [`Device::trim`]. With `fua` it is
    /// durable when this returns.
    fn write_zeroes(&self, off: u64, len: u64, fua: bool) -> Result<(), VolError>;
    /// The allocation status of `off..off + len`, as consecutive runs that
    /// cover it exactly (adjacent runs of the same status merged).
    fn extents(&self, off: u64, len: u64) -> Result<Vec<Extent>, VolError>;
}

/// Checks `off..off + len` against a device of `size` bytes.
pub fn check_range(size: u64, off: u64, len: u64) -> Result<(), VolError> {
    match off.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(VolError::OutOfRange(format!(
            "{len} bytes at offset {off} reach past the end of a {size}-byte device"
        ))),
    }
}
