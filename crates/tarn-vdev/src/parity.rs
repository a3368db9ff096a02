//! The raidz parity code, kept behind this small module so the Reed-Solomon
//! implementation can be replaced without touching layout or recovery.
//!
//! The on-disk format depends on the exact generator matrix, so a replacement
//! must produce the same parity bytes; `tests::parity_is_pinned` holds a known
//! vector for each parity level.

use std::sync::OnceLock;

use reed_solomon_erasure::galois_8::{self, ReedSolomon};

/// One systematic code: `data` shards in, `parity` shards out, over GF(2^8).
pub(crate) struct Codec {
    rs: ReedSolomon,
    /// The generator's parity rows: parity shard r is the sum over data
    /// shards i of `rows[r][i]` times shard i (see [`Codec::encode_short`]).
    rows: Vec<Vec<u8>>,
}

impl Codec {
    fn new(data: usize, parity: usize) -> Result<Codec, String> {
        let rs = ReedSolomon::new(data, parity)
            .map_err(|e| format!("parity code ({data}+{parity}): {e:?}"))?;
        let rows = parity_rows(&rs, data)?;
        Ok(Codec { rs, rows })
    }

    /// Computes the parity shards from data shards that may be shorter
    /// than them, each counting as zero-extended to the parity shards'
    /// length: a raidz block's short columns, taken where they lie in the
    /// block instead of copied into a stripe of equal shards. The same
    /// arithmetic as the library's encoder (the tests hold the two to
    /// the same bytes), but a coefficient of 1 is a plain XOR, which runs
    /// at memory speed where the GF(2^8) table arithmetic cost a twelfth
    /// of a large write's CPU: raidz1 parity is a plain XOR of 2^k - 1
    /// data columns (1, 3, 7, ..., 127: a raidz1 of 4 writing blocks of
    /// three sectors or more); the other codes have few coefficients of 1
    /// or none.
    pub(crate) fn encode_short(
        &self,
        data: &[&[u8]],
        parity: &mut [&mut [u8]],
    ) -> Result<(), String> {
        let len = parity.first().map_or(0, |p| p.len());
        if data.len() != self.rows.first().map_or(0, Vec::len)
            || parity.len() != self.rows.len()
            || parity.iter().any(|p| p.len() != len)
            || data.iter().any(|d| d.len() > len)
        {
            return Err(format!(
                "encode: {} data and {} parity shards do not fit the code",
                data.len(),
                parity.len()
            ));
        }
        for (row, out) in self.rows.iter().zip(parity.iter_mut()) {
            out.fill(0);
            for (&c, d) in row.iter().zip(data) {
                let out = &mut out[..d.len()];
                match c {
                    // (The library's vector path indexes the first byte,
                    // so empty shards must not reach it.)
                    _ if d.is_empty() => {}
                    0 => {}
                    1 => xor_into(out, d),
                    c => galois_8::mul_slice_xor(c, d, out),
                }
            }
        }
        Ok(())
    }

    /// Computes the parity shards (the last `parity`) from the data shards
    /// (the first `data`); all shards have the same length. The tests'
    /// reference; the write path uses [`Codec::encode_short`].
    #[cfg(test)]
    pub(crate) fn encode(&self, shards: &mut [&mut [u8]]) -> Result<(), String> {
        self.rs.encode(shards).map_err(|e| format!("encode: {e:?}"))
    }

    /// Rebuilds every data shard whose flag is false from the shards whose
    /// flag is true. Parity shards marked false are left untouched.
    pub(crate) fn reconstruct_data(&self, shards: &mut [(&mut [u8], bool)]) -> Result<(), String> {
        self.rs
            .reconstruct_data(shards)
            .map_err(|e| format!("reconstruct: {e:?}"))
    }
}

/// The parity rows of `rs`'s generator, read off by encoding unit
/// vectors (a 1 in one data shard, zeros elsewhere): parity shard r of
/// unit vector i is the coefficient of shard i in parity row r.
fn parity_rows(rs: &ReedSolomon, data: usize) -> Result<Vec<Vec<u8>>, String> {
    let parity = rs.parity_shard_count();
    let mut rows = vec![vec![0u8; data]; parity];
    for i in 0..data {
        let unit: Vec<[u8; 1]> = (0..data).map(|j| [u8::from(i == j)]).collect();
        let mut out = vec![[0u8; 1]; parity];
        rs.encode_sep(&unit, &mut out)
            .map_err(|e| format!("encode: {e:?}"))?;
        for (row, o) in rows.iter_mut().zip(&out) {
            row[i] = o[0];
        }
    }
    Ok(rows)
}

