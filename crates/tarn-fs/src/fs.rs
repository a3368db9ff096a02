//! `Fs`: the inode-based POSIX API (see the crate docs for the design).

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::codec::{self, K_ORPHAN};
use crate::dir::{self, Dirent, COOKIE_BASE};
use crate::file::{self, MAX_FILE_SIZE};
use crate::inode::{self, Inode, Superblock, Tx, FIRST_INO, INLINE_TARGET_MAX, MAX_LOCAL_INO};
use crate::perm;
use crate::store::{Backend, MAX_BLOCK};
use crate::types::*;
use crate::xattr;
use crate::{FsError, Result};

/// Relatime: an access time older than this is refreshed on read.
const RELATIME_NS: i128 = 24 * 3600 * 1_000_000_000;
/// Mask of the local inode number inside a mount-wide inode number.
const LOCAL_MASK: u64 = (1 << SLOT_SHIFT) - 1;
/// Largest snapshot slot (slot 0 is the live dataset).
const MAX_SLOT: u64 = 0xfffe;
/// Orphans freed per transaction at mount.
const REAP_BATCH: usize = 64;
/// Largest read served at once (a larger request returns a short read),
/// so a caller cannot make one call allocate gigabytes.
pub const MAX_READ: u32 = 16 << 20;

/// One snapshot known to this `Fs`: its slot gives its inode numbers.
struct SnapSlot<B> {
    backend: Arc<B>,
}

struct Snaps<B> {
    slots: BTreeMap<u64, SnapSlot<B>>,
    by_guid: HashMap<u64, u64>,
    next: u64,
}

/// Where a mount-wide inode number lives.
enum Place<B> {
    /// The live dataset, local inode number.
    Live(u64),
    /// The virtual `.snapshot` directory.
    SnapDir,
    /// Inside a snapshot: slot, its backend, local inode number.
    Snap(u64, Arc<B>, u64),
}

/// The POSIX filesystem of one dataset, with its snapshots read-only under
/// `/.snapshot`. Every method is one (or, for reads that refresh atime,
/// two) [`Backend::txn`] calls, so it is safe to call from many threads.
/// Mount a dataset with one `Fs` at a time: open counts live in memory.
pub struct Fs<B: Backend> {
    live: Arc<B>,
    open: Mutex<HashMap<u64, u32>>,
    snaps: Mutex<Snaps<B>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn err<T>(errno: i32, msg: &'static str) -> Result<T> {
    Err(FsError::new(errno, msg))
}

/// Rejects names no directory entry can have.
fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return err(libc::ENOENT, "empty name");
    }
    if name.len() > NAME_MAX {
        return err(libc::ENAMETOOLONG, "name longer than 255 bytes");
    }
    if name.contains(&b'/') || name.contains(&0) {
        return err(libc::EINVAL, "name contains '/' or NUL");
    }
    Ok(())
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

fn gino(slot: u64, local: u64) -> u64 {
    (slot << SLOT_SHIFT) | local
}

fn attr_of(slot: u64, guid: u64, i: &Inode) -> Attr {
    let size = if i.is_dir() {
        i.size.saturating_add(2)
    } else {
        i.size
    };
    Attr {
        ino: gino(slot, i.ino),
        generation: i.gen,
        dataset: guid,
        kind: i.kind,
        mode: i.mode,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        size,
        blocks: i.alloc.div_ceil(512),
        blksize: if i.recordsize > 0 { i.recordsize } else { 4096 },
        rdev: i.rdev,
        atime: i.atime,
        mtime: i.mtime,
        ctime: i.ctime,
        crtime: i.crtime,
    }
}

/// The directory `ino` for an operation inside it: ENOTDIR/ENOENT checks.
fn get_dir(tx: &mut Tx, ino: u64) -> Result<Inode> {
    let d = tx.get(ino)?;
    if !d.is_dir() {
        return err(libc::ENOTDIR, "not a directory");
    }
    if d.nlink == 0 {
        return err(libc::ENOENT, "directory has been removed");
    }
    Ok(d)
}

/// Relatime: should a read at `now` refresh the access time?
fn wants_atime(tx: &Tx, i: &Inode) -> bool {
    tx.info.atime
        && !tx.info.readonly
        && (i.atime <= i.mtime
            || i.atime <= i.ctime
            || tx.now.as_nanos() - i.atime.as_nanos() >= RELATIME_NS)
}

/// Walks up from `from` (inclusive) to the root: is `anc` on the way?
fn is_ancestor(tx: &mut Tx, anc: u64, from: u64) -> Result<bool> {
    let mut cur = from;
    for _ in 0..100_000 {
        if cur == anc {
            return Ok(true);
        }
        if cur == ROOT_INO {
            return Ok(false);
        }
        cur = tx.get(cur)?.parent;
    }
    Err(FsError::io(
        "directory parent chain does not reach the root",
    ))
}

fn open_mask(flags: i32) -> u32 {
    let mut mask = match flags & libc::O_ACCMODE {
        libc::O_RDONLY => R_OK,
        libc::O_WRONLY => W_OK,
        _ => R_OK | W_OK,
    };
    if flags & libc::O_TRUNC != 0 {
        mask |= W_OK;
    }
    mask
}

/// Which namespace an xattr name is in, and whether we support it.
#[derive(PartialEq, Eq)]
enum XNs {
    User,
    Trusted,
    Security,
}

fn xattr_ns(name: &[u8]) -> Result<XNs> {
    if name.is_empty() || name.len() > NAME_MAX {
        return err(libc::ERANGE, "xattr name empty or longer than 255 bytes");
    }
    if name.starts_with(b"user.") {
        Ok(XNs::User)
    } else if name.starts_with(b"trusted.") {
        Ok(XNs::Trusted)
    } else if name.starts_with(b"security.") {
        Ok(XNs::Security)
    } else {
        err(libc::EOPNOTSUPP, "unsupported xattr namespace")
    }
}

/// Linux's `xattr_permission`.
fn xattr_perm(i: &Inode, ns: &XNs, write: bool, cred: &Cred) -> Result<()> {
    match ns {
        XNs::Trusted if !cred.is_root() => {
            return if write {
                err(libc::EPERM, "trusted xattrs need root")
            } else {
                err(libc::ENODATA, "no such xattr")
            };
        }
        XNs::Security if write && !cred.is_root() => {
            return err(libc::EPERM, "security xattrs need root");
        }
        XNs::User => {
            if !matches!(i.kind, FileKind::Regular | FileKind::Directory) {
                return if write {
                    err(libc::EPERM, "user xattrs only on files and directories")
                } else {
                    err(libc::ENODATA, "no such xattr")
                };
            }
            if write && i.is_dir() && i.mode & libc::S_ISVTX != 0 && !perm::owner_or_root(i, cred) {
                return err(libc::EPERM, "sticky directory xattrs: owner only");
            }
        }
        _ => {}
    }
    perm::check(i, cred, if write { W_OK } else { R_OK })
}

