//! Inode records, the superblock, and `Tx`: one transaction's view of the
//! store with a small write-back cache of inodes.
//!
//! The cache exists so an operation can load the same inode twice (a rename
//! inside one directory, a hard link's parent being the same directory)
//! without one copy overwriting the other's changes: every load returns the
//! latest version, and dirty inodes are written once at the end.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::codec::{self, Dec, Enc, K_INODE, K_ORPHAN};
use crate::notify::{Change, ChangeLog};
use crate::store::{Store, StoreInfo, MAX_BLOCK};
use crate::types::{FileKind, Timestamp, ROOT_INO};
use crate::{FsError, Result};

/// Version byte at the start of every inode record.
const INODE_VERSION: u8 = 1;
/// Superblock magic.
const SUPER_MAGIC: &[u8; 8] = b"TARNFS01";
/// First inode number handed out; 0..16 are reserved (0 holds the
/// superblock and orphan list, 1 is the root, 2 the `.snapshot` directory).
pub(crate) const FIRST_INO: u64 = 16;
/// Largest local inode number (inode numbers of snapshots put a slot above).
pub(crate) const MAX_LOCAL_INO: u64 = (1 << 48) - 1;
/// Longest symlink target kept inside the inode record; longer targets go to
/// a block value.
pub(crate) const INLINE_TARGET_MAX: usize = 768;
/// Inode flag: the symlink target is stored in data record 0.
const F_TARGET_IN_BLOCK: u8 = 1;

/// One inode as stored (see `docs/format.md` for the byte layout).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Inode {
    /// Local inode number (from the key, not stored in the value).
    pub ino: u64,
    pub kind: FileKind,
    /// Full mode: type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    /// Regular files: bytes. Directories: number of entries (no `.`/`..`).
    /// Symlinks: target length.
    pub size: u64,
    /// Bytes held by data blocks (for `st_blocks`).
    pub alloc: u64,
    pub rdev: u64,
    pub gen: u64,
    /// Directories: the parent directory (root: itself). Others: 0.
    pub parent: u64,
    /// Record size of a regular file, fixed at creation.
    pub recordsize: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
    /// Symlink target when short enough to be inline.
    pub target: Option<Vec<u8>>,
    pub target_in_block: bool,
}

impl Inode {
    /// A fresh inode with all four times set to `now`.
    pub fn new(ino: u64, kind: FileKind, perm: u32, uid: u32, gid: u32, now: Timestamp) -> Self {
        let gen = (now.sec as u64).rotate_left(32) ^ u64::from(now.nsec) ^ ino.rotate_left(17);
        Inode {
            ino,
            kind,
            mode: kind.mode_bits() | (perm & 0o7777),
            uid,
            gid,
            nlink: 1,
            size: 0,
            alloc: 0,
            rdev: 0,
            gen,
            parent: 0,
            recordsize: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            target: None,
            target_in_block: false,
        }
    }

    /// Replaces the permission bits, keeping the type bits.
    pub fn set_perm(&mut self, perm: u32) {
        self.mode = self.kind.mode_bits() | (perm & 0o7777);
    }

    pub fn is_dir(&self) -> bool {
        self.kind == FileKind::Directory
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        let flags = if self.target_in_block {
            F_TARGET_IN_BLOCK
        } else {
            0
        };
        e.u8(INODE_VERSION)
            .u8(flags)
            .u32(self.mode)
            .u32(self.uid)
            .u32(self.gid)
            .u32(self.nlink)
            .u64(self.size)
            .u64(self.alloc)
            .u64(self.rdev)
            .u64(self.gen)
            .u64(self.parent)
            .u32(self.recordsize);
        for t in [self.atime, self.mtime, self.ctime, self.crtime] {
            e.i64(t.sec).u32(t.nsec);
        }
        let target = self.target.as_deref().unwrap_or(&[]);
        e.u16(target.len() as u16).bytes(target);
        e.0
    }

