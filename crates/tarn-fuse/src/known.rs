//! The inodes the kernel holds (it was given them by a lookup-like reply
//! and has not forgotten them yet), with a few of the names it may cache
//! for each: what [`crate::Mount::invalidate_all`] has to invalidate.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::sync::Mutex;

/// Names remembered per inode; older ones fall out (their cache entries
/// then expire with the entry TTL).
const MAX_NAMES: usize = 4;

#[derive(Default)]
struct KnownInode {
    nlookup: u64,
    names: Vec<(u64, OsString)>,
}

/// Lookup counts and names of the inodes the kernel knows.
#[derive(Default)]
pub(crate) struct Known {
    map: Mutex<HashMap<u64, KnownInode>>,
}

impl Known {
    /// The kernel got `ino` as `name` in `parent` (one lookup count).
    pub(crate) fn add(&self, ino: u64, parent: u64, name: &OsStr) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let k = map.entry(ino).or_default();
        k.nlookup = k.nlookup.saturating_add(1);
        if !k.names.iter().any(|(p, n)| *p == parent && n == name) {
            if k.names.len() >= MAX_NAMES {
                k.names.remove(0);
            }
            k.names.push((parent, name.to_os_string()));
        }
    }

    /// The kernel dropped `n` lookup counts of `ino`.
    pub(crate) fn forget(&self, ino: u64, n: u64) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = map.get_mut(&ino) {
            k.nlookup = k.nlookup.saturating_sub(n);
            if k.nlookup == 0 {
                map.remove(&ino);
            }
        }
    }

    /// Every known inode with its remembered (parent, name) entries.
    pub(crate) fn snapshot(&self) -> Vec<(u64, Vec<(u64, OsString)>)> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.iter().map(|(i, k)| (*i, k.names.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_names() {
        let k = Known::default();
        k.add(5, 1, OsStr::new("a"));
        k.add(5, 1, OsStr::new("a"));
        for i in 0..6 {
            k.add(5, 2, OsStr::new(&format!("n{i}")));
        }
        let s = k.snapshot();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].1.len(), MAX_NAMES);
        k.forget(5, 7);
        assert_eq!(k.snapshot().len(), 1);
        k.forget(5, 1);
        assert!(k.snapshot().is_empty());
        k.forget(99, 1);
    }
}
