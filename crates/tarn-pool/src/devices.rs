//! Devices over time: offline, online, replace, clear, and the counters of
//! `iostat`.
//!
//! Every configuration change follows one pattern: change the vdev in
//! memory, bump `config_gen` so the change is committed in a new txg, sync,
//! then rewrite the labels of the usable leaves with that txg. Import takes
//! the label config with the highest txg, so a device that was offline when
//! the change was made (and kept its old label) can never outvote the others.
//!
//! A device that misses writes (offline, unopenable, or a failed write) gets
//! a dirty time log: the range of txgs it missed. When it returns, a resilver
//! visits only blocks born in that range; a new device gets the range
//! [1, now], i.e. everything.

use std::path::Path;
use std::sync::Arc;

use tarn_vdev::{Leaf, LeafState, PoolState};

use crate::pool::{new_guid, Pool};
use crate::report::{add_counters, conv_counters};
use crate::status::{Counters, IostatEntry};
use crate::vdevs::lock_device;
use crate::PoolError;

impl Pool {
    /// Finds a leaf by path (as given or canonical), file name, or GUID.
    fn find_leaf(&self, dev: &str) -> Result<(usize, usize), PoolError> {
        let canon = std::fs::canonicalize(dev).ok();
        let guid = u64::from_str_radix(dev.trim_start_matches("0x"), 16).ok();
        let mut by_name = Vec::new();
        for (ti, t) in self.tops.iter().enumerate() {
            for (ci, l) in t.leaves().into_iter().enumerate() {
                if l.path == Path::new(dev)
                    || canon.as_deref() == Some(l.path.as_path())
                    || dev.parse::<u64>().ok() == Some(l.guid)
                    || guid == Some(l.guid)
                {
                    return Ok((ti, ci));
                }
                if l.path.file_name().and_then(|n| n.to_str()) == Some(dev) {
                    by_name.push((ti, ci));
                }
            }
        }
        match by_name.as_slice() {
            [one] => Ok(*one),
            _ => Err(PoolError::NotFound(format!(
                "no device '{dev}' in pool '{}'; `tarn pool status {}` lists its devices",
                self.name, self.name
            ))),
        }
    }

    /// Commits a configuration change and rewrites the labels (inside an
    /// exclusive operation).
    fn commit_config(&self, sync: &mut crate::pool::SyncState) -> Result<(), PoolError> {
        {
            let mut st = self.lock();
            st.ms.config_gen += 1;
            st.ms_dirty = true;
        }
        if let Err(e) = self.sync_txg(sync, true) {
            self.set_fault(format!("txg sync failed: {e}"));
            return Err(e);
        }
        self.write_labels(sync, PoolState::Active)
    }

    /// Refuses to take leaf `ci` of vdev `ti` out of use if the other
    /// leaves cannot rebuild what it holds: a leaf counts as weak when it is
    /// not online, is resilvering, or has missed writes on record.
    fn check_can_lose(&self, ti: usize, ci: usize, what: &str) -> Result<(), PoolError> {
        let st = self.lock();
        let t = &self.tops[ti];
        let leaves = t.leaves();
        let weak = leaves
            .iter()
            .enumerate()
            .filter(|(i, l)| {
                *i == ci
                    || !matches!(l.state, LeafState::Online)
                    || l.resilvering
                    || st.ms.dtl.contains_key(&l.guid)
            })
            .count();
        if weak > t.redundancy() {
            return Err(PoolError::Invalid(format!(
                "cannot {what}: {} would lose data that no other device of {} can rebuild; \
                 let running resilvers finish or bring missing devices back first",
                leaves
                    .get(ci)
                    .map(|l| l.path.display().to_string())
                    .unwrap_or_default(),
                self.top_name(ti)
            )));
        }
        Ok(())
    }

    /// Takes a device out of service; refused if that would lose data.
    pub fn offline(&self, dev: &str) -> Result<(), PoolError> {
        let (ti, ci) = self.find_leaf(dev)?;
        self.check_can_lose(ti, ci, &format!("offline {dev}"))?;
        self.exclusive(|sync| {
            self.tops[ti].set_offline(ci, true)?;
            let guid = self.tops[ti].leaves()[ci].guid;
            {
                let mut st = self.lock();
                let from = st.txg + 1;
                let e = st.ms.dtl.entry(guid).or_insert((from, u64::MAX));
                e.1 = u64::MAX;
            }
            self.commit_config(sync)?;
            self.write_offline_label(sync, guid);
            Ok(())
        })
    }

