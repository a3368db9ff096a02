//! State a logical unit keeps across commands, sessions and targets: the
//! lock that makes COMPARE AND WRITE atomic, the unit attentions, and
//! (see [`crate::pr`]) the reservations, persistent and SPC-2.
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
//!
//! # Unit attentions and resets
//!
//! A unit attention tells one I_T nexus that something changed behind
//! its back: its next command (other than INQUIRY, REPORT LUNS and
//! REQUEST SENSE, as SAM-5 asks) is answered CHECK CONDITION with the
//! attention's sense instead of being carried out, and REQUEST SENSE
//! returns it as its data; either way it is then cleared. Each nexus
//! with a session on the unit has its own queue ([`LuState::attach`]);
//! a nexus that logs in later learns nothing of what came before (as
//! with a real disk, whose attentions are per initiator port). Three
//! things post them: a reset (LUN RESET, TARGET WARM or COLD RESET:
//! BUS DEVICE RESET FUNCTION OCCURRED, to every nexus, the one that
//! asked too, as SAM-5 says; CLEAR TASK SET: COMMANDS CLEARED BY ANOTHER
//! INITIATOR, to every nexus but the one that asked); a
//! change of the device's size (CAPACITY DATA HAS CHANGED) to every
//! nexus, which is how an initiator learns that a volume grew; and the
//! persistent reservation changes SPC-4 names (see
//! [`crate::pr::Reservations::out_telling`]) to the nexuses they took
//! something from.
//!
//! A reset ends the tasks of every session of the unit, not only the
//! caller's. It posts the attentions and moves the unit's reset epoch on
//! under one lock ([`LuState::reset`]). A command records the epoch
//! when it is admitted ([`LuState::admit`]). Every session watches the
//! epoch and, when it moves, drops its waiting and running tasks
//! admitted in an older one (their responses are never sent: an
//! aborted task's outcome is unknown to its initiator, which learns of
//! the reset from the attention); a command it admitted in the new epoch
//! before it saw the move came after the reset and runs. A
//! medium-changing command checks the epoch again once it holds
//! [`LuState::writing`]: if a reset came between, it does nothing. The
//! reset's caller then takes [`LuState::atomic`], which waits for every
//! write that got in before, and answers only after that. So once the
//! reset is answered, no task it ended changes the medium any more.
//! Under that lock a LUN or target reset also ends the SPC-2
//! reservation ([`LuState::finish_reset`]), if it was taken in an
//! older epoch: a RESERVE the reset ended does nothing (it checks the
//! epoch like a write), and one admitted after the reset keeps what it
//! took.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{
    Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak,
};

use tarn_vol::Device;
use tokio::sync::watch;

use crate::pr::{Nexus, Reservations};
use crate::scsi::Sense;

/// Most unit attentions kept for one nexus. Each kind is queued once
/// (a second reset before the nexus sent a command says nothing new),
/// so a handful is all there can be.
const MAX_ATTENTIONS: usize = 8;

/// What a logical unit shares among all its sessions (see the module
/// docs).
pub struct LuState {
    /// Shared by medium-changing commands, exclusive for COMPARE AND
    /// WRITE and reservation changes (and by a reset, to wait for the
    /// writes it ended).
    io: RwLock<()>,
    /// Reservations, persistent and SPC-2. Taken before `ua` when both
    /// are held.
    pr: Mutex<Reservations>,
    /// Unit attentions per attached nexus.
    ua: Mutex<Attentions>,
    /// True while some nexus has an attention waiting: a command's
    /// admission takes the lock only then.
    ua_waiting: AtomicBool,
    /// Resets so far (see the module docs). Every command reads it, so
    /// it is an atomic of its own rather than the watch's value below,
    /// which is read under the watch's lock.
    epoch: AtomicU64,
    /// The same count, for sessions to wait on (sent after `epoch` is
    /// moved, under the `ua` lock).
    resets: tokio::sync::watch::Sender<u64>,
    /// The device's size when a command last looked (`u64::MAX`: none
    /// has yet).
    capacity: AtomicU64,
}

impl Default for LuState {
    fn default() -> Self {
        LuState {
            io: RwLock::default(),
            pr: Mutex::default(),
            ua: Mutex::default(),
            ua_waiting: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            resets: tokio::sync::watch::Sender::new(0),
            capacity: AtomicU64::new(u64::MAX),
        }
    }
}

