//! File data: READ, WRITE (with its stability levels) and COMMIT.

use super::wire::*;
use super::*;

impl<'a> Cx<'a> {
    /// Read permission, Linux nfsd style: the owner may always read (the
    /// client checked at open time), and execute permission suffices (so
    /// a client can load an execute-only program).
    pub(super) fn may_read(o: &Obj) -> NfsResult<()> {
        if o.cred.uid == o.attr.uid {
            return Ok(());
        }
        match o.fs().access(o.ino(), R_OK, &o.cred) {
            Ok(()) => Ok(()),
            Err(e) => {
                if o.attr.kind == FileKind::Regular && o.fs().access(o.ino(), X_OK, &o.cred).is_ok()
                {
                    Ok(())
                } else {
                    Err(stat_of(&e))
                }
            }
        }
    }

    pub(super) fn read(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let offset = r.u64()?;
        let count = r.u32()?.min(self.svc.max_io);
        let Some(o) = self.resolve_or(fh, w, NoAttrs::PostOp) else {
            return Ok(());
        };
        let res = Self::may_read(&o).and_then(|()| {
            // A read-only export changes nothing, access times included.
            if o.entry.export.read_only {
                o.fs().read_data_without_atime(o.ino(), offset, count)
            } else {
                o.fs().read_data(o.ino(), offset, count)
            }
            .map_err(|e| stat_of(&e))
        });
        let post = o.reattr();
        match res {
            Ok(data) => {
                let size = post.as_ref().map_or(o.attr.size, |a| a.size);
                let n = data.len() as u32;
                let eof = offset.saturating_add(u64::from(n)) >= size;
                w.u32(0);
                post_op_attr(w, post.as_ref());
                // count, eof, then the opaque: its length here, its bytes
                // and padding written by the connection from the blocks.
                w.u32(n).bool(eof).u32(n);
                self.payload.set(Some(data));
            }
            Err(s) => {
                w.u32(s.code());
                post_op_attr(w, post.as_ref());
            }
        }
        Ok(())
    }

    pub(super) fn write(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let offset = r.u64()?;
        let count = r.u32()? as usize;
        let stable = r.u32()?;
        if stable > 2 {
            return Err(XdrError::Invalid);
        }
        let data = r.opaque(usize::MAX)?;
        let data = &data[..count.min(data.len())];
        let Some(o) = self.resolve_or(fh, w, NoAttrs::Wcc) else {
            return Ok(());
        };
        let res = (|| {
            o.writable()?;
            if data.len() > self.svc.max_io as usize {
                return Err(NfsStat::Inval);
            }
            if o.cred.uid != o.attr.uid {
                o.fs()
                    .access(o.ino(), W_OK, &o.cred)
                    .map_err(|e| stat_of(&e))?;
            }
            let n = o
                .fs()
                .write(o.ino(), offset, data, false, &o.cred)
                .map_err(|e| stat_of(&e))?;
            if stable != 0 {
                o.fs().fsync(o.ino()).map_err(|e| stat_of(&e))?;
            }
            Ok(n)
        })();
        let post = o.reattr();
        match res {
            Ok(n) => {
                w.u32(0);
                wcc_data(w, Some(&o.attr), post.as_ref());
                // DATA_SYNC and FILE_SYNC are both answered FILE_SYNC: a
                // sync commits metadata and data together.
                w.u32(n as u32).u32(if stable == 0 { 0 } else { 2 });
                w.fixed(&self.svc.verifier(o.fs()));
            }
            Err(s) => {
                w.u32(s.code());
                wcc_data(w, Some(&o.attr), post.as_ref());
            }
        }
        Ok(())
    }

    pub(super) fn commit(&self, r: &mut Reader, w: &mut Writer) -> XdrResult<()> {
        let fh = read_fh(r)?;
        let _offset = r.u64()?;
        let _count = r.u32()?;
        let Some(o) = self.resolve_or(fh, w, NoAttrs::Wcc) else {
            return Ok(());
        };
        // The whole dataset is committed: a range commit costs the same.
        // Only for a client that may write the file, as for WRITE (a sync
        // is a write's cost; a read-only export or reader must not be able
        // to force them in a loop).
        let res = (|| {
            o.writable()?;
            if o.cred.uid != o.attr.uid {
                o.fs()
                    .access(o.ino(), W_OK, &o.cred)
                    .map_err(|e| stat_of(&e))?;
            }
            o.fs().fsync(o.ino()).map_err(|e| stat_of(&e))
        })();
        let post = o.reattr();
        finish!(
            w,
            res,
            |_v| {
                wcc_data(w, Some(&o.attr), post.as_ref());
                w.fixed(&self.svc.verifier(o.fs()));
            },
            || {
                wcc_data(w, Some(&o.attr), post.as_ref());
            }
        );
        Ok(())
    }
}
