//! A deterministic, seeded simulation of the whole engine (pool + dataset +
//! POSIX layer in one process) under random workloads, device faults within
//! the pool's redundancy, and power cuts at random points *inside* the
//! engine's I/O. It checks the contract of docs/design.md after every cut:
//! "Always consistent on disk" and "Synchronous means durable".
//!
//! # What one seed does
//!
//! A `u64` seed decides everything: the layout (raidz1 of 4 files, or a
//! mirror of 2), the sector size, the dataset's record size (4K..128K, and
//! changes of it mid-run, so files of several record sizes and multi-record
//! files coexist), compression, atime, cache and scan-batch sizes, at most
//! ONE faulty device (bit flips or errors on reads; dropped, torn or failed
//! writes; never more devices than the redundancy covers), the workload,
//! where each power cut falls and how much of the volatile disk caches it
//! loses. Then 3 to 6 rounds, each:
//!
//! 1. a few hundred random operations through `tarn_fs::Fs` on
//!    `tarn_fs::DatasetBackend`: create (also `O_TRUNC` over an existing
//!    file), writes at random offsets (inside, appending, or past EOF
//!    leaving holes; random, compressible or all-zero bytes), truncates
//!    (grow and shrink), renames (also over an existing file, and of
//!    directories), unlink, mkdir/rmdir, opens held across unlinks
//!    (orphans), fsync, `Pool::sync` (a txg boundary), `sync=always` /
//!    `standard` and `recordsize` changes, listings, and read-backs that
//!    must equal the model exactly. At most 12 names: 10 files (up to
//!    300 KiB each) and 2 directories. About one operation in fifty is a
//!    concurrent burst instead (below). No real time is involved: the pool's
//!    syncer interval is a day, so a txg commits only when the workload
//!    says so (`Pool::sync`, fsync, any change under `sync=always`);
//! 2. a power cut (below);
//! 3. import from the same files, then the checks (below);
//! 4. the model resets to the recovered state and the next round goes on
//!    on the recovered pool.
//!
//! After the last round the pool is exported cleanly and imported once more
//! by another owner: then nothing may be missing at all.
//!
//! # How the cut is placed
//!
//! Every device the pool opens is a `FaultLeaf` (the pool opens devices
//! through `tarn_vdev::open_device`; `fault::set_open_hook` arms each new
//! leaf before its first I/O, so a faulty device misbehaves during import
//! too). All leaves share one `fault::PowerSwitch`: a budget of writes that
//! may still land. Each round picks an operation and a number of writes
//! into the I/O of the first operation from there on that does any (a
//! sync, an fsync, a change under `sync=always`, a self-heal of a bad
//! read), drawn over the writes such operations have done so far, so cuts
//! fall anywhere: among data blocks, tree nodes, space maps, between the
//! two flushes, in the middle of the uberblock ring. Once the budget is
//! spent every write and flush on every device fails (an "eager" switch
//! also fails the flush right after the last write, a "lazy" one only from
//! the next write on), so nothing after the cut lands. Some rounds are cut
//! between two operations instead. The harness then calls
//! `FaultLeaf::power_cut(p)` on every device: each write since that
//! device's last flush is undone with probability `p` (0, 1/4, 1/2 or 1),
//! the way a disk loses its volatile cache. Faults of writes are cleared at
//! the cut (the damage they did stays) and armed again after the checks.
//!
//! The old pool must let go of its devices without committing anything:
//! dropping every handle is not enough (its syncer thread holds a strong
//! reference while it sleeps for `sync_interval`, a day here, so the pool's
//! `Drop` never runs and the device locks stay taken), so the harness calls
//! `Pool::export` with the power already off. Every write and flush fails,
//! so export lands nothing; it only stops the threads and drops the locks.
//!
//! # Concurrent bursts
//!
//! A burst (module `burst`) runs two or three threads at once, each doing
//! 8 to 24 random operations (create, write, truncate, rename, unlink,
//! fsync, reads and listings checked against its model) in a directory of
//! its own, `c0`..`c2`, while another thread commits txgs back to back and
//! sometimes starts a scrub. It begins with an acknowledged `Pool::sync`
//! and ends with one. Three cuts in ten fall inside a burst: the switch is
//! armed once its threads are about to start, with a budget drawn over the
//! writes bursts did so far. After such a cut the prefix rule below cannot
//! apply (concurrent operations have no one order); the burst's own oracle
//! checks that the recovered lanes form a consistent cut of real time that
//! keeps every acknowledged operation, and that nothing outside the lanes
//! changed (see that module's comment).
//!
//! # What is checked, and why the prefix rule is the right oracle
//!
//! The engine commits transactions in order, one txg at a time, and each
//! POSIX operation is one transaction that lands in one txg; the pool on
//! disk is always exactly one committed txg. So whatever instant the power
//! fails at, the recovered namespace is the model's state after SOME
//! operation i: a prefix of the operation sequence. It must also be at least
//! as long as the last acknowledged synchronous operation: an fsync, a
//! `Pool::sync` that returned Ok, or any change that returned Ok while the
//! dataset had `sync=always`. The model therefore keeps the whole-namespace
//! state (path -> file bytes or directory) after every operation since the
//! last such acknowledgement (the "floor"), and the recovered state must
//! equal one of them. An operation that failed because of the cut may or
//! may not have happened: its state is kept too, and it is the last one.
//! This is strictly stronger than checking files one by one: the state must
//! be one consistent instant for every file and directory at once. (An
//! intent log that makes an fsync durable for one file only, without the
//! operations before it on other files, would break the prefix property by
//! design; the oracle would then have to become per file.)
//!
//! After each cut:
//! 1. the pool imports (`Pool::import`; on odd rounds a different owner
//!    takes over, which must be refused without `force` and accepted with
//!    it: the pool was never exported);
//! 2. every file and the directory listing equal one model state at or
//!    after the floor (read with a faulty device still misbehaving, so
//!    redundancy has to serve the reads); a state before the floor means an
//!    acknowledged synchronous operation was lost, and is reported as such,
//!    naming the operation that acknowledged it;
//! 3. a scrub runs to completion with no unrecoverable block, the pool's
//!    damage list is empty, `Pool::leak_check` finds no leaked or doubly
//!    allocated space; then the fault is cleared and a second scrub must
//!    find nothing to repair, and the files must still read the same;
//! 4. when import started a resilver and every block a device missed is
//!    on record (no fault, or failed writes), the first scrub must find
//!    nothing to repair. (It found a real bug: a resilver started by import
//!    ran before the dataset layer attached, skipped every dataset block
//!    and still cleared the dirty time logs; scans now wait for it.)
//!
//! # Determinism and replay
//!
//! One seed drives the workload, the fault, the cut points and the cache
//! losses. The file system runs on a fixed clock (`SimBackend`, through the
//! `Store::now` seam), writes reach the devices in one order (`sync_threads`
//! is 1; flushes, which the pool issues in parallel, do not spend the
//! budget), every device's fault generator is reseeded from the seed at
//! each operation, a scan started by import finishes before anything else
//! reads, and background commits after scans are waited for. So a seed
//! replays the same operations and cuts at the same place, except inside
//! concurrent bursts: there the threads' timing decides which operation
//! lands in which txg, so a round with a burst replays its operations but
//! not necessarily its writes and cut, and after a cut inside a burst the
//! recovered state, and so every later round, may differ. What the engine
//! takes from the system (pool and dataset GUIDs, scan rates and times in
//! the pool's state) can change a metadata block by a few bytes and so,
//! rarely, the number of device writes; the trace printed per seed shows
//! whether two runs took the same path.
//!
//! * default (CI): 32 fixed seeds plus 8 random ones, printed: 15-35 s in a
//!   debug build on two busy cores (about 24 000 operations, 180 cuts);
//! * `TARN_SIM_SEEDS=N`: N random seeds (a soak), printed;
//! * `TARN_SIM_SEED=0x...`: exactly that seed;
//! * `TARN_SIM_JOBS=N`: seeds run on N threads (default: up to 2);
//! * `TARN_SIM_VERBOSE=1`: a line per round (operations, writes, the cut).
//!
//! A failure prints one line that replays it, e.g.
//! `TARN_SIM_SEED=0x1234abcd cargo test -p tarn-fs --test sim -- --nocapture`.

