//! Reading sealed blocks through the pipeline: the tag is checked after
//! the checksum, so a pointer whose encryption fields or bound sizes were
//! changed (its checksum still matching the stored bytes) reads as an
//! error, never as data; without the key, or with a revoked one, nothing
//! is opened.

use std::sync::Arc;

use tarn_block::pipeline::{make_ptr, prepare_sealed, read_block, write_copies};
use tarn_block::{BlockError, BlockType, ChecksumAlg, Cipher, Compression, Dva, KeySet};
use tarn_vdev::testing::MemLeaf;
use tarn_vdev::{Leaf, LeafConfig, TopConfig, TopVdev, VdevKind, MIN_LEAF_SIZE};

fn vdev() -> Vec<Arc<TopVdev>> {
    let config = TopConfig {
        kind: VdevKind::Single,
        guid: 1,
        children: vec![LeafConfig {
            guid: 2,
            path: "mem:0".into(),
            offline: false,
        }],
    };
    let leaf: Arc<dyn Leaf> = Arc::new(MemLeaf::new(MIN_LEAF_SIZE));
    vec![Arc::new(
        TopVdev::open(&config, 12, vec![Some(leaf)]).unwrap(),
    )]
}

#[test]
fn a_changed_pointer_of_a_sealed_block_is_an_error_never_data() {
    let tops = vdev();
    let key = KeySet::new(Cipher::Aes256Gcm, [4; 32]);
    let data: Vec<u8> = b"the plaintext of a sealed block ".repeat(300);
    let p = prepare_sealed(
        &data,
        Compression::Lz4,
        ChecksumAlg::Blake3,
        Some(&key),
        BlockType::Data,
    )
    .unwrap();
    assert!(
        p.stored.windows(8).all(|w| w != &data[..8]),
        "stored sealed"
    );
    let dva = Dva {
        vdev: 0,
        asize: tops[0].alloc_size(p.stored.len() as u64) as u32,
        offset: 0,
    };
    write_copies(&tops, &[dva], &p.stored).unwrap();
    let bp = make_ptr(&p, &[dva], 5, BlockType::Data, 0);
    assert!(bp.is_encrypted());
    assert_eq!(read_block(&tops, &bp, Some(&key)).unwrap(), data);
    // Without the key: refused, not the ciphertext.
    assert!(matches!(
        read_block(&tops, &bp, None),
        Err(BlockError::KeyUnavailable(_))
    ));
    // Another key, a changed tag, nonce or salt, a changed logical size:
    // the checksum still matches the stored bytes, the tag does not.
    let other = KeySet::new(Cipher::Aes256Gcm, [5; 32]);
    assert!(matches!(
        read_block(&tops, &bp, Some(&other)),
        Err(BlockError::Crypto(_))
    ));
    let mut changed = Vec::new();
    let mut b = bp;
    b.mac[3] ^= 1;
    changed.push(b);
    let mut b = bp;
    b.iv[0] ^= 1;
    changed.push(b);
    let mut b = bp;
    b.salt[7] ^= 1;
    changed.push(b);
    let mut b = bp;
    b.lsize += 1;
    changed.push(b);
    for b in changed {
        assert!(
            matches!(
                read_block(&tops, &b, Some(&key)),
                Err(BlockError::Crypto(_))
            ),
            "{b:?}"
        );
    }
    // A revoked key opens nothing.
    key.revoke();
    assert!(read_block(&tops, &bp, Some(&key)).is_err());
    assert!(key.seal_value(b"k", b"v").is_err());
}
