//! `Fs::read_data`, the read that hands out ranges of cached blocks
//! instead of a fresh buffer, returns exactly the file's bytes: random
//! offsets and sizes across record boundaries, holes (never written and
//! punched), short last blocks, tails past the end, on a real dataset,
//! both while the blocks are in the open txg and once committed (shared
//! with the block cache); also taken as owned parts. The files are written
//! with `Fs::write` and `Fs::write_iov` (the payload cut into random
//! slices, empty ones too), which must store the same bytes.

use std::sync::Arc;

use proptest::prelude::*;
use tarn_fs::{Cred, ReadData, ROOT_INO};
use tarn_testkit::data::{cases, Rng};
use tarn_testkit::datasets::{filesystem, DsFs};
use tarn_testkit::pools::tank;
use tarn_vdev::VdevKind;

/// A file made by random writes, punches and a final size change, and its
/// expected bytes.
fn random_file(fs: &DsFs, name: &str, rng: &mut Rng) -> (u64, Vec<u8>) {
    let c = Cred::root();
    let a = fs
        .create(ROOT_INO, name.as_bytes(), 0o644, 0, libc::O_CREAT, &c)
        .unwrap();
    let mut model: Vec<u8> = Vec::new();
    for _ in 0..rng.range(1, 12) {
        let off = rng.below(1 << 20);
        let len = rng.range(1, 200 << 10) as usize;
        let data = rng.bytes(len);
        if rng.chance(0.5) {
            fs.write(a.ino, off, &data, false, &c).unwrap();
        } else {
            let mut cuts: Vec<usize> = (0..rng.below(6))
                .map(|_| rng.below(len as u64 + 1) as usize)
                .collect();
            cuts.extend([0, len]);
            cuts.sort_unstable();
            let iov: Vec<&[u8]> = cuts.windows(2).map(|w| &data[w[0]..w[1]]).collect();
            assert_eq!(fs.write_iov(a.ino, off, &iov, false, &c).unwrap(), len);
        }
        let end = off as usize + len;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[off as usize..end].copy_from_slice(&data);
        if rng.chance(0.3) && !model.is_empty() {
            let off = rng.below(model.len() as u64);
            let len = rng.range(1, 300 << 10);
            fs.fallocate(
                a.ino,
                off,
                len,
                libc::FALLOC_FL_PUNCH_HOLE as u32 | libc::FALLOC_FL_KEEP_SIZE as u32,
                &c,
            )
            .unwrap();
            let end = (off + len).min(model.len() as u64) as usize;
            model[off as usize..end].fill(0);
        }
    }
    if rng.chance(0.3) {
        let size = rng.below(model.len() as u64 + (100 << 10));
        let set = tarn_fs::SetAttr {
            size: Some(size),
            ..Default::default()
        };
        fs.setattr(a.ino, &set, &c).unwrap();
        model.resize(size as usize, 0);
    }
    fs.release(a.ino).unwrap();
    (a.ino, model)
}

/// Every way of taking the bytes out of `d` gives the same bytes.
fn check(d: &ReadData, want: &[u8], what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(d.len(), want.len(), "{}: len", what);
    prop_assert_eq!(d.is_empty(), want.is_empty());
    let mut joined = Vec::new();
    for s in d.slices() {
        joined.extend_from_slice(s);
    }
    prop_assert!(joined == want, "{}: slices differ", what);
    prop_assert!(d.to_vec() == want, "{}: to_vec differs", what);
    Ok(())
}

