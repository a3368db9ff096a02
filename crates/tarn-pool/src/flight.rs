//! Data-block reads in flight, so one block is read from the disks once
//! however many ask for it at the same moment.
//!
//! # Theory
//!
//! A client streaming a file keeps many reads in flight, and read-ahead
//! reads the same records a little earlier on its own threads. Without
//! coordination a reader whose record read-ahead is still fetching reads
//! it again: a cold sequential NFS read moved about 1.7 bytes from the
//! disks for each byte it served, and checksummed most records twice.
//!
//! So the first to ask for a block that is not cached *leads*: it
//! registers the block here, reads and verifies it, puts it in the cache
//! and hands the bytes to everyone who asked meanwhile. A later reader
//! finds the flight and waits for it instead. Read-ahead never waits: it
//! leads or does nothing.
//!
//! **Failure.** A leader that fails (an unreadable or damaged block, or
//! read-ahead, which gives up quietly) hands its waiters nothing, and each
//! of them reads the block itself, so damage is repaired or reported by a
//! reader exactly as if it had been alone. A leader that panics is treated
//! as failing: the flight is finished when its [`Lead`] is dropped, so no
//! waiter can wait for ever.
//!
//! **Keys.** A flight is keyed by the block's identity, as the block cache
//! keys it ([`BlockId`]: the first address, the birth txg, the logical
//! size, the compression and the checksum of the stored bytes). A block
//! freed and its space reused gets another birth and checksum, so a waiter
//! can only ever receive the bytes of the pointer it asked for (and the
//! caller's hold keeps the space from reuse while it waits). A hole has no
//! identity and is never in flight.
//!
//! **Deadlock.** A leader holds nothing while it reads but the devices'
//! own locks, and waits for no one; so a waiter, whatever it holds, is
//! waiting for work that needs nothing from it.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

use tarn_block::BlockId;

/// One block being read, and what its leader found.
#[derive(Default)]
struct Flight {
    /// `None` while in flight; then the bytes, or `None` when it failed.
    done: Mutex<Option<Option<Arc<[u8]>>>>,
    cv: Condvar,
}

/// The reads in flight of one pool.
#[derive(Default)]
pub(crate) struct Flights {
    map: Mutex<HashMap<BlockId, Arc<Flight>>>,
}

/// What asking for a block gave: the lead, or someone else's flight.
pub(crate) enum Joined<'a> {
    /// Read it, then [`Lead::finish`].
    Lead(Lead<'a>),
    /// Another reader is reading it: [`Wait::wait`] for its bytes.
    Wait(Wait),
}

/// The duty to read one block for everyone who asks meanwhile; dropped
/// without [`Lead::finish`], it finishes as failed.
pub(crate) struct Lead<'a> {
    flights: &'a Flights,
    key: BlockId,
    flight: Arc<Flight>,
    done: bool,
}

/// A flight led by someone else.
pub(crate) struct Wait(Arc<Flight>);

impl Flights {
    /// Leads the read of block `k`, or joins the flight already reading it.
    pub(crate) fn join(&self, k: BlockId) -> Joined<'_> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = map.get(&k) {
            return Joined::Wait(Wait(f.clone()));
        }
        let flight = Arc::new(Flight::default());
        map.insert(k, flight.clone());
        Joined::Lead(Lead {
            flights: self,
            key: k,
            flight,
            done: false,
        })
    }

    /// Leads the read of block `k` unless someone is reading it already.
    pub(crate) fn lead(&self, k: BlockId) -> Option<Lead<'_>> {
        match self.join(k) {
            Joined::Lead(l) => Some(l),
            Joined::Wait(_) => None,
        }
    }

    /// Flights now in progress.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Lead<'_> {
    /// Hands the verified bytes (or, with `None`, the failure) to the
    /// waiters and ends the flight.
    pub(crate) fn finish(mut self, bytes: Option<Arc<[u8]>>) {
        self.end(bytes);
    }

    fn end(&mut self, bytes: Option<Arc<[u8]>>) {
        if self.done {
            return;
        }
        self.done = true;
        // Out of the map first: a reader arriving now finds the cache (or,
        // after a failure, reads itself) rather than a finished flight.
        self.flights
            .map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
        *self.flight.done.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes);
        self.flight.cv.notify_all();
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        self.end(None);
    }
}

impl Wait {
    /// The leader's bytes, or `None` when it failed (read it yourself).
    pub(crate) fn wait(self) -> Option<Arc<[u8]>> {
        let mut done = self.0.done.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = done.as_ref() {
                return r.clone();
            }
            done = self.0.cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    use tarn_block::BlockPtr;

    fn bp(offset: u64, birth: u64) -> BlockPtr {
        let mut bp = BlockPtr {
            birth,
            ..Default::default()
        };
        bp.dvas[0].offset = offset;
        bp.dvas[0].asize = 4096;
        bp.checksum[0] = offset as u8;
        bp
    }

    fn id(bp: &BlockPtr) -> BlockId {
        BlockId::of(1, bp).expect("a block with an address")
    }

    #[test]
    fn waiters_get_the_leaders_bytes_and_the_flight_ends() {
        let f = Flights::default();
        let Joined::Lead(lead) = f.join(id(&bp(1, 5))) else {
            panic!("first asker must lead");
        };
        assert!(
            f.lead(id(&bp(1, 5))).is_none(),
            "read-ahead must not lead twice"
        );
        // Another block, the same address born in another txg, or a
        // pointer that reads back differently, is another flight.
        assert!(f.lead(id(&bp(2, 5))).is_some());
        assert!(f.lead(id(&bp(1, 6))).is_some());
        let mut other = bp(1, 5);
        other.lsize = 4096;
        assert!(f.lead(id(&other)).is_some());
        let mut other = bp(1, 5);
        other.compress = tarn_block::CompressAlg::Lz4;
        assert!(f.lead(id(&other)).is_some());
        let Joined::Wait(w) = f.join(id(&bp(1, 5))) else {
            panic!("second asker must wait");
        };
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(move || tx.send(w.wait()).ok());
            assert!(
                rx.recv_timeout(Duration::from_millis(50)).is_err(),
                "waited for nothing"
            );
            lead.finish(Some(Arc::from(&b"abc"[..])));
            let got = rx.recv_timeout(Duration::from_secs(10)).expect("woken");
            assert_eq!(got.as_deref(), Some(&b"abc"[..]));
        });
        assert_eq!(f.len(), 0);
        assert!(matches!(f.join(id(&bp(1, 5))), Joined::Lead(_)));
    }

    #[test]
    fn a_lead_dropped_unfinished_fails_its_waiters() {
        let f = Flights::default();
        let lead = f.lead(id(&bp(7, 1))).expect("lead");
        let Joined::Wait(w) = f.join(id(&bp(7, 1))) else {
            panic!("must wait");
        };
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(move || tx.send(w.wait()).ok());
            // A leader that panics drops its lead while unwinding.
            let r = s
                .spawn(move || {
                    let _lead = lead;
                    panic!("leader fails");
                })
                .join();
            assert!(r.is_err());
            let got = rx.recv_timeout(Duration::from_secs(10)).expect("woken");
            assert!(got.is_none());
        });
        assert_eq!(f.len(), 0);
    }
}
