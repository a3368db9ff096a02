//! Permission checks, following Linux's `generic_permission` and
//! `setattr_prepare` so the fs is correct with or without the kernel's
//! `default_permissions`.

use crate::inode::Inode;
use crate::types::{Cred, R_OK, W_OK, X_OK};
use crate::{FsError, Result};

/// Checks `mask` (a combination of `R_OK`, `W_OK`, `X_OK`) against the
/// inode's mode for `cred`. Root passes read/write always and execute when
/// any execute bit is set (or for directories).
pub(crate) fn check(inode: &Inode, cred: &Cred, mask: u32) -> Result<()> {
    if allowed(inode, cred, mask) {
        Ok(())
    } else {
        Err(FsError::new(
            libc::EACCES,
            format!("permission denied on inode {}", inode.ino),
        ))
    }
}

pub(crate) fn allowed(inode: &Inode, cred: &Cred, mask: u32) -> bool {
    let mode = inode.mode;
    if cred.is_root() {
        return mask & X_OK == 0 || inode.is_dir() || mode & 0o111 != 0;
    }
    let bits = if cred.uid == inode.uid {
        (mode >> 6) & 7
    } else if cred.in_group(inode.gid) {
        (mode >> 3) & 7
    } else {
        mode & 7
    };
    bits & mask & (R_OK | W_OK | X_OK) == mask & (R_OK | W_OK | X_OK)
}

/// True if `cred` owns the inode or is root (chmod, explicit utimes).
pub(crate) fn owner_or_root(inode: &Inode, cred: &Cred) -> bool {
    cred.is_root() || cred.uid == inode.uid
}

/// The sticky-directory rule for removing or replacing `victim` from
/// `dir`: in a sticky directory only the owner of the victim, the owner
/// of the directory, or root may do it (EPERM otherwise).
pub(crate) fn check_sticky(dir: &Inode, victim: &Inode, cred: &Cred) -> Result<()> {
    if dir.mode & libc::S_ISVTX != 0
        && !cred.is_root()
        && cred.uid != dir.uid
        && cred.uid != victim.uid
    {
        return Err(FsError::new(
            libc::EPERM,
            "sticky directory: not the owner of the entry or the directory",
        ));
    }
    Ok(())
}

/// Linux's `should_remove_suid`: the set-id bits a data change or chown by
/// `cred` must clear. SUID always; SGID only together with group-execute
/// (otherwise it marks mandatory locking, not set-group-id).
pub(crate) fn kill_setid(mode: u32) -> u32 {
    let mut m = mode & !libc::S_ISUID;
    if mode & libc::S_ISGID != 0 && mode & libc::S_IXGRP != 0 {
        m &= !libc::S_ISGID;
    }
    m
}
