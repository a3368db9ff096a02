//! `Fs`: the inode-based POSIX API (see the crate docs for the design).
//!
//! This module holds the struct, mounting (and reaping orphans), the map
//! from mount-wide inode numbers to the live dataset or a snapshot, open
//! counts, lookup and attributes. The other operations live by concern:
//! `namespace` (create, link, remove, rename), `io` (open, read, write,
//! sync), `readdir`, `xattrs`.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::codec::{self, K_ORPHAN};
use crate::dir::{self};
use crate::file::{self, MAX_FILE_SIZE};
use crate::inode::{self, Inode, Superblock, Tx, FIRST_INO, MAX_LOCAL_INO};
use crate::notify::Hub;
use crate::perm;
use crate::store::Backend;
use crate::types::*;
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
pub(crate) enum Place<B> {
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
    pub(crate) live: Arc<B>,
    pub(crate) open: Mutex<HashMap<u64, u32>>,
    snaps: Mutex<Snaps<B>>,
    /// Sequential readers, for read-ahead.
    pub(crate) readahead: tarn_dataset::readahead::ReadAhead,
    /// Who hears about committed changes (`notify`).
    pub(crate) notify: Hub,
    /// The key of name hashes, from the superblock (encrypted datasets);
    /// fixed for the dataset's life.
    name_key: Option<[u8; 32]>,
    /// Where the last write to each file ended (see `Fs::write_iov`).
    pub(crate) last_writes: Mutex<HashMap<u64, LastWrite>>,
    /// This opening of the dataset, among all of this process (see
    /// [`Fs::epoch`]).
    epoch: u64,
}

/// The end of a file's last write, its record size, and the backend's
/// generation read before that write's transaction.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LastWrite {
    pub end: u64,
    pub rs: u64,
    pub generation: u64,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn err<T>(errno: i32, msg: &'static str) -> Result<T> {
    Err(FsError::new(errno, msg))
}

/// Rejects names no directory entry can have.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
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

pub(crate) fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

pub(crate) fn gino(slot: u64, local: u64) -> u64 {
    (slot << SLOT_SHIFT) | local
}

