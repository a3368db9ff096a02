//! Names: creating, linking, removing and renaming files, directories,
//! symlinks and device nodes. Each operation is one transaction that checks
//! every permission and name before its first change.

use crate::dir::{self, Dirent};
use crate::file::{self};
use crate::fs::{attr_of, check_name, err, get_dir, is_ancestor, is_dot, open_mask, Fs, Place};
use crate::inode::{Inode, Tx, INLINE_TARGET_MAX};
use crate::perm;
use crate::store::{Backend, MAX_BLOCK};
use crate::types::*;
use crate::{FsError, Result};

impl<B: Backend> Fs<B> {
    /// Shared by mknod, mkdir, symlink and create: adds `name` to `parent`
    /// as a new inode. `perm` is already masked.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn make_node(
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
    pub(crate) fn make(
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
        // The open is counted inside the transaction, before it commits:
        // an unlink that follows it on another thread must find the file
        // open and keep it as an orphan, not free it under the caller (a
        // transaction run again first takes back its earlier count).
        let counted = std::cell::Cell::new(None::<u64>);
        let count = |ino: u64| {
            if let Some(old) = counted.replace(Some(ino)) {
                self.uncount_open(old);
            }
            self.inc_open(ino);
        };
        let r = self.write_txn(|tx| {
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
                    count(i.ino);
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
                    count(i.ino);
                    Ok(attr_of(0, tx.info.guid, &i))
                }
            }
        });
        if r.is_err() {
            // Nothing opened: the count goes (with the inode, should it
            // have become an orphan meanwhile).
            if let Some(ino) = counted.take() {
                let _ = self.release(ino);
            }
        }
        r
    }

    pub(crate) fn open_truncate(tx: &mut Tx, i: &mut Inode, cred: &Cred) -> Result<()> {
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

    pub(crate) fn remove(&self, parent: u64, name: &[u8], isdir: bool, cred: &Cred) -> Result<()> {
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
            dir::remove(tx, p, e.h, name)?;
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
                    dir::remove(tx, op, src.h, name)?;
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
    pub(crate) fn touch_dir(tx: &mut Tx, ino: u64, entries: i64, links: i64) -> Result<()> {
        let mut d = tx.get(ino)?;
        d.size = d.size.saturating_add_signed(entries);
        d.nlink = (i64::from(d.nlink) + links).clamp(0, i64::from(u32::MAX)) as u32;
        d.mtime = tx.now;
        d.ctime = tx.now;
        tx.put(d);
        Ok(())
    }
}
