//! Attributes and names: GETATTR, SETATTR, LOOKUP, ACCESS, READLINK, and
//! the filesystem queries FSSTAT, FSINFO and PATHCONF.

use super::wire::*;
use super::*;

impl<'a> Cx<'a> {
    pub(super) fn getattr(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        finish!(w, self.resolve(fh), |o| { fattr3(w, &o.attr) }, || {});
        Ok(())
    }

    pub(super) fn setattr(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let sa = read_sattr(r)?;
        let guard = r.option(|r| Ok((r.u32()?, r.u32()?)))?;
        let Some(o) = self.resolve_or(fh, w, NoAttrs::Wcc) else {
            return Ok(());
        };
        let res = (|| {
            o.writable()?;
            if let Some(g) = guard {
                if time_wire(&o.attr.ctime) != g {
                    return Err(NfsStat::NotSync);
                }
            }
            let mut set = sa.to_setattr();
            // Nothing to set: no change at all, as in Linux's nfsd (the
            // filesystem would take an empty setattr for chown(-1, -1)
            // and update ctime).
            if set == SetAttr::default() {
                return Ok(o.attr.clone());
            }
            // The owner may truncate a file whose mode denies them writing
            // (they created it that way and still hold it open).
            if set.size.is_some() && o.cred.uid == o.attr.uid {
                set.from_open_file = true;
            }
            // Checked again where the change is made: another client's
            // change between the check above and this one must not pass.
            set.if_ctime = guard.map(|_| o.attr.ctime);
            o.synced(o.fs().setattr(o.ino(), &set, &o.cred).map_err(|e| {
                if set.if_ctime.is_some() && e.errno() == tarn_fs::GUARD_ERRNO {
                    NfsStat::NotSync
                } else {
                    stat_of(&e)
                }
            }))
        })();
        match res {
            Ok(a) => {
                w.u32(0);
                wcc_data(w, Some(&o.attr), Some(&a));
            }
            Err(s) => {
                w.u32(s.code());
                wcc_data(w, Some(&o.attr), o.reattr().as_ref());
            }
        }
        Ok(())
    }

    pub(super) fn lookup(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let name = read_name(r)?;
        let Some(dir) = self.resolve_or(fh, w, NoAttrs::PostOp) else {
            return Ok(());
        };
        match dir.fs().lookup(dir.ino(), name, &dir.cred) {
            Ok(a) => {
                w.u32(0);
                w.opaque(&self.svc.handle_bytes(&a));
                post_op_attr(w, Some(&a));
                post_op_attr(w, Some(&dir.attr));
            }
            Err(e) => {
                w.u32(stat_of(&e).code());
                post_op_attr(w, Some(&dir.attr));
            }
        }
        Ok(())
    }

    pub(super) fn access(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let want = r.u32()?;
        let Some(o) = self.resolve_or(fh, w, NoAttrs::PostOp) else {
            return Ok(());
        };
        const READ: u32 = 0x01;
        const LOOKUP: u32 = 0x02;
        const MODIFY: u32 = 0x04;
        const EXTEND: u32 = 0x08;
        const DELETE: u32 = 0x10;
        const EXECUTE: u32 = 0x20;
        let is_dir = o.attr.kind == FileKind::Directory;
        let ok = |mask: u32| o.fs().access(o.ino(), mask, &o.cred).is_ok();
        let mut granted = 0;
        if want & READ != 0 && ok(R_OK) {
            granted |= READ;
        }
        if want & (MODIFY | EXTEND | DELETE) != 0 && !o.entry.export.read_only && ok(W_OK) {
            granted |= want & (MODIFY | EXTEND);
            if is_dir {
                granted |= want & DELETE;
            }
        }
        if is_dir {
            if want & LOOKUP != 0 && ok(X_OK) {
                granted |= LOOKUP;
            }
        } else if want & EXECUTE != 0 && ok(X_OK) {
            granted |= EXECUTE;
        }
        w.u32(0);
        post_op_attr(w, Some(&o.attr));
        w.u32(granted);
        Ok(())
    }

    pub(super) fn readlink(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let o = self.resolve(fh);
        let attr = o.as_ref().ok().map(|o| o.attr.clone());
        let res = o.and_then(|o| o.fs().readlink(o.ino()).map_err(|e| stat_of(&e)));
        finish!(
            w,
            res,
            |t| {
                post_op_attr(w, attr.as_ref());
                w.opaque(&t);
            },
            || {
                post_op_attr(w, attr.as_ref());
            }
        );
        Ok(())
    }

    pub(super) fn fsstat(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let o = self.resolve(fh);
        let attr = o.as_ref().ok().map(|o| o.attr.clone());
        let res = o.and_then(|o| o.fs().statfs(o.ino()).map_err(|e| stat_of(&e)));
        finish!(
            w,
            res,
            |s| {
                post_op_attr(w, attr.as_ref());
                let b = u64::from(s.bsize);
                w.u64(s.blocks.saturating_mul(b))
                    .u64(s.bfree.saturating_mul(b))
                    .u64(s.bavail.saturating_mul(b))
                    .u64(s.files)
                    .u64(s.ffree)
                    .u64(s.ffree)
                    .u32(0);
            },
            || {
                post_op_attr(w, attr.as_ref());
            }
        );
        Ok(())
    }

    pub(super) fn fsinfo(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let o = self.resolve(fh);
        finish!(
            w,
            o,
            |o| {
                post_op_attr(w, Some(&o.attr));
                let io = self.svc.max_io;
                w.u32(io) // rtmax
                    .u32(io) // rtpref
                    .u32(4096) // rtmult
                    .u32(io) // wtmax
                    .u32(io) // wtpref
                    .u32(4096) // wtmult
                    .u32(64 * 1024) // dtpref
                    .u64(i64::MAX as u64) // maxfilesize
                    .u32(0)
                    .u32(1) // time_delta: 1 ns
                    .u32(FSF3_PROPS);
            },
            || {
                post_op_attr(w, None);
            }
        );
        Ok(())
    }

    pub(super) fn pathconf(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let o = self.resolve(fh);
        finish!(
            w,
            o,
            |o| {
                post_op_attr(w, Some(&o.attr));
                w.u32(LINK_MAX)
                    .u32(NAME_MAX as u32)
                    .bool(true) // no_trunc
                    .bool(true) // chown_restricted
                    .bool(false) // case_insensitive
                    .bool(true); // case_preserving
            },
            || {
                post_op_attr(w, None);
            }
        );
        Ok(())
    }
}
