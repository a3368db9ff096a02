//! The duplicate request cache: a retransmitted non-idempotent call gets
//! the reply the first one got instead of running again.
//!
//! # Why
//!
//! An NFS client that sees no reply within its timeout, or whose
//! connection broke, sends the same call again (same xid), often on a new
//! connection. For a READ or a GETATTR that is harmless. A REMOVE, RENAME,
//! CREATE (guarded or exclusive), MKDIR, RMDIR, LINK, SYMLINK or MKNOD
//! that already ran would run a second time and fail: the application is
//! told ENOENT for a file it did remove, EEXIST for a directory it did
//! make (`mkdir -p` and `mv` break, a build stops). A server keeps the
//! replies of such calls for a while and answers the retransmission with
//! the first reply, which is what RFC 1813 (section 4.1, "Duplicate
//! request caches") expects of it.
//!
//! # What is kept
//!
//! Calls are told apart by client address (not port: a retransmission
//! after a reconnect comes from a new port), xid, procedure and a hash of
//! the whole call after its xid (credential and arguments), so a client
//! that reuses an xid for a different call is not answered from the
//! cache. Only the procedures above, and SETATTR (a guarded or
//! size-changing SETATTR run twice can fail or undo a later write), are
//! kept: READ, WRITE and the lookups are idempotent and their replies
//! large. An entry lives [`TTL`] and the cache holds at most
//! [`CAPACITY`] entries, the oldest dropped first; replies of these
//! procedures are a few hundred bytes, so the cache stays under about
//! 2 MiB.
//!
//! A retransmission that arrives while the first call still runs waits
//! for its reply (up to [`WAIT`]); replying at once with an error, or
//! running it beside the first, would both be wrong. If the first call
//! never finishes (its worker panicked), the entry is removed and the
//! waiter runs the call itself. A waiter holds a worker thread, so at
//! most [`MAX_WAITERS`] wait at once, for the whole server: beyond that a
//! retransmission of a running call is dropped unanswered (as Linux's
//! server drops every one), and the client sends it again after its
//! timeout, by when the reply is usually kept. Without the bound, a
//! client retransmitting one slow call on every connection and slot it
//! has could park every worker of the server for [`WAIT`].

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::proto::nfsproc;

/// Most replies kept.
pub(crate) const CAPACITY: usize = 4096;
/// How long a reply is kept: longer than a client's retransmission
/// timeouts (Linux: 60 s over TCP, a few retries).
pub(crate) const TTL: Duration = Duration::from_secs(300);
/// How long a retransmission waits for the first call's reply.
pub(crate) const WAIT: Duration = Duration::from_secs(60);
/// Most retransmissions waiting for their first call at once.
pub(crate) const MAX_WAITERS: usize = 4;

/// True for the NFSv3 procedures whose replies are kept.
pub(crate) fn is_kept(proc_: u32) -> bool {
    matches!(
        proc_,
        nfsproc::SETATTR
            | nfsproc::CREATE
            | nfsproc::MKDIR
            | nfsproc::SYMLINK
            | nfsproc::MKNOD
            | nfsproc::REMOVE
            | nfsproc::RMDIR
            | nfsproc::RENAME
            | nfsproc::LINK
    )
}

/// What names one call.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Key {
    peer: IpAddr,
    xid: u32,
    proc_: u32,
    /// Hash of the call after its xid.
    sum: u64,
}

impl Key {
    /// The key of call `record` (the whole RPC message) from `peer`.
    pub(crate) fn new(peer: IpAddr, xid: u32, proc_: u32, record: &[u8]) -> Key {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        record.get(4..).unwrap_or(&[]).hash(&mut h);
        Key {
            peer,
            xid,
            proc_,
            sum: h.finish(),
        }
    }
}

enum State {
    /// The first call runs; retransmissions wait on the cache's condvar.
    Running,
    /// Its reply body.
    Done(Arc<Vec<u8>>),
}

