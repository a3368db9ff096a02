//! Extended attributes: namespaces (`user.`, `trusted.`, `security.`,
//! `system.`), their permission rules, and the operations.

use crate::fs::{err, Fs, Place};
use crate::inode::Inode;
use crate::perm;
use crate::store::Backend;
use crate::types::*;
use crate::xattr;
use crate::{FsError, Result};

/// Which namespace an xattr name is in, and whether we support it.
#[derive(PartialEq, Eq)]
pub(crate) enum XNs {
    User,
    Trusted,
    Security,
}

pub(crate) fn xattr_ns(name: &[u8]) -> Result<XNs> {
    if name.is_empty() || name.len() > NAME_MAX {
        return err(libc::ERANGE, "xattr name empty or longer than 255 bytes");
    }
    if name.starts_with(b"user.") {
        Ok(XNs::User)
    } else if name.starts_with(b"trusted.") {
        Ok(XNs::Trusted)
    } else if name.starts_with(b"security.") {
        Ok(XNs::Security)
    } else {
        err(libc::EOPNOTSUPP, "unsupported xattr namespace")
    }
}

/// Linux's `xattr_permission`.
pub(crate) fn xattr_perm(i: &Inode, ns: &XNs, write: bool, cred: &Cred) -> Result<()> {
    match ns {
        XNs::Trusted if !cred.is_root() => {
            return if write {
                err(libc::EPERM, "trusted xattrs need root")
            } else {
                err(libc::ENODATA, "no such xattr")
            };
        }
        XNs::Security if write && !cred.is_root() => {
            return err(libc::EPERM, "security xattrs need root");
        }
        XNs::User => {
            if !matches!(i.kind, FileKind::Regular | FileKind::Directory) {
                return if write {
                    err(libc::EPERM, "user xattrs only on files and directories")
                } else {
                    err(libc::ENODATA, "no such xattr")
                };
            }
            if write && i.is_dir() && i.mode & libc::S_ISVTX != 0 && !perm::owner_or_root(i, cred) {
                return err(libc::EPERM, "sticky directory xattrs: owner only");
            }
        }
        _ => {}
    }
    perm::check(i, cred, if write { W_OK } else { R_OK })
}

impl<B: Backend> Fs<B> {
    /// Sets xattr `name` (namespaces `user.`, `trusted.`, `security.`;
    /// values up to 64 KiB). `flags`: [`XATTR_CREATE`] / [`XATTR_REPLACE`].
    pub fn setxattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        cred: &Cred,
    ) -> Result<()> {
        let ns = xattr_ns(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return err(libc::E2BIG, "xattr value larger than 64 KiB");
        }
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return err(libc::EINVAL, "bad xattr flags");
        }
        let local = self.live_ino(ino)?;
        self.write_txn(|tx| {
            let mut i = tx.get(local)?;
            xattr_perm(&i, &ns, true, cred)?;
            let exists = xattr::get(tx, local, name)?.is_some();
            if flags & XATTR_CREATE != 0 && exists {
                return err(libc::EEXIST, "xattr exists");
            }
            if flags & XATTR_REPLACE != 0 && !exists {
                return err(libc::ENODATA, "no such xattr");
            }
            xattr::set(tx, local, name, value)?;
            i.ctime = tx.now;
            tx.put(i);
            Ok(())
        })
    }

    /// The value of xattr `name` (ENODATA if unset). Size negotiation
    /// (`size == 0`, ERANGE) is the front end's job.
    pub fn getxattr(&self, ino: u64, name: &[u8], cred: &Cred) -> Result<Vec<u8>> {
        let ns = xattr_ns(name)?;
        if let Place::SnapDir = self.place(ino)? {
            return err(libc::ENODATA, "no such xattr");
        }
        self.read_on(ino, |tx, _, l| {
            let i = tx.get(l)?;
            xattr_perm(&i, &ns, false, cred)?;
            xattr::get(tx, l, name)?.ok_or_else(|| FsError::new(libc::ENODATA, "no such xattr"))
        })
    }

    /// Names of the xattrs of `ino` (`trusted.` ones only for root).
    pub fn listxattr(&self, ino: u64, cred: &Cred) -> Result<Vec<Vec<u8>>> {
        if let Place::SnapDir = self.place(ino)? {
            return Ok(Vec::new());
        }
        self.read_on(ino, |tx, _, l| {
            tx.get(l)?;
            let mut names = xattr::list(tx, l)?;
            if !cred.is_root() {
                names.retain(|n| !n.starts_with(b"trusted."));
            }
            Ok(names)
        })
    }

    /// Removes xattr `name` (ENODATA if unset).
    pub fn removexattr(&self, ino: u64, name: &[u8], cred: &Cred) -> Result<()> {
        let ns = xattr_ns(name)?;
        let local = self.live_ino(ino)?;
        self.write_txn(|tx| {
            let mut i = tx.get(local)?;
            xattr_perm(&i, &ns, true, cred)?;
            if !xattr::remove(tx, local, name)? {
                return err(libc::ENODATA, "no such xattr");
            }
            i.ctime = tx.now;
            tx.put(i);
            Ok(())
        })
    }
}