pub(crate) fn attr_of(slot: u64, guid: u64, i: &Inode) -> Attr {
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
pub(crate) fn get_dir(tx: &mut Tx, ino: u64) -> Result<Inode> {
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
pub(crate) fn wants_atime(tx: &Tx, i: &Inode) -> bool {
    tx.info.atime
        && !tx.info.readonly
        && (i.atime <= i.mtime
            || i.atime <= i.ctime
            || tx.now.as_nanos() - i.atime.as_nanos() >= RELATIME_NS)
}

/// Walks up from `from` (inclusive) to the root: is `anc` on the way?
pub(crate) fn is_ancestor(tx: &mut Tx, anc: u64, from: u64) -> Result<bool> {
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

pub(crate) fn open_mask(flags: i32) -> u32 {
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
                // An encrypted dataset keys its name hashes with a secret
                // of its own, kept in the (sealed) superblock.
                let name_key = if tx.info.encrypted {
                    let mut k = [0u8; 32];
                    tarn_dataset::crypt::random_bytes(&mut k)
                        .map_err(|e| FsError::io(format!("a name key: {e}")))?;
                    Some(k)
                } else {
                    None
                };
                let sb = Superblock {
                    next_ino: FIRST_INO,
                    name_key,
                };
                tx.s.put(&inode::super_key(), &sb.encode())?;
                let mut root = Inode::new(ROOT_INO, FileKind::Directory, 0o755, 0, 0, tx.now);
                root.nlink = 2;
                root.parent = ROOT_INO;
                tx.put(root);
                tx.flush()
            })?;
        }
        // Names hash with the superblock's key, if it has one: read once.
        let name_key = backend.txn(false, &mut |s| {
            let mut tx = Tx::new(s);
            Ok(tx.superblock()?.and_then(|sb| sb.name_key))
        })?;
        let fs = Fs {
            name_key,
            live: backend,
            open: Mutex::new(HashMap::new()),
            readahead: Default::default(),
            snaps: Mutex::new(Snaps {
                slots: BTreeMap::new(),
                by_guid: HashMap::new(),
                next: 1,
            }),
            notify: Hub::default(),
            last_writes: Mutex::new(HashMap::new()),
            epoch: {
                static OPENED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            },
        };
        if !info.readonly {
            fs.reap_orphans()?;
        }
        Ok(fs)
    }

    /// A number that differs for each opening of a dataset in this
    /// process: a filesystem opened again (after its pool was exported and
    /// imported, say, once a failed sync stopped it) may have lost writes
    /// that were answered but not committed, which an NFS client learns
    /// from a changed write verifier made with this.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The live dataset's backend.
    pub fn backend(&self) -> &Arc<B> {
        &self.live
    }

    pub(crate) fn reap_orphans(&self) -> Result<()> {
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

    pub(crate) fn place(&self, ino: u64) -> Result<Place<B>> {
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
    pub(crate) fn live_ino(&self, ino: u64) -> Result<u64> {
        match self.place(ino)? {
            Place::Live(l) => Ok(l),
            _ => err(libc::EROFS, "snapshots are read-only"),
        }
    }

    /// Runs a read-only transaction on the backend of `ino`; `f` gets the
    /// slot and local inode number. The `.snapshot` directory is handled
    /// by callers before this.
    pub(crate) fn read_on<R>(
        &self,
        ino: u64,
        mut f: impl FnMut(&mut Tx, u64, u64) -> Result<R>,
    ) -> Result<R> {
        match self.place(ino)? {
            Place::Live(l) => self.live.txn(false, &mut |s| {
                f(&mut Tx::new(s).with_name_key(self.name_key), 0, l)
            }),
            // A snapshot's superblock has the same name key as its
            // dataset's: it is a copy of it.
            Place::Snap(slot, b, l) => b.txn(false, &mut |s| {
                f(&mut Tx::new(s).with_name_key(self.name_key), slot, l)
            }),
            Place::SnapDir => err(libc::EINVAL, "internal: .snapshot reached read_on"),
        }
    }

    /// Runs a write transaction on the live dataset (EROFS if read-only).
    /// Its changes are published (`notify`) once it has committed.
    pub(crate) fn write_txn<R>(&self, mut f: impl FnMut(&mut Tx) -> Result<R>) -> Result<R> {
        let mut changes = Vec::new();
        let r = self.live.txn(true, &mut |s| {
            let mut tx = Tx::new(s).with_name_key(self.name_key);
            tx.writable()?;
            let r = f(&mut tx)?;
            tx.flush()?;
            changes = tx.take_changes();
            Ok(r)
        })?;
        self.notify.publish(&changes);
        Ok(r)
    }

    /// Refreshes the slot table from the backend and returns the
    /// snapshots as (slot, name), ordered by slot.
    pub(crate) fn snapshot_list(&self) -> Result<Vec<(u64, String)>> {
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

    /// The snapshots in `.snapshot` with their creation times (seconds
    /// since the epoch), oldest first: SMB's "Previous Versions" names
    /// them by time.
    pub fn snapshot_times(&self) -> Result<Vec<(String, u64)>> {
        let mut out = Vec::new();
        for (name, b) in self.live.snapshots()? {
            let t = b.txn(false, &mut |s| Ok(s.info().created_unix))?;
            out.push((name, t));
        }
        Ok(out)
    }

    pub(crate) fn snapdir_attr(&self) -> Result<Attr> {
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

    pub(crate) fn snap_root_attr(&self, slot: u64) -> Result<Attr> {
        self.read_on(gino(slot, ROOT_INO), |tx, slot, l| {
            let i = tx.get(l)?;
            Ok(attr_of(slot, tx.info.guid, &i))
        })
    }

    pub(crate) fn open_count(&self, ino: u64) -> u32 {
        lock(&self.open).get(&ino).copied().unwrap_or(0)
    }

    pub(crate) fn inc_open(&self, ino: u64) {
        *lock(&self.open).entry(ino).or_insert(0) += 1;
    }

    /// Takes back one [`Fs::inc_open`] of a transaction that is run again
    /// (nothing else: the inode is the transaction's to keep or free).
    pub(crate) fn uncount_open(&self, ino: u64) {
        let mut open = lock(&self.open);
        if let Some(n) = open.get_mut(&ino) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&ino);
            }
        }
    }

    /// Drops one link's worth from a victim whose link count reached 0:
    /// free it now, or keep it as an orphan while it is open.
    pub(crate) fn dispose(&self, tx: &mut Tx, victim: Inode) -> Result<()> {
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
            if sa.if_ctime.is_some_and(|t| t != i.ctime) {
                return err(
                    crate::GUARD_ERRNO,
                    "the file changed since the client looked",
                );
            }
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
}
