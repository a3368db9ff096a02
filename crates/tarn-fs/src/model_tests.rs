//! Model-based test: random operation sequences against a plain in-memory
//! model of the tree; after every step every listing and every file's
//! bytes (live, through open handles, and through `.snapshot/<name>/`) must
//! match, and at the end no inode or byte may have leaked. The same model
//! runs on [`MemBackend`] and on a real pool and dataset
//! ([`DatasetBackend`]) through the small [`Harness`] trait.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tarn_pool::{Pool, PoolOptions, VdevSpec};

use crate::testing::MemBackend;
use crate::*;

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MEnt {
    Dir(usize),
    File(usize),
}

#[derive(Clone, Debug, Default)]
struct Model {
    /// Directory id → entries; 0 is the root.
    dirs: BTreeMap<usize, BTreeMap<String, MEnt>>,
    /// File id → contents (kept even when unlinked: handles may read it).
    files: BTreeMap<usize, Vec<u8>>,
    next: usize,
}

impl Model {
    fn new() -> Self {
        let mut m = Model::default();
        m.dirs.insert(0, BTreeMap::new());
        m.next = 1;
        m
    }
    /// Every directory reachable from the root: (id, path), DFS order.
    fn all_dirs(&self) -> Vec<(usize, Vec<String>)> {
        let mut out = vec![(0, Vec::new())];
        let mut i = 0;
        while i < out.len() {
            let (d, path) = out[i].clone();
            for (name, e) in &self.dirs[&d] {
                if let MEnt::Dir(c) = e {
                    let mut p = path.clone();
                    p.push(name.clone());
                    out.push((*c, p));
                }
            }
            i += 1;
        }
        out
    }
    /// Every entry: (parent id, parent path, name, entry).
    fn all_entries(&self) -> Vec<(usize, Vec<String>, String, MEnt)> {
        let mut out = Vec::new();
        for (d, path) in self.all_dirs() {
            for (name, e) in &self.dirs[&d] {
                out.push((d, path.clone(), name.clone(), *e));
            }
        }
        out
    }
    fn links(&self, fid: usize) -> u32 {
        self.dirs
            .values()
            .flat_map(|m| m.values())
            .filter(|e| **e == MEnt::File(fid))
            .count() as u32
    }
    /// Is directory `anc` equal to `d` or an ancestor of it?
    fn dir_contains(&self, anc: usize, d: usize) -> bool {
        let mut stack = vec![anc];
        while let Some(x) = stack.pop() {
            if x == d {
                return true;
            }
            for e in self.dirs[&x].values() {
                if let MEnt::Dir(c) = e {
                    stack.push(*c);
                }
            }
        }
        false
    }
}

#[derive(Clone, Debug)]
enum Op {
    Create(usize, usize),
    Mkdir(usize, usize),
    Write(usize, u32, u32, u8),
    Truncate(usize, u32),
    Rename(usize, usize, usize, u8),
    Link(usize, usize, usize),
    Unlink(usize),
    Rmdir(usize),
    Open(usize),
    ReleaseAll,
    Snapshot,
    /// Back to the newest snapshot (the model becomes its model).
    Rollback,
    Restart,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let i = || 0usize..64;
    prop_oneof![
        5 => (i(), 0usize..4).prop_map(|(d, n)| Op::Create(d, n)),
        3 => (i(), 0usize..4).prop_map(|(d, n)| Op::Mkdir(d, n)),
        5 => (i(), any::<u32>(), any::<u32>(), any::<u8>())
            .prop_map(|(f, o, l, b)| Op::Write(f, o, l, b)),
        2 => (i(), any::<u32>()).prop_map(|(f, s)| Op::Truncate(f, s)),
        3 => (i(), i(), 0usize..4, 0u8..4).prop_map(|(s, d, n, f)| Op::Rename(s, d, n, f)),
        1 => (i(), i(), 0usize..4).prop_map(|(f, d, n)| Op::Link(f, d, n)),
        2 => i().prop_map(Op::Unlink),
        1 => i().prop_map(Op::Rmdir),
        1 => i().prop_map(Op::Open),
        1 => Just(Op::ReleaseAll),
        1 => Just(Op::Snapshot),
        1 => Just(Op::Rollback),
        1 => Just(Op::Restart),
    ]
}

