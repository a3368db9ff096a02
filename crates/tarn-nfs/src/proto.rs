//! Protocol constants shared by the server and by clients (tests, tools):
//! program numbers, procedure numbers, `nfsstat3` values, and the errno →
//! `nfsstat3` mapping.

/// Portmapper program.
pub const PMAP_PROG: u32 = 100000;
/// NFS program.
pub const NFS_PROG: u32 = 100003;
/// MOUNT program.
pub const MOUNT_PROG: u32 = 100005;

/// NFSv3 procedure numbers (RFC 1813).
#[allow(missing_docs)]
pub mod nfsproc {
    pub const NULL: u32 = 0;
    pub const GETATTR: u32 = 1;
    pub const SETATTR: u32 = 2;
    pub const LOOKUP: u32 = 3;
    pub const ACCESS: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const READ: u32 = 6;
    pub const WRITE: u32 = 7;
    pub const CREATE: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const SYMLINK: u32 = 10;
    pub const MKNOD: u32 = 11;
    pub const REMOVE: u32 = 12;
    pub const RMDIR: u32 = 13;
    pub const RENAME: u32 = 14;
    pub const LINK: u32 = 15;
    pub const READDIR: u32 = 16;
    pub const READDIRPLUS: u32 = 17;
    pub const FSSTAT: u32 = 18;
    pub const FSINFO: u32 = 19;
    pub const PATHCONF: u32 = 20;
    pub const COMMIT: u32 = 21;
}

/// MOUNT v3 procedure numbers.
#[allow(missing_docs)]
pub mod mountproc {
    pub const NULL: u32 = 0;
    pub const MNT: u32 = 1;
    pub const DUMP: u32 = 2;
    pub const UMNT: u32 = 3;
    pub const UMNTALL: u32 = 4;
    pub const EXPORT: u32 = 5;
}

/// `nfsstat3` values (RFC 1813 §2.6).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum NfsStat {
    Ok = 0,
    Perm = 1,
    NoEnt = 2,
    Io = 5,
    NxIo = 6,
    Acces = 13,
    Exist = 17,
    XDev = 18,
    NoDev = 19,
    NotDir = 20,
    IsDir = 21,
    Inval = 22,
    FBig = 27,
    NoSpc = 28,
    RoFs = 30,
    MLink = 31,
    NameTooLong = 63,
    NotEmpty = 66,
    DQuot = 69,
    Stale = 70,
    Remote = 71,
    BadHandle = 10001,
    NotSync = 10002,
    BadCookie = 10003,
    NotSupp = 10004,
    TooSmall = 10005,
    ServerFault = 10006,
    BadType = 10007,
    Jukebox = 10008,
}

impl NfsStat {
    /// The status for an errno from the filesystem layer.
    pub fn from_errno(e: i32) -> NfsStat {
        match e {
            libc::EPERM => NfsStat::Perm,
            libc::ENOENT => NfsStat::NoEnt,
            libc::EIO => NfsStat::Io,
            libc::ENXIO => NfsStat::NxIo,
            libc::EACCES => NfsStat::Acces,
            libc::EEXIST => NfsStat::Exist,
            libc::EXDEV => NfsStat::XDev,
            libc::ENODEV => NfsStat::NoDev,
            libc::ENOTDIR => NfsStat::NotDir,
            libc::EISDIR => NfsStat::IsDir,
            libc::EINVAL => NfsStat::Inval,
            libc::EFBIG => NfsStat::FBig,
            libc::ENOSPC => NfsStat::NoSpc,
            libc::EROFS => NfsStat::RoFs,
            libc::EMLINK => NfsStat::MLink,
            libc::ENAMETOOLONG => NfsStat::NameTooLong,
            libc::ENOTEMPTY => NfsStat::NotEmpty,
            libc::EDQUOT => NfsStat::DQuot,
            libc::ESTALE => NfsStat::Stale,
            libc::EREMOTE => NfsStat::Remote,
            libc::EBADF => NfsStat::BadHandle,
            libc::ENOTSUP => NfsStat::NotSupp,
            libc::ENOSYS => NfsStat::NotSupp,
            libc::EAGAIN => NfsStat::Jukebox,
            // A symlink where a file or directory is needed.
            libc::ELOOP => NfsStat::Inval,
            libc::E2BIG | libc::EOVERFLOW => NfsStat::FBig,
            _ => NfsStat::Io,
        }
    }

    /// The status value as it goes on the wire.
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// `mountstat3` values.
#[allow(missing_docs)]
pub mod mountstat {
    pub const OK: u32 = 0;
    pub const PERM: u32 = 1;
    pub const NOENT: u32 = 2;
    pub const IO: u32 = 5;
    pub const ACCES: u32 = 13;
    pub const NOTDIR: u32 = 20;
    pub const INVAL: u32 = 22;
    pub const NAMETOOLONG: u32 = 63;
    pub const NOTSUPP: u32 = 10004;
    pub const SERVERFAULT: u32 = 10006;

    /// The `mountstat3` for an `nfsstat3`: the same number where MOUNT
    /// defines it, an I/O error for a stale or unreachable filesystem,
    /// and a server fault for the rest (a client told a status MOUNT does
    /// not define cannot make sense of it).
    pub fn from_nfs(code: u32) -> u32 {
        match code {
            OK | PERM | NOENT | IO | ACCES | NOTDIR | INVAL | NAMETOOLONG | NOTSUPP
            | SERVERFAULT => code,
            // STALE, BADHANDLE, and the nfsstat3 I/O-like codes.
            6 | 70 | 10001 => IO,
            _ => SERVERFAULT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_gets_only_mount_statuses() {
        let defined = [0, 1, 2, 5, 13, 20, 22, 63, 10004, 10006];
        for code in (0..200).chain(10000..10030) {
            let m = mountstat::from_nfs(code);
            assert!(defined.contains(&m), "{code} became {m}");
            if defined.contains(&code) {
                assert_eq!(m, code);
            }
        }
        assert_eq!(mountstat::from_nfs(NfsStat::Stale.code()), mountstat::IO);
        assert_eq!(
            mountstat::from_nfs(NfsStat::Jukebox.code()),
            mountstat::SERVERFAULT
        );
    }

    #[test]
    fn errno_mapping() {
        let cases = [
            (libc::ENOENT, 2),
            (libc::EACCES, 13),
            (libc::EPERM, 1),
            (libc::EEXIST, 17),
            (libc::ENOTDIR, 20),
            (libc::EISDIR, 21),
            (libc::EINVAL, 22),
            (libc::EFBIG, 27),
            (libc::ENOSPC, 28),
            (libc::EROFS, 30),
            (libc::ENAMETOOLONG, 63),
            (libc::ENOTEMPTY, 66),
            (libc::EDQUOT, 69),
            (libc::ESTALE, 70),
            (libc::EIO, 5),
            (libc::EXDEV, 18),
            (libc::EMLINK, 31),
            (libc::ENOTSUP, 10004),
            (libc::EOPNOTSUPP, 10004),
            (12345, 5),
        ];
        for (e, s) in cases {
            assert_eq!(NfsStat::from_errno(e).code(), s, "errno {e}");
        }
    }
}
