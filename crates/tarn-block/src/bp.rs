//! The block pointer: the 160-byte record through which every block is found
//! and verified.
//!
//! A block pointer says where a block lives (up to three device addresses,
//! "DVAs"), how to turn the stored bytes back into the logical bytes
//! (compression, encryption fields), when it was born (the txg that wrote it,
//! which drives incremental send, resilver and the birth-time freeing rule)
//! and the 256-bit checksum of the stored bytes. Because the checksum lives in
//! the parent, a device that returns well-formed but wrong bytes is caught:
//! the tree of pointers is a Merkle tree whose root is the uberblock.
//!
//! The layout is fixed and documented byte by byte in `docs/format.md`; any
//! change to it is a format version change.

use crate::BlockError;

/// Size in bytes of an encoded [`BlockPtr`].
pub const BLOCK_PTR_SIZE: usize = 160;

/// Largest logical block size: a bound on what one read may allocate, so a
/// pointer read from disk can never ask for gigabytes.
pub const MAX_LSIZE: u32 = 16 << 20;

/// Most copies (DVAs) a block pointer can carry.
pub const MAX_COPIES: usize = 3;

/// Flag bit: the stored bytes are sealed (see `crypt`); `salt`, `iv` and
/// `mac` say how.
pub const FLAG_ENCRYPTED: u8 = 1;

/// One device address: which top-level vdev, where in its allocatable space,
/// and how many bytes were allocated there (including parity and padding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dva {
    /// Index of the top-level vdev in the pool's vdev tree.
    pub vdev: u32,
    /// Allocated bytes on that vdev; 0 marks an unused slot.
    pub asize: u32,
    /// Byte offset in the top-level vdev's allocatable address space.
    pub offset: u64,
}

impl Dva {
    /// True when this slot holds an address.
    pub fn is_used(&self) -> bool {
        self.asize != 0
    }
}

/// Checksum algorithm of a block; the value is stored on disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ChecksumAlg {
    /// BLAKE3, 256 bits: the default, cryptographically strong, fast with SIMD.
    #[default]
    Blake3 = 1,
    /// XXH3-128, zero-extended to 256 bits: faster, not collision resistant.
    Xxh3 = 2,
}

impl ChecksumAlg {
    /// Decodes the on-disk value.
    pub fn from_u8(v: u8) -> Result<Self, BlockError> {
        match v {
            1 => Ok(Self::Blake3),
            2 => Ok(Self::Xxh3),
            _ => Err(BlockError::Format(format!(
                "unknown checksum algorithm {v}"
            ))),
        }
    }

    /// Parses the property value users write (`blake3`, `xxh3`).
    pub fn parse(s: &str) -> Result<Self, BlockError> {
        match s {
            "blake3" | "on" => Ok(Self::Blake3),
            "xxh3" | "xxh3-128" => Ok(Self::Xxh3),
            _ => Err(BlockError::InvalidProperty(format!(
                "checksum={s}: expected blake3 or xxh3"
            ))),
        }
    }

    /// The property value users see.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Blake3 => "blake3",
            Self::Xxh3 => "xxh3",
        }
    }
}

/// Compression of the stored bytes; the value is stored on disk. The zstd
/// level is a write-time choice only, so it is not part of the stored value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CompressAlg {
    /// Stored as written.
    #[default]
    Off = 0,
    /// LZ4 block format with a 4-byte little-endian length prefix.
    Lz4 = 1,
    /// A zstd frame.
    Zstd = 2,
}

impl CompressAlg {
    /// Decodes the on-disk value.
    pub fn from_u8(v: u8) -> Result<Self, BlockError> {
        match v {
            0 => Ok(Self::Off),
            1 => Ok(Self::Lz4),
            2 => Ok(Self::Zstd),
            _ => Err(BlockError::Format(format!("unknown compression {v}"))),
        }
    }
}

/// What a block holds; stored so tools (scrub, send, debuggers) can tell
/// metadata from data without context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum BlockType {
    /// User data of an object or file.
    #[default]
    Data = 1,
    /// A node of a copy-on-write B+tree.
    TreeNode = 2,
    /// Persistent free-space records.
    SpaceMap = 3,
    /// Intent-log block.
    IntentLog = 4,
}

impl BlockType {
    /// Decodes the on-disk value.
    pub fn from_u8(v: u8) -> Result<Self, BlockError> {
        match v {
            1 => Ok(Self::Data),
            2 => Ok(Self::TreeNode),
            3 => Ok(Self::SpaceMap),
            4 => Ok(Self::IntentLog),
            _ => Err(BlockError::Format(format!("unknown block type {v}"))),
        }
    }

    /// Metadata gets an extra copy by default and is checked first at import.
    pub fn is_metadata(&self) -> bool {
        !matches!(self, Self::Data)
    }
}

