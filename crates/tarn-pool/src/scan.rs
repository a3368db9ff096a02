//! Scrub and resilver: visit every live block pointer, read every copy and
//! every parity column, verify, repair.
//!
//! # Theory
//!
//! The scan runs on its own thread in two phases (docs/design.md, "Scan").
//! The *meta* phase (0) walks the committed meta tree (every node pointer,
//! pruned by birth for a resilver) and collects the blocks the extension's
//! meta entries name directly, plus the space-map block; it sorts those
//! pointers by device address and scrubs them as one batch. The *trees*
//! phase (3) walks every tree the extension (the dataset layer) names, in
//! id order, each pruned at the birth below which an older snapshot's tree
//! holds its blocks, gathering `scan_batch_blocks` pointers at a time (the
//! memory bound); each batch is sorted by (vdev, offset) so the devices see
//! ascending, mostly sequential reads, and scrubbed on up to
//! `sync_threads` scoped threads.
//!
//! Pointers come from the committed txg C; the scan holds C (see
//! `store::Holds`) for the whole meta phase, and in the trees phase from
//! reading the list of trees until the tree it walks is done (all its
//! batches), so no block it is about to read, or to repair, can be freed
//! and reused under it. Repairs are therefore always written over the
//! block the pointer names, never over a new owner. The pool lock is taken
//! only to read the roots and the list of trees, and to record each
//! chunk's results; the walks and the I/O run without it.
//!
//! Progress (phase, the id of the last tree completed, counters) lives in
//! the pool's meta state and is committed with every txg, so a scan
//! interrupted by export or a crash resumes after the last completed tree;
//! an interrupted tree, or an interrupted meta phase, is walked again from
//! its start. A resilver is a scan restricted to blocks born in the
//! missed-txg window of its target devices; when it finishes, the targets
//! that got every write have their dirty time logs cleared.

use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tarn_block::pipeline;
use tarn_block::BlockPtr;

use crate::ext::{ExtRef, ScanFn, P_EXT};
use crate::pool::{now_unix, Pool, State, SCAN_CANCEL, SCAN_PAUSE, SCAN_RUN};
use crate::status::{ScanKind, ScanState, ScanStatus};
use crate::PoolError;

/// Persistent record of the current or last scan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ScanRecord {
    pub kind: ScanKind,
    pub state: ScanState,
    pub started_unix: u64,
    pub ended_unix: Option<u64>,
    pub examined: u64,
    pub total: u64,
    pub repaired: u64,
    pub errors: u64,
    /// 0: metadata, 3: dataset trees, 2: done (1, the raw-object records
    /// of older versions, now goes straight on to the trees).
    pub phase: u8,
    /// Last record key whose batch completed (hex).
    pub bookmark: String,
    /// Blocks born in [min_birth, max_birth] are visited.
    pub min_birth: u64,
    pub max_birth: u64,
    /// Leaf GUIDs being resilvered.
    pub targets: Vec<u64>,
    /// Write errors of each target when the resilver started: a target that
    /// failed any write since keeps its dirty time log.
    #[serde(default)]
    pub target_write_errors: Vec<u64>,
    /// Targets seen failing a write (or not online) at a point the scan
    /// recorded its progress: kept with the record because the counters
    /// behind `target_write_errors` start again at an import, and a
    /// resumed resilver must still know that the trees already walked
    /// did not all reach them.
    #[serde(default)]
    pub failed_targets: Vec<u64>,
    #[serde(default)]
    pub rate: u64,
    /// Entries the scan could not decode (counted in `errors` too): what
    /// lies beneath them went unvisited, so a resilver with any keeps its
    /// targets' dirty time logs.
    #[serde(default)]
    pub unverified: u64,
    /// A tree the scan had not finished (the one it walks, or one still
    /// to come) whose pruning point moved down meanwhile (a snapshot
    /// before it was destroyed: `Cx::rescan_tree`). The walk in progress
    /// pruned with the old point, so if it is this tree it is walked
    /// again. Not kept: a resumed scan starts its tree afresh anyway.
    #[serde(skip)]
    pub moved: Option<u64>,
}

impl ScanRecord {
    pub(crate) fn is_running(&self) -> bool {
        self.state == ScanState::Scanning
    }

    pub(crate) fn to_status(&self) -> ScanStatus {
        let eta = if self.state == ScanState::Scanning && self.rate > 0 {
            Some(self.total.saturating_sub(self.examined) / self.rate)
        } else {
            None
        };
        ScanStatus {
            kind: self.kind,
            state: self.state,
            started_unix: self.started_unix,
            ended_unix: self.ended_unix,
            examined_bytes: self.examined,
            total_bytes: self.total.max(self.examined),
            repaired_bytes: self.repaired,
            errors: self.errors,
            rate_bytes_per_sec: if self.state == ScanState::Scanning {
                self.rate
            } else {
                0
            },
            eta_secs: eta,
        }
    }
}

