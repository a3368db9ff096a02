//! The pool's devices: opening and locking them, and writing the pool
//! configuration into their labels.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use tarn_vdev::{LabelConfig, Leaf, LeafState, PoolState, TopVdev};

use crate::config::VdevSpec;
use crate::pool::{new_guid, Pool, SyncState, LABEL_VERSION};
use crate::PoolError;

/// Takes an exclusive advisory lock on a device so no second process (and
/// no second pool in this one) opens it while this pool holds it.
pub(crate) fn lock_device(path: &Path) -> Result<File, PoolError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let is_block = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    if is_block {
        // Linux refuses O_EXCL on a block device that is mounted or held
        // by another program (a filesystem, md, device-mapper).
        opts.custom_flags(libc::O_EXCL);
    }
    let f = opts.open(path).map_err(|e| {
        if is_block && e.raw_os_error() == Some(libc::EBUSY) {
            PoolError::InUse(format!(
                "device {} is in use (mounted, or held by another program)",
                path.display()
            ))
        } else {
            PoolError::NotFound(format!("cannot open {}: {e}", path.display()))
        }
    })?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(PoolError::InUse(format!(
            "device {} is in use by another pool or another tarn process",
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(PoolError::InUse(format!(
            "cannot lock device {}: {e}",
            path.display()
        ))),
    }
}

/// Opens the devices of a new top-level vdev (refusing devices of another
/// live pool unless `force`), locks them and gives each a new guid.
pub(crate) fn open_new_top(
    s: &VdevSpec,
    ashift: u8,
    force: bool,
    locks: &mut Vec<File>,
) -> Result<(Arc<TopVdev>, tarn_vdev::TopConfig), PoolError> {
    let mut leaves: Vec<Option<Arc<dyn Leaf>>> = Vec::new();
    let mut children = Vec::new();
    for d in &s.devices {
        let leaf = tarn_vdev::open_device(d)
            .map_err(|e| PoolError::Invalid(format!("device {}: {e}", d.display())))?;
        if leaf.size() < tarn_vdev::MIN_LEAF_SIZE {
            return Err(PoolError::Invalid(format!(
                "device {} is too small: {} bytes, at least {} MiB needed",
                d.display(),
                leaf.size(),
                tarn_vdev::MIN_LEAF_SIZE >> 20
            )));
        }
        if let Ok(l) = tarn_vdev::read_label(leaf.as_ref()) {
            if l.config.state != PoolState::Destroyed && !force {
                return Err(PoolError::InUse(format!(
                    "device {} belongs to pool '{}' ({:?}); use -f to overwrite it",
                    d.display(),
                    l.config.pool_name,
                    l.config.state
                )));
            }
        }
        locks.push(lock_device(d)?);
        children.push(tarn_vdev::LeafConfig {
            guid: new_guid(),
            path: std::fs::canonicalize(d).unwrap_or_else(|_| d.clone()),
            offline: false,
        });
        leaves.push(Some(leaf as Arc<dyn Leaf>));
    }
    let cfg = tarn_vdev::TopConfig {
        kind: s.kind,
        guid: new_guid(),
        children,
    };
    let top = Arc::new(TopVdev::open(&cfg, ashift, leaves)?);
    Ok((top, cfg))
}

pub(crate) fn check_pool_name(name: &str) -> Result<(), PoolError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
    if ok {
        Ok(())
    } else {
        Err(PoolError::Invalid(format!(
            "invalid pool name '{name}': use 1-64 letters, digits, '-', '_', '.', ':' starting with a letter"
        )))
    }
}

impl Pool {
    /// Writes the current configuration into the labels of every usable leaf
    /// (even labels, flush, odd labels, flush).
    /// Each label write carries a txg above every earlier one (labels on a
    /// device absent at the write keep the older txg and lose to these).
    pub(crate) fn write_labels(
        &self,
        sync: &mut SyncState,
        state: PoolState,
    ) -> Result<(), PoolError> {
        let txg = self.lock().txg.max(sync.label_txg + 1);
        self.write_labels_at(sync, state, txg)
    }

    /// Writes the labels with an explicit config txg.
    pub(crate) fn write_labels_at(
        &self,
        sync: &mut SyncState,
        state: PoolState,
        txg: u64,
    ) -> Result<(), PoolError> {
        self.write_labels_to(sync, state, txg, None)
    }

    /// Writes the label of a leaf just taken offline with the configuration
    /// the other leaves got at the last label write, in which it is offline.
    /// Its older label would present it, alone, as the whole pool at the
    /// txg it left: an import from it would silently roll the pool back.
    /// With this label, such an import finds the device offline and
    /// refuses. Best effort: a device failing writes keeps its old label.
    pub(crate) fn write_offline_label(&self, sync: &mut SyncState, guid: u64) {
        let txg = sync.label_txg;
        let _ = self.write_labels_to(sync, PoolState::Active, txg, Some(guid));
    }

    /// Writes the labels of the usable leaves, or with `only`, of that one
    /// leaf whatever its state.
    fn write_labels_to(
        &self,
        sync: &mut SyncState,
        state: PoolState,
        txg: u64,
        only: Option<u64>,
    ) -> Result<(), PoolError> {
        sync.label_txg = sync.label_txg.max(txg);
        let tree: Vec<_> = self.tops.iter().map(|t| t.config()).collect();
        let log_tops: Vec<Arc<TopVdev>> = self.lock().logs.iter().map(|l| l.top.clone()).collect();
        let logs: Vec<_> = log_tops.iter().map(|t| t.config()).collect();
        let mut written = 0;
        let mut last_err = None;
        let all = self
            .tops
            .iter()
            .enumerate()
            .map(|(i, t)| (i as u32, t))
            .chain(
                log_tops
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (tarn_vdev::LOG_TOP_BASE + i as u32, t)),
            );
        for (ti, t) in all {
            for (ci, info) in t.leaves().into_iter().enumerate() {
                let wanted = match only {
                    Some(g) => info.guid == g,
                    None => matches!(info.state, LeafState::Online),
                };
                if !wanted {
                    continue;
                }
                let Some(leaf) = t.leaf(ci) else { continue };
                let cfg = LabelConfig {
                    version: LABEL_VERSION,
                    pool_name: self.name.clone(),
                    pool_guid: self.guid,
                    state: state.clone(),
                    txg,
                    device_guid: info.guid,
                    top_index: ti,
                    ashift: self.ashift,
                    owner: Some(self.opts.owner.clone()),
                    tree: tree.clone(),
                    logs: logs.clone(),
                };
                match tarn_vdev::write_label_config_all(leaf.as_ref(), &cfg) {
                    Ok(()) => written += 1,
                    Err(e) => last_err = Some(e),
                }
            }
        }
        match (written, last_err) {
            (0, Some(e)) => Err(e.into()),
            _ => Ok(()),
        }
    }
}
