//! Concurrent bursts of the simulation: several threads ("lanes") change
//! the file system at once while another thread commits txgs, and the
//! power may fail in the middle.
//!
//! # Why the sequential oracle does not apply, and what does
//!
//! With one thread the recovered namespace must be the model's state after
//! some prefix of the operations. With several, operations that overlap in
//! time may join their txgs (and the intent log) in either order, so there
//! is no single sequence to take prefixes of. What still holds is what the
//! engine promises about time:
//!
//! * each lane's own operations are sequential, so what is recovered of a
//!   lane is that lane's state after some prefix of its operations;
//! * an operation that returned before another one started joined an
//!   earlier or the same txg, and logged its intent record first; so if the
//!   later one is recovered, the earlier one is too (a consistent cut of
//!   real time, across lanes);
//! * an acknowledged synchronous operation (an fsync, a change under
//!   `sync=always`, a `Pool::sync` of the committing thread) makes
//!   durable every operation that had returned before it started, in every
//!   lane, and a change it acknowledges itself;
//! * an operation that started with the power already off (it may even
//!   succeed, if it needed no write) left nothing on disk.
//!
//! Each lane works in a directory of its own that the sequential workload
//! never touches, so the lanes' states combine without conflicts, and a
//! burst starts right after an acknowledged `Pool::sync`, so everything
//! outside the lanes' directories must be recovered exactly as it was.
//!
//! Time is a shared counter: every operation takes a tick when it starts
//! and one when it returns (`fetch_add`, which orders them all), so "A
//! returned before B started" is `end(A) < start(B)`. An operation that
//! failed because the power went off may or may not have happened; it ends
//! its lane and never counts as returned.
//!
//! The check finds, for every lane, the prefixes whose state equals what
//! was recovered, and looks for the least lengths that satisfy the floors
//! and the cut rule: raising one lane's prefix can only raise the others'
//! lower bounds, so taking each lane's shortest matching prefix at or
//! above its bound and repeating until nothing moves finds a consistent
//! choice if there is one.
//!
//! The workload of each lane comes from the seed, but which operation of
//! which lane lands in which txg depends on the threads' timing: a round
//! with a burst does not replay exactly, only its operations do, and once
//! a cut falls inside a burst, what is recovered (and so every later
//! round) can differ from run to run.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tarn_fs::{Cred, Fs, SetAttr};
use tarn_pool::Pool;
use tarn_testkit::data::Rng;
use tarn_vdev::fault::PowerSwitch;

use super::{diff_ns, join, Node, Ns, SimBackend};

/// The lanes' directories (a burst uses the first two or three).
pub const DIRS: [&str; 3] = ["c0", "c1", "c2"];
/// File names inside a lane's directory.
const NAMES: [&str; 4] = ["g0", "g1", "g2", "g3"];
/// Largest file a lane makes.
const MAX_FILE: usize = 96 << 10;