/// What the model test needs below the filesystem: snapshots, rollback,
/// restarts and leak checks. The world drops its `Fs` before `restart` and
/// `rollback_to_latest`, and mounts a fresh one after.
trait Harness {
    type B: Backend;
    /// The live dataset.
    fn backend(&self) -> Arc<Self::B>;
    fn snapshot(&mut self, name: &str);
    /// Rolls back to the newest snapshot; false when there is none.
    fn rollback_to_latest(&mut self) -> bool;
    /// Stops and starts everything below the filesystem.
    fn restart(&mut self) -> Arc<Self::B>;
    /// No handle is open and `reachable_inodes` inodes (root included) are
    /// reachable: nothing else may be stored.
    fn check_no_leaks(&mut self, reachable_inodes: usize);
    fn destroy_snapshots(&mut self);
    /// Only the empty root is left and no snapshot: the space used must be
    /// exactly what the freshly formatted filesystem used.
    fn check_empty(&mut self);
}

/// The in-memory backend; a restart keeps its state (only the `Fs` goes).
struct MemHarness {
    b: Arc<MemBackend>,
    snaps: Vec<String>,
    base_used: u64,
}

impl MemHarness {
    fn new(rs: u32) -> Self {
        let b = MemBackend::new();
        b.set_recordsize(rs);
        drop(Fs::mount(b.clone()).unwrap());
        let base_used = b.used();
        MemHarness {
            b,
            snaps: Vec::new(),
            base_used,
        }
    }
}

impl Harness for MemHarness {
    type B = MemBackend;
    fn backend(&self) -> Arc<MemBackend> {
        self.b.clone()
    }
    fn snapshot(&mut self, name: &str) {
        self.b.snapshot(name).unwrap();
        self.snaps.push(name.to_string());
    }
    fn rollback_to_latest(&mut self) -> bool {
        let Some(last) = self.snaps.last() else {
            return false;
        };
        self.b.rollback(last).unwrap();
        true
    }
    fn restart(&mut self) -> Arc<MemBackend> {
        self.b.clone()
    }
    fn check_no_leaks(&mut self, reachable_inodes: usize) {
        let dump = self.b.dump();
        let inodes = dump
            .keys()
            .filter(|k| k.len() == 9 && k[8] == 0x01 && k[..8] != [0u8; 8])
            .count();
        assert_eq!(inodes, reachable_inodes, "stored inodes vs reachable");
        let orphans = dump
            .keys()
            .filter(|k| k.len() == 17 && k[..8] == [0u8; 8] && k[8] == 0x05)
            .count();
        assert_eq!(orphans, 0);
    }
    fn destroy_snapshots(&mut self) {
        for n in self.snaps.drain(..) {
            assert!(self.b.destroy_snapshot(&n));
        }
    }
    fn check_empty(&mut self) {
        assert_eq!(self.b.used(), self.base_used, "bytes stored when empty");
    }
}

const FS: &str = "tank/fs";

fn pool_opts() -> PoolOptions {
    PoolOptions {
        sync_interval: Duration::from_secs(3600),
        owner: "test".into(),
        ..Default::default()
    }
}

/// Space figures of `tank/fs` and the pool: (used, available, referenced,
/// pool allocated).
fn pool_space(pool: &Pool) -> (u64, u64, u64, u64) {
    for _ in 0..3 {
        pool.sync().unwrap(); // frees are deferred by two txgs
    }
    let i = tarn_dataset::list(pool, true)
        .unwrap()
        .into_iter()
        .find(|i| i.name == FS)
        .unwrap();
    (i.used, i.available.unwrap(), i.referenced, pool.space().1)
}

/// A real pool (raidz1 of four sparse 64 MiB files) holding `tank/fs`; a
/// restart exports the pool and imports it again.
struct PoolHarness {
    dir: tempfile::TempDir,
    pool: Option<Arc<Pool>>,
    b: Option<Arc<DatasetBackend>>,
    snaps: Vec<String>,
    base: (u64, u64, u64, u64),
}

