//! Change notification: who else must hear that a change committed.
//!
//! The daemon opens one [`Fs`] per dataset and hands it to every front end
//! (FUSE, NFS, WebDAV), so every change to a live dataset passes through
//! here. A front end that caches (the kernel behind a FUSE mount keeps
//! names and attributes for a TTL, and file pages) subscribes with
//! [`Fs::subscribe`] and is told, after each write transaction commits,
//! which inodes and which directory entries it changed. It can then drop
//! exactly those from its cache, so a change made through NFS is seen
//! through FUSE at once, however long the TTLs.
//!
//! # What is reported
//!
//! A transaction collects its changes as it makes them (in `Tx`): every
//! inode it rewrites or frees ([`Change::Inode`], with `data` set when
//! the size or mtime moved, i.e. the contents may differ, or the inode is
//! gone) and every directory entry it adds, removes or points elsewhere
//! ([`Change::Entry`]). Inodes created by the transaction are not
//! reported: nobody can have cached them. Because collection happens at
//! the two places every change passes (`Tx::put`/`Tx::free` and the
//! directory entry functions), a new operation is covered without
//! remembering to notify. Snapshot contents never change and are never
//! reported; opening and closing files, and freeing an unlinked file at
//! its last close, change nothing a cache can hold.
//!
//! # When
//!
//! [`Hub::publish`] runs after the transaction has committed (its changes
//! are visible to every later transaction) and with no lock of `Fs` or of
//! the dataset held, on the thread that made the change. A subscriber may
//! therefore block (a FUSE invalidation waits for the kernel's inode
//! lock) without blocking the dataset. Publishing after the commit is
//! what makes invalidation race-free: a reader that looked before the
//! commit and answers after the invalidation is caught by the cache's own
//! ordering (for FUSE: the kernel's directory lock and attribute version,
//! see `tarn-fuse`), and a reader that looks after the commit sees the
//! new state.
//!
//! # Origins
//!
//! A subscriber usually does not want to hear about its own changes (the
//! kernel already knows what a FUSE request changed, and a FUSE worker
//! must not invalidate the kernel's cache while the kernel waits for its
//! reply). A front end marks the threads that serve it with an [`Origin`]
//! ([`Origin::enter`]); each published batch carries the origin of the
//! thread that made it, or `None` for threads nobody marked.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};

use crate::store::Backend;
use crate::Fs;

/// One committed change, in mount-wide inode numbers of the live dataset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Inode `ino` was rewritten or freed. `data` is true when its
    /// contents may have changed too (size or mtime moved, or the inode
    /// is gone); false for attribute-only changes (mode, owner, link
    /// count, atime, ctime).
    Inode {
        /// The inode.
        ino: u64,
        /// Whether cached contents must be dropped as well.
        data: bool,
    },
    /// The entry `name` of directory `parent` was added, removed, or now
    /// names another inode.
    Entry {
        /// The directory.
        parent: u64,
        /// The entry's name.
        name: Vec<u8>,
    },
}

/// A tag for the threads of one front end, so a subscriber can tell its
/// own changes from others' (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Origin(u64);

static NEXT_ORIGIN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static CURRENT: Cell<Option<Origin>> = const { Cell::new(None) };
}

impl Origin {
    /// A new origin, distinct from every other in this process.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Origin {
        Origin(NEXT_ORIGIN.fetch_add(1, Ordering::Relaxed))
    }

    /// Marks the calling thread as acting for this origin until the guard
    /// is dropped (the previous mark is then restored).
    pub fn enter(self) -> OriginGuard {
        let prev = CURRENT.with(|c| c.replace(Some(self)));
        OriginGuard {
            prev,
            _not_send: std::marker::PhantomData,
        }
    }

    /// The origin the calling thread acts for, if any.
    pub fn current() -> Option<Origin> {
        CURRENT.with(|c| c.get())
    }
}

/// Restores the thread's previous origin when dropped (see
/// [`Origin::enter`]). Bound to its thread.
#[must_use = "the origin is only marked while the guard lives"]
pub struct OriginGuard {
    prev: Option<Origin>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for OriginGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.prev));
    }
}

