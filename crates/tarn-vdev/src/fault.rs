//! A leaf that injects faults: the drills and tests that prove the pool
//! keeps its contract when devices misbehave.
//!
//! # Theory
//!
//! `FaultLeaf` wraps any leaf and, when told to, makes it misbehave the
//! way real devices do (the assumptions about media in docs/design.md,
//! "The contract"): reads or writes that fail, reads that return flipped
//! bits, writes that are acknowledged but never land (dropped), writes of
//! which only a prefix of the sectors lands (torn), slow I/O, flushes that
//! fail (losing what they should have made durable, when unflushed writes
//! are tracked), and a device that vanishes. Each fault applies to a share of the I/Os, decided by a
//! seeded xorshift generator so a failing run can be replayed exactly,
//! optionally limited to a byte range of the device.
//!
//! For power cuts it keeps, when asked to, an undo record of every write
//! since the last flush: [`FaultLeaf::power_cut`] then puts back the old
//! bytes of each of those writes with a given probability, as a device
//! loses what sat in its volatile cache. Flushed writes are never undone.
//!
//! To cut the power *inside* the engine's I/O rather than between two
//! calls, leaves can share a [`PowerSwitch`]: a budget of writes that may
//! still land. Once it is spent the power is off for every attached leaf:
//! each write and flush fails, nothing more lands, reads keep working. A
//! simulation then calls [`FaultLeaf::power_cut`] on each leaf and imports
//! the pool again. [`set_open_hook`] lets a test set up (fault, seed,
//! switch, undo tracking) every leaf [`open_device`] makes for a path, so
//! a pool reopened by import is armed from its very first I/O.
//!
//! The pool wraps every device it opens in a `FaultLeaf` with no faults
//! set, so `tarn pool inject` can drill a live pool; when idle an I/O costs
//! one atomic load.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::leaf::{FileLeaf, Leaf};
use crate::VdevError;

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// Reads fail with an I/O error.
    ReadError,
    /// Writes fail with an I/O error.
    WriteError,
    /// Reads return data with one bit flipped.
    Bitflip,
    /// Writes are acknowledged but nothing lands.
    DropWrite,
    /// Writes land only partly: a prefix of whole sectors.
    TornWrite,
    /// Every I/O waits first (see [`Fault::latency_ms`]).
    Latency,
    /// The device is gone: every I/O and flush fails.
    Vanish,
    /// Flushes fail with an I/O error, as when a device's write-back
    /// fails: what was written since the last flush may be lost.
    FlushError,
}

impl FaultKind {
    /// Every kind, for help texts.
    pub const ALL: [FaultKind; 8] = [
        FaultKind::ReadError,
        FaultKind::WriteError,
        FaultKind::Bitflip,
        FaultKind::DropWrite,
        FaultKind::TornWrite,
        FaultKind::Latency,
        FaultKind::Vanish,
        FaultKind::FlushError,
    ];

    /// The name used on the command line (`read-error`, ...).
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::ReadError => "read-error",
            FaultKind::WriteError => "write-error",
            FaultKind::Bitflip => "bitflip",
            FaultKind::DropWrite => "drop-write",
            FaultKind::TornWrite => "torn-write",
            FaultKind::Latency => "latency",
            FaultKind::Vanish => "vanish",
            FaultKind::FlushError => "flush-error",
        }
    }

    /// Parses a command-line name.
    pub fn parse(s: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// One injected fault.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    /// What it does.
    pub kind: FaultKind,
    /// Share of the matching I/Os it hits, 0.0..=1.0.
    pub probability: f64,
    /// Only I/Os touching this byte range [start, end) of the device.
    pub range: Option<(u64, u64)>,
    /// Delay of a `Latency` fault.
    pub latency_ms: u64,
}

impl Fault {
    /// A fault of `kind` hitting every I/O anywhere on the device.
    pub fn always(kind: FaultKind) -> Fault {
        Fault {
            kind,
            probability: 1.0,
            range: None,
            latency_ms: 0,
        }
    }
}

