//! The raidz layout and parity exactly as docs/format.md defines them
//! ("raidz parity"), recomputed here from the definition alone: GF(2^8)
//! arithmetic by shift-and-add, parity coefficients by the Lagrange
//! formula, column placement by the documented map. Nothing here calls the
//! vdev's own layout or parity code; the test writes blocks through the
//! vdev and compares every stored column byte for byte, so it fails if the
//! documentation and the on-disk format ever disagree.

mod common;

use std::sync::Arc;

use common::{mem_leaves, open};
use tarn_testkit::data::pattern;
use tarn_vdev::testing::MemLeaf;
use tarn_vdev::{Leaf, VdevKind, DATA_START};

/// The field's reducing polynomial x^8 + x^4 + x^3 + x^2 + 1.
const POLY: u16 = 0x11d;

/// Multiplication in GF(2^8): carry-less shift-and-add, reduced by `POLY`.
fn mul(a: u8, b: u8) -> u8 {
    let (mut a, mut b, mut r) = (u16::from(a), b, 0u16);
    while b != 0 {
        if b & 1 != 0 {
            r ^= a;
        }
        b >>= 1;
        a <<= 1;
        if a & 0x100 != 0 {
            a ^= POLY;
        }
    }
    r as u8
}

/// Multiplicative inverse: a^254 (the group of units has order 255).
fn inv(a: u8) -> u8 {
    assert_ne!(a, 0);
    let mut r = 1;
    for _ in 0..254 {
        r = mul(r, a);
    }
    r
}

/// Coefficient of data column `i` in parity column `j` of a stripe with
/// `k` data columns: the Lagrange basis polynomial of point i over the
/// points 0..k, evaluated at k + j (integers taken as field elements by
/// their binary representation, so subtraction is XOR).
fn coef(k: usize, j: usize, i: usize) -> u8 {
    let x = (k + j) as u8;
    let (mut num, mut den) = (1u8, 1u8);
    for m in (0..k).filter(|&m| m != i) {
        num = mul(num, x ^ m as u8);
        den = mul(den, i as u8 ^ m as u8);
    }
    mul(num, inv(den))
}

/// One column of the documented map: child, leaf offset, sectors.
struct Col {
    child: usize,
    leaf_off: u64,
    sectors: u64,
}

/// The column map of docs/format.md for a block of `psize` bytes at vdev
/// offset `off` on raidz-`p` of `n` children with sector size `s`.
fn columns(n: u64, p: u64, s: u64, off: u64, psize: u64) -> Vec<Col> {
    let b = off / s;
    let d = psize.div_ceil(s);
    let (q, r) = (d / (n - p), d % (n - p));
    let bc = if r > 0 { r + p } else { 0 };
    let cols = if q > 0 { n } else { bc };
    (0..cols)
        .map(|c| Col {
            child: ((b + c) % n) as usize,
            leaf_off: DATA_START + ((b + c) / n) * s,
            sectors: if c < bc { q + 1 } else { q },
        })
        .collect()
}

/// Parity columns computed from the definition: data split column after
/// column, each data column zero-extended to the first column's length.
fn parity_columns(data: &[u8], cols: &[Col], p: usize, s: u64) -> Vec<Vec<u8>> {
    let shard = (cols[0].sectors * s) as usize;
    let mut padded = data.to_vec();
    let total: u64 = cols[p..].iter().map(|c| c.sectors * s).sum();
    padded.resize(total as usize, 0);
    let mut shards = Vec::new();
    let mut pos = 0;
    for c in &cols[p..] {
        let len = (c.sectors * s) as usize;
        let mut d = padded[pos..pos + len].to_vec();
        d.resize(shard, 0);
        shards.push(d);
        pos += len;
    }
    let k = shards.len();
    (0..p)
        .map(|j| {
            let a: Vec<u8> = (0..k).map(|i| coef(k, j, i)).collect();
            (0..shard)
                .map(|t| (0..k).fold(0u8, |acc, i| acc ^ mul(a[i], shards[i][t])))
                .collect()
        })
        .collect()
}

