//! Conversions between `tarn-fs` types and `fuser` types.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo, TimeOrNow};
use tarn_fs::{Attr, FileKind, FsError, TimeSet, Timestamp};

/// The errno a failed `Fs` call replies with.
pub(crate) fn errno(e: &FsError) -> Errno {
    if e.errno() == libc::EIO {
        // Damage or a failing pool: the operator needs to know which file.
        log::warn!("tarn: I/O error: {}", e.message());
    }
    Errno::from_i32(e.errno())
}

/// The attributes of a negative entry: inode 0 tells the kernel that the
/// name does not exist, for the entry TTL.
pub(crate) fn absent() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

pub(crate) fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
    }
}

/// A stored timestamp as the `SystemTime` fuser sends to the kernel
/// (exact, including times before 1970).
pub(crate) fn system_time(t: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(t.nsec));
    let base = if t.sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(t.sec.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(t.sec.unsigned_abs()))
    };
    base.and_then(|b| b.checked_add(nanos))
        .unwrap_or(UNIX_EPOCH)
}

/// A time from a request as a timestamp. fuser builds a pre-1970 time
/// `(sec < 0, nsec)` as `EPOCH - (|sec| s + nsec ns)`, so that is inverted
/// here to get back exactly the `(sec, nsec)` pair the kernel sent.
pub(crate) fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp::new(
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_nanos(),
        ),
        Err(e) => {
            let d = e.duration();
            let sec = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            Timestamp::new(-sec, d.subsec_nanos())
        }
    }
}

pub(crate) fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(st) => TimeSet::At(timestamp(st)),
    }
}

/// `Attr` as fuser's `FileAttr`.
pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.crtime),
        kind: file_type(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        // Device numbers are stored in the FUSE (kernel "new") 32-bit
        // encoding they arrive in; anything wider cannot come from here.
        rdev: u32::try_from(a.rdev).unwrap_or(0),
        blksize: a.blksize,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        for (sec, nsec) in [
            (0, 0),
            (1_700_000_000, 123_456_789),
            (-1, 0),
            (-2, 800_000_000),
        ] {
            let t = Timestamp::new(sec, nsec);
            // Outgoing times are exact.
            let st = system_time(t);
            let back = match st.duration_since(UNIX_EPOCH) {
                Ok(d) => i128::try_from(d.as_nanos()).unwrap_or(0),
                Err(e) => -i128::try_from(e.duration().as_nanos()).unwrap_or(0),
            };
            assert_eq!(back, t.as_nanos());
        }
        // Incoming: fuser's encoding of (-2, 800_000_000).
        let st = UNIX_EPOCH - Duration::new(2, 800_000_000);
        assert_eq!(timestamp(st), Timestamp::new(-2, 800_000_000));
        let st = UNIX_EPOCH + Duration::new(5, 7);
        assert_eq!(timestamp(st), Timestamp::new(5, 7));
    }
}