/// A block pointer. The all-zero pointer is a hole (no block).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlockPtr {
    /// Device addresses; unused slots have `asize == 0`.
    pub dvas: [Dva; MAX_COPIES],
    /// Logical (uncompressed, decrypted) size in bytes.
    pub lsize: u32,
    /// Physical (stored) size in bytes; the checksum covers exactly these.
    pub psize: u32,
    /// The txg in which the block was written.
    pub birth: u64,
    /// What the block holds.
    pub btype: BlockType,
    /// Tree level (0 for leaves and data).
    pub level: u8,
    /// Checksum algorithm of `checksum`.
    pub checksum_alg: ChecksumAlg,
    /// Compression of the stored bytes.
    pub compress: CompressAlg,
    /// Bit 0: encrypted. Other bits reserved, zero.
    pub flags: u8,
    /// Number of non-hole data blocks at or below this pointer (1 for data).
    pub fill: u64,
    /// Encryption salt selecting the per-block key (encrypted blocks).
    pub salt: [u8; 8],
    /// Encryption nonce (encrypted blocks).
    pub iv: [u8; 12],
    /// Encryption authentication tag (encrypted blocks).
    pub mac: [u8; 16],
    /// 256-bit checksum of the stored bytes.
    pub checksum: [u8; 32],
}

impl BlockPtr {
    /// True for the hole pointer, which references no block.
    pub fn is_hole(&self) -> bool {
        self.birth == 0 && !self.dvas.iter().any(Dva::is_used)
    }

    /// True when the stored bytes are sealed with a dataset's key.
    pub fn is_encrypted(&self) -> bool {
        self.flags & FLAG_ENCRYPTED != 0
    }

    /// The used device addresses.
    pub fn used_dvas(&self) -> impl Iterator<Item = &Dva> {
        self.dvas.iter().filter(|d| d.is_used())
    }

    /// Total bytes allocated for this block over all copies.
    pub fn allocated_bytes(&self) -> u64 {
        self.used_dvas().map(|d| d.asize as u64).sum()
    }

    /// Encodes into the fixed little-endian layout of `docs/format.md`.
    pub fn encode(&self) -> [u8; BLOCK_PTR_SIZE] {
        let mut b = [0u8; BLOCK_PTR_SIZE];
        for (i, d) in self.dvas.iter().enumerate() {
            let o = i * 16;
            b[o..o + 4].copy_from_slice(&d.vdev.to_le_bytes());
            b[o + 4..o + 8].copy_from_slice(&d.asize.to_le_bytes());
            b[o + 8..o + 16].copy_from_slice(&d.offset.to_le_bytes());
        }
        if self.is_hole() {
            return [0u8; BLOCK_PTR_SIZE];
        }
        b[48..52].copy_from_slice(&self.lsize.to_le_bytes());
        b[52..56].copy_from_slice(&self.psize.to_le_bytes());
        b[56..64].copy_from_slice(&self.birth.to_le_bytes());
        b[64] = self.btype as u8;
        b[65] = self.level;
        b[66] = self.checksum_alg as u8;
        b[67] = self.compress as u8;
        b[68] = self.flags;
        b[72..80].copy_from_slice(&self.fill.to_le_bytes());
        b[80..88].copy_from_slice(&self.salt);
        b[88..100].copy_from_slice(&self.iv);
        b[100..116].copy_from_slice(&self.mac);
        b[128..160].copy_from_slice(&self.checksum);
        b
    }