/// What [`Pool::leak_check`] found, in bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakReport {
    /// Allocated according to the space maps (including deferred frees).
    pub allocated: u64,
    /// Freed but not yet reusable.
    pub deferred: u64,
    /// Reachable from the committed trees, each block counted once.
    pub reachable: u64,
    /// Addresses claimed by two different blocks.
    pub conflicts: u64,
    /// Entries whose references could not be decoded (what they are): the
    /// space beneath them is not counted as reachable.
    #[serde(default)]
    pub undecodable: Vec<String>,
}

impl LeakReport {
    /// True when every allocated byte is reachable and nothing reachable is
    /// unaccounted for.
    pub fn is_clean(&self) -> bool {
        self.conflicts == 0
            && self.undecodable.is_empty()
            && self.allocated.saturating_sub(self.deferred) == self.reachable
    }
}

/// Whose block a scanned pointer is, for damage reports.
#[derive(Clone, Debug)]
enum Who {
    Meta,
    Ext(u64, Vec<u8>),
}

type Batch = Vec<(BlockPtr, Who)>;

/// Scan phase that walks extension trees in id order.
pub(crate) const PHASE_TREES: u8 = 3;

/// The last completed tree id of a phase-3 bookmark (none: nothing done).
pub(crate) fn bookmark_id(bookmark: &str) -> Option<u64> {
    <[u8; 8]>::try_from(unhex(bookmark).as_slice())
        .ok()
        .map(u64::from_be_bytes)
}

/// The phase-3 bookmark after tree `id` (none: before every tree).
pub(crate) fn id_bookmark(id: Option<u64>) -> String {
    id.map(|i| hex(&i.to_be_bytes())).unwrap_or_default()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// What to do with a scan: the API's scrub actions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanAction {
    /// Start a scrub (or resume a paused one).
    Start,
    /// Pause the running scrub; it resumes where it stopped.
    Pause,
    /// Resume a paused scrub.
    Resume,
    /// Cancel the running or paused scrub.
    Cancel,
}

/// Sort key so a batch reaches the devices in ascending address order.
fn addr_key(bp: &BlockPtr) -> (u32, u64) {
    bp.used_dvas()
        .next()
        .map(|d| (d.vdev, d.offset))
        .unwrap_or((u32::MAX, 0))
}

enum Step {
    Continue,
    Stop,
}

impl Pool {
    /// Starts, pauses, resumes or cancels a scrub.
    pub fn scrub(self: &Arc<Self>, action: ScanAction) -> Result<Option<ScanStatus>, PoolError> {
        let _ops = self.scan_ops.lock().unwrap_or_else(|e| e.into_inner());
        let mut st = self.lock();
        self.check_usable(&st)?;
        let running = st.ms.scan.as_ref().is_some_and(|s| s.is_running());
        let paused = st
            .ms
            .scan
            .as_ref()
            .is_some_and(|s| s.state == ScanState::Paused);
        match action {
            ScanAction::Start | ScanAction::Resume if paused => {
                if let Some(s) = st.ms.scan.as_mut() {
                    s.state = ScanState::Scanning;
                }
                st.ms_dirty = true;
            }
            ScanAction::Start => {
                if running {
                    let kind = st.ms.scan.as_ref().map(|s| s.kind);
                    return Err(PoolError::Invalid(format!(
                        "a {} is already running on pool '{}'; pause or cancel it first",
                        if kind == Some(ScanKind::Resilver) {
                            "resilver"
                        } else {
                            "scrub"
                        },
                        self.name
                    )));
                }
                let total = st.space.iter().map(|m| m.allocated()).sum();
                st.ms.scan = Some(ScanRecord {
                    kind: ScanKind::Scrub,
                    state: ScanState::Scanning,
                    started_unix: now_unix(),
                    ended_unix: None,
                    examined: 0,
                    total,
                    repaired: 0,
                    errors: 0,
                    phase: 0,
                    bookmark: String::new(),
                    min_birth: 0,
                    max_birth: u64::MAX,
                    targets: Vec::new(),
                    target_write_errors: Vec::new(),
                    failed_targets: Vec::new(),
                    rate: 0,
                    unverified: 0,
                    moved: None,
                });
                st.damaged_at_scrub_start = Some(st.ms.damaged.clone());
                st.ms_dirty = true;
            }
            ScanAction::Resume => {
                if !running {
                    return Err(PoolError::Invalid(format!(
                        "no paused scrub on pool '{}'",
                        self.name
                    )));
                }
            }
            ScanAction::Pause | ScanAction::Cancel => {
                if !(running || (paused && action == ScanAction::Cancel)) {
                    return Err(PoolError::Invalid(format!(
                        "no scrub is running on pool '{}'",
                        self.name
                    )));
                }
                if st
                    .ms
                    .scan
                    .as_ref()
                    .is_some_and(|s| s.kind == ScanKind::Resilver)
                    && action == ScanAction::Cancel
                {
                    return Err(PoolError::Invalid(
                        "a resilver cannot be canceled: it restores redundancy".into(),
                    ));
                }
                self.scan_ctl.store(
                    if action == ScanAction::Pause {
                        SCAN_PAUSE
                    } else {
                        SCAN_CANCEL
                    },
                    Ordering::Release,
                );
                drop(st);
                self.join_scanner();
                let mut st = self.lock();
                if let Some(s) = st.ms.scan.as_mut() {
                    if action == ScanAction::Cancel {
                        s.state = ScanState::Canceled;
                        s.ended_unix = Some(now_unix());
                    } else if s.state == ScanState::Scanning {
                        s.state = ScanState::Paused;
                    }
                }
                st.ms_dirty = true;
                return Ok(st.ms.scan.as_ref().map(|s| s.to_status()));
            }
        }
        let status = st.ms.scan.as_ref().map(|s| s.to_status());
        drop(st);
        self.spawn_scanner();
        Ok(status)
    }