impl PoolHarness {
    fn new(rs: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let devices: Vec<PathBuf> = (0..4)
            .map(|i| {
                let p = dir.path().join(format!("d{i}"));
                std::fs::File::create(&p)
                    .unwrap()
                    .set_len(64 << 20)
                    .unwrap();
                p
            })
            .collect();
        let spec = VdevSpec {
            kind: tarn_vdev::VdevKind::Raidz { parity: 1 },
            devices,
        };
        let pool = Pool::create("tank", &[spec], 12, &BTreeMap::new(), false, pool_opts()).unwrap();
        tarn_dataset::attach(&pool).unwrap();
        let props = BTreeMap::from([("recordsize".to_string(), rs.to_string())]);
        tarn_dataset::create(&pool, FS, &props, false).unwrap();
        let b = Arc::new(DatasetBackend::new(tarn_dataset::open(&pool, FS).unwrap()));
        drop(Fs::mount(b.clone()).unwrap());
        let base = pool_space(&pool);
        PoolHarness {
            dir,
            pool: Some(pool),
            b: Some(b),
            snaps: Vec::new(),
            base,
        }
    }

    fn pool(&self) -> &Arc<Pool> {
        self.pool.as_ref().unwrap()
    }
}

impl Harness for PoolHarness {
    type B = DatasetBackend;
    fn backend(&self) -> Arc<DatasetBackend> {
        self.b.clone().unwrap()
    }
    fn snapshot(&mut self, name: &str) {
        tarn_dataset::snapshot(self.pool(), &[format!("{FS}@{name}")], false).unwrap();
        self.snaps.push(name.to_string());
    }
    fn rollback_to_latest(&mut self) -> bool {
        let Some(last) = self.snaps.last() else {
            return false;
        };
        tarn_dataset::rollback(self.pool(), &format!("{FS}@{last}"), false).unwrap();
        true
    }
    fn restart(&mut self) -> Arc<DatasetBackend> {
        self.b = None;
        let pool = self.pool.take().unwrap();
        pool.export(false).unwrap();
        assert_eq!(Arc::strong_count(&pool), 1, "someone still holds the pool");
        drop(pool);
        let dirs = [self.dir.path().to_path_buf()];
        let pool = Pool::import(&dirs, &[], "tank", None, false, pool_opts()).unwrap();
        tarn_dataset::attach(&pool).unwrap();
        let b = Arc::new(DatasetBackend::new(tarn_dataset::open(&pool, FS).unwrap()));
        self.pool = Some(pool);
        self.b = Some(b.clone());
        b
    }
    fn check_no_leaks(&mut self, _reachable_inodes: usize) {
        let r = self.pool().leak_check().unwrap();
        assert!(r.is_clean(), "{r:?}");
    }
    fn destroy_snapshots(&mut self) {
        for n in self.snaps.drain(..) {
            tarn_dataset::destroy(self.pool.as_ref().unwrap(), &format!("{FS}@{n}"), false)
                .unwrap();
        }
    }
    fn check_empty(&mut self) {
        assert_eq!(pool_space(self.pool()), self.base, "space when empty");
        let r = self.pool().leak_check().unwrap();
        assert!(r.is_clean(), "{r:?}");
    }
}

struct World<H: Harness> {
    h: H,
    /// None only while the harness restarts or rolls back.
    fs: Option<Fs<H::B>>,
    m: Model,
    rs: u64,
    /// Open handles: (ino, file id).
    handles: Vec<(u64, usize)>,
    snaps: Vec<(String, Model)>,
}

fn root() -> Cred {
    Cred::root()
}

fn walk<B: Backend>(fs: &Fs<B>, start: u64, path: &[String]) -> u64 {
    let mut ino = start;
    for p in path {
        ino = fs
            .lookup(ino, p.as_bytes(), &root())
            .unwrap_or_else(|e| panic!("lookup {p} in {path:?}: {e}"))
            .ino;
    }
    ino
}

/// Every key the backend stores, read through its transactions.
fn stored_keys<B: Backend>(b: &B) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    loop {
        let after = out.last().cloned();
        let page = b
            .txn(false, &mut |s| {
                let lo = after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
                Ok(s.range(lo, Bound::Unbounded, 256)?)
            })
            .unwrap();
        if page.is_empty() {
            return out;
        }
        out.extend(page.into_iter().map(|(k, _)| k));
    }
}

