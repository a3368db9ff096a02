//! Destroying filesystems, snapshots and snapshot ranges.

use std::collections::BTreeSet;

use tarn_pool::{Pool, SyncCx};

use crate::dsl::{with_dir_excl, Dir};
use crate::ops::applied;
use crate::DsError;

impl Dir {
    pub(crate) fn remove_rec(&mut self, id: u64) {
        if let Some(r) = self.recs.remove(&id) {
            self.names.remove(&r.name);
        }
        self.forgotten.push(id);
        self.deleted.insert(id);
        self.dirty_recs.remove(&id);
        // A key record lives while a dataset names it (see `crypt`).
        self.tidy_keys();
    }

    /// Destroys one snapshot (checked by the caller: no clones).
    pub(crate) fn destroy_snapshot(
        &mut self,
        cx: &mut SyncCx<'_>,
        snap: u64,
    ) -> Result<(), DsError> {
        let s = self.rec(snap)?.clone();
        s.check_not_held()?;
        if !s.clones.is_empty() {
            let names: Vec<String> = s
                .clones
                .iter()
                .filter_map(|c| self.recs.get(c).map(|r| r.name.clone()))
                .collect();
            return Err(DsError::Busy(format!(
                "snapshot '{}' has dependent clones: {}; destroy them first",
                s.name,
                names.join(", ")
            )));
        }
        let Some(next) = self.next_of(snap) else {
            return Err(DsError::Corrupt(format!(
                "snapshot '{}' has no successor in its chain",
                s.name
            )));
        };
        let next_rec = self.rec(next)?.clone();
        // Blocks born after S's previous snapshot and dead by `next`: only S
        // held them.
        let freed = self.dead_from(next, s.prev_snap_txg);
        self.drain_deadlist(cx, next_rec.deadlist, s.prev_snap_txg, true, None)?;
        // S's own dead blocks are still held by older snapshots: next
        // inherits them.
        self.drain_deadlist(cx, s.deadlist, 0, false, Some(next_rec.deadlist))?;
        if let Some(n) = self.recs.get_mut(&next) {
            n.dead.retain(|b, _| *b < s.prev_snap_txg);
            for (b, sum) in &s.dead {
                n.dead.entry(*b).or_default().add(*sum);
            }
            n.prev_snap = s.prev_snap;
            n.prev_snap_txg = s.prev_snap_txg;
            // A scan that already walked `next` skipped blocks born after
            // the new pruning point that only S's tree led to.
            cx.rescan_tree(next);
            // What S wrote and next still holds is now next's alone.
            let mut gain = s.unique;
            gain.sub(freed);
            n.unique.add(gain);
        }
        if let Some(o) = s.origin {
            if let Some(orec) = self.recs.get_mut(&o) {
                orec.clones.retain(|c| *c != snap);
            }
        }
        self.dirty_recs.insert(next);
        self.remove_rec(snap);
        Ok(())
    }

    /// True when filesystem `id` has snapshots or children: what keeps
    /// it from being destroyed alone.
    pub(crate) fn has_dependents(&self, id: u64) -> bool {
        !self.snapshots_of(id).is_empty() || !self.children_of(id).is_empty()
    }

    /// Destroys a filesystem without snapshots or children.
    pub(crate) fn destroy_fs(&mut self, cx: &mut SyncCx<'_>, id: u64) -> Result<(), DsError> {
        let r = self.rec(id)?.clone();
        if r.parent.is_none() {
            return Err(DsError::Invalid(format!(
                "'{}' is the pool's root dataset; destroy the pool instead",
                r.name
            )));
        }
        if self.has_dependents(id) {
            return Err(DsError::Busy(format!(
                "dataset '{}' has children or snapshots; use -r",
                r.name
            )));
        }
        let root = r.root_ptr()?;
        self.free_tree(cx, &root, r.prev_snap_txg)?;
        self.drain_deadlist(cx, r.deadlist, 0, false, None)?;
        crate::zil::drop_parked(self, cx, id)?;
        if let Some(o) = r.origin {
            if let Some(orec) = self.recs.get_mut(&o) {
                orec.clones.retain(|c| *c != id);
                self.dirty_recs.insert(o);
            }
        }
        self.remove_rec(id);
        Ok(())
    }
}

/// What a destroy removes, each part checked.
enum DestroyPlan {
    /// Snapshots of one filesystem.
    Snapshots(Vec<u64>),
    /// One filesystem without snapshots or children.
    Fs(u64),
    /// Filesystems (with their snapshots), each after its children and
    /// the clones of its snapshots.
    Tree(Vec<u64>),
}

/// Destroys a filesystem (with `recursive`: its descendants and all their
/// snapshots first), a snapshot `fs@a`, or a range of snapshots `fs@a%c`
/// (from a to c inclusive, by creation; either end may be empty).
pub fn destroy(pool: &Pool, name: &str, recursive: bool) -> Result<(), DsError> {
    with_dir_excl(pool, |dsl, cx| {
        // Everything a user can get wrong is checked before the first
        // change; what fails after that is I/O or damage, and faults.
        match destroy_plan(dsl, name, recursive)? {
            DestroyPlan::Snapshots(chosen) => {
                let r = chosen
                    .into_iter()
                    .try_for_each(|id| dsl.destroy_snapshot(cx, id));
                applied(cx, "destroy", r)
            }
            DestroyPlan::Fs(id) => {
                let r = dsl.destroy_fs(cx, id);
                applied(cx, "destroy", r)
            }
            DestroyPlan::Tree(order) => {
                let r = order.into_iter().try_for_each(|d| {
                    for s in dsl.snapshots_of(d).into_iter().rev() {
                        dsl.destroy_snapshot(cx, s)?;
                    }
                    dsl.destroy_fs(cx, d)
                });
                applied(cx, "destroy", r)
            }
        }
    })
}

