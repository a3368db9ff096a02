//! Listing directories: `readdir` and `readdirplus` with cookies that are
//! tree keys (see the crate docs), so they survive restarts and changes.

use crate::dir::{self, COOKIE_BASE};
use crate::fs::{attr_of, err, gino, wants_atime, Fs, Place};
use crate::store::Backend;
use crate::types::*;
use crate::{FsError, Result};

impl<B: Backend> Fs<B> {
    /// Up to `limit` entries of directory `ino` after `cookie` (0 = from
    /// the start; `.` and `..` come first with cookies 1 and 2). Cookies
    /// are derived from the entries' keys, so they stay valid across
    /// restarts and concurrent changes.
    pub fn readdir(&self, ino: u64, cookie: u64, limit: usize) -> Result<Vec<DirEntry>> {
        self.readdir_with(ino, cookie, limit, true)
    }

    /// [`Fs::readdir`], refreshing the directory's atime only when `atime`
    /// (a read-only mount of a writable dataset lists without writing).
    pub fn readdir_with(
        &self,
        ino: u64,
        cookie: u64,
        limit: usize,
        atime: bool,
    ) -> Result<Vec<DirEntry>> {
        Ok(self
            .readdir_impl(ino, cookie, limit, false, atime, &mut |_| true)?
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
        self.readdirplus_with(ino, cookie, limit, true)
    }

    /// [`Fs::readdirplus`], refreshing atime only when `atime` (see
    /// [`Fs::readdir_with`]).
    pub fn readdirplus_with(
        &self,
        ino: u64,
        cookie: u64,
        limit: usize,
        atime: bool,
    ) -> Result<Vec<(DirEntry, Attr)>> {
        self.readdirplus_fitting(ino, cookie, limit, atime, &mut |_| true)
    }

    /// [`Fs::readdirplus_with`] that ends the page before the first entry
    /// `fits` refuses, so a caller with a reply of fixed size (NFS's
    /// `maxcount`) does not pay for the attributes of entries it would
    /// drop. `fits` is called with `None` before the first entry of each
    /// attempt (a transaction may run again), then with each entry in
    /// order; a refused entry is the first of the next page.
    pub fn readdirplus_fitting(
        &self,
        ino: u64,
        cookie: u64,
        limit: usize,
        atime: bool,
        fits: &mut dyn FnMut(Option<&DirEntry>) -> bool,
    ) -> Result<Vec<(DirEntry, Attr)>> {
        self.readdir_impl(ino, cookie, limit, true, atime, fits)?
            .into_iter()
            .map(|(e, a)| match a {
                Some(a) => Ok((e, a)),
                None => Err(FsError::io(
                    "internal: readdirplus entry without attributes",
                )),
            })
            .collect()
    }

    pub(crate) fn readdir_impl(
        &self,
        ino: u64,
        cookie: u64,
        limit: usize,
        plus: bool,
        atime: bool,
        fits: &mut dyn FnMut(Option<&DirEntry>) -> bool,
    ) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        let dot = |ino: u64, cookie: u64, name: &[u8]| DirEntry {
            ino,
            cookie,
            kind: FileKind::Directory,
            name: name.to_vec(),
        };
        if let Place::SnapDir = self.place(ino)? {
            let mut out = Vec::new();
            let mut page = Page::start(fits);
            if cookie == 0 && out.len() < limit {
                let e = dot(SNAPDIR_INO, 1, b".");
                if page.admit(&e) {
                    let a = if plus {
                        Some(self.snapdir_attr()?)
                    } else {
                        None
                    };
                    out.push((e, a));
                }
            }
            if cookie <= 1 && out.len() < limit {
                let e = dot(ROOT_INO, 2, b"..");
                if page.admit(&e) {
                    let a = if plus {
                        Some(self.getattr(ROOT_INO)?)
                    } else {
                        None
                    };
                    out.push((e, a));
                }
            }
            for (slot, name) in self.snapshot_list()? {
                if out.len() >= limit || page.full {
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
                // A snapshot taken before the filesystem was first made on
                // its dataset (created, snapshotted, never mounted) holds
                // no root: it is left out, as its lookup fails, rather
                // than failing the listing of every snapshot.
                let a = match self.snap_root_attr(slot) {
                    Ok(a) => a,
                    Err(err) if err.errno() == libc::ENOENT => continue,
                    Err(err) => return Err(err),
                };
                if !page.admit(&e) {
                    break;
                }
                out.push((e, plus.then_some(a)));
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
            let mut page = Page::start(&mut *fits);
            if cookie == 0 && limit > 0 {
                let e = dot(gino(slot, l), 1, b".");
                if page.admit(&e) {
                    let a = plus.then(|| attr_of(slot, guid, &d));
                    out.push((e, a));
                }
            }
            if cookie <= 1 && out.len() < limit {
                let parent = if slot != 0 && l == ROOT_INO {
                    SNAPDIR_INO
                } else {
                    gino(slot, d.parent)
                };
                let e = dot(parent, 2, b"..");
                if page.admit(&e) {
                    if parent == SNAPDIR_INO {
                        snap_parent = Some(out.len());
                        out.push((e, None));
                    } else {
                        let a = if plus {
                            // A removed (but still open) directory's parent
                            // may be gone too: fall back to the directory.
                            let p = tx.try_get(d.parent)?.unwrap_or_else(|| d.clone());
                            Some(attr_of(slot, guid, &p))
                        } else {
                            None
                        };
                        out.push((e, a));
                    }
                }
            }
            let want = limit - out.len();
            if want > 0 && d.nlink > 0 && !page.full {
                let after = cookie.checked_sub(COOKIE_BASE);
                let mut listed = Vec::new();
                let mut inos = Vec::new();
                for e in dir::list(tx, l, after, want)? {
                    let ino = e.ino;
                    let e = DirEntry {
                        ino: gino(slot, e.ino),
                        cookie: e.h + COOKIE_BASE,
                        kind: e.kind,
                        name: e.name,
                    };
                    if !page.admit(&e) {
                        break;
                    }
                    listed.push(e);
                    inos.push(ino);
                }
                if plus {
                    let inodes = tx.peek_many(&inos)?;
                    for (e, i) in listed.into_iter().zip(inodes) {
                        out.push((e, Some(attr_of(slot, guid, &i))));
                    }
                } else {
                    out.extend(listed.into_iter().map(|e| (e, None)));
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
        if touch && atime {
            self.touch_atime(ino);
        }
        Ok(out)
    }
}

/// One attempt at a page: asks `fits` (see [`Fs::readdirplus_fitting`])
/// about each entry in order until it refuses one, after which the page
/// is full and nothing more is asked.
struct Page<'f> {
    fits: &'f mut dyn FnMut(Option<&DirEntry>) -> bool,
    full: bool,
}

impl<'f> Page<'f> {
    fn start(fits: &'f mut dyn FnMut(Option<&DirEntry>) -> bool) -> Page<'f> {
        fits(None);
        Page { fits, full: false }
    }

    /// Whether `e` goes on the page.
    fn admit(&mut self, e: &DirEntry) -> bool {
        self.full = self.full || !(self.fits)(Some(e));
        !self.full
    }
}