    pub fn decode(ino: u64, v: &[u8]) -> Result<Inode> {
        let mut d = Dec::new(v, "inode record");
        let version = d.u8()?;
        if version != INODE_VERSION {
            return Err(d.bad(format_args!("inode {ino}: unknown version {version}")));
        }
        let flags = d.u8()?;
        let mode = d.u32()?;
        let kind = FileKind::from_mode(mode)
            .ok_or_else(|| d.bad(format_args!("inode {ino}: bad mode {mode:o}")))?;
        let uid = d.u32()?;
        let gid = d.u32()?;
        let nlink = d.u32()?;
        let size = d.u64()?;
        let alloc = d.u64()?;
        let rdev = d.u64()?;
        let gen = d.u64()?;
        let parent = d.u64()?;
        let recordsize = d.u32()?;
        let mut times = [Timestamp::default(); 4];
        for t in times.iter_mut() {
            let sec = d.i64()?;
            let nsec = d.u32()?;
            if nsec >= 1_000_000_000 {
                return Err(d.bad(format_args!("inode {ino}: nanoseconds {nsec}")));
            }
            *t = Timestamp { sec, nsec };
        }
        let tlen = d.u16()? as usize;
        let target = d.take(tlen)?.to_vec();
        if kind == FileKind::Regular && !(512..=MAX_BLOCK as u32).contains(&recordsize) {
            return Err(d.bad(format_args!("inode {ino}: record size {recordsize}")));
        }
        let target_in_block = flags & F_TARGET_IN_BLOCK != 0;
        Ok(Inode {
            ino,
            kind,
            mode,
            uid,
            gid,
            nlink,
            size,
            alloc,
            rdev,
            gen,
            parent,
            recordsize,
            atime: times[0],
            mtime: times[1],
            ctime: times[2],
            crtime: times[3],
            target: (kind == FileKind::Symlink && !target_in_block).then_some(target),
            target_in_block,
        })
    }
}

/// The superblock: format identity, the inode-number counter, and in an
/// encrypted dataset the secret key of its name hashes (version 2).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub next_ino: u64,
    pub name_key: Option<[u8; 32]>,
}

impl std::fmt::Debug for Superblock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Superblock")
            .field("next_ino", &self.next_ino)
            .field("name_key", &self.name_key.map(|_| "<secret>"))
            .finish()
    }
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        let version = if self.name_key.is_some() { 2 } else { 1 };
        e.bytes(SUPER_MAGIC)
            .u32(version)
            .u64(self.next_ino)
            .u64(ROOT_INO);
        if let Some(k) = &self.name_key {
            e.bytes(k);
        }
        e.0
    }
    pub fn decode(v: &[u8]) -> Result<Superblock> {
        let mut d = Dec::new(v, "superblock");
        if d.take(8)? != SUPER_MAGIC {
            return Err(d.bad("bad magic (not a tarn-fs dataset?)"));
        }
        let version = d.u32()?;
        if version != 1 && version != 2 {
            return Err(d.bad(format_args!("unknown version {version}")));
        }
        let next_ino = d.u64()?;
        let root = d.u64()?;
        if root != ROOT_INO || next_ino < FIRST_INO {
            return Err(d.bad(format_args!("root {root}, next inode {next_ino}")));
        }
        let name_key = if version == 2 {
            let mut k = [0u8; 32];
            k.copy_from_slice(d.take(32)?);
            Some(k)
        } else {
            None
        };
        Ok(Superblock { next_ino, name_key })
    }
}

pub(crate) fn super_key() -> Vec<u8> {
    codec::key2(0, K_INODE)
}

pub(crate) fn orphan_key(ino: u64) -> Vec<u8> {
    codec::key3(0, K_ORPHAN, ino)
}

enum Cached {
    Clean(Inode),
    Dirty(Inode),
    Freed,
}

/// One transaction: the store, its facts, the time the operation happens,
/// and the inode cache.
pub(crate) struct Tx<'a> {
    pub s: &'a mut dyn Store,
    pub info: StoreInfo,
    pub now: Timestamp,
    cache: BTreeMap<u64, Cached>,
    /// What this transaction changed, for `notify`.
    log: ChangeLog,
    /// The key of name hashes, once read (encrypted datasets).
    name_key: Option<Option<[u8; 32]>>,
}