/// True for a lane's directory or anything in it.
pub fn in_lane(path: &str) -> bool {
    DIRS.iter().any(|d| {
        path.strip_prefix(d)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// A lane's files: name in its directory -> bytes.
type Own = BTreeMap<String, Arc<Vec<u8>>>;

/// One operation of a lane, as the oracle needs it.
struct Done {
    what: String,
    start: u64,
    /// `u64::MAX` for an operation that failed at the cut.
    end: u64,
    /// The lane's files after it.
    after: Own,
    /// Returned Ok and acknowledged durability.
    acks: bool,
    /// Started with the power off already: nothing it did can be on disk.
    after_cut: bool,
}

/// One lane's record.
pub struct Lane {
    dir: String,
    before: Own,
    ops: Vec<Done>,
}

impl Lane {
    fn state(&self, p: usize) -> &Own {
        if p == 0 {
            &self.before
        } else {
            &self.ops[p - 1].after
        }
    }

    /// How many of this lane's operations had returned before tick `t`.
    fn returned_before(&self, t: u64) -> usize {
        self.ops.iter().take_while(|o| o.end < t).count()
    }

    /// The lane's files after the whole burst.
    pub fn last(&self) -> &Own {
        self.state(self.ops.len())
    }
}

/// A burst's record: the namespace it started from, each lane's
/// operations, and the start ticks of the committing thread's
/// acknowledged syncs.
pub struct Burst {
    pub base: Ns,
    pub lanes: Vec<Lane>,
    pub syncs: Vec<u64>,
}

impl Burst {
    /// `ns` without what is inside the lanes' directories.
    fn outside(&self, ns: &Ns) -> Ns {
        ns.iter()
            .filter(|(p, _)| {
                !self
                    .lanes
                    .iter()
                    .any(|l| p.starts_with(&format!("{}/", l.dir)))
            })
            .map(|(p, n)| (p.clone(), n.clone()))
            .collect()
    }

    /// The namespace after every lane finished.
    pub fn merged(&self) -> Ns {
        let mut ns = self.outside(&self.base);
        for l in &self.lanes {
            for (name, b) in l.last() {
                ns.insert(join(&l.dir, name), Node::File(b.clone()));
            }
        }
        ns
    }

    /// Operations in all lanes.
    pub fn ops(&self) -> usize {
        self.lanes.iter().map(|l| l.ops.len()).sum()
    }

    /// Checks a namespace recovered after a cut inside this burst (see the
    /// module comment); an `Err` says what is wrong.
    pub fn check(&self, got: &Ns) -> Result<(), String> {
        // Outside the lanes: exactly the base.
        let d = diff_ns(&self.outside(&self.base), &self.outside(got));
        if !d.is_empty() {
            return Err(format!(
                "outside the burst's directories the file system differs from the state the \
                 burst started from (acknowledged by a pool sync):\n  {}",
                d.join("\n  ")
            ));
        }
        // Each lane: the prefixes that match.
        let mut cands = Vec::new();
        for l in &self.lanes {
            let prefix = format!("{}/", l.dir);
            let mut mine = Own::new();
            for (p, n) in got {
                if let Some(name) = p.strip_prefix(&prefix) {
                    match n {
                        Node::File(b) => mine.insert(name.to_string(), b.clone()),
                        Node::Dir => return Err(format!("{p}: a directory no lane made")),
                    };
                }
            }
            // What an operation started with the power off changed cannot
            // be on disk (one that changed nothing, such as an fsync with
            // nothing to write, does not matter).
            let most = (0..l.ops.len())
                .find(|&j| l.ops[j].after_cut && l.state(j + 1) != l.state(j))
                .unwrap_or(l.ops.len());
            let c: Vec<usize> = (0..=most).filter(|&p| *l.state(p) == mine).collect();
            if c.is_empty() {
                let (best, diffs) = (0..=l.ops.len())
                    .map(|p| (p, diff_own(l.state(p), &mine)))
                    .min_by_key(|(_, d)| d.len())
                    .expect("a lane has a state before its operations");
                return Err(format!(
                    "{} is in no state its lane went through; closest is after {best} \
                     operations, which differs in:\n  {}\n{}",
                    l.dir,
                    diffs.join("\n  "),
                    self.trace()
                ));
            }
            cands.push(c);
        }
        // The floors: acknowledged operations and syncs.
        let mut lo = vec![0usize; self.lanes.len()];
        let mut acks: Vec<u64> = self.syncs.clone();
        for (k, l) in self.lanes.iter().enumerate() {
            for (j, o) in l.ops.iter().enumerate() {
                if o.acks {
                    // One that started with the power off (an fsync with
                    // nothing left to write) vouches for what came before
                    // it; itself it cannot be on disk, but changed nothing.
                    lo[k] = lo[k].max(if o.after_cut { j } else { j + 1 });
                    acks.push(o.start);
                }
            }
        }
        for t in acks {
            for (k, l) in self.lanes.iter().enumerate() {
                lo[k] = lo[k].max(l.returned_before(t));
            }
        }
        // Raise the bounds until the shortest matching prefixes form a
        // consistent cut.
        loop {
            let mut pick = Vec::new();
            for (k, c) in cands.iter().enumerate() {
                match c.iter().find(|&&p| p >= lo[k]) {
                    Some(&p) => pick.push(p),
                    None => {
                        return Err(format!(
                            "{} was recovered as after {:?} of its operations, but at least {} \
                             had to be (acknowledged by an fsync or sync, or returned before a \
                             recovered operation of another lane started): lost or out of \
                             order\n{}",
                            self.lanes[k].dir,
                            c,
                            lo[k],
                            self.trace()
                        ))
                    }
                }
            }
            let mut moved = false;
            for (b, l) in self.lanes.iter().enumerate() {
                if pick[b] == 0 {
                    continue;
                }
                let t = l.ops[pick[b] - 1].start;
                for (a, la) in self.lanes.iter().enumerate() {
                    let need = la.returned_before(t);
                    if need > lo[a] {
                        lo[a] = need;
                        moved = true;
                    }
                }
            }
            if !moved {
                return Ok(());
            }
        }
    }

    /// Every lane's operations with their ticks, for a failure report.
    fn trace(&self) -> String {
        let mut s = format!("pool syncs acknowledged at ticks {:?}\n", self.syncs);
        for l in &self.lanes {
            s.push_str(&format!("lane {}:\n", l.dir));
            for (j, o) in l.ops.iter().enumerate() {
                let end = if o.end == u64::MAX {
                    "failed at the cut".to_string()
                } else {
                    o.end.to_string()
                };
                s.push_str(&format!(
                    "  {}: ticks {}..{end}{} {}\n",
                    j + 1,
                    o.start,
                    if o.acks { " ack" } else { "" },
                    o.what
                ));
            }
        }
        s
    }
}

fn diff_own(want: &Own, got: &Own) -> Vec<String> {
    let wrap = |o: &Own| -> Ns {
        o.iter()
            .map(|(n, b)| (n.clone(), Node::File(b.clone())))
            .collect()
    };
    diff_ns(&wrap(want), &wrap(got))
}

/// What a lane shares with the others.
pub struct Shared<'a> {
    pub fs: &'a Fs<SimBackend>,
    pub pool: &'a Arc<Pool>,
    pub switch: &'a PowerSwitch,
    pub ticks: &'a AtomicU64,
    pub sync_always: bool,
}

impl Shared<'_> {
    fn tick(&self) -> u64 {
        self.ticks.fetch_add(1, Ordering::SeqCst)
    }
}

/// A lane at work.
struct Runner<'a> {
    sh: &'a Shared<'a>,
    rng: Rng,
    dir_ino: u64,
    own: Own,
    inos: BTreeMap<String, u64>,
    ops: Vec<Done>,
    cred: Cred,
    /// The power was off when the current operation started.
    cut_at_start: bool,
}