    /// Reopens a leaf's device at its recorded path and checks that it is
    /// the same device (by its label GUID).
    fn reopen(&self, ti: usize, ci: usize) -> Result<Arc<dyn Leaf>, PoolError> {
        let info = &self.tops[ti].leaves()[ci];
        let leaf = tarn_vdev::open_device(&info.path).map_err(|e| {
            PoolError::NotFound(format!("cannot open {}: {e}", info.path.display()))
        })?;
        match tarn_vdev::read_label(leaf.as_ref()) {
            Ok(l) if l.config.pool_guid == self.guid && l.config.device_guid == info.guid => {}
            _ => {
                return Err(PoolError::Invalid(format!(
                    "{} is not the device that left pool '{}'; use `tarn pool replace` for a new device",
                    info.path.display(),
                    self.name
                )))
            }
        }
        self.locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(lock_device(&info.path)?);
        Ok(leaf)
    }

    /// Brings a device back into service and resilvers what it missed.
    pub fn online(self: &Arc<Self>, dev: &str) -> Result<(), PoolError> {
        let (ti, ci) = self.find_leaf(dev)?;
        self.exclusive(|sync| {
            let info = self.tops[ti].leaves()[ci].clone();
            match info.state {
                LeafState::Online => {}
                LeafState::Offline => self.tops[ti].set_offline(ci, false)?,
                LeafState::Faulted => self.tops[ti].clear_fault(ci)?,
                LeafState::Missing => {
                    let leaf = self.reopen(ti, ci)?;
                    self.tops[ti].replace_leaf(ci, leaf, info.guid)?;
                }
            }
            {
                let mut st = self.lock();
                let now = st.txg;
                if let Some(e) = st.ms.dtl.get_mut(&info.guid) {
                    e.1 = now.max(e.0);
                }
                if !matches!(info.state, LeafState::Online) {
                    self.drop_resilver_target(&mut st, info.guid);
                }
            }
            self.commit_config(sync)
        })?;
        self.start_resilver_if_needed();
        Ok(())
    }

    /// Drills: makes a device misbehave (see `tarn_vdev::fault`), or with
    /// `None` behave again. Returns the faults now in force on it.
    pub fn inject(
        &self,
        device: &str,
        fault: Option<tarn_vdev::Fault>,
    ) -> Result<Vec<tarn_vdev::Fault>, PoolError> {
        let (ti, ci) = self.find_leaf(device)?;
        let path = self.tops[ti].leaves()[ci].path.clone();
        let leaf = tarn_vdev::find_device(&path).ok_or_else(|| {
            PoolError::NotFound(format!(
                "device {} of pool '{}' is not open",
                path.display(),
                self.name
            ))
        })?;
        match fault {
            Some(f) => leaf.inject(f),
            None => leaf.clear(),
        }
        Ok(leaf.faults())
    }

    /// Replaces `old` with the device at `new` and resilvers everything onto it.
    pub fn replace(self: &Arc<Self>, old: &str, new: &Path, force: bool) -> Result<(), PoolError> {
        let (ti, ci) = self.find_leaf(old)?;
        let leaf = tarn_vdev::open_device(new)
            .map_err(|e| PoolError::Invalid(format!("device {}: {e}", new.display())))?;
        let need = self.tops[ti]
            .leaves()
            .iter()
            .enumerate()
            .filter_map(|(i, _)| self.tops[ti].leaf(i).map(|l| l.size()))
            .min()
            .unwrap_or(tarn_vdev::MIN_LEAF_SIZE)
            .max(tarn_vdev::MIN_LEAF_SIZE);
        if leaf.size() < need {
            return Err(PoolError::Invalid(format!(
                "device {} is too small: {} bytes, the vdev needs {} bytes",
                new.display(),
                leaf.size(),
                need
            )));
        }
        if let Ok(l) = tarn_vdev::read_label(leaf.as_ref()) {
            let same_leaf = l.config.pool_guid == self.guid
                && l.config.device_guid == self.tops[ti].leaves()[ci].guid;
            if l.config.state != PoolState::Destroyed && !same_leaf && !force {
                return Err(PoolError::InUse(format!(
                    "device {} belongs to pool '{}'; use -f to overwrite it",
                    new.display(),
                    l.config.pool_name
                )));
            }
        }
        // The old device leaves before the resilver runs, so it may go only
        // if the rest of its vdev can rebuild everything it holds.
        self.check_can_lose(ti, ci, &format!("replace {old}"))?;
        let canon = std::fs::canonicalize(new).unwrap_or_else(|_| new.to_path_buf());
        if self.device_paths().contains(&canon) && canon != self.tops[ti].leaves()[ci].path {
            return Err(PoolError::InUse(format!(
                "device {} is already part of pool '{}'",
                new.display(),
                self.name
            )));
        }
        self.exclusive(|sync| {
            let lock = lock_device(new)?;
            let old_guid = self.tops[ti].leaves()[ci].guid;
            let guid = new_guid();
            self.tops[ti].replace_leaf(ci, leaf, guid)?;
            self.locks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(lock);
            {
                // The old device's record of missed txgs stays until the
                // labels name the new device: a crash before they do
                // brings the old one back at import, still owing them.
                let mut st = self.lock();
                let now = st.txg;
                st.ms.dtl.insert(guid, (1, now));
            }
            self.commit_config(sync)?;
            let mut st = self.lock();
            if st.ms.dtl.remove(&old_guid).is_some() {
                st.ms_dirty = true;
            }
            Ok(())
        })?;
        self.start_resilver_if_needed();
        Ok(())
    }

