//! Leaf entries kept in their encoded form.

use std::cmp::Ordering;

use crate::{MAX_KEY, MAX_VALUE};

/// Orders two keys as byte strings (the same order as `<[u8]>::cmp`).
///
/// Most keys start with an 8-byte big-endian object number, and two keys
/// met in a search usually differ there: comparing those bytes as one
/// integer settles most probes without a call to `memcmp`, which dominated
/// the lookups of a directory listing's inodes.
#[inline]
pub(crate) fn cmp_keys(a: &[u8], b: &[u8]) -> Ordering {
    if let (Some(ha), Some(hb)) = (a.first_chunk::<8>(), b.first_chunk::<8>()) {
        match u64::from_be_bytes(*ha).cmp(&u64::from_be_bytes(*hb)) {
            Ordering::Equal => a[8..].cmp(&b[8..]),
            o => o,
        }
    } else {
        a.cmp(b)
    }
}

/// Key length (u16) and value length (u32) in front of every leaf entry.
pub(crate) const ENTRY_OVERHEAD: usize = 6;

/// The entries of a leaf, stored back to back exactly as encoded on disk
/// (`key_len: u16, value_len: u32, key, value`), plus where each one starts.
///
/// A search then touches two dense arrays instead of two heap objects per
/// entry, decoding a node is one copy after validation, and a cached leaf
/// costs about its size on disk. Changes move at most one node's bytes.
#[derive(Clone, Default)]
pub(crate) struct Leaf {
    buf: Vec<u8>,
    offs: Vec<u32>,
}

impl Leaf {
    /// A leaf holding `entries`, which must be in strictly ascending key order.
    pub fn from_entries<'a>(entries: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Leaf {
        let mut leaf = Leaf::default();
        for (k, v) in entries {
            leaf.insert(leaf.len(), k, v);
        }
        leaf
    }

    /// Validates `count` encoded entries filling all of `data` and returns
    /// the leaf, or what is wrong with the bytes.
    pub fn parse(data: &[u8], count: usize) -> Result<Leaf, String> {
        let mut offs = Vec::with_capacity(count.min(data.len() / ENTRY_OVERHEAD));
        let mut pos = 0usize;
        let mut prev: Option<&[u8]> = None;
        for i in 0..count {
            let Some(head) = data.get(pos..pos + ENTRY_OVERHEAD) else {
                return Err(format!("entry {i} of {count} is truncated"));
            };
            let klen = u16::from_le_bytes([head[0], head[1]]) as usize;
            let vlen = u32::from_le_bytes([head[2], head[3], head[4], head[5]]) as usize;
            if klen > MAX_KEY || vlen > MAX_VALUE {
                return Err(format!(
                    "entry {i} has a key of {klen} and a value of {vlen} bytes"
                ));
            }
            let kstart = pos + ENTRY_OVERHEAD;
            let end = kstart + klen + vlen;
            let Some(key) = data
                .get(kstart..kstart + klen)
                .filter(|_| end <= data.len())
            else {
                return Err(format!("entry {i} of {count} is truncated"));
            };
            if prev.is_some_and(|p| p >= key) {
                return Err(format!("entry {i} is out of key order"));
            }
            prev = Some(key);
            offs.push(pos as u32);
            pos = end;
        }
        if pos != data.len() {
            return Err(format!("{} trailing bytes", data.len() - pos));
        }
        Ok(Leaf {
            buf: data.to_vec(),
            offs,
        })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.offs.len()
    }

    /// The encoded entries.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    fn start(&self, i: usize) -> usize {
        self.offs.get(i).map_or(self.buf.len(), |&o| o as usize)
    }

    /// Encoded size of entry `i`.
    pub fn entry_size(&self, i: usize) -> usize {
        self.start(i + 1) - self.start(i)
    }

    /// Key and value of entry `i`.
    pub fn entry(&self, i: usize) -> (&[u8], &[u8]) {
        let (o, end) = (self.start(i), self.start(i + 1));
        let klen = u16::from_le_bytes([self.buf[o], self.buf[o + 1]]) as usize;
        let k = o + ENTRY_OVERHEAD;
        (&self.buf[k..k + klen], &self.buf[k + klen..end])
    }

    pub fn key(&self, i: usize) -> &[u8] {
        // Only the key: searches call this for every probe, and the value's
        // end (the next entry's start) is not needed for it.
        let o = self.start(i);
        let klen = u16::from_le_bytes([self.buf[o], self.buf[o + 1]]) as usize;
        let k = o + ENTRY_OVERHEAD;
        &self.buf[k..k + klen]
    }

    /// The last key, if any.
    pub fn last_key(&self) -> Option<&[u8]> {
        self.len().checked_sub(1).map(|i| self.key(i))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        (0..self.len()).map(|i| self.entry(i))
    }

    /// Index of `key`, or where it would be inserted.
    pub fn search(&self, key: &[u8]) -> Result<usize, usize> {
        self.search_from(0, key)
    }

    /// [`Leaf::search`] among the entries from `lo` on, for a key known
    /// not to sort before entry `lo` (the next of a run of sorted keys).
    pub fn search_from(&self, lo: usize, key: &[u8]) -> Result<usize, usize> {
        let (mut lo, mut hi) = (lo.min(self.len()), self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match cmp_keys(self.key(mid), key) {
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
                Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    /// Number of leading entries whose key satisfies `pred` (which must hold
    /// for a prefix of the keys).
    pub fn partition_point(&self, pred: impl Fn(&[u8]) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if pred(self.key(mid)) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Inserts an entry at index `i`, keeping keys in order is the caller's job.
    pub fn insert(&mut self, i: usize, key: &[u8], value: &[u8]) {
        let at = self.start(i);
        let size = ENTRY_OVERHEAD + key.len() + value.len();
        let head = (key.len() as u16)
            .to_le_bytes()
            .into_iter()
            .chain((value.len() as u32).to_le_bytes());
        self.buf.splice(
            at..at,
            head.chain(key.iter().copied()).chain(value.iter().copied()),
        );
        self.offs.insert(i, at as u32);
        for o in &mut self.offs[i + 1..] {
            *o += size as u32;
        }
    }

    /// Removes entries `a..b`.
    pub fn remove_range(&mut self, a: usize, b: usize) {
        if a >= b {
            return;
        }
        let (s, e) = (self.start(a), self.start(b));
        self.buf.drain(s..e);
        self.offs.drain(a..b);
        for o in &mut self.offs[a..] {
            *o -= (e - s) as u32;
        }
    }

    /// Removes entry `i` and returns its value.
    pub fn remove(&mut self, i: usize) -> Vec<u8> {
        let value = self.entry(i).1.to_vec();
        self.remove_range(i, i + 1);
        value
    }

    /// Replaces the value of entry `i` and returns the old one.
    pub fn replace_value(&mut self, i: usize, value: &[u8]) -> Vec<u8> {
        let key = self.key(i).to_vec();
        let old = self.remove(i);
        self.insert(i, &key, value);
        old
    }

    /// Moves entries `at..` into a new leaf.
    pub fn split_off(&mut self, at: usize) -> Leaf {
        let base = self.start(at);
        let buf = self.buf.split_off(base);
        let mut offs = self.offs.split_off(at);
        for o in &mut offs {
            *o -= base as u32;
        }
        Leaf { buf, offs }
    }

    /// Appends the entries of `other`, whose keys all sort after ours.
    pub fn append(&mut self, other: Leaf) {
        let base = self.buf.len() as u32;
        self.buf.extend_from_slice(&other.buf);
        self.offs.extend(other.offs.iter().map(|o| o + base));
    }
}