#[path = "sim/burst.rs"]
mod burst;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tarn_fs::{Backend, Cred, DatasetBackend, FileKind, Fs, FsError, SetAttr, Store, ROOT_INO};
use tarn_pool::status::{Health, ScanKind, ScanState, ScanStatus};
use tarn_pool::{Pool, PoolError, PoolOptions, ScanAction, VdevSpec};
use tarn_testkit::data::{env_seed, random_seed, Rng};
use tarn_testkit::stores::{snapshots_wrapped, tick, Tap};
use tarn_vdev::fault::{set_open_hook, OpenHook, PowerSwitch};
use tarn_vdev::{Fault, FaultKind, FaultLeaf, VdevKind};

const POOL: &str = "tank";
const DS: &str = "tank/fs";
/// Largest file the workload makes.
const MAX_FILE: usize = 300 * 1024;
/// Most files alive at once (plus at most 2 directories).
const MAX_FILES: usize = 10;
const FILE_NAMES: [&str; 8] = ["f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7"];
const DIR_NAMES: [&str; 2] = ["d0", "d1"];
const RECORD_SIZES: [u64; 6] = [4096, 8192, 16384, 32768, 65536, 131072];
/// Fixed seeds of the default run are derived from this.
const BASE_SEED: u64 = 0x7a51_d000_0000_0000;
const FIXED_SEEDS: u64 = 32;
const RANDOM_SEEDS: u64 = 8;

// ----- the model ----------------------------------------------------------

/// One name in the namespace: a directory or a regular file's bytes.
#[derive(Clone, PartialEq, Eq)]
enum Node {
    Dir,
    File(Arc<Vec<u8>>),
}

/// A whole namespace: path ("f0", "d0", "d0/f1") -> node.
type Ns = BTreeMap<String, Node>;

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn show(n: &Node) -> String {
    match n {
        Node::Dir => "a directory".into(),
        Node::File(b) => format!("a file of {} bytes (fnv {:016x})", b.len(), fnv(b)),
    }
}

/// What differs between the model's `want` and the engine's `got`.
fn diff_ns(want: &Ns, got: &Ns) -> Vec<String> {
    let mut out = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => out.push(format!("{p}: missing (model: {})", show(w))),
            Some(g) if g != w => {
                let at = match (w, g) {
                    (Node::File(a), Node::File(b)) => {
                        let first = a.iter().zip(b.iter()).position(|(x, y)| x != y);
                        match first {
                            Some(i) => format!(", first difference at byte {i}"),
                            None => ", one is a prefix of the other".into(),
                        }
                    }
                    _ => String::new(),
                };
                out.push(format!("{p}: {} (model: {}){at}", show(g), show(w)));
            }
            Some(_) => {}
        }
    }
    for (p, g) in got {
        if !want.contains_key(p) {
            out.push(format!("{p}: unexpected {}", show(g)));
        }
    }
    out
}

/// The model: every namespace state since the last acknowledged sync.
struct History {
    /// `states[i]`: the namespace after the i-th change of this round
    /// (`states[0]`: as recovered at the start of the round).
    states: Vec<Ns>,
    /// What produced each state, for failure reports.
    what: Vec<String>,
    /// Index of the state the last acknowledged synchronous operation
    /// made durable: recovery must land at or after it.
    floor: usize,
    /// That operation.
    floor_by: String,
}

impl History {
    fn new(ns: Ns, what: String) -> History {
        History {
            states: vec![ns],
            what: vec![what.clone()],
            floor: 0,
            floor_by: what,
        }
    }

    fn cur(&self) -> &Ns {
        self.states.last().expect("history is never empty")
    }

    fn push(&mut self, ns: Ns, what: String) {
        self.states.push(ns);
        self.what.push(what);
    }

    fn ack(&mut self, by: &str) {
        self.floor = self.states.len() - 1;
        self.floor_by = by.to_string();
    }

    /// The sequential workload's files (not those of a burst's lanes).
    fn files(&self) -> Vec<String> {
        self.cur()
            .iter()
            .filter(|(p, n)| matches!(n, Node::File(_)) && !burst::in_lane(p))
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// The sequential workload's directories.
    fn dirs(&self) -> Vec<String> {
        self.cur()
            .iter()
            .filter(|(p, n)| matches!(n, Node::Dir) && !burst::in_lane(p))
            .map(|(p, _)| p.clone())
            .collect()
    }

    fn bytes(&self, path: &str) -> Arc<Vec<u8>> {
        match self.cur().get(path) {
            Some(Node::File(b)) => b.clone(),
            _ => Arc::new(Vec::new()),
        }
    }
}

// ----- a fixed clock ---------------------------------------------------------

/// `DatasetBackend` on the simulation's clock: every call passes straight
/// through, except that `Store::now` (the seam tarn-fs keeps for tests)
/// reads a counter that advances 1 ms per call, so inode times, relatime
/// decisions and the sizes of the tree nodes holding them are the same on
/// every run of a seed.
struct SimBackend {
    inner: DatasetBackend,
    clock: Arc<AtomicU64>,
}

impl Backend for SimBackend {
    fn txn<R>(
        &self,
        write: bool,
        f: &mut dyn FnMut(&mut dyn Store) -> Result<R, FsError>,
    ) -> Result<R, FsError> {
        let clock = || tick(&self.clock, 1_000_000);
        self.inner
            .txn(write, &mut |s| f(&mut Tap::new(s).clock(&clock)))
    }

    fn sync(&self) -> Result<(), FsError> {
        self.inner.sync()
    }

    fn snapshots(&self) -> Result<Vec<(String, Arc<Self>)>, FsError> {
        snapshots_wrapped(&self.inner, |b| {
            let inner = (*b).clone();
            let clock = self.clock.clone();
            Arc::new(SimBackend { inner, clock })
        })
    }
}

// ----- the rig: device files, faults, power ------------------------------

/// What the open hook does to each new leaf of one device.
struct Arming {
    fault: Option<Fault>,
    seed: u64,
    opens: u64,
}

/// The device files of one seed and what arms them.
struct Rig {
    _dir: tempfile::TempDir,
    paths: Vec<PathBuf>,
    switch: Arc<PowerSwitch>,
    arming: Vec<Arc<Mutex<Arming>>>,
    /// The file system's clock, in nanoseconds (see [`SimBackend`]).
    clock: Arc<AtomicU64>,
}

impl Rig {
    fn new(n: usize, seed: u64) -> Rig {
        let dir = tempfile::tempdir().expect("temporary directory for the device files");
        let switch = PowerSwitch::new();
        let paths = tarn_testkit::files::make(dir.path(), "dev", n, tarn_vdev::MIN_LEAF_SIZE);
        let mut arming = Vec::new();
        for (i, p) in paths.iter().enumerate() {
            let a = Arc::new(Mutex::new(Arming {
                fault: None,
                seed: seed ^ (i as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F),
                opens: 0,
            }));
            let (a2, sw) = (a.clone(), switch.clone());
            let hook: OpenHook = Arc::new(move |leaf: &FaultLeaf| {
                let mut a = a2.lock().unwrap_or_else(|e| e.into_inner());
                a.opens += 1;
                leaf.seed(a.seed ^ a.opens.wrapping_mul(0xE703_7ED1_A0B4_28DB));
                if let Some(f) = &a.fault {
                    leaf.inject(f.clone());
                }
                leaf.attach_switch(Some(sw.clone()));
                leaf.track_unflushed(true);
            });
            set_open_hook(p, Some(hook));
            arming.push(a);
        }
        Rig {
            _dir: dir,
            paths,
            switch,
            arming,
            clock: Arc::new(AtomicU64::new(1_700_000_000 * 1_000_000_000)),
        }
    }

    /// Arms device `dev` with `fault` (or disarms every device), on the
    /// live leaves and on every leaf opened from now on.
    fn set_fault(&self, fault: Option<(usize, Fault)>, leaves: &[Arc<FaultLeaf>]) {
        for (i, a) in self.arming.iter().enumerate() {
            let f = fault
                .as_ref()
                .filter(|(d, _)| *d == i)
                .map(|(_, f)| f.clone());
            if let Some(l) = leaves.get(i) {
                l.clear();
                if let Some(f) = &f {
                    l.inject(f.clone());
                }
            }
            a.lock().unwrap_or_else(|e| e.into_inner()).fault = f;
        }
    }