/// How one lane operation ended.
enum Outcome {
    Ok,
    /// Failed with the power off: the lane stops.
    Cut,
}

/// Runs `n` random operations in the directory `dir` (inode `dir_ino`,
/// holding `before`); `Err` is a failure of the engine.
pub fn run_lane(
    sh: &Shared<'_>,
    rng: Rng,
    dir: &str,
    dir_ino: u64,
    before: Own,
    n: usize,
) -> Result<Lane, String> {
    let mut inos = BTreeMap::new();
    for name in before.keys() {
        match sh.fs.lookup(dir_ino, name.as_bytes(), &Cred::root()) {
            Ok(a) => inos.insert(name.clone(), a.ino),
            // The other lanes spent the write budget already.
            Err(_) if sh.switch.is_off() => {
                return Ok(Lane {
                    dir: dir.to_string(),
                    before,
                    ops: Vec::new(),
                })
            }
            Err(e) => return Err(format!("lane {dir}: lookup {name} before the burst: {e}")),
        };
    }
    let mut r = Runner {
        sh,
        rng,
        dir_ino,
        own: before.clone(),
        inos,
        ops: Vec::new(),
        cred: Cred::root(),
        cut_at_start: false,
    };
    for _ in 0..n {
        match r.step().map_err(|e| format!("lane {dir}: {e}"))? {
            Outcome::Ok => {}
            Outcome::Cut => break,
        }
    }
    Ok(Lane {
        dir: dir.to_string(),
        before,
        ops: r.ops,
    })
}