/// Inode `ino` from what the store holds under its key.
fn stored_inode(ino: u64, v: Option<crate::Val>) -> Result<Option<Inode>> {
    match v {
        None => Ok(None),
        Some(crate::Val::Plain(v)) => Inode::decode(ino, &v).map(Some),
        Some(crate::Val::Block { .. }) => {
            Err(FsError::io(format!("inode {ino} stored as a block")))
        }
    }
}

impl<'a> Tx<'a> {
    pub fn new(s: &'a mut dyn Store) -> Self {
        let info = s.info();
        let (sec, nsec) = s.now();
        Tx {
            s,
            info,
            now: Timestamp::new(sec, nsec),
            cache: BTreeMap::new(),
            log: ChangeLog::default(),
            name_key: None,
        }
    }

    /// This transaction with the dataset's name key already known (the
    /// mount read it), so hashing a name reads nothing.
    pub fn with_name_key(mut self, key: Option<[u8; 32]>) -> Self {
        self.name_key = Some(key);
        self
    }

    /// The hash bucket of a directory entry or xattr name in `ino` (see
    /// `codec::name_bucket`): keyed when the superblock holds a name key
    /// (encrypted datasets, and what was received from them).
    pub fn name_bucket(&mut self, ino: u64, name: &[u8]) -> Result<u64> {
        let key = match self.name_key {
            Some(k) => k,
            None => {
                let k = self
                    .superblock()?
                    .ok_or_else(|| FsError::io("superblock missing"))?
                    .name_key;
                self.name_key = Some(k);
                k
            }
        };
        Ok(codec::name_bucket(key.as_ref(), ino, name))
    }

    /// The inode, or ENOENT.
    pub fn get(&mut self, ino: u64) -> Result<Inode> {
        self.try_get(ino)?
            .ok_or_else(|| FsError::new(libc::ENOENT, format!("no inode {ino}")))
    }

    /// The inode if it exists.
    pub fn try_get(&mut self, ino: u64) -> Result<Option<Inode>> {
        let (inode, loaded) = self.find(ino)?;
        if let (Some(i), true) = (&inode, loaded) {
            self.cache.insert(ino, Cached::Clean(i.clone()));
        }
        Ok(inode)
    }