/// A power supply shared by several leaves (see the module docs): a
/// budget of writes that may still land, after which every write and
/// flush of every attached leaf fails. Reads are not affected.
///
/// Only writes spend the budget. Flushes do not (a vdev flushes its
/// children in parallel, so counting them would make the cut point depend
/// on thread scheduling); instead the switch decides what happens between
/// the last write that lands and the next one: an *eager* switch goes off
/// as soon as the budget is spent (a flush right after the last write
/// fails, so that write may still be lost), a *lazy* one only when a write
/// is refused (flushes in between succeed). Both are deterministic.
#[derive(Debug)]
pub struct PowerSwitch {
    /// Writes that may still land; negative: no limit.
    budget: AtomicI64,
    /// Off when the budget reaches 0 rather than at the first refused write.
    eager: AtomicBool,
    /// The power is off: every write and flush fails.
    off: AtomicBool,
    /// Writes let through so far.
    landed: AtomicU64,
}

impl Default for PowerSwitch {
    fn default() -> Self {
        PowerSwitch {
            budget: AtomicI64::new(-1),
            eager: AtomicBool::new(false),
            off: AtomicBool::new(false),
            landed: AtomicU64::new(0),
        }
    }
}

impl PowerSwitch {
    /// A switch that is on, with no limit.
    pub fn new() -> Arc<PowerSwitch> {
        Arc::new(PowerSwitch::default())
    }

    /// Powers on with a budget: `writes` more writes land, then the power
    /// goes off (`eager`: at once; otherwise at the next write).
    pub fn arm(&self, writes: u64, eager: bool) {
        let writes = i64::try_from(writes).unwrap_or(i64::MAX);
        self.eager.store(eager, Ordering::Release);
        self.budget.store(writes, Ordering::Release);
        self.off.store(eager && writes == 0, Ordering::Release);
    }

    /// Powers on with no limit.
    pub fn unlimited(&self) {
        self.budget.store(-1, Ordering::Release);
        self.off.store(false, Ordering::Release);
    }

    /// Cuts the power now.
    pub fn cut(&self) {
        self.budget.store(0, Ordering::Release);
        self.off.store(true, Ordering::Release);
    }

    /// True once the power is off.
    pub fn is_off(&self) -> bool {
        self.off.load(Ordering::Acquire)
    }

    /// Writes let through since the switch was made.
    pub fn landed(&self) -> u64 {
        self.landed.load(Ordering::Acquire)
    }

    /// Whether a write may land now (spends one unit of the budget).
    fn admit_write(&self) -> bool {
        if self.is_off() {
            return false;
        }
        let r = self
            .budget
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| match b {
                0 => None,
                b if b < 0 => Some(b),
                b => Some(b - 1),
            });
        match r {
            Ok(b) => {
                if b == 1 && self.eager.load(Ordering::Acquire) {
                    self.off.store(true, Ordering::Release);
                }
                self.landed.fetch_add(1, Ordering::AcqRel);
                true
            }
            Err(_) => {
                self.off.store(true, Ordering::Release);
                false
            }
        }
    }
}

/// A gate a test holds writes at: while it is closed, every write and
/// flush of the attached leaves waits (reads pass). Attached with
/// [`FaultLeaf::attach_read_gate`] instead, it holds reads (and only
/// reads): a test stops a disk read to see what else still runs. Tests use it to stop a
/// txg sync in the middle of its device writes and check what the rest of
/// the engine can still do meanwhile; attach it to the pool's data
/// devices only, so a log device keeps working.
#[derive(Debug, Default)]
pub struct WriteGate {
    closed: Mutex<bool>,
    cv: std::sync::Condvar,
    /// I/Os waiting at the gate now.
    waiting: AtomicU64,
    /// I/Os that ever waited at it.
    stopped: AtomicU64,
}

impl WriteGate {
    /// A gate that is open.
    pub fn new() -> Arc<WriteGate> {
        Arc::new(WriteGate::default())
    }

    /// Holds every write and flush from now on.
    pub fn close(&self) {
        *self.closed.lock().unwrap_or_else(|e| e.into_inner()) = true;
    }