    /// Reseeds every device's fault generator from the seed and `salt`
    /// (the round and operation), so a difference of a few device I/Os in
    /// one operation cannot shift the fault decisions of all later ones.
    fn reseed(&self, leaves: &[Arc<FaultLeaf>], salt: u64) {
        for (i, (a, l)) in self.arming.iter().zip(leaves).enumerate() {
            let base = a.lock().unwrap_or_else(|e| e.into_inner()).seed;
            let mut r = Rng::new(base ^ salt.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ i as u64);
            l.seed(r.next_u64());
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for p in &self.paths {
            set_open_hook(p, None);
        }
    }
}

// ----- the engine -----------------------------------------------------------

/// One imported pool with the dataset mounted.
struct Engine {
    pool: Arc<Pool>,
    fs: Fs<SimBackend>,
    leaves: Vec<Arc<FaultLeaf>>,
}

/// Everything drawn from the seed before the first operation.
#[derive(Debug)]
struct Plan {
    mirror: bool,
    ashift: u8,
    recordsize: u64,
    compression: &'static str,
    atime: bool,
    sync_always: bool,
    node_cache: usize,
    scan_batch: usize,
    fault: Option<(usize, FaultKind, f64)>,
    rounds: usize,
}

impl Plan {
    fn draw(r: &mut Rng) -> Plan {
        let mirror = r.chance(0.3);
        let width = if mirror { 2 } else { 4 };
        let fault = if r.chance(0.75) {
            let kind = *r.pick(&[
                FaultKind::Bitflip,
                FaultKind::ReadError,
                FaultKind::DropWrite,
                FaultKind::TornWrite,
                FaultKind::WriteError,
            ]);
            let p = match kind {
                FaultKind::Bitflip | FaultKind::ReadError => *r.pick(&[0.02, 0.05, 0.15]),
                FaultKind::WriteError => *r.pick(&[0.02, 0.1, 0.5]),
                _ => *r.pick(&[0.005, 0.01, 0.03]),
            };
            Some((r.below(width) as usize, kind, p))
        } else {
            None
        };
        Plan {
            mirror,
            ashift: *r.pick(&[9, 12, 12]),
            recordsize: *r.pick(&RECORD_SIZES),
            compression: ["lz4", "lz4", "off", "zstd"][r.below(4) as usize],
            atime: r.chance(0.5),
            sync_always: r.chance(0.2),
            node_cache: *r.pick(&[128 << 10, 1 << 20, 64 << 20]),
            scan_batch: *r.pick(&[16, 256, 16384]),
            fault,
            rounds: r.range(3, 7) as usize,
        }
    }

    fn width(&self) -> usize {
        if self.mirror {
            2
        } else {
            4
        }
    }

    fn fault(&self) -> Option<(usize, Fault)> {
        self.fault.map(|(dev, kind, p)| {
            let mut f = Fault::always(kind);
            f.probability = p;
            (dev, f)
        })
    }

    /// Faults of writes: cleared at each cut (the damage they did stays)
    /// and armed again when the checks are done, so the repairs of import,
    /// resilver and scrub stick.
    fn write_fault(&self) -> bool {
        matches!(
            self.fault,
            Some((
                _,
                FaultKind::DropWrite | FaultKind::TornWrite | FaultKind::WriteError,
                _
            ))
        )
    }

    /// Whether every block the devices miss is on record (no fault, or
    /// failed writes, which the pool notes in its dirty time logs): then a
    /// finished resilver must leave nothing for a scrub to repair.
    fn misses_on_record(&self) -> bool {
        matches!(self.fault, None | Some((_, FaultKind::WriteError, _)))
    }
}

fn options(plan: &Plan, owner: &str) -> PoolOptions {
    PoolOptions {
        sync_interval: Duration::from_secs(24 * 3600),
        dirty_max_bytes: 1 << 30,
        dirty_sync_bytes: 1 << 30,
        cache: Some(std::sync::Arc::new(tarn_block::BlockCache::new(
            plan.node_cache,
        ))),
        scan_batch_blocks: plan.scan_batch,
        owner: owner.to_string(),
        sync_threads: 1,
        discard_log: false,
        // Small chunks: the crashes and imports here go through space
        // maps written in several blocks too.
        space_chunk_bytes: 16 << 10,
    }
}

/// What one seed did, for the summary line.
#[derive(Default)]
struct Stats {
    ops: usize,
    cuts_in_io: usize,
    cuts_between_ops: usize,
    failed_at_cut: usize,
    acks: usize,
    writes: u64,
    undone: usize,
    /// Recovered exactly the last state / an earlier one at or after the floor.
    recovered_last: usize,
    recovered_earlier: usize,
    faults_hit: u64,
    repaired: u64,
    /// Scans (resilvers) import started.
    import_scans: usize,
    /// Concurrent bursts, their operations, and cuts that fell inside one.
    bursts: usize,
    burst_ops: usize,
    cuts_in_bursts: usize,
    /// A hash of what each round did (operations, writes, where the cut
    /// fell, which state was recovered): equal for two runs of one seed.
    trace: u64,
}

impl Stats {
    fn mix(&mut self, x: u64) {
        self.trace = (self.trace ^ x)
            .wrapping_mul(0x100_0000_01b3)
            .rotate_left(17);
    }
}

/// How an operation ended.
enum Step {
    Go,
    /// The power is off: the round ends.
    Cut,
}

/// One seed's simulation.
struct Sim {
    seed: u64,
    plan: Plan,
    rig: Rig,
    work: Rng,
    cuts: Rng,
    round: usize,
    op: usize,
    hist: History,
    sync_always: bool,
    /// Inodes held open (unlinking them leaves orphans).
    open: Vec<u64>,
    owner: String,
    /// Writes of the operations that did I/O so far, to spread the cut
    /// over an operation's writes.
    io_writes: u64,
    io_ops: u64,
    /// The scan record after the last check, to notice scans import starts.
    last_scan: Option<ScanStatus>,
    /// The burst the power failed in, if it did: the recovered state is
    /// checked against its record instead of the history.
    burst: Option<burst::Burst>,
    /// The cut is to fall inside the next operation, a burst (eager or not).
    cut_in_burst: Option<bool>,
    /// Writes of the bursts so far, to spread such a cut over a burst.
    burst_writes: u64,
    stats: Stats,
    cred: Cred,
}

impl Sim {
    fn ctx(&self) -> String {
        format!("seed {:#x} round {} op {}", self.seed, self.round, self.op)
    }

    fn switch(&self) -> &PowerSwitch {
        &self.rig.switch
    }

    // ----- engine set-up -------------------------------------------------

    fn create(seed: u64) -> (Sim, Engine) {
        let mut top = Rng::new(seed);
        let mut pr = top.fork();
        let plan = Plan::draw(&mut pr);
        let rig = Rig::new(plan.width(), seed);
        let owner = format!("sim-{seed:x}");
        let spec = VdevSpec {
            kind: if plan.mirror {
                VdevKind::Mirror
            } else {
                VdevKind::Raidz { parity: 1 }
            },
            devices: rig.paths.clone(),
        };
        let ctx = format!("seed {seed:#x} set-up");
        let pool = Pool::create(
            POOL,
            &[spec],
            plan.ashift,
            &BTreeMap::new(),
            false,
            options(&plan, &owner),
        )
        .unwrap_or_else(|e| panic!("{ctx}: create the pool: {e}"));
        tarn_dataset::attach(&pool).unwrap_or_else(|e| panic!("{ctx}: attach: {e}"));
        let props = BTreeMap::from([
            ("recordsize".to_string(), plan.recordsize.to_string()),
            ("compression".to_string(), plan.compression.to_string()),
            (
                "atime".to_string(),
                if plan.atime { "on" } else { "off" }.to_string(),
            ),
            (
                "sync".to_string(),
                if plan.sync_always {
                    "always"
                } else {
                    "standard"
                }
                .to_string(),
            ),
        ]);
        tarn_dataset::create(&pool, DS, &props, false)
            .unwrap_or_else(|e| panic!("{ctx}: create {DS}: {e}"));
        let engine = Self::mount(&rig, pool, &ctx);
        rig.set_fault(plan.fault(), &engine.leaves);
        engine
            .pool
            .sync()
            .unwrap_or_else(|e| panic!("{ctx}: first sync: {e}"));
        let sim = Sim {
            seed,
            sync_always: plan.sync_always,
            plan,
            rig,
            work: top.fork(),
            cuts: top.fork(),
            round: 0,
            op: 0,
            hist: History::new(Ns::new(), "empty file system".into()),
            open: Vec::new(),
            owner,
            io_writes: 0,
            io_ops: 0,
            last_scan: None,
            burst: None,
            cut_in_burst: None,
            burst_writes: 0,
            stats: Stats::default(),
            cred: Cred::root(),
        };
        (sim, engine)
    }

