//! Directory entries: one key per entry, `dir ‖ DIRENT ‖ h`, where `h` is
//! a 40-bit hash of the name shifted left 16 bits plus a collision counter.
//! Lookup scans one hash bucket (almost always a single key): O(log n).
//! Listing resumes from a key: O(entries returned), and the cookie is the
//! key itself, so it survives restarts and concurrent changes.

use std::ops::Bound;

use crate::codec::{self, Dec, Enc, K_DIRENT};
use crate::inode::Tx;
use crate::store::Val;
use crate::types::FileKind;
use crate::{FsError, Result};

/// Cookies 0 (start), 1 (after `.`) and 2 (after `..`) are reserved; an
/// entry with hash key `h` has cookie `h + COOKIE_BASE`.
pub(crate) const COOKIE_BASE: u64 = 3;

/// One decoded directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Dirent {
    /// Hash key (bucket | counter).
    pub h: u64,
    pub ino: u64,
    pub kind: FileKind,
    pub name: Vec<u8>,
}

fn encode(ino: u64, kind: FileKind, name: &[u8]) -> Vec<u8> {
    let mut e = Enc::default();
    e.u64(ino).u8(kind.dtype()).bytes(name);
    e.0
}

fn decode(dir: u64, key: &[u8], v: &Val) -> Result<Dirent> {
    let h = codec::key3_suffix(key, dir, K_DIRENT)?;
    let Val::Plain(v) = v else {
        return Err(FsError::io(format!(
            "directory {dir}: entry {h:#x} stored as a block"
        )));
    };
    let mut d = Dec::new(v, "directory entry");
    let ino = d.u64()?;
    let t = d.u8()?;
    let kind = FileKind::from_dtype(t).ok_or_else(|| d.bad(format_args!("type {t}")))?;
    let name = d.rest().to_vec();
    if name.is_empty() {
        return Err(d.bad("empty name"));
    }
    Ok(Dirent { h, ino, kind, name })
}

/// All entries in the hash bucket of `name`.
fn bucket(tx: &mut Tx, dir: u64, name: &[u8]) -> Result<(u64, Vec<Dirent>)> {
    let b = tx.name_bucket(dir, name)?;
    let hi = codec::key3(dir, K_DIRENT, b | 0xffff);
    let mut start = codec::key3(dir, K_DIRENT, b);
    let mut incl = true;
    let mut out = Vec::new();
    loop {
        let lo = if incl {
            Bound::Included(start.as_slice())
        } else {
            Bound::Excluded(start.as_slice())
        };
        let page = tx.s.range(lo, Bound::Included(hi.as_slice()), 64)?;
        let n = page.len();
        for (k, v) in &page {
            out.push(decode(dir, k, v)?);
        }
        match page.into_iter().last() {
            Some((k, _)) if n == 64 => {
                start = k;
                incl = false;
            }
            _ => break,
        }
    }
    Ok((b, out))
}

/// The entry named `name` in `dir`.
pub(crate) fn find(tx: &mut Tx, dir: u64, name: &[u8]) -> Result<Option<Dirent>> {
    let (_, entries) = bucket(tx, dir, name)?;
    Ok(entries.into_iter().find(|e| e.name == name))
}

/// Adds an entry (the caller has checked the name is free) and returns its
/// hash key.
pub(crate) fn insert(tx: &mut Tx, dir: u64, name: &[u8], ino: u64, kind: FileKind) -> Result<u64> {
    let (b, entries) = bucket(tx, dir, name)?;
    let mut used: Vec<u64> = entries.iter().map(|e| e.h & 0xffff).collect();
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
        return Err(FsError::new(libc::ENOSPC, "directory hash bucket full"));
    }
    let h = b | c;
    tx.s.put(&codec::key3(dir, K_DIRENT, h), &encode(ino, kind, name))?;
    tx.entry_changed(dir, name);
    Ok(h)
}

/// Points the existing entry `h` (named `name`) at another inode.
pub(crate) fn set(
    tx: &mut Tx,
    dir: u64,
    h: u64,
    name: &[u8],
    ino: u64,
    kind: FileKind,
) -> Result<()> {
    tx.s.put(&codec::key3(dir, K_DIRENT, h), &encode(ino, kind, name))?;
    tx.entry_changed(dir, name);
    Ok(())
}

/// Removes entry `h` (named `name`).
pub(crate) fn remove(tx: &mut Tx, dir: u64, h: u64, name: &[u8]) -> Result<()> {
    if !tx.s.delete(&codec::key3(dir, K_DIRENT, h))? {
        return Err(FsError::io(format!(
            "directory {dir}: entry {h:#x} vanished"
        )));
    }
    tx.entry_changed(dir, name);
    Ok(())
}

/// Up to `limit` entries with hash key above `after` (or from the start).
pub(crate) fn list(tx: &mut Tx, dir: u64, after: Option<u64>, limit: usize) -> Result<Vec<Dirent>> {
    let start = match after {
        Some(h) => (codec::key3(dir, K_DIRENT, h), false),
        None => (codec::key2(dir, K_DIRENT), true),
    };
    let end = codec::key2(dir, K_DIRENT + 1);
    let lo = if start.1 {
        Bound::Included(start.0.as_slice())
    } else {
        Bound::Excluded(start.0.as_slice())
    };
    let page = tx.s.range(lo, Bound::Excluded(end.as_slice()), limit)?;
    page.iter().map(|(k, v)| decode(dir, k, v)).collect()
}
