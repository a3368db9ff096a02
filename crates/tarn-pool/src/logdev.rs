//! Separate intent log devices (SLOG).
//!
//! # Theory
//!
//! A log device holds nothing but intent log blocks, and every log block
//! is obsolete once the txg after it commits (see `zil`). So a log device
//! needs no persistent space map: at import all of it is free except what
//! the committed chain claims, and its space lives in memory beside the
//! pool's. Its addresses are written as vdev `LOG_VDEV_BASE + i`, which
//! no data vdev can have, so a chain can mix log and data vdevs (the
//! pool falls back to its data vdevs when the log device fails or fills).
//!
//! Log vdevs are listed in every label (`logs`), their leaves carry labels
//! like any member, and they can be mirrored. They are added and removed
//! while the pool is in use: adding writes the new labels everywhere;
//! removing first commits a txg (so no chain lives on the device any more:
//! the next header is placed on the remaining vdevs) and only then drops it
//! from the labels.
//!
//! **A missing log device at import** may hold acknowledged synchronous
//! writes that exist nowhere else. Import refuses, naming the device, unless
//! told to discard the log (`PoolOptions::discard_log`): silently
//! losing an acknowledged `fsync` is the one outcome we do not allow.

use std::sync::Arc;

use tarn_space::SpaceMap;
use tarn_vdev::{TopHealth, TopVdev, VdevKind};

use crate::config::VdevSpec;
use crate::pool::{Pool, State};
use crate::vdevs::open_new_top;
use crate::PoolError;

/// Vdev number of the first log device in log block addresses.
pub(crate) const LOG_VDEV_BASE: u32 = tarn_vdev::LOG_TOP_BASE;

/// One log vdev and its in-memory space.
pub(crate) struct LogVdev {
    pub top: Arc<TopVdev>,
    pub space: SpaceMap,
}

impl LogVdev {
    pub(crate) fn new(top: Arc<TopVdev>) -> LogVdev {
        let space = SpaceMap::new(top.asize(), top.alloc_align());
        LogVdev { top, space }
    }
}

impl Pool {
    /// The top-level vdev of a log block address (data or log vdev).
    pub(crate) fn log_top(&self, st: &State, vdev: u32) -> Option<Arc<TopVdev>> {
        if vdev >= LOG_VDEV_BASE {
            st.logs
                .get((vdev - LOG_VDEV_BASE) as usize)
                .map(|l| l.top.clone())
        } else {
            self.tops.get(vdev as usize).cloned()
        }
    }

    /// The space map of a log block address.
    pub(crate) fn log_space<'a>(&self, st: &'a mut State, vdev: u32) -> Option<&'a mut SpaceMap> {
        if vdev >= LOG_VDEV_BASE {
            st.logs
                .get_mut((vdev - LOG_VDEV_BASE) as usize)
                .map(|l| &mut l.space)
        } else {
            st.space.get_mut(vdev as usize)
        }
    }

    /// Allocates a log block on a healthy log device, if the pool has one
    /// with room.
    pub(crate) fn log_dev_alloc(&self, st: &mut State, psize: u32) -> Option<(u32, u64, u32)> {
        for (i, l) in st.logs.iter_mut().enumerate() {
            if matches!(l.top.health(), TopHealth::Faulted) {
                continue;
            }
            let asize = l.top.alloc_size(psize as u64);
            if let Ok(off) = l.space.alloc(asize) {
                return Some((LOG_VDEV_BASE + i as u32, off, asize as u32));
            }
        }
        None
    }

    /// True when the pool has a usable log device.
    pub(crate) fn has_log_device(st: &State) -> bool {
        st.logs
            .iter()
            .any(|l| !matches!(l.top.health(), TopHealth::Faulted))
    }

    /// Adds a log vdev (single device or mirror) to the imported pool.
    pub fn add_log(&self, spec: &VdevSpec, force: bool) -> Result<(), PoolError> {
        if matches!(spec.kind, VdevKind::Raidz { .. }) {
            return Err(PoolError::Invalid(
                "a log device is a single device or a mirror, not raidz".into(),
            ));
        }
        self.exclusive(|sync| {
            let mine = self.device_paths();
            for d in &spec.devices {
                let canon = std::fs::canonicalize(d).unwrap_or_else(|_| d.clone());
                let dup = mine
                    .iter()
                    .any(|m| std::fs::canonicalize(m).unwrap_or_else(|_| m.clone()) == canon)
                    || self
                        .lock()
                        .logs
                        .iter()
                        .any(|l| l.top.config().children.iter().any(|c| c.path == canon));
                if dup {
                    return Err(PoolError::Invalid(format!(
                        "device {} is already part of pool '{}'",
                        d.display(),
                        self.name
                    )));
                }
            }
            let mut locks = Vec::new();
            let (top, _) = open_new_top(spec, self.ashift, force, &mut locks)?;
            {
                let mut st = self.lock();
                st.logs.push(LogVdev::new(top));
                st.ms.config_gen += 1;
                st.ms_dirty = true;
            }
            self.locks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .append(&mut locks);
            // The next chain starts on the new device.
            self.zil_state().broken = true;
            self.write_labels(sync, tarn_vdev::PoolState::Active)
        })
    }

    /// Removes the log vdev that holds `device`. Commits txgs first so no
    /// chain needs it, then drops it from the labels and clears its own.
    pub fn remove_log(&self, device: &std::path::Path) -> Result<(), PoolError> {
        let canon = std::fs::canonicalize(device).unwrap_or_else(|_| device.to_path_buf());
        self.exclusive(|sync| {
            if self.zil_state().replay.is_some() {
                return Err(PoolError::InUse(format!(
                    "pool '{}' has an intent log to replay first (its datasets are not loaded)",
                    self.name
                )));
            }
            let Some(i) = self.lock().logs.iter().position(|l| {
                l.top
                    .config()
                    .children
                    .iter()
                    .any(|c| c.path == canon || c.path == device)
            }) else {
                return Err(PoolError::NotFound(format!(
                    "{} is not a log device of pool '{}'",
                    device.display(),
                    self.name
                )));
            };
            // Log devices rest while one leaves: the chain restarts on the
            // data vdevs, so no committed header names a log vdev whose
            // number is about to change. (Everything pending was committed
            // before this runs, so nothing in the chain matters.)
            {
                let mut z = self.zil_state();
                z.no_log_dev = true;
                z.broken = true;
            }
            let r = self.sync_txg(sync, true);
            self.zil_state().no_log_dev = false;
            if let Err(e) = r {
                self.fault_and_wake(format!("txg sync failed: {e}"));
                return Err(e);
            }
            let mut st = self.lock();
            if st.ms.log.is_some_and(|h| h.first.vdev >= LOG_VDEV_BASE) {
                return Err(PoolError::Internal(
                    "the intent log still starts on a log device".into(),
                ));
            }
            let gone = st.logs.remove(i);
            st.ms.config_gen += 1;
            st.ms_dirty = true;
            drop(st);
            self.write_labels(sync, tarn_vdev::PoolState::Active)?;
            for ci in 0..gone.top.width() {
                if let Some(leaf) = gone.top.leaf(ci) {
                    let _ = tarn_vdev::clear_labels(leaf.as_ref());
                }
            }
            Ok(())
        })
    }
}
