//! The object-safe seam between the WebDAV layer and a [`tarn_fs::Fs`].
//!
//! [`tarn_fs::Fs`] is generic over its backend; a share stores an
//! `Arc<dyn FsApi>` so one server can serve datasets and test backends side
//! by side and the DAV code is compiled once. Every method blocks (it takes
//! the pool lock): the DAV layer only calls them from blocking threads.

use tarn_fs::{Attr, Backend, Cred, DirEntry, Fs, SetAttr, StatFs};

/// The subset of [`tarn_fs::Fs`] the WebDAV front end uses. Implemented for
/// every `Fs<B>`; the methods have the same meaning as there.
#[allow(missing_docs)]
pub trait FsApi: Send + Sync + 'static {
    fn lookup(&self, parent: u64, name: &[u8], cred: &Cred) -> tarn_fs::Result<Attr>;
    fn getattr(&self, ino: u64) -> tarn_fs::Result<Attr>;
    fn setattr(&self, ino: u64, sa: &SetAttr, cred: &Cred) -> tarn_fs::Result<Attr>;
    fn access(&self, ino: u64, mask: u32, cred: &Cred) -> tarn_fs::Result<()>;
    fn mkdir(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        cred: &Cred,
    ) -> tarn_fs::Result<Attr>;
    fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
        cred: &Cred,
    ) -> tarn_fs::Result<Attr>;
    fn open(&self, ino: u64, flags: i32, cred: &Cred) -> tarn_fs::Result<Attr>;
    fn release(&self, ino: u64) -> tarn_fs::Result<()>;
    fn read(&self, ino: u64, offset: u64, size: u32) -> tarn_fs::Result<Vec<u8>>;
    fn write(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        append: bool,
        cred: &Cred,
    ) -> tarn_fs::Result<usize>;
    fn unlink(&self, parent: u64, name: &[u8], cred: &Cred) -> tarn_fs::Result<()>;
    fn rmdir(&self, parent: u64, name: &[u8], cred: &Cred) -> tarn_fs::Result<()>;
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
        cred: &Cred,
    ) -> tarn_fs::Result<()>;
    fn readdirplus(
        &self,
        ino: u64,
        cookie: u64,
        limit: usize,
    ) -> tarn_fs::Result<Vec<(DirEntry, Attr)>>;
    fn statfs(&self, ino: u64) -> tarn_fs::Result<StatFs>;
    fn setxattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        cred: &Cred,
    ) -> tarn_fs::Result<()>;
    fn getxattr(&self, ino: u64, name: &[u8], cred: &Cred) -> tarn_fs::Result<Vec<u8>>;
    fn listxattr(&self, ino: u64, cred: &Cred) -> tarn_fs::Result<Vec<Vec<u8>>>;
    fn removexattr(&self, ino: u64, name: &[u8], cred: &Cred) -> tarn_fs::Result<()>;
}

impl<B: Backend + 'static> FsApi for Fs<B> {
    fn lookup(&self, parent: u64, name: &[u8], cred: &Cred) -> tarn_fs::Result<Attr> {
        Fs::lookup(self, parent, name, cred)
    }
    fn getattr(&self, ino: u64) -> tarn_fs::Result<Attr> {
        Fs::getattr(self, ino)
    }
    fn setattr(&self, ino: u64, sa: &SetAttr, cred: &Cred) -> tarn_fs::Result<Attr> {
        Fs::setattr(self, ino, sa, cred)
    }
    fn access(&self, ino: u64, mask: u32, cred: &Cred) -> tarn_fs::Result<()> {
        Fs::access(self, ino, mask, cred)
    }
    fn mkdir(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        cred: &Cred,
    ) -> tarn_fs::Result<Attr> {
        Fs::mkdir(self, parent, name, mode, umask, cred)
    }
    fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
        cred: &Cred,
    ) -> tarn_fs::Result<Attr> {
        Fs::create(self, parent, name, mode, umask, flags, cred)
    }
    fn open(&self, ino: u64, flags: i32, cred: &Cred) -> tarn_fs::Result<Attr> {
        Fs::open(self, ino, flags, cred)
    }
    fn release(&self, ino: u64) -> tarn_fs::Result<()> {
        Fs::release(self, ino)
    }
    fn read(&self, ino: u64, offset: u64, size: u32) -> tarn_fs::Result<Vec<u8>> {
        Fs::read(self, ino, offset, size)
    }
    fn write(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        append: bool,
        cred: &Cred,
    ) -> tarn_fs::Result<usize> {
        Fs::write(self, ino, offset, data, append, cred)
    }
    fn unlink(&self, parent: u64, name: &[u8], cred: &Cred) -> tarn_fs::Result<()> {
        Fs::unlink(self, parent, name, cred)
    }
    fn rmdir(&self, parent: u64, name: &[u8], cred: &Cred) -> tarn_fs::Result<()> {
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
    ) -> tarn_fs::Result<()> {
        Fs::rename(self, parent, name, newparent, newname, flags, cred)
    }
    fn readdirplus(
        &self,
        ino: u64,
        cookie: u64,
        limit: usize,
    ) -> tarn_fs::Result<Vec<(DirEntry, Attr)>> {
        Fs::readdirplus(self, ino, cookie, limit)
    }
    fn statfs(&self, ino: u64) -> tarn_fs::Result<StatFs> {
        Fs::statfs(self, ino)
    }
    fn setxattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        cred: &Cred,
    ) -> tarn_fs::Result<()> {
        Fs::setxattr(self, ino, name, value, flags, cred)
    }
    fn getxattr(&self, ino: u64, name: &[u8], cred: &Cred) -> tarn_fs::Result<Vec<u8>> {
        Fs::getxattr(self, ino, name, cred)
    }
    fn listxattr(&self, ino: u64, cred: &Cred) -> tarn_fs::Result<Vec<Vec<u8>>> {
        Fs::listxattr(self, ino, cred)
    }
    fn removexattr(&self, ino: u64, name: &[u8], cred: &Cred) -> tarn_fs::Result<()> {
        Fs::removexattr(self, ino, name, cred)
    }
}
