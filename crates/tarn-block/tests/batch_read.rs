//! Reading many blocks at once (`pipeline::read_blocks`) against reading
//! them one by one (`read_block`): the same bytes or the same kind of
//! error for every block, with two copies on two devices, compressed and
//! sealed blocks, damaged first copies, a key missing.

use std::sync::Arc;

use proptest::prelude::*;
use tarn_block::pipeline::{make_ptr, prepare_sealed, read_block, read_blocks, write_copies};
use tarn_block::{BlockPtr, BlockType, ChecksumAlg, Cipher, Compression, Dva, KeySet};
use tarn_vdev::testing::MemLeaf;
use tarn_vdev::{Leaf, LeafConfig, TopConfig, TopVdev, VdevKind, DATA_START, MIN_LEAF_SIZE};

fn single(guid: u64) -> (Arc<TopVdev>, Arc<MemLeaf>) {
    let config = TopConfig {
        kind: VdevKind::Single,
        guid,
        children: vec![LeafConfig {
            guid: guid + 100,
            path: format!("mem:{guid}").into(),
            offline: false,
        }],
    };
    let leaf = Arc::new(MemLeaf::new(MIN_LEAF_SIZE));
    let dyn_leaf: Arc<dyn Leaf> = leaf.clone();
    (
        Arc::new(TopVdev::open(&config, 12, vec![Some(dyn_leaf)]).unwrap()),
        leaf,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn read_blocks_is_read_block_one_by_one(
        blocks in proptest::collection::vec(
            (1usize..40_000, any::<bool>(), any::<bool>(), any::<bool>()), 1..24),
        with_key in any::<bool>(),
    ) {
        let (t0, l0) = single(1);
        let (t1, _l1) = single(2);
        let tops = vec![t0.clone(), t1.clone()];
        let key = KeySet::new(Cipher::Aes256Gcm, [7; 32]);
        let mut at = [0u64, 0u64];
        let mut bps: Vec<BlockPtr> = Vec::new();
        let mut damaged = Vec::new();
        for (i, &(len, compress, sealed, damage)) in blocks.iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|k| ((k / 64) as u8).wrapping_add(i as u8)).collect();
            let p = prepare_sealed(
                &data,
                if compress { Compression::Lz4 } else { Compression::Off },
                ChecksumAlg::Blake3,
                sealed.then_some(&key),
                BlockType::Data,
            )
            .unwrap();
            let mut dvas = Vec::new();
            for v in 0..2 {
                let asize = tops[v].alloc_size(p.stored.len() as u64);
                dvas.push(Dva { vdev: v as u32, asize: asize as u32, offset: at[v] });
                at[v] += asize;
            }
            write_copies(&tops, &dvas, &p.stored).unwrap();
            if damage {
                // The first copy no longer verifies: the second is read.
                l0.corrupt(DATA_START + dvas[0].offset, 64);
                damaged.push(i);
            }
            bps.push(make_ptr(&p, &dvas, 5, BlockType::Data, 0));
        }
        let k = with_key.then_some(&key);
        let kind = |r: Result<&[u8], &tarn_block::BlockError>| match r {
            Ok(v) => Ok(v.to_vec()),
            Err(e) => Err(std::mem::discriminant(e)),
        };
        let one: Vec<_> = bps
            .iter()
            .map(|bp| kind(read_block(&tops, bp, k).as_deref()))
            .collect();
        let refs: Vec<&BlockPtr> = bps.iter().collect();
        let many: Vec<_> = read_blocks(&tops, &refs, k)
            .iter()
            .map(|r| kind(r.as_deref()))
            .collect();
        prop_assert_eq!(&one, &many);
        for (i, r) in many.iter().enumerate() {
            let sealed = blocks[i].2;
            // A key reads sealed blocks only: an unsealed block read with a
            // key is a downgrade (tampering), not data.
            prop_assert_eq!(r.is_ok(), sealed == with_key, "block {} (damaged: {})", i, damaged.contains(&i));
        }
    }
}
