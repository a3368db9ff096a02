//! The value types of the public API: attributes, credentials, directory
//! entries and the flag constants front ends pass through.

/// The errno of a [`SetAttr`] refused by its `if_ctime` guard. No other
/// call of the filesystem returns it, so the NFS layer can answer its
/// own "not in sync" status for it.
pub const GUARD_ERRNO: i32 = libc::EBADE;

/// `rename` flag: fail with EEXIST instead of replacing an existing target
/// (Linux `RENAME_NOREPLACE`, same value).
pub const RENAME_NOREPLACE: u32 = 1;
/// `rename` flag: atomically swap source and target, which must both exist
/// (Linux `RENAME_EXCHANGE`, same value).
pub const RENAME_EXCHANGE: u32 = 2;
/// `setxattr` flag: fail with EEXIST if the attribute exists (Linux value).
pub const XATTR_CREATE: u32 = 1;
/// `setxattr` flag: fail with ENODATA unless the attribute exists (Linux value).
pub const XATTR_REPLACE: u32 = 2;
/// `fallocate` mode bit: do not change the file size (Linux value).
pub const FALLOC_FL_KEEP_SIZE: u32 = 1;
/// `fallocate` mode bit: free the range, which then reads as zeros; must be
/// combined with [`FALLOC_FL_KEEP_SIZE`] (Linux value).
pub const FALLOC_FL_PUNCH_HOLE: u32 = 2;

/// `access` mask bit: read permission (`R_OK`).
pub const R_OK: u32 = 4;
/// `access` mask bit: write permission (`W_OK`).
pub const W_OK: u32 = 2;
/// `access` mask bit: execute/search permission (`X_OK`).
pub const X_OK: u32 = 1;

/// Longest file name component in bytes (`NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// Longest symlink target in bytes (`PATH_MAX - 1`).
pub const SYMLINK_MAX: usize = 4095;
/// Largest extended attribute value in bytes (`XATTR_SIZE_MAX`).
pub const XATTR_SIZE_MAX: usize = 65536;
/// Most hard links (or subdirectories + 2) an inode may have; above → EMLINK.
pub const LINK_MAX: u32 = 65000;

/// Inode number of the root directory (FUSE requires 1).
pub const ROOT_INO: u64 = 1;
/// Inode number reserved for the virtual `.snapshot` directory of the root.
pub const SNAPDIR_INO: u64 = 2;
/// Inode numbers of one dataset (live or snapshot) use the low 48 bits; the
/// high 16 bits select the snapshot slot (0 = the live dataset).
pub const SLOT_SHIFT: u32 = 48;

/// A point in time: seconds and nanoseconds since the Unix epoch. Kept as a
/// pair (not one i64 of nanoseconds) so `utimensat` can store any value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// Seconds since the epoch (negative before 1970).
    pub sec: i64,
    /// Nanoseconds, `0..1_000_000_000`.
    pub nsec: u32,
}

impl Timestamp {
    /// Builds a timestamp, normalising `nsec` into range.
    pub fn new(sec: i64, nsec: u32) -> Self {
        Timestamp {
            sec: sec.saturating_add(i64::from(nsec / 1_000_000_000)),
            nsec: nsec % 1_000_000_000,
        }
    }
    /// Total nanoseconds since the epoch, for comparisons and arithmetic.
    pub fn as_nanos(&self) -> i128 {
        i128::from(self.sec) * 1_000_000_000 + i128::from(self.nsec)
    }
}

/// A time to set with [`SetAttr`]: the server's clock or a given value.
/// The distinction matters for permissions (`UTIME_NOW` only needs write
/// access; explicit times need ownership).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    /// The current time of the store's clock.
    Now,
    /// An explicit time.
    At(Timestamp),
}

/// The type of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A regular file.
    Regular,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A character device node (metadata only).
    CharDevice,
    /// A block device node (metadata only).
    BlockDevice,
    /// A named pipe (metadata only).
    Fifo,
    /// A Unix socket (metadata only).
    Socket,
}