fn reads(
    fs: &Arc<DsFs>,
    ino: u64,
    model: &[u8],
    rng: &mut Rng,
    what: &str,
) -> Result<(), TestCaseError> {
    let size = model.len() as u64;
    for _ in 0..40 {
        // Around record boundaries (4K and 128K), the end, and anywhere.
        let off = match rng.below(4) {
            0 => (rng.below(12) * (128 << 10)).saturating_sub(rng.below(3)),
            1 => size.saturating_sub(rng.below(5000)),
            2 => size + rng.below(3),
            _ => rng.below(size + 1),
        };
        let len = match rng.below(3) {
            0 => rng.range(0, 5),
            1 => rng.range(4096, 300 << 10),
            _ => 1 << 20,
        } as u32;
        let end = (off.saturating_add(u64::from(len))).min(size);
        let want = if off < size {
            &model[off as usize..end as usize]
        } else {
            &[][..]
        };
        let d = fs.read_data(ino, off, len).unwrap();
        check(&d, want, &format!("{what}: read {len} at {off}"))?;
        let mut joined = Vec::new();
        for p in d.into_parts() {
            let b = p.as_ref();
            prop_assert!(
                !b.is_empty() && b.len() <= 1 << 20,
                "{}: a part of {} bytes",
                what,
                b.len()
            );
            joined.extend_from_slice(b);
        }
        prop_assert!(joined == want, "{}: the owned parts differ", what);
        // The face the front ends hold gives the same.
        let d = tarn_fs::DynFs::read_data(&**fs, ino, off, len).unwrap();
        check(&d, want, what)?;
        prop_assert!(fs.read(ino, off, len).unwrap() == want);
    }
    Ok(())
}

proptest! {
    #![proptest_config(cases(6))]
    #[test]
    fn read_data_returns_exactly_the_bytes(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let dir = tempfile::tempdir().unwrap();
        let pool = tank(dir.path(), VdevKind::Single, 1, 256 << 20);
        // A small record size and the default, so reads cross many records.
        let small = Arc::new(filesystem(&pool, "tank/small", &[("recordsize", "4K")]));
        let big = Arc::new(filesystem(&pool, "tank/big", &[]));
        let mut files = Vec::new();
        for (i, fs) in [&small, &big].into_iter().enumerate() {
            for j in 0..2 {
                let (ino, model) = random_file(fs, &format!("f{j}"), &mut rng);
                files.push((fs.clone(), ino, model, format!("fs {i} file {j}")));
            }
        }
        // In the open txg, then committed (and cached once read).
        for (fs, ino, model, what) in &files {
            reads(fs, *ino, model, &mut rng, &format!("{what}, open txg"))?;
        }
        pool.sync().unwrap();
        for pass in 0..2 {
            for (fs, ino, model, what) in &files {
                reads(fs, *ino, model, &mut rng, &format!("{what}, committed, pass {pass}"))?;
            }
        }
    }
}

/// Writes that would end past the largest file size (a client's offset
/// near 2^64) fail with EFBIG, with or without a record to patch before
/// them and whatever the record size, and change nothing.
#[test]
fn writes_past_the_largest_file_size_are_efbig() {
    let dir = tempfile::tempdir().unwrap();
    let pool = tank(dir.path(), VdevKind::Single, 1, 64 << 20);
    let c = Cred::root();
    for (name, props) in [
        ("tank/r4", vec![("recordsize", "4K")]),
        ("tank/r128", vec![]),
    ] {
        let fs = filesystem(&pool, name, &props);
        let a = fs
            .create(ROOT_INO, b"f", 0o644, 0, libc::O_CREAT, &c)
            .unwrap();
        fs.write(a.ino, 0, b"kept", false, &c).unwrap();
        for off in [
            u64::MAX,
            u64::MAX - 3,
            u64::MAX - (128 << 10),
            (i64::MAX as u64) - 2,
        ] {
            let e = fs.write(a.ino, off, b"xyz!", false, &c).unwrap_err();
            assert_eq!(e.errno(), libc::EFBIG, "{name} at {off:#x}");
            let e = fs
                .write_iov(a.ino, off, &[b"xy", b"z!"], false, &c)
                .unwrap_err();
            assert_eq!(e.errno(), libc::EFBIG, "{name} at {off:#x}");
        }
        assert_eq!(fs.getattr(a.ino).unwrap().size, 4);
    }
}
