//! One POSIX filesystem object per dataset, shared by every front end,
//! and one block device object per volume, shared by NBD and iSCSI.
//!
//! `tarn_fs::Fs` keeps the open-file counts of its dataset in memory (an
//! unlinked file lives until its last close), so two `Fs` on one dataset
//! would each free what the other still has open. The daemon therefore
//! opens at most one per dataset and hands the same one to the FUSE mount,
//! the NFS export and the WebDAV share of that dataset. An operation that
//! replaces or removes a dataset's tree (rollback, destroy, rename,
//! export) first takes the front ends down, then drops the entry here, and
//! the next user opens a fresh one. A forgotten volume is also *closed*:
//! a block front end's connection may still hold it, and from then on
//! every request through it fails, so the initiator reconnects and finds
//! the volume as it is now (another size after a rollback, or gone).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tarn_fs::{DatasetBackend, Fs};
use tarn_pool::Pool;
use tarn_vol::Volume;

use tarn_api::ApiError;

use crate::convert::ds_error;

/// The filesystem of one dataset (or snapshot).
pub type DatasetFs = Fs<DatasetBackend>;

/// The open filesystems, by dataset name.
#[derive(Default)]
pub struct Filesystems {
    map: Mutex<BTreeMap<String, Arc<DatasetFs>>>,
    volumes: Mutex<BTreeMap<String, Arc<Volume>>>,
}

/// True when `name` is `dataset` or lies below it (`tank/a` covers
/// `tank/a/b` and `tank/a@s`).
pub fn covers(dataset: &str, name: &str) -> bool {
    name == dataset
        || name
            .strip_prefix(dataset)
            .is_some_and(|r| r.starts_with('/') || r.starts_with('@'))
}

/// Refuses `dataset` unless it is in `pool`. The maps are keyed by
/// dataset name, and a share record read from one pool names its
/// dataset: a record written elsewhere (an imported pool) that names
/// another pool's dataset must not be handed that dataset, already open
/// under its name, with the record's users and rights.
fn in_pool(pool: &Pool, dataset: &str) -> Result<(), ApiError> {
    if crate::pools::pool_of(dataset) != pool.name() {
        return Err(ApiError::invalid(format!(
            "'{dataset}' is not in pool '{}': a pool's shares serve its own datasets only",
            pool.name()
        )));
    }
    Ok(())
}

impl Filesystems {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<DatasetFs>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The filesystem of `dataset`, opened on first use (which creates the
    /// root directory of a new dataset and frees orphans a crash left).
    pub fn get(&self, pool: &Arc<Pool>, dataset: &str) -> Result<Arc<DatasetFs>, ApiError> {
        in_pool(pool, dataset)?;
        let mut map = self.lock();
        if let Some(fs) = map.get(dataset) {
            return Ok(fs.clone());
        }
        let handle = tarn_dataset::open(pool, dataset).map_err(ds_error)?;
        handle.check_unlocked().map_err(ds_error)?;
        if handle.volume().map_err(ds_error)?.is_some() {
            return Err(ApiError::invalid(format!(
                "'{dataset}' is a volume, a block device: serve it over NBD, not as a filesystem"
            )));
        }
        let fs = Fs::mount(Arc::new(DatasetBackend::new(handle)))
            .map_err(|e| ApiError::io(format!("cannot open {dataset} as a filesystem: {e}")))?;
        let fs = Arc::new(fs);
        map.insert(dataset.to_string(), fs.clone());
        Ok(fs)
    }

    /// The block device of volume (or volume snapshot) `dataset`, opened
    /// on first use.
    pub fn volume(&self, pool: &Arc<Pool>, dataset: &str) -> Result<Arc<Volume>, ApiError> {
        in_pool(pool, dataset)?;
        let mut map = self.volumes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = map.get(dataset) {
            // Opened before a rollback, rename or destroy that raced with
            // closing it: retire it and open what the name is now.
            if v.is_current() {
                return Ok(v.clone());
            }
            v.close();
            map.remove(dataset);
        }
        let handle = tarn_dataset::open(pool, dataset).map_err(ds_error)?;
        handle.check_unlocked().map_err(ds_error)?;
        let v = Volume::open(handle).map_err(|e| ApiError::invalid(e.to_string()))?;
        map.insert(dataset.to_string(), v.clone());
        Ok(v)
    }

    /// Forgets (and closes the volumes of) every dataset for which
    /// `gone` is true.
    fn forget(&self, gone: impl Fn(&str) -> bool) {
        self.lock().retain(|k, _| !gone(k));
        let mut vols = self.volumes.lock().unwrap_or_else(|e| e.into_inner());
        vols.retain(|k, v| {
            if gone(k) {
                v.close();
            }
            !gone(k)
        });
    }

    /// Forgets the filesystems of the snapshots of filesystem `fs`.
    pub fn forget_snapshots(&self, fs: &str) {
        let prefix = format!("{fs}@");
        self.forget(|k| k.starts_with(&prefix));
    }

    /// Forgets the filesystems of `dataset` and its snapshots (not its
    /// children).
    pub fn forget_one(&self, dataset: &str) {
        let prefix = format!("{dataset}@");
        self.forget(|k| k == dataset || k.starts_with(&prefix));
    }

    /// Forgets the filesystems of `dataset` and everything below it.
    pub fn forget_tree(&self, dataset: &str) {
        self.forget(|k| covers(dataset, k));
    }
}

#[cfg(test)]
mod tests {
    use super::{covers, Filesystems};
    use tarn_vdev::VdevKind;

    /// A pool's share records name datasets: one naming another pool's
    /// dataset gets nothing, not even when that dataset is open already.
    #[test]
    fn a_dataset_is_handed_out_for_its_own_pool_only() {
        let dir = tempfile::tempdir().unwrap();
        let tank = tarn_testkit::pools::tank(dir.path(), VdevKind::Mirror, 2, 64 << 20);
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let evil = tarn_testkit::pools::attached(
            tarn_testkit::pools::create(
                "evil",
                VdevKind::Mirror,
                &tarn_testkit::files::make(&other, "e", 2, 64 << 20),
                &[],
            )
            .unwrap(),
        );
        tarn_dataset::create(&tank, "tank/private", &Default::default(), false).unwrap();
        let fss = Filesystems::default();
        fss.get(&tank, "tank/private").expect("its own pool");
        let e = fss.get(&evil, "tank/private").err().expect("refused");
        assert!(e.message.contains("not in pool 'evil'"), "{}", e.message);
        assert!(fss.volume(&evil, "tank/private").is_err());
    }

    #[test]
    fn coverage() {
        assert!(covers("tank/a", "tank/a"));
        assert!(covers("tank/a", "tank/a/b"));
        assert!(covers("tank/a", "tank/a@s"));
        assert!(!covers("tank/a", "tank/ab"));
        assert!(!covers("tank/a/b", "tank/a"));
    }
}