fn expect(r: Result<()>, want: std::result::Result<(), i32>, what: &str) -> bool {
    match (r, want) {
        (Ok(()), Ok(())) => true,
        (Err(e), Err(w)) => {
            assert_eq!(e.errno(), w, "{what}: {e}");
            false
        }
        (got, want) => panic!("{what}: got {got:?}, model wants {want:?}"),
    }
}

impl<H: Harness> World<H> {
    fn new(h: H, rs: u32) -> Self {
        let fs = Some(Fs::mount(h.backend()).unwrap());
        World {
            h,
            fs,
            m: Model::new(),
            rs: u64::from(rs),
            handles: Vec::new(),
            snaps: Vec::new(),
        }
    }

    fn fs(&self) -> &Fs<H::B> {
        self.fs.as_ref().unwrap()
    }

    fn dir_ino(&self, path: &[String]) -> u64 {
        walk(self.fs(), ROOT_INO, path)
    }

    /// Drops the `Fs` (and so every open handle), runs `below` on the
    /// harness, and mounts a fresh `Fs` on the backend it returns.
    fn remount(&mut self, below: impl FnOnce(&mut H) -> Arc<H::B>) {
        self.handles.clear();
        self.fs = None;
        let b = below(&mut self.h);
        self.fs = Some(Fs::mount(b).unwrap());
    }

