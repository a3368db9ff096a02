//! Key construction and a small bounds-checked decoder for stored values.
//!
//! Keys put integers in big-endian order so that byte order equals numeric
//! order (the tree sorts keys bytewise); values use little-endian, like the
//! rest of tarn's on-disk format.

use crate::{FsError, Result};

/// Key kind: the inode record of `ino` (for ino 0: the superblock).
pub(crate) const K_INODE: u8 = 0x01;
/// Key kind: one extended attribute (hashed name + collision counter).
pub(crate) const K_XATTR: u8 = 0x02;
/// Key kind: one directory entry (hashed name + collision counter).
pub(crate) const K_DIRENT: u8 = 0x03;
/// Key kind: one data record of a file (or a long symlink target).
pub(crate) const K_DATA: u8 = 0x04;
/// Key kind (under ino 0 only): one orphan, an unlinked inode still open.
pub(crate) const K_ORPHAN: u8 = 0x05;

/// The prefix every key of `ino` starts with.
pub(crate) fn ino_prefix(ino: u64) -> [u8; 8] {
    ino.to_be_bytes()
}

/// `ino ‖ kind`.
pub(crate) fn key2(ino: u64, kind: u8) -> Vec<u8> {
    // Room for `key3`'s counter without growing.
    let mut k = Vec::with_capacity(17);
    k.extend_from_slice(&key2_array(ino, kind));
    k
}

/// [`key2`] on the stack, for lookups made once per listed entry.
pub(crate) fn key2_array(ino: u64, kind: u8) -> [u8; 9] {
    let mut k = [kind; 9];
    k[..8].copy_from_slice(&ino.to_be_bytes());
    k
}

/// `ino ‖ kind ‖ n` with `n` big-endian.
pub(crate) fn key3(ino: u64, kind: u8, n: u64) -> Vec<u8> {
    let mut k = key2(ino, kind);
    k.extend_from_slice(&n.to_be_bytes());
    k
}

/// Parses the trailing u64 of a `key3` key of the given ino and kind.
pub(crate) fn key3_suffix(key: &[u8], ino: u64, kind: u8) -> Result<u64> {
    if key.len() != 17 || key[..8] != ino.to_be_bytes() || key[8] != kind {
        return Err(FsError::io(format!(
            "unexpected key {:02x?} under inode {ino} kind {kind}",
            key
        )));
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&key[9..17]);
    Ok(u64::from_be_bytes(b))
}

/// The 40-bit hash of a name in directory (or inode, for xattrs) `ino`,
/// shifted so the low 16 bits are free for a collision counter. In an
/// encrypted dataset the hash is keyed with the superblock's secret name
/// key and covers `ino` too, so the keys in the tree (which are not
/// encrypted) neither let anyone test guesses of names nor show that two
/// directories hold the same name.
pub(crate) fn name_bucket(key: Option<&[u8; 32]>, ino: u64, name: &[u8]) -> u64 {
    let h = match key {
        Some(k) => {
            let mut h = blake3::Hasher::new_keyed(k);
            h.update(&ino.to_be_bytes());
            h.update(name);
            h.finalize()
        }
        None => blake3::hash(name),
    };
    let b = h.as_bytes();
    let v = u64::from_be_bytes([0, 0, 0, b[0], b[1], b[2], b[3], b[4]]);
    v << 16
}

/// Appends little-endian integers to a value.
#[derive(Default)]
pub(crate) struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
}

/// Reads little-endian integers from a stored value; running off the end is
/// an EIO naming `what`, never a panic.
pub(crate) struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Dec<'a> {
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Dec { buf, pos: 0, what }
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(FsError::io(format!(
                "corrupt {}: truncated at byte {} of {}",
                self.what,
                self.pos,
                self.buf.len()
            ))),
        }
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.arr::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.arr()?))
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    pub fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.arr()?))
    }
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
    /// An error naming the value kind, for checks the caller does.
    pub fn bad(&self, why: impl std::fmt::Display) -> FsError {
        FsError::io(format!("corrupt {}: {why}", self.what))
    }
}
