//! Turns the changes `Fs` reports ([`tarn_fs::notify`]) into kernel cache
//! invalidations of one mount, so the long TTLs never show a change made
//! through another front end (NFS, WebDAV, another mount, a direct `Fs`
//! call).
//!
//! Changes made by this mount's own workers are skipped: the kernel made
//! them and keeps its caches right by itself. Changes made by a thread
//! that is not a FUSE worker are invalidated on that thread, before the
//! changing call returns, so they are visible through the mount at once.
//! Changes made by another mount's workers go to this mount's
//! invalidation thread instead: a worker must not wait for this kernel's
//! inode locks, because a process holding one may be waiting for a reply
//! that only the other mount's workers can give (two mounts doing that
//! to each other would deadlock).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use fuser::{INodeNo, Notifier};
use tarn_fs::{Change, Origin, Subscriber};

/// The subscriber of one mount.
pub(crate) struct Invalidator {
    origin: Origin,
    notifier: Notifier,
    deferred: Mutex<Sender<Vec<Change>>>,
    /// Invalidations the kernel refused for another reason than "not
    /// cached" (the mount going away): counted, never fatal.
    pub(crate) failed: AtomicU64,
}

impl Invalidator {
    /// A subscriber for the mount whose workers act as `origin`, and the
    /// receiving end of its deferred queue (for [`run_deferred`]).
    pub(crate) fn new(origin: Origin, notifier: Notifier) -> (Arc<Self>, Receiver<Vec<Change>>) {
        let (tx, rx) = mpsc::channel();
        let inv = Arc::new(Invalidator {
            origin,
            notifier,
            deferred: Mutex::new(tx),
            failed: AtomicU64::new(0),
        });
        (inv, rx)
    }

    /// Invalidates what `changes` name. The kernel ignores what it does
    /// not cache (fuser maps that ENOENT to success).
    pub(crate) fn apply(&self, changes: &[Change]) {
        for c in changes {
            let r = match c {
                Change::Entry { parent, name } => self
                    .notifier
                    .inval_entry(INodeNo(*parent), OsStr::from_bytes(name)),
                // Offset -1: attributes only; 0 with length 0: attributes
                // and every cached page.
                Change::Inode { ino, data } => {
                    let offset = if *data { 0 } else { -1 };
                    self.notifier.inval_inode(INodeNo(*ino), offset, 0)
                }
            };
            if r.is_err() {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Subscriber for Invalidator {
    fn changed(&self, origin: Option<Origin>, changes: &[Change]) {
        match origin {
            Some(o) if o == self.origin => {}
            Some(_) => {
                let tx = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
                // The thread is gone only when the mount is: nothing to do.
                let _ = tx.send(changes.to_vec());
            }
            None => self.apply(changes),
        }
    }
}

/// The body of a mount's invalidation thread: applies deferred batches
/// until the subscriber (the only sender) is dropped.
pub(crate) fn run_deferred(inv: std::sync::Weak<Invalidator>, rx: Receiver<Vec<Change>>) {
    while let Ok(batch) = rx.recv() {
        match inv.upgrade() {
            Some(inv) => inv.apply(&batch),
            None => return,
        }
    }
}