    /// Attaches the dataset layer and mounts the file system.
    fn mount(rig: &Rig, pool: Arc<Pool>, ctx: &str) -> Engine {
        let leaves = rig
            .paths
            .iter()
            .map(|p| {
                tarn_vdev::find_device(p)
                    .unwrap_or_else(|| panic!("{ctx}: the pool did not open {}", p.display()))
            })
            .collect();
        tarn_dataset::attach(&pool).unwrap_or_else(|e| panic!("{ctx}: attach: {e}"));
        let h = tarn_dataset::open(&pool, DS).unwrap_or_else(|e| panic!("{ctx}: open {DS}: {e}"));
        let backend = SimBackend {
            inner: DatasetBackend::new(h),
            clock: rig.clock.clone(),
        };
        let fs = Fs::mount(Arc::new(backend)).unwrap_or_else(|e| panic!("{ctx}: mount {DS}: {e}"));
        Engine { pool, fs, leaves }
    }

    // ----- running a round -------------------------------------------------

    fn run(mut self, mut e: Engine) -> Stats {
        for round in 0..self.plan.rounds {
            self.round = round;
            self.op = 0;
            let n_ops = self.cuts.range(200, 500) as usize;
            let stop_at = self.cuts.range(n_ops as u64 / 3, n_ops as u64 + 1) as usize;
            // Where the cut falls: `writes` writes into the first operation
            // at or after `cut_op` that does I/O (a sync, an fsync, any
            // change under sync=always, a self-heal), drawn over the writes
            // such an operation did so far. Placing it relative to an
            // operation, not to the round's first write, keeps a replay
            // cutting at the same instant even if an earlier operation did
            // a write more or less. No cut_op: cut between two operations.
            let per_io_op = if self.io_ops == 0 {
                40
            } else {
                self.io_writes.div_ceil(self.io_ops)
            };
            let cut_op = self
                .cuts
                .chance(0.85)
                .then(|| self.cuts.below(stop_at as u64) as usize);
            let writes = self.cuts.below(per_io_op + per_io_op / 4 + 1);
            let eager = self.cuts.chance(0.5);
            self.switch().unlimited();
            let w0 = self.switch().landed();
            let mut cut = false;
            self.cut_in_burst = None;
            while self.op < stop_at {
                if cut_op == Some(self.op) {
                    if self.cuts.chance(0.3) {
                        // The cut falls inside a concurrent burst, which
                        // arms the switch once its lanes are about to start.
                        self.cut_in_burst = Some(eager);
                    } else {
                        self.switch().arm(writes, eager);
                    }
                }
                self.rig
                    .reseed(&e.leaves, ((round as u64) << 32) | self.op as u64);
                let before = self.switch().landed();
                let step = self.step(&e);
                let did = self.switch().landed() - before;
                if did > 0 {
                    self.io_ops += 1;
                    self.io_writes += did;
                }
                self.op += 1;
                self.stats.ops += 1;
                if let Step::Cut = step {
                    cut = true;
                    break;
                }
            }
            let landed = self.switch().landed() - w0;
            self.stats.mix(self.op as u64);
            self.stats.mix(landed);
            self.stats.mix(self.hist.states.len() as u64);
            if verbose() {
                eprintln!(
                    "sim: seed {:#x} round {round}: {} ops, {landed} writes, {} (planned: \
                     {writes} writes into op {cut_op:?}, {}), {} states, floor {}",
                    self.seed,
                    self.op,
                    if cut { "cut in I/O" } else { "cut between ops" },
                    if eager { "eager" } else { "lazy" },
                    self.hist.states.len(),
                    self.hist.floor
                );
            }
            self.stats.writes += landed;
            if cut {
                self.stats.cuts_in_io += 1;
            } else {
                self.stats.cuts_between_ops += 1;
            }
            e = self.cut_and_recover(e);
        }
        self.finish(e);
        self.stats
    }

    /// Handles the result of one engine call. Ok: the change (if any) is
    /// the new state, and `acks` makes it the floor. An error with the power
    /// off: the change may or may not have happened; its state is kept and
    /// the round ends. An error with the power on is a failure.
    fn settle<T, E: std::fmt::Display>(
        &mut self,
        what: String,
        r: Result<T, E>,
        next: Option<Ns>,
        acks: bool,
    ) -> Option<T> {
        match r {
            Ok(v) => {
                if acks {
                    self.stats.acks += 1;
                }
                match next {
                    Some(ns) => {
                        self.hist.push(ns, what.clone());
                        if acks {
                            self.hist.ack(&what);
                        }
                    }
                    None if acks => self.hist.ack(&what),
                    None => {}
                }
                Some(v)
            }
            Err(err) if self.switch().is_off() => {
                if let Some(ns) = next {
                    self.hist
                        .push(ns, format!("{what} [failed at the cut: {err}]"));
                }
                self.stats.failed_at_cut += 1;
                None
            }
            Err(err) => panic!(
                "{}: {what} failed with the power on: {err}\n{}",
                self.ctx(),
                self.recent_ops(8)
            ),
        }
    }

    fn recent_ops(&self, n: usize) -> String {
        let from = self.hist.what.len().saturating_sub(n);
        let mut s = String::from("last operations of this round:\n");
        for (i, w) in self.hist.what.iter().enumerate().skip(from) {
            s.push_str(&format!("  state {i}: {w}\n"));
        }
        s
    }

    /// The inode of a path the model has (`None`: the power went off and
    /// the pool refuses even lookups now).
    fn ino_of(&mut self, e: &Engine, path: &str) -> Option<u64> {
        let mut ino = ROOT_INO;
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            let r = e.fs.lookup(ino, comp.as_bytes(), &self.cred);
            ino = self
                .settle(format!("#{} lookup {path}", self.op), r, None, false)?
                .ino;
        }
        Some(ino)
    }

    /// One random operation.
    fn step(&mut self, e: &Engine) -> Step {
        let k = self.work.below(100);
        let files = self.hist.files();
        let done = if self.work.chance(0.02) || self.cut_in_burst.is_some() {
            self.op_burst(e)
        } else {
            match k {
                0..=8 => self.op_create(e, false),
                9..=10 => self.op_create(e, true),
                11..=39 => self.op_write(e, &files),
                40..=46 => self.op_truncate(e, &files),
                47..=53 => self.op_rename_file(e, &files),
                54 => self.op_rename_dir(e),
                55..=60 => self.op_unlink(e, &files),
                61..=62 => self.op_mkdir(e),
                63..=64 => self.op_rmdir(e),
                65..=68 => self.op_fsync(e, &files),
                69..=71 => self.op_pool_sync(e),
                72..=74 => self.op_set_sync(e),
                75 => self.op_set_recordsize(e),
                76..=89 => self.op_read(e, &files),
                90..=92 => self.op_list(e),
                93..=95 => self.op_open(e, &files),
                _ => self.op_close(e),
            }
        };
        if !done {
            // Not applicable now (no file yet, ...): make a file.
            if !self.op_create(e, false) {
                self.op_pool_sync(e);
            }
        }
        if self.switch().is_off() {
            Step::Cut
        } else {
            Step::Go
        }
    }