impl Runner<'_> {
    /// Records an operation that changes (or may change) the lane's files:
    /// `r` is its result, `after` the files if it happened.
    fn settle<T, E: std::fmt::Display>(
        &mut self,
        what: String,
        start: u64,
        r: Result<T, E>,
        after: Own,
        acks: bool,
    ) -> Result<Option<T>, String> {
        match r {
            Ok(v) => {
                let end = self.sh.tick();
                self.own = after.clone();
                self.ops.push(Done {
                    what,
                    start,
                    end,
                    after,
                    acks,
                    after_cut: self.cut_at_start,
                });
                Ok(Some(v))
            }
            Err(_) if self.sh.switch.is_off() => {
                self.ops.push(Done {
                    what: format!("{what} [failed at the cut]"),
                    start,
                    end: u64::MAX,
                    after,
                    acks: false,
                    after_cut: self.cut_at_start,
                });
                Ok(None)
            }
            Err(e) => Err(format!("{what} failed with the power on: {e}")),
        }
    }

    fn names(&self) -> Vec<String> {
        self.own.keys().cloned().collect()
    }

    fn step(&mut self) -> Result<Outcome, String> {
        let always = self.sh.sync_always;
        let names = self.names();
        let k = self.rng.below(100);
        let start = self.sh.tick();
        self.cut_at_start = self.sh.switch.is_off();
        let done = match k {
            0..=14 if names.len() < NAMES.len() => {
                let free: Vec<&str> = NAMES
                    .iter()
                    .copied()
                    .filter(|n| !self.own.contains_key(*n))
                    .collect();
                let name = self.rng.pick(&free).to_string();
                let fs = self.sh.fs;
                let r = fs
                    .create(
                        self.dir_ino,
                        name.as_bytes(),
                        libc::S_IFREG | 0o644,
                        0o022,
                        libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                        &self.cred,
                    )
                    .and_then(|a| fs.release(a.ino).map(|()| a.ino));
                let mut after = self.own.clone();
                after.insert(name.clone(), Arc::new(Vec::new()));
                self.settle(format!("create {name}"), start, r, after, always)?
                    .map(|ino| self.inos.insert(name, ino))
                    .is_some()
            }
            _ if names.is_empty() => {
                // Nothing to work on yet: a sync of the directory.
                let r = self.sh.fs.fsync(self.dir_ino);
                let after = self.own.clone();
                self.settle("fsync the directory".into(), start, r, after, true)?
                    .is_some()
            }
            0..=44 => {
                let name = self.rng.pick(&names).clone();
                let cur = self.own[&name].clone();
                let off = self
                    .rng
                    .below(cur.len() as u64 + 8192)
                    .min(MAX_FILE as u64 - 1) as usize;
                let len = (self.rng.range(1, 24 << 10) as usize).min(MAX_FILE - off);
                let (data, kind) = self.rng.mixed(len);
                let r = self
                    .sh
                    .fs
                    .write(self.inos[&name], off as u64, &data, false, &self.cred);
                let mut bytes = (*cur).clone();
                if bytes.len() < off + len {
                    bytes.resize(off + len, 0);
                }
                bytes[off..off + len].copy_from_slice(&data);
                let mut after = self.own.clone();
                after.insert(name.clone(), Arc::new(bytes));
                let what = format!("write {name} at {off} len {len} ({kind})");
                match self.settle(what, start, r, after, always)? {
                    Some(n) if n != len => return Err(format!("short write to {name}: {n}")),
                    Some(_) => true,
                    None => false,
                }
            }
            45..=52 => {
                let name = self.rng.pick(&names).clone();
                let new = self.rng.below(MAX_FILE as u64 + 1) as usize;
                let sa = SetAttr {
                    size: Some(new as u64),
                    ..Default::default()
                };
                let r = self.sh.fs.setattr(self.inos[&name], &sa, &self.cred);
                let mut bytes = (*self.own[&name]).clone();
                bytes.resize(new, 0);
                let mut after = self.own.clone();
                after.insert(name.clone(), Arc::new(bytes));
                self.settle(format!("truncate {name} to {new}"), start, r, after, always)?
                    .is_some()
            }
            53..=60 => {
                let src = self.rng.pick(&names).clone();
                let dst = self.rng.pick(&NAMES).to_string();
                if dst == src {
                    return Ok(Outcome::Ok);
                }
                let r = self.sh.fs.rename(
                    self.dir_ino,
                    src.as_bytes(),
                    self.dir_ino,
                    dst.as_bytes(),
                    0,
                    &self.cred,
                );
                let mut after = self.own.clone();
                let b = after.remove(&src).expect("the source is the lane's");
                after.insert(dst.clone(), b);
                let what = format!("rename {src} -> {dst}");
                let ok = self.settle(what, start, r, after, always)?.is_some();
                if ok {
                    let ino = self.inos.remove(&src).expect("the lane knows its inodes");
                    self.inos.insert(dst, ino);
                }
                ok
            }
            61..=66 => {
                let name = self.rng.pick(&names).clone();
                let r = self.sh.fs.unlink(self.dir_ino, name.as_bytes(), &self.cred);
                let mut after = self.own.clone();
                after.remove(&name);
                let ok = self
                    .settle(format!("unlink {name}"), start, r, after, always)?
                    .is_some();
                if ok {
                    self.inos.remove(&name);
                }
                ok
            }
            67..=74 => {
                let name = self.rng.pick(&names).clone();
                let ino = if self.rng.chance(0.8) {
                    self.inos[&name]
                } else {
                    self.dir_ino
                };
                let r = self.sh.fs.fsync(ino);
                let after = self.own.clone();
                self.settle(format!("fsync {name}"), start, r, after, true)?
                    .is_some()
            }
            75..=92 => {
                // A read of a whole file, checked against the lane's model
                // while the other lanes and the syncs run.
                let name = self.rng.pick(&names).clone();
                let want = self.own[&name].clone();
                let r = self.sh.fs.read(self.inos[&name], 0, want.len() as u32 + 1);
                match r {
                    Ok(got) if got != *want => {
                        let at = got.iter().zip(want.iter()).position(|(a, b)| a != b);
                        return Err(format!(
                            "read of {name} returned {} bytes, expected {} (first difference \
                             at {at:?})\n{}",
                            got.len(),
                            want.len(),
                            self.recent()
                        ));
                    }
                    Ok(_) => true,
                    // Reads refresh atime, which commits under sync=always.
                    Err(_) if self.sh.switch.is_off() => false,
                    Err(e) => return Err(format!("read of {name} failed with the power on: {e}")),
                }
            }
            _ => {
                let r = self.sh.fs.readdir(self.dir_ino, 0, 64);
                match r {
                    Ok(ents) => {
                        let mut got: Vec<String> = ents
                            .iter()
                            .filter(|e| e.name != b"." && e.name != b"..")
                            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                            .collect();
                        got.sort();
                        if got != names {
                            return Err(format!(
                                "the directory lists {got:?}, the lane has {names:?}\n{}",
                                self.recent()
                            ));
                        }
                        true
                    }
                    Err(_) if self.sh.switch.is_off() => false,
                    Err(e) => return Err(format!("readdir failed with the power on: {e}")),
                }
            }
        };
        Ok(if done { Outcome::Ok } else { Outcome::Cut })
    }

    fn recent(&self) -> String {
        let from = self.ops.len().saturating_sub(8);
        let mut s = String::from("the lane's last operations:\n");
        for o in &self.ops[from..] {
            s.push_str(&format!("  {}\n", o.what));
        }
        s
    }
}

