//! Changing names: CREATE (UNCHECKED, GUARDED, EXCLUSIVE), MKDIR,
//! SYMLINK, MKNOD, REMOVE, RMDIR, RENAME and LINK.

use super::wire::*;
use super::*;

impl<'a> Cx<'a> {
    /// Shared tail of CREATE / MKDIR / SYMLINK / MKNOD: the new object
    /// made durable (see [`Obj::synced`]), then on success post_op_fh3,
    /// post_op_attr and the directory's wcc_data; on failure the
    /// directory's wcc_data.
    pub(super) fn reply_made(&self, w: &mut Writer, dir: Option<&Obj>, res: NfsResult<Made>) {
        let res = match dir {
            Some(d) => d.synced(res),
            None => res,
        };
        let pre = dir.map(|d| d.attr.clone());
        let post = dir.and_then(|d| d.reattr());
        match res {
            Ok(m) => {
                w.u32(0);
                w.bool(true).opaque(&self.svc.handle_bytes(&m.obj));
                post_op_attr(w, Some(&m.obj));
                wcc_data(w, pre.as_ref(), post.as_ref());
            }
            Err(s) => {
                w.u32(s.code());
                wcc_data(w, pre.as_ref(), post.as_ref());
            }
        }
    }

    /// Applies the attributes a create-like call carried beyond the mode
    /// (owner, group, times, size) to a new object; best effort, the
    /// object exists either way.
    pub(super) fn apply_rest(dir: &Obj, a: Attr, sa: &Sattr) -> Attr {
        let rest = Sattr {
            mode: None,
            uid: sa.uid.filter(|&u| u != a.uid),
            gid: sa.gid.filter(|&g| g != a.gid),
            size: sa.size.filter(|&s| s != 0 && a.kind == FileKind::Regular),
            atime: sa.atime,
            mtime: sa.mtime,
        };
        if rest.is_empty() {
            return a;
        }
        dir.fs()
            .setattr(a.ino, &rest.to_setattr(), &dir.cred)
            .unwrap_or(a)
    }

    pub(super) fn create(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let name = read_name(r)?;
        let how = r.u32()?;
        let (sa, verf) = match how {
            0 | 1 => (read_sattr(r)?, None),
            2 => {
                let v = r.fixed(8)?;
                let mut verf = [0u8; 8];
                verf.copy_from_slice(v);
                (Sattr::default(), Some(verf))
            }
            _ => return Err(XdrError::Invalid),
        };
        let dir = self.resolve(fh);
        let res = dir.as_ref().map_err(|s| *s).and_then(|d| {
            d.writable()?;
            let fs = d.fs();
            let mode = sa.mode.unwrap_or(0o644) & 0o7777;
            match verf {
                None => {
                    // UNCHECKED returns an existing regular file as is
                    // (never truncated); GUARDED refuses it.
                    if how == 0 {
                        match fs.lookup(d.ino(), name, &d.cred) {
                            Ok(a) if a.kind == FileKind::Regular => return Ok(Made { obj: a }),
                            Ok(_) => return Err(NfsStat::Exist),
                            Err(e) if e.errno() == libc::ENOENT => {}
                            Err(e) => return Err(stat_of(&e)),
                        }
                    }
                    let made = fs.create(
                        d.ino(),
                        name,
                        mode,
                        0,
                        libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                        &d.cred,
                    );
                    let a = match made {
                        // Made by another client between the lookup and
                        // here: UNCHECKED answers it as if found first.
                        Err(e) if how == 0 && e.errno() == libc::EEXIST => {
                            return match fs.lookup(d.ino(), name, &d.cred) {
                                Ok(a) if a.kind == FileKind::Regular => Ok(Made { obj: a }),
                                Ok(_) => Err(NfsStat::Exist),
                                Err(e) => Err(stat_of(&e)),
                            };
                        }
                        r => r.map_err(|e| stat_of(&e))?,
                    };
                    let _ = fs.release(a.ino);
                    Ok(Made {
                        obj: Self::apply_rest(d, a, &sa),
                    })
                }
                Some(v) => {
                    // EXCLUSIVE: the verifier is stored in atime/mtime
                    // seconds, so a retried call finds its own file.
                    let t0 = u32::from_be_bytes([v[0], v[1], v[2], v[3]]);
                    let t1 = u32::from_be_bytes([v[4], v[5], v[6], v[7]]);
                    let matches = |a: &Attr| {
                        a.kind == FileKind::Regular
                            && a.atime.sec == i64::from(t0)
                            && a.mtime.sec == i64::from(t1)
                    };
                    match fs.create(
                        d.ino(),
                        name,
                        0o600,
                        0,
                        libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                        &d.cred,
                    ) {
                        Ok(a) => {
                            let _ = fs.release(a.ino);
                            let set = SetAttr {
                                atime: Some(TimeSet::At(Timestamp::new(i64::from(t0), 0))),
                                mtime: Some(TimeSet::At(Timestamp::new(i64::from(t1), 0))),
                                ..SetAttr::default()
                            };
                            let a = fs.setattr(a.ino, &set, &d.cred).map_err(|e| stat_of(&e))?;
                            Ok(Made { obj: a })
                        }
                        Err(e) if e.errno() == libc::EEXIST => {
                            match fs.lookup(d.ino(), name, &d.cred) {
                                Ok(a) if matches(&a) => Ok(Made { obj: a }),
                                _ => Err(NfsStat::Exist),
                            }
                        }
                        Err(e) => Err(stat_of(&e)),
                    }
                }
            }
        });
        self.reply_made(w, dir.as_ref().ok(), res);
        Ok(())
    }