struct Slot {
    state: State,
    at: Instant,
    /// Told apart from a later entry under the same key (the order queue
    /// may still name a removed one).
    serial: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Key, Slot>,
    /// Keys in the order they were entered, with their serial.
    order: VecDeque<(Key, u64)>,
    serial: u64,
    /// Retransmissions waiting now (at most [`MAX_WAITERS`]).
    waiting: usize,
}

impl Inner {
    /// Drops expired entries and, past capacity, the oldest finished ones
    /// (a running call is kept: its retransmissions wait for it).
    fn trim(&mut self, now: Instant) {
        let mut budget = self.order.len();
        while budget > 0 {
            budget -= 1;
            let Some(&(k, serial)) = self.order.front() else {
                break;
            };
            let Some(slot) = self.map.get(&k).filter(|s| s.serial == serial) else {
                self.order.pop_front();
                continue;
            };
            let old = now.duration_since(slot.at) > TTL;
            if !old && self.map.len() <= CAPACITY {
                break;
            }
            self.order.pop_front();
            if matches!(slot.state, State::Running) && !old {
                self.order.push_back((k, serial));
                continue;
            }
            self.map.remove(&k);
        }
    }
}

/// The cache, shared by every connection of a server.
#[derive(Default)]
pub(crate) struct Drc {
    inner: Mutex<Inner>,
    done: Condvar,
}

/// What [`Drc::begin`] found.
pub(crate) enum Begin<'a> {
    /// A new call: run it and give the reply to the guard.
    Run(Running<'a>),
    /// A retransmission of a call that finished: its reply.
    Replay(Arc<Vec<u8>>),
    /// A retransmission whose first call is still running after [`WAIT`],
    /// or while [`MAX_WAITERS`] others wait: answer nothing (the client
    /// sends it again).
    Drop,
}

/// A call being run; finished with [`Running::finish`], or removed from
/// the cache if dropped without (so a retransmission runs it again).
pub(crate) struct Running<'a> {
    drc: &'a Drc,
    key: Key,
    serial: u64,
    finished: bool,
}

impl Running<'_> {
    /// Keeps `reply` as the answer to every retransmission of the call.
    pub(crate) fn finish(mut self, reply: &[u8]) {
        let mut g = self.drc.lock();
        if let Some(slot) = g.map.get_mut(&self.key) {
            if slot.serial == self.serial {
                slot.state = State::Done(Arc::new(reply.to_vec()));
                slot.at = Instant::now();
            }
        }
        self.finished = true;
        drop(g);
        self.drc.done.notify_all();
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut g = self.drc.lock();
        if g.map
            .get(&self.key)
            .is_some_and(|s| s.serial == self.serial)
        {
            g.map.remove(&self.key);
        }
        drop(g);
        self.drc.done.notify_all();
    }
}