impl<B: Backend> Fs<B> {
    /// Mounts the dataset behind `backend`: creates the superblock and root
    /// directory on an empty dataset, and frees orphans (files unlinked
    /// while open when the last mount ended) on a writable one.
    pub fn mount(backend: Arc<B>) -> Result<Self> {
        let (info, sb) = backend.txn(false, &mut |s| {
            let mut tx = Tx::new(s);
            Ok((tx.info.clone(), tx.superblock()?))
        })?;
        if sb.is_none() {
            if info.readonly {
                return err(libc::EROFS, "read-only dataset holds no filesystem");
            }
            backend.txn(true, &mut |s| {
                let mut tx = Tx::new(s);
                let any = tx.s.range(Bound::Unbounded, Bound::Unbounded, 1)?;
                if !any.is_empty() {
                    return Err(FsError::io("dataset holds keys but no tarn-fs superblock"));
                }
                let sb = Superblock {
                    next_ino: FIRST_INO,
                };
                tx.s.put(&inode::super_key(), &sb.encode())?;
                let mut root = Inode::new(ROOT_INO, FileKind::Directory, 0o755, 0, 0, tx.now);
                root.nlink = 2;
                root.parent = ROOT_INO;
                tx.put(root);
                tx.flush()
            })?;
        }
        let fs = Fs {
            live: backend,
            open: Mutex::new(HashMap::new()),
            snaps: Mutex::new(Snaps {
                slots: BTreeMap::new(),
                by_guid: HashMap::new(),
                next: 1,
            }),
        };
        if !info.readonly {
            fs.reap_orphans()?;
        }
        Ok(fs)
    }

    /// The live dataset's backend.
    pub fn backend(&self) -> &Arc<B> {
        &self.live
    }

    fn reap_orphans(&self) -> Result<()> {
        loop {
            let n = self.live.txn(true, &mut |s| {
                let mut tx = Tx::new(s);
                let lo = codec::key2(0, K_ORPHAN);
                let hi = codec::key2(0, K_ORPHAN + 1);
                let page = tx.s.range(
                    Bound::Included(lo.as_slice()),
                    Bound::Excluded(hi.as_slice()),
                    REAP_BATCH,
                )?;
                for (k, _) in &page {
                    let ino = codec::key3_suffix(k, 0, K_ORPHAN)?;
                    if let Some(i) = tx.try_get(ino)? {
                        if i.nlink == 0 {
                            tx.free(ino)?;
                        }
                    }
                    tx.s.delete(k)?;
                }
                Ok(page.len())
            })?;
            if n < REAP_BATCH {
                return Ok(());
            }
        }
    }

    // ----- inode-number resolution -------------------------------------

    fn place(&self, ino: u64) -> Result<Place<B>> {
        let slot = ino >> SLOT_SHIFT;
        let local = ino & LOCAL_MASK;
        if slot == 0 {
            return Ok(if local == SNAPDIR_INO {
                Place::SnapDir
            } else {
                Place::Live(local)
            });
        }
        let snaps = lock(&self.snaps);
        match snaps.slots.get(&slot) {
            Some(s) => Ok(Place::Snap(slot, s.backend.clone(), local)),
            None => err(libc::ESTALE, "unknown snapshot inode"),
        }
    }

    /// The live local inode number, or EROFS for snapshot contents.
    fn live_ino(&self, ino: u64) -> Result<u64> {
        match self.place(ino)? {
            Place::Live(l) => Ok(l),
            _ => err(libc::EROFS, "snapshots are read-only"),
        }
    }

    /// Runs a read-only transaction on the backend of `ino`; `f` gets the
    /// slot and local inode number. The `.snapshot` directory is handled
    /// by callers before this.
    fn read_on<R>(&self, ino: u64, mut f: impl FnMut(&mut Tx, u64, u64) -> Result<R>) -> Result<R> {
        match self.place(ino)? {
            Place::Live(l) => self.live.txn(false, &mut |s| f(&mut Tx::new(s), 0, l)),
            Place::Snap(slot, b, l) => b.txn(false, &mut |s| f(&mut Tx::new(s), slot, l)),
            Place::SnapDir => err(libc::EINVAL, "internal: .snapshot reached read_on"),
        }
    }

    /// Runs a write transaction on the live dataset (EROFS if read-only).
    fn write_txn<R>(&self, mut f: impl FnMut(&mut Tx) -> Result<R>) -> Result<R> {
        self.live.txn(true, &mut |s| {
            let mut tx = Tx::new(s);
            tx.writable()?;
            let r = f(&mut tx)?;
            tx.flush()?;
            Ok(r)
        })
    }

    /// Refreshes the slot table from the backend and returns the
    /// snapshots as (slot, name), ordered by slot.
    fn snapshot_list(&self) -> Result<Vec<(u64, String)>> {
        let list = self.live.snapshots()?;
        let mut out = Vec::with_capacity(list.len());
        for (name, b) in list {
            let guid = b.txn(false, &mut |s| Ok(s.info().guid))?;
            let mut snaps = lock(&self.snaps);
            let slot = match snaps.by_guid.get(&guid) {
                Some(&s) => s,
                None => {
                    if snaps.next > MAX_SLOT {
                        return err(libc::ENOSPC, "too many snapshots seen by this mount");
                    }
                    let s = snaps.next;
                    snaps.next += 1;
                    snaps.by_guid.insert(guid, s);
                    s
                }
            };
            snaps.slots.insert(slot, SnapSlot { backend: b });
            out.push((slot, name));
        }
        out.sort();
        Ok(out)
    }

    fn snapdir_attr(&self) -> Result<Attr> {
        self.live.txn(false, &mut |s| {
            let mut tx = Tx::new(s);
            let root = tx.get(ROOT_INO)?;
            let mut a = attr_of(0, tx.info.guid, &root);
            a.ino = SNAPDIR_INO;
            a.generation = 0;
            a.mode = libc::S_IFDIR | 0o555;
            a.nlink = 2;
            a.uid = 0;
            a.gid = 0;
            a.size = 2;
            a.blocks = 0;
            Ok(a)
        })
    }

    fn snap_root_attr(&self, slot: u64) -> Result<Attr> {
        self.read_on(gino(slot, ROOT_INO), |tx, slot, l| {
            let i = tx.get(l)?;
            Ok(attr_of(slot, tx.info.guid, &i))
        })
    }

    // ----- open counts ---------------------------------------------------

    fn open_count(&self, ino: u64) -> u32 {
        lock(&self.open).get(&ino).copied().unwrap_or(0)
    }

    fn inc_open(&self, ino: u64) {
        *lock(&self.open).entry(ino).or_insert(0) += 1;
    }

    /// Drops one link's worth from a victim whose link count reached 0:
    /// free it now, or keep it as an orphan while it is open.
    fn dispose(&self, tx: &mut Tx, victim: Inode) -> Result<()> {
        if victim.nlink > 0 {
            tx.put(victim);
        } else if self.open_count(victim.ino) > 0 {
            tx.s.put(&inode::orphan_key(victim.ino), &[])?;
            tx.put(victim);
        } else {
            tx.free(victim.ino)?;
        }
        Ok(())
    }

