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
            .readdir_impl(ino, cookie, limit, false, atime)?
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
        self.readdir_impl(ino, cookie, limit, true, atime)?
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
                        Some(attr_of(slot, guid, &tx.peek(e.ino)?))
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
        if touch && atime {
            self.touch_atime(ino);
        }
        Ok(out)
    }
}