impl Drc {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks the call up: new (run it), finished (its reply), or running
    /// (waits for it, up to [`WAIT`]).
    pub(crate) fn begin(&self, key: Key) -> Begin<'_> {
        let deadline = Instant::now() + WAIT;
        let mut g = self.lock();
        loop {
            let now = Instant::now();
            g.trim(now);
            match g.map.get(&key).map(|s| &s.state) {
                Some(State::Done(reply)) => return Begin::Replay(reply.clone()),
                Some(State::Running) => {
                    if now >= deadline || g.waiting >= MAX_WAITERS {
                        return Begin::Drop;
                    }
                    g.waiting += 1;
                    g = match self.done.wait_timeout(g, deadline - now) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    };
                    g.waiting -= 1;
                }
                None => {
                    g.serial += 1;
                    let serial = g.serial;
                    g.map.insert(
                        key,
                        Slot {
                            state: State::Running,
                            at: now,
                            serial,
                        },
                    );
                    g.order.push_back((key, serial));
                    return Begin::Run(Running {
                        drc: self,
                        key,
                        serial,
                        finished: false,
                    });
                }
            }
        }
    }

    /// Entries held (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(xid: u32, args: &[u8]) -> Key {
        let mut rec = xid.to_be_bytes().to_vec();
        rec.extend_from_slice(args);
        Key::new("10.0.0.1".parse().unwrap(), xid, nfsproc::REMOVE, &rec)
    }

    #[test]
    fn a_finished_call_is_replayed_and_another_call_is_not() {
        let drc = Drc::default();
        let Begin::Run(run) = drc.begin(key(7, b"a")) else {
            panic!("a new call runs");
        };
        run.finish(b"reply");
        match drc.begin(key(7, b"a")) {
            Begin::Replay(r) => assert_eq!(&r[..], b"reply"),
            _ => panic!("the retransmission is answered from the cache"),
        }
        // Same xid, other arguments: a new call.
        assert!(matches!(drc.begin(key(7, b"b")), Begin::Run(_)));
        // Other peer.
        let mut other = key(7, b"a");
        other.peer = "10.0.0.2".parse().unwrap();
        assert!(matches!(drc.begin(other), Begin::Run(_)));
    }

    #[test]
    fn a_call_that_never_finished_runs_again() {
        let drc = Drc::default();
        match drc.begin(key(1, b"x")) {
            Begin::Run(run) => drop(run),
            _ => panic!("new"),
        }
        assert_eq!(drc.len(), 0);
        assert!(matches!(drc.begin(key(1, b"x")), Begin::Run(_)));
    }

    #[test]
    fn a_retransmission_waits_for_the_running_call() {
        let drc = Arc::new(Drc::default());
        let Begin::Run(run) = drc.begin(key(3, b"x")) else {
            panic!("new");
        };
        let d = drc.clone();
        let waiter = std::thread::spawn(move || match d.begin(key(3, b"x")) {
            Begin::Replay(r) => r.to_vec(),
            _ => b"not replayed".to_vec(),
        });
        std::thread::sleep(Duration::from_millis(100));
        run.finish(b"first");
        assert_eq!(waiter.join().unwrap(), b"first");
    }

    #[test]
    fn only_a_few_retransmissions_wait_at_once() {
        let drc = Arc::new(Drc::default());
        let Begin::Run(run) = drc.begin(key(4, b"x")) else {
            panic!("new");
        };
        let waiters: Vec<_> = (0..MAX_WAITERS)
            .map(|_| {
                let d = drc.clone();
                std::thread::spawn(move || matches!(d.begin(key(4, b"x")), Begin::Replay(_)))
            })
            .collect();
        let t0 = Instant::now();
        while drc.lock().waiting < MAX_WAITERS {
            assert!(t0.elapsed() < Duration::from_secs(10), "they never waited");
            std::thread::sleep(Duration::from_millis(5));
        }
        // One more is dropped at once instead of parking its worker.
        let (tx, rx) = std::sync::mpsc::channel();
        let d = drc.clone();
        std::thread::spawn(move || {
            let _ = tx.send(matches!(d.begin(key(4, b"x")), Begin::Drop));
        });
        let dropped = rx.recv_timeout(Duration::from_secs(5));
        run.finish(b"first");
        assert_eq!(dropped, Ok(true), "the extra retransmission waited");
        for w in waiters {
            assert!(w.join().unwrap(), "a waiter got the reply");
        }
        assert_eq!(drc.lock().waiting, 0);
        assert!(matches!(drc.begin(key(4, b"x")), Begin::Replay(_)));
    }

    #[test]
    fn the_cache_is_bounded() {
        let drc = Drc::default();
        for xid in 0..(CAPACITY as u32 + 100) {
            if let Begin::Run(run) = drc.begin(key(xid, b"x")) {
                run.finish(b"r");
            }
        }
        assert!(drc.len() <= CAPACITY + 1, "{} entries", drc.len());
        // The newest are kept, the oldest gone.
        assert!(matches!(
            drc.begin(key(CAPACITY as u32 + 99, b"x")),
            Begin::Replay(_)
        ));
        assert!(matches!(drc.begin(key(0, b"x")), Begin::Run(_)));
    }
}