    // ----- lookup and attributes -----------------------------------------

    /// Looks `name` up in directory `parent` (needs search permission).
    /// `.` and `..` work; `.snapshot` in the root is the hidden snapshot
    /// directory.
    pub fn lookup(&self, parent: u64, name: &[u8], cred: &Cred) -> Result<Attr> {
        if !is_dot(name) {
            check_name(name)?;
        }
        match self.place(parent)? {
            Place::SnapDir => match name {
                b"." => self.snapdir_attr(),
                b".." => self.getattr(ROOT_INO),
                _ => {
                    let list = self.snapshot_list()?;
                    match list.iter().find(|(_, n)| n.as_bytes() == name) {
                        Some((slot, _)) => self.snap_root_attr(*slot),
                        None => err(libc::ENOENT, "no such snapshot"),
                    }
                }
            },
            place => {
                let slot = match place {
                    Place::Snap(s, _, _) => s,
                    _ => 0,
                };
                if slot == 0 && parent == ROOT_INO && name == b".snapshot" {
                    // Search permission on the root still applies.
                    self.read_on(parent, |tx, _, l| {
                        let d = get_dir(tx, l)?;
                        perm::check(&d, cred, X_OK)
                    })?;
                    return self.snapdir_attr();
                }
                let r = self.read_on(parent, |tx, slot, l| {
                    let d = get_dir(tx, l)?;
                    perm::check(&d, cred, X_OK)?;
                    let child = match name {
                        b"." => l,
                        b".." => {
                            if l == ROOT_INO && slot != 0 {
                                return Ok(None);
                            }
                            d.parent
                        }
                        _ => match dir::find(tx, l, name)? {
                            Some(e) => e.ino,
                            None => return err(libc::ENOENT, "no such entry"),
                        },
                    };
                    let i = tx.get(child)?;
                    Ok(Some(attr_of(slot, tx.info.guid, &i)))
                })?;
                match r {
                    Some(a) => Ok(a),
                    None => self.snapdir_attr(),
                }
            }
        }
    }

    /// The attributes of the inode an NFS-style handle names, or ESTALE if
    /// it is gone (freed, or a different dataset or generation).
    pub fn getattr_handle(&self, h: &FileHandle) -> Result<Attr> {
        let stale = || FsError::new(libc::ESTALE, "stale file handle");
        let a = self.getattr(h.ino).map_err(|e| {
            if e.errno() == libc::ENOENT {
                stale()
            } else {
                e
            }
        })?;
        if a.generation != h.generation || a.dataset != h.dataset || a.nlink == 0 {
            return Err(stale());
        }
        Ok(a)
    }

