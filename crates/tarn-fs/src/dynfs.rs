//! An object-safe face of [`Fs`]: front ends that keep filesystems of
//! different backends side by side (NFS exports, WebDAV shares) hold an
//! `Arc<dyn DynFs>`, and their protocol code is compiled once. Every method
//! means exactly what the `Fs` method of the same name means, and blocks.

use crate::{Attr, Backend, Cred, DirEntry, FileHandle, Fs, ReadData, Result, SetAttr, StatFs};

/// [`Fs`] behind a trait object (see the module docs).
#[allow(missing_docs)]
pub trait DynFs: Send + Sync + 'static {
    fn epoch(&self) -> u64;
    fn lookup(&self, parent: u64, name: &[u8], cred: &Cred) -> Result<Attr>;
    fn getattr_handle(&self, h: &FileHandle) -> Result<Attr>;
    fn getattr(&self, ino: u64) -> Result<Attr>;
    fn setattr(&self, ino: u64, sa: &SetAttr, cred: &Cred) -> Result<Attr>;
    fn access(&self, ino: u64, mask: u32, cred: &Cred) -> Result<()>;
    #[allow(clippy::too_many_arguments)]
    fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        umask: u32,
        cred: &Cred,
    ) -> Result<Attr>;
    fn mkdir(&self, parent: u64, name: &[u8], mode: u32, umask: u32, cred: &Cred) -> Result<Attr>;
    fn symlink(&self, parent: u64, name: &[u8], target: &[u8], cred: &Cred) -> Result<Attr>;
    fn readlink(&self, ino: u64) -> Result<Vec<u8>>;
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
        cred: &Cred,
    ) -> Result<Attr>;
    fn link(&self, ino: u64, newparent: u64, newname: &[u8], cred: &Cred) -> Result<Attr>;
    fn unlink(&self, parent: u64, name: &[u8], cred: &Cred) -> Result<()>;
    fn rmdir(&self, parent: u64, name: &[u8], cred: &Cred) -> Result<()>;
    #[allow(clippy::too_many_arguments)]
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
        cred: &Cred,
    ) -> Result<()>;
    fn open(&self, ino: u64, flags: i32, cred: &Cred) -> Result<Attr>;
    fn opendir(&self, ino: u64, cred: &Cred) -> Result<Attr>;
    fn release(&self, ino: u64) -> Result<()>;
    fn releasedir(&self, ino: u64) -> Result<()>;
    fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>>;
    fn read_data(&self, ino: u64, offset: u64, size: u32) -> Result<ReadData>;
    /// [`Fs::read_data_without_atime`]: for a front end serving the
    /// filesystem read-only, whose reads must change nothing.
    fn read_data_without_atime(&self, ino: u64, offset: u64, size: u32) -> Result<ReadData>;
    /// [`Fs::write_iov`]; `write` is the one-slice case.
    fn write_iov(&self, ino: u64, off: u64, iov: &[&[u8]], app: bool, c: &Cred) -> Result<usize>;
    fn write(&self, ino: u64, off: u64, data: &[u8], app: bool, c: &Cred) -> Result<usize> {
        self.write_iov(ino, off, &[data], app, c)
    }
    fn fallocate(&self, ino: u64, offset: u64, length: u64, mode: u32, cred: &Cred) -> Result<()>;
    fn fsync(&self, ino: u64) -> Result<()>;
    fn readdir(&self, ino: u64, cookie: u64, limit: usize) -> Result<Vec<DirEntry>>;
    /// [`Fs::readdir_with`]: `atime` false lists without touching the
    /// directory's access time (a read-only front end).
    fn readdir_with(
        &self,
        ino: u64,
        cookie: u64,
        limit: usize,
        atime: bool,
    ) -> Result<Vec<DirEntry>>;
    fn readdirplus(&self, ino: u64, cookie: u64, limit: usize) -> Result<Vec<(DirEntry, Attr)>>;
    /// [`Fs::readdirplus_fitting`]; `atime` as for [`DynFs::readdir_with`].
    fn readdirplus_fitting(
        &self,
        ino: u64,
        cookie: u64,
        limit: usize,
        atime: bool,
        fits: &mut dyn FnMut(Option<&DirEntry>) -> bool,
    ) -> Result<Vec<(DirEntry, Attr)>>;
    fn statfs(&self, ino: u64) -> Result<StatFs>;
    fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: u32, cred: &Cred) -> Result<()>;
    fn getxattr(&self, ino: u64, name: &[u8], cred: &Cred) -> Result<Vec<u8>>;
    fn listxattr(&self, ino: u64, cred: &Cred) -> Result<Vec<Vec<u8>>>;
    fn removexattr(&self, ino: u64, name: &[u8], cred: &Cred) -> Result<()>;
    /// [`Fs::snapshot_times`].
    fn snapshot_times(&self) -> Result<Vec<(String, u64)>>;
}