impl FileKind {
    /// The kind encoded in the `S_IFMT` bits of `mode`, if valid.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        match mode & libc::S_IFMT {
            libc::S_IFREG => Some(FileKind::Regular),
            libc::S_IFDIR => Some(FileKind::Directory),
            libc::S_IFLNK => Some(FileKind::Symlink),
            libc::S_IFCHR => Some(FileKind::CharDevice),
            libc::S_IFBLK => Some(FileKind::BlockDevice),
            libc::S_IFIFO => Some(FileKind::Fifo),
            libc::S_IFSOCK => Some(FileKind::Socket),
            _ => None,
        }
    }
    /// The `S_IFMT` bits of this kind.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::Regular => libc::S_IFREG,
            FileKind::Directory => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::CharDevice => libc::S_IFCHR,
            FileKind::BlockDevice => libc::S_IFBLK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
        }
    }
    /// The `d_type` value readdir reports (`DT_REG`, `DT_DIR`, ...).
    pub fn dtype(self) -> u8 {
        match self {
            FileKind::Regular => libc::DT_REG,
            FileKind::Directory => libc::DT_DIR,
            FileKind::Symlink => libc::DT_LNK,
            FileKind::CharDevice => libc::DT_CHR,
            FileKind::BlockDevice => libc::DT_BLK,
            FileKind::Fifo => libc::DT_FIFO,
            FileKind::Socket => libc::DT_SOCK,
        }
    }
    /// Inverse of [`FileKind::dtype`].
    pub fn from_dtype(d: u8) -> Option<FileKind> {
        [
            FileKind::Regular,
            FileKind::Directory,
            FileKind::Symlink,
            FileKind::CharDevice,
            FileKind::BlockDevice,
            FileKind::Fifo,
            FileKind::Socket,
        ]
        .into_iter()
        .find(|k| k.dtype() == d)
    }
}

/// What an NFS file handle needs to find an inode again and to notice that
/// it is gone: the dataset (or snapshot) guid, the inode number and its
/// generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileHandle {
    /// `StoreInfo::guid` of the dataset or snapshot holding the inode.
    pub dataset: u64,
    /// The inode number as this `Fs` reports it.
    pub ino: u64,
    /// The inode's generation number.
    pub generation: u64,
}

/// Attributes of an inode, shaped like `struct stat` so front ends can
/// copy them field by field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number, unique across the whole mount (see the crate docs).
    pub ino: u64,
    /// Generation number, for NFS handles.
    pub generation: u64,
    /// Guid of the dataset or snapshot the inode lives in.
    pub dataset: u64,
    /// The inode type.
    pub kind: FileKind,
    /// Full `st_mode`: type bits and permission bits.
    pub mode: u32,
    /// Link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes (directories: entries + 2; symlinks: target length).
    pub size: u64,
    /// Allocated space in 512-byte units (holes take none).
    pub blocks: u64,
    /// Preferred I/O size: the file's record size.
    pub blksize: u32,
    /// Device number of a device node (0 otherwise).
    pub rdev: u64,
    /// Last access (relatime rules).
    pub atime: Timestamp,
    /// Last data change.
    pub mtime: Timestamp,
    /// Last inode change.
    pub ctime: Timestamp,
    /// Creation (birth) time.
    pub crtime: Timestamp,
}

impl Attr {
    /// The permission bits (`mode & 07777`).
    pub fn perm(&self) -> u32 {
        self.mode & 0o7777
    }
    /// The NFS-style handle of this inode.
    pub fn handle(&self) -> FileHandle {
        FileHandle {
            dataset: self.dataset,
            ino: self.ino,
            generation: self.generation,
        }
    }
}

/// Changes for [`crate::Fs::setattr`]; `None` leaves a field alone.
///
/// A `SetAttr` with nothing set still marks the inode changed (ctime =
/// now): that is what the kernel asks for on `chown(path, -1, -1)`, and
/// what Linux filesystems do then.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits (type bits are ignored).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeSet>,
    /// New modification time.
    pub mtime: Option<TimeSet>,
    /// True when the change comes through an open file (`ftruncate`,
    /// `futimens`): the write permission was checked at open time, so a
    /// size change is not checked again.
    pub from_open_file: bool,
    /// Change nothing unless the inode's change time is still this one
    /// (NFS's SETATTR guard): checked in the transaction that makes the
    /// change, so no other change can slip in between; otherwise the call
    /// fails with [`crate::GUARD_ERRNO`].
    pub if_ctime: Option<Timestamp>,
}

/// The caller's identity, used for every permission check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cred {
    /// Effective (filesystem) user id; 0 is root and bypasses checks.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Cred {
    /// Root, for tests and internal work.
    pub fn root() -> Cred {
        Cred::default()
    }
    /// A credential with no supplementary groups.
    pub fn user(uid: u32, gid: u32) -> Cred {
        Cred {
            uid,
            gid,
            groups: Vec::new(),
        }
    }
    /// True for root.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
    /// True if `gid` is the primary or a supplementary group.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// One entry returned by [`crate::Fs::readdir`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Inode number of the entry.
    pub ino: u64,
    /// Cookie to pass to the next `readdir` to continue after this entry.
    /// Stable across restarts and concurrent changes.
    pub cookie: u64,
    /// Type of the entry.
    pub kind: FileKind,
    /// Name (raw bytes; no `/` or NUL).
    pub name: Vec<u8>,
}

/// Filesystem statistics for `statfs`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    /// Block size the counts below use.
    pub bsize: u32,
    /// Total blocks.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks for unprivileged users (the same: no root reserve).
    pub bavail: u64,
    /// Inodes in use plus free inode numbers.
    pub files: u64,
    /// Free inode numbers.
    pub ffree: u64,
    /// Longest name.
    pub namelen: u32,
}