    /// Starts a resilver of every leaf with a dirty time log that can be
    /// written now, unless one is running (it will be folded in next time).
    pub(crate) fn start_resilver_if_needed(self: &Arc<Self>) {
        let _ops = self.scan_ops.lock().unwrap_or_else(|e| e.into_inner());
        let mut st = self.lock();
        // A resilver that runs, or that the operator paused, is left alone
        // (checked under `scan_ops`, so a caller that decided to start one
        // before a pause cannot undo the pause).
        if st.ms.scan.as_ref().is_some_and(|s| {
            s.kind == ScanKind::Resilver && (s.is_running() || s.state == ScanState::Paused)
        }) {
            // Devices that came back meanwhile are still untrusted.
            self.mark_resilver_targets(&st);
            return;
        }
        let mut targets = Vec::new();
        let mut target_write_errors = Vec::new();
        let mut lo = u64::MAX;
        let mut hi = 0;
        for t in &self.tops {
            for (ci, l) in t.leaves().into_iter().enumerate() {
                if let Some((a, b)) = st.ms.dtl.get(&l.guid) {
                    if matches!(l.state, tarn_vdev::LeafState::Online) {
                        targets.push(l.guid);
                        target_write_errors.push(l.counters.write_errors);
                        lo = lo.min(*a);
                        hi = hi.max((*b).min(st.txg + 1));
                        t.set_resilvering(ci, true);
                    }
                }
            }
        }
        if targets.is_empty() {
            return;
        }
        // A running scrub yields to the resilver; it can be started again.
        let was_scrubbing = st.ms.scan.as_ref().is_some_and(|s| s.is_running());
        if was_scrubbing {
            self.scan_ctl.store(SCAN_CANCEL, Ordering::Release);
            drop(st);
            self.join_scanner();
            st = self.lock();
        }
        let total = st.space.iter().map(|m| m.allocated()).sum();
        st.ms.scan = Some(ScanRecord {
            kind: ScanKind::Resilver,
            state: ScanState::Scanning,
            started_unix: now_unix(),
            ended_unix: None,
            examined: 0,
            total,
            repaired: 0,
            errors: 0,
            phase: 0,
            bookmark: String::new(),
            min_birth: lo,
            max_birth: hi,
            targets,
            target_write_errors,
            failed_targets: Vec::new(),
            rate: 0,
            unverified: 0,
            moved: None,
        });
        st.ms_dirty = true;
        drop(st);
        self.spawn_scanner();
    }