    /// The attributes of `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        if let Place::SnapDir = self.place(ino)? {
            return self.snapdir_attr();
        }
        self.read_on(ino, |tx, slot, l| {
            let i = tx.get(l)?;
            Ok(attr_of(slot, tx.info.guid, &i))
        })
    }

    /// Changes attributes with Linux's rules: only the owner (or root) may
    /// chmod or set explicit times; only root may give a file away; the
    /// owner may chgrp to a group they are in; chown clears set-id bits of
    /// non-directories; a non-root chmod drops SGID unless the caller is in
    /// the file's group; a non-root truncate drops set-id bits.
    pub fn setattr(&self, ino: u64, sa: &SetAttr, cred: &Cred) -> Result<Attr> {
        let local = self.live_ino(ino)?;
        self.write_txn(|tx| {
            let mut i = tx.get(local)?;
            if let Some(size) = sa.size {
                if i.is_dir() {
                    return err(libc::EISDIR, "cannot truncate a directory");
                }
                if i.kind != FileKind::Regular {
                    return err(libc::EINVAL, "cannot truncate a special file");
                }
                if !sa.from_open_file {
                    perm::check(&i, cred, W_OK)?;
                }
                if size > MAX_FILE_SIZE {
                    return err(libc::EFBIG, "size beyond the largest file size");
                }
            }
            if let Some(uid) = sa.uid {
                if !(cred.is_root() || (cred.uid == i.uid && uid == i.uid)) {
                    return err(libc::EPERM, "only root may change the owner");
                }
            }
            if let Some(gid) = sa.gid {
                if !cred.is_root() && !(cred.uid == i.uid && (gid == i.gid || cred.in_group(gid))) {
                    return err(libc::EPERM, "chgrp: not the owner or not in the group");
                }
            }
            if sa.mode.is_some() && !perm::owner_or_root(&i, cred) {
                return err(libc::EPERM, "chmod: not the owner");
            }
            let times = [sa.atime, sa.mtime];
            if times.iter().any(|t| matches!(t, Some(TimeSet::At(_)))) {
                if !perm::owner_or_root(&i, cred) {
                    return err(libc::EPERM, "utimes: not the owner");
                }
            } else if times.iter().any(|t| t.is_some())
                && !perm::owner_or_root(&i, cred)
                && !perm::allowed(&i, cred, W_OK)
            {
                return err(libc::EACCES, "utimes: no write permission");
            }

            let now = tx.now;
            // Nothing to set is chown(path, -1, -1) (or its like): Linux
            // still marks the inode changed.
            let mut changed = sa.mode.is_none()
                && sa.uid.is_none()
                && sa.gid.is_none()
                && sa.size.is_none()
                && sa.atime.is_none()
                && sa.mtime.is_none();
            if sa.uid.is_some() || sa.gid.is_some() {
                if let Some(uid) = sa.uid {
                    i.uid = uid;
                }
                if let Some(gid) = sa.gid {
                    i.gid = gid;
                }
                if !i.is_dir() {
                    i.mode = perm::kill_setid(i.mode);
                }
                changed = true;
            }
            if let Some(mode) = sa.mode {
                let mut m = mode & 0o7777;
                if !cred.is_root() && !cred.in_group(i.gid) {
                    m &= !libc::S_ISGID;
                }
                i.set_perm(m);
                changed = true;
            }
            if let Some(size) = sa.size {
                file::truncate(tx, &mut i, size)?;
                i.mtime = now;
                if !cred.is_root() {
                    i.mode = perm::kill_setid(i.mode);
                }
                changed = true;
            }
            let pick = |t: TimeSet| match t {
                TimeSet::Now => now,
                TimeSet::At(t) => t,
            };
            if let Some(t) = sa.atime {
                i.atime = pick(t);
                changed = true;
            }
            if let Some(t) = sa.mtime {
                i.mtime = pick(t);
                changed = true;
            }
            if changed {
                i.ctime = now;
                tx.put(i.clone());
            }
            Ok(attr_of(0, tx.info.guid, &i))
        })
    }

    /// Checks `mask` (`R_OK|W_OK|X_OK`, or 0 for existence) for `cred`;
    /// writes to snapshots or a read-only dataset fail with EROFS.
    pub fn access(&self, ino: u64, mask: u32, cred: &Cred) -> Result<()> {
        match self.place(ino)? {
            Place::SnapDir => {
                if mask & W_OK != 0 {
                    return err(libc::EROFS, "snapshots are read-only");
                }
                Ok(())
            }
            _ => self.read_on(ino, |tx, _, l| {
                let i = tx.get(l)?;
                if mask & W_OK != 0 && (tx.info.readonly || l != ino) {
                    return err(libc::EROFS, "read-only");
                }
                perm::check(&i, cred, mask & (R_OK | W_OK | X_OK))
            }),
        }
    }

    // ----- creating names --------------------------------------------------

    /// Shared by mknod, mkdir, symlink and create: adds `name` to `parent`
    /// as a new inode. `perm` is already masked.
    #[allow(clippy::too_many_arguments)]
    fn make_node(
        tx: &mut Tx,
        parent: u64,
        name: &[u8],
        kind: FileKind,
        perm_bits: u32,
        rdev: u64,
        target: &[u8],
        cred: &Cred,
    ) -> Result<Inode> {
        let d = get_dir(tx, parent)?;
        perm::check(&d, cred, X_OK)?;
        if is_dot(name) || (parent == ROOT_INO && name == b".snapshot") {
            return err(libc::EEXIST, "name exists");
        }
        if dir::find(tx, parent, name)?.is_some() {
            return err(libc::EEXIST, "name exists");
        }
        perm::check(&d, cred, W_OK)?;
        if kind == FileKind::Directory && d.nlink >= LINK_MAX {
            return err(libc::EMLINK, "too many subdirectories");
        }
        let ino = tx.alloc_ino()?;
        let sgid_dir = d.mode & libc::S_ISGID != 0;
        let gid = if sgid_dir { d.gid } else { cred.gid };
        let mut p = perm_bits & 0o7777;
        if kind == FileKind::Directory {
            if sgid_dir {
                p |= libc::S_ISGID;
            }
        } else if p & libc::S_ISGID != 0 && !cred.is_root() && !cred.in_group(gid) {
            p &= !libc::S_ISGID;
        }
        let mut i = Inode::new(ino, kind, p, cred.uid, gid, tx.now);
        match kind {
            FileKind::Directory => {
                i.nlink = 2;
                i.parent = parent;
            }
            FileKind::Regular => {
                i.recordsize = tx.info.recordsize.clamp(512, MAX_BLOCK as u32);
            }
            FileKind::Symlink => {
                i.size = target.len() as u64;
                if target.len() <= INLINE_TARGET_MAX {
                    i.target = Some(target.to_vec());
                } else {
                    i.target_in_block = true;
                    file::put_long_target(tx, ino, target)?;
                }
            }
            FileKind::CharDevice | FileKind::BlockDevice => i.rdev = rdev,
            FileKind::Fifo | FileKind::Socket => {}
        }
        dir::insert(tx, parent, name, ino, kind)?;
        let mut d = tx.get(parent)?;
        d.size = d.size.saturating_add(1);
        if kind == FileKind::Directory {
            d.nlink += 1;
        }
        d.mtime = tx.now;
        d.ctime = tx.now;
        tx.put(d);
        tx.put(i.clone());
        Ok(i)
    }

    #[allow(clippy::too_many_arguments)]
    fn make(
        &self,
        parent: u64,
        name: &[u8],
        kind: FileKind,
        perm_bits: u32,
        rdev: u64,
        target: &[u8],
        cred: &Cred,
    ) -> Result<Attr> {
        if !is_dot(name) {
            check_name(name)?;
        }
        let p = self.live_ino(parent)?;
        self.write_txn(|tx| {
            let i = Self::make_node(tx, p, name, kind, perm_bits, rdev, target, cred)?;
            Ok(attr_of(0, tx.info.guid, &i))
        })
    }

    /// Creates a regular file, FIFO, socket, or (root only) a character or
    /// block device node, which is metadata only. `mode` carries the type
    /// bits; `umask` is applied here.
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        umask: u32,
        cred: &Cred,
    ) -> Result<Attr> {
        let kind = match mode & libc::S_IFMT {
            0 => FileKind::Regular,
            libc::S_IFDIR => return err(libc::EPERM, "mknod cannot make directories"),
            libc::S_IFLNK => return err(libc::EINVAL, "mknod cannot make symlinks"),
            m => {
                FileKind::from_mode(m).ok_or_else(|| FsError::new(libc::EINVAL, "bad file type"))?
            }
        };
        if matches!(kind, FileKind::CharDevice | FileKind::BlockDevice) && !cred.is_root() {
            return err(libc::EPERM, "only root may create device nodes");
        }
        self.make(parent, name, kind, mode & 0o7777 & !umask, rdev, &[], cred)
    }

    /// Creates a directory (set-id bits from `mode` are dropped, SGID is
    /// inherited from an SGID parent).
    pub fn mkdir(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        cred: &Cred,
    ) -> Result<Attr> {
        let p = mode & (0o777 | libc::S_ISVTX) & !umask;
        self.make(parent, name, FileKind::Directory, p, 0, &[], cred)
    }

    /// Creates a symbolic link to `target` (1..=4095 bytes, no NUL).
    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], cred: &Cred) -> Result<Attr> {
        if target.is_empty() {
            return err(libc::ENOENT, "empty symlink target");
        }
        if target.len() > SYMLINK_MAX {
            return err(libc::ENAMETOOLONG, "symlink target longer than 4095 bytes");
        }
        if target.contains(&0) {
            return err(libc::EINVAL, "symlink target contains NUL");
        }
        self.make(parent, name, FileKind::Symlink, 0o777, 0, target, cred)
    }

    /// The target of symlink `ino`.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        if let Place::SnapDir = self.place(ino)? {
            return err(libc::EINVAL, "not a symlink");
        }
        self.read_on(ino, |tx, _, l| {
            let i = tx.get(l)?;
            if i.kind != FileKind::Symlink {
                return err(libc::EINVAL, "not a symlink");
            }
            match &i.target {
                Some(t) => Ok(t.clone()),
                None => file::get_long_target(tx, l),
            }
        })
    }

    /// Opens `name` in `parent`, creating a regular file if it is missing
    /// (`O_EXCL`: it must be missing; `O_TRUNC`: an existing file is
    /// emptied). The result counts as an open: call [`Fs::release`].
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
        cred: &Cred,
    ) -> Result<Attr> {
        check_name(name)?;
        let p = self.live_ino(parent)?;
        let a = self.write_txn(|tx| {
            let existing = if is_dot(name) || (p == ROOT_INO && name == b".snapshot") {
                return err(libc::EEXIST, "name exists");
            } else {
                let d = get_dir(tx, p)?;
                perm::check(&d, cred, X_OK)?;
                dir::find(tx, p, name)?
            };
            match existing {
                Some(e) => {
                    if flags & libc::O_EXCL != 0 {
                        return err(libc::EEXIST, "file exists");
                    }
                    let mut i = tx.get(e.ino)?;
                    if i.is_dir() {
                        return err(libc::EISDIR, "is a directory");
                    }
                    perm::check(&i, cred, open_mask(flags))?;
                    if flags & libc::O_TRUNC != 0 && i.kind == FileKind::Regular {
                        Self::open_truncate(tx, &mut i, cred)?;
                    }
                    Ok(attr_of(0, tx.info.guid, &i))
                }
                None => {
                    let i = Self::make_node(
                        tx,
                        p,
                        name,
                        FileKind::Regular,
                        mode & 0o7777 & !umask,
                        0,
                        &[],
                        cred,
                    )?;
                    Ok(attr_of(0, tx.info.guid, &i))
                }
            }
        })?;
        self.inc_open(a.ino);
        Ok(a)
    }

    fn open_truncate(tx: &mut Tx, i: &mut Inode, cred: &Cred) -> Result<()> {
        file::truncate(tx, i, 0)?;
        i.mtime = tx.now;
        i.ctime = tx.now;
        if !cred.is_root() {
            i.mode = perm::kill_setid(i.mode);
        }
        tx.put(i.clone());
        Ok(())
    }

    /// Adds a hard link `newparent/newname` to the non-directory `ino`.
    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8], cred: &Cred) -> Result<Attr> {
        check_name(newname)?;
        let src = self.live_ino(ino)?;
        let np = self.live_ino(newparent)?;
        self.write_txn(|tx| {
            let d = get_dir(tx, np)?;
            perm::check(&d, cred, X_OK)?;
            if is_dot(newname)
                || (np == ROOT_INO && newname == b".snapshot")
                || dir::find(tx, np, newname)?.is_some()
            {
                return err(libc::EEXIST, "name exists");
            }
            perm::check(&d, cred, W_OK)?;
            let mut i = tx.get(src)?;
            if i.is_dir() {
                return err(libc::EPERM, "cannot hard-link a directory");
            }
            if i.nlink == 0 {
                return err(libc::ENOENT, "file has been removed");
            }
            if i.nlink >= LINK_MAX {
                return err(libc::EMLINK, "too many links");
            }
            dir::insert(tx, np, newname, src, i.kind)?;
            i.nlink += 1;
            i.ctime = tx.now;
            tx.put(i.clone());
            let mut d = tx.get(np)?;
            d.size = d.size.saturating_add(1);
            d.mtime = tx.now;
            d.ctime = tx.now;
            tx.put(d);
            Ok(attr_of(0, tx.info.guid, &i))
        })
    }

    // ----- removing names --------------------------------------------------

    /// Removes the non-directory entry `name`; the inode goes when its last
    /// link and last open are gone.
    pub fn unlink(&self, parent: u64, name: &[u8], cred: &Cred) -> Result<()> {
        self.remove(parent, name, false, cred)
    }

    /// Removes the empty directory `name`.
    pub fn rmdir(&self, parent: u64, name: &[u8], cred: &Cred) -> Result<()> {
        if name == b"." {
            return err(libc::EINVAL, "cannot remove '.'");
        }
        if name == b".." {
            return err(libc::ENOTEMPTY, "cannot remove '..'");
        }
        self.remove(parent, name, true, cred)
    }

    fn remove(&self, parent: u64, name: &[u8], isdir: bool, cred: &Cred) -> Result<()> {
        if !is_dot(name) {
            check_name(name)?;
        }
        let p = self.live_ino(parent)?;
        if p == ROOT_INO && name == b".snapshot" {
            return err(libc::EROFS, ".snapshot is read-only");
        }
        self.write_txn(|tx| {
            let d = get_dir(tx, p)?;
            perm::check(&d, cred, X_OK)?;
            if is_dot(name) {
                return err(libc::EISDIR, "is a directory");
            }
            let e = dir::find(tx, p, name)?
                .ok_or_else(|| FsError::new(libc::ENOENT, "no such entry"))?;
            perm::check(&d, cred, W_OK)?;
            let mut v = tx.get(e.ino)?;
            perm::check_sticky(&d, &v, cred)?;
            if isdir {
                if !v.is_dir() {
                    return err(libc::ENOTDIR, "not a directory");
                }
                if v.size > 0 {
                    return err(libc::ENOTEMPTY, "directory not empty");
                }
            } else if v.is_dir() {
                return err(libc::EISDIR, "is a directory");
            }
            dir::remove(tx, p, e.h)?;
            let mut d = tx.get(p)?;
            d.size = d.size.saturating_sub(1);
            if isdir {
                d.nlink = d.nlink.saturating_sub(1);
            }
            d.mtime = tx.now;
            d.ctime = tx.now;
            tx.put(d);
            v.nlink = if isdir { 0 } else { v.nlink.saturating_sub(1) };
            v.ctime = tx.now;
            self.dispose(tx, v)
        })
    }

    /// Renames `parent/name` to `newparent/newname` atomically, replacing
    /// a compatible target (file over file, directory over empty
    /// directory). `flags`: [`RENAME_NOREPLACE`] or [`RENAME_EXCHANGE`].
    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
        cred: &Cred,
    ) -> Result<()> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags == RENAME_NOREPLACE | RENAME_EXCHANGE
        {
            return err(libc::EINVAL, "bad rename flags");
        }
        if is_dot(name) || is_dot(newname) {
            return err(libc::EBUSY, "cannot rename '.' or '..'");
        }
        check_name(name)?;
        check_name(newname)?;
        let op = self.live_ino(parent)?;
        let np = self.live_ino(newparent)?;
        if op == ROOT_INO && name == b".snapshot" {
            return err(libc::EROFS, ".snapshot is read-only");
        }
        if np == ROOT_INO && newname == b".snapshot" {
            return err(libc::EEXIST, ".snapshot exists");
        }
        let exchange = flags & RENAME_EXCHANGE != 0;
        self.write_txn(|tx| {
            let od = get_dir(tx, op)?;
            let nd = get_dir(tx, np)?;
            perm::check(&od, cred, X_OK)?;
            perm::check(&nd, cred, X_OK)?;
            let src: Dirent = dir::find(tx, op, name)?
                .ok_or_else(|| FsError::new(libc::ENOENT, "no such entry"))?;
            let dst = dir::find(tx, np, newname)?;
            if exchange && dst.is_none() {
                return err(libc::ENOENT, "exchange target missing");
            }
            if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
                return err(libc::EEXIST, "target exists");
            }
            let si = tx.get(src.ino)?;
            let di = match &dst {
                Some(d) => Some(tx.get(d.ino)?),
                None => None,
            };
            let moved = op != np;
            if si.is_dir() && moved && is_ancestor(tx, si.ino, np)? {
                return err(libc::EINVAL, "cannot move a directory into itself");
            }
            if let Some(di) = &di {
                if di.is_dir() && moved && is_ancestor(tx, di.ino, op)? {
                    return if exchange {
                        err(libc::EINVAL, "cannot move a directory into itself")
                    } else {
                        err(libc::ENOTEMPTY, "target is an ancestor of the source")
                    };
                }
                if di.ino == si.ino {
                    return Ok(());
                }
            }
            perm::check(&od, cred, W_OK)?;
            perm::check_sticky(&od, &si, cred)?;
            perm::check(&nd, cred, W_OK)?;
            if let Some(di) = &di {
                perm::check_sticky(&nd, di, cred)?;
                if !exchange {
                    if si.is_dir() && !di.is_dir() {
                        return err(libc::ENOTDIR, "target is not a directory");
                    }
                    if !si.is_dir() && di.is_dir() {
                        return err(libc::EISDIR, "target is a directory");
                    }
                }
            }
            if moved {
                if si.is_dir() {
                    perm::check(&si, cred, W_OK)?;
                }
                if let Some(di) = di.as_ref().filter(|d| exchange && d.is_dir()) {
                    perm::check(di, cred, W_OK)?;
                }
                let dst_dir = di.as_ref().is_some_and(|d| d.is_dir());
                if si.is_dir() && !dst_dir && nd.nlink >= LINK_MAX {
                    return err(libc::EMLINK, "too many subdirectories");
                }
                if exchange && dst_dir && !si.is_dir() && od.nlink >= LINK_MAX {
                    return err(libc::EMLINK, "too many subdirectories");
                }
            }
            if let Some(di) = &di {
                if !exchange && di.is_dir() && di.size > 0 {
                    return err(libc::ENOTEMPTY, "target directory not empty");
                }
            }

            let now = tx.now;
            match (dst, di) {
                (Some(d), Some(di)) if exchange => {
                    dir::set(tx, op, src.h, name, di.ino, di.kind)?;
                    dir::set(tx, np, d.h, newname, si.ino, si.kind)?;
                    let mut s = tx.get(si.ino)?;
                    let mut t = tx.get(di.ino)?;
                    s.ctime = now;
                    t.ctime = now;
                    let (mut o_links, mut n_links) = (0i64, 0i64);
                    if moved && s.is_dir() {
                        s.parent = np;
                        o_links -= 1;
                        n_links += 1;
                    }
                    if moved && t.is_dir() {
                        t.parent = op;
                        o_links += 1;
                        n_links -= 1;
                    }
                    tx.put(s);
                    tx.put(t);
                    Self::touch_dir(tx, op, 0, o_links)?;
                    Self::touch_dir(tx, np, 0, n_links)?;
                }
                (dst, di) => {
                    dir::remove(tx, op, src.h)?;
                    let mut n_links = 0i64;
                    let mut n_entries = 0i64;
                    if let (Some(d), Some(mut v)) = (dst, di) {
                        dir::set(tx, np, d.h, newname, si.ino, si.kind)?;
                        v = tx.get(v.ino)?;
                        if v.is_dir() {
                            v.nlink = 0;
                            n_links -= 1;
                        } else {
                            v.nlink = v.nlink.saturating_sub(1);
                        }
                        v.ctime = now;
                        self.dispose(tx, v)?;
                    } else {
                        dir::insert(tx, np, newname, si.ino, si.kind)?;
                        n_entries += 1;
                    }
                    let mut s = tx.get(si.ino)?;
                    s.ctime = now;
                    let mut o_links = 0i64;
                    if s.is_dir() && moved {
                        s.parent = np;
                        o_links -= 1;
                        n_links += 1;
                    }
                    tx.put(s);
                    Self::touch_dir(tx, op, -1, o_links)?;
                    Self::touch_dir(tx, np, n_entries, n_links)?;
                }
            }
            Ok(())
        })
    }

    /// Adjusts a directory's entry and link counts and sets mtime/ctime.
    fn touch_dir(tx: &mut Tx, ino: u64, entries: i64, links: i64) -> Result<()> {
        let mut d = tx.get(ino)?;
        d.size = d.size.saturating_add_signed(entries);
        d.nlink = (i64::from(d.nlink) + links).clamp(0, i64::from(u32::MAX)) as u32;
        d.mtime = tx.now;
        d.ctime = tx.now;
        tx.put(d);
        Ok(())
    }

    // ----- open files ------------------------------------------------------

    /// Opens `ino` with open(2) `flags` (checks permissions; `O_TRUNC`
    /// empties a regular file). Counts the open so an unlinked file keeps
    /// its data until [`Fs::release`].
    pub fn open(&self, ino: u64, flags: i32, cred: &Cred) -> Result<Attr> {
        let mask = open_mask(flags);
        let local = match self.place(ino)? {
            Place::Live(l) => l,
            Place::SnapDir => {
                if mask & W_OK != 0 {
                    return err(libc::EROFS, "snapshots are read-only");
                }
                return self.snapdir_attr();
            }
            Place::Snap(..) => {
                if mask & W_OK != 0 {
                    return err(libc::EROFS, "snapshots are read-only");
                }
                return self.read_on(ino, |tx, slot, l| {
                    let i = tx.get(l)?;
                    if i.kind == FileKind::Symlink {
                        return err(libc::ELOOP, "is a symlink");
                    }
                    perm::check(&i, cred, mask)?;
                    Ok(attr_of(slot, tx.info.guid, &i))
                });
            }
        };
        self.inc_open(local);
        let trunc = flags & libc::O_TRUNC != 0;
        let check = |tx: &mut Tx| {
            let mut i = tx.get(local)?;
            if i.is_dir() && mask & W_OK != 0 {
                return err(libc::EISDIR, "is a directory");
            }
            if i.kind == FileKind::Symlink {
                return err(libc::ELOOP, "is a symlink");
            }
            perm::check(&i, cred, mask)?;
            // Opening a file (not a FIFO, socket or device) for writing on a
            // read-only dataset fails at open, as on a read-only mount.
            let writes_data = i.kind == FileKind::Regular || i.is_dir();
            if mask & W_OK != 0 && writes_data && tx.info.readonly {
                return err(libc::EROFS, "the dataset is read-only");
            }
            if trunc && i.kind == FileKind::Regular {
                Self::open_truncate(tx, &mut i, cred)?;
            }
            Ok(attr_of(0, tx.info.guid, &i))
        };
        let r = if trunc {
            self.write_txn(check)
        } else {
            self.read_on(local, |tx, _, _| check(tx))
        };
        if r.is_err() {
            // Undo the count (and free the inode if it became an orphan).
            let _ = self.release(local);
        }
        r
    }

    /// Opens directory `ino` for reading (needs read permission).
    pub fn opendir(&self, ino: u64, cred: &Cred) -> Result<Attr> {
        let a = self.getattr(ino)?;
        if a.kind != FileKind::Directory {
            return err(libc::ENOTDIR, "not a directory");
        }
        if let Place::Live(l) = self.place(ino)? {
            self.inc_open(l);
            let r = self.read_on(l, |tx, _, l| perm::check(&tx.get(l)?, cred, R_OK));
            if let Err(e) = r {
                let _ = self.release(l);
                return Err(e);
            }
        } else if let Place::Snap(..) = self.place(ino)? {
            self.read_on(ino, |tx, _, l| perm::check(&tx.get(l)?, cred, R_OK))?;
        }
        Ok(a)
    }

    /// Ends one open of `ino` (from `open`, `create` or `opendir`); the
    /// last release of an unlinked inode frees it.
    pub fn release(&self, ino: u64) -> Result<()> {
        let local = match self.place(ino) {
            Ok(Place::Live(l)) => l,
            _ => return Ok(()),
        };
        {
            let mut open = lock(&self.open);
            match open.get_mut(&local) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    return Ok(());
                }
                Some(_) => {
                    open.remove(&local);
                }
                None => {}
            }
        }
        self.live.txn(true, &mut |s| {
            let mut tx = Tx::new(s);
            if tx.info.readonly {
                return Ok(());
            }
            match tx.try_get(local)? {
                Some(i) if i.nlink == 0 && self.open_count(local) == 0 => {
                    tx.free(local)?;
                    tx.s.delete(&inode::orphan_key(local))?;
                }
                _ => {}
            }
            Ok(())
        })
    }

    /// Same as [`Fs::release`], for directories.
    pub fn releasedir(&self, ino: u64) -> Result<()> {
        self.release(ino)
    }

    /// Reads up to `size` bytes (at most [`MAX_READ`]) at `offset`: short
    /// at end of file; holes read as zeros. Refreshes atime by relatime
    /// rules.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        if let Place::SnapDir = self.place(ino)? {
            return err(libc::EISDIR, "is a directory");
        }
        let (data, touch) = self.read_on(ino, |tx, _, l| {
            let i = tx.get(l)?;
            match i.kind {
                FileKind::Regular => {}
                FileKind::Directory => return err(libc::EISDIR, "is a directory"),
                _ => return err(libc::EINVAL, "not a regular file"),
            }
            let data = file::read(tx, &i, offset, u64::from(size.min(MAX_READ)))?;
            Ok((data, wants_atime(tx, &i)))
        })?;
        if touch {
            self.touch_atime(ino);
        }
        Ok(data)
    }

    /// Best-effort atime refresh after a read (a failure, e.g. ENOSPC,
    /// must not fail the read).
    fn touch_atime(&self, ino: u64) {
        if let Ok(local) = self.live_ino(ino) {
            let _ = self.write_txn(|tx| {
                let mut i = tx.get(local)?;
                if wants_atime(tx, &i) {
                    i.atime = tx.now;
                    tx.put(i);
                }
                Ok(())
            });
        }
    }

    /// Writes `data` at `offset` (or atomically at end of file when
    /// `append`), returning the bytes written. A write by non-root clears
    /// set-id bits, as Linux does.
    pub fn write(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        append: bool,
        cred: &Cred,
    ) -> Result<usize> {
        let local = self.live_ino(ino)?;
        self.write_txn(|tx| {
            let mut i = tx.get(local)?;
            match i.kind {
                FileKind::Regular => {}
                FileKind::Directory => return err(libc::EISDIR, "is a directory"),
                _ => return err(libc::EINVAL, "not a regular file"),
            }
            let off = if append { i.size } else { offset };
            file::write(tx, &mut i, off, data)?;
            if !data.is_empty() {
                i.mtime = tx.now;
                i.ctime = tx.now;
                if !cred.is_root() {
                    i.mode = perm::kill_setid(i.mode);
                }
                tx.put(i);
            }
            Ok(data.len())
        })
    }

    /// `fallocate`: mode 0 only extends the size (a copy-on-write store
    /// cannot reserve blocks ahead of writing them, so nothing is
    /// preallocated); `KEEP_SIZE` alone is accepted and does nothing;
    /// `PUNCH_HOLE | KEEP_SIZE` frees the range. Other modes: EOPNOTSUPP.
    pub fn fallocate(&self, ino: u64, offset: u64, length: u64, mode: u32) -> Result<()> {
        let local = self.live_ino(ino)?;
        if length == 0 || offset > i64::MAX as u64 || length > i64::MAX as u64 {
            return err(libc::EINVAL, "bad fallocate range");
        }
        let punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
        if mode != 0 && mode != FALLOC_FL_KEEP_SIZE && mode != punch {
            return err(libc::EOPNOTSUPP, "unsupported fallocate mode");
        }
        let end = offset
            .checked_add(length)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| FsError::new(libc::EFBIG, "beyond the largest file size"))?;
        self.write_txn(|tx| {
            let mut i = tx.get(local)?;
            match i.kind {
                FileKind::Regular => {}
                FileKind::Directory => return err(libc::EISDIR, "is a directory"),
                _ => return err(libc::ENODEV, "not a regular file"),
            }
            if mode == punch {
                file::punch(tx, &mut i, offset, length)?;
                i.mtime = tx.now;
                i.ctime = tx.now;
                tx.put(i);
            } else if mode == 0 && end > i.size {
                i.size = end;
                i.mtime = tx.now;
                i.ctime = tx.now;
                tx.put(i);
            }
            Ok(())
        })
    }

    /// Makes every completed change durable (the dataset's txg sync).
    pub fn fsync(&self, ino: u64) -> Result<()> {
        match self.place(ino)? {
            Place::Live(_) => self.live.sync(),
            _ => Ok(()),
        }
    }

    // ----- directories -----------------------------------------------------

    /// Up to `limit` entries of directory `ino` after `cookie` (0 = from
    /// the start; `.` and `..` come first with cookies 1 and 2). Cookies
    /// are derived from the entries' keys, so they stay valid across
    /// restarts and concurrent changes.
    pub fn readdir(&self, ino: u64, cookie: u64, limit: usize) -> Result<Vec<DirEntry>> {
        Ok(self
            .readdir_impl(ino, cookie, limit, false)?
            .into_iter()
            .map(|(e, _)| e)
            .collect())
    }

    /// [`Fs::readdir`] with each entry's attributes, read in the same
    /// transaction.
    pub fn readdirplus(
        &self,
        ino: u64,
        cookie: u64,
        limit: usize,
    ) -> Result<Vec<(DirEntry, Attr)>> {
        self.readdir_impl(ino, cookie, limit, true)?
            .into_iter()
            .map(|(e, a)| match a {
                Some(a) => Ok((e, a)),
                None => Err(FsError::io(
                    "internal: readdirplus entry without attributes",
                )),
            })
            .collect()
    }

    fn readdir_impl(
        &self,
        ino: u64,
        cookie: u64,
        limit: usize,
        plus: bool,
    ) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        let dot = |ino: u64, cookie: u64, name: &[u8]| DirEntry {
            ino,
            cookie,
            kind: FileKind::Directory,
            name: name.to_vec(),
        };
        if let Place::SnapDir = self.place(ino)? {
            let mut out = Vec::new();
            if cookie == 0 && out.len() < limit {
                let a = if plus {
                    Some(self.snapdir_attr()?)
                } else {
                    None
                };
                out.push((dot(SNAPDIR_INO, 1, b"."), a));
            }
            if cookie <= 1 && out.len() < limit {
                let a = if plus {
                    Some(self.getattr(ROOT_INO)?)
                } else {
                    None
                };
                out.push((dot(ROOT_INO, 2, b".."), a));
            }
            for (slot, name) in self.snapshot_list()? {
                if out.len() >= limit {
                    break;
                }
                if slot + COOKIE_BASE <= cookie {
                    continue;
                }
                let e = DirEntry {
                    ino: gino(slot, ROOT_INO),
                    cookie: slot + COOKIE_BASE,
                    kind: FileKind::Directory,
                    name: name.into_bytes(),
                };
                let a = if plus {
                    Some(self.snap_root_attr(slot)?)
                } else {
                    None
                };
                out.push((e, a));
            }
            return Ok(out);
        }
        let (out, touch, snap_parent) = self.read_on(ino, |tx, slot, l| {
            let d = tx.get(l)?;
            if !d.is_dir() {
                return err(libc::ENOTDIR, "not a directory");
            }
            let guid = tx.info.guid;
            let mut out = Vec::new();
            let mut snap_parent = None;
            if cookie == 0 && limit > 0 {
                let a = plus.then(|| attr_of(slot, guid, &d));
                out.push((dot(gino(slot, l), 1, b"."), a));
            }
            if cookie <= 1 && out.len() < limit {
                if slot != 0 && l == ROOT_INO {
                    snap_parent = Some(out.len());
                    out.push((dot(SNAPDIR_INO, 2, b".."), None));
                } else {
                    let a = if plus {
                        // A removed (but still open) directory's parent
                        // may be gone too: fall back to the directory.
                        let p = tx.try_get(d.parent)?.unwrap_or_else(|| d.clone());
                        Some(attr_of(slot, guid, &p))
                    } else {
                        None
                    };
                    out.push((dot(gino(slot, d.parent), 2, b".."), a));
                }
            }
            let want = limit - out.len();
            if want > 0 && d.nlink > 0 {
                let after = cookie.checked_sub(COOKIE_BASE);
                for e in dir::list(tx, l, after, want)? {
                    let a = if plus {
                        Some(attr_of(slot, guid, &tx.get(e.ino)?))
                    } else {
                        None
                    };
                    out.push((
                        DirEntry {
                            ino: gino(slot, e.ino),
                            cookie: e.h + COOKIE_BASE,
                            kind: e.kind,
                            name: e.name,
                        },
                        a,
                    ));
                }
            }
            Ok((out, wants_atime(tx, &d), snap_parent))
        })?;
        let mut out = out;
        if let (Some(idx), true) = (snap_parent, plus) {
            if let Some(slot) = out.get_mut(idx) {
                slot.1 = Some(self.snapdir_attr()?);
            }
        }
        if touch {
            self.touch_atime(ino);
        }
        Ok(out)
    }

    /// Filesystem statistics (space from the dataset; inode numbers are
    /// plentiful: 2^48 per dataset).
    pub fn statfs(&self, _ino: u64) -> Result<StatFs> {
        self.live.txn(false, &mut |s| {
            let mut tx = Tx::new(s);
            let sp = tx.s.space();
            let next = tx.superblock()?.map(|sb| sb.next_ino).unwrap_or(FIRST_INO);
            let bsize = 4096u64;
            let ffree = MAX_LOCAL_INO - next.min(MAX_LOCAL_INO);
            Ok(StatFs {
                bsize: bsize as u32,
                blocks: sp.total / bsize,
                bfree: sp.available / bsize,
                bavail: sp.available / bsize,
                files: next - FIRST_INO + ffree,
                ffree,
                namelen: NAME_MAX as u32,
            })
        })
    }

    // ----- extended attributes ---------------------------------------------

    /// Sets xattr `name` (namespaces `user.`, `trusted.`, `security.`;
    /// values up to 64 KiB). `flags`: [`XATTR_CREATE`] / [`XATTR_REPLACE`].
    pub fn setxattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        cred: &Cred,
    ) -> Result<()> {
        let ns = xattr_ns(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return err(libc::E2BIG, "xattr value larger than 64 KiB");
        }
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return err(libc::EINVAL, "bad xattr flags");
        }
        let local = self.live_ino(ino)?;
        self.write_txn(|tx| {
            let mut i = tx.get(local)?;
            xattr_perm(&i, &ns, true, cred)?;
            let exists = xattr::get(tx, local, name)?.is_some();
            if flags & XATTR_CREATE != 0 && exists {
                return err(libc::EEXIST, "xattr exists");
            }
            if flags & XATTR_REPLACE != 0 && !exists {
                return err(libc::ENODATA, "no such xattr");
            }
            xattr::set(tx, local, name, value)?;
            i.ctime = tx.now;
            tx.put(i);
            Ok(())
        })
    }

    /// The value of xattr `name` (ENODATA if unset). Size negotiation
    /// (`size == 0`, ERANGE) is the front end's job.
    pub fn getxattr(&self, ino: u64, name: &[u8], cred: &Cred) -> Result<Vec<u8>> {
        let ns = xattr_ns(name)?;
        if let Place::SnapDir = self.place(ino)? {
            return err(libc::ENODATA, "no such xattr");
        }
        self.read_on(ino, |tx, _, l| {
            let i = tx.get(l)?;
            xattr_perm(&i, &ns, false, cred)?;
            xattr::get(tx, l, name)?.ok_or_else(|| FsError::new(libc::ENODATA, "no such xattr"))
        })
    }

    /// Names of the xattrs of `ino` (`trusted.` ones only for root).
    pub fn listxattr(&self, ino: u64, cred: &Cred) -> Result<Vec<Vec<u8>>> {
        if let Place::SnapDir = self.place(ino)? {
            return Ok(Vec::new());
        }
        self.read_on(ino, |tx, _, l| {
            tx.get(l)?;
            let mut names = xattr::list(tx, l)?;
            if !cred.is_root() {
                names.retain(|n| !n.starts_with(b"trusted."));
            }
            Ok(names)
        })
    }

    /// Removes xattr `name` (ENODATA if unset).
    pub fn removexattr(&self, ino: u64, name: &[u8], cred: &Cred) -> Result<()> {
        let ns = xattr_ns(name)?;
        let local = self.live_ino(ino)?;
        self.write_txn(|tx| {
            let mut i = tx.get(local)?;
            xattr_perm(&i, &ns, true, cred)?;
            if !xattr::remove(tx, local, name)? {
                return err(libc::ENODATA, "no such xattr");
            }
            i.ctime = tx.now;
            tx.put(i);
            Ok(())
        })
    }
}