impl<B: Backend + 'static> DynFs for Fs<B> {
    fn epoch(&self) -> u64 {
        Fs::epoch(self)
    }
    fn lookup(&self, parent: u64, name: &[u8], cred: &Cred) -> Result<Attr> {
        Fs::lookup(self, parent, name, cred)
    }
    fn getattr_handle(&self, h: &FileHandle) -> Result<Attr> {
        Fs::getattr_handle(self, h)
    }
    fn getattr(&self, ino: u64) -> Result<Attr> {
        Fs::getattr(self, ino)
    }
    fn setattr(&self, ino: u64, sa: &SetAttr, cred: &Cred) -> Result<Attr> {
        Fs::setattr(self, ino, sa, cred)
    }
    fn access(&self, ino: u64, mask: u32, cred: &Cred) -> Result<()> {
        Fs::access(self, ino, mask, cred)
    }
    fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        umask: u32,
        cred: &Cred,
    ) -> Result<Attr> {
        Fs::mknod(self, parent, name, mode, rdev, umask, cred)
    }
    fn mkdir(&self, parent: u64, name: &[u8], mode: u32, umask: u32, cred: &Cred) -> Result<Attr> {
        Fs::mkdir(self, parent, name, mode, umask, cred)
    }
    fn symlink(&self, parent: u64, name: &[u8], target: &[u8], cred: &Cred) -> Result<Attr> {
        Fs::symlink(self, parent, name, target, cred)
    }
    fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        Fs::readlink(self, ino)
    }
    fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
        cred: &Cred,
    ) -> Result<Attr> {
        Fs::create(self, parent, name, mode, umask, flags, cred)
    }
    fn link(&self, ino: u64, newparent: u64, newname: &[u8], cred: &Cred) -> Result<Attr> {
        Fs::link(self, ino, newparent, newname, cred)
    }
    fn unlink(&self, parent: u64, name: &[u8], cred: &Cred) -> Result<()> {
        Fs::unlink(self, parent, name, cred)
    }
    fn rmdir(&self, parent: u64, name: &[u8], cred: &Cred) -> Result<()> {
        Fs::rmdir(self, parent, name, cred)
    }
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
        cred: &Cred,
    ) -> Result<()> {
        Fs::rename(self, parent, name, newparent, newname, flags, cred)
    }
    fn open(&self, ino: u64, flags: i32, cred: &Cred) -> Result<Attr> {
        Fs::open(self, ino, flags, cred)
    }
    fn opendir(&self, ino: u64, cred: &Cred) -> Result<Attr> {
        Fs::opendir(self, ino, cred)
    }
    fn release(&self, ino: u64) -> Result<()> {
        Fs::release(self, ino)
    }
    fn releasedir(&self, ino: u64) -> Result<()> {
        Fs::releasedir(self, ino)
    }
    fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        Fs::read(self, ino, offset, size)
    }
    fn read_data(&self, ino: u64, offset: u64, size: u32) -> Result<ReadData> {
        Fs::read_data(self, ino, offset, size)
    }
    fn read_data_without_atime(&self, ino: u64, offset: u64, size: u32) -> Result<ReadData> {
        Fs::read_data_without_atime(self, ino, offset, size)
    }
    fn write_iov(&self, ino: u64, off: u64, iov: &[&[u8]], app: bool, c: &Cred) -> Result<usize> {
        Fs::write_iov(self, ino, off, iov, app, c)
    }
    fn fallocate(&self, ino: u64, offset: u64, length: u64, mode: u32, cred: &Cred) -> Result<()> {
        Fs::fallocate(self, ino, offset, length, mode, cred)
    }
    fn fsync(&self, ino: u64) -> Result<()> {
        Fs::fsync(self, ino)
    }
    fn readdir(&self, ino: u64, cookie: u64, limit: usize) -> Result<Vec<DirEntry>> {
        Fs::readdir(self, ino, cookie, limit)
    }
    fn readdir_with(
        &self,
        ino: u64,
        cookie: u64,
        limit: usize,
        atime: bool,
    ) -> Result<Vec<DirEntry>> {
        Fs::readdir_with(self, ino, cookie, limit, atime)
    }
    fn readdirplus(&self, ino: u64, cookie: u64, limit: usize) -> Result<Vec<(DirEntry, Attr)>> {
        Fs::readdirplus(self, ino, cookie, limit)
    }
    fn readdirplus_fitting(
        &self,
        ino: u64,
        cookie: u64,
        limit: usize,
        atime: bool,
        fits: &mut dyn FnMut(Option<&DirEntry>) -> bool,
    ) -> Result<Vec<(DirEntry, Attr)>> {
        Fs::readdirplus_fitting(self, ino, cookie, limit, atime, fits)
    }
    fn statfs(&self, ino: u64) -> Result<StatFs> {
        Fs::statfs(self, ino)
    }
    fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: u32, cred: &Cred) -> Result<()> {
        Fs::setxattr(self, ino, name, value, flags, cred)
    }
    fn getxattr(&self, ino: u64, name: &[u8], cred: &Cred) -> Result<Vec<u8>> {
        Fs::getxattr(self, ino, name, cred)
    }
    fn listxattr(&self, ino: u64, cred: &Cred) -> Result<Vec<Vec<u8>>> {
        Fs::listxattr(self, ino, cred)
    }
    fn removexattr(&self, ino: u64, name: &[u8], cred: &Cred) -> Result<()> {
        Fs::removexattr(self, ino, name, cred)
    }
    fn snapshot_times(&self) -> Result<Vec<(String, u64)>> {
        Fs::snapshot_times(self)
    }
}