fn read(leaves: &[Arc<MemLeaf>], c: &Col, s: u64) -> Vec<u8> {
    leaves[c.child].raw_read(c.leaf_off, (c.sectors * s) as usize)
}

#[test]
fn field_and_coefficients_match_the_documented_tables() {
    // Spot checks of the arithmetic and the tables printed in the docs.
    assert_eq!(mul(0x80, 2), 0x1d);
    assert_eq!(mul(3, 7), 9);
    assert!((1..=255u8).all(|a| mul(a, inv(a)) == 1));
    let rows = |k: usize| -> Vec<Vec<u8>> {
        (0..3)
            .map(|j| (0..k).map(|i| coef(k, j, i)).collect())
            .collect()
    };
    assert_eq!(rows(1), [[1], [1], [1]]);
    assert_eq!(rows(2), [[3, 2], [2, 3], [5, 4]]);
    assert_eq!(rows(3), [[1, 1, 1], [15, 8, 6], [14, 9, 6]]);
    assert_eq!(
        rows(4),
        [[27, 28, 18, 20], [28, 27, 20, 18], [18, 20, 27, 28]]
    );
    assert_eq!(
        rows(5),
        [[7, 7, 6, 6, 1], [9, 8, 9, 8, 1], [15, 14, 14, 15, 1]]
    );
}

#[test]
fn raidz_columns_are_the_documented_layout_and_parity() {
    let mut blocks = 0;
    for (width, parity, ashift) in [
        (3usize, 1usize, 9u8),
        (4, 1, 12),
        (5, 1, 9),
        (4, 2, 9),
        (6, 2, 12),
        (7, 2, 9),
        (5, 3, 9),
        (8, 3, 12),
        (12, 3, 9),
        (19, 2, 9),
    ] {
        let s = 1u64 << ashift;
        let leaves = mem_leaves(width);
        // Not zeros: the padding a column is written with must be told
        // apart from space never written.
        for l in &leaves {
            let size = l.size() as usize;
            l.write_at(&vec![0xff; size], 0).unwrap();
        }
        let v = open(
            VdevKind::Raidz {
                parity: parity as u8,
            },
            ashift,
            &leaves,
            &[],
        );
        let data_cols = (width - parity) as u64;
        // Less than a sector, one row exactly, a partial row, several full
        // rows, rows plus a remainder, an odd byte count.
        let sizes = [
            1,
            s - 1,
            s * data_cols,
            s * (data_cols - 1).max(1) + 5,
            s * data_cols * 3,
            s * data_cols * 2 + s * 2 + 17,
            70_001,
        ];
        let mut off = 0u64;
        for (i, &psize) in sizes.iter().enumerate() {
            // Stagger the start so the columns begin on every child.
            off += (i as u64 % width as u64 + 1) * v.alloc_align();
            let data = pattern(0x5eed + i as u64 * 31 + width as u64, psize as usize);
            v.write(off, &data).unwrap();
            let cols = columns(width as u64, parity as u64, s, off, psize);
            let want = parity_columns(&data, &cols, parity, s);
            for (j, c) in cols[..parity].iter().enumerate() {
                assert_eq!(
                    read(&leaves, c, s),
                    want[j],
                    "parity {j} of raidz{parity} width {width} psize {psize}"
                );
            }
            let mut stored = Vec::new();
            for c in &cols[parity..] {
                stored.extend(read(&leaves, c, s));
            }
            assert_eq!(stored[..data.len()], data[..]);
            assert!(stored[data.len()..].iter().all(|&x| x == 0));
            // The allocation's padding sectors (after the stored ones) are
            // never written: still as the devices were filled.
            let used: u64 = cols.iter().map(|c| c.sectors).sum();
            let alloc = v.alloc_size(psize) / s;
            assert_eq!(alloc % (parity as u64 + 1), 0);
            for l in off / s + used..off / s + alloc {
                let pad = Col {
                    child: (l % width as u64) as usize,
                    leaf_off: DATA_START + (l / width as u64) * s,
                    sectors: 1,
                };
                assert!(read(&leaves, &pad, s).iter().all(|&x| x == 0xff));
            }
            off += alloc * s;
            blocks += 1;
        }
    }
    assert_eq!(blocks, 70);
}