    pub(super) fn mkdir(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let name = read_name(r)?;
        let sa = read_sattr(r)?;
        let dir = self.resolve(fh);
        let res = dir.as_ref().map_err(|s| *s).and_then(|d| {
            d.writable()?;
            let mode = sa.mode.unwrap_or(0o755) & 0o7777;
            let a = d
                .fs()
                .mkdir(d.ino(), name, mode, 0, &d.cred)
                .map_err(|e| stat_of(&e))?;
            Ok(Made {
                obj: Self::apply_rest(d, a, &sa),
            })
        });
        self.reply_made(w, dir.as_ref().ok(), res);
        Ok(())
    }

    pub(super) fn symlink(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let name = read_name(r)?;
        let sa = read_sattr(r)?;
        let target = r.string(SYMLINK_MAX + 1)?;
        let dir = self.resolve(fh);
        let res = dir.as_ref().map_err(|s| *s).and_then(|d| {
            d.writable()?;
            let a = d
                .fs()
                .symlink(d.ino(), name, target, &d.cred)
                .map_err(|e| stat_of(&e))?;
            let sa = Sattr {
                mode: None,
                size: None,
                ..sa
            };
            Ok(Made {
                obj: Self::apply_rest(d, a, &sa),
            })
        });
        self.reply_made(w, dir.as_ref().ok(), res);
        Ok(())
    }

    pub(super) fn mknod(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let name = read_name(r)?;
        let t = r.u32()?;
        let (kind, sa, rdev) = match t {
            3 | 4 => {
                let sa = read_sattr(r)?;
                let ma = r.u32()?;
                let mi = r.u32()?;
                let k = if t == 3 {
                    FileKind::BlockDevice
                } else {
                    FileKind::CharDevice
                };
                (Some(k), sa, make_dev(ma, mi))
            }
            6 => (Some(FileKind::Socket), read_sattr(r)?, 0),
            7 => (Some(FileKind::Fifo), read_sattr(r)?, 0),
            1 | 2 | 5 => (None, Sattr::default(), 0),
            _ => return Err(XdrError::Invalid),
        };
        let dir = self.resolve(fh);
        let res = dir.as_ref().map_err(|s| *s).and_then(|d| {
            let kind = kind.ok_or(NfsStat::BadType)?;
            d.writable()?;
            let mode = kind.mode_bits() | (sa.mode.unwrap_or(0o644) & 0o7777);
            let a = d
                .fs()
                .mknod(d.ino(), name, mode, rdev, 0, &d.cred)
                .map_err(|e| stat_of(&e))?;
            Ok(Made {
                obj: Self::apply_rest(d, a, &sa),
            })
        });
        self.reply_made(w, dir.as_ref().ok(), res);
        Ok(())
    }

    pub(super) fn remove(&self, r: &mut Reader, w: &mut Writer, is_dir: bool) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let name = read_name(r)?;
        let dir = self.resolve(fh);
        let res = dir.as_ref().map_err(|s| *s).and_then(|d| {
            d.writable()?;
            let r = if is_dir {
                d.fs().rmdir(d.ino(), name, &d.cred)
            } else {
                d.fs().unlink(d.ino(), name, &d.cred)
            };
            d.synced(r.map_err(|e| stat_of(&e)))
        });
        let d = dir.as_ref().ok();
        w.u32(res.err().map_or(0, |s| s.code()));
        wcc_data(w, d.map(|d| &d.attr), d.and_then(|d| d.reattr()).as_ref());
        Ok(())
    }

    pub(super) fn rename(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let ffh = read_fh(r)?;
        let fname = read_name(r)?;
        let tfh = read_fh(r)?;
        let tname = read_name(r)?;
        let from = self.resolve(ffh);
        let to = self.resolve(tfh);
        let res = match (&from, &to) {
            (Ok(f), Ok(t)) => (|| {
                if !std::ptr::eq(f.entry, t.entry) {
                    return Err(NfsStat::XDev);
                }
                f.writable()?;
                f.synced(
                    f.fs()
                        .rename(f.ino(), fname, t.ino(), tname, 0, &f.cred)
                        .map_err(|e| stat_of(&e)),
                )
            })(),
            (Err(s), _) | (_, Err(s)) => Err(*s),
        };
        w.u32(res.err().map_or(0, |s| s.code()));
        let f = from.as_ref().ok();
        let t = to.as_ref().ok();
        wcc_data(w, f.map(|d| &d.attr), f.and_then(|d| d.reattr()).as_ref());
        wcc_data(w, t.map(|d| &d.attr), t.and_then(|d| d.reattr()).as_ref());
        Ok(())
    }

    pub(super) fn link(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let dfh = read_fh(r)?;
        let name = read_name(r)?;
        let file = self.resolve(fh);
        let dir = self.resolve(dfh);
        let res = match (&file, &dir) {
            (Ok(f), Ok(d)) => (|| {
                if !std::ptr::eq(f.entry, d.entry) {
                    return Err(NfsStat::XDev);
                }
                d.writable()?;
                d.synced(
                    d.fs()
                        .link(f.ino(), d.ino(), name, &d.cred)
                        .map_err(|e| stat_of(&e)),
                )
            })(),
            (Err(s), _) | (_, Err(s)) => Err(*s),
        };
        w.u32(res.as_ref().err().map_or(0, |s| s.code()));
        let f = file.as_ref().ok();
        let fattr = match &res {
            Ok(a) => Some(a.clone()),
            Err(_) => f.and_then(|f| f.reattr()),
        };
        post_op_attr(w, fattr.as_ref());
        let d = dir.as_ref().ok();
        wcc_data(w, d.map(|d| &d.attr), d.and_then(|d| d.reattr()).as_ref());
        Ok(())
    }
}