/// True while a scan (scrub or resilver) runs.
fn scanning(pool: &Pool) -> bool {
    pool.status()
        .scan
        .is_some_and(|s| s.state == tarn_pool::status::ScanState::Scanning)
}

/// The committing thread of a burst: pool syncs (and perhaps a scrub
/// start) until `lanes_done`; returns the start ticks of the syncs that
/// were acknowledged.
pub fn run_syncer(
    sh: &Shared<'_>,
    mut rng: Rng,
    lanes_done: &std::sync::atomic::AtomicBool,
    scrub: bool,
) -> Result<Vec<u64>, String> {
    let mut acks = Vec::new();
    let mut scrubbed = !scrub;
    while !lanes_done.load(Ordering::Acquire) {
        std::thread::sleep(std::time::Duration::from_micros(rng.below(3000)));
        if !scrubbed && rng.chance(0.3) {
            scrubbed = true;
            match sh.pool.scrub(tarn_pool::ScanAction::Start) {
                Ok(_) => {}
                Err(_) if sh.switch.is_off() => return Ok(acks),
                // The pool may have started a resilver on its own (after
                // write faults): a scan is running, which is what we wanted.
                Err(_) if scanning(sh.pool) => {}
                Err(e) => return Err(format!("scrub start failed with the power on: {e}")),
            }
            continue;
        }
        let start = sh.tick();
        match sh.pool.sync() {
            Ok(_) => acks.push(start),
            Err(_) if sh.switch.is_off() => return Ok(acks),
            Err(e) => return Err(format!("a pool sync failed with the power on: {e}")),
        }
    }
    Ok(acks)
}
