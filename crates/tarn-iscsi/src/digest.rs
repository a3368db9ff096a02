//! The two digests the protocol needs: CRC32C (header and data digests,
//! RFC 7143 section 13.1) and MD5 (CHAP, RFC 1994, with the algorithm of
//! RFC 1321). Both are small enough to keep here rather than pull in a
//! crate for each.

use std::sync::OnceLock;

/// The reflected Castagnoli polynomial.
const CRC32C_POLY: u32 = 0x82F6_3B78;

fn crc_table() -> &'static [u32; 256] {
    static T: OnceLock<[u32; 256]> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ CRC32C_POLY
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    })
}

/// CRC32C of the concatenation of `parts` (initial value and final xor
/// all ones, as iSCSI uses it). On the wire it is sent little-endian.
pub fn crc32c(parts: &[&[u8]]) -> u32 {
    let t = crc_table();
    let mut c = !0u32;
    for p in parts {
        for &b in *p {
            c = t[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
        }
    }
    !c
}

fn md5_k() -> &'static [u32; 64] {
    static K: OnceLock<[u32; 64]> = OnceLock::new();
    K.get_or_init(|| {
        let mut k = [0u32; 64];
        for (i, e) in k.iter_mut().enumerate() {
            *e = (((i + 1) as f64).sin().abs() * 4_294_967_296.0) as u32;
        }
        k
    })
}

const MD5_S: [u32; 16] = [7, 12, 17, 22, 5, 9, 14, 20, 4, 11, 16, 23, 6, 10, 15, 21];

/// MD5 of the concatenation of `parts`.
pub fn md5(parts: &[&[u8]]) -> [u8; 16] {
    let k = md5_k();
    let mut msg: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    let bits = (msg.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bits.to_le_bytes());
    let mut h: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];
    for block in msg.chunks_exact(64) {
        let mut m = [0u32; 16];
        for (i, w) in m.iter_mut().enumerate() {
            *w = u32::from_le_bytes([
                block[4 * i],
                block[4 * i + 1],
                block[4 * i + 2],
                block[4 * i + 3],
            ]);
        }
        let [mut a, mut b, mut c, mut d] = h;
        for i in 0..64 {
            let (f, g) = match i / 16 {
                0 => ((b & c) | (!b & d), i),
                1 => ((d & b) | (!d & c), (5 * i + 1) % 16),
                2 => (b ^ c ^ d, (3 * i + 5) % 16),
                _ => (c ^ (b | !d), (7 * i) % 16),
            };
            let s = MD5_S[(i / 16) * 4 + i % 4];
            let t = d;
            d = c;
            c = b;
            b = b.wrapping_add(
                a.wrapping_add(f)
                    .wrapping_add(k[i])
                    .wrapping_add(m[g])
                    .rotate_left(s),
            );
            a = t;
        }
        h[0] = h[0].wrapping_add(a);
        h[1] = h[1].wrapping_add(b);
        h[2] = h[2].wrapping_add(c);
        h[3] = h[3].wrapping_add(d);
    }
    let mut out = [0u8; 16];
    for (i, w) in h.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn md5_matches_the_rfc_1321_test_suite() {
        let cases: [(&str, &str); 7] = [
            ("", "d41d8cd98f00b204e9800998ecf8427e"),
            ("a", "0cc175b9c0f1b6a831c399e269772661"),
            ("abc", "900150983cd24fb0d6963f7d28e17f72"),
            ("message digest", "f96b697d7cb7938d525a2f31aaf161d0"),
            (
                "abcdefghijklmnopqrstuvwxyz",
                "c3fcd3d76192e4007dfb496cca67e13b",
            ),
            (
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                "d174ab98d277d9f5a5611c2c9f419d9f",
            ),
            (
                "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "57edf4a22be3c955ac49da2e2107b67a",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(hex(&md5(&[input.as_bytes()])), want, "{input:?}");
        }
        // Split input hashes as the whole.
        assert_eq!(md5(&[b"mess", b"age digest"]), md5(&[b"message digest"]));
    }

    #[test]
    fn crc32c_known_values() {
        assert_eq!(crc32c(&[b"123456789"]), 0xE306_9283);
        // RFC 7143 appendix B.4: 32 bytes of zeros, of 0xff, ascending.
        assert_eq!(crc32c(&[&[0u8; 32]]), 0x8A91_36AA);
        assert_eq!(crc32c(&[&[0xffu8; 32]]), 0x62A8_AB43);
        let asc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&[&asc]), 0x46DD_794E);
        assert_eq!(crc32c(&[&asc[..5], &asc[5..]]), 0x46DD_794E);
    }
}