/// The refusal [`destroy`] would give, if any, changing nothing: what
/// the daemon asks before it takes mounts and volumes down for a destroy
/// (a refused one must not disconnect their clients).
pub fn check_destroy(pool: &Pool, name: &str, recursive: bool) -> Result<(), DsError> {
    crate::dsl::with_dsl(pool, false, |dsl, _| {
        destroy_plan(&dsl.dir(), name, recursive).map(|_| ())
    })
}

/// Every check of destroying `name`, and what it destroys in which order.
fn destroy_plan(dsl: &Dir, name: &str, recursive: bool) -> Result<DestroyPlan, DsError> {
    if let Some((fs, spec)) = name.split_once('@') {
        let head = dsl.id_of(fs)?;
        let snaps = dsl.snapshots_of(head);
        let pos = |s: &str| -> Result<usize, DsError> {
            let full = format!("{fs}@{s}");
            let id = dsl.id_of(&full)?;
            snaps
                .iter()
                .position(|x| *x == id)
                .ok_or(DsError::NotFound(full))
        };
        let chosen: Vec<u64> = match spec.split_once('%') {
            Some((a, c)) => {
                let lo = if a.is_empty() { 0 } else { pos(a)? };
                let hi = if c.is_empty() {
                    snaps.len().saturating_sub(1)
                } else {
                    pos(c)?
                };
                if snaps.is_empty() || lo > hi {
                    return Err(DsError::Invalid(format!("empty snapshot range '{name}'")));
                }
                snaps[lo..=hi].to_vec()
            }
            None => vec![snaps[pos(spec)?]],
        };
        // The base of a receive in progress stays: without it the
        // part of the stream applied could not be undone.
        let base = dsl.rec(head)?.recv.as_ref().and_then(|st| st.from_guid);
        for id in &chosen {
            if let Some(r) = dsl.recs.get(id) {
                if base == Some(r.guid) {
                    return Err(DsError::Busy(format!(
                        "snapshot '{}' is the base of a receive in progress; \
                         abandon it with receive -A first",
                        r.name
                    )));
                }
                r.check_not_held()?;
                if !r.clones.is_empty() {
                    return Err(DsError::Busy(format!(
                        "snapshot '{}' has dependent clones; destroy them first",
                        r.name
                    )));
                }
            }
        }
        return Ok(DestroyPlan::Snapshots(chosen));
    }
    let id = dsl.id_of(name)?;
    if dsl.rec(id)?.parent.is_none() {
        return Err(DsError::Invalid(format!(
            "'{name}' is the pool's root dataset; destroy the pool instead"
        )));
    }
    if !recursive {
        if dsl.has_dependents(id) {
            return Err(DsError::Busy(format!(
                "dataset '{name}' has children or snapshots; use -r"
            )));
        }
        return Ok(DestroyPlan::Fs(id));
    }
    let prefix = format!("{name}/");
    let mut remaining: BTreeSet<u64> = dsl
        .recs
        .values()
        .filter(|r| !r.is_snapshot() && (r.id == id || r.name.starts_with(&prefix)))
        .map(|r| r.id)
        .collect();
    for d in &remaining {
        for s in dsl.snapshots_of(*d) {
            if let Some(r) = dsl.recs.get(&s) {
                r.check_not_held()?;
                if r.clones.iter().any(|c| !remaining.contains(c)) {
                    return Err(DsError::Busy(format!(
                        "snapshot '{}' has clones outside '{name}'; destroy them first",
                        r.name
                    )));
                }
            }
        }
    }
    // An order in which each dataset goes after its children and after
    // the clones of its snapshots.
    let mut order = Vec::new();
    while !remaining.is_empty() {
        let free = remaining.iter().copied().find(|d| {
            let no_children = dsl.children_of(*d).iter().all(|c| !remaining.contains(c));
            let no_clones = dsl.snapshots_of(*d).iter().all(|s| {
                dsl.recs
                    .get(s)
                    .is_none_or(|r| r.clones.iter().all(|c| !remaining.contains(c)))
            });
            no_children && no_clones
        });
        // None: a clone below the tree holds a snapshot of a dataset that
        // must go after it (a clone promoted, or a dataset renamed, under
        // its own clone). Nothing is damaged; the layout has no order.
        let Some(d) = free else {
            return Err(DsError::Busy(format!(
                "datasets under '{name}' depend on each other: a clone below it was promoted                  over its origin (or a dataset renamed under its own clone); promote the origin                  back or rename the clone out first"
            )));
        };
        order.push(d);
        remaining.remove(&d);
    }
    Ok(DestroyPlan::Tree(order))
}