    fn apply(&mut self, op: &Op) {
        let dirs = self.m.all_dirs();
        let ents = self.m.all_entries();
        let files: Vec<_> = ents
            .iter()
            .filter(|e| matches!(e.3, MEnt::File(_)))
            .cloned()
            .collect();
        let c = root();
        match op {
            Op::Create(d, n) | Op::Mkdir(d, n) => {
                let (did, path) = &dirs[d % dirs.len()];
                let name = NAMES[*n];
                let p = self.dir_ino(path);
                let exists = self.m.dirs[did].contains_key(name);
                let want = if exists { Err(libc::EEXIST) } else { Ok(()) };
                let is_dir = matches!(op, Op::Mkdir(..));
                let r = if is_dir {
                    self.fs()
                        .mkdir(p, name.as_bytes(), 0o755, 0, &c)
                        .map(|_| ())
                } else {
                    self.fs()
                        .mknod(p, name.as_bytes(), libc::S_IFREG | 0o644, 0, 0, &c)
                        .map(|_| ())
                };
                if expect(r, want, "create") {
                    let id = self.m.next;
                    self.m.next += 1;
                    let ent = if is_dir {
                        self.m.dirs.insert(id, BTreeMap::new());
                        MEnt::Dir(id)
                    } else {
                        self.m.files.insert(id, Vec::new());
                        MEnt::File(id)
                    };
                    self.m
                        .dirs
                        .entry(*did)
                        .or_default()
                        .insert(name.to_string(), ent);
                }
            }
            Op::Write(f, off, len, byte) => {
                if files.is_empty() {
                    return;
                }
                let (_, path, name, e) = &files[f % files.len()];
                let MEnt::File(fid) = e else { return };
                let off = u64::from(*off) % (3 * self.rs);
                let len = (*len as usize) % (2 * self.rs as usize) + 1;
                let data: Vec<u8> = if *byte < 32 {
                    vec![0; len]
                } else {
                    (0..len)
                        .map(|i| byte.wrapping_add((i % 13) as u8))
                        .collect()
                };
                let ino = walk(self.fs(), self.dir_ino(path), std::slice::from_ref(name));
                let n = self.fs().write(ino, off, &data, false, &c).unwrap();
                assert_eq!(n, len);
                let content = self.m.files.entry(*fid).or_default();
                let end = off as usize + len;
                if content.len() < end {
                    content.resize(end, 0);
                }
                content[off as usize..end].copy_from_slice(&data);
            }
            Op::Truncate(f, size) => {
                if files.is_empty() {
                    return;
                }
                let (_, path, name, e) = &files[f % files.len()];
                let MEnt::File(fid) = e else { return };
                let size = u64::from(*size) % (3 * self.rs + 7);
                let ino = walk(self.fs(), self.dir_ino(path), std::slice::from_ref(name));
                let sa = SetAttr {
                    size: Some(size),
                    ..Default::default()
                };
                self.fs().setattr(ino, &sa, &c).unwrap();
                self.m
                    .files
                    .entry(*fid)
                    .or_default()
                    .resize(size as usize, 0);
            }
            Op::Rename(s, d, n, fl) => {
                if ents.is_empty() {
                    return;
                }
                let (sp, spath, sname, se) = ents[s % ents.len()].clone();
                let (dp, dpath) = dirs[d % dirs.len()].clone();
                let dname = NAMES[*n].to_string();
                let flags = match fl {
                    1 => RENAME_NOREPLACE,
                    2 => RENAME_EXCHANGE,
                    _ => 0,
                };
                let de = self.m.dirs[&dp].get(&dname).copied();
                let moved = sp != dp;
                let exch = flags == RENAME_EXCHANGE;
                let want: std::result::Result<(), i32> = (|| {
                    if exch && de.is_none() {
                        return Err(libc::ENOENT);
                    }
                    if flags == RENAME_NOREPLACE && de.is_some() {
                        return Err(libc::EEXIST);
                    }
                    if let MEnt::Dir(sd) = se {
                        if moved && self.m.dir_contains(sd, dp) {
                            return Err(libc::EINVAL);
                        }
                    }
                    if let Some(MEnt::Dir(dd)) = de {
                        if moved && self.m.dir_contains(dd, sp) {
                            return Err(if exch { libc::EINVAL } else { libc::ENOTEMPTY });
                        }
                    }
                    if de == Some(se) {
                        return Ok(());
                    }
                    if let (false, Some(de)) = (exch, de) {
                        match (se, de) {
                            (MEnt::Dir(_), MEnt::File(_)) => return Err(libc::ENOTDIR),
                            (MEnt::File(_), MEnt::Dir(_)) => return Err(libc::EISDIR),
                            (_, MEnt::Dir(dd)) if !self.m.dirs[&dd].is_empty() => {
                                return Err(libc::ENOTEMPTY)
                            }
                            _ => {}
                        }
                    }
                    Ok(())
                })();
                let spi = self.dir_ino(&spath);
                let dpi = self.dir_ino(&dpath);
                let r = self
                    .fs()
                    .rename(spi, sname.as_bytes(), dpi, dname.as_bytes(), flags, &c);
                if expect(r, want, &format!("rename {op:?}")) && de != Some(se) {
                    if exch {
                        let de = de.unwrap_or(se);
                        self.m.dirs.entry(sp).or_default().insert(sname, de);
                        self.m.dirs.entry(dp).or_default().insert(dname, se);
                    } else {
                        self.m.dirs.entry(sp).or_default().remove(&sname);
                        if let Some(MEnt::Dir(dd)) = self.m.dirs[&dp].get(&dname).copied() {
                            self.m.dirs.remove(&dd);
                        }
                        self.m.dirs.entry(dp).or_default().insert(dname, se);
                    }
                }
            }
            Op::Link(f, d, n) => {
                if files.is_empty() {
                    return;
                }
                let (_, path, name, e) = files[f % files.len()].clone();
                let (dp, dpath) = dirs[d % dirs.len()].clone();
                let dname = NAMES[*n];
                let want = if self.m.dirs[&dp].contains_key(dname) {
                    Err(libc::EEXIST)
                } else {
                    Ok(())
                };
                let ino = walk(self.fs(), self.dir_ino(&path), std::slice::from_ref(&name));
                let r = self
                    .fs()
                    .link(ino, self.dir_ino(&dpath), dname.as_bytes(), &c)
                    .map(|_| ());
                if expect(r, want, "link") {
                    self.m
                        .dirs
                        .entry(dp)
                        .or_default()
                        .insert(dname.to_string(), e);
                }
            }
            Op::Unlink(i) | Op::Rmdir(i) => {
                if ents.is_empty() {
                    return;
                }
                let (p, path, name, e) = ents[i % ents.len()].clone();
                let rmdir = matches!(op, Op::Rmdir(_));
                let want = match (rmdir, e) {
                    (false, MEnt::Dir(_)) => Err(libc::EISDIR),
                    (true, MEnt::File(_)) => Err(libc::ENOTDIR),
                    (true, MEnt::Dir(d)) if !self.m.dirs[&d].is_empty() => Err(libc::ENOTEMPTY),
                    _ => Ok(()),
                };
                let pi = self.dir_ino(&path);
                let r = if rmdir {
                    self.fs().rmdir(pi, name.as_bytes(), &c)
                } else {
                    self.fs().unlink(pi, name.as_bytes(), &c)
                };
                if expect(r, want, "remove") {
                    self.m.dirs.entry(p).or_default().remove(&name);
                    if let MEnt::Dir(d) = e {
                        self.m.dirs.remove(&d);
                    }
                }
            }
            Op::Open(f) => {
                if files.is_empty() {
                    return;
                }
                let (_, path, name, e) = &files[f % files.len()];
                let MEnt::File(fid) = e else { return };
                let ino = walk(self.fs(), self.dir_ino(path), std::slice::from_ref(name));
                self.fs().open(ino, libc::O_RDWR, &c).unwrap();
                self.handles.push((ino, *fid));
            }
            Op::ReleaseAll => {
                for (ino, _) in std::mem::take(&mut self.handles) {
                    self.fs().release(ino).unwrap();
                }
            }
            Op::Snapshot => {
                let name = format!("s{}", self.snaps.len());
                self.h.snapshot(&name);
                self.snaps.push((name, self.m.clone()));
            }
            Op::Rollback => {
                // A rollback replaces every inode behind the mounted
                // filesystem's back, so, like a restart, it is followed by
                // a fresh mount: open handles are gone (a FUSE server
                // would have to be remounted; the kernel's cached view is
                // no longer valid).
                let Some((_, sm)) = self.snaps.last() else {
                    return;
                };
                let sm = sm.clone();
                self.remount(|h| {
                    assert!(h.rollback_to_latest());
                    h.backend()
                });
                self.m = sm;
            }
            Op::Restart => self.remount(|h| h.restart()),
        }
    }