    /// A concurrent burst (see the `burst` module): two or three lanes,
    /// each in a directory of its own, change the file system at once
    /// while another thread commits txgs and perhaps starts a scrub.
    fn op_burst(&mut self, e: &Engine) -> bool {
        let n_lanes = self.work.range(2, 4) as usize;
        let always = self.sync_always;
        for d in &burst::DIRS[..n_lanes] {
            if !self.hist.cur().contains_key(*d) {
                let r = e.fs.mkdir(ROOT_INO, d.as_bytes(), 0o755, 0o022, &self.cred);
                let mut next = self.hist.cur().clone();
                next.insert(d.to_string(), Node::Dir);
                let what = format!("#{} mkdir {d}", self.op);
                if self.settle(what, r, Some(next), always).is_none() {
                    return true;
                }
            }
        }
        // Everything before the burst is acknowledged: outside the lanes,
        // nothing may change.
        let r = e.pool.sync();
        let what = format!("#{} pool sync before a burst", self.op);
        if self.settle(what, r, None, true).is_none() {
            return true;
        }
        let base = self.hist.cur().clone();
        let mut lanes_in = Vec::new();
        for d in &burst::DIRS[..n_lanes] {
            let Some(ino) = self.ino_of(e, d) else {
                return true;
            };
            let prefix = format!("{d}/");
            let before = base
                .iter()
                .filter_map(|(p, n)| match (p.strip_prefix(&prefix), n) {
                    (Some(name), Node::File(b)) => Some((name.to_string(), b.clone())),
                    _ => None,
                })
                .collect();
            let n = self.work.range(8, 25) as usize;
            lanes_in.push((*d, ino, before, self.work.fork(), n));
        }
        let scrub = self.work.chance(0.25);
        let syncer_rng = self.work.fork();
        let w0 = self.switch().landed();
        if let Some(eager) = self.cut_in_burst.take() {
            let per_burst = if self.stats.bursts == 0 {
                200
            } else {
                self.burst_writes / self.stats.bursts as u64
            };
            let writes = self.cuts.below(per_burst + per_burst / 4 + 1);
            self.switch().arm(writes, eager);
        }
        let ticks = AtomicU64::new(0);
        let lanes_done = AtomicBool::new(false);
        let sh = burst::Shared {
            fs: &e.fs,
            pool: &e.pool,
            switch: self.switch(),
            ticks: &ticks,
            sync_always: always,
        };
        let (lanes, syncs) = std::thread::scope(|s| {
            let syncer = s.spawn(|| burst::run_syncer(&sh, syncer_rng, &lanes_done, scrub));
            let handles: Vec<_> = lanes_in
                .into_iter()
                .map(|(d, ino, before, rng, n)| {
                    let sh = &sh;
                    s.spawn(move || burst::run_lane(sh, rng, d, ino, before, n))
                })
                .collect();
            let lanes: Vec<Result<burst::Lane, String>> = handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("a lane panicked".into())))
                .collect();
            lanes_done.store(true, Ordering::Release);
            let syncs = syncer
                .join()
                .unwrap_or_else(|_| Err("the committing thread panicked".into()));
            (lanes, syncs)
        });
        let ctx = self.ctx();
        let syncs = syncs.unwrap_or_else(|err| panic!("{ctx}: in a burst: {err}"));
        let lanes = lanes
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .unwrap_or_else(|err| panic!("{ctx}: in a burst: {err}"));
        let b = burst::Burst { base, lanes, syncs };
        self.burst_writes += self.switch().landed() - w0;
        self.stats.bursts += 1;
        self.stats.burst_ops += b.ops();
        self.stats.mix(b.ops() as u64);
        if self.switch().is_off() {
            self.burst = Some(b);
            return true;
        }
        let what = format!(
            "#{} burst of {} operations in {n_lanes} lanes",
            self.op,
            b.ops()
        );
        match e.pool.sync() {
            Ok(_) => {
                self.stats.acks += 1;
                self.hist.push(b.merged(), what.clone());
                self.hist.ack(&what);
            }
            Err(_) if self.switch().is_off() => {
                self.burst = Some(b);
                return true;
            }
            Err(err) => panic!("{ctx}: the sync after a burst failed with the power on: {err}"),
        }
        if scrub {
            quiesce(&e.pool);
            self.last_scan = e.pool.status().scan;
        }
        true
    }

    fn file_count(&self) -> usize {
        self.hist.files().len()
    }

    fn op_create(&mut self, e: &Engine, trunc: bool) -> bool {
        let ns = self.hist.cur().clone();
        let path = if trunc {
            let files = self.hist.files();
            if files.is_empty() {
                return false;
            }
            self.work.pick(&files).clone()
        } else {
            if self.file_count() >= MAX_FILES {
                return false;
            }
            let mut parents = vec![String::new()];
            parents.extend(self.hist.dirs());
            let parent = self.work.pick(&parents).clone();
            let name = *self.work.pick(&FILE_NAMES);
            let p = join(&parent, name);
            if ns.contains_key(&p) {
                return false;
            }
            p
        };
        let (parent, name) = split(&path);
        let Some(pino) = self.ino_of(e, parent) else {
            return true;
        };
        let flags = libc::O_RDWR
            | if trunc {
                libc::O_TRUNC
            } else {
                libc::O_CREAT | libc::O_EXCL
            };
        let r = e.fs.create(
            pino,
            name.as_bytes(),
            libc::S_IFREG | 0o644,
            0o022,
            flags,
            &self.cred,
        );
        let mut next = ns;
        next.insert(path.clone(), Node::File(Arc::new(Vec::new())));
        let what = format!(
            "#{} create {path}{}",
            self.op,
            if trunc { " O_TRUNC" } else { "" }
        );
        let always = self.sync_always;
        if let Some(a) = self.settle(what, r, Some(next), always) {
            assert_eq!(
                a.size,
                0,
                "{}: create of {path} returned size {}",
                self.ctx(),
                a.size
            );
            let r = e.fs.release(a.ino);
            self.settle(format!("#{} release {path}", self.op), r, None, always);
        }
        true
    }

    fn op_write(&mut self, e: &Engine, files: &[String]) -> bool {
        if files.is_empty() {
            return false;
        }
        let path = self.work.pick(files).clone();
        let cur = self.hist.bytes(&path);
        let size = cur.len();
        let w = &mut self.work;
        let mut off = match w.below(5) {
            0 | 1 => w.below(size as u64 + 1) as usize,
            2 => size,
            3 => size + w.range(1, 100 << 10) as usize,
            _ => w.below(MAX_FILE as u64) as usize,
        };
        if off >= MAX_FILE {
            off = w.below(MAX_FILE as u64 - 1) as usize;
        }
        let len = match w.below(10) {
            0 | 1 => w.range(1, 65),
            2..=5 => w.range(1, 8 << 10),
            6..=8 => w.range(1, 64 << 10),
            _ => w.range(64 << 10, 160 << 10),
        } as usize;
        let len = len.min(MAX_FILE - off).max(1);
        let (data, kind) = w.mixed(len);
        let Some(ino) = self.ino_of(e, &path) else {
            return true;
        };
        let r = e.fs.write(ino, off as u64, &data, false, &self.cred);
        let mut bytes = (*cur).clone();
        if bytes.len() < off + len {
            bytes.resize(off + len, 0);
        }
        bytes[off..off + len].copy_from_slice(&data);
        let mut next = self.hist.cur().clone();
        next.insert(path.clone(), Node::File(Arc::new(bytes)));
        let what = format!(
            "#{} write {path} at {off} len {len} ({kind}; size was {size})",
            self.op
        );
        let always = self.sync_always;
        if let Some(n) = self.settle(what, r, Some(next), always) {
            assert_eq!(n, len, "{}: short write to {path}", self.ctx());
        }
        true
    }

    fn op_truncate(&mut self, e: &Engine, files: &[String]) -> bool {
        if files.is_empty() {
            return false;
        }
        let path = self.work.pick(files).clone();
        let cur = self.hist.bytes(&path);
        let size = cur.len();
        let w = &mut self.work;
        let new = match w.below(6) {
            0 => 0,
            1 | 2 => w.below(size as u64 + 1) as usize,
            3 | 4 => size + w.below((MAX_FILE - size.min(MAX_FILE)) as u64 + 1) as usize,
            _ => {
                // A record boundary of the dataset's current record size.
                let rs = *w.pick(&RECORD_SIZES) as usize;
                (w.below((MAX_FILE / rs) as u64 + 1) as usize) * rs
            }
        }
        .min(MAX_FILE);
        let Some(ino) = self.ino_of(e, &path) else {
            return true;
        };
        let sa = SetAttr {
            size: Some(new as u64),
            ..Default::default()
        };
        let r = e.fs.setattr(ino, &sa, &self.cred);
        let mut bytes = (*cur).clone();
        bytes.resize(new, 0);
        let mut next = self.hist.cur().clone();
        next.insert(path.clone(), Node::File(Arc::new(bytes)));
        let what = format!("#{} truncate {path} from {size} to {new}", self.op);
        let always = self.sync_always;
        if let Some(a) = self.settle(what, r, Some(next), always) {
            assert_eq!(
                a.size,
                new as u64,
                "{}: truncate of {path} returned size {}",
                self.ctx(),
                a.size
            );
        }
        true
    }

    fn op_rename_file(&mut self, e: &Engine, files: &[String]) -> bool {
        if files.is_empty() {
            return false;
        }
        let src = self.work.pick(files).clone();
        let mut parents = vec![String::new()];
        parents.extend(self.hist.dirs());
        let parent = self.work.pick(&parents).clone();
        let name = *self.work.pick(&FILE_NAMES);
        let dst = join(&parent, name);
        if dst == src {
            return false;
        }
        let ns = self.hist.cur().clone();
        let over = ns.contains_key(&dst);
        let (sp, sn) = split(&src);
        let (dp, dn) = split(&dst);
        let (Some(spi), Some(dpi)) = (self.ino_of(e, sp), self.ino_of(e, dp)) else {
            return true;
        };
        let r =
            e.fs.rename(spi, sn.as_bytes(), dpi, dn.as_bytes(), 0, &self.cred);
        let mut next = ns;
        let node = next.remove(&src).expect("the source is in the model");
        next.insert(dst.clone(), node);
        let what = format!(
            "#{} rename {src} -> {dst}{}",
            self.op,
            if over { " (replacing it)" } else { "" }
        );
        let always = self.sync_always;
        self.settle(what, r, Some(next), always);
        true
    }

    fn op_rename_dir(&mut self, e: &Engine) -> bool {
        let dirs = self.hist.dirs();
        if dirs.is_empty() {
            return false;
        }
        let src = self.work.pick(&dirs).clone();
        let dst = DIR_NAMES
            .iter()
            .find(|d| **d != src)
            .expect("two directory names")
            .to_string();
        let ns = self.hist.cur().clone();
        let prefix = format!("{dst}/");
        let dst_busy = ns.keys().any(|p| p.starts_with(&prefix));
        if dst_busy {
            return false; // rename over a non-empty directory fails
        }
        let over = ns.contains_key(&dst);
        let r = e.fs.rename(
            ROOT_INO,
            src.as_bytes(),
            ROOT_INO,
            dst.as_bytes(),
            0,
            &self.cred,
        );
        let sprefix = format!("{src}/");
        let mut next = Ns::new();
        for (p, n) in ns {
            if p == src || p == dst {
                continue;
            }
            match p.strip_prefix(&sprefix) {
                Some(rest) => next.insert(format!("{dst}/{rest}"), n),
                None => next.insert(p, n),
            };
        }
        next.insert(dst.clone(), Node::Dir);
        let what = format!(
            "#{} rename directory {src} -> {dst}{}",
            self.op,
            if over { " (replacing it)" } else { "" }
        );
        let always = self.sync_always;
        self.settle(what, r, Some(next), always);
        true
    }

    fn op_unlink(&mut self, e: &Engine, files: &[String]) -> bool {
        if files.is_empty() {
            return false;
        }
        let path = self.work.pick(files).clone();
        let (p, n) = split(&path);
        let Some(pino) = self.ino_of(e, p) else {
            return true;
        };
        let r = e.fs.unlink(pino, n.as_bytes(), &self.cred);
        let mut next = self.hist.cur().clone();
        next.remove(&path);
        let what = format!("#{} unlink {path}", self.op);
        let always = self.sync_always;
        self.settle(what, r, Some(next), always);
        true
    }

    fn op_mkdir(&mut self, e: &Engine) -> bool {
        let ns = self.hist.cur().clone();
        let free: Vec<&str> = DIR_NAMES
            .iter()
            .copied()
            .filter(|d| !ns.contains_key(*d))
            .collect();
        if free.is_empty() {
            return false;
        }
        let d = self.work.pick(&free).to_string();
        let r = e.fs.mkdir(ROOT_INO, d.as_bytes(), 0o755, 0o022, &self.cred);
        let mut next = ns;
        next.insert(d.clone(), Node::Dir);
        let what = format!("#{} mkdir {d}", self.op);
        let always = self.sync_always;
        self.settle(what, r, Some(next), always);
        true
    }

    fn op_rmdir(&mut self, e: &Engine) -> bool {
        let ns = self.hist.cur().clone();
        let empty: Vec<String> = self
            .hist
            .dirs()
            .into_iter()
            .filter(|d| !ns.keys().any(|p| p.starts_with(&format!("{d}/"))))
            .collect();
        if empty.is_empty() {
            return false;
        }
        let d = self.work.pick(&empty).clone();
        let r = e.fs.rmdir(ROOT_INO, d.as_bytes(), &self.cred);
        let mut next = ns;
        next.remove(&d);
        let what = format!("#{} rmdir {d}", self.op);
        let always = self.sync_always;
        self.settle(what, r, Some(next), always);
        true
    }

    fn op_fsync(&mut self, e: &Engine, files: &[String]) -> bool {
        let mut targets = files.to_vec();
        targets.extend(self.hist.dirs());
        targets.push(String::new());
        let path = self.work.pick(&targets).clone();
        let Some(ino) = self.ino_of(e, &path) else {
            return true;
        };
        let r = e.fs.fsync(ino);
        let shown = if path.is_empty() { "/" } else { &path };
        let what = format!("#{} fsync {shown}", self.op);
        self.settle(what, r, None, true);
        true
    }

    fn op_pool_sync(&mut self, e: &Engine) -> bool {
        let r = e.pool.sync();
        self.settle(format!("#{} pool sync", self.op), r, None, true);
        true
    }

    fn op_set_sync(&mut self, e: &Engine) -> bool {
        // Mostly sync=standard: under sync=always every change is a floor,
        // which leaves the prefix rule little to choose from.
        let v = if self.sync_always {
            "standard"
        } else if self.work.chance(0.3) {
            "always"
        } else {
            return true;
        };
        let r = tarn_dataset::set_prop(&e.pool, DS, "sync", v);
        // Not counted as an acknowledgement: only the property's own
        // durability is promised, whatever set_prop does inside.
        if self
            .settle(format!("#{} set sync={v}", self.op), r, None, false)
            .is_some()
        {
            self.sync_always = v == "always";
        }
        true
    }

    fn op_set_recordsize(&mut self, e: &Engine) -> bool {
        let rs = *self.work.pick(&RECORD_SIZES);
        let r = tarn_dataset::set_prop(&e.pool, DS, "recordsize", &rs.to_string());
        self.settle(format!("#{} set recordsize={rs}", self.op), r, None, false);
        true
    }

    fn op_read(&mut self, e: &Engine, files: &[String]) -> bool {
        if files.is_empty() {
            return false;
        }
        let path = self.work.pick(files).clone();
        let want = self.hist.bytes(&path);
        let size = want.len();
        let (off, len) = if self.work.chance(0.5) {
            (0, size + 1)
        } else {
            let off = self.work.below(size as u64 + 4096) as usize;
            (off, self.work.range(1, 128 << 10) as usize)
        };
        let Some(ino) = self.ino_of(e, &path) else {
            return true;
        };
        let attr = e.fs.getattr(ino);
        let Some(attr) = self.settle(format!("#{} getattr {path}", self.op), attr, None, false)
        else {
            return true;
        };
        assert_eq!(
            attr.size,
            size as u64,
            "{}: {path} has size {} but the model says {size}\n{}",
            self.ctx(),
            attr.size,
            self.recent_ops(12)
        );
        let r = e.fs.read(ino, off as u64, len as u32);
        let what = format!("#{} read {path} at {off} len {len}", self.op);
        if let Some(got) = self.settle(what, r, None, false) {
            let lo = off.min(size);
            let hi = (off + len).min(size);
            let exp = &want[lo..hi];
            if got != exp {
                let at = got.iter().zip(exp).position(|(a, b)| a != b);
                panic!(
                    "{}: read of {path} at {off} len {len} returned {} bytes, expected {} \
                     (first difference at {:?} from the offset)\n{}",
                    self.ctx(),
                    got.len(),
                    exp.len(),
                    at,
                    self.recent_ops(12)
                );
            }
        }
        true
    }

    fn op_list(&mut self, e: &Engine) -> bool {
        let got = match read_ns(&e.fs, false) {
            Ok(ns) => ns,
            // Reads refresh atime, which commits under sync=always.
            Err(_) if self.switch().is_off() => return true,
            Err(err) => panic!("{}: listing the file system failed: {err}", self.ctx()),
        };
        let want: Ns = self
            .hist
            .cur()
            .iter()
            .map(|(p, n)| {
                (
                    p.clone(),
                    match n {
                        Node::Dir => Node::Dir,
                        Node::File(_) => Node::File(Arc::new(Vec::new())),
                    },
                )
            })
            .collect();
        let d = diff_ns(&want, &got);
        assert!(
            d.is_empty(),
            "{}: the directory listing differs from the model:\n  {}\n{}",
            self.ctx(),
            d.join("\n  "),
            self.recent_ops(12)
        );
        true
    }

    fn op_open(&mut self, e: &Engine, files: &[String]) -> bool {
        if files.is_empty() || self.open.len() >= 3 {
            return false;
        }
        let path = self.work.pick(files).clone();
        let Some(ino) = self.ino_of(e, &path) else {
            return true;
        };
        let r = e.fs.open(ino, libc::O_RDWR, &self.cred);
        if self
            .settle(format!("#{} open {path}", self.op), r, None, false)
            .is_some()
        {
            self.open.push(ino);
        }
        true
    }

    fn op_close(&mut self, e: &Engine) -> bool {
        if self.open.is_empty() {
            return false;
        }
        let i = self.work.below(self.open.len() as u64) as usize;
        let ino = self.open.swap_remove(i);
        let r = e.fs.release(ino);
        let always = self.sync_always;
        self.settle(format!("#{} close inode {ino}", self.op), r, None, always);
        true
    }

    // ----- the cut and the checks -------------------------------------------

    fn cut_and_recover(&mut self, old: Engine) -> Engine {
        // 1. Power off (if the budget did not already), then let the old
        // pool go: with every write and flush failing, export lands nothing.
        self.switch().cut();
        let _ = old.pool.export(false);
        let p = *self.cuts.pick(&[0.0, 0.25, 0.5, 1.0]);
        for (i, l) in old.leaves.iter().enumerate() {
            self.stats.faults_hit += l.injected();
            self.stats.undone += l
                .power_cut(p)
                .unwrap_or_else(|err| panic!("{}: power_cut of device {i}: {err}", self.ctx()));
            l.attach_switch(None);
            l.track_unflushed(false);
        }
        drop(old);
        self.open.clear();
        self.switch().unlimited();
        if self.plan.write_fault() {
            self.rig.set_fault(None, &[]);
        }

        // 2. Import. On odd rounds someone else takes over the pool, which
        // was never exported: refused without force, accepted with it.
        let ctx = format!("{} (after the cut)", self.ctx());
        let force = self.round % 2 == 1;
        if force {
            let owner = format!("sim-{:x}-r{}", self.seed, self.round);
            match Pool::import(
                &[],
                &self.rig.paths,
                POOL,
                None,
                false,
                options(&self.plan, &owner),
            ) {
                Err(PoolError::InUse(_)) => {}
                Err(err) => panic!("{ctx}: import by a new owner without force: {err}"),
                Ok(_) => panic!("{ctx}: a new owner imported an active pool without force"),
            }
            self.owner = owner;
        }
        let pool = Pool::import(
            &[],
            &self.rig.paths,
            POOL,
            None,
            force,
            options(&self.plan, &self.owner),
        )
        .unwrap_or_else(|err| panic!("{ctx}: import failed: {err}"));
        let txg0 = pool.txg();
        let mut resilvered = false;
        let salt = ((self.round as u64) << 32) | 0xffff_0000;
        let leaves: Vec<Arc<FaultLeaf>> = self
            .rig
            .paths
            .iter()
            .filter_map(|p| tarn_vdev::find_device(p))
            .collect();
        self.rig.reseed(&leaves, salt);
        // The dataset layer attaches right after import, as in the daemon
        // (it replays the intent log; a scan started by import waits for it).
        tarn_dataset::attach(&pool).unwrap_or_else(|e| panic!("{ctx}: attach: {e}"));
        if pool.status().scan != self.last_scan {
            // Import started a resilver (or resumed a scan): let it finish
            // before anything else reads, so the faulty device's generator
            // sees the same reads in the same order on every run.
            self.stats.import_scans += 1;
            let s = wait_scan(&pool, txg0, "the scan started by import", &ctx);
            resilvered = s.kind == ScanKind::Resilver && s.state == ScanState::Finished;
        }
        let e = Self::mount(&self.rig, pool, &ctx);
        self.rig.reseed(&e.leaves, salt + 1);

        // 3. The recovered namespace, read while the faulty device still
        // misbehaves, must be one of the model's states at or after the
        // floor.
        let got = read_ns(&e.fs, true)
            .unwrap_or_else(|err| panic!("{ctx}: reading the recovered file system: {err}"));
        self.check_recovered(&got, &ctx);

        // 4. Scrub, leaks, and a second scrub that finds nothing.
        self.rig.reseed(&e.leaves, salt + 2);
        let s1 = self.scrub(&e.pool, "first scrub", &ctx);
        assert_eq!(
            s1.errors,
            0,
            "{ctx}: the first scrub found {} unrecoverable blocks: {:?}\n{:?}",
            s1.errors,
            s1,
            e.pool.status().damaged
        );
        if resilvered && self.plan.misses_on_record() && s1.repaired_bytes > 0 {
            let msg = format!(
                "{ctx}: import's resilver finished (and cleared the dirty time logs), yet the \
                 first scrub had to repair {} bytes: the resilver missed blocks",
                s1.repaired_bytes
            );
            panic!("{msg}");
        }
        self.stats.repaired += s1.repaired_bytes;
        let leaks = e
            .pool
            .leak_check()
            .unwrap_or_else(|err| panic!("{ctx}: leak check failed: {err}"));
        assert!(
            leaks.is_clean(),
            "{ctx}: leaked or doubly allocated space: {leaks:?}"
        );
        self.rig.set_fault(None, &e.leaves);
        let s2 = self.scrub(&e.pool, "second scrub", &ctx);
        assert!(
            s2.errors == 0 && s2.repaired_bytes == 0,
            "{ctx}: the second scrub still found damage: {s2:?}"
        );
        let status = e.pool.status();
        assert!(
            status.damaged.is_empty() && status.health == Health::Online,
            "{ctx}: after two scrubs the pool is {} and lists damage: {:?}\n{:#?}",
            status.health,
            status.damaged,
            status.vdevs
        );
        let again = read_ns(&e.fs, true)
            .unwrap_or_else(|err| panic!("{ctx}: reading the file system after the scrubs: {err}"));
        let d = diff_ns(&got, &again);
        assert!(
            d.is_empty(),
            "{ctx}: the scrubs changed the file system:\n  {}",
            d.join("\n  ")
        );
        quiesce(&e.pool);
        self.last_scan = e.pool.status().scan;
        self.rig.set_fault(self.plan.fault(), &e.leaves);

        // 5. Go on from the recovered state.
        let props = tarn_dataset::get_props(&e.pool, DS, &["sync".to_string()])
            .unwrap_or_else(|err| panic!("{ctx}: get sync: {err}"));
        self.sync_always = props.first().is_some_and(|p| p.value == "always");
        self.hist = History::new(got, format!("recovered after round {}", self.round));
        e
    }

    fn check_recovered(&mut self, got: &Ns, ctx: &str) {
        if let Some(b) = self.burst.take() {
            self.stats.cuts_in_bursts += 1;
            if let Err(why) = b.check(got) {
                panic!(
                    "{ctx}: the power failed in a concurrent burst, and the recovered file \
                     system is not a consistent cut of it: {why}"
                );
            }
            return;
        }
        let h = &self.hist;
        let last = h.states.len() - 1;
        if let Some(i) = (h.floor..=last).rev().find(|&i| h.states[i] == *got) {
            self.stats.mix(i as u64);
            if i == last {
                self.stats.recovered_last += 1;
            } else {
                self.stats.recovered_earlier += 1;
            }
            return;
        }
        // A failure: say what it is closest to and what differs.
        let (best, diffs) = (0..=last)
            .map(|i| (i, diff_ns(&h.states[i], got)))
            .min_by_key(|(i, d)| (d.len(), last - i))
            .expect("history is never empty");
        let lost = if diffs.is_empty() {
            format!(
                "it equals state {best} ({}), BEFORE the floor {} that `{}` acknowledged: \
                 an acknowledged synchronous operation was lost",
                h.what[best], h.floor, h.floor_by
            )
        } else {
            format!(
                "it equals no state of this round; closest is state {best} ({}), which differs in:\n  {}",
                h.what[best],
                diffs.join("\n  ")
            )
        };
        let from = best.min(h.floor).saturating_sub(3);
        let mut ops = String::new();
        for (i, w) in h.what.iter().enumerate().skip(from).take(60) {
            let mark = if i == h.floor {
                format!("  <- floor, acknowledged by `{}`", h.floor_by)
            } else {
                String::new()
            };
            ops.push_str(&format!("  state {i}: {w}{mark}\n"));
        }
        panic!(
            "{ctx}: the recovered file system is not a state at or after the last acknowledged \
             sync (states {}..={last}): {lost}\nrecovered: {}\noperations:\n{ops}",
            h.floor,
            got.keys().cloned().collect::<Vec<_>>().join(" ")
        );
    }

    /// Runs a scrub to completion and returns its result.
    fn scrub(&self, pool: &Arc<Pool>, what: &str, ctx: &str) -> ScanStatus {
        let txg0 = pool.txg();
        pool.scrub(ScanAction::Start)
            .unwrap_or_else(|err| panic!("{ctx}: start the {what}: {err}"));
        let s = wait_scan(pool, txg0, what, ctx);
        assert!(
            s.kind == ScanKind::Scrub && s.state == ScanState::Finished,
            "{ctx}: the {what} did not finish: {s:?}"
        );
        s
    }

    /// A clean export and import: now nothing at all may be missing.
    fn finish(&mut self, e: Engine) {
        self.round = self.plan.rounds;
        self.op = 0;
        let ctx = format!("{} (clean export)", self.ctx());
        e.pool
            .export(false)
            .unwrap_or_else(|err| panic!("{ctx}: export failed: {err}"));
        for l in &e.leaves {
            self.stats.faults_hit += l.injected();
        }
        drop(e);
        self.rig.set_fault(None, &[]);
        let pool = Pool::import(
            &[],
            &self.rig.paths,
            POOL,
            None,
            false,
            options(&self.plan, "someone else"),
        )
        .unwrap_or_else(|err| panic!("{ctx}: import of the exported pool failed: {err}"));
        let e = Self::mount(&self.rig, pool, &ctx);
        let got = read_ns(&e.fs, true)
            .unwrap_or_else(|err| panic!("{ctx}: reading the file system: {err}"));
        let d = diff_ns(self.hist.cur(), &got);
        assert!(
            d.is_empty(),
            "{ctx}: after a clean export the file system differs from the model:\n  {}",
            d.join("\n  ")
        );
        let leaks = e
            .pool
            .leak_check()
            .unwrap_or_else(|err| panic!("{ctx}: leak check failed: {err}"));
        assert!(leaks.is_clean(), "{ctx}: leaked space: {leaks:?}");
        e.pool
            .export(false)
            .unwrap_or_else(|err| panic!("{ctx}: final export failed: {err}"));
    }
}