    /// Resets error counters (of one device or all) and retries faulted devices.
    pub fn clear(self: &Arc<Self>, dev: Option<&str>) -> Result<(), PoolError> {
        self.check_usable(&self.lock())?;
        let only = dev.map(|d| self.find_leaf(d)).transpose()?;
        let mut reopened = false;
        let mut back = Vec::new();
        for (ti, t) in self.tops.iter().enumerate() {
            if only.is_some_and(|(x, _)| x != ti) {
                continue;
            }
            // A resilver target whose write errors are cleared could no
            // longer be told to have failed a write of the resilver.
            back.extend(
                t.leaves()
                    .into_iter()
                    .filter(|l| l.counters.write_errors > 0)
                    .map(|l| l.guid),
            );
            t.clear_counters();
            for (ci, l) in t.leaves().into_iter().enumerate() {
                if only.is_some_and(|(_, y)| y != ci) {
                    continue;
                }
                match l.state {
                    LeafState::Faulted => {
                        t.clear_fault(ci)?;
                        reopened = true;
                        back.push(l.guid);
                    }
                    LeafState::Missing => {
                        if let Ok(leaf) = self.reopen(ti, ci) {
                            t.replace_leaf(ci, leaf, l.guid)?;
                            reopened = true;
                            back.push(l.guid);
                        }
                    }
                    _ => {}
                }
            }
        }
        if reopened {
            self.exclusive(|sync| {
                {
                    let mut st = self.lock();
                    let now = st.txg;
                    for t in &self.tops {
                        for l in t.leaves() {
                            if let Some(e) = st.ms.dtl.get_mut(&l.guid) {
                                if matches!(l.state, LeafState::Online) {
                                    e.1 = now.max(e.0);
                                }
                            }
                        }
                    }
                    for g in &back {
                        self.drop_resilver_target(&mut st, *g);
                    }
                }
                self.commit_config(sync)
            })?;
        } else if !back.is_empty() {
            let mut st = self.lock();
            for g in &back {
                self.drop_resilver_target(&mut st, *g);
            }
        }
        // Also the retry after a resilver that failed: the syncer does not
        // restart those on its own.
        self.start_resilver_if_needed();
        Ok(())
    }

    /// What the metrics endpoint reads: each device's read and write
    /// latencies (its path, then the two histograms), and how long the
    /// txg syncs took.
    pub fn latencies(
        &self,
    ) -> (
        Vec<(String, tarn_stats::Snapshot, tarn_stats::Snapshot)>,
        tarn_stats::Snapshot,
    ) {
        let devices = self
            .tops
            .iter()
            .flat_map(|t| t.latencies())
            .map(|(p, r, w)| (p.display().to_string(), r, w))
            .collect();
        (devices, self.sync_times.snapshot())
    }

    /// Cumulative counters of the pool, each top-level vdev and each leaf.
    pub fn iostat(&self) -> Vec<IostatEntry> {
        let st = self.lock();
        let mut rows = Vec::new();
        let mut total = Counters::default();
        let mut tops = Vec::new();
        for (i, t) in self.tops.iter().enumerate() {
            let mut sum = Counters::default();
            let mut leaves = Vec::new();
            for l in t.leaves() {
                let c = conv_counters(&l.counters);
                add_counters(&mut sum, &c);
                leaves.push(IostatEntry {
                    name: l.path.display().to_string(),
                    depth: 2,
                    allocated: 0,
                    free: 0,
                    counters: c,
                });
            }
            add_counters(&mut total, &sum);
            let m = &st.space[i];
            tops.push(IostatEntry {
                name: self.top_name(i),
                depth: 1,
                allocated: m.allocated(),
                free: m.free(),
                counters: sum,
            });
            // A single-device vdev is its leaf: one row, as in `status`.
            if !matches!(t.kind(), tarn_vdev::VdevKind::Single) {
                tops.extend(leaves);
            }
        }
        rows.push(IostatEntry {
            name: self.name.clone(),
            depth: 0,
            allocated: st.space.iter().map(|m| m.allocated()).sum(),
            free: st.space.iter().map(|m| m.free()).sum(),
            counters: total,
        });
        rows.extend(tops);
        rows
    }
}