    /// Inodes to look at only, or ENOENT: like [`Tx::get`], but those
    /// loaded from the store are not kept (listing a large directory's
    /// attributes would otherwise fill the transaction's cache with inodes
    /// nobody changes), and they are read in one ordered pass
    /// ([`Store::get_many`]), which is what a page of a listing costs.
    pub fn peek_many(&mut self, inos: &[u64]) -> Result<Vec<Inode>> {
        let gone = |ino: u64| FsError::new(libc::ENOENT, format!("no inode {ino}"));
        let mut out: Vec<Option<Inode>> = vec![None; inos.len()];
        let mut wanted: Vec<(u64, usize)> = Vec::new();
        for (i, &ino) in inos.iter().enumerate() {
            match self.cache.get(&ino) {
                Some(Cached::Clean(x)) | Some(Cached::Dirty(x)) => out[i] = Some(x.clone()),
                Some(Cached::Freed) => return Err(gone(ino)),
                None if ino == 0 || ino > MAX_LOCAL_INO => return Err(gone(ino)),
                None => wanted.push((ino, i)),
            }
        }
        // Keys are the inode numbers big-endian: sorted numbers, sorted keys.
        wanted.sort_unstable();
        let keys: Vec<[u8; 9]> = wanted
            .iter()
            .map(|&(ino, _)| codec::key2_array(ino, K_INODE))
            .collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        let vals = self.s.get_many(&refs)?;
        for (&(ino, i), v) in wanted.iter().zip(vals) {
            out[i] = Some(stored_inode(ino, v)?.ok_or_else(|| gone(ino))?);
        }
        out.into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| FsError::io("internal: an inode of a batch was not looked up"))
    }

    /// The inode if it exists, and whether it came from the store rather
    /// than this transaction's cache.
    fn find(&mut self, ino: u64) -> Result<(Option<Inode>, bool)> {
        match self.cache.get(&ino) {
            Some(Cached::Clean(i)) | Some(Cached::Dirty(i)) => return Ok((Some(i.clone()), false)),
            Some(Cached::Freed) => return Ok((None, false)),
            None => {}
        }
        if ino == 0 || ino > MAX_LOCAL_INO {
            return Ok((None, false));
        }
        let v = self.s.get(&codec::key2_array(ino, K_INODE))?;
        let inode = stored_inode(ino, v)?;
        let loaded = inode.is_some();
        Ok((inode, loaded))
    }

    /// Records a changed inode; written by [`Tx::flush`]. A new inode (not
    /// loaded first) is not logged as a change: nobody can have cached it.
    /// Its contents count as changed when the size or mtime moved (or the
    /// `file` functions said so: the clock may not have moved).
    pub fn put(&mut self, inode: Inode) {
        match self.cache.get(&inode.ino) {
            Some(Cached::Clean(old)) | Some(Cached::Dirty(old)) => {
                let data = old.size != inode.size || old.mtime != inode.mtime;
                self.log.inode(inode.ino, data);
            }
            Some(Cached::Freed) | None => {}
        }
        self.cache.insert(inode.ino, Cached::Dirty(inode));
    }

    /// Logs that the contents of `ino` changed (the `file` module calls
    /// it for writes, truncates and punched holes).
    pub fn contents_changed(&mut self, ino: u64) {
        self.log.inode(ino, true);
    }

    /// Logs a changed directory entry (the `dir` module calls it).
    pub fn entry_changed(&mut self, dir: u64, name: &[u8]) {
        self.log.entry(dir, name);
    }

    /// What the transaction changed so far, for publishing after it
    /// commits.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.log).into_changes()
    }

    /// Deletes every key of `ino`: inode, data, xattrs, entries.
    pub fn free(&mut self, ino: u64) -> Result<()> {
        let lo = codec::ino_prefix(ino);
        let hi = codec::ino_prefix(ino + 1);
        self.s
            .delete_range(Bound::Included(&lo), Bound::Excluded(&hi))?;
        self.cache.insert(ino, Cached::Freed);
        self.log.inode(ino, true);
        Ok(())
    }

    /// Writes every dirty inode.
    pub fn flush(&mut self) -> Result<()> {
        let mut dirty = Vec::new();
        for (ino, c) in self.cache.iter_mut() {
            if let Cached::Dirty(i) = c {
                dirty.push((*ino, i.encode()));
                *c = Cached::Clean(i.clone());
            }
        }
        for (ino, v) in dirty {
            self.s.put(&codec::key2(ino, K_INODE), &v)?;
        }
        Ok(())
    }

    pub fn superblock(&mut self) -> Result<Option<Superblock>> {
        match self.s.get(&super_key())? {
            None => Ok(None),
            Some(crate::Val::Plain(v)) => Superblock::decode(&v).map(Some),
            Some(crate::Val::Block { .. }) => Err(FsError::io("superblock stored as a block")),
        }
    }

    /// Hands out the next inode number (never reused).
    pub fn alloc_ino(&mut self) -> Result<u64> {
        let mut sb = self
            .superblock()?
            .ok_or_else(|| FsError::io("superblock missing"))?;
        let ino = sb.next_ino;
        if ino > MAX_LOCAL_INO {
            return Err(FsError::new(libc::ENOSPC, "inode numbers exhausted"));
        }
        sb.next_ino += 1;
        self.s.put(&super_key(), &sb.encode())?;
        Ok(ino)
    }

    /// EROFS unless the dataset is writable.
    pub fn writable(&self) -> Result<()> {
        if self.info.readonly {
            Err(FsError::new(libc::EROFS, "read-only dataset"))
        } else {
            Ok(())
        }
    }
}
