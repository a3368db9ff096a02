//! Block checksums: 256 bits, computed over the stored bytes.

use crate::bp::ChecksumAlg;

/// Computes the 256-bit checksum of `data` with `alg`. XXH3-128 is
/// zero-extended so every pointer carries the same 32-byte field.
pub fn checksum(alg: ChecksumAlg, data: &[u8]) -> [u8; 32] {
    match alg {
        ChecksumAlg::Blake3 => *blake3::hash(data).as_bytes(),
        ChecksumAlg::Xxh3 => {
            let h = xxhash_rust::xxh3::xxh3_128(data);
            let mut out = [0u8; 32];
            out[..16].copy_from_slice(&h.to_le_bytes());
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithms_differ_and_detect_a_flip() {
        let mut data = vec![7u8; 4096];
        for alg in [ChecksumAlg::Blake3, ChecksumAlg::Xxh3] {
            let a = checksum(alg, &data);
            data[100] ^= 1;
            assert_ne!(a, checksum(alg, &data), "{alg:?} missed a bit flip");
            data[100] ^= 1;
            assert_eq!(a, checksum(alg, &data));
        }
        assert_ne!(
            checksum(ChecksumAlg::Blake3, &data),
            checksum(ChecksumAlg::Xxh3, &data)
        );
    }

    #[test]
    fn blake3_matches_reference_vector() {
        // BLAKE3 of the empty input, from the BLAKE3 specification.
        let h = checksum(ChecksumAlg::Blake3, b"");
        assert_eq!(h[..4], [0xaf, 0x13, 0x49, 0xb9]);
    }
}