    /// Whether an online device has missed writes and no resilver runs:
    /// checked after each sync so a device that came back during a resilver
    /// gets its own.
    pub(crate) fn resilver_pending(&self, st: &State) -> bool {
        // Not while a scan runs or is paused (a pause is the operator's), and
        // not right after a resilver that failed: a device that keeps failing
        // writes would otherwise be resilvered in a loop. `online` and `clear`
        // start one explicitly.
        let blocked = st.ms.scan.as_ref().is_some_and(|s| {
            s.is_running()
                || (s.kind == ScanKind::Resilver && (s.state == ScanState::Paused || s.errors > 0))
        });
        if st.ms.dtl.is_empty() || blocked {
            return false;
        }
        self.tops.iter().any(|t| {
            t.leaves().iter().any(|l| {
                matches!(l.state, tarn_vdev::LeafState::Online) && st.ms.dtl.contains_key(&l.guid)
            })
        })
    }

    /// Takes leaf `guid`, back in service after an outage, out of the
    /// targets of a resilver that runs or is paused: the blocks that
    /// resilver visited while the leaf was out were not written to it, so
    /// it must not end the leaf's dirty time log. It keeps the whole log,
    /// stays resilvering, and the next resilver (started when this one
    /// ends) covers it.
    pub(crate) fn drop_resilver_target(&self, st: &mut State, guid: u64) {
        let Some(s) = st.ms.scan.as_mut() else {
            return;
        };
        if s.kind != ScanKind::Resilver || !(s.is_running() || s.state == ScanState::Paused) {
            return;
        }
        if let Some(i) = s.targets.iter().position(|g| *g == guid) {
            s.targets.remove(i);
            if i < s.target_write_errors.len() {
                s.target_write_errors.remove(i);
            }
            s.failed_targets.retain(|g| *g != guid);
            st.ms_dirty = true;
        }
    }

    /// Adds to the record's `failed_targets` every target that is not
    /// online or failed a write since `target_write_errors` was taken, and
    /// with `rebase` takes those counts again (a scan thread starting: after
    /// an import the counters begin at zero, below what was recorded).
    /// Called under the state lock at every point the scan records its
    /// progress, so the note reaches the disk with the progress it
    /// qualifies.
    pub(crate) fn note_failed_targets(&self, st: &mut State, rebase: bool) {
        let Some(s) = st.ms.scan.as_mut() else {
            return;
        };
        if s.kind != ScanKind::Resilver {
            return;
        }
        for t in &self.tops {
            for l in t.leaves() {
                let Some(i) = s.targets.iter().position(|g| *g == l.guid) else {
                    continue;
                };
                let before = s.target_write_errors.get(i).copied().unwrap_or(0);
                let failed = !matches!(l.state, tarn_vdev::LeafState::Online)
                    || l.counters.write_errors > before;
                if failed && !s.failed_targets.contains(&l.guid) {
                    s.failed_targets.push(l.guid);
                    st.ms_dirty = true;
                }
                if rebase {
                    if s.target_write_errors.len() < s.targets.len() {
                        s.target_write_errors.resize(s.targets.len(), 0);
                    }
                    s.target_write_errors[i] = l.counters.write_errors;
                }
            }
        }
    }

    /// Marks every online leaf with missed writes as resilvering (reads do
    /// not trust it, offline/replace count it as weak), whether a resilver
    /// for it runs, is paused, or is yet to start.
    pub(crate) fn mark_resilver_targets(&self, st: &State) {
        for t in &self.tops {
            for (ci, l) in t.leaves().into_iter().enumerate() {
                if matches!(l.state, tarn_vdev::LeafState::Online)
                    && st.ms.dtl.contains_key(&l.guid)
                {
                    t.set_resilvering(ci, true);
                }
            }
        }
    }