/// Something that wants to hear about committed changes.
pub trait Subscriber: Send + Sync {
    /// Called after a transaction with `changes` committed, on the thread
    /// that made it, with no lock of the filesystem held; `origin` is that
    /// thread's mark. Must not call back into the same `Fs` for long: the
    /// caller of the changing operation waits until every subscriber
    /// returns.
    fn changed(&self, origin: Option<Origin>, changes: &[Change]);
}

type Subs = Vec<(u64, Arc<dyn Subscriber>)>;

#[derive(Default)]
struct HubInner {
    next: AtomicU64,
    subs: RwLock<Subs>,
}

/// The subscribers of one `Fs`.
#[derive(Default)]
pub(crate) struct Hub {
    inner: Arc<HubInner>,
}

impl Hub {
    /// Tells every subscriber about `changes` (nothing if empty).
    pub(crate) fn publish(&self, changes: &[Change]) {
        if changes.is_empty() {
            return;
        }
        let subs: Vec<Arc<dyn Subscriber>> = {
            let g = self.inner.subs.read().unwrap_or_else(|e| e.into_inner());
            if g.is_empty() {
                return;
            }
            g.iter().map(|(_, s)| s.clone()).collect()
        };
        let origin = Origin::current();
        for s in subs {
            s.changed(origin, changes);
        }
    }

    fn subscribe(&self, sub: Arc<dyn Subscriber>) -> Subscription {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        self.inner
            .subs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, sub));
        Subscription {
            hub: Arc::downgrade(&self.inner),
            id,
        }
    }
}

/// A live subscription; dropping it unsubscribes (a batch being delivered
/// at that moment may still arrive).
pub struct Subscription {
    hub: Weak<HubInner>,
    id: u64,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .finish()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(h) = self.hub.upgrade() {
            h.subs
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|(id, _)| *id != self.id);
        }
    }
}

/// What one transaction changed, collected by `Tx` as it goes.
#[derive(Default)]
pub(crate) struct ChangeLog {
    inodes: BTreeMap<u64, bool>,
    entries: Vec<(u64, Vec<u8>)>,
}

impl ChangeLog {
    /// Inode `ino` was rewritten (`data`: its contents may differ) or
    /// freed (`data` true).
    pub(crate) fn inode(&mut self, ino: u64, data: bool) {
        *self.inodes.entry(ino).or_default() |= data;
    }

    /// The entry `name` of `dir` changed.
    pub(crate) fn entry(&mut self, dir: u64, name: &[u8]) {
        if !self.entries.iter().any(|(d, n)| *d == dir && n == name) {
            self.entries.push((dir, name.to_vec()));
        }
    }

    /// The changes as published: entries first, then inodes.
    pub(crate) fn into_changes(self) -> Vec<Change> {
        let mut out = Vec::with_capacity(self.entries.len() + self.inodes.len());
        out.extend(
            self.entries
                .into_iter()
                .map(|(parent, name)| Change::Entry { parent, name }),
        );
        out.extend(
            self.inodes
                .into_iter()
                .map(|(ino, data)| Change::Inode { ino, data }),
        );
        out
    }
}

