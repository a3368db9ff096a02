//! tarn-block: the block pointer and the block pipeline.
//!
//! Every byte tarn stores passes through here. Writing a block runs
//! compress → encrypt (blocks of encrypted datasets, `crypt`) → checksum →
//! allocate → write; reading runs the inverse and refuses to return bytes
//! whose checksum does not match the one held by the parent pointer. The
//! checksum covers the *stored* bytes, so scrub and resilver can verify
//! blocks without decompressing or decrypting.

#![warn(missing_docs)]

pub mod bp;
pub mod cache;
pub mod checksum;
pub mod compress;
pub mod crypt;
pub mod pipeline;
pub mod spare;

pub use bp::{
    BlockPtr, BlockType, ChecksumAlg, CompressAlg, Dva, BLOCK_PTR_SIZE, FLAG_ENCRYPTED, MAX_COPIES,
};
pub use cache::{BlockCache, BlockId, BlockKind, CacheStats};
pub use checksum::checksum;
pub use compress::Compression;
pub use crypt::{Cipher, KeySet};

/// Errors of the block layer.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// A structure read from disk is malformed.
    #[error("malformed block data: {0}")]
    Format(String),
    /// A property value is not one tarn understands.
    #[error("invalid property: {0}")]
    InvalidProperty(String),
    /// Stored bytes could not be decompressed although their checksum matched.
    #[error("{0} failed to decompress: {1}")]
    Decompress(String, String),
    /// A device operation on one copy failed.
    #[error("device address {0}: {1}")]
    Io(String, #[source] tarn_vdev::VdevError),
    /// Sealed bytes that do not open (the wrong key, or damage the checksum
    /// could not see), or a cryptographic primitive that failed.
    #[error("encryption: {0}")]
    Crypto(String),
    /// A wrapped key did not unwrap: the passphrase or raw key is wrong.
    #[error("wrong key or passphrase")]
    WrongKey,
    /// An encrypted block was read without its dataset's key.
    #[error("{0} is encrypted and its key is not loaded")]
    KeyUnavailable(String),
    /// No copy of a block could be read and verified, even with reconstruction.
    #[error("{block} is unrecoverable: {cause}")]
    Unrecoverable {
        /// Which block (type, birth, address).
        block: String,
        /// The last failure seen.
        cause: String,
    },
}
