//! The raidz parity code, kept behind this small module so the Reed-Solomon
//! implementation can be replaced without touching layout or recovery.
//!
//! The on-disk format depends on the exact generator matrix, so a replacement
//! must produce the same parity bytes; `tests::parity_is_pinned` holds a known
//! vector for each parity level.

use std::sync::OnceLock;

use reed_solomon_erasure::galois_8::ReedSolomon;

/// One systematic code: `data` shards in, `parity` shards out, over GF(2^8).
pub(crate) struct Codec {
    rs: ReedSolomon,
}

impl Codec {
    fn new(data: usize, parity: usize) -> Result<Codec, String> {
        ReedSolomon::new(data, parity)
            .map(|rs| Codec { rs })
            .map_err(|e| format!("parity code ({data}+{parity}): {e:?}"))
    }

    /// Computes the parity shards (the last `parity`) from the data shards
    /// (the first `data`); all shards have the same length.
    pub(crate) fn encode(&self, shards: &mut [&mut [u8]]) -> Result<(), String> {
        self.rs.encode(shards).map_err(|e| format!("encode: {e:?}"))
    }

    /// Computes parity shards from data shards held in separate buffers.
    pub(crate) fn encode_sep(
        &self,
        data: &[&[u8]],
        parity: &mut [&mut [u8]],
    ) -> Result<(), String> {
        self.rs
            .encode_sep(data, parity)
            .map_err(|e| format!("encode: {e:?}"))
    }

    /// Rebuilds every data shard whose flag is false from the shards whose
    /// flag is true. Parity shards marked false are left untouched.
    pub(crate) fn reconstruct_data(&self, shards: &mut [(&mut [u8], bool)]) -> Result<(), String> {
        self.rs
            .reconstruct_data(shards)
            .map_err(|e| format!("reconstruct: {e:?}"))
    }
}

/// One lazily built codec per data-column count: a raidz block narrower than
/// the vdev has fewer data columns, and each count is a different code.
pub(crate) struct CodecCache {
    parity: usize,
    codecs: Vec<OnceLock<Result<Codec, String>>>,
}

impl CodecCache {
    /// A cache for codes with `parity` parity shards and 1..=`max_data` data shards.
    pub(crate) fn new(parity: usize, max_data: usize) -> CodecCache {
        CodecCache {
            parity,
            codecs: (0..max_data).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The codec for `data` data shards.
    pub(crate) fn get(&self, data: usize) -> Result<&Codec, String> {
        let slot = data
            .checked_sub(1)
            .and_then(|i| self.codecs.get(i))
            .ok_or_else(|| format!("no parity code for {data} data columns"))?;
        slot.get_or_init(|| Codec::new(data, self.parity))
            .as_ref()
            .map_err(Clone::clone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(data: &[&[u8]], parity: usize) -> Vec<Vec<u8>> {
        let c = Codec::new(data.len(), parity).unwrap();
        let mut bufs: Vec<Vec<u8>> = data.iter().map(|d| d.to_vec()).collect();
        bufs.extend((0..parity).map(|_| vec![0u8; data[0].len()]));
        let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        c.encode(&mut refs).unwrap();
        bufs.split_off(data.len())
    }

    #[test]
    fn parity_is_pinned() {
        // Changing these values changes the on-disk format of every raidz pool.
        let d: [&[u8]; 3] = [&[1, 2, 3, 4], &[5, 6, 7, 8], &[9, 10, 11, 250]];
        assert_eq!(encode(&d, 1), PINNED_P1);
        assert_eq!(encode(&d, 2), PINNED_P2);
        assert_eq!(encode(&d, 3), PINNED_P3);
        // One data column: every parity column is a copy.
        assert_eq!(encode(&[&[7, 8, 9]], 3), vec![vec![7, 8, 9]; 3]);
    }

    // The first parity column is the XOR of the data (1 ^ 5 ^ 9 = 13).
    const PINNED_P1: &[&[u8]] = &[&[13, 14, 15, 246]];
    const PINNED_P2: &[&[u8]] = &[&[13, 14, 15, 246], &[17, 18, 19, 90]];
    const PINNED_P3: &[&[u8]] = &[&[13, 14, 15, 246], &[17, 18, 19, 90], &[21, 22, 23, 86]];

    #[test]
    fn reconstruct_any_erasures() {
        let d: [&[u8]; 4] = [&[1, 2], &[3, 4], &[5, 6], &[7, 8]];
        let par = encode(&d, 2);
        let c = Codec::new(4, 2).unwrap();
        let mut all: Vec<Vec<u8>> = d.iter().map(|x| x.to_vec()).chain(par).collect();
        let want = all.clone();
        all[0] = vec![0; 2];
        all[5] = vec![0; 2];
        let mut sh: Vec<(&mut [u8], bool)> = all
            .iter_mut()
            .enumerate()
            .map(|(i, b)| (b.as_mut_slice(), i != 0 && i != 5))
            .collect();
        c.reconstruct_data(&mut sh).unwrap();
        assert_eq!(all[..4], want[..4]);
    }

    #[test]
    fn cache_rejects_zero_and_too_many() {
        let cache = CodecCache::new(2, 3);
        assert!(cache.get(0).is_err());
        assert!(cache.get(4).is_err());
        assert!(cache.get(3).is_ok());
    }
}