/// XORs `src` into `dst` (the same length).
pub(crate) fn xor_into(dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    // A plain loop: the compiler turns it into vector instructions.
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= *s;
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
        // The write path's arithmetic gives the same bytes.
        for (p, pinned) in [(1, PINNED_P1), (2, PINNED_P2), (3, PINNED_P3)] {
            let mut out = vec![vec![0u8; 4]; p];
            let mut refs: Vec<&mut [u8]> = out.iter_mut().map(Vec::as_mut_slice).collect();
            Codec::new(3, p)
                .unwrap()
                .encode_short(&d, &mut refs)
                .unwrap();
            assert_eq!(out, pinned, "encode_short, parity {p}");
        }
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

    /// The parity `c.encode_short` computes from `shards` (each at most
    /// `len` bytes) into shards filled with `fill` first, and the parity
    /// the library computes from the same shards zero-extended to `len`:
    /// the two must be equal.
    fn short_and_extended(
        c: &Codec,
        shards: &[Vec<u8>],
        len: usize,
        fill: u8,
    ) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let parity = c.rows.len();
        let padded: Vec<Vec<u8>> = shards
            .iter()
            .map(|s| {
                let mut p = s.clone();
                p.resize(len, 0);
                p
            })
            .collect();
        let refs: Vec<&[u8]> = padded.iter().map(Vec::as_slice).collect();
        let want = encode(&refs, parity);
        let mut got = vec![vec![fill; len]; parity];
        let short: Vec<&[u8]> = shards.iter().map(Vec::as_slice).collect();
        let mut outs: Vec<&mut [u8]> = got.iter_mut().map(Vec::as_mut_slice).collect();
        c.encode_short(&short, &mut outs).unwrap();
        (got, want)
    }

    proptest::proptest! {
        /// `encode_short` of short shards is `encode` of the same shards
        /// zero-extended, for every code a raidz vdev can use.
        #[test]
        fn short_shards_encode_as_zero_extended(
            data in 1usize..=16,
            parity in 1usize..=3,
            len in 1usize..200,
            cuts in proptest::collection::vec(0usize..200, 16),
            seed in proptest::prelude::any::<u8>(),
        ) {
            let c = Codec::new(data, parity).unwrap();
            let shards: Vec<Vec<u8>> = (0..data)
                .map(|i| {
                    let n = cuts[i] % (len + 1);
                    (0..n).map(|j| (j as u8).wrapping_mul(29) ^ seed ^ (i as u8)).collect()
                })
                .collect();
            let (got, want) = short_and_extended(&c, &shards, len, 0xa5);
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn wide_codes_encode_short_as_the_library_does() {
        // The property test stops at 16 data columns; a raidz vdev may
        // have up to 255 children, and codes of 2^k - 1 columns are all
        // XOR for raidz1.
        for data in [17usize, 31, 63, 127, 252, 253] {
            for parity in 1..=3 {
                let c = Codec::new(data, parity).unwrap();
                let len = 37;
                let shards: Vec<Vec<u8>> = (0..data)
                    .map(|i| {
                        let n = [len, len - 1, 0, 5, len][i % 5];
                        (0..n).map(|j| (i * 7 + j * 3 + 1) as u8).collect()
                    })
                    .collect();
                let (got, want) = short_and_extended(&c, &shards, len, 0x5a);
                assert_eq!(got, want, "{data}+{parity}");
                if parity == 1 {
                    let all_ones = c.rows[0].iter().all(|&x| x == 1);
                    assert_eq!(all_ones, (data + 1).is_power_of_two(), "{data}+1 XOR");
                }
            }
        }
    }

    #[test]
    fn encode_short_refuses_shards_that_do_not_fit() {
        let c = Codec::new(3, 1).unwrap();
        let mut p = [0u8; 4];
        // Too few data shards, and a data shard longer than the parity.
        assert!(c.encode_short(&[&[1], &[2]], &mut [&mut p[..]]).is_err());
        assert!(c
            .encode_short(&[&[1], &[2], &[0; 5]], &mut [&mut p[..]])
            .is_err());
    }

    #[test]
    fn xor_into_matches_bytewise_xor() {
        for len in [0, 1, 7, 8, 9, 63, 64, 65, 4096 + 3] {
            let a: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
            let b: Vec<u8> = (0..len).map(|i| (i * 13 + 5) as u8).collect();
            let mut got = a.clone();
            xor_into(&mut got, &b);
            let want: Vec<u8> = a.iter().zip(&b).map(|(x, y)| x ^ y).collect();
            assert_eq!(got, want, "len {len}");
        }
    }

    #[test]
    fn cache_rejects_zero_and_too_many() {
        let cache = CodecCache::new(2, 3);
        assert!(cache.get(0).is_err());
        assert!(cache.get(4).is_err());
        assert!(cache.get(3).is_ok());
    }
}