    /// Compares the tree under `ino` with model directory `d`.
    fn check_dir(&self, m: &Model, ino: u64, d: usize, path: &str) {
        let mut got: BTreeMap<String, (u64, FileKind)> = BTreeMap::new();
        let mut cookie = 0;
        loop {
            let page = self.fs().readdir(ino, cookie, 3).unwrap();
            if page.is_empty() {
                break;
            }
            for e in page {
                cookie = e.cookie;
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let name = String::from_utf8(e.name).unwrap();
                assert!(got.insert(name, (e.ino, e.kind)).is_none(), "dup in {path}");
            }
        }
        let want = &m.dirs[&d];
        let gnames: Vec<_> = got.keys().collect();
        let wnames: Vec<_> = want.keys().collect();
        assert_eq!(gnames, wnames, "listing of {path}");
        let da = self.fs().getattr(ino).unwrap();
        let subdirs = want.values().filter(|e| matches!(e, MEnt::Dir(_))).count() as u32;
        assert_eq!(da.nlink, 2 + subdirs, "nlink of {path}");
        assert_eq!(da.size, want.len() as u64 + 2, "size of {path}");
        for (name, e) in want {
            let (cino, kind) = got[name];
            let a = self.fs().lookup(ino, name.as_bytes(), &root()).unwrap();
            assert_eq!(a.ino, cino, "{path}/{name}");
            match e {
                MEnt::Dir(cd) => {
                    assert_eq!(kind, FileKind::Directory);
                    self.check_dir(m, cino, *cd, &format!("{path}/{name}"));
                }
                MEnt::File(fid) => {
                    assert_eq!(kind, FileKind::Regular);
                    let content = &m.files[fid];
                    assert_eq!(a.size, content.len() as u64, "size of {path}/{name}");
                    assert_eq!(a.nlink, m.links(*fid), "nlink of {path}/{name}");
                    let got = self.fs().read(cino, 0, content.len() as u32 + 100).unwrap();
                    assert!(got == *content, "contents of {path}/{name}");
                    assert!(a.blocks * 512 <= a.size.next_multiple_of(self.rs) + 512);
                }
            }
        }
    }

