//! State a logical unit keeps across commands, sessions and targets: the
//! lock that makes COMPARE AND WRITE atomic, and (see [`crate::pr`]) the
//! persistent reservations.
//!
//! # One state per device
//!
//! A logical unit is its device: two targets serving the same
//! `Arc<dyn Device>`, or a target replaced by `set_targets` with the same
//! device, are one logical unit seen through several target ports. Its
//! state ([`LuState`]) is therefore found by the device's address in a
//! process-wide registry of weak references ([`LuState::of`]). Every
//! holder of a strong reference (a target table entry, a session) also
//! holds the device, so while the state is alive the device is too and
//! its address cannot be reused by another device: the key is never
//! ambiguous. The target table keeps the state alive while a target
//! serves the device, so reservations outlive the sessions that made
//! them; when no target and no session refers to the device any more,
//! the state goes (reservations are kept in memory only).
//!
//! # Why COMPARE AND WRITE is atomic
//!
//! VMware's ATS locking reads a lock block, compares it with what the
//! host last saw and writes the new owner, all in one COMPARE AND WRITE;
//! if another host could write the block between the compare and the
//! write, both would believe they own the lock. So every command that
//! changes the medium (WRITE, WRITE AND VERIFY, WRITE SAME, UNMAP) holds
//! [`LuState::io`] shared while it calls the device, and COMPARE AND
//! WRITE holds it exclusively from its read to the end of its write.
//! Writes still run in parallel with one another; a COMPARE AND WRITE
//! waits for the writes in flight and holds off new ones (std's `RwLock`
//! does not let waiting writers starve behind a stream of readers).
//! Reads take no lock: a read racing a COMPARE AND WRITE sees the blocks
//! before or after it, as with any write. Writes that reach the device
//! another way (another server, the NBD front end, a local file system)
//! are outside this lock; atomicity holds for everything this process's
//! iSCSI server writes to the device.

use std::collections::HashMap;
use std::sync::{
    Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak,
};

use tarn_vol::Device;

use crate::pr::Reservations;

/// What a logical unit shares among all its sessions (see the module
/// docs).
#[derive(Default)]
pub struct LuState {
    /// Shared by medium-changing commands, exclusive for COMPARE AND
    /// WRITE.
    io: RwLock<()>,
    /// Persistent reservations.
    pr: Mutex<Reservations>,
}

type Registry = Mutex<HashMap<usize, Weak<LuState>>>;

fn registry() -> &'static Registry {
    static UNITS: OnceLock<Registry> = OnceLock::new();
    UNITS.get_or_init(Registry::default)
}

impl LuState {
    /// The state of the logical unit `dev` is, shared with every other
    /// holder of the same device.
    pub fn of(dev: &Arc<dyn Device>) -> Arc<LuState> {
        let key = Arc::as_ptr(dev) as *const () as usize;
        let mut map = match registry().lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some(s) = map.get(&key).and_then(Weak::upgrade) {
            return s;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let s = Arc::new(LuState::default());
        map.insert(key, Arc::downgrade(&s));
        s
    }

    /// Held (shared) while a command changes the medium.
    pub fn writing(&self) -> RwLockReadGuard<'_, ()> {
        match self.io.read() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Held (exclusive) by COMPARE AND WRITE from its read to the end of
    /// its write.
    pub fn atomic(&self) -> RwLockWriteGuard<'_, ()> {
        match self.io.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The persistent reservations if no one holds them now.
    pub fn try_reservations(&self) -> Option<MutexGuard<'_, Reservations>> {
        match self.pr.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The persistent reservations, locked.
    pub fn reservations(&self) -> MutexGuard<'_, Reservations> {
        match self.pr.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    use tarn_vol::testing::MemDevice;

    #[test]
    fn one_state_per_device_while_someone_holds_it() {
        let a: Arc<dyn Device> = Arc::new(MemDevice::new(1 << 20, 4096));
        let b: Arc<dyn Device> = Arc::new(MemDevice::new(1 << 20, 4096));
        let sa = LuState::of(&a);
        assert!(Arc::ptr_eq(&sa, &LuState::of(&a.clone())));
        assert!(!Arc::ptr_eq(&sa, &LuState::of(&b)));
        let weak = Arc::downgrade(&sa);
        drop(sa);
        assert!(weak.upgrade().is_none(), "nobody holds it: gone");
    }

    #[test]
    fn the_atomic_section_excludes_writers() {
        let lu = Arc::new(LuState::default());
        let g = lu.atomic();
        let done = Arc::new(AtomicBool::new(false));
        let (lu2, done2) = (lu.clone(), done.clone());
        let t = std::thread::spawn(move || {
            let _w = lu2.writing();
            done2.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!done.load(Ordering::SeqCst), "a write waited");
        drop(g);
        t.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }
}
