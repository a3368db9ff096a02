//! File handles: 36 opaque bytes.
//!
//! | bytes | field |
//! |---|---|
//! | 0 | version (1) |
//! | 1..4 | reserved, zero |
//! | 4..12 | dataset (or snapshot) guid, big-endian |
//! | 12..20 | inode number |
//! | 20..28 | generation |
//! | 28..36 | first 8 bytes of keyed BLAKE3 over bytes 0..28 |
//!
//! Everything in a handle is stable data of the filesystem, so the same
//! dataset gives the same handles after a restart. The MAC (keyed with the
//! server's handle key) rejects handles a client forged or mangled before
//! any filesystem lookup; it is not a secret-keeping mechanism: AUTH_SYS
//! is trusted anyway, and the export's client list is the access control.

use tarn_fs::FileHandle;

/// Length of every handle this server issues.
pub const HANDLE_LEN: usize = 36;
const VERSION: u8 = 1;

fn mac(key: &[u8; 32], body: &[u8]) -> [u8; 8] {
    let h = blake3::keyed_hash(key, body);
    let mut out = [0u8; 8];
    out.copy_from_slice(&h.as_bytes()[..8]);
    out
}

/// Encodes `h` as opaque handle bytes.
pub fn encode(key: &[u8; 32], h: &FileHandle) -> [u8; HANDLE_LEN] {
    let mut b = [0u8; HANDLE_LEN];
    b[0] = VERSION;
    b[4..12].copy_from_slice(&h.dataset.to_be_bytes());
    b[12..20].copy_from_slice(&h.ino.to_be_bytes());
    b[20..28].copy_from_slice(&h.generation.to_be_bytes());
    let m = mac(key, &b[..28]);
    b[28..].copy_from_slice(&m);
    b
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_be_bytes(a)
}

/// Decodes handle bytes; None for a wrong length, version or MAC
/// (NFS3ERR_BADHANDLE).
pub fn decode(key: &[u8; 32], b: &[u8]) -> Option<FileHandle> {
    if b.len() != HANDLE_LEN || b[0] != VERSION || b[1..4] != [0, 0, 0] {
        return None;
    }
    let m = mac(key, &b[..28]);
    // Not secret-dependent timing in any meaningful way, but compare all.
    if m.iter()
        .zip(&b[28..])
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        != 0
    {
        return None;
    }
    Some(FileHandle {
        dataset: be64(&b[4..12]),
        ino: be64(&b[12..20]),
        generation: be64(&b[20..28]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(d in any::<u64>(), i in any::<u64>(), g in any::<u64>(), k in any::<[u8; 32]>()) {
            let h = FileHandle { dataset: d, ino: i, generation: g };
            let b = encode(&k, &h);
            prop_assert_eq!(decode(&k, &b), Some(h));
        }

        #[test]
        fn any_flip_is_rejected(pos in 0usize..HANDLE_LEN, bit in 0u8..8) {
            let k = [3u8; 32];
            let h = FileHandle { dataset: 1, ino: 2, generation: 3 };
            let mut b = encode(&k, &h);
            b[pos] ^= 1 << bit;
            prop_assert_eq!(decode(&k, &b), None);
        }
    }

    #[test]
    fn wrong_key_or_length() {
        let h = FileHandle {
            dataset: 1,
            ino: 2,
            generation: 3,
        };
        let b = encode(&[1; 32], &h);
        assert_eq!(decode(&[2; 32], &b), None);
        assert_eq!(decode(&[1; 32], &b[..35]), None);
    }
}