    pub(crate) fn join_scanner(&self) {
        let h = self
            .scanner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    /// Runs the scan thread for the current scan record, if it is running.
    pub(crate) fn spawn_scanner(self: &Arc<Self>) {
        self.join_scanner();
        self.scan_ctl.store(SCAN_RUN, Ordering::Release);
        let pool = Arc::clone(self);
        let h = std::thread::Builder::new()
            .name(format!("scan-{}", self.name))
            .spawn(move || {
                if let Err(e) = pool.run_scan() {
                    let mut st = pool.lock();
                    if let Some(s) = st.ms.scan.as_mut() {
                        s.state = ScanState::Canceled;
                        s.ended_unix = Some(now_unix());
                        s.errors += 1;
                    }
                    st.ms.damaged.insert(format!("scan stopped: {e}"));
                    st.ms_dirty = true;
                }
            });
        match h {
            Ok(h) => *self.scanner.lock().unwrap_or_else(|e| e.into_inner()) = Some(h),
            Err(e) => {
                // Do not show a scan as running that nobody runs; it resumes
                // from its bookmark when started again.
                let mut st = self.lock();
                if let Some(s) = st.ms.scan.as_mut().filter(|s| s.is_running()) {
                    s.state = ScanState::Paused;
                }
                st.ms.damaged.insert(format!("scan could not start: {e}"));
                st.ms_dirty = true;
            }
        }
    }

    /// Counts an entry the scan could not decode as an error of the
    /// running scan and lists it as damage.
    fn note_undecodable(&self, what: String) {
        let mut st = self.lock();
        if let Some(s) = st.ms.scan.as_mut() {
            s.errors += 1;
            s.unverified += 1;
        }
        st.ms.damaged.insert(format!("cannot decode {what}"));
        st.ms_dirty = true;
    }

    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Acquire) || self.scan_ctl.load(Ordering::Acquire) != SCAN_RUN
    }

    /// Scrubs one sorted batch on the worker threads; returns whether to go on.
    fn scrub_batch(&self, batch: &mut [(BlockPtr, Who)], started: Instant, base: u64) -> Step {
        batch.sort_by_key(|(bp, _)| addr_key(bp));
        let threads = self.opts.sync_threads.max(1);
        for chunk in batch.chunks(64 * threads) {
            if self.should_stop() {
                return Step::Stop;
            }
            let per = chunk.len().div_ceil(threads);
            let tops = &self.tops;
            type Job<'a> = Box<dyn FnOnce() -> Vec<pipeline::BlockScrub> + Send + 'a>;
            let parts: Vec<&[(BlockPtr, Who)]> = chunk.chunks(per.max(1)).collect();
            let jobs: Vec<Job<'_>> = parts
                .iter()
                .map(|&c| {
                    Box::new(move || {
                        c.iter()
                            .map(|(bp, _)| pipeline::scrub_block(tops, bp))
                            .collect::<Vec<_>>()
                    }) as Job<'_>
                })
                .collect();
            // A part whose worker panicked counts each of its blocks as
            // unrecoverable, so the results stay in step with the blocks.
            let results: Vec<pipeline::BlockScrub> = tarn_vdev::workers::run_all(jobs)
                .into_iter()
                .zip(&parts)
                .flat_map(|(got, c)| {
                    got.unwrap_or_else(|| {
                        (0..c.len())
                            .map(|_| pipeline::BlockScrub {
                                unrecoverable: true,
                                ..Default::default()
                            })
                            .collect()
                    })
                })
                .collect();
            let mut st = self.lock();
            let mut lost = Vec::new();
            for ((bp, rec), r) in chunk.iter().zip(&results) {
                if r.unrecoverable {
                    lost.push((*bp, rec.clone()));
                }
            }
            for (bp, rec) in lost {
                let what = match rec {
                    Who::Ext(tree, key) => {
                        format!("dataset tree #{tree}, key {}", hex(&key))
                    }
                    Who::Meta => format!("metadata: {}", pipeline::describe(&bp)),
                };
                st.ms.damaged.insert(what);
            }
            if let Some(s) = st.ms.scan.as_mut() {
                for ((bp, _), r) in chunk.iter().zip(&results) {
                    s.examined += bp.allocated_bytes();
                    s.repaired += r.repaired_bytes;
                    s.errors += r.unrecoverable as u64;
                }
                let secs = started.elapsed().as_secs_f64().max(0.001);
                s.rate = ((s.examined.saturating_sub(base)) as f64 / secs) as u64;
            }
            st.ms_dirty = true;
        }
        Step::Continue
    }

    /// Commits what is dirty, then compares the space the space maps hold
    /// allocated with the space reachable from every committed tree (the
    /// meta tree, every extension tree walked whole,
    /// shared blocks counted once). A difference is a leak or a lost block.
    pub fn leak_check(&self) -> Result<LeakReport, PoolError> {
        self.exclusive(|_| self.leak_check_quiet())
    }

    /// [`Pool::leak_check`] of a quiet pool (inside an exclusive operation).
    fn leak_check_quiet(&self) -> Result<LeakReport, PoolError> {
        let (space_root, meta_root, allocated, deferred) = {
            let st = self.lock();
            (
                st.space_root.clone(),
                st.meta_root,
                st.space.iter().map(|m| m.allocated()).sum(),
                st.space.iter().map(|m| m.deferred()).sum(),
            )
        };
        let rs = self.read_store();
        let seen = std::cell::RefCell::new(
            std::collections::HashMap::<(u32, u64), ([u8; 32], u32)>::new(),
        );
        let conflicts = std::cell::Cell::new(0u64);
        let add = |bp: &BlockPtr| {
            for d in bp.used_dvas() {
                let mut m = seen.borrow_mut();
                match m.get(&(d.vdev, d.offset)) {
                    Some((sum, _)) if *sum != bp.checksum => conflicts.set(conflicts.get() + 1),
                    Some(_) => {}
                    None => {
                        m.insert((d.vdev, d.offset), (bp.checksum, d.asize));
                    }
                }
            }
        };
        for bp in space_root.all() {
            add(bp);
        }
        for d in self.log_allocated() {
            seen.borrow_mut()
                .entry((d.vdev, d.offset))
                .or_insert(([0xff; 32], d.asize));
        }
        let scan = self.scan_fn();
        let mut trees = Vec::new();
        let undecodable = std::cell::RefCell::new(Vec::new());
        tarn_tree::walk(
            &rs,
            &meta_root,
            0,
            &mut |bp| {
                add(bp);
                Ok(())
            },
            &mut |k, v| {
                if let (Some((&P_EXT, key)), Some(f)) = (k.split_first(), scan) {
                    let mut refs = Vec::new();
                    f(0, key, v, &mut refs);
                    for r in refs {
                        match r {
                            ExtRef::Block(bp) => add(&bp),
                            ExtRef::Tree { root, kind, .. } => trees.push((root, kind)),
                            ExtRef::Undecodable(what) => undecodable.borrow_mut().push(what),
                        }
                    }
                }
                Ok(())
            },
        )?;
        while let Some((root, kind)) = trees.pop() {
            let Some(f) = scan else { break };
            let mut nested = Vec::new();
            tarn_tree::walk(
                &rs,
                &root,
                0,
                &mut |bp| {
                    add(bp);
                    Ok(())
                },
                &mut |k, v| {
                    let mut refs = Vec::new();
                    f(kind, k, v, &mut refs);
                    for r in refs {
                        match r {
                            ExtRef::Block(bp) => add(&bp),
                            ExtRef::Tree { root, kind, .. } => nested.push((root, kind)),
                            ExtRef::Undecodable(what) => undecodable.borrow_mut().push(what),
                        }
                    }
                    Ok(())
                },
            )?;
            trees.append(&mut nested);
        }
        let reachable = seen.borrow().values().map(|(_, a)| *a as u64).sum();
        Ok(LeakReport {
            allocated,
            deferred,
            reachable,
            conflicts: conflicts.get(),
            undecodable: undecodable.into_inner(),
        })
    }

    /// Visits the extension's entries of the committed meta tree at `root`,
    /// in key order, a page at a time so memory stays bounded; `f` returns
    /// false to stop early.
    fn for_each_ext_entry(
        &self,
        root: BlockPtr,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), PoolError> {
        let rs = self.read_store();
        let mut meta = tarn_tree::Tree::open(root);
        let hi = [P_EXT + 1];
        let mut start = vec![P_EXT];
        let mut incl = true;
        loop {
            let lo = if incl {
                Bound::Included(&start[..])
            } else {
                Bound::Excluded(&start[..])
            };
            let page = meta.range(&rs, lo, Bound::Excluded(&hi[..]), 1024)?;
            let Some(last) = page.last().map(|(k, _)| k.clone()) else {
                return Ok(());
            };
            for (k, v) in &page {
                if !f(&k[1..], v) {
                    return Ok(());
                }
            }
            start = last;
            incl = false;
        }
    }

    /// Every tree the extension references in the committed meta tree at
    /// `root`, as (id, root, min_birth, kind), sorted by id.
    pub(crate) fn ext_trees(
        &self,
        root: BlockPtr,
        scan: ScanFn,
    ) -> Result<Vec<(u64, BlockPtr, u64, u8)>, PoolError> {
        let mut trees = Vec::new();
        self.for_each_ext_entry(root, &mut |k, v| {
            let mut refs = Vec::new();
            scan(0, k, v, &mut refs);
            for r in refs {
                if let ExtRef::Tree {
                    id,
                    root,
                    min_birth,
                    kind,
                } = r
                {
                    trees.push((id, root, min_birth, kind));
                }
            }
            true
        })?;
        trees.sort_by_key(|t| t.0);
        Ok(trees)
    }

    /// Scrubs one extension tree: its nodes and the blocks its entries name,
    /// in memory-bounded sorted batches.
    #[allow(clippy::too_many_arguments)]
    fn scan_tree(
        &self,
        id: u64,
        root: &BlockPtr,
        prune: u64,
        kind: u8,
        scan: ScanFn,
        keep: &dyn Fn(&BlockPtr) -> bool,
        started: Instant,
        base: u64,
    ) -> Result<Step, PoolError> {
        let rs = self.read_store();
        let batch: std::cell::RefCell<Batch> = std::cell::RefCell::new(Vec::new());
        let stopped = std::cell::Cell::new(false);
        let limit = self.opts.scan_batch_blocks.max(1);
        let flush = |force: bool| -> Result<(), tarn_tree::TreeError> {
            let mut b = batch.borrow_mut();
            if b.len() >= limit || (force && !b.is_empty()) {
                if let Step::Stop = self.scrub_batch(&mut b, started, base) {
                    stopped.set(true);
                    return Err(tarn_tree::TreeError::Store(Box::new(PoolError::Internal(
                        "scan stopped".into(),
                    ))));
                }
                b.clear();
            }
            Ok(())
        };
        let r = tarn_tree::walk(
            &rs,
            root,
            prune,
            &mut |bp| {
                if keep(bp) {
                    batch.borrow_mut().push((*bp, Who::Meta));
                }
                flush(false)
            },
            &mut |k, v| {
                let mut refs = Vec::new();
                scan(kind, k, v, &mut refs);
                for r in refs {
                    match r {
                        ExtRef::Block(bp) if keep(&bp) => {
                            batch.borrow_mut().push((bp, Who::Ext(id, k.to_vec())));
                        }
                        ExtRef::Undecodable(what) => self.note_undecodable(format!(
                            "dataset tree #{id}, key {}: {what}",
                            hex(k)
                        )),
                        _ => {}
                    }
                }
                flush(false)
            },
        )
        .and_then(|()| flush(true));
        if stopped.get() {
            return Ok(Step::Stop);
        }
        r?;
        Ok(Step::Continue)
    }

    /// True when the committed meta tree holds entries of an extension
    /// (datasets).
    fn has_ext_entries(&self) -> Result<bool, PoolError> {
        let root = self.lock().meta_root;
        let mut found = false;
        self.for_each_ext_entry(root, &mut |_, _| {
            found = true;
            false
        })?;
        Ok(found)
    }

    fn run_scan(self: &Arc<Self>) -> Result<(), PoolError> {
        // A scan started at import runs before the dataset layer attaches;
        // without its scan function it would skip every dataset block and
        // still clear the dirty time logs. Wait for it (the scan stays
        // running on disk, so stopping here resumes it after the next import).
        if self.scan_fn().is_none() && self.has_ext_entries()? {
            while self.scan_fn().is_none() {
                if self.should_stop() {
                    return Ok(());
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        let started = Instant::now();
        let (mut phase, min_birth, max_birth, base) = {
            let mut st = self.lock();
            if !st.ms.scan.as_ref().is_some_and(|s| s.is_running()) {
                return Ok(());
            }
            self.note_failed_targets(&mut st, true);
            let Some(s) = st.ms.scan.as_ref() else {
                return Ok(());
            };
            (s.phase, s.min_birth, s.max_birth, s.examined)
        };
        let in_window = |bp: &BlockPtr| bp.birth >= min_birth && bp.birth <= max_birth;
        if phase == 0 {
            let st = self.lock();
            let root = st.meta_root;
            let space_root = st.space_root.clone();
            let hold = self.holds.hold(st.txg);
            drop(st);
            let rs = self.read_store();
            let mut batch: Batch = Vec::new();
            let ext_scan = self.scan_fn();
            for bp in space_root.all() {
                if !bp.is_hole() && in_window(bp) {
                    batch.push((*bp, Who::Meta));
                }
            }
            let ext_blocks = std::cell::RefCell::new(Vec::new());
            if !root.is_hole() {
                tarn_tree::walk(
                    &rs,
                    &root,
                    min_birth.saturating_sub(1),
                    &mut |bp| {
                        if in_window(bp) {
                            ext_blocks.borrow_mut().push((*bp, Who::Meta));
                        }
                        Ok(())
                    },
                    &mut |k, v| {
                        if let (Some(f), Some((&P_EXT, key))) = (ext_scan, k.split_first()) {
                            let mut refs = Vec::new();
                            f(0, key, v, &mut refs);
                            for r in refs {
                                match r {
                                    ExtRef::Block(bp) if in_window(&bp) => {
                                        ext_blocks.borrow_mut().push((bp, Who::Meta));
                                    }
                                    ExtRef::Undecodable(what) => self.note_undecodable(format!(
                                        "metadata, key {}: {what}",
                                        hex(key)
                                    )),
                                    _ => {}
                                }
                            }
                        }
                        Ok(())
                    },
                )?;
                batch.append(&mut ext_blocks.borrow_mut());
            }
            if let Step::Stop = self.scrub_batch(&mut batch, started, base) {
                return Ok(());
            }
            drop(hold);
            phase = 1;
        }
        if phase == 1 {
            phase = PHASE_TREES;
            let mut st = self.lock();
            self.note_failed_targets(&mut st, false);
            if let Some(s) = st.ms.scan.as_mut() {
                s.phase = PHASE_TREES;
                s.bookmark = String::new();
            }
            st.ms_dirty = true;
        }
        if phase == PHASE_TREES {
            if let Some(scan) = self.scan_fn() {
                loop {
                    let mut st = self.lock();
                    let done = st.ms.scan.as_ref().and_then(|s| bookmark_id(&s.bookmark));
                    // Trees still to come are read from this root, so they
                    // prune with the points in force now.
                    if let Some(s) = st.ms.scan.as_mut() {
                        s.moved = None;
                    }
                    let (root, txg) = (st.meta_root, st.txg);
                    drop(st);
                    let hold = self.holds.hold(txg);
                    let trees = self.ext_trees(root, scan)?;
                    let Some(t) = trees.into_iter().find(|t| done.is_none_or(|d| t.0 > d)) else {
                        break;
                    };
                    let (id, root, tree_min, kind) = t;
                    let prune = tree_min.max(min_birth.saturating_sub(1));
                    let keep = |bp: &BlockPtr| in_window(bp) && bp.birth > prune;
                    if let Step::Stop =
                        self.scan_tree(id, &root, prune, kind, scan, &keep, started, base)?
                    {
                        return Ok(());
                    }
                    drop(hold);
                    let mut st = self.lock();
                    self.note_failed_targets(&mut st, false);
                    if let Some(s) = st.ms.scan.as_mut() {
                        // Unless a destroy asked for an earlier tree, or
                        // this one, to be walked again meanwhile
                        // (`Cx::rescan_tree`).
                        if bookmark_id(&s.bookmark) == done && s.moved != Some(id) {
                            s.bookmark = id_bookmark(Some(id));
                        }
                    }
                    st.ms_dirty = true;
                }
            }
        }
        // Finished. The repairs are written, not yet durable: flushed
        // before a resilver's targets are judged, so a target whose flush
        // fails (a failure counts as a write error) keeps its dirty time
        // log rather than being trusted with columns it may have dropped.
        for t in &self.tops {
            let _ = t.flush();
        }
        let mut st = self.lock();
        // The last look at the targets: a failure since the last progress
        // point joins the ones noted before (an import included).
        self.note_failed_targets(&mut st, false);
        let Some(s) = st.ms.scan.as_mut() else {
            return Ok(());
        };
        s.phase = 2;
        s.state = ScanState::Finished;
        s.ended_unix = Some(now_unix());
        s.examined = s.examined.max(s.total.min(s.examined));
        let kind = s.kind;
        let targets = s.targets.clone();
        let failed = s.failed_targets.clone();
        let max_birth = s.max_birth;
        let clean = s.errors == 0;
        // Blocks beneath an entry it could not decode were not rebuilt.
        let unverified = s.unverified > 0;
        if kind == ScanKind::Resilver {
            // A target that faulted or failed a write during the resilver
            // did not get everything: it keeps its whole dirty time log.
            if let Some(s) = st.ms.scan.as_mut() {
                s.errors += failed.len() as u64;
            }
            for g in targets
                .iter()
                .filter(|g| !failed.contains(g) && !unverified)
            {
                let keep = match st.ms.dtl.get(g) {
                    Some((_, hi)) if *hi > max_birth => Some((max_birth + 1, *hi)),
                    _ => None,
                };
                match keep {
                    Some(r) => {
                        st.ms.dtl.insert(*g, r);
                    }
                    None => {
                        st.ms.dtl.remove(g);
                    }
                }
            }
            // A target whose dirty time log is not empty yet (it missed
            // blocks born after this resilver began) stays untrusted until
            // the resilver that covers them.
            for t in &self.tops {
                for (ci, l) in t.leaves().into_iter().enumerate() {
                    if targets.contains(&l.guid)
                        && !failed.contains(&l.guid)
                        && !unverified
                        && !st.ms.dtl.contains_key(&l.guid)
                    {
                        t.set_resilvering(ci, false);
                    }
                }
            }
        } else if clean {
            // A full clean scrub proves the damage reports made before it
            // started stale; one made while it ran may name a block it had
            // walked past (or one born after it began), and stays.
            if let Some(before) = st.damaged_at_scrub_start.take() {
                st.ms.damaged.retain(|d| !before.contains(d));
            }
        }
        st.ms_dirty = true;
        st.sync_requested = true;
        self.cv.notify_all();
        Ok(())
    }
}
