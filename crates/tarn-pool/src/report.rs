//! What `status`, `list` and `health` report: the vdev tree with states,
//! counters and notes, built from the live vdevs and the pool state.

use std::collections::BTreeMap;

use tarn_vdev::{LeafState, TopHealth, TopVdev, VdevKind};

use crate::pool::Pool;
use crate::status::{Counters, Health, PoolListEntry, PoolStatus, VdevStatus};

impl Pool {
    /// Pool-wide space: (size, allocated, free) in allocator bytes.
    pub fn space(&self) -> (u64, u64, u64) {
        let st = self.lock();
        let size = st.space.iter().map(|m| m.asize()).sum();
        let alloc = st.space.iter().map(|m| m.allocated()).sum();
        let free = st.space.iter().map(|m| m.free()).sum();
        (size, alloc, free)
    }

    /// How many blocks the committed space maps are written in: one, or
    /// their chunks and the index that lists them (see docs/format.md).
    pub fn space_map_blocks(&self) -> usize {
        self.lock().space_root.all().count()
    }

    /// Overall health.
    pub fn health(&self) -> Health {
        if self.fault.lock().map(|f| f.is_some()).unwrap_or(true) {
            return Health::Faulted;
        }
        let mut h = Health::Online;
        for t in &self.tops {
            match t.health() {
                TopHealth::Faulted => return Health::Faulted,
                TopHealth::Degraded => h = Health::Degraded,
                TopHealth::Online => {}
            }
        }
        h
    }

    /// One row of `list`.
    pub fn list_entry(&self) -> PoolListEntry {
        let (size, allocated, free) = self.space();
        PoolListEntry {
            name: self.name.clone(),
            size,
            allocated,
            free,
            health: self.health(),
            guid: format!("{:016x}", self.guid),
        }
    }

    /// Name of a top-level vdev as `status` shows it.
    pub(crate) fn top_name(&self, i: usize) -> String {
        match self.tops[i].kind() {
            VdevKind::Single => self.tops[i]
                .leaves()
                .first()
                .map(|l| l.path.display().to_string())
                .unwrap_or_default(),
            VdevKind::Mirror => format!("mirror-{i}"),
            VdevKind::Raidz { parity } => format!("raidz{parity}-{i}"),
        }
    }

    /// The vdev tree with health and counters.
    pub(crate) fn vdev_status(&self) -> Vec<VdevStatus> {
        let st = self.lock();
        let dtl = st.ms.dtl.clone();
        drop(st);
        self.tops
            .iter()
            .enumerate()
            .map(|(i, t)| top_status(&self.top_name(i), t, &dtl))
            .collect()
    }

    /// The separate log vdevs, as `status` shows them.
    pub(crate) fn log_status(&self) -> Vec<VdevStatus> {
        let st = self.lock();
        st.logs
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let name = match l.top.kind() {
                    VdevKind::Mirror => format!("mirror-log-{i}"),
                    _ => format!("log-{i}"),
                };
                top_status(&name, &l.top, &st.ms.dtl)
            })
            .collect()
    }

    /// Everything `status` shows.
    pub fn status(&self) -> PoolStatus {
        let health = self.health();
        let vdevs = self.vdev_status();
        let logs = self.log_status();
        let st = self.lock();
        let fault = self.fault.lock().map(|f| f.clone()).unwrap_or(None);
        let (message, action) = if let Some(f) = fault {
            (
                Some(format!("The pool stopped accepting changes: {f}")),
                Some("Fix or reattach the devices, then export and import the pool.".to_string()),
            )
        } else if health == Health::Degraded {
            (
                Some("One or more devices are unavailable or offline; the pool runs without full redundancy.".to_string()),
                Some("Bring the device back with `tarn pool online`, or replace it with `tarn pool replace`.".to_string()),
            )
        } else if !st.ms.damaged.is_empty() {
            (
                Some("Some data could not be repaired and is damaged.".to_string()),
                Some("Restore the listed objects from a backup, then run `tarn pool clear` and a scrub.".to_string()),
            )
        } else {
            (None, None)
        };
        PoolStatus {
            name: self.name.clone(),
            guid: format!("{:016x}", self.guid),
            health,
            message,
            action,
            txg: st.txg,
            scan: st.ms.scan.as_ref().map(|s| s.to_status()),
            vdevs,
            logs,
            damaged: st.ms.damaged.iter().cloned().collect(),
        }
    }
}

/// One top-level vdev (and its leaves) as `status` shows it.
fn top_status(name: &str, t: &TopVdev, dtl: &BTreeMap<u64, (u64, u64)>) -> VdevStatus {
    let mut children = Vec::new();
    let mut sum = Counters::default();
    for l in t.leaves() {
        let c = conv_counters(&l.counters);
        add_counters(&mut sum, &c);
        let health = match l.state {
            LeafState::Online => Health::Online,
            LeafState::Offline => Health::Offline,
            LeafState::Missing => Health::Unavail,
            LeafState::Faulted => Health::Faulted,
        };
        let note = if l.resilvering {
            Some("resilvering".to_string())
        } else if matches!(l.state, LeafState::Missing) {
            Some("cannot open".to_string())
        } else if dtl.contains_key(&l.guid) && matches!(l.state, LeafState::Online) {
            Some("missed writes; needs resilver".to_string())
        } else {
            None
        };
        children.push(VdevStatus {
            name: l.path.display().to_string(),
            health,
            counters: c,
            note,
            children: Vec::new(),
        });
    }
    let health = match t.health() {
        TopHealth::Online => Health::Online,
        TopHealth::Degraded => Health::Degraded,
        TopHealth::Faulted => Health::Faulted,
    };
    if matches!(t.kind(), VdevKind::Single) {
        if let Some(mut c) = children.pop() {
            if health == Health::Faulted {
                c.health = Health::Faulted;
            }
            return c;
        }
    } else {
        return VdevStatus {
            name: name.to_string(),
            health,
            counters: sum,
            note: None,
            children,
        };
    }
    VdevStatus {
        name: name.to_string(),
        health: Health::Faulted,
        counters: Counters::default(),
        note: Some("no devices".to_string()),
        children: Vec::new(),
    }
}

pub(crate) fn conv_counters(c: &tarn_vdev::Counters) -> Counters {
    Counters {
        read_errors: c.read_errors,
        write_errors: c.write_errors,
        cksum_errors: c.cksum_errors,
        read_ops: c.read_ops,
        write_ops: c.write_ops,
        read_bytes: c.read_bytes,
        write_bytes: c.write_bytes,
    }
}

pub(crate) fn add_counters(sum: &mut Counters, c: &Counters) {
    sum.read_errors += c.read_errors;
    sum.write_errors += c.write_errors;
    sum.cksum_errors += c.cksum_errors;
    sum.read_ops += c.read_ops;
    sum.write_ops += c.write_ops;
    sum.read_bytes += c.read_bytes;
    sum.write_bytes += c.write_bytes;
}