/// The attached nexuses and their waiting attentions.
#[derive(Default)]
struct Attentions {
    /// Nexus → (sessions attached with it, attentions waiting, moved on
    /// by each login that reinstates it).
    nexuses: HashMap<Nexus, (usize, VecDeque<Sense>, watch::Sender<u64>)>,
}

impl Attentions {
    /// Queues `s` for every attached nexus but `except`.
    fn post(&mut self, s: Sense, except: Option<&Nexus>) {
        for (n, (_, q, _)) in self.nexuses.iter_mut() {
            if Some(n) != except {
                queue(q, s);
            }
        }
    }

    fn any(&self) -> bool {
        self.nexuses.values().any(|(_, q, _)| !q.is_empty())
    }
}

/// Queues `s` unless it waits already (or the queue is full).
fn queue(q: &mut VecDeque<Sense>, s: Sense) {
    if !q.contains(&s) && q.len() < MAX_ATTENTIONS {
        q.push_back(s);
    }
}

/// What [`LuState::admit`] decided for a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Carry it out; the reset epoch it started in.
    Run(u64),
    /// Answer CHECK CONDITION with this unit attention instead.
    Attention(Sense),
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

    /// Counts `nexus` among the unit's nexuses (a session with it
    /// starts): attentions are kept for it from now on.
    ///
    /// A nexus that already has a session is being reinstated: RFC 7143
    /// makes a login with the initiator name and ISID of a session still
    /// logged in (and TSIH 0, the only kind the server takes: one
    /// connection per session) a reinstatement, where the old session
    /// ends and SCSI sees an I_T nexus loss. An initiator that reboots and
    /// logs in again with its fixed ISID (Windows uses one) before TCP
    /// keepalive has dropped its dead connection is such a login. So the
    /// nexus's SPC-2 reservation ends here (the new session keeps the
    /// count above zero, so `detach` would never end it), and the
    /// sessions already in are told to close through the receiver each
    /// got. This session's receiver, and whether it reinstated.
    pub fn attach(&self, nexus: &Nexus) -> (watch::Receiver<u64>, bool) {
        // Both locks, in the one order (see `detach`).
        let mut r = self.reservations();
        let mut a = self.attentions();
        let e = a
            .nexuses
            .entry(nexus.clone())
            .or_insert_with(|| (0, VecDeque::new(), watch::Sender::new(0)));
        let reinstates = e.0 > 0;
        if reinstates {
            e.2.send_modify(|g| *g += 1);
            r.nexus_lost(nexus);
        }
        e.0 += 1;
        (e.2.subscribe(), reinstates)
    }

    /// The end of a session [`LuState::attach`] counted: with its last
    /// session the nexus is lost, its attentions go and so does an SPC-2
    /// reservation it held.
    pub fn detach(&self, nexus: &Nexus) {
        // Both locks (the reservations' first, the one order anything
        // takes the two in), so a new session of the nexus cannot attach
        // and reserve between the count reaching zero and the release.
        let mut r = self.reservations();
        let mut a = self.attentions();
        if let Some(e) = a.nexuses.get_mut(nexus) {
            e.0 = e.0.saturating_sub(1);
            if e.0 == 0 {
                a.nexuses.remove(nexus);
                r.nexus_lost(nexus);
            }
        }
        self.ua_waiting.store(a.any(), Ordering::SeqCst);
    }

    /// The end of a task management reset that moved the unit to reset
    /// epoch `epoch` ([`LuState::reset`]): waits for the writes and
    /// reservation changes admitted before it (they hold
    /// [`LuState::atomic`]'s lock), then, for a LUN or target reset
    /// (`releases`; not CLEAR TASK SET), ends the SPC-2 reservation taken
    /// before it.
    pub fn finish_reset(&self, epoch: u64, releases: bool) {
        let _settled = self.atomic();
        if releases {
            self.reservations().reset(epoch);
        }
    }

    /// Decides whether a command of `nexus` runs or reports a unit
    /// attention (which it then clears). `reports` is false for the
    /// commands that never report one (INQUIRY, REPORT LUNS); REQUEST
    /// SENSE reports it as its data.
    pub fn admit(&self, nexus: &Nexus, reports: bool) -> Admission {
        // The epoch is read before the flag: a reset that posts after
        // the flag was read moved the epoch after it was read too, so a
        // write admitted here is refused by `stale`.
        let epoch = self.epoch.load(Ordering::SeqCst);
        if !reports || !self.ua_waiting.load(Ordering::SeqCst) {
            return Admission::Run(epoch);
        }
        let mut a = self.attentions();
        let epoch = self.epoch.load(Ordering::SeqCst);
        let popped = a.nexuses.get_mut(nexus).and_then(|(_, q, _)| q.pop_front());
        self.ua_waiting.store(a.any(), Ordering::SeqCst);
        match popped {
            Some(s) => Admission::Attention(s),
            None => Admission::Run(epoch),
        }
    }

    /// True if a reset came after a command admitted in `epoch`: it must
    /// not change the medium (checked while holding
    /// [`LuState::writing`]).
    pub fn stale(&self, epoch: u64) -> bool {
        self.epoch.load(Ordering::SeqCst) != epoch
    }

    /// A reset: posts `attention` to every attached nexus but `except`
    /// (None: to all of them) and moves the epoch on, so every session
    /// drops its tasks. The caller then waits for the writes already
    /// running with [`LuState::atomic`] before it answers. The new
    /// epoch.
    pub fn reset(&self, except: Option<&Nexus>, attention: Sense) -> u64 {
        let mut a = self.attentions();
        a.post(attention, except);
        self.ua_waiting.store(a.any(), Ordering::SeqCst);
        let e = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        self.resets.send_replace(e);
        e
    }

    /// Posts each attention to its nexus, if that nexus has a session
    /// (what a PERSISTENT RESERVE OUT decided to tell).
    pub fn tell(&self, told: Vec<(Nexus, Sense)>) {
        if told.is_empty() {
            return;
        }
        let mut a = self.attentions();
        for (n, s) in told {
            if let Some((_, q, _)) = a.nexuses.get_mut(&n) {
                queue(q, s);
            }
        }
        self.ua_waiting.store(a.any(), Ordering::SeqCst);
    }

    /// Follows the unit's resets (see [`LuState::reset`]).
    pub fn resets(&self) -> tokio::sync::watch::Receiver<u64> {
        self.resets.subscribe()
    }

    /// Tells the unit the device's size as a command found it (`size`
    /// asks the device; None: it cannot say now without waiting): if it
    /// differs from what the unit last saw, every attached nexus gets
    /// CAPACITY DATA HAS CHANGED. The size is asked again under the
    /// unit's lock before anything is posted, so a command that read the
    /// old size just before a resize cannot post the change back (and
    /// the new one again after it). Size 0 (a closed device) is ignored.
    pub fn saw_capacity(&self, size: impl Fn() -> Option<u64>) {
        // Asked by every command: a load first, so the usual case takes
        // no lock and writes nothing to the shared line.
        match size() {
            Some(s) if s != 0 && s != self.capacity.load(Ordering::SeqCst) => {}
            _ => return,
        }
        let mut a = self.attentions();
        let Some(now) = size().filter(|&s| s != 0) else {
            return;
        };
        let old = self.capacity.swap(now, Ordering::SeqCst);
        if old != now && old != u64::MAX {
            a.post(Sense::CAPACITY_CHANGED, None);
            self.ua_waiting.store(a.any(), Ordering::SeqCst);
        }
    }

    fn attentions(&self) -> MutexGuard<'_, Attentions> {
        match self.ua.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
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

    /// The reservations if no one holds them now.
    pub fn try_reservations(&self) -> Option<MutexGuard<'_, Reservations>> {
        match self.pr.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The reservations, locked.
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

    fn nexus(isid: u8) -> Nexus {
        Nexus::new("iqn.2024-01.x:i", [0, 0, 0, 0, 0, isid], "iqn.2024-01.x:t")
    }

    #[test]
    fn a_reset_warns_every_attached_nexus_once() {
        let lu = LuState::default();
        let (a, b, c, late) = (nexus(1), nexus(2), nexus(3), nexus(4));
        for n in [&a, &b, &c] {
            lu.attach(n);
        }
        let Admission::Run(before) = lu.admit(&b, true) else {
            panic!("nothing waits yet");
        };
        lu.reset(None, Sense::RESET_OCCURRED);
        lu.reset(None, Sense::RESET_OCCURRED);
        assert!(lu.stale(before), "a write admitted before must not run");
        lu.attach(&late);
        assert_eq!(
            lu.admit(&a, true),
            Admission::Attention(Sense::RESET_OCCURRED)
        );
        assert!(
            matches!(lu.admit(&late, true), Admission::Run(_)),
            "came after"
        );
        // CLEAR TASK SET tells the others only.
        lu.reset(Some(&late), Sense::COMMANDS_CLEARED);
        assert!(
            matches!(lu.admit(&late, true), Admission::Run(_)),
            "the clearer"
        );
        assert_eq!(
            lu.admit(&a, true),
            Admission::Attention(Sense::COMMANDS_CLEARED)
        );
        // Two resets, one attention of each kind, in order; INQUIRY
        // neither reports nor clears them.
        assert_eq!(
            lu.admit(&b, true),
            Admission::Attention(Sense::RESET_OCCURRED)
        );
        assert_eq!(
            lu.admit(&b, true),
            Admission::Attention(Sense::COMMANDS_CLEARED)
        );
        let Admission::Run(now) = lu.admit(&b, true) else {
            panic!("reported once");
        };
        assert!(!lu.stale(now));
        assert!(matches!(lu.admit(&c, false), Admission::Run(_)));
        assert_eq!(
            lu.admit(&c, true),
            Admission::Attention(Sense::RESET_OCCURRED)
        );
        assert_eq!(
            lu.admit(&c, true),
            Admission::Attention(Sense::COMMANDS_CLEARED)
        );
        assert!(matches!(lu.admit(&c, true), Admission::Run(_)));
    }

    #[test]
    fn a_new_size_warns_every_nexus_and_a_detached_one_forgets() {
        let lu = LuState::default();
        let (a, b) = (nexus(1), nexus(2));
        lu.attach(&a);
        lu.attach(&b);
        lu.attach(&b); // two sessions of one nexus
        lu.saw_capacity(|| Some(1 << 20));
        lu.saw_capacity(|| Some(1 << 20));
        lu.saw_capacity(|| None);
        lu.saw_capacity(|| Some(0));
        assert!(
            matches!(lu.admit(&a, true), Admission::Run(_)),
            "no change yet"
        );
        lu.saw_capacity(|| Some(2 << 20));
        // A command that read the size just before the resize asks again
        // under the lock and finds the new one: nothing more is posted.
        let calls = std::cell::Cell::new(0);
        lu.saw_capacity(|| {
            calls.set(calls.get() + 1);
            Some(if calls.get() == 1 { 1 << 20 } else { 2 << 20 })
        });
        assert_eq!(calls.get(), 2);
        assert_eq!(
            lu.admit(&a, true),
            Admission::Attention(Sense::CAPACITY_CHANGED)
        );
        assert!(matches!(lu.admit(&a, true), Admission::Run(_)), "once");
        lu.detach(&b);
        assert_eq!(
            lu.admit(&b, true),
            Admission::Attention(Sense::CAPACITY_CHANGED),
            "its other session is still there"
        );
        lu.saw_capacity(|| Some(3 << 20));
        lu.detach(&b);
        lu.attach(&b);
        assert!(
            matches!(lu.admit(&b, true), Admission::Run(_)),
            "gone with it"
        );
        assert_eq!(
            lu.admit(&a, true),
            Admission::Attention(Sense::CAPACITY_CHANGED)
        );
    }

    #[test]
    fn the_last_session_of_a_nexus_ends_its_spc2_reservation() {
        let lu = LuState::default();
        let (a, b) = (nexus(1), nexus(2));
        lu.attach(&a);
        lu.attach(&a);
        lu.attach(&b);
        lu.reservations().reserve_unit(&a, 0).unwrap();
        lu.detach(&b);
        lu.detach(&a);
        assert_eq!(
            lu.reservations().unit_holder(),
            Some(&a),
            "a session of it is left"
        );
        lu.detach(&a);
        assert_eq!(lu.reservations().unit_holder(), None, "the nexus is lost");
    }

    #[test]
    fn a_second_login_of_a_nexus_reinstates_it() {
        let lu = LuState::default();
        let (a, b) = (nexus(1), nexus(2));
        let (old, first) = lu.attach(&a);
        let (other, _) = lu.attach(&b);
        assert!(!first);
        lu.reservations().reserve_unit(&a, 0).unwrap();
        let (new, again) = lu.attach(&a);
        assert!(again, "the same initiator port logged in again");
        assert!(old.has_changed().unwrap(), "the old session is told to go");
        assert!(!new.has_changed().unwrap() && !other.has_changed().unwrap());
        assert_eq!(lu.reservations().unit_holder(), None, "the nexus was lost");
        // The old session goes; the new one keeps the nexus.
        lu.detach(&a);
        lu.reservations().reserve_unit(&a, 0).unwrap();
        lu.detach(&b);
        assert_eq!(lu.reservations().unit_holder(), Some(&a));
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
