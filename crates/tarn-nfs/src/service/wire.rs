//! XDR encoders and decoders of NFS v3 types: attributes (`fattr3`,
//! `post_op_attr`, `wcc_data`), settable attributes (`sattr3`), handles
//! and names.

use tarn_fs::{Attr, FileKind, SetAttr, TimeSet, Timestamp};

use super::{FHSIZE, WIRE_NAME_MAX};
use crate::xdr::{Reader, Writer, XdrError, XdrResult};

// ----- encoders --------------------------------------------------------

pub(super) fn time_wire(t: &Timestamp) -> (u32, u32) {
    // nfstime3 seconds are unsigned 32-bit: clamp what does not fit.
    let sec = t.sec.clamp(0, i64::from(u32::MAX)) as u32;
    (sec, t.nsec)
}

pub(super) fn put_time(w: &mut Writer, t: &Timestamp) {
    let (s, n) = time_wire(t);
    w.u32(s).u32(n);
}

pub(super) fn ftype(k: FileKind) -> u32 {
    match k {
        FileKind::Regular => 1,
        FileKind::Directory => 2,
        FileKind::BlockDevice => 3,
        FileKind::CharDevice => 4,
        FileKind::Symlink => 5,
        FileKind::Socket => 6,
        FileKind::Fifo => 7,
    }
}

/// Linux `dev_t` → (major, minor).
pub(super) fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// (major, minor) → Linux `dev_t`.
pub(super) fn make_dev(major: u32, minor: u32) -> u64 {
    let (ma, mi) = (u64::from(major), u64::from(minor));
    ((ma & 0xfff) << 8) | ((ma & !0xfff) << 32) | (mi & 0xff) | ((mi & !0xff) << 12)
}

pub(super) fn fattr3(w: &mut Writer, a: &Attr) {
    w.u32(ftype(a.kind))
        .u32(a.mode & 0o7777)
        .u32(a.nlink)
        .u32(a.uid)
        .u32(a.gid)
        .u64(a.size)
        .u64(a.blocks.saturating_mul(512));
    let (ma, mi) = split_dev(a.rdev);
    w.u32(ma).u32(mi).u64(a.dataset).u64(a.ino);
    put_time(w, &a.atime);
    put_time(w, &a.mtime);
    put_time(w, &a.ctime);
}

pub(super) fn post_op_attr(w: &mut Writer, a: Option<&Attr>) {
    match a {
        Some(a) => {
            w.bool(true);
            fattr3(w, a);
        }
        None => {
            w.bool(false);
        }
    }
}

pub(super) fn wcc_data(w: &mut Writer, pre: Option<&Attr>, post: Option<&Attr>) {
    match pre {
        Some(a) => {
            w.bool(true).u64(a.size);
            put_time(w, &a.mtime);
            put_time(w, &a.ctime);
        }
        None => {
            w.bool(false);
        }
    }
    post_op_attr(w, post);
}

// ----- decoders --------------------------------------------------------

/// Decoded `sattr3`.
#[derive(Debug, Default)]
pub(super) struct Sattr {
    pub(super) mode: Option<u32>,
    pub(super) uid: Option<u32>,
    pub(super) gid: Option<u32>,
    pub(super) size: Option<u64>,
    pub(super) atime: Option<TimeSet>,
    pub(super) mtime: Option<TimeSet>,
}

impl Sattr {
    pub(super) fn to_setattr(&self) -> SetAttr {
        SetAttr {
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            atime: self.atime,
            mtime: self.mtime,
            from_open_file: false,
            if_ctime: None,
        }
    }
    pub(super) fn is_empty(&self) -> bool {
        self.mode.is_none()
            && self.uid.is_none()
            && self.gid.is_none()
            && self.size.is_none()
            && self.atime.is_none()
            && self.mtime.is_none()
    }
}

pub(super) fn read_time_how(r: &mut Reader) -> XdrResult<Option<TimeSet>> {
    match r.u32()? {
        0 => Ok(None),
        1 => Ok(Some(TimeSet::Now)),
        2 => {
            let s = r.u32()?;
            let n = r.u32()?;
            if n >= 1_000_000_000 {
                return Err(XdrError::Invalid);
            }
            Ok(Some(TimeSet::At(Timestamp::new(i64::from(s), n))))
        }
        _ => Err(XdrError::Invalid),
    }
}

pub(super) fn read_sattr(r: &mut Reader) -> XdrResult<Sattr> {
    Ok(Sattr {
        mode: r.option(|r| r.u32())?,
        uid: r.option(|r| r.u32())?,
        gid: r.option(|r| r.u32())?,
        size: r.option(|r| r.u64())?,
        atime: read_time_how(r)?,
        mtime: read_time_how(r)?,
    })
}

pub(super) fn read_fh<'a>(r: &mut Reader<'a>) -> XdrResult<&'a [u8]> {
    r.opaque(FHSIZE)
}

pub(super) fn read_name<'a>(r: &mut Reader<'a>) -> XdrResult<&'a [u8]> {
    r.string(WIRE_NAME_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_numbers_round_trip() {
        for (ma, mi) in [(0, 0), (8, 1), (259, 65536), (4095, 255), (5000, 1 << 20)] {
            assert_eq!(split_dev(make_dev(ma, mi)), (ma, mi));
        }
    }
}
