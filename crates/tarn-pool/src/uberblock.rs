//! The uberblock: the root of everything a committed txg wrote.
//!
//! Each txg ends by writing one uberblock into slot `txg % slots` of the
//! uberblock ring in all four labels of every leaf (see tarn-vdev's label
//! module), after every block it references has been flushed. Import reads
//! every slot it can, drops those whose checksum, magic, version or pool GUID
//! do not match, and tries them newest first until one's trees verify. A
//! torn uberblock write therefore costs at most the txg being written: the
//! previous uberblock sits in another slot and its blocks are still intact
//! because frees are deferred (tarn-space's `DEFER_TXGS`).

use tarn_block::{BlockPtr, BLOCK_PTR_SIZE};

use crate::PoolError;

/// Magic at the start of every uberblock.
pub const UBERBLOCK_MAGIC: &[u8; 8] = b"TARNUBR1";
/// Current uberblock version.
pub const UBERBLOCK_VERSION: u32 = 1;
/// Leaves that missed writes of the txg, listed by GUID, at most.
pub const MISSED_LISTED_MAX: usize = 16;
/// Count value meaning "more leaves missed writes than are listed".
pub const MISSED_OVERFLOW: u32 = u32::MAX;
/// Encoded size of an uberblock (fits the smallest ring slot, 1 KiB).
pub const UBERBLOCK_SIZE: usize =
    8 + 4 + 4 + 8 + 8 + 8 + 2 * BLOCK_PTR_SIZE + 4 + 8 * MISSED_LISTED_MAX + 32;

// An uberblock must fit the smallest ring slot.
const _: () = assert!(UBERBLOCK_SIZE <= tarn_vdev::UBERBLOCK_SLOT_MIN);

/// The root record of one committed txg.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uberblock {
    /// The txg this uberblock commits.
    pub txg: u64,
    /// The pool it belongs to; uberblocks of other pools are ignored.
    pub pool_guid: u64,
    /// Unix seconds at commit, for `status` and for rewind decisions.
    pub timestamp: u64,
    /// Root of the pool's meta tree.
    pub meta_root: BlockPtr,
    /// The block holding every top-level vdev's space map.
    pub space_root: BlockPtr,
    /// Leaves that missed a write of this txg but still got this uberblock
    /// (no leaf of their vdev got every write). Import records them as
    /// having missed this txg even if the dirty time log of the next txg
    /// never reached disk.
    pub missed: Vec<u64>,
    /// More leaves missed writes than fit in `missed`: every leaf is
    /// treated as having missed this txg.
    pub missed_overflow: bool,
}

impl Uberblock {
    /// Encodes with a trailing BLAKE3 checksum of all preceding bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(UBERBLOCK_SIZE);
        b.extend_from_slice(UBERBLOCK_MAGIC);
        b.extend_from_slice(&UBERBLOCK_VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.txg.to_le_bytes());
        b.extend_from_slice(&self.pool_guid.to_le_bytes());
        b.extend_from_slice(&self.timestamp.to_le_bytes());
        b.extend_from_slice(&self.meta_root.encode());
        b.extend_from_slice(&self.space_root.encode());
        let listed = if self.missed_overflow || self.missed.len() > MISSED_LISTED_MAX {
            b.extend_from_slice(&MISSED_OVERFLOW.to_le_bytes());
            &[][..]
        } else {
            b.extend_from_slice(&(self.missed.len() as u32).to_le_bytes());
            &self.missed[..]
        };
        for i in 0..MISSED_LISTED_MAX {
            b.extend_from_slice(&listed.get(i).copied().unwrap_or(0).to_le_bytes());
        }
        let sum = blake3::hash(&b);
        b.extend_from_slice(sum.as_bytes());
        debug_assert_eq!(b.len(), UBERBLOCK_SIZE);
        b
    }

    /// Decodes and verifies a slot's bytes (trailing padding ignored).
    pub fn decode(b: &[u8]) -> Result<Self, PoolError> {
        let bad = |why: &str| PoolError::Corrupt(format!("uberblock: {why}"));
        if b.len() < UBERBLOCK_SIZE {
            return Err(bad("slot too short"));
        }
        let b = &b[..UBERBLOCK_SIZE];
        if &b[..8] != UBERBLOCK_MAGIC {
            return Err(bad("no magic"));
        }
        let body = &b[..UBERBLOCK_SIZE - 32];
        if blake3::hash(body).as_bytes() != &b[UBERBLOCK_SIZE - 32..] {
            return Err(bad("checksum mismatch"));
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let version = u32_at(8);
        if version != UBERBLOCK_VERSION {
            return Err(PoolError::Unsupported(format!(
                "uberblock version {version}; this tarn reads version {UBERBLOCK_VERSION}"
            )));
        }
        let p = 40;
        let m = p + 2 * BLOCK_PTR_SIZE;
        let count = u32_at(m);
        let missed_overflow = count == MISSED_OVERFLOW;
        if !missed_overflow && count as usize > MISSED_LISTED_MAX {
            return Err(bad("missed-leaf count out of range"));
        }
        let listed = if missed_overflow { 0 } else { count as usize };
        let missed = (0..listed).map(|i| u64_at(m + 4 + 8 * i)).collect();
        Ok(Uberblock {
            missed,
            missed_overflow,
            txg: u64_at(16),
            pool_guid: u64_at(24),
            timestamp: u64_at(32),
            meta_root: BlockPtr::decode(&b[p..p + BLOCK_PTR_SIZE])
                .map_err(|e| bad(&e.to_string()))?,
            space_root: BlockPtr::decode(&b[p + BLOCK_PTR_SIZE..p + 2 * BLOCK_PTR_SIZE])
                .map_err(|e| bad(&e.to_string()))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tarn_block::{BlockType, Dva};

    fn sample() -> Uberblock {
        let mut bp = BlockPtr {
            lsize: 4096,
            psize: 4096,
            birth: 9,
            btype: BlockType::TreeNode,
            ..Default::default()
        };
        bp.dvas[0] = Dva {
            vdev: 0,
            asize: 4096,
            offset: 8192,
        };
        Uberblock {
            txg: 9,
            pool_guid: 0x1234,
            timestamp: 1_700_000_000,
            meta_root: bp,
            space_root: BlockPtr::default(),
            missed: vec![0xfeed, 0xbeef],
            missed_overflow: false,
        }
    }

    #[test]
    fn roundtrip_and_size() {
        let u = sample();
        let e = u.encode();
        assert_eq!(e.len(), UBERBLOCK_SIZE);
        let mut slot = e.clone();
        slot.resize(1024, 0);
        assert_eq!(Uberblock::decode(&slot).unwrap(), u);
    }

    #[test]
    fn missed_leaves_roundtrip_and_overflow() {
        let mut u = sample();
        u.missed = (1..=MISSED_LISTED_MAX as u64).collect();
        assert_eq!(Uberblock::decode(&u.encode()).unwrap(), u);
        u.missed.push(99);
        let d = Uberblock::decode(&u.encode()).unwrap();
        assert!(d.missed_overflow && d.missed.is_empty());
    }

    proptest! {
        #[test]
        fn any_flip_is_caught(pos in 0usize..UBERBLOCK_SIZE, bit in 0u8..8) {
            let mut e = sample().encode();
            e[pos] ^= 1 << bit;
            prop_assert!(Uberblock::decode(&e).is_err());
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..1100)) {
            let _ = Uberblock::decode(&b);
        }
    }
}
