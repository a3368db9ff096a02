//! Directory listings with attributes on a real pool: every page of
//! `readdirplus` gives each entry the attributes `getattr` gives it, while
//! inodes change in the open txg, in synced txgs and in an encrypted
//! dataset. A page's inodes are read in one ordered pass over the tree
//! (`Tx::peek_many`), beside the open txg's overlays: a lookup that missed
//! an overlay, or matched an inode to the wrong entry, shows here.

use proptest::prelude::*;
use tarn_fs::{Cred, SetAttr, ROOT_INO};
use tarn_pool::Pool;
use tarn_testkit::datasets::{encrypted, filesystem, mount, DsFs};
use tarn_testkit::pools::tank;
use tarn_vdev::VdevKind;

#[derive(Clone, Debug)]
enum Op {
    /// Creates `f{i}` with `len` bytes.
    Create(u8, u16),
    /// Makes directory `d{i}`.
    Mkdir(u8),
    /// Links `f{i}` again as `l{j}`.
    Link(u8, u8),
    /// Removes `f{i}`.
    Unlink(u8),
    /// Sets `f{i}`'s mode and size.
    Change(u8, u16, u16),
    /// Ends the txg: what follows is over a committed tree.
    Sync,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..48, 0u16..3000).prop_map(|(i, n)| Op::Create(i, n)),
        1 => (0u8..8).prop_map(Op::Mkdir),
        2 => (0u8..48, 0u8..8).prop_map(|(i, j)| Op::Link(i, j)),
        2 => (0u8..48).prop_map(Op::Unlink),
        3 => (0u8..48, 0u16..0o777, 0u16..5000).prop_map(|(i, m, s)| Op::Change(i, m, s)),
        2 => Just(Op::Sync),
    ]
}

fn root() -> Cred {
    Cred::root()
}

fn apply(pool: &Pool, fs: &DsFs, op: &Op) {
    let ino_of = |name: &str| fs.lookup(ROOT_INO, name.as_bytes(), &root()).map(|a| a.ino);
    // Failures (a name that exists or not) are part of the game: only the
    // listing is checked.
    match op {
        Op::Create(i, len) => {
            let name = format!("f{i}");
            if let Ok(a) = fs.create(
                ROOT_INO,
                name.as_bytes(),
                libc::S_IFREG | 0o644,
                0,
                libc::O_RDWR,
                &root(),
            ) {
                let data = vec![*i | 1; usize::from(*len)];
                fs.write(a.ino, 0, &data, false, &root()).unwrap();
                fs.release(a.ino).unwrap();
            }
        }
        Op::Mkdir(i) => {
            let _ = fs.mkdir(ROOT_INO, format!("d{i}").as_bytes(), 0o755, 0, &root());
        }
        Op::Link(i, j) => {
            if let Ok(ino) = ino_of(&format!("f{i}")) {
                let _ = fs.link(ino, ROOT_INO, format!("l{j}").as_bytes(), &root());
            }
        }
        Op::Unlink(i) => {
            let _ = fs.unlink(ROOT_INO, format!("f{i}").as_bytes(), &root());
        }
        Op::Change(i, mode, size) => {
            if let Ok(ino) = ino_of(&format!("f{i}")) {
                let sa = SetAttr {
                    mode: Some(u32::from(*mode)),
                    size: Some(u64::from(*size)),
                    ..SetAttr::default()
                };
                fs.setattr(ino, &sa, &root()).unwrap();
            }
        }
        Op::Sync => {
            pool.sync().unwrap();
        }
    }
}

/// Lists the root in pages of `page` entries and checks each entry's
/// attributes against `getattr`; returns the names listed.
fn check_listing(fs: &DsFs, page: usize) -> Vec<Vec<u8>> {
    let mut names = Vec::new();
    let mut cookie = 0;
    loop {
        let got = fs.readdirplus(ROOT_INO, cookie, page).unwrap();
        for (e, a) in &got {
            assert_eq!(e.ino, a.ino, "entry {:?}", String::from_utf8_lossy(&e.name));
            if e.name != b"." && e.name != b".." {
                assert_eq!(a, &fs.getattr(e.ino).unwrap(), "attributes of {:?}", e.name);
            }
            names.push(e.name.clone());
            cookie = e.cookie;
        }
        if got.len() < page {
            return names;
        }
    }
}

fn run(ops: &[Op], page: usize, sealed: bool) {
    let dir = tempfile::tempdir().unwrap();
    let pool = tank(dir.path(), VdevKind::Single, 1, 64 << 20);
    let fs = if sealed {
        encrypted(&pool, "tank/fs", "correct horse", &[]);
        mount(&pool, "tank/fs")
    } else {
        filesystem(&pool, "tank/fs", &[])
    };
    for (n, op) in ops.iter().enumerate() {
        apply(&pool, &fs, op);
        if n % 8 == 7 {
            check_listing(&fs, page);
        }
    }
    let names = check_listing(&fs, page);
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "every entry once");
    // After a sync every inode comes from the committed tree.
    pool.sync().unwrap();
    assert_eq!(check_listing(&fs, page).len(), names.len());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn listed_attributes_are_getattrs(
        ops in prop::collection::vec(op(), 1..80),
        page in 1usize..40,
        sealed in any::<bool>(),
    ) {
        run(&ops, page, sealed);
    }
}