    /// Decodes and validates a pointer read from a verified parent block.
    pub fn decode(b: &[u8]) -> Result<Self, BlockError> {
        if b.len() < BLOCK_PTR_SIZE {
            return Err(BlockError::Format(format!(
                "block pointer needs {BLOCK_PTR_SIZE} bytes, got {}",
                b.len()
            )));
        }
        if b[..BLOCK_PTR_SIZE].iter().all(|&x| x == 0) {
            return Ok(Self::default());
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let mut dvas = [Dva::default(); MAX_COPIES];
        for (i, d) in dvas.iter_mut().enumerate() {
            let o = i * 16;
            *d = Dva {
                vdev: u32_at(o),
                asize: u32_at(o + 4),
                offset: u64_at(o + 8),
            };
        }
        let mut bp = BlockPtr {
            dvas,
            lsize: u32_at(48),
            psize: u32_at(52),
            birth: u64_at(56),
            btype: BlockType::from_u8(b[64])?,
            level: b[65],
            checksum_alg: ChecksumAlg::from_u8(b[66])?,
            compress: CompressAlg::from_u8(b[67])?,
            flags: b[68],
            fill: u64_at(72),
            ..Default::default()
        };
        bp.salt.copy_from_slice(&b[80..88]);
        bp.iv.copy_from_slice(&b[88..100]);
        bp.mac.copy_from_slice(&b[100..116]);
        bp.checksum.copy_from_slice(&b[128..160]);
        if bp.lsize > MAX_LSIZE {
            return Err(BlockError::Format(format!(
                "block pointer with lsize {} above the {MAX_LSIZE}-byte maximum",
                bp.lsize
            )));
        }
        if bp.psize == 0 || bp.lsize == 0 || bp.psize > bp.lsize {
            return Err(BlockError::Format(format!(
                "block pointer with psize {} lsize {}",
                bp.psize, bp.lsize
            )));
        }
        if bp.flags & !FLAG_ENCRYPTED != 0 {
            return Err(BlockError::Format(format!(
                "block pointer with unknown flags {:#04x}",
                bp.flags
            )));
        }
        if bp.used_dvas().count() == 0 {
            return Err(BlockError::Format(
                "block pointer without an address".into(),
            ));
        }
        if bp.compress == CompressAlg::Off && bp.psize != bp.lsize {
            return Err(BlockError::Format(format!(
                "uncompressed block pointer with psize {} != lsize {}",
                bp.psize, bp.lsize
            )));
        }
        Ok(bp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_bp() -> impl Strategy<Value = BlockPtr> {
        (
            proptest::collection::vec((any::<u32>(), 1u32.., any::<u64>()), 1..=3),
            1u32..(16 << 20),
            1u64..,
            0u8..4,
            any::<u8>(),
            any::<[u8; 32]>(),
            any::<u64>(),
        )
            .prop_map(|(dv, lsize, birth, kind, level, sum, fill)| {
                let mut dvas = [Dva::default(); 3];
                for (i, (vdev, asize, offset)) in dv.into_iter().enumerate() {
                    dvas[i] = Dva {
                        vdev,
                        asize,
                        offset,
                    };
                }
                BlockPtr {
                    dvas,
                    lsize,
                    psize: if kind == 0 { lsize } else { lsize.div_ceil(2) },
                    birth,
                    btype: BlockType::TreeNode,
                    level,
                    checksum_alg: ChecksumAlg::Xxh3,
                    compress: if kind == 0 {
                        CompressAlg::Off
                    } else {
                        CompressAlg::Zstd
                    },
                    flags: 0,
                    fill,
                    checksum: sum,
                    ..Default::default()
                }
            })
    }

    proptest! {
        #[test]
        fn roundtrip(bp in arb_bp()) {
            let enc = bp.encode();
            prop_assert_eq!(BlockPtr::decode(&enc).unwrap(), bp);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = BlockPtr::decode(&bytes);
        }
    }

    #[test]
    fn hole_is_all_zero() {
        let h = BlockPtr::default();
        assert!(h.is_hole());
        assert_eq!(h.encode(), [0u8; BLOCK_PTR_SIZE]);
        assert!(BlockPtr::decode(&[0u8; BLOCK_PTR_SIZE]).unwrap().is_hole());
    }

    #[test]
    fn layout_is_pinned() {
        let bp = BlockPtr {
            dvas: [
                Dva {
                    vdev: 1,
                    asize: 0x2000,
                    offset: 0x10_0000,
                },
                Dva::default(),
                Dva::default(),
            ],
            lsize: 0x2_0000,
            psize: 0x1000,
            birth: 7,
            btype: BlockType::Data,
            level: 0,
            checksum_alg: ChecksumAlg::Blake3,
            compress: CompressAlg::Lz4,
            flags: 0,
            fill: 1,
            checksum: [0xab; 32],
            ..Default::default()
        };
        let e = bp.encode();
        assert_eq!(
            &e[0..16],
            &[1, 0, 0, 0, 0, 0x20, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0]
        );
        assert_eq!(&e[48..56], &[0, 0, 2, 0, 0, 0x10, 0, 0]);
        assert_eq!(&e[56..64], &[7, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&e[64..69], &[1, 0, 1, 1, 0]);
        assert_eq!(&e[72..80], &[1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&e[128..160], &[0xab; 32]);
        // An encrypted block: flag bit 0, salt, nonce and tag in place.
        let enc = BlockPtr {
            flags: FLAG_ENCRYPTED,
            salt: [1; 8],
            iv: [2; 12],
            mac: [3; 16],
            ..bp
        };
        let e = enc.encode();
        assert_eq!(e[68], 1);
        assert_eq!(&e[80..88], &[1; 8]);
        assert_eq!(&e[88..100], &[2; 12]);
        assert_eq!(&e[100..116], &[3; 16]);
        assert_eq!(&e[116..128], &[0; 12]);
        let back = BlockPtr::decode(&e).unwrap();
        assert!(back.is_encrypted());
        assert_eq!(back, enc);
        // Flags this version does not know are refused.
        let mut unknown = e;
        unknown[68] = 3;
        assert!(BlockPtr::decode(&unknown).is_err());
    }
}
