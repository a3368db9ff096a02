//! Extended attributes: `ino ‖ XATTR ‖ h` with the same hashed-name scheme
//! as directory entries (so names up to 255 bytes fit the key limit). The
//! value is `01 ‖ name_len u8 ‖ name ‖ data`, stored inline when it fits a
//! plain value and as a block otherwise; the leading 01 keeps a block from
//! ever being all zeros, which the store would turn into a hole.

use std::ops::Bound;

use crate::codec::{self, K_XATTR};
use crate::inode::Tx;
use crate::store::{Val, MAX_VALUE};
use crate::{FsError, Result};

struct XEnt {
    h: u64,
    name: Vec<u8>,
    value: Vec<u8>,
}

fn decode(ino: u64, key: &[u8], v: Val, tx: &mut Tx) -> Result<XEnt> {
    let h = codec::key3_suffix(key, ino, K_XATTR)?;
    let raw = match v {
        Val::Plain(p) => p,
        Val::Block { .. } => tx.s.read_block(key)?.unwrap_or_default(),
    };
    let bad = || FsError::io(format!("inode {ino}: corrupt xattr {h:#x}"));
    if raw.len() < 2 || raw[0] != 1 {
        return Err(bad());
    }
    let nl = raw[1] as usize;
    if nl == 0 || raw.len() < 2 + nl {
        return Err(bad());
    }
    Ok(XEnt {
        h,
        name: raw[2..2 + nl].to_vec(),
        value: raw[2 + nl..].to_vec(),
    })
}

fn find(tx: &mut Tx, ino: u64, name: &[u8]) -> Result<(u64, Option<XEnt>)> {
    let b = tx.name_bucket(ino, name)?;
    let lo = codec::key3(ino, K_XATTR, b);
    let hi = codec::key3(ino, K_XATTR, b | 0xffff);
    let page = tx.s.range(
        Bound::Included(lo.as_slice()),
        Bound::Included(hi.as_slice()),
        usize::MAX,
    )?;
    let mut found = None;
    let mut used = Vec::new();
    for (k, v) in page {
        let e = decode(ino, &k, v, tx)?;
        used.push(e.h & 0xffff);
        if e.name == name {
            found = Some(e);
        }
    }
    if found.is_some() {
        return Ok((b, found));
    }
    used.sort_unstable();
    let mut c = 0u64;
    for u in used {
        if u == c {
            c += 1;
        } else if u > c {
            break;
        }
    }
    if c > 0xffff {
        return Err(FsError::new(libc::ENOSPC, "xattr hash bucket full"));
    }
    Ok((b | c, None))
}

/// The value of attribute `name`, if set.
pub(crate) fn get(tx: &mut Tx, ino: u64, name: &[u8]) -> Result<Option<Vec<u8>>> {
    Ok(find(tx, ino, name)?.1.map(|e| e.value))
}

/// Sets `name` to `value`; `exists` tells whether it was set before.
pub(crate) fn set(tx: &mut Tx, ino: u64, name: &[u8], value: &[u8]) -> Result<bool> {
    let (free_h, found) = find(tx, ino, name)?;
    let h = found.as_ref().map(|e| e.h).unwrap_or(free_h);
    let key = codec::key3(ino, K_XATTR, h);
    let mut raw = Vec::with_capacity(2 + name.len() + value.len());
    raw.push(1u8);
    raw.push(name.len() as u8);
    raw.extend_from_slice(name);
    raw.extend_from_slice(value);
    if raw.len() <= MAX_VALUE {
        tx.s.put(&key, &raw)?;
    } else {
        tx.s.write_block(&key, raw)?;
    }
    Ok(found.is_some())
}

/// Removes `name`; false if it was not set.
pub(crate) fn remove(tx: &mut Tx, ino: u64, name: &[u8]) -> Result<bool> {
    match find(tx, ino, name)?.1 {
        Some(e) => {
            tx.s.delete(&codec::key3(ino, K_XATTR, e.h))?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Every attribute name of `ino`, in key order.
pub(crate) fn list(tx: &mut Tx, ino: u64) -> Result<Vec<Vec<u8>>> {
    let lo = codec::key2(ino, K_XATTR);
    let hi = codec::key2(ino, K_XATTR + 1);
    let page = tx.s.range(
        Bound::Included(lo.as_slice()),
        Bound::Excluded(hi.as_slice()),
        usize::MAX,
    )?;
    let mut out = Vec::new();
    for (k, v) in page {
        out.push(decode(ino, &k, v, tx)?.name);
    }
    Ok(out)
}