    /// Lets everything through, including what waits.
    pub fn open(&self) {
        *self.closed.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.cv.notify_all();
    }

    /// I/Os waiting at the gate now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Acquire)
    }

    /// I/Os that have been held at the gate since it was made.
    pub fn stopped(&self) -> u64 {
        self.stopped.load(Ordering::Acquire)
    }

    /// Waits up to `timeout` until some I/O waits at the gate; false if
    /// none came.
    pub fn wait_for_waiter(&self, timeout: Duration) -> bool {
        let end = std::time::Instant::now() + timeout;
        while self.waiting() == 0 {
            if std::time::Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    fn pass(&self) {
        let mut closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        if !*closed {
            return;
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        self.stopped.fetch_add(1, Ordering::AcqRel);
        while *closed {
            closed = self.cv.wait(closed).unwrap_or_else(|e| e.into_inner());
        }
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Set-up run on every leaf [`open_device`] makes for a path (see
/// [`set_open_hook`]).
pub type OpenHook = Arc<dyn Fn(&FaultLeaf) + Send + Sync>;

fn hooks() -> &'static Mutex<HashMap<PathBuf, OpenHook>> {
    static HOOKS: OnceLock<Mutex<HashMap<PathBuf, OpenHook>>> = OnceLock::new();
    HOOKS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Runs `hook` on every leaf [`open_device`] opens at `path` from now on
/// (`None` removes it), before the leaf does any I/O: a test arms the
/// devices of a pool that import is about to open.
pub fn set_open_hook(path: &Path, hook: Option<OpenHook>) {
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut h = hooks().lock().unwrap_or_else(|e| e.into_inner());
    match hook {
        Some(f) => h.insert(key, f),
        None => h.remove(&key),
    };
}

struct State {
    faults: Vec<Fault>,
    rng: u64,
    /// Undo records (offset, old bytes) of writes since the last flush.
    undo: Option<Vec<(u64, Vec<u8>)>>,
    injected: u64,
    switch: Option<Arc<PowerSwitch>>,
    gate: Option<Arc<WriteGate>>,
    read_gate: Option<Arc<WriteGate>>,
}

impl State {
    fn next(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn chance(&mut self, p: f64) -> bool {
        if p >= 1.0 {
            return true;
        }
        if p <= 0.0 {
            return false;
        }
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// The first fault of `kind` that hits an I/O of `len` bytes at `off`.
    fn hit(&mut self, kind: FaultKind, off: u64, len: u64) -> Option<Fault> {
        let f = self
            .faults
            .iter()
            .find(|f| {
                f.kind == kind
                    && f.range
                        .is_none_or(|(s, e)| off < e && off.saturating_add(len) > s)
            })?
            .clone();
        if self.chance(f.probability) {
            self.injected += 1;
            Some(f)
        } else {
            None
        }
    }
}

/// Every device opened with [`open_device`], by canonical path, so a
/// drill can find the live leaf of a pool member. A path may be open more
/// than once at a time (an import scanning a directory opens the members
/// of pools already imported just to read their labels), so each path
/// keeps every open leaf, oldest first.
fn registry() -> &'static Mutex<HashMap<PathBuf, Vec<Weak<FaultLeaf>>>> {
    static REG: OnceLock<Mutex<HashMap<PathBuf, Vec<Weak<FaultLeaf>>>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Opens a device (file or block device) the way the pool does: a
/// [`FileLeaf`] inside a [`FaultLeaf`] with no faults, registered so
/// [`find_device`] can reach it.
pub fn open_device(path: &Path) -> Result<Arc<FaultLeaf>, VdevError> {
    let leaf = FileLeaf::open(path)?;
    let f = Arc::new(FaultLeaf::new(Arc::new(leaf), 4096));
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let hook = hooks()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .cloned();
    if let Some(hook) = hook {
        hook(&f);
    }
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    reg.retain(|_, open| {
        open.retain(|w| w.strong_count() > 0);
        !open.is_empty()
    });
    reg.entry(key).or_default().push(Arc::downgrade(&f));
    Ok(f)
}

/// The open device at `path`, if this process has it open: the newest of
/// its leaves still in use, so a short-lived second opening (to read a
/// label) never hides the leaf a pool keeps using.
pub fn find_device(path: &Path) -> Option<Arc<FaultLeaf>> {
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)?
        .iter()
        .rev()
        .find_map(Weak::upgrade)
}

/// A leaf that injects faults (see the module docs).
pub struct FaultLeaf {
    inner: Arc<dyn Leaf>,
    sector: u64,
    /// True while a fault is set, unflushed writes are tracked or a power
    /// switch is attached; when false (every pool device, most of the
    /// time) I/O skips the lock.
    armed: AtomicBool,
    state: Mutex<State>,
}

impl std::fmt::Debug for FaultLeaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultLeaf({:?})", self.inner)
    }
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("injected fault: {what}"))
}

impl FaultLeaf {
    /// Wraps `inner`; `sector` is the unit of torn writes.
    pub fn new(inner: Arc<dyn Leaf>, sector: u64) -> FaultLeaf {
        FaultLeaf {
            inner,
            sector: sector.max(512),
            armed: AtomicBool::new(false),
            state: Mutex::new(State {
                faults: Vec::new(),
                rng: 0x9E37_79B9_7F4A_7C15,
                undo: None,
                injected: 0,
                switch: None,
                gate: None,
                read_gate: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Recomputes `armed` after a change (under the state lock).
    fn rearm(&self, st: &State) {
        let on = !st.faults.is_empty()
            || st.undo.is_some()
            || st.switch.is_some()
            || st.gate.is_some()
            || st.read_gate.is_some();
        self.armed.store(on, Ordering::Release);
    }

    fn idle(&self) -> bool {
        !self.armed.load(Ordering::Acquire)
    }

    /// Adds a fault.
    pub fn inject(&self, fault: Fault) {
        let mut st = self.lock();
        st.faults.push(fault);
        self.rearm(&st);
    }

    /// Removes every fault (the device behaves again).
    pub fn clear(&self) {
        let mut st = self.lock();
        st.faults.clear();
        self.rearm(&st);
    }

    /// The faults in force.
    pub fn faults(&self) -> Vec<Fault> {
        self.lock().faults.clone()
    }

    /// How many I/Os a fault has hit so far.
    pub fn injected(&self) -> u64 {
        self.lock().injected
    }

    /// Seeds the generator that decides which I/Os a fault hits.
    pub fn seed(&self, seed: u64) {
        self.lock().rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    }

    /// Starts (or stops) keeping undo records of unflushed writes, for
    /// [`FaultLeaf::power_cut`].
    pub fn track_unflushed(&self, on: bool) {
        let mut st = self.lock();
        st.undo = on.then(Vec::new);
        self.rearm(&st);
    }

    /// Attaches the leaf to a shared [`PowerSwitch`] (`None` detaches it).
    pub fn attach_switch(&self, switch: Option<Arc<PowerSwitch>>) {
        let mut st = self.lock();
        st.switch = switch;
        self.rearm(&st);
    }

    /// Attaches the leaf to a [`WriteGate`] (`None` detaches it).
    pub fn attach_gate(&self, gate: Option<Arc<WriteGate>>) {
        let mut st = self.lock();
        st.gate = gate;
        self.rearm(&st);
    }

    /// Attaches the leaf's reads to a [`WriteGate`] (`None` detaches
    /// them): while it is closed every read waits, writes pass.
    pub fn attach_read_gate(&self, gate: Option<Arc<WriteGate>>) {
        let mut st = self.lock();
        st.read_gate = gate;
        self.rearm(&st);
    }

    /// The attached power switch.
    pub fn switch(&self) -> Option<Arc<PowerSwitch>> {
        self.lock().switch.clone()
    }

    /// Simulates a power cut: each write since the last flush is undone
    /// with `probability` (newest first, so overlapping writes unwind in
    /// order). Returns how many were undone.
    pub fn power_cut(&self, probability: f64) -> io::Result<usize> {
        let mut st = self.lock();
        let Some(undo) = st.undo.take() else {
            return Ok(0);
        };
        let mut n = 0;
        for (off, old) in undo.into_iter().rev() {
            if st.chance(probability) {
                self.inner.write_at(&old, off)?;
                n += 1;
            }
        }
        st.undo = Some(Vec::new());
        Ok(n)
    }

    /// The wrapped leaf.
    pub fn inner(&self) -> &Arc<dyn Leaf> {
        &self.inner
    }
}

impl Leaf for FaultLeaf {
    fn read_direct_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.idle() {
            return self.inner.read_direct_at(buf, offset);
        }
        // Faults are injected on the one read path there is for them.
        self.read_at(buf, offset)
    }

    fn direct_reads(&self) -> u64 {
        self.inner.direct_reads()
    }

    fn direct_fd(&self) -> Option<std::os::fd::RawFd> {
        // Only while idle: a fault set later applies from the next batch,
        // as it applies from the next read to reads already running.
        self.inner.direct_fd().filter(|_| self.idle())
    }

    fn note_direct_reads(&self, n: u64) {
        self.inner.note_direct_reads(n);
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.idle() {
            return self.inner.read_at(buf, offset);
        }
        let len = buf.len() as u64;
        // Bound first: the state lock must not be held while the gate waits.
        let gate = self.lock().read_gate.clone();
        if let Some(g) = gate {
            g.pass();
        }
        let (vanish, error, flip, delay) = {
            let mut st = self.lock();
            (
                st.hit(FaultKind::Vanish, offset, len).is_some(),
                st.hit(FaultKind::ReadError, offset, len).is_some(),
                st.hit(FaultKind::Bitflip, offset, len)
                    .map(|_| st.next() % (len.max(1) * 8)),
                st.hit(FaultKind::Latency, offset, len)
                    .map(|f| f.latency_ms),
            )
        };
        if let Some(ms) = delay {
            std::thread::sleep(Duration::from_millis(ms));
        }
        if vanish {
            return Err(injected("device vanished"));
        }
        if error {
            return Err(injected("read error"));
        }
        self.inner.read_at(buf, offset)?;
        if let Some(bit) = flip {
            if let Some(b) = buf.get_mut((bit / 8) as usize) {
                *b ^= 1 << (bit % 8);
            }
        }
        Ok(())
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        if self.idle() {
            return self.inner.write_vectored_at(bufs, offset);
        }
        // Faults apply to the write as a whole, as to any other.
        self.write_at(&bufs.concat(), offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.idle() {
            return self.inner.write_at(buf, offset);
        }
        let len = buf.len() as u64;
        // Bound first: the state lock must not be held while the gate waits.
        let gate = self.lock().gate.clone();
        if let Some(g) = gate {
            g.pass();
        }
        let (vanish, error, drop, torn, delay, tracking) = {
            let mut st = self.lock();
            if st.switch.as_ref().is_some_and(|s| !s.admit_write()) {
                return Err(injected("power is off"));
            }
            (
                st.hit(FaultKind::Vanish, offset, len).is_some(),
                st.hit(FaultKind::WriteError, offset, len).is_some(),
                st.hit(FaultKind::DropWrite, offset, len).is_some(),
                st.hit(FaultKind::TornWrite, offset, len).map(|_| {
                    let sectors = len.div_ceil(self.sector).max(1);
                    (st.next() % sectors) * self.sector
                }),
                st.hit(FaultKind::Latency, offset, len)
                    .map(|f| f.latency_ms),
                st.undo.is_some(),
            )
        };
        if let Some(ms) = delay {
            std::thread::sleep(Duration::from_millis(ms));
        }
        if vanish {
            return Err(injected("device vanished"));
        }
        if error {
            return Err(injected("write error"));
        }
        if tracking {
            let mut old = vec![0u8; buf.len()];
            self.inner.read_at(&mut old, offset)?;
            if let Some(u) = self.lock().undo.as_mut() {
                u.push((offset, old));
            }
        }
        if drop {
            return Ok(()); // acknowledged, never written
        }
        match torn {
            Some(keep) => self.inner.write_at(&buf[..keep as usize], offset),
            None => self.inner.write_at(buf, offset),
        }
    }

    fn flush(&self) -> io::Result<()> {
        if self.idle() {
            return self.inner.flush();
        }
        // Bound first: the state lock must not be held while the gate waits.
        let gate = self.lock().gate.clone();
        if let Some(g) = gate {
            g.pass();
        }
        let (vanish, power, failed) = {
            let mut st = self.lock();
            (
                st.hit(FaultKind::Vanish, 0, u64::MAX).is_some(),
                st.switch.as_ref().is_none_or(|s| !s.is_off()),
                st.hit(FaultKind::FlushError, 0, u64::MAX).is_some(),
            )
        };
        if !power {
            return Err(injected("power is off"));
        }
        if vanish {
            return Err(injected("device vanished"));
        }
        if failed {
            // The kernel drops the pages whose write-back failed: with
            // unflushed writes tracked, they are lost here too.
            self.power_cut(1.0)?;
            return Err(injected("flush error"));
        }
        self.inner.flush()?;
        if let Some(u) = self.lock().undo.as_mut() {
            u.clear();
        }
        Ok(())
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn path(&self) -> &Path {
        self.inner.path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemLeaf;

    fn leaf() -> (Arc<MemLeaf>, FaultLeaf) {
        let m = Arc::new(MemLeaf::new(1 << 20));
        let f = FaultLeaf::new(m.clone(), 4096);
        (m, f)
    }

    #[test]
    fn a_closed_gate_holds_writes_and_flushes_but_not_reads() {
        let (m, f) = leaf();
        let f = Arc::new(f);
        let gate = WriteGate::new();
        f.attach_gate(Some(gate.clone()));
        f.write_at(&[1; 4096], 0).unwrap(); // open: passes
        gate.close();
        let w = {
            let f = f.clone();
            std::thread::spawn(move || {
                f.write_at(&[2; 4096], 0).unwrap();
                f.flush().unwrap();
            })
        };
        assert!(gate.wait_for_waiter(Duration::from_secs(10)));
        let mut b = [0u8; 4096];
        f.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [1; 4096], "the held write landed");
        assert_eq!(gate.waiting(), 1);
        gate.open();
        w.join().unwrap();
        m.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [2; 4096]);
        assert_eq!(gate.stopped(), 1);
        f.attach_gate(None);
        gate.close();
        f.write_at(&[3; 4096], 0).unwrap(); // detached: passes
    }

    #[test]
    fn a_closed_read_gate_holds_reads_but_not_writes() {
        let (_, f) = leaf();
        let f = Arc::new(f);
        let gate = WriteGate::new();
        f.attach_read_gate(Some(gate.clone()));
        f.write_at(&[1; 4096], 0).unwrap();
        gate.close();
        let r = {
            let f = f.clone();
            std::thread::spawn(move || {
                let mut b = [0u8; 4096];
                f.read_at(&mut b, 0).unwrap();
                b
            })
        };
        assert!(gate.wait_for_waiter(Duration::from_secs(10)));
        f.write_at(&[2; 4096], 0).unwrap(); // writes pass
        f.flush().unwrap();
        assert_eq!(gate.waiting(), 1, "the read is still held");
        gate.open();
        assert_eq!(r.join().unwrap(), [2; 4096]);
        f.attach_read_gate(None);
        gate.close();
        let mut b = [0u8; 4096];
        f.read_at(&mut b, 0).unwrap(); // detached: passes
    }

    #[test]
    fn passes_through_when_idle() {
        let (_, f) = leaf();
        f.write_at(&[7; 8192], 4096).unwrap();
        let mut b = [0u8; 8192];
        f.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, [7; 8192]);
        assert_eq!(f.injected(), 0);
    }

    #[test]
    fn each_kind_does_what_it_says() {
        let (m, f) = leaf();
        f.write_at(&[1; 8192], 0).unwrap();
        let mut b = [0u8; 8192];

        f.inject(Fault::always(FaultKind::ReadError));
        assert!(f.read_at(&mut b, 0).is_err());
        f.clear();

        f.inject(Fault::always(FaultKind::Bitflip));
        f.read_at(&mut b, 0).unwrap();
        let flipped: u32 = b.iter().map(|x| (x ^ 1).count_ones()).sum();
        assert_eq!(flipped, 1, "exactly one bit differs");
        f.clear();

        f.inject(Fault::always(FaultKind::DropWrite));
        f.write_at(&[2; 8192], 0).unwrap();
        m.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [1; 8192], "dropped: the old bytes stay");
        f.clear();

        f.inject(Fault::always(FaultKind::TornWrite));
        f.write_at(&[3; 8192], 0).unwrap();
        m.read_at(&mut b, 0).unwrap();
        let landed = b.iter().take_while(|&&x| x == 3).count();
        assert!(
            landed % 4096 == 0 && landed < 8192,
            "a sector prefix: {landed}"
        );
        assert!(b[landed..].iter().all(|&x| x == 1));
        f.clear();

        f.inject(Fault::always(FaultKind::WriteError));
        assert!(f.write_at(&[4; 8192], 0).is_err());
        f.clear();

        f.inject(Fault::always(FaultKind::Vanish));
        assert!(f.read_at(&mut b, 0).is_err());
        assert!(f.flush().is_err());
        f.clear();
        f.flush().unwrap();

        let mut slow = Fault::always(FaultKind::Latency);
        slow.latency_ms = 30;
        f.inject(slow);
        let t = std::time::Instant::now();
        f.read_at(&mut b, 0).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn ranges_and_probability_are_honoured_and_replayable() {
        let (_, f) = leaf();
        let mut fault = Fault::always(FaultKind::ReadError);
        fault.range = Some((65536, 131072));
        f.inject(fault);
        let mut b = [0u8; 4096];
        assert!(f.read_at(&mut b, 0).is_ok());
        assert!(f.read_at(&mut b, 65536).is_err());
        assert!(f.read_at(&mut b, 131072).is_ok());
        f.clear();
        let run = |seed| {
            let (_, f) = leaf();
            f.seed(seed);
            let mut p = Fault::always(FaultKind::ReadError);
            p.probability = 0.3;
            f.inject(p);
            (0..200)
                .map(|i| f.read_at(&mut [0u8; 512], i * 512).is_err())
                .collect::<Vec<bool>>()
        };
        let a = run(7);
        assert_eq!(a, run(7), "the same seed replays exactly");
        let hits = a.iter().filter(|x| **x).count();
        assert!((30..=90).contains(&hits), "about 30% of 200: {hits}");
        assert_ne!(a, run(8));
    }

    #[test]
    fn a_second_opening_of_a_device_does_not_hide_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let first = open_device(&path).unwrap();
        // A label scan opens the same file and lets it go.
        drop(open_device(&path).unwrap());
        let found = find_device(&path).expect("the first opening is still in use");
        assert!(Arc::ptr_eq(&found, &first));
        drop(found);
        // While two are open, the newest is the one in charge.
        let second = open_device(&path).unwrap();
        assert!(Arc::ptr_eq(&find_device(&path).unwrap(), &second));
        drop(second);
        assert!(Arc::ptr_eq(&find_device(&path).unwrap(), &first));
        drop(first);
        assert!(find_device(&path).is_none());
    }

    #[test]
    fn power_cut_undoes_only_unflushed_writes() {
        let (m, f) = leaf();
        f.track_unflushed(true);
        f.write_at(&[1; 4096], 0).unwrap();
        f.flush().unwrap();
        f.write_at(&[2; 4096], 0).unwrap();
        f.write_at(&[3; 4096], 4096).unwrap();
        assert_eq!(f.power_cut(1.0).unwrap(), 2);
        let mut b = [0u8; 8192];
        m.read_at(&mut b, 0).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 1), "the flushed write stays");
        assert!(
            b[4096..].iter().all(|&x| x == 0),
            "the unflushed write is gone"
        );
        f.write_at(&[5; 4096], 0).unwrap();
        assert_eq!(f.power_cut(0.0).unwrap(), 0, "probability 0 keeps them");
        m.read_at(&mut b[..4096], 0).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 5));
    }

    #[test]
    fn power_switch_cuts_every_attached_leaf_at_its_budget() {
        let (ma, a) = leaf();
        let (mb, b) = leaf();
        let sw = PowerSwitch::new();
        for f in [&a, &b] {
            f.track_unflushed(true);
            f.attach_switch(Some(sw.clone()));
        }
        // No limit yet: everything lands and flushes.
        a.write_at(&[1; 4096], 0).unwrap();
        b.write_at(&[1; 4096], 0).unwrap();
        a.flush().unwrap();
        b.flush().unwrap();
        assert_eq!(sw.landed(), 2);

        // Lazy: three more writes land (on either leaf); flushes in between
        // succeed; the fourth write is refused and the power is off.
        sw.arm(3, false);
        a.write_at(&[2; 4096], 0).unwrap();
        b.write_at(&[2; 4096], 0).unwrap();
        a.write_at(&[3; 4096], 4096).unwrap();
        assert!(!sw.is_off(), "lazy: still on with the budget spent");
        a.flush().unwrap();
        assert!(b.write_at(&[4; 4096], 4096).is_err(), "budget spent");
        assert!(sw.is_off());
        assert!(a.write_at(&[4; 4096], 0).is_err());
        assert!(a.flush().is_err() && b.flush().is_err(), "flushes fail too");
        let mut buf = [0u8; 4096];
        b.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [2; 4096], "reads keep working");
        mb.read_at(&mut buf, 4096).unwrap();
        assert_eq!(buf, [0; 4096], "the refused write never landed");

        // The cut: a's writes were flushed, b's unflushed one is undone.
        assert_eq!(a.power_cut(1.0).unwrap(), 0);
        assert_eq!(b.power_cut(1.0).unwrap(), 1);
        mb.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [1; 4096]);
        ma.read_at(&mut buf, 4096).unwrap();
        assert_eq!(buf, [3; 4096]);

        // Eager: off right after the last write of the budget, so the
        // flush that would have made it durable fails.
        sw.arm(1, true);
        assert!(!sw.is_off());
        a.write_at(&[5; 4096], 0).unwrap();
        assert!(sw.is_off(), "eager: off as soon as the budget is spent");
        assert!(a.flush().is_err());
        assert_eq!(a.power_cut(1.0).unwrap(), 1);
        ma.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [2; 4096], "the unflushed write is gone");

        sw.arm(0, true);
        assert!(sw.is_off(), "a budget of 0, eager: off at once");
        sw.unlimited();
        a.write_at(&[6; 4096], 0).unwrap();
        a.flush().unwrap();
        sw.cut();
        assert!(a.write_at(&[7; 4096], 0).is_err());

        // Detached and untracked, the leaf is idle again: no lock per I/O.
        for f in [&a, &b] {
            f.attach_switch(None);
            f.track_unflushed(false);
            assert!(f.idle());
        }
        a.write_at(&[8; 4096], 0).unwrap();
        a.flush().unwrap();
    }

    #[test]
    fn open_hook_arms_every_new_leaf_of_a_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let sw = PowerSwitch::new();
        let s2 = sw.clone();
        set_open_hook(
            &path,
            Some(Arc::new(move |l: &FaultLeaf| {
                l.attach_switch(Some(s2.clone()));
                l.inject(Fault::always(FaultKind::ReadError));
            })),
        );
        let l = open_device(&path).unwrap();
        assert!(l.switch().is_some_and(|s| Arc::ptr_eq(&s, &sw)));
        assert!(
            l.read_at(&mut [0u8; 512], 0).is_err(),
            "armed before any I/O"
        );
        set_open_hook(&path, None);
        let l = open_device(&path).unwrap();
        assert!(l.switch().is_none() && l.faults().is_empty() && l.idle());
    }
}