    fn check(&self) {
        self.check_dir(&self.m, ROOT_INO, 0, "");
        for (ino, fid) in &self.handles {
            let content = &self.m.files[fid];
            let got = self.fs().read(*ino, 0, content.len() as u32 + 100).unwrap();
            assert!(got == *content, "contents through handle {ino}");
        }
        for (name, sm) in &self.snaps {
            let s = walk(
                self.fs(),
                ROOT_INO,
                &[".snapshot".to_string(), name.clone()],
            );
            self.check_dir(sm, s, 0, &format!("/.snapshot/{name}"));
        }
    }

    /// Checks that exactly `reachable` inodes and no orphan are stored,
    /// then the harness's own checks.
    fn check_stored(&mut self, reachable: usize) {
        let keys = stored_keys(&*self.h.backend());
        let inodes = keys
            .iter()
            .filter(|k| k.len() == 9 && k[8] == 0x01 && k[..8] != [0u8; 8])
            .count();
        assert_eq!(inodes, reachable, "stored inodes vs reachable");
        let orphans = keys
            .iter()
            .filter(|k| k.len() == 17 && k[..8] == [0u8; 8] && k[8] == 0x05)
            .count();
        assert_eq!(orphans, 0, "orphans with no handle open");
        self.h.check_no_leaks(reachable);
    }

    /// Removes everything below model directory `d` (at `path`).
    fn delete_tree(&mut self, d: usize, path: &[String]) {
        let ino = self.dir_ino(path);
        let ents: Vec<(String, MEnt)> = self.m.dirs[&d]
            .iter()
            .map(|(n, e)| (n.clone(), *e))
            .collect();
        for (name, e) in ents {
            match e {
                MEnt::Dir(c) => {
                    let mut p = path.to_vec();
                    p.push(name.clone());
                    self.delete_tree(c, &p);
                    self.fs().rmdir(ino, name.as_bytes(), &root()).unwrap();
                    self.m.dirs.remove(&c);
                }
                MEnt::File(_) => self.fs().unlink(ino, name.as_bytes(), &root()).unwrap(),
            }
            self.m.dirs.entry(d).or_default().remove(&name);
        }
    }

    /// After releasing everything only reachable inodes remain stored; after
    /// deleting everything and destroying the snapshots, the dataset is back
    /// to its freshly formatted size.
    fn finish(&mut self) {
        for (ino, _) in std::mem::take(&mut self.handles) {
            self.fs().release(ino).unwrap();
        }
        let mut reachable: HashMap<MEnt, ()> = HashMap::new();
        for (d, _) in self.m.all_dirs() {
            reachable.insert(MEnt::Dir(d), ());
            for e in self.m.dirs[&d].values() {
                reachable.insert(*e, ());
            }
        }
        self.check_stored(reachable.len());
        self.delete_tree(0, &[]);
        self.h.destroy_snapshots();
        self.snaps.clear();
        self.check();
        self.check_stored(1);
        self.h.check_empty();
    }
}

impl std::hash::Hash for MEnt {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        match self {
            MEnt::Dir(d) => (0u8, *d).hash(h),
            MEnt::File(f) => (1u8, *f).hash(h),
        }
    }
}

fn run<H: Harness>(h: H, rs: u32, ops: &[Op]) {
    let mut w = World::new(h, rs);
    for op in ops {
        w.apply(op);
        w.check();
    }
    w.finish();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn fs_matches_model(
        rs in prop_oneof![Just(512u32), Just(1024), Just(4096)],
        ops in proptest::collection::vec(op_strategy(), 1..60),
    ) {
        run(MemHarness::new(rs), rs, &ops);
    }
}

proptest! {
    // A real pool per case (and per shrink step): fewer, shorter cases.
    #![proptest_config(ProptestConfig {
        cases: 48,
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]

    #[test]
    fn fs_on_pool_matches_model(
        rs in prop_oneof![Just(4096u32), Just(8192)],
        ops in proptest::collection::vec(op_strategy(), 1..60),
    ) {
        run(PoolHarness::new(rs), rs, &ops);
    }
}
