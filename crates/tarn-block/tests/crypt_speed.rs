//! One core's encryption throughput: the limit an encrypted dataset's
//! reads and writes meet (`scripts/bench-crypt.sh` prints it beside its
//! table). A measurement, not a test: ignored unless asked for, and it
//! fails on nothing but a wrong round trip.
//!
//! `cargo test --release -p tarn-block --test crypt_speed -- --ignored --nocapture`

use std::time::Instant;

use tarn_block::{BlockPtr, BlockType, Cipher, CompressAlg, KeySet};

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn seal_and_open_throughput() {
    for cipher in [
        Cipher::Aes256Gcm,
        Cipher::Aes128Gcm,
        Cipher::ChaCha20Poly1305,
    ] {
        let k = KeySet::new(cipher, [9; 32]);
        for size in [128usize << 10, 1 << 20] {
            let total = 2usize << 30;
            let n = total / size;
            let mut buf = vec![0x5au8; size];
            let t0 = Instant::now();
            let mut last = None;
            for _ in 0..n {
                last = Some(
                    k.seal_block(BlockType::Data, CompressAlg::Off, size as u32, &mut buf)
                        .unwrap(),
                );
            }
            let seal = total as f64 / t0.elapsed().as_secs_f64() / 1e9;
            let s = last.unwrap();
            let bp = BlockPtr {
                btype: BlockType::Data,
                compress: CompressAlg::Off,
                lsize: size as u32,
                psize: size as u32,
                flags: 1,
                salt: s.salt,
                iv: s.iv,
                mac: s.mac,
                ..Default::default()
            };
            let sealed = buf.clone();
            let t0 = Instant::now();
            for _ in 0..n {
                buf.copy_from_slice(&sealed);
                k.open_block(&bp, &mut buf).unwrap();
            }
            let open = total as f64 / t0.elapsed().as_secs_f64() / 1e9;
            println!(
                "{:18} {:>5} KiB blocks: seal {seal:.2} GB/s, open {open:.2} GB/s (one core)",
                cipher.name(),
                size >> 10
            );
        }
    }
}