impl<B: Backend> Fs<B> {
    /// Registers `sub` to hear about every change committed through this
    /// `Fs` from now on (see the module docs of `notify`), until the
    /// returned handle is dropped.
    pub fn subscribe(&self, sub: Arc<dyn Subscriber>) -> Subscription {
        self.notify.subscribe(sub)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Rec(Mutex<Vec<(Option<Origin>, Vec<Change>)>>);

    impl Subscriber for Rec {
        fn changed(&self, origin: Option<Origin>, changes: &[Change]) {
            self.0.lock().unwrap().push((origin, changes.to_vec()));
        }
    }

    #[test]
    fn origins_nest_and_restore() {
        assert_eq!(Origin::current(), None);
        let (a, b) = (Origin::new(), Origin::new());
        assert_ne!(a, b);
        {
            let _g = a.enter();
            assert_eq!(Origin::current(), Some(a));
            {
                let _h = b.enter();
                assert_eq!(Origin::current(), Some(b));
            }
            assert_eq!(Origin::current(), Some(a));
            let other = std::thread::spawn(Origin::current).join().unwrap();
            assert_eq!(other, None);
        }
        assert_eq!(Origin::current(), None);
    }

    #[test]
    fn hub_delivers_until_unsubscribed() {
        let hub = Hub::default();
        hub.publish(&[Change::Inode {
            ino: 1,
            data: false,
        }]);
        let rec = Arc::new(Rec::default());
        let sub = hub.subscribe(rec.clone());
        hub.publish(&[]);
        let o = Origin::new();
        {
            let _g = o.enter();
            hub.publish(&[Change::Inode { ino: 5, data: true }]);
        }
        drop(sub);
        hub.publish(&[Change::Inode { ino: 6, data: true }]);
        let got = rec.0.lock().unwrap().clone();
        assert_eq!(
            got,
            vec![(Some(o), vec![Change::Inode { ino: 5, data: true }])]
        );
    }

    /// What the operations of `Fs` report, end to end.
    #[test]
    fn operations_report_their_changes() {
        use crate::testing::MemBackend;
        use crate::{Cred, SetAttr, ROOT_INO};

        let fs = Fs::mount(MemBackend::new()).unwrap();
        let rec = Arc::new(Rec::default());
        let _sub = fs.subscribe(rec.clone());
        let take = || std::mem::take(&mut *rec.0.lock().unwrap());
        let root = Cred::root();
        let entry = |parent: u64, name: &[u8]| Change::Entry {
            parent,
            name: name.to_vec(),
        };

        // A create reports the name and the directory, not the new inode.
        let a = fs.create(ROOT_INO, b"a", 0o644, 0, 0, &root).unwrap();
        let got = take();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, None);
        assert_eq!(
            got[0].1,
            vec![
                entry(ROOT_INO, b"a"),
                Change::Inode {
                    ino: ROOT_INO,
                    data: true
                }
            ]
        );
        // A write changes contents; a chmod only attributes.
        fs.write(a.ino, 0, b"xyz", false, &root).unwrap();
        assert_eq!(
            take()[0].1,
            vec![Change::Inode {
                ino: a.ino,
                data: true
            }]
        );
        let chmod = SetAttr {
            mode: Some(0o600),
            ..Default::default()
        };
        fs.setattr(a.ino, &chmod, &root).unwrap();
        assert_eq!(
            take()[0].1,
            vec![Change::Inode {
                ino: a.ino,
                data: false
            }]
        );
        // A rename reports both names.
        fs.rename(ROOT_INO, b"a", ROOT_INO, b"b", 0, &root).unwrap();
        let got = take();
        assert!(got[0].1.contains(&entry(ROOT_INO, b"a")));
        assert!(got[0].1.contains(&entry(ROOT_INO, b"b")));
        // A read at most refreshes the access time (relatime): attributes.
        fs.read(a.ino, 0, 10).unwrap();
        for (_, changes) in take() {
            assert_eq!(
                changes,
                vec![Change::Inode {
                    ino: a.ino,
                    data: false
                }]
            );
        }
        // A failed operation reports nothing.
        assert!(fs.unlink(ROOT_INO, b"missing", &root).is_err());
        assert!(take().is_empty());
        // An unlink frees the inode (once closed): its contents are gone.
        fs.release(a.ino).unwrap();
        fs.unlink(ROOT_INO, b"b", &root).unwrap();
        let got = take();
        assert!(got[0].1.contains(&entry(ROOT_INO, b"b")));
        assert!(got[0].1.contains(&Change::Inode {
            ino: a.ino,
            data: true
        }));
    }

    #[test]
    fn change_log_merges() {
        let mut log = ChangeLog::default();
        log.inode(7, false);
        log.inode(7, true);
        log.inode(7, false);
        log.entry(1, b"a");
        log.entry(1, b"a");
        log.entry(2, b"a");
        assert_eq!(
            log.into_changes(),
            vec![
                Change::Entry {
                    parent: 1,
                    name: b"a".to_vec()
                },
                Change::Entry {
                    parent: 2,
                    name: b"a".to_vec()
                },
                Change::Inode { ino: 7, data: true },
            ]
        );
    }
}