/// Waits until no scan runs, then for the commit the scan asked the
/// syncer for at its end, so no background commit falls inside the next
/// workload and a seed replays the same way. (If that commit came before
/// `txg0` was read, the wait ends at its bound: only replay suffers.)
fn wait_scan(pool: &Arc<Pool>, txg0: u64, what: &str, ctx: &str) -> ScanStatus {
    let t0 = Instant::now();
    let s = loop {
        match pool.status().scan {
            Some(s) if s.state == ScanState::Scanning => {
                assert!(
                    t0.elapsed() < Duration::from_secs(300),
                    "{ctx}: {what} did not finish in 5 minutes: {s:?}"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            Some(s) => break s,
            None => panic!("{ctx}: {what}: no scan record"),
        }
    };
    let t1 = Instant::now();
    while pool.txg() <= txg0 && t1.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    s
}

/// Waits until the pool's background threads are idle: no scan runs and
/// no commit happened for a few milliseconds (the syncer may start a
/// resilver after the commit a scan asked for).
fn quiesce(pool: &Arc<Pool>) {
    let t0 = Instant::now();
    let mut last = (pool.txg(), Instant::now());
    while t0.elapsed() < Duration::from_secs(300) {
        let scanning = pool
            .status()
            .scan
            .is_some_and(|s| s.state == ScanState::Scanning);
        let txg = pool.txg();
        if scanning || txg != last.0 {
            last = (txg, Instant::now());
        } else if last.1.elapsed() >= Duration::from_millis(10) {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Reads the whole namespace back from the engine (file contents too when
/// `contents`), checking that sizes and reads agree.
fn read_ns(fs: &Fs<SimBackend>, contents: bool) -> Result<Ns, String> {
    let cred = Cred::root();
    let mut out = Ns::new();
    let mut dirs = vec![(ROOT_INO, String::new())];
    while let Some((dino, dpath)) = dirs.pop() {
        let mut cookie = 0;
        loop {
            let page = fs
                .readdir(dino, cookie, 64)
                .map_err(|e| format!("readdir of /{dpath}: {e}"))?;
            let Some(last) = page.last() else { break };
            cookie = last.cookie;
            for ent in page {
                if ent.name == b"." || ent.name == b".." {
                    continue;
                }
                let name = String::from_utf8(ent.name.clone())
                    .map_err(|_| format!("a name in /{dpath} is not UTF-8"))?;
                let path = join(&dpath, &name);
                if out.len() > 64 {
                    return Err(format!("too many entries (at {path})"));
                }
                let a = fs
                    .lookup(dino, name.as_bytes(), &cred)
                    .map_err(|e| format!("lookup of {path}: {e}"))?;
                if a.ino != ent.ino || a.kind != ent.kind {
                    return Err(format!(
                        "{path}: readdir says inode {} ({:?}), lookup {} ({:?})",
                        ent.ino, ent.kind, a.ino, a.kind
                    ));
                }
                match a.kind {
                    FileKind::Directory => {
                        out.insert(path.clone(), Node::Dir);
                        dirs.push((a.ino, path));
                    }
                    FileKind::Regular if !contents => {
                        out.insert(path, Node::File(Arc::new(Vec::new())));
                    }
                    FileKind::Regular => {
                        let want = usize::try_from(a.size).unwrap_or(usize::MAX);
                        if want > MAX_FILE {
                            return Err(format!("{path}: size {} beyond any write", a.size));
                        }
                        let data = fs
                            .read(a.ino, 0, want as u32 + 1)
                            .map_err(|e| format!("read of {path}: {e}"))?;
                        if data.len() != want {
                            return Err(format!(
                                "{path}: size {want} but a read returned {} bytes",
                                data.len()
                            ));
                        }
                        out.insert(path, Node::File(Arc::new(data)));
                    }
                    other => return Err(format!("{path}: unexpected {other:?}")),
                }
            }
        }
    }
    Ok(out)
}

// ----- seeds and the test ------------------------------------------------------

/// `TARN_SIM_VERBOSE=1`: a line per round.
fn verbose() -> bool {
    std::env::var_os("TARN_SIM_VERBOSE").is_some_and(|v| v != "0")
}

fn seeds() -> Vec<u64> {
    if let Some(seed) = env_seed("TARN_SIM_SEED") {
        return vec![seed];
    }
    if let Ok(n) = std::env::var("TARN_SIM_SEEDS") {
        let n: u64 = n
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("TARN_SIM_SEEDS={n}: not a number"));
        return (0..n).map(|_| random_seed()).collect();
    }
    let mut v: Vec<u64> = (0..FIXED_SEEDS)
        .map(|i| BASE_SEED ^ (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    v.extend((0..RANDOM_SEEDS).map(|_| random_seed()));
    v
}

fn replay_line(seed: u64) -> String {
    format!("TARN_SIM_SEED={seed:#x} cargo test -p tarn-fs --test sim -- --nocapture")
}

fn run_seed(seed: u64) -> Stats {
    let (sim, engine) = Sim::create(seed);
    let plan = format!("{:?}", sim.plan);
    eprintln!("sim: seed {seed:#x}: {plan}");
    sim.run(engine)
}

#[test]
fn simulation_with_faults_and_power_cuts() {
    let seeds = seeds();
    eprintln!(
        "sim: {} seeds: {}",
        seeds.len(),
        seeds
            .iter()
            .map(|s| format!("{s:#x}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let jobs = std::env::var("TARN_SIM_JOBS")
        .ok()
        .and_then(|j| j.parse::<usize>().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(2)
        })
        .clamp(1, seeds.len().max(1));
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let failed: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let i = next.fetch_add(1, Ordering::AcqRel);
                let Some(&seed) = seeds.get(i) else { return };
                let t = Instant::now();
                match catch_unwind(AssertUnwindSafe(|| run_seed(seed))) {
                    Ok(st) => eprintln!(
                        "sim: seed {seed:#x} ok in {:.1}s: {} ops, {} cuts in I/O + {} between \
                         ops, {} ops failed at a cut, {} syncs acknowledged, {} writes, {} \
                         unflushed writes lost, recovered the last state {}x / an earlier one \
                         {}x, {} faults injected, {} bytes repaired, {} scans at import, {} \
                         concurrent bursts of {} operations ({} cut), trace {:016x}",
                        t.elapsed().as_secs_f64(),
                        st.ops,
                        st.cuts_in_io,
                        st.cuts_between_ops,
                        st.failed_at_cut,
                        st.acks,
                        st.writes,
                        st.undone,
                        st.recovered_last,
                        st.recovered_earlier,
                        st.faults_hit,
                        st.repaired,
                        st.import_scans,
                        st.bursts,
                        st.burst_ops,
                        st.cuts_in_bursts,
                        st.trace,
                    ),
                    Err(_) => {
                        eprintln!(
                            "\nsim: seed {seed:#x} FAILED; replay it with:\n{}\n",
                            replay_line(seed)
                        );
                        failed.lock().unwrap_or_else(|e| e.into_inner()).push(seed);
                        stop.store(true, Ordering::Release);
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap_or_else(|e| e.into_inner());
    eprintln!(
        "sim: {} seeds in {:.1}s",
        seeds.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "simulation failed; replay with:\n{}",
        failed
            .iter()
            .map(|s| replay_line(*s))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
